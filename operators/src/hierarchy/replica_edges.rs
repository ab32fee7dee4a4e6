//! The replica graph's edges, kept incrementally per space: an edge `(u, v, w)` of the layer joins the replica of `u`
//! for the component of its ego network that holds `v` to the replica of `v` for the component that holds `u`, with
//! the same weight. As two joins of the edges with the ego-network components this kept four arrangements keyed by
//! `(space, u, v)` per layer; here the state is each edge's weight rows and the two components of its ends, and an
//! epoch rewrites only the edges whose weight or components changed.

use super::Replica;
use crate::name::Name;
use crate::slots::{multiplicity, HashMap, Slots};

/// A change of the input: an edge `(u, v, Some(weight))` (either order), or an ego-network component
/// `(v, a, None)` with its name in `component`.
pub type EdgeOrComponent = (Name, Name, Option<u64>, Name);

/// A directed replica edge `(x, (y, weight))`.
pub type ReplicaEdge = (Replica, (Replica, u64));

/// One space's edges and components, over interned names. What an edge emitted is not kept: it is always the
/// product of the edge's weight rows and its two components' rows, so an epoch takes it from the state before it
/// applies its changes.
pub struct ReplicaEdges {
    /// Node and component names ↔ slots; the slots nothing names any more are released by a sweep once as many
    /// names were added since the last one as were live after it (at least `min_sweep`).
    slots: Slots<Name>,
    added: usize,
    live_at_sweep: usize,
    min_sweep: usize,
    /// `(u, v)`, the smaller slot first → weight → multiplicity (nearly always one row, kept inline).
    weights: HashMap<(u32, u32), Rows<u64>>,
    /// `(v, a)` → the component of `v`'s ego network holding `a` → multiplicity.
    components: HashMap<(u32, u32), Rows<u32>>,
}

/// What one edge emits: `(cu, cv, weight)` with multiplicity, `cu` the component at the key's first end, sorted.
type Emitted = Vec<((u32, u32, u64), isize)>;

/// Rows with multiplicities. Nearly always one row, which lives inline: an entry of the maps above is 24 bytes, key
/// included. Two or more rows (a weight change within an epoch, a replica edge of two components) go to the heap.
#[derive(Clone, Debug)]
enum Rows<K> {
    One(K, i32),
    // A thin pointer: a `Vec` inline would make every entry, the one-row ones too, 16 bytes longer.
    #[allow(clippy::box_collection)]
    Many(Box<Vec<(K, isize)>>),
}

impl<K: Copy + PartialEq> Rows<K> {
    fn iter(&self) -> impl Iterator<Item = (K, isize)> + '_ {
        let (one, many) = match self {
            Rows::One(k, n) => (Some((*k, *n as isize)), &[][..]),
            Rows::Many(rows) => (None, &rows[..]),
        };
        one.into_iter().chain(many.iter().copied())
    }

    /// Adds `d` to row `k`; whether no row is left.
    fn bump(&mut self, k: K, d: isize) -> bool {
        if d == 0 {
            return false;
        }
        match self {
            Rows::One(x, n) if *x == k => {
                let m = *n as isize + d;
                *n = multiplicity(m);
                m == 0
            }
            Rows::One(x, n) => {
                *self = Rows::Many(Box::new(vec![(*x, *n as isize), (k, d)]));
                false
            }
            Rows::Many(rows) => {
                match rows.iter().position(|(x, _)| *x == k) {
                    Some(i) => {
                        rows[i].1 += d;
                        if rows[i].1 == 0 {
                            rows.swap_remove(i);
                        }
                    }
                    None => rows.push((k, d)),
                }
                match rows[..] {
                    [] => true,
                    [(x, n)] => {
                        *self = Rows::One(x, multiplicity(n));
                        false
                    }
                    _ => false,
                }
            }
        }
    }
}

