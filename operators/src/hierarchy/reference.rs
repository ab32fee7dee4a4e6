//! The hierarchy as a plain sequential program over one space's graph: the specification the dataflow is held to,
//! and the from-scratch rebuild `engram bench hierarchy` measures against.

use std::collections::{BTreeMap, BTreeSet};

use super::{
    active, cluster_ids, ego_components, find_root, label_parts, link_groups, link_weight, next_label, replica_hash,
    strongest, strongest_link, HierarchyParams, Replica,
};
use crate::name::Name;

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
        let next = next_layer(&graph, &clusters, params.max_degree);
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
        // Above the replica layers a node is one replica, `(v, "")`, whatever its ego network.
        if !params.splits(layer) {
            comp.extend(nbrs.keys().map(|a| ((*v, *a), "")));
            continue;
        }
        let links = nbrs.keys().flat_map(|a| {
            adj.get(a)
                .into_iter()
                .flat_map(move |an| an.keys().filter(|b| nbrs.contains_key(*b)).map(move |b| (*a, *b)))
        });
        for (a, c) in ego_components(nbrs.keys().copied(), links, params.pool_loose_neighbours) {
            comp.insert((v, a), c);
        }
    }
    let mut replicas: BTreeSet<Replica> = comp.iter().map(|((v, _), c)| (Name::new(v), Name::new(c))).collect();
    for n in &g.nodes {
        if !adj.contains_key(n.as_str()) {
            replicas.insert((Name::new(n), Name::default()));
        }
    }
    // Replica graph, both directions.
    let mut radj: BTreeMap<Replica, Vec<(Replica, u64)>> = BTreeMap::new();
    for (u, nbrs) in &adj {
        for (v, w) in nbrs {
            let ru = (Name::new(u), Name::new(comp[&(*u, *v)]));
            let rv = (Name::new(v), Name::new(comp[&(*v, *u)]));
            radj.entry(ru).or_default().push((rv, *w));
        }
    }
    let (mut labels, rounds) = if params.propagates(layer) {
        (replicas.iter().map(|r| (r.clone(), r.clone())).collect(), params.lpa_rounds)
    } else {
        (strongest_link_groups(&replicas, &radj, params.max_cluster_size), 0)
    };
    for round in 0..rounds {
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
    let mut by_label: BTreeMap<&Replica, Vec<&Replica>> = BTreeMap::new();
    for (r, l) in &labels {
        by_label.entry(l).or_default().push(r);
    }
    // Member set → the smallest anchor: identical member sets are one cluster; then by anchor, ranked by members.
    let head = !params.propagates(layer);
    let mut sets: BTreeMap<Vec<&str>, &str> = BTreeMap::new();
    for (label, replicas) in by_label {
        for (anchor, part) in label_parts(label, &replicas, params.max_cluster_size, head) {
            let a = sets.entry(part).or_insert(anchor);
            *a = anchor.min(*a);
        }
    }
    let mut by_anchor: BTreeMap<&str, Vec<Vec<&str>>> = BTreeMap::new();
    for (members, anchor) in sets {
        by_anchor.entry(anchor).or_default().push(members);
    }
    let mut out = Clusters::new();
    for (anchor, sets) in by_anchor {
        for (id, ms) in cluster_ids(layer, anchor, sets.len()).into_iter().zip(sets) {
            out.insert(id.into(), ms.into_iter().map(str::to_string).collect());
        }
    }
    out
}

