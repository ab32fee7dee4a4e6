//! The hierarchy as differential dataflow: every step of [`super`] is a collection, so inserting or deleting a
//! layer-0 node or edge updates exactly the ego networks, replicas, labels, clusters and upper layers it affects.
//! The layers are unrolled into `max-layers` stages, each incremental on its own. Two steps are stateful operators
//! per space rather than joins, because their joins were the cost: the ego networks with the replica graph they make
//! ([`ego_replicas`]) and label propagation ([`super::lpa`]), which keeps every round's labels and recomputes only
//! what an epoch's changes reach.

use std::collections::{BTreeMap, HashMap};

use differential_dataflow::lattice::Lattice;
use differential_dataflow::VecCollection;
use timely::order::TotalOrder;
use timely::progress::Timestamp;

use crate::dataflow::per_space_in_time_order;

use super::ego::{Ego, EgoInput, ReplicaRow};
use super::links::{Layer, LayerInput, LayerOutput};
use super::lpa::Lpa;
use super::{cluster_ids, label_parts, HierarchyParams, Replica};
use crate::name::Name;

/// `(space, node)`.
pub type Nodes<'s, T> = VecCollection<'s, T, (Name, Name)>;
/// `(space, u, v, weight)`, undirected, `u < v`.
pub type Edges<'s, T> = VecCollection<'s, T, (Name, Name, Name, u64)>;

pub struct Hierarchy<'s, T: Timestamp> {
    /// `(space, layer, cluster, member)`: the clusters of every layer ≥ 1 and their members (nodes of the layer
    /// below).
    pub clusters: VecCollection<'s, T, (Name, u32, Name, Name)>,
    /// The same, one collection per layer (index 0 is layer 1): `(space, cluster, member)`.
    pub layers: Vec<VecCollection<'s, T, (Name, Name, Name)>>,
    /// `(space, layer, u, v, weight)`: the graph of every layer ≥ 1.
    pub edges: VecCollection<'s, T, (Name, u32, Name, Name, u64)>,
}

pub fn hierarchy<'s, T>(nodes: Nodes<'s, T>, edges: Edges<'s, T>, params: &HierarchyParams) -> Hierarchy<'s, T>
where
    T: Timestamp + Lattice + TotalOrder,
{
    let mut all_clusters = Vec::new();
    let mut all_edges = Vec::new();
    let mut layers = Vec::new();
    let (mut nodes, mut edges) = (nodes, edges);
    for layer in 1..=params.max_layers as u32 {
        let below = nodes.clone().map(|(s, _)| s).count();
        let clusters = cluster_layer(layer, nodes, edges.clone(), params);
        let (members, next_nodes, next_edges) = next_layer(edges, clusters, below, params);
        nodes = next_nodes;
        edges = next_edges;
        layers.push(members.clone());
        all_clusters.push(members.map(move |(s, c, m)| (s, layer, c, m)));
        all_edges.push(edges.clone().map(move |(s, u, v, w)| (s, layer, u, v, w)));
    }
    let scope = nodes.scope();
    Hierarchy {
        layers,
        clusters: differential_dataflow::collection::concatenate(scope, all_clusters),
        edges: differential_dataflow::collection::concatenate(scope, all_edges),
    }
}

