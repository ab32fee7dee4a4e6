//! `engram bench scale` end to end, at sizes a test can afford: one object per point with every figure the issue
//! asks for, on the synthetic news stream and on a records file of one space (turns).

use serde_json::Value;

fn points(args: &[&str]) -> Vec<Value> {
    let out = crate::common::engram()
        .args(["bench", "scale", "--queries", "5", "--stream-seconds", "1", "--batch", "200", "--json"])
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn check(p: &Value, size: u64) {
    assert_eq!(p["bench"], "scale");
    assert!(p["size"].as_u64().unwrap() >= size, "{p}");
    for key in ["chunks_per_second", "hnsw_rs_chunks_per_second", "vs_hnsw_rs", "rss_bytes_per_chunk"] {
        assert!(p[key].as_f64().unwrap() > 0.0, "{key}: {p}");
    }
    for mode in ["flat", "prune-and-grow", "compass"] {
        let q = &p["query_ms"][mode];
        assert!(q["p50"].as_f64().unwrap() <= q["p95"].as_f64().unwrap(), "{mode}: {p}");
    }
    let fresh = &p["freshness_ms"];
    assert_eq!(fresh["records"], 10, "a 10 records/s stream for 1 s: {p}");
    assert!(fresh["p95"].as_f64().unwrap() > 0.0, "{p}");
    // What the stream rewrote, per streamed record: at least its own node of layer 0 (a re-published story is one).
    assert!(fresh["view_updates_per_record"]["node@0"].as_f64().unwrap() >= 0.5, "{p}");
    let layers = p["layers"].as_array().unwrap().len();
    assert_eq!(p["layer_degrees"].as_array().unwrap().len(), layers, "a degree per layer: {p}");
    assert!(p["clusters_replaced_per_streamed_record"].is_array(), "{p}");
}

#[test]
fn scale_bench_grows_one_news_space() {
    let ps = points(&["--sizes", "150,300"]);
    assert_eq!(ps.len(), 2);
    check(&ps[0], 150);
    check(&ps[1], 300);
    assert_eq!(ps[0]["corpus"], "synthetic-news");
    assert_eq!(ps[1]["layers"][0], ps[1]["size"], "layer 0 is the space: {}", ps[1]);
    assert_eq!(ps[1]["events"], 0, "chunks make no events: {}", ps[1]);
}

#[test]
fn scale_bench_grows_one_space_of_turns() {
    let standup = concat!(env!("CARGO_MANIFEST_DIR"), "/../examples/standup.jsonl");
    let ps = points(&["--input", standup, "--sizes", "20"]);
    assert_eq!(ps.len(), 1, "{ps:?}");
    check(&ps[0], 20);
    assert!(ps[0]["events"].as_u64().unwrap() > 0, "turns make events: {}", ps[0]);
}

#[test]
fn scale_bench_bad_input_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.jsonl");
    let out = crate::common::engram().args(["bench", "scale", "--input"]).arg(&missing).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.jsonl"), "{out:?}");
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"space\": \"s\", \"kind\": \"turn\"}\n").unwrap();
    let out = crate::common::engram().args(["bench", "scale", "--sizes", "5", "--input"]).arg(&bad).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("record"), "{out:?}");
}
