//! The HTTP API over real sockets, against the real binary: ingest → query, read-your-writes, bad bodies, config
//! errors, durability across kill -9, dead-lettering of file input, clean shutdown.

use std::io::Write;

use crate::common::{chunk, engram, get, post, Engine};
use serde_json::json;

const STORM: &str = "A storm flooded the harbour district overnight and the harbour master closed the quay.";
const CUP: &str = "The football club won the cup semi-final with a late goal from the striker.";
const WALL: &str = "The council approved the sea wall budget after the cost rose to twenty six million pounds.";

#[tokio::test]
async fn ingest_query_round_trip_with_read_your_writes() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(dir.path(), &[], &[]);
    let body = [chunk("storm", 0, STORM), chunk("cup", 0, CUP), chunk("wall", 0, WALL)].join("\n");
    let (status, receipt) = post(&format!("{}/v1/spaces/port/records", engine.api), body).await;
    assert_eq!(status, 200, "{receipt}");
    assert_eq!(receipt["accepted"], 3);
    assert_eq!(receipt["rejected"], json!([]));
    let r = receipt["receipt"].as_str().expect("a receipt").to_string();

    // Asked right after the acknowledgement, with ?after, the answer includes the records.
    let q = json!({"query": "who won the football cup semi-final?", "mode": "flat", "k": 2});
    let (status, resp) = post(&format!("{}/v1/spaces/port/query?after={r}", engine.api), q.to_string()).await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["evidence"][0]["id"], "cup#0", "{resp}");
    assert_eq!(resp["evidence"][0]["text"], CUP);
    assert_eq!(resp["evidence"][0]["layer"], 0);
    assert_eq!(resp["evidence"][0]["source"]["doc"], "cup");
    assert!(resp["as_of"].as_u64().unwrap() >= r.parse::<u64>().unwrap());
    assert!(resp["answer"].is_null());
    assert_eq!(resp["evidence"].as_array().unwrap().len(), 2);

    // A JSON array body, a replacement of cup#0, and a budget of 5 words.
    let replaced = "The football club lost the cup final on penalties.";
    let body = json!([{"kind": "chunk", "doc": "cup", "seq": 0, "text": replaced}]).to_string();
    let (_, receipt) = post(&format!("{}/v1/spaces/port/records", engine.api), body).await;
    let r = receipt["receipt"].as_str().unwrap();
    let q = json!({"query": "football cup", "budget_words": 5});
    let (_, resp) = post(&format!("{}/v1/spaces/port/query?after={r}", engine.api), q.to_string()).await;
    assert_eq!(resp["evidence"][0]["id"], "cup#0");
    assert_eq!(resp["evidence"][0]["text"], "The football club lost the", "budget cuts the text: {resp}");
    assert_eq!(resp["evidence"].as_array().unwrap().len(), 1);

    // Views: the spaces listing, and a node with its neighbours.
    let (_, spaces) = get(&format!("{}/v1/spaces", engine.api)).await;
    assert_eq!(spaces["spaces"][0]["space"], "port");
    assert_eq!(spaces["spaces"][0]["nodes"], 3);
    assert_eq!(spaces["spaces"][0]["layers"], json!([3]));
    let (status, node) = get(&format!("{}/v1/spaces/port/nodes/cup%230", engine.api)).await;
    assert_eq!(status, 200, "{node}");
    assert_eq!(node["text"], replaced);
    assert!(node["neighbours"].is_array());

    // A delete retracts the document.
    let body = json!({"kind": "delete", "doc": "cup"}).to_string();
    let (_, receipt) = post(&format!("{}/v1/spaces/port/records", engine.api), body).await;
    let r = receipt["receipt"].as_str().unwrap();
    let (status, _) = get(&format!("{}/v1/spaces/port/nodes/cup%230?after={r}", engine.api)).await;
    assert_eq!(status, 404);

    // Metrics on the admin port.
    let text =
        crate::common::client().get(format!("{}/metrics", engine.admin)).send().await.unwrap().text().await.unwrap();
    for name in [
        "engram_records_in_total",
        "engram_epochs_total",
        "engram_nodes",
        "engram_edges",
        "engram_frontier_lag_epochs",
        "engram_query_duration_seconds_bucket",
    ] {
        assert!(text.contains(name), "{name} missing from /metrics");
    }
}

