//! Hostile and heavy clients against the real binary: slow headers, a full connection table, a queue over its byte
//! cap, huge bodies and questions with memory bounded, a stalled model endpoint, and a fuzz of requests that must
//! never get a 5xx or bring the engine down.

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use serde_json::json;
use tokio::io::AsyncWriteExt;

use crate::common::{chunk, get, post, Engine};

fn code(v: &serde_json::Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("")
}

/// A record of about `bytes` bytes.
fn record(i: usize, bytes: usize) -> String {
    chunk(&format!("d{i}"), 0, &"word ".repeat(bytes / 5))
}

/// Whether the peer closed `s` within `within` (a read returns 0 or fails).
async fn closed_within(s: &mut tokio::net::TcpStream, within: Duration) -> bool {
    use tokio::io::AsyncReadExt;
    let mut buf = [0u8; 512];
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Err(_) => return false,
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
        }
    }
}

/// Clients that send half their headers and stall hold a connection at most `http.header-read-timeout`; past
/// `http.max-connections` new clients wait, and are served once the slow ones are cut.
#[tokio::test]
async fn slow_headers_are_cut_and_the_connection_cap_holds() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("ENGRAM__HTTP__HEADER_READ_TIMEOUT", "1s"),
        ("ENGRAM__HTTP__MAX_CONCURRENT_REQUESTS", "4"),
        ("ENGRAM__HTTP__MAX_CONNECTIONS", "8"),
    ];
    let engine = Engine::start(dir.path(), &[], &env);
    let addr = engine.api.trim_start_matches("http://").to_string();
    // Below the cap: 6 slowloris connections, and other clients are served at once.
    let mut slow = Vec::new();
    for _ in 0..6 {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"GET /v1/spaces HTTP/1.1\r\nHost: x\r\nX-Slow: ").await.unwrap();
        slow.push(s);
    }
    let t = Instant::now();
    for _ in 0..10 {
        let (status, _) = get(&format!("{}/healthz", engine.api)).await;
        assert_eq!(status, 200);
    }
    assert!(t.elapsed() < Duration::from_millis(900), "served while 6 clients stall: {:?}", t.elapsed());
    for s in &mut slow {
        assert!(closed_within(s, Duration::from_secs(3)).await, "a stalled client is cut after its header timeout");
    }
    // At the cap: 8 stalled connections; a new client waits until they are cut, then is served.
    let mut slow = Vec::new();
    for _ in 0..8 {
        let mut s = tokio::net::TcpStream::connect(&addr).await.unwrap();
        s.write_all(b"GET /v1/spaces HTTP/1.1\r\nHo").await.unwrap();
        slow.push(s);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let t = Instant::now();
    let (status, _) = get(&format!("{}/healthz", engine.api)).await;
    let waited = t.elapsed();
    assert_eq!(status, 200);
    assert!(
        waited > Duration::from_millis(300) && waited < Duration::from_secs(4),
        "a client past max-connections waits for a slot, then is served: {waited:?}"
    );
    let (status, h) = get(&format!("{}/healthz", engine.admin)).await;
    assert_eq!((status, h["status"].as_str()), (200, Some("ok")));
}

/// With the dataflow not taking the queue (a long epoch), ingest past `ingest.max-queue-bytes` is answered 503 and
/// nothing of the refused request is logged.
#[tokio::test]
async fn the_queue_is_capped_in_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let env = [
        ("ENGRAM__INGEST__MAX_BODY_BYTES", "8192"),
        ("ENGRAM__INGEST__MAX_QUEUE_BYTES", "8192"),
        ("ENGRAM__INGEST__MAX_RECORD_BYTES", "2048"),
        ("ENGRAM__INGEST__EPOCH_INTERVAL", "60s"),
    ];
    let engine = Engine::start(dir.path(), &[], &env);
    let url = format!("{}/v1/spaces/q/records", engine.api);
    let body = |from: usize| (from..from + 4).map(|i| record(i, 1500)).collect::<Vec<_>>().join("\n");
    let (status, r) = post(&url, body(0)).await;
    assert_eq!(status, 200, "{r}");
    let (status, e) = post(&url, body(4)).await;
    assert_eq!((status, code(&e)), (503, "overloaded"), "12 kB queued past an 8 kB cap: {e}");
    let log = std::fs::read_to_string(dir.path().join("input.log")).unwrap();
    assert_eq!(log.lines().count(), 4, "the refused request was not logged");
}

