//! A compact HNSW graph (Malkov & Yashunin, "Efficient and robust approximate nearest neighbor search using
//! Hierarchical Navigable Small World graphs", 2018) over shared unit vectors: the similarity index's and the views'
//! nearest-neighbour index.
//!
//! hnsw_rs keeps, per point, a table of 16 layers, a lock, and every link as a reference-counted allocation of its
//! own: about 1.5 KB a point at 16 links, more than the rest of a node's similarity state. Here a point is its
//! vector (a shared [`Embedding`] handle), its layer-0 links in one flat array of `u32` (`2·M` slots a point) and,
//! for the few points above layer 0 (one in `M`), their upper links in a map: under 200 bytes a point. The graph is
//! one space's, built and read by one thread at a time (the index's owner; readers through `&self`), so it needs no
//! locks.
//!
//! The algorithm is the paper's: a point's level drawn from `⌊−ln U · 1/ln M⌋` (a seeded generator, drawn once per
//! insert, so the same inserts in the same order give the same graph); greedy descent through the upper layers; a
//! beam search of width `ef` on each layer from the point's level down; neighbours chosen by the paper's heuristic
//! (Algorithm 4: a candidate is kept when it is closer to the point than to every neighbour kept before it), `M` on
//! every layer for a new point, and a neighbour's list, when a new link overflows it (`M` above layer 0, `2·M` on
//! it), cut back by the same heuristic. Distances are `1 − a·b` floored at 0 ([`crate::model::UnitCosine`]'s, bit for
//! bit), and every order breaks ties by point, so a walk is deterministic.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use serde::{Deserialize, Serialize};

use crate::fasthash::{HashMap, HashSet};
use crate::model::Embedding;

/// The seed of the level generator: every index starts from the same one.
const SEED: u64 = 0x5eed_4e57_9a1d_c0de;
/// Levels are drawn in `0..MAX_LEVEL`.
const MAX_LEVEL: usize = 16;

/// What an [`Hnsw`] holds besides its vectors: the level generator's state, the entry point and its level, every
/// point's layer-0 links (their counts in point order, then the links one point after another) and the upper links
/// of the points above layer 0, by point.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Graph {
    rng: u64,
    entry: Option<(u32, u32)>,
    count0: Vec<u16>,
    links0: Vec<u32>,
    upper: Vec<(u32, Vec<Vec<u32>>)>,
}

/// A point and its distance to a query, ordered by distance, then by point.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Near {
    d: f32,
    id: u32,
}

impl Eq for Near {}

impl Ord for Near {
    fn cmp(&self, other: &Self) -> Ordering {
        self.d.total_cmp(&other.d).then(self.id.cmp(&other.id))
    }
}

impl PartialOrd for Near {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// The distance of two unit vectors: `1 − a·b`, floored at 0.
pub fn distance(a: &Embedding, b: &Embedding) -> f32 {
    (1.0 - a.dot(b)).max(0.0)
}

/// One space's HNSW graph. Points are numbered in the order they were inserted, from 0; a point stays (hnsw cannot
/// delete): callers keep tombstones and rebuild.
#[derive(Clone)]
pub struct Hnsw {
    /// Links per point on the layers above 0 (and a new point's links on every layer).
    m: usize,
    /// Links per point on layer 0.
    m0: usize,
    ef_construction: usize,
    level_scale: f64,
    /// The level generator's state (splitmix64).
    rng: u64,
    points: Vec<Embedding>,
    /// Layer 0: `m0` slots a point, the first `count0[p]` used.
    links0: Vec<u32>,
    count0: Vec<u16>,
    /// Point → its links on layers 1..=its level (index 0 is layer 1).
    upper: HashMap<u32, Vec<Vec<u32>>>,
    /// The entry point and its level.
    entry: Option<(u32, usize)>,
}

impl std::fmt::Debug for Hnsw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hnsw").field("points", &self.points.len()).field("m", &self.m).finish_non_exhaustive()
    }
}

impl Hnsw {
    /// An empty graph: `m` links per point (`2·m` on layer 0), a beam of `ef_construction` while inserting, room
    /// for `capacity` points.
    pub fn new(m: usize, ef_construction: usize, capacity: usize) -> Self {
        let m = m.clamp(2, 256);
        Hnsw {
            m,
            m0: 2 * m,
            ef_construction: ef_construction.max(1),
            level_scale: 1.0 / (m as f64).ln(),
            rng: SEED,
            points: Vec::with_capacity(capacity),
            links0: Vec::with_capacity(capacity * 2 * m),
            count0: Vec::with_capacity(capacity),
            upper: HashMap::default(),
            entry: None,
        }
    }

