//! `engram bench`: throughput measurements, printed as a table, or with `--json` one JSON object per point.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use clap::{Args, ValueEnum};
use differential_dataflow::input::Input;
use hnsw_rs::prelude::Hnsw;
use operators::model::UnitCosine;
use operators::dataflow::{embed_nodes, similarity_edges};
use operators::ingest::Ingestor;
use operators::{parse_record, Embedder, HashEmbedder, Limits, Node, SimilarityParams};
use timely::dataflow::operators::probe::Handle as ProbeHandle;

use crate::config::{Config, Overrides};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum BenchName {
    /// Records → chunks → embeddings → similarity edges, against raw hnsw_rs insertion of the same vectors.
    Ingest,
    /// Score distributions of the similarity graph and the edges per node at a range of θ (calibration).
    Theta,
}

#[derive(Args)]
pub struct BenchArgs {
    name: BenchName,
    /// JSONL record files (default: the bundled examples).
    #[arg(long = "input")]
    inputs: Vec<PathBuf>,
    /// Worker counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    workers: Vec<usize>,
    /// Records per epoch.
    #[arg(long, default_value_t = 1000)]
    batch: usize,
    /// Configuration file for the similarity and ingest parameters.
    #[arg(long)]
    config: Option<PathBuf>,
    /// One JSON object per measured point.
    #[arg(long)]
    json: bool,
}

pub fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let config = Config::load(args.config.as_deref(), std::env::vars(), &Overrides::default())?;
    match args.name {
        BenchName::Ingest => ingest(&args, &config),
        BenchName::Theta => theta(&args, &config),
    }
}

fn load_nodes(args: &BenchArgs, config: &Config) -> anyhow::Result<Vec<(String, Node, isize)>> {
    let inputs = if args.inputs.is_empty() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples");
        vec![root.join("news.jsonl"), root.join("standup.jsonl")]
    } else {
        args.inputs.clone()
    };
    let limits = Limits { max_record_bytes: config.ingest.max_record_bytes, max_id_bytes: config.ingest.max_id_bytes };
    let mut ingestor = Ingestor::new(config.ingest.chunk_tokens);
    let mut out = Vec::new();
    for path in inputs {
        let text = std::fs::read(&path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        for line in text.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            if let Ok(r) = parse_record(line, None, &limits) {
                out.extend(ingestor.apply(r));
            }
        }
    }
    Ok(out)
}

