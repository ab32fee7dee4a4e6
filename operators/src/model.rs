//! The memory model: the rows that flow through the dataflow.

use serde::{Deserialize, Serialize};
use std::cmp::Ordering;
use std::sync::Arc;

use crate::name::Name;

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
///
/// Its strings are [`Name`]s: a clone shares them, so the ingestor's current nodes, the rows in the dataflow's
/// collections and arrangements, and the views all hold one allocation of a node's text, and the nodes of one
/// document share its name, speaker and time. Ordered, hashed and serialised as the strings they hold.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Node {
    pub id: Name,
    pub kind: NodeKind,
    /// The document (or conversation) the node belongs to; deleting it retracts the node.
    pub doc: Name,
    /// Position within `doc`, in thousandths (see [`POSITION_SCALE`]).
    pub pos: i64,
    pub text: Name,
    pub speaker: Option<Name>,
    pub ts: Option<Name>,
}

impl Node {
    /// The text that is embedded: a turn carries its speaker, which is part of what it says.
    pub fn embedding_text(&self) -> String {
        match &self.speaker {
            Some(s) => format!("{s}: {}", self.text),
            None => self.text.to_string(),
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

fn bits(v: &[f32]) -> impl Iterator<Item = u32> + '_ {
    v.iter().map(|x| x.to_bits())
}

/// The same distance over shared embeddings: an index of `Embedding` points holds one handle per point (the slice of
/// one), not a copy of its vector, and scores as [`Embedding::cos`] does, bit for bit.
impl hnsw_rs::prelude::Distance<Embedding> for UnitCosine {
    fn eval(&self, a: &[Embedding], b: &[Embedding]) -> f32 {
        match (a, b) {
            ([a], [b]) => (1.0 - a.dot(b)).max(0.0),
            _ => 1.0,
        }
    }
}

/// The cosine of two unit vectors as the similarity graph scores it: `1 −` the HNSW index's distance, bit for bit,
/// so that a search hit's distance gives the same score as a computation from the vectors.
pub fn unit_cos(a: &[f32], b: &[f32]) -> f32 {
    1.0 - (1.0 - dot(a, b)).max(0.0)
}

/// An L2-normalised embedding (or all zeros for a text with no features), shared: the dataflow's copies, the
/// similarity index's and the views' are one allocation. A vector with at most a quarter of its components non-zero
/// (the hash embedder's, of any text shorter than a few hundred words) is stored sparse — a bitmap of its non-zero
/// components, their values in index order, and the bitmap's running counts — and any other dense. Which form a
/// vector takes is a function of its values, so two equal vectors always have the same form and the same bits.
///
/// Ordered so that it can travel in a differential collection (the order means nothing beyond determinism), and
/// serialised in its form (a sparse vector as its dimension, bitmap and stored values).
#[derive(Clone, Debug)]
pub struct Embedding(Repr);

#[derive(Clone, Debug)]
enum Repr {
    Dense(Arc<[f32]>),
    Sparse(Sparse),
}

/// A sparse vector in one shared allocation, so that scoring it against another touches one block of memory, not
/// four (an index search scores hundreds of vectors it has not seen before).
#[derive(Clone, Debug)]
struct Sparse {
    dim: u32,
    /// The bitmap, `dim / 64` words rounded up (bit `i % 64` of word `i / 64` set: component `i` is stored, its bits
    /// are not all zero), then the stored components in index order, two to a word (the first in the low half).
    data: Arc<[u64]>,
}

/// Vectors shorter than this stay dense whatever their zeros: a bitmap would not pay for itself.
const SPARSE_MIN_DIM: usize = 64;

impl Default for Embedding {
    fn default() -> Self {
        Embedding(Repr::Dense(Arc::from(Vec::new())))
    }
}

impl From<Vec<f32>> for Embedding {
    fn from(values: Vec<f32>) -> Self {
        Embedding::new(values)
    }
}

impl Embedding {
    /// The embedding of these component values, in its form (sparse or dense).
    pub fn new(values: Vec<f32>) -> Embedding {
        let stored = values.iter().filter(|x| x.to_bits() != 0).count();
        if values.len() < SPARSE_MIN_DIM || stored * 4 > values.len() {
            return Embedding(Repr::Dense(values.into()));
        }
        let words = values.len().div_ceil(64);
        let mut data = vec![0u64; words + stored.div_ceil(2)];
        let mut k = 0;
        for (w, chunk) in values.chunks(64).enumerate() {
            for (bit, x) in chunk.iter().enumerate() {
                if x.to_bits() != 0 {
                    data[w] |= 1 << bit;
                    data[words + k / 2] |= u64::from(x.to_bits()) << (32 * (k % 2));
                    k += 1;
                }
            }
        }
        Embedding(Repr::Sparse(Sparse { dim: values.len() as u32, data: data.into() }))
    }

    /// The number of components.
    pub fn dim(&self) -> usize {
        match &self.0 {
            Repr::Dense(v) => v.len(),
            Repr::Sparse(s) => s.dim as usize,
        }
    }

    /// Every component, zeros included.
    pub fn to_dense(&self) -> Vec<f32> {
        match &self.0 {
            Repr::Dense(v) => v.to_vec(),
            Repr::Sparse(s) => {
                let mut out = vec![0f32; s.dim as usize];
                for (i, x) in s.stored() {
                    out[i] = x;
                }
                out
            }
        }
    }

    /// Whether this vector is stored sparse.
    pub fn is_sparse(&self) -> bool {
        matches!(self.0, Repr::Sparse(_))
    }

    /// The dot product, summed in a fixed order: two dense vectors by [`dot`]; otherwise over the sparse one's
    /// stored components (both vectors' when both are sparse), in index order. Deterministic and symmetric to the bit.
    pub fn dot(&self, other: &Embedding) -> f32 {
        match (&self.0, &other.0) {
            (Repr::Dense(a), Repr::Dense(b)) => dot(a, b),
            (Repr::Sparse(a), Repr::Sparse(b)) => a.dot(b),
            (Repr::Sparse(s), Repr::Dense(d)) | (Repr::Dense(d), Repr::Sparse(s)) => {
                let mut acc = 0f32;
                for (i, x) in s.stored().take_while(|(i, _)| *i < d.len()) {
                    acc += x * d[i];
                }
                acc
            }
        }
    }

    /// `1 −` the HNSW index's distance ([`UnitCosine`]), bit for bit.
    pub fn cos(&self, other: &Embedding) -> f32 {
        1.0 - (1.0 - self.dot(other)).max(0.0)
    }

    pub fn is_zero(&self) -> bool {
        match &self.0 {
            Repr::Dense(v) => v.iter().all(|x| *x == 0.0),
            Repr::Sparse(s) => s.values().all(|x| x == 0.0),
        }
    }

    /// Whether both are the same allocation (then they are equal).
    pub fn ptr_eq(&self, other: &Embedding) -> bool {
        match (&self.0, &other.0) {
            (Repr::Dense(a), Repr::Dense(b)) => Arc::ptr_eq(a, b),
            (Repr::Sparse(a), Repr::Sparse(b)) => Arc::ptr_eq(&a.data, &b.data),
            _ => false,
        }
    }

    /// A 64-bit FNV-1a hash of the vector's components: equal vectors hash alike.
    pub fn content_hash(&self) -> u64 {
        let step = |h: u64, x: u64| (h ^ x).wrapping_mul(0x0100_0000_01b3);
        match &self.0 {
            Repr::Dense(v) => v.iter().fold(0xcbf2_9ce4_8422_2325, |h, x| step(h, u64::from(x.to_bits()))),
            Repr::Sparse(s) => {
                let h = s.mask().iter().fold(0x8422_2325_cbf2_9ce4 ^ u64::from(s.dim), |h, m| step(h, *m));
                s.values().fold(h, |h, x| step(h, u64::from(x.to_bits())))
            }
        }
    }

    /// Bytes this vector holds on the heap (its allocations' payloads).
    pub fn heap_bytes(&self) -> usize {
        match &self.0 {
            Repr::Dense(v) => 16 + 4 * v.len(),
            Repr::Sparse(s) => 16 + 8 * s.data.len(),
        }
    }
}

impl Sparse {
    /// The bitmap and the packed values.
    #[inline(always)]
    fn parts(&self) -> (&[u64], &[u64]) {
        self.data.split_at((self.dim as usize).div_ceil(64))
    }

    fn mask(&self) -> &[u64] {
        self.parts().0
    }

    /// The stored components in index order.
    fn values(&self) -> impl Iterator<Item = f32> + '_ {
        let (mask, packed) = self.parts();
        let n: usize = mask.iter().map(|m| m.count_ones() as usize).sum();
        (0..n).map(move |k| value_at(packed, k))
    }

    /// The stored components `(index, value)` in index order.
    fn stored(&self) -> impl Iterator<Item = (usize, f32)> + '_ {
        let (mask, packed) = self.parts();
        let mut k = 0;
        mask.iter()
            .enumerate()
            .flat_map(move |(w, &word)| {
                let mut m = word;
                std::iter::from_fn(move || {
                    if m == 0 {
                        return None;
                    }
                    let bit = m.trailing_zeros() as usize;
                    m &= m - 1;
                    Some(w * 64 + bit)
                })
            })
            .map(move |i| {
                k += 1;
                (i, value_at(packed, k - 1))
            })
    }

