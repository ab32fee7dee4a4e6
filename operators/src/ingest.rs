//! From records to node deltas. Replacement and deletion need the previous version of what a record replaces; the
//! ingestor keeps the current nodes of every document, so its state is a function of the records it has seen (and
//! a replay of the same records rebuilds it).

use std::collections::{BTreeMap, HashMap};

use crate::chunk::chunk_text;
use crate::model::{chunk_id, turn_id, Node, NodeKind, POSITION_SCALE};
use crate::name::{Interner, Name};
use crate::record::Record;

/// A change to layer 0: `(space, node, +1 | -1)`.
pub type NodeDelta = (String, Node, isize);

#[derive(Clone, Debug)]
pub struct Ingestor {
    /// Token budget of a chunk (CAM: 512).
    pub chunk_tokens: usize,
    /// (space, doc) → unit key → the nodes of that unit. A unit is what one record replaces: a chunk `seq`
    /// (`c` and the seq, zero-padded: a `document` record's chunk `i` is unit `i`) or a turn (`t` and its name). A
    /// document and a conversation of one name share the entry (a delete names either) but never a unit.
    docs: HashMap<(String, String), BTreeMap<String, Vec<Node>>>,
    /// Documents', speakers' and times' names: the nodes of one document (and the turns of one speaker) share them.
    names: Interner,
}

impl Ingestor {
    pub fn new(chunk_tokens: usize) -> Self {
        Ingestor { chunk_tokens, docs: HashMap::new(), names: Interner::default() }
    }

    fn name(&mut self, s: &str) -> Name {
        self.names.name(s)
    }

    /// Every live layer-0 node, over all spaces.
    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.docs.values().flat_map(|d| d.values()).flatten()
    }

    /// Number of live layer-0 nodes over all spaces.
    pub fn node_count(&self) -> usize {
        self.docs.values().flat_map(|d| d.values()).map(Vec::len).sum()
    }

    /// Applies one record, returning the node deltas it causes (retractions first).
    pub fn apply(&mut self, record: Record) -> Vec<NodeDelta> {
        let mut out = Vec::new();
        match record {
            Record::Delete { space, doc } => {
                if let Some(units) = self.docs.remove(&(space.clone(), doc)) {
                    for n in units.into_values().flatten() {
                        out.push((space.clone(), n, -1));
                    }
                }
            }
            Record::Chunk { space, doc, seq, text, ts } => {
                let parts = chunk_text(&text, self.chunk_tokens);
                let count = parts.len() as i64;
                let (name, ts) = (self.name(&doc), ts.map(|t| self.name(&t)));
                let nodes = parts
                    .into_iter()
                    .enumerate()
                    .map(|(p, text)| Node {
                        id: chunk_id(&doc, seq, (count > 1).then_some(p)).into(),
                        kind: NodeKind::Chunk,
                        doc: name.clone(),
                        pos: seq * POSITION_SCALE + (p as i64) * POSITION_SCALE / count,
                        text: text.into(),
                        speaker: None,
                        ts: ts.clone(),
                    })
                    .collect();
                self.replace(space, doc, chunk_unit(seq), nodes, &mut out);
            }
            Record::Document { space, doc, text, ts } => {
                let (name, ts) = (self.name(&doc), ts.map(|t| self.name(&t)));
                let nodes: Vec<Node> = chunk_text(&text, self.chunk_tokens)
                    .into_iter()
                    .enumerate()
                    .map(|(i, text)| Node {
                        id: chunk_id(&doc, i as i64, None).into(),
                        kind: NodeKind::Chunk,
                        doc: name.clone(),
                        pos: i as i64 * POSITION_SCALE,
                        text: text.into(),
                        speaker: None,
                        ts: ts.clone(),
                    })
                    .collect();
                // A whole document replaces every unit of it, chunk records included; its chunk `i` is the unit a
                // chunk record of `seq` i replaces, so the two never hold one id twice.
                if let Some(units) = self.docs.remove(&(space.clone(), doc.clone())) {
                    out.extend(units.into_values().flatten().map(|n| (space.clone(), n, -1)));
                }
                for (i, node) in nodes.into_iter().enumerate() {
                    self.replace(space.clone(), doc.clone(), chunk_unit(i as i64), vec![node], &mut out);
                }
            }
            Record::Turn { space, conversation, turn, speaker, text, ts, seq } => {
                let pos = seq.unwrap_or_else(|| turn_position(&turn)) * POSITION_SCALE;
                let node = Node {
                    id: turn_id(&conversation, &turn).into(),
                    kind: NodeKind::Turn,
                    doc: self.name(&conversation),
                    pos,
                    text: text.into(),
                    speaker: Some(self.name(&speaker)),
                    ts: ts.map(|t| self.name(&t)),
                };
                self.replace(space, conversation, turn_unit(&turn), vec![node], &mut out);
            }
        }
        self.names.sweep();
        out
    }

    fn replace(&mut self, space: String, doc: String, unit: String, nodes: Vec<Node>, out: &mut Vec<NodeDelta>) {
        let units = self.docs.entry((space.clone(), doc)).or_default();
        if let Some(old) = units.insert(unit, nodes.clone()) {
            out.extend(old.into_iter().map(|n| (space.clone(), n, -1)));
        }
        out.extend(nodes.into_iter().map(|n| (space.clone(), n, 1)));
    }
}