#[tokio::test]
async fn bad_bodies_get_clear_errors_and_dead_letters() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(dir.path(), &[], &[]);
    let url = format!("{}/v1/spaces/port/records", engine.api);

    let (status, e) = post(&url, "[{\"kind\":\"chunk\",").await;
    assert_eq!(status, 400);
    assert_eq!(e["error"]["code"], "bad_request");
    assert!(e["error"]["message"].as_str().unwrap().contains("JSON array"));

    let (status, e) = post(&url, "").await;
    assert_eq!(status, 400, "{e}");

    let body = [
        chunk("ok", 0, STORM),
        "{\"kind\":\"chunk\",\"doc\":\"x\",\"seq\":\"one\",\"text\":\"t\"}".to_string(),
        "{\"kind\":\"chunk\",\"doc\":\"x\",\"seq\":1,\"text\":\"t\",\"space\":\"other\"}".to_string(),
        "{\"kind\":\"turn\"".to_string(),
    ]
    .join("\n");
    let (status, r) = post(&url, body).await;
    assert_eq!(status, 200);
    assert_eq!(r["accepted"], 1);
    let reasons: Vec<(u64, String)> = r["rejected"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| (x["index"].as_u64().unwrap(), x["reason"].as_str().unwrap().to_string()))
        .collect();
    assert_eq!(reasons.len(), 3, "{r}");
    assert_eq!(reasons[0].0, 1);
    assert!(reasons[0].1.contains("`seq` must be an integer"));
    assert!(reasons[1].1.contains("space `other`"));
    assert!(reasons[2].1.contains("not valid JSON"));

    let dead = std::fs::read_to_string(dir.path().join("dead-letter.jsonl")).unwrap();
    let dead: Vec<serde_json::Value> = dead.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(dead.len(), 3);
    assert!(dead.iter().all(|d| !d["reason"].as_str().unwrap().is_empty() && d["raw"].is_string()));
    let r = r["receipt"].as_str().unwrap();
    // The error rows travel through the dataflow; wait for the epoch through a query first.
    let q = json!({"query": "storm"}).to_string();
    let (_, _) = post(&format!("{}/v1/spaces/port/query?after={r}", engine.api), q).await;
    let (_, errors2) = get(&format!("{}/v1/errors", engine.api)).await;
    assert_eq!(errors2["total"], 3, "{errors2}");

    let qurl = format!("{}/v1/spaces/port/query", engine.api);
    for (body, status, code) in [
        ("{", 400, "bad_request"),
        ("{\"query\":\"\"}", 400, "bad_request"),
        ("{\"query\":\"x\",\"mode\":\"magic\"}", 400, "bad_request"),
        ("{\"query\":\"x\",\"k\":0}", 400, "bad_request"),
        ("{\"query\":\"x\",\"colour\":1}", 400, "bad_request"),
        ("{\"query\":\"x\",\"answer\":\"yes\"}", 400, "bad_request"),
        ("{\"query\":\"x\",\"use_model\":3}", 400, "bad_request"),
    ] {
        let (s, e) = post(&qurl, body).await;
        assert_eq!((s, e["error"]["code"].as_str().unwrap()), (status, code), "{body} → {e}");
    }
    let (s, e) = post(&format!("{}/v1/spaces/nowhere/query", engine.api), "{\"query\":\"x\"}").await;
    assert_eq!((s, e["error"]["code"].as_str().unwrap()), (404, "unknown_space"));
    let (s, e) = post(&format!("{qurl}?after=soon"), "{\"query\":\"x\"}").await;
    assert_eq!((s, e["error"]["code"].as_str().unwrap()), (400, "bad_request"));
    let (s, e) = post(&format!("{}/v1/spaces/bad%20space/records", engine.api), chunk("a", 0, "b")).await;
    assert_eq!((s, e["error"]["code"].as_str().unwrap()), (400, "bad_request"));
    let (s, _) = get(&format!("{}/v1/nope", engine.api)).await;
    assert_eq!(s, 404);
}

