//! The embedders beyond the built-in `hash` one:
//!
//! * [`OpenAiEmbedder`] (in [`crate::openai::embeddings`], re-exported here): any OpenAI-compatible
//!   `POST /v1/embeddings` (OpenAI, Ollama, vLLM, TEI, llama.cpp server), batched, under the same budget as the LLM
//!   client (requests and tokens per minute, in flight, retries). Its vectors are logged like LLM responses — keyed
//!   by (model, text hash), fsync'd, read back at start — so a replay or restart embeds nothing twice and rebuilds
//!   the same memory bit for bit;
//! * [`LocalEmbedder`] (feature `local-embedder`): a sentence-transformer of the all-MiniLM-L6-v2 class run
//!   in-process with candle from a directory holding `config.json`, `model.safetensors` and `tokenizer.json`: BERT,
//!   mean pooling over the attention mask, L2 normalisation — the sentence-transformers recipe;
//! * [`Instrumented`]: wraps any embedder with its metrics (texts, batch latency).

use std::sync::Arc;
use std::time::Instant;

use operators::hash::content_hex;
use operators::{Embedder, Embedding};
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};
use serde::{Deserialize, Serialize};

use crate::input_log::JsonLog;

pub use crate::openai::OpenAiEmbedder;

/// Embedder metrics shared by every kind.
#[derive(Clone)]
pub struct EmbedderMetrics {
    pub texts: IntCounterVec,
    pub batch_seconds: HistogramVec,
    pub cached: IntCounterVec,
}

impl EmbedderMetrics {
    pub fn new(registry: &Registry) -> prometheus::Result<Self> {
        let m = EmbedderMetrics {
            texts: IntCounterVec::new(
                Opts::new("engram_embedder_texts_total", "Texts embedded, by embedder kind"),
                &["kind"],
            )?,
            batch_seconds: HistogramVec::new(
                HistogramOpts::new("engram_embedder_batch_seconds", "Time to embed one batch, by embedder kind")
                    .buckets(prometheus::exponential_buckets(0.0001, 3.0, 14)?),
                &["kind"],
            )?,
            cached: IntCounterVec::new(
                Opts::new(
                    "engram_embedder_logged_hits_total",
                    "Texts whose vector came from the embedding log, not a request",
                ),
                &["kind"],
            )?,
        };
        registry.register(Box::new(m.texts.clone()))?;
        registry.register(Box::new(m.batch_seconds.clone()))?;
        registry.register(Box::new(m.cached.clone()))?;
        Ok(m)
    }
}

/// Any embedder, counted.
pub struct Instrumented {
    inner: Arc<dyn Embedder>,
    kind: &'static str,
    metrics: EmbedderMetrics,
}

impl Instrumented {
    pub fn new(inner: Arc<dyn Embedder>, kind: &'static str, metrics: EmbedderMetrics) -> Self {
        Instrumented { inner, kind, metrics }
    }
}

impl Embedder for Instrumented {
    fn dim(&self) -> usize {
        self.inner.dim()
    }

    fn embed_batch(&self, texts: &[&str]) -> Vec<Embedding> {
        let started = Instant::now();
        let out = self.inner.embed_batch(texts);
        self.metrics.batch_seconds.with_label_values(&[self.kind]).observe(started.elapsed().as_secs_f64());
        self.metrics.texts.with_label_values(&[self.kind]).inc_by(texts.len() as u64);
        out
    }

    fn bit_exact(&self) -> bool {
        self.inner.bit_exact()
    }
}

pub(crate) fn l2_normalise(mut v: Vec<f32>) -> Embedding {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
    Embedding::new(v)
}

/// A logged embedding: `{"model":M,"key":H,"vector":[…]}`.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LoggedEmbedding {
    pub model: String,
    pub key: String,
    pub vector: Vec<f32>,
}

pub type EmbeddingLog = JsonLog<LoggedEmbedding>;

/// The key of a text in the embedding log: the text's content key. Not scoped by space: a vector is a function of
/// the model and the text alone, and one text sent to many spaces is embedded once.
pub fn text_key(text: &str) -> String {
    content_hex(text.as_bytes())
}

/// The key a log written before [`text_key`] holds a text's vector under.
pub fn legacy_text_key(text: &str) -> String {
    operators::hash::legacy_content_hex(text.as_bytes())
}

#[cfg(feature = "local-embedder")]
pub use local::LocalEmbedder;

#[cfg(feature = "local-embedder")]
mod local {
    use super::*;
    use std::path::Path;

    use candle_core::{DType, Device, Tensor};
    use candle_nn::VarBuilder;
    use candle_transformers::models::bert::{BertModel, Config};
    use tokenizers::{PaddingParams, PaddingStrategy, Tokenizer, TruncationParams};

    /// all-MiniLM-L6-v2-class sentence-transformers, in-process on the CPU.
    pub struct LocalEmbedder {
        model: BertModel,
        tokenizer: Tokenizer,
        dim: usize,
        batch: usize,
    }

