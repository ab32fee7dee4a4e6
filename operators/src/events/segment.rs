//! The extractive segmentation of a session (no model): a new event starts at a time gap (`time_gap_secs` between
//! two stamped turns), at a topic shift (the turn's hash-embedding cosine with the running event below
//! `shift_below`, once the event has `min_turns`), or when the event reaches `max_turns`. Each event gets an
//! extractive summary, its speakers (people) and the time of its first stamped turn.

use std::collections::BTreeSet;

use crate::embed::{features_by, fold_values};
use crate::llm::{EventDraft, TurnIn};
use crate::summary::extractive_summary;

#[derive(Clone, Debug)]
pub struct SegmentParams {
    pub time_gap_secs: i64,
    pub shift_below: f32,
    pub min_turns: usize,
    pub max_turns: usize,
    pub summary_words: usize,
    /// How far back an event looks for relations and how many it keeps (extractive relations).
    pub relations: super::RelationBounds,
}

impl Default for SegmentParams {
    fn default() -> Self {
        SegmentParams {
            time_gap_secs: 30 * 60,
            shift_below: 0.05,
            min_turns: 3,
            max_turns: 8,
            summary_words: 60,
            relations: super::RelationBounds::default(),
        }
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
    let vecs: Vec<Vec<f32>> =
        turns.iter().map(|t| fold_values(&features_by(&t.text, crate::hash::fnv1a), 256)).collect();
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
                let cos = if norm > 0.0 {
                    vecs[i].iter().zip(&centroid).map(|(a, b)| a * b).sum::<f32>() / norm
                } else {
                    0.0
                };
                gap || g.len() >= p.max_turns || (g.len() >= p.min_turns && cos < p.shift_below)
            }
        };
        if start {
            groups.push(Vec::new());
            centroid = vec![0.0; vecs[i].len()];
        }
        groups.last_mut().expect("a group").push(i);
        centroid.iter_mut().zip(vecs[i].iter()).for_each(|(c, x)| *c += x);
        if time.is_some() {
            last_time = time;
        }
    }
    groups
        .into_iter()
        .map(|g| {
            let texts: Vec<&str> = g.iter().map(|&i| turns[i].text.as_str()).collect();
            let people: BTreeSet<String> =
                g.iter().map(|&i| turns[i].speaker.clone()).filter(|s| !s.is_empty()).collect();
            EventDraft {
                summary: extractive_summary(&texts, p.summary_words),
                people: people.into_iter().collect(),
                time: g.iter().find_map(|&i| turns[i].ts.clone()),
                turns: g,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::llm::RelationKind;

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
