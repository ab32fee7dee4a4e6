//! Topics (CompassMem): events grouped by k-means over their vectors, per space.

/// The number of topics for `n` events (CompassMem): max(2, min(⌊n/5⌋, 50)), never more than `n`.
pub fn topic_count(n: usize) -> usize {
    (n / 5).clamp(2, 50).min(n)
}

/// Deterministic k-means over quantised unit vectors (cosine): farthest-first seeding from the smallest id, then
/// Lloyd rounds until stable (at most 20). Returns, per input, the index of its topic's smallest member — a name
/// that does not depend on the order topics were found in.
pub fn kmeans_topics(items: &[(&str, &[i16])]) -> Vec<usize> {
    let n = items.len();
    if n == 0 {
        return Vec::new();
    }
    let k = topic_count(n);
    let vecs: Vec<Vec<f32>> = items.iter().map(|(_, v)| v.iter().map(|x| f32::from(*x) / 10_000.0).collect()).collect();
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| items[a].0.cmp(items[b].0));
    let mut centres: Vec<Vec<f32>> = vec![vecs[order[0]].clone()];
    while centres.len() < k {
        // The item least similar to every centre; ties to the smallest id.
        let next = order
            .iter()
            .copied()
            .map(|i| (centres.iter().map(|c| dot(&vecs[i], c)).fold(f32::MIN, f32::max), i))
            .min_by(|a, b| a.0.total_cmp(&b.0).then_with(|| items[a.1].0.cmp(items[b.1].0)))
            .expect("n > 0")
            .1;
        centres.push(vecs[next].clone());
    }
    let mut assign = vec![usize::MAX; n];
    for _round in 0..20 {
        let new: Vec<usize> = (0..n)
            .map(|i| {
                (0..k)
                    .map(|c| (dot(&vecs[i], &centres[c]), c))
                    .max_by(|a, b| a.0.total_cmp(&b.0).then_with(|| b.1.cmp(&a.1)))
                    .expect("k > 0")
                    .1
            })
            .collect();
        if new == assign {
            break;
        }
        assign = new;
        for (c, centre) in centres.iter_mut().enumerate() {
            let members: Vec<usize> = (0..n).filter(|&i| assign[i] == c).collect();
            if members.is_empty() {
                continue;
            }
            let mut sum = vec![0f32; centre.len()];
            for &i in &members {
                sum.iter_mut().zip(&vecs[i]).for_each(|(s, x)| *s += x);
            }
            let norm = sum.iter().map(|x| x * x).sum::<f32>().sqrt().max(f32::MIN_POSITIVE);
            *centre = sum.into_iter().map(|x| x / norm).collect();
        }
    }
    // Name each topic by its smallest member.
    let mut name: std::collections::HashMap<usize, usize> = std::collections::HashMap::new();
    for &i in &order {
        name.entry(assign[i]).or_insert(i);
    }
    (0..n).map(|i| name[&assign[i]]).collect()
}

/// Topics (CompassMem): per conversation (a meeting, a chat), k-means over its events' vectors ([`kmeans_topics`]),
/// recomputed as a whole whenever the conversation's events change — a pure function of the current events, so
/// incremental equals from scratch (the paper's "join the nearest topic, re-cluster every 4 steps" depends on arrival
/// order; this does not). Per conversation, so an event costs what its own meeting costs however many meetings the
/// space holds. Input `(space, conversation, event, vector)`; output `(space, topic, event)` with topic
/// `T:<smallest member event id>`.
pub fn event_topics<'s, T>(
    vectors: differential_dataflow::VecCollection<'s, T, (String, String, String, Vec<i16>)>,
) -> differential_dataflow::VecCollection<'s, T, (String, String, String)>
where
    T: timely::progress::Timestamp + differential_dataflow::lattice::Lattice + timely::order::TotalOrder,
{
    vectors
        .map(|(s, conversation, id, v)| ((s, conversation), (id, v)))
        .reduce(|_k, events: &[(&(String, Vec<i16>), isize)], out: &mut Vec<((String, String), isize)>| {
            let items: Vec<(&str, &[i16])> =
                events.iter().filter(|(_, d)| *d > 0).map(|(e, _)| (e.0.as_str(), e.1.as_slice())).collect();
            for (i, t) in kmeans_topics(&items).into_iter().enumerate() {
                out.push(((format!("T:{}", items[t].0), items[i].0.to_string()), 1));
            }
        })
        .map(|((s, _), (topic, event))| (s, topic, event))
}
