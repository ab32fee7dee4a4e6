//! Materialised, read-optimised views of the dataflow's output, per space, which the HTTP server reads while the
//! dataflow runs. Each reflects a whole number of epochs: `as_of` is the last epoch whose layer 0 and event memory
//! are fully applied, `hierarchy_as_of` the last whose hierarchy and summaries are (never ahead of `as_of`).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use operators::fasthash::HashMap;
use operators::model::ErrorRow;
use operators::request::ModelRequest;
use operators::slots::SortedSet;
use operators::{Edge, Embedding, Name, Node};
use serde::{Deserialize, Serialize};

/// One change to the views, as the dataflow emits it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ViewUpdate {
    // The large payloads are boxed: an epoch's updates wait in vectors of these (the structure's output of one step
    // can be hundreds of thousands), so the enum stays a few words long whatever its largest variant.
    Node(String, Box<Node>, Embedding),
    Edge(Box<Edge>),
    Error(Box<ErrorRow>),
    /// `(space, layer, cluster, member)`.
    Cluster(Name, u32, Name, Name),
    /// `(space, layer, u, v, weight)`: an edge of layer ≥ 1.
    LayerEdge(Name, u32, Name, Name, u64),
    /// (space, layer, cluster, text): embedded when applied, once per inserted summary.
    Summary(Name, u32, Name, Name),
    /// A request waiting for the model: `(space, content key, request)`.
    Request(String, String, Box<ModelRequest>),
    /// An event of the event memory (CompassMem).
    Event(String, Box<operators::events::EventRow>),
    /// A typed relation between two events.
    Relation(String, Box<operators::events::RelationRow>),
    /// `(space, event, group)`: the merge group of an event.
    Merge(Name, Name, Name),
    /// `(space, topic, event)`: an event's topic.
    Topic(Name, Name, Name),
    /// `(source, offset)`: the highest position of a source (`kafka:TOPIC/PARTITION`, `file:PATH`) that the views
    /// hold, whichever process read it (for `?after=TOPIC:PARTITION:OFFSET`).
    Position(String, u64),
}

impl ViewUpdate {
    /// The layer of a change to the hierarchy (layer-0 nodes and edges: 0; clusters, their edges and summaries:
    /// theirs), as `engram_view_updates_total` labels it; "" for the others.
    pub fn layer(&self) -> &'static str {
        const LAYERS: [&str; 12] = ["0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11+"];
        let l = match self {
            ViewUpdate::Node(..) | ViewUpdate::Edge(_) => 0,
            ViewUpdate::Cluster(_, l, _, _)
            | ViewUpdate::LayerEdge(_, l, _, _, _)
            | ViewUpdate::Summary(_, l, _, _) => *l as usize,
            _ => return "",
        };
        LAYERS[l.min(LAYERS.len() - 1)]
    }

    /// Whether the change is the structure's (the hierarchy's clusters, their edges and summaries, and the
    /// requests for those summaries), which the structure's own dataflow makes.
    pub fn is_structure(&self) -> bool {
        matches!(self, ViewUpdate::Cluster(..) | ViewUpdate::LayerEdge(..) | ViewUpdate::Summary(..))
            || matches!(self, ViewUpdate::Request(_, _, r) if matches!(**r, ModelRequest::Summary { .. }))
    }

    /// The kind of change, as `engram_view_updates_total` labels it.
    pub fn kind(&self) -> &'static str {
        match self {
            ViewUpdate::Node(..) => "node",
            ViewUpdate::Edge(_) => "edge",
            ViewUpdate::Error(_) => "error",
            ViewUpdate::Cluster(..) => "cluster",
            ViewUpdate::LayerEdge(..) => "layer-edge",
            ViewUpdate::Summary(..) => "summary",
            ViewUpdate::Request(..) => "request",
            ViewUpdate::Event(..) => "event",
            ViewUpdate::Relation(..) => "relation",
            ViewUpdate::Merge(..) => "merge",
            ViewUpdate::Topic(..) => "topic",
            ViewUpdate::Position(..) => "position",
        }
    }
}

/// The text an event is embedded by in the views (for `compass`): its summary and people.
pub fn event_text(e: &operators::events::EventRow) -> String {
    format!("{} ({})", e.summary, e.people.join(", "))
}

/// The texts applying `updates` embeds (inserted summaries and events), so that they can be embedded before the
/// views are locked.
pub fn texts_to_embed(updates: &[(ViewUpdate, isize)]) -> Vec<String> {
    updates
        .iter()
        .filter(|(_, d)| *d > 0)
        .filter_map(|(u, _)| match u {
            ViewUpdate::Summary(_, _, _, text) => Some(text.to_string()),
            ViewUpdate::Event(_, e) => Some(event_text(e)),
            _ => None,
        })
        .collect()
}

/// A node's neighbours in its layer's graph and their weights, as a vector sorted by name: a node's few tens of
/// links cost their own bytes, where a B-tree map costs leaves with room to spare.
#[derive(Clone, Debug, Default)]
pub struct Links(Vec<(operators::Name, u32)>);

impl Links {
    fn find(&self, b: &str) -> Result<usize, usize> {
        self.0.binary_search_by(|(n, _)| n.as_str().cmp(b))
    }

    pub fn get(&self, b: &str) -> Option<u32> {
        self.find(b).ok().map(|i| self.0[i].1)
    }

    /// Adds `b` with weight `w`, or gives it that weight.
    fn insert(&mut self, b: operators::Name, w: u32) {
        match self.find(&b) {
            Ok(i) => self.0[i].1 = w,
            Err(i) => {
                operators::slots::reserve_one(&mut self.0);
                self.0.insert(i, (b, w))
            }
        }
    }

    fn remove(&mut self, b: &str) {
        if let Ok(i) = self.find(b) {
            self.0.remove(i);
            if self.0.capacity() > 2 * self.0.len().max(2) {
                self.0.shrink_to_fit();
            }
        }
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The neighbours and weights, by name.
    pub fn iter(&self) -> impl Iterator<Item = (&operators::Name, &u32)> + '_ {
        self.0.iter().map(|(n, w)| (n, w))
    }

    pub fn keys(&self) -> impl Iterator<Item = &operators::Name> + '_ {
        self.0.iter().map(|(n, _)| n)
    }

    /// The neighbours named after `a`, by name: each undirected link once, from its smaller end.
    pub fn after<'a>(&'a self, a: &str) -> impl Iterator<Item = (&'a operators::Name, &'a u32)> + 'a {
        let from = self.0.partition_point(|(n, _)| n.as_str() <= a);
        self.0[from..].iter().map(|(n, w)| (n, w))
    }
}

/// A node of layer ≥ 1: a cluster of the layer below.
#[derive(Default, Clone)]
pub struct ClusterView {
    pub layer: u32,
    pub members: SortedSet<operators::Name>,
    pub summary: Option<(String, Embedding)>,
    /// When its members last changed in the views: a cluster whose members have settled is summarised without
    /// waiting out the debounce again for each new text of a member ([`operators::summary::Scheduler`]).
    pub members_since: Option<std::time::Instant>,
    /// The summary's terms, counted once for retrieval's BM25.
    pub summary_terms: operators::lexical::TermCounts,
}

/// The events of one session, and how many turns they hold.
#[derive(Default, Clone, Debug, PartialEq)]
pub struct SessionEvents {
    pub turns: usize,
    pub events: BTreeSet<String>,
}

