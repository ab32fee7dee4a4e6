//! Interned keys for the stateful operators and indexes: each key gets a `u32` slot, and a released slot is reused,
//! so that per-slot state can live in plain vectors and the hot loops compare integers instead of strings.

use std::borrow::Borrow;
use std::hash::{BuildHasher, Hash};

pub use crate::fasthash::{HashMap, HashSet};

/// Adds `d` to slot `k`'s multiplicity in `map`, removing it at zero.
pub fn bump(map: &mut HashMap<u32, isize>, k: u32, d: isize) {
    let n = map.entry(k).or_default();
    *n += d;
    if *n == 0 {
        map.remove(&k);
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
