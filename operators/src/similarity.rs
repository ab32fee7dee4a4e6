//! CAM's foundational network expansion: the layer-0 similarity graph.
//!
//! Score of two chunks: `S = α·max(0, cos) + (1−α)·exp(−(i−j)²/2σ²)`, the positional term only between chunks of one
//! document within the positional window `|i−j| ≤ ⌈3σ⌉` (beyond it the Gaussian is below 1.1 % and is cut to 0).
//! Every node keeps its `k` best neighbours with `S ≥ θ` (ties broken by id), and the graph's undirected edges are
//! the pairs where either end keeps the other. That definition depends only on the live set of nodes, so the
//! incrementally maintained graph is exactly the graph a from-scratch build of the same nodes gives:
//!
//! * an insert `w` computes its own neighbours, and enters the lists of the nodes it beats (any such node scores
//!   `S ≥ θ` with `w`, so it is among `w`'s candidates: the reverse lookup is exact);
//! * a delete `d` leaves the lists that held it; those nodes are recomputed from the index once the batch's inserts
//!   are in (a neighbour that drops below `k` finds its replacements).
//!
//! **Identical vectors share one entry** of the HNSW index (a *class*: "yeah ." said 6,000 times in a meeting
//! archive, a wire story re-published). Outside the positional window every member of a class scores the same with
//! any node, so a class answers for its members in one step: a node's own list takes a class's smallest ids, and an
//! insert enters only the members whose weakest neighbour it beats — each class keeps its members ordered by their
//! weakest neighbour, so an insert never walks the plateau of a tie it cannot win.
//!
//! Candidates come from an HNSW index ([`crate::hnsw`]) by a *range* query — every class with `cos ≥ θ/α` or above the
//! bar the lists set — grown until the last hit falls below the bound (an insert's reverse range is cut at
//! `max_reverse_classes`, nearest first), plus every node of the same document inside the positional window. The
//! index's points are the classes' shared embeddings (an `Arc` each, not a copy of the vector). HNSW cannot
//! delete: emptied classes are tombstoned, filtered out of searches, and the index is rebuilt when tombstones
//! outnumber the living.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::fasthash::{HashMap, HashSet};
use crate::hnsw::{Graph, Hnsw};
use crate::model::{Edge, Embedding, Node, POSITION_SCALE};
use crate::name::Name;
use crate::slots::SortedSet;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields, default)]
pub struct SimilarityParams {
    /// Weight of cosine similarity against positional proximity (CAM: 0.6).
    pub alpha: f32,
    /// Minimum score of an edge. CAM's code uses 0.6 with OpenAI embeddings; see `default.toml` for the hash
    /// embedder's calibration.
    pub theta: f32,
    /// Width of the positional Gaussian, in chunks (CAM: 1.0).
    pub sigma: f32,
    /// Neighbours kept per node (CAM: 10).
    pub k: usize,
    /// HNSW: links per node and layer.
    pub max_connections: usize,
    /// HNSW: candidate list while inserting; the main cost knob of ingest.
    pub ef_construction: usize,
    /// HNSW: candidate list while searching (at least the number of results asked for).
    pub ef_search: usize,
    /// Below this many live nodes a space is searched exhaustively: exact and faster than a graph walk.
    pub exhaustive_below: usize,
    /// The most vector classes an insert's reverse lookup asks the index for. A range that holds more (a dense
    /// region: one speaker's thousands of short turns) is cut to its nearest classes, as `ef-search` cuts a search:
    /// the cost of an insert stays bounded, and a weak node beyond the cut misses the newcomer until it is next
    /// recomputed. Ranges within the cap are exact.
    pub max_reverse_classes: usize,
    /// An insert's reverse lookup first scores the this-many nodes whose lists are easiest to enter (the lowest
    /// bars: short lists, weak neighbourhoods) one by one, and asks the index only for cosines that beat the next
    /// bar. Those nodes get the newcomer even where the index's range is cut at `max-reverse-classes`.
    pub reverse_scan: usize,
}

impl Default for SimilarityParams {
    fn default() -> Self {
        SimilarityParams {
            alpha: 0.6,
            theta: 0.6,
            sigma: 1.0,
            k: 10,
            max_connections: 16,
            ef_construction: 100,
            ef_search: 64,
            exhaustive_below: 256,
            max_reverse_classes: 64,
            reverse_scan: 0,
        }
    }
}

