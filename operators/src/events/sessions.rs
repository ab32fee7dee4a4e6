//! A session's event and relation rows: from the extractive backend, from a logged model answer that fits its turns,
//! or — for a live session — the answer for the longest prefix with the tail segmented extractively.

use super::{event_id, extractive_relations, extractive_segments, EventRow, RelationRow, SegmentParams};
use crate::llm::{EventDraft, EventIn, RelationDraft, RelationKind, TurnIn};
use crate::request::{session_key, SessionAnswer};

/// The events and relations of one session's turns (any order; sorted by position here): the sequential
/// definition the dataflow computes per session.
pub fn session_events(
    conversation: &str,
    session: i64,
    turns: &[&crate::model::Node],
    p: &SegmentParams,
) -> (Vec<EventRow>, Vec<RelationRow>) {
    let (_, input) = sorted_turns(turns);
    let drafts = extractive_segments(&input, p);
    let ins: Vec<EventIn> = drafts.iter().map(EventIn::from).collect();
    let rels = extractive_relations(&ins, p.relations);
    rows(conversation, session, &input, drafts, rels)
}

/// A session's events from the logged answers that fit its live turns (sorted): the answer for exactly these turns
/// if there is one; else the answer for the longest prefix of them (unchanged since it was answered), with the turns after it (the live tail, not yet
/// segmented by the model) segmented extractively and linked to it in time; else `None`.
pub(crate) fn from_answers(
    conversation: &str,
    session: i64,
    live: &[&crate::model::Node],
    answers: &[&str],
    params: &SegmentParams,
) -> Option<(Vec<EventRow>, Vec<RelationRow>)> {
    let (sorted, input) = sorted_turns(live);
    let ids: Vec<&str> = input.iter().map(|t| t.id.as_str()).collect();
    let best = answers
        .iter()
        .filter_map(|a| serde_json::from_str::<SessionAnswer>(a).ok().map(|p| (p, *a)))
        .filter(|(p, _)| !p.turn_ids.is_empty() && p.turn_ids.len() <= ids.len())
        .filter(|(p, _)| p.turn_ids.iter().zip(&ids).all(|(a, b)| a == b))
        .filter(|(p, _)| p.key == session_key(&input[..p.turn_ids.len()]))
        .max_by(|(a, ra), (b, rb)| a.turn_ids.len().cmp(&b.turn_ids.len()).then_with(|| rb.cmp(ra)))?;
    let n = best.0.turn_ids.len();
    let (mut events, mut relations) = answered_events(conversation, session, &sorted[..n], best.1)?;
    if n < sorted.len() {
        let (tail_events, tail_relations) = session_events(conversation, session, &sorted[n..], params);
        if let (Some(last), Some(first)) = (events.last(), tail_events.first()) {
            let mut evidence = last.turns.clone();
            evidence.extend(first.turns.iter().cloned());
            relations.push(RelationRow {
                from: last.id.clone(),
                to: first.id.clone(),
                kind: RelationKind::Temporal,
                evidence: evidence.into(),
            });
        }
        events.extend(tail_events);
        relations.extend(tail_relations);
        relations.sort();
        relations.dedup();
    }
    Some((events, relations))
}

pub(crate) fn sorted_turns<'a>(turns: &[&'a crate::model::Node]) -> (Vec<&'a crate::model::Node>, Vec<TurnIn>) {
    let mut turns: Vec<&crate::model::Node> = turns.to_vec();
    turns.sort_by(|a, b| a.pos.cmp(&b.pos).then_with(|| a.id.cmp(&b.id)));
    let input = turns
        .iter()
        .map(|n| TurnIn {
            id: n.id.to_string(),
            speaker: n.speaker.as_deref().unwrap_or_default().to_string(),
            text: n.text.to_string(),
            ts: n.ts.as_deref().map(str::to_string),
        })
        .collect();
    (turns, input)
}

/// The events and relations of a session from a logged model answer, when it fits the turns exactly (every turn
/// in exactly one event, in order; relation ends in range); `None` otherwise.
pub fn answered_events(
    conversation: &str,
    session: i64,
    turns: &[&crate::model::Node],
    answer: &str,
) -> Option<(Vec<EventRow>, Vec<RelationRow>)> {
    let a: SessionAnswer = serde_json::from_str(answer).ok()?;
    let (_, input) = sorted_turns(turns);
    let covered: Vec<usize> = a.events.iter().flat_map(|e| e.turns.iter().copied()).collect();
    if covered != (0..input.len()).collect::<Vec<_>>() || a.events.iter().any(|e| e.turns.is_empty()) {
        return None;
    }
    if a.relations.iter().any(|r| r.from >= a.events.len() || r.to >= a.events.len() || r.from == r.to) {
        return None;
    }
    Some(rows(conversation, session, &input, a.events, a.relations))
}

