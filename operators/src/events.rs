//! CompassMem's two LLM stages as entry points of the [`Llm`](crate::summary::Llm) trait — segmenting a conversation's
//! turns into *events*, and typing the *relations* between events — with the extractive backend's answers (no model):
//!
//! * **segmentation**: a new event starts at a time gap (`time_gap_secs` between two stamped turns), at a topic shift
//!   (the turn's hash-embedding cosine with the running event below `shift_below`, once the event has `min_turns`),
//!   or when the event reaches `max_turns`. Each event gets an extractive summary, its speakers (people) and the time
//!   of its first stamped turn;
//! * **relations**: `temporal` between consecutive events of one conversation; `causal` and `motivation` when an
//!   event's text carries a cue phrase ("because", "so", "as a result" … / "in order to", "wants to", "plans to" …)
//!   and shares content words with an earlier event; `shared-participants` when two non-adjacent events have a
//!   speaker in common and share content words.
//!
//! A baseline, documented as one: it cannot see causality a cue phrase does not state. Deterministic, so a replay
//! gives the same events without the response log.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::embed::{features_by, fold, words};
use crate::summary::extractive_summary;

/// One turn as the segmenter sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
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

/// A typed, directed relation between two events of the input (indices): `from` relates to `to` as `kind`
/// (`from` caused `to`, `from` happened before `to`, …).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RelationDraft {
    pub from: usize,
    pub to: usize,
    pub kind: RelationKind,
}

#[derive(Clone, Debug)]
pub struct SegmentParams {
    pub time_gap_secs: i64,
    pub shift_below: f32,
    pub min_turns: usize,
    pub max_turns: usize,
    pub summary_words: usize,
}

impl Default for SegmentParams {
    fn default() -> Self {
        SegmentParams { time_gap_secs: 30 * 60, shift_below: 0.05, min_turns: 3, max_turns: 8, summary_words: 60 }
    }
}

/// Seconds since the epoch of an RFC 3339 UTC-ish stamp (`YYYY-MM-DDTHH:MM:SS…`); offsets are ignored, which is
/// enough to find gaps inside one conversation.
pub fn seconds(ts: &str) -> Option<i64> {
    let b = ts.as_bytes();
    if b.len() < 19 || b[4] != b'-' || b[7] != b'-' || !(b[10] == b'T' || b[10] == b' ') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| ts.get(r)?.parse::<i64>().ok();
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hh, mm, ss) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) {
        return None;
    }
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hh * 3600 + mm * 60 + ss)
}

/// The extractive segmentation of `turns` (in conversation order).
pub fn extractive_segments(turns: &[TurnIn], p: &SegmentParams) -> Vec<EventDraft> {
    // The vectors the topic-shift rule was calibrated on: 256 buckets of FNV-1a features (the hash embedder before it
    // mixed its hash). Short texts score chance cosines of about ±0.07 there, around the 0.05 threshold; exact
    // features score 0 for every turn that shares no word with the event, and split conversations at each short reply
    // (the stand-up's appended turn started an event of its own): a change of the rule for its own measurement.
    let vecs: Vec<_> = turns.iter().map(|t| fold(&features_by(&t.text, crate::hash::fnv1a), 256)).collect();
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut centroid: Vec<f32> = Vec::new();
    let mut last_time: Option<i64> = None;
    for (i, t) in turns.iter().enumerate() {
        let time = t.ts.as_deref().and_then(seconds);
        let start = match groups.last() {
            None => true,
            Some(g) => {
                let gap = matches!((last_time, time), (Some(a), Some(b)) if b - a >= p.time_gap_secs);
                let norm = centroid.iter().map(|x| x * x).sum::<f32>().sqrt();
                let cos = if norm > 0.0 { vecs[i].0.iter().zip(&centroid).map(|(a, b)| a * b).sum::<f32>() / norm } else { 0.0 };
                gap || g.len() >= p.max_turns || (g.len() >= p.min_turns && cos < p.shift_below)
            }
        };
        if start {
            groups.push(Vec::new());
            centroid = vec![0.0; vecs[i].0.len()];
        }
        groups.last_mut().expect("a group").push(i);
        centroid.iter_mut().zip(&vecs[i].0).for_each(|(c, x)| *c += x);
        if time.is_some() {
            last_time = time;
        }
    }
    groups
        .into_iter()
        .map(|g| {
            let texts: Vec<&str> = g.iter().map(|&i| turns[i].text.as_str()).collect();
            let people: BTreeSet<String> = g.iter().map(|&i| turns[i].speaker.clone()).filter(|s| !s.is_empty()).collect();
            EventDraft {
                summary: extractive_summary(&texts, p.summary_words),
                people: people.into_iter().collect(),
                time: g.iter().find_map(|&i| turns[i].ts.clone()),
                turns: g,
            }
        })
        .collect()
}

