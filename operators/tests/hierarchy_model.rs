//! Model tests for the hierarchy: seeded random inserts and deletes of nodes and edges over three spaces; after every
//! batch the dataflow (1 and 3 workers) equals the sequential implementation, and incremental equals from-scratch.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{mpsc, Arc, Mutex};

use differential_dataflow::input::Input;
use engram_operators::hierarchy::dataflow::hierarchy;
use engram_operators::hierarchy::reference::{build, Graph};
use engram_operators::hierarchy::HierarchyParams;
use engram_operators::Name;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use timely::dataflow::operators::capture::{Capture, Extract};

#[derive(Clone, Debug)]
enum Change {
    Node(String, String, isize),
    Edge(String, String, String, u64, isize),
}

const SPACES: usize = 3;

/// Planted communities of 8 nodes, dense inside, sparse across, with random churn.
fn workload(seed: u64, batches: usize, per_batch: usize) -> Vec<Vec<Change>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut live_nodes: BTreeSet<(String, String)> = BTreeSet::new();
    let mut live_edges: BTreeMap<(String, String, String), u64> = BTreeMap::new();
    let mut out = Vec::new();
    for _ in 0..batches {
        let mut batch = Vec::new();
        for _ in 0..per_batch {
            let s = format!("s{}", rng.gen_range(0..SPACES));
            let n = rng.gen_range(0..48);
            let id = format!("n{n:02}");
            match rng.gen_range(0..10) {
                0 => {
                    // delete a node and its edges
                    if live_nodes.remove(&(s.clone(), id.clone())) {
                        batch.push(Change::Node(s.clone(), id.clone(), -1));
                        let gone: Vec<_> = live_edges
                            .keys()
                            .filter(|(es, u, v)| *es == s && (*u == id || *v == id))
                            .cloned()
                            .collect();
                        for k in gone {
                            let w = live_edges.remove(&k).unwrap();
                            batch.push(Change::Edge(k.0, k.1, k.2, w, -1));
                        }
                    }
                }
                1..=2 => {
                    if live_nodes.insert((s.clone(), id.clone())) {
                        batch.push(Change::Node(s, id, 1));
                    }
                }
                _ => {
                    // an edge, mostly within the planted community of 8
                    let m = if rng.gen_bool(0.85) { (n / 8) * 8 + rng.gen_range(0..8) } else { rng.gen_range(0..48) };
                    let other = format!("n{m:02}");
                    if other == id {
                        continue;
                    }
                    for x in [&id, &other] {
                        if live_nodes.insert((s.clone(), x.clone())) {
                            batch.push(Change::Node(s.clone(), x.clone(), 1));
                        }
                    }
                    let (u, v) = if id < other { (id, other) } else { (other, id) };
                    let key = (s.clone(), u.clone(), v.clone());
                    if live_edges.contains_key(&key) {
                        // Mostly keep existing edges, so that communities grow dense (triangles make ego networks
                        // connected, which is what lets replicas merge).
                        if rng.gen_bool(0.25) {
                            let w = live_edges.remove(&key).unwrap();
                            batch.push(Change::Edge(s, u, v, w, -1));
                        } else if rng.gen_bool(0.2) {
                            // A new weight for a kept edge: the pair is retracted and inserted in one batch (what
                            // a replaced chunk does to its edges), which must not disturb the ego networks.
                            let w = live_edges[&key];
                            let nw = if w >= 400 { 100 } else { w + 100 };
                            live_edges.insert(key, nw);
                            batch.push(Change::Edge(s.clone(), u.clone(), v.clone(), w, -1));
                            batch.push(Change::Edge(s, u, v, nw, 1));
                        }
                    } else {
                        let w = rng.gen_range(1..5) * 100;
                        live_edges.insert(key, w);
                        batch.push(Change::Edge(s, u, v, w, 1));
                    }
                }
            }
        }
        out.push(batch);
    }
    out
}

type Row = (String, u32, String, String);

