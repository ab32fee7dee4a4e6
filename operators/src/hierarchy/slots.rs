//! Interned keys for the hierarchy's stateful operators: each key gets a `u32` slot, and a released slot is reused,
//! so that per-slot state can live in plain vectors and the hot loops compare integers instead of strings.

use std::borrow::Borrow;
use std::hash::Hash;

pub use crate::fasthash::{HashMap, HashSet};

/// Adds `d` to slot `k`'s multiplicity in `map`, removing it at zero.
pub fn bump(map: &mut HashMap<u32, isize>, k: u32, d: isize) {
    let n = map.entry(k).or_default();
    *n += d;
    if *n == 0 {
        map.remove(&k);
    }
}

#[derive(Default)]
pub struct Slots<K> {
    index: HashMap<K, u32>,
    keys: Vec<K>,
    free: Vec<u32>,
}

impl<K: Hash + Eq + Clone + Default> Slots<K> {
    /// The slot of `k`, taking a released one or a new one; `true` when the slot is new, so that the caller grows
    /// its per-slot vectors (a reused slot's state is whatever the caller left at release).
    pub fn intern<Q>(&mut self, k: &Q) -> (u32, bool)
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ToOwned<Owned = K> + ?Sized,
    {
        if let Some(s) = self.index.get(k) {
            return (*s, false);
        }
        let key = k.to_owned();
        let (s, new) = match self.free.pop() {
            Some(s) => {
                self.keys[s as usize] = key.clone();
                (s, false)
            }
            None => {
                self.keys.push(key.clone());
                ((self.keys.len() - 1) as u32, true)
            }
        };
        self.index.insert(key, s);
        (s, new)
    }

    /// Whether `k` holds a slot now.
    pub fn contains<Q>(&self, k: &Q) -> bool
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.index.contains_key(k)
    }

    /// The slot `k` holds now.
    pub fn get<Q>(&self, k: &Q) -> Option<u32>
    where
        K: Borrow<Q>,
        Q: Hash + Eq + ?Sized,
    {
        self.index.get(k).copied()
    }

    /// The key of a slot (a released slot keeps its key until it is reused).
    pub fn key(&self, s: u32) -> &K {
        &self.keys[s as usize]
    }

    pub fn release(&mut self, s: u32) {
        if self.index.get(&self.keys[s as usize]) == Some(&s) {
            self.index.remove(&self.keys[s as usize]);
            self.free.push(s);
        }
    }

    /// Whether `s` holds a key now.
    pub fn holds(&self, s: u32) -> bool {
        self.index.get(&self.keys[s as usize]) == Some(&s)
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