#[tokio::test]
async fn acknowledged_records_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = Engine::start(dir.path(), &[], &[]);
    let url = format!("{}/v1/spaces/durable/records", engine.api);
    let mut last = 0u64;
    for batch in 0..10 {
        let body: Vec<String> = (0..20)
            .map(|i| chunk(&format!("doc{batch}"), i, &format!("record {batch} {i} about harbour storms")))
            .collect();
        let (status, r) = post(&url, body.join("\n")).await;
        assert_eq!(status, 200);
        last = r["receipt"].as_str().unwrap().parse().unwrap();
    }
    // No waiting: the acknowledgement alone must be enough.
    engine.kill9();

    let engine = Engine::start(dir.path(), &[], &[]);
    let q = json!({"query": "harbour storms", "k": 1}).to_string();
    let (status, resp) = post(&format!("{}/v1/spaces/durable/query?after={last}", engine.api), q).await;
    assert_eq!(status, 200, "{resp}");
    let (_, spaces) = get(&format!("{}/v1/spaces", engine.api)).await;
    assert_eq!(spaces["spaces"][0]["nodes"], 200, "{spaces}");
    // Receipts stay monotone across the restart.
    let (_, r) = post(&format!("{}/v1/spaces/durable/records", engine.api), chunk("late", 0, "late record")).await;
    assert!(r["receipt"].as_str().unwrap().parse::<u64>().unwrap() > last);
}

