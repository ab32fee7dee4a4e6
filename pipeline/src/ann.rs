//! The views' nearest-neighbour index over one space's layer-0 embeddings ([`operators::hnsw`]): what retrieval reads instead of
//! every node once a space holds `query.exhaustive-below` nodes, so that a query costs an index lookup and a bounded
//! candidate set, not a pass over the memory. Below that size retrieval stays exact (a pass costs less than a walk).
//!
//! Nodes with the same vector (identical texts: a transcript's repeated backchannel turns, a re-published article)
//! share one point of the index, which names them all: a plateau of equal scores is one point for the walk instead of
//! hundreds that crowd the search's candidate list, and a search expands a point to its nodes.
//!
//! HNSW cannot delete: a point whose nodes all left or were replaced is tombstoned and filtered out of searches
//! (and taken up again by a node that comes with its vector), and the index is rebuilt from the live nodes when
//! tombstones outnumber the live points.
//!
//! In the engine an index is built aside ([`AnnParams::build_aside`]): the views hand a copy of the space's vectors
//! to a thread of its own ([`IndexBuild`]), go on applying epochs and serving (a space without its index is read
//! exactly, an index being rebuilt keeps serving with its tombstones), and take the built index when it is done,
//! brought up to date with what changed meanwhile ([`NodeAnn::catch_up`]). So neither a space that crosses
//! `exhaustive-below` nor a restart from a checkpoint waits for an index over the whole space.

use std::collections::HashMap;

use operators::hnsw::{Graph, Hnsw};
use operators::{Embedding, Name, Node};
use serde::{Deserialize, Serialize};

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
    pub nodes: Vec<(Name, Embedding)>,
}

/// A built index, with the vectors it was built over (to catch up with what changed since).
pub struct BuiltIndex {
    pub space: String,
    pub index: NodeAnn,
    pub nodes: Vec<(Name, Embedding)>,
}

impl IndexBuild {
    /// Builds the index.
    pub fn run(self) -> BuiltIndex {
        let mut index = NodeAnn::empty(&self.params, self.nodes.len());
        for (id, e) in &self.nodes {
            index.place(id, e);
        }
        BuiltIndex { space: self.space, index, nodes: self.nodes }
    }
}

/// A [`NodeAnn`] as a checkpoint holds it: the graph, and each point's nodes (their vector is theirs in the views)
/// or, for a tombstone, its vector.
#[derive(Serialize, Deserialize)]
pub struct AnnState {
    graph: Graph,
    points: Vec<AnnPoint>,
}

#[derive(Serialize, Deserialize)]
enum AnnPoint {
    Nodes(Vec<String>),
    Tombstone(Embedding),
}

pub struct NodeAnn {
    hnsw: Hnsw,
    /// Point → the live nodes that have its vector, sorted (none: a tombstone). The names are the views' own,
    /// shared; the vector is the graph's point.
    points: Vec<Vec<Name>>,
    /// A vector's hash → the points with a vector of that hash.
    by_vector: HashMap<u64, Vec<usize>>,
    /// Live node → its point.
    live: HashMap<Name, usize>,
    /// Points with at least one live node.
    live_points: usize,
    ef_search: usize,
    params: AnnParams,
}

