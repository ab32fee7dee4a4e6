//! The graph of the layer above, kept incrementally per space: two clusters are linked once for every member they
//! share and once for every edge between their members (in each direction), a link weighs [`link_weight`] of that
//! count, each cluster keeps its `max-degree` heaviest links ([`super::strongest`]) and a link is an edge when either end
//! keeps it — [`super::reference::next_layer`], over integer slots.
//!
//! As joins (members × members, edges × members × members, a count, a top-k reduce and a distinct) the same
//! computation kept eight arrangements of string tuples per layer, and every changed link reran its cluster's
//! reduce over its history. Here the state is the layer's adjacency, the membership both ways, each cluster's link
//! counts and the links it keeps; an epoch recounts only the clusters whose members or whose members' edges changed,
//! re-picks the kept links of the clusters whose counts changed, and emits the difference in edges.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::{keep_strongest, link_weight, HierarchyParams};
use crate::name::Name;
use crate::slots::{bump, HashMap, HashSet, Multiplicities, SlotMap, Slots};

/// One space's layer-above graph.
#[derive(Default)]
pub struct Links {
    max_degree: usize,
    /// Nodes of the layer below (members), with their adjacency (both directions, with the multiplicity of the
    /// edge rows) and the clusters that hold them.
    nodes: Slots<Name>,
    adj: Vec<Multiplicities>,
    of: Vec<Multiplicities>,
    /// Clusters, with their members, their link counts (symmetric) and the links they keep.
    clusters: Slots<Name>,
    has: Vec<Multiplicities>,
    /// Link counts, saturating at `u32::MAX` (a count is a sum over two clusters' member pairs).
    counts: Vec<SlotMap<u32>>,
    kept: Vec<Vec<u32>>,
    /// The edges emitted: `(a, b)` with `a`'s id below `b`'s → weight.
    emitted: HashMap<(u32, u32), u64>,
}

/// A change of the input: a layer-below edge `(false, u, v)` or a membership `(true, cluster, member)`.
pub type LinkRow = (bool, Name, Name);

/// An edge of the layer above: `(a, b, weight)`, `a < b`.
pub type LinkEdge = (Name, Name, u64);

