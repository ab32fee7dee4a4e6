//! Durable append-only JSON-lines logs, fsync'd per append and replayed at start:
//!
//! * the input log: records acknowledged over HTTP are appended before the acknowledgement, so an acknowledged
//!   record survives a crash — `{"epoch":E,"space":S,"record":{…}}`;
//! * the response log: every LLM response, keyed by (model, space, content hash), so a restart or replay repeats no
//!   call — `{"model":M,"space":S,"key":H,"response":"…"}`.
//!
//! Each line is the row's JSON, a tab, and a checksum: the first 16 hex digits of the JSON's BLAKE3 hash (JSON
//! never holds a raw tab, so the split is unambiguous; a line without one, as older logs have, is read as JSON
//! alone). An append that fails is truncated back before the next one; an fsync that fails fails the log, which
//! then refuses every append (what the disk holds after a failed fsync is unknown). Only a torn last line — one
//! without its newline, a crash mid-append, never acknowledged — is dropped, on replay and on reopen; any other line
//! that does not read stops the replay with an error naming the file and the byte offset (`engram log check` shows
//! such lines, `engram log repair` moves them to `FILE.quarantine`).

use std::fs::{File, OpenOptions};
use std::io::Write;
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
    /// Why this is the extractive answer and not the model's: the model failed at the request `llm.max-failures`
    /// times (the last reason). Absent for the model's own replies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback: Option<String>,
}

fn lenient_coverage<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<operators::summary::Coverage>, D::Error> {
    let v = <serde_json::Value as serde::Deserialize>::deserialize(d)?;
    Ok(serde_json::from_value(v).ok())
}

pub struct JsonLog<T> {
    path: PathBuf,
    file: File,
    /// Bytes of whole lines in the file: where a failed append is truncated back to.
    len: u64,
    /// Why the log refuses appends (an fsync failed, or a failed append could not be truncated back).
    failed: Option<String>,
    /// Tests: the next append writes only this many bytes, then fails.
    #[cfg(test)]
    fail_after: Option<usize>,
    _rows: std::marker::PhantomData<fn(T)>,
}

pub type InputLog = JsonLog<LoggedRecord>;
pub type ResponseLog = JsonLog<LoggedResponse>;

#[derive(Debug)]
pub struct Replay<T> {
    pub records: Vec<T>,
    /// A torn last line (a crash mid-append): 1 when there was one, dropped.
    pub torn_lines: usize,
}

impl<T> Default for Replay<T> {
    fn default() -> Self {
        Replay { records: Vec::new(), torn_lines: 0 }
    }
}

/// A line of a log that does not read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadLine {
    /// 1-based.
    pub line: usize,
    /// The byte offset of its start.
    pub offset: u64,
    pub reason: String,
}

/// What `check` finds in a log.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Check {
    /// Lines that read.
    pub good: usize,
    /// Lines that read but carry no checksum (written before lines had one).
    pub unchecked: usize,
    /// Complete lines that do not read: corruption.
    pub bad: Vec<BadLine>,
    /// Bytes of a torn last line (no newline), if any.
    pub torn_bytes: usize,
}

/// The checksum of a line's JSON: the first 8 bytes of its BLAKE3 hash, in hex.
fn checksum(json: &[u8]) -> String {
    blake3::hash(json).to_hex()[..16].to_string()
}

/// Writes `row` as one log line.
fn encode<T: Serialize>(buf: &mut Vec<u8>, row: &T) -> std::io::Result<()> {
    let start = buf.len();
    serde_json::to_writer(&mut *buf, row)?;
    let sum = checksum(&buf[start..]);
    buf.push(b'\t');
    buf.extend_from_slice(sum.as_bytes());
    buf.push(b'\n');
    Ok(())
}

/// Reads one line (without its newline): the row, and whether it carried a checksum.
fn decode<T: serde::de::DeserializeOwned>(line: &[u8]) -> Result<(T, bool), String> {
    let (json, sum) = match line.iter().rposition(|b| *b == b'\t') {
        Some(i) => (&line[..i], Some(&line[i + 1..])),
        None => (line, None),
    };
    if let Some(sum) = sum {
        if sum != checksum(json).as_bytes() {
            return Err("checksum mismatch".into());
        }
    }
    serde_json::from_slice(json).map(|r| (r, sum.is_some())).map_err(|e| format!("not a log row: {e}"))
}

