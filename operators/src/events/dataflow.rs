//! CompassMem's event layer as differential dataflow.

use super::sessions::{from_answers, sorted_turns};
use super::{session_events, session_of, EventRow, RelationRow, SegmentParams, SessionAnswer};
use crate::llm::TurnIn;
use crate::request::{session_key, ModelRequest, RequestKind};

/// The output of [`event_memory`].
pub struct EventMemory<'s, T: timely::progress::Timestamp> {
    pub events: differential_dataflow::VecCollection<'s, T, (String, EventRow)>,
    pub relations: differential_dataflow::VecCollection<'s, T, (String, RelationRow)>,
    /// With a model: the sessions whose current content has no logged answer yet — `(space, key,
    /// ModelRequest::Session)`.
    pub requests: differential_dataflow::VecCollection<'s, T, (String, String, ModelRequest)>,
}

/// CompassMem's event layer as differential dataflow: turns are grouped by (space, conversation, session) and each
/// group is segmented and related as a whole whenever it changes — a reduce, so a new turn, an edit or a deleted
/// conversation updates exactly its session's events and relations, and the result always equals a from-scratch
/// build. Without a model (`with_model == false`) the extractive answer ([`session_events`]) is the answer;
/// segmentation is greedy left to right, so a turn appended to a live session changes only its last event and
/// earlier events keep their ids. With a model, a session's content with no logged answer (`logged`, keyed by
/// [`session_key`]) is a request, and its events are the logged answer for the longest prefix of its turns that
/// has one, the turns after that prefix segmented extractively ([`from_answers`]) — so a live turn reaches the
/// memory within an epoch, the model's events for the turns it has seen stay put while a meeting goes on, and the
/// model's segmentation of the whole session replaces the tail when it arrives.
pub fn event_memory<'s, T>(
    nodes: differential_dataflow::VecCollection<'s, T, (String, crate::model::Node)>,
    logged: differential_dataflow::VecCollection<'s, T, ((String, String), String)>,
    params: SegmentParams,
    with_model: bool,
) -> EventMemory<'s, T>
where
    T: timely::progress::Timestamp + differential_dataflow::lattice::Lattice + timely::order::TotalOrder,
{
    type Key = (String, String, i64);
    let turns = nodes
        .filter(|(_, n)| n.kind == crate::model::NodeKind::Turn)
        .map(|(s, n)| ((s, n.doc.to_string(), session_of(&n)), n));
    // Each session's content key (only with a model).
    let keys = turns.clone().filter(move |_| with_model).reduce(
        |_k: &Key, turns: &[(&crate::model::Node, isize)], out: &mut Vec<((String, Vec<TurnIn>), isize)>| {
            let live: Vec<&crate::model::Node> = turns.iter().filter(|(_, d)| *d > 0).map(|(n, _)| *n).collect();
            if live.is_empty() {
                return;
            }
            let (_, input) = sorted_turns(&live);
            out.push(((session_key(&input), input), 1));
        },
    );
    // Every logged answer names its session: all of a session's answers meet its turns in the reduce below.
    let answers = logged.clone().flat_map(|((s, key), answer)| {
        let parsed = (RequestKind::of_key(&key) == RequestKind::Session)
            .then(|| serde_json::from_str::<SessionAnswer>(&answer).ok())
            .flatten();
        parsed.filter(|p| !p.turn_ids.is_empty()).map(|p| ((s, p.conversation, p.session), answer))
    });
    let answered = logged.map(|(k, _)| k).filter(|(_, key)| RequestKind::of_key(key) == RequestKind::Session);
    let requests = keys
        .map(|((s, conversation, session), (key, turns))| {
            ((s, key), ModelRequest::Session { conversation, session, turns })
        })
        .antijoin(answered.distinct())
        .map(|((s, key), request)| (s, key, request));
    let sessions =
        turns.map(|(k, n)| (k, (Some(n), None::<String>))).concat(answers.map(|(k, a)| (k, (None, Some(a))))).reduce(
            move |(_s, conv, session): &Key,
                  vals: &[(&(Option<crate::model::Node>, Option<String>), isize)],
                  out: &mut Vec<((Vec<EventRow>, Vec<RelationRow>), isize)>| {
                let live: Vec<&crate::model::Node> =
                    vals.iter().filter(|(_, d)| *d > 0).filter_map(|(v, _)| v.0.as_ref()).collect();
                if live.is_empty() {
                    return;
                }
                let answers: Vec<&str> =
                    vals.iter().filter(|(_, d)| *d > 0).filter_map(|(v, _)| v.1.as_deref()).collect();
                let made = from_answers(conv, *session, &live, &answers, &params)
                    .unwrap_or_else(|| session_events(conv, *session, &live, &params));
                out.push((made, 1));
            },
        );
    // A session's answer changes as a whole; most of its events do not, and cancel here, before anything downstream
    // embeds or compares them.
    let events = sessions
        .clone()
        .flat_map(|((s, _, _), (events, _))| events.into_iter().map(move |e| (s.clone(), e)))
        .consolidate_stream();
    let relations =
        sessions.flat_map(|((s, _, _), (_, rels))| rels.into_iter().map(move |r| (s.clone(), r))).consolidate_stream();
    EventMemory { events, relations, requests }
}
