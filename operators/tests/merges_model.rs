//! Event merging in the dataflow equals union-find over the live events after every epoch of seeded random inserts
//! and deletes (1 and 3 workers), and a from-scratch build.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{mpsc, Arc, Mutex};

use differential_dataflow::input::Input;
use engram_operators::events::{event_embedding, event_merges, pair_params, quantise};
use engram_operators::model::{Node, NodeKind};
use engram_operators::similarity::{reference_edges, SimilarityParams};
use rand::{Rng, SeedableRng};
use timely::dataflow::operators::capture::{Capture, Extract};

const TAU: f32 = 0.88;
/// Few enough neighbours that some events have more links at τ than they keep.
const K: usize = 3;
type Ev = (String, String, Vec<i16>);

fn vector(rng: &mut rand::rngs::StdRng, prototype: usize) -> Vec<i16> {
    // Near one of four directions, or noise: some pairs above τ, chains of them, and loners.
    let mut v: Vec<f32> =
        (0..16).map(|i| if i == prototype * 4 || i == prototype * 4 + 1 { 1.0 } else { 0.0 }).collect();
    for x in v.iter_mut() {
        *x += rng.gen_range(-0.2..0.2);
    }
    let n = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    quantise(&v.iter().map(|x| x / n).collect::<Vec<_>>())
}

fn expected(live: &BTreeSet<Ev>) -> BTreeSet<(String, String, String)> {
    let items: Vec<&Ev> = live.iter().collect();
    let mut parent: Vec<usize> = (0..items.len()).collect();
    fn find(p: &mut Vec<usize>, x: usize) -> usize {
        if p[x] != x {
            let r = find(p, p[x]);
            p[x] = r;
        }
        p[x]
    }
    // The links: each event's K nearest at τ or above (brute force, per space), as the index defines them.
    let p = pair_params(TAU, K, &SimilarityParams::default());
    let at: BTreeMap<(&str, &str), usize> =
        items.iter().enumerate().map(|(i, e)| ((e.0.as_str(), e.1.as_str()), i)).collect();
    for space in items.iter().map(|e| e.0.as_str()).collect::<BTreeSet<_>>() {
        let nodes: Vec<(Node, engram_operators::Embedding)> = items
            .iter()
            .filter(|e| e.0 == space)
            .map(|e| {
                let node = Node {
                    id: e.1.as_str().into(),
                    kind: NodeKind::Summary,
                    doc: e.1.as_str().into(),
                    pos: 0,
                    text: Default::default(),
                    speaker: None,
                    ts: None,
                };
                (node, event_embedding(&e.2))
            })
            .collect();
        for (u, v, _) in reference_edges(&p, &nodes) {
            let (a, b) = (find(&mut parent, at[&(space, u.as_str())]), find(&mut parent, at[&(space, v.as_str())]));
            parent[a.max(b)] = a.min(b);
        }
    }
    let mut group: BTreeMap<usize, String> = BTreeMap::new();
    for (i, item) in items.iter().enumerate() {
        let r = find(&mut parent, i);
        let g = group.entry(r).or_insert_with(|| item.1.clone());
        if item.1 < *g {
            *g = item.1.clone();
        }
    }
    (0..items.len())
        .map(|i| {
            let r = find(&mut parent, i);
            (items[i].0.clone(), items[i].1.clone(), group[&r].clone())
        })
        .collect()
}

fn run(workers: usize, steps: Vec<Vec<(Ev, isize)>>) -> Vec<BTreeSet<(String, String, String)>> {
    let (tx, rx) = mpsc::channel();
    let tx = Arc::new(Mutex::new(tx));
    let n = steps.len() as u64;
    timely::execute(timely::Config::process(workers), move |worker| {
        let tx = tx.lock().unwrap().clone();
        let (mut input, probe) = worker.dataflow::<u64, _, _>(|scope| {
            let (input, vectors) = scope.new_collection::<Ev, isize>();
            let (probe, merged) = event_merges(vectors, TAU, K, &SimilarityParams::default()).probe();
            merged.inner.capture_into(tx);
            (input, probe)
        });
        for (t, step) in steps.iter().enumerate() {
            if worker.index() == 0 {
                for (e, d) in step {
                    input.update(e.clone(), *d);
                }
            }
            input.advance_to(t as u64 + 1);
            input.flush();
            worker.step_while(|| probe.less_than(&(t as u64 + 1)));
        }
    })
    .unwrap();
    let got = rx.extract();
    let mut acc: BTreeMap<(String, String, String), isize> = BTreeMap::new();
    (0..n)
        .map(|t| {
            for (time, rows) in &got {
                if *time == t {
                    for (x, _, d) in rows {
                        *acc.entry(x.clone()).or_default() += d;
                    }
                }
            }
            assert!(acc.values().all(|d| *d >= 0 && *d <= 1), "multiplicities 0 or 1");
            acc.iter().filter(|(_, d)| **d > 0).map(|(x, _)| x.clone()).collect()
        })
        .collect()
}