/// Every line of the file at `path` with its offset, and the torn tail's length; `None` when there is no file.
fn lines(path: &Path) -> std::io::Result<Option<(Vec<u8>, Vec<(u64, std::ops::Range<usize>)>, usize)>> {
    let data = match std::fs::read(path) {
        Ok(d) => d,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    let mut start = 0;
    while let Some(n) = data[start..].iter().position(|b| *b == b'\n') {
        out.push((start as u64, start..start + n));
        start += n + 1;
    }
    let torn = data.len() - start;
    Ok(Some((data, out, torn)))
}

/// Fsyncs the directory holding `path`, so that a file just created there survives a crash.
pub fn sync_parent(path: &Path) -> std::io::Result<()> {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => File::open(dir)?.sync_all(),
        _ => File::open(".")?.sync_all(),
    }
}

impl<T: Serialize + serde::de::DeserializeOwned> JsonLog<T> {
    pub fn open(path: &Path) -> std::io::Result<Self> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let existed = path.exists();
        let file = OpenOptions::new().create(true).read(true).append(true).open(path)?;
        if !existed {
            sync_parent(path)?;
        }
        // A torn last line (a crash mid-append; never acknowledged) is cut off, so the next append starts on a line
        // of its own and the torn one never sits between good lines.
        let mut len = file.metadata()?.len();
        if len > 0 {
            let whole = lines(path)?.map_or(0, |(data, _, torn)| data.len() - torn) as u64;
            if whole < len {
                tracing::warn!(path = %path.display(), bytes = len - whole, "cutting off a torn last line");
                file.set_len(whole)?;
                file.sync_data()?;
                len = whole;
            }
        }
        Ok(JsonLog {
            path: path.to_path_buf(),
            file,
            len,
            failed: None,
            #[cfg(test)]
            fail_after: None,
            _rows: std::marker::PhantomData,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Replaces the log at `path` with `records`, in order, atomically: written aside, fsync'd, renamed over the
    /// old file, the directory fsync'd. A crash leaves the old log or the new one, never a mix. A log open for
    /// appends at `path` keeps writing to the old file: open it again afterwards.
    pub fn rewrite(path: &Path, records: &[T]) -> std::io::Result<()> {
        let mut buf = Vec::with_capacity(records.len() * 256);
        for r in records {
            encode(&mut buf, r)?;
        }
        let mut aside = path.as_os_str().to_owned();
        aside.push(".compact");
        let aside = std::path::PathBuf::from(aside);
        let mut f = File::create(&aside)?;
        f.write_all(&buf)?;
        f.sync_all()?;
        drop(f);
        std::fs::rename(&aside, path)?;
        sync_parent(path)
    }

    /// Why the log refuses appends, if it does.
    pub fn failed(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// Appends records and fsyncs once for the whole batch (group commit). A failed write is truncated back (the
    /// log is as before, and the next append may succeed, e.g. once the disk has room); a failed fsync fails the
    /// log for good.
    pub fn append(&mut self, records: &[T]) -> std::io::Result<()> {
        if let Some(why) = &self.failed {
            return Err(std::io::Error::other(format!("{} refuses appends: {why}", self.path.display())));
        }
        if records.is_empty() {
            return Ok(());
        }
        let mut buf = Vec::with_capacity(records.len() * 256);
        for r in records {
            encode(&mut buf, r)?;
        }
        if let Err(e) = self.write(&buf) {
            self.truncate_back();
            return Err(e);
        }
        if let Err(e) = self.file.sync_data() {
            self.failed = Some(format!("an fsync failed ({e}); restart once the disk is sound"));
            self.truncate_back();
            return Err(e);
        }
        self.len += buf.len() as u64;
        Ok(())
    }

    fn write(&mut self, buf: &[u8]) -> std::io::Result<()> {
        #[cfg(test)]
        if let Some(n) = self.fail_after.take() {
            self.file.write_all(&buf[..n.min(buf.len())])?;
            return Err(std::io::Error::new(std::io::ErrorKind::StorageFull, "injected: no space left on device"));
        }
        self.file.write_all(buf)
    }

    /// Cuts the file back to its whole lines after a failed append; if even that fails, the log is failed.
    fn truncate_back(&mut self) {
        if let Err(e) = self.file.set_len(self.len).and_then(|()| self.file.sync_data()) {
            self.failed.get_or_insert_with(|| format!("a failed append could not be cut back ({e})"));
        }
    }

    /// Reads back everything appended so far. A torn last line is dropped (counted); any other line that does not
    /// read is an error naming the file, the line and its byte offset.
    pub fn replay(path: &Path) -> std::io::Result<Replay<T>> {
        let Some((data, lines, torn)) = lines(path)? else { return Ok(Replay::default()) };
        let mut out = Replay { records: Vec::with_capacity(lines.len()), torn_lines: usize::from(torn > 0) };
        for (i, (offset, range)) in lines.into_iter().enumerate() {
            if range.is_empty() {
                continue;
            }
            match decode::<T>(&data[range]) {
                Ok((r, _)) => out.records.push(r),
                Err(reason) => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!(
                            "{}: line {} at byte offset {offset} is corrupt ({reason}); `engram log check` shows the bad lines, `engram log repair` moves them aside",
                            path.display(),
                            i + 1
                        ),
                    ))
                }
            }
        }
        Ok(out)
    }