impl SimilarityParams {
    /// Every problem with the parameters, each naming its key.
    pub fn validate(&self) -> Vec<String> {
        let mut errs = Vec::new();
        if !(0.0..=1.0).contains(&self.alpha) {
            errs.push(format!("similarity.alpha = {} must be in [0, 1]", self.alpha));
        }
        if !(self.theta > 0.0 && self.theta <= 1.0) {
            errs.push(format!("similarity.theta = {} must be in (0, 1]", self.theta));
        }
        if !(self.sigma > 0.0 && self.sigma.is_finite()) {
            errs.push(format!("similarity.sigma = {} must be positive", self.sigma));
        }
        if self.k == 0 || self.k > 1000 {
            errs.push(format!("similarity.k = {} must be in 1..=1000", self.k));
        }
        if !(2..=256).contains(&self.max_connections) {
            errs.push(format!("similarity.max-connections = {} must be in 2..=256", self.max_connections));
        }
        if self.max_reverse_classes < 16 {
            errs.push(format!("similarity.max-reverse-classes = {} must be at least 16", self.max_reverse_classes));
        }
        if self.reverse_scan > 100_000 {
            errs.push(format!("similarity.reverse-scan = {} must be at most 100000", self.reverse_scan));
        }
        if self.ef_construction == 0 || self.ef_search == 0 {
            errs.push("similarity.ef-construction and similarity.ef-search must be positive".into());
        }
        errs
    }

    /// The positional term of two nodes of one document.
    pub fn positional(&self, a: i64, b: i64) -> f32 {
        let d = (a - b) as f32 / POSITION_SCALE as f32;
        (-(d * d) / (2.0 * self.sigma * self.sigma)).exp()
    }

    /// The similarity score of two nodes. Symmetric, and computed in one fixed order so that it is bit-identical
    /// wherever it is computed.
    pub fn score(&self, a: (&str, i64, &Embedding), b: (&str, i64, &Embedding)) -> f32 {
        self.mix(a.2.cos(b.2), self.positional_term((a.0, a.1), (b.0, b.1)))
    }

    /// The positional term of two nodes `(doc, position)`: the Gaussian inside the window of one document, else 0.
    fn positional_term(&self, a: (&str, i64), b: (&str, i64)) -> f32 {
        let near = a.0 == b.0 && a.1.abs_diff(b.1) <= self.window().0.unsigned_abs();
        if near {
            self.positional(a.1, b.1)
        } else {
            0.0
        }
    }

    /// `α·max(0, cos) + (1−α)·pos`, the one formula every score goes through.
    fn mix(&self, cos: f32, pos: f32) -> f32 {
        self.alpha * cos.max(0.0) + (1.0 - self.alpha) * pos
    }

    /// The positional window (in position units, either side) inside which nodes of one document have a positional
    /// term, and the smallest cosine that reaches θ without one (`None` when only the window can): a range query at
    /// `θ/α` finds every candidate outside the window, same document or not, without a scan of long documents.
    fn window(&self) -> (i64, Option<f32>) {
        let w = (3.0 * self.sigma).ceil().max(1.0);
        let window = (w as i64).saturating_mul(POSITION_SCALE);
        let min_cos = (self.alpha > 0.0).then(|| self.theta / self.alpha - 1e-4);
        (window, min_cos)
    }
}

/// What a newcomer must score to enter a top-`k` list: 0 while it is short, else its k-th score (millionths).
fn bar(list: &[Scored], k: usize) -> u32 {
    if list.len() < k {
        0
    } else {
        micro(list[k - 1].score)
    }
}

/// A list's weakest neighbour as an order: `None` (a short list, which anything scoring θ enters) first, then by
/// score ascending and, at one score, by id descending. A newcomer `w` scoring `s` enters exactly the lists whose
/// weakest is below `Some((s, Reverse(w)))`. Scores are positive, so their bits order as they do.
type Weakest = Option<(u32, Reverse<Name>)>;

fn weakest(list: &[Scored], k: usize) -> Weakest {
    (list.len() >= k).then(|| (list[k - 1].score.to_bits(), Reverse(list[k - 1].id.clone())))
}

/// A batch's net change per (node, vector), zeros dropped.
fn consolidate<N: Ord, E: Ord>(changes: impl IntoIterator<Item = (N, E, isize)>) -> BTreeMap<(N, E), isize> {
    let mut net: BTreeMap<(N, E), isize> = BTreeMap::new();
    for (n, e, d) in changes {
        *net.entry((n, e)).or_default() += d;
    }
    net.retain(|_, d| *d != 0);
    net
}

/// Weight in millionths, as edges carry it.
pub fn micro(score: f32) -> u32 {
    (score.clamp(0.0, 1.0) * 1e6).round() as u32
}

/// A neighbour in a top-k list: best score first, then smallest id.
#[derive(Clone, Debug, PartialEq)]
struct Scored {
    score: f32,
    id: Name,
}

fn better(a: &Scored, b: &Scored) -> bool {
    a.score > b.score || (a.score == b.score && a.id < b.id)
}

/// The nodes that share one vector: one point of the HNSW index (the class's number is the point's, and the point
/// holds the vector).
struct Class {
    /// Members by id: a list takes a class's smallest ids first.
    members: SortedSet<Name>,
    /// Members by the weakest neighbour of their list, weakest first: the members an insert can enter.
    by_weakest: SortedSet<(Weakest, Name)>,
}

