//! Checkpoints of the views: what a restart serves at once, while the dataflow rebuilds from the logs behind it.
//!
//! A checkpoint holds the views at an epoch `E` as the updates that build them ([`Views::snapshot`]), the number of
//! the model's replies the dataflow had been fed by `E` (the first that many of the response log, in its order), and
//! a fingerprint of the configuration the memory depends on. The memory at `E` is a function of the records logged
//! at epochs up to `E` and of those replies, so a restart feeds exactly them at epoch `E` — their updates are what
//! the checkpoint already holds, up to the similarity index's approximation: the views sink sets them aside and, once
//! the rebuild has passed `E`, corrects the views where they differ — and everything after at `E + 1`, applied as
//! usual.
//! The hierarchy runs behind layer 0 (see `structure.rs`): a checkpoint holds it as of its own epoch, served at
//! restart until the structure's first step replaces it whole.
//! The file is `DATA_DIR/checkpoint.bin`: a magic line, the bincode body, and the body's BLAKE3 hash; written aside,
//! fsync'd, renamed over the last one, the directory fsync'd. A checkpoint that does not read, whose hash or
//! fingerprint does not match, or that is ahead of the logs (a lost log) is ignored with a warning: the restart
//! rebuilds.

use std::collections::VecDeque;
use std::io::Write;
use std::path::{Path, PathBuf};

use operators::memory::Indexes;
use operators::model::ErrorRow;
use operators::similarity::IndexState;
use operators::Embedding;
use serde::{Deserialize, Serialize};

use crate::ann::AnnState;
use crate::config::Config;
use crate::views::{ViewUpdate, Views};

const MAGIC: &[u8] = b"engram checkpoint 5\n";

/// The views at an epoch, and what the dataflow had been fed by then.
#[derive(Serialize, Deserialize)]
pub(super) struct Checkpoint {
    pub fingerprint: String,
    pub epoch: u64,
    /// The epoch the checkpoint's hierarchy reflects (the structure runs behind layer 0: at most `epoch`).
    pub hierarchy_epoch: Option<u64>,
    /// The model's replies fed by `epoch`: the first this many of the response log's dataflow replies.
    pub replies: u64,
    /// The input log's records fed by `epoch`: a log that holds another number up to `epoch` is not the one this
    /// checkpoint was made from (a lost or replaced log).
    pub records: u64,
    pub errors_total: u64,
    /// The recent rejects, as JSON (their optional field is skipped when empty, which bincode cannot read back).
    pub errors: Vec<String>,
    pub updates: Vec<ViewUpdate>,
    pub vectors: Vec<(String, Embedding)>,
    /// The similarity indexes at `epoch`, when they were taken with the views (nothing fed after `epoch` yet).
    pub indexes: Option<IndexStates>,
    /// The views' nearest-neighbour indexes, by space: a restart installs them instead of building them again.
    pub ann: Vec<(String, AnnState)>,
}

/// The memory's similarity indexes at a checkpoint's epoch, by space: layer 0's and the events'.
#[derive(Serialize, Deserialize)]
pub(super) struct IndexStates {
    pub layer0: Vec<(String, IndexState)>,
    pub events: Vec<(String, IndexState)>,
}

impl IndexStates {
    /// The indexes' states now.
    pub fn of(indexes: &Indexes) -> IndexStates {
        IndexStates { layer0: indexes.layer0.states(), events: indexes.events.states() }
    }

    /// Hands the states to the indexes, each restored with its space's first batch.
    pub fn restore(self, indexes: &Indexes) {
        indexes.layer0.restore(self.layer0);
        indexes.events.restore(self.events);
    }
}

