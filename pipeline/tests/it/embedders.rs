//! The engine with the `openai` embedder (against a local `/v1/embeddings` test server: vectors logged, a restart
//! requests none) and with the `local` sentence-transformer (deletes and replacements cancel exactly even though its
//! vectors depend on the batch).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{chunk, get, post, Engine};
use axum::extract::State;
use axum::routing::post as route_post;
use axum::{Json, Router};
use operators::{Embedder, HashEmbedder};
use serde_json::{json, Value};

const STORM: &str = "A storm flooded the harbour district overnight and the harbour master closed the quay.";
const CUP: &str = "The football club won the cup semi-final with a late goal from the striker.";
const WALL: &str = "The council approved the sea wall budget after the cost rose to twenty six million pounds.";

async fn embeddings(State(seen): State<Arc<Mutex<Vec<String>>>>, Json(body): Json<Value>) -> Json<Value> {
    let inputs: Vec<String> =
        body["input"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
    seen.lock().unwrap().extend(inputs.iter().cloned());
    let e = HashEmbedder::new(64);
    let data: Vec<Value> =
        inputs.iter().enumerate().map(|(i, t)| json!({"index": i, "embedding": e.embed(t).to_dense()})).collect();
    Json(json!({"data": data, "usage": {"prompt_tokens": 9, "total_tokens": 9}}))
}

async fn space(engine: &Engine, name: &str) -> Value {
    let (_, spaces) = get(&format!("{}/v1/spaces", engine.api)).await;
    spaces["spaces"].as_array().and_then(|a| a.iter().find(|s| s["space"] == name).cloned()).unwrap_or(Value::Null)
}

/// The engine restarted on `dir`: once its replay has restored the three chunks, `q` still finds the cup.
async fn restarted(dir: &std::path::Path, env: &[(&str, &str)], q: &Value) -> Engine {
    let engine = Engine::start(dir, &[], env);
    let deadline = Instant::now() + Duration::from_secs(30);
    while space(&engine, "port").await["nodes"] != 3 {
        assert!(Instant::now() < deadline, "replay did not restore the memory");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (_, resp) = post(&format!("{}/v1/spaces/port/query", engine.api), q.to_string()).await;
    assert_eq!(resp["evidence"][0]["id"], "cup#0", "{resp}");
    engine
}

// Multi-threaded: the engine's start-up probe reaches the test server while the test thread waits for the engine.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn openai_embedder_logs_vectors_and_a_restart_requests_none() {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let app = Router::new().route("/v1/embeddings", route_post(embeddings)).with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let env = [
        ("ENGRAM__EMBEDDER__KIND", "openai"),
        ("ENGRAM__EMBEDDER__BASE_URL", base.as_str()),
        ("ENGRAM__EMBEDDER__MODEL", "test-embed"),
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut engine = Engine::start(dir.path(), &[], &env);
    let body = [chunk("storm", 0, STORM), chunk("cup", 0, CUP), chunk("wall", 0, WALL)].join("\n");
    let (status, receipt) = post(&format!("{}/v1/spaces/port/records", engine.api), body).await;
    assert_eq!(status, 200, "{receipt}");
    let r = receipt["receipt"].as_str().unwrap().to_string();
    let q = json!({"query": "football cup semi-final", "mode": "flat", "k": 1});
    let (status, resp) = post(&format!("{}/v1/spaces/port/query?after={r}", engine.api), q.to_string()).await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["evidence"][0]["id"], "cup#0", "{resp}");
    let requested = seen.lock().unwrap().clone();
    assert!(requested.iter().any(|t| t.contains("football club")), "chunks are embedded by the server: {requested:?}");
    let metrics =
        crate::common::client().get(format!("{}/metrics", engine.admin)).send().await.unwrap().text().await.unwrap();
    assert!(metrics.contains("engram_embedder_requests_total{outcome=\"ok\",stage=\"embed\"}"), "{metrics}");
    assert!(metrics.contains("engram_embedder_texts_total{kind=\"openai\"}"), "{metrics}");
    let logged = std::fs::read_to_string(dir.path().join("embeddings.log")).unwrap();
    assert!(logged.lines().count() >= 4, "probe, three chunks and the query are logged");
    assert_eq!(engine.terminate(), Some(0));

    // The restart replays the input log: the same memory, and not one text sent to the server (no probe either).
    let before = seen.lock().unwrap().len();
    let engine = restarted(dir.path(), &env, &q).await;
    assert_eq!(seen.lock().unwrap().len(), before, "a restart requests no embedding");
    drop(engine);

    // A log written before today's keys (its lines under the earlier FNV-1a keys, with no checksum, as that build
    // wrote them) still spares every request.
    let texts: std::collections::HashMap<String, String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|t| (connectors::embedders::text_key(t), connectors::embedders::legacy_text_key(t)))
        .collect();
    let path = dir.path().join("embeddings.log");
    let old: Vec<String> = std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| {
            let mut row: Value = serde_json::from_str(l.split('\t').next().unwrap()).unwrap();
            let key = row["key"].as_str().unwrap().to_string();
            row["key"] = json!(texts.get(&key).expect("every logged vector was requested"));
            row.to_string()
        })
        .collect();
    std::fs::write(&path, old.join("\n") + "\n").unwrap();
    let _engine = restarted(dir.path(), &env, &q).await;
    assert_eq!(seen.lock().unwrap().len(), before, "an old embedding log spares every request");
}

