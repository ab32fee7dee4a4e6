//! The logs' integrity against the real binary: a byte flipped in the middle of the input log stops the start with
//! the file and the offset; `engram log check` names the line, `engram log repair` moves it aside, and the engine
//! then starts with every other record.

use std::time::{Duration, Instant};

use crate::common::{chunk, engram, get, post, Engine};

#[tokio::test]
async fn a_corrupt_line_stops_the_start_and_repair_moves_it_aside() {
    let dir = tempfile::tempdir().unwrap();
    let mut engine = Engine::start(dir.path(), &[], &[]);
    let url = format!("{}/v1/spaces/logs/records", engine.api);
    for i in 0..3 {
        let (status, r) = post(&url, chunk("d", i, &format!("record number {i} about the harbour"))).await;
        assert_eq!(status, 200, "{r}");
    }
    assert_eq!(engine.terminate(), Some(0));

    // Flip one byte inside the second record's text: the line still parses as JSON, but its checksum fails.
    let log = dir.path().join("input.log");
    let mut bytes = std::fs::read(&log).unwrap();
    let second = bytes.iter().position(|b| *b == b'\n').unwrap() + 1;
    let at = second + bytes[second..].windows(6).position(|w| w == b"number").unwrap();
    bytes[at] = b'N';
    std::fs::write(&log, &bytes).unwrap();

    let out = engram()
        .args(["run", "--once", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("input.log: line 2 at byte offset {second} is corrupt")), "{err}");

    let check = engram().args(["log", "check", "--data-dir"]).arg(dir.path()).output().unwrap();
    assert_eq!(check.status.code(), Some(1));
    let report = String::from_utf8_lossy(&check.stdout);
    assert!(report.contains(&format!("line 2 at byte offset {second}: checksum mismatch")), "{report}");

    let repair = engram().args(["log", "repair", "--data-dir"]).arg(dir.path()).output().unwrap();
    assert!(repair.status.success(), "{}", String::from_utf8_lossy(&repair.stderr));
    let quarantined = std::fs::read_to_string(dir.path().join("input.log.quarantine")).unwrap();
    assert!(quarantined.contains("Number 1"), "{quarantined}");
    let check = engram().args(["log", "check", "--data-dir"]).arg(dir.path()).output().unwrap();
    assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stdout));

    let engine = Engine::start(dir.path(), &[], &[]);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, s) = get(&format!("{}/v1/spaces", engine.api)).await;
        if s["spaces"][0]["nodes"] == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "{s}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, _) = get(&format!("{}/v1/spaces/logs/nodes/d%231", engine.api)).await;
    assert_eq!(status, 404, "the quarantined record is not in the memory");
    let (status, n) = get(&format!("{}/v1/spaces/logs/nodes/d%232", engine.api)).await;
    assert_eq!(status, 200, "{n}");
}

