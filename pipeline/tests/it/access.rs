//! API tokens against the real binary: every route refuses a missing, wrong or out-of-scope token; a read token
//! cannot write; lists and errors show only the token's spaces; space quotas; and without tokens only loopback.

use std::time::{Duration, Instant};

use reqwest::Method;
use serde_json::{json, Value};

use crate::common::{chunk, engram, send, tokens_file, Engine};

const READER: &str = "reader-token-0123456789";
const WRITER: &str = "writer-token-0123456789";
const HR: &str = "hr-admin-token-0123456789";
const ROOT: &str = "root-admin-token-0123456789";
const CAPPED: &str = "capped-token-0123456789";

fn code(v: &Value) -> &str {
    v["error"]["code"].as_str().unwrap_or("")
}

/// Waits until the root token sees `n` rejected inputs in `/v1/errors`.
async fn errors_reach(api: &str, n: usize) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, e) = send(Method::GET, &format!("{api}/v1/errors"), Some(ROOT), None).await;
        assert_eq!(status, 200, "{e}");
        if e["recent"].as_array().unwrap().len() >= n {
            return e;
        }
        assert!(Instant::now() < deadline, "errors never reached {n}: {e}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn every_route_checks_the_token_and_its_spaces() {
    let dir = tempfile::tempdir().unwrap();
    let file = tokens_file(
        dir.path(),
        &[
            ("reader", READER, "read", &["news"], 0),
            ("writer", WRITER, "write", &["news", "wire-*"], 0),
            ("hr", HR, "admin", &["hr"], 0),
            ("root", ROOT, "admin", &["*"], 0),
            ("capped", CAPPED, "write", &["team-*"], 2),
        ],
    );
    let file = file.display().to_string();
    let env = [("ENGRAM__AUTH__TOKENS_FILE", file.as_str()), ("ENGRAM__INGEST__MAX_SPACES", "6")];
    let engine = Engine::start(&dir.path().join("data"), &[], &env);
    let api = engine.api.clone();

    // Every route of the API, with the scope it needs over `news` (or over nothing).
    let query = json!({"query": "storm damage", "mode": "flat"}).to_string();
    let routes: Vec<(Method, String, Option<String>, &str)> = vec![
        (Method::GET, "/healthz".into(), None, "read"),
        (Method::GET, "/v1/spaces".into(), None, "read"),
        (Method::GET, "/v1/errors".into(), None, "admin"),
        (Method::POST, "/v1/spaces/news/records".into(), Some(chunk("d", 0, "a storm hit the coast")), "write"),
        (Method::POST, "/v1/spaces/news/query".into(), Some(query.clone()), "read"),
        (Method::GET, "/v1/spaces/news/nodes/d%230".into(), None, "read"),
        (Method::GET, "/v1/spaces/news/summaries/pending".into(), None, "read"),
        (Method::GET, "/v1/spaces/news/events".into(), None, "read"),
        (Method::GET, "/openapi.json".into(), None, "read"),
        (Method::GET, "/v1/no/such/route".into(), None, "read"),
    ];
    for (method, path, body, need) in &routes {
        let url = format!("{api}{path}");
        let (status, e) = send(method.clone(), &url, None, body.clone()).await;
        assert_eq!((status, code(&e)), (401, "unauthorized"), "{method} {path} without a token: {e}");
        for wrong in ["nope", READER.trim_end_matches('9'), &format!("{READER}x")] {
            let (status, e) = send(method.clone(), &url, Some(wrong), body.clone()).await;
            assert_eq!((status, code(&e)), (401, "bad_token"), "{method} {path} with {wrong:?}: {e}");
        }
        // The hash of a token is not the token.
        let hash = blake3::hash(ROOT.as_bytes()).to_hex().to_string();
        let (status, _) = send(method.clone(), &url, Some(&hash), body.clone()).await;
        assert_eq!(status, 401, "{method} {path} with a token's hash");
        if path.contains("/news/") {
            // A token over other spaces, even an admin one, cannot touch `news`.
            let (status, e) = send(method.clone(), &url, Some(HR), body.clone()).await;
            assert_eq!((status, code(&e)), (403, "forbidden"), "{method} {path} with hr's token: {e}");
        }
        if *need != "read" {
            let (status, e) = send(method.clone(), &url, Some(READER), body.clone()).await;
            assert_eq!((status, code(&e)), (403, "forbidden"), "{method} {path} ({need}) with a read token: {e}");
        }
        if *need == "admin" {
            let (status, e) = send(method.clone(), &url, Some(WRITER), body.clone()).await;
            assert_eq!((status, code(&e)), (403, "forbidden"), "{method} {path} with a write token: {e}");
        }
    }
    // Nothing above reached the memory: every refused write was refused before it was read.
    let (status, s) = send(Method::GET, &format!("{api}/v1/spaces"), Some(ROOT), None).await;
    assert_eq!((status, s["spaces"].as_array().unwrap().len()), (200, 0), "{s}");

    // What each token may do, it can; and sees only its own spaces.
    let post = |space: &str, token: &'static str, body: String| {
        let url = format!("{api}/v1/spaces/{space}/records");
        async move { send(Method::POST, &url, Some(token), Some(body)).await }
    };
    let (status, r) = post("news", WRITER, chunk("d", 0, "a storm hit the coast")).await;
    assert_eq!(status, 200, "{r}");
    let (status, r) = post("wire-eu", WRITER, chunk("w", 0, "markets rallied in europe")).await;
    assert_eq!(status, 200, "{r}");
    let (status, r) = post("hr", HR, chunk("h", 0, "salary review for the team")).await;
    assert_eq!(status, 200, "{r}");
    let receipt = r["receipt"].as_str().unwrap().to_string();
    // Rejected inputs, one in `hr` and one in `news`.
    assert_eq!(post("hr", HR, "{\"kind\":\"nope\"}".into()).await.0, 200);
    assert_eq!(post("news", WRITER, "{\"kind\":\"nope\"}".into()).await.0, 200);

    let url = format!("{api}/v1/spaces/news/query?after={receipt}");
    let (status, q) = send(Method::POST, &url, Some(READER), Some(query.clone())).await;
    assert_eq!(status, 200, "{q}");
    assert!(q["evidence"].as_array().unwrap().iter().all(|e| e["id"] == "d#0"), "{q}");
    let (status, n) = send(Method::GET, &format!("{api}/v1/spaces/news/nodes/d%230"), Some(READER), None).await;
    assert_eq!((status, n["text"].as_str()), (200, Some("a storm hit the coast")), "{n}");

    let names = |v: &Value| -> Vec<String> {
        let mut n: Vec<String> =
            v["spaces"].as_array().unwrap().iter().map(|s| s["space"].as_str().unwrap().to_string()).collect();
        n.sort();
        n
    };
    let list = |token: &'static str| {
        let url = format!("{api}/v1/spaces");
        async move { send(Method::GET, &url, Some(token), None).await.1 }
    };
    assert_eq!(names(&list(READER).await), ["news"]);
    assert_eq!(names(&list(WRITER).await), ["news", "wire-eu"]);
    assert_eq!(names(&list(HR).await), ["hr"]);
    assert_eq!(names(&list(ROOT).await), ["hr", "news", "wire-eu"]);

    let all = errors_reach(&api, 2).await;
    assert_eq!(all["total"], 2, "{all}");
    let (status, hr) = send(Method::GET, &format!("{api}/v1/errors"), Some(HR), None).await;
    assert_eq!(status, 200);
    let recent = hr["recent"].as_array().unwrap();
    assert_eq!(recent.len(), 1, "hr sees only its own rejects: {hr}");
    assert_eq!(recent[0]["space"], "hr");
    assert!(hr["total"].is_null(), "the engine-wide count is for a token over every space: {hr}");

    // Quotas: the capped token may create two spaces; the engine holds at most six.
    assert_eq!(post("team-a", CAPPED, chunk("t", 0, "x")).await.0, 200);
    assert_eq!(post("team-b", CAPPED, chunk("t", 0, "x")).await.0, 200);
    assert_eq!(post("team-a", CAPPED, chunk("t", 1, "y")).await.0, 200, "an existing space is no new one");
    let (status, e) = post("team-c", CAPPED, chunk("t", 0, "x")).await;
    assert_eq!((status, code(&e)), (403, "space_quota"), "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("max-spaces = 2"), "{e}");
    assert_eq!(post("extra", ROOT, chunk("x", 0, "x")).await.0, 200, "the sixth space");
    let (status, e) = post("one-more", ROOT, chunk("x", 0, "x")).await;
    assert_eq!((status, code(&e)), (403, "space_quota"), "{e}");
    assert!(e["error"]["message"].as_str().unwrap().contains("ingest.max-spaces = 6"), "{e}");

    // The admin port has no tokens and no user data.
    let (status, h) = crate::common::get(&format!("{}/healthz", engine.admin)).await;
    assert_eq!((status, h["status"].as_str()), (200, Some("ok")));
    let metrics = crate::common::client().get(format!("{}/metrics", engine.admin)).send().await.unwrap();
    let metrics = metrics.text().await.unwrap();
    assert!(!metrics.contains("wire-eu") && !metrics.contains("storm"), "no space or text in the metrics");
    let refused = metrics.lines().find(|l| l.starts_with("engram_api_unauthorized_total")).unwrap();
    assert!(refused.ends_with(" 50"), "10 routes x 5 unauthenticated requests: {refused}");
    let (status, doc) = send(Method::GET, &format!("{api}/openapi.json"), Some(READER), None).await;
    assert_eq!((status, doc["openapi"].as_str()), (200, Some("3.1.0")), "any token reads the API's document");
}

