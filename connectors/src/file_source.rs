//! JSONL sources: a file read once or followed as it grows (`tail -f`), and stdin.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::sync::mpsc;

use crate::source::{Position, Source, SourceBatch, SourceRecord};

pub struct FileSource {
    path: PathBuf,
    follow: bool,
    reader: Option<BufReader<File>>,
    /// A line read without its newline yet (a writer mid-line); completed on a later poll.
    partial: Vec<u8>,
    line: u64,
    /// Lines up to this one were ingested before a restart (the input log says so): skip them.
    resume_after: u64,
}

impl FileSource {
    pub fn new(path: impl Into<PathBuf>, follow: bool) -> Self {
        FileSource { path: path.into(), follow, reader: None, partial: Vec::new(), line: 0, resume_after: 0 }
    }

    /// Resumes after `line` (a file source is an append-only log: its lines keep their numbers).
    pub fn resume_after(mut self, line: u64) -> Self {
        self.resume_after = line;
        self
    }
}

impl Source for FileSource {
    fn name(&self) -> String {
        format!("file:{}", self.path.display())
    }

    fn poll(&mut self, max: usize) -> std::io::Result<SourceBatch> {
        if self.reader.is_none() {
            match File::open(&self.path) {
                Ok(f) => self.reader = Some(BufReader::with_capacity(1 << 16, f)),
                // A followed file may not exist yet.
                Err(e) if self.follow && e.kind() == std::io::ErrorKind::NotFound => return Ok(SourceBatch::Idle),
                Err(e) => return Err(e),
            }
        }
        let name = self.name();
        let reader = self.reader.as_mut().expect("opened above");
        let mut out = Vec::new();
        while out.len() < max {
            let n = reader.read_until(b'\n', &mut self.partial)?;
            if n == 0 {
                break;
            }
            if self.partial.last() != Some(&b'\n') {
                if self.follow {
                    // Wait for the rest of the line.
                    break;
                }
            } else {
                self.partial.pop();
                if self.partial.last() == Some(&b'\r') {
                    self.partial.pop();
                }
            }
            self.line += 1;
            let payload = std::mem::take(&mut self.partial);
            if self.line <= self.resume_after || payload.iter().all(u8::is_ascii_whitespace) {
                continue;
            }
            out.push(SourceRecord {
                payload,
                space: None,
                position: Position { source: name.clone(), partition: 0, offset: self.line },
            });
        }
        Ok(match (out.is_empty(), self.follow) {
            (false, _) => SourceBatch::Records(out),
            (true, true) => SourceBatch::Idle,
            (true, false) => SourceBatch::Done,
        })
    }
}

/// Lines of standard input, read on a thread of their own (stdin cannot be polled without blocking).
pub struct StdinSource {
    rx: mpsc::Receiver<std::io::Result<Vec<u8>>>,
    line: u64,
    done: bool,
}

impl StdinSource {
    pub fn spawn() -> Self {
        Self::from_reader(std::io::stdin())
    }

    pub fn from_reader<R: Read + Send + 'static>(r: R) -> Self {
        let (tx, rx) = mpsc::sync_channel(1024);
        std::thread::Builder::new()
            .name("engram-stdin".into())
            .spawn(move || {
                let mut reader = BufReader::new(r);
                loop {
                    let mut buf = Vec::new();
                    match reader.read_until(b'\n', &mut buf) {
                        Ok(0) => break,
                        Ok(_) => {
                            if buf.last() == Some(&b'\n') {
                                buf.pop();
                            }
                            if tx.send(Ok(buf)).is_err() {
                                break;
                            }
                        }
                        Err(e) => {
                            let _ = tx.send(Err(e));
                            break;
                        }
                    }
                }
            })
            .expect("spawn stdin reader");
        StdinSource { rx, line: 0, done: false }
    }
}

impl Source for StdinSource {
    fn name(&self) -> String {
        "stdin".into()
    }

    fn poll(&mut self, max: usize) -> std::io::Result<SourceBatch> {
        let mut out = Vec::new();
        while out.len() < max && !self.done {
            match self.rx.try_recv() {
                Ok(Ok(payload)) => {
                    self.line += 1;
                    if payload.iter().all(u8::is_ascii_whitespace) {
                        continue;
                    }
                    out.push(SourceRecord {
                        payload,
                        space: None,
                        position: Position { source: "stdin".into(), partition: 0, offset: self.line },
                    });
                }
                Ok(Err(e)) => return Err(e),
                Err(mpsc::TryRecvError::Empty) => break,
                Err(mpsc::TryRecvError::Disconnected) => self.done = true,
            }
        }
        Ok(match (out.is_empty(), self.done) {
            (false, _) => SourceBatch::Records(out),
            (true, false) => SourceBatch::Idle,
            (true, true) => SourceBatch::Done,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn drain(src: &mut dyn Source) -> Vec<String> {
        let mut out = Vec::new();
        loop {
            match src.poll(2).unwrap() {
                SourceBatch::Records(rs) => out.extend(rs.into_iter().map(|r| String::from_utf8(r.payload).unwrap())),
                SourceBatch::Idle | SourceBatch::Done => return out,
            }
        }
    }

    #[test]
    fn reads_once_skipping_blank_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("in.jsonl");
        std::fs::write(&p, "a\n\nb\r\nc").unwrap();
        let mut s = FileSource::new(&p, false);
        assert_eq!(drain(&mut s), vec!["a", "b", "c"]);
        assert!(matches!(s.poll(10).unwrap(), SourceBatch::Done));
    }

    #[test]
    fn resumes_after_a_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("in.jsonl");
        std::fs::write(&p, "a\nb\nc\n").unwrap();
        let mut s = FileSource::new(&p, false).resume_after(2);
        assert_eq!(drain(&mut s), vec!["c"]);
    }

    #[test]
    fn follows_a_growing_file_and_waits_for_whole_lines() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("grow.jsonl");
        let mut s = FileSource::new(&p, true);
        assert!(matches!(s.poll(10).unwrap(), SourceBatch::Idle), "missing file is idle when following");
        let mut f = std::fs::File::create(&p).unwrap();
        write!(f, "one\ntw").unwrap();
        f.flush().unwrap();
        assert_eq!(drain(&mut s), vec!["one"]);
        writeln!(f, "o").unwrap();
        writeln!(f, "three").unwrap();
        f.flush().unwrap();
        assert_eq!(drain(&mut s), vec!["two", "three"]);
        assert!(matches!(s.poll(10).unwrap(), SourceBatch::Idle));
    }

    #[test]
    fn stdin_source_reads_a_stream() {
        let mut s = StdinSource::from_reader(std::io::Cursor::new(b"x\ny\n".to_vec()));
        let mut got = Vec::new();
        for _ in 0..100 {
            match s.poll(10).unwrap() {
                SourceBatch::Records(rs) => got.extend(rs.into_iter().map(|r| r.position.offset)),
                SourceBatch::Done => break,
                SourceBatch::Idle => std::thread::sleep(std::time::Duration::from_millis(5)),
            }
        }
        assert_eq!(got, vec![1, 2]);
    }
}
