//! An OpenAI-compatible chat-completions and embeddings client (OpenAI, Ollama, vLLM, llama.cpp server, LM Studio
//! all serve `POST {base}/chat/completions`; most also `POST {base}/embeddings`), bounded and observable:
//!
//! * requests-per-minute and tokens-per-minute limits (governor); when the budget is spent, work waits — it is never
//!   dropped;
//! * at most `max-in-flight` requests at once, each with a timeout;
//! * retries with exponential backoff and jitter on 429, 5xx, timeouts and transport errors, honouring `Retry-After`;
//! * structured output: the reply is asked for as JSON (`json_schema`, or `json_object` for servers without schema
//!   support), validated against the expected shape, repaired once by asking again with the error, then a typed
//!   error.
//!
//! Memory content goes into the prompt as data (serialised by serde, fenced and labelled as such); the reply is
//! parsed strictly, so text inside the memory cannot change what is parsed.
//!
//! * [`client`]: [`OpenAiClient`] — config, budget, retries, `Retry-After`, chat and embeddings requests;
//! * [`chat`]: [`OpenAiLlm`], the memory's `Llm` stages over the client;
//! * [`embeddings`]: [`OpenAiEmbedder`], `POST {base}/embeddings` behind the embedding log;
//! * [`replies`]: the strict checks on the chat stages' replies;
//! * `prompts`: the system prompts and user-message builders.

pub mod chat;
pub mod client;
pub mod embeddings;
mod prompts;
pub mod replies;

pub use chat::OpenAiLlm;
pub use client::{estimate_tokens, LlmMetrics, OpenAiClient, OpenAiConfig, ResponseFormat};
pub use embeddings::OpenAiEmbedder;
pub use prompts::answer_prompt;
pub use replies::{
    validate_actions, validate_plan, validate_relations, validate_segments, validate_selection, validate_verdict,
};
