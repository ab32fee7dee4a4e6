//! Model tests for the similarity edges: seeded random inserts, replacements and deletes, checked after every batch
//! against a brute-force sequential reference, through the HNSW index directly and through the dataflow with 1 and
//! 3 workers (differential-dataflow's tests/bfs.rs is the pattern).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{mpsc, Arc, Mutex};

use differential_dataflow::input::Input;
use engram_operators::dataflow::{embed_nodes, similarity_edges};
use engram_operators::model::{Node, NodeKind, POSITION_SCALE};
use engram_operators::similarity::{reference_edges, IndexState};
use engram_operators::{Edge, Embedder, Embedding, HashEmbedder, SimilarityIndex, SimilarityParams};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use timely::dataflow::operators::capture::{Capture, Extract};

const TOPICS: &[&[&str]] = &[
    &["bank", "rates", "inflation", "bond", "yield", "central", "policy", "markets", "euro", "dollar"],
    &["match", "goal", "keeper", "league", "penalty", "season", "coach", "striker", "cup", "fans"],
    &["storm", "rain", "flood", "wind", "coast", "warning", "river", "forecast", "snow", "heat"],
    &["vaccine", "hospital", "doctors", "virus", "patients", "trial", "health", "clinic", "dose", "nurses"],
];

/// Backchannel turns: said again and again, word for word, as live transcripts are.
const BACKCHANNEL: &[&str] = &["yeah .", "okay", "mm-hmm", "right right", "yeah yeah ."];

fn random_text(rng: &mut StdRng, duplicates: bool) -> String {
    if duplicates {
        match rng.gen_range(0..10) {
            // Exact duplicates: one of a few backchannel turns.
            0..=3 => return BACKCHANNEL[rng.gen_range(0..BACKCHANNEL.len())].to_string(),
            // Near-duplicates: a backchannel turn with one more word.
            4 => {
                let b = BACKCHANNEL[rng.gen_range(0..BACKCHANNEL.len())];
                return format!("{b} {}", TOPICS[0][rng.gen_range(0..3)]);
            }
            // A short topic phrase from a small pool: more exact repeats.
            5 => return TOPICS[rng.gen_range(0..2)][..2].join(" "),
            _ => {}
        }
    }
    let topic = TOPICS[rng.gen_range(0..TOPICS.len())];
    let n = rng.gen_range(3..9);
    (0..n).map(|_| topic[rng.gen_range(0..topic.len())]).collect::<Vec<_>>().join(" ")
}

type Batch = Vec<(String, Node, isize)>;

/// Seeded batches over three spaces: new chunks, replaced chunks and deleted documents.
fn workload(seed: u64, batches: usize, per_batch: usize) -> Vec<Batch> {
    workload_with(seed, batches, per_batch, false)
}

/// [`workload`], with `duplicates`: half the texts are exact or near duplicates of a few short ones.
fn workload_with(seed: u64, batches: usize, per_batch: usize, duplicates: bool) -> Vec<Batch> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut live: BTreeMap<(String, String, i64), Node> = BTreeMap::new();
    let mut out = Vec::new();
    for _ in 0..batches {
        let mut batch = Vec::new();
        for _ in 0..per_batch {
            let space = format!("s{}", rng.gen_range(0..3));
            let doc = format!("d{}", rng.gen_range(0..12));
            match rng.gen_range(0..10) {
                0 => {
                    // delete a whole document
                    let keys: Vec<_> = live.keys().filter(|k| k.0 == space && k.1 == doc).cloned().collect();
                    for k in keys {
                        let n = live.remove(&k).unwrap();
                        batch.push((space.clone(), n, -1));
                    }
                }
                _ => {
                    let seq = rng.gen_range(0..6);
                    let key = (space.clone(), doc.clone(), seq);
                    if let Some(old) = live.remove(&key) {
                        batch.push((space.clone(), old, -1));
                    }
                    let node = Node {
                        id: format!("{doc}#{seq}").into(),
                        kind: NodeKind::Chunk,
                        doc: doc.as_str().into(),
                        pos: seq * POSITION_SCALE,
                        text: random_text(&mut rng, duplicates).into(),
                        speaker: None,
                        ts: None,
                    };
                    live.insert(key, node.clone());
                    batch.push((space, node, 1));
                }
            }
        }
        out.push(batch);
    }
    out
}

