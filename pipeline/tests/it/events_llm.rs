//! The event memory with `llm.backend = "openai"` against a local OpenAI-compatible test server that answers
//! segmentation and relation requests from a script (one malformed reply included): the model's events replace the
//! extractive ones, and a restart makes no call; a live session reaches the model within its bound; the model steers
//! Prune-and-Grow's selection and CompassMem's planner and explorers.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{get, Engine};
use axum::extract::State;
use axum::routing::post;
use axum::{Json, Router};
use serde_json::{json, Value};

type Calls = Arc<Mutex<BTreeMap<String, usize>>>;

async fn chat(State(calls): State<Calls>, Json(body): Json<Value>) -> Json<Value> {
    let stage = body["response_format"]["json_schema"]["name"].as_str().unwrap_or("?").to_string();
    let n = {
        let mut c = calls.lock().unwrap();
        let e = c.entry(stage.clone()).or_default();
        *e += 1;
        *e
    };
    let user = body["messages"][1]["content"].as_str().unwrap_or("");
    let rows: Value = user.find('[').and_then(|i| serde_json::from_str(&user[i..]).ok()).unwrap_or(Value::Null);
    let count = rows.as_array().map_or(0, Vec::len);
    let content = match stage.as_str() {
        // The very first segmentation reply leaves out the last turn: the client sends it back once (repair).
        "segment" if n == 1 && body["messages"].as_array().unwrap().len() == 2 => {
            json!({"events": [{"turns": [1], "summary": "incomplete", "people": [], "time": null}]})
        }
        "segment" => {
            let events: Vec<Value> = (0..count)
                .collect::<Vec<_>>()
                .chunks(4)
                .enumerate()
                .map(|(k, c)| json!({"turns": c.iter().map(|i| i + 1).collect::<Vec<_>>(), "summary": format!("LLM event {}", k + 1),
                                     "people": [rows[c[0]]["speaker"]], "time": rows[c[0]]["time"]}))
                .collect();
            json!({"events": events})
        }
        "relate" => {
            json!({"relations": (1..count).map(|i| json!({"from": i, "to": i + 1, "kind": "causal"})).collect::<Vec<_>>()})
        }
        // Retrieval steps: passages that mention the demo are chosen; the plan has two subgoals.
        "select" => {
            let chosen: Vec<usize> = rows
                .as_array()
                .into_iter()
                .flatten()
                .enumerate()
                .filter(|(_, r)| r["text"].as_str().unwrap_or("").to_lowercase().contains("demo"))
                .map(|(i, _)| i + 1)
                .collect();
            json!({"relevant": chosen})
        }
        // A question with "poison" in it gets a plan that is not the JSON asked for.
        "plan" if user.contains("poison") => json!({"steps": "none"}),
        "plan" => json!({"subgoals": ["when the customer demo is", "who presents the demo"]}),
        // The co-reference judge: events 1 and 4 (of either session) are one event, events 2 and 3 overlap.
        "judge" => {
            let (a, b) = user.split_once("\nEvent 2: ").unwrap_or((user, ""));
            let pair = |x: &str, y: &str| (a.contains(x) && b.contains(y)) || (a.contains(y) && b.contains(x));
            let verdict = if pair("LLM event 1 ", "LLM event 4 ") {
                "same_event"
            } else if pair("LLM event 2 ", "LLM event 3 ") {
                "has_overlap"
            } else {
                "different"
            };
            json!({"verdict": verdict})
        }
        // The explorer: the first event shown answers the subgoal, the rest are skipped (no walk follows).
        "explore" => {
            let actions: Vec<Value> =
                (1..=count).map(|i| json!({"event": i, "action": if i == 1 { "answer" } else { "skip" }})).collect();
            json!({"actions": actions})
        }
        _ => json!({"summary": "a cluster summary"}),
    };
    Json(
        json!({"choices": [{"message": {"role": "assistant", "content": content.to_string()}}], "usage": {"prompt_tokens": 10, "completion_tokens": 5}}),
    )
}

