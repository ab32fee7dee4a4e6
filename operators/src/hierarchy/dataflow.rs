//! The hierarchy as differential dataflow: every step of [`super`] is a collection, so inserting or deleting a
//! layer-0 node or edge updates exactly the ego networks, replicas, labels, clusters and upper layers it affects.
//! Label propagation is unrolled into `lpa-rounds` join/reduce rounds and the layers into `max-layers` stages; each
//! is incremental on its own.

use differential_dataflow::lattice::Lattice;
use differential_dataflow::VecCollection;
use timely::order::TotalOrder;
use timely::progress::Timestamp;

use super::{choose_label, cluster_id, ego_components, split_part, HierarchyParams, Replica};

/// `(space, node)`.
pub type Nodes<'s, T> = VecCollection<'s, T, (String, String)>;
/// `(space, u, v, weight)`, undirected, `u < v`.
pub type Edges<'s, T> = VecCollection<'s, T, (String, String, String, u64)>;

pub struct Hierarchy<'s, T: Timestamp> {
    /// `(space, layer, cluster, member)`: the clusters of every layer ≥ 1 and their members (nodes of the layer
    /// below).
    pub clusters: VecCollection<'s, T, (String, u32, String, String)>,
    /// `(space, layer, u, v, weight)`: the graph of every layer ≥ 1.
    pub edges: VecCollection<'s, T, (String, u32, String, String, u64)>,
}

pub fn hierarchy<'s, T>(nodes: Nodes<'s, T>, edges: Edges<'s, T>, params: &HierarchyParams) -> Hierarchy<'s, T>
where
    T: Timestamp + Lattice + TotalOrder,
{
    let mut all_clusters = Vec::new();
    let mut all_edges = Vec::new();
    let (mut nodes, mut edges) = (nodes, edges);
    for layer in 1..=params.max_layers as u32 {
        let clusters = cluster_layer(layer, nodes.clone(), edges.clone(), params);
        let (next_nodes, next_edges) = next_layer(edges.clone(), clusters.clone());
        // CAM's stop rule, per space: a layer that does not shrink ends the hierarchy.
        let below = nodes.map(|(s, _)| s).count();
        let above = next_nodes.clone().map(|(s, _)| s).count();
        let shrinks = below.join_map(above, |s, b, a| (s.clone(), a < b)).filter(|(_, ok)| *ok).map(|(s, _)| s);
        let clusters = clusters
            .map(|((s, c), m)| (s, (c, m)))
            .semijoin(shrinks.clone())
            .map(move |(s, (c, m))| (s, layer, c, m));
        nodes = next_nodes.map(|(s, c)| (s, c)).semijoin(shrinks.clone()).map(|(s, c)| (s, c));
        edges = next_edges.map(|(s, u, v, w)| (s, (u, v, w))).semijoin(shrinks).map(|(s, (u, v, w))| (s, u, v, w));
        all_clusters.push(clusters);
        all_edges.push(edges.clone().map(move |(s, u, v, w)| (s, layer, u, v, w)));
    }
    let scope = nodes.scope();
    Hierarchy {
        clusters: differential_dataflow::collection::concatenate(scope.clone(), all_clusters),
        edges: differential_dataflow::collection::concatenate(scope, all_edges),
    }
}

