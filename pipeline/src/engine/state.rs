//! The engine's state, shared by the timely workers, the sources, the summariser and the HTTP server, and how it is
//! opened: the data directory's logs replayed into the ingest queue.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use connectors::input_log::LoggedRecord;
use connectors::{DeadLetter, InputLog, LoggedResponse, ResponseLog};
use operators::extractive::Extractive;
use operators::llm::Llm;
use operators::model::ErrorRow;
use operators::request::{is_legacy_key, ModelRequest, RequestKind};
use operators::summary::SummaryCache;
use operators::{Embedder, Limits, Record};
use tokio::sync::watch;

use super::models::{kafka_metrics, make_embedder, make_llm};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::views::Views;

/// Longest raw input kept in an error row (the dead-letter file keeps all of it).
pub(super) const ERROR_RAW_CHARS: usize = 2048;

/// What the drivers feed into the dataflow.
pub(super) enum Item {
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

/// The ingest queue: what the next epoch will hold.
pub(super) struct Queue {
    /// The epoch that queued records will be fed at.
    pub(super) open_epoch: u64,
    pub(super) items: Vec<Item>,
    /// When the first item of the open epoch arrived.
    pub(super) opened: Option<Instant>,
    /// Sources still reading.
    pub(super) live_sources: usize,
    /// Bytes of the records in `items` (as received).
    pub(super) bytes: usize,
}

/// The engine's state. Read from anywhere; changed only through its methods (the engine's own modules).
pub struct Shared {
    pub config: Config,
    pub limits: Limits,
    pub embedder: Arc<dyn Embedder>,
    pub(super) queue: Mutex<Queue>,
    /// What the dataflow has produced, as of `as_of`; written by the views sink alone.
    pub(super) views: RwLock<Views>,
    /// The last epoch whose layer 0 and events the views reflect.
    pub(super) as_of: watch::Sender<Option<u64>>,
    /// The last epoch whose hierarchy and summaries the views reflect (at most `as_of`).
    pub(super) hierarchy_as_of: watch::Sender<Option<u64>>,
    /// Into the structure (on the leading process; dropped at stop, which ends the structure's thread), and the end
    /// its thread takes at start.
    structure: Mutex<Option<std::sync::mpsc::Sender<super::structure::StructureInput>>>,
    pub(super) structure_rx: Mutex<Option<std::sync::mpsc::Receiver<super::structure::StructureInput>>>,
    pub metrics: Metrics,
    shutdown: AtomicBool,
    /// Why the engine cannot go on (a worker or the summariser died): served by /healthz, and the process exits.
    failure: Mutex<Option<String>>,
    pub(super) input_log: Mutex<InputLog>,
    pub(super) response_log: Mutex<ResponseLog>,
    dead_letter: Mutex<DeadLetter>,
    pub(super) llm: Arc<dyn Llm>,
    /// Per source (`file:PATH`), the last offset the input log holds: where the source resumes after a restart.
    pub resume: HashMap<String, u64>,
    /// Closed epochs not yet reflected in the views, with the instant each closed (for the lag metric).
    pub(super) closed: Mutex<VecDeque<(u64, Instant)>>,
    /// This process's place in the cluster.
    pub place: Place,
    /// The latest epoch any driver has opened (the cluster's clock), or `CLOCK_STOP`.
    pub(super) clock: AtomicU64,
    /// The Kafka output topics (no-ops when none is configured).
    pub(super) outputs: crate::outputs::Outputs,
    /// Logged query-time replies of the configured model (answers, selections, plans, explorer choices):
    /// (space, `q:` key) → reply.
    pub(super) answers: Mutex<HashMap<(String, String), String>>,
    /// `(space, key) → reply` of a response log written before today's content keys: found for a request by its
    /// [`ModelRequest::legacy_key`] when it comes round, and logged again under its key.
    legacy: HashMap<(String, String), String>,
    /// The memory's similarity indexes, where checkpoints read them and a restart restores them.
    pub(super) indexes: operators::memory::Indexes,
    /// What a restart from a checkpoint feeds before anything else (taken by the driver): the checkpoint's records
    /// and replies at its epoch, then the log's later records, each at the epoch it was logged at — the epochs the run
    /// before fed them in, so the similarity indexes the checkpoint restores take them as they did.
    pub(super) prefix: Mutex<Vec<(u64, Vec<Item>)>>,
    /// The checkpoint's epoch, when the views started from one: the views sink sets the updates up to it aside, and
    /// corrects the views to them once the rebuild has passed it.
    pub(super) restored_through: Option<u64>,
    /// The model's replies and the records fed so far, and their counts at the end of each epoch fed (pruned below
    /// what the views hold).
    pub(super) fed: Mutex<((u64, u64), BTreeMap<u64, (u64, u64)>)>,
    /// Whether a checkpoint is being written, and when the last one was.
    pub(super) checkpointing: AtomicBool,
    /// Layer-0 node changes handed to the structure and not yet through one of its steps.
    pub(super) structure_backlog: AtomicU64,
    pub(super) last_checkpoint: Mutex<Instant>,
    /// Whether the replies this engine is fed are all in its response log (see `checkpoint.rs`).
    pub(super) checkpoints_allowed: bool,
    /// This process's data directory.
    dir: std::path::PathBuf,
    /// Cluster summaries made so far (seeded from the response log): what a grown cluster can reuse.
    pub(super) summary_cache: Mutex<SummaryCache>,
    /// Every space this process has taken a record for (what `ingest.max-spaces` counts).
    pub(super) spaces: Mutex<HashSet<String>>,
    /// The API tokens.
    pub access: crate::auth::Access,
}

impl Shared {
    /// Opens the data directory: the input log (replayed into the queue, at one epoch past every receipt it handed
    /// out) and the dead-letter file. Process `p > 0` of a cluster keeps its files in `DATA_DIR/process-p`, so that
    /// processes sharing a disk stay apart.
    pub fn open(config: Config, place: Place) -> anyhow::Result<Arc<Shared>> {
        let dir = if place.leads() {
            config.data_dir.clone()
        } else {
            config.data_dir.join(format!("process-{}", place.process))
        };
        std::fs::create_dir_all(&dir)?;
        // The checkpoint (read, hashed and decoded) is read on a thread of its own while the logs replay on this one.
        let reading = (place.leads() && !config.checkpoint.interval.is_zero()).then(|| {
            let (path, config) = (dir.join("checkpoint.bin"), config.clone());
            std::thread::spawn(move || super::checkpoint::Checkpoint::read(&path, &config))
        });
        let log_path = dir.join("input.log");
        let replay = InputLog::replay(&log_path)?;
        if replay.torn_lines > 0 {
            tracing::warn!(torn = replay.torn_lines, "input log had unreadable lines (a crash mid-append); skipped");
        }
        let metrics = Metrics::new();
        // Only process 0 asks the model; the others never call it.
        let llm: Arc<dyn Llm> = if place.leads() {
            make_llm(&config, &metrics)?
        } else {
            Arc::new(Extractive { max_words: config.hierarchy.summary_words })
        };
        let embedder = make_embedder(&config, &metrics, &dir)?;
        // Logged responses of the configured model are inputs like records: no call is made for them again.
        let responses_path = dir.join("responses.log");
        let mut responses = ResponseLog::replay(&responses_path)?;
        // The response log topic, when configured, holds what an earlier pod logged.
        let from_topic =
            if place.leads() { crate::outputs::Outputs::read_responses(&config.kafka)? } else { Vec::new() };
        let from_topic_used = !from_topic.is_empty();
        if from_topic_used {
            let known: HashSet<(String, String, String)> =
                responses.records.iter().map(|r| (r.model.clone(), r.space.clone(), r.key.clone())).collect();
            let new: Vec<LoggedResponse> = from_topic
                .into_iter()
                .filter(|r| !known.contains(&(r.model.clone(), r.space.clone(), r.key.clone())))
                .collect();
            tracing::info!(responses = new.len(), "read LLM responses from the response log topic");
            responses.records.extend(new);
        }
        let response_log = ResponseLog::open(&responses_path)?;
        let dead_letter = DeadLetter::open(&dir.join("dead-letter.jsonl"))?;
        let limits = config.limits();
        let (as_of, _) = watch::channel(None);
        let (mut records, max_epoch, resume) = replay_records(&replay.records, &limits);
        let spaces: HashSet<String> =
            replay.records.iter().filter(|r| !r.record.is_null()).map(|r| r.space.clone()).collect();
        let access = crate::auth::Access::load(&config.auth)
            .map_err(|e| anyhow::anyhow!("invalid configuration: {}", e.join("; ")))?;
        if !records.is_empty() {
            metrics.records_in.with_label_values(&["replay"]).inc_by(records.len() as u64);
            tracing::info!(records = records.len(), "replaying the input log");
        }
        let mut replies = Vec::new();
        let mut answers = HashMap::new();
        let mut legacy = HashMap::new();
        let mut summary_cache = SummaryCache::new(config.hierarchy.summary_coverage);
        for r in responses.records.into_iter().filter(|r| place.leads() && r.model == llm.model()) {
            if let Some(c) = &r.covers {
                summary_cache.record(&r.space, c, &r.response);
            }
            if RequestKind::of_key(&r.key) == RequestKind::Query {
                answers.insert((r.space, r.key), r.response);
            } else if is_legacy_key(&r.key) {
                legacy.insert((r.space, r.key), r.response);
            } else {
                replies.push(Item::Summary(r.space, r.key, r.response));
            }
        }
        let ann = crate::ann::AnnParams { build_aside: true, ..config.query.ann() };
        let mut views = Views { ann, ..Views::default() };
        // In a cluster only process 0 checkpoints (the views are its); the others replay their logs behind it.
        let read = reading.map(|r| r.join().unwrap_or_else(|_| Err("its reader panicked".into())));
        let mut checkpoint = match read {
            Some(read) if !from_topic_used => load_checkpoint(&dir, read, &records, replies.len()),
            _ => None,
        };
        // Compaction only in one process: a delete in process 0's log may delete what another process's log holds,
        // and that log does not know it.
        if let Some(c) = checkpoint.as_mut().filter(|_| place.processes == 1) {
            if let Some(kept) = compact_behind(&dir, &replay.records, c, &config, &metrics) {
                records = kept;
            }
        }
        let indexes = operators::memory::Indexes::default();
        if let Some(states) = checkpoint.as_mut().and_then(|c| c.indexes.take()) {
            states.restore(&indexes);
        }
        let input_log = InputLog::open(&log_path)?;
        let mut open_epoch = max_epoch.unwrap_or(0);
        let mut items = Vec::new();
        let (prefix, restored_through) = match checkpoint {
            Some(c) => {
                // The epochs the checkpoint holds are fed at its epoch, their updates set aside by the views sink; the
                // later ones at their own. Positions go after them: they reach only the views, which take the latest.
                let (e, n) = (c.epoch, c.replies as usize);
                let mut prefix = vec![(e, Vec::new())];
                for (epoch, item) in records {
                    if epoch <= e {
                        prefix[0].1.push(item);
                        continue;
                    }
                    match prefix.last_mut() {
                        Some((at, items)) if *at == epoch => items.push(item),
                        _ => prefix.push((epoch, vec![item])),
                    }
                }
                let later = replies.split_off(n);
                prefix[0].1.extend(replies);
                items.extend(later);
                let t = Instant::now();
                c.restore(&mut views);
                tracing::info!(epoch = e, nodes = views.node_count(), took = ?t.elapsed(),
                    "serving the checkpoint; the dataflow rebuilds behind it");
                metrics.checkpoint_restored.set(e as i64);
                metrics.checkpoint_rebuilding.set(1);
                metrics.checkpoint_hierarchy_rebuilding.set(1);
                open_epoch = open_epoch.max(prefix.last().map_or(e, |p| p.0) + 1);
                (prefix, Some(e))
            }
            None => {
                items.extend(records.into_iter().map(|(_, item)| item));
                items.extend(replies);
                (Vec::new(), None)
            }
        };
        items.extend(resume.iter().map(|(src, off)| Item::Position(src.clone(), *off)));
        as_of.send_replace(restored_through);
        let (hierarchy_as_of, _) = watch::channel(views.hierarchy_as_of);
        let (structure_tx, structure_rx) = match place.leads() {
            true => {
                let (tx, rx) = super::structure::channel();
                (Some(tx), Some(rx))
            }
            false => (None, None),
        };
        let opened = (!items.is_empty()).then(Instant::now);
        let outputs = crate::outputs::Outputs::open(&config.kafka, kafka_metrics(&metrics))?;
        Ok(Arc::new(Shared {
            embedder,
            limits,
            queue: Mutex::new(Queue { open_epoch, items, opened, live_sources: 0, bytes: 0 }),
            spaces: Mutex::new(spaces),
            access,
            resume,
            views: RwLock::new(views),
            prefix: Mutex::new(prefix),
            indexes,
            restored_through,
            fed: Mutex::new(((0, 0), BTreeMap::new())),
            checkpointing: AtomicBool::new(false),
            structure_backlog: AtomicU64::new(0),
            last_checkpoint: Mutex::new(Instant::now()),
            checkpoints_allowed: !from_topic_used,
            dir: dir.clone(),
            as_of,
            hierarchy_as_of,
            structure: Mutex::new(structure_tx),
            structure_rx: Mutex::new(structure_rx),
            metrics,
            shutdown: AtomicBool::new(false),
            failure: Mutex::new(None),
            input_log: Mutex::new(input_log),
            response_log: Mutex::new(response_log),
            dead_letter: Mutex::new(dead_letter),
            llm,
            closed: Mutex::new(VecDeque::new()),
            place,
            clock: AtomicU64::new(0),
            answers: Mutex::new(answers),
            legacy,
            summary_cache: Mutex::new(summary_cache),
            outputs,
            config,
        }))
    }

