//! kill -9 at seeded random points of an ingest (between acknowledged requests and in the middle of one): every
//! restart replays the input log, no acknowledged record is lost, and the memory at the end equals the memory of an
//! uninterrupted run of the same records. `ENGRAM_FAULT_POINTS` sets how many kills (default 50).

use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use serde_json::{json, Value};

use crate::common::{get, Engine};

/// Seeded records: chunks of 24 documents, replacements of some, and deletes of a few, in batches.
fn batches(seed: u64) -> Vec<String> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let words = ["harbour", "storm", "council", "wall", "ferry", "strike", "budget", "tide", "pier", "clinic", "vote"];
    let text = |rng: &mut rand::rngs::StdRng| -> String {
        (0..12).map(|_| words[rng.gen_range(0..words.len())]).collect::<Vec<_>>().join(" ")
    };
    let mut records = Vec::new();
    for d in 0..24 {
        for seq in 0..rng.gen_range(2..8) {
            records.push(json!({"kind": "chunk", "doc": format!("d{d}"), "seq": seq, "text": text(&mut rng)}));
        }
    }
    for _ in 0..30 {
        let d = rng.gen_range(0..24);
        records.push(json!({"kind": "chunk", "doc": format!("d{d}"), "seq": 0, "text": text(&mut rng)}));
    }
    for d in [3, 11, 17] {
        records.push(json!({"kind": "delete", "doc": format!("d{d}")}));
    }
    records.chunks(7).map(|b| b.iter().map(Value::to_string).collect::<Vec<_>>().join("\n")).collect()
}

async fn send(api: &str, body: &str) -> Result<u64, String> {
    let r = crate::common::client()
        .post(format!("{api}/v1/spaces/f/records"))
        .body(body.to_string())
        .send()
        .await
        .map_err(|e| e.to_string())?;
    let v: Value = r.json().await.map_err(|e| e.to_string())?;
    v["receipt"].as_str().and_then(|r| r.parse().ok()).ok_or_else(|| format!("no receipt: {v}"))
}

/// The memory's state, for comparison: the space's statistics and every page of layers 0 and 1.
async fn state(api: &str, receipt: u64) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, h) = get(&format!("{api}/healthz")).await;
        let (_, s) = get(&format!("{api}/v1/spaces")).await;
        let reached = |k: &str| h[k].as_u64().is_some_and(|a| a >= receipt);
        if reached("as_of") && reached("hierarchy_as_of") && s["spaces"][0]["summaries_pending"] == 0 {
            let mut space = s["spaces"][0].clone();
            space.as_object_mut().unwrap().remove("as_of");
            space.as_object_mut().unwrap().remove("hierarchy_as_of");
            let (_, l0) = get(&format!("{api}/v1/spaces/f/layers/0?limit=1000")).await;
            let (_, l1) = get(&format!("{api}/v1/spaces/f/layers/1?limit=1000")).await;
            return json!({"space": space, "layer0": l0["nodes"], "layer1": l1["nodes"]});
        }
        assert!(Instant::now() < deadline, "the memory did not settle: {s}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_at_random_points_loses_no_acknowledged_record() {
    let points: usize = std::env::var("ENGRAM_FAULT_POINTS").ok().and_then(|v| v.parse().ok()).unwrap_or(50);
    let batches = batches(7);
    let env = [("ENGRAM__INGEST__EPOCH_INTERVAL", "20ms")];

    // The uninterrupted run.
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(dir.path(), &[], &env);
    let mut last = 0;
    for b in &batches {
        last = send(&engine.api, b).await.unwrap();
    }
    let want = state(&engine.api, last).await;
    drop(engine);
    assert!(want["space"]["nodes"].as_u64().unwrap() > 50, "{want}");

    // The same records with kill -9 at seeded points: after an acknowledged request, or while one is in flight.
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut kills: Vec<usize> = (0..points).map(|_| rng.gen_range(0..batches.len())).collect();
    kills.sort_unstable();
    let dir = tempfile::tempdir().unwrap();
    let mut engine = Engine::start(dir.path(), &[], &env);
    let (mut next, mut last, mut killed) = (0, 0, 0);
    while next < batches.len() || !kills.is_empty() {
        if kills.first().is_some_and(|k| *k <= next) {
            kills.remove(0);
            killed += 1;
            if next < batches.len() && rng.gen_bool(0.5) {
                // In the middle of a request: it may or may not be acknowledged; if not, it is sent again.
                let api = engine.api.clone();
                let body = batches[next].clone();
                let inflight = tokio::spawn(async move { send(&api, &body).await });
                tokio::time::sleep(Duration::from_millis(rng.gen_range(0..15))).await;
                engine.kill9();
                if let Ok(Ok(r)) = inflight.await {
                    last = r;
                    next += 1;
                }
            } else {
                engine.kill9();
            }
            engine = Engine::start(dir.path(), &[], &env);
            continue;
        }
        last = send(&engine.api, &batches[next]).await.unwrap();
        next += 1;
    }
    let got = state(&engine.api, last).await;
    assert_eq!(killed, points);
    assert_eq!(got, want, "after {killed} kills the memory equals the uninterrupted one");
}

