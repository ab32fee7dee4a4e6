//! Ingest: the queue of records waiting for the next epoch, fed by HTTP and the sources (each batch appended to
//! the input log first), and the epoch clock the drivers take it by.

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::Instant;

use connectors::input_log::LoggedRecord;
use operators::record::{from_value, parse_json};
use operators::{Record, Reject};

use super::state::{Item, Queue, Shared};

#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    #[error("the ingest queue is full ({0} records waiting); retry later")]
    Overloaded(usize),
    #[error("could not append to the input log: {0}")]
    Log(#[from] std::io::Error),
    #[error("{0}")]
    SpaceQuota(String),
}

/// What an HTTP ingest returns.
pub struct Receipt {
    pub epoch: Option<u64>,
    pub accepted: usize,
    /// The first `ingest.max-rejects-listed` rejects: (index in the request, reason).
    pub rejected: Vec<(usize, String)>,
    /// Every reject, listed or not.
    pub rejected_total: usize,
}

impl Shared {
    pub(super) fn queue_cap(&self) -> usize {
        self.config.ingest.epoch_max_records * 10
    }

    /// Takes `space` into this process's spaces, unless it is new and a quota is reached: `ingest.max-spaces`, or
    /// the `max-spaces` of the token that sends it.
    pub fn admit_space(&self, space: &str, token: Option<&crate::auth::Token>) -> Result<(), String> {
        let mut spaces = self.spaces.lock().expect("spaces lock");
        if spaces.contains(space) {
            return Ok(());
        }
        let max = self.config.ingest.max_spaces;
        if max > 0 && spaces.len() >= max {
            return Err(format!("space `{space}` would be one more than ingest.max-spaces = {max}"));
        }
        if let Some(t) = token.filter(|t| t.max_spaces > 0) {
            if spaces.iter().filter(|s| t.reaches(s)).count() >= t.max_spaces {
                return Err(format!(
                    "space `{space}` would be one more than token `{}`'s max-spaces = {}",
                    t.name, t.max_spaces
                ));
            }
        }
        spaces.insert(space.to_string());
        Ok(())
    }

    /// HTTP ingest: validates every record, appends the valid ones to the input log (fsync'd) and queues them.
    /// The receipt names the epoch that will hold them; it is returned only after the log append.
    pub fn ingest_http(
        &self,
        space: &str,
        raws: Vec<Result<serde_json::Value, (Vec<u8>, String)>>,
        token: Option<&crate::auth::Token>,
    ) -> Result<Receipt, IngestError> {
        let mut accepted = Vec::new();
        let mut rejects = Vec::new();
        let mut rejected = Vec::new();
        let mut bytes_in = 0;
        let listed = self.config.ingest.max_rejects_listed;
        for (i, raw) in raws.into_iter().enumerate() {
            let source = format!("http:{space}:{i}");
            let (reason, bytes) = match raw {
                Ok(value) => {
                    // An array element is held to the same size as an NDJSON line (counted, not written out).
                    let size = json_len(&value);
                    let checked = if size > self.limits.max_record_bytes {
                        Err(Reject::TooLarge { size, limit: self.limits.max_record_bytes })
                    } else {
                        from_value(value.clone(), Some(space), &self.limits)
                    };
                    match checked {
                        Ok(rec) => {
                            bytes_in += size;
                            accepted.push((rec, value));
                            continue;
                        }
                        Err(e) => (e.to_string(), value.to_string().into_bytes()),
                    }
                }
                Err((bytes, reason)) => (reason, bytes),
            };
            let row = self.reject("http", &source, Some(space), &reason, &bytes);
            if rejected.len() < listed {
                rejected.push((i, row.reason.clone()));
            }
            rejects.push(row);
        }
        let rejected_total = rejects.len();
        if rejected_total > 0 {
            self.sync_dead_letters();
        }
        if !accepted.is_empty() {
            self.admit_space(space, token).map_err(IngestError::SpaceQuota)?;
        }
        let mut q = self.queue.lock().expect("queue lock");
        let over = q.items.len() + accepted.len() > self.queue_cap()
            || q.bytes + bytes_in > self.config.ingest.max_queue_bytes;
        if over && !accepted.is_empty() {
            return Err(IngestError::Overloaded(q.items.len()));
        }
        q.bytes += bytes_in;
        let logged: Vec<LoggedRecord> = accepted
            .iter()
            .map(|(_, v)| {
                let mut v = v.clone();
                if let Some(obj) = v.as_object_mut() {
                    obj.remove("space");
                }
                LoggedRecord { epoch: 0, space: space.to_string(), record: v, source: None, offset: None }
            })
            .collect();
        let n = accepted.len();
        self.metrics.records_in.with_label_values(&["http"]).inc_by(n as u64);
        let items = accepted.into_iter().map(|(r, _)| Item::Record(r)).chain(rejects.into_iter().map(Item::Reject));
        let epoch = self.log_and_queue(&mut q, logged, items.collect())?;
        Ok(Receipt { epoch: (n > 0).then_some(epoch), accepted: n, rejected, rejected_total })
    }

