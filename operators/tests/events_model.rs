//! The event layer in the dataflow equals the sequential definition after every epoch of seeded random inserts,
//! edits and deletes of turns (1 and 3 workers), and a from-scratch build of the final turns equals the
//! incremental result.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{mpsc, Arc, Mutex};

use differential_dataflow::input::Input;
use engram_operators::events::{event_memory, session_events, session_of, EventRow, RelationRow, SegmentParams};
use engram_operators::model::{Node, NodeKind, POSITION_SCALE};
use rand::{Rng, SeedableRng};
use timely::dataflow::operators::capture::{Capture, Extract};

const WORDS: &[&str] = &[
    "harbour",
    "storm",
    "flooded",
    "quay",
    "council",
    "budget",
    "violin",
    "lessons",
    "daughter",
    "football",
    "striker",
    "because",
    "therefore",
    "plans",
    "to",
    "the",
    "ferry",
    "cancelled",
    "wall",
    "nurse",
    "bakery",
    "job",
    "lost",
];

fn turn(space_conv: (usize, usize), session: i64, n: i64, rng: &mut rand::rngs::StdRng) -> (String, Node) {
    let len = rng.gen_range(3..9);
    let text: Vec<&str> = (0..len).map(|_| WORDS[rng.gen_range(0..WORDS.len())]).collect();
    let speaker = ["Ana", "Ben", "Cem"][rng.gen_range(0..3)];
    let minute = n * 3 + if rng.gen_bool(0.1) { 60 } else { 0 };
    let node = Node {
        id: format!("D{session}:{n}").into(),
        kind: NodeKind::Turn,
        doc: format!("conv{}", space_conv.1).into(),
        pos: (session * 10_000 + n) * POSITION_SCALE,
        text: text.join(" ").into(),
        speaker: Some(speaker.into()),
        ts: Some(format!("2026-11-{:02}T{:02}:{:02}:00Z", 1 + session, 8 + minute / 60, minute % 60).into()),
    };
    (format!("space{}", space_conv.0), node)
}

type Out = (BTreeSet<(String, EventRow)>, BTreeSet<(String, RelationRow)>);

fn expected(live: &BTreeMap<(String, String, String), Node>) -> Out {
    let mut groups: BTreeMap<(String, String, i64), Vec<&Node>> = BTreeMap::new();
    for ((s, _, _), n) in live {
        groups.entry((s.clone(), n.doc.to_string(), session_of(n))).or_default().push(n);
    }
    let mut out = Out::default();
    for ((s, conv, session), turns) in groups {
        let (ev, rel) = session_events(&conv, session, &turns, &SegmentParams::default());
        out.0.extend(ev.into_iter().map(|e| (s.clone(), e)));
        out.1.extend(rel.into_iter().map(|r| (s.clone(), r)));
    }
    out
}

/// Runs `steps` (each a list of (space, node, diff)) as epochs; returns the accumulated outputs after each epoch.
fn run(workers: usize, steps: Vec<Vec<(String, Node, isize)>>) -> Vec<Out> {
    let (es, er) = mpsc::channel();
    let (rs, rr) = mpsc::channel();
    let (es, rs) = (Arc::new(Mutex::new(es)), Arc::new(Mutex::new(rs)));
    let n_steps = steps.len() as u64;
    timely::execute(timely::Config::process(workers), move |worker| {
        let (es, rs) = (es.lock().unwrap().clone(), rs.lock().unwrap().clone());
        let (mut input, probe) = worker.dataflow::<u64, _, _>(|scope| {
            let (input, nodes) = scope.new_collection::<(String, Node), isize>();
            let (_logged_in, logged) = scope.new_collection::<((String, String), String), isize>();
            let m = event_memory(nodes, logged, SegmentParams::default(), false);
            let (events, relations) = (m.events, m.relations);
            events.inner.capture_into(es);
            let (probe, relations) = relations.probe();
            relations.inner.capture_into(rs);
            (input, probe)
        });
        for (t, step) in steps.iter().enumerate() {
            if worker.index() == 0 {
                for (s, n, d) in step {
                    input.update((s.clone(), n.clone()), *d);
                }
            }
            input.advance_to(t as u64 + 1);
            input.flush();
            worker.step_while(|| probe.less_than(&(t as u64 + 1)));
        }
    })
    .unwrap();
    let events = er.extract();
    let relations = rr.extract();
    let mut acc_e: BTreeMap<(String, EventRow), isize> = BTreeMap::new();
    let mut acc_r: BTreeMap<(String, RelationRow), isize> = BTreeMap::new();
    let mut out = Vec::new();
    for t in 0..n_steps {
        for (time, rows) in &events {
            if *time == t {
                for (x, _, d) in rows {
                    *acc_e.entry(x.clone()).or_default() += d;
                }
            }
        }
        for (time, rows) in &relations {
            if *time == t {
                for (x, _, d) in rows {
                    *acc_r.entry(x.clone()).or_default() += d;
                }
            }
        }
        assert!(acc_e.values().all(|d| *d >= 0) && acc_r.values().all(|d| *d >= 0), "negative multiplicity");
        out.push((
            acc_e.iter().filter(|(_, d)| **d > 0).map(|(x, _)| x.clone()).collect(),
            acc_r.iter().filter(|(_, d)| **d > 0).map(|(x, _)| x.clone()).collect(),
        ));
    }
    out
}

