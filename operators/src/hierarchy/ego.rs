//! The ego networks of one space's graph and the replica graph they make, kept incrementally over interned node
//! slots: for every node v and neighbour a, the component of v's ego network (the subgraph induced by v's
//! neighbours) that holds a, named by its smallest member ([`super::ego_components`] is the same rule over strings,
//! used by the sequential reference); the replicas `(v, component)`; and for every edge `(u, v, w)` the replica edge
//! between u's replica for the component holding v and v's replica for the component holding u, with weight `w`.
//!
//! A node of the layer with no edge is one replica `(v, "")`, as a node whose ego network is one component: the
//! layer's nodes come in beside its edges, so that the replicas are every node's, isolated or not.
//!
//! One operator holds all three because they are one state: the components are a function of the adjacency, and a
//! replica edge of an edge's weight rows and the components at its two ends. As separate operators the components
//! flowed between them as rows and were kept twice (here, and keyed by `(v, a)` beside the edges' weights there),
//! and the replicas were a `distinct` arrangement of them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{find_root, Replica};
use crate::name::Name;
use crate::slots::{bump, bump_rows, HashMap, Multiplicities, Rows, Slots};

/// A change of the output: a directed replica edge `(x, Some((y, weight)))` (both directions of each edge), or a
/// replica `(r, None)`.
pub type ReplicaRow = (Replica, Option<(Replica, u64)>);

/// The component of an ego network that is its only one (named "").
const SOLE: u32 = u32::MAX;

/// An input row: a node of the layer, or an edge `(u, v, weight)`, `u < v`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum EgoInput {
    Node(Name),
    Edge(Name, Name, u64),
}

#[derive(Default)]
pub struct Ego {
    /// Whether loose neighbours are one component ([`super::ego_components`]).
    pool: bool,
    slots: Slots<Name>,
    /// Each slot's multiplicity as a node of the layer.
    present: Vec<i32>,
    /// Neighbours with the multiplicity of the edge rows that join them (a weight change retracts one row and
    /// inserts another).
    adj: Vec<Multiplicities>,
    /// Each edge's weight rows, keyed by `(u, v)`, the smaller slot first.
    weights: HashMap<(u32, u32), Rows<u64>>,
    /// The components of each node's ego network: (neighbour, component) slots, sorted by neighbour, allocated to
    /// size.
    emitted: Vec<Box<[(u32, u32)]>>,
    /// Scratch: slot → local index + 1 while one ego network is computed.
    mark: Vec<u32>,
}

/// `(neighbour, component)` of `comps` (sorted by neighbour).
fn comp_of(comps: &[(u32, u32)], a: u32) -> Option<u32> {
    comps.binary_search_by_key(&a, |r| r.0).ok().map(|i| comps[i].1)
}