    /// Records a reject: the dead-letter line, the metric, and the error row for the dataflow.
    pub fn reject(&self, kind: &str, source: &str, space: Option<&str>, reason: &str, raw: &[u8]) -> ErrorRow {
        let reason = &cut(reason, self.config.ingest.max_reason_chars);
        if let Err(e) = self.dead_letter.lock().expect("dead letter lock").write(source, reason, raw) {
            tracing::error!(error = %e, source, reason, "could not write the dead-letter file");
        }
        self.outputs.dead_letter(source, reason, raw);
        self.metrics.records_rejected.with_label_values(&[kind]).inc();
        ErrorRow {
            source: source.to_string(),
            reason: reason.to_string(),
            raw: String::from_utf8_lossy(raw).chars().take(ERROR_RAW_CHARS).collect(),
            space: space.map(str::to_string),
        }
    }

    /// Makes the rejects written so far durable (one fsync per batch).
    pub(super) fn sync_dead_letters(&self) {
        if let Err(e) = self.dead_letter.lock().expect("dead letter lock").sync() {
            tracing::error!(error = %e, "could not fsync the dead-letter file");
        }
    }

    /// This process's data directory (`DATA_DIR`, or `DATA_DIR/process-P` in a cluster).
    pub fn data_dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// An old log's reply for `request` (whose key is `key`), fit to log under `key`.
    pub(super) fn legacy_reply(&self, space: &str, key: &str, request: &ModelRequest) -> Option<String> {
        if self.legacy.is_empty() {
            return None;
        }
        let reply = self.legacy.get(&(space.to_string(), request.legacy_key()))?;
        request.upgrade_reply(reply, key)
    }

