//! The checks on the chat stages' replies: each reply is parsed strictly against the shape its stage asked for, so
//! a reply that does not match is an error (sent back once for repair by [`OpenAiClient::chat_json`]), never a guess.
//!
//! [`OpenAiClient::chat_json`]: crate::openai::OpenAiClient::chat_json

use operators::events::{EventDraft, RelationDraft, RelationKind};
use serde_json::Value;

/// The start of a reply (200 characters), for an error message.
pub(crate) fn snippet(s: &str) -> String {
    s.chars().take(200).collect()
}

/// Some servers wrap JSON in a Markdown fence even when asked not to.
pub(crate) fn strip_fences(s: &str) -> &str {
    let t = s.trim();
    let t = t.strip_prefix("```json").or_else(|| t.strip_prefix("```")).unwrap_or(t);
    t.strip_suffix("```").unwrap_or(t).trim()
}

/// Checks a segmentation reply against `n` turns: a list of events whose turns (1-based in the prompt) cover
/// 1..=n exactly once, consecutively and in order.
pub fn validate_segments(v: &Value, n: usize) -> Result<Vec<EventDraft>, String> {
    let events = v.get("events").and_then(Value::as_array).ok_or("missing `events` array")?;
    let mut next = 0usize;
    let mut out = Vec::with_capacity(events.len());
    for (k, e) in events.iter().enumerate() {
        let turns = e.get("turns").and_then(Value::as_array).ok_or(format!("event {k}: missing `turns` array"))?;
        if turns.is_empty() {
            return Err(format!("event {k}: no turns"));
        }
        let mut idx = Vec::with_capacity(turns.len());
        for t in turns {
            let t = t.as_u64().ok_or(format!("event {k}: a turn number must be an integer"))? as usize;
            if t != next + 1 {
                return Err(format!("event {k}: turn {t} out of order (expected {})", next + 1));
            }
            idx.push(next);
            next += 1;
        }
        let summary = e.get("summary").and_then(Value::as_str).map(str::trim).unwrap_or("");
        if summary.is_empty() {
            return Err(format!("event {k}: missing or empty `summary`"));
        }
        let people = match e.get("people") {
            Some(Value::Array(a)) => a
                .iter()
                .map(|p| p.as_str().map(str::to_string).ok_or(format!("event {k}: `people` must be strings")))
                .collect::<Result<Vec<_>, _>>()?,
            None | Some(Value::Null) => Vec::new(),
            Some(_) => return Err(format!("event {k}: `people` must be an array")),
        };
        let time = e.get("time").and_then(Value::as_str).map(str::to_string);
        out.push(EventDraft { turns: idx, summary: summary.to_string(), people, time });
    }
    if next != n {
        return Err(format!("the events cover {next} of {n} turns"));
    }
    Ok(out)
}

/// Checks a relations reply against `n` events (1-based in the prompt).
pub fn validate_relations(v: &Value, n: usize) -> Result<Vec<RelationDraft>, String> {
    let rels = v.get("relations").and_then(Value::as_array).ok_or("missing `relations` array")?;
    let mut out = Vec::with_capacity(rels.len());
    for (k, r) in rels.iter().enumerate() {
        let end = |key: &str| -> Result<usize, String> {
            let i =
                r.get(key).and_then(Value::as_u64).ok_or(format!("relation {k}: `{key}` must be an event number"))?
                    as usize;
            if i == 0 || i > n {
                return Err(format!("relation {k}: `{key}` = {i} is not an event (1..={n})"));
            }
            Ok(i - 1)
        };
        let (from, to) = (end("from")?, end("to")?);
        if from == to {
            return Err(format!("relation {k}: an event cannot relate to itself"));
        }
        let kind = r.get("kind").and_then(Value::as_str).ok_or(format!("relation {k}: missing `kind`"))?;
        let (kind, reversed) =
            RelationKind::parse_directed(kind).ok_or(format!("relation {k}: unknown kind {kind:?}"))?;
        let (from, to) = if reversed { (to, from) } else { (from, to) };
        out.push(RelationDraft { from, to, kind });
    }
    out.sort();
    out.dedup();
    Ok(out)
}

/// `{"verdict": "same_event" | "has_overlap" | "different"}`.
pub fn validate_verdict(v: &Value) -> Result<operators::events::Verdict, String> {
    let verdict = v.get("verdict").ok_or("missing `verdict`")?;
    serde_json::from_value(verdict.clone())
        .map_err(|_| format!("`verdict` is {verdict}: expected same_event, has_overlap or different"))
}

/// `{"relevant": [1-based numbers]}` → 0-based indices, in range, without repeats.
pub fn validate_selection(v: &Value, n: usize) -> Result<Vec<usize>, String> {
    let list = v.get("relevant").and_then(Value::as_array).ok_or("missing `relevant` array")?;
    let mut out = Vec::new();
    for x in list {
        let i = x.as_u64().ok_or_else(|| format!("`relevant` holds {x}, not a passage number"))? as usize;
        if i == 0 || i > n {
            return Err(format!("passage {i} is out of range 1..={n}"));
        }
        if !out.contains(&(i - 1)) {
            out.push(i - 1);
        }
    }
    Ok(out)
}

/// `{"subgoals": [1–5 non-empty strings]}`.
pub fn validate_plan(v: &Value) -> Result<Vec<String>, String> {
    let list = v.get("subgoals").and_then(Value::as_array).ok_or("missing `subgoals` array")?;
    let goals: Vec<String> =
        list.iter().filter_map(Value::as_str).map(str::trim).filter(|g| !g.is_empty()).map(String::from).collect();
    if goals.len() != list.len() || goals.is_empty() || goals.len() > 5 {
        return Err(format!("`subgoals` must be 1 to 5 non-empty strings, got {}", Value::Array(list.clone())));
    }
    Ok(goals)
}