#[derive(Default, Clone)]
pub struct SpaceView {
    pub nodes: HashMap<operators::Name, (Node, Embedding)>,
    /// The nearest-neighbour index over `nodes`, once the space holds `query.exhaustive-below` of them: retrieval then
    /// reads candidates from it instead of every node ([`crate::ann`]).
    pub ann: crate::ann::AnnSlot,
    /// Speaker → how many layer-0 nodes they said (a question naming a speaker is matched against these).
    pub speakers: BTreeMap<operators::Name, usize>,
    /// BM25 over the layer-0 texts (hybrid retrieval).
    pub lexical: operators::lexical::LexicalIndex,
    /// Document → its layer-0 nodes by position (a turn's or chunk's neighbours in reading order).
    pub order: HashMap<operators::Name, BTreeMap<i64, operators::Name>>,
    /// Layer-0 node → |its embedding + the embedding of the node just before it| (when it has one): relevance reads a
    /// node together with the one before it, and this keeps that from costing a second dot product per node and query.
    pub with_before: HashMap<operators::Name, f32>,
    /// Adjacency of every layer (cluster ids never collide with layer-0 ids: they are `L<layer>:<hash>`). Node and
    /// cluster names here, in `clusters`' members and in `parents` are shared ([`SpaceView::names`]).
    pub adjacency: HashMap<operators::Name, Links>,
    /// The names the adjacency lists, memberships and parents hold, one allocation each.
    names: operators::name::Interner,
    /// Layer-0 edges.
    pub edges: usize,
    pub clusters: HashMap<String, ClusterView>,
    /// node or cluster → the clusters that hold it.
    pub parents: HashMap<operators::Name, SortedSet<operators::Name>>,
    /// content key → request: the summariser's work list.
    pub requests: BTreeMap<String, std::sync::Arc<ModelRequest>>,
    /// Events by id, and their relations.
    pub events: BTreeMap<String, operators::events::EventRow>,
    pub relations: BTreeSet<std::sync::Arc<operators::events::RelationRow>>,
    /// Event → the relations that touch it (either end): a walk reads an event's relations without a scan. The rows
    /// are the ones `relations` holds, shared.
    pub related: HashMap<String, BTreeSet<std::sync::Arc<operators::events::RelationRow>>>,
    /// Event id → the embedding of its summary and people (for `compass`).
    pub event_vectors: HashMap<String, Embedding>,
    /// Turn id → its event.
    pub event_of: HashMap<String, String>,
    /// Conversation → session → its events and the turns they hold (`compass` reads a long session's stretch
    /// without a scan of every event).
    pub sessions: HashMap<String, HashMap<i64, SessionEvents>>,
    /// Event id → its merge group (the smallest event id of its component; itself when alone).
    pub groups: HashMap<String, String>,
    /// Event id → its topic (`T:<smallest member>`).
    pub topic_of: HashMap<String, String>,
}

impl SpaceView {
    /// The events related to `event` (either direction), with the relation's kind.
    pub fn related<'a>(&'a self, event: &'a str) -> impl Iterator<Item = (&'a str, &'static str)> + 'a {
        self.related.get(event).into_iter().flatten().map(move |r| {
            let other = if r.from == event { r.to.as_str() } else { r.from.as_str() };
            (other, r.kind.name())
        })
    }

    /// Node counts per layer, layer 0 first; trailing empty layers omitted.
    pub fn layer_counts(&self) -> Vec<usize> {
        let mut counts = vec![self.nodes.len()];
        for c in self.clusters.values() {
            let l = c.layer as usize;
            if counts.len() <= l {
                counts.resize(l + 1, 0);
            }
            counts[l] += 1;
        }
        counts
    }

    /// The node just before a node in its document (one position step away at most: sessions and sections that the
    /// positions keep apart stay apart).
    pub fn before(&self, n: &Node) -> Option<&str> {
        let step = operators::model::POSITION_SCALE;
        let order = self.order.get(&n.doc)?;
        order.range(..n.pos).next_back().filter(|(p, _)| n.pos - **p <= step).map(|(_, id)| id.as_str())
    }

    /// Recomputes `with_before` for a node whose predecessor may have changed.
    fn refresh_before(&mut self, id: &str) {
        let norm = self.nodes.get(id).and_then(|(n, e)| {
            let (_, pe) = self.nodes.get(self.before(n)?)?;
            Some((e.dot(e) + pe.dot(pe) + 2.0 * e.dot(pe)).max(0.0).sqrt())
        });
        match (norm, self.nodes.get_key_value(id)) {
            (Some(v), Some((id, _))) => self.with_before.insert(id.clone(), v),
            _ => self.with_before.remove(id),
        };
    }

    /// Applies a layer-0 node; returns whether an index build has to be started for the space
    /// ([`crate::ann::AnnParams::build_aside`]).
    fn apply_node(&mut self, node: Node, emb: Embedding, d: isize, ann: &crate::ann::AnnParams) -> bool {
        if d > 0 {
            self.lexical.insert(&node.id, &node.text);
            self.order.entry(node.doc.clone()).or_default().insert(node.pos, node.id.clone());
            if let Some(s) = &node.speaker {
                *self.speakers.entry(s.clone()).or_default() += 1;
            }
            if let Some(a) = self.ann.as_mut() {
                a.insert(&node.id, &emb);
            }
            self.nodes.insert(node.id.clone(), (node, emb));
            if self.ann.is_none() && self.nodes.len() >= ann.exhaustive_below {
                if ann.build_aside {
                    return self.want_index();
                }
                *self.ann = Some(crate::ann::NodeAnn::build(ann, self.nodes.iter().map(|(id, (_, e))| (id, e))));
            }
        } else if self.nodes.get(&node.id).is_some_and(|(n, _)| *n == node) {
            self.lexical.remove(&node.id);
            if let Some(o) = self.order.get_mut(&node.doc) {
                if o.get(&node.pos) == Some(&node.id) {
                    o.remove(&node.pos);
                }
                if o.is_empty() {
                    self.order.remove(&node.doc);
                }
            }
            if let Some(s) = &node.speaker {
                if let Some(n) = self.speakers.get_mut(s) {
                    *n -= 1;
                    if *n == 0 {
                        self.speakers.remove(s);
                    }
                }
            }
            self.nodes.remove(&node.id);
            self.with_before.remove(&node.id);
            let rebuild = self.ann.as_mut().is_some_and(|a| a.remove(&node.id));
            if self.nodes.len() < ann.exhaustive_below / 2 {
                *self.ann = None;
            } else if rebuild && ann.build_aside {
                // The worn index serves, its tombstones filtered, until the new one is installed.
                return self.want_index();
            } else if rebuild {
                let nodes = &self.nodes;
                *self.ann = self.ann.as_ref().map(|a| a.rebuilt(|id| nodes.get(id).map(|(_, e)| e)));
            }
        }
        false
    }

    /// Marks an index build as out for this space; whether one has to be started (none was out).
    fn want_index(&mut self) -> bool {
        !std::mem::replace(&mut self.ann.building, true)
    }

    /// Installs an index built aside over `built`, brought up to date with the nodes now. One built for a space that
    /// has since shrunk below half of `exhaustive-below` is dropped; one that is worn by the time it is installed
    /// (more than its size changed meanwhile) is installed, and the next removal asks for another.
    fn install_index(
        &mut self,
        mut index: crate::ann::NodeAnn,
        built: &[(operators::Name, Embedding)],
        params: &crate::ann::AnnParams,
    ) {
        self.ann.building = false;
        if self.nodes.len() < params.exhaustive_below / 2 {
            return;
        }
        index.catch_up(built, &self.nodes);
        *self.ann = Some(index);
    }

    /// Adds `b` to `a`'s adjacency with weight `w` (replacing its weight there).
    fn link(&mut self, a: &str, b: &str, w: u32) {
        let name = self.names.name(b);
        match self.adjacency.get_mut(a) {
            Some(m) => {
                m.insert(name, w);
            }
            None => {
                let a = self.names.name(a);
                self.adjacency.insert(a, Links(vec![(name, w)]));
            }
        }
    }

    /// Removes `b` from `a`'s adjacency if it is there with weight `w`; whether it was.
    fn unlink(&mut self, a: &str, b: &str, w: u32) -> bool {
        let Some(m) = self.adjacency.get_mut(a) else { return false };
        let mut removed = false;
        if m.get(b) == Some(w) {
            m.remove(b);
            removed = true;
        }
        if m.is_empty() {
            self.adjacency.remove(a);
        }
        removed
    }

    fn apply_edge(&mut self, e: Edge, d: isize) {
        if d > 0 {
            self.link(&e.u, &e.v, e.weight_micro);
            self.link(&e.v, &e.u, e.weight_micro);
            self.edges += 1;
        } else {
            let removed = self.unlink(&e.u, &e.v, e.weight_micro) | self.unlink(&e.v, &e.u, e.weight_micro);
            if removed {
                self.edges -= 1;
            }
        }
    }

