//! The engine: shared state between the timely workers and the HTTP server, the dataflow, and the driver loop that
//! turns queued records into epochs.
//!
//! Threads: `timely::execute` runs the workers; source threads (one per `--input`, one for Kafka) parse records into
//! the ingest queue; the HTTP server appends acknowledged records to the input log and the queue. The first worker of
//! each process (its *driver*) owns that process's inputs: it closes an epoch every `ingest.epoch-interval` (or
//! `epoch-max-records`), feeds the records' node deltas into the dataflow, and steps it. The other workers close their
//! inputs at once.
//!
//! **A cluster** (`-n` processes): every process reads its share of the Kafka partitions into its own input log and
//! queue; process 0 alone reads files, serves HTTP and runs the summariser. The drivers keep one clock: each
//! broadcasts the epoch it opens, and a driver that sees a later epoch closes its own open epoch and moves to it, so
//! the frontier (the least epoch any driver may still feed) keeps up with the busiest process. The views (on worker
//! 0) hold a capability for every epoch they have not yet applied; a probe on them tells every process what the views
//! reflect, which is when its Kafka offsets are committed.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use connectors::input_log::LoggedRecord;
use connectors::{DeadLetter, InputLog, LoggedResponse, ResponseLog, Source, SourceBatch};
use operators::hierarchy::dataflow::{hierarchy, summaries};
use operators::summary::{Extractive, Llm};
use differential_dataflow::input::{Input, InputSession};
use operators::dataflow::{embed_nodes, similarity_edges};
use operators::ingest::Ingestor;
use operators::model::ErrorRow;
use operators::{parse_record, Embedder, HashEmbedder, Limits, Node, Record};
use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::generic::Operator;
use timely::worker::Worker;
use tokio::sync::watch;

use crate::config::Config;
use crate::metrics::Metrics;
use crate::views::{ViewUpdate, Views};

/// Longest raw input kept in an error row (the dead-letter file keeps all of it).
const ERROR_RAW_CHARS: usize = 2048;

pub enum Item {
    Record(Record),
    Reject(ErrorRow),
    /// A logged summary: `(space, content hash, text)`.
    Summary(String, String, String),
    /// The highest offset read of a source, after the records it covers.
    Position(String, u64),
}

/// Where this process sits in the cluster.
#[derive(Clone, Copy, Debug)]
pub struct Place {
    pub process: usize,
    pub processes: usize,
}

impl Place {
    pub const SINGLE: Place = Place { process: 0, processes: 1 };

    /// Process 0 serves HTTP, reads files and runs the summariser.
    pub fn leads(&self) -> bool {
        self.process == 0
    }
}

/// The clock message that tells the other drivers to finish.
const CLOCK_STOP: u64 = u64::MAX;

pub struct Queue {
    /// The epoch that queued records will be fed at.
    pub open_epoch: u64,
    pub items: Vec<Item>,
    /// When the first item of the open epoch arrived.
    pub opened: Option<Instant>,
    /// Sources still reading.
    pub live_sources: usize,
}

pub struct Shared {
    pub config: Config,
    pub limits: Limits,
    pub embedder: Arc<dyn Embedder>,
    pub queue: Mutex<Queue>,
    pub views: RwLock<Views>,
    pub as_of: watch::Sender<Option<u64>>,
    pub metrics: Metrics,
    pub shutdown: AtomicBool,
    pub input_log: Mutex<InputLog>,
    pub response_log: Mutex<ResponseLog>,
    pub dead_letter: Mutex<DeadLetter>,
    pub llm: Arc<dyn Llm>,
    /// Per source (`file:PATH`), the last offset the input log holds: where the source resumes after a restart.
    pub resume: HashMap<String, u64>,
    /// Closed epochs not yet reflected in the views, with the instant each closed (for the lag metric).
    closed: Mutex<VecDeque<(u64, Instant)>>,
    /// This process's place in the cluster.
    pub place: Place,
    /// The latest epoch any driver has opened (the cluster's clock), or `CLOCK_STOP`.
    clock: AtomicU64,
    /// The Kafka output topics (no-ops when none is configured).
    pub outputs: crate::outputs::Outputs,
    /// Logged query-time replies of the configured model (answers, selections, plans, explorer choices):
    /// (space, `q:` key) → reply.
    answers: Mutex<HashMap<(String, String), String>>,
    /// Cluster summaries made so far (seeded from the response log): what a grown cluster can reuse.
    pub summary_cache: Mutex<operators::summary::SummaryCache>,
}

/// The response-log key prefix of query-time calls (never an input of the dataflow).
const QUERY_KEY: &str = "q:";

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("the ingest queue is full ({0} records waiting); retry later")]
    Overloaded(usize),
    #[error("could not append to the input log: {0}")]
    Log(#[from] std::io::Error),
}

/// What an HTTP ingest returns.
pub struct Receipt {
    pub epoch: Option<u64>,
    pub accepted: usize,
    pub rejected: Vec<(usize, String)>,
}

/// A configured API key, else the OPENAI_API_KEY environment variable, if either is set.
fn api_key(configured: &str) -> Option<String> {
    Some(configured.to_string())
        .filter(|k| !k.is_empty())
        .or_else(|| std::env::var("OPENAI_API_KEY").ok().filter(|k| !k.is_empty()))
}

/// The summariser's model: the built-in extractive backend, or an OpenAI-compatible server.
pub fn make_llm(config: &Config, metrics: &Metrics) -> anyhow::Result<Arc<dyn Llm>> {
    use crate::config::{LlmBackend, ResponseFormatName};
    use connectors::llm::{OpenAiClient, OpenAiConfig, OpenAiLlm, ResponseFormat};
    Ok(match config.llm.backend {
        LlmBackend::Extractive => Arc::new(Extractive { max_words: config.hierarchy.summary_words }),
        LlmBackend::Openai => {
            let l = &config.llm;
            let api_key = api_key(&l.api_key);
            let client = OpenAiClient::new(
                OpenAiConfig {
                    base_url: l.base_url.clone(),
                    model: l.model.clone(),
                    api_key,
                    requests_per_minute: l.requests_per_minute,
                    tokens_per_minute: l.tokens_per_minute,
                    max_in_flight: l.max_in_flight,
                    timeout: l.timeout,
                    max_retries: l.max_retries,
                    response_format: match l.response_format {
                        ResponseFormatName::JsonSchema => ResponseFormat::JsonSchema,
                        ResponseFormatName::JsonObject => ResponseFormat::JsonObject,
                    },
                    max_tokens: l.max_tokens,
                    backoff: Duration::from_millis(500),
                },
                metrics.llm.clone(),
            )
            .map_err(|e| anyhow::anyhow!(e))?;
            Arc::new(OpenAiLlm::new(client, config.hierarchy.summary_words)?)
        }
    })
}