    /// Appends `logged` to the input log (one fsync), stamped with the open epoch, then queues `items` at that
    /// epoch: what is queued is durable first. Returns the epoch.
    pub(super) fn log_and_queue(
        &self,
        q: &mut Queue,
        mut logged: Vec<LoggedRecord>,
        items: Vec<Item>,
    ) -> std::io::Result<u64> {
        let epoch = q.open_epoch;
        if !logged.is_empty() {
            for l in &mut logged {
                l.epoch = epoch;
            }
            let t = Instant::now();
            let mut log = self.input_log.lock().expect("log lock");
            if let Err(e) = log.append(&logged) {
                self.metrics.input_log_failures.inc();
                tracing::error!(error = %e, records = logged.len(), "could not append to the input log; nothing taken");
                if let Some(why) = log.failed() {
                    // What the disk holds is unknown: stop, and let a restart replay what the log does hold.
                    self.fail(format!("the input log failed: {why}"));
                }
                return Err(e);
            }
            drop(log);
            self.metrics.input_log_fsync.observe(t.elapsed().as_secs_f64());
        }
        if !items.is_empty() {
            q.opened.get_or_insert_with(Instant::now);
            q.items.extend(items);
        }
        Ok(epoch)
    }

    /// A batch from a source: rejects are dead-lettered; the rest are appended to the input log with their
    /// positions (so that a restart replays them in order and the source resumes after them) and queued.
    /// Returns the epoch that holds the batch and the highest position of each source in it.
    pub fn ingest_source(
        &self,
        kind: &str,
        records: &[connectors::SourceRecord],
    ) -> std::io::Result<(u64, Vec<connectors::Position>)> {
        let n = records.len();
        let mut last: BTreeMap<String, connectors::Position> = BTreeMap::new();
        for r in records {
            let e = last.entry(r.position.source.clone()).or_insert_with(|| r.position.clone());
            if r.position.offset > e.offset {
                *e = r.position.clone();
            }
        }
        let mut items = Vec::with_capacity(n);
        let mut logged = Vec::with_capacity(n + 1);
        let mut bytes_in = 0;
        for r in records {
            let parsed = parse_json(&r.payload, &self.limits)
                .and_then(|value| Ok((from_value(value.clone(), r.space.as_deref(), &self.limits)?, value)));
            let parsed = parsed.map_err(|e| e.to_string()).and_then(|(rec, value)| {
                self.admit_space(rec.space(), None)?;
                Ok((rec, value))
            });
            match parsed {
                Ok((rec, value)) => {
                    bytes_in += r.payload.len();
                    logged.push(LoggedRecord {
                        epoch: 0,
                        space: rec.space().to_string(),
                        record: value,
                        source: Some(r.position.source.clone()),
                        offset: Some(r.position.offset),
                    });
                    items.push(Item::Record(rec));
                }
                Err(e) => {
                    let source = r.position.to_string();
                    items.push(Item::Reject(self.reject(kind, &source, r.space.as_deref(), &e, &r.payload)))
                }
            }
        }
        for p in last.values() {
            // Mark each source's batch end, so that rejected last records are not read (and dead-lettered) again.
            let logged_max =
                logged.iter().filter(|l| l.source.as_ref() == Some(&p.source)).filter_map(|l| l.offset).max();
            if logged_max != Some(p.offset) {
                logged.push(LoggedRecord {
                    epoch: 0,
                    space: String::new(),
                    record: serde_json::Value::Null,
                    source: Some(p.source.clone()),
                    offset: Some(p.offset),
                });
            }
        }
        self.metrics.records_in.with_label_values(&[kind]).inc_by(n as u64);
        if items.iter().any(|i| matches!(i, Item::Reject(_))) {
            self.sync_dead_letters();
        }
        items.extend(last.values().map(|p| Item::Position(p.source.clone(), p.offset)));
        let mut q = self.queue.lock().expect("queue lock");
        let epoch = self.log_and_queue(&mut q, logged, items)?;
        q.bytes += bytes_in;
        Ok((epoch, last.into_values().collect()))
    }

    /// Takes the open epoch's items if it is due: old enough, full enough, shutting down, or behind the cluster's
    /// clock (`clock`, the latest epoch another driver opened). Returns the epoch, its items and the next open one.
    pub(super) fn take_due(&self, force: bool, clock: u64) -> Option<(u64, Vec<Item>, u64)> {
        let mut q = self.queue.lock().expect("queue lock");
        let due = match q.opened {
            None => false,
            Some(t) => {
                force
                    || q.open_epoch < clock
                    || t.elapsed() >= self.config.ingest.epoch_interval
                    || q.items.len() >= self.config.ingest.epoch_max_records
            }
        };
        if !due || q.items.is_empty() {
            return None;
        }
        if !force && self.in_flight() >= self.config.ingest.max_epochs_in_flight {
            // The dataflow is behind: the queue waits (and fills to its caps) rather than the dataflow's buffers.
            return None;
        }
        let epoch = q.open_epoch;
        q.open_epoch = (epoch + 1).max(clock);
        q.opened = None;
        q.bytes = 0;
        Some((epoch, std::mem::take(&mut q.items), q.open_epoch))
    }

