//! The CAM hierarchy end to end over HTTP: clusters and summaries appear for the bundled examples, a delete
//! retracts what was derived from the document and re-summarises what changed, and a restart makes no summary call.

use std::time::{Duration, Instant};

use crate::common::{get, post, Engine};
use serde_json::json;

fn example(name: &str) -> String {
    format!("{}/../examples/{name}", env!("CARGO_MANIFEST_DIR"))
}

const ENV: &[(&str, &str)] =
    &[("ENGRAM__HIERARCHY__SUMMARY_DEBOUNCE", "50ms"), ("ENGRAM__HIERARCHY__SUMMARY_COVERAGE", "0.5")];

/// Waits until `space` has `nodes` nodes, at least one cluster, no summary pending and its hierarchy as of its layer 0.
async fn quiet(engine: &Engine, space: &str, nodes: u64) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, spaces) = get(&format!("{}/v1/spaces", engine.api)).await;
        if let Some(s) = spaces["spaces"].as_array().unwrap().iter().find(|s| s["space"] == space) {
            let caught_up = s["hierarchy_as_of"] == s["as_of"];
            if s["nodes"] == nodes && s["clusters"].as_u64() > Some(0) && s["summaries_pending"] == 0 && caught_up {
                return s.clone();
            }
        }
        assert!(Instant::now() < deadline, "{space} did not settle: {spaces}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Waits until the news space has its hierarchy and every cluster its summary.
async fn settled(engine: &Engine) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, spaces) = get(&format!("{}/v1/spaces", engine.api)).await;
        if let Some(news) = spaces["spaces"].as_array().unwrap().iter().find(|s| s["space"] == "news") {
            let layers = news["layers"].as_array().unwrap().len();
            if news["nodes"] == 59 && layers >= 3 && news["summaries_pending"] == 0 {
                return news.clone();
            }
        }
        assert!(Instant::now() < deadline, "hierarchy did not settle: {spaces}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn metric(engine: &Engine, name: &str) -> f64 {
    let text =
        crate::common::client().get(format!("{}/metrics", engine.admin)).send().await.unwrap().text().await.unwrap();
    text.lines().filter(|l| l.starts_with(name)).map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap()).sum()
}

fn log_lines(engine: &Engine) -> usize {
    std::fs::read_to_string(engine.data_dir.join("responses.log")).map(|t| t.lines().count()).unwrap_or(0)
}

