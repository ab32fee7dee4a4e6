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

/// The id of a document's chunk: `DOC#SEQ`, or `DOC#SEQ.PART` when a chunk record is split. The id of a
/// conversation's turn: `CONVERSATION#TURN`. Names keep their bytes except `%` and `#` (written `%25`, `%23`), and a
/// turn name's leading digit (written `%3X`): so the `#` that separates is the only one, a chunk's tail always begins
/// with a digit and a turn's never does — no chunk, turn or derived id (`L…:`, `E:…`, which have no `#`) can be
/// another's, whatever the names. [`split_node_id`] reads one back.
pub fn chunk_id(doc: &str, seq: i64, part: Option<usize>) -> String {
    match part {
        None => format!("{}#{seq}", escape_name(doc, false)),
        Some(p) => format!("{}#{seq}.{p}", escape_name(doc, false)),
    }
}

/// See [`chunk_id`].
pub fn turn_id(conversation: &str, turn: &str) -> String {
    format!("{}#{}", escape_name(conversation, false), escape_name(turn, true))
}

fn escape_name(name: &str, digit_first: bool) -> String {
    let mut out = String::with_capacity(name.len());
    for (i, c) in name.chars().enumerate() {
        match c {
            '%' => out.push_str("%25"),
            '#' => out.push_str("%23"),
            '0'..='9' if digit_first && i == 0 => {
                out.push('%');
                out.push_str(&format!("{:02X}", c as u32));
            }
            c => out.push(c),
        }
    }
    out
}

fn unescape_name(s: &str) -> Option<String> {
    let mut out = Vec::with_capacity(s.len());
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A layer-0 id read back: `(document or conversation, the unit's name)` — the chunk's `SEQ` or `SEQ.PART`, or the
/// turn's name. `None` for anything else (a cluster or event id).
pub fn split_node_id(id: &str) -> Option<(String, String)> {
    let (doc, unit) = id.split_once('#')?;
    Some((unescape_name(doc)?, unescape_name(unit)?))
}

/// Lanes of [`dot`]: 32 partial sums, so that a core runs several independent chains of adds (eight SSE registers)
/// instead of waiting on one.
const LANES: usize = 32;

/// Dot product in 32 independent lanes (the compiler vectorises it), summed in a fixed order: deterministic, and the
/// same wherever it runs (no fused multiply-add).
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    dot_lanes(a, b)
}

#[inline(always)]
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; LANES];
    let mut ca = a.chunks_exact(LANES);
    let mut cb = b.chunks_exact(LANES);
    for (x, y) in (&mut ca).zip(&mut cb) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    let mut tail = 0f32;
    for (x, y) in ca.remainder().iter().zip(cb.remainder()) {
        tail += x * y;
    }
    // A fixed tree: lane i with lane i + 16, then i + 8, i + 4, i + 2, i + 1.
    let mut width = LANES / 2;
    while width > 0 {
        for i in 0..width {
            acc[i] += acc[i + width];
        }
        width /= 2;
    }
    acc[0] + tail
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

/// The same distance over shared embeddings: an index of `Embedding` points holds one `Arc` per point (the slice of
/// one), not a copy of its vector, and scores bit for bit as the index of `f32` points does.
impl hnsw_rs::prelude::Distance<Embedding> for UnitCosine {
    fn eval(&self, a: &[Embedding], b: &[Embedding]) -> f32 {
        match (a, b) {
            ([a], [b]) => (1.0 - dot(&a.0, &b.0)).max(0.0),
            _ => 1.0,
        }
    }
}

/// The cosine of two unit vectors as the similarity graph scores it: `1 −` the HNSW index's distance, bit for bit,
/// so that a search hit's distance gives the same score as a computation from the vectors.
pub fn unit_cos(a: &[f32], b: &[f32]) -> f32 {
    1.0 - (1.0 - dot(a, b)).max(0.0)
}

/// An L2-normalised embedding (or all zeros for a text with no features). Ordered bitwise so that it can travel in a
/// differential collection; the order means nothing beyond determinism. Shared: the dataflow's copies, the
/// similarity index's and the views' are one allocation (serialised as the plain sequence of its values).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Embedding(pub std::sync::Arc<[f32]>);

impl Embedding {
    pub fn dot(&self, other: &Embedding) -> f32 {
        dot(&self.0, &other.0)
    }
    /// [`unit_cos`] of two embeddings.
    pub fn cos(&self, other: &Embedding) -> f32 {
        unit_cos(&self.0, &other.0)
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

#[cfg(test)]
mod id_tests {
    use super::*;
    use proptest::prelude::*;

    fn name() -> impl Strategy<Value = String> {
        prop_oneof![Just("a".to_string()), Just("1".to_string()), "[a1#%.:]{1,4}", "\\PC{1,3}"]
    }

    proptest! {
        /// Different (kind, name, unit) never give one id, and every id reads back as its names.
        #[test]
        fn ids_are_injective_and_read_back(a in name(), b in name(), c in name(), d in name(), s in 0i64..20, t in 0i64..20) {
            let ids = [
                (chunk_id(&a, s, None), (a.clone(), s.to_string())),
                (chunk_id(&c, t, Some(1)), (c.clone(), format!("{t}.1"))),
                (turn_id(&a, &b), (a.clone(), b.clone())),
                (turn_id(&c, &d), (c.clone(), d.clone())),
            ];
            for (id, names) in &ids {
                prop_assert_eq!(&split_node_id(id).unwrap(), names);
                prop_assert_eq!(id.matches('#').count(), 1);
            }
            let turns_equal = a == c && b == d;
            prop_assert_eq!(ids[2].0 == ids[3].0, turns_equal);
            for (i, j) in [(0, 2), (0, 3), (1, 2), (1, 3), (0, 1)] {
                prop_assert_ne!(&ids[i].0, &ids[j].0);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Seeded vectors of awkward lengths: the plain sum, symmetric to the bit.
    #[test]
    fn dot_is_the_plain_sum_and_symmetric() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        };
        for n in [0, 1, 7, 31, 32, 33, 100, 384, 1000, 1024, 1536] {
            let a: Vec<f32> = (0..n).map(|_| next()).collect();
            let b: Vec<f32> = (0..n).map(|_| next()).collect();
            let plain: f64 = a.iter().zip(&b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
            let d = dot(&a, &b);
            assert!((f64::from(d) - plain).abs() < 1e-4, "n = {n}: {d} against {plain}");
            assert_eq!(d.to_bits(), dot(&b, &a).to_bits(), "n = {n}: symmetric");
        }
    }
}