impl Ego {
    pub fn new(pool: bool) -> Self {
        Ego { pool, ..Ego::default() }
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    fn slot_of(&mut self, n: &Name) -> u32 {
        let (s, new) = self.slots.intern(n);
        if new {
            self.adj.push(Multiplicities::default());
            self.present.push(0);
            self.emitted.push(Box::default());
            self.mark.push(0);
        }
        s
    }

    /// Applies one epoch's changes of nodes and edges with multiplicities and returns the changes of the replicas
    /// and of the directed replica edges. The ego networks recomputed are those of both endpoints of every edge that
    /// appeared or went, and of the common neighbours of its endpoints (whose ego network gained or lost the link);
    /// the replica edges rewritten are those whose weight or whose component at either end changed.
    pub fn apply(&mut self, changes: Vec<(EgoInput, isize)>) -> Vec<(ReplicaRow, isize)> {
        let mut linked_before: BTreeMap<(u32, u32), bool> = BTreeMap::new();
        // Each edge whose rows or components change, with its weight rows before the epoch.
        let mut touched: HashMap<(u32, u32), Option<Rows<u64>>> = HashMap::default();
        // The nodes whose multiplicity changed, with whether they were nodes of the layer before the epoch.
        let mut present_before: BTreeMap<u32, bool> = BTreeMap::new();
        for (row, d) in changes {
            let (u, v, w) = match row {
                EgoInput::Node(n) => {
                    let s = self.slot_of(&n);
                    present_before.entry(s).or_insert(self.present[s as usize] > 0);
                    self.present[s as usize] = crate::slots::multiplicity(self.present[s as usize] as isize + d);
                    continue;
                }
                EgoInput::Edge(u, v, w) => (u, v, w),
            };
            let (su, sv) = (self.slot_of(&u), self.slot_of(&v));
            let key = (su.min(sv), su.max(sv));
            linked_before.entry(key).or_insert_with(|| self.adj[su as usize].contains_key(sv));
            touched.entry(key).or_insert_with(|| self.weights.get(&key).cloned());
            bump_rows(&mut self.weights, key, w, d);
            for (a, b) in [(su, sv), (sv, su)] {
                bump(&mut self.adj[a as usize], b, d);
            }
        }
        let mut affected: Vec<u32> = Vec::new();
        let mut seen: Vec<u32> = Vec::new();
        for (&(u, v), &was) in &linked_before {
            seen.extend([u, v]);
            if self.adj[u as usize].contains_key(v) == was {
                continue;
            }
            affected.extend([u, v]);
            let (nu, nv) = (&self.adj[u as usize], &self.adj[v as usize]);
            let (small, large) = if nu.len() <= nv.len() { (nu, nv) } else { (nv, nu) };
            affected.extend(small.keys().filter(|w| large.contains_key(*w)));
        }
        for (&s, &was) in &present_before {
            seen.push(s);
            if (self.present[s as usize] > 0) != was {
                affected.push(s);
            }
        }
        affected.sort_unstable();
        affected.dedup();
        let mut out: Vec<(ReplicaRow, isize)> = Vec::new();
        // The components before the epoch of the (v, a) that changed.
        let mut comps_before: HashMap<(u32, u32), Option<u32>> = HashMap::default();
        for v in affected {
            let now = self.components(v);
            let before = std::mem::take(&mut self.emitted[v as usize]);
            for &(a, c) in before.iter() {
                if comp_of(&now, a) != Some(c) {
                    comps_before.insert((v, a), Some(c));
                }
            }
            for &(a, _) in &now {
                if comp_of(&before, a).is_none() {
                    comps_before.insert((v, a), None);
                }
            }
            // The replicas: v's distinct components, or the one replica of a node without edges.
            let distinct = |rows: &[(u32, u32)], present: bool| {
                let mut cs: Vec<u32> = rows.iter().map(|r| r.1).collect();
                cs.sort_unstable();
                cs.dedup();
                if cs.is_empty() && present {
                    cs.push(SOLE);
                }
                cs
            };
            let present_now = self.present[v as usize] > 0;
            let was_present = present_before.get(&v).copied().unwrap_or(present_now);
            let (was, is) = (distinct(&before, was_present), distinct(&now, present_now));
            for c in was.iter().filter(|c| is.binary_search(c).is_err()) {
                out.push((((self.name(v), self.name(*c)), None), -1));
            }
            for c in is.iter().filter(|c| was.binary_search(c).is_err()) {
                out.push((((self.name(v), self.name(*c)), None), 1));
            }
            self.emitted[v as usize] = now.into_boxed_slice();
        }
        for &(v, a) in comps_before.keys() {
            let key = (v.min(a), v.max(a));
            touched.entry(key).or_insert_with(|| self.weights.get(&key).cloned());
        }
        for (key, weights_before) in touched {
            let (u, v) = key;
            let comp = |x: u32, y: u32| comp_of(&self.emitted[x as usize], y);
            let comp_before = |x: u32, y: u32| comps_before.get(&(x, y)).copied().unwrap_or_else(|| comp(x, y));
            let was = (weights_before, comp_before(u, v), comp_before(v, u));
            let is = (self.weights.get(&key).cloned(), comp(u, v), comp(v, u));
            if was == is {
                continue;
            }
            for ((ws, cu, cv), sign) in [(was, -1), (is, 1)] {
                let (Some(ws), Some(cu), Some(cv)) = (ws, cu, cv) else { continue };
                let (ru, rv) = ((self.name(u), self.name(cu)), (self.name(v), self.name(cv)));
                for (w, d) in ws.iter() {
                    out.push(((ru.clone(), Some((rv.clone(), w))), sign * d));
                    out.push(((rv.clone(), Some((ru.clone(), w))), sign * d));
                }
            }
        }
        for s in seen {
            if self.adj[s as usize].is_empty() && self.emitted[s as usize].is_empty() && self.present[s as usize] == 0 {
                self.slots.release(s);
            }
        }
        out
    }

    fn name(&self, s: u32) -> Name {
        if s == SOLE {
            return Name::default();
        }
        self.slots.key(s).clone()
    }

    /// v's ego network: union-find over its neighbours and the links among them, each component named by its
    /// smallest member (by name); `(neighbour, component)` in neighbour order.
    fn components(&mut self, v: u32) -> Vec<(u32, u32)> {
        let nbrs: Vec<u32> = self.adj[v as usize].keys().collect();
        for (i, a) in nbrs.iter().enumerate() {
            self.mark[*a as usize] = i as u32 + 1;
        }
        let mut parent: Vec<usize> = (0..nbrs.len()).collect();
        for (i, a) in nbrs.iter().enumerate() {
            for b in self.adj[*a as usize].keys() {
                let j = self.mark[b as usize];
                if j == 0 || (j - 1) as usize <= i {
                    continue;
                }
                let (ra, rb) = (find_root(&mut parent, i), find_root(&mut parent, (j - 1) as usize));
                if ra != rb {
                    // The root is the member with the smaller name, so a root names its component.
                    let (lo, hi) =
                        if self.slots.key(nbrs[ra]) < self.slots.key(nbrs[rb]) { (ra, rb) } else { (rb, ra) };
                    parent[hi] = lo;
                }
            }
        }
        for a in &nbrs {
            self.mark[*a as usize] = 0;
        }
        let mut roots: Vec<usize> = (0..nbrs.len()).map(|i| find_root(&mut parent, i)).collect();
        if self.pool {
            super::pool_loose(&mut roots, |a, b| self.slots.key(nbrs[a]).cmp(self.slots.key(nbrs[b])));
        }
        let mut comps: Vec<(u32, u32)> = (0..nbrs.len()).map(|i| (nbrs[i], nbrs[roots[i]])).collect();
        // A single component is named "" ([`SOLE`]), as [`super::ego_components`] names it.
        if comps.iter().all(|c| c.1 == comps[0].1) {
            comps.iter_mut().for_each(|c| c.1 = SOLE);
        }
        comps
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    /// Seeded random node and edge inserts and deletes and weight changes (within one batch too): after every batch
    /// the replicas and replica edges emitted so far equal those of [`super::super::ego_components`] over the whole
    /// graph, joined with the edges' weights at both ends, and a replica `(v, "")` for every node without edges.
    #[test]
    fn incremental_replicas_equal_the_reference_rule() {
        for seed in 0..12 {
            let pool = seed % 2 == 0;
            let mut rng = StdRng::seed_from_u64(seed);
            let mut ego = Ego::new(pool);
            let mut edges: BTreeMap<(String, String), u64> = BTreeMap::new();
            let mut nodes: BTreeSet<String> = BTreeSet::new();
            let mut isolated_seen = false;
            let mut emitted: BTreeMap<ReplicaRow, isize> = BTreeMap::new();
            let mut shared_components = false;
            for _ in 0..40 {
                let mut batch = Vec::new();
                let mut node_rows = Vec::new();
                for _ in 0..rng.gen_range(0..6) {
                    let n = format!("n{:02}", rng.gen_range(0..45));
                    let d = if nodes.remove(&n) { -1 } else { 1 };
                    if d > 0 {
                        nodes.insert(n.clone());
                    }
                    node_rows.push((EgoInput::Node(Name::from(n)), d));
                }
                for _ in 0..rng.gen_range(1..15) {
                    let a = rng.gen_range(0..40);
                    let b = (a / 10) * 10 + rng.gen_range(0..10);
                    let b = if rng.gen_bool(0.1) { rng.gen_range(0..40) } else { b };
                    if a == b {
                        continue;
                    }
                    let (u, v) = (format!("n{:02}", a.min(b)), format!("n{:02}", a.max(b)));
                    if let Some(w) = edges.remove(&(u.clone(), v.clone())) {
                        batch.push(((u.clone(), v.clone(), w), -1));
                        if rng.gen_bool(0.5) {
                            // A weight change: the same pair comes back, its new row first or last.
                            let w = rng.gen_range(1..4);
                            edges.insert((u.clone(), v.clone()), w);
                            let at = if rng.gen_bool(0.5) { batch.len() - 1 } else { batch.len() };
                            batch.insert(at, ((u, v, w), 1));
                        }
                    } else {
                        let w = rng.gen_range(1..4);
                        edges.insert((u.clone(), v.clone()), w);
                        batch.push(((u, v, w), 1));
                    }
                }
                let mut batch: Vec<(EgoInput, isize)> = batch
                    .into_iter()
                    .map(|((u, v, w), d)| (EgoInput::Edge(Name::from(u), Name::from(v), w), d))
                    .collect();
                // The node rows anywhere in the batch.
                for row in node_rows {
                    let at = rng.gen_range(0..=batch.len());
                    batch.insert(at, row);
                }
                for (row, d) in ego.apply(batch) {
                    let n = emitted.entry(row.clone()).or_default();
                    *n += d;
                    if *n == 0 {
                        emitted.remove(&row);
                    }
                }
                let mut adj: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
                for (u, v) in edges.keys() {
                    adj.entry(u).or_default().insert(v);
                    adj.entry(v).or_default().insert(u);
                }
                let mut comps: BTreeMap<(&str, &str), &str> = BTreeMap::new();
                for (v, nbrs) in &adj {
                    let links =
                        nbrs.iter().flat_map(|a| adj[a].iter().filter(|b| nbrs.contains(*b)).map(move |b| (*a, *b)));
                    for (a, c) in crate::hierarchy::ego_components(nbrs.iter().copied(), links, pool) {
                        comps.insert((v, a), c);
                    }
                }
                let rep = |v: &str, c: &str| (Name::from(v), Name::from(c));
                let mut want: BTreeMap<ReplicaRow, isize> = BTreeMap::new();
                for ((v, _), c) in &comps {
                    want.insert((rep(v, c), None), 1);
                }
                for v in nodes.iter().filter(|v| !adj.contains_key(v.as_str())) {
                    want.insert((rep(v, ""), None), 1);
                    isolated_seen = true;
                }
                for ((u, v), w) in &edges {
                    let (ru, rv) = (rep(u, comps[&(u.as_str(), v.as_str())]), rep(v, comps[&(v.as_str(), u.as_str())]));
                    want.insert((ru.clone(), Some((rv.clone(), *w))), 1);
                    want.insert((rv, Some((ru, *w))), 1);
                }
                assert_eq!(emitted, want, "seed {seed}");
                shared_components |= comps.values().collect::<BTreeSet<_>>().len() < comps.len();
            }
            assert!(shared_components, "some components hold several neighbours");
            assert!(isolated_seen, "some nodes have no edges");
            if edges.is_empty() && nodes.is_empty() {
                assert!(ego.is_empty());
            }
        }
    }
}
