//! The model factories: the summariser's model and the configured embedder, from the config.

use std::sync::Arc;
use std::time::Duration;

use operators::extractive::Extractive;
use operators::llm::Llm;
use operators::{Embedder, HashEmbedder};

use crate::config::Config;
use crate::metrics::Metrics;

/// A configured API key, else the OPENAI_API_KEY environment variable, if either is set.
fn api_key(configured: &str) -> Option<String> {
    Some(configured.to_string())
        .filter(|k| !k.is_empty())
        .or_else(|| std::env::var("OPENAI_API_KEY").ok().filter(|k| !k.is_empty()))
}

/// The summariser's model: the built-in extractive backend, or an OpenAI-compatible server.
pub fn make_llm(config: &Config, metrics: &Metrics) -> anyhow::Result<Arc<dyn Llm>> {
    use crate::config::{LlmBackend, ResponseFormatName};
    use connectors::openai::{OpenAiClient, OpenAiConfig, OpenAiLlm, ResponseFormat};
    Ok(match config.llm.backend {
        LlmBackend::Extractive => Arc::new(Extractive { max_words: config.hierarchy.summary_words }),
        LlmBackend::Openai => {
            let l = &config.llm;
            let api_key = api_key(&l.api_key);
            let client = OpenAiClient::new(
                OpenAiConfig {
                    base_url: l.base_url.clone(),
                    model: l.model.clone(),
                    api_key,
                    requests_per_minute: l.requests_per_minute,
                    tokens_per_minute: l.tokens_per_minute,
                    max_in_flight: l.max_in_flight,
                    timeout: l.timeout,
                    max_retries: l.max_retries,
                    response_format: match l.response_format {
                        ResponseFormatName::Auto | ResponseFormatName::JsonSchema => ResponseFormat::JsonSchema,
                        ResponseFormatName::JsonObjectSchema => ResponseFormat::JsonObjectSchema,
                        ResponseFormatName::JsonObject => ResponseFormat::JsonObject,
                    },
                    max_tokens: l.max_tokens,
                    backoff: Duration::from_millis(500),
                },
                metrics.llm.clone(),
            )
            .map_err(|e| anyhow::anyhow!(e))?;
            let llm = OpenAiLlm::new(client, config.hierarchy.summary_words)?;
            if l.response_format == ResponseFormatName::Auto {
                match llm.probe_response_format() {
                    Ok(f) => tracing::info!(format = f.name(), "the model server enforces this structured-output form"),
                    Err(why) => tracing::warn!(%why,
                        "no structured-output form is enforced by the model server; asking with json-schema"),
                }
            }
            Arc::new(llm)
        }
    })
}

#[cfg(feature = "kafka")]
pub(super) fn kafka_metrics(m: &Metrics) -> Option<connectors::kafka::KafkaMetrics> {
    Some(m.kafka.clone())
}

#[cfg(not(feature = "kafka"))]
pub(super) fn kafka_metrics(_m: &Metrics) -> Option<()> {
    None
}

/// The configured embedder, counted. `openai` vectors are logged in `dir/embeddings.log`.
pub fn make_embedder(config: &Config, metrics: &Metrics, dir: &std::path::Path) -> anyhow::Result<Arc<dyn Embedder>> {
    use crate::config::EmbedderKind;
    use connectors::embedders::{Instrumented, OpenAiEmbedder};
    use connectors::openai::{OpenAiClient, OpenAiConfig, ResponseFormat};
    let e = &config.embedder;
    let (inner, kind): (Arc<dyn Embedder>, &'static str) = match e.kind {
        EmbedderKind::Hash => (Arc::new(HashEmbedder::new(e.dim)), "hash"),
        #[cfg(feature = "local-embedder")]
        EmbedderKind::Local => {
            let m = connectors::embedders::LocalEmbedder::load(std::path::Path::new(&e.model_dir), e.batch)
                .map_err(|err| anyhow::anyhow!("embedder.model-dir: {err}"))?;
            (Arc::new(m), "local")
        }
        #[cfg(not(feature = "local-embedder"))]
        EmbedderKind::Local => anyhow::bail!("embedder.kind = \"local\": built without the local-embedder feature"),
        EmbedderKind::Openai => {
            let api_key = api_key(&e.api_key);
            let client = OpenAiClient::new(
                OpenAiConfig {
                    base_url: e.base_url.clone(),
                    model: e.model.clone(),
                    api_key,
                    requests_per_minute: e.requests_per_minute,
                    tokens_per_minute: e.tokens_per_minute,
                    max_in_flight: 2,
                    timeout: e.timeout,
                    max_retries: 5,
                    response_format: ResponseFormat::JsonObject,
                    max_tokens: 0,
                    backoff: Duration::from_millis(500),
                },
                metrics.embedder_requests.clone(),
            )
            .map_err(|err| anyhow::anyhow!(err))?;
            let m = OpenAiEmbedder::new(client, &dir.join("embeddings.log"), e.batch, Some(metrics.embedder.clone()))
                .map_err(|err| anyhow::anyhow!("embedder: {err}"))?;
            (Arc::new(m), "openai")
        }
    };
    Ok(Arc::new(Instrumented::new(inner, kind, metrics.embedder.clone())))
}
