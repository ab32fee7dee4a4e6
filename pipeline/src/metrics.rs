//! Prometheus metrics, served on the admin port. Names follow `engram_<noun>_<unit>`; labels stay low-cardinality
//! (never a space, document or node id). Counted once per batch, not once per record.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry,
};

pub struct Metrics {
    pub registry: Registry,
    pub records_in: IntCounterVec,
    pub records_rejected: IntCounterVec,
    pub epochs: IntCounter,
    pub epoch_records: Histogram,
    pub frontier_lag_epochs: IntGauge,
    pub frontier_lag_seconds: prometheus::Gauge,
    pub nodes: IntGauge,
    pub edges: IntGauge,
    pub spaces: IntGauge,
    pub query_duration: HistogramVec,
    pub clusters: IntGauge,
    pub summary_backlog: IntGauge,
    /// Cluster summaries served from an earlier summary that still holds (no model call).
    pub summaries_reused: IntCounter,
    pub llm: connectors::openai::LlmMetrics,
    /// The OpenAI-compatible embedder's requests (`engram_embedder_requests_total{stage,outcome}`, …).
    pub embedder_requests: connectors::openai::LlmMetrics,
    /// Every embedder's texts and batch latency.
    pub embedder: connectors::embedders::EmbedderMetrics,
    #[cfg(feature = "kafka")]
    pub kafka: connectors::kafka::KafkaMetrics,
    pub input_log_fsync: Histogram,
    /// API requests refused for a missing, malformed or unknown token.
    pub unauthorized: IntCounter,
    /// Appends to the input log that failed (nothing of them was acknowledged).
    pub input_log_failures: IntCounter,
}

impl Metrics {
    pub fn new() -> Self {
        let registry = Registry::new();
        let records_in = IntCounterVec::new(
            Opts::new("engram_records_in_total", "Records read, by source kind (file, stdin, http, replay)"),
            &["source"],
        )
        .expect("metric");
        let records_rejected = IntCounterVec::new(
            Opts::new("engram_records_rejected_total", "Records rejected to the dead-letter output, by source kind"),
            &["source"],
        )
        .expect("metric");
        let epochs = IntCounter::new("engram_epochs_total", "Epochs closed and fed to the dataflow").expect("metric");
        let epoch_records = Histogram::with_opts(
            HistogramOpts::new("engram_epoch_records", "Records per epoch")
                .buckets(vec![1.0, 10.0, 100.0, 1000.0, 10000.0, 100000.0]),
        )
        .expect("metric");
        let frontier_lag_epochs = IntGauge::new(
            "engram_frontier_lag_epochs",
            "Epochs closed at the input but not yet reflected in the views",
        )
        .expect("metric");
        let frontier_lag_seconds = prometheus::Gauge::new(
            "engram_frontier_lag_seconds",
            "Age of the oldest closed epoch the views do not reflect yet (0 when caught up)",
        )
        .expect("metric");
        let nodes = IntGauge::new("engram_nodes", "Layer-0 nodes in the views, all spaces").expect("metric");
        let edges = IntGauge::new("engram_edges", "Layer-0 similarity edges in the views, all spaces").expect("metric");
        let spaces = IntGauge::new("engram_spaces", "Memory spaces with at least one node").expect("metric");
        let query_duration = HistogramVec::new(
            HistogramOpts::new("engram_query_duration_seconds", "Query latency by mode (excluding ?after waits)")
                .buckets(prometheus::exponential_buckets(0.0001, 3.0, 12).expect("buckets")),
            &["mode"],
        )
        .expect("metric");
        let input_log_fsync = Histogram::with_opts(
            HistogramOpts::new("engram_input_log_append_seconds", "Time to append and fsync an HTTP ingest batch")
                .buckets(prometheus::exponential_buckets(0.0001, 3.0, 10).expect("buckets")),
        )
        .expect("metric");
        let unauthorized = IntCounter::new(
            "engram_api_unauthorized_total",
            "API requests refused 401: no token, a malformed Authorization header, or an unknown token",
        )
        .expect("metric");
        let input_log_failures = IntCounter::new(
            "engram_input_log_failures_total",
            "Input log appends that failed (a write truncated back, or an fsync that failed the log): nothing acknowledged",
        )
        .expect("metric");
        let clusters =
            IntGauge::new("engram_clusters", "Clusters (nodes of layers 1 and above), all spaces").expect("metric");
        let summary_backlog =
            IntGauge::new("engram_summary_backlog", "Clusters waiting for a summary (debouncing or in flight)")
                .expect("metric");
        let summaries_reused = IntCounter::new(
            "engram_summaries_reused_total",
            "Cluster summaries reused from an earlier summary of a part of the same content (no model call)",
        )
        .expect("metric");
        let llm = connectors::openai::LlmMetrics::new(&registry).expect("LLM metrics");
        let embedder_requests = connectors::openai::LlmMetrics::with_prefix(&registry, "engram_embedder", "Embedding")
            .expect("embedder metrics");
        let embedder = connectors::embedders::EmbedderMetrics::new(&registry).expect("embedder metrics");
        #[cfg(feature = "kafka")]
        let kafka = connectors::kafka::KafkaMetrics::new(&registry).expect("Kafka metrics");
        for m in [
            Box::new(clusters.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(summary_backlog.clone()),
            Box::new(summaries_reused.clone()),
            Box::new(records_in.clone()),
            Box::new(records_rejected.clone()),
            Box::new(epochs.clone()),
            Box::new(epoch_records.clone()),
            Box::new(frontier_lag_epochs.clone()),
            Box::new(frontier_lag_seconds.clone()),
            Box::new(nodes.clone()),
            Box::new(edges.clone()),
            Box::new(spaces.clone()),
            Box::new(query_duration.clone()),
            Box::new(input_log_fsync.clone()),
            Box::new(unauthorized.clone()),
            Box::new(input_log_failures.clone()),
        ] {
            registry.register(m).expect("register metric");
        }
        Metrics {
            registry,
            records_in,
            records_rejected,
            epochs,
            epoch_records,
            frontier_lag_epochs,
            frontier_lag_seconds,
            nodes,
            edges,
            spaces,
            query_duration,
            input_log_fsync,
            unauthorized,
            input_log_failures,
            clusters,
            summary_backlog,
            summaries_reused,
            llm,
            embedder_requests,
            embedder,
            #[cfg(feature = "kafka")]
            kafka,
        }
    }

    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        prometheus::TextEncoder::new().encode(&self.registry.gather(), &mut buf).expect("encode metrics");
        String::from_utf8(buf).expect("prometheus text is UTF-8")
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