#[test]
fn merges_equal_union_find_after_every_epoch() {
    for seed in [7u64, 8] {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut live: BTreeSet<Ev> = BTreeSet::new();
        let (mut steps, mut want) = (Vec::new(), Vec::new());
        for _ in 0..10 {
            let mut step = Vec::new();
            for _ in 0..rng.gen_range(1..8) {
                if live.is_empty() || rng.gen_bool(0.75) {
                    let proto = rng.gen_range(0..4);
                    let e = (
                        format!("s{}", rng.gen_range(0..2)),
                        format!("E:{:04}", rng.gen_range(0..60)),
                        vector(&mut rng, proto),
                    );
                    if !live.iter().any(|x| x.0 == e.0 && x.1 == e.1) && live.insert(e.clone()) {
                        step.push((e, 1));
                    }
                } else {
                    let e = live.iter().nth(rng.gen_range(0..live.len())).unwrap().clone();
                    live.remove(&e);
                    step.push((e, -1));
                }
            }
            steps.push(step);
            want.push(expected(&live));
        }
        let merged = want.iter().map(|w| w.iter().filter(|(_, id, g)| id != g).count()).max().unwrap();
        assert!(merged >= 3, "the test exercises merging: {merged}");
        for workers in [1, 3] {
            let got = run(workers, steps.clone());
            for (t, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g, w, "seed {seed}, {workers} workers, epoch {t}");
            }
        }
        let scratch = run(1, vec![live.iter().map(|e| (e.clone(), 1)).collect()]);
        assert_eq!(scratch[0], want[want.len() - 1]);
    }
}

#[test]
fn topics_are_a_function_of_the_current_events() {
    use engram_operators::events::{event_topics, kmeans_topics, topic_count};
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    // Four well-separated directions, 6 events each: k-means with k = 4 finds them.
    let items: Vec<(String, Vec<i16>)> = (0..24).map(|i| (format!("E:{i:03}"), vector(&mut rng, i % 4))).collect();
    let refs: Vec<(&str, &[i16])> = items.iter().map(|(a, v)| (a.as_str(), v.as_slice())).collect();
    assert_eq!(topic_count(24), 4);
    let t = kmeans_topics(&refs);
    for i in 0..24 {
        for j in 0..24 {
            assert_eq!(t[i] == t[j], i % 4 == j % 4, "events {i} and {j}");
        }
    }
    // Order of input does not matter.
    let mut rev = refs.clone();
    rev.reverse();
    let tr = kmeans_topics(&rev);
    for i in 0..24 {
        assert_eq!(rev[tr[i]].0, refs[t[23 - i]].0);
    }
    // In the dataflow, after inserts and a delete, the topics equal the function of what is left.
    let (tx, rx) = mpsc::channel();
    let tx = Arc::new(Mutex::new(tx));
    let feed = items.clone();
    timely::execute(timely::Config::process(2), move |worker| {
        let tx = tx.lock().unwrap().clone();
        let (mut input, probe) = worker.dataflow::<u64, _, _>(|scope| {
            let (input, vectors) = scope.new_collection::<(String, String, String, Vec<i16>), isize>();
            let (probe, topics) = event_topics(vectors).probe();
            topics.inner.capture_into(tx);
            (input, probe)
        });
        if worker.index() == 0 {
            for (id, v) in &feed {
                input.insert(("s".into(), "c".into(), id.clone(), v.clone()));
                // The same vectors in another conversation of the space: topics never mix conversations.
                input.insert(("s".into(), "d".into(), id.replace("E:", "X:"), v.clone()));
            }
        }
        input.advance_to(1);
        input.flush();
        worker.step_while(|| probe.less_than(&1));
        if worker.index() == 0 {
            for (id, v) in feed.iter().filter(|(id, _)| id.ends_with('0') || id.ends_with('4')) {
                input.remove(("s".into(), "c".into(), id.clone(), v.clone()));
            }
        }
        input.advance_to(2);
        input.flush();
        worker.step_while(|| probe.less_than(&2));
    })
    .unwrap();
    let mut acc: BTreeMap<(String, String, String), isize> = BTreeMap::new();
    for (_, rows) in rx.extract() {
        for (x, _, d) in rows {
            *acc.entry(x).or_default() += d;
        }
    }
    let got: BTreeSet<(String, String)> =
        acc.into_iter().filter(|(_, d)| *d > 0).map(|((_, t, e), _)| (t, e)).collect();
    let (other, got): (BTreeSet<(String, String)>, BTreeSet<(String, String)>) =
        got.into_iter().partition(|(_, e)| e.starts_with("X:"));
    assert_eq!(other.len(), items.len(), "the other conversation keeps all its events");
    assert!(other.iter().all(|(t, _)| t.starts_with("T:X:")), "a topic mixes conversations: {other:?}");
    assert!(got.iter().all(|(t, _)| t.starts_with("T:E:")), "a topic mixes conversations: {got:?}");
    let left: Vec<&(String, Vec<i16>)> =
        items.iter().filter(|(id, _)| !(id.ends_with('0') || id.ends_with('4'))).collect();
    let refs: Vec<(&str, &[i16])> = left.iter().map(|(a, v)| (a.as_str(), v.as_slice())).collect();
    let want: BTreeSet<(String, String)> = kmeans_topics(&refs)
        .into_iter()
        .enumerate()
        .map(|(i, t)| (format!("T:{}", refs[t].0), refs[i].0.to_string()))
        .collect();
    assert_eq!(got, want);
    assert_eq!(got.len(), left.len());
}