fn params(exhaustive_below: usize) -> SimilarityParams {
    SimilarityParams { theta: 0.35, k: 4, exhaustive_below, ..SimilarityParams::default() }
}

/// The reference: brute force over the live nodes after each batch.
fn reference(batches: &[Batch], p: &SimilarityParams) -> Vec<BTreeSet<Edge>> {
    let emb = HashEmbedder::default();
    // A multiset of (space, node): a batch may insert a node and retract it again.
    let mut live: BTreeMap<(String, Node), isize> = BTreeMap::new();
    let mut out = Vec::new();
    for batch in batches {
        for (s, n, d) in batch {
            *live.entry((s.clone(), n.clone())).or_default() += d;
        }
        live.retain(|_, c| *c != 0);
        assert!(live.values().all(|c| *c == 1), "the workload keeps one version of each node");
        let mut edges = BTreeSet::new();
        for space in ["s0", "s1", "s2"] {
            let nodes: Vec<(Node, Embedding)> = live
                .keys()
                .filter(|(s, _)| s == space)
                .map(|(_, n)| (n.clone(), emb.embed(&n.embedding_text())))
                .collect();
            for (u, v, w) in reference_edges(p, &nodes) {
                edges.insert(Edge { space: space.into(), u, v, weight_micro: w });
            }
        }
        out.push(edges);
    }
    out
}

fn apply(set: &mut BTreeSet<Edge>, e: Edge, d: isize) {
    match d {
        1 => assert!(set.insert(e.clone()), "edge inserted twice: {e:?}"),
        -1 => assert!(set.remove(&e), "edge retracted but absent: {e:?}"),
        _ => panic!("unexpected multiplicity {d} for {e:?}"),
    }
}

fn run_index(batches: &[Batch], p: &SimilarityParams) -> Vec<BTreeSet<Edge>> {
    let emb = HashEmbedder::default();
    let mut indexes: BTreeMap<String, SimilarityIndex> = BTreeMap::new();
    let mut edges = BTreeSet::new();
    let mut out = Vec::new();
    for batch in batches {
        let mut by_space: BTreeMap<String, Vec<(Node, Embedding, isize)>> = BTreeMap::new();
        for (s, n, d) in batch {
            let e = emb.embed(&n.embedding_text());
            by_space.entry(s.clone()).or_default().push((n.clone(), e, *d));
        }
        for (s, changes) in by_space {
            let idx = indexes.entry(s.clone()).or_insert_with(|| SimilarityIndex::new(p.clone()));
            let deltas = idx.apply(changes);
            idx.check_lists().unwrap();
            for (u, v, w, d) in deltas.clone() {
                apply(&mut edges, Edge { space: s.clone(), u, v, weight_micro: w }, d);
            }
            let mine: BTreeSet<(String, String, u32)> =
                edges.iter().filter(|e| e.space == s).map(|e| (e.u.clone(), e.v.clone(), e.weight_micro)).collect();
            if mine != idx.edges() {
                panic!(
                    "deltas {deltas:?}\nextra {:?}\nmissing {:?}",
                    mine.difference(&idx.edges()).collect::<Vec<_>>(),
                    idx.edges().difference(&mine).collect::<Vec<_>>()
                );
            }
        }
        out.push(edges.clone());
    }
    out
}

