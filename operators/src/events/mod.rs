//! CompassMem's event memory: a conversation's turns segmented into *events* per session (summary, turn refs, time,
//! people), events linked by typed *relations*, similar events *merged* (optionally with a co-reference judge), and
//! events grouped into *topics* — each a differential operator, so the memory after any stream of updates equals a
//! from-scratch build.
//!
//! * [`segment`]: the extractive segmentation of a session's turns (time gaps, topic shifts, a size cap);
//! * [`relations`]: the extractive relations among a session's events (order, cue phrases, shared people);
//! * [`sessions`]: a session's event and relation rows, from a logged model answer or the extractive backend;
//! * [`merge`]: similar events linked and merged into groups;
//! * [`coref`]: the co-reference judge on pairs just below the merge threshold;
//! * [`topics`]: k-means topics over the events of a space;
//! * [`dataflow`]: the event layer over a collection of turns.

use serde::{Deserialize, Serialize};

pub mod coref;
pub mod dataflow;
pub mod merge;
pub mod relations;
pub mod segment;
pub mod sessions;
pub mod topics;

pub use crate::llm::{EventDraft, EventIn, RelationDraft, RelationKind, TurnIn, Verdict};
pub use crate::request::SessionAnswer;
pub use coref::{coref_key, coreference, describe_event, Coreference};
pub use dataflow::{event_memory, EventMemory};
pub use merge::{event_embedding, event_merges, merge_groups, pair_params, quantise, quantised_cos, similar_pairs};
pub use relations::{extractive_relations, RelationBounds};
pub use segment::{extractive_segments, seconds, SegmentParams};
pub use sessions::{answered_events, session_events};
pub use topics::{event_topics, kmeans_topics, topic_count};

/// An event of the memory: `id` is `E:<hash>` over (conversation, session, first and last turn), so appending turns
/// to a session leaves its earlier events (and their ids) untouched.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct EventRow {
    pub id: String,
    pub conversation: String,
    pub session: i64,
    /// Turn ids (utterance refs), in order.
    pub turns: Vec<String>,
    pub summary: String,
    pub people: Vec<String>,
    pub time: Option<String>,
}

/// A typed, directed relation between two events of one session, with its evidence (the turns of both ends). The
/// evidence is shared by every copy of the row (the views keep one per end and one in their set; arrangements hold
/// more), so a relation's turn ids are allocated once.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RelationRow {
    pub from: String,
    pub to: String,
    pub kind: RelationKind,
    pub evidence: std::sync::Arc<[String]>,
}

/// The session of a turn: LoCoMo-style ids `D<s>:<n>` sit at position `s·10000 + n` (see `ingest`), every other
/// turn of a conversation in session 0 (time gaps still split its events).
pub fn session_of(node: &crate::model::Node) -> i64 {
    node.pos.div_euclid(crate::model::POSITION_SCALE * 10_000)
}

pub(crate) fn event_id(conversation: &str, session: i64, first: &str, last: &str) -> String {
    let key = format!("{conversation}\u{1f}{session}\u{1f}{first}\u{1f}{last}");
    format!("E:{}", crate::hash::content_hex96(key.as_bytes()))
}