    pub fn len(&self) -> usize {
        self.points.len()
    }

    pub fn is_empty(&self) -> bool {
        self.points.is_empty()
    }

    /// The vector of point `p`.
    pub fn point(&self, p: u32) -> &Embedding {
        &self.points[p as usize]
    }

    /// Bytes held by the graph beyond its vectors' shared allocations (what a point costs the index).
    pub fn heap_bytes(&self) -> usize {
        let upper: usize =
            self.upper.values().map(|ls| 24 + ls.iter().map(|l| 24 + 4 * l.capacity()).sum::<usize>()).sum();
        self.points.capacity() * std::mem::size_of::<Embedding>()
            + self.links0.capacity() * 4
            + self.count0.capacity() * 2
            + upper
            + self.upper.capacity() * 40
    }

    fn draw_level(&mut self) -> usize {
        // splitmix64
        self.rng = self.rng.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.rng;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        // U in (0, 1].
        let u = ((z >> 11) as f64 + 1.0) / (1u64 << 53) as f64;
        ((-u.ln() * self.level_scale).floor() as usize).min(MAX_LEVEL - 1)
    }

    fn links(&self, p: u32, layer: usize) -> &[u32] {
        if layer == 0 {
            let at = p as usize * self.m0;
            &self.links0[at..at + self.count0[p as usize] as usize]
        } else {
            self.upper.get(&p).and_then(|ls| ls.get(layer - 1)).map_or(&[], Vec::as_slice)
        }
    }

    fn set_links(&mut self, p: u32, layer: usize, links: &[u32]) {
        if layer == 0 {
            let at = p as usize * self.m0;
            self.links0[at..at + links.len()].copy_from_slice(links);
            self.count0[p as usize] = links.len() as u16;
        } else if let Some(l) = self.upper.get_mut(&p).and_then(|ls| ls.get_mut(layer - 1)) {
            l.clear();
            l.extend_from_slice(links);
        }
    }

    fn dist(&self, q: &Embedding, p: u32) -> Near {
        Near { d: distance(q, &self.points[p as usize]), id: p }
    }

    /// Adds a point (its vector shared, not copied); returns its number.
    pub fn insert(&mut self, v: Embedding) -> u32 {
        let id = u32::try_from(self.points.len()).expect("fewer than 2^32 points");
        let level = self.draw_level();
        self.points.push(v.clone());
        self.links0.resize(self.links0.len() + self.m0, 0);
        self.count0.push(0);
        if level > 0 {
            self.upper.insert(id, vec![Vec::new(); level]);
        }
        let Some((ep, top)) = self.entry else {
            self.entry = Some((id, level));
            return id;
        };
        let mut cur = self.dist(&v, ep);
        for layer in (level + 1..=top).rev() {
            cur = self.greedy(&v, cur, layer);
        }
        let mut entries = vec![cur];
        for layer in (0..=level.min(top)).rev() {
            let found = self.search_layer(&v, &entries, self.ef_construction, layer, None::<&fn(u32) -> bool>);
            let chosen = self.select(&found, self.m);
            let ids: Vec<u32> = chosen.iter().map(|n| n.id).collect();
            self.set_links(id, layer, &ids);
            for n in chosen {
                self.link(n.id, id, n.d, layer);
            }
            entries = found;
        }
        if level > top {
            self.entry = Some((id, level));
        }
        id
    }

    /// Adds `new` (at distance `d`) to `p`'s links on `layer`, cutting them back by the heuristic when full.
    fn link(&mut self, p: u32, new: u32, d: f32, layer: usize) {
        let cap = if layer == 0 { self.m0 } else { self.m };
        let links = self.links(p, layer);
        if links.len() < cap {
            let n = links.len();
            if layer == 0 {
                self.links0[p as usize * self.m0 + n] = new;
                self.count0[p as usize] += 1;
            } else if let Some(l) = self.upper.get_mut(&p).and_then(|ls| ls.get_mut(layer - 1)) {
                l.push(new);
            }
            return;
        }
        let base = &self.points[p as usize];
        let mut cands: Vec<Near> = links.iter().map(|&x| self.dist(base, x)).collect();
        cands.push(Near { d, id: new });
        cands.sort_unstable();
        let ids: Vec<u32> = self.select(&cands, cap).into_iter().map(|n| n.id).collect();
        self.set_links(p, layer, &ids);
    }