#[cfg(feature = "kafka")]
fn kafka_metrics(m: &Metrics) -> Option<connectors::kafka::KafkaMetrics> {
    Some(m.kafka.clone())
}

#[cfg(not(feature = "kafka"))]
fn kafka_metrics(_m: &Metrics) -> Option<()> {
    None
}

/// The configured embedder, counted. `openai` vectors are logged in `dir/embeddings.log`.
pub fn make_embedder(config: &Config, metrics: &Metrics, dir: &std::path::Path) -> anyhow::Result<Arc<dyn Embedder>> {
    use crate::config::EmbedderKind;
    use connectors::embedders::{Instrumented, OpenAiEmbedder};
    use connectors::llm::{OpenAiClient, OpenAiConfig, ResponseFormat};
    let e = &config.embedder;
    let (inner, kind): (Arc<dyn Embedder>, &'static str) = match e.kind {
        EmbedderKind::Hash => (Arc::new(HashEmbedder::new(e.dim)), "hash"),
        #[cfg(feature = "local-embedder")]
        EmbedderKind::Local => {
            let m = connectors::embedders::LocalEmbedder::load(std::path::Path::new(&e.model_dir), e.batch)
                .map_err(|err| anyhow::anyhow!("embedder.model-dir: {err}"))?;
            (Arc::new(m), "local")
        }
        #[cfg(not(feature = "local-embedder"))]
        EmbedderKind::Local => anyhow::bail!("embedder.kind = \"local\": built without the local-embedder feature"),
        EmbedderKind::Openai => {
            let api_key = api_key(&e.api_key);
            let client = OpenAiClient::new(
                OpenAiConfig {
                    base_url: e.base_url.clone(),
                    model: e.model.clone(),
                    api_key,
                    requests_per_minute: e.requests_per_minute,
                    tokens_per_minute: e.tokens_per_minute,
                    max_in_flight: 2,
                    timeout: e.timeout,
                    max_retries: 5,
                    response_format: ResponseFormat::JsonObject,
                    max_tokens: 0,
                    backoff: Duration::from_millis(500),
                },
                metrics.embedder_requests.clone(),
            )
            .map_err(|err| anyhow::anyhow!(err))?;
            let m = OpenAiEmbedder::new(client, &dir.join("embeddings.log"), e.batch, Some(metrics.embedder.clone()))
                .map_err(|err| anyhow::anyhow!("embedder: {err}"))?;
            (Arc::new(m), "openai")
        }
    };
    Ok(Arc::new(Instrumented::new(inner, kind, metrics.embedder.clone())))
}

impl Shared {
    /// Opens the data directory: the input log (replayed into the queue, at one epoch past every receipt it handed
    /// out) and the dead-letter file. Process `p > 0` of a cluster keeps its files in `DATA_DIR/process-p`, so that
    /// processes sharing a disk stay apart.
    pub fn open(config: Config, place: Place) -> anyhow::Result<Arc<Shared>> {
        let dir = if place.leads() { config.data_dir.clone() } else { config.data_dir.join(format!("process-{}", place.process)) };
        std::fs::create_dir_all(&dir)?;
        let log_path = dir.join("input.log");
        let replay = InputLog::replay(&log_path)?;
        if replay.torn_lines > 0 {
            tracing::warn!(torn = replay.torn_lines, "input log had unreadable lines (a crash mid-append); skipped");
        }
        let input_log = InputLog::open(&log_path)?;
        let metrics = Metrics::new();
        // Only process 0 asks the model; the others never call it.
        let llm: Arc<dyn Llm> =
            if place.leads() { make_llm(&config, &metrics)? } else { Arc::new(Extractive { max_words: config.hierarchy.summary_words }) };
        let embedder = make_embedder(&config, &metrics, &dir)?;
        // Logged responses of the configured model are inputs like records: no call is made for them again.
        let responses_path = dir.join("responses.log");
        let mut responses = ResponseLog::replay(&responses_path)?;
        // The response log topic, when configured, holds what an earlier pod logged.
        let from_topic = if place.leads() { crate::outputs::Outputs::read_responses(&config.kafka)? } else { Vec::new() };
        if !from_topic.is_empty() {
            let known: std::collections::HashSet<(String, String, String)> =
                responses.records.iter().map(|r| (r.model.clone(), r.space.clone(), r.key.clone())).collect();
            let new: Vec<LoggedResponse> =
                from_topic.into_iter().filter(|r| !known.contains(&(r.model.clone(), r.space.clone(), r.key.clone()))).collect();
            tracing::info!(responses = new.len(), "read LLM responses from the response log topic");
            responses.records.extend(new);
        }
        let response_log = ResponseLog::open(&responses_path)?;
        let dead_letter = DeadLetter::open(&dir.join("dead-letter.jsonl"))?;
        let limits = config.limits();
        let (as_of, _) = watch::channel(None);
        let mut items = Vec::new();
        let mut max_epoch = None;
        let mut resume: HashMap<String, u64> = HashMap::new();
        for r in &replay.records {
            max_epoch = max_epoch.max(Some(r.epoch));
            if let (Some(src), Some(off)) = (&r.source, r.offset) {
                let e = resume.entry(src.clone()).or_default();
                *e = (*e).max(off);
            }
            if r.record.is_null() {
                continue;
            }
            match operators::record::from_value(r.record.clone(), Some(&r.space), &limits) {
                Ok(rec) => items.push(Item::Record(rec)),
                // Logged records were valid when logged; a config change (smaller limits) can reject them now.
                Err(e) => items.push(Item::Reject(ErrorRow {
                    source: "replay".into(),
                    reason: e.to_string(),
                    raw: r.record.to_string().chars().take(ERROR_RAW_CHARS).collect(),
                })),
            }
        }
        if !items.is_empty() {
            metrics.records_in.with_label_values(&["replay"]).inc_by(items.len() as u64);
            tracing::info!(records = items.len(), "replaying the input log");
        }
        items.extend(resume.iter().map(|(src, off)| Item::Position(src.clone(), *off)));
        let mut answers = HashMap::new();
        let mut summary_cache = operators::summary::SummaryCache::new(config.hierarchy.summary_coverage);
        for r in responses.records.into_iter().filter(|r| place.leads() && r.model == llm.model()) {
            if let Some(c) = &r.covers {
                summary_cache.record(&r.space, c, &r.response);
            }
            if r.key.starts_with(QUERY_KEY) {
                answers.insert((r.space, r.key), r.response);
            } else {
                items.push(Item::Summary(r.space, r.key, r.response));
            }
        }
        let open_epoch = max_epoch.unwrap_or(0);
        let opened = (!items.is_empty()).then(Instant::now);
        let outputs = crate::outputs::Outputs::open(&config.kafka, kafka_metrics(&metrics))?;
        Ok(Arc::new(Shared {
            embedder,
            limits,
            queue: Mutex::new(Queue { open_epoch, items, opened, live_sources: 0 }),
            resume,
            views: RwLock::new(Views::default()),
            as_of,
            metrics,
            shutdown: AtomicBool::new(false),
            input_log: Mutex::new(input_log),
            response_log: Mutex::new(response_log),
            dead_letter: Mutex::new(dead_letter),
            llm,
            closed: Mutex::new(VecDeque::new()),
            place,
            clock: AtomicU64::new(0),
            answers: Mutex::new(answers),
            summary_cache: Mutex::new(summary_cache),
            outputs,
            config,
        }))
    }

