//! The hierarchy as a plain sequential program over one space's graph: the specification the dataflow is held to,
//! and the from-scratch rebuild `engram bench hierarchy` measures against.

use std::collections::{BTreeMap, BTreeSet};

use super::{active, cluster_id, ego_components, next_label, parts, HierarchyParams, Replica};

/// One layer's graph: nodes and undirected weighted edges `(u, v) → w` with `u < v`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Graph {
    pub nodes: BTreeSet<String>,
    pub edges: BTreeMap<(String, String), u64>,
}

/// Clusters of one layer: cluster id → members (nodes of the layer below).
pub type Clusters = BTreeMap<String, BTreeSet<String>>;

/// Every layer's clusters: `result[i]` holds the clusters of layer `i + 1`.
pub fn build(layer0: &Graph, params: &HierarchyParams) -> Vec<Clusters> {
    let mut out = Vec::new();
    let mut graph = layer0.clone();
    for layer in 1..=params.max_layers as u32 {
        let clusters = cluster_layer(layer, &graph, params);
        let next = next_layer(&graph, &clusters);
        if !params.keeps(graph.nodes.len(), next.nodes.len()) {
            break;
        }
        out.push(clusters);
        graph = next;
    }
    out
}

/// Label propagation over the replica graph of one layer, then clusters with splits.
pub fn cluster_layer(layer: u32, g: &Graph, params: &HierarchyParams) -> Clusters {
    let mut adj: BTreeMap<&str, BTreeMap<&str, u64>> = BTreeMap::new();
    for ((u, v), w) in &g.edges {
        adj.entry(u).or_default().insert(v, *w);
        adj.entry(v).or_default().insert(u, *w);
    }
    // Ego components: comp[(v, a)] = the component of v's ego network holding neighbour a.
    let mut comp: BTreeMap<(&str, &str), &str> = BTreeMap::new();
    for (v, nbrs) in &adj {
        let links = nbrs.keys().flat_map(|a| {
            adj.get(a).into_iter().flat_map(move |an| an.keys().filter(|b| nbrs.contains_key(*b)).map(move |b| (*a, *b)))
        });
        for (a, c) in ego_components(nbrs.keys().copied(), links) {
            comp.insert((v, a), c);
        }
    }
    let mut replicas: BTreeSet<Replica> = comp.iter().map(|((v, _), c)| (v.to_string(), c.to_string())).collect();
    for n in &g.nodes {
        if !adj.contains_key(n.as_str()) {
            replicas.insert((n.clone(), String::new()));
        }
    }
    // Replica graph, both directions.
    let mut radj: BTreeMap<Replica, Vec<(Replica, u64)>> = BTreeMap::new();
    for (u, nbrs) in &adj {
        for (v, w) in nbrs {
            let ru = (u.to_string(), comp[&(*u, *v)].to_string());
            let rv = (v.to_string(), comp[&(*v, *u)].to_string());
            radj.entry(ru).or_default().push((rv, *w));
        }
    }
    let mut labels: BTreeMap<Replica, Replica> = replicas.iter().map(|r| (r.clone(), r.clone())).collect();
    for round in 0..params.lpa_rounds {
        let mut next = BTreeMap::new();
        for r in &replicas {
            let mut votes: Vec<(&Replica, u128)> =
                radj.get(r).into_iter().flatten().map(|(y, w)| (&labels[y], *w as u128)).collect();
            votes.sort();
            let l = next_label(&labels[r], votes.into_iter(), active(r, round)).clone();
            next.insert(r.clone(), l);
        }
        labels = next;
    }
    let mut by_label: BTreeMap<&Replica, BTreeSet<&str>> = BTreeMap::new();
    for (r, l) in &labels {
        by_label.entry(l).or_default().insert(&r.0);
    }
    let mut clusters = Clusters::new();
    for members in by_label.into_values() {
        let ms: Vec<&str> = members.into_iter().collect();
        for part in parts(&ms, params.max_cluster_size) {
            let id = cluster_id(layer, part.iter().copied());
            clusters.entry(id).or_default().extend(part.iter().map(|m| m.to_string()));
        }
    }
    clusters
}

/// The graph of the next layer: clusters linked by shared members and by edges between their members.
pub fn next_layer(g: &Graph, clusters: &Clusters) -> Graph {
    let mut member_of: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (c, ms) in clusters {
        for m in ms {
            member_of.entry(m).or_default().push(c);
        }
    }
    let mut edges: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut link = |a: &str, b: &str| {
        if a != b {
            let k = if a < b { (a.to_string(), b.to_string()) } else { (b.to_string(), a.to_string()) };
            *edges.entry(k).or_default() += 1;
        }
    };
    for cs in member_of.values() {
        for (i, a) in cs.iter().enumerate() {
            for b in &cs[i + 1..] {
                link(a, b);
            }
        }
    }
    for (u, v) in g.edges.keys() {
        for a in member_of.get(u.as_str()).into_iter().flatten() {
            for b in member_of.get(v.as_str()).into_iter().flatten() {
                link(a, b);
            }
        }
    }
    Graph { nodes: clusters.keys().cloned().collect(), edges }
}