    /// The paper's heuristic over candidates sorted by distance to a base point: a candidate is kept when it is
    /// closer to the base than to every candidate kept before it, up to `m`.
    fn select(&self, sorted: &[Near], m: usize) -> Vec<Near> {
        let mut out: Vec<Near> = Vec::with_capacity(m);
        for c in sorted {
            if out.len() == m {
                break;
            }
            let v = &self.points[c.id as usize];
            if out.iter().all(|r| distance(v, &self.points[r.id as usize]) > c.d) {
                out.push(*c);
            }
        }
        out
    }

    /// Greedy descent on one layer: the nearest point reachable by always moving closer.
    fn greedy(&self, q: &Embedding, mut cur: Near, layer: usize) -> Near {
        loop {
            let mut moved = false;
            for &n in self.links(cur.id, layer) {
                let c = self.dist(q, n);
                if c < cur {
                    cur = c;
                    moved = true;
                }
            }
            if !moved {
                return cur;
            }
        }
    }

    /// The beam search of one layer from `entries`: the `ef` nearest points it reaches (those `keep` accepts, when
    /// given; the walk goes through the others), nearest first.
    fn search_layer<F: Fn(u32) -> bool>(
        &self,
        q: &Embedding,
        entries: &[Near],
        ef: usize,
        layer: usize,
        keep: Option<&F>,
    ) -> Vec<Near> {
        let accepts = |p: u32| keep.is_none_or(|k| k(p));
        let mut visited: HashSet<u32> = HashSet::default();
        let mut frontier: BinaryHeap<Reverse<Near>> = BinaryHeap::new();
        let mut best: BinaryHeap<Near> = BinaryHeap::new();
        for e in entries {
            if visited.insert(e.id) {
                frontier.push(Reverse(*e));
                if accepts(e.id) {
                    best.push(*e);
                }
            }
        }
        while best.len() > ef {
            best.pop();
        }
        while let Some(Reverse(c)) = frontier.pop() {
            if best.len() >= ef && best.peek().is_some_and(|w| c > *w) {
                break;
            }
            for &n in self.links(c.id, layer) {
                if !visited.insert(n) {
                    continue;
                }
                let near = self.dist(q, n);
                if best.len() < ef || best.peek().is_some_and(|w| near < *w) {
                    frontier.push(Reverse(near));
                    if accepts(n) {
                        best.push(near);
                        if best.len() > ef {
                            best.pop();
                        }
                    }
                }
            }
        }
        best.into_sorted_vec()
    }

    /// The graph's links and level generator, without its vectors: with them, [`Hnsw::with_graph`] gives this graph
    /// back without a search, and the inserts after it draw the levels they would have drawn.
    pub fn graph(&self) -> Graph {
        let n = self.points.len();
        let mut links0 = Vec::with_capacity(self.count0.iter().map(|&c| c as usize).sum());
        for p in 0..n as u32 {
            links0.extend_from_slice(self.links(p, 0));
        }
        let mut upper: Vec<(u32, Vec<Vec<u32>>)> = self.upper.iter().map(|(&p, ls)| (p, ls.clone())).collect();
        upper.sort_unstable_by_key(|(p, _)| *p);
        Graph {
            rng: self.rng,
            entry: self.entry.map(|(p, l)| (p, l as u32)),
            count0: self.count0.clone(),
            links0,
            upper,
        }
    }

