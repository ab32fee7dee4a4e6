//! The engine: the state shared by the timely workers and the HTTP server, the dataflow, and the threads that feed
//! it. [`Engine`] starts and stops it; `run`, `eval` and the tests all go through it.
//!
//! Threads: `timely::execute` runs the workers; source threads (one per `--input`, one for Kafka) parse records into
//! the ingest queue; the HTTP server appends acknowledged records to the input log and the queue. The first worker of
//! each process (its *driver*) owns that process's inputs: it closes an epoch every `ingest.epoch-interval` (or
//! `epoch-max-records`), feeds the records' node deltas into the dataflow, and steps it. The other workers close their
//! inputs at once.
//!
//! **A cluster** (`-n` processes): every process reads its share of the Kafka partitions into its own input log and
//! queue; process 0 alone reads files, serves HTTP and runs the summariser and the structure. The drivers keep one clock: each
//! broadcasts the epoch it opens, and a driver that sees a later epoch closes its own open epoch and moves to it, so
//! the frontier (the least epoch any driver may still feed) keeps up with the busiest process. The views (on worker
//! 0) hold a capability for every epoch they have not yet applied; a probe on them tells every process what the views
//! reflect, which is when its Kafka offsets are committed.
//!
//! | file | concern |
//! |---|---|
//! | `state.rs` | the shared state, and opening it: the logs replayed into the queue |
//! | `models.rs` | the summariser's model and the embedder, from the config |
//! | `ingest.rs` | the ingest queue (HTTP and sources, logged first) and the epoch clock |
//! | `sources.rs` | source threads |
//! | `driver.rs` | the worker loop that turns the queue into epochs |
//! | `sink.rs` | the dataflow's inputs, the memory's fresh part wired over them, the views sink |
//! | `structure.rs` | the hierarchy and its summaries, a dataflow on a thread of its own behind layer 0 |
//! | `summarizer.rs` | the model requests served, logged and fed back |
//! | `checkpoint.rs` | checkpoints of the views, and a restart that serves one while the dataflow rebuilds |
//! | `guide.rs` | the model at query time, logged |

mod checkpoint;
mod compact;
mod driver;
mod guide;
mod ingest;
mod models;
mod sink;
mod sources;
mod state;
mod structure;
mod summarizer;

use std::sync::Arc;
use std::thread::JoinHandle;

pub use guide::ModelGuide;
pub use ingest::{IngestError, Receipt};
pub use models::{make_embedder, make_llm};
pub use sink::memory_params;
pub use state::{Place, Shared};

use crate::config::Config;

/// A running engine: its state, and the threads that feed and serve it.
pub struct Engine {
    shared: Arc<Shared>,
    sources: Vec<JoinHandle<()>>,
    summarizer: Option<JoinHandle<()>>,
    structure: Option<JoinHandle<()>>,
    workers: Option<timely::communication::WorkerGuards<()>>,
}

impl Engine {
    /// Opens the data directory (the logs replayed into the ingest queue); nothing runs yet.
    pub fn open(config: Config, place: Place) -> anyhow::Result<Engine> {
        config.allocator.apply();
        Ok(Engine {
            shared: Shared::open(config, place)?,
            sources: Vec::new(),
            summarizer: None,
            structure: None,
            workers: None,
        })
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Starts reading `source` (`kind` labels its metrics) on a thread of its own.
    pub fn add_source(&mut self, source: Box<dyn connectors::Source>, kind: &'static str) {
        self.sources.push(sources::spawn_source(self.shared.clone(), source, kind));
    }

    /// Starts the timely workers and, on the leading process, the summariser and the structure.
    pub fn start(&mut self, timely: timely::Config) -> anyhow::Result<()> {
        if self.shared.place.leads() {
            self.summarizer = Some(summarizer::spawn_summarizer(self.shared.clone()));
        }
        if let Some(rx) = self.shared.structure_rx.lock().expect("structure lock").take() {
            self.structure = Some(structure::spawn_structure(self.shared.clone(), rx));
        }
        // A restart from a checkpoint of a large space builds its index now, while the space is served exactly.
        self.shared.start_index_builds(&mut self.shared.views.write().expect("views lock"));
        let shared = self.shared.clone();
        let guards = timely::execute(timely, move |worker| {
            // A worker that dies (a bug, or a lost peer process: timely's network threads panic) fails the engine,
            // so that it stops serving views that no longer follow its input.
            let index = worker.index();
            let run = std::panic::AssertUnwindSafe(|| driver::run_worker(worker, shared.clone()));
            if let Err(panic) = std::panic::catch_unwind(run) {
                shared.fail(format!("worker {index} died: {}", panic_message(&panic)));
                std::panic::resume_unwind(panic);
            }
        })
        .map_err(|e| anyhow::anyhow!("starting timely: {e}"))?;
        self.workers = Some(guards);
        Ok(())
    }

    /// Waits until the workers finish on their own (a follower process, when process 0 closes the dataflow).
    pub fn join_workers(&mut self) -> anyhow::Result<()> {
        if let Some(guards) = self.workers.take() {
            for r in guards.join() {
                r.map_err(|e| anyhow::anyhow!("worker failed: {e}"))?;
            }
        }
        Ok(())
    }

    /// Stops cleanly: the sources stop reading, the open epoch is fed, the workers, the summariser and the
    /// structure finish, the output topics are flushed.
    pub fn stop(mut self) -> anyhow::Result<()> {
        self.shared.stop();
        for s in self.sources.drain(..) {
            let _ = s.join();
        }
        if let Some(s) = self.summarizer.take() {
            let _ = s.join();
        }
        self.join_workers()?;
        self.shared.close_structure();
        if let Some(s) = self.structure.take() {
            let _ = s.join();
        }
        self.shared.final_checkpoint();
        self.shared.outputs.flush();
        tracing::info!(as_of = ?self.shared.as_of(), "stopped");
        Ok(())
    }
}

/// What a panic said, when it said it as text.
pub(crate) fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic".into())
}
