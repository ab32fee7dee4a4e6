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
    assert_eq!(all.len(), 8, "four modes (flat, hybrid, prune-and-grow, compass) × two budgets");
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
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/locomo-mini.json");
    let out = crate::common::engram().args(["eval", "locomo", "--data", fixture, "--mode", "magic"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("invalid value 'magic'"), "{out:?}");

    let out = crate::common::engram()
        .args(["run", "--once", "--ask", "no-colon-here", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected SPACE:QUESTION"), "{out:?}");
}

#[test]
fn ask_mode_answers_with_a_structured_mode() {
    // The bundled news example: flat (cosine alone) ranks a passage about the fishing cooperative first; compass
    // ranks by cosine, BM25 and context together and puts the sea wall's cost first.
    let news = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/news.jsonl");
    let ask = |mode: &str| {
        let dir = tempfile::tempdir().unwrap();
        let mut args = vec!["run", "--once", "--input", news, "--ask", "news:How much will the sea wall cost?"];
        if !mode.is_empty() {
            args.extend(["--ask-mode", mode]);
        }
        let out = crate::common::engram().args(args).arg("--data-dir").arg(dir.path()).output().unwrap();
        assert!(out.status.success(), "{out:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        v
    };
    let flat = ask("flat");
    assert_eq!(flat["trace"][0]["mode"], "flat");
    let compass = ask("compass");
    assert_eq!(compass["trace"][0]["step"], "plan", "{compass}");
    let first = compass["evidence"][0]["text"].as_str().unwrap();
    assert!(first.contains("26.2 million pounds"), "{compass}");
    assert_ne!(flat["evidence"][0]["id"], compass["evidence"][0]["id"]);
    // Without --ask-mode the answer is compass's: the engine's best retrieval is the default.
    assert_eq!(ask("")["evidence"], compass["evidence"]);

    let dir = tempfile::tempdir().unwrap();
    let out = crate::common::engram()
        .args(["run", "--once", "--ask", "news:x", "--ask-mode", "nope", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--ask-mode \"nope\""), "{out:?}");
}

#[test]
fn eval_qmsum_reports_recall_of_relevant_spans() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("qmsum.json");
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/qmsum-mini");
    let output = crate::common::engram()
        .args([
            "eval",
            "qmsum",
            "--data",
            fixture,
            "--budgets",
            "30,1000",
            "--mode",
            "flat",
            "--mode",
            "compass",
            "--out",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let table = String::from_utf8_lossy(&output.stdout);
    assert!(table.contains("| specific | general |"), "{table}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(v["dataset"], "qmsum");
    let row = |mode: &str, budget: u64, cat: &str| {
        v["results"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["mode"] == mode && r["budget_words"] == budget && r["category"] == cat)
            .cloned()
            .unwrap()
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

/// An OpenAI-compatible test server for eval: summaries, a session as one event, no relations, and the same answer to
/// every question.
async fn fixed_answers(axum::Json(body): axum::Json<serde_json::Value>) -> axum::Json<serde_json::Value> {
    let stage = body["response_format"]["json_schema"]["name"].as_str().unwrap_or("");
    let user = body["messages"][1]["content"].as_str().unwrap_or("");
    let content = match stage {
        "answer" => serde_json::json!({"answer": "A lock timeout."}),
        "segment" => {
            let turns: Vec<serde_json::Value> =
                user.find('[').and_then(|i| serde_json::from_str(&user[i..]).ok()).unwrap_or_default();
            let numbers: Vec<usize> = (1..=turns.len()).collect();
            serde_json::json!({"events": [{"turns": numbers, "summary": "the stand-up", "people": [], "time": null}]})
        }
        "relate" => serde_json::json!({"relations": []}),
        _ => serde_json::json!({"summary": "a summary"}),
    };
    axum::Json(serde_json::json!({"choices": [{"message": {"role": "assistant", "content": content.to_string()}}],
                                  "usage": {"prompt_tokens": 10, "completion_tokens": 5}}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eval_with_a_model_scores_its_answers() {
    let app = axum::Router::new().route("/v1/chat/completions", axum::routing::post(fixed_answers));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("eval.json");
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/locomo-mini.json");
    let mut cmd = crate::common::engram();
    cmd.args(["eval", "locomo", "--data", fixture, "--budgets", "500", "--mode", "flat", "--out"])
        .arg(&out)
        .env("ENGRAM__LLM__BACKEND", "openai")
        .env("ENGRAM__LLM__BASE_URL", &base)
        .env("ENGRAM__LLM__MODEL", "test-model")
        .env("ENGRAM__LLM__RESPONSE_FORMAT", "json-schema")
        .env("ENGRAM__LLM__REQUESTS_PER_MINUTE", "60000");
    let output = tokio::task::spawn_blocking(move || cmd.output().unwrap()).await.unwrap();
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("answer F1 / BLEU-1"), "{stdout}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let row = |c: &str| v["results"].as_array().unwrap().iter().find(|r| r["category"] == c).cloned().unwrap();
    // Category 4's question has the gold answer "a lock timeout": exact after normalisation.
    assert_eq!(row("4")["f1"], 1.0, "{v}");
    assert_eq!(row("4")["bleu1"], 1.0, "{v}");
    // "Ben" and "Friday" share no token with it.
    assert_eq!(row("1")["f1"], 0.0);
    let all = row("all");
    assert_eq!(all["answered"], 3);
    assert_eq!(all["answer_errors"], 0);
    assert!((all["f1"].as_f64().unwrap() - 1.0 / 3.0).abs() < 1e-9, "{all}");
}
