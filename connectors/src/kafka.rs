//! Kafka (rdkafka, librdkafka built from source): the source of records and the sinks of what engram derives.
//!
//! **Source.** [`KafkaSource`] reads the configured topics as a member of a consumer group with manual assignment:
//! its [`Share`] of the partitions of the topics (all of them for a single process), each from the offset after the
//! last one the input log holds (a restart resumes exactly where the memory is), or, when the log holds nothing of
//! it (a new pod, a lost disk), from the beginning: the memory is rebuilt from the partition, so the group's committed
//! offset marks only what the memory had reflected (for lag and monitoring). Each
//! message is a record; its key names the space. Positions are `kafka:TOPIC/PARTITION` with
//! Kafka's offsets, so the input log, read-your-writes (`?after=TOPIC:PARTITION:OFFSET`) and commits speak Kafka's
//! terms. Offsets are committed to the group only once the views reflect them ([`Source::commit`]); a redelivered
//! record replaces itself, so at-least-once input gives exactly-once memory.
//!
//! **Sinks.** [`KafkaSink`]: a non-blocking producer (librdkafka's queue, a background poller) for the
//! memory-change topic, the dead-letter topic and the LLM response log topic (compacted, keyed by the response's
//! key). [`read_topic`] reads a topic from the beginning to its end at start (the response log).

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use prometheus::{Histogram, HistogramOpts, IntCounterVec, IntGaugeVec, Opts, Registry};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

use crate::source::{Position, Source, SourceBatch, SourceRecord};

/// Kafka metrics, registered by the caller. Lag is aggregated per topic: no per-partition or per-offset labels.
#[derive(Clone)]
pub struct KafkaMetrics {
    pub lag: IntGaugeVec,
    pub records: IntCounterVec,
    pub commit_seconds: Histogram,
    pub produced: IntCounterVec,
}

impl KafkaMetrics {
    pub fn new(registry: &Registry) -> prometheus::Result<Self> {
        let m = KafkaMetrics {
            lag: IntGaugeVec::new(
                Opts::new(
                    "engram_kafka_consumer_lag",
                    "Messages in the topic not yet read, summed over its partitions",
                ),
                &["topic"],
            )?,
            records: IntCounterVec::new(
                Opts::new("engram_kafka_records_in_total", "Messages read, by topic"),
                &["topic"],
            )?,
            commit_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "engram_kafka_commit_seconds",
                    "Time to commit the group's offsets once the views reflect them",
                )
                .buckets(prometheus::exponential_buckets(0.0005, 3.0, 10)?),
            )?,
            produced: IntCounterVec::new(
                Opts::new(
                    "engram_kafka_records_out_total",
                    "Messages produced, by sink (changes, dead-letter, responses) and outcome",
                ),
                &["sink", "outcome"],
            )?,
        };
        registry.register(Box::new(m.lag.clone()))?;
        registry.register(Box::new(m.records.clone()))?;
        registry.register(Box::new(m.commit_seconds.clone()))?;
        registry.register(Box::new(m.produced.clone()))?;
        Ok(m)
    }
}

/// The position name of a partition: `kafka:TOPIC/PARTITION`.
pub fn source_name(topic: &str, partition: i32) -> String {
    format!("kafka:{topic}/{partition}")
}

/// Splits `kafka:TOPIC/PARTITION`.
pub fn parse_source_name(name: &str) -> Option<(&str, i32)> {
    let rest = name.strip_prefix("kafka:")?;
    let (topic, p) = rest.rsplit_once('/')?;
    Some((topic, p.parse().ok()?))
}

fn client_config(brokers: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", brokers).set("socket.timeout.ms", "10000");
    c
}