impl Links {
    pub fn new(max_degree: usize) -> Self {
        Links { max_degree, ..Links::default() }
    }

    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty() && self.clusters.is_empty()
    }

    fn node(&mut self, n: &Name) -> u32 {
        let (s, new) = self.nodes.intern(n);
        if new {
            self.adj.push(Multiplicities::default());
            self.of.push(Multiplicities::default());
        }
        s
    }

    fn cluster(&mut self, c: &Name) -> u32 {
        let (s, new) = self.clusters.intern(c);
        if new {
            self.has.push(Multiplicities::default());
            self.counts.push(SlotMap::default());
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
            touched.extend(self.of[u as usize].keys());
        }
        // Recount the touched clusters' links; a changed count changes both ends' link lists.
        let mut dirty: BTreeSet<u32> = BTreeSet::new();
        for &c in &touched {
            let mut row: HashMap<u32, i64> = HashMap::default();
            for (m, dm) in self.has[c as usize].iter() {
                for (b, db) in self.of[m as usize].iter() {
                    if b != c {
                        *row.entry(b).or_default() += i64::from(dm) * i64::from(db);
                    }
                }
                for (x, dx) in self.adj[m as usize].iter() {
                    for (b, db) in self.of[x as usize].iter() {
                        if b != c {
                            *row.entry(b).or_default() += i64::from(dm) * i64::from(dx) * i64::from(db);
                        }
                    }
                }
            }
            let old: Vec<u32> = self.counts[c as usize].keys().collect();
            let mut changed: Vec<(u32, u64)> = Vec::new();
            for b in old.into_iter().chain(row.keys().copied()) {
                let new = row.get(&b).copied().unwrap_or(0).max(0) as u64;
                let was = self.counts[c as usize].get(b).map_or(0, u64::from);
                if new != was && !changed.iter().any(|(x, _)| *x == b) {
                    changed.push((b, new));
                }
            }
            for (b, n) in changed {
                for (p, q) in [(c, b), (b, c)] {
                    if n == 0 {
                        self.counts[p as usize].remove(q);
                    } else {
                        self.counts[p as usize].insert(q, u32::try_from(n).unwrap_or(u32::MAX));
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
                let mut links: Vec<(u64, &str, u32)> = self.counts[c as usize]
                    .iter()
                    .map(|(b, n)| (link_weight(n.into()), clusters.key(b).as_str(), b))
                    .collect();
                keep_strongest(&mut links, self.max_degree);
                links.into_iter().map(|l| l.2).collect()
            };
            let old = std::mem::replace(&mut self.kept[c as usize], new);
            for b in old.into_iter().chain(self.kept[c as usize].iter().copied()) {
                pairs.insert(self.ordered(c, b));
            }
        }
        let mut out = Vec::new();
        for (a, b) in pairs {
            let keeps = self.kept[a as usize].contains(&b) || self.kept[b as usize].contains(&a);
            let now = keeps.then(|| self.counts[a as usize].get(b)).flatten().map(|n| link_weight(n.into()));
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

    /// Whether cluster `c` has a member now.
    fn is_live(&self, c: &str) -> bool {
        self.clusters.get(c).is_some_and(|s| !self.has[s as usize].is_empty())
    }

    /// Every membership `(cluster, member)` with its multiplicity, every cluster with a member, and every edge now
    /// emitted.
    fn state(&self) -> Vec<(LayerOutput, isize)> {
        let mut out = Vec::new();
        for c in (0..self.clusters.capacity() as u32).filter(|&c| self.clusters.holds(c)) {
            let has = &self.has[c as usize];
            if has.is_empty() {
                continue;
            }
            let name = self.clusters.key(c);
            out.push((LayerOutput::Node(name.clone()), 1));
            for (m, d) in has.iter() {
                out.push((LayerOutput::Member(name.clone(), self.nodes.key(m).clone()), d as isize));
            }
        }
        for (&(a, b), &w) in &self.emitted {
            out.push((LayerOutput::Edge(self.clusters.key(a).clone(), self.clusters.key(b).clone(), w), 1));
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

/// An input row of one layer's [`Layer`]: an edge of the layer, a membership of its clusters, or the number of the
/// layer's nodes (differential's `count`, so a change is a retraction and an insert).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum LayerInput {
    Edge(Name, Name),
    Member(Name, Name),
    Below(u64),
}

/// What [`Layer`] emits while its layer shrinks enough: the clusters' memberships, the clusters as the nodes of the
/// layer above, and the layer above's edges.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum LayerOutput {
    Member(Name, Name),
    Node(Name),
    Edge(Name, Name, u64),
}

/// [`Links`] behind CAM's stop rule, for one space: the layer's clusters, the nodes and the edges of the layer above
/// are emitted only while the clusters are few enough against the layer's nodes ([`HierarchyParams::keeps`]). The
/// rule is applied where the rows are already held: when it flips, the whole state is emitted or retracted from
/// `Links`' own state, so no arrangement keeps a copy of the layer to gate it.
pub struct Layer {
    links: Links,
    params: HierarchyParams,
    /// The count rows of the layer's nodes, by value (one is live between epochs).
    below: HashMap<u64, isize>,
    /// Clusters with a member.
    live: usize,
    open: bool,
}

impl Layer {
    pub fn new(params: &HierarchyParams) -> Self {
        Layer {
            links: Links::new(params.max_degree),
            params: params.clone(),
            below: HashMap::default(),
            live: 0,
            open: false,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.links.is_empty() && self.below.is_empty()
    }

    /// Applies one epoch's changes; returns the changes of what the layer emits, consolidated.
    pub fn apply(&mut self, changes: Vec<(LayerInput, isize)>) -> Vec<(LayerOutput, isize)> {
        let mut rows = Vec::with_capacity(changes.len());
        let mut members: HashMap<LayerOutput, isize> = HashMap::default();
        let mut named: BTreeSet<Name> = BTreeSet::new();
        for (row, d) in changes {
            match row {
                LayerInput::Below(n) => bump_value(&mut self.below, n, d),
                LayerInput::Edge(u, v) => rows.push(((false, u, v), d)),
                LayerInput::Member(c, m) => {
                    *members.entry(LayerOutput::Member(c.clone(), m.clone())).or_default() += d;
                    if !named.contains(&c) {
                        named.insert(c.clone());
                    }
                    rows.push(((true, c, m), d));
                }
            }
        }
        let was_live: Vec<bool> = named.iter().map(|c| self.links.is_live(c)).collect();
        let edges = self.links.apply(rows);
        let mut delta = members;
        for (c, was) in named.into_iter().zip(was_live) {
            let now = self.links.is_live(&c);
            if now != was {
                let d = if now { 1 } else { -1 };
                self.live = self.live.checked_add_signed(d).expect("live clusters stay counted");
                *delta.entry(LayerOutput::Node(c)).or_default() += d;
            }
        }
        for ((a, b, w), d) in edges {
            *delta.entry(LayerOutput::Edge(a, b, w)).or_default() += d;
        }
        let below = self.below.iter().find(|(_, d)| **d > 0).map(|(n, _)| *n as usize);
        let open = below.is_some_and(|b| self.live > 0 && self.params.keeps(b, self.live));
        let was_open = std::mem::replace(&mut self.open, open);
        match (was_open, open) {
            (false, false) => Vec::new(),
            (true, true) => delta.into_iter().filter(|(_, d)| *d != 0).collect(),
            // Opened: everything now. Closed: everything before, which is now less this epoch's change.
            (false, true) => self.links.state(),
            (true, false) => {
                for (row, d) in self.links.state() {
                    *delta.entry(row).or_default() -= d;
                }
                delta.into_iter().filter(|(_, d)| *d != 0).collect()
            }
        }
    }
}

fn bump_value(map: &mut HashMap<u64, isize>, k: u64, d: isize) {
    let n = map.entry(k).or_default();
    *n += d;
    if *n == 0 {
        map.remove(&k);
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
                let batch = batch.into_iter().map(|((m, x, y), d)| ((m, Name::from(x), Name::from(y)), d)).collect();
                for ((a, b, w), d) in links.apply(batch) {
                    let (a, b) = (a.to_string(), b.to_string());
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

    /// [`Layer`] against the rule it applies: seeded random edges, memberships and node counts (the count crossing
    /// the stop rule's bar both ways); after every batch what it emitted equals the memberships, the clusters and
    /// [`next_layer`]'s edges when the layer shrinks enough, and nothing when it does not.
    #[test]
    fn a_layer_emits_only_while_it_shrinks() {
        for seed in 0..16 {
            let mut rng = StdRng::seed_from_u64(100 + seed);
            let params = HierarchyParams { max_degree: [1, 3, 1000][seed as usize % 3], ..HierarchyParams::default() };
            let mut layer = Layer::new(&params);
            let mut edges: BTreeSet<(String, String)> = BTreeSet::new();
            let mut members: BTreeSet<(String, String)> = BTreeSet::new();
            let mut below: Option<u64> = None;
            let mut emitted: BTreeMap<LayerOutput, isize> = BTreeMap::new();
            let mut flips = 0;
            let mut was_open = false;
            for _ in 0..60 {
                let mut batch = Vec::new();
                for _ in 0..rng.gen_range(1..8) {
                    let (a, b) = (rng.gen_range(0..20), rng.gen_range(0..20));
                    if rng.gen_bool(0.4) && a != b {
                        let e = (format!("n{:02}", a.min(b)), format!("n{:02}", a.max(b)));
                        let d = if edges.remove(&e) { -1 } else { 1 };
                        if d > 0 {
                            edges.insert(e.clone());
                        }
                        batch.push((LayerInput::Edge(e.0.into(), e.1.into()), d));
                    } else {
                        let mc = (format!("L1:c{}", rng.gen_range(0..8)), format!("n{a:02}"));
                        let d = if members.remove(&mc) { -1 } else { 1 };
                        if d > 0 {
                            members.insert(mc.clone());
                        }
                        batch.push((LayerInput::Member(mc.0.into(), mc.1.into()), d));
                    }
                }
                if rng.gen_bool(0.4) {
                    if let Some(n) = below.take() {
                        batch.push((LayerInput::Below(n), -1));
                    }
                    if rng.gen_bool(0.9) {
                        let n = rng.gen_range(1..14);
                        below = Some(n);
                        batch.push((LayerInput::Below(n), 1));
                    }
                }
                for (row, d) in layer.apply(batch) {
                    let n = emitted.entry(row).or_default();
                    *n += d;
                    if *n == 0 {
                        emitted.retain(|_, n| *n != 0);
                    }
                }
                let mut clusters: Clusters = BTreeMap::new();
                for (c, m) in &members {
                    clusters.entry(c.clone()).or_default().insert(m.clone());
                }
                let open = below.is_some_and(|b| !clusters.is_empty() && params.keeps(b as usize, clusters.len()));
                flips += usize::from(open != was_open);
                was_open = open;
                let mut want: BTreeMap<LayerOutput, isize> = BTreeMap::new();
                if open {
                    let g = Graph { nodes: BTreeSet::new(), edges: edges.iter().map(|e| (e.clone(), 1)).collect() };
                    for ((a, b), w) in next_layer(&g, &clusters, params.max_degree).edges {
                        want.insert(LayerOutput::Edge(a.into(), b.into(), w), 1);
                    }
                    for (c, ms) in &clusters {
                        want.insert(LayerOutput::Node(c.into()), 1);
                        for m in ms {
                            want.insert(LayerOutput::Member(c.into(), m.into()), 1);
                        }
                    }
                }
                assert_eq!(emitted, want, "seed {seed}");
            }
            assert!(flips >= 2, "seed {seed}: the rule flipped {flips} times");
        }
    }
}
