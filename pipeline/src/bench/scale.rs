//! `engram bench scale`: ONE space grown through the real engine (input log, dataflow, similarity, hierarchy,
//! extractive summaries, events, topics, views) to each of `--sizes` chunks. At every size it reports the ingest
//! rate of the segment just added, the resident memory per chunk, query latency per mode (no model), and freshness:
//! the time from a record's receipt to its reflection in the views, while a steady stream (`--stream-rate` records a
//! second for `--stream-seconds`) flows into the grown space. After the engine has stopped, raw hnsw_rs insertion of
//! the same vectors with the same parameters is timed segment by segment in the same run, the yardstick of ingest.
//!
//! Corpora: `--input FILE` (records of one space, e.g. QMSum's training meetings from
//! `scripts/to_records.py qmsum DIR --one-space meetings`), or, without `--input`, a synthetic news stream
//! ([`super::news`]).

use std::collections::VecDeque;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use hnsw_rs::prelude::Hnsw;
use operators::ingest::Ingestor;
use operators::model::UnitCosine;
use operators::record::from_value;
use operators::{Embedding, Record};
use serde_json::{json, Value};

use super::news::News;
use super::BenchArgs;
use crate::config::Config;
use crate::engine::{Engine, Place, Shared};
use crate::eval::settle;
use crate::query::{Mode, QueryRequest};

/// The records to grow the space with, in order, and where questions come from. The bench keeps no copy of what it
/// fed (that would count as the memory's): the yardstick and the questions open the corpus again and read it from
/// the start, and it yields the same records in the same order.
enum Corpus {
    News(Box<News>, VecDeque<Value>),
    Records(Box<dyn Iterator<Item = anyhow::Result<Value>>>),
}