fn run_dataflow(batches: &[Batch], p: &SimilarityParams, workers: usize) -> Vec<BTreeSet<Edge>> {
    let (send, recv) = mpsc::channel();
    let send = Arc::new(Mutex::new(send));
    let batches = batches.to_vec();
    let rounds = batches.len();
    let p = p.clone();
    timely::execute(timely::Config::process(workers), move |worker| {
        let send = send.lock().unwrap().clone();
        let p = p.clone();
        let mut input = worker.dataflow::<u64, _, _>(|scope| {
            let (input, nodes) = scope.new_collection::<(String, Node), isize>();
            let embedded = embed_nodes(nodes, Arc::new(HashEmbedder::default()));
            similarity_edges(embedded, p).inner.capture_into(send);
            input
        });
        for (round, batch) in batches.iter().enumerate() {
            // Worker 0 feeds; the others only advance, as the engine does.
            if worker.index() == 0 {
                for (s, n, d) in batch {
                    input.update((s.clone(), n.clone()), *d);
                }
            }
            input.advance_to(round as u64 + 1);
        }
    })
    .unwrap();

    let mut per_time: BTreeMap<u64, Vec<(Edge, isize)>> = BTreeMap::new();
    for (_, updates) in recv.extract() {
        for (e, t, d) in updates {
            per_time.entry(t).or_default().push((e, d));
        }
    }
    let mut edges = BTreeSet::new();
    let mut out = Vec::new();
    for round in 0..rounds as u64 {
        let mut net: BTreeMap<Edge, isize> = BTreeMap::new();
        for (e, d) in per_time.remove(&round).unwrap_or_default() {
            *net.entry(e).or_default() += d;
        }
        for (e, d) in net.into_iter().filter(|x| x.1 != 0) {
            apply(&mut edges, e, d);
        }
        out.push(edges.clone());
    }
    out
}

fn check(name: &str, got: &[BTreeSet<Edge>], want: &[BTreeSet<Edge>]) {
    assert_eq!(got.len(), want.len());
    for (round, (g, w)) in got.iter().zip(want).enumerate() {
        if g != w {
            let extra: Vec<_> = g.difference(w).take(5).collect();
            let missing: Vec<_> = w.difference(g).take(5).collect();
            panic!(
                "{name}: batch {round}: {} edges vs {} in the reference\nextra {extra:?}\nmissing {missing:?}",
                g.len(),
                w.len()
            );
        }
    }
}

#[test]
fn index_equals_brute_force_exhaustive_and_hnsw() {
    for seed in [1, 2, 3] {
        let batches = workload(seed, 30, 25);
        // Through HNSW with and without the reverse lookup's scan of the easiest lists.
        for p in [params(usize::MAX), params(0), SimilarityParams { reverse_scan: 8, ..params(0) }] {
            let want = reference(&batches, &p);
            assert!(want.last().unwrap().len() > 50, "the workload must produce a real graph");
            let name = format!("index seed {seed} exhaustive<{} scan {}", p.exhaustive_below, p.reverse_scan);
            check(&name, &run_index(&batches, &p), &want);
        }
    }
}

#[test]
fn duplicates_and_ties_equal_brute_force() {
    // Plateaus of identical vectors (ties broken by id) and near-identical ones, with deletes and replacements:
    // the classes that share a vector must give exactly the brute-force graph, exhaustive and through HNSW.
    for seed in [4, 5, 6] {
        let batches = workload_with(seed, 30, 40, true);
        for p in [
            params(usize::MAX),
            params(0),
            SimilarityParams { k: 2, ..params(0) },
            SimilarityParams { reverse_scan: 8, ..params(0) },
        ] {
            let want = reference(&batches, &p);
            assert!(want.last().unwrap().len() > 50, "the workload must produce a real graph");
            check(
                &format!("duplicates seed {seed} k={} exhaustive<{}", p.k, p.exhaustive_below),
                &run_index(&batches, &p),
                &want,
            );
        }
    }
    // Identical texts share one vector of the index.
    let batches = workload_with(9, 10, 60, true);
    let emb = HashEmbedder::default();
    let mut idx = SimilarityIndex::new(params(0));
    let changes: Vec<(Node, Embedding, isize)> = batches
        .concat()
        .into_iter()
        .filter(|(s, _, _)| s == "s0")
        .map(|(_, n, d)| {
            let e = emb.embed(&n.embedding_text());
            (n, e, d)
        })
        .collect();
    let mut live: BTreeMap<(Node, Embedding), isize> = BTreeMap::new();
    for (n, e, d) in &changes {
        *live.entry((n.clone(), e.clone())).or_default() += d;
    }
    live.retain(|_, d| *d != 0);
    let distinct: BTreeSet<&Embedding> = live.keys().map(|(_, e)| e).filter(|e| !e.is_zero()).collect();
    idx.apply(changes);
    assert_eq!(idx.len(), live.len());
    assert_eq!(idx.vector_count(), distinct.len(), "one index entry per distinct vector");
    assert!(
        distinct.len() * 4 < live.len() * 3,
        "{} vectors for {} nodes: the workload repeats",
        distinct.len(),
        live.len()
    );
}