/// What the index keeps of a node: where it sits (its document, shared with the document map, and its position)
/// and its vector's class. The rest of the node (its text, speaker, time) is the views'.
struct Entry {
    doc: Name,
    pos: i64,
    /// The class (HNSW data id) of its vector; `None` for a zero vector, which no cosine can reach.
    class: Option<usize>,
}

/// The similarity graph of one space: its HNSW index of vector classes, each node's top-k list and the reverse
/// lists.
pub struct SimilarityIndex {
    params: SimilarityParams,
    hnsw: Hnsw,
    /// HNSW data id → its class; `None` once emptied.
    classes: Vec<Option<Class>>,
    /// [`Embedding::content_hash`] → the live classes with that hash.
    by_vector: HashMap<u64, Vec<usize>>,
    tombstones: usize,
    entries: HashMap<Name, Entry>,
    /// doc → (position, id) of its nodes: the positional window is a range scan.
    by_doc: HashMap<Name, BTreeSet<(i64, Name)>>,
    topk: HashMap<Name, Vec<Scored>>,
    /// x → the nodes whose top-k lists hold x.
    holders: HashMap<Name, SortedSet<Name>>,
    /// (what it takes to enter a node's list — its k-th score in millionths, 0 while the list is short —, node),
    /// easiest first: the reverse lookup of an insert scans the easiest nodes and asks the index only for the rest.
    bars: BTreeSet<(u32, Name)>,
}

/// An edge change within one space: `(u, v, weight_micro, diff)`.
pub type EdgeDelta = (String, String, u32, isize);

type Before = BTreeMap<(Name, Name), Option<u32>>;

impl SimilarityIndex {
    pub fn new(params: SimilarityParams) -> Self {
        let hnsw = Self::new_hnsw(&params, 0);
        SimilarityIndex {
            params,
            hnsw,
            classes: Vec::new(),
            by_vector: HashMap::default(),
            tombstones: 0,
            entries: HashMap::default(),
            by_doc: HashMap::default(),
            topk: HashMap::default(),
            holders: HashMap::default(),
            bars: BTreeSet::new(),
        }
    }

    /// The vector of class `c` (its HNSW point's).
    fn vector(&self, c: usize) -> &Embedding {
        self.hnsw.point(c as u32)
    }

    fn class(&self, c: usize) -> &Class {
        self.classes[c].as_ref().expect("a live class")
    }

    /// Changes the list of `id` (creating it if need be), keeping `bars` and its class's order in step.
    fn relist(&mut self, id: &Name, change: impl FnOnce(&mut Vec<Scored>)) {
        let k = self.params.k;
        let (b0, w0, b1, w1) = {
            let list = self.topk.entry(id.clone()).or_default();
            let (b0, w0) = (bar(list, k), weakest(list, k));
            change(list);
            // A list collected from a longer candidate list keeps that list's room: a list holds at most `k`.
            if list.capacity() > k.max(list.len()) {
                list.shrink_to(k.max(list.len()));
            }
            (b0, w0, bar(list, k), weakest(list, k))
        };
        if b0 != b1 || !self.bars.contains(&(b0, id.clone())) {
            self.bars.remove(&(b0, id.clone()));
            self.bars.insert((b1, id.clone()));
        }
        let class = self.entries.get(id).and_then(|e| e.class);
        if let Some(class) = class.and_then(|c| self.classes[c].as_mut()) {
            let old = (w0, id.clone());
            if old.0 != w1 || !class.by_weakest.contains(&old) {
                class.by_weakest.remove(&old);
                class.by_weakest.insert((w1, id.clone()));
            }
        }
    }