    /// A query-time model call, logged like summaries: keyed by the stage and its inputs, so the same call again,
    /// or after a restart, is answered from the log. `None` without a model.
    pub fn remember<T>(
        &self,
        space: &str,
        stage: &str,
        inputs: &[&str],
        call: impl FnOnce(&dyn Llm) -> Result<Option<T>, operators::summary::LlmError>,
    ) -> Result<Option<T>, operators::summary::LlmError>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
    {
        let parts: Vec<(String, &str)> = inputs.iter().enumerate().map(|(i, x)| (i.to_string(), *x)).collect();
        let refs: Vec<(&str, &str)> = parts.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        let key = format!("{QUERY_KEY}{stage}:{}", operators::summary::content_hash(&refs));
        if let Some(logged) = self.answers.lock().expect("answers lock").get(&(space.to_string(), key.clone())) {
            if let Ok(v) = serde_json::from_str(logged) {
                return Ok(Some(v));
            }
        }
        let Some(reply) = call(self.llm.as_ref())? else { return Ok(None) };
        let text = serde_json::to_string(&reply).map_err(|e| operators::summary::LlmError::BadReply(e.to_string()))?;
        let logged = LoggedResponse { model: self.llm.model().to_string(), space: space.to_string(), key: key.clone(), response: text.clone(), covers: None };
        match self.response_log.lock().expect("response log lock").append(std::slice::from_ref(&logged)) {
            Ok(()) => {
                self.outputs.responses(std::slice::from_ref(&logged));
                self.answers.lock().expect("answers lock").insert((space.to_string(), key), text);
            }
            Err(e) => tracing::error!(error = %e, stage, "could not append a query-time reply to the response log; it is not kept"),
        }
        Ok(Some(reply))
    }

    /// The model's short answer to `question` from `evidence` (best first), `None` without a model.
    pub fn answer(&self, space: &str, question: &str, evidence: &[&str]) -> Result<Option<String>, operators::summary::LlmError> {
        let mut inputs = vec![question];
        inputs.extend_from_slice(evidence);
        self.remember(space, "answer", &inputs, |llm| llm.answer(question, evidence))
    }

    /// Records a reject: the dead-letter line, the metric, and the error row for the dataflow.
    pub fn reject(&self, kind: &str, source: &str, reason: &str, raw: &[u8]) -> ErrorRow {
        if let Err(e) = self.dead_letter.lock().expect("dead letter lock").write(source, reason, raw) {
            tracing::error!(error = %e, source, reason, "could not write the dead-letter file");
        }
        self.outputs.dead_letter(source, reason, raw);
        self.metrics.records_rejected.with_label_values(&[kind]).inc();
        ErrorRow {
            source: source.to_string(),
            reason: reason.to_string(),
            raw: String::from_utf8_lossy(raw).chars().take(ERROR_RAW_CHARS).collect(),
        }
    }

    fn queue_cap(&self) -> usize {
        self.config.ingest.epoch_max_records * 10
    }

    /// HTTP ingest: validates every record, appends the valid ones to the input log (fsync'd) and queues them.
    /// The receipt names the epoch that will hold them; it is returned only after the log append.
    pub fn ingest_http(&self, space: &str, raws: Vec<Result<serde_json::Value, (Vec<u8>, String)>>) -> Result<Receipt, IngestError> {
        let mut accepted = Vec::new();
        let mut rejects = Vec::new();
        let mut rejected = Vec::new();
        for (i, raw) in raws.into_iter().enumerate() {
            let source = format!("http:{space}:{i}");
            match raw {
                Ok(value) => match operators::record::from_value(value.clone(), Some(space), &self.limits) {
                    Ok(rec) => accepted.push((rec, value)),
                    Err(e) => {
                        let reason = e.to_string();
                        rejects.push(self.reject("http", &source, &reason, value.to_string().as_bytes()));
                        rejected.push((i, reason));
                    }
                },
                Err((bytes, reason)) => {
                    rejects.push(self.reject("http", &source, &reason, &bytes));
                    rejected.push((i, reason));
                }
            }
        }
        let mut q = self.queue.lock().expect("queue lock");
        if q.items.len() + accepted.len() > self.queue_cap() && !accepted.is_empty() {
            return Err(IngestError::Overloaded(q.items.len()));
        }
        let logged: Vec<LoggedRecord> = accepted
            .iter()
            .map(|(_, v)| {
                let mut v = v.clone();
                if let Some(obj) = v.as_object_mut() {
                    obj.remove("space");
                }
                LoggedRecord { epoch: 0, space: space.to_string(), record: v, source: None, offset: None }
            })
            .collect();
        let n = accepted.len();
        self.metrics.records_in.with_label_values(&["http"]).inc_by(n as u64);
        let items = accepted.into_iter().map(|(r, _)| Item::Record(r)).chain(rejects.into_iter().map(Item::Reject));
        let epoch = self.log_and_queue(&mut q, logged, items.collect())?;
        Ok(Receipt { epoch: (n > 0).then_some(epoch), accepted: n, rejected })
    }

