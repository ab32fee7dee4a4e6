//! Busy time per operator from timely's log (`engram bench hierarchy --profile`).

use std::time::Duration;

/// Busy time per operator from timely's log: `(id → (name, address)`, `id → total time)`.
pub(super) struct OperatorProfile {
    state: std::rc::Rc<std::cell::RefCell<ProfileState>>,
}

#[derive(Default)]
struct ProfileState {
    names: std::collections::HashMap<usize, String>,
    started: std::collections::HashMap<usize, Duration>,
    busy: std::collections::HashMap<usize, Duration>,
    /// Updates each arrangement holds (batches added, merged and dropped, from differential's log).
    held: std::collections::HashMap<usize, isize>,
    /// Operator id by address, and `(scope, target index) → source index` for every channel: what feeds an operator.
    ids: std::collections::HashMap<Vec<usize>, usize>,
    feeds: std::collections::HashMap<(Vec<usize>, usize), Vec<usize>>,
}

pub(super) fn operator_profile(worker: &mut timely::worker::Worker) -> OperatorProfile {
    use timely::logging::{StartStop, TimelyEvent, TimelyEventBuilder};
    let state = std::rc::Rc::new(std::cell::RefCell::new(ProfileState::default()));
    let st = state.clone();
    worker.log_register().expect("log register").insert::<TimelyEventBuilder, _>("timely", move |_time, data| {
        let Some(data) = data else { return };
        let mut st = st.borrow_mut();
        for (t, e) in data.iter() {
            match e {
                TimelyEvent::Operates(o) => {
                    st.names.insert(o.id, format!("{}{:?}", o.name, o.addr));
                    st.ids.insert(o.addr.clone(), o.id);
                }
                TimelyEvent::Channels(c) => {
                    st.feeds.entry((c.scope_addr.clone(), c.target.0)).or_default().push(c.source.0);
                }
                TimelyEvent::Schedule(s) => match s.start_stop {
                    StartStop::Start => {
                        st.started.insert(s.id, *t);
                    }
                    StartStop::Stop => {
                        if let Some(t0) = st.started.remove(&s.id) {
                            *st.busy.entry(s.id).or_default() += t.saturating_sub(t0);
                        }
                    }
                },
                _ => {}
            }
        }
    });
    use differential_dataflow::logging::{DifferentialEvent, DifferentialEventBuilder};
    let st = state.clone();
    worker.log_register().expect("log register").insert::<DifferentialEventBuilder, _>(
        "differential/arrange",
        move |_time, data| {
            let Some(data) = data else { return };
            let mut st = st.borrow_mut();
            for (_, e) in data.iter() {
                let (op, d) = match e {
                    DifferentialEvent::Batch(b) => (b.operator, b.length as isize),
                    DifferentialEvent::Merge(m) => match m.complete {
                        Some(n) => (m.operator, n as isize - (m.length1 + m.length2) as isize),
                        None => continue,
                    },
                    DifferentialEvent::Drop(d) => (d.operator, -(d.length as isize)),
                    _ => continue,
                };
                *st.held.entry(op).or_default() += d;
            }
        },
    );
    OperatorProfile { state }
}

impl ProfileState {
    /// The names of the operators that feed `id`, `depth` steps up its first input: where an arrangement's rows
    /// come from.
    fn upstream(&self, id: usize, depth: usize) -> String {
        let addr = self.ids.iter().find(|(_, i)| **i == id).map(|(a, _)| a.clone());
        let mut chain = Vec::new();
        let mut at = addr;
        for _ in 0..depth {
            let Some(a) = at.take() else { break };
            let Some((&index, scope)) = a.split_last() else { break };
            let Some(&source) = self.feeds.get(&(scope.to_vec(), index)).and_then(|s| s.first()) else { break };
            let mut up = scope.to_vec();
            up.push(source);
            let Some(name) = self.ids.get(&up).and_then(|i| self.names.get(i)) else { break };
            chain.push(name.split('[').next().unwrap_or("?").to_string());
            at = Some(up);
        }
        chain.join(" ← ")
    }
}

impl OperatorProfile {
    /// Prints the 25 busiest operators since the last report, and resets.
    pub(super) fn report(&self, worker: usize) {
        let mut st = self.state.borrow_mut();
        let mut busy: Vec<(usize, Duration)> = st.busy.drain().collect();
        busy.sort_by_key(|b| std::cmp::Reverse(b.1));
        let total: f64 = busy.iter().map(|b| b.1.as_secs_f64()).sum();
        eprintln!("profile (worker {worker}): {total:.3}s in operators");
        for (id, d) in busy.iter().take(15) {
            eprintln!("  {:>8.3}s  {:>4}  {}", d.as_secs_f64(), id, st.names.get(id).map_or("?", String::as_str));
        }
        {
            // Busy time per stretch of operators between two EgoReplicas (one hierarchy layer each).
            let mut ids: Vec<usize> = st.names.keys().copied().collect();
            ids.sort();
            let mut seg = 0;
            let mut segs: Vec<f64> = vec![0.0];
            let busy_map: std::collections::HashMap<usize, Duration> = busy.iter().copied().collect();
            for id in ids {
                if id == 0 {
                    continue;
                }
                if st.names[&id].starts_with("EgoReplicas") {
                    seg += 1;
                    segs.push(0.0);
                }
                segs[seg] += busy_map.get(&id).map_or(0.0, Duration::as_secs_f64);
            }
            eprintln!(
                "  by layer stretch: {:?}",
                segs.iter().map(|x| (x * 1000.0).round() / 1000.0).collect::<Vec<_>>()
            );
        }
        let mut by_name: std::collections::HashMap<&str, (Duration, usize)> = Default::default();
        for (id, d) in &busy {
            let name = st.names.get(id).map_or("?", |n| n.split('[').next().unwrap_or("?"));
            let e = by_name.entry(name).or_default();
            e.0 += *d;
            e.1 += 1;
        }
        let mut by_name: Vec<_> = by_name.into_iter().collect();
        by_name.sort_by_key(|b| std::cmp::Reverse(b.1 .0));
        for (name, (d, n)) in by_name.iter().take(15) {
            eprintln!("  {:>8.3}s  {n:>5} × {name}", d.as_secs_f64());
        }
    }

    /// Prints the updates each arrangement holds now, the largest first (call it while the dataflow is alive: a
    /// finished dataflow has dropped its traces).
    pub(super) fn arrangements(&self) {
        let st = self.state.borrow();
        let mut held: Vec<(usize, isize)> = st.held.iter().map(|(k, v)| (*k, *v)).filter(|h| h.1 > 0).collect();
        held.sort_by_key(|h| std::cmp::Reverse(h.1));
        let total: isize = held.iter().map(|h| h.1).sum();
        eprintln!("  arrangements hold {total} updates in {} arrangements; the largest:", held.len());
        let egos: Vec<usize> = st.names.iter().filter(|(_, n)| n.starts_with("EgoReplicas")).map(|(i, _)| *i).collect();
        for (id, n) in held.iter().take(60) {
            let stretch = egos.iter().filter(|e| **e < *id).count();
            eprintln!(
                "  {n:>10}  {:>4}  stretch {stretch}  {}  ← {}",
                id,
                st.names.get(id).map_or("?", String::as_str),
                st.upstream(*id, 4)
            );
        }
    }
}