fn rows(
    conversation: &str,
    session: i64,
    input: &[TurnIn],
    drafts: Vec<EventDraft>,
    rels: Vec<RelationDraft>,
) -> (Vec<EventRow>, Vec<RelationRow>) {
    let events: Vec<EventRow> = drafts
        .into_iter()
        .map(|d| {
            let ids: Vec<String> = d.turns.iter().map(|&i| input[i].id.clone()).collect();
            EventRow {
                id: event_id(conversation, session, &ids[0], &ids[ids.len() - 1]),
                conversation: conversation.to_string(),
                session,
                turns: ids,
                summary: d.summary,
                people: d.people,
                time: d.time,
            }
        })
        .collect();
    let mut relations: Vec<RelationRow> = rels
        .into_iter()
        .map(|r| {
            let (a, b) = (&events[r.from], &events[r.to]);
            let mut evidence = a.turns.clone();
            evidence.extend(b.turns.iter().cloned());
            RelationRow { from: a.id.clone(), to: b.id.clone(), kind: r.kind, evidence: evidence.into() }
        })
        .collect();
    relations.sort();
    relations.dedup();
    (events, relations)
}

#[cfg(test)]
mod live_answer_tests {
    use super::*;
    use crate::model::{Node, NodeKind};

    fn node(i: i64, text: &str) -> Node {
        Node {
            id: format!("m#T{i}").into(),
            kind: NodeKind::Turn,
            doc: "m".into(),
            pos: i,
            text: text.into(),
            speaker: Some(if i % 2 == 0 { "Ana" } else { "Ben" }.into()),
            ts: None,
        }
    }

    /// The model's answer for `turns`: one event over all of them.
    fn answer_for(turns: &[&Node], summary: &str) -> String {
        let (_, input) = sorted_turns(turns);
        let a = SessionAnswer {
            events: vec![EventDraft {
                turns: (0..input.len()).collect(),
                summary: summary.into(),
                people: vec![],
                time: None,
            }],
            relations: vec![],
            conversation: "m".into(),
            session: 0,
            turn_ids: input.iter().map(|t| t.id.clone()).collect(),
            key: session_key(&input),
        };
        serde_json::to_string(&a).unwrap()
    }

    #[test]
    fn a_live_session_keeps_the_answer_for_its_prefix_and_segments_the_tail() {
        let nodes: Vec<Node> = (0..6).map(|i| node(i, &format!("Point {i} of the plan."))).collect();
        let all: Vec<&Node> = nodes.iter().collect();
        let p = SegmentParams::default();
        let first = answer_for(&all[..3], "model: first three");
        let (events, relations) = from_answers("m", 0, &all, &[first.as_str()], &p).expect("a prefix answer fits");
        assert_eq!(events[0].summary, "model: first three");
        assert_eq!(events[0].turns, vec!["m#T0", "m#T1", "m#T2"]);
        let tail: Vec<String> = events[1..].iter().flat_map(|e| e.turns.clone()).collect();
        assert_eq!(tail, vec!["m#T3", "m#T4", "m#T5"], "the tail, extractive");
        assert!(relations
            .iter()
            .any(|r| r.from == events[0].id && r.to == events[1].id && r.kind == RelationKind::Temporal));
        // The longest fitting prefix wins; an answer for all turns replaces the tail.
        let whole = answer_for(&all, "model: all six");
        let (events, _) = from_answers("m", 0, &all, &[first.as_str(), whole.as_str()], &p).unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].summary, "model: all six");
        // An edited turn inside the prefix makes its answer stale: extractive until the model answers again.
        let mut edited = nodes.clone();
        edited[1].text = "Point 1, corrected.".into();
        let edited_refs: Vec<&Node> = edited.iter().collect();
        assert!(from_answers("m", 0, &edited_refs, &[first.as_str()], &p).is_none());
        // An answer for turns that are not a prefix (a turn deleted) does not fit either.
        let without_t0: Vec<&Node> = all[1..].to_vec();
        assert!(from_answers("m", 0, &without_t0, &[first.as_str()], &p).is_none());
    }
}