#[tokio::test]
async fn file_input_dead_letters_garbage_and_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.jsonl");
    let mut f = std::fs::File::create(&input).unwrap();
    let good = |doc: &str, text: &str| {
        format!("{{\"space\":\"f\",\"kind\":\"chunk\",\"doc\":\"{doc}\",\"seq\":0,\"text\":\"{text}\"}}\n")
    };
    f.write_all(good("a", STORM).as_bytes()).unwrap();
    f.write_all(b"{\"space\":\"f\",\"kind\":\"chunk\",\"doc\":\"b\",\"seq\":0,\"text\":\"trunc\n").unwrap();
    f.write_all(b"{\"space\":\"f\",\"kind\":\"chunk\",\"doc\":\"\xff\xfe\",\"seq\":0,\"text\":\"x\"}\n").unwrap();
    f.write_all(
        format!(
            "{{\"space\":\"f\",\"kind\":\"chunk\",\"doc\":\"c\",\"seq\":0,\"text\":\"{}\"}}\n",
            "word ".repeat(400)
        )
        .as_bytes(),
    )
    .unwrap();
    f.write_all(b"{\"space\":\"f\",\"kind\":\"turn\",\"conversation\":7}\n").unwrap();
    f.write_all(good("d", WALL).as_bytes()).unwrap();
    drop(f);
    let mut engine = Engine::start(
        dir.path(),
        &["--input", input.to_str().unwrap()],
        &[("ENGRAM__INGEST__MAX_RECORD_BYTES", "1000")],
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (_, errors) = get(&format!("{}/v1/errors", engine.api)).await;
        let (_, spaces) = get(&format!("{}/v1/spaces", engine.api)).await;
        if errors["total"] == 4 && spaces["spaces"][0]["nodes"] == 2 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{errors} {spaces}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let dead = std::fs::read_to_string(dir.path().join("dead-letter.jsonl")).unwrap();
    let reasons: Vec<String> = dead
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["reason"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(reasons.len(), 4);
    assert!(reasons[0].contains("not valid JSON"));
    assert!(reasons[1].contains("UTF-8"));
    assert!(reasons[2].contains("over the limit of 1000"));
    assert!(reasons[3].contains("`conversation` must be a string"));
    assert!(dead.lines().next().unwrap().contains(":2\""), "the source position names the line: {dead}");
    // SIGTERM: finish, flush, exit 0.
    assert_eq!(engine.terminate(), Some(0));
}

#[test]
fn config_errors_exit_2_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.toml");
    std::fs::write(&cfg, "[similarity]\ntheta = 2.0\nthetta = 1\n").unwrap();
    let out = engram().args(["run", "--config", cfg.to_str().unwrap(), "--data-dir"]).arg(dir.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("thetta"), "{err}");

    std::fs::write(&cfg, "[similarity]\ntheta = 2.0\nk = 0\n").unwrap();
    let out = engram().args(["run", "--config", cfg.to_str().unwrap(), "--data-dir"]).arg(dir.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("similarity.theta") && err.contains("similarity.k"), "both errors at once: {err}");

    let out = engram()
        .args(["run", "--data-dir"])
        .arg(dir.path())
        .env("ENGRAM__INGEST__EPOCH_INTERVAL", "whenever")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("epoch-interval"));

    // The embedder, event and Kafka keys: every problem named at once.
    std::fs::write(
        &cfg,
        "[embedder]\nkind = \"local\"\nmodel-dir = \"/nonexistent/model\"\nbatch = 0\n[events]\nmerge-threshold = 1.5\n[kafka]\ntopics = [\"news\"]\nbrokers = \"\"\n",
    )
    .unwrap();
    let out = engram().args(["run", "--config", cfg.to_str().unwrap(), "--data-dir"]).arg(dir.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for key in ["embedder.model-dir", "embedder.batch", "events.merge-threshold", "kafka.brokers"] {
        assert!(err.contains(key), "{key} not named: {err}");
    }
    let out = engram()
        .args(["run", "--data-dir"])
        .arg(dir.path())
        .env("ENGRAM__EMBEDDER__KIND", "openai")
        .env("ENGRAM__EMBEDDER__BASE_URL", "not a url")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("embedder.base-url") && err.contains("embedder.model"), "{err}");

    let out = engram().args(["run", "--config", "/nonexistent/engram.toml"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/engram.toml"));
}

/// Every bound on a request has its key and its error: records per request (NDJSON and arrays, nothing taken), bytes
/// per array element, rejects listed (the rest counted and still dead-lettered), reasons cut, question length.
#[tokio::test]
async fn bounded_requests_are_refused_with_their_code() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("ENGRAM__INGEST__MAX_RECORDS_PER_REQUEST", "4"),
        ("ENGRAM__INGEST__MAX_REJECTS_LISTED", "2"),
        ("ENGRAM__INGEST__MAX_REASON_CHARS", "40"),
        ("ENGRAM__INGEST__MAX_RECORD_BYTES", "300"),
        ("ENGRAM__QUERY__MAX_QUERY_CHARS", "50"),
    ];
    let engine = Engine::start(dir.path(), &[], &env);
    let url = format!("{}/v1/spaces/port/records", engine.api);

    // Five records, as NDJSON and as an array of empty objects: refused whole, nothing logged or dead-lettered.
    let five = (0..5).map(|i| chunk("d", i, STORM)).collect::<Vec<_>>().join("\n");
    let (status, e) = post(&url, five).await;
    assert_eq!((status, e["error"]["code"].as_str().unwrap()), (413, "too_many_records"), "{e}");
    let (status, e) = post(&url, "[{},{},{},{},{}]").await;
    assert_eq!((status, e["error"]["code"].as_str().unwrap()), (413, "too_many_records"), "{e}");
    let dead = dir.path().join("dead-letter.jsonl");
    assert_eq!(std::fs::read_to_string(&dead).unwrap_or_default().lines().count(), 0);

    // Four records in an array: one good; one element over max-record-bytes; two with a long unknown field name.
    let long_field = "x".repeat(200);
    let odd =
        |doc: &str| format!("{{\"kind\":\"chunk\",\"doc\":\"{doc}\",\"seq\":0,\"text\":\"t\",\"{long_field}\":1}}");
    let body = format!("[{},{},{},{}]", chunk("ok", 0, STORM), chunk("big", 0, &"w ".repeat(200)), odd("a"), odd("b"));
    let (status, r) = post(&url, body).await;
    assert_eq!(status, 200, "{r}");
    assert_eq!(r["accepted"], 1);
    assert_eq!(r["rejected_total"], 3, "{r}");
    let listed = r["rejected"].as_array().unwrap();
    assert_eq!(listed.len(), 2, "only max-rejects-listed are echoed: {r}");
    assert_eq!(listed[0]["index"], 1);
    assert!(listed[0]["reason"].as_str().unwrap().starts_with("record is 446 bytes, over the limit"), "{r}");
    let reason = listed[1]["reason"].as_str().unwrap();
    assert!(reason.chars().count() <= 41 && reason.ends_with('…'), "the reason is cut: {reason:?}");
    let dead: Vec<serde_json::Value> =
        std::fs::read_to_string(&dead).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(dead.len(), 3, "every reject is dead-lettered");
    assert!(dead.iter().all(|d| d["reason"].as_str().unwrap().chars().count() <= 41));

    // A question over max-query-chars.
    let q = json!({"query": "why? ".repeat(20)}).to_string();
    let (status, e) = post(&format!("{}/v1/spaces/port/query", engine.api), q).await;
    assert_eq!((status, e["error"]["code"].as_str().unwrap()), (400, "bad_request"), "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("max-query-chars"), "{e}");
}