    /// The products of the components both store, summed in index order.
    fn dot(&self, other: &Sparse) -> f32 {
        let ((ma, va), (mb, vb)) = (self.parts(), other.parts());
        let mut acc = 0f32;
        // The stored components before the current word, in each.
        let (mut ra, mut rb) = (0usize, 0usize);
        for (&a, &b) in ma.iter().zip(mb) {
            let mut both = a & b;
            while both != 0 {
                let below = (both & both.wrapping_neg()) - 1;
                let i = ra + (a & below).count_ones() as usize;
                let j = rb + (b & below).count_ones() as usize;
                acc += value_at(va, i) * value_at(vb, j);
                both &= both - 1;
            }
            ra += a.count_ones() as usize;
            rb += b.count_ones() as usize;
        }
        acc
    }
}

/// Component `k` of values stored two to a word, the first in the low half.
#[inline(always)]
fn value_at(packed: &[u64], k: usize) -> f32 {
    f32::from_bits((packed[k / 2] >> (32 * (k % 2))) as u32)
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
        if self.ptr_eq(other) {
            return Ordering::Equal;
        }
        match (&self.0, &other.0) {
            (Repr::Dense(a), Repr::Dense(b)) => bits(a).cmp(bits(b)),
            (Repr::Sparse(a), Repr::Sparse(b)) => a
                .dim
                .cmp(&b.dim)
                .then_with(|| a.mask().cmp(b.mask()))
                .then_with(|| a.values().map(f32::to_bits).cmp(b.values().map(f32::to_bits))),
            (Repr::Dense(_), Repr::Sparse(_)) => Ordering::Less,
            (Repr::Sparse(_), Repr::Dense(_)) => Ordering::Greater,
        }
    }
}

