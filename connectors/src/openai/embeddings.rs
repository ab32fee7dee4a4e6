//! [`OpenAiEmbedder`]: any OpenAI-compatible `POST /v1/embeddings` (OpenAI, Ollama, vLLM, TEI, llama.cpp server),
//! batched, under the same budget as the LLM client (requests and tokens per minute, in flight, retries). Its
//! vectors are logged like LLM responses — keyed by (model, text hash), fsync'd, read back at start — so a replay or
//! restart embeds nothing twice and rebuilds the same memory bit for bit.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use operators::{Embedder, Embedding};

use crate::embedders::{l2_normalise, legacy_text_key, text_key, EmbedderMetrics, EmbeddingLog, LoggedEmbedding};
use crate::openai::client::OpenAiClient;

/// An OpenAI-compatible embeddings endpoint behind the embedding log.
pub struct OpenAiEmbedder {
    client: Arc<OpenAiClient>,
    runtime: Option<tokio::runtime::Runtime>,
    dim: usize,
    batch: usize,
    log: Mutex<(EmbeddingLog, HashMap<String, Vec<f32>>)>,
    metrics: Option<EmbedderMetrics>,
}

impl Drop for OpenAiEmbedder {
    fn drop(&mut self) {
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl OpenAiEmbedder {
    /// Opens (and reads back) the embedding log at `log_path`; learns the dimension from the log or, when the log
    /// has no vector of this model yet, from one probe request — so a wrong URL, model or key is an error at start,
    /// not a stalled stage later.
    pub fn new(
        client: OpenAiClient,
        log_path: &Path,
        batch: usize,
        metrics: Option<EmbedderMetrics>,
    ) -> Result<Self, String> {
        let replay = EmbeddingLog::replay(log_path).map_err(|e| format!("reading {}: {e}", log_path.display()))?;
        let model = client.model().to_string();
        let cache: HashMap<String, Vec<f32>> =
            replay.records.into_iter().filter(|r| r.model == model).map(|r| (r.key, r.vector)).collect();
        let log = EmbeddingLog::open(log_path).map_err(|e| format!("opening {}: {e}", log_path.display()))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .map_err(|e| format!("starting the embedder's runtime: {e}"))?;
        let client = Arc::new(client);
        let dim = match cache.values().next() {
            Some(v) => v.len(),
            None => {
                let c = client.clone();
                let probe = runtime
                    .block_on(async move { c.embeddings("embed", &["engram"]).await })
                    .map_err(|e| format!("embedder probe request failed: {e}"))?;
                probe.first().map(Vec::len).filter(|d| *d > 0).ok_or("the embedder probe returned an empty vector")?
            }
        };
        Ok(OpenAiEmbedder {
            client,
            runtime: Some(runtime),
            dim,
            batch: batch.max(1),
            log: Mutex::new((log, cache)),
            metrics,
        })
    }

    /// Requests the vectors of `texts`, waiting out failures: a stage that cannot embed waits (backpressure, visible
    /// in `engram_embedder_requests_total{outcome="error"}` and the log) rather than dropping or inventing vectors.
    fn request(&self, texts: &[&str]) -> Vec<Vec<f32>> {
        let runtime = self.runtime.as_ref().expect("the runtime lives as long as the embedder");
        let mut wait = Duration::from_millis(500);
        loop {
            let c = self.client.clone();
            let owned: Vec<String> = texts.iter().map(|t| t.to_string()).collect();
            let result = runtime.block_on(async move {
                let refs: Vec<&str> = owned.iter().map(String::as_str).collect();
                c.embeddings("embed", &refs).await
            });
            match result {
                Ok(v) if v.iter().all(|x| x.len() == self.dim) => return v,
                Ok(v) => tracing::warn!(
                    expected = self.dim,
                    got = v.first().map(Vec::len),
                    "embeddings of the wrong dimension; waiting and asking again"
                ),
                Err(e) => tracing::warn!(error = %e, ?wait, "embedding request failed; waiting and asking again"),
            }
            std::thread::sleep(wait);
            wait = (wait * 2).min(Duration::from_secs(30));
        }
    }
}

impl Embedder for OpenAiEmbedder {
    fn dim(&self) -> usize {
        self.dim
    }

    fn embed_batch(&self, texts: &[&str]) -> Vec<Embedding> {
        let keys: Vec<String> = texts.iter().map(|t| text_key(t)).collect();
        let mut missing: Vec<usize> = Vec::new();
        {
            let mut guard = self.log.lock().expect("embedding log lock");
            let mut seen = std::collections::HashSet::new();
            let mut upgraded = Vec::new();
            for (i, k) in keys.iter().enumerate() {
                if guard.1.contains_key(k) || !seen.insert(k.clone()) {
                    continue;
                }
                // A log written before today's keys holds the text under its earlier key: logged again, not asked.
                match guard.1.get(&legacy_text_key(texts[i])) {
                    Some(v) => upgraded.push(LoggedEmbedding {
                        model: self.client.model().to_string(),
                        key: k.clone(),
                        vector: v.clone(),
                    }),
                    None => missing.push(i),
                }
            }
            // The earlier line stays in the log, so a vector is in the log whether or not this append lands.
            if !upgraded.is_empty() {
                if let Err(e) = guard.0.append(&upgraded) {
                    tracing::warn!(error = %e, "could not log embeddings again under today's keys");
                }
                for r in upgraded {
                    guard.1.insert(r.key, r.vector);
                }
            }
        }
        if let Some(m) = &self.metrics {
            m.cached.with_label_values(&["openai"]).inc_by((texts.len() - missing.len()) as u64);
        }
        for chunk in missing.chunks(self.batch) {
            let batch: Vec<&str> = chunk.iter().map(|&i| texts[i]).collect();
            let vectors = self.request(&batch);
            let model = self.client.model().to_string();
            let rows: Vec<LoggedEmbedding> = chunk
                .iter()
                .zip(vectors)
                .map(|(&i, vector)| LoggedEmbedding { model: model.clone(), key: keys[i].clone(), vector })
                .collect();
            let mut guard = self.log.lock().expect("embedding log lock");
            // Logged before use: a vector that entered the memory is always in the log.
            while let Err(e) = guard.0.append(&rows) {
                tracing::error!(error = %e, "cannot append to the embedding log; retrying");
                std::thread::sleep(Duration::from_secs(1));
            }
            for r in rows {
                guard.1.insert(r.key, r.vector);
            }
        }
        let guard = self.log.lock().expect("embedding log lock");
        keys.iter().map(|k| l2_normalise(guard.1.get(k).cloned().unwrap_or_default())).collect()
    }
}