/// A client that sends its headers and then stalls is answered 408 once `http.request-timeout` has passed, and other
/// clients are served meanwhile.
#[tokio::test]
async fn a_stalled_request_times_out_and_others_are_served() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = tempfile::tempdir().unwrap();
    let env = [("ENGRAM__HTTP__REQUEST_TIMEOUT", "1s"), ("ENGRAM__QUERY__MAX_WAIT", "500ms")];
    let engine = Engine::start(dir.path(), &[], &env);
    let addr = engine.api.trim_start_matches("http://").to_string();
    let mut slow: Vec<tokio::net::TcpStream> = Vec::new();
    for _ in 0..8 {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"POST /v1/spaces/port/records HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{").await.unwrap();
        slow.push(s);
    }
    let t = std::time::Instant::now();
    let (status, _) = get(&format!("{}/healthz", engine.api)).await;
    assert_eq!(status, 200);
    assert!(t.elapsed() < std::time::Duration::from_millis(900), "served while the slow ones stall");
    let mut reply = String::new();
    let read = tokio::time::timeout(std::time::Duration::from_secs(10), slow[0].read_to_string(&mut reply)).await;
    assert!(read.is_ok(), "the stalled request was never answered");
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains("request_timeout"), "{reply}");
    assert!(t.elapsed() >= std::time::Duration::from_millis(900), "not before the timeout");
}

/// `hybrid` is the fused ranking over layer 0 alone: on a space without events (chunks only) it is exactly what
/// `compass` gives, and it is not `flat`'s cosine order; the trace says it is the hybrid ranking.
#[tokio::test]
async fn hybrid_is_the_fused_ranking_without_the_structure() {
    let dir = tempfile::tempdir().unwrap();
    let news = format!("{}/../examples/news.jsonl", env!("CARGO_MANIFEST_DIR"));
    let engine = Engine::start(dir.path(), &["--input", &news], &[]);
    let ask = |mode: &str| {
        let url = format!("{}/v1/spaces/news/query", engine.api);
        let q = json!({"query": "How much will the sea wall cost?", "mode": mode, "budget_words": 120});
        async move { post(&url, q.to_string()).await }
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let (_, s) = get(&format!("{}/v1/spaces", engine.api)).await;
        if s["spaces"][0]["nodes"] == 59 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{s}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let (status, hybrid) = ask("hybrid").await;
    assert_eq!(status, 200, "{hybrid}");
    let (_, compass) = ask("compass").await;
    let (_, flat) = ask("flat").await;
    let ids = |v: &serde_json::Value| -> Vec<String> {
        v["evidence"].as_array().unwrap().iter().map(|e| e["id"].as_str().unwrap().to_string()).collect()
    };
    assert!(!ids(&hybrid).is_empty());
    assert_eq!(ids(&hybrid), ids(&compass), "no events: compass is the fused ranking alone");
    assert_eq!(hybrid["evidence"], compass["evidence"]);
    assert_ne!(ids(&hybrid), ids(&flat), "the fused ranking is not cosine's");
    assert_eq!(hybrid["trace"][0]["mode"], "hybrid", "{}", hybrid["trace"]);
    assert!(ids(&hybrid)[0].starts_with("pm-2026-11-25-seawall-costs#0"), "{:?}", ids(&hybrid));
}

/// The API's OpenAPI document is served, and it is the committed one (`docs/openapi.json`).
#[tokio::test]
async fn the_openapi_document_is_served() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(dir.path(), &[], &[]);
    let (status, doc) = get(&format!("{}/openapi.json", engine.api)).await;
    assert_eq!(status, 200);
    let committed: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(doc, committed);
    assert_eq!(doc["paths"].as_object().unwrap().len(), 9);
}

