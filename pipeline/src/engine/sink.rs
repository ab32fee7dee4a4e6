//! The dataflow of one worker: its inputs, the memory's fresh part wired over them (layer 0 and the event memory),
//! and the views sink that applies its output to the views the HTTP server reads and hands layer 0's changes to the
//! structure (`structure.rs`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use differential_dataflow::input::{Input, InputSession};
use differential_dataflow::VecCollection;
use operators::events::{RelationBounds, SegmentParams};
use operators::memory::{fresh, MemoryParams};
use operators::model::ErrorRow;
use operators::{Embedding, Node};
use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::generic::Operator;
use timely::dataflow::operators::Inspect;
use timely::worker::Worker;

use super::state::Shared;
use super::structure::StructureInput;
use crate::config::Config;
use crate::views::{texts_to_embed, ViewUpdate};

type NodeInput = InputSession<u64, (String, Node), isize>;
type ErrorInput = InputSession<u64, ErrorRow, isize>;
type SummaryInput = InputSession<u64, ((String, String), String), isize>;
type PositionInput = InputSession<u64, (String, u64), isize>;

/// The dataflow's inputs, fed by the worker's driver.
pub(super) struct Inputs {
    pub(super) nodes: NodeInput,
    pub(super) errors: ErrorInput,
    pub(super) summaries: SummaryInput,
    pub(super) positions: PositionInput,
    /// The cluster's clock: every driver sends the epoch it opens; all of them see it.
    pub(super) clock: timely::dataflow::operators::vec::input::Handle<u64, u64>,
    /// What the views have applied, seen from any worker.
    pub(super) views: timely::dataflow::operators::probe::Handle<u64>,
}

impl Inputs {
    pub(super) fn advance_to(&mut self, t: u64) {
        self.nodes.advance_to(t);
        self.errors.advance_to(t);
        self.summaries.advance_to(t);
        self.positions.advance_to(t);
        if *self.clock.time() < t {
            self.clock.advance_to(t);
        }
    }
    pub(super) fn flush(&mut self) {
        self.nodes.flush();
        self.errors.flush();
        self.summaries.flush();
        self.positions.flush();
        self.clock.flush();
    }
}

/// Builds the dataflow on one worker: the memory's fresh part ([`operators::memory::fresh`]) over the nodes and
/// logged replies, and everything it outputs → the views (on worker 0).
pub(super) fn build_dataflow(worker: &mut Worker, shared: Arc<Shared>) -> Inputs {
    let params = MemoryParams { indexes: shared.indexes.clone(), ..memory_params(&shared.config) };
    let index = worker.index();
    worker.dataflow::<u64, _, _>(|scope| {
        let (node_input, nodes) = scope.new_collection::<(String, Node), isize>();
        let (error_input, errors) = scope.new_collection::<ErrorRow, isize>();
        let (summary_input, logged) = scope.new_collection::<((String, String), String), isize>();
        let (position_input, positions) = scope.new_collection::<(String, u64), isize>();
        let (clock_input, clock) = timely::dataflow::operators::vec::Input::new_input::<u64>(&scope);
        let seen = shared.clone();
        timely::dataflow::operators::vec::Broadcast::broadcast(clock).inspect(move |e| seen.see_clock(*e));
        let m = fresh(nodes, logged, shared.embedder.clone(), &params);
        let updates = m
            .nodes
            .map(|(s, n, e)| ViewUpdate::Node(s, Box::new(n), e))
            .concat(m.edges.map(|e| ViewUpdate::Edge(Box::new(e))))
            .concat(errors.map(|e| ViewUpdate::Error(Box::new(e))))
            .concat(m.requests.map(|(s, key, r)| ViewUpdate::Request(s, key, Box::new(r))))
            .concat(m.events.map(|(s, e)| ViewUpdate::Event(s, Box::new(e))))
            .concat(m.relations.map(|(s, r)| ViewUpdate::Relation(s, Box::new(r))))
            .concat(m.merges.map(|(s, e, g)| ViewUpdate::Merge(s.into(), e.into(), g.into())))
            .concat(m.topics.map(|(s, t, e)| ViewUpdate::Topic(s.into(), t.into(), e.into())))
            .concat(positions.map(|(s, o)| ViewUpdate::Position(s, o)));
        let views = views_sink(updates, index, shared);
        Inputs {
            nodes: node_input,
            errors: error_input,
            summaries: summary_input,
            positions: position_input,
            clock: clock_input,
            views,
        }
    })
}

