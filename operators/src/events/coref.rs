//! The optional co-reference judge (CompassMem): pairs of events just below the merge threshold, put to the model.

use super::{EventRow, RelationRow};
use crate::llm::{RelationKind, Verdict};
use crate::request::{judge_key, ModelRequest, RequestKind};

/// An event as the co-reference judge sees it: summary, people, time.
pub fn describe_event(e: &EventRow) -> String {
    let mut d = e.summary.clone();
    if !e.people.is_empty() {
        d.push_str(&format!(" (people: {})", e.people.join(", ")));
    }
    if let Some(t) = &e.time {
        d.push_str(&format!(" (time: {t})"));
    }
    d
}

/// The response-log key of a judged pair: its two events' descriptions, so an edited event is judged again.
pub fn coref_key(a: &EventRow, b: &EventRow) -> String {
    let (da, db) = (describe_event(a), describe_event(b));
    judge_key((&a.id, &da), (&b.id, &db))
}

/// The output of [`coreference`].
pub struct Coreference<'s, T: timely::progress::Timestamp> {
    /// Pairs with no logged verdict yet: `(space, key, ModelRequest::Judge)`.
    pub requests: differential_dataflow::VecCollection<'s, T, (String, String, ModelRequest)>,
    /// Pairs judged the same event: merge links `(space, a, b)`.
    pub same: differential_dataflow::VecCollection<'s, T, (String, String, String)>,
    /// Pairs judged overlapping: `overlap` relations.
    pub overlaps: differential_dataflow::VecCollection<'s, T, (String, RelationRow)>,
}

/// The optional co-reference judge (CompassMem): `candidates` (pairs below the merge threshold but close) are put to
/// the model, keyed by [`coref_key`]; the logged verdicts (`{"verdict"}` under that key in `logged`) join back —
/// `same_event` merges the pair, `has_overlap` links it. Like every model answer, a verdict is an input, so the
/// memory stays a function of the input and response logs.
pub fn coreference<'s, T>(
    candidates: differential_dataflow::VecCollection<'s, T, (String, String, String)>,
    events: differential_dataflow::VecCollection<'s, T, (String, EventRow)>,
    logged: differential_dataflow::VecCollection<'s, T, ((String, String), String)>,
) -> Coreference<'s, T>
where
    T: timely::progress::Timestamp + differential_dataflow::lattice::Lattice + timely::order::TotalOrder,
{
    let by_id = events.map(|(s, e)| ((s, e.id.clone()), e));
    let pairs = candidates
        .map(|(s, a, b)| ((s, a), b))
        .join_map(by_id.clone(), |(s, _a), b, ea| ((s.clone(), b.clone()), ea.clone()))
        .join_map(by_id, |(s, _b), ea, eb| ((s.clone(), coref_key(ea, eb)), (ea.clone(), eb.clone())));
    let verdicts = logged.filter(|((_, key), _)| RequestKind::of_key(key) == RequestKind::Judge);
    let judged = pairs.clone().join_map(verdicts.clone(), |(s, _key), (ea, eb), text| {
        let verdict = serde_json::from_str::<serde_json::Value>(text)
            .ok()
            .and_then(|v| serde_json::from_value::<Verdict>(v["verdict"].clone()).ok())
            .unwrap_or(Verdict::Different);
        (s.clone(), ea.clone(), eb.clone(), verdict)
    });
    let same = judged.clone().filter(|j| j.3 == Verdict::SameEvent).map(|(s, a, b, _)| (s, a.id, b.id));
    let overlaps = judged.filter(|j| j.3 == Verdict::HasOverlap).map(|(s, a, b, _)| {
        let mut evidence = a.turns.clone();
        evidence.extend(b.turns.iter().cloned());
        (s, RelationRow { from: a.id, to: b.id, kind: RelationKind::Overlap, evidence: evidence.into() })
    });
    let requests = pairs.antijoin(verdicts.map(|(k, _)| k).distinct()).map(|((s, key), (a, b))| {
        let pair = [(a.id.clone(), describe_event(&a)), (b.id.clone(), describe_event(&b))];
        (s, key, ModelRequest::Judge { pair })
    });
    Coreference { requests, same, overlaps }
}