/// The value of an unlabelled metric.
async fn metric<T: std::str::FromStr>(engine: &Engine, name: &str) -> T {
    let text = crate::common::client().get(format!("{}/metrics", engine.admin)).send().await.unwrap();
    let text = text.text().await.unwrap();
    let prefix = format!("{name} ");
    text.lines().find_map(|l| l.strip_prefix(&prefix).and_then(|v| v.parse().ok())).expect(name)
}

async fn restored_epoch(engine: &Engine) -> i64 {
    metric(engine, "engram_checkpoint_restored_epoch").await
}

/// Checkpoints every 50 ms, and at seeded points a kill -9 (the last checkpoint and the log after it) or a clean
/// stop (a checkpoint of everything): each restart serves its checkpoint's memory at once and ends, once the
/// dataflow has rebuilt behind it and the tail is applied, with the memory of the uninterrupted run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_from_checkpoints_equal_an_uninterrupted_run() {
    let batches = batches(5);
    let env = [("ENGRAM__INGEST__EPOCH_INTERVAL", "20ms"), ("ENGRAM__CHECKPOINT__INTERVAL", "50ms")];

    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(dir.path(), &[], &[("ENGRAM__INGEST__EPOCH_INTERVAL", "20ms")]);
    let mut last = 0;
    for b in &batches {
        last = send(&engine.api, b).await.unwrap();
    }
    let want = state(&engine.api, last).await;
    drop(engine);

    let mut rng = rand::rngs::StdRng::seed_from_u64(23);
    let mut stops: Vec<usize> = (0..12).map(|_| rng.gen_range(1..batches.len())).collect();
    stops.sort_unstable();
    let dir = tempfile::tempdir().unwrap();
    let mut engine = Engine::start(dir.path(), &[], &env);
    let (mut next, mut last, mut restored, mut clean) = (0, 0, 0, 0);
    while next < batches.len() {
        if stops.first().is_some_and(|s| *s <= next) {
            stops.remove(0);
            // Give the checkpoint timer a chance, then stop one way or the other.
            tokio::time::sleep(Duration::from_millis(rng.gen_range(0..120))).await;
            if rng.gen_bool(0.5) {
                assert_eq!(engine.terminate(), Some(0));
                clean += 1;
            } else {
                engine.kill9();
            }
            engine = Engine::start(dir.path(), &[], &env);
            if restored_epoch(&engine).await >= 0 {
                restored += 1;
            }
            continue;
        }
        last = send(&engine.api, &batches[next]).await.unwrap();
        next += 1;
    }
    let got = state(&engine.api, last).await;
    assert!(clean > 0 && restored >= clean, "{restored} restarts from a checkpoint, {clean} clean stops");
    assert_eq!(got, want, "after restarts from checkpoints the memory equals the uninterrupted one");
    // And a restart with nothing after the last checkpoint serves it as it stands.
    let mut engine = engine;
    assert_eq!(engine.terminate(), Some(0));
    let engine = Engine::start(dir.path(), &[], &env);
    assert!(restored_epoch(&engine).await >= last as i64);
    assert_eq!(state(&engine.api, last).await, want);
    // A checkpoint that does not read (a byte flipped) is set aside with a warning: the restart rebuilds.
    let mut engine = engine;
    assert_eq!(engine.terminate(), Some(0));
    let path = dir.path().join("checkpoint.bin");
    let mut bytes = std::fs::read(&path).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x55;
    std::fs::write(&path, bytes).unwrap();
    let engine = Engine::start(dir.path(), &[], &env);
    assert_eq!(restored_epoch(&engine).await, -1);
    assert_eq!(state(&engine.api, last).await, want);
}

async fn compacted_lines(engine: &Engine) -> u64 {
    metric(engine, "engram_input_log_compacted_lines_total").await
}