/// Adds `d` to row `k` of `key`'s rows in `map`, dropping the entry when no row is left.
fn bump<K: Copy + PartialEq>(map: &mut HashMap<(u32, u32), Rows<K>>, key: (u32, u32), k: K, d: isize) {
    use std::collections::hash_map::Entry;
    match map.entry(key) {
        Entry::Vacant(e) => {
            if d != 0 {
                e.insert(Rows::One(k, multiplicity(d)));
            }
        }
        Entry::Occupied(mut e) => {
            if e.get_mut().bump(k, d) {
                e.remove();
            }
        }
    }
}

impl Default for ReplicaEdges {
    fn default() -> Self {
        ReplicaEdges {
            slots: Slots::default(),
            added: 0,
            live_at_sweep: 0,
            min_sweep: 1024,
            weights: HashMap::default(),
            components: HashMap::default(),
        }
    }
}

impl ReplicaEdges {
    pub fn is_empty(&self) -> bool {
        self.weights.is_empty() && self.components.is_empty()
    }

    fn slot(&mut self, name: &Name) -> u32 {
        let live = self.slots.len();
        let s = self.slots.intern(name).0;
        self.added += self.slots.len() - live;
        s
    }

    /// What the edge `key` emits in the present state: the join of its weights with the components at both ends.
    fn emitted(&self, key: (u32, u32)) -> Emitted {
        let (u, v) = key;
        let mut now = Vec::new();
        if let (Some(ws), Some(cus), Some(cvs)) =
            (self.weights.get(&key), self.components.get(&(u, v)), self.components.get(&(v, u)))
        {
            for (w, dw) in ws.iter() {
                for (cu, du) in cus.iter() {
                    for (cv, dv) in cvs.iter() {
                        now.push(((cu, cv, w), dw * du * dv));
                    }
                }
            }
        }
        now.sort_unstable();
        now
    }

    /// Applies one epoch's changes; returns the changes of the directed replica edges (both directions of each).
    pub fn apply(&mut self, changes: Vec<(EdgeOrComponent, isize)>) -> Vec<(ReplicaEdge, isize)> {
        // Each touched edge with what it emitted before the epoch.
        let mut before: HashMap<(u32, u32), Emitted> = HashMap::default();
        for ((x, y, weight, component), d) in changes {
            let (x, y) = (self.slot(&x), self.slot(&y));
            let key = (x.min(y), x.max(y));
            if let std::collections::hash_map::Entry::Vacant(e) = before.entry(key) {
                e.insert(self.emitted(key));
            }
            match weight {
                Some(w) => bump(&mut self.weights, key, w, d),
                None => {
                    let c = self.slot(&component);
                    bump(&mut self.components, (x, y), c, d);
                }
            }
        }
        let mut out = Vec::new();
        for (key, before) in before {
            let now = self.emitted(key);
            if before != now {
                let (u, v) = key;
                let name = |s: u32| self.slots.key(s).clone();
                let rows = |&(cu, cv, w): &(u32, u32, u64)| {
                    let (ru, rv) = ((name(u), name(cu)), (name(v), name(cv)));
                    [(ru.clone(), (rv.clone(), w)), (rv, (ru, w))]
                };
                for (row, d) in &before {
                    out.extend(rows(row).into_iter().map(|r| (r, -d)));
                }
                for (row, d) in &now {
                    out.extend(rows(row).into_iter().map(|r| (r, *d)));
                }
            }
        }
        if self.added >= self.live_at_sweep.max(self.min_sweep) {
            self.sweep();
        }
        out
    }

