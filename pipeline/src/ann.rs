//! The views' nearest-neighbour index over one space's layer-0 embeddings (hnsw_rs): what retrieval reads instead of
//! every node once a space holds `query.exhaustive-below` nodes, so that a query costs an index lookup and a bounded
//! candidate set, not a pass over the memory. Below that size retrieval stays exact (a pass costs less than a walk).
//!
//! hnsw_rs cannot delete: a removed or replaced node's slot is tombstoned and filtered out of searches, and the index
//! is rebuilt from the live nodes when tombstones outnumber them.
//!
//! In the engine an index is built aside ([`AnnParams::build_aside`]): the views hand a copy of the space's vectors
//! to a thread of its own ([`IndexBuild`]), go on applying epochs and serving (a space without its index is read
//! exactly, an index being rebuilt keeps serving with its tombstones), and take the built index when it is done,
//! brought up to date with what changed meanwhile ([`NodeAnn::catch_up`]). So neither a space that crosses
//! `exhaustive-below` nor a restart from a checkpoint waits for an index over the whole space.

use std::collections::HashMap;

use hnsw_rs::prelude::Hnsw;
use operators::model::UnitCosine;
use operators::Embedding;

/// The index's parameters (`query.ann-*` keys).
#[derive(Clone, Debug)]
pub struct AnnParams {
    /// A space is indexed once it holds this many layer-0 nodes (and dropped again below half of it).
    pub exhaustive_below: usize,
    pub max_connections: usize,
    pub ef_construction: usize,
    pub ef_search: usize,
    /// Over an indexed space, retrieval reads this many nearest nodes by cosine and this many best by BM25, with the
    /// nodes beside each in its document.
    pub candidates: usize,
    /// Whether indexes are built on a thread of their own ([`IndexBuild`]) rather than within the apply that needs
    /// them (the engine: a build over a large space takes seconds).
    pub build_aside: bool,
}

impl Default for AnnParams {
    fn default() -> Self {
        AnnParams {
            exhaustive_below: usize::MAX,
            max_connections: 16,
            ef_construction: 64,
            ef_search: 64,
            candidates: 256,
            build_aside: false,
        }
    }
}

/// A space's index in its view, and whether one is being built aside for it. A copy of the view (what a query that
/// waits on the model reads, so that the views are not held meanwhile) has none and is read exactly: the copy already
/// costs a pass over the space.
#[derive(Default)]
pub struct AnnSlot {
    pub index: Option<NodeAnn>,
    /// An [`IndexBuild`] of this space is out: no second one is started until it is installed.
    pub building: bool,
}

impl Clone for AnnSlot {
    fn clone(&self) -> Self {
        AnnSlot::default()
    }
}

impl std::ops::Deref for AnnSlot {
    type Target = Option<NodeAnn>;
    fn deref(&self) -> &Self::Target {
        &self.index
    }
}

impl std::ops::DerefMut for AnnSlot {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.index
    }
}

/// An index to build aside: the space, and a copy of its layer-0 vectors (ids sorted) when the build was asked for.
pub struct IndexBuild {
    pub space: String,
    pub params: AnnParams,
    pub nodes: Vec<(String, Embedding)>,
}

/// A built index, with the vectors it was built over (to catch up with what changed since).
pub struct BuiltIndex {
    pub space: String,
    pub index: NodeAnn,
    pub nodes: Vec<(String, Embedding)>,
}

impl IndexBuild {
    /// Builds the index, inserting on every core (rayon).
    pub fn run(self) -> BuiltIndex {
        let mut index = NodeAnn::empty(&self.params, self.nodes.len());
        let live: Vec<(usize, &(String, Embedding))> =
            self.nodes.iter().filter(|(_, e)| !e.is_zero()).enumerate().collect();
        let data: Vec<(&[Embedding], usize)> =
            live.iter().map(|(slot, (_, e))| (std::slice::from_ref(e), *slot)).collect();
        index.hnsw.parallel_insert_slice(&data);
        for (slot, (id, _)) in live {
            index.slots.push(Some(id.clone()));
            index.live.insert(id.clone(), slot);
        }
        BuiltIndex { space: self.space, index, nodes: self.nodes }
    }
}

pub struct NodeAnn {
    hnsw: Hnsw<'static, Embedding, UnitCosine>,
    /// Slot → node id; `None` once the node left or was replaced (a tombstone).
    slots: Vec<Option<String>>,
    /// Live node → its slot.
    live: HashMap<String, usize>,
    ef_search: usize,
    params: AnnParams,
}

