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
    for key in [
        "chunks_per_second",
        "hnsw_rs_chunks_per_second",
        "vs_hnsw_rs",
        "hnsw_rs_engram_vectors_chunks_per_second",
        "vs_hnsw_rs_engram_vectors",
        "rss_bytes_per_chunk",
        "vector_bytes_per_chunk",
    ] {
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

/// `bench news` writes the synthetic stream as records: the same on every run, chunks of one space, and a file of
/// them grows a space as the generator does.
#[test]
fn news_bench_writes_the_synthetic_stream_as_records() {
    let write = |n: &str| {
        let out = crate::common::engram().args(["bench", "news", "--sizes", n]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let (a, b) = (write("300"), write("300"));
    assert_eq!(a, b, "the stream is seeded");
    assert!(write("120").lines().eq(a.lines().take(120)), "a shorter stream is a prefix of a longer one");
    let rows: Vec<Value> = a.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(rows.len(), 300);
    assert!(rows.iter().all(|r| r["space"] == "news" && r["kind"] == "chunk"), "{}", rows[0]);
    let docs: std::collections::HashSet<&str> = rows.iter().map(|r| r["doc"].as_str().unwrap()).collect();
    assert!(docs.len() > 300 / 8 && docs.len() < 300, "documents of one to eight chunks: {}", docs.len());
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("news.jsonl");
    std::fs::write(&file, &a).unwrap();
    let ps = points(&["--input", file.to_str().unwrap(), "--sizes", "200"]);
    check(&ps[0], 200);
    assert_eq!(ps[0]["space"], "news");
    assert_eq!(ps[0]["events"], 0, "chunks make no events: {}", ps[0]);
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
