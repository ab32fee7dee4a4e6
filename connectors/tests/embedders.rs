//! The embedders: the OpenAI-compatible one against a local `/v1/embeddings` test server (axum, on a real socket),
//! and the local sentence-transformer against vectors computed by sentence-transformers itself.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use engram_connectors::embedders::EmbedderMetrics;
use engram_connectors::openai::{LlmMetrics, OpenAiClient, OpenAiConfig, OpenAiEmbedder, ResponseFormat};
use operators::{Embedder, HashEmbedder};
use serde_json::{json, Value};

#[derive(Clone, Copy, Debug)]
enum Fault {
    TooMany,
    ServerError,
    Malformed,
    WrongCount,
    BadRequest,
}

#[derive(Default)]
struct Server {
    faults: Mutex<VecDeque<Fault>>,
    /// The `input` array of every request that reached the handler.
    seen: Mutex<Vec<Vec<String>>>,
}

/// The server's "model": a 16-dimensional hash embedding, scaled by 3 so that normalisation is visible.
fn server_vector(text: &str) -> Vec<f32> {
    HashEmbedder::new(16).embed(text).to_dense().iter().map(|x| 3.0 * x).collect()
}

async fn embeddings(State(srv): State<Arc<Server>>, Json(body): Json<Value>) -> Response {
    let inputs: Vec<String> =
        body["input"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect();
    srv.seen.lock().unwrap().push(inputs.clone());
    let fault = srv.faults.lock().unwrap().pop_front();
    match fault {
        Some(Fault::TooMany) => {
            return (StatusCode::TOO_MANY_REQUESTS, [("retry-after", "0.1")], "slow down").into_response()
        }
        Some(Fault::ServerError) => return (StatusCode::INTERNAL_SERVER_ERROR, "boom").into_response(),
        Some(Fault::Malformed) => return (StatusCode::OK, "{\"data\": [").into_response(),
        Some(Fault::BadRequest) => return (StatusCode::BAD_REQUEST, "{\"error\":\"no such model\"}").into_response(),
        _ => {}
    }
    // Items in reverse order: the client must place them by `index`.
    let mut data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"object": "embedding", "index": i, "embedding": server_vector(t)}))
        .rev()
        .collect();
    if matches!(fault, Some(Fault::WrongCount)) {
        data.pop();
    }
    Json(json!({"object": "list", "data": data, "model": body["model"], "usage": {"prompt_tokens": 5 * inputs.len(), "total_tokens": 5 * inputs.len()}}))
        .into_response()
}

async fn start(faults: Vec<Fault>) -> (Arc<Server>, String) {
    let srv = Arc::new(Server { faults: Mutex::new(faults.into()), ..Server::default() });
    let app = Router::new().route("/v1/embeddings", post(embeddings)).with_state(srv.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (srv, format!("http://{addr}/v1"))
}

fn client(base_url: String, registry: &prometheus::Registry) -> OpenAiClient {
    let cfg = OpenAiConfig {
        base_url,
        model: "test-embed".into(),
        api_key: None,
        requests_per_minute: 6000,
        tokens_per_minute: 10_000_000,
        max_in_flight: 2,
        timeout: Duration::from_secs(5),
        max_retries: 4,
        response_format: ResponseFormat::JsonObject,
        max_tokens: 0,
        backoff: Duration::from_millis(10),
    };
    OpenAiClient::new(cfg, LlmMetrics::with_prefix(registry, "engram_embedder", "embedder").unwrap()).unwrap()
}

fn normalised(v: Vec<f32>) -> Vec<f32> {
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    v.into_iter().map(|x| x / n).collect()
}

/// Builds the embedder and embeds off the test's runtime (the embedder blocks).
async fn embed(
    url: String,
    log: std::path::PathBuf,
    batch: usize,
    texts: Vec<String>,
) -> (Result<Vec<Vec<f32>>, String>, String) {
    tokio::task::spawn_blocking(move || {
        let registry = prometheus::Registry::new();
        let metrics = EmbedderMetrics::new(&registry).unwrap();
        let e = match OpenAiEmbedder::new(client(url, &registry), &log, batch, Some(metrics)) {
            Ok(e) => e,
            Err(e) => return (Err(e), String::new()),
        };
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let out = e.embed_batch(&refs).into_iter().map(|e| e.to_dense()).collect();
        let text = prometheus::TextEncoder::new().encode_to_string(&registry.gather()).unwrap();
        (Ok(out), text)
    })
    .await
    .unwrap()
}

fn texts(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("text number {i} about the harbour and the sea wall {}", i * 7)).collect()
}

