//! The memory model: the rows that flow through the dataflow.

use serde::{Deserialize, Serialize};
use std::cmp::Ordering;

/// Positions are kept in thousandths so that the parts of a split chunk can sit between two whole positions and a
/// position stays an integer (collections need `Ord`).
pub const POSITION_SCALE: i64 = 1000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeKind {
    Chunk,
    Turn,
    /// A cluster of layer ≥ 1, shown by its summary.
    Summary,
}

/// A layer-0 node: one chunk of a document or one turn of a conversation. `id` is unique within its space.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Node {
    pub id: String,
    pub kind: NodeKind,
    /// The document (or conversation) the node belongs to; deleting it retracts the node.
    pub doc: String,
    /// Position within `doc`, in thousandths (see [`POSITION_SCALE`]).
    pub pos: i64,
    pub text: String,
    pub speaker: Option<String>,
    pub ts: Option<String>,
}

impl Node {
    /// The text that is embedded: a turn carries its speaker, which is part of what it says.
    pub fn embedding_text(&self) -> String {
        match &self.speaker {
            Some(s) => format!("{s}: {}", self.text),
            None => self.text.clone(),
        }
    }
}

/// Dot product in eight independent lanes (the compiler vectorises it), summed in a fixed order: deterministic,
/// and the same wherever it runs.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; 8];
    let mut ca = a.chunks_exact(8);
    let mut cb = b.chunks_exact(8);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        tail += x * y;
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7])) + tail
}

/// Cosine distance for L2-normalised vectors (`1 − dot`), for the HNSW index: hnsw_rs's `DistCosine` recomputes
/// both norms on every call and `DistDot` asserts `dot ≤ 1`, which rounding can break.
#[derive(Clone, Copy, Debug, Default)]
pub struct UnitCosine;

impl hnsw_rs::prelude::Distance<f32> for UnitCosine {
    fn eval(&self, a: &[f32], b: &[f32]) -> f32 {
        (1.0 - dot(a, b)).max(0.0)
    }
}

/// An L2-normalised embedding (or all zeros for a text with no features). Ordered bitwise so that it can travel in a
/// differential collection; the order means nothing beyond determinism.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Embedding(pub Vec<f32>);

impl Embedding {
    pub fn dot(&self, other: &Embedding) -> f32 {
        dot(&self.0, &other.0)
    }
    pub fn is_zero(&self) -> bool {
        self.0.iter().all(|x| *x == 0.0)
    }
}

impl PartialEq for Embedding {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Embedding {}
impl PartialOrd for Embedding {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Embedding {
    fn cmp(&self, other: &Self) -> Ordering {
        let a = self.0.iter().map(|x| x.to_bits());
        let b = other.0.iter().map(|x| x.to_bits());
        a.cmp(b)
    }
}

/// An undirected similarity edge of layer 0, `u < v`, with its weight in millionths.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Edge {
    pub space: String,
    pub u: String,
    pub v: String,
    pub weight_micro: u32,
}

impl Edge {
    pub fn weight(&self) -> f32 {
        self.weight_micro as f32 / 1e6
    }
}

/// A record that failed to parse or validate: a row of the error collection.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ErrorRow {
    /// Where it came from: `file:PATH:LINE`, `http:RECEIPT:INDEX`, later `kafka:TOPIC:PARTITION:OFFSET`.
    pub source: String,
    pub reason: String,
    /// The raw input (lossily decoded when it was not UTF-8), cut to a bounded length.
    pub raw: String,
    /// The space it was sent to, when that is known (what an API token must reach to see it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub space: Option<String>,
}