    /// Releases the slots that no edge or component names.
    fn sweep(&mut self) {
        let mut named = vec![false; self.slots.capacity()];
        for &(u, v) in self.weights.keys() {
            named[u as usize] = true;
            named[v as usize] = true;
        }
        for (&(v, a), cs) in &self.components {
            named[v as usize] = true;
            named[a as usize] = true;
            for (c, _) in cs.iter() {
                named[c as usize] = true;
            }
        }
        for (s, named) in named.into_iter().enumerate() {
            if !named && self.slots.holds(s as u32) {
                self.slots.release(s as u32);
            }
        }
        self.added = 0;
        self.live_at_sweep = self.slots.len();
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;

    #[test]
    fn a_row_lives_inline_in_sixteen_bytes() {
        assert_eq!(std::mem::size_of::<Rows<u64>>(), 16);
        assert_eq!(std::mem::size_of::<Rows<u32>>(), 16);
        let mut rows = Rows::One(7u32, 1);
        assert!(!rows.bump(8, 1) && matches!(rows, Rows::Many(_)));
        assert!(!rows.bump(7, -1) && matches!(rows, Rows::One(8, 1)));
        assert!(rows.bump(8, -1));
    }

    /// Seeded random edges (inserts, deletes, weight changes) and components (changed, removed): after every batch
    /// the emitted rows equal the join of the edges with the components at both ends.
    #[test]
    fn incremental_replica_edges_equal_the_join() {
        for seed in 0..10 {
            let mut rng = StdRng::seed_from_u64(seed);
            // Sweeps as soon as as many names were added as were live, so that released slots are reused here.
            let mut op = ReplicaEdges { min_sweep: 0, ..ReplicaEdges::default() };
            let mut edges: BTreeMap<(String, String), u64> = BTreeMap::new();
            let mut comps: BTreeMap<(String, String), String> = BTreeMap::new();
            let mut emitted: BTreeMap<ReplicaEdge, isize> = BTreeMap::new();
            for _ in 0..40 {
                let mut batch = Vec::new();
                for _ in 0..rng.gen_range(1..12) {
                    let (a, b) = (rng.gen_range(0..12), rng.gen_range(0..12));
                    if a == b {
                        continue;
                    }
                    if rng.gen_bool(0.5) {
                        let key = (format!("n{:02}", a.min(b)), format!("n{:02}", a.max(b)));
                        if let Some(w) = edges.remove(&key) {
                            batch.push(((key.0.clone(), key.1.clone(), Some(w), String::new()), -1));
                        }
                        if rng.gen_bool(0.6) {
                            let w = rng.gen_range(1..4);
                            edges.insert(key.clone(), w);
                            batch.push(((key.0, key.1, Some(w), String::new()), 1));
                        }
                    } else {
                        let key = (format!("n{a:02}"), format!("n{b:02}"));
                        if let Some(c) = comps.remove(&key) {
                            batch.push(((key.0.clone(), key.1.clone(), None, c), -1));
                        }
                        if rng.gen_bool(0.7) {
                            let c = format!("n{:02}", rng.gen_range(0..12));
                            comps.insert(key.clone(), c.clone());
                            batch.push(((key.0, key.1, None, c), 1));
                        }
                    }
                }
                let batch = batch
                    .into_iter()
                    .map(|((x, y, w, c), d): ((String, String, Option<u64>, String), isize)| {
                        ((x.into(), y.into(), w, c.into()), d)
                    })
                    .collect();
                for (row, d) in op.apply(batch) {
                    let n = emitted.entry(row.clone()).or_default();
                    *n += d;
                    if *n == 0 {
                        emitted.remove(&row);
                    }
                }
                let mut want: BTreeMap<ReplicaEdge, isize> = BTreeMap::new();
                for ((u, v), w) in &edges {
                    if let (Some(cu), Some(cv)) =
                        (comps.get(&(u.clone(), v.clone())), comps.get(&(v.clone(), u.clone())))
                    {
                        let (ru, rv) = ((u.into(), cu.into()), (v.into(), cv.into()));
                        want.insert((ru.clone(), (rv.clone(), *w)), 1);
                        want.insert((rv, (ru, *w)), 1);
                    }
                }
                assert_eq!(emitted, want, "seed {seed}");
            }
            if edges.is_empty() && comps.is_empty() {
                assert!(op.is_empty());
            }
        }
    }
}
