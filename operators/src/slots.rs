//! Interned keys for the stateful operators and indexes: each key gets a `u32` slot, and a released slot is reused,
//! so that per-slot state can live in plain vectors and the hot loops compare integers instead of strings.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

pub use crate::fasthash::{HashMap, HashSet};

/// Room for one more element in `v`, grown by an eighth of its length rather than doubled: the per-node vectors
/// of the state (neighbours, members, edges) are many and small and mostly done growing, and a doubled vector
/// leaves a quarter of its room empty on average. The copies cost about eight per element over its growth.
pub fn reserve_one<T>(v: &mut Vec<T>) {
    if v.len() == v.capacity() {
        v.reserve_exact((v.len() / 8).max(2));
    }
}

/// A small map from slots to values, kept as a vector sorted by slot: a node's neighbours, a cluster's members, a
/// cluster's link counts. An entry costs its own bytes, where a hash map per node costs buckets, control bytes and
/// a table that only grows; the degrees it serves are tens, so a binary search is as quick as a hash. It iterates in
/// slot order.
#[derive(Clone, Debug)]
pub struct SlotMap<V> {
    entries: Vec<(u32, V)>,
}

impl<V> Default for SlotMap<V> {
    fn default() -> Self {
        SlotMap { entries: Vec::new() }
    }
}

impl<V: Copy> SlotMap<V> {
    fn find(&self, k: u32) -> Result<usize, usize> {
        self.entries.binary_search_by_key(&k, |e| e.0)
    }

    pub fn get(&self, k: u32) -> Option<V> {
        self.find(k).ok().map(|i| self.entries[i].1)
    }

    pub fn contains_key(&self, k: u32) -> bool {
        self.find(k).is_ok()
    }

    pub fn insert(&mut self, k: u32, v: V) {
        match self.find(k) {
            Ok(i) => self.entries[i].1 = v,
            Err(i) => {
                reserve_one(&mut self.entries);
                self.entries.insert(i, (k, v))
            }
        }
    }

    pub fn remove(&mut self, k: u32) -> Option<V> {
        let i = self.find(k).ok()?;
        let (_, v) = self.entries.remove(i);
        // A map that emptied out gives its room back (hubs shrink as well as grow).
        if self.entries.len() * 4 < self.entries.capacity() {
            self.entries.shrink_to(self.entries.len() * 2);
        }
        Some(v)
    }

    pub fn keys(&self) -> impl Iterator<Item = u32> + '_ {
        self.entries.iter().map(|e| e.0)
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, V)> + '_ {
        self.entries.iter().copied()
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Multiplicities by slot.
pub type Multiplicities = SlotMap<i32>;

/// A multiplicity as the compact state keeps it: the rows that join the same ends, a handful, never 2^31.
pub fn multiplicity(n: isize) -> i32 {
    i32::try_from(n).expect("a multiplicity within i32")
}

/// Adds `d` to slot `k`'s multiplicity in `map`, removing it at zero.
pub fn bump(map: &mut Multiplicities, k: u32, d: isize) {
    let n = map.get(k).unwrap_or(0) as isize + d;
    if n == 0 {
        map.remove(k);
    } else {
        map.insert(k, multiplicity(n));
    }
}

/// Rows with multiplicities: an edge's weight rows, nearly always one, which lives inline in 16 bytes. Two or more
/// rows (a weight change within an epoch) go to the heap.
#[derive(Clone, Debug, PartialEq)]
pub enum Rows<K> {
    One(K, i32),
    // A thin pointer: a `Vec` inline would make every entry, the one-row ones too, 16 bytes longer.
    #[allow(clippy::box_collection)]
    Many(Box<Vec<(K, isize)>>),
}

