//! Kafka end to end against a real Kafka-compatible broker (tansu, started by `.ci/run`; `ENGRAM_TEST_KAFKA` names
//! it, default 127.0.0.1:9092): produce → memory, read-your-writes by offset, dead-letter and change topics, offsets
//! committed once reflected, consumer-group restart, kill -9 mid-stream → the same memory as an uninterrupted run
//! and no LLM call repeated (counted at a local OpenAI-compatible test server), and two processes splitting the
//! partitions between them building the memory of one.
#![cfg(feature = "kafka")]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::{get, post, Engine};
use axum::extract::State;
use axum::routing::post as route_post;
use axum::{Json, Router};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::TopicPartitionList;
use serde_json::{json, Value};

/// The broker, or `None` (the test is skipped, visibly) when none answers and CI did not ask for one.
fn brokers() -> Option<String> {
    let b = std::env::var("ENGRAM_TEST_KAFKA").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let reachable = b.split(',').any(|a| {
        use std::net::ToSocketAddrs;
        a.to_socket_addrs()
            .ok()
            .and_then(|mut s| s.next())
            .is_some_and(|s| std::net::TcpStream::connect_timeout(&s, Duration::from_secs(1)).is_ok())
    });
    if reachable {
        return Some(b);
    }
    assert!(std::env::var("ENGRAM_REQUIRE_KAFKA").is_err(), "ENGRAM_REQUIRE_KAFKA is set but no broker answers at {b}");
    eprintln!("SKIPPED: no Kafka broker at {b} — .ci/run starts one (tansu); set ENGRAM_TEST_KAFKA to use another");
    None
}

fn unique(name: &str) -> String {
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("{name}-{}-{}", std::process::id(), nanos % 1_000_000_000)
}

async fn create_topics(brokers: &str, topics: &[(&str, i32)]) {
    let admin: AdminClient<DefaultClientContext> =
        ClientConfig::new().set("bootstrap.servers", brokers).create().unwrap();
    let new: Vec<NewTopic> = topics.iter().map(|(t, p)| NewTopic::new(t, *p, TopicReplication::Fixed(1))).collect();
    let results = admin.create_topics(&new, &AdminOptions::new()).await.expect("create topics");
    for r in results {
        r.expect("topic created");
    }
}

/// Produces `(partition, key, payload)` and returns each message's offset.
async fn produce(brokers: &str, topic: &str, messages: &[(i32, &str, String)]) -> Vec<i64> {
    let p: FutureProducer = ClientConfig::new().set("bootstrap.servers", brokers).create().unwrap();
    let mut offsets = Vec::new();
    for (partition, key, payload) in messages {
        let delivery = p
            .send(FutureRecord::to(topic).partition(*partition).key(*key).payload(payload), Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)
            .expect("produce");
        offsets.push(delivery.offset);
    }
    offsets
}

fn kafka_env<'a>(brokers: &'a str, topic: &'a str, group: &'a str) -> Vec<(&'a str, &'a str)> {
    vec![("ENGRAM__KAFKA__BROKERS", brokers), ("ENGRAM__KAFKA__TOPICS", topic), ("ENGRAM__KAFKA__GROUP_ID", group)]
}

async fn space(engine: &Engine, name: &str) -> Value {
    let (_, spaces) = get(&format!("{}/v1/spaces", engine.api)).await;
    spaces["spaces"].as_array().and_then(|a| a.iter().find(|s| s["space"] == name).cloned()).unwrap_or(Value::Null)
}