    /// Reads the whole log and reports every line that does not read, and a torn tail.
    pub fn check(path: &Path) -> std::io::Result<Check> {
        let Some((data, lines, torn)) = lines(path)? else { return Ok(Check::default()) };
        let mut out = Check { torn_bytes: torn, ..Check::default() };
        for (i, (offset, range)) in lines.into_iter().enumerate() {
            if range.is_empty() {
                continue;
            }
            match decode::<T>(&data[range]) {
                Ok((_, checked)) => {
                    out.good += 1;
                    out.unchecked += usize::from(!checked);
                }
                Err(reason) => out.bad.push(BadLine { line: i + 1, offset, reason }),
            }
        }
        Ok(out)
    }

    /// Moves every line that does not read (and a torn tail) to `PATH.quarantine`, keeping the rest in order; the
    /// log is replaced atomically (written aside, fsync'd, renamed, the directory fsync'd). Returns what was moved.
    pub fn repair(path: &Path) -> std::io::Result<Check> {
        let check = Self::check(path)?;
        if check.bad.is_empty() && check.torn_bytes == 0 {
            return Ok(check);
        }
        let (data, lines, torn) = lines(path)?.expect("checked above");
        let mut keep = Vec::with_capacity(data.len());
        let mut moved = Vec::new();
        for (offset, range) in lines {
            let line = &data[range.clone()];
            if !line.is_empty() && decode::<T>(line).is_err() {
                moved.extend_from_slice(format!("# offset {offset}\n").as_bytes());
                moved.extend_from_slice(line);
                moved.push(b'\n');
            } else {
                keep.extend_from_slice(line);
                keep.push(b'\n');
            }
        }
        if torn > 0 {
            moved.extend_from_slice(format!("# torn tail at offset {}\n", data.len() - torn).as_bytes());
            moved.extend_from_slice(&data[data.len() - torn..]);
            moved.push(b'\n');
        }
        let mut quarantine = path.as_os_str().to_owned();
        quarantine.push(".quarantine");
        let mut q = OpenOptions::new().create(true).append(true).open(&quarantine)?;
        q.write_all(&moved)?;
        q.sync_all()?;
        let mut aside = path.as_os_str().to_owned();
        aside.push(".repair");
        let mut f = File::create(&aside)?;
        f.write_all(&keep)?;
        f.sync_all()?;
        std::fs::rename(&aside, path)?;
        sync_parent(path)?;
        Ok(check)
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
            fallback: None,
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

    fn rec(e: u64) -> LoggedRecord {
        LoggedRecord {
            epoch: e,
            space: "s".into(),
            record: serde_json::json!({"kind":"delete","doc":"d\ttab"}),
            source: None,
            offset: None,
        }
    }

    fn raw_append(p: &Path, bytes: &[u8]) {
        std::fs::OpenOptions::new().append(true).open(p).unwrap().write_all(bytes).unwrap();
    }

    #[test]
    fn append_replay_and_torn_tail() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("input.log");
        let mut log = InputLog::open(&p).unwrap();
        log.append(&[rec(1), rec(2)]).unwrap();
        drop(log);
        let text = std::fs::read_to_string(&p).unwrap();
        assert!(text.lines().all(|l| l.rsplit_once('\t').is_some_and(|(_, sum)| sum.len() == 16)), "{text}");
        raw_append(&p, b"{\"epoch\":3,\"spa");
        let replay = InputLog::replay(&p).unwrap();
        assert_eq!(replay.records, vec![rec(1), rec(2)]);
        assert_eq!(replay.torn_lines, 1);
        // Reopened after the crash: the torn line is cut off and the next record is readable.
        InputLog::open(&p).unwrap().append(&[rec(4)]).unwrap();
        let replay = InputLog::replay(&p).unwrap();
        assert_eq!((replay.records, replay.torn_lines), (vec![rec(1), rec(2), rec(4)], 0));
        assert!(InputLog::replay(&dir.path().join("absent")).unwrap().records.is_empty());
    }