fn reference(batches: &[Vec<Change>], p: &HierarchyParams) -> Vec<BTreeSet<Row>> {
    let mut graphs: BTreeMap<String, Graph> = BTreeMap::new();
    let mut out = Vec::new();
    for batch in batches {
        for c in batch {
            match c {
                Change::Node(s, n, d) => {
                    let g = graphs.entry(s.clone()).or_default();
                    if *d > 0 {
                        g.nodes.insert(n.clone());
                    } else {
                        g.nodes.remove(n);
                    }
                }
                Change::Edge(s, u, v, w, d) => {
                    let g = graphs.entry(s.clone()).or_default();
                    if *d > 0 {
                        g.edges.insert((u.clone(), v.clone()), *w);
                    } else {
                        g.edges.remove(&(u.clone(), v.clone()));
                    }
                }
            }
        }
        let mut rows = BTreeSet::new();
        for (s, g) in &graphs {
            for (i, layer) in build(g, p).into_iter().enumerate() {
                for (c, members) in layer {
                    for m in members {
                        rows.insert((s.clone(), i as u32 + 1, c.clone(), m));
                    }
                }
            }
        }
        out.push(rows);
    }
    out
}

fn run_dataflow(batches: &[Vec<Change>], p: &HierarchyParams, workers: usize) -> Vec<BTreeSet<Row>> {
    let (send, recv) = mpsc::channel();
    let send = Arc::new(Mutex::new(send));
    let batches = batches.to_vec();
    let rounds = batches.len();
    let p = p.clone();
    timely::execute(timely::Config::process(workers), move |worker| {
        let send = send.lock().unwrap().clone();
        let p = p.clone();
        let (mut nodes, mut edges) = worker.dataflow::<u64, _, _>(|scope| {
            let (ni, nodes) = scope.new_collection::<(Name, Name), isize>();
            let (ei, edges) = scope.new_collection::<(Name, Name, Name, u64), isize>();
            let clusters = hierarchy(nodes, edges, &p).clusters;
            clusters.map(|(s, l, c, m)| (s.into(), l, c.into(), m.into())).inner.capture_into(send);
            (ni, ei)
        });
        for (round, batch) in batches.iter().enumerate() {
            if worker.index() == 0 {
                for c in batch {
                    match c {
                        Change::Node(s, n, d) => nodes.update((s.into(), n.into()), *d),
                        Change::Edge(s, u, v, w, d) => edges.update((s.into(), u.into(), v.into(), *w), *d),
                    }
                }
            }
            nodes.advance_to(round as u64 + 1);
            edges.advance_to(round as u64 + 1);
        }
    })
    .unwrap();
    let mut per_time: BTreeMap<u64, Vec<(Row, isize)>> = BTreeMap::new();
    for (_, updates) in recv.extract() {
        for (r, t, d) in updates {
            per_time.entry(t).or_default().push((r, d));
        }
    }
    let mut state: BTreeMap<Row, isize> = BTreeMap::new();
    let mut out = Vec::new();
    for round in 0..rounds as u64 {
        for (r, d) in per_time.remove(&round).unwrap_or_default() {
            *state.entry(r).or_default() += d;
        }
        state.retain(|_, d| *d != 0);
        assert!(state.values().all(|d| *d == 1), "a cluster row with multiplicity other than 1");
        out.push(state.keys().cloned().collect());
    }
    out
}

fn check(name: &str, got: &[BTreeSet<Row>], want: &[BTreeSet<Row>]) {
    for (round, (g, w)) in got.iter().zip(want).enumerate() {
        if g != w {
            let extra: Vec<_> = g.difference(w).take(4).collect();
            let missing: Vec<_> = w.difference(g).take(4).collect();
            panic!("{name}: batch {round}: {} rows vs {}\nextra {extra:?}\nmissing {missing:?}", g.len(), w.len());
        }
    }
}

