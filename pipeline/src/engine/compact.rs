//! Compaction of the input log behind a checkpoint.
//!
//! A checkpoint at epoch `E` stands for the memory of the records logged up to `E`, and that memory is a function of
//! the nodes they leave live (incremental equals from-scratch). So of the rows up to `E` the log needs only those
//! whose content is still live at `E`: a record replaced later (the same chunk `seq`, the same turn, or a whole
//! document sent again) or deleted later, up to `E`, is dropped, and so is a delete once what it deleted is gone.
//! Rows after `E` are kept as they are: the dataflow applies them on top of `E`, retractions included. A row that
//! does not read as a record under today's limits touches nothing and is kept. The largest offset each source
//! reached stays in the log (as a position marker where its row is dropped), so a source resumes where it did.

use std::collections::HashMap;

use connectors::input_log::LoggedRecord;
use operators::ingest::{chunk_unit, turn_unit};
use operators::{Limits, Record};

/// The rows of a log after compaction behind epoch `through`, and how many rows it has fewer.
pub(super) struct Compacted {
    pub rows: Vec<LoggedRecord>,
    pub dropped: usize,
}

/// The rows of one document or conversation that supply its live content.
#[derive(Default)]
struct Live {
    /// The last whole-document record, which supplies every unit no later record replaced.
    document: Option<usize>,
    /// Unit (the ingestor's [`chunk_unit`] or [`turn_unit`]) → the row that supplies it.
    units: HashMap<String, usize>,
}

impl Live {
    /// Every row this document's content comes from; the entry is empty afterwards.
    fn drain(&mut self) -> impl Iterator<Item = usize> + '_ {
        self.document.take().into_iter().chain(self.units.drain().map(|(_, i)| i))
    }
}

/// Compacts `rows` (a log, in its order) behind epoch `through`.
pub(super) fn compact(rows: &[LoggedRecord], through: u64, limits: &Limits) -> Compacted {
    let mut keep = vec![true; rows.len()];
    let mut docs: HashMap<(String, String), Live> = HashMap::new();
    for (i, row) in rows.iter().enumerate().filter(|(_, r)| r.epoch <= through) {
        if row.record.is_null() {
            // A position marker: its offset is looked after below.
            keep[i] = false;
            continue;
        }
        let Ok(record) = operators::record::from_value(row.record.clone(), Some(&row.space), limits) else {
            continue;
        };
        let (space, doc, unit) = match record {
            Record::Delete { space, doc } => {
                if let Some(mut live) = docs.remove(&(space, doc)) {
                    live.drain().for_each(|j| keep[j] = false);
                }
                keep[i] = false;
                continue;
            }
            Record::Document { space, doc, .. } => {
                let live = docs.entry((space, doc)).or_default();
                live.drain().for_each(|j| keep[j] = false);
                live.document = Some(i);
                continue;
            }
            Record::Chunk { space, doc, seq, .. } => (space, doc, chunk_unit(seq)),
            Record::Turn { space, conversation, turn, .. } => (space, conversation, turn_unit(&turn)),
        };
        if let Some(j) = docs.entry((space, doc)).or_default().units.insert(unit, i) {
            keep[j] = false;
        }
    }
    // A source's largest offset: kept in a position marker where its row goes.
    let mut furthest: HashMap<&str, (u64, usize)> = HashMap::new();
    for (i, row) in rows.iter().enumerate() {
        if let (Some(src), Some(off)) = (&row.source, row.offset) {
            let e = furthest.entry(src.as_str()).or_insert((off, i));
            if off > e.0 {
                *e = (off, i);
            }
        }
    }
    let markers: std::collections::HashSet<usize> = furthest.values().map(|(_, i)| *i).filter(|i| !keep[*i]).collect();
    let mut out = Vec::with_capacity(rows.len());
    for (i, row) in rows.iter().enumerate() {
        if keep[i] {
            out.push(row.clone());
        } else if markers.contains(&i) {
            out.push(LoggedRecord { record: serde_json::Value::Null, ..row.clone() });
        }
    }
    let dropped = rows.len() - out.len();
    Compacted { rows: out, dropped }
}

