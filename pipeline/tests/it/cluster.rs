//! Whole system: the bundled examples ingested by two timely processes (two workers each) on loopback give the same
//! memory as one process with one worker.

use std::collections::BTreeMap;

use crate::common::{follower, get, rebuilt_behind_checkpoint, Engine};

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

fn example(name: &str) -> String {
    format!("{}/../examples/{name}", env!("CARGO_MANIFEST_DIR"))
}

/// Every node's neighbour list, read over HTTP.
async fn memory(engine: &Engine) -> BTreeMap<String, serde_json::Value> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (_, spaces) = get(&format!("{}/v1/spaces", engine.api)).await;
        let nodes: u64 = spaces["spaces"].as_array().unwrap().iter().map(|s| s["nodes"].as_u64().unwrap()).sum();
        if nodes == 113 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "examples not ingested: {spaces}");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let mut out = BTreeMap::new();
    for file in ["news.jsonl", "standup.jsonl"] {
        for line in std::fs::read_to_string(example(file)).unwrap().lines() {
            let r: serde_json::Value = serde_json::from_str(line).unwrap();
            let id = match r["kind"].as_str().unwrap() {
                "chunk" => format!("{}#{}", r["doc"].as_str().unwrap(), r["seq"]),
                _ => format!("{}#{}", r["conversation"].as_str().unwrap(), r["turn"].as_str().unwrap()),
            };
            let url =
                format!("{}/v1/spaces/{}/nodes/{}", engine.api, r["space"].as_str().unwrap(), id.replace('#', "%23"));
            let (status, node) = get(&url).await;
            assert_eq!(status, 200, "{node}");
            out.insert(id, node["neighbours"].clone());
        }
    }
    out
}

#[tokio::test]
async fn two_processes_equal_one() {
    let inputs = ["--input", &example("news.jsonl"), "--input", &example("standup.jsonl")];
    let dir = tempfile::tempdir().unwrap();
    let single = Engine::start(&dir.path().join("single"), &inputs, &[]);
    let want = memory(&single).await;
    drop(single);
    assert!(want.values().map(|n| n.as_array().unwrap().len()).sum::<usize>() > 100, "the examples make a graph");

    let (mut follower, mut leader) = cluster(dir.path(), &inputs);
    let got = memory(&leader).await;
    assert_eq!(got, want);
    assert_eq!(leader.terminate(), Some(0));
    // The follower ends with the dataflow.
    let status = follower.wait().unwrap();
    assert!(status.success());
}

/// A two-process cluster of one worker each: process 1 (a bare child) and process 0 (serving), both started.
fn two_processes(dir: &std::path::Path) -> (std::process::Child, Engine) {
    let hosts = dir.join("hosts");
    std::fs::write(&hosts, format!("127.0.0.1:{}\n127.0.0.1:{}\n", free_port(), free_port())).unwrap();
    let hosts = hosts.to_str().unwrap();
    let follower = follower(hosts, &dir.join("p1"), &[], &[]);
    let leader = Engine::start(&dir.join("p0"), &["-n", "2", "-p", "0", "-h", hosts], &[]);
    (follower, leader)
}

/// A two-process cluster of two workers each in `dir` (new ports each time), process 0 given `args`.
fn cluster(dir: &std::path::Path, args: &[&str]) -> (std::process::Child, Engine) {
    let hosts = dir.join("hosts");
    std::fs::write(&hosts, format!("127.0.0.1:{}\n127.0.0.1:{}\n", free_port(), free_port())).unwrap();
    let hosts = hosts.to_str().unwrap();
    let follower = follower(hosts, &dir.join("p1"), &["-w", "2"], &[]);
    let mut leader_args = vec!["-n", "2", "-p", "0", "-w", "2", "-h", hosts];
    leader_args.extend(args);
    (follower, Engine::start(&dir.join("p0"), &leader_args, &[]))
}

/// A cluster that loses a process fails loudly: process 0's worker dies with the lost peer, the engine is marked
/// failed and the process exits non-zero instead of serving views that no longer follow its input.
#[tokio::test]
async fn losing_a_process_fails_the_leader_loudly() {
    let dir = tempfile::tempdir().unwrap();
    let (mut follower, mut leader) = two_processes(dir.path());
    let (status, health) = get(&format!("{}/healthz", leader.admin)).await;
    assert_eq!((status, health["status"].as_str()), (200, Some("ok")), "{health}");
    follower.kill().unwrap();
    follower.wait().unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let code = loop {
        if let Some(status) = leader.child.try_wait().unwrap() {
            break status.code();
        }
        assert!(std::time::Instant::now() < deadline, "the leader kept serving after losing a process");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_eq!(code, Some(1), "a failed engine exits non-zero");
}

/// The other way round: when process 0 is lost, a follower's workers die with it and the follower exits non-zero
/// (it does not linger, reading its Kafka share into a memory nobody serves).
#[tokio::test]
async fn losing_the_leader_fails_the_follower_loudly() {
    let dir = tempfile::tempdir().unwrap();
    let (mut follower, mut leader) = two_processes(dir.path());
    let (status, _) = get(&format!("{}/healthz", leader.admin)).await;
    assert_eq!(status, 200);
    leader.kill9();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let code = loop {
        if let Some(status) = follower.try_wait().unwrap() {
            break status.code();
        }
        assert!(std::time::Instant::now() < deadline, "the follower kept running after losing process 0");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert_ne!(code, Some(0), "a follower that lost its leader exits non-zero: {code:?}");
}

/// A cluster restarts from process 0's checkpoint: after a clean stop of both processes, the restarted process 0
/// serves the checkpoint at once while both rebuild behind it, and ends with the memory of the run before.
#[tokio::test]
async fn a_restarted_cluster_serves_process_0s_checkpoint() {
    let inputs = ["--input", &example("news.jsonl"), "--input", &example("standup.jsonl")];
    let dir = tempfile::tempdir().unwrap();
    let (mut follower, mut leader) = cluster(dir.path(), &inputs);
    let want = memory(&leader).await;
    assert_eq!(leader.terminate(), Some(0));
    assert!(follower.wait().unwrap().success());
    assert!(dir.path().join("p0/checkpoint.bin").exists(), "process 0 checkpoints at its clean stop");

    let (mut follower, mut leader) = cluster(dir.path(), &inputs);
    rebuilt_behind_checkpoint(&leader).await;
    assert_eq!(memory(&leader).await, want, "and ends with the memory of the run before");
    assert_eq!(leader.terminate(), Some(0));
    assert!(follower.wait().unwrap().success());
}