const CAUSAL: &[&str] = &["because", "so that", "as a result", "therefore", "due to", "led to", "caused", "since then", "that's why", "which is why"];
const MOTIVATION: &[&str] = &["in order to", "wants to", "want to", "wanted to", "plans to", "planning to", "decided to", "hoping to", "so i can", "goal"];

fn content(text: &str) -> BTreeSet<String> {
    words(text).into_iter().filter(|w| w.len() > 3).collect()
}

fn has_cue(text: &str, cues: &[&str]) -> bool {
    let t = format!(" {} ", words(text).join(" "));
    cues.iter().any(|c| t.contains(&format!(" {} ", words(c).join(" "))))
}

/// The extractive relations among `events` (in time order): see the module comment.
pub fn extractive_relations(events: &[EventIn]) -> Vec<RelationDraft> {
    let words: Vec<BTreeSet<String>> = events.iter().map(|e| content(&e.summary)).collect();
    let mut out = BTreeSet::new();
    for j in 0..events.len() {
        if j > 0 {
            out.insert(RelationDraft { from: j - 1, to: j, kind: RelationKind::Temporal });
        }
        let causal = has_cue(&events[j].summary, CAUSAL);
        let motivation = has_cue(&events[j].summary, MOTIVATION);
        for i in 0..j {
            let shared = words[i].intersection(&words[j]).count();
            if shared < 2 {
                continue;
            }
            if causal {
                out.insert(RelationDraft { from: i, to: j, kind: RelationKind::Causal });
            }
            if motivation {
                out.insert(RelationDraft { from: j, to: i, kind: RelationKind::Motivation });
            }
            if i + 1 < j && events[i].people.iter().any(|p| events[j].people.contains(p)) {
                out.insert(RelationDraft { from: i, to: j, kind: RelationKind::SharedParticipants });
            }
        }
    }
    out.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(id: &str, speaker: &str, text: &str, ts: Option<&str>) -> TurnIn {
        TurnIn { id: id.into(), speaker: speaker.into(), text: text.into(), ts: ts.map(Into::into) }
    }

    #[test]
    fn time_gaps_and_topic_shifts_start_events() {
        let turns = vec![
            turn("1", "Ana", "The harbour flooded after the storm last night.", Some("2026-11-29T09:00:00Z")),
            turn("2", "Ben", "Yes, the storm flooded the harbour quay badly.", Some("2026-11-29T09:01:00Z")),
            turn("3", "Ana", "The harbour master closed the flooded quay.", Some("2026-11-29T09:02:00Z")),
            turn("4", "Ben", "Did the storm damage the boats in the harbour?", Some("2026-11-29T09:03:00Z")),
            // Two hours later: a new event, whatever the words.
            turn("5", "Ana", "The harbour is still flooded.", Some("2026-11-29T11:05:00Z")),
            turn("6", "Cem", "Still flooded, the harbour, yes.", Some("2026-11-29T11:06:00Z")),
            turn("7", "Ana", "And the quay is closed in the harbour.", Some("2026-11-29T11:07:00Z")),
            // A topic shift without a time gap.
            turn("8", "Cem", "My daughter starts violin lessons on Tuesday.", Some("2026-11-29T11:08:00Z")),
        ];
        let ev = extractive_segments(&turns, &SegmentParams::default());
        let groups: Vec<Vec<usize>> = ev.iter().map(|e| e.turns.clone()).collect();
        assert_eq!(groups, vec![vec![0, 1, 2, 3], vec![4, 5, 6], vec![7]]);
        assert_eq!(ev[1].people, vec!["Ana".to_string(), "Cem".to_string()]);
        assert_eq!(ev[1].time.as_deref(), Some("2026-11-29T11:05:00Z"));
        assert!(ev[0].summary.contains("harbour"), "{}", ev[0].summary);
        assert_eq!(ev, extractive_segments(&turns, &SegmentParams::default()), "deterministic");
    }

    #[test]
    fn relations_from_order_cues_and_people() {
        let e = |s: &str, p: &[&str]| EventIn { id: String::new(), summary: s.into(), people: p.iter().map(|x| x.to_string()).collect(), time: None };
        let events = vec![
            e("Ana lost her job at the bakery downtown.", &["Ana"]),
            e("Ben talked about football.", &["Ben"]),
            e("Ana is retraining as a nurse because she lost the bakery job.", &["Ana"]),
            e("Ana plans to open her own bakery downtown in order to replace the job she lost.", &["Ana"]),
        ];
        let r = extractive_relations(&events);
        let has = |from, to, kind| r.contains(&RelationDraft { from, to, kind });
        assert!(has(0, 1, RelationKind::Temporal) && has(2, 3, RelationKind::Temporal));
        assert!(has(0, 2, RelationKind::Causal), "{r:?}");
        assert!(!has(1, 2, RelationKind::Causal), "no shared content, no cause: {r:?}");
        assert!(has(3, 0, RelationKind::Motivation), "{r:?}");
        assert!(has(0, 2, RelationKind::SharedParticipants), "{r:?}");
    }

    #[test]
    fn timestamps() {
        assert_eq!(seconds("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(seconds("2026-11-29T10:00:00Z").unwrap() - seconds("2026-11-29T09:30:00Z").unwrap(), 1800);
        assert_eq!(seconds("2024-03-01T00:00:00Z").unwrap() - seconds("2024-02-28T00:00:00Z").unwrap(), 2 * 86_400);
        assert_eq!(seconds("yesterday"), None);
        assert_eq!(RelationKind::parse("part-of"), Some(RelationKind::PartOf));
        assert_eq!(RelationKind::parse("Follow_Up"), Some(RelationKind::FollowUp));
        assert_eq!(RelationKind::parse_directed("temporal_after"), Some((RelationKind::Temporal, true)));
        assert_eq!(RelationKind::parse("temporal_after"), None, "needs the pair reversed");
        assert_eq!(RelationKind::parse("friendship"), None);
        for k in RelationKind::ALL {
            assert_eq!(RelationKind::parse(k.name()), Some(k));
        }
    }
}

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

/// A typed, directed relation between two events of one session, with its evidence (the turns of both ends).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct RelationRow {
    pub from: String,
    pub to: String,
    pub kind: RelationKind,
    pub evidence: Vec<String>,
}

/// The session of a turn: LoCoMo-style ids `D<s>:<n>` sit at position `s·10000 + n` (see `ingest`), every other
/// turn of a conversation in session 0 (time gaps still split its events).
pub fn session_of(node: &crate::model::Node) -> i64 {
    node.pos.div_euclid(crate::model::POSITION_SCALE * 10_000)
}

fn event_id(conversation: &str, session: i64, first: &str, last: &str) -> String {
    let key = format!("{conversation}\u{1f}{session}\u{1f}{first}\u{1f}{last}");
    let rev: Vec<u8> = key.bytes().rev().collect();
    format!("E:{:016x}{:08x}", crate::hash::fnv1a(key.as_bytes()), crate::hash::fnv1a(&rev) as u32)
}

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
    let ins: Vec<EventIn> = drafts
        .iter()
        .map(|d| EventIn { id: String::new(), summary: d.summary.clone(), people: d.people.clone(), time: d.time.clone() })
        .collect();
    let rels = extractive_relations(&ins);
    rows(conversation, session, &input, drafts, rels)
}

