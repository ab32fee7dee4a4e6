//! The extractive relations among a session's events (no model): `temporal` between consecutive events of one
//! conversation; `causal` and `motivation` when an event's text carries a cue phrase ("because", "so", "as a
//! result" … / "in order to", "wants to", "plans to" …) and shares content words with an earlier event;
//! `shared-participants` when two non-adjacent events have a speaker in common and share content words. A baseline:
//! it cannot see causality a cue phrase does not state.

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
        let r = extractive_relations(&events);
        let has = |from, to, kind| r.contains(&RelationDraft { from, to, kind });
        assert!(has(0, 1, RelationKind::Temporal) && has(2, 3, RelationKind::Temporal));
        assert!(has(0, 2, RelationKind::Causal), "{r:?}");
        assert!(!has(1, 2, RelationKind::Causal), "no shared content, no cause: {r:?}");
        assert!(has(3, 0, RelationKind::Motivation), "{r:?}");
        assert!(has(0, 2, RelationKind::SharedParticipants), "{r:?}");
    }
}