/// `k`, `budget_words` and the subgoals of a question are held to their config keys.
#[tokio::test]
async fn query_bounds_are_config_keys() {
    let dir = tempfile::tempdir().unwrap();
    let env = [("ENGRAM__QUERY__MAX_K", "20"), ("ENGRAM__QUERY__MAX_BUDGET_WORDS", "900")];
    let engine = Engine::start(dir.path(), &[], &env);
    let url = format!("{}/v1/spaces/q/query", engine.api);
    for (body, key) in [
        (json!({"query": "storm", "k": 21}), "query.max-k = 20"),
        (json!({"query": "storm", "budget_words": 901}), "query.max-budget-words = 900"),
        (json!({"query": "who came here and what did they say ? ".repeat(10)}), "query.max-subgoals = 16"),
    ] {
        let (status, e) = post(&url, body.to_string()).await;
        assert_eq!((status, code(&e)), (400, "bad_request"), "{e}");
        assert!(e["error"]["message"].as_str().unwrap().contains(key), "{key}: {e}");
    }
    let (status, e) = post(&url, json!({"query": "storm", "k": 20, "budget_words": 900}).to_string()).await;
    assert_eq!((status, code(&e)), (404, "unknown_space"), "at the bounds the query is taken: {e}");
}

/// Peak resident memory of a process, in bytes (Linux).
fn peak_rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 =
        status.lines().find(|l| l.starts_with("VmHWM:")).unwrap().split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

/// A 64 MiB `[{},{},…]` body and a 10,000-clause question get their 4xx quickly, with resident growth under twice
/// the body.
#[tokio::test]
async fn a_huge_body_and_question_are_refused_with_memory_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(dir.path(), &[], &[]);
    let limit = 64 << 20;
    let mut body = String::with_capacity(limit);
    body.push('[');
    while body.len() + 4 < limit {
        body.push_str("{},");
    }
    body.push_str("{}]");
    let before = peak_rss(engine.child.id());
    let t = Instant::now();
    let (status, e) = post(&format!("{}/v1/spaces/big/records", engine.api), body.clone()).await;
    assert_eq!((status, code(&e)), (413, "too_many_records"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(10), "took {:?}", t.elapsed());
    let question = json!({"query": "why did it rain and ".repeat(10_000)}).to_string();
    let t = Instant::now();
    let (status, e) = post(&format!("{}/v1/spaces/big/query", engine.api), question).await;
    assert_eq!((status, code(&e)), (400, "bad_request"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(5), "took {:?}", t.elapsed());
    let grew = peak_rss(engine.child.id()).saturating_sub(before);
    assert!(grew < 2 * body.len() as u64, "resident memory grew {grew} bytes for a {} byte body", body.len());
    assert!(std::fs::read_to_string(dir.path().join("dead-letter.jsonl")).unwrap_or_default().is_empty());
    let (status, _) = get(&format!("{}/healthz", engine.admin)).await;
    assert_eq!(status, 200);
}

/// A model endpoint that never answers holds up only the work that needs it: ingest, reads and model-free queries
/// go on, and the records are reflected.
#[tokio::test]
async fn a_stalled_model_endpoint_stalls_no_reader() {
    use axum::routing::post as route_post;
    let stalled = axum::Router::new().route(
        "/v1/chat/completions",
        route_post(|| async {
            std::future::pending::<()>().await;
            "never"
        }),
    );
    let base = crate::common::serve(stalled).await;
    let dir = tempfile::tempdir().unwrap();
    let mut env = crate::common::llm_env(&base);
    env.push(("ENGRAM__LLM__TIMEOUT", "600s"));
    let engine = Engine::start(dir.path(), &[], &env);
    let news = std::fs::read_to_string(format!("{}/../examples/news.jsonl", env!("CARGO_MANIFEST_DIR"))).unwrap();
    let (status, r) = post(&format!("{}/v1/spaces/news/records", engine.api), news).await;
    assert_eq!(status, 200, "{r}");
    let receipt = r["receipt"].as_str().unwrap().to_string();
    // Wait until summaries are asked for (and stall at the endpoint).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, s) = get(&format!("{}/v1/spaces", engine.api)).await;
        if s["spaces"][0]["summaries_pending"].as_u64().unwrap_or(0) > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "no summary was asked for: {s}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    for _ in 0..5 {
        let t = Instant::now();
        let (status, _) = get(&format!("{}/v1/spaces", engine.api)).await;
        assert_eq!(status, 200);
        let q = json!({"query": "storm damage on the coast", "mode": "compass", "use_model": false, "answer": false});
        let url = format!("{}/v1/spaces/news/query?after={receipt}", engine.api);
        let (status, q) = post(&url, q.to_string()).await;
        assert_eq!(status, 200, "{q}");
        assert!(!q["evidence"].as_array().unwrap().is_empty(), "{q}");
        let (status, _) = get(&format!("{}/v1/spaces/news/events", engine.api)).await;
        assert_eq!(status, 200);
        assert!(t.elapsed() < Duration::from_secs(2), "reads waited on the model: {:?}", t.elapsed());
    }
    // New records are still taken and reflected.
    let (status, r) =
        post(&format!("{}/v1/spaces/news/records", engine.api), chunk("late", 0, "a late storm report")).await;
    assert_eq!(status, 200, "{r}");
    let url = format!("{}/v1/spaces/news/nodes/late%230?after={}", engine.api, r["receipt"].as_str().unwrap());
    let (status, n) = get(&url).await;
    assert_eq!(status, 200, "{n}");
}

