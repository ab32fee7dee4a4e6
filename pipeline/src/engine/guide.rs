//! The model at query time: every call logged like the memory's requests (keyed by stage and inputs), so the same
//! call again, or after a restart, is answered from the log.

use connectors::LoggedResponse;
use operators::llm::{Explore, Llm, LlmError};
use operators::request::{legacy_query_key, query_key};

use super::state::Shared;

impl Shared {
    /// A query-time model call, logged like summaries: keyed by the stage and its inputs, so the same call again,
    /// or after a restart, is answered from the log. `None` without a model.
    fn remember<T>(
        &self,
        space: &str,
        stage: &str,
        inputs: &[&str],
        call: impl FnOnce(&dyn Llm) -> Result<Option<T>, LlmError>,
    ) -> Result<Option<T>, LlmError>
    where
        T: serde::Serialize + serde::de::DeserializeOwned,
    {
        let key = query_key(stage, inputs);
        {
            // Today's key, then the key a log written before it used.
            let answers = self.answers.lock().expect("answers lock");
            let logged = answers
                .get(&(space.to_string(), key.clone()))
                .or_else(|| answers.get(&(space.to_string(), legacy_query_key(stage, inputs))));
            if let Some(v) = logged.and_then(|l| serde_json::from_str(l).ok()) {
                return Ok(Some(v));
            }
        }
        let Some(reply) = call(self.llm.as_ref())? else { return Ok(None) };
        let text = serde_json::to_string(&reply).map_err(|e| LlmError::BadReply(e.to_string()))?;
        let logged = LoggedResponse {
            model: self.llm.model().to_string(),
            space: space.to_string(),
            key: key.clone(),
            response: text.clone(),
            covers: None,
            fallback: None,
        };
        match self.response_log.lock().expect("response log lock").append(std::slice::from_ref(&logged)) {
            Ok(()) => {
                self.outputs.responses(std::slice::from_ref(&logged));
                self.answers.lock().expect("answers lock").insert((space.to_string(), key), text);
            }
            Err(e) => {
                tracing::error!(error = %e, stage, "could not append a query-time reply to the response log; it is not kept")
            }
        }
        Ok(Some(reply))
    }

    /// The model's short answer to `question` from `evidence` (best first), `None` without a model.
    pub fn answer(&self, space: &str, question: &str, evidence: &[&str]) -> Result<Option<String>, LlmError> {
        let mut inputs = vec![question];
        inputs.extend_from_slice(evidence);
        self.remember(space, "answer", &inputs, |llm| llm.answer(question, evidence))
    }
}

/// The model's part in one query's retrieval (`query::Guide`), every call logged under the space.
pub struct ModelGuide<'a> {
    pub shared: &'a Shared,
    pub space: &'a str,
}

impl crate::query::Guide for ModelGuide<'_> {
    fn select(&self, question: &str, candidates: &[&str]) -> Result<Option<Vec<usize>>, String> {
        let mut inputs = vec![question];
        inputs.extend_from_slice(candidates);
        self.shared
            .remember(self.space, "select", &inputs, |llm| llm.select(question, candidates))
            .map_err(|e| e.to_string())
    }

    fn plan(&self, question: &str) -> Result<Option<Vec<String>>, String> {
        self.shared.remember(self.space, "plan", &[question], |llm| llm.plan(question)).map_err(|e| e.to_string())
    }

    fn explore(&self, question: &str, subgoal: &str, events: &[&str]) -> Result<Option<Vec<Explore>>, String> {
        let mut inputs = vec![question, subgoal];
        inputs.extend_from_slice(events);
        self.shared
            .remember(self.space, "explore", &inputs, |llm| llm.explore(question, subgoal, events))
            .map_err(|e| e.to_string())
    }
}
