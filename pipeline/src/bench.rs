//! `engram bench`: throughput measurements, printed as a table, or with `--json` one JSON object per point.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    /// Incremental cost of inserting batches into a memory (similarity graph, hierarchy, summaries) against a
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
    /// hierarchy: memory sizes (chunks) to measure.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
    sizes: Vec<usize>,
    /// hierarchy: batch sizes (chunks) to insert.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,500")]
    batches: Vec<usize>,
    /// hierarchy: after the batches, stream this many chunks into the memory, `--stream-batch` per epoch, with the
    /// summariser's debounce (steady state); 0 skips it.
    #[arg(long, default_value_t = 2000)]
    stream: usize,
    /// hierarchy: chunks per epoch of the stream (100 ms epochs: 10 = 100 chunks/s).
    #[arg(long, default_value_t = 10)]
    stream_batch: usize,
    /// hierarchy: epochs a cluster must stay unchanged before it is summarised in the stream (the engine's
    /// `summary-debounce` over its `epoch-interval`: 1 s / 100 ms = 10).
    #[arg(long, default_value_t = 10)]
    debounce_epochs: u64,
    /// embed: a local model directory (config.json, model.safetensors, tokenizer.json) to measure too.
    #[arg(long)]
    model_dir: Option<PathBuf>,
    /// kafka: the broker.
    #[arg(long, default_value = "127.0.0.1:9092")]
    brokers: String,
}

pub fn run(args: BenchArgs) -> anyhow::Result<ExitCode> {
    let config = Config::load(args.config.as_deref(), std::env::vars(), &Overrides::default())?;
    match args.name {
        BenchName::Ingest => ingest(&args, &config),
        BenchName::Theta => theta(&args, &config),
        BenchName::Hierarchy => hierarchy_bench(&args, &config),
        BenchName::Embed => embed_bench(&args, &config),
        BenchName::Llm => llm_bench(&args),
        BenchName::Kafka => kafka_bench(&args),
    }
}

#[cfg(not(feature = "kafka"))]
fn kafka_bench(_args: &BenchArgs) -> anyhow::Result<ExitCode> {
    anyhow::bail!("built without the kafka feature")
}

