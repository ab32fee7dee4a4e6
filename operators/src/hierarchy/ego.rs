//! The ego networks of one space's graph, kept incrementally over interned node slots: for every node v and
//! neighbour a, the component of v's ego network (the subgraph induced by v's neighbours) that holds a, named by its
//! smallest member ([`super::ego_components`] is the same rule over strings, used by the sequential reference).

use std::collections::BTreeMap;

use super::find_root;
use crate::name::Name;
use crate::slots::{bump, Multiplicities, Slots};

/// A change of one ego-network row: `(v, a, old component, new component)`.
pub type EgoChange = (Name, Name, Option<Name>, Option<Name>);

/// The component of an ego network that is its only one (named "").
const SOLE: u32 = u32::MAX;

#[derive(Default)]
pub struct Ego {
    /// Whether loose neighbours are one component ([`super::ego_components`]).
    pool: bool,
    slots: Slots<Name>,
    /// Neighbours with the multiplicity of the edge rows that join them (a weight change retracts one row and
    /// inserts another).
    adj: Vec<Multiplicities>,
    /// What was emitted for each node: (neighbour, component) slots, sorted by neighbour, allocated to size.
    emitted: Vec<Box<[(u32, u32)]>>,
    /// Scratch: slot → local index + 1 while one ego network is computed.
    mark: Vec<u32>,
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
            self.emitted.push(Box::default());
            self.mark.push(0);
        }
        s
    }

    /// Applies one epoch's edge changes `(u, v)` with multiplicities and returns the changed rows: the ego networks
    /// of both endpoints of every edge that appeared or went, and of the common neighbours of its endpoints (whose
    /// ego network gained or lost the link). An edge whose weight alone changed changes nothing.
    pub fn apply(&mut self, changes: Vec<((Name, Name), isize)>) -> Vec<EgoChange> {
        let mut linked_before: BTreeMap<(u32, u32), bool> = BTreeMap::new();
        for ((u, v), d) in changes {
            let (su, sv) = (self.slot_of(&u), self.slot_of(&v));
            linked_before.entry((su, sv)).or_insert_with(|| self.adj[su as usize].contains_key(sv));
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
        affected.sort_unstable();
        affected.dedup();
        let mut out = Vec::new();
        for v in affected {
            let now = self.components(v);
            let before = std::mem::take(&mut self.emitted[v as usize]);
            for (a, c) in before.iter() {
                let n = now.binary_search_by_key(a, |r| r.0).ok().map(|i| &now[i].1);
                if n != Some(c) {
                    out.push((self.name(v), self.name(*a), Some(self.name(*c)), n.map(|n| self.name(*n))));
                }
            }
            for (a, c) in &now {
                if before.binary_search_by_key(a, |r| r.0).is_err() {
                    out.push((self.name(v), self.name(*a), None, Some(self.name(*c))));
                }
            }
            self.emitted[v as usize] = now.into_boxed_slice();
        }
        for s in seen {
            if self.adj[s as usize].is_empty() && self.emitted[s as usize].is_empty() {
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

    /// Seeded random edge inserts, deletes and weight changes: after every batch the emitted rows equal
    /// [`super::super::ego_components`] over the whole graph.
    #[test]
    fn incremental_ego_networks_equal_the_reference_rule() {
        for seed in 0..10 {
            let pool = seed % 2 == 0;
            let mut rng = StdRng::seed_from_u64(seed);
            let mut ego = Ego::new(pool);
            let mut edges: BTreeMap<(String, String), u64> = BTreeMap::new();
            let mut rows: BTreeMap<(String, String), String> = BTreeMap::new();
            for _ in 0..40 {
                let mut batch = Vec::new();
                for _ in 0..rng.gen_range(1..15) {
                    let a = rng.gen_range(0..40);
                    let b = (a / 10) * 10 + rng.gen_range(0..10);
                    let b = if rng.gen_bool(0.1) { rng.gen_range(0..40) } else { b };
                    if a == b {
                        continue;
                    }
                    let (u, v) = (format!("n{:02}", a.min(b)), format!("n{:02}", a.max(b)));
                    if edges.remove(&(u.clone(), v.clone())).is_some() {
                        batch.push(((u.clone(), v.clone()), -1));
                        if rng.gen_bool(0.5) {
                            // a weight change: the same pair comes back
                            edges.insert((u.clone(), v.clone()), 2);
                            batch.push(((u, v), 1));
                        }
                    } else {
                        edges.insert((u.clone(), v.clone()), 1);
                        batch.push(((u, v), 1));
                    }
                }
                let batch = batch.into_iter().map(|((u, v), d)| ((Name::from(u), Name::from(v)), d)).collect();
                for (v, a, old, new) in ego.apply(batch) {
                    let (v, a) = (v.to_string(), a.to_string());
                    assert_eq!(rows.get(&(v.clone(), a.clone())).map(String::as_str), old.as_deref());
                    match new {
                        Some(c) => rows.insert((v, a), c.to_string()),
                        None => rows.remove(&(v, a)),
                    };
                }
                let mut adj: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
                for (u, v) in edges.keys() {
                    adj.entry(u).or_default().insert(v);
                    adj.entry(v).or_default().insert(u);
                }
                let mut want: BTreeMap<(String, String), String> = BTreeMap::new();
                for (v, nbrs) in &adj {
                    let links =
                        nbrs.iter().flat_map(|a| adj[a].iter().filter(|b| nbrs.contains(*b)).map(move |b| (*a, *b)));
                    for (a, c) in crate::hierarchy::ego_components(nbrs.iter().copied(), links, pool) {
                        want.insert((v.to_string(), a.to_string()), c.to_string());
                    }
                }
                assert_eq!(rows, want, "seed {seed}");
            }
            assert!(
                rows.values().collect::<BTreeSet<_>>().len() < rows.len(),
                "some components hold several neighbours"
            );
        }
    }
}