/// Ego networks → replicas → label propagation → clusters, for one layer. Output `((space, cluster), member)`.
fn cluster_layer<'s, T>(
    layer: u32,
    nodes: Nodes<'s, T>,
    edges: Edges<'s, T>,
    params: &HierarchyParams,
) -> VecCollection<'s, T, ((Name, Name), Name)>
where
    T: Timestamp + Lattice + TotalOrder,
{
    // The replica graph: replicas `(s, (v, c))` (an isolated node's `(v, "")` too) and directed replica edges
    // `((s, x), (y, w))`, both directions. Above the replica layers every node is its one replica `(v, "")` and the
    // layer's edges are the replica edges, with no ego-network operator.
    let (replicas, radj) = if params.splits(layer) {
        let ego = ego_replicas(nodes, edges, params.pool_loose_neighbours);
        let radj = ego.clone().flat_map(|(s, (x, e))| e.map(|(y, w)| ((s, x), (y, w))));
        (ego.flat_map(|(s, (r, e))| e.is_none().then_some((s, r))), radj)
    } else {
        let replicas = nodes.map(|(s, v)| (s, (v, Name::default())));
        let radj = edges.flat_map(|(s, u, v, w)| {
            let (ru, rv) = ((u, Name::default()), (v, Name::default()));
            [((s.clone(), ru.clone()), (rv.clone(), w)), ((s, rv), (ru, w))]
        });
        (replicas, radj)
    };
    let rule =
        if params.propagates(layer) { Rule::Propagate(params.lpa_rounds) } else { Rule::Link(params.max_cluster_size) };
    let labels = label_propagation(replicas, radj, rule);
    let max = params.max_cluster_size;
    let head = !params.propagates(layer);
    labels
        .map(|((s, r), l)| ((s, l), r))
        .reduce(
            move |(_, label): &(Name, Replica),
                  reps: &[(&Replica, isize)],
                  out: &mut Vec<((Vec<Name>, Name), isize)>| {
                let reps: Vec<&Replica> = reps.iter().map(|(r, _)| *r).collect();
                // The parts name their members as the replicas do: each as the replica's own name, not a copy.
                let names: BTreeMap<&str, &Name> =
                    reps.iter().map(|r| (r.0.as_str(), &r.0)).chain([(label.0.as_str(), &label.0)]).collect();
                let name = |m: &str| names.get(m).map_or_else(|| Name::new(m), |n| (*n).clone());
                for (anchor, part) in label_parts(label, &reps, max, head) {
                    out.push(((part.into_iter().map(name).collect(), name(anchor)), 1));
                }
            },
        )
        // Identical member sets (from different labels) are one cluster, anchored by the smaller anchor; the
        // clusters of one anchor are ranked by their members.
        .map(|((s, _l), (members, anchor))| ((s, members), anchor))
        .reduce(|_k, anchors: &[(&Name, isize)], out: &mut Vec<(Name, isize)>| out.push((anchors[0].0.clone(), 1)))
        .map(|((s, members), anchor)| ((s, anchor), members))
        .reduce(
            move |(_, anchor): &(Name, Name),
                  sets: &[(&Vec<Name>, isize)],
                  out: &mut Vec<((Name, Vec<Name>), isize)>| {
                for (id, (ms, _)) in cluster_ids(layer, anchor, sets.len()).into_iter().zip(sets) {
                    out.push(((id, (*ms).clone()), 1));
                }
            },
        )
        .flat_map(|((s, _anchor), (id, members))| members.into_iter().map(move |m| ((s.clone(), id.clone()), m)))
}

/// The replica graph of one layer: `(space, (replica, None))` for every replica `(v, c)`, `c` naming the component
/// of `v`'s ego network it stands for ([`super::ego_components`]; "" for a node without edges), and
/// `(space, (x, Some((y, weight))))` for the replica edges, both directions of each.
///
/// A stateful operator per space ([`Ego`] over interned slots): it keeps the adjacency with its weights and each
/// node's components, and for each epoch's edge changes recomputes the ego networks of the nodes they touch — the
/// endpoints, and the common neighbours of the endpoints, whose ego network gained or lost a link — and emits the
/// difference in replicas and replica edges. As a join this needs every wedge `(a, v, b)`, Σ deg² rows arranged in
/// memory (tens of millions at 100k chunks); here the state is the adjacency and the components, O(edges).
fn ego_replicas<'s, T>(nodes: Nodes<'s, T>, edges: Edges<'s, T>, pool: bool) -> VecCollection<'s, T, (Name, ReplicaRow)>
where
    T: Timestamp + Lattice + TotalOrder,
{
    let rows =
        nodes.map(|(s, v)| (s, EgoInput::Node(v))).concat(edges.map(|(s, u, v, w)| (s, EgoInput::Edge(u, v, w))));
    let mut spaces: HashMap<String, Ego> = HashMap::new();
    per_space_in_time_order(
        rows,
        "EgoReplicas",
        |(s, _)| s,
        move |space, rows| {
            let sp = Name::new(space);
            let ego = spaces.entry(space.to_string()).or_insert_with(|| Ego::new(pool));
            let changes = ego.apply(rows.into_iter().map(|((_, row), d)| (row, d)).collect());
            if ego.is_empty() {
                spaces.remove(space);
            }
            changes.into_iter().map(|(row, d)| ((sp.clone(), row), d)).collect()
        },
    )
}