impl Corpus {
    /// The corpus from its start: the synthetic news stream, or the lines of `inputs` in order, read as they are fed.
    fn open(inputs: &[std::path::PathBuf]) -> anyhow::Result<Corpus> {
        use std::io::BufRead;
        if inputs.is_empty() {
            return Ok(Corpus::News(Box::new(super::news::stream()), VecDeque::new()));
        }
        let mut files = Vec::new();
        for path in inputs {
            let file = std::fs::File::open(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
            files.push((path.clone(), std::io::BufReader::new(file)));
        }
        let lines = files.into_iter().flat_map(|(path, reader)| {
            reader.lines().enumerate().filter_map(move |(i, line)| {
                let at = || format!("{}:{}", path.display(), i + 1);
                match line {
                    Err(e) => Some(Err(anyhow::anyhow!("{}: {e}", at()))),
                    Ok(l) if l.trim().is_empty() => None,
                    Ok(l) => Some(serde_json::from_str(&l).map_err(|e| anyhow::anyhow!("{}: {e}", at()))),
                }
            })
        });
        Ok(Corpus::Records(Box::new(lines)))
    }

    fn next(&mut self) -> anyhow::Result<Option<Value>> {
        match self {
            Corpus::News(news, buf) => {
                if buf.is_empty() {
                    buf.extend(news.next_doc());
                }
                Ok(buf.pop_front())
            }
            Corpus::Records(it) => it.next().transpose(),
        }
    }

    /// The next record, parsed under `limits`.
    fn next_record(&mut self, limits: &operators::Limits) -> anyhow::Result<Option<Record>> {
        match self.next()? {
            Some(v) => Ok(Some(from_value(v, None, limits).map_err(|e| anyhow::anyhow!("record: {e}"))?)),
            None => Ok(None),
        }
    }
}

/// Resident memory of this process, in bytes (Linux; 0 elsewhere).
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// How often a wait looks at the views: fine enough for the rates measured.
const POLL: Duration = Duration::from_millis(5);

struct Point {
    size: usize,
    records: usize,
    seconds: f64,
    json: Value,
}

pub(super) fn scale(args: &BenchArgs, config: &Config) -> anyhow::Result<ExitCode> {
    let mut sizes = args.sizes.clone();
    sizes.sort_unstable();
    anyhow::ensure!(!sizes.is_empty(), "--sizes names no size");
    let dir = std::env::temp_dir().join(format!("engram-bench-scale-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut config = config.clone();
    config.data_dir = dir.clone();
    config.checkpoint.interval = std::time::Duration::ZERO;
    config.ingest.epoch_max_records = args.batch.max(1);
    // Every record is checked before the engine starts: a bad one is an error naming its line.
    let limits = operators::Limits {
        max_record_bytes: config.ingest.max_record_bytes,
        max_id_bytes: config.ingest.max_id_bytes,
    };
    let corpus_name = if args.inputs.is_empty() {
        "synthetic-news".to_string()
    } else {
        let mut check = Corpus::open(&args.inputs)?;
        let mut n = 0usize;
        while let Some(v) = check.next()? {
            n += 1;
            from_value(v, None, &limits).map_err(|e| anyhow::anyhow!("record {n} of the inputs: {e}"))?;
        }
        let names: Vec<String> = args.inputs.iter().map(|p| p.display().to_string()).collect();
        names.join(",")
    };
    let mut corpus = Corpus::open(&args.inputs)?;
    let mut engine = Engine::open(config.clone(), Place::SINGLE)?;
    let shared = engine.shared().clone();
    engine.start(timely::Config::process(args.workers.first().copied().unwrap_or(1)))?;
    let baseline = rss_bytes();
    // How many records were fed (the corpus's first `fed`).
    let mut fed = 0usize;
    let mut space = String::new();
    let mut points = Vec::new();
    let mut questions = News::new("news", 7);
    let mut grown = 0;
    for &size in &sizes {
        // Grow: keep a few epochs queued, never the whole segment (its records would count as the memory's).
        let started = Instant::now();
        let before = fed;
        while fed < size {
            if shared.queued() > 2 * args.batch {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            let mut batch = Vec::with_capacity(args.batch);
            while batch.len() < args.batch && fed + batch.len() < size {
                let Some(r) = corpus.next_record(&shared.limits)? else { break };
                batch.push(r);
            }
            if batch.is_empty() {
                break;
            }
            space = batch[0].space().to_string();
            fed += batch.len();
            shared.queue_records(batch);
        }
        settle(&shared, POLL);
        let seconds = started.elapsed().as_secs_f64();
        let records = fed - before;
        if records == 0 {
            eprintln!("the corpus ends at {fed} records");
            break;
        }
        grown = fed;
        let rss = rss_bytes();
        let (nodes, events, relations, topics, layers, degrees) = counts(&shared, &space);
        let vector_bytes = vector_bytes(&shared, &space);
        let latency = query_latency(&shared, &space, &args.inputs, fed, &mut questions, args.queries)?;
        let ids_before = cluster_ids(&shared, &space);
        let streamed = fed;
        let fresh = freshness(&shared, &mut corpus, &mut fed, args.stream_rate, args.stream_seconds)?;
        let replaced = replaced_clusters(&ids_before, &cluster_ids(&shared, &space), fed - streamed);
        let point = json!({
            "bench": "scale", "corpus": corpus_name, "space": space, "size": nodes, "records": fed,
            "segment_records": records, "segment_seconds": seconds,
            "chunks_per_second": records as f64 / seconds,
            "rss_bytes": rss, "rss_bytes_per_chunk": rss.saturating_sub(baseline) as f64 / nodes.max(1) as f64,
            "vector_bytes_per_chunk": vector_bytes as f64 / nodes.max(1) as f64,
            "events": events, "relations": relations, "relations_per_event": relations as f64 / events.max(1) as f64,
            "topics": topics, "layers": layers, "layer_degrees": degrees, "query_ms": latency, "freshness_ms": fresh,
            "clusters_replaced_per_streamed_record": replaced,
        });
        eprintln!("{point}");
        points.push(Point { size: grown, records, seconds, json: point });
    }
    engine.stop()?;
    let _ = std::fs::remove_dir_all(&dir);
    // The memory goes before the yardstick's index is built (at a million chunks the two would not fit together).
    let (embedder, limits) = (shared.embedder.clone(), shared.limits.clone());
    drop(shared);
    // The yardstick: the same vectors into a bare hnsw_rs index with the same parameters, segment by segment.
    let p = &config.similarity;
    let mut ingestor = Ingestor::new(config.ingest.chunk_tokens);
    // Two of them: the vectors as plain `f32` slices (what a user of hnsw_rs would insert), and engram's own
    // `Embedding`s (sparse where the vector is), so that the ratio to each is known.
    let dense: Hnsw<f32, UnitCosine> = Hnsw::new(p.max_connections, grown.max(1024), 16, p.ef_construction, UnitCosine);
    let shared_vectors: Hnsw<Embedding, UnitCosine> =
        Hnsw::new(p.max_connections, grown.max(1024), 16, p.ef_construction, UnitCosine);
    let (mut at, mut slot) = (0, 0);
    let mut corpus = Corpus::open(&args.inputs)?;
    for point in &mut points {
        let mut segment = Vec::with_capacity(point.size - at);
        while at + segment.len() < point.size {
            let Some(r) = corpus.next_record(&limits)? else { break };
            segment.push(r);
        }
        let texts: Vec<String> = segment
            .into_iter()
            .flat_map(|r| ingestor.apply(r))
            .filter(|d| d.2 > 0)
            .map(|d| d.1.embedding_text())
            .collect();
        at = point.size;
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let vectors: Vec<Embedding> = embedder.embed_batch(&refs).into_iter().filter(|v| !v.is_zero()).collect();
        let plain: Vec<Vec<f32>> = vectors.iter().map(Embedding::to_dense).collect();
        let t = Instant::now();
        for (i, v) in plain.iter().enumerate() {
            dense.insert_slice((v, slot + i));
        }
        let raw = texts.len() as f64 / t.elapsed().as_secs_f64();
        let t = Instant::now();
        for (i, v) in vectors.iter().enumerate() {
            shared_vectors.insert_slice((std::slice::from_ref(v), slot + i));
        }
        let raw_shared = texts.len() as f64 / t.elapsed().as_secs_f64();
        slot += vectors.len();
        let ours = point.records as f64 / point.seconds;
        point.json["hnsw_rs_chunks_per_second"] = json!(raw);
        point.json["vs_hnsw_rs"] = json!(ours / raw);
        point.json["hnsw_rs_engram_vectors_chunks_per_second"] = json!(raw_shared);
        point.json["vs_hnsw_rs_engram_vectors"] = json!(ours / raw_shared);
    }
    for p in &points {
        if args.json {
            println!("{}", p.json);
        } else {
            let q = &p.json["query_ms"];
            println!(
                "size={:<8} chunks/s={:<7.0} hnsw_rs/s={:<7.0} ratio={:<5.2} (over engram's vectors {:<7.0} {:<5.2}) KB/chunk={:<6.1} (vectors {:.2}) events={} rel/event={:.1} \
                 p95 ms flat={:.1} pg={:.1} compass={:.1}  freshness p95 ms={:.0} (hierarchy {:.0})",
                p.json["size"],
                p.json["chunks_per_second"].as_f64().unwrap_or(0.0),
                p.json["hnsw_rs_chunks_per_second"].as_f64().unwrap_or(0.0),
                p.json["vs_hnsw_rs"].as_f64().unwrap_or(0.0),
                p.json["hnsw_rs_engram_vectors_chunks_per_second"].as_f64().unwrap_or(0.0),
                p.json["vs_hnsw_rs_engram_vectors"].as_f64().unwrap_or(0.0),
                p.json["rss_bytes_per_chunk"].as_f64().unwrap_or(0.0) / 1024.0,
                p.json["vector_bytes_per_chunk"].as_f64().unwrap_or(0.0) / 1024.0,
                p.json["events"],
                p.json["relations_per_event"].as_f64().unwrap_or(0.0),
                q["flat"]["p95"].as_f64().unwrap_or(0.0),
                q["prune-and-grow"]["p95"].as_f64().unwrap_or(0.0),
                q["compass"]["p95"].as_f64().unwrap_or(0.0),
                p.json["freshness_ms"]["p95"].as_f64().unwrap_or(0.0),
                p.json["freshness_ms"]["hierarchy"]["p95"].as_f64().unwrap_or(0.0),
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The heap bytes of the layer-0 vectors of `space` (each held once, shared by the engine's parts).
fn vector_bytes(shared: &Shared, space: &str) -> usize {
    let views = shared.views();
    views.spaces.get(space).map_or(0, |v| v.nodes.values().map(|(_, e)| e.heap_bytes()).sum())
}

/// (layer-0 nodes, events, relations, topics, nodes per layer).
fn counts(shared: &Shared, space: &str) -> (usize, usize, usize, usize, Vec<usize>, Vec<f64>) {
    let views = shared.views();
    let Some(v) = views.spaces.get(space) else { return (0, 0, 0, 0, Vec::new(), Vec::new()) };
    let topics: std::collections::HashSet<&String> = v.topic_of.values().collect();
    let layers = v.layer_counts();
    // Mean degree per layer: how dense each layer's graph is.
    let mut links = vec![0usize; layers.len()];
    for (id, nbrs) in &v.adjacency {
        let layer = v.clusters.get(id.as_str()).map_or(0, |c| c.layer as usize);
        if let Some(l) = links.get_mut(layer) {
            *l += nbrs.len();
        }
    }
    let degrees =
        links.iter().zip(&layers).map(|(l, n)| (*l as f64 / (*n).max(1) as f64 * 10.0).round() / 10.0).collect();
    (v.nodes.len(), v.events.len(), v.relations.len(), topics.len(), layers, degrees)
}

/// The cluster ids of every layer of a space (index 0 is layer 1).
fn cluster_ids(shared: &Shared, space: &str) -> Vec<std::collections::HashSet<String>> {
    let views = shared.views();
    let mut out: Vec<std::collections::HashSet<String>> = Vec::new();
    for (id, c) in views.spaces.get(space).map(|v| &v.clusters).into_iter().flatten() {
        let l = c.layer.max(1) as usize - 1;
        if out.len() <= l {
            out.resize_with(l + 1, Default::default);
        }
        out[l].insert(id.clone());
    }
    out
}

/// Per layer, the clusters that left or arrived over a stream of `records`, per record: a cluster that keeps its id
/// while its members change is not counted, one renamed (a new anchor) counts twice.
fn replaced_clusters(
    before: &[std::collections::HashSet<String>],
    after: &[std::collections::HashSet<String>],
    records: usize,
) -> Vec<f64> {
    let empty = std::collections::HashSet::new();
    (0..before.len().max(after.len()))
        .map(|l| {
            let (b, a) = (before.get(l).unwrap_or(&empty), after.get(l).unwrap_or(&empty));
            let n = b.symmetric_difference(a).count();
            (n as f64 / records.max(1) as f64 * 10.0).round() / 10.0
        })
        .collect()
}

/// p50 and p95 (ms) of `n` queries per mode, without a model: questions from the news generator, or the opening
/// words of turns spread over the records.
fn query_latency(
    shared: &Shared,
    space: &str,
    inputs: &[std::path::PathBuf],
    fed: usize,
    news: &mut News,
    n: usize,
) -> anyhow::Result<Value> {
    // The fed records at the questions' positions, read again from the corpus's start (news: none, the generator
    // asks).
    let mut at: Vec<usize> = (0..n).map(|i| (i * 7919) % fed.max(1)).collect();
    at.sort_unstable();
    at.dedup();
    let mut picked: std::collections::HashMap<usize, Record> = std::collections::HashMap::new();
    if !inputs.is_empty() {
        let mut corpus = Corpus::open(inputs)?;
        let last = at.last().copied().unwrap_or(0);
        for i in 0..=last {
            let Some(r) = corpus.next_record(&shared.limits)? else { break };
            if at.binary_search(&i).is_ok() {
                picked.insert(i, r);
            }
        }
    }
    let questions: Vec<String> = (0..n)
        .map(|i| match picked.get(&((i * 7919) % fed.max(1))) {
            Some(Record::Turn { text, .. }) => text.split_whitespace().take(12).collect::<Vec<_>>().join(" "),
            _ => news.question(),
        })
        .collect();
    let mut out = serde_json::Map::new();
    for mode in [Mode::Flat, Mode::Hybrid, Mode::PruneAndGrow, Mode::Compass] {
        let mut ms = Vec::new();
        for q in &questions {
            let req = QueryRequest {
                query: if q.trim().is_empty() { "what was said".into() } else { q.clone() },
                mode,
                budget_words: None,
                k: None,
                answer: Some(false),
                use_model: Some(false),
            };
            let t = Instant::now();
            let _ = crate::service::execute(shared, space, &req);
            ms.push(t.elapsed().as_secs_f64() * 1e3);
        }
        ms.sort_by(f64::total_cmp);
        out.insert(mode.as_str().into(), json!({"p50": percentile(&ms, 0.5), "p95": percentile(&ms, 0.95)}));
    }
    Ok(Value::Object(out))
}

/// Streams `rate` records a second for `seconds` into the space and measures each record's time from receipt
/// (queued) to the views reflecting its epoch (`as_of`: layer 0 and events): p50, p95, max (ms); and the same to
/// the hierarchy reflecting it (`hierarchy_as_of`).
fn freshness(shared: &Shared, corpus: &mut Corpus, fed: &mut usize, rate: f64, seconds: f64) -> anyhow::Result<Value> {
    let total = (rate * seconds).round() as usize;
    if total == 0 {
        return Ok(Value::Null);
    }
    // Every (kind, layer) the views count, summed over the labels seen.
    let changes = || -> std::collections::BTreeMap<String, u64> {
        let mut out = std::collections::BTreeMap::new();
        for m in prometheus::core::Collector::collect(&shared.metrics.view_updates) {
            for c in m.get_metric() {
                let label = |n: &str| c.get_label().iter().find(|l| l.name() == n).map(|l| l.value().to_string());
                let (kind, layer) = (label("kind").unwrap_or_default(), label("layer").unwrap_or_default());
                let key = if layer.is_empty() { kind } else { format!("{kind}@{layer}") };
                *out.entry(key).or_default() += c.get_counter().get_value() as u64;
            }
        }
        out
    };
    let before = changes();
    let started = Instant::now();
    let mut waiting: VecDeque<(u64, Instant)> = VecDeque::new();
    let mut waiting_hierarchy: VecDeque<(u64, Instant)> = VecDeque::new();
    let mut ms = Vec::new();
    let mut hierarchy_ms = Vec::new();
    let mut sent = 0;
    while sent < total || !waiting.is_empty() || !waiting_hierarchy.is_empty() {
        let due = started + Duration::from_secs_f64(sent as f64 / rate);
        if sent < total && Instant::now() >= due {
            let Some(r) = corpus.next_record(&shared.limits)? else { break };
            *fed += 1;
            let epoch = shared.queue_records(vec![r]);
            waiting.push_back((epoch, Instant::now()));
            waiting_hierarchy.push_back((epoch, Instant::now()));
            sent += 1;
        }
        for (queue, at, out) in [
            (&mut waiting, shared.as_of(), &mut ms),
            (&mut waiting_hierarchy, shared.hierarchy_as_of(), &mut hierarchy_ms),
        ] {
            while queue.front().is_some_and(|(e, _)| at.is_some_and(|a| a >= *e)) {
                let (_, t) = queue.pop_front().expect("front");
                out.push(t.elapsed().as_secs_f64() * 1e3);
            }
        }
        if started.elapsed() > Duration::from_secs_f64(seconds + 120.0) {
            eprintln!(
                "warning: {} streamed records not in the views, {} not in the hierarchy, two minutes on",
                waiting.len(),
                waiting_hierarchy.len()
            );
            break;
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    settle(shared, POLL);
    // What the stream rewrote in the views, per streamed record, by kind: churn beyond the records themselves.
    let per_record: serde_json::Map<String, Value> = changes()
        .into_iter()
        .map(|(k, now)| {
            let n = now - before.get(&k).copied().unwrap_or(0);
            (k, json!((n as f64 / ms.len().max(1) as f64 * 10.0).round() / 10.0))
        })
        .filter(|(_, v)| v.as_f64() != Some(0.0))
        .collect();
    ms.sort_by(f64::total_cmp);
    hierarchy_ms.sort_by(f64::total_cmp);
    let hierarchy = json!({"p50": percentile(&hierarchy_ms, 0.5), "p95": percentile(&hierarchy_ms, 0.95),
                           "max": hierarchy_ms.last().copied().unwrap_or(0.0)});
    Ok(json!({"records": ms.len(), "p50": percentile(&ms, 0.5), "p95": percentile(&ms, 0.95),
              "max": ms.last().copied().unwrap_or(0.0), "hierarchy": hierarchy, "view_updates_per_record": per_record}))
}