impl Checkpoint {
    /// The views' checkpoint at their `as_of`, with `(replies, records)` fed by then and the similarity indexes'
    /// states when they are at that epoch too.
    pub fn of(
        views: &Views,
        config: &Config,
        (replies, records): (u64, u64),
        indexes: Option<IndexStates>,
    ) -> Option<Checkpoint> {
        let epoch = views.as_of?;
        let (updates, vectors) = views.snapshot();
        Some(Checkpoint {
            fingerprint: fingerprint(config),
            epoch,
            hierarchy_epoch: views.hierarchy_as_of,
            replies,
            records,
            errors_total: views.errors_total,
            errors: views.recent_errors.iter().filter_map(|e| serde_json::to_string(e).ok()).collect(),
            updates,
            vectors,
            indexes,
            ann: views.ann_states(),
        })
    }

    /// Builds `views` from the checkpoint.
    pub fn restore(self, views: &mut Views) {
        let errors: VecDeque<ErrorRow> = self.errors.iter().filter_map(|e| serde_json::from_str(e).ok()).collect();
        views.restore((self.epoch, self.hierarchy_epoch), self.updates, self.vectors, self.errors_total, errors);
        views.restore_indexes(self.ann);
    }

    /// Writes the checkpoint to `path`, replacing the last one only once this one is whole and durable.
    pub fn write(&self, path: &Path) -> std::io::Result<u64> {
        let body = bincode::serialize(self).map_err(std::io::Error::other)?;
        let aside = aside(path);
        let mut f = std::fs::File::create(&aside)?;
        f.write_all(MAGIC)?;
        f.write_all(&body)?;
        f.write_all(blake3::hash(&body).as_bytes())?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&aside, path)?;
        connectors::input_log::sync_parent(path)?;
        Ok((MAGIC.len() + body.len() + 32) as u64)
    }

    /// Reads the checkpoint at `path`: `Ok(None)` when there is none, an error naming what is wrong otherwise.
    pub fn read(path: &Path, config: &Config) -> Result<Option<Checkpoint>, String> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e.to_string()),
        };
        let body = bytes
            .strip_prefix(MAGIC)
            .filter(|b| b.len() >= 32)
            .ok_or_else(|| "not an engram checkpoint (or one of another version)".to_string())?;
        let (body, hash) = body.split_at(body.len() - 32);
        if blake3::hash(body).as_bytes() != hash {
            return Err("checksum mismatch".into());
        }
        let c: Checkpoint = bincode::deserialize(body).map_err(|e| format!("does not read: {e}"))?;
        if c.fingerprint != fingerprint(config) {
            return Err("written under another configuration of the memory".into());
        }
        Ok(Some(c))
    }
}

fn aside(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".tmp");
    PathBuf::from(p)
}

/// What the memory depends on besides its logs: a checkpoint made under other settings of these is not this memory.
pub(super) fn fingerprint(config: &Config) -> String {
    let parts = serde_json::json!({
        "ingest": { "chunk-tokens": config.ingest.chunk_tokens, "max-record-bytes": config.ingest.max_record_bytes,
                    "max-id-bytes": config.ingest.max_id_bytes },
        "embedder": &config.embedder,
        "events": &config.events,
        "similarity": &config.similarity,
        "hierarchy": &config.hierarchy,
        "llm": { "backend": &config.llm.backend, "model": &config.llm.model },
        "query": &config.query,
    });
    operators::hash::content_hex(parts.to_string().as_bytes())
}

impl super::state::Shared {
    fn checkpoint_path(&self) -> PathBuf {
        self.data_dir().join("checkpoint.bin")
    }

    /// Whether this engine writes checkpoints: configured, process 0 (which holds the views), and every reply it is
    /// fed is in its own response log (replies read from the response topic are not, so counting them would misplace
    /// the cut).
    fn checkpoints_on(&self) -> bool {
        !self.config.checkpoint.interval.is_zero() && self.place.leads() && self.checkpoints_allowed
    }

    /// The driver fed `epoch` with `replies` of the model's replies and `records` records among its items.
    pub(super) fn fed(&self, epoch: u64, replies: u64, records: u64) {
        let mut fed = self.fed.lock().expect("fed lock");
        fed.0 .0 += replies;
        fed.0 .1 += records;
        let total = fed.0;
        fed.1.insert(epoch, total);
    }

