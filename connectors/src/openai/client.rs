//! The OpenAI-compatible HTTP client: one [`OpenAiClient`] per endpoint, bounded and observable:
//!
//! * requests-per-minute and tokens-per-minute limits (governor); when the budget is spent, work waits — it is never
//!   dropped;
//! * at most `max-in-flight` requests at once, each with a timeout;
//! * retries with exponential backoff and jitter on 429, 5xx, timeouts and transport errors, honouring `Retry-After`;
//! * structured output ([`OpenAiClient::chat_json`]): the reply is asked for as JSON, validated, repaired once.

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use operators::llm::LlmError;
use prometheus::{HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry};
use serde_json::{json, Value};

use crate::openai::replies::{snippet, strip_fences};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResponseFormat {
    /// `response_format: {type: "json_schema", …}` (OpenAI, vLLM, LM Studio, Ollama ≥ 0.5).
    JsonSchema,
    /// `response_format: {type: "json_object", schema: …}`: the form llama.cpp's servers (llama-cpp-python among them)
    /// enforce with a grammar, where they answer `json_schema` with an error.
    JsonObjectSchema,
    /// `response_format: {type: "json_object"}`, the schema described in the prompt only (nothing enforces it).
    JsonObject,
}

impl ResponseFormat {
    pub fn name(self) -> &'static str {
        match self {
            ResponseFormat::JsonSchema => "json-schema",
            ResponseFormat::JsonObjectSchema => "json-object-schema",
            ResponseFormat::JsonObject => "json-object",
        }
    }

    fn body(self, stage: &str, schema: &Value) -> Value {
        match self {
            ResponseFormat::JsonSchema => {
                json!({"type": "json_schema", "json_schema": {"name": stage, "schema": schema, "strict": true}})
            }
            ResponseFormat::JsonObjectSchema => json!({"type": "json_object", "schema": schema}),
            ResponseFormat::JsonObject => json!({"type": "json_object"}),
        }
    }
}

#[derive(Clone, Debug)]
pub struct OpenAiConfig {
    /// Up to and including `/v1`, e.g. `https://api.openai.com/v1` or `http://127.0.0.1:11434/v1`.
    pub base_url: String,
    pub model: String,
    pub api_key: Option<String>,
    pub requests_per_minute: u32,
    pub tokens_per_minute: u32,
    pub max_in_flight: usize,
    pub timeout: Duration,
    pub max_retries: u32,
    pub response_format: ResponseFormat,
    pub max_tokens: u32,
    /// First backoff; doubled per retry, with up to 50 % jitter.
    pub backoff: Duration,
}

/// LLM metrics, registered by the caller.
#[derive(Clone)]
pub struct LlmMetrics {
    pub requests: IntCounterVec,
    /// Structured calls by how they ended: `valid` (the first reply), `repaired` (the reply to the repair round),
    /// `rejected` (neither was the JSON asked for), `failed` (no reply after the retries).
    pub calls: IntCounterVec,
    pub tokens: IntCounterVec,
    pub duration: HistogramVec,
    pub rate_limited_waits: IntCounter,
    pub inflight: IntGauge,
}

impl LlmMetrics {
    /// `engram_llm_*`.
    pub fn new(registry: &Registry) -> prometheus::Result<Self> {
        Self::with_prefix(registry, "engram_llm", "LLM")
    }