async fn settled(engine: &Engine) -> Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (_, spaces) = get(&format!("{}/v1/spaces", engine.api)).await;
        if let Some(s) = spaces["spaces"].as_array().and_then(|a| a.iter().find(|s| s["space"] == "standup")) {
            if s["nodes"] == 54 && s["summaries_pending"] == 0 {
                let (_, ev) = get(&format!("{}/v1/spaces/standup/events", engine.api)).await;
                if ev["events"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .all(|e| e["summary"].as_str().unwrap().starts_with("LLM event"))
                {
                    return ev;
                }
            }
        }
        assert!(Instant::now() < deadline, "not settled: {spaces}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_events_replace_extractive_ones_and_a_restart_makes_no_call() {
    let (calls, base, standup) = scripted().await;
    let env = crate::common::llm_env(&base);
    let dir = tempfile::tempdir().unwrap();
    let mut engine = Engine::start(dir.path(), &["--input", &standup], &env);
    let ev = settled(&engine).await;
    let events = ev["events"].as_array().unwrap();
    // Two sessions (26 and 28 turns) in events of four turns: 7 + 7.
    assert_eq!(events.len(), 14, "{ev}");
    assert_eq!(events[0]["turns"].as_array().unwrap().len(), 4);
    assert_eq!(events[0]["people"], json!(["Ana"]));
    let relations = ev["relations"].as_array().unwrap();
    assert_eq!(relations.len(), 12, "a causal chain in each session");
    // Evidence: the turns of both ends (4 + 4, or 4 + 2 at the end of the 26-turn session).
    assert!(relations
        .iter()
        .all(|r| r["kind"] == "causal" && [6, 8].contains(&r["evidence"].as_array().unwrap().len())));
    let made = calls.lock().unwrap().clone();
    assert_eq!(made.get("segment"), Some(&3), "two sessions, one repaired: {made:?}");
    assert_eq!(made.get("relate"), Some(&2), "{made:?}");
    assert_eq!(engine.terminate(), Some(0));

    let engine = Engine::start(dir.path(), &["--input", &standup], &env);
    assert_eq!(settled(&engine).await["events"], ev["events"]);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(*calls.lock().unwrap(), made, "a restart makes no call");
}

/// The scripted server (its call counts and base URL) and the stand-up example's path.
async fn scripted() -> (Calls, String, String) {
    let calls: Calls = Arc::default();
    let base =
        crate::common::serve(Router::new().route("/v1/chat/completions", post(chat)).with_state(calls.clone())).await;
    (calls, base, format!("{}/../examples/standup.jsonl", env!("CARGO_MANIFEST_DIR")))
}

/// The turns of a session's events, in event order.
fn covered(events: &[Value]) -> Vec<String> {
    events.iter().flat_map(|e| e["turns"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string())).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_session_is_in_the_memory_at_once_and_reaches_the_model_within_its_bound() {
    let calls: Calls = Arc::default();
    let base =
        crate::common::serve(Router::new().route("/v1/chat/completions", post(chat)).with_state(calls.clone())).await;
    let env = [
        ("ENGRAM__LLM__BACKEND", "openai"),
        ("ENGRAM__LLM__BASE_URL", base.as_str()),
        ("ENGRAM__LLM__MODEL", "test-model"),
        ("ENGRAM__LLM__RESPONSE_FORMAT", "json-schema"),
        ("ENGRAM__LLM__REQUESTS_PER_MINUTE", "60000"),
        // A session that gains a turn every 150 ms never waits out this debounce: only the latency bound sends it.
        ("ENGRAM__HIERARCHY__SUMMARY_DEBOUNCE", "1h"),
        ("ENGRAM__EVENTS__MAX_LATENCY", "500ms"),
    ];
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(dir.path(), &[], &env);
    let n = 24;
    let mut model_events_while_live = 0;
    for i in 0..n {
        let turn = json!({"kind": "turn", "conversation": "meet", "turn": format!("T{i:02}"), "seq": i,
                          "speaker": if i % 2 == 0 { "Ana" } else { "Ben" },
                          "text": format!("Point {i} of the release plan: the budget line {i} and who owns it.")});
        let (status, r) =
            crate::common::post(&format!("{}/v1/spaces/live/records", engine.api), turn.to_string()).await;
        assert_eq!(status, 200, "{r}");
        let receipt = r["receipt"].as_str().unwrap();
        // In the memory as soon as its receipt is reflected: every turn so far in exactly one event, in order.
        let (_, ev) = get(&format!("{}/v1/spaces/live/events?after={receipt}", engine.api)).await;
        let events = ev["events"].as_array().unwrap();
        let want: Vec<String> = (0..=i).map(|j| format!("meet#T{j:02}")).collect();
        assert_eq!(covered(events), want, "{ev}");
        model_events_while_live = model_events_while_live
            .max(events.iter().filter(|e| e["summary"].as_str().unwrap().starts_with("LLM event")).count());
        tokio::time::sleep(Duration::from_millis(150)).await;
    }
    // The stream lasted over 3.6 s: the model was asked while it went on, and its events stood for the turns it had
    // seen while the newest turns were extractive.
    let asked = calls.lock().unwrap().get("segment").copied().unwrap_or(0);
    assert!(asked >= 2, "the model was asked {asked} times during the stream");
    assert!(model_events_while_live >= 1, "model events appeared while the session was live");
    // Within the bound after the last turn, the whole session is the model's.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, ev) = get(&format!("{}/v1/spaces/live/events", engine.api)).await;
        let events = ev["events"].as_array().unwrap().clone();
        if events.iter().all(|e| e["summary"].as_str().unwrap().starts_with("LLM event")) {
            assert_eq!(covered(&events).len(), n);
            assert_eq!(events.len(), n / 4, "the scripted model's events of four turns: {ev}");
            break;
        }
        assert!(Instant::now() < deadline, "the model never segmented the whole session: {ev}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_model_selects_plans_and_explores_and_each_call_is_made_once() {
    let (calls, base, standup) = scripted().await;
    let env = crate::common::llm_env(&base);
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(dir.path(), &["--input", &standup], &env);
    settled(&engine).await;
    let url = format!("{}/v1/spaces/standup/query", engine.api);

    // Prune-and-Grow: the kept layer-0 passages are the ones the model selected.
    let q = json!({"query": "When is the customer demo?", "mode": "prune-and-grow", "k": 8, "answer": false});
    let (status, pg) = crate::common::post(&url, q.to_string()).await;
    assert_eq!(status, 200, "{pg}");
    let trace = pg["trace"].as_array().unwrap();
    assert!(trace.iter().any(|t| t["step"] == "select" && t["why"] == "the model's selection"), "{pg}");
    let evidence = pg["evidence"].as_array().unwrap();
    assert!(!evidence.is_empty(), "{pg}");
    assert!(evidence.iter().all(|e| e["text"].as_str().unwrap().to_lowercase().contains("demo")), "{pg}");

    // Compass: the model's subgoals, and explorers that keep the one event the model says answers each.
    let q =
        json!({"query": "When is the customer demo and who presents it?", "mode": "compass", "k": 5, "answer": false});
    let (status, cp) = crate::common::post(&url, q.to_string()).await;
    assert_eq!(status, 200, "{cp}");
    let trace = cp["trace"].as_array().unwrap();
    assert_eq!(trace[0]["subgoals"], json!(["when the customer demo is", "who presents the demo"]), "{cp}");
    let explored: Vec<&Value> = trace.iter().filter(|t| t["step"] == "explore").collect();
    assert_eq!(explored.len(), 2, "one explorer per subgoal: {cp}");
    assert!(explored.iter().all(|t| t["why"].as_str().unwrap().contains("as the model chose")), "{cp}");
    for t in &explored {
        assert_eq!(t["events"], 1, "the answering event alone, and no walk from it: {t}");
        assert_eq!(t["walked"], json!([]), "{t}");
    }

    // The same queries again: every model step is answered from the response log.
    let before = calls.lock().unwrap().clone();
    let (_, again) = crate::common::post(&url, q.to_string()).await;
    assert_eq!(again["evidence"], cp["evidence"]);
    assert_eq!(*calls.lock().unwrap(), before, "no call made twice");

    // A plan that is not the JSON asked for (after the repair round): traced, and the rule plans instead.
    let q = json!({"query": "poison: when is the customer demo?", "mode": "compass", "answer": false});
    let (status, bad) = crate::common::post(&url, q.to_string()).await;
    assert_eq!(status, 200, "{bad}");
    let trace = bad["trace"].as_array().unwrap();
    assert!(trace.iter().any(|t| t["step"] == "model-error" && t["stage"] == "plan"), "{bad}");
    assert!(
        trace.iter().any(|t| t["step"] == "plan" && t["why"] == "the question and its clauses (no model)"),
        "{bad}"
    );
    assert!(!bad["evidence"].as_array().unwrap().is_empty());
    let before = calls.lock().unwrap().clone();

    // And the similarity rules on request.
    let q = json!({"query": "When is the customer demo and who presents it?", "mode": "compass", "use_model": false, "answer": false});
    let (_, rule) = crate::common::post(&url, q.to_string()).await;
    assert_eq!(rule["trace"][0]["why"], "the question and its clauses (no model)", "{rule}");
    assert_eq!(*calls.lock().unwrap(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coreference_judge_merges_and_links_events_across_sessions_once() {
    let (calls, base, standup) = scripted().await;
    let mut env = crate::common::llm_env(&base);
    env.extend([
        // Every pair of the 14 events is a candidate (each keeps all others as neighbours): lift the token budget so
        // that 91 calls take no time.
        ("ENGRAM__LLM__TOKENS_PER_MINUTE", "100000000"),
        ("ENGRAM__EVENTS__MERGE_NEIGHBOURS", "20"),
        ("ENGRAM__EVENTS__JUDGE", "true"),
        ("ENGRAM__EVENTS__JUDGE_THRESHOLD", "0.01"),
        // Only near-identical events merge by similarity: the merges below are the judge's.
        ("ENGRAM__EVENTS__MERGE_THRESHOLD", "0.99"),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let mut engine = Engine::start(dir.path(), &["--input", &standup], &env);
    settled(&engine).await;
    // Settled again once no judge request waits.
    let deadline = Instant::now() + Duration::from_secs(60);
    let ev = loop {
        let (_, pending) = get(&format!("{}/v1/spaces/standup/summaries/pending", engine.api)).await;
        let (_, ev) = get(&format!("{}/v1/spaces/standup/events", engine.api)).await;
        if pending["pending"].as_array().unwrap().is_empty()
            && ev["relations"].as_array().unwrap().iter().any(|r| r["kind"] == "overlap")
        {
            break ev;
        }
        assert!(Instant::now() < deadline, "the judge's verdicts never arrived: {pending}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let events = ev["events"].as_array().unwrap();
    let named = |p: &str| -> Vec<&Value> { events.iter().filter(|e| e["summary"] == p).collect() };
    // Events 1 and 4 of both sessions: judged one event, pair by pair, so one merge group.
    let one_and_four: Vec<&Value> = named("LLM event 1").into_iter().chain(named("LLM event 4")).collect();
    assert_eq!(one_and_four.len(), 4, "{ev}");
    assert!(one_and_four.iter().all(|e| e["group"] == one_and_four[0]["group"]), "merged by the judge: {ev}");
    assert!(named("LLM event 5").iter().all(|e| e["group"] != one_and_four[0]["group"]));
    // As a node, a merged event carries the other members of its group, their turns included.
    let id = one_and_four[0]["id"].as_str().unwrap();
    let (_, node) = get(&format!("{}/v1/spaces/standup/nodes/{id}", engine.api)).await;
    let merged = node["merged"].as_array().unwrap();
    assert_eq!(merged.len(), 3, "{node}");
    assert!(merged.iter().all(|m| !m["turns"].as_array().unwrap().is_empty() && m["id"] != id), "{node}");
    // Events 2 and 3: linked by `overlap` relations, and nothing else is.
    let two_three: Vec<&Value> =
        named("LLM event 2").into_iter().chain(named("LLM event 3")).map(|e| &e["id"]).collect();
    let overlap: Vec<&Value> = ev["relations"].as_array().unwrap().iter().filter(|r| r["kind"] == "overlap").collect();
    assert_eq!(overlap.len(), 4, "two 2s × two 3s: {overlap:?}");
    assert!(overlap.iter().all(|r| two_three.contains(&&r["from"]) && two_three.contains(&&r["to"])), "{overlap:?}");
    let judged = calls.lock().unwrap().get("judge").copied().unwrap_or(0);
    assert!(judged >= 2, "{judged} judge calls");
    assert_eq!(engine.terminate(), Some(0));

    // A restart replays every verdict: no pair is judged twice.
    let engine = Engine::start(dir.path(), &["--input", &standup], &env);
    settled(&engine).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, again) = get(&format!("{}/v1/spaces/standup/events", engine.api)).await;
    assert_eq!(again["relations"], ev["relations"]);
    assert_eq!(calls.lock().unwrap().get("judge").copied().unwrap_or(0), judged, "no pair judged twice");
}