    fn new_hnsw(params: &SimilarityParams, hint: usize) -> Hnsw {
        Hnsw::new(params.max_connections, params.ef_construction, hint)
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Distinct vectors among the live nodes (HNSW entries).
    pub fn vector_count(&self) -> usize {
        self.classes.len() - self.tombstones
    }

    /// Applies one batch of node changes (an epoch of one space) and returns the edge changes, consolidated.
    /// A node retracted and inserted in one batch is a replacement. The result does not depend on the order of
    /// `changes`.
    pub fn apply(&mut self, changes: Vec<(Node, Embedding, isize)>) -> Vec<EdgeDelta> {
        // Consolidate: a batch may retract and re-insert the same node.
        let net = consolidate(changes);
        let mut deletes = Vec::new();
        let mut inserts = Vec::new();
        for ((n, e), d) in net {
            if d < 0 {
                deletes.push(n.id);
            } else if d > 0 {
                inserts.push((n, e));
            }
        }
        let mut before: Before = BTreeMap::new();
        let mut dirty: BTreeSet<Name> = BTreeSet::new();

        for id in deletes {
            self.delete(&id, &mut before, &mut dirty);
        }
        if self.tombstones > 1024 && self.tombstones > self.vector_count() {
            self.rebuild();
        }
        // A batch that at least doubles the space (a from-scratch build, a replay) is built in bulk: every node
        // enters the index, then every list is computed by a nearest-neighbour search. No reverse lookups, whose
        // bars are all low while lists are still filling. Same graph: it is a function of the live nodes.
        let bulk = inserts.len() > self.params.exhaustive_below.max(self.entries.len());
        let mut fresh: Vec<Name> = Vec::new();
        for (node, emb) in inserts {
            let id: Name = node.id.clone();
            if self.entries.contains_key(&id) {
                // An insert of a live id without its retraction: replace (upstream sends both, but be total).
                self.delete(&id, &mut before, &mut dirty);
            }
            if bulk {
                self.place(id.clone(), &node, emb);
                fresh.push(id);
            } else {
                self.insert(id, node, emb, &mut before);
            }
        }
        if bulk {
            // The nodes that were there first: their pairs with newcomers are touched while the newcomers' lists
            // are still empty, so the recorded "before" of every pair is its state before the batch.
            let fresh_set: HashSet<Name> = fresh.iter().cloned().collect();
            let mut old: Vec<Name> = self.entries.keys().filter(|id| !fresh_set.contains(*id)).cloned().collect();
            old.sort();
            for id in old.iter().chain(&fresh) {
                self.recompute(id, &mut before);
            }
            dirty.clear();
        }
        for id in dirty {
            if self.entries.contains_key(&id) {
                self.recompute(&id, &mut before);
            }
        }

        let mut out = Vec::new();
        for ((u, v), was) in before {
            let now = self.edge_state(&u, &v);
            if was != now {
                if let Some(w) = was {
                    out.push((u.to_string(), v.to_string(), w, -1));
                }
                if let Some(w) = now {
                    out.push((u.to_string(), v.to_string(), w, 1));
                }
            }
        }
        out
    }

    fn pair(a: &Name, b: &Name) -> (Name, Name) {
        if a < b {
            (a.clone(), b.clone())
        } else {
            (b.clone(), a.clone())
        }
    }

    /// Records the state of pair (a, b) before the batch touches it.
    fn touch(&self, a: &Name, b: &Name, before: &mut Before) {
        if let std::collections::btree_map::Entry::Vacant(e) = before.entry(Self::pair(a, b)) {
            let state = self.edge_state(&e.key().0, &e.key().1);
            e.insert(state);
        }
    }

    fn edge_state(&self, u: &Name, v: &Name) -> Option<u32> {
        let (eu, ev) = (self.entries.get(u)?, self.entries.get(v)?);
        let holds = |a: &Name, b: &Name| self.topk.get(a).is_some_and(|l| l.iter().any(|s| &s.id == b));
        if holds(u, v) || holds(v, u) {
            Some(micro(self.score_entries(eu, ev)))
        } else {
            None
        }
    }

    /// [`SimilarityParams::score`] of two entries, bit for bit.
    fn score_entries(&self, a: &Entry, b: &Entry) -> f32 {
        let cos = match (a.class, b.class) {
            (Some(x), Some(y)) => self.vector(x).cos(self.vector(y)),
            _ => 0.0,
        };
        self.params.mix(cos, self.params.positional_term((a.doc.as_str(), a.pos), (b.doc.as_str(), b.pos)))
    }

    fn delete(&mut self, id: &str, before: &mut Before, dirty: &mut BTreeSet<Name>) {
        let Some(id) = self.entries.get_key_value(id).map(|(k, _)| k.clone()) else { return };
        for s in self.topk.get(&id).cloned().unwrap_or_default() {
            self.touch(&id, &s.id, before);
            if let Some(h) = self.holders.get_mut(&s.id) {
                h.remove(&id);
            }
        }
        for y in self.holders.remove(&id).unwrap_or_default() {
            self.touch(&y, &id, before);
            if self.topk.contains_key(&y) {
                self.relist(&y, |list| list.retain(|s| s.id != id));
            }
            dirty.insert(y);
        }
        let entry = self.entries.remove(&id).expect("entry checked above");
        let list = self.topk.remove(&id);
        if let Some(list) = &list {
            self.bars.remove(&(bar(list, self.params.k), id.clone()));
        }
        if let Some(c) = entry.class {
            let class = self.classes[c].as_mut().expect("a live class");
            class.members.remove(&id);
            if let Some(list) = &list {
                class.by_weakest.remove(&(weakest(list, self.params.k), id.clone()));
            }
            if class.members.is_empty() {
                let h = self.hnsw.point(c as u32).content_hash();
                self.classes[c] = None;
                self.tombstones += 1;
                if let Some(cs) = self.by_vector.get_mut(&h) {
                    cs.retain(|x| *x != c);
                    if cs.is_empty() {
                        self.by_vector.remove(&h);
                    }
                }
            }
        }
        if let Some(set) = self.by_doc.get_mut(&entry.doc) {
            set.remove(&(entry.pos, id.clone()));
            if set.is_empty() {
                self.by_doc.remove(&entry.doc);
            }
        }
        dirty.remove(&id);
    }

    /// The class of a vector, made (and put into the index) if no live node has it.
    fn class_for(&mut self, emb: Embedding) -> usize {
        let h = emb.content_hash();
        let found = self
            .by_vector
            .get(&h)
            .and_then(|cs| cs.iter().copied().find(|c| self.classes[*c].is_some() && *self.vector(*c) == emb));
        if let Some(c) = found {
            return c;
        }
        let slot = self.classes.len();
        let point = self.hnsw.insert(emb);
        debug_assert_eq!(point as usize, slot);
        self.classes.push(Some(Class { members: SortedSet::default(), by_weakest: SortedSet::default() }));
        self.by_vector.entry(h).or_default().push(slot);
        slot
    }

    /// Puts a node into its class and the document map, with no list yet.
    fn place(&mut self, id: Name, node: &Node, emb: Embedding) {
        let class = (!emb.is_zero()).then(|| self.class_for(emb));
        self.enter(id, node, class);
    }

    /// Enters a node into its (live) class and the document map, with no list yet.
    fn enter(&mut self, id: Name, node: &Node, class: Option<usize>) {
        if let Some(c) = class {
            self.classes[c].as_mut().expect("a live class").members.insert(id.clone());
        }
        let doc = match self.by_doc.get_key_value(node.doc.as_str()) {
            Some((doc, _)) => doc.clone(),
            None => node.doc.clone(),
        };
        self.by_doc.entry(doc.clone()).or_default().insert((node.pos, id.clone()));
        self.entries.insert(id, Entry { doc, pos: node.pos, class });
    }

    fn insert(&mut self, id: Name, node: Node, emb: Embedding, before: &mut Before) {
        self.place(id.clone(), &node, emb);

        let cands = self.candidates(&id, true);
        let k = self.params.k;
        // The new node's own list.
        let mine: Vec<Scored> = cands.iter().take(k).cloned().collect();
        for s in &mine {
            self.touch(&id, &s.id, before);
            self.holders.entry(s.id.clone()).or_default().insert(id.clone());
        }
        self.relist(&id, |list| *list = mine);
        // Enter the lists of the nodes it beats.
        for c in cands {
            let me = Scored { score: c.score, id: id.clone() };
            let list = self.topk.get(&c.id).map(Vec::as_slice).unwrap_or(&[]);
            let enters = list.len() < k || list.last().is_some_and(|last| better(&me, last));
            if !enters {
                continue;
            }
            self.touch(&c.id, &id, before);
            // The evicted pair is touched while the list still holds it.
            let evicted = (list.len() >= k).then(|| list[list.len() - 1].id.clone());
            if let Some(ev) = &evicted {
                self.touch(&c.id, ev, before);
                if let Some(h) = self.holders.get_mut(ev) {
                    h.remove(&c.id);
                }
            }
            self.relist(&c.id, |list| {
                if evicted.is_some() {
                    list.pop();
                }
                let at = list.iter().position(|s| better(&me, s)).unwrap_or(list.len());
                list.insert(at, me);
            });
            self.holders.entry(id.clone()).or_default().insert(c.id.clone());
        }
    }

    fn recompute(&mut self, id: &Name, before: &mut Before) {
        let fresh: Vec<Scored> = self.candidates(id, false).into_iter().take(self.params.k).collect();
        let old = self.topk.get(id).cloned().unwrap_or_default();
        for s in old.iter().filter(|s| !fresh.iter().any(|f| f.id == s.id)) {
            self.touch(id, &s.id, before);
            if let Some(h) = self.holders.get_mut(&s.id) {
                h.remove(id);
            }
        }
        for s in fresh.iter().filter(|s| !old.iter().any(|o| o.id == s.id)) {
            self.touch(id, &s.id, before);
            self.holders.entry(s.id.clone()).or_default().insert(id.clone());
        }
        self.relist(id, |list| *list = fresh);
    }

    /// Live nodes other than `id` with `S ≥ θ`, best first: at least the `k` best (its own list) and, with
    /// `reverse`, every node whose list `id` can enter.
    ///
    /// A node `c` outside `id`'s positional window takes `id` only if `α·cos ≥ bar(c)`. So the reverse lookup scans
    /// the nodes with the lowest bars one by one (short lists, weak neighbourhoods) and asks the index only for
    /// `cos ≥ τ/α`, where `τ` is the lowest bar not scanned: the bar of a full list rises as the space fills, so the
    /// range stays narrow however large the space grows. Of each class in range, only the members whose weakest
    /// neighbour `id` beats are candidates (and its smallest ids, for `id`'s own list): a tie is never walked.
    fn candidates(&self, id: &Name, reverse: bool) -> Vec<Scored> {
        let me = &self.entries[id];
        let k = self.params.k;
        let mut seen: HashSet<Name> = HashSet::default();
        let mut out = Vec::new();
        let consider = |other: &Name, seen: &mut HashSet<Name>, out: &mut Vec<Scored>| {
            if other == id || !seen.insert(other.clone()) {
                return;
            }
            let score = self.score_entries(me, &self.entries[other]);
            if score >= self.params.theta {
                out.push(Scored { score, id: other.clone() });
            }
        };
        let (window, min_cos) = self.params.window();
        if let Some(same_doc) = self.by_doc.get(&me.doc) {
            let lo = (me.pos.saturating_sub(window), Name::default());
            let hi = me.pos.saturating_add(window);
            for (_, other) in same_doc.range(lo..).take_while(|(p, _)| *p <= hi) {
                consider(other, &mut seen, &mut out);
            }
        }
        let (Some(min_cos), Some(mine)) = (min_cos, me.class) else {
            out.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.id.cmp(&b.id)));
            return out;
        };
        if self.entries.len() <= self.params.exhaustive_below {
            for other in self.entries.keys() {
                consider(other, &mut seen, &mut out);
            }
        } else {
            // Without `reverse` only the nearest matter: a bound above every cosine stops the range search after its
            // first round, which returns more than `k` nearest.
            let mut bound = 2.0;
            if reverse {
                let mut bars = self.bars.iter().filter(|(_, n)| n != id);
                for (_, other) in bars.by_ref().take(self.params.reverse_scan) {
                    consider(other, &mut seen, &mut out);
                }
                if let Some((tau, _)) = bars.next() {
                    let tau = (*tau as f32 / 1e6 - 1e-6).max(self.params.theta);
                    bound = (tau / self.params.alpha - 1e-4).max(min_cos);
                }
            }
            let emb = self.vector(mine);
            let cap = if reverse { self.params.max_reverse_classes } else { usize::MAX };
            for (c, cos) in self.range_search(emb, bound, cap) {
                let class = self.class(c);
                // Every member outside the window scores this (the window's members are already considered).
                let score = self.params.mix(cos, 0.0);
                if score < self.params.theta {
                    continue;
                }
                let mut taken = 0;
                for m in class.members.iter() {
                    if taken == k {
                        break;
                    }
                    if m != id && seen.insert(m.clone()) {
                        out.push(Scored { score, id: m.clone() });
                        taken += 1;
                    }
                }
                if reverse {
                    let beaten = (Some((score.to_bits(), Reverse(id.clone()))), Name::default());
                    for (_, m) in class.by_weakest.below(Some(&beaten)) {
                        if m != id && seen.insert(m.clone()) {
                            out.push(Scored { score, id: m.clone() });
                        }
                    }
                }
            }
        }
        out.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| a.id.cmp(&b.id)));
        out
    }

    /// The classes with cosine ≥ `min_cos` to `q` and their cosines ([`unit_cos`]), as far as the HNSW walk finds
    /// them: the result size is grown until the worst hit falls below the bound (and the hits hold more than `k`
    /// nodes), or reaches `cap`. A capped search (an insert's reverse range) asks for the whole candidate list of its
    /// first walk at once: a walk costs the same whatever share of its list it returns.
    fn range_search(&self, q: &Embedding, min_cos: f32, cap: usize) -> Vec<(usize, f32)> {
        let first = (2 * self.params.k).max(16);
        let mut want = if cap < usize::MAX { first.max(self.params.ef_search).min(cap) } else { first };
        loop {
            let ef = want.max(self.params.ef_search);
            // Tombstones (emptied classes) stay in the graph as waypoints; the hits drop them here, and the walk grows
            // while the live hits fall short.
            let hits = self.hnsw.search(q, want, ef);
            // A short answer is the end of the index; else the worst hit falling out of range ends the search.
            let exhausted = want >= self.classes.len() || hits.len() < want;
            let out_of_range = hits.last().is_some_and(|h| 1.0 - h.1 < min_cos - 1e-3);
            let live: Vec<(usize, f32)> =
                hits.iter().map(|&(p, d)| (p as usize, 1.0 - d)).filter(|(c, _)| self.classes[*c].is_some()).collect();
            // Enough for a top-k list (the node itself is among the members).
            let members: usize = live.iter().map(|(c, _)| self.class(*c).members.len()).sum();
            if exhausted || want >= cap || (out_of_range && members > self.params.k) {
                return live;
            }
            want = (want * 4).min(cap);
        }
    }

    /// Rebuilds the HNSW index from the live classes in the order of their smallest member, dropping tombstones.
    fn rebuild(&mut self) {
        let old = std::mem::replace(&mut self.hnsw, Self::new_hnsw(&self.params, 0));
        let mut live: Vec<(Embedding, Class)> = std::mem::take(&mut self.classes)
            .into_iter()
            .enumerate()
            .filter_map(|(c, class)| Some((old.point(c as u32).clone(), class?)))
            .collect();
        live.sort_by(|a, b| a.1.members.first().cmp(&b.1.members.first()));
        self.hnsw = Self::new_hnsw(&self.params, live.len());
        self.by_vector.clear();
        self.tombstones = 0;
        for (emb, class) in live {
            let slot = self.classes.len();
            self.by_vector.entry(emb.content_hash()).or_default().push(slot);
            self.hnsw.insert(emb);
            for m in class.members.iter() {
                self.entries.get_mut(m).expect("a member is live").class = Some(slot);
            }
            self.classes.push(Some(class));
        }
    }

    /// The current edges of this space, `u < v`.
    pub fn edges(&self) -> BTreeSet<(String, String, u32)> {
        let mut out = BTreeSet::new();
        for (u, list) in &self.topk {
            for s in list {
                let (a, b) = Self::pair(u, &s.id);
                let w = self.edge_state(&a, &b).expect("listed pair is an edge");
                out.insert((a.to_string(), b.to_string(), w));
            }
        }
        out
    }
}

