//! The model port: what the memory asks of a language model (the [`Llm`] trait), and the request and reply types of
//! its stages — cluster summaries (CAM), session segmentation and event relations, the co-reference judge, and the
//! query-time stages (selection, planner, explorers, responder; CompassMem). Implemented by the built-in
//! [`Extractive`](crate::extractive::Extractive) backend and by the OpenAI-compatible client in `engram-connectors`.

use serde::{Deserialize, Serialize};
use thiserror::Error;

/// Why a summary could not be made. Whose fault it is decides whether a retry can help.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum LlmError {
    #[error("the LLM service failed: {0}")]
    Service(String),
    #[error("the LLM reply did not have the expected shape: {0}")]
    BadReply(String),
}

/// What the memory asks of a language model. Implementations: [`Extractive`](crate::extractive::Extractive) here, OpenAI-compatible clients in
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
    fn judge(&self, _a: &str, _b: &str) -> Result<Option<Verdict>, LlmError> {
        Ok(None)
    }
}

/// An Explorer's choice for one event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Explore {
    /// Keep it and walk on along its relations.
    Expand,
    /// Keep it; it answers the subgoal, no need to walk on.
    Answer,
    /// Not relevant.
    Skip,
}

/// One turn as the segmenter sees it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct TurnIn {
    pub id: String,
    pub speaker: String,
    pub text: String,
    /// RFC 3339, when the record had one.
    pub ts: Option<String>,
}

/// An event: consecutive turns (indices into the segmenter's input), a summary, its people and time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventDraft {
    pub turns: Vec<usize>,
    pub summary: String,
    pub people: Vec<String>,
    pub time: Option<String>,
}

/// The relation types of the event graph: CompassMem's logic map (causal, motivation, enablement, follow-up,
/// temporal, contrast, part-of, parallel, elaboration) and shared participants (the extractive backend's link).
/// Directed: `from` relates to `to` as the kind says.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RelationKind {
    Temporal,
    Causal,
    Motivation,
    PartOf,
    SharedParticipants,
    Enablement,
    FollowUp,
    Contrast,
    Parallel,
    Elaboration,
    /// Two events of different sessions that the co-reference judge found overlapping (not the same event).
    Overlap,
}

impl RelationKind {
    pub const ALL: [RelationKind; 11] = [
        RelationKind::Temporal,
        RelationKind::Causal,
        RelationKind::Motivation,
        RelationKind::PartOf,
        RelationKind::SharedParticipants,
        RelationKind::Enablement,
        RelationKind::FollowUp,
        RelationKind::Contrast,
        RelationKind::Parallel,
        RelationKind::Elaboration,
        RelationKind::Overlap,
    ];

    pub fn name(self) -> &'static str {
        match self {
            RelationKind::Temporal => "temporal",
            RelationKind::Causal => "causal",
            RelationKind::Motivation => "motivation",
            RelationKind::PartOf => "part-of",
            RelationKind::SharedParticipants => "shared-participants",
            RelationKind::Enablement => "enablement",
            RelationKind::FollowUp => "follow-up",
            RelationKind::Contrast => "contrast",
            RelationKind::Parallel => "parallel",
            RelationKind::Elaboration => "elaboration",
            RelationKind::Overlap => "overlap",
        }
    }

    /// A kind by name; case, `_` for `-`, and the paper's `temporal_before` are accepted (`temporal_after` is
    /// `temporal` the other way round: see [`RelationKind::parse_directed`]).
    pub fn parse(s: &str) -> Option<RelationKind> {
        Self::parse_directed(s).filter(|(_, reversed)| !reversed).map(|(k, _)| k)
    }

    /// A kind by name and whether the label reverses the pair (`temporal_after`: `from` happened after `to`).
    pub fn parse_directed(s: &str) -> Option<(RelationKind, bool)> {
        let s = s.trim().to_lowercase().replace(['_', ' '], "-");
        match s.as_str() {
            "temporal-before" | "before" => Some((RelationKind::Temporal, false)),
            "temporal-after" | "after" => Some((RelationKind::Temporal, true)),
            _ => RelationKind::ALL.into_iter().find(|k| k.name() == s).map(|k| (k, false)),
        }
    }
}

/// An event as the relation stage sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventIn {
    pub id: String,
    pub summary: String,
    pub people: Vec<String>,
    pub time: Option<String>,
}

impl From<&EventDraft> for EventIn {
    /// A drafted event as the relation stage sees it (no id yet).
    fn from(d: &EventDraft) -> Self {
        EventIn { id: String::new(), summary: d.summary.clone(), people: d.people.clone(), time: d.time.clone() }
    }
}

/// A typed, directed relation between two events of the input (indices): `from` relates to `to` as `kind`
/// (`from` caused `to`, `from` happened before `to`, …).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RelationDraft {
    pub from: usize,
    pub to: usize,
    pub kind: RelationKind,
}

/// The co-reference judge's verdict on two events (CompassMem).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// One event told twice: merge them.
    SameEvent,
    /// Different events that overlap: link them (`overlap`).
    HasOverlap,
    Different,
}