#[test]
fn dataflow_equals_brute_force_with_1_and_3_workers() {
    let batches = workload(7, 25, 30);
    let p = params(0);
    let want = reference(&batches, &p);
    check("dataflow, 1 worker", &run_dataflow(&batches, &p, 1), &want);
    check("dataflow, 3 workers", &run_dataflow(&batches, &p, 3), &want);
}

#[test]
fn incremental_equals_from_scratch() {
    // All batches at once (one epoch) against batch by batch: same final graph.
    let batches = workload(11, 20, 30);
    let p = params(0);
    let incremental = run_dataflow(&batches, &p, 2);
    let all: Batch = batches.concat();
    let scratch = run_dataflow(&[all], &p, 2);
    assert_eq!(incremental.last(), scratch.last());
}

/// The live nodes of `space` after `batches`, as one batch of inserts (what a restart feeds at a checkpoint's epoch).
fn live_batch(batches: &[Batch], space: &str, emb: &HashEmbedder) -> Vec<(Node, Embedding, isize)> {
    let mut live: BTreeMap<Node, isize> = BTreeMap::new();
    for (_, n, d) in batches.iter().flatten().filter(|(s, _, _)| s == space) {
        *live.entry(n.clone()).or_default() += d;
    }
    // In reverse order: the restore may not depend on the order of its batch.
    live.into_iter()
        .rev()
        .filter(|(_, d)| *d != 0)
        .map(|(n, d)| (n.clone(), emb.embed(&n.embedding_text()), d))
        .collect()
}

fn by_space(batch: &Batch, emb: &HashEmbedder) -> BTreeMap<String, Vec<(Node, Embedding, isize)>> {
    let mut out: BTreeMap<String, Vec<(Node, Embedding, isize)>> = BTreeMap::new();
    for (s, n, d) in batch {
        out.entry(s.clone()).or_default().push((n.clone(), emb.embed(&n.embedding_text()), *d));
    }
    out
}

#[test]
fn a_restored_index_goes_on_exactly_as_the_one_it_was_taken_from() {
    // A deliberately coarse index (tiny HNSW lists, a reverse lookup cut at 2 classes), so that the lists depend on
    // the order of the inserts: a rebuild from the live nodes keeps other edges, a restore must not.
    let p = SimilarityParams {
        exhaustive_below: 0,
        max_connections: 2,
        ef_construction: 2,
        ef_search: 2,
        max_reverse_classes: 2,
        ..params(0)
    };
    let emb = HashEmbedder::default();
    let mut rebuilds_differed = 0;
    for seed in 0..8u64 {
        let batches = workload_with(100 + seed, 24, 40, true);
        let cut = StdRng::seed_from_u64(seed).gen_range(2..batches.len() - 2);
        let mut run: BTreeMap<String, SimilarityIndex> = BTreeMap::new();
        for batch in &batches[..cut] {
            for (s, changes) in by_space(batch, &emb) {
                run.entry(s).or_insert_with(|| SimilarityIndex::new(p.clone())).apply(changes);
            }
        }
        run.retain(|_, i| !i.is_empty());
        // The checkpoint: each space's state, through its serialised form.
        let mut restored: BTreeMap<String, SimilarityIndex> = BTreeMap::new();
        for (s, index) in &run {
            let state: IndexState = serde_json::from_str(&serde_json::to_string(&index.state()).unwrap()).unwrap();
            assert_eq!(state, index.state());
            let nodes = live_batch(&batches[..cut], s, &emb);
            let back = SimilarityIndex::restore(p.clone(), &state, &nodes).unwrap();
            let emitted: BTreeSet<(String, String, u32)> =
                back.all_edges().into_iter().filter(|e| e.3 == 1).map(|(u, v, w, _)| (u, v, w)).collect();
            assert_eq!(emitted, index.edges(), "seed {seed}: the restored edges at the cut");
            let mut scratch = SimilarityIndex::new(p.clone());
            scratch.apply(nodes);
            rebuilds_differed += usize::from(scratch.edges() != index.edges());
            restored.insert(s.clone(), back);
        }
        // After the cut: the same changes give the same deltas, batch by batch.
        for (i, batch) in batches[cut..].iter().enumerate() {
            for (s, changes) in by_space(batch, &emb) {
                let a = run.entry(s.clone()).or_insert_with(|| SimilarityIndex::new(p.clone())).apply(changes.clone());
                let b = restored.entry(s.clone()).or_insert_with(|| SimilarityIndex::new(p.clone())).apply(changes);
                assert_eq!(a, b, "seed {seed}, batch {} after the cut, space {s}", i + 1);
            }
        }
        for (s, index) in &run {
            assert_eq!(index.edges(), restored[s].edges(), "seed {seed}: space {s} at the end");
        }
    }
    assert!(rebuilds_differed > 0, "the coarse index never depended on its history: the test shows nothing");
}