    /// Starts the index builds the views ask for, each on a thread of its own that installs the index when it is
    /// built (the views go on meanwhile; see `crate::ann`).
    pub(super) fn start_index_builds(self: &Arc<Self>, views: &mut Views) {
        for build in views.take_index_builds() {
            let shared = self.clone();
            let spawned = std::thread::Builder::new().name("index".into()).spawn(move || {
                let (space, nodes) = (build.space.clone(), build.nodes.len());
                let t = Instant::now();
                let built = build.run();
                let took = t.elapsed();
                shared.views.write().expect("views lock").install_index(built);
                shared.metrics.index_build_seconds.observe(took.as_secs_f64());
                tracing::info!(space, nodes, ?took, "built a space's nearest-neighbour index");
            });
            if let Err(e) = spawned {
                tracing::error!(error = %e, "could not start an index build; the space is read exactly");
            }
        }
    }

    /// The views, read-locked (the views sink waits while this is held: keep it short).
    pub fn views(&self) -> std::sync::RwLockReadGuard<'_, Views> {
        self.views.read().expect("views lock")
    }

    /// The last epoch the views reflect in full, if any.
    pub fn as_of(&self) -> Option<u64> {
        *self.as_of.borrow()
    }

    /// The last epoch whose hierarchy and summaries the views reflect, if any.
    pub fn hierarchy_as_of(&self) -> Option<u64> {
        *self.hierarchy_as_of.borrow()
    }