/// One raw HTTP/1.1 exchange; the status code of the reply, or `None` when the server closed without one (allowed
/// only for requests that are not HTTP).
fn exchange(addr: &str, request: &[u8]) -> Option<u16> {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let _ = s.write_all(request);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut reply = Vec::new();
    let _ = s.read_to_end(&mut reply);
    let head = String::from_utf8_lossy(&reply[..reply.len().min(64)]).to_string();
    head.strip_prefix("HTTP/1.1 ").and_then(|r| r.get(..3)).and_then(|c| c.parse().ok())
}

mod fuzz {
    use super::*;
    use proptest::prelude::*;

    const TOKEN: &str = "fuzz-token-0123456789";

    fn segment() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("news".to_string()),
            Just("d%230".to_string()),
            Just("%00".to_string()),
            Just("..".to_string()),
            Just("%F0%9F%92%A5".to_string()),
            "[a-zA-Z0-9._~-]{0,40}",
            "[!-~]{1,12}".prop_map(|s| s.replace(['/', '?', '#', ' '], "_")),
            (0usize..3000).prop_map(|n| "x".repeat(n)),
        ]
    }

    fn path() -> impl Strategy<Value = String> {
        (segment(), segment(), prop::option::of("[a-z=&0-9%]{0,30}")).prop_flat_map(|(a, b, q)| {
            let q = q.map(|q| format!("?{q}")).unwrap_or_default();
            prop_oneof![
                Just(format!("/v1/spaces/{a}/records{q}")),
                Just(format!("/v1/spaces/{a}/query{q}")),
                Just(format!("/v1/spaces/{a}/nodes/{b}{q}")),
                Just(format!("/v1/spaces/{a}/events{q}")),
                Just(format!("/v1/spaces/{a}/summaries/pending{q}")),
                Just(format!("/v1/spaces{q}")),
                Just(format!("/v1/errors{q}")),
                Just(format!("/healthz{q}")),
                Just(format!("/mcp{q}")),
                Just(format!("/v1/spaces/{a}/layers/{b}{q}")),
                Just(format!("/v1/spaces/news/layers/1?offset={b}&limit={a}")),
                Just(format!("/{a}/{b}")),
            ]
        })
    }

    fn json_value() -> impl Strategy<Value = serde_json::Value> {
        let leaf = prop_oneof![
            Just(serde_json::Value::Null),
            any::<bool>().prop_map(serde_json::Value::from),
            any::<i64>().prop_map(serde_json::Value::from),
            any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(serde_json::Value::from),
            "\\PC{0,30}".prop_map(serde_json::Value::from),
            prop_oneof![Just("chunk"), Just("turn"), Just("delete"), Just("document")]
                .prop_map(serde_json::Value::from),
        ];
        leaf.prop_recursive(4, 32, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(serde_json::Value::from),
                prop::collection::btree_map(
                    prop_oneof![
                        Just("kind".to_string()),
                        Just("text".to_string()),
                        Just("doc".to_string()),
                        Just("seq".to_string()),
                        Just("query".to_string()),
                        Just("k".to_string()),
                        Just("mode".to_string()),
                        Just("budget_words".to_string()),
                        "\\PC{0,10}",
                    ],
                    inner,
                    0..6
                )
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
            ]
        })
    }

    fn body() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            json_value().prop_map(|v| v.to_string().into_bytes()),
            (
                0i64..5,
                prop_oneof![Just("initialize"), Just("tools/list"), Just("tools/call"), Just("ping")],
                json_value()
            )
                .prop_map(|(id, method, params)| {
                    json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params}).to_string().into_bytes()
                }),
            prop::collection::vec(json_value(), 0..8).prop_map(|v| v
                .iter()
                .map(|v| v.to_string())
                .collect::<Vec<_>>()
                .join("\n")
                .into_bytes()),
            prop::collection::vec(any::<u8>(), 0..400),
            "\\PC{0,200}".prop_map(String::into_bytes),
            (0usize..20_000).prop_map(|n| format!("{}{}", "[".repeat(n), "]".repeat(n / 2)).into_bytes()),
        ]
    }

    fn authorization() -> impl Strategy<Value = Option<String>> {
        prop_oneof![
            1 => Just(None),
            6 => Just(Some(format!("Bearer {TOKEN}"))),
            1 => Just(Some(format!("bearer {TOKEN}"))),
            1 => Just(Some("Bearer".to_string())),
            1 => "[ -~]{0,60}".prop_map(Some),
        ]
    }

    fn request() -> impl Strategy<Value = Vec<u8>> {
        (
            prop_oneof![
                4 => Just("GET".to_string()),
                6 => Just("POST".to_string()),
                1 => Just("PUT".to_string()),
                1 => Just("DELETE".to_string()),
                1 => Just("HEAD".to_string()),
                1 => "[A-Z]{1,8}"
            ],
            path(),
            authorization(),
            prop::option::of(prop_oneof![
                Just("application/json".to_string()),
                Just("application/x-ndjson".to_string()),
                "[ -~]{0,40}"
            ]),
            body(),
            prop_oneof![Just(0i64), Just(0), Just(0), -5i64..5, Just(100_000_000)],
            prop::collection::vec(("[A-Za-z-]{1,20}", "[ -~]{0,80}"), 0..4),
        )
            .prop_map(|(method, path, auth, ctype, body, skew, extra)| {
                let mut r = format!(
                    "{method} {path} HTTP/1.1\r\nHost: fuzz\r\nConnection: close\r\nAccept: application/json, text/event-stream\r\n"
                );
                if let Some(a) = auth {
                    r.push_str(&format!("Authorization: {a}\r\n"));
                }
                if let Some(c) = ctype {
                    r.push_str(&format!("Content-Type: {c}\r\n"));
                }
                for (k, v) in extra {
                    r.push_str(&format!("{k}: {v}\r\n"));
                }
                let length = (body.len() as i64 + skew).max(0);
                r.push_str(&format!("Content-Length: {length}\r\n\r\n"));
                let mut bytes = r.into_bytes();
                bytes.extend_from_slice(&body);
                bytes
            })
    }

    /// Requests over paths, methods, headers and bodies, valid and not: the engine never answers 5xx, never
    /// panics, and is healthy after. `ENGRAM_FUZZ_CASES` sets how many (default 5,000).
    #[test]
    fn no_request_gets_a_5xx() {
        let cases: u32 = std::env::var("ENGRAM_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(5000);
        let dir = tempfile::tempdir().unwrap();
        let file = crate::common::tokens_file(dir.path(), &[("fuzz", TOKEN, "admin", &["news", "n*"], 0)]);
        let file = file.display().to_string();
        let env = [
            ("ENGRAM__AUTH__TOKENS_FILE", file.as_str()),
            ("ENGRAM__QUERY__MAX_WAIT", "2s"),
            ("ENGRAM__HTTP__REQUEST_TIMEOUT", "5s"),
            ("ENGRAM__HTTP__HEADER_READ_TIMEOUT", "5s"),
            ("ENGRAM__MCP__ALLOWED_HOSTS", ""),
        ];
        let engine = Engine::start(&dir.path().join("data"), &[], &env);
        let addr = engine.api.trim_start_matches("http://").to_string();
        // Some real content, so that queries and node reads have something to walk.
        let news = std::fs::read_to_string(format!("{}/../examples/news.jsonl", env!("CARGO_MANIFEST_DIR"))).unwrap();
        let seed = format!(
            "POST /v1/spaces/news/records HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: {}\r\n\r\n{news}",
            news.len()
        );
        assert_eq!(exchange(&addr, seed.as_bytes()), Some(200));
        let statuses = std::cell::RefCell::new(std::collections::BTreeMap::<Option<u16>, usize>::new());
        let config = ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() };
        proptest!(config, |(req in request())| {
            let status = exchange(&addr, &req);
            *statuses.borrow_mut().entry(status).or_default() += 1;
            prop_assert!(status.is_none_or(|s| s < 500), "{:?} for {:?}", status, String::from_utf8_lossy(&req[..req.len().min(300)]));
        });
        let statuses = statuses.into_inner();
        eprintln!("fuzz: {cases} requests, statuses {statuses:?}");
        let answered: usize = statuses.iter().filter(|(s, _)| s.is_some()).map(|(_, n)| n).sum();
        assert!(answered * 10 >= cases as usize * 9, "most requests are answered: {statuses:?}");
        let health = exchange(
            &addr,
            format!("GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\nAuthorization: Bearer {TOKEN}\r\n\r\n")
                .as_bytes(),
        );
        assert_eq!(health, Some(200));
        let mut engine = engine;
        assert!(engine.child.try_wait().unwrap().is_none(), "the engine is still running");
        assert_eq!(engine.terminate(), Some(0), "and stops cleanly");
    }
}