/// Each replica's label under strongest-link groups: the head of its group in its component of strongest links
/// ([`link_groups`]).
fn strongest_link_groups(
    replicas: &BTreeSet<Replica>,
    radj: &BTreeMap<Replica, Vec<(Replica, u64)>>,
    max: usize,
) -> BTreeMap<Replica, Replica> {
    let names: Vec<&Replica> = replicas.iter().collect();
    let index: BTreeMap<&Replica, usize> = names.iter().copied().zip(0..).collect();
    let mut link: Vec<Option<(usize, u128)>> = vec![None; names.len()];
    let mut parent: Vec<usize> = (0..names.len()).collect();
    for (r, links) in radj {
        let mut links: Vec<(&Replica, u128)> = links.iter().map(|(y, w)| (y, *w as u128)).collect();
        links.sort();
        if let Some((y, w)) = strongest_link(links.into_iter()) {
            link[index[r]] = Some((index[y], w));
            let (a, b) = (find_root(&mut parent, index[r]), find_root(&mut parent, index[y]));
            parent[a.max(b)] = a.min(b);
        }
    }
    let mut comps: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for i in 0..names.len() {
        comps.entry(find_root(&mut parent, i)).or_default().push(i);
    }
    let mut out = BTreeMap::new();
    for members in comps.into_values() {
        // Members are in replica order; links as indices among them.
        let at: BTreeMap<usize, usize> = members.iter().zip(0..).map(|(m, i)| (*m, i)).collect();
        let links: Vec<Option<(usize, u128)>> = members.iter().map(|m| link[*m].map(|(y, w)| (at[&y], w))).collect();
        let hashes: Vec<u64> = members.iter().map(|m| replica_hash(names[*m])).collect();
        for (i, g) in link_groups(&links, &hashes, max).into_iter().enumerate() {
            out.insert(names[members[i]].clone(), names[members[g]].clone());
        }
    }
    out
}

/// The graph of the next layer: clusters linked by shared members and by edges between their members (weight: the
/// number of such links), each cluster keeping its `max_degree` strongest links ([`strongest`]).
pub fn next_layer(g: &Graph, clusters: &Clusters, max_degree: usize) -> Graph {
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
    for w in edges.values_mut() {
        *w = link_weight(*w);
    }
    let mut links: BTreeMap<&str, Vec<(u64, &str)>> = BTreeMap::new();
    for ((a, b), w) in &edges {
        links.entry(a).or_default().push((*w, b));
        links.entry(b).or_default().push((*w, a));
    }
    let mut kept: BTreeSet<(String, String)> = BTreeSet::new();
    for (a, ls) in &links {
        for b in strongest(ls.iter().copied(), max_degree) {
            kept.insert(if *a < b { (a.to_string(), b.to_string()) } else { (b.to_string(), a.to_string()) });
        }
    }
    let edges = edges.into_iter().filter(|(k, _)| kept.contains(k)).collect();
    Graph { nodes: clusters.keys().cloned().collect(), edges }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(edges: &[(&str, &str)], extra: &[&str]) -> Graph {
        let mut g = Graph::default();
        for (u, v) in edges {
            g.nodes.insert(u.to_string());
            g.nodes.insert(v.to_string());
            let k = if u < v { (u.to_string(), v.to_string()) } else { (v.to_string(), u.to_string()) };
            g.edges.insert(k, 1);
        }
        g.nodes.extend(extra.iter().map(|n| n.to_string()));
        g
    }

    #[test]
    fn a_cluster_keeps_its_id_while_its_smallest_member_stays() {
        let p = HierarchyParams::default();
        let clique = |ns: &[&'static str]| -> Vec<(&'static str, &'static str)> {
            ns.iter().enumerate().flat_map(|(i, a)| ns[i + 1..].iter().map(move |b| (*a, *b))).collect()
        };
        let before = cluster_layer(1, &graph(&clique(&["b", "c", "d", "e"]), &["z"]), &p);
        let after = cluster_layer(1, &graph(&clique(&["b", "c", "d", "e", "f"]), &["z"]), &p);
        let id = |cs: &Clusters, m: &str| cs.iter().find(|(_, ms)| ms.contains(m)).map(|(c, _)| c.clone()).unwrap();
        assert_eq!(before.len(), 2, "{before:?}");
        assert_eq!(after[&id(&after, "b")].len(), 5, "{after:?}");
        assert_eq!(id(&before, "b"), id(&after, "b"), "a new member larger than the smallest keeps the id");
        assert_eq!(id(&before, "z"), id(&after, "z"), "an untouched cluster keeps its id");
        let smaller = cluster_layer(1, &graph(&clique(&["a", "b", "c", "d", "e"]), &["z"]), &p);
        assert_ne!(id(&before, "b"), id(&smaller, "b"), "a new smallest member renames the cluster");
    }
}