#[tokio::test]
async fn openai_embedder_unreachable_is_an_error_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let out = crate::common::engram()
        .args(["run", "--once", "--data-dir"])
        .arg(dir.path())
        .env("ENGRAM__EMBEDDER__KIND", "openai")
        .env("ENGRAM__EMBEDDER__BASE_URL", "http://127.0.0.1:9/v1")
        .env("ENGRAM__EMBEDDER__MODEL", "m")
        .env("ENGRAM__EMBEDDER__TIMEOUT", "1s")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("embedder") && err.contains("probe"), "{err}");
}

#[cfg(feature = "local-embedder")]
/// `ENGRAM_MODEL_DIR`, else `.models/all-MiniLM-L6-v2` (scripts/fetch-model.sh); CI sets `ENGRAM_REQUIRE_MODEL=1`.
fn model_dir() -> Option<String> {
    let dir = std::env::var("ENGRAM_MODEL_DIR")
        .unwrap_or_else(|_| format!("{}/../.models/all-MiniLM-L6-v2", env!("CARGO_MANIFEST_DIR")));
    if std::path::Path::new(&dir).join("model.safetensors").exists() {
        return Some(dir);
    }
    assert!(std::env::var("ENGRAM_REQUIRE_MODEL").is_err(), "ENGRAM_REQUIRE_MODEL is set but {dir} has no model");
    eprintln!("SKIPPED: no model files in {dir} — run scripts/fetch-model.sh to test the local embedder");
    None
}

#[cfg(feature = "local-embedder")]
/// (node ids, edge count) once the space has `nodes` nodes and has been stable a moment.
async fn graph(engine: &Engine, receipt: &str) -> (Vec<String>, u64) {
    let q = json!({"query": "harbour", "mode": "flat", "k": 50, "budget_words": 100000});
    let (_, resp) = post(&format!("{}/v1/spaces/port/query?after={receipt}", engine.api), q.to_string()).await;
    let mut ids: Vec<String> =
        resp["evidence"].as_array().unwrap().iter().map(|e| e["id"].as_str().unwrap().to_string()).collect();
    ids.sort();
    (ids, space(engine, "port").await["edges"].as_u64().unwrap())
}

#[cfg(feature = "local-embedder")]
#[tokio::test]
async fn local_embedder_retracts_exactly_what_it_inserted() {
    let Some(model) = model_dir() else { return };
    let env = [
        ("ENGRAM__EMBEDDER__KIND", "local"),
        ("ENGRAM__EMBEDDER__MODEL_DIR", model.as_str()),
        ("ENGRAM__SIMILARITY__THETA", "0.3"),
    ];
    let texts = [
        STORM,
        CUP,
        WALL,
        "Fishermen said the quay was flooded after the storm.",
        "The striker scored again in the league.",
    ];
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(dir.path(), &[], &env);
    // Everything in one request, then a replacement and a delete in others: different batches, different padding.
    let body: Vec<String> = texts.iter().enumerate().map(|(i, t)| chunk(&format!("d{i}"), 0, t)).collect();
    post(&format!("{}/v1/spaces/port/records", engine.api), body.join("\n")).await;
    let (_, r) =
        post(&format!("{}/v1/spaces/port/records", engine.api), chunk("d1", 0, "The cup final was lost on penalties."))
            .await;
    let (_, r2) =
        post(&format!("{}/v1/spaces/port/records", engine.api), json!({"kind": "delete", "doc": "d4"}).to_string())
            .await;
    let _ = r;
    let incremental = graph(&engine, r2["receipt"].as_str().unwrap()).await;

    // From scratch: the final state in one request.
    let dir2 = tempfile::tempdir().unwrap();
    let fresh = Engine::start(dir2.path(), &[], &env);
    let body = [
        chunk("d0", 0, STORM),
        chunk("d1", 0, "The cup final was lost on penalties."),
        chunk("d2", 0, WALL),
        chunk("d3", 0, texts[3]),
    ];
    let (_, r) = post(&format!("{}/v1/spaces/port/records", fresh.api), body.join("\n")).await;
    let scratch = graph(&fresh, r["receipt"].as_str().unwrap()).await;
    assert_eq!(incremental, scratch);
    assert_eq!(incremental.0.len(), 4);
    assert!(incremental.1 >= 1, "the storm and the flooded quay are linked: {incremental:?}");
    // The semantic neighbour, not a word overlap: "inundated" appears nowhere.
    let q = json!({"query": "Which part of town was inundated?", "mode": "flat", "k": 1});
    let (_, resp) = post(&format!("{}/v1/spaces/port/query", engine.api), q.to_string()).await;
    assert!(["d0#0", "d3#0"].contains(&resp["evidence"][0]["id"].as_str().unwrap()), "{resp}");
}