fn ingest(args: &BenchArgs, config: &Config) -> anyhow::Result<ExitCode> {
    let deltas = load_nodes(args, config)?;
    let chunks = deltas.iter().filter(|d| d.2 > 0).count();
    let params = config.similarity.clone();
    let mut points = Vec::new();
    for &w in &args.workers {
        let (secs, edges) = run_dataflow(&deltas, &params, config.embedder.dim, w, args.batch)?;
        points.push(serde_json::json!({
            "bench": "ingest", "workers": w, "chunks": chunks, "batch": args.batch, "seconds": secs,
            "chunks_per_second": chunks as f64 / secs, "edges": edges,
        }));
    }
    // The yardstick: hnsw_rs alone, inserting the same vectors with the same parameters, one thread, same clock.
    let embedder = HashEmbedder::new(config.embedder.dim);
    let vectors: Vec<Vec<f32>> = deltas.iter().filter(|d| d.2 > 0).map(|d| embedder.embed(&d.1.embedding_text()).0).collect();
    let t = Instant::now();
    let hnsw: Hnsw<f32, UnitCosine> = Hnsw::new(params.max_connections, vectors.len().max(1024), 16, params.ef_construction, UnitCosine);
    for (i, v) in vectors.iter().enumerate() {
        if v.iter().any(|x| *x != 0.0) {
            hnsw.insert_slice((v, i));
        }
    }
    let raw_secs = t.elapsed().as_secs_f64();
    let t = Instant::now();
    let texts: Vec<String> = deltas.iter().filter(|d| d.2 > 0).map(|d| d.1.embedding_text()).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let _ = embedder.embed_batch(&refs);
    let embed_secs = t.elapsed().as_secs_f64();
    points.push(serde_json::json!({
        "bench": "hnsw_rs_insert", "workers": 1, "chunks": vectors.len(), "seconds": raw_secs,
        "chunks_per_second": vectors.len() as f64 / raw_secs,
        "max_connections": params.max_connections, "ef_construction": params.ef_construction,
    }));
    points.push(serde_json::json!({
        "bench": "hash_embed", "workers": 1, "chunks": texts.len(), "seconds": embed_secs,
        "chunks_per_second": texts.len() as f64 / embed_secs,
    }));
    for p in &points {
        if args.json {
            println!("{p}");
        } else {
            println!(
                "{:<16} workers={:<2} chunks={:<7} seconds={:<9.3} chunks/s={:.0}",
                p["bench"].as_str().unwrap_or(""),
                p["workers"],
                p["chunks"],
                p["seconds"].as_f64().unwrap_or(0.0),
                p["chunks_per_second"].as_f64().unwrap_or(0.0)
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs the ingest dataflow over `deltas` in epochs of `batch`, returning seconds to the last epoch's completion
/// and the final edge count.
fn run_dataflow(deltas: &[(String, Node, isize)], params: &SimilarityParams, dim: usize, workers: usize, batch: usize) -> anyhow::Result<(f64, usize)> {
    let deltas = Arc::new(deltas.to_vec());
    let params = params.clone();
    let edges = Arc::new(Mutex::new(0isize));
    let edges2 = edges.clone();
    let started = Instant::now();
    let guards = timely::execute(timely::Config::process(workers), move |worker| {
        let params = params.clone();
        let edges = edges2.clone();
        let probe = ProbeHandle::new();
        let mut input = worker.dataflow::<u64, _, _>(|scope| {
            let (input, nodes) = scope.new_collection::<(String, Node), isize>();
            let embedded = embed_nodes(nodes, Arc::new(HashEmbedder::new(dim)));
            similarity_edges(embedded, params)
                .inspect(move |(_, _, d)| *edges.lock().expect("edges") += d)
                .probe_with(&probe);
            input
        });
        if worker.index() == 0 {
            for (epoch, chunk) in deltas.chunks(batch.max(1)).enumerate() {
                for (s, n, d) in chunk {
                    input.update((s.clone(), n.clone()), *d);
                }
                input.advance_to(epoch as u64 + 1);
                input.flush();
                // Keep at most a couple of epochs in flight, as the engine's epoch clock does.
                worker.step_while(|| probe.less_than(&(epoch as u64).saturating_sub(1)));
            }
        }
        drop(input);
        while worker.step() {}
    })
    .map_err(|e| anyhow::anyhow!("timely: {e}"))?;
    for r in guards.join() {
        r.map_err(|e| anyhow::anyhow!("worker: {e}"))?;
    }
    let secs = started.elapsed().as_secs_f64();
    let n = *edges.lock().expect("edges");
    Ok((secs, n as usize))
}

/// Calibration of θ for an embedder: percentiles of the cosine between random pairs of different documents, of
/// each node's best cross-document cosine, and of the score of neighbouring chunks; then, for a range of θ, the
/// edges per node of the resulting graph (exact, brute force).
fn theta(args: &BenchArgs, config: &Config) -> anyhow::Result<ExitCode> {
    let deltas = load_nodes(args, config)?;
    let embedder = HashEmbedder::new(config.embedder.dim);
    let mut by_space: std::collections::BTreeMap<String, Vec<(Node, operators::Embedding)>> = Default::default();
    for (s, n, d) in deltas {
        if d > 0 {
            let e = embedder.embed(&n.embedding_text());
            by_space.entry(s).or_default().push((n, e));
        }
    }
    let pct = |v: &mut Vec<f32>, p: f64| -> f32 {
        if v.is_empty() {
            return f32::NAN;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        v[((v.len() - 1) as f64 * p).round() as usize]
    };
    let params = config.similarity.clone();
    for (space, nodes) in &by_space {
        let mut random = Vec::new();
        let mut best = Vec::new();
        let mut adjacent = Vec::new();
        let n = nodes.len();
        for (i, (a, ea)) in nodes.iter().enumerate() {
            let mut b_best = 0f32;
            for (j, (b, eb)) in nodes.iter().enumerate() {
                if i == j {
                    continue;
                }
                let cos = ea.dot(eb);
                if a.doc != b.doc {
                    b_best = b_best.max(cos);
                    if (i * 31 + j * 17) % 97 == 0 {
                        random.push(cos);
                    }
                } else if (a.pos - b.pos).abs() == operators::model::POSITION_SCALE && i < j {
                    adjacent.push(params.score((&a.doc, a.pos, ea), (&b.doc, b.pos, eb)));
                }
            }
            best.push(b_best);
        }
        let mut row = serde_json::json!({"bench": "theta", "space": space, "nodes": n});
        for (name, v) in [("random_cross_cos", &mut random), ("best_cross_cos", &mut best), ("adjacent_score", &mut adjacent)] {
            row[name] = serde_json::json!({"p10": pct(v, 0.1), "p50": pct(v, 0.5), "p90": pct(v, 0.9)});
        }
        let mut per_theta = serde_json::Map::new();
        for t in [0.1f32, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.6] {
            let p = SimilarityParams { theta: t, ..params.clone() };
            let edges = operators::similarity::reference_edges(&p, nodes);
            let cross = edges.iter().filter(|(u, v, _)| {
                let du = nodes.iter().find(|x| &x.0.id == u).map(|x| &x.0.doc);
                let dv = nodes.iter().find(|x| &x.0.id == v).map(|x| &x.0.doc);
                du != dv
            }).count();
            per_theta.insert(format!("{t}"), serde_json::json!({"edges_per_node": edges.len() as f64 / n as f64, "cross_doc_share": cross as f64 / edges.len().max(1) as f64}));
        }
        row["by_theta"] = serde_json::Value::Object(per_theta);
        println!("{}", if args.json { row.to_string() } else { serde_json::to_string_pretty(&row)? });
    }
    Ok(ExitCode::SUCCESS)
}
