//! The driver: the first worker of each process turns queued records into epochs — it closes an epoch every
//! `ingest.epoch-interval` (or `epoch-max-records`), feeds the records' node deltas into the dataflow, and steps it;
//! the other workers follow. In a cluster the drivers keep one clock (see the engine's module doc).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use operators::ingest::Ingestor;
use timely::worker::Worker;

use super::sink::{build_dataflow, Inputs};
use super::state::{Item, Shared};
use super::structure::StructureInput;

/// The clock message that tells the other drivers to finish.
pub(super) const CLOCK_STOP: u64 = u64::MAX;

/// The body of every worker: the first worker of each process drives that process's epochs until shutdown; the
/// others follow.
pub(super) fn run_worker(worker: &mut Worker, shared: Arc<Shared>) {
    let mut inputs = build_dataflow(worker, shared.clone());
    let place = shared.place;
    let per_process = (worker.peers() / place.processes.max(1)).max(1);
    if worker.index() != place.process * per_process {
        drop(inputs);
        while worker.step_or_park(None) {}
        return;
    }
    let cluster = place.processes > 1;
    let mut ingestor = Ingestor::new(shared.config.ingest.chunk_tokens);
    // The highest position fed per source (retracted when a higher one is fed).
    let mut fed: HashMap<String, u64> = HashMap::new();
    let mut as_of: Option<u64> = None;
    // The model's replies go to the structure too (on the leading process).
    let structure = shared.structure_sender();
    // A restart from a checkpoint: what the checkpoint holds, at its epoch, and the log after it at its epochs,
    // before anything else.
    let prefix = std::mem::take(&mut *shared.prefix.lock().expect("prefix lock"));
    let restarted = !prefix.is_empty();
    for (epoch, items) in prefix {
        inputs.advance_to(epoch);
        let (replies, records) = counts(&items);
        feed(&mut inputs, &mut ingestor, &mut fed, items, structure.as_ref());
        shared.fed(epoch, replies, records);
        shared.closed_epoch(epoch);
    }
    if cluster && restarted {
        // The other drivers move up to the epoch after them.
        inputs.clock.send(shared.open_epoch());
    }
    inputs.advance_to(shared.open_epoch());
    // The epochs fed so far are closed: the dataflow takes them now, not with the first epoch the queue closes.
    inputs.flush();
    loop {
        let clock = if cluster { shared.clock() } else { 0 };
        if clock == CLOCK_STOP && !shared.stopping() {
            // Process 0 has stopped: stop the sources, feed what they queued, and finish.
            shared.stop();
        }
        let stopping = shared.stopping();
        let clock = if clock == CLOCK_STOP { 0 } else { clock };
        if let Some((epoch, items, next)) = shared.take_due(stopping, clock) {
            inputs.advance_to(epoch);
            let n = items.len();
            let (replies, records) = counts(&items);
            feed(&mut inputs, &mut ingestor, &mut fed, items, structure.as_ref());
            shared.fed(epoch, replies, records);
            if cluster {
                inputs.clock.send(next);
            }
            inputs.advance_to(next);
            inputs.flush();
            tracing::debug!(epoch, items = n, "epoch closed");
            shared.closed_epoch(epoch);
            shared.metrics.epochs.inc();
            shared.metrics.epoch_records.observe(n as f64);
        } else if let Some(next) = shared.follow_clock(clock) {
            inputs.advance_to(next);
            inputs.flush();
        } else if stopping && shared.queue_is_idle() {
            break;
        }
        worker.step_or_park(Some(Duration::from_millis(2)));
        if !place.leads() {
            // What the views (on process 0) reflect: when this process's Kafka offsets may be committed.
            let now = inputs.views.with_frontier(|f| f.first().copied()).map(|f| f.checked_sub(1));
            if let Some(a) = now {
                if a > as_of {
                    as_of = a;
                    shared.as_of.send_replace(a);
                    if let Some(a) = a {
                        shared.advanced(a);
                    }
                }
            }
        }
    }
    if cluster && place.leads() {
        inputs.clock.send(CLOCK_STOP);
    }
    drop(inputs);
    while worker.step() {}
}

/// The model's replies and the records among an epoch's items (what a checkpoint counts).
fn counts(items: &[Item]) -> (u64, u64) {
    let replies = items.iter().filter(|i| matches!(i, Item::Summary(..))).count() as u64;
    let records = items.iter().filter(|i| matches!(i, Item::Record(_))).count() as u64;
    (replies, records)
}

/// Feeds one epoch's items: records as node deltas, rejects as error rows, logged replies (to the structure too),
/// and each source's highest position (retracting the one fed before it).
fn feed(
    inputs: &mut Inputs,
    ingestor: &mut Ingestor,
    fed: &mut HashMap<String, u64>,
    items: Vec<Item>,
    structure: Option<&std::sync::mpsc::Sender<StructureInput>>,
) {
    let mut replies = Vec::new();
    for item in items {
        match item {
            Item::Record(r) => {
                for (space, node, d) in ingestor.apply(r) {
                    inputs.nodes.update((space, node), d);
                }
            }
            Item::Reject(row) => inputs.errors.update(row, 1),
            Item::Summary(space, hash, text) => {
                if structure.is_some() {
                    replies.push(((space.clone(), hash.clone()), text.clone()));
                }
                inputs.summaries.update(((space, hash), text), 1)
            }
            Item::Position(source, offset) => {
                let before = fed.get(&source).copied();
                if before.is_none_or(|b| offset > b) {
                    if let Some(b) = before {
                        inputs.positions.update((source.clone(), b), -1);
                    }
                    inputs.positions.update((source.clone(), offset), 1);
                    fed.insert(source, offset);
                }
            }
        }
    }
    if let Some(tx) = structure.filter(|_| !replies.is_empty()) {
        // A closed structure (the engine is stopping or failed) takes nothing more.
        let _ = tx.send(StructureInput::Replies(replies));
    }
}
