//! The built-in extractive backend: the [`Llm`] port answered without a model. Summaries are the cluster's most
//! central sentences ([`extractive_summary`]), sessions are segmented at time gaps and topic shifts
//! ([`extractive_segments`]) and related by order, cue phrases and shared people ([`extractive_relations`]); the
//! query-time stages answer `None`, so retrieval uses its similarity rules. A baseline, documented as one, and
//! deterministic, so a replay gives the same memory without the response log.

use crate::events::{extractive_relations, extractive_segments, SegmentParams};
use crate::llm::{EventDraft, EventIn, Llm, LlmError, RelationDraft, TurnIn};
use crate::summary::extractive_summary;

/// The built-in extractive backend.
#[derive(Clone, Debug)]
pub struct Extractive {
    pub max_words: usize,
}

impl Default for Extractive {
    fn default() -> Self {
        Extractive { max_words: 80 }
    }
}

impl Llm for Extractive {
    fn model(&self) -> &str {
        "extractive"
    }

    fn summarize(&self, texts: &[&str]) -> Result<String, LlmError> {
        Ok(extractive_summary(texts, self.max_words))
    }

    fn segment(&self, turns: &[TurnIn]) -> Result<Vec<EventDraft>, LlmError> {
        Ok(extractive_segments(turns, &SegmentParams { summary_words: self.max_words, ..SegmentParams::default() }))
    }

    fn relate(&self, events: &[EventIn]) -> Result<Vec<RelationDraft>, LlmError> {
        Ok(extractive_relations(events, SegmentParams::default().relations))
    }
}
