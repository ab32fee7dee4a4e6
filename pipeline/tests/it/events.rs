//! The event memory end to end: the bundled stand-up conversation becomes events (every turn in exactly one, in
//! order) with typed relations; a new turn reaches its event within an epoch; deleting the conversation retracts
//! them all.

use std::time::{Duration, Instant};

use crate::common::{get, post, Engine};
use serde_json::{json, Value};

async fn space(engine: &Engine, name: &str) -> Value {
    let (_, spaces) = get(&format!("{}/v1/spaces", engine.api)).await;
    spaces["spaces"].as_array().and_then(|a| a.iter().find(|s| s["space"] == name).cloned()).unwrap_or(Value::Null)
}

#[tokio::test]
async fn standup_events_relations_live_turns_and_retraction() {
    let dir = tempfile::tempdir().unwrap();
    let standup = format!("{}/../examples/standup.jsonl", env!("CARGO_MANIFEST_DIR"));
    let engine = Engine::start(dir.path(), &["--input", &standup], &[]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while space(&engine, "standup").await["nodes"] != 54 {
        assert!(Instant::now() < deadline, "the stand-up did not arrive");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let s = space(&engine, "standup").await;
    let (_, all) = get(&format!("{}/v1/spaces/standup/events", engine.api)).await;
    let events = all["events"].as_array().unwrap();
    assert_eq!(s["events"].as_u64().unwrap() as usize, events.len());
    assert!(events.len() >= 4 && events.len() <= 27, "{} events for 54 turns", events.len());
    // Every turn in exactly one event, events in turn order.
    let turns: Vec<String> = events
        .iter()
        .flat_map(|e| e["turns"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()))
        .collect();
    let text = std::fs::read_to_string(&standup).unwrap();
    let want: Vec<String> = text
        .lines()
        .map(|l| format!("team-standup#{}", serde_json::from_str::<Value>(l).unwrap()["turn"].as_str().unwrap()))
        .collect();
    assert_eq!(turns, want);
    let topics: std::collections::BTreeSet<&str> = events.iter().map(|e| e["topic"].as_str().unwrap()).collect();
    assert_eq!(topics.len(), (events.len() / 5).clamp(2, 50), "k-means with max(2, min(N/5, 50)) topics");
    assert_eq!(s["topics"].as_u64().unwrap() as usize, topics.len());
    for e in events {
        assert!(!e["summary"].as_str().unwrap().is_empty());
        assert!(!e["people"].as_array().unwrap().is_empty());
    }
    let relations = all["relations"].as_array().unwrap();
    // A temporal chain within each of the two sessions.
    assert_eq!(relations.iter().filter(|r| r["kind"] == "temporal").count(), events.len() - 2);
    assert_eq!(s["relations"].as_u64().unwrap() as usize, relations.len());
    // An event as a node.
    let id = events[1]["id"].as_str().unwrap();
    let (status, node) = get(&format!("{}/v1/spaces/standup/nodes/{id}", engine.api)).await;
    assert_eq!(status, 200, "{node}");
    assert_eq!(node["kind"], "event");
    assert!(node["relations"].as_array().unwrap().len() >= 2, "{node}");
    // A topic as a node: its member events.
    let topic = events[1]["topic"].as_str().unwrap();
    let (status, t) = get(&format!("{}/v1/spaces/standup/nodes/{topic}", engine.api)).await;
    assert_eq!(status, 200, "{t}");
    assert_eq!(t["kind"], "topic");
    let children = t["children"].as_array().unwrap();
    assert!(children.iter().any(|c| c == id), "{t}");
    assert_eq!(children.len(), events.iter().filter(|e| e["topic"] == topic).count());

    // Compass: planner, explorers over the events and their relations, turns of the explored events as evidence.
    let q = json!({"query": "What went wrong with the migration and who is fixing it?", "mode": "compass", "k": 3, "budget_words": 200});
    let (status, resp) = post(&format!("{}/v1/spaces/standup/query", engine.api), q.to_string()).await;
    assert_eq!(status, 200, "{resp}");
    let steps: Vec<&str> = resp["trace"].as_array().unwrap().iter().filter_map(|t| t["step"].as_str()).collect();
    assert_eq!(&steps[..2], &["plan", "explore"], "{steps:?}");
    assert!(
        resp["trace"][0]["subgoals"].as_array().unwrap().len() >= 2,
        "the question's clauses: {}",
        resp["trace"][0]
    );
    let evidence = resp["evidence"].as_array().unwrap();
    assert!(!evidence.is_empty());
    assert!(evidence.iter().all(|e| !e["source"]["events"].as_array().unwrap().is_empty()));
    assert!(evidence.iter().any(|e| e["text"].as_str().unwrap().contains("igration")), "{resp}");
    let words: usize = evidence.iter().map(|e| e["text"].as_str().unwrap().split_whitespace().count()).sum();
    assert!(words <= 200);

    // Live: a new turn is in an event as soon as its receipt is reflected; earlier events keep their ids.
    let turn = json!({"kind": "turn", "conversation": "team-standup", "turn": "D2:29", "speaker": "Ana",
                      "text": "One more thing: the demo for Brightwater Foods moves to Friday at ten."});
    let (_, r) = post(&format!("{}/v1/spaces/standup/records", engine.api), turn.to_string()).await;
    let receipt = r["receipt"].as_str().unwrap();
    let (_, after) = get(&format!("{}/v1/spaces/standup/events?after={receipt}", engine.api)).await;
    let after_events = after["events"].as_array().unwrap();
    let last = after_events.last().unwrap();
    assert_eq!(last["turns"].as_array().unwrap().last().unwrap(), "team-standup#D2:29");
    let kept = events[..events.len() - 1].iter().filter(|e| after_events.iter().any(|a| a["id"] == e["id"])).count();
    assert_eq!(kept, events.len() - 1, "appending a turn changes only the last event");

    // Merging: a second conversation that retells the first session merges with it, event by event (the same
    // segmentation, the same summaries: cosine 1 ≥ 0.88).
    let copy: Vec<String> = text
        .lines()
        .filter(|l| l.contains("\"D1:"))
        .map(|l| {
            let mut v: Value = serde_json::from_str(l).unwrap();
            v["conversation"] = json!("retold");
            v.as_object_mut().unwrap().remove("space");
            v.to_string()
        })
        .collect();
    let (_, r) = post(&format!("{}/v1/spaces/standup/records", engine.api), copy.join("\n")).await;
    let receipt = r["receipt"].as_str().unwrap();
    let (_, merged) = get(&format!("{}/v1/spaces/standup/events?after={receipt}", engine.api)).await;
    let retold: Vec<&Value> =
        merged["events"].as_array().unwrap().iter().filter(|e| e["conversation"] == "retold").collect();
    assert!(!retold.is_empty());
    let all_events = merged["events"].as_array().unwrap();
    for e in &retold {
        let partner = all_events.iter().any(|o| o["conversation"] == "team-standup" && o["group"] == e["group"]);
        assert!(partner, "a retold event shares a group with an original one: {e}");
    }
    assert!(space(&engine, "standup").await["merged_events"].as_u64().unwrap() >= retold.len() as u64);
    let del = json!({"kind": "delete", "conversation": "retold"});
    post(&format!("{}/v1/spaces/standup/records", engine.api), del.to_string()).await;

    // Deleting the conversation retracts its events and relations.
    let del = json!({"kind": "delete", "conversation": "team-standup"});
    let (status, r) = post(&format!("{}/v1/spaces/standup/records", engine.api), del.to_string()).await;
    assert_eq!(status, 200, "{r}");
    let receipt = r["receipt"].as_str().unwrap();
    let (status, gone) = get(&format!("{}/v1/spaces/standup/events?after={receipt}", engine.api)).await;
    // The space held only this conversation: it is gone as a whole, or empty.
    if status == 404 {
        assert_eq!(gone["error"]["code"], "unknown_space", "{gone}");
    } else {
        assert_eq!(gone["events"], json!([]), "{gone}");
        assert_eq!(gone["relations"], json!([]));
    }
    // The hierarchy follows: once it holds the receipt, nothing of the space is left.
    let (status, layer) = get(&format!("{}/v1/spaces/standup/layers/1?after={receipt}", engine.api)).await;
    assert!(status == 404 || layer["total"] == 0, "{layer}");
    assert!(space(&engine, "standup").await.is_null());
}