    /// Whether the views reflect `epoch` in full: layer 0 and events, and the hierarchy (on a follower process, which
    /// has no views, layer 0's frontier alone).
    pub fn reflects(&self, epoch: u64) -> bool {
        let reached = |a: Option<u64>| a.is_some_and(|a| a >= epoch);
        reached(self.as_of()) && (!self.place.leads() || reached(self.hierarchy_as_of()))
    }

    /// Wakes on every change of [`Shared::hierarchy_as_of`].
    pub fn watch_hierarchy_as_of(&self) -> watch::Receiver<Option<u64>> {
        self.hierarchy_as_of.subscribe()
    }

    /// A sender into the structure (on the leading process, until the engine stops).
    pub(super) fn structure_sender(&self) -> Option<std::sync::mpsc::Sender<super::structure::StructureInput>> {
        self.structure.lock().expect("structure lock").clone()
    }

    /// Lets go of the engine's own sender: once the workers' are gone too, the structure finishes and ends.
    pub(super) fn close_structure(&self) {
        self.structure.lock().expect("structure lock").take();
    }

    /// The structure has applied what layer 0 held at `through`.
    pub(super) fn structure_advanced(&self, through: Option<u64>) {
        self.hierarchy_as_of.send_if_modified(|h| {
            let changed = through > *h;
            *h = through.max(*h);
            changed
        });
        let lag = self.as_of().zip(through).map_or(0, |(a, h)| a.saturating_sub(h));
        self.metrics.structure_lag_epochs.set(lag as i64);
    }