    /// The same family under another prefix: `engram_embedder_*` for the OpenAI-compatible embedder.
    pub fn with_prefix(registry: &Registry, prefix: &str, what: &str) -> prometheus::Result<Self> {
        let m = LlmMetrics {
            requests: IntCounterVec::new(
                Opts::new(
                    format!("{prefix}_requests_total"),
                    format!("{what} requests by stage and outcome (logged responses are not requests)"),
                ),
                &["stage", "outcome"],
            )?,
            calls: IntCounterVec::new(
                Opts::new(
                    format!("{prefix}_calls_total"),
                    format!("{what} structured calls by stage and result (valid, repaired, rejected, failed)"),
                ),
                &["stage", "result"],
            )?,
            tokens: IntCounterVec::new(
                Opts::new(
                    format!("{prefix}_tokens_total"),
                    format!("{what} tokens by stage and direction (prompt, completion)"),
                ),
                &["stage", "direction"],
            )?,
            duration: HistogramVec::new(
                HistogramOpts::new(
                    format!("{prefix}_request_duration_seconds"),
                    format!("{what} request latency by stage (one attempt)"),
                )
                .buckets(prometheus::exponential_buckets(0.001, 3.0, 12)?),
                &["stage"],
            )?,
            rate_limited_waits: IntCounter::new(
                format!("{prefix}_rate_limited_waits_total"),
                "Requests that waited for the requests- or tokens-per-minute budget",
            )?,
            inflight: IntGauge::new(format!("{prefix}_inflight"), format!("{what} requests in flight"))?,
        };
        registry.register(Box::new(m.requests.clone()))?;
        registry.register(Box::new(m.calls.clone()))?;
        registry.register(Box::new(m.tokens.clone()))?;
        registry.register(Box::new(m.duration.clone()))?;
        registry.register(Box::new(m.rate_limited_waits.clone()))?;
        registry.register(Box::new(m.inflight.clone()))?;
        Ok(m)
    }
}

/// Why one attempt failed, and whether another can help.
#[derive(Debug)]
enum Attempt {
    Retryable { why: String, retry_after: Option<Duration> },
    Fatal(String),
}

pub struct OpenAiClient {
    http: reqwest::Client,
    cfg: OpenAiConfig,
    rpm: DefaultDirectRateLimiter,
    tpm: DefaultDirectRateLimiter,
    tpm_burst: u32,
    inflight: tokio::sync::Semaphore,
    /// The structured-output form (the configured one, or what [`OpenAiClient::probe_response_format`] found).
    format: std::sync::RwLock<ResponseFormat>,
    metrics: LlmMetrics,
}

/// `n` a minute, with a burst of one second's worth: the budget is spread over the minute rather than spent in
/// its first instant.
fn per_minute(n: u32) -> Quota {
    let burst = NonZeroU32::new((n / 60).max(1)).expect("positive");
    Quota::per_minute(NonZeroU32::new(n.max(1)).expect("positive")).allow_burst(burst)
}

/// A `Retry-After` header in seconds, at most 600; `None` for what is not a finite number of seconds (`NaN`,
/// `inf`, an HTTP date), which then waits the usual backoff.
pub fn retry_after(value: &str) -> Option<Duration> {
    let secs = value.trim().parse::<f64>().ok().filter(|s| s.is_finite())?;
    Some(Duration::from_secs_f64(secs.clamp(0.0, 600.0)))
}

/// A rough token count (4 bytes a token): what the tokens-per-minute budget is charged before the reply says.
pub fn estimate_tokens(s: &str) -> u32 {
    (s.len() / 4).max(1).min(u32::MAX as usize) as u32
}

impl OpenAiClient {
    pub fn new(cfg: OpenAiConfig, metrics: LlmMetrics) -> Result<Self, String> {
        let http = reqwest::Client::builder()
            .timeout(cfg.timeout)
            .build()
            .map_err(|e| format!("building the HTTP client: {e}"))?;
        let tpm_burst = (cfg.tokens_per_minute / 60).max(1);
        Ok(OpenAiClient {
            http,
            rpm: RateLimiter::direct(per_minute(cfg.requests_per_minute)),
            tpm: RateLimiter::direct(per_minute(cfg.tokens_per_minute)),
            tpm_burst,
            inflight: tokio::sync::Semaphore::new(cfg.max_in_flight.max(1)),
            format: std::sync::RwLock::new(cfg.response_format),
            cfg,
            metrics,
        })
    }

    pub fn model(&self) -> &str {
        &self.cfg.model
    }

    /// The structured-output form requests carry.
    pub fn response_format(&self) -> ResponseFormat {
        *self.format.read().expect("format lock")
    }

