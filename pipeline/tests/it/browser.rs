//! The memory browser in a real browser: headless Chromium (Debian's `chromium`, which `.ci/run` installs) loads the
//! page served by the engine on the bundled examples, lists the spaces, runs a query, follows a cluster to its
//! children and a conversation's event graph to an event's relations, and saves screenshots. Skipped, visibly, when
//! no Chromium is found and `ENGRAM_REQUIRE_CHROMIUM` is not set.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::{get, post, Engine};

fn chromium() -> Option<PathBuf> {
    let named = std::env::var_os("ENGRAM_CHROMIUM").map(PathBuf::from);
    let found = named.or_else(|| {
        ["chromium", "chromium-browser", "google-chrome"].iter().find_map(|b| {
            let out = Command::new("which").arg(b).output().ok()?;
            out.status.success().then(|| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
        })
    });
    if found.is_none() {
        assert!(
            std::env::var_os("ENGRAM_REQUIRE_CHROMIUM").is_none(),
            "ENGRAM_REQUIRE_CHROMIUM is set but no Chromium"
        );
        eprintln!("SKIPPED: no Chromium (apt-get install chromium; .ci/run installs it)");
    }
    found
}

struct Browser {
    bin: PathBuf,
    profile: tempfile::TempDir,
    shots: PathBuf,
}

impl Browser {
    fn run(&self, extra: &[String], url: &str) -> String {
        let out = Command::new(&self.bin)
            .args(["--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=8000", "--hide-scrollbars"])
            .arg(format!("--user-data-dir={}", self.profile.path().display()))
            .args(extra)
            .arg(url)
            .output()
            .expect("run chromium");
        assert!(out.status.success(), "chromium failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// The page's DOM once its scripts have run, and it said which view it rendered.
    fn dom(&self, url: &str) -> String {
        let dom = self.run(&["--dump-dom".into()], url);
        assert!(dom.contains("data-ready="), "the page rendered: {dom}");
        dom
    }

    fn screenshot(&self, url: &str, name: &str) -> PathBuf {
        let path = self.shots.join(format!("{name}.png"));
        self.run(&[format!("--screenshot={}", path.display()), "--window-size=1280,900".into()], url);
        assert!(std::fs::metadata(&path).map(|m| m.len() > 10_000).unwrap_or(false), "a screenshot at {path:?}");
        path
    }
}

/// Every value of `attr="…"` in `dom`, in order.
fn attrs(dom: &str, attr: &str) -> Vec<String> {
    let key = format!("{attr}=\"");
    dom.match_indices(&key)
        .map(|(i, _)| {
            let rest = &dom[i + key.len()..];
            rest[..rest.find('"').unwrap()].replace("&amp;", "&")
        })
        .collect()
}

async fn settled(api: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, s) = get(&format!("{api}/v1/spaces")).await;
        let spaces = s["spaces"].as_array().cloned().unwrap_or_default();
        let ready = spaces.len() == 2
            && spaces.iter().all(|x| {
                x["summaries_pending"] == 0
                    && x["layers"].as_array().is_some_and(|l| l.len() >= 2)
                    && x["hierarchy_as_of"] == x["as_of"]
            });
        if ready {
            return s;
        }
        assert!(Instant::now() < deadline, "not settled: {s}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn the_memory_browser_in_chromium() {
    let Some(bin) = chromium() else { return };
    let dir = tempfile::tempdir().unwrap();
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let (news, standup) = (examples.join("news.jsonl"), examples.join("standup.jsonl"));
    let engine =
        Engine::start(dir.path(), &["--input", news.to_str().unwrap(), "--input", standup.to_str().unwrap()], &[]);
    // A record whose text is markup: the browser must show it as text.
    let hostile = r#"{"kind":"chunk","doc":"xss","seq":0,"text":"<img src=x onerror=document.title='owned'> harbour"}"#;
    assert_eq!(post(&format!("{}/v1/spaces/news/records", engine.api), hostile).await.0, 200);
    settled(&engine.api).await;
    let shots = std::env::var_os("ENGRAM_SCREENSHOTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("browser"));
    std::fs::create_dir_all(&shots).unwrap();
    let b = Browser { bin, profile: tempfile::tempdir().unwrap(), shots };
    let page = format!("{}/browse", engine.api);

    // The spaces and the live figures.
    let dom = b.dom(&format!("{page}#/"));
    assert_eq!(attrs(&dom, "data-space"), ["news", "standup"]);
    assert!(dom.contains("id=\"as-of\""), "live figures: {dom}");
    b.screenshot(&format!("{page}#/"), "spaces");

    // A query: the evidence, best first, and the trace.
    let q = format!("{page}#/query/news?q=How%20much%20will%20the%20sea%20wall%20cost%3F&mode=compass");
    let dom = b.dom(&q);
    let evidence = attrs(&dom, "data-evidence");
    assert!(evidence[0].starts_with("pm-2026-11-25-seawall-costs#0"), "{evidence:?}");
    assert!(dom.contains("id=\"trace\"") && dom.contains(">keep<"), "the trace is shown");
    b.screenshot(&q, "query");

    // The hierarchy: a layer's clusters, one cluster's children, and a child's page.
    let dom = b.dom(&format!("{page}#/space/news"));
    assert!(attrs(&dom, "data-layer").len() >= 2, "{dom}");
    let dom = b.dom(&format!("{page}#/layer/news/1"));
    let clusters = attrs(&dom, "data-cluster");
    assert!(!clusters.is_empty(), "{dom}");
    let cluster = &clusters[0];
    let dom = b.dom(&format!("{page}#/node/news/{}", urlencode(cluster)));
    let (_, api_cluster) = get(&format!("{}/v1/spaces/news/nodes/{}", engine.api, urlencode(cluster))).await;
    let children = attrs(&dom, "data-node");
    let want: Vec<String> =
        api_cluster["children"].as_array().unwrap().iter().map(|c| c.as_str().unwrap().to_string()).collect();
    for c in &want {
        assert!(children.contains(c), "the cluster page links its child {c}: {children:?}");
    }
    b.screenshot(&format!("{page}#/node/news/{}", urlencode(cluster)), "cluster");
    let child = &want[0];
    let dom = b.dom(&format!("{page}#/node/news/{}", urlencode(child)));
    let (_, api_child) = get(&format!("{}/v1/spaces/news/nodes/{}", engine.api, urlencode(child))).await;
    let text = api_child["text"].as_str().unwrap();
    assert!(dom.contains(&html_escape(&text[..text.len().min(40)])), "the child's text is shown");
    assert!(attrs(&dom, "data-node").contains(cluster), "and it links back to its parent");

    // A conversation's event graph, and an event's relations.
    let dom = b.dom(&format!("{page}#/space/standup"));
    let conversation = attrs(&dom, "data-conversation").into_iter().next().expect("a conversation");
    let url = format!("{page}#/events/standup/{}", urlencode(&conversation));
    let dom = b.dom(&url);
    let (_, api_events) = get(&format!("{}/v1/spaces/standup/events", engine.api)).await;
    let drawn = attrs(&dom, "data-event");
    assert_eq!(drawn.len(), api_events["events"].as_array().unwrap().len(), "every event is drawn");
    assert_eq!(attrs(&dom, "data-kind").len(), api_events["relations"].as_array().unwrap().len(), "every relation");
    b.screenshot(&url, "events");
    let with_relations = drawn
        .iter()
        .find(|e| api_events["relations"].as_array().unwrap().iter().any(|r| r["from"] == e.as_str()))
        .expect("an event with a relation");
    let dom = b.dom(&format!("{page}#/node/standup/{}", urlencode(with_relations)));
    assert!(dom.contains("id=\"relations\""), "the event's relations: {dom}");
    b.screenshot(&format!("{page}#/node/standup/{}", urlencode(with_relations)), "event");

    // Markup in the memory is text, not markup.
    let dom = b.dom(&format!("{page}#/node/news/xss%230"));
    assert!(dom.contains("&lt;img src=x onerror=") && !dom.contains("<img src=\"x\""), "escaped: {dom}");
    assert!(!dom.contains("<title>owned</title>"));
}

/// With tokens configured the page is served without one (it holds no memory), and it shows the API's refusal until
/// a token is typed.
#[tokio::test]
async fn the_browser_asks_for_a_token_when_the_api_needs_one() {
    let Some(bin) = chromium() else { return };
    let dir = tempfile::tempdir().unwrap();
    let file = crate::common::tokens_file(dir.path(), &[("ops", "browser-token-0123456789", "read", &["*"], 0)]);
    let file = file.display().to_string();
    let engine = Engine::start(&dir.path().join("data"), &[], &[("ENGRAM__AUTH__TOKENS_FILE", file.as_str())]);
    let r = crate::common::client().get(format!("{}/browse", engine.api)).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let csp = r.headers().get("content-security-policy").unwrap().to_str().unwrap().to_string();
    assert!(csp.contains("default-src 'none'") && csp.contains("connect-src 'self'"), "{csp}");
    let b = Browser { bin, profile: tempfile::tempdir().unwrap(), shots: dir.path().to_path_buf() };
    let dom = b.dom(&format!("{}/browse#/", engine.api));
    assert!(dom.contains("id=\"error\"") && dom.contains("unauthorized"), "{dom}");
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// With a model configured, the query page shows the model's answer above the evidence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_browser_shows_the_models_answer() {
    use axum::routing::post as route_post;
    let Some(bin) = chromium() else { return };
    async fn chat(axum::Json(body): axum::Json<serde_json::Value>) -> axum::Json<serde_json::Value> {
        let stage = body["response_format"]["json_schema"]["name"].as_str().unwrap_or("");
        let content = match stage {
            "answer" => serde_json::json!({"answer": "twenty six million pounds"}).to_string(),
            _ => serde_json::json!({"summary": "a summary"}).to_string(),
        };
        axum::Json(serde_json::json!({"choices": [{"message": {"role": "assistant", "content": content}}],
                                      "usage": {"prompt_tokens": 10, "completion_tokens": 5}}))
    }
    let base = crate::common::serve(axum::Router::new().route("/v1/chat/completions", route_post(chat))).await;
    let dir = tempfile::tempdir().unwrap();
    let news = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/news.jsonl");
    let engine = Engine::start(dir.path(), &["--input", news.to_str().unwrap()], &crate::common::llm_env(&base));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, s) = get(&format!("{}/v1/spaces", engine.api)).await;
        if s["spaces"][0]["nodes"] == 59 && s["spaces"][0]["summaries_pending"] == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "not settled: {s}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let b = Browser { bin, profile: tempfile::tempdir().unwrap(), shots: dir.path().to_path_buf() };
    let dom =
        b.dom(&format!("{}/browse#/query/news?q=How%20much%20will%20the%20sea%20wall%20cost%3F&mode=flat", engine.api));
    assert!(dom.contains("id=\"answer\"") && dom.contains("twenty six million pounds"), "{dom}");
}