    /// Wakes on every change of [`Shared::as_of`].
    pub fn watch_as_of(&self) -> watch::Receiver<Option<u64>> {
        self.as_of.subscribe()
    }

    /// Asks every thread of the engine to finish: sources stop reading, the drivers feed what is queued and close.
    pub fn stop(&self) {
        self.shutdown.store(true, Ordering::Relaxed);
    }

    /// Marks the engine failed (the first reason is kept) and stops it: its views no longer follow its input.
    pub fn fail(&self, why: String) {
        tracing::error!(reason = %why, "the engine failed; it stops");
        self.failure.lock().expect("failure lock").get_or_insert(why);
        self.stop();
    }

    /// Why the engine failed, if it did.
    pub fn failure(&self) -> Option<String> {
        self.failure.lock().expect("failure lock").clone()
    }

    pub fn stopping(&self) -> bool {
        self.shutdown.load(Ordering::Relaxed)
    }

    /// Whether a model (not the extractive backend) answers the memory's requests and the query-time stages.
    pub fn has_model(&self) -> bool {
        self.config.llm.has_model()
    }
}

/// The input log's records as queue items with the epochs they were logged at (a record the current limits reject
/// becomes an error row), the highest epoch, and each source's last logged offset (where it resumes).
fn replay_records(records: &[LoggedRecord], limits: &Limits) -> (Vec<(u64, Item)>, Option<u64>, HashMap<String, u64>) {
    let mut items = Vec::new();
    let mut max_epoch = None;
    let mut resume: HashMap<String, u64> = HashMap::new();
    for r in records {
        max_epoch = max_epoch.max(Some(r.epoch));
        if let (Some(src), Some(off)) = (&r.source, r.offset) {
            let e = resume.entry(src.clone()).or_default();
            *e = (*e).max(off);
        }
        if r.record.is_null() {
            continue;
        }
        match operators::record::from_value(r.record.clone(), Some(&r.space), limits) {
            Ok(rec) => items.push((r.epoch, Item::Record(rec))),
            // Logged records were valid when logged; a config change (smaller limits) can reject them now.
            Err(e) => items.push((
                r.epoch,
                Item::Reject(ErrorRow {
                    source: "replay".into(),
                    reason: e.to_string(),
                    raw: r.record.to_string().chars().take(ERROR_RAW_CHARS).collect(),
                    space: (!r.space.is_empty()).then(|| r.space.clone()),
                }),
            )),
        }
    }
    (items, max_epoch, resume)
}

