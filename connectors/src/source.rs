//! The source abstraction. A source yields raw records, each with a position `(source, partition, offset)`; the
//! engine turns batches of them into epochs and remembers, per epoch, the highest position it holds, which is what
//! read-your-writes and (for Kafka) offset commits are keyed by. A file is one partition whose offsets are line
//! numbers; a Kafka topic has many partitions whose offsets are Kafka's (Materialize's SourceRender and Arroyo's
//! SourceOperator have the same shape).

use std::time::Duration;

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    /// `file:PATH`, `stdin`, later `kafka:TOPIC`.
    pub source: String,
    pub partition: u32,
    pub offset: u64,
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.source.starts_with("kafka:") {
            // `kafka:TOPIC/PARTITION` already names the partition.
            write!(f, "{}:{}", self.source, self.offset)
        } else {
            write!(f, "{}:{}:{}", self.source, self.partition, self.offset)
        }
    }
}

#[derive(Clone, Debug)]
pub struct SourceRecord {
    pub payload: Vec<u8>,
    /// The space named by the transport (a Kafka key), if any.
    pub space: Option<String>,
    pub position: Position,
}

#[derive(Debug)]
pub enum SourceBatch {
    Records(Vec<SourceRecord>),
    /// Nothing now; poll again later.
    Idle,
    /// The source is exhausted (a file read once).
    Done,
}

/// A pull-based source. `poll` must not block for long: the caller drives many sources and the clock.
pub trait Source: Send {
    fn name(&self) -> String;
    fn poll(&mut self, max: usize) -> std::io::Result<SourceBatch>;
    /// How long to wait after an `Idle` poll.
    fn idle_wait(&self) -> Duration {
        Duration::from_millis(50)
    }
    /// The views now reflect these positions (the highest of each partition that an epoch held): a source that
    /// acknowledges upstream (Kafka's group offsets) does it here, never earlier.
    fn commit(&mut self, _positions: &[Position]) {}
}
