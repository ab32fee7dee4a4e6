//! The whole memory, wired once, in two parts: [`fresh`] (layer 0 and the event memory) and [`structure`] (CAM's
//! hierarchy and its summaries, over layer 0). The engine runs them as two dataflows, so that a streamed record is
//! reflected without waiting for the layers above it; the benches and model tests build both as one with [`memory`],
//! the same operators either way.
//!
//! ```text
//! nodes ─► embed ─► similarity edges ─► hierarchy (ego networks, replicas, label propagation, layers)
//!   │                                        └─► summaries ◄─ logged replies
//!   └─► events per session ◄─ logged replies ─► relations
//!          └─► event vectors ─► similar pairs ─► merges (with the co-reference judge below the threshold)
//!                                    └─► topics
//! ```
//!
//! Every model request (cluster summaries, session segmentations, co-reference judgements) comes out as one
//! collection of [`ModelRequest`]s keyed by content; the replies come back in as `logged`.

use std::sync::Arc;

use differential_dataflow::lattice::Lattice;
use differential_dataflow::VecCollection;
use timely::order::TotalOrder;
use timely::progress::Timestamp;

use crate::dataflow::{embed_nodes, similarity_edges_in, IndexStore};
use crate::embed::Embedder;
use crate::events::{self, EventRow, RelationRow, SegmentParams};
use crate::hierarchy::dataflow::{hierarchy, summaries};
use crate::hierarchy::HierarchyParams;
use crate::model::{Edge, Embedding, Node, NodeKind};
use crate::name::Name;
use crate::request::ModelRequest;
use crate::similarity::SimilarityParams;

/// The parameters of the whole memory.
#[derive(Clone, Debug)]
pub struct MemoryParams {
    pub similarity: SimilarityParams,
    pub hierarchy: HierarchyParams,
    pub segment: SegmentParams,
    /// Whether a model answers the requests: with one, sessions are asked of it (until it answers, and without
    /// one, the extractive events are the answer).
    pub with_model: bool,
    /// Events whose vectors reach this cosine are merged.
    pub merge_threshold: f32,
    /// Each event is linked to at most this many nearest events at the threshold (the components are merged).
    pub merge_neighbours: usize,
    /// With a model, the pairs from this cosine up to the merge threshold go to the co-reference judge; `None`: no
    /// judge.
    pub judge_threshold: Option<f32>,
    /// Where the similarity indexes live, for checkpoints and restarts.
    pub indexes: Indexes,
}

/// The stores of the memory's two similarity indexes: layer 0's and the events' (for merges).
#[derive(Clone, Debug, Default)]
pub struct Indexes {
    pub layer0: Arc<IndexStore>,
    pub events: Arc<IndexStore>,
}

/// The memory's output collections, per space.
pub struct Memory<'s, T: Timestamp> {
    /// `(space, node, embedding)`: layer 0.
    pub nodes: VecCollection<'s, T, (String, Node, Embedding)>,
    /// Layer 0's similarity edges.
    pub edges: VecCollection<'s, T, Edge>,
    /// `(space, layer, cluster, member)` for every layer ≥ 1.
    pub clusters: VecCollection<'s, T, (String, u32, String, String)>,
    /// `(space, layer, u, v, weight)`: the graph of every layer ≥ 1.
    pub layer_edges: VecCollection<'s, T, (String, u32, String, String, u64)>,
    /// `((space, cluster), (layer, text))`: the summary every summarised cluster shows.
    pub summaries: VecCollection<'s, T, ((String, String), (u32, String))>,
    /// `(space, content key, request)`: what waits for the model.
    pub requests: VecCollection<'s, T, (String, String, ModelRequest)>,
    pub events: VecCollection<'s, T, (String, EventRow)>,
    /// The relations of each session's events, and the `overlap` relations of the co-reference judge.
    pub relations: VecCollection<'s, T, (String, RelationRow)>,
    /// `(space, event, group)`: the merge group of every event.
    pub merges: VecCollection<'s, T, (String, String, String)>,
    /// `(space, topic, event)`.
    pub topics: VecCollection<'s, T, (String, String, String)>,
}

/// The memory's fresh part: layer 0 and the event memory, what a streamed record needs before the views reflect it.
pub struct Fresh<'s, T: Timestamp> {
    /// `(space, node, embedding)`: layer 0.
    pub nodes: VecCollection<'s, T, (String, Node, Embedding)>,
    /// Layer 0's similarity edges.
    pub edges: VecCollection<'s, T, Edge>,
    /// `(space, content key, request)`: the event memory's requests (segmentations, co-reference judgements).
    pub requests: VecCollection<'s, T, (String, String, ModelRequest)>,
    pub events: VecCollection<'s, T, (String, EventRow)>,
    pub relations: VecCollection<'s, T, (String, RelationRow)>,
    pub merges: VecCollection<'s, T, (String, String, String)>,
    pub topics: VecCollection<'s, T, (String, String, String)>,
}

/// The memory's structure: CAM's hierarchy over layer 0, and the summaries of its clusters.
pub struct Structure<'s, T: Timestamp> {
    /// `(space, layer, cluster, member)` for every layer ≥ 1.
    pub clusters: VecCollection<'s, T, (Name, u32, Name, Name)>,
    /// `(space, layer, u, v, weight)`: the graph of every layer ≥ 1.
    pub layer_edges: VecCollection<'s, T, (Name, u32, Name, Name, u64)>,
    /// `((space, cluster), (layer, text))`.
    pub summaries: VecCollection<'s, T, ((Name, Name), (u32, Name))>,
    /// `(space, content key, request)`: the clusters waiting for their summaries.
    pub requests: VecCollection<'s, T, (String, String, ModelRequest)>,
}

