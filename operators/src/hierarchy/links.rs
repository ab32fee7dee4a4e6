//! The graph of the layer above, kept incrementally per space: two clusters are linked once for every member they
//! share and once for every edge between their members (in each direction), a link weighs [`link_weight`] of that
//! count, each cluster keeps its `max-degree` heaviest links ([`strongest`]) and a link is an edge when either end
//! keeps it — [`super::reference::next_layer`], over integer slots.
//!
//! As joins (members × members, edges × members × members, a count, a top-k reduce and a distinct) the same
//! computation kept eight arrangements of string tuples per layer, and every changed link reran its cluster's
//! reduce over its history. Here the state is the layer's adjacency, the membership both ways, each cluster's link
//! counts and the links it keeps; an epoch recounts only the clusters whose members or whose members' edges changed,
//! re-picks the kept links of the clusters whose counts changed, and emits the difference in edges.

use std::collections::BTreeSet;

use super::slots::{bump, HashMap, HashSet, Slots};
use super::{link_weight, strongest};

/// One space's layer-above graph.
#[derive(Default)]
pub struct Links {
    max_degree: usize,
    /// Nodes of the layer below (members), with their adjacency (both directions, with the multiplicity of the
    /// edge rows) and the clusters that hold them.
    nodes: Slots<String>,
    adj: Vec<HashMap<u32, isize>>,
    of: Vec<HashMap<u32, isize>>,
    /// Clusters, with their members, their link counts (symmetric) and the links they keep.
    clusters: Slots<String>,
    has: Vec<HashMap<u32, isize>>,
    counts: Vec<HashMap<u32, u64>>,
    kept: Vec<Vec<u32>>,
    /// The edges emitted: `(a, b)` with `a`'s id below `b`'s → weight.
    emitted: HashMap<(u32, u32), u64>,
}

/// A change of the input: a layer-below edge `(false, u, v)` or a membership `(true, cluster, member)`.
pub type LinkRow = (bool, String, String);

/// An edge of the layer above: `(a, b, weight)`, `a < b`.
pub type LinkEdge = (String, String, u64);

impl Links {
    pub fn new(max_degree: usize) -> Self {
        Links { max_degree, ..Links::default() }
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty() && self.clusters.is_empty()
    }

    fn node(&mut self, n: &str) -> u32 {
        let (s, new) = self.nodes.intern(n);
        if new {
            self.adj.push(HashMap::default());
            self.of.push(HashMap::default());
        }
        s
    }

    fn cluster(&mut self, c: &str) -> u32 {
        let (s, new) = self.clusters.intern(c);
        if new {
            self.has.push(HashMap::default());
            self.counts.push(HashMap::default());
            self.kept.push(Vec::new());
        }
        s
    }

    /// Applies one epoch's changes; returns the changes of the layer-above edges.
    pub fn apply(&mut self, changes: Vec<(LinkRow, isize)>) -> Vec<(LinkEdge, isize)> {
        let mut touched: BTreeSet<u32> = BTreeSet::new();
        let mut nodes_touched: Vec<u32> = Vec::new();
        let mut changed_edges: Vec<(u32, u32)> = Vec::new();
        for ((member, x, y), d) in changes {
            if member {
                let (c, m) = (self.cluster(&x), self.node(&y));
                bump(&mut self.has[c as usize], m, d);
                bump(&mut self.of[m as usize], c, d);
                touched.insert(c);
                nodes_touched.push(m);
            } else {
                let (u, v) = (self.node(&x), self.node(&y));
                bump(&mut self.adj[u as usize], v, d);
                bump(&mut self.adj[v as usize], u, d);
                changed_edges.push((u, v));
                nodes_touched.extend([u, v]);
            }
        }
        // A changed edge (u, v) changes the counts of the pairs (a cluster of u, a cluster of v): recounting the
        // clusters of u settles them all (a cluster u left in this epoch is touched by its membership change).
        for (u, _) in changed_edges {
            touched.extend(self.of[u as usize].keys().copied());
        }
        // Recount the touched clusters' links; a changed count changes both ends' link lists.
        let mut dirty: BTreeSet<u32> = BTreeSet::new();
        for &c in &touched {
            let mut row: HashMap<u32, i64> = HashMap::default();
            for (&m, &dm) in &self.has[c as usize] {
                for (&b, &db) in &self.of[m as usize] {
                    if b != c {
                        *row.entry(b).or_default() += (dm * db) as i64;
                    }
                }
                for (&x, &dx) in &self.adj[m as usize] {
                    for (&b, &db) in &self.of[x as usize] {
                        if b != c {
                            *row.entry(b).or_default() += (dm * dx * db) as i64;
                        }
                    }
                }
            }
            let old: Vec<u32> = self.counts[c as usize].keys().copied().collect();
            let mut changed: Vec<(u32, u64)> = Vec::new();
            for b in old.into_iter().chain(row.keys().copied()) {
                let new = row.get(&b).copied().unwrap_or(0).max(0) as u64;
                let was = self.counts[c as usize].get(&b).copied().unwrap_or(0);
                if new != was && !changed.iter().any(|(x, _)| *x == b) {
                    changed.push((b, new));
                }
            }
            for (b, n) in changed {
                for (p, q) in [(c, b), (b, c)] {
                    if n == 0 {
                        self.counts[p as usize].remove(&q);
                    } else {
                        self.counts[p as usize].insert(q, n);
                    }
                }
                dirty.extend([c, b]);
            }
        }
        // Re-pick the kept links of the clusters whose counts changed, then settle every pair they kept or keep.
        let mut pairs: HashSet<(u32, u32)> = HashSet::default();
        for &c in &dirty {
            let new: Vec<u32> = {
                let clusters = &self.clusters;
                let links = self.counts[c as usize].iter().map(|(&b, &n)| (link_weight(n), b));
                let named: Vec<(u64, &str)> = links.map(|(w, b)| (w, clusters.key(b).as_str())).collect();
                let keep: Vec<&str> = strongest(named.into_iter(), self.max_degree);
                keep.into_iter().map(|k| clusters.get(k).expect("a linked cluster holds a slot")).collect()
            };
            let old = std::mem::replace(&mut self.kept[c as usize], new);
            for b in old.into_iter().chain(self.kept[c as usize].iter().copied()) {
                pairs.insert(self.ordered(c, b));
            }
        }
        let mut out = Vec::new();
        for (a, b) in pairs {
            let keeps = self.kept[a as usize].contains(&b) || self.kept[b as usize].contains(&a);
            let now = keeps.then(|| self.counts[a as usize].get(&b).copied()).flatten().map(link_weight);
            let before = self.emitted.get(&(a, b)).copied();
            if now == before {
                continue;
            }
            let (ka, kb) = (self.clusters.key(a).clone(), self.clusters.key(b).clone());
            if let Some(w) = before {
                out.push(((ka.clone(), kb.clone(), w), -1));
                self.emitted.remove(&(a, b));
            }
            if let Some(w) = now {
                out.push(((ka, kb, w), 1));
                self.emitted.insert((a, b), w);
            }
        }
        // Release what holds nothing any more.
        for c in touched.into_iter().chain(dirty) {
            if self.clusters.holds(c) && self.has[c as usize].is_empty() && self.counts[c as usize].is_empty() {
                self.kept[c as usize].clear();
                self.clusters.release(c);
            }
        }
        for n in nodes_touched {
            if self.nodes.holds(n) && self.adj[n as usize].is_empty() && self.of[n as usize].is_empty() {
                self.nodes.release(n);
            }
        }
        out
    }