/// Ego networks → replicas → label propagation → clusters, for one layer. Output `((space, cluster), member)`.
fn cluster_layer<'s, T>(
    layer: u32,
    nodes: Nodes<'s, T>,
    edges: Edges<'s, T>,
    params: &HierarchyParams,
) -> VecCollection<'s, T, ((String, String), String)>
where
    T: Timestamp + Lattice + TotalOrder,
{
    // Directed adjacency ((s, a), (b, w)), both directions.
    let adj = edges.flat_map(|(s, u, v, w)| [((s.clone(), u.clone()), (v.clone(), w)), ((s, v), (u, w))]);
    let pairs = adj.clone().map(|((s, a), (b, _))| ((s, a), b));
    // Links inside ego networks: a triangle (v, a, b) is a link a–b in v's ego network.
    let wedges = pairs
        .clone()
        .join_map(pairs.clone(), |(s, a), v, b| ((s.clone(), v.clone(), b.clone()), a.clone()))
        .filter(|((_, v, b), _)| v != b);
    let adjacent = pairs.clone().map(|((s, a), b)| (s, a, b));
    let links = wedges
        .semijoin(adjacent)
        .map(|((s, v, b), a)| ((s, v), (a, Some(b))));
    let neighbours = pairs.clone().map(|((s, v), a)| ((s, v), (a, None::<String>)));
    // comp: ((s, v, a), component of v's ego network holding a).
    let comp = neighbours
        .concat(links)
        .reduce(|_key, vals: &[(&(String, Option<String>), isize)], out: &mut Vec<((String, String), isize)>| {
            let nbrs = vals.iter().filter(|(v, _)| v.1.is_none()).map(|(v, _)| v.0.as_str());
            let links = vals.iter().filter_map(|(v, _)| v.1.as_deref().map(|b| (v.0.as_str(), b)));
            for (a, c) in ego_components(nbrs, links) {
                out.push(((a.to_string(), c.to_string()), 1));
            }
        })
        .map(|((s, v), (a, c))| ((s, v, a), c));
    // Replica edges: (u, comp(u, v)) — (v, comp(v, u)).
    let radj = adj
        .map(|((s, u), (v, w))| ((s, u, v), w))
        .join_map(comp.clone(), |(s, u, v), w, cu| ((s.clone(), v.clone(), u.clone()), (cu.clone(), *w)))
        .join_map(comp.clone(), |(s, v, u), (cu, w), cv| {
            ((s.clone(), (u.clone(), cu.clone())), ((v.clone(), cv.clone()), *w))
        });
    let with_edges = adj_keys(pairs);
    let isolated = nodes
        .map(|(s, v)| ((s, v), ()))
        .antijoin(with_edges)
        .map(|((s, v), ())| (s, (v, String::new())));
    let replicas = comp.map(|((s, v, _), c)| (s, (v, c))).distinct().concat(isolated);
    // Each replica's self-vote weight: its strongest edge (0 when isolated).
    let self_w = replicas
        .clone()
        .map(|r| (r, 0u64))
        .concat(radj.clone().map(|(x, (_, w))| (x, w)))
        .reduce(|_x, vals: &[(&u64, isize)], out: &mut Vec<(u64, isize)>| {
            out.push((*vals.iter().map(|(w, _)| *w).max().expect("non-empty"), 1));
        });
    let radj = radj.arrange_by_key();
    let self_w = self_w.arrange_by_key();
    let mut labels = replicas.map(|(s, r)| ((s, r.clone()), r));
    for _ in 0..params.lpa_rounds {
        let lab = labels.arrange_by_key();
        let votes = radj
            .clone()
            .join_core(lab.clone(), |(s, _x), (y, w), l| {
                Some(((s.clone(), y.clone()), (l.clone(), super::NEIGHBOUR_VOTE * *w as u128)))
            })
            .concat(lab.join_core(self_w.clone(), |k, l, w| Some((k.clone(), (l.clone(), *w as u128)))));
        labels = votes.reduce(|_x, vals: &[(&(Replica, u128), isize)], out: &mut Vec<(Replica, isize)>| {
            let weighted = vals.iter().map(|((l, w), d)| (l, *w * (*d).max(0) as u128));
            out.push((choose_label(weighted).expect("a replica votes for itself").clone(), 1));
        });
    }
    let max = params.max_cluster_size;
    labels
        .map(|((s, r), l)| ((s, l), r.0))
        .reduce(move |(_s, l): &(String, Replica), members: &[(&String, isize)], out: &mut Vec<((String, String), isize)>| {
            let n = members.len();
            for (i, (m, _)) in members.iter().enumerate() {
                out.push(((cluster_id(layer, l, split_part(i, n, max)), (*m).clone()), 1));
            }
        })
        .map(|((s, _l), (c, m))| ((s, c), m))
}

fn adj_keys<'s, T>(pairs: VecCollection<'s, T, ((String, String), String)>) -> VecCollection<'s, T, (String, String)>
where
    T: Timestamp + Lattice + TotalOrder,
{
    pairs.map(|(k, _)| k).distinct()
}

/// Layer L+1: its nodes (the clusters) and its edges (shared members, and layer-L edges between members).
fn next_layer<'s, T>(
    edges: Edges<'s, T>,
    clusters: VecCollection<'s, T, ((String, String), String)>,
) -> (Nodes<'s, T>, Edges<'s, T>)
where
    T: Timestamp + Lattice + TotalOrder,
{
    let nodes = clusters.clone().map(|(k, _)| k).distinct();
    let member_of = clusters.map(|((s, c), m)| ((s, m), c));
    let shared = member_of
        .clone()
        .join_map(member_of.clone(), |(s, _m), a, b| (s.clone(), a.clone(), b.clone()))
        .filter(|(_, a, b)| a < b);
    let joined = edges
        .map(|(s, u, v, _)| ((s, u), v))
        .join_map(member_of.clone(), |(s, _u), v, a| ((s.clone(), v.clone()), a.clone()))
        .join_map(member_of, |(s, _v), a, b| {
            if a < b {
                (s.clone(), a.clone(), b.clone())
            } else {
                (s.clone(), b.clone(), a.clone())
            }
        })
        .filter(|(_, a, b)| a != b);
    let edges = shared.concat(joined).count().map(|((s, a, b), n)| (s, a, b, n as u64));
    (nodes, edges)
}
