//! The engine with `llm.backend = "openai"` against a local OpenAI-compatible test server: cluster summaries come
//! from the server (through 500s, which are retried), and a restart makes zero calls, counted at the server.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::{get, Engine};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

async fn chat(State(calls): State<Arc<AtomicUsize>>, Json(body): Json<Value>) -> axum::response::Response {
    let n = calls.fetch_add(1, Ordering::SeqCst);
    if n % 5 == 4 {
        return (StatusCode::INTERNAL_SERVER_ERROR, "flaky").into_response();
    }
    let user = body["messages"][1]["content"].as_str().unwrap_or("");
    let passages: Value = user.find('[').and_then(|i| serde_json::from_str(&user[i..]).ok()).unwrap_or(Value::Null);
    let first = passages[0]["text"].as_str().unwrap_or("?");
    let head: Vec<&str> = first.split_whitespace().take(5).collect();
    let content = json!({"summary": format!("S: {}", head.join(" "))}).to_string();
    Json(json!({"choices": [{"message": {"role": "assistant", "content": content}}],
                "usage": {"prompt_tokens": 100, "completion_tokens": 10}}))
    .into_response()
}

async fn settled(engine: &Engine) -> Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (_, spaces) = get(&format!("{}/v1/spaces", engine.api)).await;
        if let Some(news) = spaces["spaces"].as_array().and_then(|a| a.iter().find(|s| s["space"] == "news")) {
            if news["nodes"] == 59 && news["layers"].as_array().unwrap().len() >= 3 && news["summaries_pending"] == 0 {
                return news.clone();
            }
        }
        assert!(Instant::now() < deadline, "not settled: {spaces}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn summaries_from_an_openai_compatible_server_and_no_call_on_restart() {
    let calls = Arc::new(AtomicUsize::new(0));
    let base =
        crate::common::serve(Router::new().route("/v1/chat/completions", post(chat)).with_state(calls.clone())).await;

    let dir = tempfile::tempdir().unwrap();
    let news = format!("{}/../examples/news.jsonl", env!("CARGO_MANIFEST_DIR"));
    let env = crate::common::llm_env(&base);
    let mut engine = Engine::start(dir.path(), &["--input", &news], &env);
    let space = settled(&engine).await;
    let clusters = space["clusters"].as_u64().unwrap() as usize;
    let made = calls.load(Ordering::SeqCst);
    assert!(made >= clusters, "{made} calls for {clusters} clusters");

    let (_, chunk) = get(&format!("{}/v1/spaces/news/nodes/pm-2026-11-23-storm%230", engine.api)).await;
    let parent = chunk["parents"][0].as_str().unwrap().to_string();
    let (_, cluster) = get(&format!("{}/v1/spaces/news/nodes/{parent}", engine.api)).await;
    assert!(cluster["text"].as_str().unwrap().starts_with("S: "), "{cluster}");
    let logged = std::fs::read_to_string(dir.path().join("responses.log")).unwrap();
    assert!(logged.lines().all(|l| l.contains("\"model\":\"test-model\"")));
    assert_eq!(engine.terminate(), Some(0));

    let engine = Engine::start(dir.path(), &["--input", &news], &env);
    settled(&engine).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(calls.load(Ordering::SeqCst), made, "a restart makes no call: every response is in the log");
}

/// Summaries as above; answers `{"answer": …}` counted per question; a question with "poison" in it gets a reply
/// that is not the JSON asked for, every time.
async fn responder(State(asked): State<Arc<std::sync::Mutex<Vec<String>>>>, Json(body): Json<Value>) -> Json<Value> {
    let stage = body["response_format"]["json_schema"]["name"].as_str().unwrap_or("");
    let user = body["messages"][1]["content"].as_str().unwrap_or("").to_string();
    let content = if stage == "answer" {
        asked.lock().unwrap().push(user.clone());
        if user.contains("poison") {
            json!({"reply": "not what was asked"}).to_string()
        } else {
            json!({"answer": "twenty six million pounds"}).to_string()
        }
    } else {
        json!({"summary": "a summary"}).to_string()
    };
    Json(
        json!({"choices": [{"message": {"role": "assistant", "content": content}}], "usage": {"prompt_tokens": 10, "completion_tokens": 5}}),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_come_from_the_model_once_and_a_bad_reply_leaves_the_evidence() {
    let asked = Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let base =
        crate::common::serve(Router::new().route("/v1/chat/completions", post(responder)).with_state(asked.clone()))
            .await;
    let dir = tempfile::tempdir().unwrap();
    let news = format!("{}/../examples/news.jsonl", env!("CARGO_MANIFEST_DIR"));
    let env = crate::common::llm_env(&base);
    let mut engine = Engine::start(dir.path(), &["--input", &news], &env);
    settled(&engine).await;
    let url = format!("{}/v1/spaces/news/query", engine.api);
    let q = json!({"query": "How much will the sea wall cost?", "mode": "flat", "k": 3});
    let (status, resp) = crate::common::post(&url, q.to_string()).await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["answer"], "twenty six million pounds", "{resp}");
    assert!(resp.get("answer_error").is_none(), "{resp}");
    {
        let asked = asked.lock().unwrap();
        assert_eq!(asked.len(), 1);
        // The prompt carries the question and the evidence, best first.
        assert!(asked[0].contains("How much will the sea wall cost?"));
        assert!(asked[0].contains(resp["evidence"][0]["text"].as_str().unwrap()), "{}", asked[0]);
    }
    // The same question over the same evidence is answered from the response log.
    let (_, again) = crate::common::post(&url, q.to_string()).await;
    assert_eq!(again["answer"], resp["answer"]);
    assert_eq!(asked.lock().unwrap().len(), 1, "asked once");
    // Evidence only, on request.
    let (_, plain) =
        crate::common::post(&url, json!({"query": "sea wall cost", "mode": "flat", "answer": false}).to_string()).await;
    assert_eq!(plain["answer"], Value::Null);
    assert_eq!(asked.lock().unwrap().len(), 1);
    // A reply that is not the JSON asked for (after the client's repair round): the evidence, and why no answer.
    let (status, bad) =
        crate::common::post(&url, json!({"query": "poison: the sea wall", "mode": "flat"}).to_string()).await;
    assert_eq!(status, 200, "{bad}");
    assert_eq!(bad["answer"], Value::Null);
    assert!(bad["answer_error"].as_str().unwrap().contains("answer"), "{bad}");
    assert!(!bad["evidence"].as_array().unwrap().is_empty());
    assert_eq!(engine.terminate(), Some(0));

    // After a restart the logged answer is served without a call.
    let before = asked.lock().unwrap().len();
    let engine = Engine::start(dir.path(), &["--input", &news], &env);
    settled(&engine).await;
    let (_, after) = crate::common::post(&format!("{}/v1/spaces/news/query", engine.api), q.to_string()).await;
    assert_eq!(after["answer"], "twenty six million pounds", "{after}");
    assert_eq!(asked.lock().unwrap().len(), before, "a restart asks nothing again");
}
