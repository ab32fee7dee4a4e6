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
    /// Replies found in a log written before today's content keys and logged again under them (no model call).
    pub responses_upgraded: IntCounter,
    /// Model requests whose extractive answer was logged in place of the model's, by kind, after `llm.max-failures`.
    pub llm_fallbacks: IntCounterVec,
    /// The epoch of the last checkpoint written, its size, how long writing took, and failed writes.
    pub checkpoint_epoch: IntGauge,
    pub checkpoint_bytes: IntGauge,
    pub checkpoint_seconds: prometheus::Histogram,
    /// Time to take a checkpoint's state from the views and the indexes, on the views sink's thread: the pause in
    /// applying epochs that a checkpoint costs.
    pub checkpoint_pause_seconds: prometheus::Histogram,
    /// Time to build a space's nearest-neighbour index aside (the space is read exactly meanwhile).
    pub index_build_seconds: prometheus::Histogram,
    pub checkpoint_failures: IntCounter,
    /// The epoch of the checkpoint this process started from (-1: it rebuilt from the logs).
    pub checkpoint_restored: IntGauge,
    /// 1 while the dataflow rebuilds behind a restored checkpoint (the views serve the checkpoint, and records
    /// after it wait), else 0.
    pub checkpoint_rebuilding: IntGauge,
    /// 1 while the structure rebuilds the hierarchy behind a restored checkpoint (the views serve the checkpoint's
    /// hierarchy until the structure's first step replaces it), else 0.
    pub checkpoint_hierarchy_rebuilding: IntGauge,
    /// The updates by which the dataflow, rebuilt behind the restored checkpoint, differed from it (the views then
    /// took the dataflow's state); 0 when they agreed or no checkpoint was restored.
    pub checkpoint_rebuild_differences: IntGauge,
    /// Input log lines a start from a checkpoint compacted away (records replaced or deleted behind it).
    pub input_log_compacted: IntCounter,
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
    /// Changes applied to the views, by kind (node, edge, cluster, layer-edge, summary, event, …) and layer (of the
    /// hierarchy's kinds; "" for the others): how much of the memory an epoch rewrites, and where.
    pub view_updates: IntCounterVec,
    /// How long each step of the structure (the hierarchy and its summaries, behind layer 0) takes.
    pub structure_seconds: Histogram,
    /// Epochs the views' hierarchy is behind their layer 0 (`as_of - hierarchy_as_of`).
    pub structure_lag_epochs: IntGauge,
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
        let responses_upgraded = IntCounter::new(
            "engram_responses_upgraded_total",
            "Model replies found under the earlier content keys of an old response log, logged again (no model call)",
        )
        .expect("metric");
        let llm_fallbacks = IntCounterVec::new(
            Opts::new(
                "engram_llm_fallbacks_total",
                "Model requests answered by the extractive backend after llm.max-failures failed attempts, by kind",
            ),
            &["kind"],
        )
        .expect("metric");
        let checkpoint_epoch =
            IntGauge::new("engram_checkpoint_epoch", "The epoch of the last checkpoint written").expect("metric");
        let checkpoint_bytes =
            IntGauge::new("engram_checkpoint_bytes", "The size of the last checkpoint written").expect("metric");
        let checkpoint_seconds = prometheus::Histogram::with_opts(prometheus::HistogramOpts::new(
            "engram_checkpoint_seconds",
            "Time to write a checkpoint (serialise, write, fsync, rename)",
        ))
        .expect("metric");
        let checkpoint_pause_seconds = prometheus::Histogram::with_opts(prometheus::HistogramOpts::new(
            "engram_checkpoint_pause_seconds",
            "Time to take a checkpoint's state from the views and the indexes (epochs wait meanwhile)",
        ))
        .expect("metric");
        let index_build_seconds = prometheus::Histogram::with_opts(
            prometheus::HistogramOpts::new(
                "engram_index_build_seconds",
                "Time to build a space's nearest-neighbour index aside, while the space is read exactly",
            )
            .buckets(vec![0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0, 300.0]),
        )
        .expect("metric");
        let checkpoint_failures =
            IntCounter::new("engram_checkpoint_failures_total", "Checkpoints that could not be written")
                .expect("metric");
        let checkpoint_restored = IntGauge::new(
            "engram_checkpoint_restored_epoch",
            "The epoch of the checkpoint this process started from (-1: it rebuilt from the logs)",
        )
        .expect("metric");
        checkpoint_restored.set(-1);
        let checkpoint_rebuilding = IntGauge::new(
            "engram_checkpoint_rebuilding",
            "1 while the dataflow rebuilds behind a restored checkpoint (records after it are reflected once it is done)",
        )
        .expect("metric");
        let checkpoint_hierarchy_rebuilding = IntGauge::new(
            "engram_checkpoint_hierarchy_rebuilding",
            "1 while the structure rebuilds the hierarchy behind a restored checkpoint (its hierarchy is served until then)",
        )
        .expect("metric");
        let checkpoint_rebuild_differences = IntGauge::new(
            "engram_checkpoint_rebuild_differences",
            "Updates by which the dataflow rebuilt behind the restored checkpoint differed from it (the views took its state)",
        )
        .expect("metric");
        let input_log_compacted = IntCounter::new(
            "engram_input_log_compacted_lines_total",
            "Input log lines compacted away behind the checkpoint a start restored (records replaced or deleted by then)",
        )
        .expect("metric");
        let view_updates = IntCounterVec::new(
            Opts::new("engram_view_updates_total", "Changes applied to the views, by kind and hierarchy layer"),
            &["kind", "layer"],
        )
        .expect("metric");
        let structure_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "engram_structure_step_seconds",
                "Time of one step of the structure (the hierarchy and its summaries over what layer 0 handed it)",
            )
            .buckets(vec![0.01, 0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0, 100.0]),
        )
        .expect("metric");
        let structure_lag_epochs = IntGauge::new(
            "engram_structure_lag_epochs",
            "Epochs the views' hierarchy is behind their layer 0 and events",
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
            Box::new(responses_upgraded.clone()),
            Box::new(llm_fallbacks.clone()),
            Box::new(checkpoint_epoch.clone()),
            Box::new(checkpoint_bytes.clone()),
            Box::new(checkpoint_seconds.clone()),
            Box::new(checkpoint_pause_seconds.clone()),
            Box::new(index_build_seconds.clone()),
            Box::new(checkpoint_failures.clone()),
            Box::new(checkpoint_restored.clone()),
            Box::new(checkpoint_rebuilding.clone()),
            Box::new(checkpoint_hierarchy_rebuilding.clone()),
            Box::new(checkpoint_rebuild_differences.clone()),
            Box::new(input_log_compacted.clone()),
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
            Box::new(view_updates.clone()),
            Box::new(structure_seconds.clone()),
            Box::new(structure_lag_epochs.clone()),
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
            view_updates,
            structure_seconds,
            structure_lag_epochs,
            clusters,
            summary_backlog,
            summaries_reused,
            responses_upgraded,
            llm_fallbacks,
            checkpoint_epoch,
            checkpoint_bytes,
            checkpoint_seconds,
            checkpoint_pause_seconds,
            index_build_seconds,
            checkpoint_failures,
            checkpoint_restored,
            checkpoint_rebuilding,
            checkpoint_hierarchy_rebuilding,
            checkpoint_rebuild_differences,
            input_log_compacted,
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

impl Metrics {
    /// The name of every metric family engram exposes, whether or not it has a sample yet (a labelled family shows
    /// in `/metrics` only once a label value is used): what the dashboard and the alerts may query.
    pub fn family_names(&self) -> std::collections::BTreeSet<String> {
        use prometheus::core::Collector;
        let llm = |m: &connectors::openai::LlmMetrics| -> Vec<Box<dyn Collector>> {
            vec![
                Box::new(m.requests.clone()),
                Box::new(m.tokens.clone()),
                Box::new(m.duration.clone()),
                Box::new(m.rate_limited_waits.clone()),
                Box::new(m.inflight.clone()),
            ]
        };
        let mut all: Vec<Box<dyn Collector>> = vec![
            Box::new(self.records_in.clone()),
            Box::new(self.records_rejected.clone()),
            Box::new(self.epochs.clone()),
            Box::new(self.epoch_records.clone()),
            Box::new(self.frontier_lag_epochs.clone()),
            Box::new(self.frontier_lag_seconds.clone()),
            Box::new(self.nodes.clone()),
            Box::new(self.edges.clone()),
            Box::new(self.spaces.clone()),
            Box::new(self.query_duration.clone()),
            Box::new(self.clusters.clone()),
            Box::new(self.summary_backlog.clone()),
            Box::new(self.summaries_reused.clone()),
            Box::new(self.responses_upgraded.clone()),
            Box::new(self.llm_fallbacks.clone()),
            Box::new(self.checkpoint_epoch.clone()),
            Box::new(self.checkpoint_bytes.clone()),
            Box::new(self.checkpoint_seconds.clone()),
            Box::new(self.checkpoint_pause_seconds.clone()),
            Box::new(self.index_build_seconds.clone()),
            Box::new(self.checkpoint_failures.clone()),
            Box::new(self.checkpoint_restored.clone()),
            Box::new(self.checkpoint_rebuilding.clone()),
            Box::new(self.checkpoint_hierarchy_rebuilding.clone()),
            Box::new(self.checkpoint_rebuild_differences.clone()),
            Box::new(self.input_log_compacted.clone()),
            Box::new(self.input_log_fsync.clone()),
            Box::new(self.unauthorized.clone()),
            Box::new(self.input_log_failures.clone()),
            Box::new(self.view_updates.clone()),
            Box::new(self.structure_seconds.clone()),
            Box::new(self.structure_lag_epochs.clone()),
            Box::new(self.embedder.texts.clone()),
            Box::new(self.embedder.batch_seconds.clone()),
            Box::new(self.embedder.cached.clone()),
        ];
        all.extend(llm(&self.llm));
        all.extend(llm(&self.embedder_requests));
        #[cfg(feature = "kafka")]
        all.extend([
            Box::new(self.kafka.lag.clone()) as Box<dyn Collector>,
            Box::new(self.kafka.records.clone()),
            Box::new(self.kafka.commit_seconds.clone()),
            Box::new(self.kafka.produced.clone()),
        ]);
        all.iter().flat_map(|c| c.desc().into_iter().map(|d| d.fq_name.clone()).collect::<Vec<_>>()).collect()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `engram_*` name in a text, with a histogram's `_bucket`, `_sum` and `_count` series named by their
    /// family.
    fn names_in(text: &str, families: &std::collections::BTreeSet<String>) -> Vec<String> {
        let mut out = Vec::new();
        let mut rest = text;
        while let Some(i) = rest.find("engram_") {
            let tail = &rest[i..];
            let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
            let name = &tail[..end];
            let family = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|f| families.contains(*f)))
                .unwrap_or(name);
            out.push(family.to_string());
            rest = &tail[end..];
        }
        out
    }

    #[test]
    fn the_family_list_holds_every_registered_metric() {
        let m = Metrics::new();
        let families = m.family_names();
        // Give every labelled family a sample, so that the registry lists it.
        m.records_in.with_label_values(&["http"]).inc();
        m.records_rejected.with_label_values(&["http"]).inc();
        m.query_duration.with_label_values(&["flat"]).observe(0.1);
        for l in [&m.llm, &m.embedder_requests] {
            l.requests.with_label_values(&["s", "ok"]).inc();
            l.tokens.with_label_values(&["s", "in"]).inc();
            l.duration.with_label_values(&["s"]).observe(0.1);
        }
        m.embedder.texts.with_label_values(&["hash"]).inc();
        m.embedder.batch_seconds.with_label_values(&["hash"]).observe(0.1);
        m.embedder.cached.with_label_values(&["hash"]).inc();
        m.view_updates.with_label_values(&["node", "0"]).inc();
        m.llm_fallbacks.with_label_values(&["summary"]).inc();
        #[cfg(feature = "kafka")]
        {
            m.kafka.lag.with_label_values(&["t"]).set(1);
            m.kafka.records.with_label_values(&["t"]).inc();
            m.kafka.produced.with_label_values(&["changes", "ok"]).inc();
        }
        let registered: std::collections::BTreeSet<String> =
            m.registry.gather().iter().map(|f| f.name().to_string()).collect();
        assert_eq!(registered, families, "Metrics::family_names lists exactly what is registered");
    }

    #[test]
    fn the_dashboard_and_the_alerts_query_only_metrics_engram_exposes() {
        let families = Metrics::new().family_names();
        let k8s = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../k8s");
        let dashboard = std::fs::read_to_string(k8s.join("dashboard.json")).unwrap();
        let alerts = std::fs::read_to_string(k8s.join("alerts.rules.yml")).unwrap();
        let dash: serde_json::Value = serde_json::from_str(&dashboard).unwrap();
        let exprs: Vec<&str> = dash["panels"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|p| p["targets"].as_array().into_iter().flatten())
            .filter_map(|t| t["expr"].as_str())
            .collect();
        assert!(exprs.len() >= 20, "{} queries", exprs.len());
        for (what, text) in [("dashboard", exprs.join("\n")), ("alerts", alerts)] {
            let used = names_in(&text, &families);
            assert!(!used.is_empty());
            for name in used {
                assert!(families.contains(&name), "{what} queries `{name}`, which engram does not expose");
            }
        }
        // Every panel family of the issue: ingest, frontier lag, LLM calls, tokens, waits, backlog, latency, Kafka.
        for needed in [
            "engram_records_in_total",
            "engram_frontier_lag_seconds",
            "engram_llm_requests_total",
            "engram_llm_tokens_total",
            "engram_llm_rate_limited_waits_total",
            "engram_summary_backlog",
            "engram_query_duration_seconds",
            "engram_kafka_consumer_lag",
        ] {
            assert!(dashboard.contains(needed), "the dashboard shows {needed}");
        }
    }
}