    /// The view of cluster `c`, made when it has none (its key is allocated only then).
    fn cluster_mut(&mut self, c: &str) -> &mut ClusterView {
        if !self.clusters.contains_key(c) {
            self.clusters.insert(c.to_string(), ClusterView::default());
        }
        self.clusters.get_mut(c).expect("inserted")
    }

    fn apply_cluster(&mut self, layer: u32, c: Name, m: Name, d: isize) {
        if d > 0 {
            let (cn, mn) = (self.names.adopt(c), self.names.adopt(m));
            let cv = self.cluster_mut(&cn);
            cv.layer = layer;
            if cv.members.insert(mn.clone()) {
                cv.members_since = Some(std::time::Instant::now());
            }
            self.parents.entry(mn).or_default().insert(cn);
        } else {
            if let Some(cv) = self.clusters.get_mut(c.as_str()) {
                if cv.members.remove(m.as_str()) {
                    cv.members_since = Some(std::time::Instant::now());
                }
                if cv.members.is_empty() {
                    self.clusters.remove(c.as_str());
                }
            }
            if let Some(p) = self.parents.get_mut(m.as_str()) {
                p.remove(c.as_str());
                if p.is_empty() {
                    self.parents.remove(m.as_str());
                }
            }
        }
    }

    fn apply_layer_edge(&mut self, u: Name, v: Name, w: u64, d: isize) {
        let w = layer_weight(w);
        for (a, b) in [(&u, &v), (&v, &u)] {
            if d > 0 {
                self.link(a, b, w);
            } else {
                self.unlink(a, b, w);
            }
        }
    }

    fn apply_summary(&mut self, layer: u32, c: Name, text: Name, d: isize, embed: &dyn Fn(&str) -> Embedding) {
        if d > 0 {
            let emb = embed(&text);
            let cv = self.cluster_mut(&c);
            cv.layer = layer;
            cv.summary_terms = operators::lexical::TermCounts::of(&text);
            cv.summary = Some((text.to_string(), emb));
        } else if let Some(cv) = self.clusters.get_mut(c.as_str()) {
            if cv.summary.as_ref().is_some_and(|(t, _)| text == *t) {
                cv.summary = None;
                cv.summary_terms = Default::default();
            }
            if cv.members.is_empty() && cv.summary.is_none() {
                self.clusters.remove(c.as_str());
            }
        }
    }

    fn apply_event(&mut self, e: operators::events::EventRow, d: isize, embed: &dyn Fn(&str) -> Embedding) {
        if d > 0 {
            self.event_vectors.insert(e.id.clone(), embed(&event_text(&e)));
            for t in &e.turns {
                self.event_of.insert(t.clone(), e.id.clone());
            }
            if let Some(old) = self.events.get(&e.id).cloned() {
                self.leave_session(&old);
            }
            let session = self.sessions.entry(e.conversation.clone()).or_default().entry(e.session).or_default();
            session.turns += e.turns.len();
            session.events.insert(e.id.clone());
            self.events.insert(e.id.clone(), e);
        } else if self.events.get(&e.id) == Some(&e) {
            self.leave_session(&e);
            self.events.remove(&e.id);
            self.event_vectors.remove(&e.id);
            for t in &e.turns {
                if self.event_of.get(t) == Some(&e.id) {
                    self.event_of.remove(t);
                }
            }
        }
    }

    /// Takes event `e` out of its session's index.
    fn leave_session(&mut self, e: &operators::events::EventRow) {
        let Some(conv) = self.sessions.get_mut(&e.conversation) else { return };
        if let Some(session) = conv.get_mut(&e.session) {
            if session.events.remove(&e.id) {
                session.turns -= e.turns.len();
            }
            if session.events.is_empty() {
                conv.remove(&e.session);
            }
        }
        if conv.is_empty() {
            self.sessions.remove(&e.conversation);
        }
    }

    /// Builds the adjacency of an empty view from `(u, v, weight, of layer 0)` edges: each node's list is collected,
    /// then sorted once, where [`SpaceView::link`] keeps it sorted (and grows it) through every insert.
    fn build_adjacency(&mut self, edges: Vec<(String, String, u32, bool)>) {
        let mut lists: HashMap<operators::Name, Vec<(operators::Name, u32)>> = HashMap::default();
        for (u, v, w, layer0) in edges {
            let (a, b) = (self.names.take(u), self.names.take(v));
            lists.entry(a.clone()).or_default().push((b.clone(), w));
            lists.entry(b).or_default().push((a, w));
            self.edges += usize::from(layer0);
        }
        self.adjacency.reserve(lists.len());
        for (a, mut list) in lists {
            list.sort_by(|x, y| x.0.as_str().cmp(y.0.as_str()));
            list.dedup_by(|later, kept| {
                let same = later.0 == kept.0;
                if same {
                    kept.1 = later.1;
                }
                same
            });
            list.shrink_to_fit();
            self.adjacency.insert(a, Links(list));
        }
    }

    /// Takes the graph of `g` (adjacency, names, clusters, parents), a view built from the graph's updates alone.
    fn take_graph(&mut self, g: SpaceView) {
        (self.adjacency, self.names, self.edges) = (g.adjacency, g.names, g.edges);
        (self.clusters, self.parents) = (g.clusters, g.parents);
    }

    fn is_empty(&self) -> bool {
        self.nodes.is_empty()
            && self.edges == 0
            && self.clusters.is_empty()
            && self.requests.is_empty()
            && self.events.is_empty()
            && self.relations.is_empty()
            && self.groups.is_empty()
            && self.topic_of.is_empty()
    }
}

/// A layer edge's weight as the adjacency holds it (saturated at `u32::MAX`).
fn layer_weight(w: u64) -> u32 {
    w.min(u64::from(u32::MAX)) as u32
}

/// How many recent rejects the views keep for `GET /v1/errors`.
const RECENT_ERRORS: usize = 100;

/// Which of the views' updates a snapshot takes: the dataflow's (all but the structure's and the sources'
/// positions) or the structure's.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Part {
    Dataflow,
    Structure,
}

#[derive(Default)]
pub struct Views {
    /// The last epoch whose layer 0 and event memory are applied; `None` before the first.
    pub as_of: Option<u64>,
    /// The last epoch whose hierarchy and summaries are applied (at most `as_of`).
    pub hierarchy_as_of: Option<u64>,
    pub spaces: BTreeMap<String, SpaceView>,
    /// When a space's layer-0 nodes are indexed for retrieval, and how.
    pub ann: crate::ann::AnnParams,
    pub errors_total: u64,
    pub recent_errors: VecDeque<ErrorRow>,
    /// Source → the highest offset the views hold.
    pub positions: HashMap<String, u64>,
    /// Spaces whose index is to be built aside, not yet handed out ([`Views::take_index_builds`]).
    pub index_builds: BTreeSet<String>,
    /// Changes whenever a waiting request or a cluster's members change (a number no other `Views` has had): the
    /// summariser takes the waiting list again only then.
    pub requests_version: u64,
}

