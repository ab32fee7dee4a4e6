//! Durable append-only JSON-lines logs, fsync'd per append and replayed at start:
//!
//! * the input log: records acknowledged over HTTP are appended before the acknowledgement, so an acknowledged
//!   record survives a crash — `{"epoch":E,"space":S,"record":{…}}`;
//! * the response log: every LLM response, keyed by (model, space, content hash), so a restart or replay repeats no
//!   call — `{"model":M,"space":S,"key":H,"response":"…"}`.
//!
//! A torn last line (a crash mid-append) is skipped on replay and closed off on reopen; nothing after it was
//! acknowledged.

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LoggedRecord {
    pub epoch: u64,
    pub space: String,
    /// The record; `null` for a position marker (a batch of a source whose last lines were rejected).
    pub record: serde_json::Value,
    /// Where it was read (`file:PATH`, `stdin`), and its offset there, for sources that resume after a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
}

/// A logged LLM response.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct LoggedResponse {
    pub model: String,
    pub space: String,
    pub key: String,
    pub response: String,
    /// A cluster summary's coverage: what it was made from (`hierarchy.summary-coverage`); absent for other calls.
    /// A `covers` that does not read (a hand-edited or foreign log) reads as none: the response is kept, only its
    /// reuse is lost.
    #[serde(default, skip_serializing_if = "Option::is_none", deserialize_with = "lenient_coverage")]
    pub covers: Option<operators::summary::Coverage>,
}

fn lenient_coverage<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<operators::summary::Coverage>, D::Error> {
    let v = <serde_json::Value as serde::Deserialize>::deserialize(d)?;
    Ok(serde_json::from_value(v).ok())
}

pub struct JsonLog<T> {
    path: PathBuf,
    file: File,
    _rows: std::marker::PhantomData<fn(T)>,
}

pub type InputLog = JsonLog<LoggedRecord>;
pub type ResponseLog = JsonLog<LoggedResponse>;

#[derive(Debug)]
pub struct Replay<T> {
    pub records: Vec<T>,
    /// Lines that could not be read back (a torn tail), counted and reported.
    pub torn_lines: usize,
}

impl<T> Default for Replay<T> {
    fn default() -> Self {
        Replay { records: Vec::new(), torn_lines: 0 }
    }
}

impl<T: Serialize + serde::de::DeserializeOwned> JsonLog<T> {
    pub fn open(path: &Path) -> std::io::Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let mut file = OpenOptions::new().create(true).read(true).append(true).open(path)?;
        // A torn last line (a crash mid-append) is closed off, so the next append starts on a line of its own.
        let len = file.metadata()?.len();
        if len > 0 {
            use std::io::{Read, Seek, SeekFrom};
            let mut last = [0u8; 1];
            file.seek(SeekFrom::Start(len - 1))?;
            file.read_exact(&mut last)?;
            if last[0] != b'\n' {
                file.write_all(b"\n")?;
                file.sync_data()?;
            }
        }
        Ok(JsonLog { path: path.to_path_buf(), file, _rows: std::marker::PhantomData })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends records and fsyncs once for the whole batch (group commit).
    pub fn append(&mut self, records: &[T]) -> std::io::Result<()> {
        if records.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::with_capacity(records.len() * 256);
        for r in records {
            serde_json::to_writer(&mut buf, r)?;
            buf.push(b'\n');
        }
        self.file.write_all(&buf)?;
        self.file.sync_data()
    }

    /// Reads back everything appended so far.
    pub fn replay(path: &Path) -> std::io::Result<Replay<T>> {
        let f = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Replay::default()),
            Err(e) => return Err(e),
        };
        let mut out = Replay::default();
        for line in BufReader::new(f).split(b'\n') {
            let line = line?;
            if line.is_empty() {
                continue;
            }
            match serde_json::from_slice::<T>(&line) {
                Ok(r) => out.records.push(r),
                Err(_) => out.torn_lines += 1,
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_response_whose_coverage_does_not_read_is_kept_without_it() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("responses.log");
        let cov = operators::summary::Coverage {
            layer: 1,
            cluster: "L1:a".into(),
            members: vec![("a".into(), 7)],
            chain: 3,
            seq: 0,
            from: None,
        };
        let mut log = ResponseLog::open(&p).unwrap();
        let r = LoggedResponse {
            model: "m".into(),
            space: "s".into(),
            key: "k".into(),
            response: "S".into(),
            covers: Some(cov.clone()),
        };
        log.append(std::slice::from_ref(&r)).unwrap();
        drop(log);
        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"{\"model\":\"m\",\"space\":\"s\",\"key\":\"k2\",\"response\":\"T\",\"covers\":\"garbage\"}\n")
            .unwrap();
        f.write_all(
            b"{\"model\":\"m\",\"space\":\"s\",\"key\":\"k3\",\"response\":\"U\",\"covers\":{\"layer\":\"one\"}}\n",
        )
        .unwrap();
        let replay = ResponseLog::replay(&p).unwrap();
        assert_eq!(replay.torn_lines, 0);
        assert_eq!(replay.records.len(), 3);
        assert_eq!(replay.records[0], r, "a coverage round-trips");
        assert_eq!((replay.records[1].response.as_str(), &replay.records[1].covers), ("T", &None));
        assert_eq!((replay.records[2].response.as_str(), &replay.records[2].covers), ("U", &None));
    }

    #[test]
    fn append_replay_and_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("input.log");
        let mut log = InputLog::open(&p).unwrap();
        let r = |e| LoggedRecord {
            epoch: e,
            space: "s".into(),
            record: serde_json::json!({"kind":"delete","doc":"d"}),
            source: None,
            offset: None,
        };
        log.append(&[r(1), r(2)]).unwrap();
        drop(log);
        std::fs::OpenOptions::new().append(true).open(&p).unwrap().write_all(b"{\"epoch\":3,\"spa").unwrap();
        let replay = InputLog::replay(&p).unwrap();
        assert_eq!(replay.records, vec![r(1), r(2)]);
        assert_eq!(replay.torn_lines, 1);
        // Reopened after the crash: the next record is readable.
        InputLog::open(&p).unwrap().append(&[r(4)]).unwrap();
        let replay = InputLog::replay(&p).unwrap();
        assert_eq!(replay.records, vec![r(1), r(2), r(4)]);
        assert!(InputLog::replay(&dir.path().join("absent")).unwrap().records.is_empty());
    }
}