/// Builds the memory over `nodes` (layer 0, per space) and `logged` (the model's replies, `((space, content key),
/// reply)`): [`fresh`] and, over its layer 0, [`structure`], in one dataflow.
pub fn memory<'s, T>(
    nodes: VecCollection<'s, T, (String, Node)>,
    logged: VecCollection<'s, T, ((String, String), String)>,
    embedder: Arc<dyn Embedder>,
    params: &MemoryParams,
) -> Memory<'s, T>
where
    T: Timestamp + Lattice + TotalOrder,
{
    let texts = nodes.clone().map(|(s, n)| ((Name::from(s), n.id), n.text));
    let f = fresh(nodes, logged.clone(), embedder, params);
    let edges = f.edges.clone().map(|e| (e.space.into(), e.u.into(), e.v.into(), u64::from(e.weight_micro)));
    let named = logged.clone().map(|((s, k), r)| ((Name::from(s), Name::from(k)), Name::from(r)));
    let st = structure(texts, edges, named, params);
    Memory {
        nodes: f.nodes,
        edges: f.edges,
        clusters: st.clusters.map(|(s, l, c, m)| (s.into(), l, c.into(), m.into())),
        layer_edges: st.layer_edges.map(|(s, l, u, v, w)| (s.into(), l, u.into(), v.into(), w)),
        summaries: st.summaries.map(|((s, c), (l, t))| ((s.into(), c.into()), (l, t.into()))),
        requests: st.requests.concat(f.requests),
        events: f.events,
        relations: f.relations,
        merges: f.merges,
        topics: f.topics,
    }
}

/// The hierarchy and its summaries over layer 0 given as `texts` (`((space, node), text)`) and `edges` (`(space,
/// u, v, weight)`), with the model's replies `logged`.
pub fn structure<'s, T>(
    texts: VecCollection<'s, T, ((Name, Name), Name)>,
    edges: VecCollection<'s, T, (Name, Name, Name, u64)>,
    logged: VecCollection<'s, T, ((Name, Name), Name)>,
    params: &MemoryParams,
) -> Structure<'s, T>
where
    T: Timestamp + Lattice + TotalOrder,
{
    let h = hierarchy(texts.clone().map(|((s, id), _)| (s, id)), edges, &params.hierarchy);
    let sm = summaries(texts, &h.layers, logged);
    let requests = sm.requests.map(|(s, layer, cluster, key, members)| {
        let members = members.iter().map(|(m, t)| (m.to_string(), t.to_string())).collect();
        (s.to_string(), key.to_string(), ModelRequest::Summary { layer, cluster: cluster.to_string(), members })
    });
    Structure { clusters: h.clusters, layer_edges: h.edges, summaries: sm.texts, requests }
}

/// Layer 0 (embedded nodes, similarity edges) and the event memory over `nodes`, with the model's replies `logged`.
pub fn fresh<'s, T>(
    nodes: VecCollection<'s, T, (String, Node)>,
    logged: VecCollection<'s, T, ((String, String), String)>,
    embedder: Arc<dyn Embedder>,
    params: &MemoryParams,
) -> Fresh<'s, T>
where
    T: Timestamp + Lattice + TotalOrder,
{
    let embedded = embed_nodes(nodes.clone(), embedder.clone());
    let edges = similarity_edges_in(embedded.clone(), params.similarity.clone(), &params.indexes.layer0);
    let em = events::event_memory(nodes, logged.clone(), params.segment.clone(), params.with_model);
    // Each event embedded as a pseudo-node (so batch-dependent embedders retract exactly) and quantised.
    let event_nodes = em.events.clone().map(|(s, e)| {
        let text = format!("{} | {}", e.summary, e.people.join(", "));
        let node = Node {
            id: e.id.into(),
            kind: NodeKind::Summary,
            doc: e.conversation.into(),
            pos: 0,
            text: text.into(),
            speaker: None,
            ts: None,
        };
        (s, node)
    });
    let by_conversation = embed_nodes(event_nodes, embedder)
        .map(|(s, n, v)| (s, n.doc.to_string(), n.id.to_string(), events::quantise(&v.to_dense())));
    let event_vectors = by_conversation.clone().map(|(s, _, id, v)| (s, id, v));
    // Links at the merge threshold; with the judge on (and a model), the pairs just below it go to the model.
    let micro = |x: f32| (f64::from(x) * 1e6).round() as i64;
    let tau = params.merge_threshold;
    let tau_micro = micro(tau);
    let lo = params.judge_threshold.filter(|_| params.with_model).unwrap_or(tau);
    let pairs = events::similar_pairs(
        event_vectors.clone(),
        lo,
        params.merge_neighbours,
        &params.similarity,
        &params.indexes.events,
    );
    let links = pairs.clone().filter(move |p| p.3 >= tau_micro).map(|(s, a, b, _)| (s, a, b));
    let candidates = pairs.filter(move |p| p.3 < tau_micro).map(|(s, a, b, _)| (s, a, b));
    let coref = events::coreference(candidates, em.events.clone(), logged);
    let merges = events::merge_groups(event_vectors.clone(), links.concat(coref.same));
    let topics = events::event_topics(by_conversation);
    Fresh {
        nodes: embedded,
        edges,
        requests: em.requests.concat(coref.requests),
        events: em.events,
        relations: em.relations.concat(coref.overlaps),
        merges,
        topics,
    }
}