    /// Finds the structured-output form the server enforces: one small request in each form, strongest first (one
    /// attempt each, no retries), until a reply comes back as the JSON its schema asks for. The form found is used
    /// from then on; when none is (the server refuses them all, answers outside the schema, or cannot be reached),
    /// the configured one stays and the reason is returned.
    pub async fn probe_response_format(&self) -> Result<ResponseFormat, String> {
        let schema = json!({
            "type": "object",
            "properties": {"colour": {"type": "string", "enum": ["red", "green", "blue"]}},
            "required": ["colour"],
        });
        let url = format!("{}/chat/completions", self.cfg.base_url.trim_end_matches('/'));
        let mut why = Vec::new();
        for format in [ResponseFormat::JsonSchema, ResponseFormat::JsonObjectSchema] {
            let body = json!({
                "model": self.cfg.model,
                "messages": [
                    {"role": "system", "content": "Reply with a JSON object only."},
                    {"role": "user", "content": "Name one colour of the sky at noon, as {\"colour\": …}."},
                ],
                "temperature": 0,
                "max_tokens": 20,
                "response_format": format.body("probe", &schema),
            });
            self.wait_for_budget(40).await;
            let result = self.send(&url, &body).await;
            self.metrics.requests.with_label_values(&["probe", if result.is_ok() { "ok" } else { "error" }]).inc();
            let verdict = match result {
                Ok((v, _)) => {
                    let content = v["choices"][0]["message"]["content"].as_str().unwrap_or("");
                    let reply = serde_json::from_str::<Value>(strip_fences(content)).ok();
                    match reply.as_ref().and_then(|r| r["colour"].as_str()) {
                        Some("red" | "green" | "blue") => Ok(()),
                        _ => Err(format!("a reply outside the schema: {}", snippet(content))),
                    }
                }
                Err(Attempt::Fatal(w)) | Err(Attempt::Retryable { why: w, .. }) => Err(w),
            };
            match verdict {
                Ok(()) => {
                    *self.format.write().expect("format lock") = format;
                    return Ok(format);
                }
                Err(w) => why.push(format!("{}: {w}", format.name())),
            }
        }
        Err(why.join("; "))
    }

    /// One structured call: `system` and `user` messages, a JSON reply checked by `validate` (a JSON Schema is sent
    /// when the server supports it). One repair round when the reply does not validate.
    pub async fn chat_json<T>(
        &self,
        stage: &str,
        system: &str,
        user: &str,
        schema: &Value,
        validate: impl Fn(&Value) -> Result<T, String>,
    ) -> Result<T, LlmError> {
        let mut messages = vec![json!({"role": "system", "content": system}), json!({"role": "user", "content": user})];
        let mut last_err = String::new();
        let result = |r: &str| self.metrics.calls.with_label_values(&[stage, r]).inc();
        for repair in 0..2 {
            let content = match self.complete(stage, &messages, schema).await {
                Ok(c) => c,
                Err(e) => {
                    result("failed");
                    return Err(e);
                }
            };
            let parsed = serde_json::from_str::<Value>(strip_fences(&content))
                .map_err(|e| format!("not JSON: {e}"))
                .and_then(|v| validate(&v));
            match parsed {
                Ok(t) => {
                    result(if repair == 0 { "valid" } else { "repaired" });
                    return Ok(t);
                }
                Err(e) => {
                    self.metrics.requests.with_label_values(&[stage, "bad_reply"]).inc();
                    last_err = e.clone();
                    if repair == 0 {
                        messages.push(json!({"role": "assistant", "content": content}));
                        messages.push(json!({"role": "user", "content": format!(
                            "Your reply did not match the required JSON shape ({e}). Reply again with only the JSON object, matching this schema: {schema}")}));
                    }
                }
            }
        }
        result("rejected");
        Err(LlmError::BadReply(last_err))
    }

