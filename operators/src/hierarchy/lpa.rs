//! Label propagation over one space's replica graph, kept incrementally: every round's label of every replica is
//! stored, and a change of the graph recomputes, round by round, only the replicas whose inputs changed — those
//! whose edges changed, and the neighbours of those whose label in the round before changed — as differential
//! dataflow would, but over integer slots instead of arrangements of strings. The result after any sequence of
//! changes equals a from-scratch run (the rounds of [`super`]: [`super::active`] coins, [`super::next_label`]'s
//! rule), which `tests` and the hierarchy's model tests check.
//!
//! The same operator also keeps the other labelling of [`super`], *strongest-link groups* ([`Lpa::components`]):
//! each replica's link to its heaviest neighbour, and for label the head of its group when each connected component
//! of those links is cut into groups ([`super::link_groups`]). A change re-picks the links of the replicas it
//! touches and regroups only the components whose links or link weights changed.

use std::cmp::Ordering;
use std::collections::BTreeSet;

use super::{active, link_groups, replica_hash, Replica};
use crate::slots::{multiplicity, reserve_one, HashMap, Slots};

/// One replica graph and its labels.
#[derive(Default)]
pub struct Lpa {
    rounds: usize,
    /// Replica ↔ slot (a slot is released at the end of an epoch, so labels may still name it until then).
    slots: Slots<Replica>,
    /// Multiplicity in the replica set; a slot with none is not a replica (it may still be named by edges).
    present: Vec<isize>,
    /// Directed edges out of each slot: (neighbour, weight, multiplicity); 16 bytes an edge.
    adj: Vec<Vec<(u32, u64, i32)>>,
    /// Each live replica's label after each round, `labels[s][0]` being `s` itself; empty when not a replica. With
    /// strongest-link groups, one label per live replica.
    labels: Vec<Vec<u32>>,
    /// Strongest-link groups instead of label propagation, of at most this many replicas.
    components: bool,
    max: usize,
    /// With components: each live replica's strongest link and its weight, and the replicas whose strongest link it
    /// is.
    link: Vec<Option<(u32, u128)>>,
    linked_from: Vec<Vec<u32>>,
    /// With components: each slot's [`replica_hash`], taken when the slot gets its key.
    hash: Vec<u64>,
    /// Scratch for a round of propagation: a flag per slot, all clear between rounds (kept, not allocated per
    /// epoch: a space's layer has as many slots as replicas).
    marked: Vec<bool>,
}

/// A change of the replica graph: a replica `(r, None)` or a directed edge `(x, Some((y, weight)))`.
pub type GraphRow = (Replica, Option<(Replica, u64)>);

/// A label change: `(replica, old label, new label)`, `None` when there was or is none.
pub type LabelChange = (Replica, Option<Replica>, Option<Replica>);

impl Lpa {
    pub fn new(rounds: usize) -> Self {
        Lpa { rounds, ..Lpa::default() }
    }