    /// Appends `logged` to the input log (one fsync), stamped with the open epoch, then queues `items` at that
    /// epoch: what is queued is durable first. Returns the epoch.
    fn log_and_queue(&self, q: &mut Queue, mut logged: Vec<LoggedRecord>, items: Vec<Item>) -> std::io::Result<u64> {
        let epoch = q.open_epoch;
        if !logged.is_empty() {
            for l in &mut logged {
                l.epoch = epoch;
            }
            let t = Instant::now();
            self.input_log.lock().expect("log lock").append(&logged)?;
            self.metrics.input_log_fsync.observe(t.elapsed().as_secs_f64());
        }
        if !items.is_empty() {
            q.opened.get_or_insert_with(Instant::now);
            q.items.extend(items);
        }
        Ok(epoch)
    }

    /// A batch from a source: rejects are dead-lettered; the rest are appended to the input log with their
    /// positions (so that a restart replays them in order and the source resumes after them) and queued.
    /// Returns the epoch that holds the batch and the highest position of each source in it.
    pub fn ingest_source(&self, kind: &str, records: Vec<connectors::SourceRecord>) -> std::io::Result<(u64, Vec<connectors::Position>)> {
        let n = records.len();
        let mut last: BTreeMap<String, connectors::Position> = BTreeMap::new();
        for r in &records {
            let e = last.entry(r.position.source.clone()).or_insert_with(|| r.position.clone());
            if r.position.offset > e.offset {
                *e = r.position.clone();
            }
        }
        let mut items = Vec::with_capacity(n);
        let mut logged = Vec::with_capacity(n + 1);
        for r in records {
            let parsed = std::str::from_utf8(&r.payload)
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(t).ok());
            match parse_record(&r.payload, r.space.as_deref(), &self.limits) {
                Ok(rec) => {
                    let value = parsed.expect("a record that parses is JSON");
                    logged.push(LoggedRecord {
                        epoch: 0,
                        space: rec.space().to_string(),
                        record: value,
                        source: Some(r.position.source.clone()),
                        offset: Some(r.position.offset),
                    });
                    items.push(Item::Record(rec));
                }
                Err(e) => items.push(Item::Reject(self.reject(kind, &r.position.to_string(), &e.to_string(), &r.payload))),
            }
        }
        for p in last.values() {
            // Mark each source's batch end, so that rejected last records are not read (and dead-lettered) again.
            let logged_max = logged.iter().filter(|l| l.source.as_ref() == Some(&p.source)).filter_map(|l| l.offset).max();
            if logged_max != Some(p.offset) {
                logged.push(LoggedRecord {
                    epoch: 0,
                    space: String::new(),
                    record: serde_json::Value::Null,
                    source: Some(p.source.clone()),
                    offset: Some(p.offset),
                });
            }
        }
        self.metrics.records_in.with_label_values(&[kind]).inc_by(n as u64);
        items.extend(last.values().map(|p| Item::Position(p.source.clone(), p.offset)));
        let mut q = self.queue.lock().expect("queue lock");
        let epoch = self.log_and_queue(&mut q, logged, items)?;
        Ok((epoch, last.into_values().collect()))
    }

    /// Takes the open epoch's items if it is due: old enough, full enough, shutting down, or behind the cluster's
    /// clock (`clock`, the latest epoch another driver opened). Returns the epoch, its items and the next open one.
    fn take_due(&self, force: bool, clock: u64) -> Option<(u64, Vec<Item>, u64)> {
        let mut q = self.queue.lock().expect("queue lock");
        let due = match q.opened {
            None => false,
            Some(t) => {
                force
                    || q.open_epoch < clock
                    || t.elapsed() >= self.config.ingest.epoch_interval
                    || q.items.len() >= self.config.ingest.epoch_max_records
            }
        };
        if !due || q.items.is_empty() {
            return None;
        }
        let epoch = q.open_epoch;
        q.open_epoch = (epoch + 1).max(clock);
        q.opened = None;
        Some((epoch, std::mem::take(&mut q.items), q.open_epoch))
    }

    /// Moves an empty open epoch up to the cluster's clock; returns the new open epoch if it moved.
    fn follow_clock(&self, clock: u64) -> Option<u64> {
        let mut q = self.queue.lock().expect("queue lock");
        (q.items.is_empty() && q.open_epoch < clock).then(|| {
            q.open_epoch = clock;
            clock
        })
    }

    /// Once every source has finished and its records are in the views, the epoch they reached; `None` while
    /// sources are still reading (a followed file never finishes).
    pub fn inputs_settled(&self) -> Option<Option<u64>> {
        let q = self.queue.lock().expect("queue lock");
        (q.live_sources == 0 && q.items.is_empty()).then(|| q.open_epoch.checked_sub(1))
    }

    fn queue_is_idle(&self) -> bool {
        let q = self.queue.lock().expect("queue lock");
        q.items.is_empty()
    }

    /// Called by the view sink when the views reflect every epoch up to `as_of`.
    fn advanced(&self, as_of: u64) {
        let mut closed = self.closed.lock().expect("closed lock");
        while closed.front().is_some_and(|(e, _)| *e <= as_of) {
            closed.pop_front();
        }
        self.metrics.frontier_lag_epochs.set(closed.len() as i64);
        self.metrics.frontier_lag_seconds.set(closed.front().map_or(0.0, |(_, t)| t.elapsed().as_secs_f64()));
    }

    fn closed_epoch(&self, epoch: u64) {
        let mut closed = self.closed.lock().expect("closed lock");
        closed.push_back((epoch, Instant::now()));
        self.metrics.frontier_lag_epochs.set(closed.len() as i64);
        self.metrics.frontier_lag_seconds.set(closed.front().map_or(0.0, |(_, t)| t.elapsed().as_secs_f64()));
    }
}