#[cfg(test)]
mod tests {
    use super::*;
    use operators::ingest::Ingestor;
    use rand::{Rng, SeedableRng};
    use serde_json::json;

    fn row(epoch: u64, record: serde_json::Value) -> LoggedRecord {
        LoggedRecord { epoch, space: "s".into(), record, source: None, offset: None }
    }

    /// The live nodes after applying `rows` (those that read) in order.
    fn nodes(ingestor: &mut Ingestor, rows: &[LoggedRecord]) -> Vec<(String, String)> {
        for r in rows.iter().filter(|r| !r.record.is_null()) {
            if let Ok(rec) = operators::record::from_value(r.record.clone(), Some(&r.space), &Limits::default()) {
                ingestor.apply(rec);
            }
        }
        let mut out: Vec<(String, String)> = ingestor.nodes().map(|n| (n.id.to_string(), n.text.to_string())).collect();
        out.sort();
        out
    }

    /// Seeded streams of chunks, turns, whole documents (of one or two chunks) and deletes over a few names, cut at
    /// a random epoch: the compacted prefix leaves the same nodes as the whole prefix, and so does every tail after
    /// it.
    #[test]
    fn a_compacted_prefix_leaves_the_same_memory() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut shrunk = 0;
        for _ in 0..300 {
            let n = rng.gen_range(1..60);
            let mut rows = Vec::new();
            for i in 0..n {
                let doc = format!("d{}", rng.gen_range(0..4));
                let text = format!("text {} of {doc}", rng.gen_range(0..3));
                let record = match rng.gen_range(0..10) {
                    0 => json!({"kind": "delete", "doc": doc}),
                    1 => json!({"kind": "document", "doc": doc, "text": if rng.gen_bool(0.5) {
                        text.clone()
                    } else {
                        format!("{} {}", "long words here ".repeat(40), text)
                    }}),
                    2..=4 => {
                        json!({"kind": "turn", "conversation": doc, "turn": format!("D1:{}", rng.gen_range(0..4)),
                                        "speaker": "a", "text": text})
                    }
                    5 => json!({"kind": "chunk", "doc": doc}),
                    _ => json!({"kind": "chunk", "doc": doc, "seq": rng.gen_range(0..4), "text": text}),
                };
                rows.push(row(i / 3, record));
            }
            let through = rng.gen_range(0..=n / 3);
            let c = compact(&rows, through, &Limits::default());
            assert!(c.rows.len() <= rows.len());
            shrunk += c.dropped;
            let cut = |rs: &[LoggedRecord]| rs.iter().position(|r| r.epoch > through).unwrap_or(rs.len());
            let (full, compacted) = (&rows[..cut(&rows)], &c.rows[..cut(&c.rows)]);
            let mut a = Ingestor::new(64);
            let mut b = Ingestor::new(64);
            assert_eq!(nodes(&mut a, full), nodes(&mut b, compacted), "at the checkpoint");
            assert_eq!(&rows[cut(&rows)..], &c.rows[cut(&c.rows)..], "the tail is kept as it is");
            assert_eq!(nodes(&mut a, &rows[cut(&rows)..]), nodes(&mut b, &c.rows[cut(&c.rows)..]), "after the tail");
        }
        assert!(shrunk > 1000, "{shrunk} rows dropped: the streams replace and delete often");
    }

    #[test]
    fn a_sources_furthest_offset_stays() {
        let at = |epoch, seq, off| LoggedRecord {
            source: Some("file:a".into()),
            offset: Some(off),
            ..row(epoch, json!({"kind": "chunk", "doc": "d", "seq": seq, "text": "x"}))
        };
        let rows = vec![at(0, 0, 10), at(1, 0, 20), row(1, json!({"kind": "delete", "doc": "d"}))];
        let c = compact(&rows, 1, &Limits::default());
        assert_eq!(c.rows.len(), 1, "{:?}", c.rows);
        assert!(c.rows[0].record.is_null());
        assert_eq!((c.rows[0].source.as_deref(), c.rows[0].offset), (Some("file:a"), Some(20)));
        assert_eq!(c.dropped, 2);
    }
}
