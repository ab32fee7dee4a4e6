//! The dead-letter sink: one JSON line per rejected record, with its source, the reason and the raw input.

use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

#[derive(Serialize)]
struct Line<'a> {
    source: &'a str,
    reason: &'a str,
    /// The raw bytes, lossily decoded when they were not UTF-8 (then `raw_utf8` is false).
    raw: &'a str,
    raw_utf8: bool,
    at_unix_ms: u128,
}

pub struct DeadLetter {
    path: PathBuf,
    out: BufWriter<File>,
}

impl DeadLetter {
    pub fn open(path: &Path) -> std::io::Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let existed = path.exists();
        let f = OpenOptions::new().create(true).append(true).open(path)?;
        if !existed {
            crate::input_log::sync_parent(path)?;
        }
        Ok(DeadLetter { path: path.to_path_buf(), out: BufWriter::new(f) })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one reject and flushes it to the OS; [`DeadLetter::sync`] makes a batch of them durable.
    pub fn write(&mut self, source: &str, reason: &str, raw: &[u8]) -> std::io::Result<()> {
        let (raw, raw_utf8) = match std::str::from_utf8(raw) {
            Ok(s) => (std::borrow::Cow::Borrowed(s), true),
            Err(_) => (String::from_utf8_lossy(raw), false),
        };
        let at_unix_ms =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis()).unwrap_or(0);
        let line = Line { source, reason, raw: &raw, raw_utf8, at_unix_ms };
        serde_json::to_writer(&mut self.out, &line)?;
        self.out.write_all(b"\n")?;
        self.out.flush()
    }

    /// Fsyncs what was written: called once per batch of rejects, before the batch is acknowledged.
    pub fn sync(&mut self) -> std::io::Result<()> {
        self.out.flush()?;
        self.out.get_ref().sync_data()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_reason_and_raw_even_for_invalid_utf8() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("dl/dead.jsonl");
        let mut dl = DeadLetter::open(&p).unwrap();
        dl.write("file:x:1", "not JSON", b"{oops").unwrap();
        dl.write("file:x:2", "bad utf8", b"\xff\xfe").unwrap();
        let lines: Vec<serde_json::Value> =
            std::fs::read_to_string(&p).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines[0]["raw"], "{oops");
        assert_eq!(lines[0]["reason"], "not JSON");
        assert_eq!(lines[1]["raw_utf8"], false);
    }
}