/// `engram ingest` sends record files to a running engine in batches grouped by space, logs a plain progress line
/// when stderr is not a terminal, and returns once the views hold its last receipt.
#[tokio::test]
async fn engram_ingest_sends_files_and_waits_for_the_views() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(dir.path(), &[], &[]);
    let examples = format!("{}/../examples", env!("CARGO_MANIFEST_DIR"));
    let out = engram()
        .args(["ingest", &format!("{examples}/news.jsonl"), &format!("{examples}/standup.jsonl")])
        .args(["--url", &engine.api, "--batch", "10"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("ingest: 113/113 records"), "a plain progress line: {err}");
    assert!(err.contains("ingested 113 records (113 accepted, 0 rejected)"), "{err}");
    let (_, spaces) = get(&format!("{}/v1/spaces", engine.api)).await;
    let nodes: Vec<(String, u64)> = spaces["spaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s["space"].as_str().unwrap().to_string(), s["nodes"].as_u64().unwrap()))
        .collect();
    assert_eq!(nodes, [("news".to_string(), 59), ("standup".to_string(), 54)], "in the views when it returns");

    // Garbage lines go to the engine, which rejects them with their reasons; the good ones are taken.
    let mixed = dir.path().join("mixed.jsonl");
    std::fs::write(&mixed, "{\"space\":\"news\",\"kind\":\"chunk\",\"doc\":\"m\",\"seq\":0,\"text\":\"ok\"}\n{\"space\":\"news\",\"kind\":\"nope\"}\n").unwrap();
    let out = engram().args(["ingest"]).arg(&mixed).args(["--url", &engine.api]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && err.contains("ingested 2 records (1 accepted, 1 rejected)"), "{err}");

    // A record that names no space, without --space: a clear error naming the line; nothing sent.
    let bad = dir.path().join("bad.jsonl");
    std::fs::write(&bad, "{\"kind\":\"chunk\",\"doc\":\"a\",\"seq\":0,\"text\":\"x\"}\n").unwrap();
    let out = engram().args(["ingest"]).arg(&bad).args(["--url", &engine.api]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad.jsonl:1: the record names no space"));
}

/// A layer's page: ids in order, paged; bad path or query values are JSON errors.
#[tokio::test]
async fn a_layer_page_is_paged_and_its_parameters_checked() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(dir.path(), &[], &[]);
    let body = [chunk("storm", 0, STORM), chunk("cup", 0, CUP), chunk("wall", 0, WALL)].join("\n");
    let (_, r) = post(&format!("{}/v1/spaces/port/records", engine.api), body).await;
    let url = |q: &str| format!("{}/v1/spaces/port/layers/{q}", engine.api);
    let (status, page) = get(&url(&format!("0?after={}", r["receipt"].as_str().unwrap()))).await;
    assert_eq!(status, 200, "{page}");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut page = page;
    while page["total"] != 3 {
        assert!(std::time::Instant::now() < deadline, "{page}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        page = get(&url("0")).await.1;
    }
    let ids: Vec<&str> = page["nodes"].as_array().unwrap().iter().map(|n| n["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["cup#0", "storm#0", "wall#0"]);
    let (_, second) = get(&url("0?offset=1&limit=1")).await;
    assert_eq!(second["nodes"][0]["id"], "storm#0");
    assert_eq!((second["offset"].as_u64(), second["nodes"].as_array().unwrap().len()), (Some(1), 1));
    let r = crate::common::client().delete(url("0")).send().await.unwrap();
    assert_eq!(r.status(), 405);
    let e: serde_json::Value = r.json().await.unwrap();
    assert_eq!(e["error"]["code"], "method_not_allowed", "a wrong method is a JSON error too");
    for bad in ["abc", "0?limit=many", "0?offset=-1"] {
        let (status, e) = get(&url(bad)).await;
        assert_eq!((status, e["error"]["code"].as_str()), (400, Some("bad_request")), "{bad}: {e}");
    }
}