/// Reads a source on a thread of its own, parsing into the queue; backs off while the queue is full.
pub fn spawn_source(shared: Arc<Shared>, mut source: Box<dyn Source>, kind: &'static str) -> std::thread::JoinHandle<()> {
    shared.queue.lock().expect("queue lock").live_sources += 1;
    std::thread::Builder::new()
        .name(format!("engram-source-{kind}"))
        .spawn(move || {
            let name = source.name();
            let batch = shared.config.ingest.epoch_max_records.max(1);
            // Batches not yet reflected in the views: (epoch, highest position per source).
            let mut uncommitted: VecDeque<(u64, Vec<connectors::Position>)> = VecDeque::new();
            while !shared.shutdown.load(Ordering::Relaxed) {
                let as_of = *shared.as_of.borrow();
                let mut done = Vec::new();
                while uncommitted.front().is_some_and(|(e, _)| as_of.is_some_and(|a| *e <= a)) {
                    done.extend(uncommitted.pop_front().expect("front").1);
                }
                if !done.is_empty() {
                    source.commit(&done);
                }
                if shared.queue.lock().expect("queue lock").items.len() >= shared.queue_cap() {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                match source.poll(batch) {
                    Ok(SourceBatch::Records(records)) => match shared.ingest_source(kind, records) {
                        Ok(batch) => uncommitted.push_back(batch),
                        Err(e) => {
                            tracing::error!(source = %name, error = %e, "could not log source records; the source stops");
                            break;
                        }
                    },
                    Ok(SourceBatch::Idle) => std::thread::sleep(source.idle_wait().max(Duration::from_millis(if uncommitted.is_empty() { 0 } else { 5 }))),
                    Ok(SourceBatch::Done) => break,
                    Err(e) => {
                        tracing::error!(source = %name, error = %e, "source failed; it stops, the engine goes on");
                        break;
                    }
                }
            }
            shared.queue.lock().expect("queue lock").live_sources -= 1;
            tracing::info!(source = %name, "source finished");
        })
        .expect("spawn source thread")
}

type NodeInput = InputSession<u64, (String, Node), isize>;
type ErrorInput = InputSession<u64, ErrorRow, isize>;
type SummaryInput = InputSession<u64, ((String, String), String), isize>;
type PositionInput = InputSession<u64, (String, u64), isize>;

pub struct Inputs {
    pub nodes: NodeInput,
    pub errors: ErrorInput,
    pub summaries: SummaryInput,
    pub positions: PositionInput,
    /// The cluster's clock: every driver sends the epoch it opens; all of them see it.
    pub clock: timely::dataflow::operators::vec::input::Handle<u64, u64>,
    /// What the views have applied, seen from any worker.
    pub views: timely::dataflow::operators::probe::Handle<u64>,
}

impl Inputs {
    fn advance_to(&mut self, t: u64) {
        self.nodes.advance_to(t);
        self.errors.advance_to(t);
        self.summaries.advance_to(t);
        self.positions.advance_to(t);
        if *self.clock.time() < t {
            self.clock.advance_to(t);
        }
    }
    fn flush(&mut self) {
        self.nodes.flush();
        self.errors.flush();
        self.summaries.flush();
        self.positions.flush();
        self.clock.flush();
    }
}

/// Builds the dataflow on one worker: nodes → embeddings → similarity edges → hierarchy → summaries, and everything
/// → views (on worker 0).
pub fn build_dataflow(worker: &mut Worker, shared: Arc<Shared>) -> Inputs {
    let index = worker.index();
    let params = shared.config.similarity.clone();
    let hparams = shared.config.hierarchy.params();
    worker.dataflow::<u64, _, _>(|scope| {
        let (node_input, nodes) = scope.new_collection::<(String, Node), isize>();
        let (error_input, errors) = scope.new_collection::<ErrorRow, isize>();
        let (summary_input, logged) = scope.new_collection::<((String, String), String), isize>();
        let (position_input, positions) = scope.new_collection::<(String, u64), isize>();
        let (clock_input, clock) = timely::dataflow::operators::vec::Input::new_input::<u64>(&scope);
        let seen = shared.clone();
        use timely::dataflow::operators::Inspect;
        timely::dataflow::operators::vec::Broadcast::broadcast(clock).inspect(move |e| {
            seen.clock.fetch_max(*e, Ordering::SeqCst);
        });
        let embedded = embed_nodes(nodes.clone(), shared.embedder.clone());
        let edges = similarity_edges(embedded.clone(), params);
        let h = hierarchy(
            nodes.clone().map(|(s, n)| (s, n.id)),
            edges.clone().map(|e| (e.space, e.u, e.v, u64::from(e.weight_micro))),
            &hparams,
        );
        let em = operators::events::event_memory(
            nodes.clone(),
            logged.clone(),
            operators::events::SegmentParams { summary_words: shared.config.hierarchy.summary_words, ..Default::default() },
            shared.config.llm.backend != crate::config::LlmBackend::Extractive,
        );
        let (events, relations) = (em.events, em.relations);
        // Merging: each event embedded (as a pseudo-node, so batch-dependent embedders retract exactly) and quantised.
        let event_nodes = events.clone().map(|(s, e)| {
            let text = format!("{} | {}", e.summary, e.people.join(", "));
            (s, Node { id: e.id, kind: operators::NodeKind::Summary, doc: e.conversation, pos: 0, text, speaker: None, ts: None })
        });
        let event_vectors =
            embed_nodes(event_nodes, shared.embedder.clone()).map(|(s, n, v)| (s, n.id, operators::events::quantise(&v.0)));
        // Links at the merge threshold; with the judge on (and a model), the pairs just below it go to the model.
        let ev_cfg = &shared.config.events;
        let judging = ev_cfg.judge && shared.config.llm.backend != crate::config::LlmBackend::Extractive;
        let tau = ev_cfg.merge_threshold;
        let micro = |x: f32| (f64::from(x) * 1e6).round() as i64;
        let (tau_micro, lo) = (micro(tau), if judging { ev_cfg.judge_threshold } else { tau });
        let pairs = operators::events::similar_pairs(event_vectors.clone(), lo);
        let links = pairs.clone().filter(move |p| p.3 >= tau_micro).map(|(s, a, b, _)| (s, a, b));
        let candidates = pairs.filter(move |p| p.3 < tau_micro).map(|(s, a, b, _)| (s, a, b));
        let coref = operators::events::coreference(candidates, events.clone(), logged.clone());
        let merges = operators::events::merge_groups(event_vectors.clone(), links.concat(coref.same));
        let topics = operators::events::event_topics(event_vectors);
        let sm = summaries(nodes.map(|(s, n)| ((s, n.id), n.text)), &h.layers, logged);
        let embedder = shared.embedder.clone();
        let updates = embedded
            .map(|(s, n, e)| ViewUpdate::Node(s, n, e))
            .concat(edges.map(ViewUpdate::Edge))
            .concat(errors.map(ViewUpdate::Error))
            .concat(h.clusters.map(|(s, l, c, m)| ViewUpdate::Cluster(s, l, c, m)))
            .concat(h.edges.map(|(s, l, u, v, w)| ViewUpdate::LayerEdge(s, l, u, v, w)))
            .concat(sm.texts.map(|((s, c), (l, t))| ViewUpdate::Summary(s, l, c, t)))
            .concat(sm.requests.map(|(s, l, c, h, ms)| ViewUpdate::Request(s, l, c, h, ms)))
            .concat(em.requests.map(|(s, tag, key, turns)| ViewUpdate::Request(s, SESSION_LAYER, tag, key, turns)))
            .concat(events.map(|(s, e)| ViewUpdate::Event(s, e)))
            .concat(relations.map(|(s, r)| ViewUpdate::Relation(s, r)))
            .concat(coref.overlaps.map(|(s, r)| ViewUpdate::Relation(s, r)))
            .concat(coref.requests.map(|(s, key, pair)| ViewUpdate::Request(s, JUDGE_LAYER, String::new(), key, pair)))
            .concat(merges.map(|(s, e, g)| ViewUpdate::Merge(s, e, g)))
            .concat(topics.map(|(s, t, e)| ViewUpdate::Topic(s, t, e)))
            .concat(positions.map(|(s, o)| ViewUpdate::Position(s, o)));
        let mut pending: BTreeMap<u64, Vec<(ViewUpdate, isize)>> = BTreeMap::new();
        // A capability per epoch not yet applied: the probe below sees an epoch only once the views hold it.
        let mut held: BTreeMap<u64, timely::dataflow::operators::Capability<u64>> = BTreeMap::new();
        let mut last_as_of: Option<u64> = None;
        type Nothing = timely::container::CapacityContainerBuilder<Vec<()>>;
        let applied = updates.inner.unary_frontier::<Nothing, _, _, _>(
            Exchange::new(|_: &(ViewUpdate, u64, isize)| 0),
            "Views",
            move |initial, _info| {
                drop(initial);
                move |(input, frontier), _output| {
            input.for_each(|cap, data| {
                if let Some(c) = cap.retain_least(0) {
                    held.entry(*c.time()).or_insert(c);
                }
                for (u, t, d) in data.drain(..) {
                    pending.entry(t).or_default().push((u, d));
                }
            });
            if index != 0 {
                return;
            }
            let lower = frontier.frontier().iter().min().copied();
            let as_of = match lower {
                Some(f) => f.checked_sub(1),
                None => pending.keys().next_back().copied().max(last_as_of),
            };
            let ready: Vec<u64> = pending.keys().copied().take_while(|t| lower.is_none_or(|f| *t < f)).collect();
            if ready.is_empty() && as_of == last_as_of {
                held.retain(|t, _| lower.is_some_and(|f| *t >= f));
                return;
            }
            {
                let mut views = shared.views.write().expect("views lock");
                for t in ready {
                    let mut updates = pending.remove(&t).expect("ready time");
                    if shared.outputs.wants_changes() {
                        differential_dataflow::consolidation::consolidate(&mut updates);
                        shared.outputs.changes(t, &updates);
                    }
                    views.apply_with(updates, &|text| embedder.embed(text));
                }
                views.as_of = as_of.max(views.as_of);
                shared.metrics.nodes.set(views.node_count() as i64);
                shared.metrics.edges.set(views.edge_count() as i64);
                shared.metrics.spaces.set(views.spaces.len() as i64);
                shared.metrics.clusters.set(views.cluster_count() as i64);
                shared.metrics.summary_backlog.set(views.request_count() as i64);
            }
            last_as_of = as_of.max(last_as_of);
            if let Some(a) = last_as_of {
                shared.advanced(a);
                shared.as_of.send_replace(Some(a));
            }
            // Everything below the frontier is applied.
            held.retain(|t, _| lower.is_some_and(|f| *t >= f));
                }
            },
        );
        let (views, _) = timely::dataflow::operators::probe::Probe::probe(applied);
        Inputs {
            nodes: node_input,
            errors: error_input,
            summaries: summary_input,
            positions: position_input,
            clock: clock_input,
            views,
        }
    })
}

/// The model's part in one query's retrieval (`query::Guide`), every call logged under the space.
pub struct ModelGuide<'a> {
    pub shared: &'a Shared,
    pub space: &'a str,
}