/// `min_shrink`: 0.1 (the default) or 0 (CAM's bare stop rule); each test runs one. Loose neighbours pooled (the
/// default); [`cam_rule`] splits them.
fn params(min_shrink: f64) -> HierarchyParams {
    HierarchyParams {
        max_layers: 4,
        max_cluster_size: 6,
        lpa_rounds: 5,
        lpa_layers: 1,
        replica_layers: 1,
        min_shrink,
        pool_loose_neighbours: true,
        max_degree: 4,
    }
}

fn cam_rule(min_shrink: f64) -> HierarchyParams {
    HierarchyParams { pool_loose_neighbours: false, ..params(min_shrink) }
}

#[test]
fn dataflow_equals_sequential_with_1_and_3_workers() {
    let batches = workload(5, 16, 40);
    let p = params(0.0);
    let want = reference(&batches, &p);
    let layers: BTreeSet<u32> = want.last().unwrap().iter().map(|r| r.1).collect();
    assert!(layers.len() >= 2, "the workload must build at least two layers: {layers:?}");
    check("1 worker", &run_dataflow(&batches, &p, 1), &want);
    check("3 workers", &run_dataflow(&batches, &p, 3), &want);
    let cam = cam_rule(0.0);
    let want_cam = reference(&batches, &cam);
    assert_ne!(want_cam.last(), want.last(), "pooling loose neighbours changes the clusters of this workload");
    check("1 worker, CAM's ego rule", &run_dataflow(&batches, &cam, 1), &want_cam);
    check("3 workers, CAM's ego rule", &run_dataflow(&batches, &cam, 3), &want_cam);
    let uncut = HierarchyParams { max_degree: 1000, ..p.clone() };
    assert_ne!(reference(&batches, &uncut).last(), want.last(), "the degree cut changes the upper layers");
    // Label propagation on every layer (CAM's rule) against strongest-link components above layer 1.
    let lpa = HierarchyParams { lpa_layers: 4, ..p.clone() };
    let want_lpa = reference(&batches, &lpa);
    assert_ne!(want_lpa.last(), want.last(), "strongest-link components change the upper layers");
    check("2 workers, label propagation on every layer", &run_dataflow(&batches, &lpa, 2), &want_lpa);
    // Ego-network replicas on every layer (CAM's rule) against one replica per node above layer 1.
    let replicas = HierarchyParams { replica_layers: 4, ..p.clone() };
    let want_replicas = reference(&batches, &replicas);
    assert_ne!(want_replicas.last(), want.last(), "replicas above layer 1 change the upper layers");
    check("2 workers, replicas on every layer", &run_dataflow(&batches, &replicas, 2), &want_replicas);
    let both = HierarchyParams { replica_layers: 4, ..cam.clone() };
    check("1 worker, CAM's ego rule on every layer", &run_dataflow(&batches, &both, 1), &reference(&batches, &both));
}

#[test]
fn incremental_equals_from_scratch() {
    let batches = workload(9, 12, 40);
    let p = params(0.1);
    let incremental = run_dataflow(&batches, &p, 2);
    let scratch = run_dataflow(&[batches.concat()], &p, 2);
    assert_eq!(incremental.last(), scratch.last());
    assert_eq!(incremental.last(), reference(&batches, &p).last());
}

#[test]
fn a_stop_margin_drops_the_layers_it_should_incrementally() {
    // A margin that cuts layers CAM's bare rule keeps: the dataflow drops exactly those, batch after batch.
    let batches = workload(5, 16, 40);
    let p = params(0.3);
    let want = reference(&batches, &p);
    let bare = reference(&batches, &params(0.0));
    assert!(want.iter().zip(&bare).any(|(a, b)| a.len() < b.len()), "the margin must drop some layer");
    assert!(want.iter().zip(&bare).all(|(a, b)| a.is_subset(b)), "the margin keeps a prefix of CAM's layers");
    check("1 worker", &run_dataflow(&batches, &p, 1), &want);
}