#[cfg(feature = "kafka")]
fn kafka_bench(args: &BenchArgs) -> anyhow::Result<ExitCode> {
    use connectors::{FileSource, Source, SourceBatch};
    use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
    use rdkafka::client::DefaultClientContext;
    use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
    let inputs = if args.inputs.is_empty() {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../examples");
        vec![root.join("news.jsonl"), root.join("standup.jsonl")]
    } else {
        args.inputs.clone()
    };
    let mut lines: Vec<Vec<u8>> = Vec::new();
    for p in &inputs {
        let text = std::fs::read(p).map_err(|e| anyhow::anyhow!("{}: {e}", p.display()))?;
        lines.extend(text.split(|b| *b == b'\n').filter(|l| !l.is_empty()).map(<[u8]>::to_vec));
    }
    let n = lines.len();
    let topic = format!("engram-bench-{}-{}", std::process::id(), Instant::now().elapsed().as_nanos());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut cc = rdkafka::ClientConfig::new();
    cc.set("bootstrap.servers", &args.brokers);
    let admin: AdminClient<DefaultClientContext> = cc.create()?;
    for r in rt.block_on(admin.create_topics(&[NewTopic::new(&topic, 1, TopicReplication::Fixed(1))], &AdminOptions::new()))? {
        r.map_err(|(t, e)| anyhow::anyhow!("creating {t}: {e}"))?;
    }
    let producer: ThreadedProducer<DefaultProducerContext> = cc.clone().set("linger.ms", "20").create()?;
    let started = Instant::now();
    let keys: Vec<String> = lines
        .iter()
        .map(|l| serde_json::from_slice::<serde_json::Value>(l).ok().and_then(|v| v["space"].as_str().map(str::to_string)).unwrap_or_else(|| "bench".into()))
        .collect();
    for (l, key) in lines.iter().zip(&keys) {
        let mut rec = BaseRecord::to(&topic).key(key.as_str()).payload(l.as_slice());
        while let Err((_, r)) = producer.send(rec) {
            rec = r;
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    producer.flush(Duration::from_secs(120))?;
    let produce = started.elapsed().as_secs_f64();
    let drain = |mut src: Box<dyn Source>| -> anyhow::Result<f64> {
        let started = Instant::now();
        let mut got = 0;
        while got < n {
            match src.poll(20_000)? {
                SourceBatch::Records(r) => got += r.len(),
                SourceBatch::Idle => std::thread::sleep(src.idle_wait()),
                SourceBatch::Done => break,
            }
            anyhow::ensure!(started.elapsed() < Duration::from_secs(600), "read {got} of {n} records in 10 minutes");
        }
        Ok(started.elapsed().as_secs_f64())
    };
    let kafka = drain(Box::new(
        connectors::kafka::KafkaSource::new(&args.brokers, &format!("{topic}-g"), std::slice::from_ref(&topic), connectors::kafka::Share::ALL, &Default::default(), None)
            .map_err(|e| anyhow::anyhow!(e))?,
    ))?;
    let file = if inputs.len() == 1 { Some(drain(Box::new(FileSource::new(&inputs[0], false)))?) } else { None };
    let row = serde_json::json!({"bench": "kafka", "records": n, "produce_per_second": n as f64 / produce,
        "kafka_source_per_second": n as f64 / kafka, "file_source_per_second": file.map(|f| n as f64 / f)});
    println!("{}", if args.json { row.to_string() } else { serde_json::to_string_pretty(&row)? });
    Ok(ExitCode::SUCCESS)
}

fn llm_bench(args: &BenchArgs) -> anyhow::Result<ExitCode> {
    use axum::routing::post;
    use connectors::llm::{LlmMetrics, OpenAiClient, OpenAiConfig, OpenAiLlm, ResponseFormat};
    use operators::summary::Llm;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let reply = serde_json::json!({"choices": [{"message": {"role": "assistant", "content": "{\"summary\": \"The council approved the sea wall.\"}"}}],
                                   "usage": {"prompt_tokens": 120, "completion_tokens": 9}});
    let app = axum::Router::new().route("/v1/chat/completions", post(move || { let r = reply.clone(); async move { axum::Json(r) } }));
    let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))?;
    let base = format!("http://{}/v1", listener.local_addr()?);
    rt.spawn(async move { axum::serve(listener, app).await });
    let n = 2000usize;
    let texts = ["The council approved the sea wall budget after the cost rose to 26 million pounds.", "Fishermen said the quay flooded."];
    // Bare: one POST with a fixed body and no checks, the floor any client pays on this machine.
    let http = reqwest::Client::new();
    let body = serde_json::json!({"model": "m", "messages": [{"role": "user", "content": texts.join(" ")}]});
    let url = format!("{base}/chat/completions");
    let bare = rt.block_on(async {
        let started = Instant::now();
        for _ in 0..n {
            let r = http.post(&url).json(&body).send().await?;
            let _: serde_json::Value = r.json().await?;
        }
        Ok::<_, reqwest::Error>(started.elapsed().as_secs_f64() / n as f64)
    })?;
    let cfg = OpenAiConfig {
        base_url: base,
        model: "m".into(),
        api_key: None,
        requests_per_minute: u32::MAX / 2,
        tokens_per_minute: u32::MAX / 2,
        max_in_flight: 4,
        timeout: Duration::from_secs(10),
        max_retries: 0,
        response_format: ResponseFormat::JsonSchema,
        max_tokens: 200,
        backoff: Duration::from_millis(10),
    };
    let client = OpenAiClient::new(cfg, LlmMetrics::new(&prometheus::Registry::new())?).map_err(|e| anyhow::anyhow!(e))?;
    let llm = OpenAiLlm::new(client, 80)?;
    let started = Instant::now();
    for _ in 0..n {
        llm.summarize(&texts).map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    let full = started.elapsed().as_secs_f64() / n as f64;
    rt.shutdown_background();
    let row = serde_json::json!({"bench": "llm", "calls": n, "bare_post_us": bare * 1e6, "client_call_us": full * 1e6, "overhead_us": (full - bare) * 1e6});
    println!("{}", if args.json { row.to_string() } else {
        format!("{n} sequential calls: bare POST {:.0} µs, engram's client (summary stage) {:.0} µs: overhead {:.0} µs a call", bare * 1e6, full * 1e6, (full - bare) * 1e6)
    });
    Ok(ExitCode::SUCCESS)
}

/// The configured embedder (`theta` calibrates for it); an `openai` one logs into a temporary directory.
fn config_embedder(config: &Config) -> anyhow::Result<Arc<dyn Embedder>> {
    let dir = std::env::temp_dir().join(format!("engram-bench-{}", std::process::id()));
    crate::engine::make_embedder(config, &crate::metrics::Metrics::new(), &dir)
}

fn embed_bench(args: &BenchArgs, config: &Config) -> anyhow::Result<ExitCode> {
    let texts: Vec<String> = load_nodes(args, config)?.into_iter().filter(|d| d.2 > 0).map(|d| d.1.embedding_text()).collect();
    anyhow::ensure!(!texts.is_empty(), "no chunks in the inputs");
    let words = texts.iter().map(|t| t.split_whitespace().count()).sum::<usize>() as f64 / texts.len() as f64;
    let mut embedders: Vec<(&str, usize, Arc<dyn Embedder>)> = vec![("hash", 0, Arc::new(HashEmbedder::new(config.embedder.dim)))];
    #[cfg(feature = "local-embedder")]
    if let Some(dir) = &args.model_dir {
        for batch in [1usize, 8, 32] {
            let e = connectors::embedders::LocalEmbedder::load(dir, batch).map_err(|e| anyhow::anyhow!(e))?;
            embedders.push(("local", batch, Arc::new(e)));
        }
    }
    #[cfg(not(feature = "local-embedder"))]
    anyhow::ensure!(args.model_dir.is_none(), "--model-dir: built without the local-embedder feature");
    for (kind, batch, e) in embedders {
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        let started = Instant::now();
        let mut n = 0usize;
        // At least two seconds and one pass over the texts.
        while n < refs.len() || started.elapsed() < Duration::from_secs(2) {
            let step = if kind == "hash" { refs.len() } else { refs.len().min(64) };
            let from = n % refs.len();
            let slice = &refs[from..(from + step).min(refs.len())];
            let _ = e.embed_batch(slice);
            n += slice.len();
        }
        let secs = started.elapsed().as_secs_f64();
        let row = serde_json::json!({
            "bench": "embed", "embedder": kind, "batch": batch, "dim": e.dim(), "texts": n,
            "mean_words": words, "seconds": secs, "embeddings_per_second": n as f64 / secs,
        });
        println!("{}", if args.json { row.to_string() } else { format!("{kind:>5} batch {batch:>2}: {:>9.1} embeddings/s ({n} texts of {words:.0} words on average, {secs:.1} s, dim {})", n as f64 / secs, e.dim()) });
    }
    Ok(ExitCode::SUCCESS)
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
    let embedder = config_embedder(config)?;
    let live: Vec<(String, Node)> = deltas.into_iter().filter(|d| d.2 > 0).map(|(s, n, _)| (s, n)).collect();
    let texts: Vec<String> = live.iter().map(|(_, n)| n.embedding_text()).collect();
    let vectors = embedder.embed_batch(&texts.iter().map(String::as_str).collect::<Vec<_>>());
    let mut by_space: std::collections::BTreeMap<String, Vec<(Node, operators::Embedding)>> = Default::default();
    for ((s, n), e) in live.into_iter().zip(vectors) {
        by_space.entry(s).or_default().push((n, e));
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
            id: format!("d{doc}#{}", i % 8),
            kind: operators::NodeKind::Chunk,
            doc: format!("d{doc}"),
            pos: (i % 8) as i64 * operators::model::POSITION_SCALE,
            text: words.join(" "),
            speaker: None,
            ts: None,
        };
        out.push(("bench".to_string(), node, 1));
    }
    out
}