    /// Moves an empty open epoch up to the cluster's clock; returns the new open epoch if it moved.
    pub(super) fn follow_clock(&self, clock: u64) -> Option<u64> {
        let mut q = self.queue.lock().expect("queue lock");
        (q.items.is_empty() && q.open_epoch < clock).then(|| {
            q.open_epoch = clock;
            clock
        })
    }

    /// Once every source has finished and its records are in the views, the epoch they reached; `None` while
    /// sources are still reading (a followed file never finishes).
    pub fn inputs_settled(&self) -> Option<Option<u64>> {
        let q = self.queue.lock().expect("queue lock");
        (q.live_sources == 0 && q.items.is_empty()).then(|| q.open_epoch.checked_sub(1))
    }

    pub(super) fn queue_is_idle(&self) -> bool {
        let q = self.queue.lock().expect("queue lock");
        q.items.is_empty()
    }

    /// Epochs fed to the dataflow and not yet reflected.
    pub(super) fn in_flight(&self) -> usize {
        self.closed.lock().expect("closed lock").len()
    }

    /// Called when the views (on process 0; elsewhere, the dataflow's output) reflect every epoch up to `as_of`.
    pub(super) fn advanced(&self, as_of: u64) {
        let mut closed = self.closed.lock().expect("closed lock");
        while closed.front().is_some_and(|(e, _)| *e <= as_of) {
            closed.pop_front();
        }
        self.metrics.frontier_lag_epochs.set(closed.len() as i64);
        self.metrics.frontier_lag_seconds.set(closed.front().map_or(0.0, |(_, t)| t.elapsed().as_secs_f64()));
    }

    pub(super) fn closed_epoch(&self, epoch: u64) {
        let mut closed = self.closed.lock().expect("closed lock");
        closed.push_back((epoch, Instant::now()));
        self.metrics.frontier_lag_epochs.set(closed.len() as i64);
        self.metrics.frontier_lag_seconds.set(closed.front().map_or(0.0, |(_, t)| t.elapsed().as_secs_f64()));
    }

    /// Whether `epoch` can be a receipt: no later than the epoch now open (a later one was never handed out).
    pub fn receipt_issued(&self, epoch: u64) -> bool {
        epoch <= self.open_epoch()
    }

    /// The epoch that queued records will be fed at.
    pub(super) fn open_epoch(&self) -> u64 {
        self.queue.lock().expect("queue lock").open_epoch
    }

    /// Queues records that need no log (an evaluation's or a bench's input, rebuilt from its files on every run).
    /// Returns the epoch that will hold them.
    pub fn queue_records(&self, records: Vec<Record>) -> u64 {
        let mut q = self.queue.lock().expect("queue lock");
        q.opened.get_or_insert_with(Instant::now);
        q.items.extend(records.into_iter().map(Item::Record));
        q.open_epoch
    }

    /// Items waiting in the queue for an epoch.
    pub fn queued(&self) -> usize {
        self.queue.lock().expect("queue lock").items.len()
    }

    /// Queues logged replies of the model, after they are in the response log.
    pub(super) fn queue_replies(&self, replies: impl IntoIterator<Item = (String, String, String)>) {
        let mut q = self.queue.lock().expect("queue lock");
        q.opened.get_or_insert_with(Instant::now);
        q.items.extend(replies.into_iter().map(|(space, key, text)| Item::Summary(space, key, text)));
    }

    /// Whether the queue is at its cap (a source backs off).
    pub(super) fn queue_full(&self) -> bool {
        let q = self.queue.lock().expect("queue lock");
        q.items.len() >= self.queue_cap() || q.bytes >= self.config.ingest.max_queue_bytes
    }

    /// A source started (`+1`) or finished (`-1`) reading.
    pub(super) fn source_live(&self, delta: isize) {
        let mut q = self.queue.lock().expect("queue lock");
        q.live_sources = q.live_sources.saturating_add_signed(delta);
    }

    /// The latest epoch any driver has opened (the cluster's clock).
    pub(super) fn clock(&self) -> u64 {
        self.clock.load(Ordering::SeqCst)
    }

    /// A driver opened `epoch`.
    pub(super) fn see_clock(&self, epoch: u64) {
        self.clock.fetch_max(epoch, Ordering::SeqCst);
    }
}

/// The length of `value` written as compact JSON, without writing it.
fn json_len(value: &serde_json::Value) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, value).map_or(usize::MAX, |()| count.0)
}
