//! `engram eval locomo` on a small LoCoMo-shaped fixture (the bundled stand-up conversation, original text): the
//! output file has the contract's shape, skips category 5 and evidence that names no turn, and recall is a share.


#[test]
fn eval_locomo_writes_recall_by_mode_budget_and_category() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("eval.json");
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/locomo-mini.json");
    let status = crate::common::engram()
        .args(["eval", "locomo", "--data", fixture, "--budgets", "100,500", "--out"])
        .arg(&out)
        .status()
        .unwrap();
    assert!(status.success());
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(v["dataset"], "locomo");
    let results = v["results"].as_array().unwrap();
    let all: Vec<_> = results.iter().filter(|r| r["category"] == "all").collect();
    assert_eq!(all.len(), 6, "three modes (flat, prune-and-grow, compass) × two budgets");
    for r in &all {
        assert_eq!(r["n"], 3, "categories 1-4 with a real evidence turn: {r}");
        let recall = r["recall"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&recall));
    }
    assert!(!results.iter().any(|r| r["category"] == "5"));
    let flat500 = all.iter().find(|r| r["mode"] == "flat" && r["budget_words"] == 500).unwrap();
    let flat100 = all.iter().find(|r| r["mode"] == "flat" && r["budget_words"] == 100).unwrap();
    assert!(flat500["recall"].as_f64() >= flat100["recall"].as_f64(), "a larger budget never finds less");
    assert!(flat500["recall"].as_f64().unwrap() > 0.0, "the migration question finds its turn");
}

#[test]
fn bad_eval_data_and_bad_asks_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, "{\"not\": \"a list\"}").unwrap();
    let out = crate::common::engram().args(["eval", "locomo", "--data"]).arg(&bad).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected a JSON array"), "{out:?}");
    std::fs::write(&bad, "[{\"sample_id\": ").unwrap();
    let out = crate::common::engram().args(["eval", "locomo", "--data"]).arg(&bad).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error:"));

    let out = crate::common::engram()
        .args(["run", "--once", "--ask", "no-colon-here", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected SPACE:QUESTION"), "{out:?}");
}

#[test]
fn eval_qmsum_reports_recall_of_relevant_spans() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("qmsum.json");
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/qmsum-mini");
    let output = crate::common::engram()
        .args(["eval", "qmsum", "--data", fixture, "--budgets", "30,1000", "--mode", "flat", "--mode", "compass", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(table.contains("| specific | general |"), "{table}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(v["dataset"], "qmsum");
    let row = |mode: &str, budget: u64, cat: &str| {
        v["results"].as_array().unwrap().iter().find(|r| r["mode"] == mode && r["budget_words"] == budget && r["category"] == cat).cloned().unwrap()
    };
    assert_eq!(row("flat", 1000, "all")["n"], 3);
    assert_eq!(row("flat", 1000, "specific")["n"], 2);
    // With the whole meeting in budget every relevant turn is found (the empty turn 4 is not a turn).
    assert_eq!(row("flat", 1000, "all")["recall"], 1.0);
    assert!(row("flat", 30, "specific")["recall"].as_f64().unwrap() < 1.0, "30 words cannot hold three turns");
    assert!(row("compass", 30, "specific")["recall"].as_f64().unwrap() > 0.0);
    let bad = crate::common::engram().args(["eval", "qmsum", "--data", "/nonexistent/qmsum"]).output().unwrap();
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("/nonexistent/qmsum"));
}
