//! Input records: parsed with serde_json, then validated field by field so that every reject says
//! exactly what is wrong. Parsing never panics; a reject is data (an [`Reject`]), not an error path.

use serde_json::{Map, Value};
use thiserror::Error;

/// What a record asks the memory to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// One chunk of a document at position `seq`. Re-sending `(space, doc, seq)` replaces it.
    Chunk { space: String, doc: String, seq: i64, text: String, ts: Option<String> },
    /// A whole document, split into chunks by the chunker. Re-sending `(space, doc)` replaces all its chunks.
    Document { space: String, doc: String, text: String, ts: Option<String> },
    /// One turn of a conversation. Re-sending `(space, conversation, turn)` replaces it.
    Turn {
        space: String,
        conversation: String,
        turn: String,
        speaker: String,
        text: String,
        ts: Option<String>,
        seq: Option<i64>,
    },
    /// Retracts a document or a conversation and everything derived from it.
    Delete { space: String, doc: String },
}

impl Record {
    pub fn space(&self) -> &str {
        match self {
            Record::Chunk { space, .. }
            | Record::Document { space, .. }
            | Record::Turn { space, .. }
            | Record::Delete { space, .. } => space,
        }
    }
}

/// Why a record was rejected. Always the sender's fault; retrying the same bytes cannot help.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum Reject {
    #[error("record is {size} bytes, over the limit of {limit} (max-record-bytes)")]
    TooLarge { size: usize, limit: usize },
    #[error("record is not valid UTF-8 (first bad byte at offset {offset})")]
    InvalidUtf8 { offset: usize },
    #[error("record is not valid JSON: {0}")]
    Json(String),
    #[error("record must be a JSON object, got {0}")]
    NotAnObject(&'static str),
    #[error("field `{field}` is required for kind `{kind}`")]
    Missing { field: &'static str, kind: String },
    #[error("field `{field}` must be {expected}, got {got}")]
    WrongType { field: String, expected: &'static str, got: &'static str },
    #[error("field `{field}` is invalid: {why}")]
    Invalid { field: String, why: String },
    #[error("unknown field `{0}` (known: space, kind, doc, seq, text, ts, conversation, turn, speaker)")]
    UnknownField(String),
    #[error("unknown kind `{0}` (expected chunk, document, turn or delete)")]
    UnknownKind(String),
    #[error("record is for space `{record}` but was sent to space `{target}`")]
    SpaceMismatch { record: String, target: String },
}

/// Validation limits, from config.
#[derive(Clone, Debug)]
pub struct Limits {
    /// Largest raw record accepted, in bytes.
    pub max_record_bytes: usize,
    /// Longest id (space, doc, conversation, turn, speaker), in bytes.
    pub max_id_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits { max_record_bytes: 1 << 20, max_id_bytes: 512 }
    }
}

const KNOWN: &[&str] = &["space", "kind", "doc", "seq", "text", "ts", "conversation", "turn", "speaker"];

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Parses and validates one raw record. `target_space` is the space named by the transport (the HTTP path, the
/// Kafka key): it fills a missing `space` and must agree with a present one.
pub fn parse_record(raw: &[u8], target_space: Option<&str>, limits: &Limits) -> Result<Record, Reject> {
    from_value(parse_json(raw, limits)?, target_space, limits)
}

/// The JSON value of one raw record: within `max-record-bytes`, UTF-8, JSON.
pub fn parse_json(raw: &[u8], limits: &Limits) -> Result<Value, Reject> {
    if raw.len() > limits.max_record_bytes {
        return Err(Reject::TooLarge { size: raw.len(), limit: limits.max_record_bytes });
    }
    let text = std::str::from_utf8(raw).map_err(|e| Reject::InvalidUtf8 { offset: e.valid_up_to() })?;
    serde_json::from_str(text).map_err(|e| Reject::Json(e.to_string()))
}

/// Validates an already-parsed JSON value (an element of an HTTP JSON array).
pub fn from_value(value: Value, target_space: Option<&str>, limits: &Limits) -> Result<Record, Reject> {
    let obj = match value {
        Value::Object(m) => m,
        other => return Err(Reject::NotAnObject(type_name(&other))),
    };
    if let Some(k) = obj.keys().find(|k| !KNOWN.contains(&k.as_str())) {
        return Err(Reject::UnknownField(k.clone()));
    }
    let f = Fields { obj: &obj, limits };
    let kind = match f.opt_str("kind")? {
        Some(k) => k.to_string(),
        None => return Err(Reject::Missing { field: "kind", kind: "(none)".into() }),
    };
    let space = match (f.opt_str("space")?, target_space) {
        (Some(s), Some(t)) if s != t => {
            return Err(Reject::SpaceMismatch { record: s.to_string(), target: t.to_string() })
        }
        (Some(s), _) | (None, Some(s)) => s.to_string(),
        (None, None) => return Err(Reject::Missing { field: "space", kind }),
    };
    check_id("space", &space, limits)?;
    if !space.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) {
        return Err(Reject::Invalid {
            field: "space".into(),
            why: "only ASCII letters, digits, '-', '_' and '.' are allowed".into(),
        });
    }
    let ts = f.opt_str("ts")?.map(str::to_string);
    match kind.as_str() {
        "chunk" => Ok(Record::Chunk {
            space,
            doc: f.id("doc", &kind)?,
            seq: f.req_int("seq", &kind)?,
            text: f.text(&kind)?,
            ts,
        }),
        "document" => Ok(Record::Document { space, doc: f.id("doc", &kind)?, text: f.text(&kind)?, ts }),
        "turn" => Ok(Record::Turn {
            space,
            conversation: f.id("conversation", &kind)?,
            turn: f.id("turn", &kind)?,
            speaker: f.id("speaker", &kind)?,
            text: f.text(&kind)?,
            ts,
            seq: f.opt_int("seq")?,
        }),
        "delete" => {
            // A delete names a document or a conversation: both are the same thing to the memory.
            let doc = match (f.opt_str("doc")?, f.opt_str("conversation")?) {
                (Some(d), None) | (None, Some(d)) => d.to_string(),
                (Some(_), Some(_)) => {
                    return Err(Reject::Invalid {
                        field: "doc".into(),
                        why: "give `doc` or `conversation`, not both".into(),
                    })
                }
                (None, None) => return Err(Reject::Missing { field: "doc", kind }),
            };
            check_id("doc", &doc, limits)?;
            Ok(Record::Delete { space, doc })
        }
        other => Err(Reject::UnknownKind(other.chars().take(64).collect())),
    }
}