impl<K: Copy + PartialEq> Rows<K> {
    pub fn iter(&self) -> impl Iterator<Item = (K, isize)> + '_ {
        let (one, many) = match self {
            Rows::One(k, n) => (Some((*k, *n as isize)), &[][..]),
            Rows::Many(rows) => (None, &rows[..]),
        };
        one.into_iter().chain(many.iter().copied())
    }

    /// Adds `d` to row `k`; whether no row is left.
    pub fn bump(&mut self, k: K, d: isize) -> bool {
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
pub fn bump_rows<Q: Hash + Eq, K: Copy + PartialEq>(map: &mut HashMap<Q, Rows<K>>, key: Q, k: K, d: isize) {
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

/// Keys ↔ slots. Each key is stored once: the index holds slots only, hashed and compared through `keys`.
#[derive(Clone)]
pub struct Slots<K> {
    index: hashbrown::HashTable<u32>,
    hasher: foldhash::fast::RandomState,
    keys: Vec<K>,
    free: Vec<u32>,
}

impl<K> Default for Slots<K> {
    fn default() -> Self {
        Slots { index: hashbrown::HashTable::new(), hasher: Default::default(), keys: Vec::new(), free: Vec::new() }
    }
}

impl<K: Hash + Eq + Clone + Default> Slots<K> {
    fn hash<Q: Hash + ?Sized>(&self, k: &Q) -> u64 {
        self.hasher.hash_one(k)
    }

    /// The slot of `k`, taking a released one or a new one; `true` when the slot is new, so that the caller grows
    /// its per-slot vectors (a reused slot's state is whatever the caller left at release).
    pub fn intern<Q>(&mut self, k: &Q) -> (u32, bool)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        let hash = self.hash(k);
        if let Some(s) = self.index.find(hash, |&s| self.keys[s as usize].borrow() == k) {
            return (*s, false);
        }
        let key = k.to_owned();
        let (s, new) = match self.free.pop() {
            Some(s) => {
                self.keys[s as usize] = key;
                (s, false)
            }
            None => {
                self.keys.push(key);
                ((self.keys.len() - 1) as u32, true)
            }
        };
        let (keys, hasher) = (&self.keys, &self.hasher);
        self.index.insert_unique(hash, s, |&x| hasher.hash_one(&keys[x as usize]));
        (s, new)
    }

    /// Whether `k` holds a slot now.
    pub fn contains<Q>(&self, k: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.get(k).is_some()
    }

    /// The slot `k` holds now.
    pub fn get<Q>(&self, k: &Q) -> Option<u32>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.index.find(self.hash(k), |&s| self.keys[s as usize].borrow() == k).copied()
    }

    /// The key of a slot (a released slot keeps its key until it is reused).
    pub fn key(&self, s: u32) -> &K {
        &self.keys[s as usize]
    }

    pub fn release(&mut self, s: u32) {
        let hash = self.hash(&self.keys[s as usize]);
        if let Ok(entry) = self.index.find_entry(hash, |&x| x == s) {
            entry.remove();
            self.free.push(s);
        }
    }

    /// Whether `s` holds a key now.
    pub fn holds(&self, s: u32) -> bool {
        self.index.find(self.hash(&self.keys[s as usize]), |&x| x == s).is_some()
    }

    pub fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    /// How many keys hold a slot now.
    pub fn len(&self) -> usize {
        self.index.len()
    }

    /// How many slots were ever allocated (the length of per-slot vectors).
    pub fn capacity(&self) -> usize {
        self.keys.len()
    }
}

/// An ordered set that is a sorted vector while it is small and a B-tree once it is large: a set of a few elements
/// costs their own bytes (a B-tree's first leaf holds room for eleven), and a set of thousands (the members of one
/// repeated text, the lists that hold one of them) still inserts and removes in logarithmic time.
#[derive(Clone, Debug)]
pub enum SortedSet<T> {
    Small(Vec<T>),
    Large(std::collections::BTreeSet<T>),
}

/// A small set turns into a B-tree past this many elements, and back below half of it.
const LARGE_SET: usize = 32;

impl<T> Default for SortedSet<T> {
    fn default() -> Self {
        SortedSet::Small(Vec::new())
    }
}

impl<T: Ord> SortedSet<T> {
    /// Adds `x`; false if it was there.
    pub fn insert(&mut self, x: T) -> bool {
        match self {
            SortedSet::Small(v) => match v.binary_search(&x) {
                Ok(_) => false,
                Err(i) if v.len() < LARGE_SET => {
                    reserve_one(v);
                    v.insert(i, x);
                    true
                }
                Err(_) => {
                    let mut tree: std::collections::BTreeSet<T> = std::mem::take(v).into_iter().collect();
                    tree.insert(x);
                    *self = SortedSet::Large(tree);
                    true
                }
            },
            SortedSet::Large(t) => t.insert(x),
        }
    }

    /// Removes `x`; false if it was not there.
    pub fn remove<Q: Ord + ?Sized>(&mut self, x: &Q) -> bool
    where
        T: Borrow<Q>,
    {
        match self {
            SortedSet::Small(v) => match v.binary_search_by(|e| e.borrow().cmp(x)) {
                Ok(i) => {
                    v.remove(i);
                    if v.capacity() > 2 * v.len().max(2) {
                        v.shrink_to_fit();
                    }
                    true
                }
                Err(_) => false,
            },
            SortedSet::Large(t) => {
                let removed = t.remove(x);
                if t.len() < LARGE_SET / 2 {
                    *self = SortedSet::Small(std::mem::take(t).into_iter().collect());
                }
                removed
            }
        }
    }