/// Compacts the input log behind checkpoint `c` (see `compact.rs`) when enough of it is superseded: the log is
/// rewritten, then the checkpoint with the records it now counts. A rewrite that fails leaves the log as it was (a
/// warning); a checkpoint that cannot be written after it is only out of step on disk: this start uses it from
/// memory, and the next checkpoint replaces it. Returns the log's items when it was rewritten.
fn compact_behind(
    dir: &std::path::Path,
    rows: &[LoggedRecord],
    c: &mut super::checkpoint::Checkpoint,
    config: &Config,
    metrics: &Metrics,
) -> Option<Vec<(u64, Item)>> {
    let limits = config.limits();
    let t = Instant::now();
    let compacted = super::compact::compact(rows, c.epoch, &limits);
    if rows.is_empty() || (compacted.dropped as f64) < config.checkpoint.compact_min_share * rows.len() as f64 {
        return None;
    }
    let log = dir.join("input.log");
    if let Err(e) = InputLog::rewrite(&log, &compacted.rows) {
        tracing::warn!(path = %log.display(), error = %e, "could not compact the input log; it stays as it was");
        return None;
    }
    let (kept, _, _) = replay_records(&compacted.rows, &limits);
    c.records = kept.iter().filter(|(e, i)| *e <= c.epoch && matches!(i, Item::Record(_))).count() as u64;
    if let Err(e) = c.write(&dir.join("checkpoint.bin")) {
        tracing::warn!(error = %e, "could not write the checkpoint after compacting the input log");
    }
    metrics.input_log_compacted.inc_by(compacted.dropped as u64);
    tracing::info!(epoch = c.epoch, lines = rows.len(), dropped = compacted.dropped, took = ?t.elapsed(),
        "compacted the input log behind the checkpoint");
    Some(kept)
}

/// The checkpoint read from `dir` (`read`), if it is one this memory can start from.
fn load_checkpoint(
    dir: &std::path::Path,
    read: Result<Option<super::checkpoint::Checkpoint>, String>,
    records: &[(u64, Item)],
    replies: usize,
) -> Option<super::checkpoint::Checkpoint> {
    let path = dir.join("checkpoint.bin");
    match read {
        Ok(None) => None,
        Ok(Some(c)) => {
            let logged = records.iter().filter(|(e, i)| *e <= c.epoch && matches!(i, Item::Record(_))).count();
            if logged as u64 == c.records && c.replies as usize <= replies {
                return Some(c);
            }
            tracing::warn!(path = %path.display(), epoch = c.epoch, records = c.records, logged_records = logged,
                replies = c.replies, logged_replies = replies,
                "the checkpoint does not match the logs (lost or replaced); rebuilding from the logs");
            None
        }
        Err(why) => {
            tracing::warn!(path = %path.display(), %why, "the checkpoint cannot be used; rebuilding from the logs");
            None
        }
    }
}

/// `text` cut to `max` characters, with `…` where it was cut.
fn cut(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((i, _)) => format!("{}…", &text[..i]),
        None => text.to_string(),
    }
}
