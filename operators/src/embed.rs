//! The embedder trait and the built-in `hash` embedder.

use crate::hash::mixed;
use crate::model::Embedding;

/// Turns texts into L2-normalised vectors of a fixed dimension. Implementations must be deterministic: the memory is
/// a function of its input, and embeddings are recomputed on replay.
pub trait Embedder: Send + Sync {
    fn dim(&self) -> usize;
    fn embed_batch(&self, texts: &[&str]) -> Vec<Embedding>;
    fn embed(&self, text: &str) -> Embedding {
        self.embed_batch(&[text]).pop().unwrap_or_default()
    }
    /// Whether a text gets the same bits whatever batch it is embedded in. A model whose vectors depend on the
    /// batch (padding, kernel blocking) says `false`, and the dataflow then retracts exactly the vector it inserted
    /// (it remembers the vectors of live nodes) instead of embedding the text again.
    fn bit_exact(&self) -> bool {
        true
    }
}

/// Feature-hashed word unigrams and bigrams with sublinear term frequency (1 + ln tf), signed hashing to cancel
/// collision bias, L2-normalised. No model, no download. English stop words are skipped as unigrams (they would make
/// every pair of sentences look alike) but kept inside bigrams, where "out of" and "of course" carry meaning.
#[derive(Clone, Debug)]
pub struct HashEmbedder {
    dim: usize,
}

impl HashEmbedder {
    pub fn new(dim: usize) -> Self {
        HashEmbedder { dim: dim.max(8) }
    }
}

impl Default for HashEmbedder {
    fn default() -> Self {
        HashEmbedder::new(512)
    }
}

const STOP: &[&str] = &[
    "a", "about", "after", "all", "also", "am", "an", "and", "any", "are", "as", "at", "be", "been", "but", "by",
    "can", "could", "did", "do", "does", "for", "from", "had", "has", "have", "he", "her", "him", "his", "how", "i",
    "if", "in", "into", "is", "it", "its", "just", "me", "more", "my", "no", "not", "of", "on", "one", "or", "our",
    "out", "over", "s", "she", "so", "some", "than", "that", "the", "their", "them", "then", "there", "these", "they",
    "this", "to", "up", "was", "we", "were", "what", "when", "which", "who", "will", "with", "would", "you", "your",
    "t", "yeah", "oh", "um", "uh", "really", "so", "very", "get", "got",
];

pub fn is_stop(w: &str) -> bool {
    static SET: std::sync::OnceLock<std::collections::HashSet<&'static str>> = std::sync::OnceLock::new();
    SET.get_or_init(|| STOP.iter().copied().collect()).contains(w)
}

/// Lower-cased alphanumeric words; an apostrophe splits ("don't" → "don", "t").
pub fn words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric()).filter(|w| !w.is_empty()).map(|w| w.to_lowercase()).collect()
}

impl Embedder for HashEmbedder {
    fn dim(&self) -> usize {
        self.dim
    }

    fn embed_batch(&self, texts: &[&str]) -> Vec<Embedding> {
        texts.iter().map(|t| self.embed_one(t)).collect()
    }
}

/// A text's hashed features — lower-cased word unigrams (stop words out), and bigrams at half weight — each weighed
/// `1 + ln tf` (a bigram seen once: 0.5), sorted by hash. What the hash embedder folds into its buckets; exact
/// 64-bit keys, before any bucket.
pub fn features(text: &str) -> Vec<(u64, f32)> {
    features_by(text, mixed)
}

/// [`features`] keyed by hash function `hash`.
pub fn features_by(text: &str, hash: fn(&[u8]) -> u64) -> Vec<(u64, f32)> {
    let ws = words(text);
    let mut counts: std::collections::HashMap<u64, f32> = std::collections::HashMap::new();
    for w in ws.iter().filter(|w| !is_stop(w)) {
        *counts.entry(hash(w.as_bytes())).or_default() += 1.0;
    }
    for pair in ws.windows(2) {
        if is_stop(&pair[0]) && is_stop(&pair[1]) {
            continue;
        }
        let mut key = Vec::with_capacity(pair[0].len() + pair[1].len() + 1);
        key.extend_from_slice(pair[0].as_bytes());
        key.push(b' ');
        key.extend_from_slice(pair[1].as_bytes());
        // Bigrams weigh half a unigram: they sharpen, unigrams carry the topic.
        *counts.entry(hash(&key)).or_default() += 0.5;
    }
    // Sorted so that float summation order, and hence every vector built from them, is the same on every run.
    let mut feats: Vec<(u64, f32)> =
        counts.into_iter().map(|(h, tf)| (h, if tf >= 1.0 { 1.0 + tf.ln() } else { tf })).collect();
    feats.sort_unstable_by_key(|f| f.0);
    feats
}

/// Features folded into `dim` signed buckets (bucket: the hash modulo `dim`; sign: its top bit), L2-normalised.
pub fn fold(features: &[(u64, f32)], dim: usize) -> Embedding {
    Embedding::new(fold_values(features, dim))
}

/// [`fold`]'s component values, every one of them (zeros included).
pub fn fold_values(features: &[(u64, f32)], dim: usize) -> Vec<f32> {
    let mut v = vec![0f32; dim];
    for &(h, weight) in features {
        let idx = (h % dim as u64) as usize;
        let sign = if (h >> 63) & 1 == 1 { -1.0 } else { 1.0 };
        v[idx] += sign * weight;
    }
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    v
}

impl HashEmbedder {
    fn embed_one(&self, text: &str) -> Embedding {
        fold(&features(text), self.dim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_normalised_and_topical() {
        let e = HashEmbedder::default();
        let a = e.embed("The central bank raised interest rates to fight inflation.");
        let b = e.embed("Interest rates were raised by the central bank as inflation climbed.");
        let c = e.embed("The goalkeeper saved a penalty in the final minute of the match.");
        assert_eq!(a, e.embed("The central bank raised interest rates to fight inflation."));
        assert!((a.dot(&a) - 1.0).abs() < 1e-5);
        assert!(a.dot(&b) > 0.4, "related texts: {}", a.dot(&b));
        assert!(a.dot(&c) < 0.15, "unrelated texts: {}", a.dot(&c));
        assert!(e.embed("the of and").is_zero());
    }
}