/// The key of a session's content in the response log: `seg:` + 128 bits over its turns (ids, speakers, times,
/// texts, in order).
pub fn session_key(turns: &[TurnIn]) -> String {
    let mut key = Vec::new();
    for t in turns {
        for part in [&t.id, &t.speaker, t.ts.as_deref().unwrap_or(""), &t.text] {
            key.extend_from_slice(part.as_bytes());
            key.push(0x1f);
        }
        key.push(0x1e);
    }
    let rev: Vec<u8> = key.iter().rev().copied().collect();
    format!("seg:{:016x}{:016x}", crate::hash::fnv1a(&key), crate::hash::fnv1a(&rev))
}

/// A model's answer for one session, as logged:
/// `{"events":[EventDraft…],"relations":[RelationDraft…],"conversation","session","turn_ids"}` — the session and the
/// turns (in order) it segmented, so that a live session keeps using it for those turns when more arrive.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionAnswer {
    pub events: Vec<EventDraft>,
    pub relations: Vec<RelationDraft>,
    #[serde(default)]
    pub conversation: String,
    #[serde(default)]
    pub session: i64,
    #[serde(default)]
    pub turn_ids: Vec<String>,
    /// [`session_key`] of those turns: an edited turn makes the answer stale.
    #[serde(default)]
    pub key: String,
}