    /// Sends the messages until a reply comes back or the retries are spent. Returns the message content.
    async fn complete(&self, stage: &str, messages: &[Value], schema: &Value) -> Result<String, LlmError> {
        let mut body = json!({
            "model": self.cfg.model,
            "messages": messages,
            "temperature": 0,
            "max_tokens": self.cfg.max_tokens,
        });
        body["response_format"] = self.response_format().body(stage, schema);
        let prompt_tokens = messages.iter().map(|m| estimate_tokens(m["content"].as_str().unwrap_or(""))).sum::<u32>();
        self.post(stage, "chat/completions", &body, prompt_tokens, self.cfg.max_tokens, |v| {
            let content =
                v["choices"][0]["message"]["content"].as_str().ok_or("no choices[0].message.content")?.to_string();
            let completion = estimate_tokens(&content);
            Ok((content, completion))
        })
        .await
    }

    /// `POST {base}/embeddings` for a batch of texts: one vector per input, in input order (the reply's `index`
    /// decides the order, as the API allows any).
    pub async fn embeddings(&self, stage: &str, texts: &[&str]) -> Result<Vec<Vec<f32>>, LlmError> {
        let body = json!({"model": self.cfg.model, "input": texts, "encoding_format": "float"});
        let tokens = texts.iter().map(|t| estimate_tokens(t)).sum::<u32>();
        let n = texts.len();
        self.post(stage, "embeddings", &body, tokens, 0, move |v| {
            let data = v["data"].as_array().ok_or("no `data` array")?;
            if data.len() != n {
                return Err(format!("{} embeddings for {n} inputs", data.len()));
            }
            let mut out: Vec<Option<Vec<f32>>> = vec![None; n];
            for (pos, item) in data.iter().enumerate() {
                let i = item["index"].as_u64().map(|i| i as usize).unwrap_or(pos);
                let vec = item["embedding"].as_array().ok_or("an item without an `embedding` array")?;
                let vec: Vec<f32> = vec
                    .iter()
                    .map(|x| x.as_f64().map(|f| f as f32).ok_or("a non-number in an embedding"))
                    .collect::<Result<_, _>>()?;
                *out.get_mut(i).ok_or("an `index` out of range")? = Some(vec);
            }
            let out: Vec<Vec<f32>> = out.into_iter().collect::<Option<_>>().ok_or("an input without an embedding")?;
            Ok((out, 0))
        })
        .await
    }

    /// One request with the whole budget: waits for the requests- and tokens-per-minute limits and a slot in flight,
    /// retries what can be retried, counts requests, tokens and latency under `stage`. `extract` reads the reply (a
    /// reply it rejects is retried: a 200 of the wrong shape is the server's fault and may be transient) and returns
    /// the completion-token estimate used when the reply carries no `usage`.
    async fn post<R>(
        &self,
        stage: &str,
        path: &str,
        body: &Value,
        prompt_tokens: u32,
        max_completion: u32,
        extract: impl Fn(&Value) -> Result<(R, u32), String>,
    ) -> Result<R, LlmError> {
        let url = format!("{}/{path}", self.cfg.base_url.trim_end_matches('/'));
        let mut attempt = 0u32;
        loop {
            self.wait_for_budget(prompt_tokens.saturating_add(max_completion)).await;
            let _permit = self.inflight.acquire().await.map_err(|e| LlmError::Service(e.to_string()))?;
            self.metrics.inflight.inc();
            let started = Instant::now();
            let result = self.send(&url, body).await.and_then(|(v, text)| {
                let usage = (v["usage"]["prompt_tokens"].as_u64(), v["usage"]["completion_tokens"].as_u64());
                extract(&v)
                    .map(|(r, completion)| {
                        (r, usage.0.unwrap_or(u64::from(prompt_tokens)), usage.1.unwrap_or(u64::from(completion)))
                    })
                    .map_err(|why| Attempt::Retryable {
                        why: format!("{why} in {}", snippet(&text)),
                        retry_after: None,
                    })
            });
            self.metrics.inflight.dec();
            self.metrics.duration.with_label_values(&[stage]).observe(started.elapsed().as_secs_f64());
            match result {
                Ok((r, p, c)) => {
                    self.metrics.requests.with_label_values(&[stage, "ok"]).inc();
                    self.metrics.tokens.with_label_values(&[stage, "prompt"]).inc_by(p);
                    if c > 0 {
                        self.metrics.tokens.with_label_values(&[stage, "completion"]).inc_by(c);
                    }
                    return Ok(r);
                }
                Err(Attempt::Fatal(why)) => {
                    self.metrics.requests.with_label_values(&[stage, "error"]).inc();
                    return Err(LlmError::Service(why));
                }
                Err(Attempt::Retryable { why, retry_after }) => {
                    self.metrics.requests.with_label_values(&[stage, "retry"]).inc();
                    if attempt >= self.cfg.max_retries {
                        self.metrics.requests.with_label_values(&[stage, "error"]).inc();
                        return Err(LlmError::Service(format!("{why} (after {} attempts)", attempt + 1)));
                    }
                    let backoff = self.cfg.backoff.saturating_mul(1 << attempt.min(16));
                    let jitter = backoff.mul_f64(rand::random::<f64>() * 0.5);
                    let wait = retry_after.unwrap_or_default().max(backoff + jitter);
                    tracing::debug!(stage, attempt, ?wait, why, "request failed; retrying");
                    tokio::time::sleep(wait).await;
                    attempt += 1;
                }
            }
        }
    }