/// A start from a checkpoint compacts the input log behind it: the records replaced or deleted by then leave the
/// log, the memory is the one before the stop, later replacements and deletes apply on top of it as on an engine
/// that never stopped, and the next start finds nothing to compact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_compacts_the_log_behind_its_checkpoint() {
    let mut records = batches(5);
    // Every document's first chunk sent three more times, and six documents deleted.
    for round in 0..3 {
        let again: Vec<String> = (0..24)
            .map(|d| json!({"kind": "chunk", "doc": format!("d{d}"), "seq": 0, "text": format!("tide {round} pier {d}")}))
            .map(|v| v.to_string())
            .collect();
        records.push(again.join("\n"));
    }
    records.push(
        (0..6)
            .map(|d| json!({"kind": "delete", "doc": format!("d{}", 4 * d)}).to_string())
            .collect::<Vec<_>>()
            .join("\n"),
    );
    // After the restart: a replacement of a compacted record, a deleted document back, a delete of a kept one.
    let after = [
        json!({"kind": "chunk", "doc": "d1", "seq": 0, "text": "ferry strike council vote"}),
        json!({"kind": "chunk", "doc": "d4", "seq": 2, "text": "harbour wall storm"}),
        json!({"kind": "delete", "doc": "d5"}),
    ]
    .iter()
    .map(Value::to_string)
    .collect::<Vec<_>>()
    .join("\n");
    let env = [("ENGRAM__INGEST__EPOCH_INTERVAL", "20ms")];

    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(dir.path(), &[], &env);
    let mut last = 0;
    for b in &records {
        last = send(&engine.api, b).await.unwrap();
    }
    let before = state(&engine.api, last).await;
    last = send(&engine.api, &after).await.unwrap();
    let uninterrupted = state(&engine.api, last).await;
    drop(engine);

    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("input.log");
    let lines = || std::fs::read_to_string(&log).unwrap().lines().count() as u64;
    let mut engine = Engine::start(dir.path(), &[], &env);
    let mut last = 0;
    for b in &records {
        last = send(&engine.api, b).await.unwrap();
    }
    assert_eq!(state(&engine.api, last).await, before);
    assert_eq!(engine.terminate(), Some(0));
    let logged = lines();

    let mut engine = Engine::start(dir.path(), &[], &env);
    assert!(restored_epoch(&engine).await >= last as i64, "the start serves the checkpoint");
    let compacted = compacted_lines(&engine).await;
    assert!(compacted >= 3 * 24, "{compacted} of {logged} lines compacted away");
    assert_eq!(lines(), logged - compacted, "the log holds what the checkpoint still needs");
    assert_eq!(state(&engine.api, last).await, before, "the memory before the stop");
    let last = send(&engine.api, &after).await.unwrap();
    assert_eq!(state(&engine.api, last).await, uninterrupted, "later records apply as on an engine that never stopped");
    assert_eq!(engine.terminate(), Some(0));

    let engine = Engine::start(dir.path(), &[], &env);
    assert!(restored_epoch(&engine).await >= last as i64);
    assert_eq!(compacted_lines(&engine).await, 0, "nothing left to compact");
    assert_eq!(state(&engine.api, last).await, uninterrupted);
}