/// The memory's parameters from the config.
pub fn memory_params(config: &Config) -> MemoryParams {
    let ev = &config.events;
    MemoryParams {
        similarity: config.similarity.clone(),
        hierarchy: config.hierarchy.params(),
        segment: SegmentParams {
            summary_words: config.hierarchy.summary_words,
            relations: RelationBounds { window: ev.relation_window, max_per_event: ev.max_relations_per_event },
            ..Default::default()
        },
        with_model: config.llm.has_model(),
        merge_threshold: ev.merge_threshold,
        merge_neighbours: ev.merge_neighbours,
        judge_threshold: ev.judge.then_some(ev.judge_threshold),
        indexes: Default::default(),
    }
}

/// The views sink: applies each epoch's updates to the views (on worker 0) once the frontier has passed it, hands
/// layer 0's changes to the structure, and holds a capability for every epoch not yet applied, so the returned probe
/// sees an epoch only once the views hold it.
fn views_sink<'s>(
    updates: VecCollection<'s, u64, ViewUpdate>,
    index: usize,
    shared: Arc<Shared>,
) -> timely::dataflow::operators::probe::Handle<u64> {
    let structure = if index == 0 { shared.structure_sender() } else { None };
    let mut pending: BTreeMap<u64, Vec<(ViewUpdate, isize)>> = BTreeMap::new();
    // A capability per epoch not yet applied: the probe below sees an epoch only once the views hold it.
    let mut held: BTreeMap<u64, timely::dataflow::operators::Capability<u64>> = BTreeMap::new();
    // A restart from a checkpoint starts at the checkpoint's epoch: the views never go back behind it.
    let mut last_as_of: Option<u64> = shared.restored_through;
    let mut caught_up = false;
    // The dataflow's output for the checkpoint's epochs, which the views already hold as the checkpoint: once the
    // rebuild has passed them, the views take the dataflow's state where the two differ (an approximate index
    // rebuilt in another order), so that the changes after it apply to the state they were computed from.
    let mut rebuilt: Option<Vec<(ViewUpdate, isize)>> = shared.restored_through.map(|_| Vec::new());
    let opened = std::time::Instant::now();
    type Nothing = timely::container::CapacityContainerBuilder<Vec<()>>;
    let applied = updates.inner.unary_frontier::<Nothing, _, _, _>(
        Exchange::new(|_: &(ViewUpdate, u64, isize)| 0),
        "Views",
        move |initial, _info| {
            drop(initial);
            move |(input, frontier), _output| {
                input.for_each(|cap, data| {
                    if let Some(c) = cap.retain_least(0) {
                        held.entry(*c.time()).or_insert(c);
                    }
                    for (u, t, d) in data.drain(..) {
                        pending.entry(t).or_default().push((u, d));
                    }
                });
                if index != 0 {
                    return;
                }
                let lower = frontier.frontier().iter().min().copied();
                let as_of = match lower {
                    Some(f) => f.checked_sub(1),
                    None => pending.keys().next_back().copied().max(last_as_of),
                };
                if let Some(e) = shared.restored_through.filter(|_| !caught_up) {
                    if lower.is_none_or(|f| f > e) {
                        caught_up = true;
                        shared.metrics.checkpoint_rebuilding.set(0);
                        tracing::info!(epoch = e, took = ?opened.elapsed(), "the dataflow has rebuilt the checkpoint's epochs");
                    }
                }
                let ready: Vec<u64> = pending.keys().copied().take_while(|t| lower.is_none_or(|f| *t < f)).collect();
                if ready.is_empty() && as_of == last_as_of && !(caught_up && rebuilt.is_some()) {
                    held.retain(|t, _| lower.is_some_and(|f| *t >= f));
                    return;
                }
                let mut batches = Vec::with_capacity(ready.len());
                let mut layer0 = Layer0::default();
                for t in ready {
                    let mut updates = pending.remove(&t).expect("ready time");
                    differential_dataflow::consolidation::consolidate(&mut updates);
                    if structure.is_some() {
                        layer0.take(&updates);
                    }
                    if shared.restored_through.is_some_and(|e| t <= e) {
                        // The views started from a checkpoint that holds this epoch.
                        if let Some(r) = rebuilt.as_mut() {
                            r.extend(updates);
                        }
                        continue;
                    }
                    if caught_up {
                        reconcile(&shared, &mut rebuilt, &mut batches);
                    }
                    batches.push((t, updates));
                }
                if caught_up {
                    reconcile(&shared, &mut rebuilt, &mut batches);
                }
                apply_to_views(&shared, batches, |views| views.as_of = as_of.max(views.as_of));
                let advanced = as_of.max(last_as_of) > last_as_of;
                last_as_of = as_of.max(last_as_of);
                if let Some(a) = last_as_of {
                    shared.advanced(a);
                    shared.as_of.send_replace(Some(a));
                    shared.checkpoint_if_due(a);
                }
                // After `as_of` is published: the hierarchy is never ahead of it.
                if let (Some(tx), Some(through)) = (&structure, last_as_of) {
                    if advanced || !layer0.is_empty() {
                        // A closed structure (the engine is stopping or failed) takes nothing more.
                        let n = layer0.texts.len() as u64;
                        shared.structure_backlog.fetch_add(n, std::sync::atomic::Ordering::SeqCst);
                        let _ = tx.send(StructureInput::Layer0 { through, texts: layer0.texts, edges: layer0.edges });
                    }
                }
                // Everything below the frontier is applied.
                held.retain(|t, _| lower.is_some_and(|f| *t >= f));
            }
        },
    );
    let (views, _) = timely::dataflow::operators::probe::Probe::probe(applied);
    views
}