/// A similarity index as a checkpoint holds it: what the nodes it was fed do not give again. The HNSW index's
/// points in the order they went in (live or emptied) with the graph over them, and every node's class and top-k
/// list. The graph is taken as it is, links and level generator, so a restore searches nothing and a restored index
/// goes on exactly as the one it was taken from would have: past `exhaustive-below` the lists depend on the order of
/// the inserts, not only on the live nodes, and a rebuild from the nodes would keep other edges.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IndexState {
    points: Vec<Embedding>,
    graph: Graph,
    /// By id: `(id, class, list)`, the list as `(node's place in this vector, score)`, best first.
    nodes: Vec<(String, Option<u32>, Vec<(u32, f32)>)>,
}

impl IndexState {
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }
}

impl SimilarityIndex {
    /// The index's state, to restore it from with [`SimilarityIndex::restore`].
    pub fn state(&self) -> IndexState {
        let points: Vec<Embedding> = (0..self.hnsw.len() as u32).map(|p| self.hnsw.point(p).clone()).collect();
        debug_assert_eq!(points.len(), self.classes.len());
        let mut ids: Vec<&Name> = self.entries.keys().collect();
        ids.sort();
        let at: HashMap<&str, u32> = ids.iter().enumerate().map(|(i, id)| (&***id, i as u32)).collect();
        let nodes = ids
            .iter()
            .map(|id| {
                let list = self.topk.get(*id).map_or(&[][..], Vec::as_slice);
                let list = list.iter().map(|s| (at[&*s.id], s.score)).collect();
                (id.to_string(), self.entries[*id].class.map(|c| c as u32), list)
            })
            .collect();
        IndexState { points, graph: self.hnsw.graph(), nodes }
    }