/// Waits until the views' layer 0 reflects `receipt`.
async fn layer0_wait(api: &str, receipt: u64) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while get(&format!("{api}/healthz")).await.1["as_of"].as_u64().is_none_or(|a| a < receipt) {
        assert!(Instant::now() < deadline, "the views never reached {receipt}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Layer 0 as the views hold it once they reflect `receipt`: every node with its neighbours and their weights.
async fn layer0_graph(api: &str, receipt: u64) -> Vec<(String, Value)> {
    layer0_wait(api, receipt).await;
    let mut graph = Vec::new();
    for offset in (0..).step_by(1000) {
        let (_, page) = get(&format!("{api}/v1/spaces/f/layers/0?offset={offset}&limit=1000")).await;
        let nodes = page["nodes"].as_array().unwrap().clone();
        for n in &nodes {
            let id = n["id"].as_str().unwrap().to_string();
            let path = id.replace('#', "%23");
            let (status, node) = get(&format!("{api}/v1/spaces/f/nodes/{path}")).await;
            assert_eq!(status, 200, "{node}");
            graph.push((id, node["neighbours"].clone()));
        }
        if nodes.len() < 1000 {
            return graph;
        }
    }
    unreachable!()
}

/// A space past `similarity.exhaustive-below`, with a coarse index whose edges depend on the order of its inserts:
/// a rebuild of the same records in one epoch keeps other edges than the run that fed them in twelve. A checkpoint
/// holds the similarity indexes with the views, and a restart feeds the log after it at the epochs it was logged at,
/// so a restart after a clean stop, or after a kill -9 behind a background checkpoint, goes on from the index the run
/// had: fed the same records after it, it ends with the uninterrupted run's memory, and the rebuild behind the
/// checkpoint differs from it in nothing (`engram_checkpoint_rebuild_differences`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_goes_on_from_the_checkpointed_index_where_a_rebuild_would_differ() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(31);
    let words = ["harbour", "storm", "council", "wall", "ferry", "strike", "budget", "tide", "pier", "clinic", "vote"];
    let mut record = |doc: usize, seq: usize| {
        let text: Vec<&str> = (0..6).map(|_| words[rng.gen_range(0..words.len())]).collect();
        json!({"kind": "chunk", "doc": format!("d{doc}"), "seq": seq, "text": text.join(" ")}).to_string()
    };
    let before: Vec<String> =
        (0..12).map(|b| (0..30).map(|i| record(b * 30 + i, 0)).collect::<Vec<_>>().join("\n")).collect();
    let mut after: Vec<String> =
        (0..4).map(|b| (0..20).map(|i| record(500 + b * 20 + i, 0)).collect::<Vec<_>>().join("\n")).collect();
    after.push(
        (0..30)
            .map(|d| json!({"kind": "delete", "doc": format!("d{}", d * 7)}).to_string())
            .collect::<Vec<_>>()
            .join("\n"),
    );
    let env = [
        ("ENGRAM__INGEST__EPOCH_INTERVAL", "20ms"),
        ("ENGRAM__CHECKPOINT__INTERVAL", "1s"),
        ("ENGRAM__SIMILARITY__EXHAUSTIVE_BELOW", "0"),
        ("ENGRAM__SIMILARITY__MAX_CONNECTIONS", "2"),
        ("ENGRAM__SIMILARITY__EF_CONSTRUCTION", "2"),
        ("ENGRAM__SIMILARITY__EF_SEARCH", "2"),
        ("ENGRAM__SIMILARITY__MAX_REVERSE_CLASSES", "16"),
    ];
    // Each batch in an epoch of its own: the engine has reflected one before the next is sent.
    async fn feed(engine: &Engine, batches: &[String]) -> u64 {
        let mut last = 0;
        for b in batches {
            last = send(&engine.api, b).await.unwrap();
            layer0_wait(&engine.api, last).await;
        }
        last
    }
    let expected = 12 * 30 + 4 * 20 - 30;

    let run = tempfile::tempdir().unwrap();
    let mut engine = Engine::start(run.path(), &[], &env);
    feed(&engine, &before).await;
    let last = feed(&engine, &after).await;
    let uninterrupted = layer0_graph(&engine.api, last).await;
    assert_eq!(engine.terminate(), Some(0));
    assert_eq!(uninterrupted.len(), expected);

    // A clean stop after `before` (its final checkpoint holds everything), and a kill -9 behind a background
    // checkpoint taken at the ninth batch, with three logged epochs after it.
    let scratch = tempfile::tempdir().unwrap();
    for kill in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let mut engine = Engine::start(dir.path(), &[], &env);
        if kill {
            feed(&engine, &before[..8]).await;
            // Past the checkpoint interval, the ninth batch's epoch is checkpointed when the views reach it.
            tokio::time::sleep(Duration::from_millis(1100)).await;
            let ninth = feed(&engine, &before[8..9]).await;
            let deadline = Instant::now() + Duration::from_secs(30);
            while metric::<i64>(&engine, "engram_checkpoint_epoch").await < ninth as i64 {
                assert!(Instant::now() < deadline, "no checkpoint at the ninth batch");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            feed(&engine, &before[9..]).await;
            engine.kill9();
        } else {
            feed(&engine, &before).await;
            assert_eq!(engine.terminate(), Some(0));
            std::fs::copy(dir.path().join("input.log"), scratch.path().join("input.log")).unwrap();
        }
        let mut engine = Engine::start(dir.path(), &[], &env);
        assert!(restored_epoch(&engine).await >= 0, "the restart serves its checkpoint");
        let last = feed(&engine, &after).await;
        let restarted = layer0_graph(&engine.api, last).await;
        let differences: i64 = metric(&engine, "engram_checkpoint_rebuild_differences").await;
        assert_eq!(engine.terminate(), Some(0));
        let how = if kill { "a kill -9" } else { "a clean stop" };
        assert_eq!(differences, 0, "after {how}, the rebuild behind the checkpoint differs from it");
        assert_eq!(restarted, uninterrupted, "after {how}, the restarted memory equals the uninterrupted run");
    }

    // The from-scratch build of the same log, no checkpoint, its records replayed in one epoch: other edges.
    let mut engine = Engine::start(scratch.path(), &[], &env);
    assert_eq!(restored_epoch(&engine).await, -1);
    let deadline = Instant::now() + Duration::from_secs(60);
    while get(&format!("{}/v1/spaces", engine.api)).await.1["spaces"][0]["nodes"] != 12 * 30 {
        assert!(Instant::now() < deadline, "the log was never replayed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let last = feed(&engine, &after).await;
    let from_scratch = layer0_graph(&engine.api, last).await;
    assert_eq!(engine.terminate(), Some(0));
    assert_eq!(from_scratch.len(), expected);
    assert_ne!(from_scratch, uninterrupted, "this index rebuilt in one epoch keeps other edges than in twelve");
}

/// A space past `query.exhaustive-below` is read through the views' nearest-neighbour index. A checkpoint holds the
/// index, and a restart installs it over the restored nodes instead of building it again: the restarted engine
/// builds none, and flat queries (the index's top-k) answer as they did before the stop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_takes_the_views_index_from_its_checkpoint() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    let words = [
        "harbour", "storm", "council", "wall", "ferry", "strike", "budget", "tide", "pier", "clinic", "vote", "school",
        "bridge", "flood", "rail", "market", "fire", "court", "park", "road",
    ];
    let mut text = || (0..6).map(|_| words[rng.gen_range(0..words.len())]).collect::<Vec<_>>().join(" ");
    // 1,100 chunks, a tenth of them one repeated line (nodes that share one point of the index).
    let batches: Vec<String> = (0..11)
        .map(|b| {
            (0..100)
                .map(|i| {
                    let t = if i % 10 == 0 { "yeah the flood again".to_string() } else { text() };
                    json!({"kind": "chunk", "doc": format!("d{}", b * 100 + i), "seq": 0, "text": t}).to_string()
                })
                .collect::<Vec<_>>()
                .join("\n")
        })
        .collect();
    let env = [("ENGRAM__QUERY__EXHAUSTIVE_BELOW", "1024"), ("ENGRAM__INGEST__EPOCH_INTERVAL", "20ms")];
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(dir.path(), &[], &env);
    let mut last = 0;
    for b in &batches {
        last = send(&engine.api, b).await.unwrap();
    }
    layer0_wait(&engine.api, last).await;
    let (deadline, started) = (Instant::now() + Duration::from_secs(60), Instant::now());
    while metric::<u64>(&engine, "engram_index_build_seconds_count").await == 0 {
        assert!(Instant::now() < deadline, "the views never built their index");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Long enough for a restart that builds the index to have built it.
    let build_time = started.elapsed() * 3 + Duration::from_secs(1);
    let queries: Vec<Value> = ["yeah the flood again", "storm tide harbour wall", "council budget vote", "rail bridge"]
        .iter()
        .map(|q| json!({"query": q, "mode": "flat", "k": 20, "budget_words": 100000}))
        .collect();
    let answers = |api: String| {
        let queries = queries.clone();
        async move {
            let mut out = Vec::new();
            for q in &queries {
                let (status, resp) = crate::common::post(&format!("{api}/v1/spaces/f/query"), q.to_string()).await;
                assert_eq!(status, 200, "{resp}");
                out.push(resp["evidence"].clone());
            }
            out
        }
    };
    let before = answers(engine.api.clone()).await;
    assert_eq!(before[0].as_array().unwrap().len(), 20);
    let mut engine = engine;
    assert_eq!(engine.terminate(), Some(0));

    let mut engine = Engine::start(dir.path(), &[], &env);
    assert!(restored_epoch(&engine).await >= last as i64, "the restart serves its checkpoint");
    assert_eq!(answers(engine.api.clone()).await, before, "the restarted index answers as the one before the stop");
    tokio::time::sleep(build_time).await;
    let builds: u64 = metric(&engine, "engram_index_build_seconds_count").await;
    assert_eq!(builds, 0, "the restart built a nearest-neighbour index instead of taking its own");
    assert_eq!(engine.terminate(), Some(0));
}