/// Layer 0's consolidated changes, as the structure takes them.
#[derive(Default)]
struct Layer0 {
    texts: Vec<(((String, operators::Name), operators::Name), isize)>,
    edges: Vec<((String, String, String, u64), isize)>,
}

impl Layer0 {
    fn take(&mut self, updates: &[(ViewUpdate, isize)]) {
        for (u, d) in updates {
            match u {
                ViewUpdate::Node(s, n, _) => self.texts.push((((s.clone(), n.id.clone()), n.text.clone()), *d)),
                ViewUpdate::Edge(e) => {
                    self.edges.push(((e.space.clone(), e.u.clone(), e.v.clone(), u64::from(e.weight_micro)), *d))
                }
                _ => {}
            }
        }
    }

    fn is_empty(&self) -> bool {
        self.texts.is_empty() && self.edges.is_empty()
    }
}

/// Once the dataflow has rebuilt a checkpoint's epochs: queues the correction from the checkpoint's views to the
/// rebuilt state (see [`crate::views::Views::correction`]), at the checkpoint's epoch, ahead of every later epoch.
fn reconcile(
    shared: &Arc<Shared>,
    rebuilt: &mut Option<Vec<(ViewUpdate, isize)>>,
    batches: &mut Vec<(u64, Vec<(ViewUpdate, isize)>)>,
) {
    let (Some(rebuilt), Some(epoch)) = (rebuilt.take(), shared.restored_through) else { return };
    let correction = shared.views().correction(rebuilt);
    shared.metrics.checkpoint_rebuild_differences.set(correction.len() as i64);
    if correction.is_empty() {
        tracing::info!(epoch, "the rebuilt dataflow agrees with the checkpoint");
    } else {
        let mut kinds: BTreeMap<&str, usize> = BTreeMap::new();
        for (u, _) in &correction {
            *kinds.entry(u.kind()).or_default() += 1;
        }
        tracing::warn!(
            epoch,
            updates = correction.len(),
            ?kinds,
            "the rebuilt dataflow differs from the checkpoint (an approximate index built in another order); the views take its state"
        );
        batches.push((epoch, correction));
    }
}

/// Applies epochs of consolidated updates to the views, then `then` under the same lock: the change topic is sent
/// and summaries and events are embedded before the views are locked, so a slow endpoint holds up no reader.
pub(super) fn apply_to_views(
    shared: &Arc<Shared>,
    batches: Vec<(u64, Vec<(ViewUpdate, isize)>)>,
    then: impl FnOnce(&mut crate::views::Views),
) {
    for (t, updates) in &batches {
        let mut kinds: Vec<((&'static str, &'static str), u64)> = Vec::new();
        for (u, _) in updates {
            let k = (u.kind(), u.layer());
            match kinds.iter_mut().find(|x| x.0 == k) {
                Some(x) => x.1 += 1,
                None => kinds.push((k, 1)),
            }
        }
        for ((kind, layer), n) in kinds {
            shared.metrics.view_updates.with_label_values(&[kind, layer]).inc_by(n);
        }
        if shared.outputs.wants_changes() {
            shared.outputs.changes(*t, updates);
        }
    }
    let embedder = &shared.embedder;
    let embedded: HashMap<String, Embedding> = batches
        .iter()
        .flat_map(|(_, updates)| texts_to_embed(updates))
        .map(|text| {
            let e = embedder.embed(&text);
            (text, e)
        })
        .collect();
    let embed = |text: &str| embedded.get(text).cloned().unwrap_or_else(|| embedder.embed(text));
    let mut views = shared.views.write().expect("views lock");
    for (_, updates) in batches {
        views.apply_consolidated(updates, &embed);
    }
    then(&mut views);
    shared.start_index_builds(&mut views);
    shared.metrics.nodes.set(views.node_count() as i64);
    shared.metrics.edges.set(views.edge_count() as i64);
    shared.metrics.spaces.set(views.spaces.len() as i64);
    shared.metrics.clusters.set(views.cluster_count() as i64);
    shared.metrics.summary_backlog.set(views.request_count() as i64);
}