/// The source of [`Views::requests_version`]: unique across every `Views` of the process.
static REQUESTS_VERSION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Views {
    /// Whether the views hold `offset` of `source` (read by any process of the cluster).
    pub fn holds(&self, source: &str, offset: u64) -> bool {
        self.positions.get(source).is_some_and(|o| *o >= offset)
    }

    /// The view of `space`, made when it has none.
    fn space_mut(&mut self, space: &str) -> &mut SpaceView {
        if !self.spaces.contains_key(space) {
            self.spaces.insert(space.to_string(), SpaceView::default());
        }
        self.spaces.get_mut(space).expect("inserted")
    }

    /// Applies the updates of one epoch: retractions before insertions, so that a replaced node ends up replaced.
    pub fn apply(&mut self, updates: Vec<(ViewUpdate, isize)>) {
        self.apply_with(updates, &|_| Embedding::default())
    }

    /// Applies one epoch's updates; `embed` gives the vectors of inserted summaries (embedded here, after the
    /// epoch is consolidated, so a summary that came and went within the epoch costs nothing and cancels exactly).
    pub fn apply_with(&mut self, mut updates: Vec<(ViewUpdate, isize)>, embed: &dyn Fn(&str) -> Embedding) {
        // Consolidate first: within an epoch an update may arrive as +1 and -1 (a request answered in the epoch
        // that made it), which must cancel, not apply in diff order.
        differential_dataflow::consolidation::consolidate(&mut updates);
        self.apply_consolidated(updates, embed)
    }

    /// [`Views::apply_with`] for updates already consolidated (the views sink consolidates each epoch once, for the
    /// change topic and the texts it embeds before locking).
    pub fn apply_consolidated(&mut self, mut updates: Vec<(ViewUpdate, isize)>, embed: &dyn Fn(&str) -> Embedding) {
        updates.sort_by_key(|u| u.1);
        // Layer-0 positions that changed, (space, doc, position): their nodes and the nodes after them have a new
        // node before them.
        let mut moved: BTreeSet<(String, String, i64)> = BTreeSet::new();
        if updates.iter().any(|(u, _)| matches!(u, ViewUpdate::Request(..) | ViewUpdate::Cluster(..))) {
            self.requests_version = REQUESTS_VERSION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        for (u, d) in updates {
            match u {
                ViewUpdate::Node(space, node, emb) => {
                    moved.insert((space.clone(), node.doc.to_string(), node.pos));
                    let view = self.spaces.entry(space.clone()).or_default();
                    if view.apply_node(*node, emb, d, &self.ann) {
                        self.index_builds.insert(space);
                    }
                }
                ViewUpdate::Edge(e) => self.spaces.entry(e.space.clone()).or_default().apply_edge(*e, d),
                ViewUpdate::Cluster(space, layer, c, m) => self.space_mut(&space).apply_cluster(layer, c, m, d),
                ViewUpdate::LayerEdge(space, _layer, u, v, w) => self.space_mut(&space).apply_layer_edge(u, v, w, d),
                ViewUpdate::Summary(space, layer, c, text) => {
                    self.space_mut(&space).apply_summary(layer, c, text, d, embed)
                }
                ViewUpdate::Request(space, key, request) => {
                    let view = self.spaces.entry(space).or_default();
                    if d > 0 {
                        view.requests.insert(key, std::sync::Arc::from(request));
                    } else {
                        view.requests.remove(&key);
                    }
                }
                ViewUpdate::Event(space, e) => self.spaces.entry(space).or_default().apply_event(*e, d, embed),
                ViewUpdate::Relation(space, r) => {
                    let view = self.spaces.entry(space).or_default();
                    if d > 0 {
                        let r = view.relations.get(&*r).cloned().unwrap_or_else(|| std::sync::Arc::from(r));
                        for end in [&r.from, &r.to] {
                            view.related.entry(end.clone()).or_default().insert(r.clone());
                        }
                        view.relations.insert(r);
                    } else {
                        for end in [&r.from, &r.to] {
                            if let Some(set) = view.related.get_mut(end) {
                                set.remove(&*r);
                                if set.is_empty() {
                                    view.related.remove(end);
                                }
                            }
                        }
                        view.relations.remove(&*r);
                    }
                }
                ViewUpdate::Topic(space, t, e) => {
                    let view = self.space_mut(&space);
                    if d > 0 {
                        view.topic_of.insert(e.to_string(), t.to_string());
                    } else if view.topic_of.get(e.as_str()).is_some_and(|x| t == *x) {
                        view.topic_of.remove(e.as_str());
                    }
                }
                ViewUpdate::Merge(space, e, g) => {
                    let view = self.space_mut(&space);
                    if d > 0 {
                        view.groups.insert(e.to_string(), g.to_string());
                    } else if view.groups.get(e.as_str()).is_some_and(|x| g == *x) {
                        view.groups.remove(e.as_str());
                    }
                }
                ViewUpdate::Position(source, offset) => {
                    if d > 0 {
                        self.positions.insert(source, offset);
                    } else if self.positions.get(&source) == Some(&offset) {
                        self.positions.remove(&source);
                    }
                }
                ViewUpdate::Error(row) => {
                    if d > 0 {
                        self.errors_total += 1;
                        self.recent_errors.push_back(*row);
                        while self.recent_errors.len() > RECENT_ERRORS {
                            self.recent_errors.pop_front();
                        }
                    }
                }
            }
        }
        for (space, doc, pos) in moved {
            let Some(view) = self.spaces.get_mut(&space) else { continue };
            // The node at the position (if any is left) and the first after it.
            let ids: Vec<operators::Name> = view
                .order
                .get(doc.as_str())
                .map_or(Vec::new(), |o| o.range(pos..).take(2).map(|(_, id)| id.clone()).collect());
            for id in ids {
                view.refresh_before(&id);
            }
        }
        for view in self.spaces.values_mut() {
            view.names.sweep();
        }
        self.spaces.retain(|_, v| !v.is_empty());
    }

    /// The views as the updates that build them from nothing, and the vectors of their summaries and events (by
    /// text): what a checkpoint holds. [`Views::restore`] applies them through the same code as the dataflow's
    /// updates, so what is derived from them (the lexical index, the order of a document, the index of layer 0) is
    /// rebuilt, not stored.
    /// The structure's part and the rest are taken on two threads at once (both only read the views).
    pub fn snapshot(&self) -> (Vec<ViewUpdate>, Vec<(String, Embedding)>) {
        let ((mut updates, mut vectors), (structure, summaries)) = std::thread::scope(|s| {
            let structure = s.spawn(|| self.snapshot_of(Part::Structure, true));
            let rest = self.snapshot_of(Part::Dataflow, true);
            (rest, structure.join().expect("a snapshot does not panic"))
        });
        updates.extend(structure);
        vectors.extend(summaries);
        updates.extend(self.positions.iter().map(|(source, offset)| ViewUpdate::Position(source.clone(), *offset)));
        (updates, vectors)
    }

    /// The structure's part of [`Views::snapshot`]: clusters, layer edges, summaries and summary requests (what
    /// [`ViewUpdate::is_structure`] accepts).
    pub fn structure_snapshot(&self) -> Vec<ViewUpdate> {
        self.snapshot_of(Part::Structure, false).0
    }

    /// The updates of `part` of [`Views::snapshot`], with the vectors of its summaries and events when asked.
    fn snapshot_of(&self, part: Part, with_vectors: bool) -> (Vec<ViewUpdate>, Vec<(String, Embedding)>) {
        let (dataflow, structure) = (part != Part::Structure, part != Part::Dataflow);
        let mut updates = Vec::new();
        let mut vectors = Vec::new();
        for (space, v) in &self.spaces {
            let s = || space.clone();
            let n = Name::from(space.as_str());
            if dataflow {
                for (node, emb) in v.nodes.values() {
                    updates.push(ViewUpdate::Node(s(), Box::new(node.clone()), emb.clone()));
                }
            }
            for (a, links) in &v.adjacency {
                // A layer-0 edge joins two nodes, a layer edge two clusters: `a` decides, looked up once.
                let a_is_node = v.nodes.contains_key(a.as_str());
                let layer = if structure { v.clusters.get(a.as_str()).map_or(0, |c| c.layer) } else { 0 };
                for (b, w) in links.after(a) {
                    if a_is_node && v.nodes.contains_key(b.as_str()) {
                        if dataflow {
                            let (u, v) = (a.to_string(), b.to_string());
                            updates.push(ViewUpdate::Edge(Box::new(Edge { space: s(), u, v, weight_micro: *w })));
                        }
                    } else if structure {
                        updates.push(ViewUpdate::LayerEdge(n.clone(), layer, a.clone(), b.clone(), u64::from(*w)));
                    }
                }
            }
            if structure {
                for (c, cv) in &v.clusters {
                    // One name for the cluster, shared by its memberships and its summary.
                    let c = Name::from(c.as_str());
                    for m in &cv.members {
                        updates.push(ViewUpdate::Cluster(n.clone(), cv.layer, c.clone(), m.clone()));
                    }
                    if let Some((text, emb)) = &cv.summary {
                        updates.push(ViewUpdate::Summary(n.clone(), cv.layer, c, Name::from(text.as_str())));
                        if with_vectors {
                            vectors.push((text.clone(), emb.clone()));
                        }
                    }
                }
            }
            for (key, r) in &v.requests {
                let of_structure = matches!(**r, ModelRequest::Summary { .. });
                if (of_structure && structure) || (!of_structure && dataflow) {
                    updates.push(ViewUpdate::Request(s(), key.clone(), Box::new(r.as_ref().clone())));
                }
            }
            if !dataflow {
                continue;
            }
            for (id, e) in &v.events {
                updates.push(ViewUpdate::Event(s(), Box::new(e.clone())));
                if let Some(emb) = v.event_vectors.get(id).filter(|_| with_vectors) {
                    vectors.push((event_text(e), emb.clone()));
                }
            }
            for r in &v.relations {
                updates.push(ViewUpdate::Relation(s(), Box::new(r.as_ref().clone())));
            }
            for (e, g) in &v.groups {
                updates.push(ViewUpdate::Merge(n.clone(), e.into(), g.into()));
            }
            for (e, t) in &v.topic_of {
                updates.push(ViewUpdate::Topic(n.clone(), t.into(), e.into()));
            }
        }
        (updates, vectors)
    }

    /// The updates that take what the views hold of the dataflow's own output — everything but the structure's
    /// changes, the rejects and the sources' positions — to `rebuilt`, the dataflow's output for the same epochs
    /// (consolidated or not): none where the two agree. A restart from a checkpoint applies them once the dataflow has
    /// rebuilt the checkpoint's epochs, so the views go on from the state the dataflow's later changes are relative
    /// to.
    pub fn correction(&self, rebuilt: Vec<(ViewUpdate, isize)>) -> Vec<(ViewUpdate, isize)> {
        let of_dataflow =
            |u: &ViewUpdate| !u.is_structure() && !matches!(u, ViewUpdate::Error(_) | ViewUpdate::Position(..));
        let (held, _) = self.snapshot_of(Part::Dataflow, false);
        let mut diff: Vec<(ViewUpdate, isize)> =
            rebuilt.into_iter().filter(|(u, _)| of_dataflow(u)).chain(held.into_iter().map(|u| (u, -1))).collect();
        differential_dataflow::consolidation::consolidate(&mut diff);
        diff
    }

    /// Builds the views of a checkpoint ([`Views::snapshot`]) at `as_of` (its hierarchy at `hierarchy_as_of`), with
    /// its rejects. Into empty views, the graph (edges, clusters and their summaries) is applied on a second thread
    /// while this one applies the rest: the two touch disjoint parts of a space's view, which are then put together.
    pub fn restore(
        &mut self,
        (as_of, hierarchy_as_of): (u64, Option<u64>),
        updates: Vec<ViewUpdate>,
        vectors: Vec<(String, Embedding)>,
        errors_total: u64,
        recent_errors: VecDeque<ErrorRow>,
    ) {
        let vectors: HashMap<String, Embedding> = vectors.into_iter().collect();
        let embed = |text: &str| vectors.get(text).cloned().unwrap_or_default();
        let signed = |u: Vec<ViewUpdate>| u.into_iter().map(|u| (u, 1)).collect::<Vec<_>>();
        if self.spaces.is_empty() {
            let (graph, rest): (Vec<ViewUpdate>, Vec<ViewUpdate>) = updates.into_iter().partition(|u| {
                matches!(
                    u,
                    ViewUpdate::Edge(_) | ViewUpdate::LayerEdge(..) | ViewUpdate::Cluster(..) | ViewUpdate::Summary(..)
                )
            });
            let mut graph_views = Views { ann: self.ann.clone(), ..Views::default() };
            std::thread::scope(|s| {
                let graph_side = s.spawn(|| {
                    let (edges, rest): (Vec<ViewUpdate>, Vec<ViewUpdate>) =
                        graph.into_iter().partition(|u| matches!(u, ViewUpdate::Edge(_) | ViewUpdate::LayerEdge(..)));
                    graph_views.build_adjacency(edges);
                    graph_views.apply_consolidated(signed(rest), &embed);
                });
                self.apply_consolidated(signed(rest), &embed);
                graph_side.join().expect("the graph's restore does not panic");
            });
            for (space, g) in graph_views.spaces {
                self.spaces.entry(space).or_default().take_graph(g);
            }
            self.requests_version = REQUESTS_VERSION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        } else {
            self.apply_consolidated(signed(updates), &embed);
        }
        self.as_of = Some(as_of);
        self.hierarchy_as_of = hierarchy_as_of;
        self.errors_total = errors_total;
        self.recent_errors = recent_errors;
    }

    /// Builds the adjacency of empty views from edges each given once (a checkpoint's), as inserting them one by one
    /// would: the last weight of a pair is the one kept.
    fn build_adjacency(&mut self, edges: Vec<ViewUpdate>) {
        let mut by_space: BTreeMap<String, Vec<(String, String, u32, bool)>> = BTreeMap::new();
        for u in edges {
            let (space, edge) = match u {
                ViewUpdate::Edge(e) => (e.space, (e.u, e.v, e.weight_micro, true)),
                ViewUpdate::LayerEdge(space, _, u, v, w) => {
                    (space.to_string(), (u.to_string(), v.to_string(), layer_weight(w), false))
                }
                _ => continue,
            };
            by_space.entry(space).or_default().push(edge);
        }
        for (space, edges) in by_space {
            self.spaces.entry(space).or_default().build_adjacency(edges);
        }
    }

    /// The index builds the applied updates asked for, each with a copy of its space's vectors (shared, not copied:
    /// an `Arc` each), to run off the views' lock ([`crate::ann::IndexBuild::run`]) and install with
    /// [`Views::install_index`].
    pub fn take_index_builds(&mut self) -> Vec<crate::ann::IndexBuild> {
        let spaces = std::mem::take(&mut self.index_builds);
        spaces
            .into_iter()
            .filter_map(|space| {
                let view = self.spaces.get(&space)?;
                let mut nodes: Vec<(operators::Name, Embedding)> =
                    view.nodes.iter().map(|(id, (_, e))| (id.clone(), e.clone())).collect();
                nodes.sort_by(|a, b| a.0.cmp(&b.0));
                Some(crate::ann::IndexBuild { space, params: self.ann.clone(), nodes })
            })
            .collect()
    }

    /// Every space's nearest-neighbour index as a checkpoint holds it; a space without one (too small, or its index
    /// out being built) has none, and a restart builds its index.
    pub fn ann_states(&self) -> Vec<(String, crate::ann::AnnState)> {
        self.spaces.iter().filter_map(|(s, v)| Some((s.clone(), v.ann.as_ref()?.state()))).collect()
    }

    /// Installs the indexes a checkpoint held over the restored nodes ([`Views::restore`]), in place of the builds
    /// their restore asked for. A state that does not fit its space's nodes is dropped with a warning, and that
    /// space's index is built from the nodes.
    pub fn restore_indexes(&mut self, states: Vec<(String, crate::ann::AnnState)>) {
        for (space, state) in states {
            let Some(view) = self.spaces.get_mut(&space) else { continue };
            if view.ann.is_some() || view.nodes.len() < self.ann.exhaustive_below {
                continue;
            }
            let t = std::time::Instant::now();
            match crate::ann::NodeAnn::restore(&self.ann, state, &view.nodes) {
                Ok(index) => {
                    tracing::info!(space, nodes = index.len(), took = ?t.elapsed(),
                        "installed the checkpoint's nearest-neighbour index");
                    *view.ann = Some(index);
                    view.ann.building = false;
                    self.index_builds.remove(&space);
                }
                Err(e) => tracing::warn!(space, error = %e,
                    "the checkpoint's nearest-neighbour index does not fit the space; building it from its nodes"),
            }
        }
    }

    /// Installs an index built aside (see [`SpaceView::install_index`]).
    pub fn install_index(&mut self, built: crate::ann::BuiltIndex) {
        let params = self.ann.clone();
        if let Some(view) = self.spaces.get_mut(&built.space) {
            view.install_index(built.index, &built.nodes, &params);
        }
    }

    pub fn node_count(&self) -> usize {
        self.spaces.values().map(|v| v.nodes.len()).sum()
    }

    pub fn cluster_count(&self) -> usize {
        self.spaces.values().map(|v| v.clusters.len()).sum()
    }

    pub fn request_count(&self) -> usize {
        self.spaces.values().map(|v| v.requests.len()).sum()
    }

    pub fn edge_count(&self) -> usize {
        self.spaces.values().map(|v| v.edges).sum()
    }
}

impl ViewUpdate {
    /// The memory-change message of an update (`None` for internal ones: errors and summary requests), keyed by
    /// space: `{"op":"upsert"|"retract","type":…,"epoch":E,…}`. Embeddings are left out.
    pub fn change(&self, diff: isize, epoch: u64) -> Option<(String, serde_json::Value)> {
        use serde_json::json;
        let op = if diff > 0 { "upsert" } else { "retract" };
        let (space, body) = match self {
            ViewUpdate::Node(s, n, _) => (
                s.as_str(),
                json!({"type": "node", "id": n.id, "kind": n.kind, "doc": n.doc, "pos": n.pos,
                                                    "text": n.text, "speaker": n.speaker, "ts": n.ts}),
            ),
            ViewUpdate::Edge(e) => (
                e.space.as_str(),
                json!({"type": "edge", "layer": 0, "u": e.u, "v": e.v, "weight_micro": e.weight_micro}),
            ),
            ViewUpdate::Cluster(s, l, c, m) => {
                (s.as_str(), json!({"type": "cluster-member", "layer": l, "cluster": c, "member": m}))
            }
            ViewUpdate::LayerEdge(s, l, u, v, w) => {
                (s.as_str(), json!({"type": "edge", "layer": l, "u": u, "v": v, "weight_micro": w}))
            }
            ViewUpdate::Summary(s, l, c, t) => {
                (s.as_str(), json!({"type": "summary", "layer": l, "cluster": c, "text": t}))
            }
            ViewUpdate::Event(s, e) => (
                s.as_str(),
                json!({"type": "event", "id": e.id, "conversation": e.conversation, "session": e.session,
                                                  "turns": e.turns, "summary": e.summary, "people": e.people, "time": e.time}),
            ),
            ViewUpdate::Relation(s, r) => (
                s.as_str(),
                json!({"type": "relation", "from": r.from, "to": r.to, "kind": r.kind, "evidence": r.evidence}),
            ),
            ViewUpdate::Merge(s, e, g) => (s.as_str(), json!({"type": "event-group", "event": e, "group": g})),
            ViewUpdate::Topic(s, t, e) => (s.as_str(), json!({"type": "topic-member", "topic": t, "event": e})),
            ViewUpdate::Error(_) | ViewUpdate::Request(..) | ViewUpdate::Position(..) => return None,
        };
        let mut body = body;
        body["op"] = json!(op);
        body["epoch"] = json!(epoch);
        body["space"] = json!(space);
        Some((space.to_string(), body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use operators::NodeKind;

    fn node(id: &str, text: &str) -> Node {
        Node {
            id: id.into(),
            kind: NodeKind::Chunk,
            doc: "d".into(),
            pos: 0,
            text: text.into(),
            speaker: None,
            ts: None,
        }
    }

    /// A restart's views hold the checkpoint; the dataflow rebuilt behind it may hold other edges (an approximate
    /// index built in another order). The correction takes the views to the dataflow's state and leaves the
    /// structure's part, which the structure replaces on its own, as it was.
    #[test]
    fn the_correction_takes_the_views_to_the_rebuilt_dataflow() {
        let edge = |u: &str, v: &str, w: u32| {
            ViewUpdate::Edge(Box::new(Edge { space: "s".into(), u: u.into(), v: v.into(), weight_micro: w }))
        };
        let nodes: Vec<ViewUpdate> = ["a", "b", "c", "d"]
            .iter()
            .map(|id| ViewUpdate::Node("s".into(), Box::new(node(id, id)), Embedding::new(vec![1.0, 0.0])))
            .collect();
        let cluster = ViewUpdate::Cluster("s".into(), 1, "L1-x".into(), "a".into());
        let held: Vec<ViewUpdate> =
            nodes.iter().cloned().chain([edge("a", "b", 700_000), edge("b", "c", 650_000), cluster.clone()]).collect();
        let mut views = Views::default();
        views.apply(held.iter().cloned().map(|u| (u, 1)).collect());
        // The rebuild keeps a–b at another weight, lacks b–c and has c–d; its rejects and positions are not the
        // views' to take again.
        let rebuilt: Vec<(ViewUpdate, isize)> = nodes
            .iter()
            .cloned()
            .chain([edge("a", "b", 710_000), edge("c", "d", 900_000), ViewUpdate::Position("file:x".into(), 9)])
            .map(|u| (u, 1))
            .collect();
        assert!(views
            .correction(held.iter().filter(|u| !u.is_structure()).cloned().map(|u| (u, 1)).collect())
            .is_empty());
        let correction = views.correction(rebuilt.clone());
        assert_eq!(correction.len(), 4, "{correction:?}");
        views.apply(correction);
        let mut want = Views::default();
        want.apply(rebuilt.into_iter().chain([(cluster, 1)]).collect());
        let sorted = |v: &Views| {
            let mut u = v.snapshot().0;
            u.retain(|u| !matches!(u, ViewUpdate::Position(..)));
            u.sort();
            u
        };
        assert_eq!(sorted(&views), sorted(&want));
        assert_eq!(views.edge_count(), 2);
        assert!(views.correction(want.snapshot().0.into_iter().map(|u| (u, 1)).collect()).is_empty());
    }

    /// A checkpoint's restore builds the graph on a second thread and the rest on this one: the views it builds are
    /// the views whose snapshot it was, down to what is derived from the updates (parents, order, sessions).
    #[test]
    fn a_restored_snapshot_is_the_views_it_was_taken_from() {
        let mut views = Views::default();
        let mut updates = Vec::new();
        for i in 0..40i64 {
            let id = format!("t{i}");
            let n = Node { pos: i * operators::model::POSITION_SCALE, ..node(&id, &format!("word{} harbour", i % 7)) };
            updates.push(ViewUpdate::Node("s".into(), Box::new(n), Embedding::new(vec![1.0, i as f32 / 40.0])));
            if i > 0 {
                let (u, v) = (format!("t{}", i - 1), id.clone());
                updates.push(ViewUpdate::Edge(Box::new(Edge {
                    space: "s".into(),
                    u,
                    v,
                    weight_micro: 600_000 + i as u32,
                })));
            }
            updates.push(ViewUpdate::Cluster("s".into(), 1, format!("L1:{}", i / 5).into(), id.clone().into()));
        }
        for c in 0..8 {
            updates.push(ViewUpdate::Cluster("s".into(), 2, format!("L2:{}", c / 4).into(), format!("L1:{c}").into()));
            updates.push(ViewUpdate::Summary("s".into(), 1, format!("L1:{c}").into(), format!("summary {c}").into()));
            if c > 0 {
                let (u, v) = (format!("L1:{}", c - 1), format!("L1:{c}"));
                updates.push(ViewUpdate::LayerEdge("s".into(), 1, u.into(), v.into(), 500_000));
            }
        }
        let event = |i: usize| operators::events::EventRow {
            id: format!("E:{i}"),
            conversation: "d".into(),
            session: 0,
            turns: (4 * i..4 * i + 4).map(|t| format!("t{t}")).collect(),
            summary: format!("event {i}"),
            people: vec!["Ann".into()],
            time: None,
        };
        for i in 0..10 {
            updates.push(ViewUpdate::Event("s".into(), Box::new(event(i))));
            updates.push(ViewUpdate::Topic("s".into(), "T:E:0".into(), format!("E:{i}").into()));
            if i > 0 {
                let r = operators::events::RelationRow {
                    from: format!("E:{}", i - 1),
                    to: format!("E:{i}"),
                    kind: operators::events::RelationKind::Temporal,
                    evidence: vec![format!("t{i}")].into(),
                };
                updates.push(ViewUpdate::Relation("s".into(), Box::new(r)));
            }
        }
        let request = |r: ModelRequest| ViewUpdate::Request("s".into(), format!("{:?}", r.kind()), Box::new(r));
        updates.push(request(ModelRequest::Summary { layer: 1, cluster: "L1:x".into(), members: vec![] }));
        updates.push(request(ModelRequest::Judge { pair: [("E:1".into(), "a".into()), ("E:2".into(), "b".into())] }));
        updates.push(ViewUpdate::Position("file:a".into(), 7));
        let embed = |text: &str| Embedding::new(vec![text.len() as f32, 1.0]);
        views.apply_with(updates.into_iter().map(|u| (u, 1)).collect(), &embed);
        let (held, vectors) = views.snapshot();
        // The structure's part and the dataflow's split the snapshot by `is_structure`, the positions in neither.
        let sorted = |mut u: Vec<ViewUpdate>| {
            u.sort();
            u
        };
        let part = |f: &dyn Fn(&ViewUpdate) -> bool| sorted(held.iter().filter(|u| f(u)).cloned().collect());
        let structure = sorted(views.structure_snapshot());
        assert_eq!(structure, part(&|u| u.is_structure()));
        assert_eq!(structure.iter().filter(|u| matches!(u, ViewUpdate::Request(..))).count(), 1);
        let dataflow = part(&|u| !u.is_structure() && !matches!(u, ViewUpdate::Position(..)));
        assert_eq!(sorted(views.snapshot_of(Part::Dataflow, false).0), dataflow);
        assert_eq!(dataflow.iter().filter(|u| matches!(u, ViewUpdate::Request(..))).count(), 1);
        assert!(views.correction(dataflow.into_iter().map(|u| (u, 1)).collect()).is_empty());
        let mut restored = Views::default();
        restored.restore((3, Some(2)), held.clone(), vectors, 0, VecDeque::new());
        assert_eq!(sorted(restored.snapshot().0), sorted(held));
        let (a, b) = (&views.spaces["s"], &restored.spaces["s"]);
        let parents = |v: &SpaceView| -> BTreeMap<String, Vec<String>> {
            v.parents.iter().map(|(m, p)| (m.to_string(), p.iter().map(|c| c.to_string()).collect())).collect()
        };
        assert_eq!(b.parents.len(), 48);
        assert_eq!(parents(a), parents(b));
        assert_eq!((a.edges, b.related("E:3").count()), (b.edges, 2));
        assert_eq!(a.with_before, b.with_before);
        assert_eq!(a.sessions, b.sessions);
        assert_eq!(b.clusters["L1:3"].summary, a.clusters["L1:3"].summary);
        assert_eq!((restored.as_of, restored.hierarchy_as_of), (Some(3), Some(2)));
    }

    /// The adjacency built at once from a restore's edges is the one their inserts build one by one, a pair given
    /// twice included (its last weight is kept).
    #[test]
    fn an_adjacency_built_at_once_is_the_one_inserts_build() {
        let edge = |u: &str, v: &str, w: u32| {
            ViewUpdate::Edge(Box::new(Edge { space: "s".into(), u: u.into(), v: v.into(), weight_micro: w }))
        };
        let edges = vec![
            edge("c", "a", 700_000),
            edge("a", "b", 650_000),
            edge("b", "c", 600_000),
            edge("a", "c", 710_000),
            ViewUpdate::LayerEdge("s".into(), 1, "L1:x".into(), "L1:y".into(), u64::MAX),
        ];
        let mut one_by_one = Views::default();
        for e in &edges {
            one_by_one.apply(vec![(e.clone(), 1)]);
        }
        let mut at_once = Views::default();
        at_once.build_adjacency(edges);
        let lists = |v: &Views| -> BTreeMap<String, Vec<(String, u32)>> {
            let adjacency = &v.spaces["s"].adjacency;
            adjacency
                .iter()
                .map(|(a, l)| (a.to_string(), l.0.iter().map(|(b, w)| (b.to_string(), *w)).collect()))
                .collect()
        };
        assert_eq!(lists(&at_once), lists(&one_by_one));
        assert_eq!(lists(&at_once)["a"], vec![("b".to_string(), 650_000), ("c".to_string(), 710_000)]);
        assert_eq!(lists(&at_once)["L1:x"], vec![("L1:y".to_string(), u32::MAX)]);
        assert_eq!(at_once.spaces["s"].edges, one_by_one.spaces["s"].edges);
    }

    #[test]
    fn the_session_index_follows_events_that_come_change_and_go() {
        let event = |i: u64, gen: u64| operators::events::EventRow {
            id: format!("e{i}"),
            conversation: format!("c{}", i % 3),
            session: (i % 2) as i64,
            turns: (0..1 + (i + gen) % 4).map(|t| format!("t{i}-{t}")).collect(),
            summary: format!("v{gen}"),
            people: vec![],
            time: None,
        };
        let mut v = Views::default();
        let mut live: BTreeMap<u64, u64> = BTreeMap::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _epoch in 0..60 {
            let mut batch = Vec::new();
            let mut touched = BTreeSet::new();
            for _ in 0..4 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = x % 10;
                if !touched.insert(i) {
                    continue;
                }
                match live.get(&i).copied() {
                    Some(g) if x.is_multiple_of(3) => {
                        batch.push((ViewUpdate::Event("s".into(), Box::new(event(i, g))), -1));
                        live.remove(&i);
                    }
                    Some(g) => {
                        batch.push((ViewUpdate::Event("s".into(), Box::new(event(i, g))), -1));
                        batch.push((ViewUpdate::Event("s".into(), Box::new(event(i, g + 1))), 1));
                        live.insert(i, g + 1);
                    }
                    None => {
                        batch.push((ViewUpdate::Event("s".into(), Box::new(event(i, 0))), 1));
                        live.insert(i, 0);
                    }
                }
            }
            v.apply(batch);
            let mut want: HashMap<String, HashMap<i64, SessionEvents>> = HashMap::default();
            for (&i, &g) in &live {
                let e = event(i, g);
                let s = want.entry(e.conversation.clone()).or_default().entry(e.session).or_default();
                s.turns += e.turns.len();
                s.events.insert(e.id);
            }
            let got = v.spaces.get("s").map(|s| s.sessions.clone()).unwrap_or_default();
            assert_eq!(got, want);
        }
    }

    #[test]
    fn a_change_is_a_few_words_long() {
        // An epoch's changes wait in vectors of these: the structure's output of one step, hundreds of thousands.
        assert!(std::mem::size_of::<ViewUpdate>() <= 64, "{} bytes", std::mem::size_of::<ViewUpdate>());
    }

    #[test]
    fn updates_that_cancel_within_an_epoch_leave_nothing() {
        let mut v = Views::default();
        let request = ModelRequest::Summary { layer: 1, cluster: "L1:x".into(), members: vec![] };
        let r = ViewUpdate::Request("s".into(), "h".into(), Box::new(request));
        v.apply(vec![(r.clone(), 1), (r, -1)]);
        assert!(v.spaces.is_empty());
    }

    #[test]
    fn each_nodes_sum_with_the_node_before_it_follows_inserts_and_deletes() {
        use operators::Embedder;
        let e = operators::HashEmbedder::new(64);
        let step = operators::model::POSITION_SCALE;
        // Positions 0..12 of one document with a gap after 5 (a new session), texts that change on replacement.
        let at = |i: i64, gen: u32| {
            let pos = if i > 5 { (i + 10) * step } else { i * step };
            let text = format!("turn {i} version {gen} {}", i * 7 % 5);
            let n = Node { id: format!("n{i}").into(), pos, text: text.into(), ..node("x", "") };
            let emb = e.embed(&n.text);
            ViewUpdate::Node("s".into(), Box::new(n), emb)
        };
        let mut v = Views::default();
        let mut live: BTreeMap<i64, u32> = BTreeMap::new();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for _epoch in 0..40 {
            let mut batch = Vec::new();
            for _ in 0..3 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = (x % 12) as i64;
                match live.get(&i).copied() {
                    Some(g) if x.is_multiple_of(3) => {
                        batch.push((at(i, g), -1));
                        live.remove(&i);
                    }
                    Some(g) => {
                        batch.push((at(i, g), -1));
                        batch.push((at(i, g + 1), 1));
                        live.insert(i, g + 1);
                    }
                    None => {
                        batch.push((at(i, 0), 1));
                        live.insert(i, 0);
                    }
                }
            }
            // One change per position and epoch (a position's retraction and insertion consolidate otherwise).
            let mut seen = BTreeSet::new();
            batch.retain(|(u, _)| match u {
                ViewUpdate::Node(_, n, _) => seen.insert((n.pos, n.text.clone())),
                _ => true,
            });
            v.apply(batch);
            let Some(view) = v.spaces.get("s") else { continue };
            // From scratch: every node with a node one step before it.
            let mut want: HashMap<String, f32> = HashMap::default();
            for (id, (n, emb)) in &view.nodes {
                if let Some((_, pe)) = view.before(n).and_then(|p| view.nodes.get(p)) {
                    want.insert(id.to_string(), (emb.dot(emb) + pe.dot(pe) + 2.0 * emb.dot(pe)).sqrt());
                }
            }
            assert_eq!(view.with_before.len(), want.len(), "{:?} {:?}", view.with_before, want);
            for (id, w) in &want {
                assert!((view.with_before[id.as_str()] - w).abs() < 1e-5, "{id}");
            }
        }
        assert!(!v.spaces.is_empty());
    }

    #[test]
    fn replacement_within_an_epoch_keeps_the_new_version() {
        let mut v = Views::default();
        v.apply(vec![(ViewUpdate::Node("s".into(), Box::new(node("a", "old")), Embedding::default()), 1)]);
        v.apply(vec![
            (ViewUpdate::Node("s".into(), Box::new(node("a", "new")), Embedding::default()), 1),
            (ViewUpdate::Node("s".into(), Box::new(node("a", "old")), Embedding::default()), -1),
        ]);
        assert_eq!(v.spaces["s"].nodes["a"].0.text, "new");
        v.apply(vec![(ViewUpdate::Node("s".into(), Box::new(node("a", "new")), Embedding::default()), -1)]);
        assert!(v.spaces.is_empty());
    }

    /// An index built aside: asked for once when the space crosses `exhaustive-below` (the space is read exactly
    /// until it is installed), brought up to date at install with what came, changed and left during the build, and
    /// asked for again when tombstones outnumber the living, the worn index serving meanwhile.
    /// A checkpoint's nearest-neighbour index is installed as it was, tombstones and plateaus included: the
    /// restored views answer every search alike and ask for no build. One that does not fit the restored nodes is
    /// dropped, and the build is asked for.
    #[test]
    fn a_restored_index_is_the_index_it_was_taken_from() {
        let e = operators::HashEmbedder::new(64);
        let text = |i: usize| format!("turn {i} of topic{} word{}", i % 41, i % 97);
        let upsert = |i: usize, t: &str, d: isize| {
            let mut n = node(&format!("n{i:05}"), t);
            n.pos = i as i64;
            (ViewUpdate::Node("s".into(), Box::new(n), operators::Embedder::embed(&e, t)), d)
        };
        let ann = crate::ann::AnnParams { exhaustive_below: 500, build_aside: true, ..Default::default() };
        let mut v = Views { ann: ann.clone(), ..Views::default() };
        v.apply((0..900).map(|i| upsert(i, &text(i), 1)).collect());
        let built = v.take_index_builds().pop().unwrap().run();
        v.install_index(built);
        // A plateau of one backchannel, and points left as tombstones.
        v.apply((900..960).map(|i| upsert(i, "yeah .", 1)).collect());
        v.apply((0..40).map(|i| upsert(i, &text(i), -1)).collect());
        v.as_of = Some(3);
        let (updates, vectors) = v.snapshot();
        let restore = |states| {
            let mut back = Views { ann: ann.clone(), ..Views::default() };
            back.restore((3, None), updates.clone(), vectors.clone(), 0, VecDeque::new());
            back.restore_indexes(states);
            back
        };
        let back = restore(v.ann_states());
        assert!(back.index_builds.is_empty(), "no build is asked for");
        let (a, b) = (v.spaces["s"].ann.as_ref().unwrap(), back.spaces["s"].ann.as_ref().unwrap());
        assert_eq!((b.len(), b.points()), (a.len(), a.points()));
        for q in (0..900).step_by(7).map(text).chain(["yeah .".to_string()]) {
            let q = operators::Embedder::embed(&e, &q);
            assert_eq!(a.search(&q, 12), b.search(&q, 12));
        }
        // A state taken before a node came: it does not fit, and the index is built from the nodes.
        let mut before = Views { ann: ann.clone(), ..Views::default() };
        before.apply((0..899).map(|i| upsert(i, &text(i), 1)).collect());
        let built = before.take_index_builds().pop().unwrap().run();
        before.install_index(built);
        let mut unfit = restore(before.ann_states());
        assert!(unfit.spaces["s"].ann.is_none());
        assert_eq!(unfit.take_index_builds().len(), 1, "the build is asked for");
    }

    #[test]
    fn an_index_built_aside_catches_up_with_the_changes_made_during_its_build() {
        let e = operators::HashEmbedder::new(64);
        let text = |i: usize, gen: usize| format!("turn {i} of topic{} word{} version{gen}", i % 41, i % 97);
        let upsert = |i: usize, gen: usize, d: isize| {
            let mut n = node(&format!("n{i:05}"), &text(i, gen));
            n.pos = i as i64;
            (ViewUpdate::Node("s".into(), Box::new(n), operators::Embedder::embed(&e, &text(i, gen))), d)
        };
        let ann = crate::ann::AnnParams { exhaustive_below: 1000, build_aside: true, ..Default::default() };
        let mut v = Views { ann, ..Views::default() };
        v.apply((0..1200).map(|i| upsert(i, 0, 1)).collect());
        assert!(v.spaces["s"].ann.is_none(), "not built within the apply");
        let mut builds = v.take_index_builds();
        assert_eq!(builds.len(), 1);
        assert_eq!(builds[0].nodes.len(), 1200);
        // During the build: more nodes, some gone, some replaced; no second build is asked for.
        v.apply((1200..3000).map(|i| upsert(i, 0, 1)).collect());
        v.apply((0..100).map(|i| upsert(i, 0, -1)).collect());
        v.apply((100..150).flat_map(|i| [upsert(i, 0, -1), upsert(i, 1, 1)]).collect());
        assert!(v.take_index_builds().is_empty(), "one build at a time");
        v.install_index(builds.pop().unwrap().run());
        let view = &v.spaces["s"];
        let index = view.ann.as_ref().expect("installed");
        assert_eq!(index.len(), view.nodes.len());
        let probes: Vec<usize> = (100..3000).step_by(29).collect();
        let found = probes
            .iter()
            .filter(|&&i| {
                let gen = usize::from((100..150).contains(&i));
                index.search(&operators::Embedder::embed(&e, &text(i, gen)), 1)[0].1 == format!("n{i:05}")
            })
            .count();
        assert!(
            found + 3 >= probes.len(),
            "{found} of {} nodes (replaced ones at their new vector) are their own nearest",
            probes.len()
        );
        let replaced = operators::Embedder::embed(&e, &text(120, 0));
        assert!(index.search(&replaced, 20).iter().all(|(s, _)| *s < 0.999), "a replaced vector is gone");
        let probe = operators::Embedder::embed(&e, &text(5, 0));
        assert!(index.search(&probe, 20).iter().all(|(_, id)| *id >= "n00100"), "a removed node is never a hit");
        // Wear: the index keeps serving while its replacement is built.
        v.apply((100..1800).map(|i| upsert(i, usize::from(i < 150), -1)).collect());
        assert!(v.spaces["s"].ann.is_some(), "the worn index still serves");
        let mut builds = v.take_index_builds();
        assert_eq!(builds.len(), 1, "a rebuild is asked for once tombstones outnumber the living");
        assert_eq!(builds[0].nodes.len(), 1200);
        v.install_index(builds.pop().unwrap().run());
        let index = v.spaces["s"].ann.as_ref().unwrap();
        assert_eq!(index.len(), 1200);
        assert!(!index.worn());
        // A space that shrank below half of `exhaustive-below` during its build drops the index it gets.
        v.apply((1800..3000).map(|i| upsert(i, 0, -1)).collect());
        v.apply((0..600).map(|i| upsert(i, 2, 1)).collect());
        assert!(v.spaces["s"].ann.is_none());
        v.apply((600..1000).map(|i| upsert(i, 2, 1)).collect());
        let mut builds = v.take_index_builds();
        v.apply((0..600).map(|i| upsert(i, 2, -1)).collect());
        v.install_index(builds.pop().unwrap().run());
        assert!(v.spaces["s"].ann.is_none(), "400 nodes: read exactly");
    }
}
