//! Configuration: one serde tree; embedded `default.toml`, then a file, then `ENGRAM__*` environment variables,
//! then flags. Unknown keys are rejected naming the key; every invalid value is reported at once.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use figment::providers::{Format, Serialized, Toml};
use figment::Figment;
use serde::{Deserialize, Serialize};

use operators::SimilarityParams;

pub const DEFAULT_TOML: &str = include_str!("default.toml");

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Config {
    pub data_dir: PathBuf,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub http: HttpConfig,
    pub ingest: IngestConfig,
    pub embedder: EmbedderConfig,
    pub events: EventsConfig,
    pub similarity: SimilarityParams,
    pub hierarchy: HierarchyConfig,
    pub llm: LlmConfig,
    pub kafka: KafkaConfig,
    pub query: QueryConfig,
    pub auth: crate::auth::AuthConfig,
    pub mcp: McpConfig,
    pub checkpoint: CheckpointConfig,
    pub allocator: AllocatorConfig,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct AllocatorConfig {
    /// How long freed memory stays with the allocator (mimalloc's `purge_delay`) before it goes back to the system;
    /// `0s`: at once.
    #[serde(with = "humantime_serde")]
    pub purge_delay: Duration,
}

impl AllocatorConfig {
    /// Sets the allocator's options for this process (the last call wins). Without the `mimalloc` feature the
    /// system allocator is in use and this does nothing.
    #[allow(unsafe_code)]
    pub fn apply(&self) {
        #[cfg(feature = "mimalloc")]
        {
            /// `mi_option_purge_delay` in mimalloc's `mi_option_t` (libmimalloc-sys names no constant for it).
            const PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;
            let ms = self.purge_delay.as_millis().min(i32::MAX as u128) as std::ffi::c_long;
            // SAFETY: an aligned word store into mimalloc's option table (no allocation or pointer is involved);
            // a thread purging at that moment reads the old delay or the new one, both valid.
            unsafe { libmimalloc_sys::mi_option_set(PURGE_DELAY, ms) };
        }
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct CheckpointConfig {
    /// How often the views are checkpointed (and at every clean stop); `0s`: never.
    #[serde(with = "humantime_serde")]
    pub interval: Duration,
    /// A start from a checkpoint compacts the input log behind it once at least this share of the log's lines are
    /// records replaced or deleted by then (or the deletes themselves).
    pub compact_min_share: f64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct McpConfig {
    /// `Host` values `/mcp` accepts (DNS-rebinding protection); empty: any.
    #[serde(deserialize_with = "list_or_csv")]
    pub allowed_hosts: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct HttpConfig {
    /// Longest an API request may take, body read included.
    #[serde(with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Most API requests served at once.
    pub max_concurrent_requests: usize,
    /// Longest a client may take to send a request's headers (a new connection's, or the next one on a kept-alive
    /// connection); past it the connection is closed.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// Most open API connections; past it new ones wait to be accepted.
    pub max_connections: usize,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct IngestConfig {
    pub max_record_bytes: usize,
    pub max_body_bytes: usize,
    pub chunk_tokens: usize,
    #[serde(with = "humantime_serde")]
    pub epoch_interval: Duration,
    pub epoch_max_records: usize,
    pub max_id_bytes: usize,
    /// Most records in one HTTP ingest request.
    pub max_records_per_request: usize,
    /// Most rejects an ingest response lists (the rest are counted).
    pub max_rejects_listed: usize,
    /// Longest reject reason kept.
    pub max_reason_chars: usize,
    /// Most bytes of records waiting in the ingest queue (with `epoch-max-records` × 10 records): past either, HTTP
    /// ingest is answered 503 and the sources wait.
    pub max_queue_bytes: usize,
    /// Most epochs fed to the dataflow and not yet in the views: past it the queue waits (and fills, to its caps).
    pub max_epochs_in_flight: usize,
    /// Most spaces this process holds: a record for a new space past it is refused (HTTP 403 `space_quota`; from a
    /// source, dead-lettered). 0: no limit.
    pub max_spaces: usize,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EmbedderKind {
    Hash,
    Local,
    Openai,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct EmbedderConfig {
    pub kind: EmbedderKind,
    /// Dimension of the hash embedder (the others have their model's).
    pub dim: usize,
    /// `local`: a directory with config.json, model.safetensors, tokenizer.json (scripts/fetch-model.sh).
    pub model_dir: String,
    /// `openai`: up to and including /v1.
    pub base_url: String,
    pub model: String,
    /// `openai`: empty means the OPENAI_API_KEY environment variable, if set.
    pub api_key: String,
    /// Texts per forward pass (`local`) or per request (`openai`).
    pub batch: usize,
    pub requests_per_minute: u32,
    pub tokens_per_minute: u32,
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct EventsConfig {
    /// Events of one space whose (summary | people) vectors reach this cosine merge (CompassMem: 0.88).
    pub merge_threshold: f32,
    /// With a model: the longest a live session's newest turns wait before the model is asked to segment it again
    /// (until then they are in the memory as extractive events).
    #[serde(with = "humantime_serde")]
    pub max_latency: Duration,
    /// With a model: event pairs of a space at cosine ≥ `judge-threshold` but below `merge-threshold` go to the
    /// model's co-reference judge (same_event → merged, has_overlap → an `overlap` relation).
    pub judge: bool,
    pub judge_threshold: f32,
    /// Each event is linked to its this-many nearest events at `merge-threshold` or above (the similarity index).
    pub merge_neighbours: usize,
    /// Extractive relations: how many earlier events of its session an event looks back at.
    pub relation_window: usize,
    /// Extractive relations: the most cause, motive and shared-participant links an event keeps (the strongest).
    pub max_relations_per_event: usize,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct HierarchyConfig {
    pub max_layers: usize,
    pub max_cluster_size: usize,
    pub lpa_rounds: usize,
    /// Layers 1..=this cluster by label propagation, the layers above by strongest-link components.
    pub lpa_layers: usize,
    /// Layers 1..=this split each node into ego-network replicas (overlapping clusters); above, clusters partition.
    pub replica_layers: usize,
    pub min_shrink: f64,
    /// Neighbours that share no neighbour with the rest of a node's ego network are one context (one replica)
    /// together; `false` gives each its own replica, as CAM does.
    pub pool_loose_neighbours: bool,
    /// Each cluster keeps its this-many strongest links in its layer's graph.
    pub max_degree: usize,
    /// A cluster is summarised once its membership has been unchanged this long.
    #[serde(with = "humantime_serde")]
    pub summary_debounce: Duration,
    /// Word budget of an extractive summary.
    pub summary_words: usize,
    /// A cluster whose content grew reuses its earlier summary while that summary covers at least this share of its
    /// members and saw nothing the cluster has lost (see `SummaryCache`); 1 asks the model on every change.
    pub summary_coverage: f64,
}

impl HierarchyConfig {
    pub fn params(&self) -> operators::hierarchy::HierarchyParams {
        operators::hierarchy::HierarchyParams {
            max_layers: self.max_layers,
            max_cluster_size: self.max_cluster_size,
            lpa_rounds: self.lpa_rounds,
            lpa_layers: self.lpa_layers,
            replica_layers: self.replica_layers,
            min_shrink: self.min_shrink,
            pool_loose_neighbours: self.pool_loose_neighbours,
            max_degree: self.max_degree,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LlmBackend {
    Extractive,
    Openai,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct LlmConfig {
    pub backend: LlmBackend,
    pub base_url: String,
    pub model: String,
    /// Empty: taken from the OPENAI_API_KEY environment variable, if set.
    pub api_key: String,
    pub requests_per_minute: u32,
    pub tokens_per_minute: u32,
    pub max_in_flight: usize,
    #[serde(with = "humantime_serde")]
    pub timeout: Duration,
    pub max_retries: u32,
    /// auto (probed at start) | json-schema | json-object-schema (llama.cpp's servers) | json-object (the schema in
    /// the prompt only).
    pub response_format: ResponseFormatName,
    /// Failed attempts at one request (a reply that is not the JSON asked for after the repair round, or an error
    /// after the retries) before its extractive answer is logged in its place.
    pub max_failures: u32,
    pub max_tokens: u32,
    /// While more than this many layer-0 node changes wait for the hierarchy (a load it is working through), no
    /// cluster summary is asked: its clusters are still moving.
    pub summary_hold_backlog: u64,
}

impl LlmConfig {
    /// Whether a model (not the built-in extractive backend) answers the memory's requests and the query stages.
    pub fn has_model(&self) -> bool {
        self.backend != LlmBackend::Extractive
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ResponseFormatName {
    Auto,
    JsonSchema,
    JsonObjectSchema,
    JsonObject,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct KafkaConfig {
    pub brokers: String,
    /// A list, or one comma-separated string (as `ENGRAM__KAFKA__TOPICS=a,b` gives).
    #[serde(deserialize_with = "list_or_csv")]
    pub topics: Vec<String>,
    pub group_id: String,
    /// Upserts and retractions of nodes, edges, clusters and summaries, keyed by space (empty: off).
    pub changes_topic: String,
    /// Rejected inputs with their reasons (empty: off; the dead-letter file is always written).
    pub dead_letter_topic: String,
    /// The LLM response log as a compacted topic, read back at start (empty: off; the file log is always written).
    pub responses_topic: String,
}

fn list_or_csv<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum ListOrCsv {
        List(Vec<String>),
        Csv(String),
    }
    Ok(match ListOrCsv::deserialize(d)? {
        ListOrCsv::List(l) => l,
        ListOrCsv::Csv(s) => s.split(',').map(|t| t.trim().to_string()).filter(|t| !t.is_empty()).collect(),
    })
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct QueryConfig {
    pub default_k: usize,
    pub default_budget_words: usize,
    #[serde(with = "humantime_serde")]
    pub max_wait: Duration,
    /// Longest question, in characters.
    pub max_query_chars: usize,
    /// How many distinct topics among the top events seed `compass` with their other members.
    pub compass_topics: usize,
    /// `compass` in a long session (a meeting, a long document): the events next to an explored event, up to
    /// `compass-span-hops` either way, are read at `compass-span-decay` per hop, and every explored event's turns at
    /// `compass-span-lift` of its score. A session of fewer than `compass-span-min-session` turns is read as it is
    /// (0 hops: off everywhere).
    pub compass_span_hops: usize,
    pub compass_span_decay: f32,
    pub compass_span_lift: f32,
    pub compass_span_min_session: usize,
    /// Largest `k` a query may ask for.
    pub max_k: usize,
    /// Largest `budget_words` a query may ask for.
    pub max_budget_words: usize,
    /// Most subgoals a question may split into without a model (each is a pass over the space).
    pub max_subgoals: usize,
    /// A space with at least this many layer-0 nodes is read through a nearest-neighbour index; a smaller one
    /// exactly, node by node.
    pub exhaustive_below: usize,
    /// Over an indexed space: the nearest nodes by cosine, and the best by BM25, that retrieval reads (each).
    pub candidates: usize,
    /// The index (HNSW): links per node, and candidate lists while inserting and searching.
    pub ann_max_connections: usize,
    pub ann_ef_construction: usize,
    pub ann_ef_search: usize,
}

impl QueryConfig {
    /// `compass`'s parameters.
    pub fn compass(&self) -> crate::query::CompassParams {
        crate::query::CompassParams {
            topics: self.compass_topics,
            span_hops: self.compass_span_hops,
            span_decay: self.compass_span_decay,
            span_lift: self.compass_span_lift,
            span_min_session: self.compass_span_min_session,
        }
    }

    /// The views' index parameters.
    pub fn ann(&self) -> crate::ann::AnnParams {
        crate::ann::AnnParams {
            exhaustive_below: self.exhaustive_below,
            max_connections: self.ann_max_connections,
            ef_construction: self.ann_ef_construction,
            ef_search: self.ann_ef_search,
            candidates: self.candidates,
            build_aside: false,
        }
    }
}

/// Values given on the command line; each overrides its key.
#[derive(Default, Debug, Clone)]
pub struct Overrides {
    pub data_dir: Option<PathBuf>,
    pub listen: Option<SocketAddr>,
    pub admin: Option<SocketAddr>,
}

#[derive(Debug, thiserror::Error)]
#[error("invalid configuration:\n{}", .0.iter().map(|e| format!("  - {e}")).collect::<Vec<_>>().join("\n"))]
pub struct ConfigError(pub Vec<String>);

impl Config {
    /// Loads the layered configuration. `env` is the environment to read (the process's in production, a fixed
    /// list in tests).
    pub fn load(
        file: Option<&Path>,
        env: impl IntoIterator<Item = (String, String)>,
        overrides: &Overrides,
    ) -> Result<Config, ConfigError> {
        let mut fig = Figment::from(Toml::string(DEFAULT_TOML));
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .map_err(|e| ConfigError(vec![format!("config file {}: {e}", path.display())]))?;
            fig = fig.merge(Toml::string(&text));
        }
        // ENGRAM__SIMILARITY__THETA → similarity.theta; ENGRAM__DATA_DIR → data-dir. Values parse as figment's Env
        // parses them (numbers, booleans, arrays, else strings).
        for (k, v) in env {
            if let Some(rest) = k.strip_prefix("ENGRAM__") {
                let key = rest.to_lowercase().replace("__", ".").replace('_', "-");
                let value: figment::value::Value = v.parse().unwrap_or_else(|never| match never {});
                fig = fig.merge(Serialized::default(&key, value));
            }
        }
        if let Some(d) = &overrides.data_dir {
            fig = fig.merge(Serialized::default("data-dir", d));
        }
        if let Some(l) = &overrides.listen {
            fig = fig.merge(Serialized::default("listen", l.to_string()));
        }
        if let Some(a) = &overrides.admin {
            fig = fig.merge(Serialized::default("admin", a.to_string()));
        }
        let config: Config = fig.extract().map_err(|e| ConfigError(e.into_iter().map(|e| e.to_string()).collect()))?;
        let errs = config.validate();
        if errs.is_empty() {
            Ok(config)
        } else {
            Err(ConfigError(errs))
        }
    }

    /// Every semantic problem, each naming its key.
    pub fn validate(&self) -> Vec<String> {
        let mut errs = self.similarity.validate();
        if let Err(e) = crate::auth::Access::load(&self.auth) {
            errs.extend(e);
        }
        errs.extend(self.hierarchy.params().validate());
        if !(self.hierarchy.summary_coverage > 0.0 && self.hierarchy.summary_coverage <= 1.0) {
            errs.push(format!("hierarchy.summary-coverage must be in (0, 1], got {}", self.hierarchy.summary_coverage));
        }
        if self.allocator.purge_delay > Duration::from_secs(3600) {
            errs.push(format!("allocator.purge-delay must be at most 1h, got {:?}", self.allocator.purge_delay));
        }
        if !(self.checkpoint.compact_min_share > 0.0 && self.checkpoint.compact_min_share <= 1.0) {
            errs.push(format!(
                "checkpoint.compact-min-share must be in (0, 1], got {}",
                self.checkpoint.compact_min_share
            ));
        }
        if self.hierarchy.summary_words == 0 {
            errs.push("hierarchy.summary-words must be positive".into());
        }
        let i = &self.ingest;
        if i.max_record_bytes < 64 {
            errs.push(format!("ingest.max-record-bytes = {} is too small (at least 64)", i.max_record_bytes));
        }
        if i.max_body_bytes < i.max_record_bytes {
            errs.push("ingest.max-body-bytes must be at least ingest.max-record-bytes".into());
        }
        if i.chunk_tokens == 0 {
            errs.push("ingest.chunk-tokens must be positive".into());
        }
        if i.epoch_interval.is_zero() {
            errs.push("ingest.epoch-interval must be positive (e.g. \"100ms\")".into());
        }
        if i.epoch_max_records == 0 {
            errs.push("ingest.epoch-max-records must be positive".into());
        }
        if i.max_id_bytes == 0 {
            errs.push("ingest.max-id-bytes must be positive".into());
        }
        if i.max_records_per_request == 0 {
            errs.push("ingest.max-records-per-request must be positive".into());
        }
        if i.max_reason_chars < 16 {
            errs.push(format!("ingest.max-reason-chars = {} must be at least 16", i.max_reason_chars));
        }
        if self.http.request_timeout <= self.query.max_wait {
            errs.push(format!(
                "http.request-timeout = {:?} must be longer than query.max-wait = {:?}",
                self.http.request_timeout, self.query.max_wait
            ));
        }
        if self.http.max_concurrent_requests == 0 {
            errs.push("http.max-concurrent-requests must be positive".into());
        }
        if self.http.header_read_timeout.is_zero() {
            errs.push("http.header-read-timeout must be positive".into());
        }
        if self.http.max_connections == 0 || self.http.max_connections < self.http.max_concurrent_requests {
            errs.push(format!(
                "http.max-connections = {} must be positive and at least http.max-concurrent-requests = {}",
                self.http.max_connections, self.http.max_concurrent_requests
            ));
        }
        if i.max_queue_bytes < i.max_body_bytes {
            errs.push(format!(
                "ingest.max-queue-bytes = {} must be at least ingest.max-body-bytes = {} (one full request must fit)",
                i.max_queue_bytes, i.max_body_bytes
            ));
        }
        if i.max_epochs_in_flight == 0 {
            errs.push("ingest.max-epochs-in-flight must be positive".into());
        }
        if self.query.max_query_chars == 0 {
            errs.push("query.max-query-chars must be positive".into());
        }
        if !(self.events.judge_threshold > 0.0 && self.events.judge_threshold <= self.events.merge_threshold) {
            errs.push(format!(
                "events.judge-threshold = {} must be in (0, events.merge-threshold = {}]",
                self.events.judge_threshold, self.events.merge_threshold
            ));
        }
        if self.events.max_latency < Duration::from_millis(100) {
            errs.push(format!("events.max-latency = {:?} must be at least 100ms", self.events.max_latency));
        }
        if !(1..=1000).contains(&self.events.merge_neighbours) {
            errs.push(format!("events.merge-neighbours = {} must be in 1..=1000", self.events.merge_neighbours));
        }
        if !(1..=1000).contains(&self.events.relation_window) {
            errs.push(format!("events.relation-window = {} must be in 1..=1000", self.events.relation_window));
        }
        if !(1..=1000).contains(&self.events.max_relations_per_event) {
            errs.push(format!(
                "events.max-relations-per-event = {} must be in 1..=1000",
                self.events.max_relations_per_event
            ));
        }
        if !(self.events.merge_threshold > 0.0 && self.events.merge_threshold <= 1.0) {
            errs.push(format!("events.merge-threshold = {} must be in (0, 1]", self.events.merge_threshold));
        }
        if !(8..=65536).contains(&self.embedder.dim) {
            errs.push(format!("embedder.dim = {} must be in 8..=65536", self.embedder.dim));
        }
        let e = &self.embedder;
        match e.kind {
            EmbedderKind::Hash => {}
            EmbedderKind::Local => {
                if !cfg!(feature = "local-embedder") {
                    errs.push(
                        "embedder.kind = \"local\": this binary was built without the local-embedder feature".into(),
                    );
                } else if e.model_dir.is_empty() {
                    errs.push("embedder.model-dir must name the model directory when embedder.kind = \"local\" (scripts/fetch-model.sh fetches one)".into());
                } else if !std::path::Path::new(&e.model_dir).join("model.safetensors").is_file() {
                    errs.push(format!(
                        "embedder.model-dir = {:?} has no model.safetensors (scripts/fetch-model.sh fetches one)",
                        e.model_dir
                    ));
                }
            }
            EmbedderKind::Openai => {
                if !(e.base_url.starts_with("http://") || e.base_url.starts_with("https://")) {
                    errs.push(format!(
                        "embedder.base-url = {:?} must be an http(s) URL up to /v1 when embedder.kind = \"openai\"",
                        e.base_url
                    ));
                }
                if e.model.is_empty() {
                    errs.push("embedder.model must be set when embedder.kind = \"openai\"".into());
                }
            }
        }
        if e.batch == 0 || e.requests_per_minute == 0 || e.tokens_per_minute == 0 || e.timeout.is_zero() {
            errs.push("embedder.batch, embedder.requests-per-minute, embedder.tokens-per-minute and embedder.timeout must be positive".into());
        }
        if self.llm.backend == LlmBackend::Openai {
            if !(self.llm.base_url.starts_with("http://") || self.llm.base_url.starts_with("https://")) {
                errs.push(format!(
                    "llm.base-url = {:?} must be an http(s) URL up to /v1 when llm.backend = \"openai\"",
                    self.llm.base_url
                ));
            }
            if self.llm.model.is_empty() {
                errs.push("llm.model must be set when llm.backend = \"openai\"".into());
            }
        }
        if self.llm.max_in_flight == 0 {
            errs.push("llm.max-in-flight must be positive".into());
        }
        if self.llm.max_failures == 0 {
            errs.push("llm.max-failures must be at least 1".into());
        }
        if self.llm.requests_per_minute == 0 || self.llm.tokens_per_minute == 0 {
            errs.push("llm.requests-per-minute and llm.tokens-per-minute must be positive".into());
        }
        if self.llm.timeout.is_zero() {
            errs.push("llm.timeout must be positive".into());
        }
        if self.llm.max_tokens == 0 {
            errs.push("llm.max-tokens must be positive".into());
        }
        let k = &self.kafka;
        let any_topic = !k.topics.is_empty()
            || !k.changes_topic.is_empty()
            || !k.dead_letter_topic.is_empty()
            || !k.responses_topic.is_empty();
        if any_topic && !cfg!(feature = "kafka") {
            errs.push("kafka: this binary was built without the kafka feature".into());
        }
        if any_topic && k.brokers.trim().is_empty() {
            errs.push("kafka.brokers must be set (host:port,…) when a Kafka topic is configured".into());
        }
        if !k.topics.is_empty() && k.group_id.trim().is_empty() {
            errs.push("kafka.group-id must be set when kafka.topics is".into());
        }
        if k.topics.iter().any(|t| t.trim().is_empty()) {
            errs.push("kafka.topics must not contain an empty name".into());
        }
        if self.query.default_k == 0 {
            errs.push("query.default-k must be positive".into());
        }
        if self.query.default_budget_words == 0 {
            errs.push("query.default-budget-words must be positive".into());
        }
        let q = &self.query;
        if q.exhaustive_below < 1024 {
            errs.push(format!("query.exhaustive-below = {} must be at least 1024", q.exhaustive_below));
        }
        if !(16..=100_000).contains(&q.candidates) {
            errs.push(format!("query.candidates = {} must be in 16..=100000", q.candidates));
        }
        if !(2..=256).contains(&q.ann_max_connections) {
            errs.push(format!("query.ann-max-connections = {} must be in 2..=256", q.ann_max_connections));
        }
        if !(1..=10_000).contains(&q.ann_ef_construction) || !(1..=10_000).contains(&q.ann_ef_search) {
            errs.push(format!(
                "query.ann-ef-construction = {} and query.ann-ef-search = {} must be in 1..=10000",
                q.ann_ef_construction, q.ann_ef_search
            ));
        }
        if !(1..=100_000).contains(&q.max_k) || q.default_k > q.max_k {
            errs.push(format!(
                "query.max-k = {} must be in 1..=100000 and at least query.default-k = {}",
                q.max_k, q.default_k
            ));
        }
        if !(1..=10_000_000).contains(&q.max_budget_words) || q.default_budget_words > q.max_budget_words {
            errs.push(format!(
                "query.max-budget-words = {} must be in 1..=10000000 and at least query.default-budget-words = {}",
                q.max_budget_words, q.default_budget_words
            ));
        }
        if !(1..=1000).contains(&q.max_subgoals) {
            errs.push(format!("query.max-subgoals = {} must be in 1..=1000", q.max_subgoals));
        }
        if q.compass_span_hops > 1000 {
            errs.push(format!("query.compass-span-hops = {} must be in 0..=1000", q.compass_span_hops));
        }
        if !(q.compass_span_decay > 0.0 && q.compass_span_decay <= 1.0) {
            errs.push(format!("query.compass-span-decay = {} must be in (0, 1]", q.compass_span_decay));
        }
        if !(0.0..=1.0).contains(&q.compass_span_lift) {
            errs.push(format!("query.compass-span-lift = {} must be in [0, 1]", q.compass_span_lift));
        }
        errs
    }

    pub fn limits(&self) -> operators::Limits {
        operators::Limits { max_record_bytes: self.ingest.max_record_bytes, max_id_bytes: self.ingest.max_id_bytes }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(file: Option<&str>, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("engram.toml");
        if let Some(text) = file {
            std::fs::write(&path, text).unwrap();
        }
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        Config::load(file.map(|_| path.as_path()), env, &Overrides::default())
    }

    #[test]
    fn defaults_load_and_validate() {
        let c = load(None, &[]).unwrap();
        assert_eq!(c.listen.port(), 7600);
        assert_eq!(c.similarity.k, 10);
        assert_eq!(c.ingest.epoch_interval, Duration::from_millis(100));
    }

    #[test]
    fn layering_file_then_env_then_flags() {
        let c = load(Some("[similarity]\ntheta = 0.5\nk = 7\n"), &[("ENGRAM__SIMILARITY__K", "3")]).unwrap();
        assert_eq!(c.similarity.theta, 0.5);
        assert_eq!(c.similarity.k, 3);
        let c = load(None, &[("ENGRAM__INGEST__EPOCH_INTERVAL", "250ms"), ("ENGRAM__DATA_DIR", "/tmp/x")]).unwrap();
        assert_eq!(c.ingest.epoch_interval, Duration::from_millis(250));
        assert_eq!(c.data_dir, PathBuf::from("/tmp/x"));
        let o = Overrides { listen: Some("127.0.0.1:9999".parse().unwrap()), ..Overrides::default() };
        let c = Config::load(None, vec![("ENGRAM__LISTEN".into(), "127.0.0.1:8888".into())], &o).unwrap();
        assert_eq!(c.listen.port(), 9999);
    }

    #[test]
    fn event_settings_are_checked() {
        let c = load(None, &[("ENGRAM__EVENTS__MAX_LATENCY", "2s"), ("ENGRAM__EVENTS__JUDGE", "true")]).unwrap();
        assert_eq!(c.events.max_latency, Duration::from_secs(2));
        assert!(c.events.judge);
        let e = load(Some("[events]\nmax-latency = \"10ms\"\njudge-threshold = 0.95\n"), &[]).unwrap_err().to_string();
        assert!(e.contains("events.max-latency") && e.contains("events.judge-threshold"), "{e}");
        let e = load(None, &[("ENGRAM__EVENTS__JUDGE", "maybe")]).unwrap_err().to_string();
        assert!(e.contains("judge"), "{e}");
    }

    #[test]
    fn request_bounds_are_checked() {
        let e = load(
            Some(concat!(
                "[http]\nrequest-timeout = \"10s\"\nmax-concurrent-requests = 0\nheader-read-timeout = \"0s\"\n",
                "max-connections = 0\n",
                "[ingest]\nmax-records-per-request = 0\nmax-reason-chars = 3\nmax-queue-bytes = 10\n",
                "max-epochs-in-flight = 0\n",
                "[query]\nmax-query-chars = 0\nmax-k = 0\nmax-budget-words = 0\nmax-subgoals = 0\n",
                "compass-span-hops = 1001\ncompass-span-decay = 0.0\ncompass-span-lift = 1.5\n"
            )),
            &[],
        )
        .unwrap_err();
        let msg = e.to_string();
        for key in [
            "http.request-timeout",
            "http.max-concurrent-requests",
            "ingest.max-records-per-request",
            "ingest.max-reason-chars",
            "query.max-query-chars",
            "http.header-read-timeout",
            "http.max-connections",
            "ingest.max-queue-bytes",
            "ingest.max-epochs-in-flight",
            "query.max-k",
            "query.max-budget-words",
            "query.max-subgoals",
            "query.compass-span-hops",
            "query.compass-span-decay",
            "query.compass-span-lift",
        ] {
            assert!(msg.contains(key), "{key}: {msg}");
        }
        let e = load(None, &[("ENGRAM__HTTP__REQUEST_TIMEOUT", "soon")]).unwrap_err().to_string();
        assert!(e.contains("request-timeout") || e.contains("request_timeout"), "{e}");
    }

    #[test]
    fn scale_bounds_are_checked() {
        let e = load(
            Some(concat!(
                "[similarity]\nmax-reverse-classes = 4\nreverse-scan = 100001\n",
                "[events]\nmerge-neighbours = 0\nrelation-window = 0\nmax-relations-per-event = 5000\n",
                "[hierarchy]\nmax-degree = 0\nlpa-layers = 33\nreplica-layers = 33\n",
                "[query]\nexhaustive-below = 10\ncandidates = 1\nann-max-connections = 1\nann-ef-construction = 0\n"
            )),
            &[],
        )
        .unwrap_err();
        let msg = e.to_string();
        for key in [
            "similarity.max-reverse-classes",
            "similarity.reverse-scan",
            "events.merge-neighbours",
            "events.relation-window",
            "events.max-relations-per-event",
            "hierarchy.max-degree",
            "hierarchy.lpa-layers",
            "hierarchy.replica-layers",
            "query.exhaustive-below",
            "query.candidates",
            "query.ann-max-connections",
            "query.ann-ef-construction",
        ] {
            assert!(msg.contains(key), "{key}: {msg}");
        }
        let e = load(None, &[("ENGRAM__EVENTS__RELATION_WINDOW", "many")]).unwrap_err().to_string();
        assert!(e.contains("relation"), "{e}");
        let e = load(None, &[("ENGRAM__HIERARCHY__POOL_LOOSE_NEIGHBOURS", "maybe")]).unwrap_err().to_string();
        assert!(e.contains("pool-loose-neighbours") || e.contains("pool_loose_neighbours"), "{e}");
        let e = load(None, &[("ENGRAM__HIERARCHY__LPA_LAYERS", "two")]).unwrap_err().to_string();
        assert!(e.contains("lpa-layers") || e.contains("lpa_layers"), "{e}");
        let e = load(None, &[("ENGRAM__HIERARCHY__REPLICA_LAYERS", "all")]).unwrap_err().to_string();
        assert!(e.contains("replica-layers") || e.contains("replica_layers"), "{e}");
        let e = load(None, &[("ENGRAM__SIMILARITY__REVERSE_SCAN", "-1")]).unwrap_err().to_string();
        assert!(e.contains("reverse-scan") || e.contains("reverse_scan"), "{e}");
        let e = load(None, &[("ENGRAM__QUERY__ANN_EF_SEARCH", "0")]).unwrap_err().to_string();
        assert!(e.contains("query.ann-ef-search"), "{e}");
        let e = load(None, &[("ENGRAM__LLM__MAX_FAILURES", "0")]).unwrap_err().to_string();
        assert!(e.contains("llm.max-failures"), "{e}");
        let e = load(None, &[("ENGRAM__LLM__RESPONSE_FORMAT", "xml")]).unwrap_err().to_string();
        assert!(e.contains("response-format") || e.contains("response_format"), "{e}");
        let e = load(None, &[("ENGRAM__CHECKPOINT__INTERVAL", "often")]).unwrap_err().to_string();
        assert!(e.contains("interval"), "{e}");
    }

    #[test]
    fn tokens_are_checked_with_the_config() {
        let hash = crate::auth::hash_token("t");
        let ok =
            format!("[[auth.tokens]]\nname = \"desk\"\nhash = \"{hash}\"\nscope = \"write\"\nspaces = [\"news\"]\n");
        let c = load(Some(&ok), &[]).unwrap();
        assert_eq!(c.auth.tokens.len(), 1);
        let e = load(Some(&ok.replace("write", "owner")), &[]).unwrap_err().to_string();
        assert!(e.contains("owner"), "{e}");
        let e = load(Some(&ok.replace(&hash, "t")), &[]).unwrap_err().to_string();
        assert!(e.contains("auth token `desk`") && e.contains("64 hex digits"), "{e}");
        let e = load(None, &[("ENGRAM__AUTH__TOKENS_FILE", "/nonexistent/tokens.toml")]).unwrap_err().to_string();
        assert!(e.contains("auth.tokens-file") && e.contains("cannot read it"), "{e}");
        let c = load(None, &[("ENGRAM__AUTH__ALLOW_UNAUTHENTICATED", "true")]).unwrap();
        assert!(c.auth.allow_unauthenticated);
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = load(Some("[similarity]\nthetta = 0.5\n"), &[]).unwrap_err().to_string();
        assert!(e.contains("thetta"), "{e}");
        let e = load(None, &[("ENGRAM__SIMILARITY__BOGUS", "1")]).unwrap_err().to_string();
        assert!(e.contains("bogus"), "{e}");
    }

    #[test]
    fn bad_values_are_all_reported_with_their_keys() {
        let e = load(Some("[similarity]\ntheta = 1.5\nk = 0\n[ingest]\nchunk-tokens = 0\n"), &[]).unwrap_err();
        let msg = e.to_string();
        assert_eq!(e.0.len(), 3, "{msg}");
        for key in ["similarity.theta", "similarity.k", "ingest.chunk-tokens"] {
            assert!(msg.contains(key), "{msg} lacks {key}");
        }
        let e = load(Some("[ingest]\nepoch-interval = \"soon\"\n"), &[]).unwrap_err().to_string();
        assert!(e.contains("epoch-interval"), "{e}");
        let e = load(None, &[("ENGRAM__ALLOCATOR__PURGE_DELAY", "2h")]).unwrap_err().to_string();
        assert!(e.contains("allocator.purge-delay must be at most 1h"), "{e}");
        let e = load(Some("[allocator]\npurge-delay = 10\n"), &[]).unwrap_err().to_string();
        assert!(e.contains("purge-delay"), "{e}");
        let c = load(None, &[("ENGRAM__ALLOCATOR__PURGE_DELAY", "0s")]).unwrap();
        assert_eq!(c.allocator.purge_delay, Duration::ZERO);
        let e = load(Some("listen = 12\n"), &[]).unwrap_err().to_string();
        assert!(e.contains("listen"), "{e}");
        let e = load(None, &[("ENGRAM__HIERARCHY__MIN_SHRINK", "1.5")]).unwrap_err().to_string();
        assert!(e.contains("hierarchy.min-shrink"), "{e}");
        let e = load(Some("[hierarchy]\nmin-shrink = \"some\"\n"), &[]).unwrap_err().to_string();
        assert!(e.contains("min-shrink"), "{e}");
        for bad in ["0", "1.5", "-0.2"] {
            let e = load(None, &[("ENGRAM__HIERARCHY__SUMMARY_COVERAGE", bad)]).unwrap_err().to_string();
            assert!(e.contains("hierarchy.summary-coverage must be in (0, 1]"), "{bad}: {e}");
        }
        let e = load(None, &[("ENGRAM__HIERARCHY__SUMMARY_COVERAGE", "most")]).unwrap_err().to_string();
        assert!(e.contains("summary-coverage"), "{e}");
        assert!(load(None, &[("ENGRAM__HIERARCHY__SUMMARY_COVERAGE", "1")]).is_ok());
        for bad in ["0", "1.01", "-1"] {
            let e = load(None, &[("ENGRAM__CHECKPOINT__COMPACT_MIN_SHARE", bad)]).unwrap_err().to_string();
            assert!(e.contains("checkpoint.compact-min-share must be in (0, 1]"), "{bad}: {e}");
        }
        let e = load(Some("[checkpoint]\ncompact-min-share = \"half\"\n"), &[]).unwrap_err().to_string();
        assert!(e.contains("compact-min-share"), "{e}");
        let e = load(Some("this is not toml ["), &[]).unwrap_err().to_string();
        assert!(e.contains("TOML") || e.contains("expected"), "{e}");
    }
}