impl crate::query::Guide for ModelGuide<'_> {
    fn select(&self, question: &str, candidates: &[&str]) -> Result<Option<Vec<usize>>, String> {
        let mut inputs = vec![question];
        inputs.extend_from_slice(candidates);
        self.shared.remember(self.space, "select", &inputs, |llm| llm.select(question, candidates)).map_err(|e| e.to_string())
    }

    fn plan(&self, question: &str) -> Result<Option<Vec<String>>, String> {
        self.shared.remember(self.space, "plan", &[question], |llm| llm.plan(question)).map_err(|e| e.to_string())
    }

    fn explore(&self, question: &str, subgoal: &str, events: &[&str]) -> Result<Option<Vec<operators::summary::Explore>>, String> {
        let mut inputs = vec![question, subgoal];
        inputs.extend_from_slice(events);
        self.shared.remember(self.space, "explore", &inputs, |llm| llm.explore(question, subgoal, events)).map_err(|e| e.to_string())
    }
}

/// The layer a session's segmentation request is filed under in the LLM work list (clusters use 1…max-layers).
pub const SESSION_LAYER: u32 = u32::MAX;
/// The layer of a co-reference judge request (a pair of events).
pub const JUDGE_LAYER: u32 = u32::MAX - 1;

/// The body of every worker: the first worker of each process drives that process's epochs until shutdown; the
/// others follow.
pub fn run_worker(worker: &mut Worker, shared: Arc<Shared>) {
    let mut inputs = build_dataflow(worker, shared.clone());
    let place = shared.place;
    let per_process = (worker.peers() / place.processes.max(1)).max(1);
    if worker.index() != place.process * per_process {
        drop(inputs);
        while worker.step_or_park(None) {}
        return;
    }
    let cluster = place.processes > 1;
    let mut ingestor = Ingestor::new(shared.config.ingest.chunk_tokens);
    // The highest position fed per source (retracted when a higher one is fed).
    let mut fed: HashMap<String, u64> = HashMap::new();
    let mut as_of: Option<u64> = None;
    inputs.advance_to(shared.queue.lock().expect("queue lock").open_epoch);
    loop {
        let clock = if cluster { shared.clock.load(Ordering::SeqCst) } else { 0 };
        if clock == CLOCK_STOP && !shared.shutdown.load(Ordering::Relaxed) {
            // Process 0 has stopped: stop the sources, feed what they queued, and finish.
            shared.shutdown.store(true, Ordering::Relaxed);
        }
        let stopping = shared.shutdown.load(Ordering::Relaxed);
        let clock = if clock == CLOCK_STOP { 0 } else { clock };
        if let Some((epoch, items, next)) = shared.take_due(stopping, clock) {
            inputs.advance_to(epoch);
            let n = items.len();
            for item in items {
                match item {
                    Item::Record(r) => {
                        for (space, node, d) in ingestor.apply(r) {
                            inputs.nodes.update((space, node), d);
                        }
                    }
                    Item::Reject(row) => inputs.errors.update(row, 1),
                    Item::Summary(space, hash, text) => inputs.summaries.update(((space, hash), text), 1),
                    Item::Position(source, offset) => {
                        let before = fed.get(&source).copied();
                        if before.is_none_or(|b| offset > b) {
                            if let Some(b) = before {
                                inputs.positions.update((source.clone(), b), -1);
                            }
                            inputs.positions.update((source.clone(), offset), 1);
                            fed.insert(source, offset);
                        }
                    }
                }
            }
            if cluster {
                inputs.clock.send(next);
            }
            inputs.advance_to(next);
            inputs.flush();
            tracing::debug!(epoch, items = n, "epoch closed");
            shared.closed_epoch(epoch);
            shared.metrics.epochs.inc();
            shared.metrics.epoch_records.observe(n as f64);
        } else if let Some(next) = shared.follow_clock(clock) {
            inputs.advance_to(next);
            inputs.flush();
        } else if stopping && shared.queue_is_idle() {
            break;
        }
        worker.step_or_park(Some(Duration::from_millis(2)));
        if !place.leads() {
            // What the views (on process 0) reflect: when this process's Kafka offsets may be committed.
            let now = inputs.views.with_frontier(|f| f.first().copied()).map(|f| f.checked_sub(1));
            if let Some(a) = now {
                if a > as_of {
                    as_of = a;
                    shared.as_of.send_replace(a);
                }
            }
        }
    }
    if cluster && place.leads() {
        inputs.clock.send(CLOCK_STOP);
    }
    drop(inputs);
    while worker.step() {}
}