async fn metric(engine: &Engine, name: &str) -> f64 {
    let text = crate::common::client().get(format!("{}/metrics", engine.admin)).send().await.unwrap();
    let text = text.text().await.unwrap();
    text.lines().filter(|l| l.starts_with(name)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

/// A response log written by the build before today's content keys (`tests/fixtures/legacy-responses.log`: the
/// bundled news example summarised by the extractive backend, keys of FNV-1a) still spares its calls: every layer-1
/// summary is found under its earlier key and logged again under today's; only the upper layers, whose members are
/// cluster ids derived with the earlier hash, are asked again. A restart after that asks nothing.
#[tokio::test]
async fn an_old_response_log_still_spares_its_calls() {
    let news = format!("{}/../examples/news.jsonl", env!("CARGO_MANIFEST_DIR"));
    let legacy = format!("{}/tests/fixtures/legacy-responses.log", env!("CARGO_MANIFEST_DIR"));
    let asked = "engram_llm_requests_total{outcome=\"ok\",stage=\"summary\"}";

    let fresh = tempfile::tempdir().unwrap();
    let mut engine = Engine::start(fresh.path(), &["--input", &news], &[]);
    let space = crate::common::settled_news(&engine).await;
    let asked_fresh = metric(&engine, asked).await;
    assert_eq!(engine.terminate(), Some(0));

    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(&legacy, dir.path().join("responses.log")).unwrap();
    let old_lines = std::fs::read_to_string(&legacy).unwrap().lines().count();
    let mut engine = Engine::start(dir.path(), &["--input", &news], &[]);
    let upgraded_space = crate::common::settled_news(&engine).await;
    assert_eq!(upgraded_space["layers"], space["layers"], "the same memory");
    let layer1 = space["layers"][1].as_f64().unwrap();
    let upgraded = metric(&engine, "engram_responses_upgraded_total").await;
    let asked_now = metric(&engine, asked).await;
    assert!(upgraded >= layer1, "{upgraded} replies upgraded for {layer1} layer-1 clusters");
    assert!(asked_now + upgraded <= asked_fresh + 1.0, "asked {asked_now}, upgraded {upgraded}, fresh {asked_fresh}");
    assert!(asked_now < asked_fresh - layer1 + 1.0, "asked {asked_now} of {asked_fresh}");
    // The old lines stay; the upgraded replies are logged under today's keys, with the same text.
    let rows = crate::common::log_rows(&dir.path().join("responses.log"));
    assert!(rows.len() >= old_lines + upgraded as usize, "{} rows", rows.len());
    let (_, chunk) = get(&format!("{}/v1/spaces/news/nodes/pm-2026-11-23-storm%230", engine.api)).await;
    let parent = chunk["parents"][0].as_str().unwrap().to_string();
    let (_, cluster) = get(&format!("{}/v1/spaces/news/nodes/{parent}", engine.api)).await;
    let text = cluster["text"].as_str().unwrap();
    assert!(std::fs::read_to_string(&legacy).unwrap().contains(&serde_json::to_string(text).unwrap()), "{text}");
    assert_eq!(engine.terminate(), Some(0));

    let log = dir.path().join("responses.log");
    let logged = crate::common::log_rows(&log).len();
    let mut engine = Engine::start(dir.path(), &["--input", &news], &[]);
    // The views start from the checkpoint; the dataflow rebuilds behind it and then brings the views its own state,
    // whose passing clusters each wait a debounce before they are answered (an upgrade, a reuse or, wrongly, a call),
    // and an answered layer's next layer waits another. So the test waits for quiet: no rebuild, nothing pending,
    // and the counters and the log unchanged for well over a debounce.
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut last = None;
    let mut since = Instant::now();
    let (asked_now, answered, rows) = loop {
        let rebuilding = metric(&engine, "engram_checkpoint_rebuilding").await;
        let (_, spaces) = get(&format!("{}/v1/spaces", engine.api)).await;
        let pending = spaces["spaces"]
            .as_array()
            .and_then(|a| a.iter().find(|s| s["space"] == "news"))
            .map(|s| s["summaries_pending"].clone());
        let asked_now = metric(&engine, asked).await;
        let answered = metric(&engine, "engram_responses_upgraded_total").await
            + metric(&engine, "engram_summaries_reused_total").await;
        // Complete lines only: a line may be half appended while it is read.
        let rows = std::fs::read_to_string(&log).unwrap().matches('\n').count();
        let now = (rebuilding, pending.clone(), asked_now, answered, rows);
        if last.as_ref() != Some(&now) {
            last = Some(now);
            since = Instant::now();
        } else if rebuilding == 0.0 && pending == Some(serde_json::json!(0)) && since.elapsed() > Duration::from_secs(3)
        {
            break (asked_now, answered, rows);
        }
        assert!(Instant::now() < deadline, "never quiet after the restart: {last:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(asked_now, 0.0, "a restart asks nothing");
    // A restart's rebuild may meet a passing cluster that the run before never held long enough to ask for (the
    // debounce depends on timing); the old log or a summary of part of it answers that one: an upgrade or a reuse,
    // never a call, and logged.
    assert_eq!(rows, logged + answered as usize, "only upgrades and reuses are logged on a restart ({logged} before)");
    assert_eq!(engine.terminate(), Some(0));
    let after = crate::common::log_rows(&log).len();
    assert_eq!(after, rows, "nothing is logged at shutdown");
}
