//! `engram bench …`: throughput and cost measurements of the engine's parts. Each bench builds the memory with
//! [`operators::memory::memory`], the engine's own wiring.

mod embed;
mod hierarchy;
mod ingest;
mod kafka;
mod llm;
mod news;
mod profile;
mod scale;
mod theta;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, ValueEnum};
use operators::ingest::Ingestor;
use operators::{parse_record, Embedder, Limits, Node};

use crate::config::{Config, Overrides};

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum BenchName {
    /// Records → the whole memory (chunks, embeddings, similarity, hierarchy, summaries, events), against raw hnsw_rs
    /// insertion of the same vectors.
    Ingest,
    /// Score distributions of the similarity graph and the edges per node at a range of θ (calibration).
    Theta,
    /// Incremental cost of inserting batches into a memory (the whole memory) against a
    /// from-scratch build.
    Hierarchy,
    /// Embeddings per second of the `hash` embedder and, with `--model-dir`, the `local` one, on the inputs' chunks.
    Embed,
    /// The LLM client's overhead per call (budget checks, prompt and schema, retries bookkeeping, reply validation)
    /// against an in-process OpenAI-compatible server that answers at once, next to a bare HTTP POST to it.
    Llm,
    /// Source throughput: the inputs' records produced to a fresh Kafka topic (`--brokers`), then read back through
    /// engram's Kafka source and, on the same records, through its file source.
    Kafka,
    /// ONE space grown to each of `--sizes` chunks through the real engine: ingest rate against raw hnsw_rs
    /// insertion of the same vectors, resident memory per chunk, query latency per mode, and freshness under a steady
    /// stream. `--input` names the records (one space); without it, a synthetic news stream.
    Scale,
    /// The synthetic news stream that `scale` grows without `--input`: its first `max(--sizes)` chunk records as
    /// JSONL on standard output (for `engram run --input`, `scripts/restart_bench.py` and other tools).
    News,
}

#[derive(Args)]
pub struct BenchArgs {
    pub(crate) name: BenchName,
    /// JSONL record files (default: the bundled examples).
    #[arg(long = "input")]
    pub(super) inputs: Vec<PathBuf>,
    /// Worker counts to measure.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub(super) workers: Vec<usize>,
    /// Records per epoch.
    #[arg(long, default_value_t = 1000)]
    pub(super) batch: usize,
    /// Configuration file for the similarity and ingest parameters.
    #[arg(long)]
    pub(super) config: Option<PathBuf>,
    /// One JSON object per measured point.
    #[arg(long)]
    pub(super) json: bool,
    /// hierarchy: memory sizes (chunks) to measure.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
    pub(super) sizes: Vec<usize>,
    /// hierarchy: batch sizes (chunks) to insert.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,500")]
    pub(super) batches: Vec<usize>,
    /// hierarchy: after the batches, stream this many chunks into the memory, `--stream-batch` per epoch, with the
    /// summariser's debounce (steady state); 0 skips it. ingest with `--profile`: the last this many records go in
    /// `--stream-batch` per epoch, each epoch waited for, and are profiled apart from the bulk.
    #[arg(long, default_value_t = 2000)]
    pub(super) stream: usize,
    /// hierarchy and ingest: chunks per epoch of the stream (100 ms epochs: 10 = 100 chunks/s).
    #[arg(long, default_value_t = 10)]
    pub(super) stream_batch: usize,
    /// hierarchy: epochs a cluster must stay unchanged before it is summarised in the stream (the engine's
    /// `summary-debounce` over its `epoch-interval`: 1 s / 100 ms = 10).
    #[arg(long, default_value_t = 10)]
    pub(super) debounce_epochs: u64,
    /// hierarchy and ingest: print the busiest operators after every measured run.
    #[arg(long)]
    pub(super) profile: bool,
    /// embed: a local model directory (config.json, model.safetensors, tokenizer.json) to measure too.
    #[arg(long)]
    pub(super) model_dir: Option<PathBuf>,
    /// scale: questions per mode at every size.
    #[arg(long, default_value_t = 100)]
    pub(super) queries: usize,
    /// scale: records a second streamed into the grown space while freshness is measured.
    #[arg(long, default_value_t = 10.0)]
    pub(super) stream_rate: f64,
    /// scale: seconds of that stream at every size (0 skips freshness).
    #[arg(long, default_value_t = 10.0)]
    pub(super) stream_seconds: f64,
    /// kafka: the broker.
    #[arg(long, default_value = "127.0.0.1:9092")]
    pub(super) brokers: String,
}

pub fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let config = Config::load(args.config.as_deref(), std::env::vars(), &Overrides::default())?;
    match args.name {
        BenchName::Ingest => ingest::ingest(&args, &config),
        BenchName::Theta => theta::theta(&args, &config),
        BenchName::Hierarchy => hierarchy::hierarchy_bench(&args, &config),
        BenchName::Embed => embed::embed_bench(&args, &config),
        BenchName::Llm => llm::llm_bench(&args),
        BenchName::Kafka => kafka::kafka_bench(&args),
        BenchName::Scale => scale::scale(&args, &config),
        BenchName::News => news::write_records(&args),
    }
}

/// The embedder the config names.
pub(super) fn config_embedder(config: &Config) -> anyhow::Result<Arc<dyn Embedder>> {
    let dir = std::env::temp_dir().join(format!("engram-bench-{}", std::process::id()));
    crate::engine::make_embedder(config, &crate::metrics::Metrics::new(), &dir)
}

/// The `--input` files, or the bundled examples.
pub(super) fn input_paths(args: &BenchArgs) -> Vec<PathBuf> {
    if args.inputs.is_empty() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples");
        vec![root.join("news.jsonl"), root.join("standup.jsonl")]
    } else {
        args.inputs.clone()
    }
}

/// The node deltas of the `--input` files (default: the bundled examples).
pub(super) fn load_nodes(args: &BenchArgs, config: &Config) -> anyhow::Result<Vec<(String, Node, isize)>> {
    let inputs = input_paths(args);
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

/// Probes every output of the memory, so that a measured epoch is one the whole memory has finished.
pub(super) fn probe_all<'s>(
    m: operators::memory::Memory<'s, u64>,
    probe: &timely::dataflow::operators::probe::Handle<u64>,
) {
    m.nodes.probe_with(probe);
    m.edges.probe_with(probe);
    m.clusters.probe_with(probe);
    m.layer_edges.probe_with(probe);
    m.summaries.probe_with(probe);
    m.requests.probe_with(probe);
    m.events.probe_with(probe);
    m.relations.probe_with(probe);
    m.merges.probe_with(probe);
    m.topics.probe_with(probe);
}
