//! `engram bench hierarchy`: the incremental cost of inserting batches into a memory (the whole memory: similarity
//! graph, hierarchy, summaries, events) against a from-scratch build, and the summary calls each causes.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use differential_dataflow::input::{Input, InputSession};
use operators::extractive::Extractive;
use operators::memory::{memory, MemoryParams};
use operators::request::ModelRequest;
use operators::summary::{Plan, Scheduler, SummaryCache, Waiting};
use operators::{HashEmbedder, Node};
use timely::dataflow::operators::probe::Handle as ProbeHandle;
use timely::worker::Worker;

use super::profile::operator_profile;
use super::{probe_all, BenchArgs};
use crate::config::Config;

/// A deterministic synthetic corpus: documents of 8 chunks, each chunk 40 words drawn mostly from one of `topics`
/// topic vocabularies (so that chunks of one topic are similar across documents) plus shared filler. The bench uses
/// one topic per 25 chunks of the memory, so that a larger memory has more stories, not denser ones.
fn synthetic(start: usize, n: usize, topics: u64) -> Vec<(String, Node, isize)> {
    let mut out = Vec::with_capacity(n);
    for i in start..start + n {
        let doc = i / 8;
        let mut x = (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ 0x5851_f42d_4c95_7f2d;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let topic = (doc as u64).wrapping_mul(2_654_435_761) % topics.max(1);
        let words: Vec<String> = (0..40)
            .map(|_| {
                let r = next();
                if r % 10 < 7 {
                    format!("t{topic}w{}", (r >> 8) % 25)
                } else {
                    format!("common{}", (r >> 8) % 300)
                }
            })
            .collect();
        let node = Node {
            id: format!("d{doc}#{}", i % 8).into(),
            kind: operators::NodeKind::Chunk,
            doc: format!("d{doc}").into(),
            pos: (i % 8) as i64 * operators::model::POSITION_SCALE,
            text: words.join(" ").into(),
            speaker: None,
            ts: None,
        };
        out.push(("bench".to_string(), node, 1));
    }
    out
}

/// Clusters per layer, per memory size: `(size, layer) → count` (each layer's count lives on one worker; every
/// worker adds its changes).
type Shapes = Arc<Mutex<BTreeMap<(usize, u32), i64>>>;

/// A request's change: `((space, key), request, diff)`.
type RequestDelta = ((String, String), ModelRequest, isize);

/// What one measured run cost.
struct Measured {
    seconds: f64,
    calls: usize,
    by_layer: Vec<usize>,
    reused: usize,
}

/// One memory on one worker: its inputs, the probe over every output, and the requests it makes.
struct Bench {
    nodes: InputSession<u64, (String, Node), isize>,
    logged: InputSession<u64, ((String, String), String), isize>,
    probe: ProbeHandle<u64>,
    requests: Receiver<RequestDelta>,
    epoch: u64,
    /// Waiting requests, with their multiplicity.
    open: BTreeMap<(String, String), (ModelRequest, isize)>,
}

impl Bench {
    /// Builds the memory (the engine's wiring, [`memory`]) with the hash embedder of `dim` dimensions.
    fn new(worker: &mut Worker, params: &MemoryParams, dim: usize, size: usize, shapes: &Shapes) -> Bench {
        let probe = ProbeHandle::new();
        let (req_tx, requests) = mpsc::channel::<RequestDelta>();
        let req_tx = Mutex::new(req_tx);
        let shape_in = shapes.clone();
        let (nodes, logged) = worker.dataflow::<u64, _, _>(|scope| {
            let (ni, nodes) = scope.new_collection::<(String, Node), isize>();
            let (si, logged) = scope.new_collection::<((String, String), String), isize>();
            let m = memory(nodes, logged, Arc::new(HashEmbedder::new(dim)), params);
            m.requests
                .clone()
                .inspect(move |((s, key, r), _t, d)| {
                    req_tx.lock().expect("req").send(((s.clone(), key.clone()), r.clone(), *d)).expect("send");
                })
                .probe_with(&probe);
            m.clusters
                .clone()
                .map(|(_, l, c, _)| (l, c))
                .distinct()
                .map(|(l, _)| l)
                .count()
                .inspect(move |((l, n), _t, d)| {
                    *shape_in.lock().expect("shape").entry((size, *l)).or_default() += *n as i64 * *d as i64;
                })
                .probe_with(&probe);
            probe_all(m, &probe);
            (ni, si)
        });
        Bench { nodes, logged, probe, requests, epoch: 0, open: BTreeMap::new() }
    }

    /// Feeds one batch per epoch, and answers every request once it has waited `debounce` epochs unchanged (a
    /// cluster that changes gets a new content key, and so a new wait) — the engine's [`Scheduler`] and
    /// [`SummaryCache`], counted in epochs — epoch after epoch until the batches are in and no request waits.
    fn run(
        &mut self,
        worker: &mut Worker,
        batches: Vec<Vec<(String, Node, isize)>>,
        debounce: u64,
        cache: &mut SummaryCache,
        llm: &Extractive,
    ) -> Measured {
        let t = Instant::now();
        let mut scheduler = Scheduler::new(Duration::from_secs(debounce), Duration::MAX);
        let mut m = Measured { seconds: 0.0, calls: 0, by_layer: Vec::new(), reused: 0 };
        let mut batches = batches.into_iter();
        loop {
            let batch = batches.next();
            let fed = batch.is_some();
            if worker.index() == 0 {
                for (s, n, d) in batch.into_iter().flatten() {
                    self.nodes.update((s, n), d);
                }
            }
            self.step(worker);
            if self.open.is_empty() && !fed {
                break;
            }
            let waiting: Vec<Waiting> =
                self.open.iter().map(|(k, (r, _))| (k.clone(), std::sync::Arc::new(r.clone()))).collect();
            for ((space, key), request) in scheduler.due(&waiting, Duration::from_secs(self.epoch)) {
                let text = match cache.plan(space, key, request) {
                    Plan::Reuse { text, .. } => {
                        m.reused += 1;
                        text
                    }
                    Plan::Ask(coverage) => {
                        if let ModelRequest::Summary { layer, .. } = request.as_ref() {
                            let l = *layer as usize;
                            if m.by_layer.len() < l {
                                m.by_layer.resize(l, 0);
                            }
                            m.by_layer[l - 1] += 1;
                        }
                        let text = request.ask(llm, key).expect("the extractive backend always answers");
                        if let Some(c) = &coverage {
                            cache.record(space, c, &text);
                        }
                        m.calls += 1;
                        text
                    }
                };
                if worker.index() == 0 {
                    self.logged.update(((space.clone(), key.clone()), text), 1);
                }
            }
        }
        m.seconds = t.elapsed().as_secs_f64();
        m
    }

    /// Closes an epoch, steps the worker until the memory reflects it, and reads the requests it changed.
    fn step(&mut self, worker: &mut Worker) {
        self.epoch += 1;
        self.nodes.advance_to(self.epoch);
        self.logged.advance_to(self.epoch);
        self.nodes.flush();
        self.logged.flush();
        let (probe, epoch) = (&self.probe, self.epoch);
        worker.step_while(|| probe.less_than(&epoch));
        while let Ok((k, r, d)) = self.requests.try_recv() {
            self.open.entry(k).or_insert((r, 0)).1 += d;
        }
        self.open.retain(|_, v| v.1 != 0);
    }
}

/// `engram bench hierarchy`: for each memory size, a from-scratch build (one epoch, then summary rounds until no
/// cluster waits), then batches inserted into it; each measured to quiescence, with the summary calls it caused.
pub(super) fn hierarchy_bench(args: &BenchArgs, config: &Config) -> anyhow::Result<ExitCode> {
    let sizes = args.sizes.clone();
    let batches = args.batches.clone();
    // The extractive backend answers every request: the memory is built as without a model.
    let params = MemoryParams { with_model: false, ..crate::engine::memory_params(config) };
    let dim = config.embedder.dim;
    let words = config.hierarchy.summary_words;
    let coverage = config.hierarchy.summary_coverage;
    let workers = args.workers.first().copied().unwrap_or(1);
    let (json, profile) = (args.json, args.profile);
    let (stream, stream_batch, debounce) = (args.stream, args.stream_batch.max(1), args.debounce_epochs);
    let (tx, rx) = mpsc::channel::<serde_json::Value>();
    let tx = Mutex::new(tx);
    let shapes: Shapes = Default::default();
    let guards = timely::execute(timely::Config::process(workers), move |worker| {
        let tx = tx.lock().expect("tx").clone();
        let profile = profile.then(|| operator_profile(worker));
        let llm = Extractive { max_words: words };
        for &size in &sizes {
            let mut bench = Bench::new(worker, &params, dim, size, &shapes);
            // Summaries made so far: a request whose cluster's earlier summary still holds reuses it (no call).
            let mut cache = SummaryCache::new(coverage);
            let topics = (size as u64 / 25).max(1);
            let lead = worker.index() == 0;
            let mine = |start: usize, n: usize| if lead { synthetic(start, n, topics) } else { Vec::new() };
            let mut run = |bench: &mut Bench, batches, debounce, worker: &mut Worker| {
                let m = bench.run(worker, batches, debounce, &mut cache, &llm);
                if let Some(p) = &profile {
                    p.report(worker.index());
                }
                m
            };
            let rebuild = run(&mut bench, vec![mine(0, size)], 0, worker);
            // Read once the rebuild is quiet: the probe has passed it on every worker, so every change is in.
            let shape: Vec<i64> = shapes
                .lock()
                .expect("shape")
                .range((size, 0)..=(size, u32::MAX))
                .map(|(_, n)| *n)
                .filter(|n| *n != 0)
                .collect();
            let mut next = size;
            for &b in &batches {
                let m = run(&mut bench, vec![mine(next, b)], 0, worker);
                next += b;
                if worker.index() == 0 {
                    tx.send(batch_point(size, b, &m, &rebuild, &shape, worker.peers())).expect("send");
                }
            }
            if stream > 0 {
                let epochs: Vec<Vec<_>> = (0..stream.div_ceil(stream_batch))
                    .map(|i| mine(next + i * stream_batch, stream_batch.min(stream - i * stream_batch)))
                    .collect();
                let n = epochs.len();
                let m = run(&mut bench, epochs, debounce, worker);
                if worker.index() == 0 {
                    tx.send(serde_json::json!({
                        "bench": "hierarchy-stream", "memory_chunks": size, "batch": stream_batch, "chunks": stream,
                        "debounce_epochs": debounce, "seconds": m.seconds, "seconds_per_batch": m.seconds / n as f64,
                        "rebuild_seconds": rebuild.seconds, "rebuild_summary_calls": rebuild.calls,
                        "summary_calls": m.calls, "summary_calls_per_chunk": m.calls as f64 / stream as f64,
                        "summary_calls_by_layer": m.by_layer, "summaries_reused": m.reused, "workers": worker.peers(),
                    }))
                    .expect("send");
                }
            }
        }
    })
    .map_err(|e| anyhow::anyhow!("timely: {e}"))?;
    for r in guards.join() {
        r.map_err(|e| anyhow::anyhow!("worker: {e}"))?;
    }
    print_points(rx.try_iter(), json);
    Ok(ExitCode::SUCCESS)
}

/// One batch's point: its cost against the rebuild's.
fn batch_point(
    size: usize,
    b: usize,
    m: &Measured,
    rebuild: &Measured,
    shape: &[i64],
    workers: usize,
) -> serde_json::Value {
    serde_json::json!({
        "bench": "hierarchy", "memory_chunks": size, "batch": b, "insert_seconds": m.seconds,
        "rebuild_seconds": rebuild.seconds, "speedup": rebuild.seconds / m.seconds,
        "summary_calls": m.calls, "summary_calls_per_chunk": m.calls as f64 / b as f64,
        "rebuild_summary_calls": rebuild.calls, "summary_calls_by_layer": m.by_layer,
        "rebuild_summary_calls_by_layer": rebuild.by_layer, "summaries_reused": m.reused,
        "rebuild_clusters_by_layer": shape,
        "workers": workers,
    })
}

fn print_points(points: impl Iterator<Item = serde_json::Value>, json: bool) {
    let mut shown = std::collections::BTreeSet::new();
    for p in points {
        if !json && shown.insert(p["memory_chunks"].to_string()) && p["bench"] == "hierarchy" {
            // The rebuild summarises every cluster once, except one-member clusters above layer 1 (they show their
            // member's summary).
            println!(
                "memory={:<7} rebuild: clusters by layer {}, summary calls by layer {}",
                p["memory_chunks"], p["rebuild_clusters_by_layer"], p["rebuild_summary_calls_by_layer"]
            );
        }
        if json {
            println!("{p}");
        } else if p["bench"] == "hierarchy-stream" {
            println!(
                "memory={:<7} stream of {} chunks, {} per epoch, debounce {} epochs: {:.3}s per epoch, summary_calls/chunk={:.3} by layer {}, reused {}",
                p["memory_chunks"], p["chunks"], p["batch"], p["debounce_epochs"],
                p["seconds_per_batch"].as_f64().unwrap_or(0.0), p["summary_calls_per_chunk"].as_f64().unwrap_or(0.0),
                p["summary_calls_by_layer"], p["summaries_reused"]
            );
        } else {
            println!(
                "memory={:<7} batch={:<4} insert={:>8.3}s rebuild={:>8.2}s speedup={:>7.1}x summary_calls/chunk={:.3} by layer {}, reused {}",
                p["memory_chunks"], p["batch"], p["insert_seconds"].as_f64().unwrap_or(0.0),
                p["rebuild_seconds"].as_f64().unwrap_or(0.0), p["speedup"].as_f64().unwrap_or(0.0),
                p["summary_calls_per_chunk"].as_f64().unwrap_or(0.0), p["summary_calls_by_layer"], p["summaries_reused"]
            );
        }
    }
}
