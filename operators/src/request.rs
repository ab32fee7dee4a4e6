//! The model requests of the memory, as one protocol: [`ModelRequest`] is what the dataflow asks of the model (a
//! cluster's summary, a session's events and relations, a co-reference judgement); the query-time stages (answer,
//! selection, plan, explorers) are asked by the engine at query time. Every reply is logged under a content key and
//! read back as an input, so the memory stays a function of the input and response logs. A key says what it answers
//! ([`RequestKind::of_key`]); the prefixes that tell them apart live here and nowhere else.

use serde::{Deserialize, Serialize};

use crate::hash::{content_hex, legacy_content_hex};
use crate::llm::{EventDraft, EventIn, Llm, LlmError, RelationDraft, TurnIn};

const SESSION_PREFIX: &str = "seg:";
const JUDGE_PREFIX: &str = "coref:";
const QUERY_PREFIX: &str = "q:";

/// What a logged reply answers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RequestKind {
    /// A cluster's summary (CAM).
    Summary,
    /// A session's events and relations (CompassMem).
    Session,
    /// A co-reference judgement on two events.
    Judge,
    /// A query-time stage: answer, selection, plan, explorers. Never an input of the dataflow.
    Query,
}

impl RequestKind {
    /// The kind of reply a response-log key holds.
    pub fn of_key(key: &str) -> RequestKind {
        if key.starts_with(SESSION_PREFIX) {
            RequestKind::Session
        } else if key.starts_with(JUDGE_PREFIX) {
            RequestKind::Judge
        } else if key.starts_with(QUERY_PREFIX) {
            RequestKind::Query
        } else {
            RequestKind::Summary
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            RequestKind::Summary => "summary",
            RequestKind::Session => "session",
            RequestKind::Judge => "judge",
            RequestKind::Query => "query",
        }
    }
}

/// A request of the memory's dataflow to the model, waiting under its content key until a reply is logged.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ModelRequest {
    /// A cluster of `layer` to summarise: its members `(id, text)` in id order (a member cluster shows its summary).
    Summary { layer: u32, cluster: String, members: Vec<(String, String)> },
    /// A session's turns, in order, to segment into events and relate.
    Session { conversation: String, session: i64, turns: Vec<TurnIn> },
    /// Two events `(id, description)` for the co-reference judge.
    Judge { pair: [(String, String); 2] },
}

impl ModelRequest {
    pub fn kind(&self) -> RequestKind {
        match self {
            ModelRequest::Summary { .. } => RequestKind::Summary,
            ModelRequest::Session { .. } => RequestKind::Session,
            ModelRequest::Judge { .. } => RequestKind::Judge,
        }
    }

    /// The key an earlier build logged this request's reply under. Upper-layer summaries and judgements name
    /// clusters and events by ids that were derived with the earlier hash too, so an old log answers only the
    /// requests over chunks and turns: layer-1 summaries and sessions.
    pub fn legacy_key(&self) -> String {
        match self {
            ModelRequest::Summary { members, .. } => {
                let refs: Vec<(&str, &str)> = members.iter().map(|(m, t)| (m.as_str(), t.as_str())).collect();
                members_key(&refs, legacy_content_hex)
            }
            ModelRequest::Session { turns, .. } => turns_key(turns, legacy_content_hex),
            ModelRequest::Judge { pair: [a, b] } => pair_key((&a.0, &a.1), (&b.0, &b.1), legacy_content_hex),
        }
    }

    /// An old log's reply for this request, made fit to log under `key`: a session's answer names the key it
    /// answers, which becomes `key`.
    pub fn upgrade_reply(&self, reply: &str, key: &str) -> Option<String> {
        match self {
            ModelRequest::Session { .. } => {
                let mut answer: SessionAnswer = serde_json::from_str(reply).ok()?;
                answer.key = key.to_string();
                serde_json::to_string(&answer).ok()
            }
            _ => Some(reply.to_string()),
        }
    }

    /// The answer logged in place of the model's when the model keeps failing at this request: the extractive
    /// backend's summary or segmentation, and `different` for a judgement (no merge, no link, without evidence).
    pub fn fallback(&self, extractive: &dyn Llm, key: &str) -> Result<String, LlmError> {
        match self {
            ModelRequest::Judge { .. } => {
                Ok(serde_json::json!({ "verdict": crate::llm::Verdict::Different }).to_string())
            }
            _ => self.ask(extractive, key),
        }
    }