#[tokio::test]
async fn batches_in_order_survive_faults_and_replay_from_the_log() {
    let (srv, url) = start(vec![Fault::TooMany, Fault::ServerError, Fault::Malformed, Fault::WrongCount]).await;
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("embeddings.log");
    let mut input = texts(10);
    input.push(input[3].clone()); // a duplicate is requested once
    let (out, metrics) = embed(url.clone(), log.clone(), 4, input.clone()).await;
    let out = out.unwrap();
    assert_eq!(out.len(), 11, "one vector per input, nothing lost");
    for (t, v) in input.iter().zip(&out) {
        let want = normalised(server_vector(t));
        assert!(
            v.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-6),
            "the vector of {t:?} in input order, L2-normalised"
        );
    }
    let seen = srv.seen.lock().unwrap().clone();
    // The four faults hit the probe (then three retries of it); then 10 distinct texts in batches of 4.
    let sizes: Vec<usize> = seen.iter().map(Vec::len).collect();
    assert_eq!(sizes, vec![1, 1, 1, 1, 1, 4, 4, 2], "probe with its retries, then batches of at most 4");
    assert!(metrics.contains("engram_embedder_requests_total{outcome=\"retry\",stage=\"embed\"} 4"), "{metrics}");
    assert!(metrics.contains("engram_embedder_texts_total") || metrics.contains("engram_embedder_logged_hits_total"));

    // A restart reads the log back: no probe, no request, the same vectors bit for bit.
    let (again, metrics) = embed(url, log, 4, input).await;
    assert_eq!(again.unwrap(), out);
    assert_eq!(srv.seen.lock().unwrap().len(), seen.len(), "zero requests on replay");
    assert!(metrics.contains("engram_embedder_logged_hits_total{kind=\"openai\"} 11"), "{metrics}");
}

#[tokio::test]
async fn a_wrong_model_or_url_is_an_error_at_start() {
    let (_srv, url) = start(vec![Fault::BadRequest]).await;
    let dir = tempfile::tempdir().unwrap();
    let (out, _) = embed(url, dir.path().join("e.log"), 4, texts(1)).await;
    let err = out.unwrap_err();
    assert!(err.contains("probe") && err.contains("400") && err.contains("no such model"), "{err}");
    let (out, _) = embed("http://127.0.0.1:9/v1".into(), dir.path().join("e2.log"), 4, texts(1)).await;
    assert!(out.unwrap_err().contains("probe"));
}

/// The model directory: `ENGRAM_MODEL_DIR`, else `.models/all-MiniLM-L6-v2` at the workspace root (where
/// `scripts/fetch-model.sh` puts it). CI sets `ENGRAM_REQUIRE_MODEL=1`, which turns a missing model into a failure.
#[cfg(feature = "local-embedder")]
fn model_dir() -> Option<std::path::PathBuf> {
    let dir = std::env::var_os("ENGRAM_MODEL_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.models/all-MiniLM-L6-v2"));
    if dir.join("model.safetensors").exists() {
        return Some(dir);
    }
    assert!(
        std::env::var("ENGRAM_REQUIRE_MODEL").is_err(),
        "ENGRAM_REQUIRE_MODEL is set but {} has no model (run scripts/fetch-model.sh)",
        dir.display()
    );
    eprintln!("SKIPPED: no model files in {} — run scripts/fetch-model.sh to test the local embedder", dir.display());
    None
}

#[cfg(feature = "local-embedder")]
#[test]
fn local_minilm_matches_sentence_transformers() {
    use engram_connectors::embedders::LocalEmbedder;
    let Some(dir) = model_dir() else { return };
    let fixture: Value =
        serde_json::from_str(include_str!("fixtures/minilm-reference.json")).expect("the committed fixture");
    let items = fixture["items"].as_array().unwrap();
    let texts: Vec<&str> = items.iter().map(|i| i["text"].as_str().unwrap()).collect();
    // Batch 3: padding inside a batch must not change any vector.
    let e = LocalEmbedder::load(&dir, 3).unwrap();
    assert_eq!(e.dim(), 384);
    let got = e.embed_batch(&texts);
    for (item, v) in items.iter().zip(&got) {
        let want = normalised(item["vector"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap() as f32).collect());
        let cos: f32 = v.to_dense().iter().zip(&want).map(|(a, b)| a * b).sum();
        assert!(cos >= 0.999, "cosine {cos} for {:?}", item["text"]);
        let norm: f32 = v.to_dense().iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4);
    }
    // One at a time equals in a batch.
    let single = e.embed(texts[1]);
    let cos: f32 = single.to_dense().iter().zip(got[1].to_dense().iter()).map(|(a, b)| a * b).sum();
    assert!(cos > 0.99999);
    // A missing directory is a clear error.
    let err = LocalEmbedder::load(std::path::Path::new("/nonexistent/model"), 8).err().unwrap();
    assert!(err.contains("config.json"), "{err}");
}