fn check_id(field: &str, v: &str, limits: &Limits) -> Result<(), Reject> {
    if v.is_empty() {
        return Err(Reject::Invalid { field: field.into(), why: "must not be empty".into() });
    }
    if v.len() > limits.max_id_bytes {
        return Err(Reject::Invalid { field: field.into(), why: format!("longer than {} bytes", limits.max_id_bytes) });
    }
    if v.chars().any(char::is_control) {
        return Err(Reject::Invalid { field: field.into(), why: "contains control characters".into() });
    }
    Ok(())
}

struct Fields<'a> {
    obj: &'a Map<String, Value>,
    limits: &'a Limits,
}

impl Fields<'_> {
    fn opt_str(&self, field: &'static str) -> Result<Option<&str>, Reject> {
        match self.obj.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(v) => Err(Reject::WrongType { field: field.into(), expected: "a string", got: type_name(v) }),
        }
    }
    fn id(&self, field: &'static str, kind: &str) -> Result<String, Reject> {
        let v = self.opt_str(field)?.ok_or_else(|| Reject::Missing { field, kind: kind.into() })?;
        check_id(field, v, self.limits)?;
        Ok(v.to_string())
    }
    fn text(&self, kind: &str) -> Result<String, Reject> {
        let v = self.opt_str("text")?.ok_or_else(|| Reject::Missing { field: "text", kind: kind.into() })?;
        if v.trim().is_empty() {
            return Err(Reject::Invalid { field: "text".into(), why: "is empty".into() });
        }
        Ok(v.to_string())
    }
    fn opt_int(&self, field: &'static str) -> Result<Option<i64>, Reject> {
        match self.obj.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Number(n)) => match n.as_i64() {
                // Positions are scaled by 1000 inside the memory; keep them far from overflow.
                Some(i) if (0..=1_000_000_000_000).contains(&i) => Ok(Some(i)),
                _ => Err(Reject::Invalid { field: field.into(), why: format!("{n} is not an integer in 0..=10^12") }),
            },
            Some(v) => Err(Reject::WrongType { field: field.into(), expected: "an integer", got: type_name(v) }),
        }
    }
    fn req_int(&self, field: &'static str, kind: &str) -> Result<i64, Reject> {
        self.opt_int(field)?.ok_or_else(|| Reject::Missing { field, kind: kind.into() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(s: &str) -> Result<Record, Reject> {
        parse_record(s.as_bytes(), None, &Limits::default())
    }

    #[test]
    fn parses_the_three_kinds_of_design() {
        let c =
            parse(r#"{"space":"news","kind":"chunk","doc":"r-1","seq":3,"text":"Hello.","ts":"2026-11-29T10:00:00Z"}"#);
        assert!(matches!(c, Ok(Record::Chunk { seq: 3, .. })), "{c:?}");
        let t = parse(r#"{"space":"s","kind":"turn","conversation":"c","turn":"D1:14","speaker":"Ana","text":"hi"}"#);
        assert!(matches!(t, Ok(Record::Turn { .. })), "{t:?}");
        let d = parse(r#"{"space":"news","kind":"delete","doc":"r-1"}"#);
        assert_eq!(d, Ok(Record::Delete { space: "news".into(), doc: "r-1".into() }));
        let d = parse(r#"{"space":"news","kind":"delete","conversation":"c"}"#);
        assert_eq!(d, Ok(Record::Delete { space: "news".into(), doc: "c".into() }));
    }

    #[test]
    fn rejects_say_what_is_wrong() {
        let cases = [
            (r#"{"space":"news","kind":"chunk","doc":"r","seq":1,"text":"#, "not valid JSON"),
            (r#"{"space":"news","kind":"chunk","doc":"r","seq":"1","text":"x"}"#, "`seq` must be an integer"),
            (r#"{"space":"news","kind":"chunk","doc":"r","text":"x"}"#, "`seq` is required"),
            (r#"{"space":"news","kind":"chunk","doc":7,"seq":1,"text":"x"}"#, "`doc` must be a string"),
            (r#"{"space":"news","kind":"chunk","doc":"r","seq":-1,"text":"x"}"#, "`seq` is invalid"),
            (r#"{"space":"news","kind":"chunk","doc":"r","seq":1,"text":"  "}"#, "`text` is invalid: is empty"),
            (r#"{"space":"news","kind":"poem","doc":"r"}"#, "unknown kind `poem`"),
            (r#"{"space":"news","kind":"chunk","doc":"r","seq":1,"text":"x","colour":1}"#, "unknown field `colour`"),
            (r#"{"kind":"chunk","doc":"r","seq":1,"text":"x"}"#, "`space` is required"),
            (r#"{"space":"a b","kind":"delete","doc":"r"}"#, "`space` is invalid"),
            (r#"[1,2]"#, "must be a JSON object, got an array"),
            (r#"{"space":"n","kind":"delete","doc":"a","conversation":"b"}"#, "not both"),
        ];
        for (raw, want) in cases {
            let err = parse(raw).expect_err(raw).to_string();
            assert!(err.contains(want), "{raw} → {err}, wanted {want}");
        }
    }

    #[test]
    fn invalid_utf8_and_size_limit() {
        let bad = b"{\"space\":\"n\",\"kind\":\"delete\",\"doc\":\"\xff\xfe\"}";
        assert!(matches!(parse_record(bad, None, &Limits::default()), Err(Reject::InvalidUtf8 { offset: 36 })));
        let limits = Limits { max_record_bytes: 100, ..Limits::default() };
        let huge = format!(r#"{{"space":"n","kind":"chunk","doc":"d","seq":0,"text":"{}"}}"#, "x".repeat(200));
        assert!(matches!(parse_record(huge.as_bytes(), None, &limits), Err(Reject::TooLarge { limit: 100, .. })));
    }

    #[test]
    fn target_space_fills_and_guards() {
        let r = parse_record(br#"{"kind":"delete","doc":"d"}"#, Some("s1"), &Limits::default()).unwrap();
        assert_eq!(r.space(), "s1");
        let e = parse_record(br#"{"space":"s2","kind":"delete","doc":"d"}"#, Some("s1"), &Limits::default());
        assert!(matches!(e, Err(Reject::SpaceMismatch { .. })));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// Arbitrary bytes never panic, and a reject always carries a non-empty reason.
        #[test]
        fn garbage_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Err(e) = parse_record(&bytes, None, &Limits { max_record_bytes: 200, max_id_bytes: 16 }) {
                prop_assert!(!e.to_string().is_empty());
            }
        }

        /// Truncating a valid record anywhere gives a reject (or, at the full length, the record), never a panic.
        #[test]
        fn truncations_are_rejected(cut in 0usize..90) {
            let full = r#"{"space":"news","kind":"chunk","doc":"doc-1","seq":2,"text":"Prices rose in Lisbon."}"#;
            let cut = cut.min(full.len() - 1);
            prop_assert!(parse(&full[..cut]).is_err());
        }

        /// Wrong JSON types in any field are rejected with the field named.
        #[test]
        fn wrong_types_name_the_field(field in proptest::sample::select(vec!["space", "doc", "text", "seq", "ts"]),
                                      value in proptest::sample::select(vec!["true", "[]", "{}", "1.5", "\"x\""])) {
            let mut obj: serde_json::Map<String, Value> = serde_json::from_str(
                r#"{"space":"news","kind":"chunk","doc":"doc-1","seq":2,"text":"t"}"#).unwrap();
            obj.insert(field.to_string(), serde_json::from_str(value).unwrap());
            let raw = serde_json::to_vec(&obj).unwrap();
            if let Err(e) = parse_record(&raw, None, &Limits::default()) {
                prop_assert!(e.to_string().contains(field), "{} does not name {}", e, field);
            }
        }
    }
}