    async fn wait_for_budget(&self, tokens: u32) {
        let n = NonZeroU32::new(tokens.clamp(1, self.tpm_burst)).expect("positive");
        let mut waited = false;
        if self.rpm.check().is_err() {
            waited = true;
            self.rpm.until_ready().await;
        }
        if self.tpm.check_n(n).map(|r| r.is_err()).unwrap_or(true) {
            waited = true;
            // More than a burst can never fit at once: such a request is charged a whole burst.
            let _ = self.tpm.until_n_ready(n).await;
        }
        if waited {
            self.metrics.rate_limited_waits.inc();
        }
    }

    async fn send(&self, url: &str, body: &Value) -> Result<(Value, String), Attempt> {
        let mut req = self.http.post(url).json(body);
        if let Some(key) = &self.cfg.api_key {
            req = req.bearer_auth(key);
        }
        let resp = req.send().await.map_err(|e| Attempt::Retryable {
            why: if e.is_timeout() { "timed out".into() } else { format!("transport: {e}") },
            retry_after: None,
        })?;
        let status = resp.status();
        let retry_after =
            resp.headers().get(reqwest::header::RETRY_AFTER).and_then(|v| v.to_str().ok()).and_then(retry_after);
        let text = resp
            .text()
            .await
            .map_err(|e| Attempt::Retryable { why: format!("reading the body: {e}"), retry_after: None })?;
        if status.as_u16() == 429 || status.is_server_error() {
            return Err(Attempt::Retryable { why: format!("HTTP {status}: {}", snippet(&text)), retry_after });
        }
        if !status.is_success() {
            return Err(Attempt::Fatal(format!("HTTP {status}: {}", snippet(&text))));
        }
        // A 200 whose body is not JSON is the server's fault, and may be transient.
        let v: Value = serde_json::from_str(&text)
            .map_err(|e| Attempt::Retryable { why: format!("malformed response body: {e}"), retry_after: None })?;
        Ok((v, text))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_takes_finite_seconds_only() {
        assert_eq!(retry_after(" 1.5 "), Some(Duration::from_millis(1500)));
        assert_eq!(retry_after("-3"), Some(Duration::ZERO));
        assert_eq!(retry_after("86400"), Some(Duration::from_secs(600)));
        for bad in ["NaN", "nan", "inf", "-inf", "Wed, 21 Oct 2026 07:28:00 GMT", ""] {
            assert_eq!(retry_after(bad), None, "{bad:?}");
        }
    }
}