async fn wait_until(what: &str, secs: u64, mut f: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn committed(brokers: &str, group: &str, topic: &str, partitions: i32) -> Vec<i64> {
    let c: BaseConsumer =
        ClientConfig::new().set("bootstrap.servers", brokers).set("group.id", group).create().unwrap();
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let got = c.committed_offsets(tpl, Duration::from_secs(10)).unwrap();
    (0..partitions).map(|p| got.find_partition(topic, p).unwrap().offset().to_raw().unwrap_or(-1)).collect()
}

fn chunk(doc: &str, seq: usize, text: &str) -> String {
    json!({"kind": "chunk", "doc": doc, "seq": seq, "text": text}).to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_from_kafka_with_dead_letters_changes_and_committed_offsets() {
    let Some(b) = brokers() else { return };
    let (topic, dl, changes, group) = (unique("records"), unique("dead"), unique("changes"), unique("group"));
    create_topics(&b, &[(&topic, 2), (&dl, 1), (&changes, 1)]).await;
    let msgs = vec![
        (0, "port", chunk("storm", 0, "A storm flooded the harbour district overnight.")),
        (1, "port", chunk("cup", 0, "The football club won the cup semi-final with a late goal.")),
        (0, "port", chunk("wall", 0, "The council approved the sea wall budget of twenty six million pounds.")),
        (1, "port", "{not json".to_string()),
        (1, "port", chunk("ferry", 0, "The island ferry was cancelled because of the storm.")),
    ];
    let offsets = produce(&b, &topic, &msgs).await;
    let dir = tempfile::tempdir().unwrap();
    let mut env = kafka_env(&b, &topic, &group);
    env.push(("ENGRAM__KAFKA__DEAD_LETTER_TOPIC", &dl));
    env.push(("ENGRAM__KAFKA__CHANGES_TOPIC", &changes));
    let engine = Engine::start(dir.path(), &[], &env);

    // Read-your-writes by Kafka position: the query waits until partition 1's last message is reflected.
    let q = json!({"query": "island ferry cancelled", "mode": "flat", "k": 1});
    let after = format!("{topic}:1:{}", offsets[4]);
    let (status, resp) = post(&format!("{}/v1/spaces/port/query?after={after}", engine.api), q.to_string()).await;
    assert_eq!(status, 200, "{resp}");
    assert_eq!(resp["evidence"][0]["id"], "ferry#0", "{resp}");
    wait_until("all four records", 30, async || space(&engine, "port").await["nodes"] == 4).await;
    let (status, resp) = post(&format!("{}/v1/spaces/port/query?after=nonsense", engine.api), q.to_string()).await;
    assert_eq!(status, 400, "{resp}");

    // The poison message: in the error collection and on the dead-letter topic, with its position and reason.
    let (_, errors) = get(&format!("{}/v1/errors", engine.api)).await;
    assert_eq!(errors["recent"][0]["source"], format!("kafka:{topic}/1:{}", offsets[3]), "{errors}");
    let mut dead: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    wait_until("the dead letter", 30, async || {
        dead = connectors::kafka::read_topic(&b, &dl, Duration::from_secs(10)).unwrap();
        !dead.is_empty()
    })
    .await;
    let d: Value = serde_json::from_slice(&dead[0].1).unwrap();
    assert_eq!(d["raw"], "{not json");
    assert!(d["reason"].as_str().unwrap().contains("JSON"), "{d}");

    // The change topic: an upsert per node, keyed by space.
    let mut changed: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    wait_until("node upserts on the change topic", 30, async || {
        changed = connectors::kafka::read_topic(&b, &changes, Duration::from_secs(10)).unwrap();
        changed.iter().filter(|(_, v)| String::from_utf8_lossy(v).contains("\"type\":\"node\"")).count() >= 4
    })
    .await;
    assert!(changed.iter().all(|(k, _)| k == b"port"));
    let first: Value = serde_json::from_slice(&changed[0].1).unwrap();
    assert_eq!(first["op"], "upsert");

    // Offsets are committed once reflected: the poison message too (it is dead-lettered, not retried).
    let group2 = group.clone();
    let (b2, t2) = (b.clone(), topic.clone());
    wait_until("committed offsets", 30, async || {
        let (b, g, t) = (b2.clone(), group2.clone(), t2.clone());
        tokio::task::spawn_blocking(move || committed(&b, &g, &t, 2)).await.unwrap()
            == vec![offsets[2] + 1, offsets[4] + 1]
    })
    .await;
    let metrics =
        crate::common::client().get(format!("{}/metrics", engine.admin)).send().await.unwrap().text().await.unwrap();
    for name in [
        "engram_kafka_consumer_lag",
        "engram_kafka_records_in_total",
        "engram_kafka_commit_seconds",
        "engram_kafka_records_out_total",
    ] {
        assert!(metrics.contains(name), "{name} missing");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_disk_rebuilds_the_whole_memory_from_the_partitions() {
    let Some(b) = brokers() else { return };
    let (topic, group) = (unique("resume"), unique("group"));
    create_topics(&b, &[(&topic, 1)]).await;
    produce(&b, &topic, &[(0, "s", chunk("a", 0, "alpha harbour")), (0, "s", chunk("b", 0, "beta harbour"))]).await;
    let env = kafka_env(&b, &topic, &group);
    let dir = tempfile::tempdir().unwrap();
    let mut engine = Engine::start(dir.path(), &[], &env);
    wait_until("two nodes", 30, async || space(&engine, "s").await["nodes"] == 2).await;
    let (b2, t2, g2) = (b.clone(), topic.clone(), group.clone());
    wait_until("the commit", 30, async || {
        let (b, t, g) = (b2.clone(), t2.clone(), g2.clone());
        tokio::task::spawn_blocking(move || committed(&b, &g, &t, 1)).await.unwrap() == vec![2]
    })
    .await;
    assert_eq!(engine.terminate(), Some(0));
    produce(&b, &topic, &[(0, "s", chunk("c", 0, "gamma harbour"))]).await;
    // A new data directory (a new pod with an empty disk) in the same group: nothing local is left, so every
    // partition is read from its beginning, and the memory holds the records before the group's offset too.
    let fresh = tempfile::tempdir().unwrap();
    let mut engine = Engine::start(fresh.path(), &[], &env);
    wait_until("all three records", 30, async || space(&engine, "s").await["nodes"] == 3).await;
    for (id, text) in [("a%230", "alpha harbour"), ("c%230", "gamma harbour")] {
        let (_, node) = get(&format!("{}/v1/spaces/s/nodes/{id}", engine.api)).await;
        assert_eq!(node["text"], text, "{node}");
    }
    // With its disk, a restart resumes after what its input log holds: nothing is read twice.
    assert_eq!(engine.terminate(), Some(0));
    let engine = Engine::start(fresh.path(), &[], &env);
    wait_until("the replayed memory", 30, async || space(&engine, "s").await["nodes"] == 3).await;
    let log = crate::common::log_rows(&fresh.path().join("input.log"));
    assert_eq!(log.iter().filter(|r| !r["record"].is_null()).count(), 3, "each record logged once");
}

async fn chat(State(seen): State<Arc<Mutex<Vec<String>>>>, Json(body): Json<Value>) -> Json<Value> {
    let user = body["messages"][1]["content"].as_str().unwrap_or("").to_string();
    seen.lock().unwrap().push(user.clone());
    let n = user.len();
    let content = json!({"summary": format!("summary of {n} bytes")}).to_string();
    Json(
        json!({"choices": [{"message": {"role": "assistant", "content": content}}], "usage": {"prompt_tokens": 10, "completion_tokens": 5}}),
    )
}

async fn settled(engine: &Engine, nodes: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let s = space(engine, "news").await;
        let caught_up = s["hierarchy_as_of"] == s["as_of"];
        if s["nodes"] == nodes
            && s["summaries_pending"] == 0
            && s["layers"].as_array().is_some_and(|l| l.len() >= 2)
            && caught_up
        {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let again = space(engine, "news").await;
            if again == s {
                return s;
            }
        }
        assert!(Instant::now() < deadline, "not settled: {s}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_stream_gives_the_uninterrupted_memory_and_repeats_no_llm_call() {
    let Some(b) = brokers() else { return };
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let base =
        crate::common::serve(Router::new().route("/v1/chat/completions", route_post(chat)).with_state(seen.clone()))
            .await;

    let news = std::fs::read_to_string(format!("{}/../examples/news.jsonl", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let lines: Vec<(i32, &str, String)> = news.lines().map(|l| (0, "news", l.to_string())).collect();
    let (first, second) = lines.split_at(lines.len() / 2);
    let (topic, group) = (unique("news"), unique("group"));
    create_topics(&b, &[(&topic, 1)]).await;
    produce(&b, &topic, first).await;

    let mut env = kafka_env(&b, &topic, &group);
    env.extend([
        ("ENGRAM__LLM__BACKEND", "openai"),
        ("ENGRAM__LLM__BASE_URL", base.as_str()),
        ("ENGRAM__LLM__MODEL", "test-model"),
        ("ENGRAM__LLM__RESPONSE_FORMAT", "json-schema"),
        ("ENGRAM__LLM__REQUESTS_PER_MINUTE", "60000"),
        // Long enough that the kill lands before any summary is asked for: what is asked is asked once.
        ("ENGRAM__HIERARCHY__SUMMARY_DEBOUNCE", "3s"),
    ]);
    let dir = tempfile::tempdir().unwrap();
    let mut engine = Engine::start(dir.path(), &[], &env);
    wait_until("the first half", 30, async || space(&engine, "news").await["nodes"].as_u64().unwrap_or(0) > 0).await;
    engine.kill9();
    assert!(seen.lock().unwrap().is_empty(), "no summary was asked for before the kill");
    produce(&b, &topic, second).await;
    let mut engine = Engine::start(dir.path(), &[], &env);
    let interrupted = settled(&engine, 59).await;
    let calls = seen.lock().unwrap().clone();
    let mut distinct = calls.clone();
    distinct.sort();
    distinct.dedup();
    assert_eq!(distinct.len(), calls.len(), "no prompt was sent twice");
    assert_eq!(engine.terminate(), Some(0));

    // Uninterrupted: another data directory and group over the same topic.
    let group2 = unique("group");
    let mut env2 = env.clone();
    env2[2] = ("ENGRAM__KAFKA__GROUP_ID", group2.as_str());
    let dir2 = tempfile::tempdir().unwrap();
    let engine2 = Engine::start(dir2.path(), &[], &env2);
    let uninterrupted = settled(&engine2, 59).await;
    let strip = |v: &Value| {
        let mut v = v.clone();
        v.as_object_mut().unwrap().remove("as_of");
        v.as_object_mut().unwrap().remove("hierarchy_as_of");
        v
    };
    assert_eq!(strip(&interrupted), strip(&uninterrupted));
    drop(engine2);
    let before = seen.lock().unwrap().len();

    // And the interrupted engine's restart makes no call at all.
    let engine = Engine::start(dir.path(), &[], &env);
    assert_eq!(strip(&settled(&engine, 59).await), strip(&uninterrupted));
    assert_eq!(seen.lock().unwrap().len(), before, "a restart makes no LLM call");
}

/// Every news node's neighbour list, read over HTTP.
async fn neighbours(engine: &Engine, ids: &[String]) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for id in ids {
        let (status, node) = get(&format!("{}/v1/spaces/news/nodes/{}", engine.api, id.replace('#', "%23"))).await;
        assert_eq!(status, 200, "{id}: {node}");
        out.push((id.clone(), node["neighbours"].clone()));
    }
    out
}

/// The sources (`kafka:TOPIC/PARTITION`) of the records in an input log.
fn logged_sources(path: &std::path::Path) -> std::collections::BTreeSet<String> {
    crate::common::log_rows(path).iter().filter_map(|v| v["source"].as_str().map(String::from)).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_processes_split_the_partitions_and_give_the_memory_of_one() {
    let Some(b) = brokers() else { return };
    let news = std::fs::read_to_string(format!("{}/../examples/news.jsonl", env!("CARGO_MANIFEST_DIR"))).unwrap();
    // A document's chunks stay on one partition (as a keyed producer would keep them); documents round-robin.
    let mut docs: Vec<String> = Vec::new();
    let mut ids = Vec::new();
    let mut messages = Vec::new();
    for line in news.lines() {
        let r: Value = serde_json::from_str(line).unwrap();
        let doc = r["doc"].as_str().unwrap().to_string();
        let i = docs.iter().position(|d| *d == doc).unwrap_or_else(|| {
            docs.push(doc.clone());
            docs.len() - 1
        });
        ids.push(format!("{doc}#{}", r["seq"]));
        messages.push(((i % 4) as i32, "news", line.to_string()));
    }
    let topic = unique("split");
    create_topics(&b, &[(&topic, 4)]).await;
    let offsets = produce(&b, &topic, &messages).await;
    let mut ends = [0i64; 4];
    for ((p, _, _), o) in messages.iter().zip(&offsets) {
        ends[*p as usize] = ends[*p as usize].max(o + 1);
    }
    assert!(ends.iter().all(|e| *e > 0), "every partition has records: {ends:?}");
    let dir = tempfile::tempdir().unwrap();

    // The reference: one process reads all four partitions.
    let group1 = unique("group");
    let single = Engine::start(&dir.path().join("single"), &[], &kafka_env(&b, &topic, &group1));
    let want = settled(&single, ids.len() as u64).await;
    let want_neighbours = neighbours(&single, &ids).await;
    drop(single);

    // Two processes, one worker each: process 0 reads partitions 0 and 2, process 1 reads 1 and 3.
    let group2 = unique("group");
    let env = kafka_env(&b, &topic, &group2);
    let hosts = dir.path().join("hosts");
    let port = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    std::fs::write(&hosts, format!("127.0.0.1:{}\n127.0.0.1:{}\n", port(), port())).unwrap();
    let hosts = hosts.to_str().unwrap();
    let follower_admin = format!("127.0.0.1:{}", port());
    let start = |admin: &[&str]| {
        let follower = crate::common::follower(hosts, &dir.path().join("p1"), &[&["-w", "1"], admin].concat(), &env);
        (follower, Engine::start(&dir.path().join("p0"), &["-n", "2", "-p", "0", "-w", "1", "-h", hosts], &env))
    };
    let (mut follower, mut leader) = start(&["--admin", &follower_admin]);

    // Read-your-writes for a partition the other process reads.
    let q = json!({"query": "storm harbour", "mode": "flat", "k": 3});
    let after = format!("{topic}:3:{}", ends[3] - 1);
    let (status, resp) = post(&format!("{}/v1/spaces/news/query?after={after}", leader.api), q.to_string()).await;
    assert_eq!(status, 200, "{resp}");
    let got = settled(&leader, ids.len() as u64).await;
    let strip = |v: &Value| {
        let mut v = v.clone();
        v.as_object_mut().unwrap().remove("as_of");
        v.as_object_mut().unwrap().remove("hierarchy_as_of");
        v
    };
    assert_eq!(strip(&got), strip(&want), "two processes build the memory of one");
    assert_eq!(neighbours(&leader, &ids).await, want_neighbours);

    // Each process logged only its own partitions.
    let own = |ps: &[i32]| ps.iter().map(|p| format!("kafka:{topic}/{p}")).collect::<std::collections::BTreeSet<_>>();
    assert_eq!(logged_sources(&dir.path().join("p0/input.log")), own(&[0, 2]));
    assert_eq!(logged_sources(&dir.path().join("p1/process-1/input.log")), own(&[1, 3]));

    // Both commit their offsets once the views (on process 0) reflect them.
    let (b2, g2, t2) = (b.clone(), group2.clone(), topic.clone());
    wait_until("all four partitions committed", 30, async || {
        let (b, g, t) = (b2.clone(), g2.clone(), t2.clone());
        tokio::task::spawn_blocking(move || committed(&b, &g, &t, 4)).await.unwrap() == ends.to_vec()
    })
    .await;
    // The follower's own metrics: the records it read.
    let metrics = crate::common::client()
        .get(format!("http://{follower_admin}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let read: f64 = metrics
        .lines()
        .find(|l| l.starts_with("engram_kafka_records_in_total{") && l.contains(&topic))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no engram_kafka_records_in_total for {topic}"));
    assert_eq!(read as i64, ends[1] + ends[3]);

    assert_eq!(leader.terminate(), Some(0));
    let status = follower.wait().unwrap();
    assert!(status.success(), "the follower ends with the dataflow: {status}");

    // Both restarted: process 0 serves its checkpoint at once, each process replays its own log behind it (the
    // records of both logs, in one checkpointed memory), and the memory is the one before.
    let (mut follower, mut leader) = start(&[]);
    crate::common::rebuilt_behind_checkpoint(&leader).await;
    let again = settled(&leader, ids.len() as u64).await;
    assert_eq!(strip(&again), strip(&want), "the restarted cluster has the memory of one process");
    assert_eq!(neighbours(&leader, &ids).await, want_neighbours);
    assert_eq!(leader.terminate(), Some(0));
    assert!(follower.wait().unwrap().success());
}
