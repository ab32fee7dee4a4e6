//! engram's output topics (feature `kafka`): the memory-change topic, the dead-letter topic and the LLM response log
//! topic. Without Kafka configured (or built), every method is a no-op and the file outputs are the only ones.

#[cfg(feature = "kafka")]
use std::time::Duration;

use connectors::LoggedResponse;

use crate::config::KafkaConfig;
use crate::views::ViewUpdate;

#[derive(Default)]
pub struct Outputs {
    #[cfg(feature = "kafka")]
    sink: Option<connectors::kafka::KafkaSink>,
    changes: Option<String>,
    dead_letter: Option<String>,
    responses: Option<String>,
}

fn topic(name: &str) -> Option<String> {
    Some(name.trim().to_string()).filter(|t| !t.is_empty())
}

impl Outputs {
    #[cfg(feature = "kafka")]
    pub fn open(k: &KafkaConfig, metrics: Option<connectors::kafka::KafkaMetrics>) -> anyhow::Result<Outputs> {
        let (changes, dead_letter, responses) =
            (topic(&k.changes_topic), topic(&k.dead_letter_topic), topic(&k.responses_topic));
        if changes.is_none() && dead_letter.is_none() && responses.is_none() {
            return Ok(Outputs::default());
        }
        let sink = connectors::kafka::KafkaSink::new(&k.brokers, metrics).map_err(|e| anyhow::anyhow!(e))?;
        Ok(Outputs { sink: Some(sink), changes, dead_letter, responses })
    }

    #[cfg(not(feature = "kafka"))]
    pub fn open(_k: &KafkaConfig, _metrics: Option<()>) -> anyhow::Result<Outputs> {
        Ok(Outputs::default())
    }

    #[allow(unused_variables)]
    fn send(&self, sink: &str, topic: &Option<String>, key: &str, payload: &[u8]) {
        #[cfg(feature = "kafka")]
        if let (Some(s), Some(t)) = (&self.sink, topic) {
            s.send(sink, t, key, payload);
        }
    }

    pub fn wants_changes(&self) -> bool {
        self.changes.is_some()
    }

    /// One epoch's consolidated changes to the memory.
    pub fn changes(&self, epoch: u64, updates: &[(ViewUpdate, isize)]) {
        if self.changes.is_none() {
            return;
        }
        for (u, d) in updates {
            if let Some((space, msg)) = u.change(*d, epoch) {
                self.send("changes", &self.changes, &space, msg.to_string().as_bytes());
            }
        }
    }

    /// A rejected input: `{"source","reason","raw"}`, keyed by its source position.
    pub fn dead_letter(&self, source: &str, reason: &str, raw: &[u8]) {
        if self.dead_letter.is_some() {
            let msg = serde_json::json!({"source": source, "reason": reason, "raw": String::from_utf8_lossy(raw)});
            self.send("dead-letter", &self.dead_letter, source, msg.to_string().as_bytes());
        }
    }

    /// LLM responses, keyed by model, space and content hash (the topic is compacted on that key).
    pub fn responses(&self, rows: &[LoggedResponse]) {
        for r in rows {
            if let Ok(v) = serde_json::to_vec(r) {
                self.send("responses", &self.responses, &format!("{}\u{1f}{}\u{1f}{}", r.model, r.space, r.key), &v);
            }
        }
    }

    /// The response log topic's contents, read at start (empty when not configured).
    #[allow(unused_variables)]
    pub fn read_responses(k: &KafkaConfig) -> anyhow::Result<Vec<LoggedResponse>> {
        let Some(t) = topic(&k.responses_topic) else { return Ok(Vec::new()) };
        #[cfg(feature = "kafka")]
        {
            let rows = connectors::kafka::read_topic(&k.brokers, &t, Duration::from_secs(60))
                .map_err(|e| anyhow::anyhow!(e))?;
            return Ok(rows.into_iter().filter_map(|(_, v)| serde_json::from_slice(&v).ok()).collect());
        }
        #[allow(unreachable_code)]
        Ok(Vec::new())
    }

    pub fn flush(&self) {
        #[cfg(feature = "kafka")]
        if let Some(s) = &self.sink {
            s.flush(Duration::from_secs(10));
        }
    }
}