/// Label propagation over one layer's replica graph, as a stateful operator per space ([`Lpa`]): it keeps the
/// replica graph and every round's labels, and each epoch recomputes, round by round, only the replicas whose edges
/// or whose neighbours' labels of the round before changed, emitting the difference in final labels. Unrolled into
/// `rounds` join + reduce stages of differential dataflow, the same computation kept 20 arrangements of labels and
/// votes per layer, and each changed vote reran a reduce over the replica's history of string-keyed rows.
///
/// Input: replicas `(space, r)` and directed replica edges `((space, x), (y, weight))`, both directions. Output
/// `((space, r), label)`, as [`super::reference::cluster_layer`] computes it, by label propagation or by
/// strongest-link groups ([`Lpa::components`]).
fn label_propagation<'s, T>(
    replicas: VecCollection<'s, T, (Name, Replica)>,
    radj: VecCollection<'s, T, ((Name, Replica), (Replica, u64))>,
    rule: Rule,
) -> VecCollection<'s, T, ((Name, Replica), Replica)>
where
    T: Timestamp + Lattice + TotalOrder,
{
    let rows = replicas.map(|(s, r)| (s, r, None)).concat(radj.map(|((s, x), (y, w))| (s, x, Some((y, w)))));
    let mut spaces: HashMap<String, Lpa> = HashMap::new();
    per_space_in_time_order(
        rows,
        "LabelPropagation",
        |(s, _, _)| s,
        move |space, rows| {
            let sp = Name::new(space);
            let lpa = spaces.entry(space.to_string()).or_insert_with(|| match rule {
                Rule::Propagate(rounds) => Lpa::new(rounds),
                Rule::Link(max) => Lpa::components(max),
            });
            let changes = lpa.apply(rows.into_iter().map(|((_, x, e), d)| ((x, e), d)).collect());
            if lpa.is_empty() {
                spaces.remove(space);
            }
            let mut out = Vec::new();
            for (r, old, new) in changes {
                if let Some(l) = old {
                    out.push((((sp.clone(), r.clone()), l), -1));
                }
                if let Some(l) = new {
                    out.push((((sp.clone(), r), l), 1));
                }
            }
            out
        },
    )
}

/// How a layer labels its replicas: label propagation for so many rounds, or strongest-link groups of at most so
/// many replicas.
#[derive(Clone, Copy)]
enum Rule {
    Propagate(usize),
    Link(usize),
}

/// The clusters of layer L, and layer L+1: its nodes (the clusters) and its edges (shared members, and layer-L edges
/// between members), each cluster keeping its `max_degree` strongest ([`super::strongest`]). All three only while
/// the layer shrinks (CAM's stop rule, per space: a layer that does not shrink by `min-shrink` ends the hierarchy).
/// A stateful operator per space ([`Layer`]) that applies the rule to the rows it holds; `below` is the number of
/// the layer's nodes.
#[allow(clippy::type_complexity)]
fn next_layer<'s, T>(
    edges: Edges<'s, T>,
    clusters: VecCollection<'s, T, ((Name, Name), Name)>,
    below: VecCollection<'s, T, (Name, isize)>,
    params: &HierarchyParams,
) -> (VecCollection<'s, T, (Name, Name, Name)>, Nodes<'s, T>, Edges<'s, T>)
where
    T: Timestamp + Lattice + TotalOrder,
{
    let rows = edges
        .map(|(s, u, v, _)| (s, LayerInput::Edge(u, v)))
        .concat(clusters.map(|((s, c), m)| (s, LayerInput::Member(c, m))))
        .concat(below.map(|(s, n)| (s, LayerInput::Below(n as u64))));
    let mut spaces: HashMap<String, Layer> = HashMap::new();
    let params = params.clone();
    let out = per_space_in_time_order(
        rows,
        "LayerLinks",
        |(s, _)| s,
        move |space, rows| {
            let sp = Name::new(space);
            let layer = spaces.entry(space.to_string()).or_insert_with(|| Layer::new(&params));
            let changes = layer.apply(rows.into_iter().map(|((_, row), d)| (row, d)).collect());
            if layer.is_empty() {
                spaces.remove(space);
            }
            changes.into_iter().map(|(row, d)| ((sp.clone(), row), d)).collect()
        },
    );
    let clusters = out.clone().flat_map(|(s, row)| match row {
        LayerOutput::Member(c, m) => Some((s, c, m)),
        _ => None,
    });
    let nodes = out.clone().flat_map(|(s, row)| match row {
        LayerOutput::Node(c) => Some((s, c)),
        _ => None,
    });
    let edges = out.flat_map(|(s, row)| match row {
        LayerOutput::Edge(a, b, w) => Some((s, a, b, w)),
        _ => None,
    });
    (clusters, nodes, edges)
}

/// A cluster's summary, or the request for one: `(space, layer, cluster, content hash, [(member, member text)])`.
pub type SummaryRequest = (Name, u32, Name, Name, Vec<(Name, Name)>);

pub struct Summaries<'s, T: Timestamp> {
    /// `((space, cluster), (layer, summary))`: the text every summarised cluster shows retrieval.
    pub texts: VecCollection<'s, T, ((Name, Name), (u32, Name))>,
    /// Clusters whose content has no summary yet: what the summariser works on (after its debounce).
    pub requests: VecCollection<'s, T, SummaryRequest>,
}