    /// The replies and records fed by the end of `epoch`.
    fn fed_by(&self, epoch: u64) -> (u64, u64) {
        let mut fed = self.fed.lock().expect("fed lock");
        let Some((&at, &n)) = fed.1.range(..=epoch).next_back() else { return (0, 0) };
        fed.1 = fed.1.split_off(&at);
        n
    }

    /// Called by the views sink once the views hold `as_of`: writes a checkpoint in the background when one is due.
    pub(super) fn checkpoint_if_due(self: &std::sync::Arc<Self>, as_of: u64) {
        // Only between epochs: with every epoch fed in the views, the similarity indexes are at the views' epoch.
        if !self.checkpoints_on()
            || self.restored_through.is_some_and(|e| as_of <= e)
            || self.in_flight() > 0
            || self.last_checkpoint.lock().expect("checkpoint lock").elapsed() < self.config.checkpoint.interval
            || self.checkpointing.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            return;
        }
        let t = std::time::Instant::now();
        let checkpoint = self.take_checkpoint();
        let taken = t.elapsed();
        let shared = self.clone();
        std::thread::spawn(move || {
            if let Some(c) = checkpoint {
                shared.write_checkpoint(&c, taken);
            }
            *shared.last_checkpoint.lock().expect("checkpoint lock") = std::time::Instant::now();
            shared.checkpointing.store(false, std::sync::atomic::Ordering::SeqCst);
        });
    }

    /// The checkpoint of the views as they are, with the similarity indexes' states when they are at the views'
    /// epoch. The views' part and the indexes' are taken on two threads at once (both only read), so the pause in
    /// applying epochs is the longer of the two, not their sum.
    fn take_checkpoint(&self) -> Option<Checkpoint> {
        let views = self.views();
        let fed = self.fed_by(views.as_of?);
        let (indexes, checkpoint) = std::thread::scope(|s| {
            let indexes = s.spawn(|| self.index_states());
            let checkpoint = Checkpoint::of(&views, &self.config, fed, None);
            (indexes.join().expect("taking the indexes' states does not panic"), checkpoint)
        });
        checkpoint.map(|c| Checkpoint { indexes, ..c })
    }

    /// The similarity indexes' states, when they are at the views' epoch: called with the views held, it takes them
    /// only if every epoch fed is in the views (with an epoch in flight the dataflow may be past them; at a clean
    /// stop none is), and only in one process (in a cluster another driver may have moved the frontier past the
    /// views' epoch: process 0's epochs in flight do not say).
    fn index_states(&self) -> Option<IndexStates> {
        (self.place.processes == 1 && self.in_flight() == 0).then(|| IndexStates::of(&self.indexes))
    }

    /// Writes the last checkpoint, at a clean stop (after any in the background).
    pub(super) fn final_checkpoint(&self) {
        if !self.checkpoints_on() || self.failure().is_some() {
            return;
        }
        while self.checkpointing.swap(true, std::sync::atomic::Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let t = std::time::Instant::now();
        let checkpoint = self.take_checkpoint();
        if let Some(c) = checkpoint {
            self.write_checkpoint(&c, t.elapsed());
        }
        self.checkpointing.store(false, std::sync::atomic::Ordering::SeqCst);
    }

    /// Writes `c`, which took `taken` to take (on the views sink's thread, for a checkpoint in the background).
    fn write_checkpoint(&self, c: &Checkpoint, taken: std::time::Duration) {
        self.metrics.checkpoint_pause_seconds.observe(taken.as_secs_f64());
        let t = std::time::Instant::now();
        match c.write(&self.checkpoint_path()) {
            Ok(bytes) => {
                self.metrics.checkpoint_epoch.set(c.epoch as i64);
                self.metrics.checkpoint_bytes.set(bytes as i64);
                self.metrics.checkpoint_seconds.observe(t.elapsed().as_secs_f64());
                tracing::info!(epoch = c.epoch, bytes, ?taken, took = ?t.elapsed(), indexes = c.indexes.is_some(), "checkpoint written");
            }
            Err(e) => {
                self.metrics.checkpoint_failures.inc();
                tracing::error!(error = %e, "could not write the checkpoint; the last one stands");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Overrides;

    fn refused(r: Result<Option<Checkpoint>, String>) -> String {
        r.err().expect("refused")
    }

    fn config(env: &[(&str, &str)]) -> Config {
        let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        Config::load(None, env, &Overrides::default()).unwrap()
    }

    #[test]
    fn a_checkpoint_reads_back_and_a_damaged_or_foreign_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("checkpoint.bin");
        let c = config(&[]);
        assert!(Checkpoint::read(&path, &c).unwrap().is_none(), "none yet");
        let mut views = Views::default();
        let node = operators::Node {
            id: "d#0".into(),
            kind: operators::model::NodeKind::Chunk,
            doc: "d".into(),
            pos: 0,
            text: "the harbour".into(),
            speaker: None,
            ts: None,
        };
        // A vector stored sparse (3 of 1,024 components) travels in its form and reads back the same.
        let mut values = vec![0f32; 1024];
        (values[3], values[500], values[1023]) = (0.6, -0.48, 0.64);
        let sparse = Embedding::new(values);
        assert!(sparse.is_sparse());
        let second = operators::Node { id: "d#1".into(), pos: 1000, ..node.clone() };
        views.apply(vec![
            (ViewUpdate::Node("s".into(), Box::new(node.clone()), Embedding::new(vec![1.0, 0.0])), 1),
            (ViewUpdate::Node("s".into(), Box::new(second.clone()), sparse.clone()), 1),
        ]);
        views.as_of = Some(4);
        // The similarity index of those two nodes travels with the views and restores with them.
        let mut index =
            operators::SimilarityIndex::new(operators::SimilarityParams { theta: 0.0, ..Default::default() });
        index.apply(vec![(node.clone(), Embedding::new(vec![1.0, 0.0]), 1), (second.clone(), sparse.clone(), 1)]);
        let states = IndexStates { layer0: vec![("s".into(), index.state())], events: Vec::new() };
        Checkpoint::of(&views, &c, (2, 1), Some(states)).unwrap().write(&path).unwrap();
        let mut back = Checkpoint::read(&path, &c).unwrap().unwrap();
        assert_eq!((back.epoch, back.replies, back.records, back.updates.len()), (4, 2, 1, 2));
        let states = back.indexes.take().expect("the indexes read back");
        assert_eq!((states.layer0.len(), &states.layer0[0].0), (1, &"s".to_string()));
        assert_eq!(states.layer0[0].1, index.state());
        let mut restored = Views::default();
        back.restore(&mut restored);
        assert_eq!((restored.as_of, restored.node_count()), (Some(4), 2));
        let read = &restored.spaces["s"].nodes["d#1"].1;
        assert!(read.is_sparse() && *read == sparse, "{read:?}");

        let other = config(&[("ENGRAM__SIMILARITY__THETA", "0.9")]);
        assert!(refused(Checkpoint::read(&path, &other)).contains("another configuration"));
        let mut bytes = std::fs::read(&path).unwrap();
        let at = bytes.len() - 40;
        bytes[at] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(refused(Checkpoint::read(&path, &c)), "checksum mismatch");
        // A checkpoint of the format before (its vectors dense) is refused by its first line, and rebuilt.
        std::fs::write(&path, [&b"engram checkpoint 2\n"[..], &bytes[MAGIC.len()..]].concat()).unwrap();
        assert!(refused(Checkpoint::read(&path, &c)).contains("another version"));
        std::fs::write(&path, b"garbage").unwrap();
        assert!(refused(Checkpoint::read(&path, &c)).contains("not an engram checkpoint"));
    }
}
