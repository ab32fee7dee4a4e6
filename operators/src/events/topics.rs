//! Topics (CompassMem): events grouped by k-means over their vectors, per space.

/// The number of topics for `n` events (CompassMem): max(2, min(⌊n/5⌋, 50)), never more than `n`.
pub fn topic_count(n: usize) -> usize {
    (n / 5).clamp(2, 50).min(n)
}

/// Deterministic k-means over quantised unit vectors (cosine): farthest-first seeding from the smallest id, then
/// Lloyd rounds until stable (at most 20). Returns, per input, the index of its topic's smallest member — a name
/// that does not depend on the order topics were found in. Event vectors are sparse (a summary's words among the
/// embedder's buckets), so items are kept as their non-zero components and each dot product costs what the item
/// holds, not the dimension.
pub fn kmeans_topics(items: &[(&str, &[i16])]) -> Vec<usize> {
    let n = items.len();
    if n == 0 {
        return Vec::new();
    }
    let k = topic_count(n);
    let dim = items.iter().map(|(_, v)| v.len()).max().unwrap_or(0);
    let sparse: Vec<Vec<(usize, f32)>> = items
        .iter()
        .map(|(_, v)| {
            v.iter().enumerate().filter(|(_, x)| **x != 0).map(|(i, x)| (i, f32::from(*x) / 10_000.0)).collect()
        })
        .collect();
    let dot = |a: &[(usize, f32)], centre: &[f32]| a.iter().map(|(i, x)| x * centre[*i]).sum::<f32>();
    let dense = |a: &[(usize, f32)]| {
        let mut v = vec![0f32; dim];
        for (i, x) in a {
            v[*i] = *x;
        }
        v
    };
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| items[a].0.cmp(items[b].0));
    let mut centres: Vec<Vec<f32>> = vec![dense(&sparse[order[0]])];
    // Each item's best similarity to the centres so far, kept as centres are added.
    let mut best: Vec<f32> = sparse.iter().map(|a| dot(a, &centres[0])).collect();
    while centres.len() < k {
        // The item least similar to every centre; ties to the smallest id.
        let next = order
            .iter()
            .copied()
            .min_by(|&a, &b| best[a].total_cmp(&best[b]).then_with(|| items[a].0.cmp(items[b].0)))
            .expect("n > 0");
        let centre = dense(&sparse[next]);
        for (b, a) in best.iter_mut().zip(&sparse) {
            *b = b.max(dot(a, &centre));
        }
        centres.push(centre);
    }
    let mut assign = vec![usize::MAX; n];
    for _round in 0..20 {
        let new: Vec<usize> = sparse
            .iter()
            .map(|a| {
                (0..k)
                    .map(|c| (dot(a, &centres[c]), c))
                    .max_by(|a, b| a.0.total_cmp(&b.0).then_with(|| b.1.cmp(&a.1)))
                    .expect("k > 0")
                    .1
            })
            .collect();
        if new == assign {
            break;
        }
        assign = new;
        let mut sums = vec![vec![0f32; dim]; k];
        let mut counts = vec![0usize; k];
        for (a, &c) in sparse.iter().zip(&assign) {
            counts[c] += 1;
            for (i, x) in a {
                sums[c][*i] += x;
            }
        }
        for ((centre, sum), count) in centres.iter_mut().zip(sums).zip(counts) {
            if count == 0 {
                continue;
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