    /// The index `state` was taken from, given the nodes it held (`changes`: one batch that inserts exactly them, as
    /// a restart feeds a checkpoint's records). An error says where the nodes and the state disagree (another log,
    /// another embedder): the caller builds from the nodes instead.
    pub fn restore(
        params: SimilarityParams,
        state: &IndexState,
        changes: &[(Node, Embedding, isize)],
    ) -> Result<SimilarityIndex, String> {
        let net = consolidate(changes.iter().map(|(n, e, d)| (n, e, *d)));
        if net.values().any(|d| *d != 1) {
            return Err("the batch is not one insert per node".into());
        }
        if net.len() != state.nodes.len() {
            return Err(format!("{} nodes fed for {} in the state", net.len(), state.nodes.len()));
        }
        // Every node checked against the state before the index is built.
        let place: HashMap<&str, usize> = state.nodes.iter().enumerate().map(|(i, n)| (n.0.as_str(), i)).collect();
        if place.len() != state.nodes.len() {
            return Err("the state names a node twice".into());
        }
        let mut placed = Vec::with_capacity(net.len());
        let mut fed = vec![false; state.nodes.len()];
        for (node, emb) in net.into_keys() {
            let Some(&i) = place.get(node.id.as_str()) else {
                return Err(format!("node {} is not in the state", node.id));
            };
            if std::mem::replace(&mut fed[i], true) {
                return Err(format!("node {} is fed twice", node.id));
            }
            let class = state.nodes[i].1.map(|c| c as usize);
            match class {
                Some(c) if state.points.get(c) == Some(emb) => {}
                None if emb.is_zero() => {}
                _ => return Err(format!("node {}'s vector is not its class's", node.id)),
            }
            placed.push((i, node, class));
        }
        if state.nodes.iter().flat_map(|n| &n.2).any(|(j, _)| *j as usize >= state.nodes.len()) {
            return Err("a list names a node out of range".into());
        }
        let mut index = SimilarityIndex::new(params);
        let (m, ef) = (index.params.max_connections, index.params.ef_construction);
        index.hnsw = Hnsw::with_graph(m, ef, state.points.clone(), state.graph.clone())
            .map_err(|e| format!("the HNSW graph: {e}"))?;
        for _ in &state.points {
            index.classes.push(Some(Class { members: SortedSet::default(), by_weakest: SortedSet::default() }));
        }
        let mut names: Vec<Option<Name>> = vec![None; state.nodes.len()];
        for (i, node, class) in placed {
            let id: Name = node.id.clone();
            index.enter(id.clone(), node, class);
            names[i] = Some(id);
        }
        let names: Vec<Name> = names.into_iter().map(|n| n.expect("every node placed")).collect();
        for c in 0..index.classes.len() {
            if index.classes[c].as_ref().is_some_and(|k| k.members.is_empty()) {
                index.classes[c] = None;
                index.tombstones += 1;
            } else {
                index.by_vector.entry(index.vector(c).content_hash()).or_default().push(c);
            }
        }
        for (i, (_, _, list)) in state.nodes.iter().enumerate() {
            let mut scored = Vec::with_capacity(list.len());
            for &(j, score) in list {
                let other = &names[j as usize];
                index.holders.entry(other.clone()).or_default().insert(names[i].clone());
                scored.push(Scored { score, id: other.clone() });
            }
            index.relist(&names[i], |l| *l = scored);
        }
        Ok(index)
    }