/// The session a request is for, as the request's `cluster` field carries it: `[conversation, session]` as JSON.
pub fn session_tag(conversation: &str, session: i64) -> String {
    serde_json::json!([conversation, session]).to_string()
}

/// The inverse of [`session_tag`].
pub fn parse_session_tag(tag: &str) -> Option<(String, i64)> {
    serde_json::from_str(tag).ok()
}

/// A session's events from the logged answers that fit its live turns (sorted): the answer for exactly these turns
/// if there is one; else the answer for the longest prefix of them (unchanged since it was answered), with the turns after it (the live tail, not yet
/// segmented by the model) segmented extractively and linked to it in time; else `None`.
fn from_answers(
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
            relations.push(RelationRow { from: last.id.clone(), to: first.id.clone(), kind: RelationKind::Temporal, evidence });
        }
        events.extend(tail_events);
        relations.extend(tail_relations);
        relations.sort();
        relations.dedup();
    }
    Some((events, relations))
}

fn sorted_turns<'a>(turns: &[&'a crate::model::Node]) -> (Vec<&'a crate::model::Node>, Vec<TurnIn>) {
    let mut turns: Vec<&crate::model::Node> = turns.to_vec();
    turns.sort_by(|a, b| a.pos.cmp(&b.pos).then_with(|| a.id.cmp(&b.id)));
    let input = turns
        .iter()
        .map(|n| TurnIn { id: n.id.clone(), speaker: n.speaker.clone().unwrap_or_default(), text: n.text.clone(), ts: n.ts.clone() })
        .collect();
    (turns, input)
}

/// The events and relations of a session from a logged model answer, when it fits the turns exactly (every turn
/// in exactly one event, in order; relation ends in range); `None` otherwise.
pub fn answered_events(conversation: &str, session: i64, turns: &[&crate::model::Node], answer: &str) -> Option<(Vec<EventRow>, Vec<RelationRow>)> {
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

fn rows(conversation: &str, session: i64, input: &[TurnIn], drafts: Vec<EventDraft>, rels: Vec<RelationDraft>) -> (Vec<EventRow>, Vec<RelationRow>) {
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
            RelationRow { from: a.id.clone(), to: b.id.clone(), kind: r.kind, evidence }
        })
        .collect();
    relations.sort();
    relations.dedup();
    (events, relations)
}