#[tokio::test]
async fn clusters_summaries_deletes_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let news = example("news.jsonl");
    let args = ["--input", news.as_str()];
    let mut engine = Engine::start(dir.path(), &args, ENV);
    let before = settled(&engine).await;
    let layers: Vec<u64> = before["layers"].as_array().unwrap().iter().map(|n| n.as_u64().unwrap()).collect();
    assert!(layers.windows(2).all(|w| w[1] < w[0]), "every kept layer shrinks: {layers:?}");
    let calls = metric(&engine, "engram_llm_requests_total").await;
    let reused = metric(&engine, "engram_summaries_reused_total").await;
    assert_eq!((calls + reused) as usize, log_lines(&engine), "every summary, made or reused, is logged once");
    // One summary per cluster, but a cluster of one member above layer 1 shows its member's summary with no call.
    let url = |id: &str| format!("{}/v1/spaces/news/nodes/{}", engine.api, id.replace('#', "%23"));
    let mut todo: Vec<String> = std::fs::read_to_string(&news)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .map(|r| format!("{}#{}", r["doc"].as_str().unwrap(), r["seq"]))
        .collect();
    let mut seen = std::collections::BTreeMap::new();
    while let Some(id) = todo.pop() {
        if seen.contains_key(&id) {
            continue;
        }
        let (status, node) = get(&url(&id)).await;
        assert_eq!(status, 200, "{id}: {node}");
        todo.extend(node["parents"].as_array().unwrap().iter().map(|p| p.as_str().unwrap().to_string()));
        seen.insert(id, node);
    }
    let clusters: Vec<&serde_json::Value> = seen.values().filter(|n| n["layer"].as_u64() > Some(0)).collect();
    assert_eq!(clusters.len() as u64, layers[1..].iter().sum::<u64>(), "every cluster is some chunk's ancestor");
    let singles: Vec<&&serde_json::Value> = clusters
        .iter()
        .filter(|n| n["layer"].as_u64() > Some(1) && n["children"].as_array().unwrap().len() == 1)
        .collect();
    for n in &singles {
        let child = &seen[n["children"][0].as_str().unwrap()];
        assert_eq!(n["text"], child["text"], "a one-member cluster shows its member's summary: {n}");
    }
    assert_eq!(calls as usize, clusters.len() - singles.len(), "one summary per cluster of two members or more");

    // A chunk's parents are layer-1 clusters with a summary and children.
    let (_, chunk) = get(&url("pm-2026-11-23-storm#0")).await;
    let parent = chunk["parents"][0].as_str().expect("the chunk has a cluster").to_string();
    let (status, cluster) = get(&url(&parent)).await;
    assert_eq!(status, 200, "{cluster}");
    assert_eq!(cluster["layer"], 1);
    assert_eq!(cluster["kind"], "summary");
    assert!(!cluster["text"].as_str().unwrap().is_empty());
    assert!(cluster["children"].as_array().unwrap().iter().any(|c| c == "pm-2026-11-23-storm#0"));

    // Prune-and-Grow over every layer: evidence within the budget, a trace of seeds and rounds.
    let q = json!({"query": "How much will the sea wall cost?", "mode": "prune-and-grow", "budget_words": 300, "k": 6});
    let (status, resp) = post(&format!("{}/v1/spaces/news/query", engine.api), q.to_string()).await;
    assert_eq!(status, 200, "{resp}");
    let evidence = resp["evidence"].as_array().unwrap();
    assert!(!evidence.is_empty());
    let words: usize = evidence.iter().map(|e| e["text"].as_str().unwrap().split_whitespace().count()).sum();
    assert!(words <= 300, "{words} words over the budget");
    assert!(evidence.iter().any(|e| e["text"].as_str().unwrap().contains("sea wall")), "{resp}");
    let steps: Vec<&str> = resp["trace"].as_array().unwrap().iter().map(|t| t["step"].as_str().unwrap()).collect();
    assert_eq!(steps[0], "seed");
    assert!(steps.contains(&"round"));

    let calls = metric(&engine, "engram_llm_requests_total").await;

    // Delete the storm report: its chunks leave every cluster; changed clusters are summarised again.
    let (_, r) = post(
        &format!("{}/v1/spaces/news/records", engine.api),
        json!({"kind":"delete","doc":"pm-2026-11-23-storm"}).to_string(),
    )
    .await;
    let receipt = r["receipt"].as_str().unwrap().to_string();
    let (status, _) = get(&format!("{}?after={receipt}", url("pm-2026-11-23-storm#0"))).await;
    assert_eq!(status, 404);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, spaces) = get(&format!("{}/v1/spaces", engine.api)).await;
        let news = spaces["spaces"].as_array().unwrap().iter().find(|s| s["space"] == "news").unwrap().clone();
        if news["summaries_pending"] == 0 && news["nodes"].as_u64().unwrap() < 59 {
            break;
        }
        assert!(Instant::now() < deadline, "{spaces}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, _) = get(&url(&parent)).await;
    if status == 200 {
        let (_, c) = get(&url(&parent)).await;
        assert!(!c["children"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x.as_str().unwrap().starts_with("pm-2026-11-23-storm")));
    }
    let after_delete = log_lines(&engine);
    assert!(metric(&engine, "engram_llm_requests_total").await > calls, "changed clusters were summarised again");
    // No summary anywhere still quotes the deleted report (extractive summaries copy sentences): every summary
    // that saw it was made again, up to the top, reused or not.
    let storm: Vec<String> = std::fs::read_to_string(example("news.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["doc"] == "pm-2026-11-23-storm")
        .flat_map(|r| {
            r["text"].as_str().unwrap().split(". ").map(|s| s.trim_end_matches('.').to_string()).collect::<Vec<_>>()
        })
        .filter(|s| s.split_whitespace().count() >= 6)
        .collect();
    let mut todo: Vec<String> = vec!["pm-2026-11-26-council-vote#0".into()];
    let mut seen = std::collections::BTreeSet::new();
    while let Some(id) = todo.pop() {
        if !seen.insert(id.clone()) {
            continue;
        }
        let (status, node) = get(&url(&id)).await;
        assert_eq!(status, 200, "{id}: {node}");
        if node["layer"].as_u64() > Some(0) {
            let text = node["text"].as_str().unwrap();
            for s in &storm {
                assert!(!text.contains(s.as_str()), "{id} still quotes the deleted report: {s:?} in {text:?}");
            }
        }
        for p in
            node["parents"].as_array().into_iter().flatten().chain(node["neighbours"].as_array().into_iter().flatten())
        {
            if let Some(p) = p.as_str().or_else(|| p["id"].as_str()) {
                todo.push(p.to_string());
            }
        }
    }
    assert!(seen.iter().any(|s| s.starts_with("L2")), "walked up the layers: {seen:?}");
    assert_eq!(engine.terminate(), Some(0));

    // Restart on the same data: the hierarchy comes back from the logs with no summary call.
    let engine = Engine::start(dir.path(), &args, ENV);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let (_, spaces) = get(&format!("{}/v1/spaces", engine.api)).await;
        let news = spaces["spaces"].as_array().unwrap().iter().find(|s| s["space"] == "news").cloned();
        if news.is_some_and(|n| {
            n["nodes"].as_u64() < Some(59) && n["summaries_pending"] == 0 && n["layers"].as_array().unwrap().len() >= 2
        }) {
            break;
        }
        assert!(Instant::now() < deadline, "{spaces}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(metric(&engine, "engram_llm_requests_total").await, 0.0, "a restart repeats no call");
    assert_eq!(log_lines(&engine), after_delete);
}

/// Two unrelated documents, three paragraphs each, make two layer-1 clusters. A fourth paragraph of the first joins
/// its cluster: the summary of the three still holds (it covers 3 of 4 members, nothing lost), so it is reused —
/// logged with its coverage, no call. Replacing a paragraph the summary saw asks the model again. After a restart the
/// cache is read back from the response log and the next growth reuses again.
#[tokio::test]
async fn a_grown_cluster_reuses_its_summary_and_a_changed_one_does_not() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(dir.path(), &[], ENV);
    let chunk =
        |doc: &str, seq: u32, text: &str| json!({"kind": "chunk", "doc": doc, "seq": seq, "text": text}).to_string();
    let tide = [
        "The tide gauge at the harbour recorded a surge. The harbour wall was overtopped by the tide.",
        "Harbour crews watched the tide surge over the wall. The gauge at the harbour broke its record.",
        "After the surge the harbour wall needs repair. The tide gauge will be moved along the harbour.",
    ];
    let cup = [
        "The football club won the cup semi-final. The striker scored a late goal for the club.",
        "A late goal by the striker sent the club to the cup final. The football crowd sang for the striker.",
        "The club will play the cup final in May. The striker and the football club trained on Monday.",
    ];
    let body: Vec<String> = tide
        .iter()
        .enumerate()
        .map(|(i, t)| chunk("tide", i as u32, t))
        .chain(cup.iter().enumerate().map(|(i, t)| chunk("cup", i as u32, t)))
        .collect();
    let records = format!("{}/v1/spaces/grow/records", engine.api);
    let (status, r) = post(&records, body.join("\n")).await;
    assert_eq!(status, 200, "{r}");
    let space = quiet(&engine, "grow", 6).await;
    assert_eq!(space["clusters"], 2, "{space}");
    let calls = metric(&engine, "engram_llm_requests_total").await;
    assert_eq!(calls, 2.0);
    assert_eq!(metric(&engine, "engram_summaries_reused_total").await, 0.0);
    let node = |id: &str| format!("{}/v1/spaces/grow/nodes/{}", engine.api, id.replace('#', "%23"));
    let (_, t0) = get(&node("tide#0")).await;
    let cluster = t0["parents"][0].as_str().unwrap().to_string();
    let (_, before) = get(&node(&cluster)).await;

    let (_, r) = post(
        &records,
        chunk("tide", 3, "The harbour tide surge and the gauge: the wall of the harbour held the tide."),
    )
    .await;
    assert_eq!(r["accepted"], 1, "{r}");
    quiet(&engine, "grow", 7).await;
    let (_, after) = get(&node(&cluster)).await;
    assert_eq!(after["children"].as_array().unwrap().len(), 4, "{after}");
    assert_eq!(after["text"], before["text"], "the summary of the three is kept");
    assert_eq!(metric(&engine, "engram_summaries_reused_total").await, 1.0);
    assert_eq!(metric(&engine, "engram_llm_requests_total").await, calls, "no call for the grown cluster");
    let logged = crate::common::log_rows(&engine.data_dir.join("responses.log"));
    let last = logged.last().unwrap();
    assert_eq!(last["covers"]["members"].as_array().unwrap().len(), 3, "{last}");

    // A paragraph the summary saw changes: the summary no longer holds.
    let (_, r) = post(
        &records,
        chunk("tide", 1, "Harbour crews watched the tide surge over the wall and the gauge at the harbour."),
    )
    .await;
    assert_eq!(r["accepted"], 1, "{r}");
    let deadline = Instant::now() + Duration::from_secs(60);
    while metric(&engine, "engram_llm_requests_total").await == calls {
        assert!(Instant::now() < deadline, "the changed cluster was not summarised again");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    quiet(&engine, "grow", 7).await;
    assert_eq!(metric(&engine, "engram_summaries_reused_total").await, 1.0);
    let (_, changed) = get(&node(&cluster)).await;
    assert_ne!(changed["text"], before["text"]);
    let mut engine = engine;
    assert_eq!(engine.terminate(), Some(0));
    drop(engine);

    // After a restart the summaries made so far are read back with their coverage: the next growth reuses the
    // summary of the four, still with no call.
    let engine = Engine::start(dir.path(), &[], ENV);
    let records = format!("{}/v1/spaces/grow/records", engine.api);
    let node = |id: &str| format!("{}/v1/spaces/grow/nodes/{}", engine.api, id.replace('#', "%23"));
    quiet(&engine, "grow", 7).await;
    let (_, r) =
        post(&records, chunk("tide", 4, "The gauge and the harbour wall: the tide surge at the harbour was a record."))
            .await;
    assert_eq!(r["accepted"], 1, "{r}");
    quiet(&engine, "grow", 8).await;
    let (_, grown) = get(&node(&cluster)).await;
    assert_eq!(grown["children"].as_array().unwrap().len(), 5, "{grown}");
    assert_eq!(grown["text"], changed["text"]);
    assert_eq!(metric(&engine, "engram_summaries_reused_total").await, 1.0);
    assert_eq!(metric(&engine, "engram_llm_requests_total").await, 0.0, "no call after the restart");
}

/// The hierarchy follows layer 0 on a thread of its own: `hierarchy_as_of` is never ahead of `as_of`, and `?after=`
/// on a layer above 0 or on a node waits for the hierarchy to hold the receipt, not only layer 0.
#[tokio::test]
async fn after_a_receipt_the_layers_above_0_wait_for_the_hierarchy() {
    let dir = tempfile::tempdir().unwrap();
    let engine = Engine::start(dir.path(), &[], ENV);
    let news = std::fs::read_to_string(example("news.jsonl")).unwrap();
    let (status, receipt) = post(&format!("{}/v1/spaces/news/records", engine.api), news).await;
    assert_eq!(status, 200, "{receipt}");
    let r: u64 = receipt["receipt"].as_str().unwrap().parse().unwrap();
    let (status, page) = get(&format!("{}/v1/spaces/news/layers/1?after={r}", engine.api)).await;
    assert_eq!(status, 200, "{page}");
    assert!(page["hierarchy_as_of"].as_u64().is_some_and(|h| h >= r), "{page}");
    assert!(page["total"].as_u64() > Some(0), "layer 1 holds the receipt's clusters: {page}");
    // Every cluster of layer 1 is a parent of some layer-0 node, as the node pages say at the same receipt.
    let first = page["nodes"][0]["id"].as_str().unwrap().to_string();
    let (status, cluster) = get(&format!("{}/v1/spaces/news/nodes/{first}?after={r}", engine.api)).await;
    assert_eq!(status, 200, "{cluster}");
    let child = cluster["children"][0].as_str().expect("a member").replace('#', "%23");
    let (_, node) = get(&format!("{}/v1/spaces/news/nodes/{child}?after={r}", engine.api)).await;
    assert!(node["parents"].as_array().unwrap().iter().any(|p| p == first.as_str()), "{node}");
    for _ in 0..20 {
        let (_, h) = get(&format!("{}/healthz", engine.admin)).await;
        let (a, hi) = (h["as_of"].as_u64(), h["hierarchy_as_of"].as_u64());
        assert!(hi <= a, "the hierarchy is never ahead of layer 0: {h}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
