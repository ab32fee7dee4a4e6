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