/// `engram bench hierarchy`: for each memory size, a from-scratch build (one epoch, then summary rounds until no
/// cluster waits), then batches inserted into it; each measured to quiescence, with the summary calls it caused.
fn hierarchy_bench(args: &BenchArgs, config: &Config) -> anyhow::Result<ExitCode> {
    use std::sync::mpsc;
    let sizes = args.sizes.clone();
    let batches = args.batches.clone();
    let sim = config.similarity.clone();
    let hparams = config.hierarchy.params();
    let dim = config.embedder.dim;
    let words = config.hierarchy.summary_words;
    let coverage = config.hierarchy.summary_coverage;
    let workers = args.workers.first().copied().unwrap_or(1);
    let json = args.json;
    let (stream, stream_batch, debounce) = (args.stream, args.stream_batch.max(1), args.debounce_epochs);
    let (tx, rx) = mpsc::channel::<serde_json::Value>();
    let tx = Mutex::new(tx);
    let shapes: Arc<Mutex<std::collections::BTreeMap<(usize, u32), i64>>> = Default::default();
    let guards = timely::execute(timely::Config::process(workers), move |worker| {
        let tx = tx.lock().expect("tx").clone();
        // ENGRAM_PROFILE=1: time spent in each operator, printed after every measured run (development aid).
        let profile = std::env::var_os("ENGRAM_PROFILE").is_some().then(|| operator_profile(worker));
        for &size in &sizes {
            let probe = ProbeHandle::new();
            let (req_tx, req_rx) = mpsc::channel::<((String, String), u32, String, Vec<(String, String)>, isize)>();
            // Clusters per layer (each layer's count lives on one worker; every worker adds its changes).
            let shape_in = shapes.clone();
            let req_tx = Mutex::new(req_tx);
            let (mut nodes, mut sums) = worker.dataflow::<u64, _, _>(|scope| {
                let (ni, nodes) = scope.new_collection::<(String, Node), isize>();
                let (si, logged) = scope.new_collection::<((String, String), String), isize>();
                let embedded = embed_nodes(nodes.clone(), Arc::new(HashEmbedder::new(dim)));
                let edges = similarity_edges(embedded, sim.clone());
                let h = operators::hierarchy::dataflow::hierarchy(
                    nodes.clone().map(|(s, n)| (s, n.id)),
                    edges.map(|e| (e.space, e.u, e.v, u64::from(e.weight_micro))),
                    &hparams,
                );
                let sm = operators::hierarchy::dataflow::summaries(nodes.map(|(s, n)| ((s, n.id), n.text)), &h.layers, logged);
                sm.requests
                    .inspect(move |((s, l, c, hsh, ms), _t, d)| {
                        req_tx.lock().expect("req").send(((s.clone(), hsh.clone()), *l, c.clone(), ms.clone(), *d)).expect("send");
                    })
                    .probe_with(&probe);
                h.clusters
                    .clone()
                    .map(|(_, l, c, _)| (l, c))
                    .distinct()
                    .map(|(l, _)| l)
                    .count()
                    .inspect(move |((l, n), _t, d)| {
                        *shape_in.lock().expect("shape").entry((size, *l)).or_default() += *n as i64 * *d as i64;
                    })
                    .probe_with(&probe);
                h.clusters.probe_with(&probe);
                (ni, si)
            });
            let mut epoch = 0u64;
            // Waiting requests: content key → (layer, cluster, members, multiplicity, epoch it appeared, answered).
            type Open = std::collections::BTreeMap<(String, String), (u32, String, Vec<(String, String)>, isize, u64, bool)>;
            let mut open: Open = Default::default();
            let llm = operators::summary::Extractive { max_words: words };
            // Summaries made so far: a request whose cluster's earlier summary still holds reuses it (no call).
            let mut made = operators::summary::SummaryCache::new(coverage);
            // Feeds one batch per epoch, and answers every request that has waited `debounce` epochs unchanged
            // (a cluster that changes gets a new content key, and so a new wait), epoch after epoch until the
            // batches are in and no request waits; returns (seconds, summary calls, calls by layer).
            let mut run = |batches: Vec<Vec<(String, Node, isize)>>, debounce: u64, worker: &mut timely::worker::Worker| -> (f64, usize, Vec<usize>, usize) {
                let t = Instant::now();
                let mut calls = 0;
                let mut reused = 0;
                let mut by_layer: Vec<usize> = Vec::new();
                let mut batches = batches.into_iter();
                loop {
                    let fed = match batches.next() {
                        Some(batch) => {
                            if worker.index() == 0 {
                                for (s, n, d) in batch {
                                    nodes.update((s, n), d);
                                }
                            }
                            true
                        }
                        None => false,
                    };
                    epoch += 1;
                    nodes.advance_to(epoch);
                    sums.advance_to(epoch);
                    nodes.flush();
                    sums.flush();
                    worker.step_while(|| probe.less_than(&epoch));
                    while let Ok((k, l, c, ms, d)) = req_rx.try_recv() {
                        let e = open.entry(k).or_insert((l, c, ms, 0, epoch, false));
                        e.3 += d;
                    }
                    open.retain(|_, v| v.3 != 0);
                    if open.is_empty() && !fed {
                        break;
                    }
                    for (k, (l, c, ms, _, since, answered)) in open.iter_mut() {
                        if *answered || epoch - *since < debounce {
                            continue;
                        }
                        *answered = true;
                        let s = match made.decide(&k.0, *l, c, &k.1, ms) {
                            operators::summary::Decision::Reuse { text, .. } => {
                                reused += 1;
                                text
                            }
                            operators::summary::Decision::Fresh(cov) => {
                                let l = *l as usize;
                                if by_layer.len() < l {
                                    by_layer.resize(l, 0);
                                }
                                by_layer[l - 1] += 1;
                                let texts: Vec<&str> = ms.iter().map(|m| m.1.as_str()).collect();
                                let s = operators::summary::Llm::summarize(&llm, &texts).expect("extractive");
                                made.record(&k.0, &cov, &s);
                                calls += 1;
                                s
                            }
                        };
                        if worker.index() == 0 {
                            sums.update((k.clone(), s), 1);
                        }
                    }
                }
                if let Some(p) = &profile {
                    p.report(worker.index());
                }
                (t.elapsed().as_secs_f64(), calls, by_layer, reused)
            };
            let topics = (size as u64 / 25).max(1);
            let lead = worker.index() == 0;
            let mine = |start: usize, n: usize| if lead { synthetic(start, n, topics) } else { Vec::new() };
            let (rebuild, rebuild_calls, rebuild_by_layer, _) = run(vec![mine(0, size)], 0, worker);
            // Read once the rebuild is quiet: the probe has passed it on every worker, so every change is in.
            let shape: Vec<i64> =
                shapes.lock().expect("shape").range((size, 0)..=(size, u32::MAX)).map(|(_, n)| *n).filter(|n| *n != 0).collect();
            let mut next = size;
            for &b in &batches {
                let (secs, calls, by_layer, reused) = run(vec![mine(next, b)], 0, worker);
                next += b;
                if worker.index() == 0 {
                    tx.send(serde_json::json!({
                        "bench": "hierarchy", "memory_chunks": size, "batch": b, "insert_seconds": secs,
                        "rebuild_seconds": rebuild, "speedup": rebuild / secs,
                        "summary_calls": calls, "summary_calls_per_chunk": calls as f64 / b as f64,
                        "rebuild_summary_calls": rebuild_calls, "summary_calls_by_layer": by_layer,
                        "rebuild_summary_calls_by_layer": rebuild_by_layer, "summaries_reused": reused,
                        "rebuild_clusters_by_layer": shape,
                        "workers": worker.peers(),
                    }))
                    .expect("send");
                }
            }
            if stream > 0 {
                let epochs: Vec<Vec<_>> = (0..stream.div_ceil(stream_batch))
                    .map(|i| mine(next + i * stream_batch, stream_batch.min(stream - i * stream_batch)))
                    .collect();
                let n = epochs.len();
                let (secs, calls, by_layer, reused) = run(epochs, debounce, worker);
                if worker.index() == 0 {
                    tx.send(serde_json::json!({
                        "bench": "hierarchy-stream", "memory_chunks": size, "batch": stream_batch, "chunks": stream,
                        "debounce_epochs": debounce, "seconds": secs, "seconds_per_batch": secs / n as f64,
                        "rebuild_seconds": rebuild, "rebuild_summary_calls": rebuild_calls,
                        "summary_calls": calls, "summary_calls_per_chunk": calls as f64 / stream as f64,
                        "summary_calls_by_layer": by_layer, "summaries_reused": reused, "workers": worker.peers(),
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
    let mut shown = std::collections::BTreeSet::new();
    for p in rx.try_iter() {
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
    Ok(ExitCode::SUCCESS)
}

/// Busy time per operator from timely's log: `(id → (name, address)`, `id → total time)`.
struct OperatorProfile {
    state: std::rc::Rc<std::cell::RefCell<ProfileState>>,
}

#[derive(Default)]
struct ProfileState {
    names: std::collections::HashMap<usize, String>,
    started: std::collections::HashMap<usize, Duration>,
    busy: std::collections::HashMap<usize, Duration>,
}

fn operator_profile(worker: &mut timely::worker::Worker) -> OperatorProfile {
    use timely::logging::{StartStop, TimelyEvent, TimelyEventBuilder};
    let state = std::rc::Rc::new(std::cell::RefCell::new(ProfileState::default()));
    let st = state.clone();
    worker.log_register().expect("log register").insert::<TimelyEventBuilder, _>("timely", move |_time, data| {
        let Some(data) = data else { return };
        let mut st = st.borrow_mut();
        for (t, e) in data.iter() {
            match e {
                TimelyEvent::Operates(o) => {
                    st.names.insert(o.id, format!("{}{:?}", o.name, o.addr));
                }
                TimelyEvent::Schedule(s) => match s.start_stop {
                    StartStop::Start => {
                        st.started.insert(s.id, *t);
                    }
                    StartStop::Stop => {
                        if let Some(t0) = st.started.remove(&s.id) {
                            *st.busy.entry(s.id).or_default() += t.saturating_sub(t0);
                        }
                    }
                },
                _ => {}
            }
        }
    });
    OperatorProfile { state }
}

impl OperatorProfile {
    /// Prints the 25 busiest operators since the last report, and resets.
    fn report(&self, worker: usize) {
        let mut st = self.state.borrow_mut();
        let mut busy: Vec<(usize, Duration)> = st.busy.drain().collect();
        busy.sort_by(|a, b| b.1.cmp(&a.1));
        let total: f64 = busy.iter().map(|b| b.1.as_secs_f64()).sum();
        eprintln!("profile (worker {worker}): {total:.3}s in operators");
        for (id, d) in busy.iter().take(15) {
            eprintln!("  {:>8.3}s  {:>4}  {}", d.as_secs_f64(), id, st.names.get(id).map_or("?", String::as_str));
        }
        {
            // Busy time per stretch of operators between two EgoNetworks (one hierarchy layer each).
            let mut ids: Vec<usize> = st.names.keys().copied().collect();
            ids.sort();
            let mut seg = 0;
            let mut segs: Vec<f64> = vec![0.0];
            let busy_map: std::collections::HashMap<usize, Duration> = busy.iter().copied().collect();
            for id in ids {
                if id == 0 { continue; }
                if st.names[&id].starts_with("EgoNetworks") { seg += 1; segs.push(0.0); }
                segs[seg] += busy_map.get(&id).map_or(0.0, Duration::as_secs_f64);
            }
            eprintln!("  by layer stretch: {:?}", segs.iter().map(|x| (x * 1000.0).round() / 1000.0).collect::<Vec<_>>());
        }
        let mut by_name: std::collections::HashMap<&str, (Duration, usize)> = Default::default();
        for (id, d) in &busy {
            let name = st.names.get(id).map_or("?", |n| n.split('[').next().unwrap_or("?"));
            let e = by_name.entry(name).or_default();
            e.0 += *d;
            e.1 += 1;
        }
        let mut by_name: Vec<_> = by_name.into_iter().collect();
        by_name.sort_by(|a, b| b.1 .0.cmp(&a.1 .0));
        for (name, (d, n)) in by_name.iter().take(15) {
            eprintln!("  {:>8.3}s  {n:>5} × {name}", d.as_secs_f64());
        }
    }
}
