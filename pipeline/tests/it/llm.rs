//! The engine with `llm.backend = "openai"` against a local OpenAI-compatible test server: cluster summaries come
//! from the server (through 500s, which are retried), and a restart makes zero calls, counted at the server.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

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

#[tokio::test]
async fn summaries_from_an_openai_compatible_server_and_no_call_on_restart() {
    let calls = Arc::new(AtomicUsize::new(0));
    let base =
        crate::common::serve(Router::new().route("/v1/chat/completions", post(chat)).with_state(calls.clone())).await;

    let dir = tempfile::tempdir().unwrap();
    let news = format!("{}/../examples/news.jsonl", env!("CARGO_MANIFEST_DIR"));
    let env = crate::common::llm_env(&base);
    let mut engine = Engine::start(dir.path(), &["--input", &news], &env);
    let space = crate::common::settled_news(&engine).await;
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
    crate::common::settled_news(&engine).await;
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
    crate::common::settled_news(&engine).await;
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
    crate::common::settled_news(&engine).await;
    let (_, after) = crate::common::post(&format!("{}/v1/spaces/news/query", engine.api), q.to_string()).await;
    assert_eq!(after["answer"], "twenty six million pounds", "{after}");
    assert_eq!(asked.lock().unwrap().len(), before, "a restart asks nothing again");
}

/// A llama.cpp-like server: `json_schema` is answered 500; `{"type": "json_object", "schema": …}` is honoured — but
/// a summary of anything about the storm is never the JSON asked for.
#[derive(Default)]
struct Llama {
    formats: Vec<String>,
    summaries: usize,
    poisoned: usize,
}

async fn llama(State(seen): State<Arc<std::sync::Mutex<Llama>>>, Json(body): Json<Value>) -> axum::response::Response {
    let format = &body["response_format"];
    let kind = match (format["type"].as_str(), format.get("schema").is_some()) {
        (Some("json_schema"), _) => "json_schema",
        (Some("json_object"), true) => "json_object+schema",
        _ => "json_object",
    };
    let user = body["messages"][1]["content"].as_str().unwrap_or("").to_string();
    let mut seen = seen.lock().unwrap();
    seen.formats.push(kind.to_string());
    if kind == "json_schema" {
        return (StatusCode::INTERNAL_SERVER_ERROR, "response_format: json_schema is not supported").into_response();
    }
    let content = if user.contains("colour") {
        json!({"colour": "blue"}).to_string()
    } else if user.to_lowercase().contains("storm") {
        seen.summaries += 1;
        seen.poisoned += 1;
        json!({"text": "not what was asked"}).to_string()
    } else {
        seen.summaries += 1;
        json!({"summary": "S: a summary"}).to_string()
    };
    Json(json!({"choices": [{"message": {"role": "assistant", "content": content}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 5}}))
    .into_response()
}

/// `llm.response-format = "auto"` finds the form a llama.cpp-like server enforces (json_schema first, refused; then a
/// json_object with its schema), and every request carries it; a request the model keeps failing at stops costing
/// after `llm.max-failures` attempts — its extractive answer is logged in its place, with the reason — and a restart
/// asks nothing but the probe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_structured_form_is_probed_and_a_failing_request_falls_back() {
    let seen = Arc::new(std::sync::Mutex::new(Llama::default()));
    let base =
        crate::common::serve(Router::new().route("/v1/chat/completions", post(llama)).with_state(seen.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let news = format!("{}/../examples/news.jsonl", env!("CARGO_MANIFEST_DIR"));
    let mut env = crate::common::llm_env(&base);
    env.retain(|(k, _)| *k != "ENGRAM__LLM__RESPONSE_FORMAT");
    env.push(("ENGRAM__LLM__MAX_FAILURES", "2"));
    let mut engine = Engine::start(dir.path(), &["--input", &news], &env);
    let space = crate::common::settled_news(&engine).await;
    {
        let seen = seen.lock().unwrap();
        assert_eq!(seen.formats[..2], ["json_schema", "json_object+schema"], "the probe, strongest form first");
        assert!(seen.formats[2..].iter().all(|f| f == "json_object+schema"), "{:?}", seen.formats);
        assert!(seen.poisoned > 0 && seen.summaries > seen.poisoned);
    }
    let clusters = space["clusters"].as_u64().unwrap() as usize;
    let poisoned_calls = seen.lock().unwrap().poisoned;
    // Each failed attempt is a request and one repair round: 2 attempts, 4 calls at most per poisoned request.
    assert!(poisoned_calls <= 4 * clusters, "{poisoned_calls} calls for {clusters} clusters");
    let text =
        crate::common::client().get(format!("{}/metrics", engine.admin)).send().await.unwrap().text().await.unwrap();
    let fallbacks: f64 = text
        .lines()
        .find_map(|l| l.strip_prefix("engram_llm_fallbacks_total{kind=\"summary\"} ").and_then(|v| v.parse().ok()))
        .expect("fallbacks counted");
    assert!(fallbacks >= 1.0, "{text}");
    assert_eq!(poisoned_calls, 4 * fallbacks as usize, "every poisoned request asked exactly twice, then fell back");
    let rows = crate::common::log_rows(&dir.path().join("responses.log"));
    let fell: Vec<&Value> = rows.iter().filter(|r| r["fallback"].is_string()).collect();
    assert_eq!(fell.len(), fallbacks as usize);
    assert!(fell.iter().all(|r| r["fallback"].as_str().unwrap().contains("summary")), "{fell:?}");
    assert!(fell.iter().all(|r| !r["response"].as_str().unwrap().starts_with("S: ")));
    let (_, chunk) = get(&format!("{}/v1/spaces/news/nodes/pm-2026-11-23-storm%230", engine.api)).await;
    let parent = chunk["parents"][0].as_str().unwrap().to_string();
    let (_, cluster) = get(&format!("{}/v1/spaces/news/nodes/{parent}", engine.api)).await;
    assert!(!cluster["text"].as_str().unwrap().starts_with("S: "), "the extractive summary: {cluster}");
    assert_eq!(engine.terminate(), Some(0));

    let before = seen.lock().unwrap().summaries;
    let engine = Engine::start(dir.path(), &["--input", &news], &env);
    crate::common::settled_news(&engine).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(seen.lock().unwrap().summaries, before, "a restart asks nothing: fallbacks are logged answers");
}