/// The partitions of `topic`, or an error naming it when it does not exist (topics are never auto-created).
fn partitions(consumer: &BaseConsumer, topic: &str, timeout: Duration) -> Result<Vec<i32>, String> {
    let md = consumer.fetch_metadata(Some(topic), timeout).map_err(|e| format!("metadata of topic {topic:?}: {e}"))?;
    let t = md.topics().iter().find(|t| t.name() == topic).ok_or(format!("topic {topic:?} not in the metadata"))?;
    if let Some(err) = t.error() {
        return Err(format!("topic {topic:?}: {err:?} (create it first; engram never auto-creates topics)"));
    }
    let mut ps: Vec<i32> = t.partitions().iter().map(|p| p.id()).collect();
    ps.sort_unstable();
    if ps.is_empty() {
        return Err(format!("topic {topic:?} has no partitions (create it first; engram never auto-creates topics)"));
    }
    Ok(ps)
}

/// Which partitions a process reads: of all (topic, partition) pairs, sorted, the i-th goes to process
/// `i % peers`. Static, so a restart reads the same partitions (the process's input log holds their records).
#[derive(Clone, Copy, Debug)]
pub struct Share {
    pub index: usize,
    pub peers: usize,
}

impl Share {
    pub const ALL: Share = Share { index: 0, peers: 1 };

    /// The pairs of `all` (in order) this share holds.
    pub fn pick<T: Clone>(&self, all: &[T]) -> Vec<T> {
        all.iter().enumerate().filter(|(i, _)| i % self.peers.max(1) == self.index).map(|(_, t)| t.clone()).collect()
    }
}

pub struct KafkaSource {
    consumer: BaseConsumer,
    topics: Vec<String>,
    /// (topic, partition) → the next offset to read, for the lag metric.
    next: BTreeMap<(String, i32), i64>,
    metrics: Option<KafkaMetrics>,
    last_lag: Instant,
}

impl KafkaSource {
    /// Assigns every partition of `topics`. `resume` maps a position name (`kafka:TOPIC/PARTITION`) to the last
    /// offset the input log holds.
    pub fn new(
        brokers: &str,
        group_id: &str,
        topics: &[String],
        share: Share,
        resume: &HashMap<String, u64>,
        metrics: Option<KafkaMetrics>,
    ) -> Result<Self, String> {
        let consumer: BaseConsumer = client_config(brokers)
            .set("group.id", group_id)
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("enable.partition.eof", "false")
            .create()
            .map_err(|e| format!("Kafka consumer for {brokers}: {e}"))?;
        let timeout = Duration::from_secs(10);
        let mut pairs: Vec<(String, i32)> = Vec::new();
        for topic in topics {
            pairs.extend(partitions(&consumer, topic, timeout)?.into_iter().map(|p| (topic.clone(), p)));
        }
        pairs.sort();
        let mut all = TopicPartitionList::new();
        for (topic, p) in share.pick(&pairs) {
            all.add_partition(&topic, p);
        }
        let committed = consumer
            .committed_offsets(all.clone(), timeout)
            .map_err(|e| format!("committed offsets of group {group_id:?}: {e}"))?;
        let mut assignment = TopicPartitionList::new();
        let mut next = BTreeMap::new();
        for el in all.elements() {
            let (topic, p) = (el.topic().to_string(), el.partition());
            // The input log is the memory's source of truth: with nothing of a partition in it (a new pod, a lost
            // disk) the partition is read from its beginning, whatever the group has committed, so that the rebuilt
            // memory holds every record and not only those after the group's offset.
            let logged = resume.get(&source_name(&topic, p)).map(|o| Offset::Offset(*o as i64 + 1));
            let start = logged.unwrap_or(Offset::Beginning);
            let group =
                committed.find_partition(&topic, p).map(|e| e.offset()).filter(|o| matches!(o, Offset::Offset(_)));
            if logged.is_none() && group.is_some() {
                tracing::info!(topic, partition = p, committed = ?group, "nothing of this partition is logged: reading it from the beginning");
            }
            if let Offset::Offset(o) = start {
                next.insert((topic.clone(), p), o);
            } else {
                next.insert((topic.clone(), p), 0);
            }
            assignment.add_partition_offset(&topic, p, start).map_err(|e| e.to_string())?;
        }
        consumer.assign(&assignment).map_err(|e| format!("assigning partitions: {e}"))?;
        tracing::info!(
            ?topics,
            group_id,
            partitions = assignment.count(),
            of = pairs.len(),
            process = share.index,
            "Kafka source assigned"
        );
        Ok(KafkaSource {
            consumer,
            topics: topics.to_vec(),
            next,
            metrics,
            last_lag: Instant::now() - Duration::from_secs(60),
        })
    }

