//! Summaries in the dataflow: requested once every member has a text, answered by content hash, layer by layer;
//! a changed cluster is requested again, an unchanged one never.

use std::collections::BTreeMap;
use std::sync::{mpsc, Arc, Mutex};

use differential_dataflow::input::Input;
use engram_operators::hierarchy::dataflow::{hierarchy, summaries};
use engram_operators::hierarchy::HierarchyParams;
use engram_operators::Name;
use timely::dataflow::operators::capture::{Capture, Extract};

type Req = (String, u32, String, String, Vec<(String, String)>);

type Texts = BTreeMap<u64, Vec<(((String, String), (u32, String)), isize)>>;

/// Cliques of the nodes named with one letter (a0 … a3, b0 …), cliques a and b joined by edge a0–b0; the driver
/// answers every request of epoch t at epoch t + 1 (text = "sum:" + hash), `rounds` times, and with `delete` deletes
/// node a0 two epochs before the end.
fn run(names: &[&str], max_layers: usize, rounds: u64, delete: bool) -> (BTreeMap<u64, Vec<(Req, isize)>>, Texts) {
    let names: Vec<String> = names.iter().map(|x| x.to_string()).collect();
    let (rs, rr) = mpsc::channel();
    let (ts, tr) = mpsc::channel();
    let (rs, ts) = (Arc::new(Mutex::new(rs)), Arc::new(Mutex::new(ts)));
    timely::execute(timely::Config::thread(), move |worker| {
        let names = names.clone();
        let (rs, ts) = (rs.lock().unwrap().clone(), ts.lock().unwrap().clone());
        let (req_tx, req_rx) = mpsc::channel::<(Req, u64, isize)>();
        let (mut n, mut e, mut s, probe) = worker.dataflow::<u64, _, _>(|scope| {
            let (ni, nodes) = scope.new_collection::<(Name, Name), isize>();
            let (ei, edges) = scope.new_collection::<(Name, Name, Name, u64), isize>();
            let (si, sums) = scope.new_collection::<((Name, Name), Name), isize>();
            let h = hierarchy(
                nodes.clone(),
                edges,
                &HierarchyParams {
                    max_layers,
                    max_cluster_size: 12,
                    lpa_rounds: 6,
                    lpa_layers: 1,
                    replica_layers: 1,
                    min_shrink: 0.1,
                    pool_loose_neighbours: true,
                    max_degree: 10,
                },
            );
            let sm = summaries(nodes.map(|(s, n)| ((s, n.clone()), format!("text of {n}").into())), &h.layers, sums);
            sm.texts.map(|((s, c), (l, t))| ((s.into(), c.into()), (l, t.into()))).inner.capture_into(ts);
            let req_tx = Mutex::new(req_tx);
            let strings = |ms: Vec<(Name, Name)>| ms.into_iter().map(|(m, t)| (m.into(), t.into())).collect();
            let requests = sm.requests.map(move |(s, l, c, h, ms)| (s.into(), l, c.into(), h.into(), strings(ms)));
            let (probe, reqs) =
                requests.inspect(move |(r, t, d)| req_tx.lock().unwrap().send((r.clone(), *t, *d)).unwrap()).probe();
            reqs.inner.capture_into(rs);
            (ni, ei, si, probe)
        });
        for x in &names {
            n.insert(("s".into(), x.as_str().into()));
        }
        for (i, u) in names.iter().enumerate() {
            for v in &names[i + 1..] {
                if u[..1] == v[..1] || (u == "a0" && v == "b0") {
                    e.insert(("s".into(), u.as_str().into(), v.as_str().into(), 100));
                }
            }
        }
        let mut live: BTreeMap<(String, String), isize> = BTreeMap::new();
        for t in 0..rounds {
            if delete && t == rounds - 2 {
                n.remove(("s".into(), "a0".into()));
                for v in ["a1", "a2", "a3", "b0"] {
                    e.remove(("s".into(), "a0".into(), v.into(), 100));
                }
            }
            n.advance_to(t + 1);
            e.advance_to(t + 1);
            s.advance_to(t + 1);
            n.flush();
            e.flush();
            s.flush();
            worker.step_while(|| probe.less_than(&(t + 1)));
            while let Ok((r, _, d)) = req_rx.try_recv() {
                *live.entry((r.0.clone(), r.3.clone())).or_default() += d;
            }
            live.retain(|_, d| *d != 0);
            for k in live.keys() {
                s.insert(((k.0.as_str().into(), k.1.as_str().into()), format!("sum:{}", k.1).into()));
            }
            live.clear();
        }
    })
    .unwrap();
    let mut reqs = BTreeMap::new();
    for (_, v) in rr.extract() {
        for (r, t, d) in v {
            reqs.entry(t).or_insert_with(Vec::new).push((r, d));
        }
    }
    let mut texts = BTreeMap::new();
    for (_, v) in tr.extract() {
        for (r, t, d) in v {
            texts.entry(t).or_insert_with(Vec::new).push((r, d));
        }
    }
    (reqs, texts)
}