/// `{"actions": [{"event", "action"}]}` → one action per event (an event the reply leaves out is skipped).
pub fn validate_actions(v: &Value, n: usize) -> Result<Vec<operators::llm::Explore>, String> {
    use operators::llm::Explore;
    let list = v.get("actions").and_then(Value::as_array).ok_or("missing `actions` array")?;
    let mut out = vec![Explore::Skip; n];
    for a in list {
        let i =
            a.get("event").and_then(Value::as_u64).ok_or_else(|| format!("an action without an event number: {a}"))?
                as usize;
        if i == 0 || i > n {
            return Err(format!("event {i} is out of range 1..={n}"));
        }
        out[i - 1] = match a.get("action").and_then(Value::as_str) {
            Some("answer") => Explore::Answer,
            Some("expand") => Explore::Expand,
            Some("skip") => Explore::Skip,
            other => return Err(format!("action {other:?} for event {i}: expected answer, expand or skip")),
        };
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn retrieval_replies_are_checked() {
        use operators::llm::Explore;
        assert_eq!(validate_selection(&json!({"relevant": [3, 1, 3]}), 3), Ok(vec![2, 0]));
        assert_eq!(validate_selection(&json!({"relevant": []}), 3), Ok(vec![]));
        assert!(validate_selection(&json!({"relevant": [4]}), 3).unwrap_err().contains("out of range"));
        assert!(validate_selection(&json!({"relevant": ["1"]}), 3).is_err());
        assert!(validate_selection(&json!({"chosen": [1]}), 3).unwrap_err().contains("missing"));
        assert_eq!(validate_plan(&json!({"subgoals": [" a ", "b"]})), Ok(vec!["a".to_string(), "b".to_string()]));
        assert!(validate_plan(&json!({"subgoals": []})).is_err());
        assert!(validate_plan(&json!({"subgoals": ["a", "", "c"]})).is_err());
        assert!(validate_plan(&json!({"subgoals": ["1", "2", "3", "4", "5", "6"]})).is_err());
        let acts = validate_actions(
            &json!({"actions": [{"event": 2, "action": "expand"}, {"event": 3, "action": "answer"}]}),
            3,
        )
        .unwrap();
        assert_eq!(acts, vec![Explore::Skip, Explore::Expand, Explore::Answer], "a left-out event is skipped");
        assert!(validate_actions(&json!({"actions": [{"event": 1, "action": "maybe"}]}), 3)
            .unwrap_err()
            .contains("maybe"));
        assert!(validate_actions(&json!({"actions": [{"event": 0, "action": "skip"}]}), 3).is_err());
        use operators::events::Verdict;
        assert_eq!(validate_verdict(&json!({"verdict": "same_event"})), Ok(Verdict::SameEvent));
        assert_eq!(validate_verdict(&json!({"verdict": "has_overlap"})), Ok(Verdict::HasOverlap));
        assert!(validate_verdict(&json!({"verdict": "maybe"})).unwrap_err().contains("maybe"));
        assert!(validate_verdict(&json!({})).is_err());
    }

    #[test]
    fn segment_and_relation_replies_are_checked() {
        let ok = json!({"events": [{"turns": [1, 2], "summary": "a", "people": ["Ana"], "time": null},
                                   {"turns": [3], "summary": "b", "people": [], "time": "2026-01-01"}]});
        let ev = validate_segments(&ok, 3).unwrap();
        assert_eq!(ev[0].turns, vec![0, 1]);
        assert_eq!(ev[1].time.as_deref(), Some("2026-01-01"));
        assert!(validate_segments(&ok, 4).unwrap_err().contains("cover 3 of 4"));
        let gap = json!({"events": [{"turns": [1, 3], "summary": "a", "people": [], "time": null}]});
        assert!(validate_segments(&gap, 3).unwrap_err().contains("out of order"));
        let empty = json!({"events": [{"turns": [1], "summary": " ", "people": [], "time": null}]});
        assert!(validate_segments(&empty, 1).unwrap_err().contains("summary"));
        let rel =
            json!({"relations": [{"from": 2, "to": 1, "kind": "causal"}, {"from": 2, "to": 1, "kind": "causal"}]});
        assert_eq!(
            validate_relations(&rel, 2).unwrap(),
            vec![RelationDraft { from: 1, to: 0, kind: RelationKind::Causal }]
        );
        assert!(validate_relations(&json!({"relations": [{"from": 3, "to": 1, "kind": "causal"}]}), 2)
            .unwrap_err()
            .contains("not an event"));
        assert!(validate_relations(&json!({"relations": [{"from": 1, "to": 2, "kind": "caused-by"}]}), 2)
            .unwrap_err()
            .contains("unknown kind"));
        assert!(validate_relations(&json!({"relations": [{"from": 1, "to": 1, "kind": "causal"}]}), 2).is_err());
        // The paper's labels: `temporal_after` is `temporal` the other way round; `follow_up` is `follow-up`.
        let rel = json!({"relations": [{"from": 1, "to": 2, "kind": "temporal_after"}, {"from": 1, "to": 2, "kind": "follow_up"}]});
        assert_eq!(
            validate_relations(&rel, 2).unwrap(),
            vec![
                RelationDraft { from: 0, to: 1, kind: RelationKind::FollowUp },
                RelationDraft { from: 1, to: 0, kind: RelationKind::Temporal }
            ]
        );
    }

    #[test]
    fn fences_are_stripped() {
        assert_eq!(strip_fences("```json\n{\"a\":1}\n```"), "{\"a\":1}");
        assert_eq!(strip_fences(" {\"a\":1} "), "{\"a\":1}");
    }
}
