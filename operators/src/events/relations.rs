//! The extractive relations among a session's events (no model): `temporal` between consecutive events of one
//! conversation; `causal` and `motivation` when an event's text carries a cue phrase ("because", "so", "as a
//! result" … / "in order to", "wants to", "plans to" …) and shares content words with an earlier event;
//! `shared-participants` when two non-adjacent events have a speaker in common and share content words. A baseline:
//! it cannot see causality a cue phrase does not state.
//!
//! Bounded on long sessions: an event looks back at most `window` events for a cause, a motive or a shared
//! participant, and keeps at most `max_per_event` of those links, the strongest (most shared content words, then the
//! nearest in time). With the temporal links, an event has at most `2 + 2·max_per_event` relations however long its
//! meeting runs, so a walk over the event graph meets a degree that does not grow with the session.

use std::collections::BTreeSet;

use crate::embed::words;
use crate::llm::{EventIn, RelationDraft, RelationKind};

const CAUSAL: &[&str] = &[
    "because",
    "so that",
    "as a result",
    "therefore",
    "due to",
    "led to",
    "caused",
    "since then",
    "that's why",
    "which is why",
];
const MOTIVATION: &[&str] = &[
    "in order to",
    "wants to",
    "want to",
    "wanted to",
    "plans to",
    "planning to",
    "decided to",
    "hoping to",
    "so i can",
    "goal",
];

fn content(text: &str) -> BTreeSet<String> {
    words(text).into_iter().filter(|w| w.len() > 3).collect()
}

fn has_cue(text: &str, cues: &[&str]) -> bool {
    let t = format!(" {} ", words(text).join(" "));
    cues.iter().any(|c| t.contains(&format!(" {} ", words(c).join(" "))))
}

/// How far back an event looks for relations, and how many of them it keeps.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RelationBounds {
    pub window: usize,
    pub max_per_event: usize,
}

impl Default for RelationBounds {
    fn default() -> Self {
        RelationBounds { window: 16, max_per_event: 4 }
    }
}

/// The extractive relations among `events` (in time order): see the module comment.
pub fn extractive_relations(events: &[EventIn], bounds: RelationBounds) -> Vec<RelationDraft> {
    let words: Vec<BTreeSet<String>> = events.iter().map(|e| content(&e.summary)).collect();
    let mut out = BTreeSet::new();
    for j in 0..events.len() {
        if j > 0 {
            out.insert(RelationDraft { from: j - 1, to: j, kind: RelationKind::Temporal });
        }
        let causal = has_cue(&events[j].summary, CAUSAL);
        let motivation = has_cue(&events[j].summary, MOTIVATION);
        // (shared words, i): the strongest first, then the nearest.
        let mut linked: Vec<(usize, usize)> = (j.saturating_sub(bounds.window)..j)
            .map(|i| (words[i].intersection(&words[j]).count(), i))
            .filter(|(shared, _)| *shared >= 2)
            .collect();
        linked.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| b.1.cmp(&a.1)));
        let mut kept = 0;
        for (_, i) in linked {
            if kept >= bounds.max_per_event {
                break;
            }
            let shares_people = i + 1 < j && events[i].people.iter().any(|p| events[j].people.contains(p));
            if !(causal || motivation || shares_people) {
                continue;
            }
            kept += 1;
            if causal {
                out.insert(RelationDraft { from: i, to: j, kind: RelationKind::Causal });
            }
            if motivation {
                out.insert(RelationDraft { from: j, to: i, kind: RelationKind::Motivation });
            }
            if shares_people {
                out.insert(RelationDraft { from: i, to: j, kind: RelationKind::SharedParticipants });
            }
        }
    }
    out.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relations_from_order_cues_and_people() {
        let e = |s: &str, p: &[&str]| EventIn {
            id: String::new(),
            summary: s.into(),
            people: p.iter().map(|x| x.to_string()).collect(),
            time: None,
        };
        let events = vec![
            e("Ana lost her job at the bakery downtown.", &["Ana"]),
            e("Ben talked about football.", &["Ben"]),
            e("Ana is retraining as a nurse because she lost the bakery job.", &["Ana"]),
            e("Ana plans to open her own bakery downtown in order to replace the job she lost.", &["Ana"]),
        ];
        let r = extractive_relations(&events, RelationBounds::default());
        let has = |from, to, kind| r.contains(&RelationDraft { from, to, kind });
        assert!(has(0, 1, RelationKind::Temporal) && has(2, 3, RelationKind::Temporal));
        assert!(has(0, 2, RelationKind::Causal), "{r:?}");
        assert!(!has(1, 2, RelationKind::Causal), "no shared content, no cause: {r:?}");
        assert!(has(3, 0, RelationKind::Motivation), "{r:?}");
        assert!(has(0, 2, RelationKind::SharedParticipants), "{r:?}");
    }

    #[test]
    fn a_long_session_keeps_a_bounded_degree() {
        // 400 events of one speaker, all sharing their words: unbounded, every pair would be linked.
        let events: Vec<EventIn> = (0..400)
            .map(|i| EventIn {
                id: String::new(),
                summary: format!("Ana keeps planning the bakery budget because prices rose, item {i}"),
                people: vec!["Ana".into()],
                time: None,
            })
            .collect();
        let bounds = RelationBounds { window: 16, max_per_event: 4 };
        let r = extractive_relations(&events, bounds);
        let mut degree = vec![0usize; events.len()];
        for d in &r {
            degree[d.from] += 1;
            degree[d.to] += 1;
            assert!(d.from.abs_diff(d.to) <= bounds.window, "{d:?} reaches past the window");
        }
        let max = degree.iter().max().copied().unwrap_or(0);
        // Each event: 2 temporal, up to 4 kept links with 3 kinds each back, and what later events link to it.
        assert!(max <= 2 + 3 * 4 + 3 * 16, "degree {max}");
        let unbounded = extractive_relations(&events, RelationBounds { window: usize::MAX, max_per_event: usize::MAX });
        assert!(unbounded.len() > 10 * r.len(), "{} against {}", unbounded.len(), r.len());
    }
}