/// With no token configured, a non-loopback `listen` is refused at start, naming the opt-out; with the opt-out it
/// starts.
#[test]
fn a_non_loopback_listen_without_tokens_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = engram()
        .args(["run", "--once", "--listen", "0.0.0.0:0", "--admin", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a loopback address") && err.contains("auth.allow-unauthenticated"), "{err}");
    assert!(!dir.path().join("input.log").exists(), "refused before anything was opened");

    let out = engram()
        .args(["run", "--once", "--listen", "0.0.0.0:0", "--admin", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .env("ENGRAM__AUTH__ALLOW_UNAUTHENTICATED", "true")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", String::from_utf8_lossy(&out.stderr));

    // A token file that is not what it should be is an error at start, naming the token.
    let bad = dir.path().join("tokens.toml");
    std::fs::write(&bad, "[[tokens]]\nname = \"desk\"\nhash = \"plaintext\"\nscope = \"read\"\nspaces = [\"news\"]\n")
        .unwrap();
    let out = engram()
        .args(["run", "--once", "--listen", "127.0.0.1:0", "--admin", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .env("ENGRAM__AUTH__TOKENS_FILE", &bad)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("auth token `desk`") && err.contains("64 hex digits"), "{err}");
}

/// `engram token new` prints a token and a table that, added to the config, lets that token in.
#[tokio::test]
async fn a_token_made_by_the_cli_is_accepted() {
    let out =
        engram().args(["token", "new", "--name", "desk", "--scope", "write", "--spaces", "news"]).output().unwrap();
    assert!(out.status.success());
    let token = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let stanza = String::from_utf8(out.stderr).unwrap();
    let table = &stanza[stanza.find("[[auth.tokens]]").expect("the table")..];
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("engram.toml");
    std::fs::write(&config, table).unwrap();
    let engine = Engine::start(&dir.path().join("data"), &["--config", config.to_str().unwrap()], &[]);
    let url = format!("{}/v1/spaces/news/records", engine.api);
    let (status, r) = send(Method::POST, &url, Some(&token), Some(chunk("d", 0, "hello"))).await;
    assert_eq!(status, 200, "{r}");
    let (status, _) = send(Method::POST, &url, None, Some(chunk("d", 1, "hello"))).await;
    assert_eq!(status, 401);
    let mut hash = engram()
        .args(["token", "hash"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    hash.stdin.take().unwrap().write_all(format!("{token}\n").as_bytes()).unwrap();
    let printed = String::from_utf8(hash.wait_with_output().unwrap().stdout).unwrap();
    assert!(table.contains(printed.trim()), "`token hash` gives the hash the table holds");
}

/// Bad arguments to the token and log commands are clear errors, and nothing is printed as a token.
#[test]
fn bad_token_and_log_arguments_are_clear_errors() {
    let out =
        engram().args(["token", "new", "--name", "desk", "--scope", "owner", "--spaces", "news"]).output().unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "no token for a bad scope");
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected read, write or admin"));
    let out = engram().args(["token", "new", "--name", "desk", "--spaces", "a/b"]).output().unwrap();
    assert!(!out.status.success() && out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("`a/b`"));
    let hash = engram().args(["token", "hash"]).stdin(std::process::Stdio::null()).output().unwrap();
    assert!(!hash.status.success());
    assert!(String::from_utf8_lossy(&hash.stderr).contains("no token on stdin"));
    let dir = tempfile::tempdir().unwrap();
    let out = engram().args(["log", "frobnicate", "--data-dir"]).arg(dir.path()).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("expected check or repair"));
}