/// A session's events and relations from the model: `segment`, then `relate` over the events it gave; the logged
/// answer (operators::events::SessionAnswer) names the session (`tag`), the turns and their content key.
fn segment_session(llm: &dyn Llm, tag: &str, key: &str, turns: &[&str]) -> Result<String, operators::summary::LlmError> {
    use operators::events::{EventIn, SessionAnswer, TurnIn};
    use operators::summary::LlmError;
    let turns: Vec<TurnIn> = turns
        .iter()
        .map(|t| serde_json::from_str(t).map_err(|e| LlmError::BadReply(format!("a session turn: {e}"))))
        .collect::<Result<_, _>>()?;
    let events = llm.segment(&turns)?;
    let ins: Vec<EventIn> = events
        .iter()
        .map(|e| EventIn { id: String::new(), summary: e.summary.clone(), people: e.people.clone(), time: e.time.clone() })
        .collect();
    let relations = if ins.len() > 1 { llm.relate(&ins)? } else { Vec::new() };
    let (conversation, session) = operators::events::parse_session_tag(tag)
        .ok_or_else(|| LlmError::BadReply(format!("a session request without its session: {tag:?}")))?;
    let answer = SessionAnswer {
        events,
        relations,
        conversation,
        session,
        turn_ids: turns.iter().map(|t| t.id.clone()).collect(),
        key: key.to_string(),
    };
    serde_json::to_string(&answer).map_err(|e| LlmError::BadReply(e.to_string()))
}

/// A pair of events put to the co-reference judge; the logged answer is `{"verdict"}`.
fn judge_pair(llm: &dyn Llm, pair: &[&str]) -> Result<String, operators::summary::LlmError> {
    use operators::summary::LlmError;
    let [a, b] = pair else { return Err(LlmError::BadReply(format!("a judge request holds {} events, not 2", pair.len()))) };
    let verdict = llm.judge(a, b)?.ok_or_else(|| LlmError::Service("no model to judge with".into()))?;
    Ok(serde_json::json!({"verdict": verdict}).to_string())
}