    /// Every current edge as an insert: what a restored index emits for the nodes it was restored with.
    pub fn all_edges(&self) -> Vec<EdgeDelta> {
        self.edges().into_iter().map(|(u, v, w)| (u, v, w, 1)).collect()
    }
}

/// The same graph by brute force over a set of nodes: the reference the model tests hold the index to.
pub fn reference_edges(params: &SimilarityParams, nodes: &[(Node, Embedding)]) -> BTreeSet<(String, String, u32)> {
    let mut out = BTreeSet::new();
    for (i, (a, ea)) in nodes.iter().enumerate() {
        let mut scored: Vec<(f32, &str, usize)> = nodes
            .iter()
            .enumerate()
            .filter(|(j, _)| *j != i)
            .map(|(j, (b, eb))| (params.score((&a.doc, a.pos, ea), (&b.doc, b.pos, eb)), b.id.as_str(), j))
            .filter(|(s, _, _)| *s >= params.theta)
            .collect();
        scored.sort_by(|x, y| y.0.total_cmp(&x.0).then_with(|| x.1.cmp(y.1)));
        for (s, _, j) in scored.into_iter().take(params.k) {
            let (u, v) = if a.id < nodes[j].0.id { (&a.id, &nodes[j].0.id) } else { (&nodes[j].0.id, &a.id) };
            out.insert((u.to_string(), v.to_string(), micro(s)));
        }
    }
    out
}