/// The unit a chunk record of `seq` replaces (a `document` record's chunk `seq` too).
pub fn chunk_unit(seq: i64) -> String {
    format!("c{seq:020}")
}

/// The unit a turn record replaces.
pub fn turn_unit(turn: &str) -> String {
    format!("t{turn}")
}

/// The order of a turn within its conversation, from ids of the LoCoMo form `D<session>:<turn>` (sessions kept
/// far apart, so that the positional term never links two sessions) or a trailing number; 0 otherwise. A turn may
/// give `seq` to say it directly.
pub fn turn_position(turn: &str) -> i64 {
    let digits = |s: &str| s.trim_start_matches(|c: char| !c.is_ascii_digit()).parse::<i64>().ok();
    if let Some((session, n)) = turn.split_once(':') {
        if let (Some(s), Some(n)) = (digits(session), digits(n)) {
            return s.min(1_000_000) * 10_000 + n.min(9_999);
        }
    }
    let tail: String =
        turn.chars().rev().take_while(char::is_ascii_digit).collect::<Vec<_>>().into_iter().rev().collect();
    tail.parse::<i64>().map(|n| n.min(1_000_000_000)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(doc: &str, seq: i64, text: &str) -> Record {
        Record::Chunk { space: "s".into(), doc: doc.into(), seq, text: text.into(), ts: None }
    }

    #[test]
    fn replace_and_delete_retract_what_they_replace() {
        let mut ing = Ingestor::new(512);
        let d = ing.apply(chunk("d", 0, "first"));
        assert_eq!(d.len(), 1);
        let d = ing.apply(chunk("d", 0, "second"));
        assert_eq!(d.iter().map(|x| (x.1.text.as_str(), x.2)).collect::<Vec<_>>(), vec![("first", -1), ("second", 1)]);
        ing.apply(chunk("d", 1, "third"));
        assert_eq!(ing.node_count(), 2);
        let d = ing.apply(Record::Delete { space: "s".into(), doc: "d".into() });
        assert_eq!(d.iter().filter(|x| x.2 == -1).count(), 2);
        assert_eq!(ing.node_count(), 0);
        assert!(ing.apply(Record::Delete { space: "s".into(), doc: "d".into() }).is_empty());
    }

    #[test]
    fn documents_are_chunked_with_positions() {
        let mut ing = Ingestor::new(3);
        let d =
            ing.apply(Record::Document { space: "s".into(), doc: "b".into(), text: "a b c\n\nd e f".into(), ts: None });
        let pos: Vec<_> = d.iter().map(|x| (x.1.id.as_str(), x.1.pos)).collect();
        assert_eq!(pos, vec![("b#0", 0), ("b#1", 1000)]);
    }

    #[test]
    fn turn_positions() {
        assert_eq!(turn_position("D1:14"), 10_014);
        assert_eq!(turn_position("D12:3"), 120_003);
        assert_eq!(turn_position("t-7"), 7);
        assert_eq!(turn_position("hello"), 0);
    }

    fn turn(conversation: &str, turn: &str, text: &str) -> Record {
        Record::Turn {
            space: "s".into(),
            conversation: conversation.into(),
            turn: turn.into(),
            speaker: "Ana".into(),
            text: text.into(),
            ts: None,
            seq: None,
        }
    }

    /// A conversation's turns share its name, their speaker's and their time's allocation, and a node's retraction
    /// is the node it inserted (its strings too), so the dataflow and the views hold one copy of each.
    #[test]
    fn a_documents_nodes_share_their_strings() {
        let mut ing = Ingestor::new(512);
        let turn = |t: &str, text: &str| Record::Turn {
            space: "s".into(),
            conversation: "standup".into(),
            turn: t.into(),
            speaker: "Ana".into(),
            text: text.into(),
            ts: Some("2026-11-29T10:00:00Z".into()),
            seq: None,
        };
        let a = ing.apply(turn("t1", "the demo moves to Friday")).remove(0).1;
        let b = ing.apply(turn("t2", "and the review with it")).remove(0).1;
        let same = |x: &crate::name::Name, y: &crate::name::Name| std::ptr::eq(x.as_str(), y.as_str());
        assert!(same(&a.doc, &b.doc));
        assert!(same(a.speaker.as_ref().unwrap(), b.speaker.as_ref().unwrap()));
        assert!(same(a.ts.as_ref().unwrap(), b.ts.as_ref().unwrap()));
        let replaced = ing.apply(turn("t1", "the demo moves to Monday"));
        let (gone, d) = (&replaced[0].1, replaced[0].2);
        assert_eq!((d, gone), (-1, &a));
        assert!(same(&gone.text, &a.text) && same(&gone.id, &a.id), "the retraction holds the inserted strings");
        assert!(same(&replaced[1].1.doc, &a.doc));
    }

    fn live(ing: &Ingestor) -> Vec<String> {
        let mut ids: Vec<String> =
            ing.docs.values().flat_map(|d| d.values()).flatten().map(|n| n.id.to_string()).collect();
        ids.sort();
        ids
    }

    /// Names chosen to collide under a plain `doc#unit`: each record keeps its own node, and a delete of the shared
    /// name retracts exactly the nodes under it.
    #[test]
    fn adversarial_names_never_share_an_id() {
        let mut ing = Ingestor::new(512);
        let records = [
            chunk("a", 1, "chunk a 1"),
            turn("a", "1", "turn a 1"),
            turn("a", "00000000000000000001", "turn a padded 1"),
            chunk("a#1", 2, "chunk a#1 2"),
            turn("a", "1#2", "turn a 1#2"),
            turn("a%231", "2", "turn a%231 2"),
            turn("a", "1.0", "turn a 1.0"),
        ];
        for r in records.clone() {
            ing.apply(r);
        }
        let ids = live(&ing);
        assert_eq!(ids.len(), records.len(), "{ids:?}");
        let unique: std::collections::HashSet<&String> = ids.iter().collect();
        assert_eq!(unique.len(), ids.len(), "{ids:?}");
        for id in &ids {
            let (doc, _) = crate::model::split_node_id(id).unwrap();
            assert!(["a", "a#1", "a%231"].contains(&doc.as_str()), "{id} reads back as {doc}");
        }
        assert_eq!(crate::model::split_node_id("a%231#%312").unwrap(), ("a#1".to_string(), "12".to_string()));
        let gone = ing.apply(Record::Delete { space: "s".into(), doc: "a".into() });
        assert_eq!(gone.len(), 5, "{gone:?}");
        assert!(gone.iter().all(|(_, n, d)| *d == -1 && n.doc == "a"));
        assert_eq!(ing.node_count(), 2);
    }

    /// A chunk record of `seq` i after a document replaces the document's chunk i, rather than adding a second node
    /// of that id.
    #[test]
    fn a_chunk_record_replaces_the_chunk_of_a_document_it_names() {
        let mut ing = Ingestor::new(4);
        ing.apply(Record::Document {
            space: "s".into(),
            doc: "d".into(),
            text: "one two three four. five six seven eight.".into(),
            ts: None,
        });
        let before = live(&ing);
        assert!(before.len() >= 2, "{before:?}");
        let d = ing.apply(chunk("d", 0, "zero"));
        assert_eq!(d.iter().filter(|x| x.2 == -1).count(), 1, "{d:?}");
        assert_eq!(live(&ing), before, "same ids, one text replaced");
        assert_eq!(ing.docs.values().flat_map(|u| u.values()).flatten().filter(|n| n.text == "zero").count(), 1);
    }
}