    /// The graph [`Hnsw::graph`] took, over its vectors in point order, with `m` and `ef_construction` as
    /// [`Hnsw::new`] takes them. A graph that does not fit its vectors or `m` (a count or a link out of range, an
    /// upper layer above its point's level, an entry point not at the top) is an error naming the first fault.
    pub fn with_graph(m: usize, ef_construction: usize, points: Vec<Embedding>, graph: Graph) -> Result<Hnsw, String> {
        let mut h = Hnsw::new(m, ef_construction, 0);
        let n = points.len();
        let Graph { rng, entry, count0, links0, upper } = graph;
        if count0.len() != n {
            return Err(format!("{} link counts for {n} points", count0.len()));
        }
        if let Some(p) = count0.iter().position(|&c| c as usize > h.m0) {
            return Err(format!("point {p} has {} links on layer 0, more than {}", count0[p], h.m0));
        }
        if count0.iter().map(|&c| c as usize).sum::<usize>() != links0.len() {
            return Err(format!("{} layer-0 links for counts that sum to another number", links0.len()));
        }
        let out_of_range = |l: &u32| *l as usize >= n;
        if links0.iter().any(out_of_range) {
            return Err("a layer-0 link names a point out of range".into());
        }
        let mut levels: HashMap<u32, usize> = HashMap::default();
        for (p, ls) in &upper {
            if *p as usize >= n || ls.is_empty() || ls.len() >= MAX_LEVEL || levels.insert(*p, ls.len()).is_some() {
                return Err(format!("point {p}'s upper layers do not fit the graph"));
            }
        }
        for (p, ls) in &upper {
            for (i, l) in ls.iter().enumerate() {
                let layer = i + 1;
                if l.len() > h.m || l.iter().any(|q| out_of_range(q) || levels.get(q).is_none_or(|&lv| lv < layer)) {
                    return Err(format!("point {p}'s links on layer {layer} do not fit the graph"));
                }
            }
        }
        let entry = match entry {
            None if n == 0 => None,
            Some((p, l)) if (p as usize) < n && levels.get(&p).copied().unwrap_or(0) == l as usize => {
                if levels.values().any(|&lv| lv > l as usize) {
                    return Err(format!("a point stands above the entry point's level {l}"));
                }
                Some((p, l as usize))
            }
            _ => return Err("the entry point does not fit the graph".into()),
        };
        h.links0 = vec![0; n * h.m0];
        let mut at = 0;
        for (p, &c) in count0.iter().enumerate() {
            let c = c as usize;
            h.links0[p * h.m0..p * h.m0 + c].copy_from_slice(&links0[at..at + c]);
            at += c;
        }
        h.count0 = count0;
        h.upper = upper.into_iter().collect();
        h.points = points;
        h.entry = entry;
        h.rng = rng;
        Ok(h)
    }

    /// The `k` points nearest to `q` that the walk finds, with a beam of `max(ef, k)`: `(point, distance)`, nearest
    /// first.
    pub fn search(&self, q: &Embedding, k: usize, ef: usize) -> Vec<(u32, f32)> {
        self.search_where(q, k, ef, None::<&fn(u32) -> bool>)
    }