/// The serialised form: a dense vector's values, or a sparse one's dimension, bitmap and stored values.
#[derive(Serialize)]
enum WireRef<'a> {
    Dense(&'a [f32]),
    Sparse { dim: u32, mask: &'a [u64], values: Vec<f32> },
}

#[derive(Deserialize)]
enum Wire {
    Dense(Vec<f32>),
    Sparse { dim: u32, mask: Vec<u64>, values: Vec<f32> },
}

impl Serialize for Embedding {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match &self.0 {
            Repr::Dense(v) => WireRef::Dense(v),
            Repr::Sparse(s) => WireRef::Sparse { dim: s.dim, mask: s.mask(), values: s.values().collect() },
        }
        .serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Embedding {
    /// Either form read back into the form its values take; a sparse form whose bitmap and values disagree is an
    /// error.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        match Wire::deserialize(deserializer)? {
            Wire::Dense(v) => Ok(Embedding::new(v)),
            Wire::Sparse { dim, mask, values } => {
                let stored: usize = mask.iter().map(|m| m.count_ones() as usize).sum();
                let beyond = mask.last().is_some_and(|m| dim % 64 != 0 && m >> (dim % 64) != 0);
                if mask.len() != (dim as usize).div_ceil(64) || stored != values.len() || beyond {
                    return Err(serde::de::Error::custom("a sparse embedding whose bitmap and values disagree"));
                }
                let mut out = vec![0f32; dim as usize];
                let mut k = 0;
                for (w, word) in mask.iter().enumerate() {
                    let mut m = *word;
                    while m != 0 {
                        out[w * 64 + m.trailing_zeros() as usize] = values[k];
                        k += 1;
                        m &= m - 1;
                    }
                }
                Ok(Embedding::new(out))
            }
        }
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

    /// A seeded vector of `n` components of which about `share` are non-zero, L2-normalised.
    fn vector(n: usize, share: f64, seed: u64) -> Vec<f32> {
        let mut state = seed | 1;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut v: Vec<f32> = (0..n)
            .map(|_| {
                let r = next();
                if ((r >> 11) as f64 / (1u64 << 53) as f64) < share {
                    (r >> 40) as f32 / (1u64 << 24) as f32 - 0.5
                } else {
                    0.0
                }
            })
            .collect();
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        if norm > 0.0 {
            v.iter_mut().for_each(|x| *x /= norm);
        }
        v
    }

    /// Sparse and dense vectors, and pairs of either: the form follows the values, the values read back exactly
    /// (and through serde), the dot product is the plain sum and symmetric to the bit, and equality and order are
    /// the values'.
    #[test]
    fn an_embedding_keeps_its_values_in_either_form() {
        let mut all = Vec::new();
        for (i, (n, share)) in
            [(1024, 0.02), (1024, 0.1), (1024, 0.24), (1024, 0.6), (384, 1.0), (100, 0.05), (8, 0.5), (1024, 0.0)]
                .into_iter()
                .enumerate()
        {
            for seed in 0..3u64 {
                let v = vector(n, share, 0x9e37_79b9 * (i as u64 + 1) + seed);
                let stored = v.iter().filter(|x| **x != 0.0).count();
                let e = Embedding::new(v.clone());
                assert_eq!(e.is_sparse(), n >= 64 && stored * 4 <= n, "n = {n}, {stored} stored");
                assert_eq!(e.dim(), n);
                assert_eq!(e.to_dense(), v);
                assert_eq!(e.is_zero(), stored == 0);
                let back: Embedding = serde_json::from_str(&serde_json::to_string(&e).unwrap()).unwrap();
                assert_eq!(back, e);
                assert_eq!(back.is_sparse(), e.is_sparse());
                assert_eq!(back.content_hash(), e.content_hash());
                // The dense form of any vector reads back into the form its values take.
                let plain = serde_json::json!({ "Dense": v });
                assert_eq!(serde_json::from_value::<Embedding>(plain).unwrap(), e);
                all.push((v, e));
            }
        }
        for (a, ea) in &all {
            for (b, eb) in &all {
                let plain: f64 = a.iter().zip(b).map(|(x, y)| f64::from(*x) * f64::from(*y)).sum();
                let d = ea.dot(eb);
                assert!((f64::from(d) - plain).abs() < 1e-5, "{d} against {plain}");
                assert_eq!(d.to_bits(), eb.dot(ea).to_bits(), "symmetric");
                assert_eq!(ea == eb, a.iter().map(|x| x.to_bits()).eq(b.iter().map(|x| x.to_bits())));
                assert_eq!(ea.cmp(eb), eb.cmp(ea).reverse());
            }
        }
        // A sparse form whose bitmap and values disagree does not read.
        for bad in [
            r#"{"Sparse":{"dim":128,"mask":[3,0],"values":[0.5]}}"#,
            r#"{"Sparse":{"dim":128,"mask":[1],"values":[1.0]}}"#,
            r#"{"Sparse":{"dim":100,"mask":[1,1099511627776],"values":[0.5,0.5]}}"#,
        ] {
            assert!(serde_json::from_str::<Embedding>(bad).is_err(), "{bad}");
        }
        // A vector whose form is sparse, against the same values held dense: the products agree.
        let (v, e) = &all[0];
        let held = Embedding(Repr::Dense(v.clone().into()));
        for (_, other) in &all {
            if other.dim() == v.len() {
                assert!((held.dot(other) - e.dot(other)).abs() < 1e-5);
            }
        }
    }

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
