//! Runs the real `engram` binary on free loopback ports, for tests that talk to it over sockets.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Engine {
    pub child: Child,
    pub api: String,
    pub admin: String,
    pub data_dir: PathBuf,
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

pub fn engram() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_engram"));
    c.env("ENGRAM_LOG", "warn");
    c
}

impl Engine {
    /// Starts `engram run` with `args` and waits until it answers /healthz.
    pub fn start(data_dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Engine {
        let (api_port, admin_port) = (free_port(), free_port());
        let mut cmd = engram();
        cmd.arg("run")
            .arg("--data-dir")
            .arg(data_dir)
            .arg("--listen")
            .arg(format!("127.0.0.1:{api_port}"))
            .arg("--admin")
            .arg(format!("127.0.0.1:{admin_port}"))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn engram");
        let engine = Engine {
            child,
            api: format!("http://127.0.0.1:{api_port}"),
            admin: format!("http://127.0.0.1:{admin_port}"),
            data_dir: data_dir.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if std::net::TcpStream::connect(("127.0.0.1", api_port)).is_ok() {
                return engine;
            }
            assert!(Instant::now() < deadline, "engram did not start listening");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn kill9(&mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }

    /// SIGTERM, then the exit code.
    pub fn terminate(&mut self) -> Option<i32> {
        let ok = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status().unwrap();
        assert!(ok.success());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(Instant::now() < deadline, "engram did not stop after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap()
}

pub async fn post(url: &str, body: impl Into<String>) -> (u16, serde_json::Value) {
    let r = client().post(url).body(body.into()).send().await.expect("request");
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}")))
}

pub async fn get(url: &str) -> (u16, serde_json::Value) {
    let r = client().get(url).send().await.expect("request");
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}")))
}

pub fn chunk(doc: &str, seq: usize, text: &str) -> String {
    serde_json::json!({"kind": "chunk", "doc": doc, "seq": seq, "text": text}).to_string()
}

/// Serves `app` (an OpenAI-compatible test server) on a free loopback port; returns its `/v1` base URL.
pub async fn serve(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/v1", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    base
}

/// The environment of an engine whose LLM is the test server at `base`: `test-model`, no rate limit to speak of, a
/// 50 ms summary debounce.
pub fn llm_env(base: &str) -> Vec<(&'static str, &str)> {
    vec![
        ("ENGRAM__LLM__BACKEND", "openai"),
        ("ENGRAM__LLM__BASE_URL", base),
        ("ENGRAM__LLM__MODEL", "test-model"),
        // The scripted servers serve json_schema; no start-up probe to count among their calls.
        ("ENGRAM__LLM__RESPONSE_FORMAT", "json-schema"),
        ("ENGRAM__LLM__REQUESTS_PER_MINUTE", "60000"),
        ("ENGRAM__HIERARCHY__SUMMARY_DEBOUNCE", "50ms"),
    ]
}

/// A request with an optional bearer token; the status and the JSON body.
pub async fn send(
    method: reqwest::Method,
    url: &str,
    token: Option<&str>,
    body: Option<String>,
) -> (u16, serde_json::Value) {
    let mut r = client().request(method, url);
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    if let Some(b) = body {
        r = r.body(b);
    }
    let r = r.send().await.expect("request");
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON ({status}): {text}")))
}

/// Writes an `auth.tokens-file` granting `tokens` (name, token, scope, spaces, max-spaces) and returns its path.
pub fn tokens_file(dir: &Path, tokens: &[(&str, &str, &str, &[&str], usize)]) -> PathBuf {
    let mut text = String::new();
    for (name, token, scope, spaces, max_spaces) in tokens {
        let hash = blake3::hash(token.as_bytes()).to_hex();
        let spaces: Vec<String> = spaces.iter().map(|s| format!("{s:?}")).collect();
        text.push_str(&format!(
            "[[tokens]]\nname = {name:?}\nhash = \"{hash}\"\nscope = {scope:?}\nspaces = [{}]\nmax-spaces = {max_spaces}\n\n",
            spaces.join(", ")
        ));
    }
    let path = dir.join("tokens.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// The rows of one of the data directory's logs (`input.log`, `responses.log`, `embeddings.log`): each line's JSON,
/// without the checksum after its tab.
pub fn log_rows(path: &Path) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    text.lines()
        .map(|l| l.rsplit_once('\t').map_or(l, |(json, _)| json))
        .map(|j| serde_json::from_str(j).unwrap_or_else(|e| panic!("{}: {e}: {j}", path.display())))
        .collect()
}

/// The bundled news example's space once it has settled (59 nodes, three layers or more, no summary pending, the
/// hierarchy as of layer 0).
pub async fn settled_news(engine: &Engine) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let (_, spaces) = get(&format!("{}/v1/spaces", engine.api)).await;
        if let Some(news) = spaces["spaces"].as_array().and_then(|a| a.iter().find(|s| s["space"] == "news")) {
            let caught_up = news["hierarchy_as_of"] == news["as_of"];
            if news["nodes"] == 59
                && news["layers"].as_array().unwrap().len() >= 3
                && news["summaries_pending"] == 0
                && caught_up
            {
                return news.clone();
            }
        }
        assert!(Instant::now() < deadline, "not settled: {spaces}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Process 1 of a two-process cluster (`-n 2 -p 1`), a bare child: `args` go after `-h HOSTS` (`-w`, `--admin`).
pub fn follower(hosts: &str, data_dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Child {
    engram()
        .args(["run", "-n", "2", "-p", "1", "-h", hosts])
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn the follower")
}

/// Asserts that `engine` started from its checkpoint, and waits until the dataflow has rebuilt behind it and the
/// views have taken its state.
pub async fn rebuilt_behind_checkpoint(engine: &Engine) {
    let metric = async |name: &str| -> i64 {
        let text = client().get(format!("{}/metrics", engine.admin)).send().await.unwrap().text().await.unwrap();
        let prefix = format!("{name} ");
        text.lines().find_map(|l| l.strip_prefix(&prefix).and_then(|v| v.parse().ok())).expect(name)
    };
    assert!(metric("engram_checkpoint_restored_epoch").await >= 0, "the restart serves its checkpoint");
    let deadline = Instant::now() + Duration::from_secs(120);
    while metric("engram_checkpoint_rebuilding").await != 0 {
        assert!(Instant::now() < deadline, "the dataflow never rebuilt behind the checkpoint");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