    /// Asks `llm`, returning the reply as it is logged under `key` (the request's content key).
    pub fn ask(&self, llm: &dyn Llm, key: &str) -> Result<String, LlmError> {
        match self {
            ModelRequest::Summary { members, .. } => {
                let texts: Vec<&str> = members.iter().map(|m| m.1.as_str()).collect();
                llm.summarize(&texts)
            }
            ModelRequest::Session { conversation, session, turns } => {
                let events = llm.segment(turns)?;
                let ins: Vec<EventIn> = events.iter().map(EventIn::from).collect();
                let relations = if ins.len() > 1 { llm.relate(&ins)? } else { Vec::new() };
                let answer = SessionAnswer {
                    events,
                    relations,
                    conversation: conversation.clone(),
                    session: *session,
                    turn_ids: turns.iter().map(|t| t.id.clone()).collect(),
                    key: key.to_string(),
                };
                serde_json::to_string(&answer).map_err(|e| LlmError::BadReply(e.to_string()))
            }
            ModelRequest::Judge { pair: [a, b] } => {
                let verdict =
                    llm.judge(&a.1, &b.1)?.ok_or_else(|| LlmError::Service("no model to judge with".into()))?;
                Ok(serde_json::json!({ "verdict": verdict }).to_string())
            }
        }
    }
}

/// How a key's bytes become its hex digits: [`content_hex`] for every key written, [`legacy_content_hex`] only to find
/// the replies of a log written before it.
type Hex = fn(&[u8]) -> String;

fn members_key(members: &[(&str, &str)], hex: Hex) -> String {
    let mut key = Vec::new();
    for (id, text) in members {
        key.extend_from_slice(id.as_bytes());
        key.push(0x1e);
        key.extend_from_slice(text.as_bytes());
        key.push(0x1f);
    }
    hex(&key)
}

fn turns_key(turns: &[TurnIn], hex: Hex) -> String {
    let mut key = Vec::new();
    for t in turns {
        for part in [&t.id, &t.speaker, t.ts.as_deref().unwrap_or(""), &t.text] {
            key.extend_from_slice(part.as_bytes());
            key.push(0x1f);
        }
        key.push(0x1e);
    }
    format!("{SESSION_PREFIX}{}", hex(&key))
}

fn pair_key(a: (&str, &str), b: (&str, &str), hex: Hex) -> String {
    format!("{JUDGE_PREFIX}{}", members_key(&[a, b], hex))
}

fn stage_key(stage: &str, inputs: &[&str], hex: Hex) -> String {
    let parts: Vec<(String, &str)> = inputs.iter().enumerate().map(|(i, x)| (i.to_string(), *x)).collect();
    let refs: Vec<(&str, &str)> = parts.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    format!("{QUERY_PREFIX}{stage}:{}", members_key(&refs, hex))
}

/// The content key of a cluster: its members' ids and texts, in id order.
pub fn summary_key(members: &[(&str, &str)]) -> String {
    members_key(members, content_hex)
}

/// The content key of a session: its turns (ids, speakers, times, texts), in order.
pub fn session_key(turns: &[TurnIn]) -> String {
    turns_key(turns, content_hex)
}

/// The content key of a judged pair: its two events' ids and descriptions, so an edited event is judged again.
pub fn judge_key(a: (&str, &str), b: (&str, &str)) -> String {
    pair_key(a, b, content_hex)
}

/// The content key of a query-time call: its stage and inputs, in order.
pub fn query_key(stage: &str, inputs: &[&str]) -> String {
    stage_key(stage, inputs, content_hex)
}

/// The key an earlier build logged a query-time call's reply under ([`legacy_content_hex`]).
pub fn legacy_query_key(stage: &str, inputs: &[&str]) -> String {
    stage_key(stage, inputs, legacy_content_hex)
}