/// Joins clusters with the summaries of their content. A cluster's content is its members' ids and texts (chunk
/// texts at layer 1, the members' summaries above), hashed with [`crate::request::summary_key`]; `summaries` holds
/// `((space, content hash), summary)`, the logged responses. A cluster is requested only once every member has a
/// text, so layer L+1 waits for layer L; an unchanged cluster is never requested again, whatever else changes. A
/// cluster of one member above layer 1 is never requested: its text is its member's.
pub fn summaries<'s, T>(
    texts0: VecCollection<'s, T, ((Name, Name), Name)>,
    layers: &[VecCollection<'s, T, (Name, Name, Name)>],
    summaries: VecCollection<'s, T, ((Name, Name), Name)>,
) -> Summaries<'s, T>
where
    T: Timestamp + Lattice + TotalOrder,
{
    // One summary per content hash, whatever the log holds; arranged once, for every layer's join.
    let summaries = summaries
        .reduce(|_k, vals: &[(&Name, isize)], out: &mut Vec<(Name, isize)>| {
            if let Some((t, _)) = vals.iter().find(|(_, d)| *d > 0) {
                out.push(((*t).clone(), 1));
            }
        })
        .arrange_by_key();
    let mut below = texts0;
    let mut texts = Vec::new();
    let mut requests = Vec::new();
    for (i, clusters) in layers.iter().enumerate() {
        let layer = i as u32 + 1;
        let member_of = clusters.clone().map(|(s, c, m)| ((s, m), c));
        let with_text =
            member_of.clone().join_map(below, |(s, m), c, t| ((s.clone(), c.clone()), (m.clone(), Some(t.clone()))));
        // A cluster is content once every member has a text. Every layer-0 node has its text, so layer 1 needs no
        // row per member without one; above it a member (a cluster below) waits for its summary.
        let rows = if layer == 1 {
            with_text
        } else {
            member_of.clone().map(|((s, m), c)| ((s, c), (m, None::<Name>))).concat(with_text)
        };
        let content = rows
            .reduce(|_k, vals: &[(&(Name, Option<Name>), isize)], out: &mut Vec<((Name, Vec<(Name, Name)>), isize)>| {
                // Sorted by member, `None` before `Some`: each member must have a text.
                let mut members: Vec<(Name, Name)> = Vec::new();
                let mut ids = 0;
                let mut last: Option<&str> = None;
                for ((m, t), _) in vals {
                    if last != Some(m.as_str()) {
                        ids += 1;
                        last = Some(m);
                    }
                    if let Some(t) = t {
                        if members.last().is_none_or(|(pm, _)| pm != m) {
                            members.push((m.clone(), t.clone()));
                        }
                    }
                }
                if members.len() == ids {
                    let refs: Vec<(&str, &str)> = members.iter().map(|(m, t)| (m.as_str(), t.as_str())).collect();
                    out.push(((crate::request::summary_key(&refs).into(), members), 1));
                }
            })
            .map(|((s, c), (h, ms))| ((s, h), (c, ms)));
        // Above layer 1 a cluster of one member says what its member says: it takes the member's summary, with no
        // request (summarising one summary again only paraphrases it). Upper layers are full of them — a cluster
        // that nothing joined — and each would be a model call every time its member changed.
        let (content, single) = if layer >= 2 {
            let single = content.clone().flat_map(|((s, _h), (c, ms))| match ms.as_slice() {
                [(_, t)] => Some(((s, c), t.clone())),
                _ => None,
            });
            (content.filter(|(_, (_, ms))| ms.len() > 1), Some(single))
        } else {
            (content, None)
        };
        // Content with a summary takes it; content without one is requested. Both read one arrangement of the
        // content and the summaries' (a summary per key, so joining it is a semijoin).
        let arranged = content.clone().arrange_by_key();
        let mut summarized = arranged
            .clone()
            .join_core(summaries.clone(), |(s, _h), (c, _ms), t| Some(((s.clone(), c.clone()), t.clone())));
        if let Some(single) = single {
            summarized = summarized.concat(single);
        }
        let answered = arranged.join_core(summaries.clone(), |k, v, _t| Some((k.clone(), v.clone())));
        requests.push(content.concat(answered.negate()).map(move |((s, h), (c, ms))| (s, layer, c, h, ms)));
        texts.push(summarized.clone().map(move |(k, t)| (k, (layer, t))));
        below = summarized;
    }
    let scope = summaries.stream.scope();
    Summaries {
        texts: differential_dataflow::collection::concatenate(scope, texts),
        requests: differential_dataflow::collection::concatenate(scope, requests),
    }
}
