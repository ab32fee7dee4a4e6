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
        if h["as_of"].as_u64().is_some_and(|a| a >= receipt) && s["spaces"][0]["summaries_pending"] == 0 {
            let mut space = s["spaces"][0].clone();
            space.as_object_mut().unwrap().remove("as_of");
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