/// The output of [`event_memory`].
pub struct EventMemory<'s, T: timely::progress::Timestamp> {
    pub events: differential_dataflow::VecCollection<'s, T, (String, EventRow)>,
    pub relations: differential_dataflow::VecCollection<'s, T, (String, RelationRow)>,
    /// With a model: the sessions whose current content has no logged answer yet — `(space, session tag, key,
    /// turns)`, the tag from [`session_tag`], each turn as `(id, TurnIn as JSON)`.
    pub requests: differential_dataflow::VecCollection<'s, T, (String, String, String, Vec<(String, String)>)>,
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
        .map(|(s, n)| ((s, n.doc.clone(), session_of(&n)), n));
    // Each session's content key (only with a model).
    let keys = turns
        .clone()
        .filter(move |_| with_model)
        .reduce(|_k: &Key, turns: &[(&crate::model::Node, isize)], out: &mut Vec<((String, Vec<(String, String)>), isize)>| {
            let live: Vec<&crate::model::Node> = turns.iter().filter(|(_, d)| *d > 0).map(|(n, _)| *n).collect();
            if live.is_empty() {
                return;
            }
            let (_, input) = sorted_turns(&live);
            let payload = input.iter().map(|t| (t.id.clone(), serde_json::to_string(t).unwrap_or_default())).collect();
            out.push(((session_key(&input), payload), 1));
        });
    // Every logged answer names its session: all of a session's answers meet its turns in the reduce below.
    let answers = logged.clone().flat_map(|((s, key), answer)| {
        let parsed = key.starts_with("seg:").then(|| serde_json::from_str::<SessionAnswer>(&answer).ok()).flatten();
        parsed.filter(|p| !p.turn_ids.is_empty()).map(|p| ((s, p.conversation, p.session), answer))
    });
    let answered = logged.map(|(k, _)| k).filter(|(_, key)| key.starts_with("seg:"));
    let requests = keys
        .map(|((s, c, n), (key, payload))| ((s, key), (session_tag(&c, n), payload)))
        .antijoin(answered.distinct())
        .map(|((s, key), (tag, payload))| (s, tag, key, payload));
    let sessions = turns
        .map(|(k, n)| (k, (Some(n), None::<String>)))
        .concat(answers.map(|(k, a)| (k, (None, Some(a)))))
        .reduce(move |(_s, conv, session): &Key, vals: &[(&(Option<crate::model::Node>, Option<String>), isize)], out: &mut Vec<((Vec<EventRow>, Vec<RelationRow>), isize)>| {
            let live: Vec<&crate::model::Node> = vals.iter().filter(|(_, d)| *d > 0).filter_map(|(v, _)| v.0.as_ref()).collect();
            if live.is_empty() {
                return;
            }
            let answers: Vec<&str> = vals.iter().filter(|(_, d)| *d > 0).filter_map(|(v, _)| v.1.as_deref()).collect();
            let made = from_answers(conv, *session, &live, &answers, &params)
                .unwrap_or_else(|| session_events(conv, *session, &live, &params));
            out.push((made, 1));
        });
    let events = sessions.clone().flat_map(|((s, _, _), (events, _))| events.into_iter().map(move |e| (s.clone(), e)));
    let relations = sessions.flat_map(|((s, _, _), (_, rels))| rels.into_iter().map(move |r| (s.clone(), r)));
    EventMemory { events, relations, requests }
}

/// A unit vector quantised to 1/10000 per component: orderable, so it can be joined and arranged, and the same
/// bits on every worker.
pub fn quantise(v: &[f32]) -> Vec<i16> {
    v.iter().map(|x| (x * 10_000.0).round().clamp(-32_767.0, 32_767.0) as i16).collect()
}

/// The cosine of two quantised unit vectors.
pub fn quantised_cos(a: &[i16], b: &[i16]) -> f32 {
    let dot: i64 = a.iter().zip(b).map(|(x, y)| i64::from(*x) * i64::from(*y)).sum();
    dot as f32 / 1e8
}

/// Pairs of events of one space (`a < b` by id) whose vectors reach cosine ≥ `lo`, with the cosine in millionths:
/// a self-join per space, so a new event is compared with the space's events once.
pub fn similar_pairs<'s, T>(
    vectors: differential_dataflow::VecCollection<'s, T, (String, String, Vec<i16>)>,
    lo: f32,
) -> differential_dataflow::VecCollection<'s, T, (String, String, String, i64)>
where
    T: timely::progress::Timestamp + differential_dataflow::lattice::Lattice + timely::order::TotalOrder,
{
    let by_space = vectors.map(|(s, id, v)| (s, (id, v)));
    by_space
        .clone()
        .join_map(by_space, move |s, (a, va), (b, vb)| {
            let cos = quantised_cos(va, vb);
            (a < b && cos >= lo).then(|| (s.clone(), a.clone(), b.clone(), (f64::from(cos) * 1e6).round() as i64))
        })
        .flat_map(|pair| pair)
}

