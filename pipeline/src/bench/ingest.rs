//! `engram bench ingest`: records → the whole memory, against raw hnsw_rs insertion of the same vectors.

use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use differential_dataflow::input::Input;
use hnsw_rs::prelude::Hnsw;
use operators::memory::{memory, MemoryParams};
use operators::model::UnitCosine;
use operators::{Embedder, HashEmbedder, Node};
use timely::dataflow::operators::probe::Handle as ProbeHandle;

use super::{load_nodes, probe_all, BenchArgs};
use crate::config::Config;

pub(super) fn ingest(args: &BenchArgs, config: &Config) -> anyhow::Result<ExitCode> {
    let deltas = load_nodes(args, config)?;
    let chunks = deltas.iter().filter(|d| d.2 > 0).count();
    let params = config.similarity.clone();
    let memory_params = MemoryParams { with_model: false, ..crate::engine::memory_params(config) };
    let mut points = Vec::new();
    for &w in &args.workers {
        // With `--profile`, the last `--stream` deltas go in `--stream-batch` per epoch after the bulk, each epoch
        // waited for, and are profiled on their own: what a steady stream costs in the grown memory.
        let stream = if args.profile { args.stream.min(deltas.len()) } else { 0 };
        let feed = Feed { batch: args.batch, stream, stream_batch: args.stream_batch.max(1), profile: args.profile };
        let (secs, edges) = run_dataflow(&deltas, &memory_params, config.embedder.dim, w, feed)?;
        points.push(serde_json::json!({
            "bench": "ingest", "workers": w, "chunks": chunks, "batch": args.batch, "seconds": secs,
            "chunks_per_second": chunks as f64 / secs, "edges": edges,
        }));
    }
    // The yardstick: hnsw_rs alone, inserting the same vectors with the same parameters, one thread, same clock.
    let embedder = HashEmbedder::new(config.embedder.dim);
    let vectors: Vec<Vec<f32>> =
        deltas.iter().filter(|d| d.2 > 0).map(|d| embedder.embed(&d.1.embedding_text()).to_dense()).collect();
    let t = Instant::now();
    let hnsw: Hnsw<f32, UnitCosine> =
        Hnsw::new(params.max_connections, vectors.len().max(1024), 16, params.ef_construction, UnitCosine);
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

/// How [`run_dataflow`] feeds its deltas: all but the last `stream` in epochs of `batch`, then those in epochs of
/// `stream_batch`, each waited for.
#[derive(Clone, Copy)]
struct Feed {
    batch: usize,
    stream: usize,
    stream_batch: usize,
    profile: bool,
}

/// Runs the memory ([`memory`], the engine's wiring, without a model) over `deltas` as `feed` says, returning
/// seconds to the last epoch's completion and the final edge count.
fn run_dataflow(
    deltas: &[(String, Node, isize)],
    params: &MemoryParams,
    dim: usize,
    workers: usize,
    feed: Feed,
) -> anyhow::Result<(f64, usize)> {
    let Feed { batch, stream, stream_batch, profile } = feed;
    let deltas = Arc::new(deltas.to_vec());
    let params = params.clone();
    let edges = Arc::new(Mutex::new(0isize));
    let edges2 = edges.clone();
    let started = Instant::now();
    let guards = timely::execute(timely::Config::process(workers), move |worker| {
        let edges = edges2.clone();
        let profiler = profile.then(|| super::profile::operator_profile(worker));
        let probe = ProbeHandle::new();
        let (mut input, mut logged) = worker.dataflow::<u64, _, _>(|scope| {
            let (input, nodes) = scope.new_collection::<(String, Node), isize>();
            let (logged_input, logged) = scope.new_collection::<((String, String), String), isize>();
            let m = memory(nodes, logged, Arc::new(HashEmbedder::new(dim)), &params);
            m.edges.clone().inspect(move |(_, _, d)| *edges.lock().expect("edges") += d).probe_with(&probe);
            probe_all(m, &probe);
            (input, logged_input)
        });
        let bulk = deltas.len() - stream;
        let mut epochs: Vec<&[(String, Node, isize)]> = deltas[..bulk].chunks(batch.max(1)).collect();
        let bulk_epochs = epochs.len();
        epochs.extend(deltas[bulk..].chunks(stream_batch));
        let mut stream_started = None;
        for (epoch, chunk) in epochs.iter().enumerate() {
            let epoch = epoch as u64;
            if epoch as usize == bulk_epochs && stream > 0 {
                // The bulk is in: report it, and time the stream alone.
                worker.step_while(|| probe.less_than(&epoch));
                if let Some(p) = &profiler {
                    p.arrangements();
                    p.report(worker.index());
                }
                stream_started = Some(Instant::now());
            }
            if worker.index() == 0 {
                for (s, n, d) in chunk.iter() {
                    input.update((s.clone(), n.clone()), *d);
                }
            }
            input.advance_to(epoch + 1);
            logged.advance_to(epoch + 1);
            input.flush();
            logged.flush();
            if stream_started.is_some() {
                // A live stream: every epoch reflected before the next.
                worker.step_while(|| probe.less_than(&(epoch + 1)));
            } else {
                // Keep at most a couple of epochs in flight, as the engine's epoch clock does.
                worker.step_while(|| probe.less_than(&epoch.saturating_sub(1)));
            }
        }
        if let Some(t) = stream_started {
            let n = epochs.len() - bulk_epochs;
            let secs = t.elapsed().as_secs_f64();
            eprintln!(
                "stream (worker {}): {n} epochs of {stream_batch} in {secs:.3}s, {:.1} ms per epoch",
                worker.index(),
                secs * 1000.0 / n.max(1) as f64
            );
        } else if let Some(p) = &profiler {
            let last = epochs.len() as u64;
            worker.step_while(|| probe.less_than(&last));
            p.arrangements();
        }
        drop(input);
        drop(logged);
        while worker.step() {}
        if let Some(p) = &profiler {
            p.report(worker.index());
        }
    })
    .map_err(|e| anyhow::anyhow!("timely: {e}"))?;
    for r in guards.join() {
        r.map_err(|e| anyhow::anyhow!("worker: {e}"))?;
    }
    let secs = started.elapsed().as_secs_f64();
    let n = *edges.lock().expect("edges");
    Ok((secs, n as usize))
}