/// Whether a logged key is of the earlier form (32 hex digits after its prefix, where keys now have 40). Such a reply
/// is never an input as it stands: it is found by [`ModelRequest::legacy_key`] when its request comes round, and
/// logged again under the request's key.
pub fn is_legacy_key(key: &str) -> bool {
    let tail = key.rsplit(':').next().unwrap_or(key);
    tail.len() == 32 && tail.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A model's answer for one session, as logged:
/// `{"events":[EventDraft…],"relations":[RelationDraft…],"conversation","session","turn_ids","key"}` — the session
/// and the turns (in order) it segmented, so that a live session keeps using it for those turns when more arrive.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_key_depends_on_ids_and_texts() {
        let a = summary_key(&[("a", "x"), ("b", "y")]);
        assert_ne!(a, summary_key(&[("a", "x"), ("b", "z")]));
        assert_ne!(a, summary_key(&[("a", "x"), ("c", "y")]));
        assert_eq!(a, summary_key(&[("a", "x"), ("b", "y")]));
    }

    /// The keys of logged replies are part of the on-disk format: a response log written by an earlier build must
    /// still be found, so these values may not change — neither today's nor the earlier form's.
    #[test]
    fn keys_keep_their_logged_values() {
        assert_eq!(summary_key(&[("a", "x")]), "961023858288f9ba2174a84ce2eea1161dff4294");
        let t = TurnIn { id: "c#1".into(), speaker: "Ana".into(), text: "hi".into(), ts: None };
        assert_eq!(session_key(std::slice::from_ref(&t)), "seg:099363001eef6462b2f8bd24e3e2b4fe676c3175");
        assert_eq!(judge_key(("E:1", "a"), ("E:2", "b")), "coref:9a0de42a0355f952506ef22091dc3c56389ad6a0");
        assert_eq!(query_key("plan", &["q"]), "q:plan:70e8451772f4561d18b5fd942dc0d8c7acda3147");
        let summary =
            ModelRequest::Summary { layer: 1, cluster: "L1:x".into(), members: vec![("a".into(), "x".into())] };
        assert_eq!(summary.legacy_key(), "e1a448822cbe0a4ff1e84830aec1b84f");
        let session = ModelRequest::Session { conversation: "c".into(), session: 0, turns: vec![t] };
        assert_eq!(session.legacy_key(), "seg:57e629f0bdb8ef4f0657dd4aa26c7ebf");
        let judge = ModelRequest::Judge { pair: [("E:1".into(), "a".into()), ("E:2".into(), "b".into())] };
        assert_eq!(judge.legacy_key(), "coref:52577b0b965c9bb1caab679e746a7fe1");
        assert_eq!(legacy_query_key("plan", &["q"]), "q:plan:5e93d8fa44111c6b3f997230daaf99db");
        for legacy in [summary.legacy_key(), session.legacy_key(), legacy_query_key("plan", &["q"])] {
            assert!(is_legacy_key(&legacy), "{legacy}");
        }
        assert!(!is_legacy_key(&summary_key(&[("a", "x")])));
        assert!(!is_legacy_key(&query_key("plan", &["q"])));
    }

    #[test]
    fn an_old_session_reply_is_logged_again_under_the_new_key() {
        let t = TurnIn { id: "c#1".into(), speaker: "Ana".into(), text: "hi".into(), ts: None };
        let request = ModelRequest::Session { conversation: "c".into(), session: 0, turns: vec![t.clone()] };
        let old = SessionAnswer {
            events: vec![],
            relations: vec![],
            conversation: "c".into(),
            session: 0,
            turn_ids: vec!["c#1".into()],
            key: request.legacy_key(),
        };
        let new_key = session_key(&[t]);
        let up = request.upgrade_reply(&serde_json::to_string(&old).unwrap(), &new_key).unwrap();
        let up: SessionAnswer = serde_json::from_str(&up).unwrap();
        assert_eq!(up, SessionAnswer { key: new_key, ..old });
        assert_eq!(request.upgrade_reply("not json", "k"), None);
    }

    #[test]
    fn keys_say_what_they_answer() {
        let t = TurnIn { id: "c#1".into(), speaker: String::new(), text: "hi".into(), ts: None };
        assert_eq!(RequestKind::of_key(&session_key(&[t])), RequestKind::Session);
        assert_eq!(RequestKind::of_key(&judge_key(("a", "x"), ("b", "y"))), RequestKind::Judge);
        assert_eq!(RequestKind::of_key(&query_key("answer", &["q"])), RequestKind::Query);
        assert_eq!(RequestKind::of_key(&summary_key(&[("a", "x")])), RequestKind::Summary);
    }
}