impl NodeAnn {
    /// An index over `nodes` (id, embedding).
    pub fn build<'a>(params: &AnnParams, nodes: impl Iterator<Item = (&'a Name, &'a Embedding)>) -> Self {
        let nodes: Vec<(&Name, &Embedding)> = nodes.collect();
        let mut ann = NodeAnn::empty(params, nodes.len());
        for (id, e) in nodes {
            ann.insert(id, e);
        }
        ann
    }

    /// An empty index sized for `n` nodes.
    fn empty(params: &AnnParams, n: usize) -> Self {
        NodeAnn {
            hnsw: Hnsw::new(params.max_connections, params.ef_construction, n),
            points: Vec::new(),
            by_vector: HashMap::new(),
            live: HashMap::with_capacity(n),
            live_points: 0,
            ef_search: params.ef_search,
            params: params.clone(),
        }
    }

    /// Brings an index built over `built` (id, vector) up to date with the space's nodes now: what left is
    /// tombstoned, what changed or came is inserted. Costs a look-up per node, and an insertion per change.
    pub fn catch_up(
        &mut self,
        built: &[(Name, Embedding)],
        now: &operators::fasthash::HashMap<Name, (operators::Node, Embedding)>,
    ) {
        for (id, e) in built {
            match now.get(id.as_str()) {
                Some((_, current)) if current == e => {}
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

    /// Whether tombstones outnumber the live points (the index should be rebuilt).
    pub fn worn(&self) -> bool {
        let dead = self.points.len() - self.live_points;
        dead > 1024 && dead > self.live_points
    }

    /// How many live nodes the index holds.
    pub fn len(&self) -> usize {
        self.live.len()
    }

    /// How many points (distinct vectors, tombstones included) the walk reads.
    pub fn points(&self) -> usize {
        self.points.len()
    }

    /// How many candidates retrieval reads of each kind.
    pub fn candidates(&self) -> usize {
        self.params.candidates
    }

    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Files `id` (not live; a zero vector is not filed) under the point of its vector: an existing point (live, or a
    /// tombstone taken up again) or a new one, inserted into the graph.
    fn place(&mut self, id: &Name, emb: &Embedding) {
        if emb.is_zero() {
            return;
        }
        let slots = self.by_vector.entry(emb.content_hash()).or_default();
        let slot = match slots.iter().find(|s| self.hnsw.point(**s as u32) == emb) {
            Some(s) => *s,
            None => {
                let point = self.hnsw.insert(emb.clone()) as usize;
                self.points.push(Vec::new());
                slots.push(point);
                point
            }
        };
        let ids = &mut self.points[slot];
        if ids.is_empty() {
            self.live_points += 1;
        }
        if let Err(at) = ids.binary_search_by(|x| x.as_str().cmp(id)) {
            ids.insert(at, id.clone());
        }
        self.live.insert(id.clone(), slot);
    }

    /// Adds (or replaces) a node. A node with no features (a zero vector) is not indexed: it is nobody's neighbour.
    pub fn insert(&mut self, id: &Name, emb: &Embedding) {
        self.remove(id);
        self.place(id, emb);
    }

    /// Takes a node out (its point is tombstoned when it was the last to have that vector); returns whether the
    /// index should be rebuilt (tombstones outnumber the live points).
    pub fn remove(&mut self, id: &str) -> bool {
        if let Some(slot) = self.live.remove(id) {
            let ids = &mut self.points[slot];
            if let Ok(at) = ids.binary_search_by(|x| x.as_str().cmp(id)) {
                ids.remove(at);
            }
            if ids.is_empty() {
                self.live_points -= 1;
            }
        }
        self.worn()
    }

    /// The index rebuilt over the live nodes (their embeddings from `embedding`).
    pub fn rebuilt<'a>(&self, embedding: impl Fn(&str) -> Option<&'a Embedding>) -> Self {
        let mut ids: Vec<&Name> = self.live.keys().collect();
        ids.sort();
        let nodes: Vec<(&Name, &Embedding)> = ids.into_iter().filter_map(|id| Some((id, embedding(id)?))).collect();
        NodeAnn::build(&self.params, nodes.into_iter())
    }

    /// The index as a checkpoint holds it ([`NodeAnn::restore`] gives it back).
    pub fn state(&self) -> AnnState {
        let points = self
            .points
            .iter()
            .enumerate()
            .map(|(p, ids)| match ids.as_slice() {
                [] => AnnPoint::Tombstone(self.hnsw.point(p as u32).clone()),
                ids => AnnPoint::Nodes(ids.iter().map(Name::to_string).collect()),
            })
            .collect();
        AnnState { graph: self.hnsw.graph(), points }
    }

    /// The index a checkpoint held, over the space's nodes now (the restored views'): a point's vector is its
    /// nodes' (shared with the views, not a copy). A state that does not fit the nodes — a node missing, filed
    /// twice or under a point of another vector, an indexable node left out, a graph that does not fit its points —
    /// is an error, and the index is built from the nodes instead.
    pub fn restore(
        params: &AnnParams,
        state: AnnState,
        nodes: &operators::fasthash::HashMap<Name, (Node, Embedding)>,
    ) -> Result<NodeAnn, String> {
        // The graph comes whole from the state: the empty index sizes nothing for it.
        let mut ann = NodeAnn::empty(params, 0);
        ann.live.reserve(nodes.len());
        let mut vectors = Vec::with_capacity(state.points.len());
        for (p, point) in state.points.into_iter().enumerate() {
            let ids = match point {
                AnnPoint::Tombstone(e) => {
                    vectors.push(e);
                    ann.points.push(Vec::new());
                    continue;
                }
                AnnPoint::Nodes(ids) => ids,
            };
            let mut names: Vec<Name> = Vec::with_capacity(ids.len());
            for id in &ids {
                let Some((name, (_, e))) = nodes.get_key_value(id.as_str()) else {
                    return Err(format!("point {p} names {id}, which is not a node"));
                };
                if e.is_zero() || names.first().is_some_and(|f| nodes[f].1 != *e) {
                    return Err(format!("node {id} is filed under a point of another vector"));
                }
                if names.last().is_some_and(|l| l.as_str() >= id.as_str()) {
                    return Err(format!("point {p}'s nodes are not sorted and distinct"));
                }
                if ann.live.insert(name.clone(), p).is_some() {
                    return Err(format!("node {id} is filed twice"));
                }
                names.push(name.clone());
            }
            let Some(first) = names.first() else { return Err(format!("point {p} names no node")) };
            vectors.push(nodes[first].1.clone());
            ann.points.push(names);
            ann.live_points += 1;
        }
        let indexable = nodes.values().filter(|(_, e)| !e.is_zero()).count();
        if ann.live.len() != indexable {
            return Err(format!("{} nodes filed of {indexable}", ann.live.len()));
        }
        for (p, e) in vectors.iter().enumerate() {
            ann.by_vector.entry(e.content_hash()).or_default().push(p);
        }
        ann.hnsw = Hnsw::with_graph(params.max_connections, params.ef_construction, vectors, state.graph)?;
        Ok(ann)
    }

    /// The `k` live nodes nearest to `q` as far as the walk finds them: `(cosine, id)`, best first, ties by id (a
    /// point's nodes, which share its score, in id order).
    pub fn search(&self, q: &Embedding, k: usize) -> Vec<(f32, &str)> {
        if k == 0 || self.live.is_empty() || q.is_zero() {
            return Vec::new();
        }
        let ef = self.ef_search.max(k);
        let tombstones = self.points.len() > self.live_points;
        let filter = |p: u32| self.points.get(p as usize).is_some_and(|ids| !ids.is_empty());
        let hits = self.hnsw.search_where(q, k, ef, tombstones.then_some(&filter));
        let mut out: Vec<(f32, &str)> = Vec::with_capacity(k);
        for (p, d) in hits {
            let Some(ids) = self.points.get(p as usize) else { continue };
            // Only a point's first k nodes by id can be among the k best.
            out.extend(ids.iter().take(k).map(|id| (1.0 - d, id.as_str())));
        }
        out.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        out.truncate(k);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use operators::{Embedder, HashEmbedder};

    /// The index finds a node's own text first, forgets removed nodes, and answers the same after a rebuild.
    #[test]
    fn the_index_finds_forgets_and_rebuilds() {
        let emb = HashEmbedder::default();
        let texts: Vec<(Name, Embedding)> = (0..3000)
            .map(|i| {
                let t = format!("story {} about topic{} and word{} w{}", i, i % 37, i % 101, i % 7);
                (Name::from(format!("n{i:05}")), emb.embed(&t))
            })
            .collect();
        let params = AnnParams { exhaustive_below: 0, ..AnnParams::default() };
        let mut ann = NodeAnn::build(&params, texts.iter().map(|(id, e)| (id, e)));
        assert_eq!(ann.len(), 3000);
        let found = (0..3000).step_by(97).filter(|i| ann.search(&texts[*i].1, 5)[0].1 == texts[*i].0.as_str()).count();
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

    /// Nodes with the same vector share one point: a plateau is found whole, in id order, whether the index was
    /// built in place or aside; a point all of whose nodes left is a tombstone that a node with its vector takes up
    /// again.
    #[test]
    fn identical_vectors_share_one_point() {
        let emb = HashEmbedder::default();
        let mut nodes: Vec<(Name, Embedding)> = (0..1500)
            .map(|i| {
                (
                    Name::from(format!("n{i:05}")),
                    emb.embed(&format!("story {} about topic{} and word{}", i, i % 37, i % 101)),
                )
            })
            .collect();
        // 500 turns of one backchannel, each embedded on its own (equal values, separate allocations).
        nodes.extend((0..500).map(|i| (Name::from(format!("y{i:03}")), emb.embed("mm-hmm coffee break ."))));
        let params = AnnParams { exhaustive_below: 0, ..AnnParams::default() };
        let built = IndexBuild { space: "s".into(), params: params.clone(), nodes: nodes.clone() }.run().index;
        let mut ann = NodeAnn::build(&params, nodes.iter().map(|(id, e)| (id, e)));
        let yeah = emb.embed("mm-hmm coffee break .");
        let first: Vec<String> = (0..10).map(|i| format!("y{i:03}")).collect();
        for ix in [&built, &ann] {
            assert_eq!((ix.len(), ix.points()), (2000, 1501));
            let hits: Vec<&str> = ix.search(&yeah, 10).into_iter().map(|h| h.1).collect();
            assert_eq!(hits, first, "the plateau, in id order");
        }
        for i in (0..500).filter(|i| *i != 250) {
            ann.remove(&format!("y{i:03}"));
        }
        assert_eq!(ann.search(&yeah, 3)[0].1, "y250");
        ann.remove("y250");
        assert!(ann.search(&yeah, 20).iter().all(|h| !h.1.starts_with('y')), "a tombstone is never a hit");
        assert_eq!((ann.len(), ann.points()), (1500, 1501));
        ann.insert(&"z".into(), &emb.embed("mm-hmm coffee break ."));
        assert_eq!((ann.len(), ann.points()), (1501, 1501), "the tombstone is taken up again");
        assert_eq!(ann.search(&yeah, 1)[0].1, "z");
        // A node replaced by another vector leaves its point.
        ann.insert(&"z".into(), &emb.embed("something else entirely"));
        assert!(ann.search(&yeah, 5).iter().all(|h| h.1 != "z"));
    }
}
