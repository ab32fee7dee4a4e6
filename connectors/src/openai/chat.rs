//! The chat backend: [`OpenAiLlm`], the memory's [`Llm`] stages (summaries, segmentation, relations, selection,
//! planning, exploration, the co-reference judge, answers) over [`OpenAiClient::chat_json`], each with its JSON
//! schema, prompt and reply check.

use std::sync::Arc;

use operators::events::{EventDraft, EventIn, RelationDraft, RelationKind, TurnIn};
use operators::llm::{Llm, LlmError};
use serde_json::{json, Value};

use crate::openai::client::OpenAiClient;
use crate::openai::prompts::{
    answer_prompt, numbered, summary_prompt, ANSWER_SYSTEM, EXPLORE_SYSTEM, JUDGE_SYSTEM, PLAN_SYSTEM, RELATE_SYSTEM,
    SEGMENT_SYSTEM, SELECT_SYSTEM, SUMMARY_SYSTEM,
};
use crate::openai::replies::{
    validate_actions, validate_plan, validate_relations, validate_segments, validate_selection, validate_verdict,
};

/// The summary stage over the OpenAI-compatible client: implements the memory's [`Llm`] trait. Calls block the
/// calling thread (the summariser's workers) on the client's own runtime.
pub struct OpenAiLlm {
    client: Arc<OpenAiClient>,
    runtime: Option<tokio::runtime::Runtime>,
    max_words: usize,
}

impl Drop for OpenAiLlm {
    fn drop(&mut self) {
        // May be dropped on an async thread (an HTTP handler, a test): never block there.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl OpenAiLlm {
    pub fn new(client: OpenAiClient, max_words: usize) -> std::io::Result<Self> {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
        Ok(OpenAiLlm { client: Arc::new(client), runtime: Some(runtime), max_words })
    }

    /// One structured call on the client's own runtime, blocking the calling thread (the summariser's workers).
    fn call<T>(
        &self,
        stage: &str,
        system: &str,
        user: &str,
        schema: &Value,
        validate: impl Fn(&Value) -> Result<T, String>,
    ) -> Result<T, LlmError> {
        let runtime = self.runtime.as_ref().ok_or_else(|| LlmError::Service("the client is shut down".into()))?;
        runtime.block_on(self.client.chat_json(stage, system, user, schema, validate))
    }

    /// Finds the structured-output form the server enforces ([`OpenAiClient::probe_response_format`]), blocking.
    pub fn probe_response_format(&self) -> Result<crate::openai::ResponseFormat, String> {
        let runtime = self.runtime.as_ref().ok_or_else(|| "the client is shut down".to_string())?;
        runtime.block_on(self.client.probe_response_format())
    }

    /// The user message of the summary stage, under this backend's word budget.
    pub fn summary_prompt(&self, texts: &[&str]) -> String {
        summary_prompt(self.max_words, texts)
    }
}

impl Llm for OpenAiLlm {
    fn model(&self) -> &str {
        self.client.model()
    }

    fn summarize(&self, texts: &[&str]) -> Result<String, LlmError> {
        let schema = json!({
            "type": "object",
            "properties": {"summary": {"type": "string"}},
            "required": ["summary"],
            "additionalProperties": false,
        });
        let user = self.summary_prompt(texts);
        self.call("summary", SUMMARY_SYSTEM, &user, &schema, |v| match v.get("summary") {
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(s.trim().to_string()),
            Some(Value::String(_)) => Err("`summary` is empty".into()),
            Some(_) => Err("`summary` must be a string".into()),
            None => Err("missing `summary`".into()),
        })
    }

    fn segment(&self, turns: &[TurnIn]) -> Result<Vec<EventDraft>, LlmError> {
        let schema = json!({
            "type": "object",
            "properties": {"events": {"type": "array", "items": {
                "type": "object",
                "properties": {
                    "turns": {"type": "array", "items": {"type": "integer"}},
                    "summary": {"type": "string"},
                    "people": {"type": "array", "items": {"type": "string"}},
                    "time": {"type": ["string", "null"]},
                },
                "required": ["turns", "summary", "people", "time"],
                "additionalProperties": false,
            }}},
            "required": ["events"],
            "additionalProperties": false,
        });
        let rows: Vec<Value> = turns
            .iter()
            .enumerate()
            .map(|(i, t)| json!({"turn": i + 1, "speaker": t.speaker, "time": t.ts, "text": t.text}))
            .collect();
        let user = format!("Turns (JSON):\n{}", serde_json::to_string_pretty(&rows).unwrap_or_default());
        let n = turns.len();
        self.call("segment", SEGMENT_SYSTEM, &user, &schema, |v| validate_segments(v, n))
    }