#[test]
fn requests_are_answered_layer_by_layer_and_again_after_a_change() {
    let (reqs, texts) = run(&["a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3"], 3, 8, true);
    let mut open: BTreeMap<(String, u32, String, String), isize> = BTreeMap::new();
    for (t, rs) in &reqs {
        for (r, d) in rs {
            *open.entry((r.0.clone(), r.1, r.2.clone(), r.3.clone())).or_default() += d;
        }
        open.retain(|_, d| *d != 0);
        eprintln!("t={t} open={:?}", open.keys().map(|k| (k.1, k.2.clone())).collect::<Vec<_>>());
    }
    assert!(open.is_empty(), "every request is answered: {open:?}");
    let layer1_at_0: Vec<_> = reqs[&0].iter().filter(|(r, d)| r.1 == 1 && *d > 0).collect();
    assert!(layer1_at_0.len() >= 2, "both cliques are requested at once");
    assert!(reqs[&0].iter().all(|(r, _)| r.1 == 1), "layer 2 waits for layer 1's summaries");
    let mut summarized: BTreeMap<(String, String), isize> = BTreeMap::new();
    for ts in texts.values() {
        for (((s, c), _), d) in ts {
            *summarized.entry((s.clone(), c.clone())).or_default() += d;
        }
    }
    summarized.retain(|_, d| *d != 0);
    assert!(summarized.keys().any(|(_, c)| c.starts_with("L1:")), "{summarized:?}");
    // The delete changed cluster a's content: it was requested again after the delete.
    let after_delete: usize = reqs.range(6..).flat_map(|(_, v)| v).filter(|(r, d)| r.1 == 1 && *d > 0).count();
    assert!(after_delete >= 1, "{reqs:?}");
}

/// Above layer 1 a cluster of one member is never requested: it shows its member's summary. Cliques a and b (joined
/// by one edge) meet in layer 2; clique c, alone, is a layer-2 cluster of one member. Every request is answered at
/// the next epoch; at the end, c's layer-2 cluster shows c's layer-1 summary, and no request ever had one member above
/// layer 1.
#[test]
fn a_cluster_of_one_member_above_layer_one_shows_its_members_summary() {
    let names = ["a0", "a1", "a2", "a3", "b0", "b1", "b2", "b3", "c0", "c1", "c2", "c3"];
    let (reqs, changes) = run(&names, 2, 6, false);
    let reqs: Vec<(Req, isize)> = reqs.into_values().flatten().collect();
    assert!(reqs.iter().any(|(r, _)| r.1 == 2), "layer 2 is requested: {reqs:?}");
    assert!(
        reqs.iter().all(|(r, _)| r.1 == 1 || r.4.len() > 1),
        "a one-member cluster above layer 1 was requested: {reqs:?}"
    );
    let mut net: BTreeMap<((String, String), (u32, String)), isize> = BTreeMap::new();
    for (x, d) in changes.into_values().flatten() {
        *net.entry(x).or_default() += d;
    }
    let texts: BTreeMap<(String, String), (u32, String)> =
        net.into_iter().filter(|(_, d)| *d > 0).map(|(x, _)| x).collect();
    let layer1: Vec<&String> = texts.values().filter(|(l, _)| *l == 1).map(|(_, t)| t).collect();
    let singles: Vec<&String> =
        texts.values().filter(|(l, _)| *l == 2).map(|(_, t)| t).filter(|t| layer1.contains(t)).collect();
    assert_eq!(singles.len(), 1, "clique c's layer-2 cluster shows its layer-1 summary: {texts:?}");
    assert!(
        texts.values().any(|(l, t)| *l == 2 && !layer1.contains(&t)),
        "a and b meet in a summarised cluster: {texts:?}"
    );
}
