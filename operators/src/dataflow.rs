//! The layer-0 operators as timely/differential dataflow: embedding and similarity edges.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use differential_dataflow::{AsCollection, VecCollection};
use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::generic::Operator;
use timely::dataflow::operators::Capability;
use timely::order::TotalOrder;
use timely::progress::Timestamp;

use crate::embed::Embedder;
use crate::hash::{fnv1a, space_hash};
use crate::model::{Edge, Embedding, Node};
use crate::similarity::{to_edges, IndexState, SimilarityIndex, SimilarityParams};

/// Embeds every node. Nodes are spread over the workers by id (embedding is the costly, embarrassingly parallel
/// part of ingest), and each container of updates is embedded as one batch. For a bit-exact embedder retractions are
/// embedded again (they cancel their insertions exactly); for one whose vectors depend on the batch (a neural model)
/// the operator remembers the vector of every live (space, node, text) and retracts exactly that one — so a deleted
/// or replaced node always cancels, and a retraction costs no inference.
pub fn embed_nodes<'s, T>(
    nodes: VecCollection<'s, T, (String, Node)>,
    embedder: Arc<dyn Embedder>,
) -> VecCollection<'s, T, (String, Node, Embedding)>
where
    T: Timestamp + TotalOrder,
{
    let pact = Exchange::new(|u: &((String, Node), T, isize)| fnv1a((u.0).1.id.as_bytes()));
    let remember = !embedder.bit_exact();
    nodes
        .inner
        .unary(pact, "EmbedNodes", move |_cap, _info| {
            // (space, id, text hash) → (vector, multiplicity), only when `remember`.
            let mut live: HashMap<(String, String, u64), (Embedding, isize)> = HashMap::new();
            move |input, output| {
                input.for_each(|cap, data| {
                    let texts: Vec<String> = data.iter().map(|((_, n), _, _)| n.embedding_text()).collect();
                    if !remember {
                        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
                        let embs = embedder.embed_batch(&refs);
                        let mut session = output.session(&cap);
                        for (((space, node), t, d), e) in data.drain(..).zip(embs) {
                            session.give(((space, node, e), t, d));
                        }
                        return;
                    }
                    let keys: Vec<(String, String, u64)> = data
                        .iter()
                        .zip(&texts)
                        .map(|(((s, n), _, _), text)| (s.clone(), n.id.to_string(), fnv1a(text.as_bytes())))
                        .collect();
                    // Insertions first, so a retraction in the same container finds its vector.
                    let mut order: Vec<usize> = (0..data.len()).collect();
                    order.sort_by_key(|&i| std::cmp::Reverse(data[i].2 > 0));
                    let need: Vec<usize> = order.iter().copied().filter(|&i| !live.contains_key(&keys[i])).collect();
                    let mut fresh: HashMap<usize, Embedding> = {
                        let refs: Vec<&str> = need.iter().map(|&i| texts[i].as_str()).collect();
                        need.iter().copied().zip(embedder.embed_batch(&refs)).collect()
                    };
                    let mut out: Vec<Option<Embedding>> = vec![None; data.len()];
                    for &i in &order {
                        let d = data[i].2;
                        let e = match live.get_mut(&keys[i]) {
                            Some((e, count)) => {
                                *count += d;
                                let e = e.clone();
                                if *count == 0 {
                                    live.remove(&keys[i]);
                                }
                                e
                            }
                            None => {
                                let e = fresh.remove(&i).unwrap_or_else(|| embedder.embed(&texts[i]));
                                if d != 0 {
                                    live.insert(keys[i].clone(), (e.clone(), d));
                                }
                                e
                            }
                        };
                        out[i] = Some(e);
                    }
                    let mut session = output.session(&cap);
                    for (((space, node), t, d), e) in data.drain(..).zip(out) {
                        session.give(((space, node, e.expect("every update embedded")), t, d));
                    }
                });
            }
        })
        .as_collection()
}

/// Runs a stateful per-space computation over a collection in time order: updates are exchanged by space (all of a
/// space on one worker), each time's updates are held until the input frontier passes it and then handed to
/// `apply`, one call per space in space order, times in order; what `apply` returns is emitted at that time. The
/// operators that keep an index or an adjacency per space (the similarity graph, the ego networks) are built on it.
pub fn per_space_in_time_order<'s, T, D, O>(
    input: VecCollection<'s, T, D>,
    name: &str,
    space: fn(&D) -> &str,
    mut apply: impl FnMut(&str, Vec<(D, isize)>) -> Vec<(O, isize)> + 'static,
) -> VecCollection<'s, T, O>
where
    T: Timestamp + TotalOrder,
    D: timely::ExchangeData,
    O: timely::ExchangeData,
{
    let pact = Exchange::new(move |u: &(D, T, isize)| space_hash(space(&u.0)));
    input
        .inner
        .unary_frontier(pact, name, move |_cap, _info| {
            let mut pending: BTreeMap<T, (Capability<T>, Vec<(D, isize)>)> = BTreeMap::new();
            move |(input, frontier), output| {
                input.for_each(|cap, data| {
                    for (row, t, d) in data.drain(..) {
                        let slot = pending.entry(t.clone()).or_insert_with(|| (cap.delayed(&t, 0), Vec::new()));
                        slot.1.push((row, d));
                    }
                });
                while let Some(t) = pending.keys().next().cloned() {
                    if frontier.less_equal(&t) {
                        break;
                    }
                    let (cap, rows) = pending.remove(&t).expect("first key");
                    let mut by_space: BTreeMap<String, Vec<(D, isize)>> = BTreeMap::new();
                    for (row, d) in rows {
                        match by_space.get_mut(space(&row)) {
                            Some(rows) => rows.push((row, d)),
                            None => {
                                by_space.insert(space(&row).to_string(), vec![(row, d)]);
                            }
                        }
                    }
                    let mut session = output.session(&cap);
                    for (s, changes) in by_space {
                        session.give_iterator(apply(&s, changes).into_iter().map(|(o, d)| (o, t.clone(), d)));
                    }
                }
            }
        })
        .as_collection()
}