    fn relate(&self, events: &[EventIn]) -> Result<Vec<RelationDraft>, LlmError> {
        let kinds: Vec<&str> = RelationKind::ALL.iter().map(|k| k.name()).collect();
        let schema = json!({
            "type": "object",
            "properties": {"relations": {"type": "array", "items": {
                "type": "object",
                "properties": {"from": {"type": "integer"}, "to": {"type": "integer"}, "kind": {"type": "string", "enum": kinds}},
                "required": ["from", "to", "kind"],
                "additionalProperties": false,
            }}},
            "required": ["relations"],
            "additionalProperties": false,
        });
        let rows: Vec<Value> = events
            .iter()
            .enumerate()
            .map(|(i, e)| json!({"event": i + 1, "time": e.time, "people": e.people, "summary": e.summary}))
            .collect();
        let user = format!("Events (JSON):\n{}", serde_json::to_string_pretty(&rows).unwrap_or_default());
        let n = events.len();
        self.call("relate", RELATE_SYSTEM, &user, &schema, |v| validate_relations(v, n))
    }

    fn select(&self, question: &str, candidates: &[&str]) -> Result<Option<Vec<usize>>, LlmError> {
        let schema = json!({
            "type": "object",
            "properties": {"relevant": {"type": "array", "items": {"type": "integer"}}},
            "required": ["relevant"],
            "additionalProperties": false,
        });
        let user = format!("Question: {question}\nPassages (JSON):\n{}", numbered("passage", candidates));
        let n = candidates.len();
        self.call("select", SELECT_SYSTEM, &user, &schema, |v| validate_selection(v, n)).map(Some)
    }

    fn plan(&self, question: &str) -> Result<Option<Vec<String>>, LlmError> {
        let schema = json!({
            "type": "object",
            "properties": {"subgoals": {"type": "array", "items": {"type": "string"}}},
            "required": ["subgoals"],
            "additionalProperties": false,
        });
        self.call("plan", PLAN_SYSTEM, &format!("Question: {question}"), &schema, validate_plan).map(Some)
    }

    fn explore(
        &self,
        question: &str,
        subgoal: &str,
        events: &[&str],
    ) -> Result<Option<Vec<operators::llm::Explore>>, LlmError> {
        let schema = json!({
            "type": "object",
            "properties": {"actions": {"type": "array", "items": {
                "type": "object",
                "properties": {"event": {"type": "integer"}, "action": {"type": "string", "enum": ["answer", "expand", "skip"]}},
                "required": ["event", "action"],
                "additionalProperties": false,
            }}},
            "required": ["actions"],
            "additionalProperties": false,
        });
        let user = format!("Question: {question}\nSubgoal: {subgoal}\nEvents (JSON):\n{}", numbered("event", events));
        let n = events.len();
        self.call("explore", EXPLORE_SYSTEM, &user, &schema, |v| validate_actions(v, n)).map(Some)
    }

    fn judge(&self, a: &str, b: &str) -> Result<Option<operators::events::Verdict>, LlmError> {
        let schema = json!({
            "type": "object",
            "properties": {"verdict": {"type": "string", "enum": ["same_event", "has_overlap", "different"]}},
            "required": ["verdict"],
            "additionalProperties": false,
        });
        let user = format!("Event 1: {a}\nEvent 2: {b}");
        self.call("judge", JUDGE_SYSTEM, &user, &schema, validate_verdict).map(Some)
    }

    fn answer(&self, question: &str, evidence: &[&str]) -> Result<Option<String>, LlmError> {
        let schema = json!({
            "type": "object",
            "properties": {"answer": {"type": "string"}},
            "required": ["answer"],
            "additionalProperties": false,
        });
        let user = answer_prompt(question, evidence);
        self.call("answer", ANSWER_SYSTEM, &user, &schema, |v| match v.get("answer") {
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(s.trim().to_string())),
            Some(Value::String(_)) => Err("`answer` is empty".into()),
            Some(_) => Err("`answer` must be a string".into()),
            None => Err("missing `answer`".into()),
        })
    }
}