    #[test]
    fn a_corrupt_line_before_the_end_stops_the_replay_naming_its_offset() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("input.log");
        let mut log = InputLog::open(&p).unwrap();
        log.append(&[rec(1), rec(2), rec(3)]).unwrap();
        drop(log);
        let mut bytes = std::fs::read(&p).unwrap();
        let second = bytes.iter().position(|b| *b == b'\n').unwrap() + 1;
        // A flipped byte inside the second line's JSON that still parses: "epoch":2 → "epoch":7.
        let at = second + bytes[second..].windows(9).position(|w| w == b"\"epoch\":2").unwrap() + 8;
        bytes[at] = b'7';
        std::fs::write(&p, &bytes).unwrap();
        let err = InputLog::replay(&p).unwrap_err().to_string();
        assert!(err.contains("input.log: line 2 at byte offset") && err.contains("checksum mismatch"), "{err}");
        assert!(err.contains(&format!("offset {second} ")), "{err}");
        let check = InputLog::check(&p).unwrap();
        assert_eq!((check.good, check.bad.len(), check.torn_bytes), (2, 1, 0));
        assert_eq!(check.bad[0].offset, second as u64);
        // Repair moves it aside; the log then replays, in order, without it.
        InputLog::repair(&p).unwrap();
        assert_eq!(InputLog::replay(&p).unwrap().records, vec![rec(1), rec(3)]);
        let quarantine = std::fs::read_to_string(dir.path().join("input.log.quarantine")).unwrap();
        assert!(quarantine.starts_with(&format!("# offset {second}\n")) && quarantine.contains("\"epoch\":7"));
        // A line that is not JSON at all, unchecked, in the middle: also corruption.
        raw_append(&p, b"garbage\n");
        InputLog::open(&p).unwrap().append(&[rec(5)]).unwrap();
        assert!(InputLog::replay(&p).unwrap_err().to_string().contains("line 3"));
    }

    #[test]
    fn lines_without_a_checksum_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("responses.log");
        std::fs::write(&p, "{\"model\":\"m\",\"space\":\"s\",\"key\":\"k\",\"response\":\"R\"}\n").unwrap();
        let mut log = ResponseLog::open(&p).unwrap();
        let r = LoggedResponse {
            model: "m".into(),
            space: "s".into(),
            key: "k2".into(),
            response: "T".into(),
            covers: None,
            fallback: None,
        };
        log.append(std::slice::from_ref(&r)).unwrap();
        let replay = ResponseLog::replay(&p).unwrap();
        assert_eq!(replay.records.len(), 2);
        assert_eq!(replay.records[1], r);
        let check = ResponseLog::check(&p).unwrap();
        assert_eq!((check.good, check.unchecked, check.bad.len()), (2, 1, 0));
    }

    #[test]
    fn a_failed_append_is_cut_back_and_the_next_one_lands() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("input.log");
        let mut log = InputLog::open(&p).unwrap();
        log.append(&[rec(1)]).unwrap();
        let before = std::fs::metadata(&p).unwrap().len();
        log.fail_after = Some(30);
        assert_eq!(log.append(&[rec(2), rec(3)]).unwrap_err().kind(), std::io::ErrorKind::StorageFull);
        assert_eq!(std::fs::metadata(&p).unwrap().len(), before, "the partial batch is truncated back");
        assert!(log.failed().is_none(), "a failed write does not fail the log: the disk may get room again");
        log.append(&[rec(4)]).unwrap();
        let replay = InputLog::replay(&p).unwrap();
        assert_eq!((replay.records, replay.torn_lines), (vec![rec(1), rec(4)], 0), "nothing glued to a fragment");
    }
}