    /// A pair of cluster slots, the smaller id first.
    fn ordered(&self, a: u32, b: u32) -> (u32, u32) {
        if self.clusters.key(a) < self.clusters.key(b) {
            (a, b)
        } else {
            (b, a)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::hierarchy::reference::{next_layer, Clusters, Graph};

    /// Seeded random edge and membership inserts and deletes (clusters emptied and refilled, weight changes as a
    /// retraction and an insert of the same pair): after every batch the emitted edges equal
    /// [`next_layer`] over the whole input.
    #[test]
    fn incremental_links_equal_the_reference_rule() {
        for seed in 0..12 {
            let mut rng = StdRng::seed_from_u64(seed);
            let max_degree = [1, 2, 3, 1000][seed as usize % 4];
            let mut links = Links::new(max_degree);
            let mut edges: BTreeSet<(String, String)> = BTreeSet::new();
            let mut members: BTreeSet<(String, String)> = BTreeSet::new();
            let mut emitted: BTreeMap<(String, String), u64> = BTreeMap::new();
            for _ in 0..40 {
                let mut batch = Vec::new();
                for _ in 0..rng.gen_range(1..12) {
                    if rng.gen_bool(0.5) {
                        let (a, b) = (rng.gen_range(0..30), rng.gen_range(0..30));
                        if a == b {
                            continue;
                        }
                        let (u, v) = (format!("n{:02}", a.min(b)), format!("n{:02}", a.max(b)));
                        if edges.remove(&(u.clone(), v.clone())) {
                            batch.push(((false, u.clone(), v.clone()), -1));
                            if rng.gen_bool(0.3) {
                                edges.insert((u.clone(), v.clone()));
                                batch.push(((false, u, v), 1));
                            }
                        } else {
                            edges.insert((u.clone(), v.clone()));
                            batch.push(((false, u, v), 1));
                        }
                    } else {
                        let (c, m) = (format!("L1:c{}", rng.gen_range(0..10)), format!("n{:02}", rng.gen_range(0..30)));
                        if members.remove(&(c.clone(), m.clone())) {
                            batch.push(((true, c, m), -1));
                        } else {
                            members.insert((c.clone(), m.clone()));
                            batch.push(((true, c, m), 1));
                        }
                    }
                }
                for ((a, b, w), d) in links.apply(batch) {
                    assert!(a < b, "{a} < {b}");
                    if d < 0 {
                        assert_eq!(emitted.remove(&(a.clone(), b.clone())), Some(w), "retracted what was emitted");
                    } else {
                        assert_eq!(emitted.insert((a, b), w), None, "inserted twice");
                    }
                }
                let g = Graph { nodes: BTreeSet::new(), edges: edges.iter().map(|e| (e.clone(), 1)).collect() };
                let mut clusters: Clusters = BTreeMap::new();
                for (c, m) in &members {
                    clusters.entry(c.clone()).or_default().insert(m.clone());
                }
                assert_eq!(emitted, next_layer(&g, &clusters, max_degree).edges, "seed {seed}");
            }
            if members.is_empty() && edges.is_empty() {
                assert!(links.is_empty());
            }
        }
    }
}