/// Merging (CompassMem): events of one space whose vectors (of summary and people) reach cosine ≥ `tau` are linked;
/// merged events are the connected components of those links, each named by its smallest event id. Links come from
/// a self-join per space (a new event is compared with the space's events once); components from an iterative
/// min-label propagation, so an insert or delete anywhere updates exactly the groups it touches. Output:
/// `(space, event, group)` for every event (a lone event is its own group).
pub fn event_merges<'s, T>(
    vectors: differential_dataflow::VecCollection<'s, T, (String, String, Vec<i16>)>,
    tau: f32,
) -> differential_dataflow::VecCollection<'s, T, (String, String, String)>
where
    T: timely::progress::Timestamp + differential_dataflow::lattice::Lattice + timely::order::TotalOrder,
{
    let links = similar_pairs(vectors.clone(), tau).map(|(s, a, b, _)| (s, a, b));
    merge_groups(vectors, links)
}

/// The connected components of `links` (`(space, a, b)`, either direction) over the events of `vectors`, each
/// named by its smallest event id: `(space, event, group)` for every event.
pub fn merge_groups<'s, T>(
    vectors: differential_dataflow::VecCollection<'s, T, (String, String, Vec<i16>)>,
    links: differential_dataflow::VecCollection<'s, T, (String, String, String)>,
) -> differential_dataflow::VecCollection<'s, T, (String, String, String)>
where
    T: timely::progress::Timestamp + differential_dataflow::lattice::Lattice + timely::order::TotalOrder,
{
    use differential_dataflow::operators::iterate::Iterate;
    let links = links
        .flat_map(|(s, a, b)| [((s.clone(), a.clone()), (s.clone(), b.clone())), ((s.clone(), b), (s, a))])
        .distinct();
    let nodes = vectors.map(|(s, id, _)| ((s.clone(), id.clone()), id));
    let labels = nodes.clone().iterate(|scope, inner| {
        let nodes = nodes.enter(scope);
        let links = links.enter(scope);
        inner
            .join_map(links, |_a, label, b| (b.clone(), label.clone()))
            .concat(nodes)
            .reduce(|_k, labels: &[(&String, isize)], out: &mut Vec<(String, isize)>| out.push((labels[0].0.clone(), 1)))
    });
    labels.map(|((s, id), group)| (s, id, group))
}

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
    format!("coref:{}", crate::summary::content_hash(&[(&a.id, &da), (&b.id, &db)]))
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

/// The output of [`coreference`].
pub struct Coreference<'s, T: timely::progress::Timestamp> {
    /// Pairs with no logged verdict yet: `(space, key, [(id, description); 2])`.
    pub requests: differential_dataflow::VecCollection<'s, T, (String, String, Vec<(String, String)>)>,
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
    let verdicts = logged.filter(|((_, key), _)| key.starts_with("coref:"));
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
        (s, RelationRow { from: a.id, to: b.id, kind: RelationKind::Overlap, evidence })
    });
    let requests = pairs
        .antijoin(verdicts.map(|(k, _)| k).distinct())
        .map(|((s, key), (a, b))| (s, key, vec![(a.id.clone(), describe_event(&a)), (b.id.clone(), describe_event(&b))]));
    Coreference { requests, same, overlaps }
}

/// The number of topics for `n` events (CompassMem): max(2, min(⌊n/5⌋, 50)), never more than `n`.
pub fn topic_count(n: usize) -> usize {
    (n / 5).clamp(2, 50).min(n)
}