/// Edge rows of one space, as the dataflow emits them.
pub fn to_edges(space: &str, deltas: Vec<EdgeDelta>) -> impl Iterator<Item = (Edge, isize)> + '_ {
    deltas.into_iter().map(move |(u, v, w, d)| (Edge { space: space.to_string(), u, v, weight_micro: w }, d))
}

impl SimilarityIndex {
    /// Checks every top-k list against a brute-force recomputation (tests and debugging).
    pub fn check_lists(&self) -> Result<(), String> {
        if self.bars.len() != self.entries.len() {
            return Err(format!("{} bars for {} nodes", self.bars.len(), self.entries.len()));
        }
        let ordered: usize = self.classes.iter().flatten().map(|c| c.by_weakest.len()).sum();
        let members: usize = self.classes.iter().flatten().map(|c| c.members.len()).sum();
        if ordered != members {
            return Err(format!("{ordered} ordered members for {members} members"));
        }
        for id in self.entries.keys() {
            let want: Vec<Scored> = self.candidates(id, false).into_iter().take(self.params.k).collect();
            let got = self.topk.get(id).cloned().unwrap_or_default();
            if want != got {
                return Err(format!("list of {id}: got {got:?}, want {want:?}"));
            }
            for s in &got {
                if !self.holders.get(&s.id).is_some_and(|h| h.contains(id)) {
                    return Err(format!("holders of {} miss {id}", s.id));
                }
            }
            if !self.bars.contains(&(bar(&got, self.params.k), id.clone())) {
                return Err(format!("bar of {id} out of step"));
            }
            if let Some(c) = self.entries[id].class {
                if !self.class(c).by_weakest.contains(&(weakest(&got, self.params.k), id.clone())) {
                    return Err(format!("weakest of {id} out of step in its class"));
                }
            }
        }
        Ok(())
    }
}