    impl LocalEmbedder {
        /// Loads `config.json`, `model.safetensors` and `tokenizer.json` from `dir`. Sequences are padded to the
        /// longest in the batch and truncated at `max_seq_length` from `sentence_bert_config.json` (256 when absent),
        /// as sentence-transformers does — not at the fixed 128 the shipped tokenizer.json asks for.
        pub fn load(dir: &Path, batch: usize) -> Result<Self, String> {
            let read = |name: &str| {
                std::fs::read(dir.join(name)).map_err(|e| format!("reading {}: {e}", dir.join(name).display()))
            };
            let config: Config =
                serde_json::from_slice(&read("config.json")?).map_err(|e| format!("config.json: {e}"))?;
            let dim = config.hidden_size;
            let max_len = std::fs::read(dir.join("sentence_bert_config.json"))
                .ok()
                .and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok())
                .and_then(|v| v["max_seq_length"].as_u64())
                .unwrap_or(256) as usize;
            let mut tokenizer =
                Tokenizer::from_bytes(read("tokenizer.json")?).map_err(|e| format!("tokenizer.json: {e}"))?;
            let pad_id = tokenizer.get_padding().map(|p| p.pad_id).unwrap_or(0);
            tokenizer.with_padding(Some(PaddingParams {
                strategy: PaddingStrategy::BatchLongest,
                pad_id,
                ..Default::default()
            }));
            tokenizer
                .with_truncation(Some(TruncationParams { max_length: max_len, ..Default::default() }))
                .map_err(|e| format!("tokenizer truncation: {e}"))?;
            let weights = dir.join("model.safetensors");
            // SAFETY is not needed: the weights are read into memory, not mapped.
            let vb = VarBuilder::from_buffered_safetensors(read("model.safetensors")?, DType::F32, &Device::Cpu)
                .map_err(|e| format!("{}: {e}", weights.display()))?;
            let model =
                BertModel::load(vb, &config).map_err(|e| format!("loading BERT from {}: {e}", dir.display()))?;
            Ok(LocalEmbedder { model, tokenizer, dim, batch: batch.max(1) })
        }

        fn embed_chunk(&self, texts: &[&str]) -> Result<Vec<Embedding>, String> {
            let enc = self.tokenizer.encode_batch(texts.to_vec(), true).map_err(|e| format!("tokenizing: {e}"))?;
            let n = enc.len();
            let len = enc.iter().map(|e| e.get_ids().len()).max().unwrap_or(0);
            let mut ids = Vec::with_capacity(n * len);
            let mut types = Vec::with_capacity(n * len);
            let mut mask = Vec::with_capacity(n * len);
            for e in &enc {
                ids.extend(e.get_ids().iter().copied());
                types.extend(e.get_type_ids().iter().copied());
                mask.extend(e.get_attention_mask().iter().copied());
            }
            let dev = Device::Cpu;
            let t = |v: Vec<u32>| Tensor::from_vec(v, (n, len), &dev).map_err(|e| e.to_string());
            let (ids, types, mask) = (t(ids)?, t(types)?, t(mask)?);
            let hidden = self.model.forward(&ids, &types, Some(&mask)).map_err(|e| format!("BERT forward: {e}"))?;
            // Mean over the real tokens: sum(hidden * mask) / sum(mask).
            let m = mask.to_dtype(DType::F32).and_then(|m| m.unsqueeze(2)).map_err(|e| e.to_string())?;
            let summed = hidden.broadcast_mul(&m).and_then(|x| x.sum(1)).map_err(|e| e.to_string())?;
            let counts = m.sum(1).map_err(|e| e.to_string())?;
            let pooled = summed.broadcast_div(&counts).map_err(|e| e.to_string())?;
            let rows: Vec<Vec<f32>> = pooled.to_vec2().map_err(|e| e.to_string())?;
            Ok(rows.into_iter().map(l2_normalise).collect())
        }
    }

    impl Embedder for LocalEmbedder {
        fn dim(&self) -> usize {
            self.dim
        }

        fn embed_batch(&self, texts: &[&str]) -> Vec<Embedding> {
            let mut out = Vec::with_capacity(texts.len());
            // Similar lengths in one forward pass waste less on padding; the output keeps the input order.
            let mut order: Vec<usize> = (0..texts.len()).collect();
            order.sort_by_key(|&i| texts[i].len());
            let mut slots: Vec<Option<Embedding>> = vec![None; texts.len()];
            for chunk in order.chunks(self.batch) {
                let batch: Vec<&str> = chunk.iter().map(|&i| texts[i]).collect();
                match self.embed_chunk(&batch) {
                    Ok(vs) => chunk.iter().zip(vs).for_each(|(&i, v)| slots[i] = Some(v)),
                    // Inference on a loaded model fails only on a bug or exhausted memory: say so loudly.
                    Err(e) => panic!("local embedder failed on a batch of {}: {e}", batch.len()),
                }
            }
            out.extend(slots.into_iter().map(|s| s.expect("every slot filled")));
            out
        }

        /// Float sums in a forward pass depend on the batch's padded length.
        fn bit_exact(&self) -> bool {
            false
        }
    }
}
