//! Summaries: the `Llm` trait the hierarchy and (later) the event memory call, and the built-in extractive backend.
//!
//! The extractive backend is a baseline, not a model: it picks the cluster's most central sentences (those whose
//! words recur across the cluster's texts), in their original order, up to a word budget. Deterministic, so a
//! replay gives the same summaries even without the response log.

use std::collections::HashMap;

use thiserror::Error;

use crate::embed::words;
use crate::events::{
    extractive_relations, extractive_segments, EventDraft, EventIn, RelationDraft, SegmentParams, TurnIn,
};
use crate::hash::fnv1a;

/// Why a summary could not be made. Whose fault it is decides whether a retry can help.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum LlmError {
    #[error("the LLM service failed: {0}")]
    Service(String),
    #[error("the LLM reply did not have the expected shape: {0}")]
    BadReply(String),
}

/// What the memory asks of a language model. Implementations: [`Extractive`] here, OpenAI-compatible clients in
/// `engram-connectors`.
pub trait Llm: Send + Sync {
    /// A model name for the response log key (`extractive` for the built-in backend).
    fn model(&self) -> &str;
    /// Summarises the texts of one cluster into one passage.
    fn summarize(&self, texts: &[&str]) -> Result<String, LlmError>;
    /// Segments a conversation's turns (in order) into events: every turn in exactly one event, events of
    /// consecutive turns, in order.
    fn segment(&self, turns: &[TurnIn]) -> Result<Vec<EventDraft>, LlmError>;
    /// Types the relations among events (in time order).
    fn relate(&self, events: &[EventIn]) -> Result<Vec<RelationDraft>, LlmError>;
    /// A short answer to `question` from the evidence passages (best first); `None` from a backend that does not
    /// generate text (the extractive one: its "answer" is the evidence itself).
    fn answer(&self, _question: &str, _evidence: &[&str]) -> Result<Option<String>, LlmError> {
        Ok(None)
    }
    /// Prune-and-Grow's selection: the indices of the candidate passages relevant to `question`; `None` without a
    /// model (retrieval then uses its similarity rule).
    fn select(&self, _question: &str, _candidates: &[&str]) -> Result<Option<Vec<usize>>, LlmError> {
        Ok(None)
    }
    /// CompassMem's Planner: the question split into 1–5 subgoals; `None` without a model.
    fn plan(&self, _question: &str) -> Result<Option<Vec<String>>, LlmError> {
        Ok(None)
    }
    /// CompassMem's Explorer: for each event (a description), what to do with it for `subgoal`; `None` without a
    /// model.
    fn explore(&self, _question: &str, _subgoal: &str, _events: &[&str]) -> Result<Option<Vec<Explore>>, LlmError> {
        Ok(None)
    }
    /// CompassMem's co-reference judge: are two events (descriptions) one event, overlapping, or different? `None`
    /// without a model.
    fn judge(&self, _a: &str, _b: &str) -> Result<Option<crate::events::Verdict>, LlmError> {
        Ok(None)
    }
}

/// An Explorer's choice for one event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Explore {
    /// Keep it and walk on along its relations.
    Expand,
    /// Keep it; it answers the subgoal, no need to walk on.
    Answer,
    /// Not relevant.
    Skip,
}

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
        Ok(extractive_relations(events))
    }
}

fn sentences(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let b = text.as_bytes();
    for i in 0..b.len() {
        let end = matches!(b[i], b'.' | b'!' | b'?') && (i + 1 == b.len() || b[i + 1].is_ascii_whitespace());
        if end || b[i] == b'\n' {
            let s = text[start..=i].trim();
            if !s.is_empty() {
                out.push(s);
            }
            start = i + 1;
        }
    }
    let rest = text[start..].trim();
    if !rest.is_empty() {
        out.push(rest);
    }
    out
}

/// The most central sentences of `texts`, in order, within `max_words` (at least one sentence, cut to the budget).
pub fn extractive_summary(texts: &[&str], max_words: usize) -> String {
    let all: Vec<(usize, &str)> = texts.iter().flat_map(|t| sentences(t)).enumerate().collect();
    if all.is_empty() {
        return String::new();
    }
    // Document frequency of each word across the texts: a word the whole cluster shares is what it is about.
    let mut df: HashMap<String, f32> = HashMap::new();
    for t in texts {
        let mut seen: Vec<String> = words(t).into_iter().filter(|w| w.len() > 3).collect();
        seen.sort();
        seen.dedup();
        for w in seen {
            *df.entry(w).or_default() += 1.0;
        }
    }
    let mut scored: Vec<(f32, usize, &str)> = all
        .iter()
        .map(|(i, s)| {
            let ws = words(s);
            let score: f32 = ws.iter().filter_map(|w| df.get(w)).sum::<f32>() / (ws.len().max(1) as f32).sqrt();
            (score, *i, *s)
        })
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut chosen: Vec<(usize, &str)> = Vec::new();
    let mut used = 0;
    let top = scored[0].0;
    for (score, i, s) in scored {
        // Peripheral sentences do not fill the budget just because there is room.
        if used > 0 && score < 0.5 * top {
            break;
        }
        let n = s.split_whitespace().count();
        if used > 0 && used + n > max_words {
            continue;
        }
        chosen.push((i, s));
        used += n;
        if used >= max_words {
            break;
        }
    }
    chosen.sort();
    let text = chosen.iter().map(|c| c.1).collect::<Vec<_>>().join(" ");
    let ws: Vec<&str> = text.split_whitespace().collect();
    if ws.len() > max_words {
        ws[..max_words].join(" ")
    } else {
        text
    }
}

/// The cache key of a cluster's content: its members' ids and texts, in id order.
pub fn content_hash(members: &[(&str, &str)]) -> String {
    let mut key = Vec::new();
    for (id, text) in members {
        key.extend_from_slice(id.as_bytes());
        key.push(0x1e);
        key.extend_from_slice(text.as_bytes());
        key.push(0x1f);
    }
    // Two independent 64-bit hashes (the second over the reversed bytes): a collision would serve one cluster
    // another's summary, so make it vanishingly unlikely.
    let rev: Vec<u8> = key.iter().rev().copied().collect();
    format!("{:016x}{:016x}", fnv1a(&key), fnv1a(&rev))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_central_sentences_in_order_within_budget() {
        let texts = [
            "The storm flooded the harbour. Gulls were seen.",
            "Harbour flooding closed the quay after the storm. A cat slept.",
            "Clean-up of the flooded harbour began on Monday.",
        ];
        let s = extractive_summary(&texts, 20);
        assert!(s.split_whitespace().count() <= 20, "{s}");
        assert!(s.contains("harbour") || s.contains("Harbour"), "{s}");
        assert!(!s.contains("cat slept"), "peripheral sentence kept: {s}");
        assert_eq!(s, extractive_summary(&texts, 20), "deterministic");
    }

    #[test]
    fn content_hash_depends_on_ids_and_texts() {
        let a = content_hash(&[("a", "x"), ("b", "y")]);
        assert_ne!(a, content_hash(&[("a", "x"), ("b", "z")]));
        assert_ne!(a, content_hash(&[("a", "x"), ("c", "y")]));
        assert_eq!(a, content_hash(&[("a", "x"), ("b", "y")]));
    }
}