    fn update_lag(&mut self) {
        let Some(m) = &self.metrics else { return };
        if self.last_lag.elapsed() < Duration::from_secs(5) {
            return;
        }
        self.last_lag = Instant::now();
        let mut per_topic: HashMap<&str, i64> = HashMap::new();
        for ((topic, p), next) in &self.next {
            if let Ok((_, high)) = self.consumer.fetch_watermarks(topic, *p, Duration::from_secs(2)) {
                *per_topic.entry(topic.as_str()).or_default() += (high - next).max(0);
            }
        }
        for (topic, lag) in per_topic {
            m.lag.with_label_values(&[topic]).set(lag);
        }
    }
}

impl Source for KafkaSource {
    fn name(&self) -> String {
        format!("kafka:{}", self.topics.join(","))
    }

    fn poll(&mut self, max: usize) -> std::io::Result<SourceBatch> {
        let mut out = Vec::new();
        let mut wait = Duration::from_millis(100);
        while out.len() < max {
            match self.consumer.poll(wait) {
                None => break,
                Some(Err(e)) => {
                    // Broker and transport errors are transient in librdkafka (it reconnects); say so and go on.
                    tracing::warn!(error = %e, "Kafka poll error");
                    break;
                }
                Some(Ok(msg)) => {
                    let (topic, p, offset) = (msg.topic().to_string(), msg.partition(), msg.offset());
                    if let Some(m) = &self.metrics {
                        m.records.with_label_values(&[topic.as_str()]).inc();
                    }
                    self.next.insert((topic.clone(), p), offset + 1);
                    out.push(SourceRecord {
                        payload: msg.payload().unwrap_or_default().to_vec(),
                        space: msg
                            .key()
                            .and_then(|k| std::str::from_utf8(k).ok())
                            .filter(|k| !k.is_empty())
                            .map(str::to_string),
                        position: Position {
                            source: source_name(&topic, p),
                            partition: p as u32,
                            offset: offset as u64,
                        },
                    });
                    wait = Duration::ZERO;
                }
            }
        }
        self.update_lag();
        Ok(if out.is_empty() { SourceBatch::Idle } else { SourceBatch::Records(out) })
    }

    fn idle_wait(&self) -> Duration {
        Duration::ZERO
    }

    /// Commits, per partition, the offset after the highest position the views now reflect.
    fn commit(&mut self, positions: &[Position]) {
        let mut best: BTreeMap<(&str, i32), i64> = BTreeMap::new();
        for pos in positions {
            if let Some((topic, p)) = parse_source_name(&pos.source) {
                let e = best.entry((topic, p)).or_insert(0);
                *e = (*e).max(pos.offset as i64 + 1);
            }
        }
        if best.is_empty() {
            return;
        }
        let mut tpl = TopicPartitionList::new();
        for ((topic, p), o) in &best {
            let _ = tpl.add_partition_offset(topic, *p, Offset::Offset(*o));
        }
        let started = Instant::now();
        match self.consumer.commit(&tpl, CommitMode::Sync) {
            Ok(()) => {
                if let Some(m) = &self.metrics {
                    m.commit_seconds.observe(started.elapsed().as_secs_f64());
                }
            }
            // Not fatal: the input log is the memory's source of truth; the group offset only moves later.
            Err(e) => {
                tracing::warn!(error = %e, "committing Kafka offsets failed; they are committed with the next epoch")
            }
        }
    }
}

