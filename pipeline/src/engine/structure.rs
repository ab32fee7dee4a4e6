//! The structure: CAM's hierarchy and its summaries ([`operators::memory::structure`]) as a dataflow of its own, on
//! a thread of its own, beside the views on process 0.
//!
//! The views sink hands it layer 0's consolidated changes after each epoch it applies, with the epoch the views
//! then hold; the driver hands it the model's replies as it feeds them. The structure takes whatever has arrived as
//! one step, so the layers' work on many records consolidates, and applies its output to the views with
//! `hierarchy_as_of`, the epoch its layer 0 reflects. A fresh record is reflected in `as_of` (layer 0 and events)
//! without waiting for the layers above it; the hierarchy follows.
//!
//! Its output is a function of the layer-0 collection and the replies it has taken, whatever the steps they came
//! in, so after the same input the views equal a build from scratch. A restart from a checkpoint serves the
//! checkpoint's hierarchy until the structure's first step, which replaces it whole: that step's output is taken
//! together with the retraction of what the views held, consolidated, and applied as one change.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::mpsc::{Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use differential_dataflow::input::Input;
use operators::memory::structure;
use operators::name::{Interner, Name};
use timely::dataflow::operators::{Inspect, Probe};

use super::sink::{apply_to_views, memory_params};
use super::state::Shared;
use crate::views::ViewUpdate;

/// What the structure takes.
pub(crate) enum StructureInput {
    /// The views hold `through`: layer 0's changes in the epochs up to it not handed over before.
    Layer0 {
        through: u64,
        /// `(((space, node), text), diff)`: the node's and the text's names are the views' own.
        texts: Vec<(((String, Name), Name), isize)>,
        /// `((space, u, v, weight), diff)`.
        edges: Vec<((String, String, String, u64), isize)>,
    },
    /// The model's replies fed to the dataflow: `((space, content key), reply)`.
    Replies(Vec<((String, String), String)>),
}

/// The channel into the structure, and the end its thread takes.
pub(super) fn channel() -> (Sender<StructureInput>, Receiver<StructureInput>) {
    std::sync::mpsc::channel()
}

/// Starts the structure's thread; it ends when every sender is dropped (the workers have finished and the engine
/// let go of its own), after applying what it was sent.
pub(super) fn spawn_structure(shared: Arc<Shared>, rx: Receiver<StructureInput>) -> JoinHandle<()> {
    let rx = Mutex::new(rx);
    std::thread::Builder::new()
        .name("structure".into())
        .spawn(move || {
            let run = std::panic::AssertUnwindSafe(|| {
                let inner = shared.clone();
                timely::execute_directly(move |worker| run(worker, &inner, &rx))
            });
            if let Err(panic) = std::panic::catch_unwind(run) {
                shared.fail(format!("the structure died: {}", super::panic_message(&panic)));
            }
        })
        .expect("spawning the structure thread")
}

fn run(worker: &mut timely::worker::Worker, shared: &Arc<Shared>, rx: &Mutex<Receiver<StructureInput>>) {
    let rx = rx.lock().expect("structure receiver");
    let params = memory_params(&shared.config);
    let out: Rc<RefCell<Vec<(ViewUpdate, isize)>>> = Rc::default();
    let sink = out.clone();
    let (mut texts, mut edges, mut logged, probe) = worker.dataflow::<u64, _, _>(|scope| {
        let (texts_in, texts) = scope.new_collection::<((Name, Name), Name), isize>();
        let (edges_in, edges) = scope.new_collection::<(Name, Name, Name, u64), isize>();
        let (logged_in, logged) = scope.new_collection::<((Name, Name), Name), isize>();
        let st = structure(texts, edges, logged, &params);
        let updates = st
            .clusters
            .map(|(s, l, c, m)| ViewUpdate::Cluster(s, l, c, m))
            .concat(st.layer_edges.map(|(s, l, u, v, w)| ViewUpdate::LayerEdge(s, l, u, v, w)))
            .concat(st.summaries.map(|((s, c), (l, t))| ViewUpdate::Summary(s, l, c, t)))
            .concat(st.requests.map(|(s, key, r)| ViewUpdate::Request(s, key, Box::new(r))));
        let (probe, _) = updates.inner.inspect(move |(u, _, d)| sink.borrow_mut().push((u.clone(), *d))).probe();
        (texts_in, edges_in, logged_in, probe)
    });
    let mut time = 0u64;
    let mut through: Option<u64> = None;
    // A restart from a checkpoint: the first step replaces the checkpoint's hierarchy.
    let mut replace = shared.restored_through.is_some();
    // Until then, the output of the steps before it.
    let mut kept: Vec<(ViewUpdate, isize)> = Vec::new();
    // Every name that enters is one allocation, shared by all the rows that carry it.
    let mut names = Interner::default();
    while let Ok(first) = rx.recv() {
        let mut fed = false;
        let mut taken = 0u64;
        for msg in std::iter::once(first).chain(rx.try_iter()) {
            match msg {
                StructureInput::Layer0 { through: t, texts: ts, edges: es } => {
                    through = through.max(Some(t));
                    fed |= !ts.is_empty() || !es.is_empty();
                    taken += ts.len() as u64;
                    for (((s, n), t), d) in ts {
                        texts.update(((names.take(s), names.adopt(n)), names.adopt(t)), d);
                    }
                    for ((s, u, v, w), d) in es {
                        edges.update((names.take(s), names.take(u), names.take(v), w), d);
                    }
                }
                StructureInput::Replies(rs) => {
                    fed |= !rs.is_empty();
                    for ((s, k), r) in rs {
                        logged.update(((names.take(s), Name::from(k)), Name::from(r)), 1);
                    }
                }
            }
        }
        let started = std::time::Instant::now();
        if fed {
            time += 1;
            texts.advance_to(time);
            edges.advance_to(time);
            logged.advance_to(time);
            texts.flush();
            edges.flush();
            logged.flush();
            worker.step_while(|| probe.less_than(&time));
            names.sweep();
        }
        // What this step took is no longer waiting once its output is in the views (or kept for them).
        let taken_off = || shared.structure_backlog.fetch_sub(taken, std::sync::atomic::Ordering::SeqCst);
        let mut updates = std::mem::take(&mut *out.borrow_mut());
        let replacing = replace;
        if replace {
            if through < shared.restored_through {
                // Not yet the checkpoint's layer 0: the views keep the checkpoint's hierarchy a while longer.
                kept.append(&mut updates);
                taken_off();
                continue;
            }
            replace = false;
            updates.append(&mut kept);
            let held: Vec<(ViewUpdate, isize)> =
                shared.views().structure_snapshot().into_iter().map(|u| (u, -1)).collect();
            tracing::info!(retracted = held.len(), "the structure replaces the checkpoint's hierarchy");
            updates.extend(held);
        }
        differential_dataflow::consolidation::consolidate(&mut updates);
        let changed = updates.len();
        let at = through.unwrap_or(0);
        apply_to_views(shared, vec![(at, updates)], |views| {
            views.hierarchy_as_of = through.max(views.hierarchy_as_of);
        });
        if replacing {
            shared.metrics.checkpoint_hierarchy_rebuilding.set(0);
        }
        taken_off();
        shared.structure_advanced(through);
        if fed {
            shared.metrics.structure_seconds.observe(started.elapsed().as_secs_f64());
            tracing::debug!(through = ?through, changed, took = ?started.elapsed(), "structure step");
        }
    }
}