    pub fn contains<Q: Ord + ?Sized>(&self, x: &Q) -> bool
    where
        T: Borrow<Q>,
    {
        match self {
            SortedSet::Small(v) => v.binary_search_by(|e| e.borrow().cmp(x)).is_ok(),
            SortedSet::Large(t) => t.contains(x),
        }
    }

    pub fn len(&self) -> usize {
        match self {
            SortedSet::Small(v) => v.len(),
            SortedSet::Large(t) => t.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn first(&self) -> Option<&T> {
        match self {
            SortedSet::Small(v) => v.first(),
            SortedSet::Large(t) => t.first(),
        }
    }

    /// The elements in order.
    pub fn iter(&self) -> impl Iterator<Item = &T> + '_ {
        self.below(None)
    }

    /// The elements below `bound` (all with `None`), in order.
    pub fn below<'a>(&'a self, bound: Option<&T>) -> impl Iterator<Item = &'a T> + 'a {
        let (small, large) = match self {
            SortedSet::Small(v) => {
                let end = bound.map_or(v.len(), |b| v.partition_point(|e| e < b));
                (Some(v[..end].iter()), None)
            }
            SortedSet::Large(t) => (
                None,
                Some(match bound {
                    Some(b) => t.range(..b),
                    None => t.range(..),
                }),
            ),
        };
        small.into_iter().flatten().chain(large.into_iter().flatten())
    }
}

impl<'a, T: Ord> IntoIterator for &'a SortedSet<T> {
    type Item = &'a T;
    type IntoIter = Box<dyn Iterator<Item = &'a T> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

impl<T: Ord + serde::Serialize> serde::Serialize for SortedSet<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl<T: Ord> IntoIterator for SortedSet<T> {
    type Item = T;
    type IntoIter = std::iter::Chain<
        std::iter::Flatten<std::option::IntoIter<std::vec::IntoIter<T>>>,
        std::iter::Flatten<std::option::IntoIter<std::collections::btree_set::IntoIter<T>>>,
    >;

    fn into_iter(self) -> Self::IntoIter {
        let (small, large) = match self {
            SortedSet::Small(v) => (Some(v.into_iter()), None),
            SortedSet::Large(t) => (None, Some(t.into_iter())),
        };
        small.into_iter().flatten().chain(large.into_iter().flatten())
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

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

    #[test]
    fn a_sorted_set_holds_what_a_btree_set_holds_small_or_large() {
        use std::collections::BTreeSet;
        for seed in 0..20 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let (mut set, mut model) = (SortedSet::default(), BTreeSet::<u32>::new());
            // Grown past the B-tree's threshold and shrunk back below it, more than once.
            let span = if seed % 2 == 0 { 16 } else { 120 };
            for step in 0..3000 {
                let x = rng.gen_range(0..span);
                let grow = (step / 500) % 2 == 0;
                if rng.gen_bool(if grow { 0.7 } else { 0.3 }) {
                    assert_eq!(set.insert(x), model.insert(x));
                } else {
                    assert_eq!(set.remove(&x), model.remove(&x));
                }
                assert_eq!(set.len(), model.len());
                assert_eq!(set.contains(&x), model.contains(&x));
                assert_eq!(set.first(), model.first());
                let b = rng.gen_range(0..span);
                assert!(set.below(Some(&b)).eq(model.range(..b)));
                assert!(set.iter().eq(model.iter()));
            }
            assert!(set.clone().into_iter().eq(model.clone().into_iter()));
        }
    }

    #[test]
    fn a_slot_map_holds_what_a_btree_map_holds_in_slot_order() {
        for seed in 0..20 {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            let (mut map, mut model) = (Multiplicities::default(), BTreeMap::<u32, isize>::new());
            for _ in 0..2000 {
                let (k, d) = (rng.gen_range(0..64u32), if rng.gen_bool(0.55) { 1 } else { -1 });
                bump(&mut map, k, d);
                let n = model.entry(k).or_default();
                *n += d;
                if *n == 0 {
                    model.remove(&k);
                }
                assert_eq!(
                    map.iter().map(|(k, v)| (k, v as isize)).collect::<Vec<_>>(),
                    model.clone().into_iter().collect::<Vec<_>>()
                );
                assert_eq!(map.get(k).map(|v| v as isize), model.get(&k).copied());
                assert_eq!(map.len(), model.len());
            }
            // Emptied, it gives its room back.
            for k in model.keys().copied().collect::<Vec<_>>() {
                bump(&mut map, k, -(model[&k]));
            }
            assert!(map.is_empty() && map.entries.capacity() <= 2, "{}", map.entries.capacity());
        }
    }
}