/// A producer for engram's output topics. `send` never blocks: librdkafka queues the message; a full queue is
/// counted (`outcome="dropped"` would lose data, so the caller's message is retried briefly, then counted as an
/// error and logged).
pub struct KafkaSink {
    producer: ThreadedProducer<DefaultProducerContext>,
    metrics: Option<KafkaMetrics>,
}

impl KafkaSink {
    pub fn new(brokers: &str, metrics: Option<KafkaMetrics>) -> Result<Self, String> {
        let producer: ThreadedProducer<DefaultProducerContext> = client_config(brokers)
            .set("linger.ms", "20")
            .set("message.timeout.ms", "300000")
            .set("enable.idempotence", "false")
            .create()
            .map_err(|e| format!("Kafka producer for {brokers}: {e}"))?;
        Ok(KafkaSink { producer, metrics })
    }

    pub fn send(&self, sink: &str, topic: &str, key: &str, payload: &[u8]) {
        let mut record = BaseRecord::to(topic).key(key).payload(payload);
        for attempt in 0..100 {
            match self.producer.send(record) {
                Ok(()) => {
                    if let Some(m) = &self.metrics {
                        m.produced.with_label_values(&[sink, "ok"]).inc();
                    }
                    return;
                }
                Err((e, r)) => {
                    record = r;
                    if attempt == 99 {
                        tracing::error!(error = %e, topic, "could not queue a message for Kafka");
                        if let Some(m) = &self.metrics {
                            m.produced.with_label_values(&[sink, "error"]).inc();
                        }
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }

    /// Waits until every queued message is delivered (at shutdown).
    pub fn flush(&self, timeout: Duration) {
        if let Err(e) = self.producer.flush(timeout) {
            tracing::warn!(error = %e, "flushing the Kafka producer");
        }
    }
}

/// Reads every message of `topic` from the beginning up to the end it had when called: `(key, payload)` pairs.
pub fn read_topic(brokers: &str, topic: &str, timeout: Duration) -> Result<Vec<(Vec<u8>, Vec<u8>)>, String> {
    let consumer: BaseConsumer = client_config(brokers)
        .set("group.id", "engram-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "false")
        .create()
        .map_err(|e| format!("Kafka consumer for {brokers}: {e}"))?;
    let mut tpl = TopicPartitionList::new();
    let mut ends: HashMap<i32, i64> = HashMap::new();
    for p in partitions(&consumer, topic, timeout)? {
        let (low, high) =
            consumer.fetch_watermarks(topic, p, timeout).map_err(|e| format!("watermarks of {topic}/{p}: {e}"))?;
        if high > low {
            ends.insert(p, high);
            tpl.add_partition_offset(topic, p, Offset::Offset(low)).map_err(|e| e.to_string())?;
        }
    }
    let mut out = Vec::new();
    if ends.is_empty() {
        return Ok(out);
    }
    consumer.assign(&tpl).map_err(|e| e.to_string())?;
    let deadline = Instant::now() + timeout;
    while !ends.is_empty() {
        if Instant::now() > deadline {
            return Err(format!("reading {topic}: not at its end after {timeout:?}"));
        }
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => {
                out.push((m.key().unwrap_or_default().to_vec(), m.payload().unwrap_or_default().to_vec()));
                if ends.get(&m.partition()).is_some_and(|end| m.offset() + 1 >= *end) {
                    ends.remove(&m.partition());
                }
            }
            Some(Err(e)) => tracing::warn!(error = %e, topic, "reading a topic"),
            None => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_names() {
        assert_eq!(source_name("news", 3), "kafka:news/3");
        assert_eq!(parse_source_name("kafka:a/b/12"), Some(("a/b", 12)));
        assert_eq!(parse_source_name("file:x"), None);
    }
}