    /// Strongest-link groups of at most `max` replicas ([`super::link_groups`]) instead of label propagation.
    pub fn components(max: usize) -> Self {
        Lpa { components: true, max, ..Lpa::default() }
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    fn slot_of(&mut self, r: &Replica) -> u32 {
        let fresh = !self.slots.contains(r);
        let (s, new) = self.slots.intern(r);
        if new {
            self.present.push(0);
            self.adj.push(Vec::new());
            self.labels.push(Vec::new());
            if self.components {
                self.link.push(None);
                self.linked_from.push(Vec::new());
                self.hash.push(0);
            }
        }
        if fresh && self.components {
            self.hash[s as usize] = replica_hash(r);
        }
        s
    }

    fn live(&self, s: u32) -> bool {
        self.present[s as usize] > 0
    }

    /// Applies one epoch's changes — replicas `(r, None)` and directed edges `(x, Some((y, weight)))`, with
    /// multiplicities — and returns the replicas whose final label changed.
    pub fn apply(&mut self, changes: Vec<(GraphRow, isize)>) -> Vec<LabelChange> {
        // Collected as lists and made sets once: an epoch that builds a whole layer inserts millions.
        let mut dirty: Vec<u32> = Vec::new();
        let mut was_live: HashMap<u32, bool> = HashMap::default();
        let mut touched: Vec<u32> = Vec::new();
        for ((x, e), d) in changes {
            let sx = self.slot_of(&x);
            touched.push(sx);
            match e {
                None => {
                    was_live.entry(sx).or_insert(self.present[sx as usize] > 0);
                    self.present[sx as usize] += d;
                }
                Some((y, w)) => {
                    let sy = self.slot_of(&y);
                    touched.push(sy);
                    let list = &mut self.adj[sx as usize];
                    match list.iter_mut().position(|(n, nw, _)| *n == sy && *nw == w) {
                        Some(i) => {
                            list[i].2 = multiplicity(list[i].2 as isize + d);
                            if list[i].2 == 0 {
                                list.swap_remove(i);
                            }
                        }
                        None => {
                            reserve_one(list);
                            list.push((sy, w, multiplicity(d)))
                        }
                    }
                    dirty.push(sx);
                }
            }
        }
        let mut dirty: BTreeSet<u32> = dirty.into_iter().collect();
        touched.sort_unstable();
        touched.dedup();
        // Replicas that appeared or went: their own labels start or end, and their neighbours' votes change.
        let mut born: Vec<u32> = Vec::new();
        let mut gone: Vec<u32> = Vec::new();
        for (&s, &before) in &was_live {
            match (before, self.live(s)) {
                (false, true) => born.push(s),
                (true, false) => gone.push(s),
                _ => {}
            }
        }
        let old_final: HashMap<u32, u32> = dirty
            .iter()
            .chain(&gone)
            .filter(|s| !self.labels[**s as usize].is_empty())
            .map(|s| (*s, *self.labels[*s as usize].last().expect("rounds stored")))
            .collect();
        for &s in &born {
            self.labels[s as usize] = vec![s; self.rounds + 1];
            dirty.insert(s);
        }
        for &s in &gone {
            self.labels[s as usize].clear();
        }
        for s in born.iter().chain(&gone) {
            dirty.extend(self.adj[*s as usize].iter().map(|(n, _, _)| *n));
        }
        dirty.retain(|s| self.live(*s));
        let out = if self.components {
            self.relink(dirty, &born, &gone, old_final)
        } else {
            self.propagate(dirty, &born, old_final)
        };
        // Free the slots nothing refers to any more: no replica, no edges (the graph is symmetric, so none into it
        // either), and, the labels being exact, no label names it.
        for s in touched {
            if self.live(s) || !self.adj[s as usize].is_empty() {
                continue;
            }
            self.present[s as usize] = 0;
            self.labels[s as usize].clear();
            self.slots.release(s);
        }
        out
    }

    /// The label changes of one epoch, as `(replica, old, new)` from the final labels before (`old_final`, for the
    /// replicas whose label may change) and after.
    fn changes(&self, old_final: HashMap<u32, u32>, born: &[u32]) -> Vec<LabelChange> {
        let born: std::collections::HashSet<u32> = born.iter().copied().collect();
        let mut out = Vec::new();
        for (s, old) in old_final {
            let new = self.labels[s as usize].last().copied();
            let old = if born.contains(&s) { None } else { Some(old) };
            if old != new {
                out.push((
                    self.slots.key(s).clone(),
                    old.map(|l| self.slots.key(l).clone()),
                    new.map(|l| self.slots.key(l).clone()),
                ));
            }
        }
        out
    }

    fn propagate(&mut self, dirty: BTreeSet<u32>, born: &[u32], mut old_final: HashMap<u32, u32>) -> Vec<LabelChange> {
        // Round by round: recompute the dirty replicas and the neighbours of those whose label changed the round
        // before; remember the final label of each before it changes.
        let is_born: std::collections::HashSet<u32> = born.iter().copied().collect();
        let mut changed: Vec<u32> = born.to_vec();
        // A round reads only the round before, so its replicas may be taken in any order: each once, marked in a
        // flag per slot (a set ordered by slot cost most of a whole layer's first build).
        let mut marked = std::mem::take(&mut self.marked);
        marked.resize(self.labels.len(), false);
        let mut todo: Vec<u32> = Vec::new();
        fn mark(s: u32, marked: &mut [bool], todo: &mut Vec<u32>) {
            if !std::mem::replace(&mut marked[s as usize], true) {
                todo.push(s);
            }
        }
        for round in 1..=self.rounds {
            todo.clear();
            for &s in &dirty {
                mark(s, &mut marked, &mut todo);
            }
            for &s in &changed {
                mark(s, &mut marked, &mut todo);
                for (n, _, m) in &self.adj[s as usize] {
                    if *m > 0 && self.live(*n) {
                        mark(*n, &mut marked, &mut todo);
                    }
                }
            }
            let mut now_changed = Vec::new();
            for &s in &todo {
                marked[s as usize] = false;
                let l = self.next(s, round);
                let slot = &mut self.labels[s as usize];
                if slot[round] != l || is_born.contains(&s) {
                    if round == self.rounds {
                        old_final.entry(s).or_insert(slot[round]);
                    }
                    slot[round] = l;
                    now_changed.push(s);
                }
            }
            changed = now_changed;
        }
        self.marked = marked;
        self.changes(old_final, born)
    }

    /// Strongest-link groups: re-picks the links of the `dirty` replicas (and drops those of the `gone`), then
    /// regroups every component that holds a replica whose link (or its weight), or a link into which, changed.
    fn relink(
        &mut self,
        dirty: BTreeSet<u32>,
        born: &[u32],
        gone: &[u32],
        mut old_final: HashMap<u32, u32>,
    ) -> Vec<LabelChange> {
        let mut seeds: BTreeSet<u32> = born.iter().copied().collect();
        let mut dirty = dirty;
        for &s in gone {
            if let Some((p, _)) = self.link[s as usize].take() {
                self.linked_from[p as usize].retain(|x| *x != s);
                seeds.insert(p);
            }
            for x in std::mem::take(&mut self.linked_from[s as usize]) {
                self.link[x as usize] = None;
                dirty.insert(x);
                seeds.insert(x);
            }
        }
        dirty.retain(|s| self.live(*s));
        for s in dirty {
            let new = self.strongest(s);
            let old = self.link[s as usize];
            if new == old {
                continue;
            }
            if let Some((p, _)) = old {
                self.linked_from[p as usize].retain(|x| *x != s);
                seeds.insert(p);
            }
            if let Some((p, _)) = new {
                self.linked_from[p as usize].push(s);
                seeds.insert(p);
            }
            self.link[s as usize] = new;
            seeds.insert(s);
        }
        let mut seen: std::collections::HashSet<u32> = std::collections::HashSet::default();
        for seed in seeds {
            if !self.live(seed) || seen.contains(&seed) {
                continue;
            }
            let mut comp = vec![seed];
            seen.insert(seed);
            let mut i = 0;
            while i < comp.len() {
                let s = comp[i] as usize;
                i += 1;
                for n in self.link[s].iter().map(|l| &l.0).chain(&self.linked_from[s]) {
                    if seen.insert(*n) {
                        comp.push(*n);
                    }
                }
            }
            // The component in replica order, its links as indices in it: the groups of the reference.
            comp.sort_by(|a, b| self.order(*a, *b));
            let at: HashMap<u32, usize> = comp.iter().enumerate().map(|(i, s)| (*s, i)).collect();
            let links: Vec<Option<(usize, u128)>> =
                comp.iter().map(|s| self.link[*s as usize].map(|(p, w)| (at[&p], w))).collect();
            let hashes: Vec<u64> = comp.iter().map(|s| self.hash[*s as usize]).collect();
            for (i, head) in link_groups(&links, &hashes, self.max).into_iter().enumerate() {
                let (s, label) = (comp[i], comp[head]);
                let slot = &mut self.labels[s as usize];
                if slot.first() != Some(&label) {
                    if let Some(old) = slot.first() {
                        old_final.entry(s).or_insert(*old);
                    }
                    *slot = vec![label];
                }
            }
        }
        for &s in born {
            old_final.entry(s).or_insert(s);
        }
        self.changes(old_final, born)
    }

    /// A live replica's strongest link with its weight, by the reference's rule ([`super::strongest_link`]).
    fn strongest(&self, s: u32) -> Option<(u32, u128)> {
        // The total weight per neighbour (a neighbour may come more than once), grouped by slot; names are compared
        // only between the neighbours that tie for the heaviest.
        let mut links: Vec<(u32, u128)> = self.adj[s as usize]
            .iter()
            .filter(|(n, _, m)| *m > 0 && self.live(*n))
            .map(|(n, w, m)| (*n, u128::from(*w) * *m as u128))
            .collect();
        links.sort_unstable_by_key(|l| l.0);
        let mut best: Option<(u32, u128)> = None;
        for group in links.chunk_by(|a, b| a.0 == b.0) {
            let (n, w) = (group[0].0, group.iter().map(|l| l.1).sum::<u128>());
            let better = best.is_none_or(|(bn, bw)| w > bw || (w == bw && self.slots.key(n) < self.slots.key(bn)));
            if better {
                best = Some((n, w));
            }
        }
        best
    }

    /// The label of live replica `s` after `round`, from its neighbours' labels after the round before.
    fn next(&self, s: u32, round: usize) -> u32 {
        let own = self.labels[s as usize][round - 1];
        if !active(self.slots.key(s), round - 1) {
            return own;
        }
        let mut votes: Vec<(u32, u128)> = Vec::new();
        for (n, w, m) in &self.adj[s as usize] {
            if *m > 0 && self.live(*n) {
                votes.push((self.labels[*n as usize][round - 1], u128::from(*w) * *m as u128));
            }
        }
        if votes.is_empty() {
            return own;
        }
        votes.sort_unstable();
        let mut totals: Vec<(u32, u128)> = Vec::new();
        for (l, w) in votes {
            match totals.last_mut() {
                Some((pl, pw)) if *pl == l => *pw += w,
                _ => totals.push((l, w)),
            }
        }
        let best = totals.iter().map(|t| t.1).max().expect("votes");
        if totals.iter().any(|(l, w)| *l == own && *w == best) {
            return own;
        }
        totals
            .iter()
            .filter(|(_, w)| *w == best)
            .map(|(l, _)| *l)
            .min_by(|a, b| self.order(*a, *b))
            .expect("a heaviest label")
    }

    fn order(&self, a: u32, b: u32) -> Ordering {
        self.slots.key(a).cmp(self.slots.key(b))
    }

    /// Every live replica's label.
    pub fn labels(&self) -> Vec<(Replica, Replica)> {
        (0..self.slots.capacity() as u32)
            .filter(|s| self.live(*s) && self.slots.holds(*s))
            .map(|s| {
                let l = *self.labels[s as usize].last().expect("a live replica has a label");
                (self.slots.key(s).clone(), self.slots.key(l).clone())
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::name::Name;

    fn rep(i: usize) -> Replica {
        (format!("n{:02}", i / 2).into(), if i.is_multiple_of(2) { Name::default() } else { format!("c{i}").into() })
    }

    /// Seeded random replica and edge inserts and deletes (slots freed and reused on the way): after every batch
    /// the incremental labels equal a from-scratch run over the same graph.
    #[test]
    fn incremental_labels_equal_from_scratch() {
        incremental_equals_from_scratch(|| Lpa::new(12));
    }

    #[test]
    fn incremental_components_equal_from_scratch() {
        incremental_equals_from_scratch(|| Lpa::components(4));
    }

    fn incremental_equals_from_scratch(make: impl Fn() -> Lpa) {
        for seed in 0..6 {
            let mut rng = StdRng::seed_from_u64(seed);
            let mut lpa = make();
            let mut live: BTreeMap<usize, ()> = BTreeMap::new();
            let mut edges: BTreeMap<(usize, usize), u64> = BTreeMap::new();
            let mut labels: BTreeMap<Replica, Replica> = BTreeMap::new();
            let mut spread = 0;
            for _ in 0..40 {
                let mut batch = Vec::new();
                for _ in 0..rng.gen_range(1..12) {
                    let a = rng.gen_range(0..60);
                    match rng.gen_range(0..10) {
                        0..=1 => {
                            if live.remove(&a).is_some() {
                                batch.push(((rep(a), None), -1));
                                let gone: Vec<_> = edges.keys().filter(|(u, v)| *u == a || *v == a).copied().collect();
                                for (u, v) in gone {
                                    let w = edges.remove(&(u, v)).unwrap();
                                    batch.push(((rep(u), Some((rep(v), w))), -1));
                                    batch.push(((rep(v), Some((rep(u), w))), -1));
                                }
                            }
                        }
                        2..=4 => {
                            if live.insert(a, ()).is_none() {
                                batch.push(((rep(a), None), 1));
                            }
                        }
                        _ => {
                            let b = (a / 8) * 8 + rng.gen_range(0..8);
                            let (u, v) = (a.min(b), a.max(b));
                            if u == v || !live.contains_key(&u) || !live.contains_key(&v) {
                                continue;
                            }
                            if let Some(w) = edges.remove(&(u, v)) {
                                batch.push(((rep(u), Some((rep(v), w))), -1));
                                batch.push(((rep(v), Some((rep(u), w))), -1));
                            }
                            if rng.gen_bool(0.8) {
                                let w = rng.gen_range(1..4);
                                edges.insert((u, v), w);
                                batch.push(((rep(u), Some((rep(v), w))), 1));
                                batch.push(((rep(v), Some((rep(u), w))), 1));
                            }
                        }
                    }
                }
                for (r, old, new) in lpa.apply(batch) {
                    assert_eq!(labels.get(&r), old.as_ref(), "seed {seed}: the old label of {r:?}");
                    match new {
                        Some(l) => labels.insert(r, l),
                        None => labels.remove(&r),
                    };
                }
                let mut scratch = make();
                let mut all: Vec<_> = live.keys().map(|a| ((rep(*a), None), 1)).collect();
                for ((u, v), w) in &edges {
                    all.push(((rep(*u), Some((rep(*v), *w))), 1));
                    all.push(((rep(*v), Some((rep(*u), *w))), 1));
                }
                let fresh: BTreeMap<Replica, Replica> =
                    scratch.apply(all).into_iter().map(|(r, _, l)| (r, l.expect("a live replica"))).collect();
                assert_eq!(labels, fresh, "seed {seed}");
                assert_eq!(lpa.labels().into_iter().collect::<BTreeMap<_, _>>(), fresh, "seed {seed}");
                let distinct: BTreeSet<&Replica> = fresh.values().collect();
                spread += usize::from(distinct.len() < live.len());
            }
            assert!(spread >= 10, "seed {seed}: labels spread after only {spread} of 40 batches");
        }
    }
}