/// The summariser: takes the clusters the views list as waiting for a summary, once each has waited
/// `hierarchy.summary-debounce` (a cluster still changing gets a new content hash, and so a new wait), asks the
/// LLM on up to `llm.max-in-flight` threads, appends each response to the response log (fsync'd) and queues it as an
/// input for the next epoch. A failed request is retried after another debounce; nothing is dropped. A live
/// session (a meeting being transcribed) changes with every turn and so never waits out the debounce: its newest
/// content is sent anyway once `events.max-latency` has passed since the session was last sent.
pub fn spawn_summarizer(shared: Arc<Shared>) -> std::thread::JoinHandle<()> {
    use operators::summary::{Coverage, Decision};
    type Job = ((String, String), String, Vec<String>, Option<Coverage>);
    type Done = ((String, String), Result<String, operators::summary::LlmError>, Duration, Option<Coverage>);
    let (job_tx, job_rx) = std::sync::mpsc::channel::<Job>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<Done>();
    let job_rx = Arc::new(Mutex::new(job_rx));
    for i in 0..shared.config.llm.max_in_flight.max(1) {
        let (job_rx, done_tx, shared) = (job_rx.clone(), done_tx.clone(), shared.clone());
        std::thread::Builder::new()
            .name(format!("engram-llm-{i}"))
            .spawn(move || loop {
                let job = job_rx.lock().expect("job lock").recv();
                let Ok((key, tag, texts, covers)) = job else { return };
                let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
                let t = Instant::now();
                let out = if key.1.starts_with("seg:") {
                    segment_session(shared.llm.as_ref(), &tag, &key.1, &refs)
                } else if key.1.starts_with("coref:") {
                    judge_pair(shared.llm.as_ref(), &refs)
                } else {
                    shared.llm.summarize(&refs)
                };
                if done_tx.send((key, out, t.elapsed(), covers)).is_err() {
                    return;
                }
            })
            .expect("spawn LLM worker");
    }
    let extractive = shared.config.llm.backend == crate::config::LlmBackend::Extractive;
    std::thread::Builder::new()
        .name("engram-summarizer".into())
        .spawn(move || {
            let debounce = shared.config.hierarchy.summary_debounce;
            let max_latency = shared.config.events.max_latency;
            let mut first_seen: HashMap<(String, String), Instant> = HashMap::new();
            let mut submitted: HashSet<(String, String)> = HashSet::new();
            // Per live session (space, tag): since when its newest turns have waited for the model.
            let mut session_since: HashMap<(String, String), Instant> = HashMap::new();
            while !shared.shutdown.load(Ordering::Relaxed) {
                // ((space, content hash), layer, cluster or session tag, (member, text))
                let waiting: Vec<((String, String), u32, String, Vec<(String, String)>)> = {
                    let views = shared.views.read().expect("views lock");
                    views
                        .spaces
                        .iter()
                        .flat_map(|(s, v)| {
                            v.requests.iter().map(move |(h, (layer, cluster, ms))| {
                                ((s.clone(), h.clone()), *layer, cluster.clone(), ms.clone())
                            })
                        })
                        .collect()
                };
                let live: HashSet<&(String, String)> = waiting.iter().map(|w| &w.0).collect();
                first_seen.retain(|k, _| live.contains(k));
                submitted.retain(|k| live.contains(k));
                let sessions: HashSet<(String, String)> =
                    waiting.iter().filter(|w| w.1 == SESSION_LAYER).map(|w| (w.0 .0.clone(), w.2.clone())).collect();
                session_since.retain(|k, _| sessions.contains(k));
                let now = Instant::now();
                let mut done = Vec::new();
                for (key, layer, tag, members) in waiting.iter() {
                    let seen = *first_seen.entry(key.clone()).or_insert(now);
                    let stable = now.duration_since(seen) >= debounce;
                    let overdue = *layer == SESSION_LAYER && {
                        let since = *session_since.entry((key.0.clone(), tag.clone())).or_insert(now);
                        now.duration_since(since) >= max_latency
                    };
                    if (stable || overdue) && !submitted.contains(key) {
                        submitted.insert(key.clone());
                        if *layer == SESSION_LAYER {
                            session_since.insert((key.0.clone(), tag.clone()), now);
                        }
                        let texts: Vec<String> = members.iter().map(|m| m.1.clone()).collect();
                        if *layer == SESSION_LAYER || *layer == JUDGE_LAYER {
                            let _ = job_tx.send((key.clone(), tag.clone(), texts, None));
                            continue;
                        }
                        // A cluster: an earlier summary of a part of its content may still hold.
                        let decision = shared.summary_cache.lock().expect("summary cache lock").decide(&key.0, *layer, tag, &key.1, members);
                        match decision {
                            Decision::Reuse { text, coverage } => {
                                shared.metrics.summaries_reused.inc();
                                done.push(LoggedResponse {
                                    model: shared.llm.model().to_string(),
                                    space: key.0.clone(),
                                    key: key.1.clone(),
                                    response: text,
                                    covers: Some(coverage),
                                });
                            }
                            Decision::Fresh(coverage) => {
                                let _ = job_tx.send((key.clone(), tag.clone(), texts, Some(coverage)));
                            }
                        }
                    }
                }
                while let Ok((key, out, took, covers)) = done_rx.try_recv() {
                    match out {
                        Ok(summary) => {
                            if extractive {
                                shared.metrics.llm.requests.with_label_values(&["summary", "ok"]).inc();
                                shared.metrics.llm.duration.with_label_values(&["summary"]).observe(took.as_secs_f64());
                            }
                            if let Some(c) = &covers {
                                shared.summary_cache.lock().expect("summary cache lock").record(&key.0, c, &summary);
                            }
                            done.push(LoggedResponse {
                                model: shared.llm.model().to_string(),
                                space: key.0,
                                key: key.1,
                                response: summary,
                                covers,
                            });
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "summary failed; retried after the debounce");
                            submitted.remove(&key);
                            first_seen.insert(key, Instant::now());
                        }
                    }
                }
                if !done.is_empty() {
                    if let Err(e) = shared.response_log.lock().expect("response log lock").append(&done) {
                        // Not logged means not used: the same requests come round again.
                        tracing::error!(error = %e, "could not append to the response log");
                        for r in &done {
                            submitted.remove(&(r.space.clone(), r.key.clone()));
                        }
                    } else {
                        shared.outputs.responses(&done);
                        let mut q = shared.queue.lock().expect("queue lock");
                        q.opened.get_or_insert_with(Instant::now);
                        q.items.extend(done.into_iter().map(|r| Item::Summary(r.space, r.key, r.response)));
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        })
        .expect("spawn summarizer")
}
