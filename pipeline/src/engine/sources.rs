//! Source threads: each reads its source into the ingest queue and commits what the views reflect.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use connectors::{Source, SourceBatch};

use super::state::Shared;

/// Reads a source on a thread of its own, parsing into the queue; backs off while the queue is full.
pub(super) fn spawn_source(
    shared: Arc<Shared>,
    mut source: Box<dyn Source>,
    kind: &'static str,
) -> std::thread::JoinHandle<()> {
    shared.source_live(1);
    std::thread::Builder::new()
        .name(format!("engram-source-{kind}"))
        .spawn(move || {
            let name = source.name();
            let batch = shared.config.ingest.epoch_max_records.max(1);
            // Batches not yet reflected in the views: (epoch, highest position per source).
            let mut uncommitted: VecDeque<(u64, Vec<connectors::Position>)> = VecDeque::new();
            while !shared.stopping() {
                let as_of = shared.as_of();
                let mut done = Vec::new();
                while uncommitted.front().is_some_and(|(e, _)| as_of.is_some_and(|a| *e <= a)) {
                    done.extend(uncommitted.pop_front().expect("front").1);
                }
                if !done.is_empty() {
                    source.commit(&done);
                }
                if shared.queue_full() {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                match source.poll(batch) {
                    Ok(SourceBatch::Records(records)) => loop {
                        // A batch that cannot be logged (a full disk) is tried again until it is, or until the
                        // engine stops (then the source resumes after what the log holds, at the next start).
                        match shared.ingest_source(kind, &records) {
                            Ok(batch) => {
                                uncommitted.push_back(batch);
                                break;
                            }
                            Err(e) if !shared.stopping() => {
                                tracing::error!(source = %name, error = %e, "could not log source records; retrying in 1s");
                                std::thread::sleep(Duration::from_secs(1));
                            }
                            Err(_) => break,
                        }
                    },
                    Ok(SourceBatch::Idle) => std::thread::sleep(source.idle_wait().max(Duration::from_millis(if uncommitted.is_empty() { 0 } else { 5 }))),
                    Ok(SourceBatch::Done) => break,
                    Err(e) => {
                        tracing::error!(source = %name, error = %e, "source failed; it stops, the engine goes on");
                        break;
                    }
                }
            }
            shared.source_live(-1);
            tracing::info!(source = %name, "source finished");
        })
        .expect("spawn source thread")
}