/// Deterministic k-means over quantised unit vectors (cosine): farthest-first seeding from the smallest id, then
/// Lloyd rounds until stable (at most 20). Returns, per input, the index of its topic's smallest member — a name
/// that does not depend on the order topics were found in.
pub fn kmeans_topics(items: &[(&str, &[i16])]) -> Vec<usize> {
    let n = items.len();
    if n == 0 {
        return Vec::new();
    }
    let k = topic_count(n);
    let vecs: Vec<Vec<f32>> = items.iter().map(|(_, v)| v.iter().map(|x| f32::from(*x) / 10_000.0).collect()).collect();
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| items[a].0.cmp(items[b].0));
    let mut centres: Vec<Vec<f32>> = vec![vecs[order[0]].clone()];
    while centres.len() < k {
        // The item least similar to every centre; ties to the smallest id.
        let next = order
            .iter()
            .copied()
            .map(|i| (centres.iter().map(|c| dot(&vecs[i], c)).fold(f32::MIN, f32::max), i))
            .min_by(|a, b| a.0.total_cmp(&b.0).then_with(|| items[a.1].0.cmp(items[b.1].0)))
            .expect("n > 0")
            .1;
        centres.push(vecs[next].clone());
    }
    let mut assign = vec![usize::MAX; n];
    for _round in 0..20 {
        let new: Vec<usize> = (0..n)
            .map(|i| {
                (0..k)
                    .map(|c| (dot(&vecs[i], &centres[c]), c))
                    .max_by(|a, b| a.0.total_cmp(&b.0).then_with(|| b.1.cmp(&a.1)))
                    .expect("k > 0")
                    .1
            })
            .collect();
        if new == assign {
            break;
        }
        assign = new;
        for (c, centre) in centres.iter_mut().enumerate() {
            let members: Vec<usize> = (0..n).filter(|&i| assign[i] == c).collect();
            if members.is_empty() {
                continue;
            }
            let mut sum = vec![0f32; centre.len()];
            for &i in &members {
                sum.iter_mut().zip(&vecs[i]).for_each(|(s, x)| *s += x);
            }
            let norm = sum.iter().map(|x| x * x).sum::<f32>().sqrt().max(f32::MIN_POSITIVE);
            *centre = sum.into_iter().map(|x| x / norm).collect();
        }
    }
    // Name each topic by its smallest member.
    let mut name: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
    for &i in &order {
        name.entry(assign[i]).or_insert(i);
    }
    (0..n).map(|i| name[&assign[i]]).collect()
}

/// Topics (CompassMem): per space, k-means over the events' vectors ([`kmeans_topics`]), recomputed as a whole
/// whenever the space's events change — a pure function of the current events, so incremental equals from
/// scratch (the paper's "join the nearest topic, re-cluster every 4 steps" depends on arrival order; this does
/// not). Output: `(space, topic, event)` with topic `T:<smallest member event id>`.
pub fn event_topics<'s, T>(
    vectors: differential_dataflow::VecCollection<'s, T, (String, String, Vec<i16>)>,
) -> differential_dataflow::VecCollection<'s, T, (String, String, String)>
where
    T: timely::progress::Timestamp + differential_dataflow::lattice::Lattice + timely::order::TotalOrder,
{
    vectors
        .map(|(s, id, v)| (s, (id, v)))
        .reduce(|_s, events: &[(&(String, Vec<i16>), isize)], out: &mut Vec<((String, String), isize)>| {
            let items: Vec<(&str, &[i16])> = events.iter().filter(|(_, d)| *d > 0).map(|(e, _)| (e.0.as_str(), e.1.as_slice())).collect();
            for (i, t) in kmeans_topics(&items).into_iter().enumerate() {
                out.push(((format!("T:{}", items[t].0), items[i].0.to_string()), 1));
            }
        })
        .map(|(s, (topic, event))| (s, topic, event))
}

#[cfg(test)]
mod live_answer_tests {
    use super::*;
    use crate::model::{Node, NodeKind};

    fn node(i: i64, text: &str) -> Node {
        Node {
            id: format!("m#T{i}"),
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
            events: vec![EventDraft { turns: (0..input.len()).collect(), summary: summary.into(), people: vec![], time: None }],
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
        assert!(relations.iter().any(|r| r.from == events[0].id && r.to == events[1].id && r.kind == RelationKind::Temporal));
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
