//! [`Name`]: a shared, immutable string for the ids and texts that cross the structure's operators (spaces, nodes,
//! clusters, replicas' components, texts). A clone is a reference count, not an allocation and a copy, so a row
//! copied into an arrangement, a join's output or an operator's state holds the one text its name was made from.
//! A name is one pointer wide ([`ArcStr`]: its length sits in the shared allocation), so every row, key and slot
//! table that holds names holds half the bytes an `Arc<str>` would.
//! Equality, order and hashing are the string's, so anything keyed or sorted by names is exactly what it was with
//! `String`s.

use std::borrow::Borrow;
use std::collections::HashSet;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;

use arcstr::ArcStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

#[derive(Clone)]
pub struct Name(ArcStr);

impl Name {
    pub fn new(s: &str) -> Self {
        if s.is_empty() {
            return Name::default();
        }
        Name(ArcStr::from(s))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// How many names share this one's text.
    pub fn shares(&self) -> usize {
        // The empty name is a static literal, held by every default and never freed.
        ArcStr::strong_count(&self.0).unwrap_or(usize::MAX)
    }
}

impl Default for Name {
    /// The empty name, a static literal: no allocation, and a clone touches no count.
    fn default() -> Self {
        Name(ArcStr::new())
    }
}

impl Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for Name {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl PartialEq for Name {
    fn eq(&self, other: &Self) -> bool {
        ArcStr::ptr_eq(&self.0, &other.0) || *self.0 == *other.0
    }
}

impl Eq for Name {}

impl PartialEq<str> for Name {
    fn eq(&self, other: &str) -> bool {
        &*self.0 == other
    }
}

impl PartialEq<String> for Name {
    fn eq(&self, other: &String) -> bool {
        *self.0 == **other
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, other: &&str) -> bool {
        &*self.0 == *other
    }
}

impl PartialOrd for Name {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Name {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        if ArcStr::ptr_eq(&self.0, &other.0) {
            return std::cmp::Ordering::Equal;
        }
        self.0.cmp(&other.0)
    }
}

impl Hash for Name {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (*self.0).hash(state)
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&*self.0, f)
    }
}

impl From<&str> for Name {
    fn from(s: &str) -> Self {
        Name::new(s)
    }
}

impl From<String> for Name {
    fn from(s: String) -> Self {
        if s.is_empty() {
            return Name::default();
        }
        Name(ArcStr::from(s))
    }
}

impl From<&String> for Name {
    fn from(s: &String) -> Self {
        Name::new(s)
    }
}

impl From<Name> for String {
    fn from(n: Name) -> Self {
        n.as_str().to_string()
    }
}

impl Serialize for Name {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d).map(Name::from)
    }
}

/// Makes equal strings one [`Name`]: the names that enter a dataflow go through one, so every row that carries a
/// space, node or text shares its allocation. [`Interner::sweep`] forgets the names nothing else holds any more.
#[derive(Default, Clone, Debug)]
pub struct Interner {
    names: HashSet<Name, foldhash::fast::RandomState>,
    /// The size after the last sweep; the next comes when the set has doubled.
    swept: usize,
}

impl Interner {
    pub fn name(&mut self, s: &str) -> Name {
        if let Some(n) = self.names.get(s) {
            return n.clone();
        }
        let n = Name::new(s);
        self.names.insert(n.clone());
        n
    }

    /// The names, interned, of a `String` (no copy when it is new).
    pub fn take(&mut self, s: String) -> Name {
        if let Some(n) = self.names.get(s.as_str()) {
            return n.clone();
        }
        let n = Name::from(s);
        self.names.insert(n.clone());
        n
    }

    /// The interned name equal to `n`, or `n` itself (its allocation shared, not copied) when it is new.
    pub fn adopt(&mut self, n: Name) -> Name {
        if let Some(have) = self.names.get(n.as_str()) {
            return have.clone();
        }
        self.names.insert(n.clone());
        n
    }

    /// Forgets the names only the interner holds, once it has doubled since it last did.
    pub fn sweep(&mut self) {
        if self.names.len() < 2 * self.swept.max(1024) {
            return;
        }
        self.names.retain(|n| n.shares() > 1);
        self.swept = self.names.len();
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_compares_orders_and_hashes_as_its_string() {
        let words = ["", "a", "b", "ab", "a#1", "L1:ff", "é"];
        for x in words {
            for y in words {
                let (nx, ny) = (Name::from(x), Name::from(y));
                assert_eq!(nx == ny, x == y);
                assert_eq!(nx.cmp(&ny), x.cmp(y));
            }
            let h = |v: &dyn Fn(&mut std::collections::hash_map::DefaultHasher)| {
                let mut s = std::collections::hash_map::DefaultHasher::new();
                v(&mut s);
                s.finish()
            };
            assert_eq!(h(&|s| Name::from(x).hash(s)), h(&|s| x.hash(s)));
            let json = serde_json::to_string(&Name::from(x)).unwrap();
            assert_eq!(json, serde_json::to_string(x).unwrap());
            assert_eq!(serde_json::from_str::<Name>(&json).unwrap(), x);
        }
    }

    #[test]
    fn the_interner_shares_equal_names_and_forgets_the_unheld() {
        let mut i = Interner::default();
        let a = i.name("space");
        let b = i.take("space".to_string());
        assert!(ArcStr::ptr_eq(&a.0, &b.0));
        assert_eq!(std::mem::size_of::<Name>(), std::mem::size_of::<usize>());
        drop((a, b));
        let kept: Vec<Name> = (0..3000).map(|k| i.name(&format!("n{k}"))).filter(|n| n.len() % 2 == 0).collect();
        i.sweep();
        assert!(i.len() <= kept.len() + 1, "{} names left, {} held", i.len(), kept.len());
        assert!(kept.iter().all(|n| i.names.contains(n.as_str())));
    }
}