#[test]
fn events_equal_the_sequential_definition_after_every_epoch() {
    for seed in [1u64, 2, 3] {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut live: BTreeMap<(String, String, String), Node> = BTreeMap::new();
        let mut steps = Vec::new();
        let mut want = Vec::new();
        let mut next: BTreeMap<(usize, usize, i64), i64> = BTreeMap::new();
        for _ in 0..12 {
            let mut step = Vec::new();
            for _ in 0..rng.gen_range(1..30) {
                let key = (rng.gen_range(0..2), rng.gen_range(0..2), rng.gen_range(1..3));
                // Deletes of whole conversations are rarer than appends and edits, or nothing would grow.
                let roll = if rng.gen_bool(0.02) { 10 } else { rng.gen_range(0..10) };
                let existing: Vec<(String, String, String)> = live.keys().cloned().collect();
                if roll < 8 || existing.is_empty() {
                    // Append a turn to a live session.
                    let n = next.entry(key).or_insert(0);
                    *n += 1;
                    let (s, node) = turn((key.0, key.1), key.2, *n, &mut rng);
                    let k = (s.clone(), node.doc.to_string(), node.id.to_string());
                    if let Some(old) = live.insert(k, node.clone()) {
                        step.push((s.clone(), old, -1));
                    }
                    step.push((s, node, 1));
                } else if roll < 10 {
                    // Edit a random turn's text.
                    let k = existing[rng.gen_range(0..existing.len())].clone();
                    let old = live[&k].clone();
                    let mut new = old.clone();
                    new.text = format!("{} storm because flooded", old.text).into();
                    live.insert(k.clone(), new.clone());
                    step.push((k.0.clone(), old, -1));
                    step.push((k.0, new, 1));
                } else {
                    // Delete a whole conversation.
                    let k = existing[rng.gen_range(0..existing.len())].clone();
                    let gone: Vec<_> = live.keys().filter(|x| x.0 == k.0 && x.1 == k.1).cloned().collect();
                    for g in gone {
                        let old = live.remove(&g).unwrap();
                        step.push((g.0, old, -1));
                    }
                }
            }
            steps.push(step);
            want.push(expected(&live));
        }
        for workers in [1, 3] {
            let got = run(workers, steps.clone());
            for (t, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g, w, "seed {seed}, {workers} workers, epoch {t}");
            }
        }
        // From scratch: the final turns in one epoch.
        let scratch = run(1, vec![live.iter().map(|((s, _, _), n)| (s.clone(), n.clone(), 1)).collect()]);
        assert_eq!(scratch[0], want[want.len() - 1], "seed {seed}: from scratch");
        let most = want.iter().map(|w| (w.0.len(), w.1.len())).max().unwrap();
        assert!(most.0 > 3 && most.1 > 3, "the test exercises events and relations: {most:?}");
    }
}