    /// [`Hnsw::search`] among the points `keep` accepts; the walk goes through the others.
    pub fn search_where<F: Fn(u32) -> bool>(
        &self,
        q: &Embedding,
        k: usize,
        ef: usize,
        keep: Option<&F>,
    ) -> Vec<(u32, f32)> {
        let Some((ep, top)) = self.entry else { return Vec::new() };
        if k == 0 {
            return Vec::new();
        }
        let mut cur = self.dist(q, ep);
        for layer in (1..=top).rev() {
            cur = self.greedy(q, cur, layer);
        }
        let found = self.search_layer(q, &[cur], ef.max(k), 0, keep);
        found.into_iter().take(k).map(|n| (n.id, n.d)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embed::{Embedder, HashEmbedder};

    fn corpus(n: usize) -> Vec<Embedding> {
        let e = HashEmbedder::default();
        (0..n)
            .map(|i| e.embed(&format!("story {} about topic{} and word{} w{} harbour", i, i % 37, i % 101, i % 7)))
            .collect()
    }

    fn exact(points: &[Embedding], q: &Embedding, k: usize) -> Vec<u32> {
        let mut all: Vec<Near> = (0..points.len()).map(|i| Near { d: distance(q, &points[i]), id: i as u32 }).collect();
        all.sort();
        all.into_iter().take(k).map(|n| n.id).collect()
    }

    /// Against brute force on 3,000 points: the walk finds nearly every true nearest neighbour, each point finds
    /// itself, and distances are `1 − dot` as the similarity graph scores them.
    #[test]
    fn the_walk_finds_the_true_nearest() {
        let points = corpus(3000);
        let mut g = Hnsw::new(16, 100, 0);
        for (i, p) in points.iter().enumerate() {
            assert_eq!(g.insert(p.clone()), i as u32);
        }
        let (mut hit, mut total) = (0, 0);
        for q in (0..3000).step_by(37) {
            let want = exact(&points, &points[q], 10);
            let got: Vec<u32> = g.search(&points[q], 10, 64).into_iter().map(|(p, _)| p).collect();
            assert_eq!(got[0], q as u32, "a point is its own nearest");
            hit += got.iter().filter(|p| want.contains(p)).count();
            total += want.len();
        }
        assert!(hit as f64 >= 0.95 * total as f64, "recall@10 {hit}/{total}");
        for (p, d) in g.search(&points[5], 5, 64) {
            assert_eq!(d.to_bits(), distance(&points[5], &points[p as usize]).to_bits());
        }
        assert!(g.heap_bytes() < 400 * 3000, "{} bytes for 3,000 points", g.heap_bytes());
    }

    /// The same inserts in the same order give the same graph: a rebuilt index answers every search alike.
    #[test]
    fn the_same_inserts_give_the_same_graph() {
        let points = corpus(800);
        let build = || {
            let mut g = Hnsw::new(4, 8, 0);
            for p in &points {
                g.insert(p.clone());
            }
            g
        };
        let (a, b) = (build(), build());
        for q in points.iter().step_by(13) {
            assert_eq!(a.search(q, 10, 8), b.search(q, 10, 8));
        }
        assert_eq!(a.links0, b.links0);
    }

    /// A graph taken and given back is the same graph: it answers every search alike, and the inserts after it
    /// give the graph that the same inserts give to the one it was taken from (the level generator goes on where it
    /// was).
    #[test]
    fn a_graph_given_back_is_the_graph_it_was_taken_from() {
        let points = corpus(1200);
        let mut a = Hnsw::new(6, 16, 0);
        for p in &points[..900] {
            a.insert(p.clone());
        }
        let mut b = Hnsw::with_graph(6, 16, a.points.clone(), a.graph()).unwrap();
        assert_eq!(b.graph(), a.graph());
        for q in points.iter().step_by(17) {
            assert_eq!(a.search(q, 10, 16), b.search(q, 10, 16));
        }
        for p in &points[900..] {
            assert_eq!(a.insert(p.clone()), b.insert(p.clone()));
        }
        assert_eq!(b.graph(), a.graph());
        let empty = Hnsw::new(6, 16, 0);
        assert!(Hnsw::with_graph(6, 16, Vec::new(), empty.graph()).unwrap().is_empty());
    }

    /// A graph that does not fit its vectors is refused with the fault named, never taken as it is.
    #[test]
    fn a_graph_that_does_not_fit_is_refused() {
        let points = corpus(300);
        let mut g = Hnsw::new(4, 8, 0);
        for p in &points {
            g.insert(p.clone());
        }
        let good = g.graph();
        let refuse = |graph: Graph, points: Vec<Embedding>| Hnsw::with_graph(4, 8, points, graph).unwrap_err();
        assert!(refuse(good.clone(), points[..299].to_vec()).contains("link counts"));
        let mut bad = good.clone();
        bad.links0[7] = 300;
        assert!(refuse(bad, points.clone()).contains("out of range"));
        let mut bad = good.clone();
        bad.count0[3] = 9;
        assert!(refuse(bad, points.clone()).contains("more than 8"));
        let mut bad = good.clone();
        bad.count0[3] -= 1;
        assert!(refuse(bad, points.clone()).contains("sum"));
        let mut bad = good.clone();
        let (p, ls) = bad.upper[0].clone();
        bad.upper.push((p, ls));
        assert!(refuse(bad, points.clone()).contains("upper layers"));
        let mut bad = good.clone();
        let past = bad.upper.iter().map(|(p, _)| *p).max().unwrap() + 1;
        bad.upper[0].1[0].push(past);
        assert!(refuse(bad, points.clone()).contains("layer 1"));
        let mut bad = good.clone();
        bad.entry = bad.entry.map(|(p, l)| (p, l + 1));
        assert!(refuse(bad, points.clone()).contains("entry point"));
        let mut bad = good;
        bad.entry = None;
        assert!(refuse(bad, points).contains("entry point"));
    }

    /// A filtered search walks through the points it skips and returns only the accepted ones.
    #[test]
    fn a_filtered_search_returns_only_accepted_points() {
        let points = corpus(1000);
        let mut g = Hnsw::new(8, 64, 0);
        for p in &points {
            g.insert(p.clone());
        }
        let keep = |p: u32| p.is_multiple_of(3);
        let got = g.search_where(&points[300], 10, 64, Some(&keep));
        assert_eq!(got.len(), 10);
        assert!(got.iter().all(|(p, _)| keep(*p)));
        assert_eq!(got[0].0, 300);
        assert!(Hnsw::new(8, 64, 0).search(&points[0], 5, 10).is_empty());
    }
}