#[test]
fn a_state_that_does_not_match_its_nodes_is_refused() {
    let p = SimilarityParams { exhaustive_below: 0, ..params(0) };
    let emb = HashEmbedder::default();
    let batches = workload_with(7, 6, 30, true);
    let nodes = live_batch(&batches, "s0", &emb);
    let mut index = SimilarityIndex::new(p.clone());
    index.apply(nodes.clone());
    let state = index.state();
    assert!(SimilarityIndex::restore(p.clone(), &state, &nodes).is_ok());
    let missing = SimilarityIndex::restore(p.clone(), &state, &nodes[1..]).err().unwrap();
    assert!(missing.contains("nodes fed"), "{missing}");
    let mut other = nodes.clone();
    other[0].1 = emb.embed("a text no node of the state has");
    let differs = SimilarityIndex::restore(p.clone(), &state, &other).err().unwrap();
    assert!(differs.contains("not its class's"), "{differs}");
    let mut retracted = nodes.clone();
    retracted[0].2 = -1;
    assert!(SimilarityIndex::restore(p.clone(), &state, &retracted).is_err());
    // One id twice in the batch (another text), in place of another node: refused, not a panic.
    let mut twice = nodes.clone();
    twice[1].0 = Node { text: "another text".into(), ..twice[0].0.clone() };
    twice[1].1 = emb.embed("another text");
    assert!(SimilarityIndex::restore(p.clone(), &state, &twice).is_err());
    // A state whose lists or classes point past its nodes or points (a damaged or foreign checkpoint): refused.
    let json = serde_json::to_value(&state).unwrap();
    let damaged = |edit: &dyn Fn(&mut serde_json::Value)| -> IndexState {
        let mut v = json.clone();
        edit(&mut v);
        serde_json::from_value(v).unwrap()
    };
    let far_list = damaged(&|v| v["nodes"][0][2] = serde_json::json!([[100000, 0.9]]));
    let err = SimilarityIndex::restore(p.clone(), &far_list, &nodes).err().unwrap();
    assert!(err.contains("out of range"), "{err}");
    let far_class = damaged(&|v| v["nodes"][0][1] = serde_json::json!(100000));
    assert!(SimilarityIndex::restore(p.clone(), &far_class, &nodes).is_err());
    let far_link = damaged(&|v| v["graph"]["links0"][0] = serde_json::json!(100000));
    let err = SimilarityIndex::restore(p.clone(), &far_link, &nodes).err().unwrap();
    assert!(err.contains("HNSW graph"), "{err}");
    let named_twice = damaged(&|v| v["nodes"][1][0] = v["nodes"][0][0].clone());
    let err = SimilarityIndex::restore(p, &named_twice, &nodes).err().unwrap();
    assert!(err.contains("twice"), "{err}");
}