impl NodeAnn {
    /// An index over `nodes` (id, embedding).
    pub fn build<'a>(params: &AnnParams, nodes: impl Iterator<Item = (&'a String, &'a Embedding)>) -> Self {
        let nodes: Vec<(&String, &Embedding)> = nodes.collect();
        let mut ann = NodeAnn::empty(params, nodes.len());
        for (id, e) in nodes {
            ann.insert(id, e);
        }
        ann
    }

    /// An empty index sized for `n` nodes.
    fn empty(params: &AnnParams, n: usize) -> Self {
        NodeAnn {
            hnsw: Hnsw::new(params.max_connections, n.max(1024), 16, params.ef_construction, UnitCosine),
            slots: Vec::with_capacity(n),
            live: HashMap::with_capacity(n),
            ef_search: params.ef_search,
            params: params.clone(),
        }
    }

    /// Brings an index built over `built` (id, vector) up to date with the space's nodes now: what left is
    /// tombstoned, what changed or came is inserted. Costs a look-up per node, and an insertion per change.
    pub fn catch_up(
        &mut self,
        built: &[(String, Embedding)],
        now: &operators::fasthash::HashMap<String, (operators::Node, Embedding)>,
    ) {
        for (id, e) in built {
            match now.get(id) {
                Some((_, current)) if same(current, e) => {}
                Some((_, current)) => self.insert(id, current),
                None => {
                    self.remove(id);
                }
            }
        }
        let before: std::collections::HashSet<&str> = built.iter().map(|(id, _)| id.as_str()).collect();
        for (id, (_, e)) in now {
            if !before.contains(id.as_str()) {
                self.insert(id, e);
            }
        }
    }

    /// Whether tombstones outnumber the living (the index should be rebuilt).
    pub fn worn(&self) -> bool {
        let dead = self.slots.len() - self.live.len();
        dead > 1024 && dead > self.live.len()
    }

    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// How many candidates retrieval reads of each kind.
    pub fn candidates(&self) -> usize {
        self.params.candidates
    }

    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Adds (or replaces) a node. A node with no features (a zero vector) is not indexed: it is nobody's neighbour.
    pub fn insert(&mut self, id: &str, emb: &Embedding) {
        self.remove(id);
        if emb.is_zero() {
            return;
        }
        let slot = self.slots.len();
        self.hnsw.insert_slice((std::slice::from_ref(emb), slot));
        self.slots.push(Some(id.to_string()));
        self.live.insert(id.to_string(), slot);
    }

    /// Tombstones a node; returns whether the index should be rebuilt (tombstones outnumber the living).
    pub fn remove(&mut self, id: &str) -> bool {
        if let Some(slot) = self.live.remove(id) {
            self.slots[slot] = None;
        }
        self.worn()
    }

    /// The index rebuilt over the live nodes (their embeddings from `embedding`).
    pub fn rebuilt<'a>(&self, embedding: impl Fn(&str) -> Option<&'a Embedding>) -> Self {
        let mut ids: Vec<&String> = self.live.keys().collect();
        ids.sort();
        let nodes: Vec<(&String, &Embedding)> = ids.into_iter().filter_map(|id| Some((id, embedding(id)?))).collect();
        NodeAnn::build(&self.params, nodes.into_iter())
    }

    /// The `k` live nodes nearest to `q` as far as the walk finds them: `(cosine, id)`, best first.
    pub fn search(&self, q: &Embedding, k: usize) -> Vec<(f32, &str)> {
        if k == 0 || self.live.is_empty() || q.is_zero() {
            return Vec::new();
        }
        let ef = self.ef_search.max(k);
        let tombstones = self.slots.len() > self.live.len();
        let filter = |d: &usize| self.slots.get(*d).is_some_and(Option::is_some);
        // hnsw_rs filters after cutting to `k`: with tombstones, ask for more and cut here.
        let hits = if tombstones {
            self.hnsw.search_filter(std::slice::from_ref(q), k, ef, Some(&filter))
        } else {
            self.hnsw.search(std::slice::from_ref(q), k, ef)
        };
        let mut out: Vec<(f32, &str)> =
            hits.into_iter().filter_map(|h| Some((1.0 - h.distance, self.slots.get(h.d_id)?.as_deref()?))).collect();
        out.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        out.truncate(k);
        out
    }
}

/// Whether two vectors are the same: one allocation (the usual case: the views' vector is the one the build copied)
/// or equal values.
fn same(a: &Embedding, b: &Embedding) -> bool {
    std::sync::Arc::ptr_eq(&a.0, &b.0) || a == b
}

#[cfg(test)]
mod tests {
    use super::*;
    use operators::{Embedder, HashEmbedder};

    /// The index finds a node's own text first, forgets removed nodes, and answers the same after a rebuild.
    #[test]
    fn the_index_finds_forgets_and_rebuilds() {
        let emb = HashEmbedder::default();
        let texts: Vec<(String, Embedding)> = (0..3000)
            .map(|i| {
                let t = format!("story {} about topic{} and word{} w{}", i, i % 37, i % 101, i % 7);
                (format!("n{i:05}"), emb.embed(&t))
            })
            .collect();
        let params = AnnParams { exhaustive_below: 0, ..AnnParams::default() };
        let mut ann = NodeAnn::build(&params, texts.iter().map(|(id, e)| (id, e)));
        assert_eq!(ann.len(), 3000);
        let found = (0..3000).step_by(97).filter(|i| ann.search(&texts[*i].1, 5)[0].1 == texts[*i].0).count();
        assert!(found >= 30, "{found} of 31 nodes are their own nearest");
        for (id, _) in texts.iter().take(2000) {
            ann.remove(id);
        }
        let hits = ann.search(&texts[10].1, 10);
        assert!(hits.iter().all(|(_, id)| *id >= "n02000"), "a removed node is never a hit: {hits:?}");
        assert_eq!(hits.len(), 10);
        let by_id: HashMap<&str, &Embedding> = texts.iter().map(|(id, e)| (id.as_str(), e)).collect();
        let rebuilt = ann.rebuilt(|id| by_id.get(id).copied());
        assert_eq!(rebuilt.len(), 1000);
        assert_eq!(rebuilt.search(&texts[2500].1, 1)[0].1, "n02500");
    }
}