/// The similarity indexes of one operator on every worker of a process, where a checkpoint reads them and a restart
/// hands them back. Each worker's indexes sit behind their own lock (its spaces are its own), taken by the operator
/// for each batch and by [`IndexStore::states`] between epochs.
#[derive(Default)]
pub struct IndexStore {
    workers: Mutex<Vec<Arc<Mutex<HashMap<String, SimilarityIndex>>>>>,
    /// Space → the state a restart restores, taken by the operator with that space's first batch.
    restored: Mutex<HashMap<String, IndexState>>,
}

impl std::fmt::Debug for IndexStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IndexStore").finish_non_exhaustive()
    }
}

impl IndexStore {
    fn register(&self) -> Arc<Mutex<HashMap<String, SimilarityIndex>>> {
        let mine = Arc::new(Mutex::new(HashMap::new()));
        self.workers.lock().expect("index store lock").push(mine.clone());
        mine
    }

    /// Every space's index state, by space. Consistent at an epoch only when no operator is applying one: the
    /// caller takes it between epochs (the views hold the last one fed, and nothing after it has been fed).
    pub fn states(&self) -> Vec<(String, IndexState)> {
        let mut out = Vec::new();
        for w in self.workers.lock().expect("index store lock").iter() {
            let indexes = w.lock().expect("index lock");
            out.extend(indexes.iter().map(|(s, i)| (s.clone(), i.state())));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        out
    }

    /// The states a restart restores: each space's index is rebuilt from its state with its first batch.
    pub fn restore(&self, states: Vec<(String, IndexState)>) {
        self.restored.lock().expect("index store lock").extend(states);
    }

    fn take_restored(&self, space: &str) -> Option<IndexState> {
        self.restored.lock().expect("index store lock").remove(space)
    }
}

/// CAM's similarity edges, maintained per space by a [`SimilarityIndex`] on the worker that owns the space. The
/// operator holds each epoch until its input frontier passes it, then applies the whole epoch at once, so the
/// output at every time is the exact graph of the nodes at that time.
pub fn similarity_edges<'s, T>(
    nodes: VecCollection<'s, T, (String, Node, Embedding)>,
    params: SimilarityParams,
) -> VecCollection<'s, T, Edge>
where
    T: Timestamp + TotalOrder,
{
    similarity_edges_in(nodes, params, &Arc::default())
}

/// [`similarity_edges`] with its indexes kept in `store`. A space whose state `store` holds from a checkpoint is
/// restored from it with its first batch (the checkpoint's nodes) and emits its edges as they were; a state that
/// does not match the batch is dropped with a warning, and the index is built from the batch.
pub fn similarity_edges_in<'s, T>(
    nodes: VecCollection<'s, T, (String, Node, Embedding)>,
    params: SimilarityParams,
    store: &Arc<IndexStore>,
) -> VecCollection<'s, T, Edge>
where
    T: Timestamp + TotalOrder,
{
    let store = store.clone();
    let indexes = store.register();
    per_space_in_time_order(
        nodes,
        "SimilarityEdges",
        |(s, _, _)| s,
        move |space, rows| {
            let changes: Vec<(Node, Embedding, isize)> = rows.into_iter().map(|((_, n, e), d)| (n, e, d)).collect();
            let mut indexes = indexes.lock().expect("index lock");
            let state = if indexes.contains_key(space) { None } else { store.take_restored(space) };
            let restored = state.and_then(|state| match SimilarityIndex::restore(params.clone(), &state, &changes) {
                Ok(index) => Some(index),
                Err(e) => {
                    tracing::warn!(space, error = %e, "the checkpoint's similarity index does not match its nodes; built from them");
                    None
                }
            });
            let deltas = match restored {
                Some(index) => {
                    let deltas = index.all_edges();
                    indexes.insert(space.to_string(), index);
                    deltas
                }
                None => {
                    let index =
                        indexes.entry(space.to_string()).or_insert_with(|| SimilarityIndex::new(params.clone()));
                    index.apply(changes)
                }
            };
            if indexes.get(space).is_some_and(SimilarityIndex::is_empty) {
                indexes.remove(space);
            }
            to_edges(space, deltas).collect()
        },
    )
}
