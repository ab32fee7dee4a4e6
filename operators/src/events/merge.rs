//! Merging (CompassMem): events whose vectors (of summary and people) are close are linked, and linked events are
//! merged into groups.

/// A unit vector quantised to 1/10000 per component: orderable, so it can be joined and arranged, and the same
/// bits on every worker.
pub fn quantise(v: &[f32]) -> Vec<i16> {
    v.iter().map(|x| (x * 10_000.0).round().clamp(-32_767.0, 32_767.0) as i16).collect()
}

/// The cosine of two quantised unit vectors.
pub fn quantised_cos(a: &[i16], b: &[i16]) -> f32 {
    let dot: i64 = a.iter().zip(b).map(|(x, y)| i64::from(*x) * i64::from(*y)).sum();
    dot as f32 / 1e8
}

/// Pairs of events of one space (`a < b` by id) whose vectors reach cosine ≥ `lo`, with the cosine in millionths:
/// a self-join per space, so a new event is compared with the space's events once.
pub fn similar_pairs<'s, T>(
    vectors: differential_dataflow::VecCollection<'s, T, (String, String, Vec<i16>)>,
    lo: f32,
) -> differential_dataflow::VecCollection<'s, T, (String, String, String, i64)>
where
    T: timely::progress::Timestamp + differential_dataflow::lattice::Lattice + timely::order::TotalOrder,
{
    let by_space = vectors.map(|(s, id, v)| (s, (id, v)));
    by_space
        .clone()
        .join_map(by_space, move |s, (a, va), (b, vb)| {
            let cos = quantised_cos(va, vb);
            (a < b && cos >= lo).then(|| (s.clone(), a.clone(), b.clone(), (f64::from(cos) * 1e6).round() as i64))
        })
        .flat_map(|pair| pair)
}

/// Merging (CompassMem): events of one space whose vectors (of summary and people) reach cosine ≥ `tau` are linked;
/// merged events are the connected components of those links, each named by its smallest event id. Links come from
/// a self-join per space (a new event is compared with the space's events once); components from an iterative
/// min-label propagation, so an insert or delete anywhere updates exactly the groups it touches. Output:
/// `(space, event, group)` for every event (a lone event is its own group).
pub fn event_merges<'s, T>(
    vectors: differential_dataflow::VecCollection<'s, T, (String, String, Vec<i16>)>,
    tau: f32,
) -> differential_dataflow::VecCollection<'s, T, (String, String, String)>
where
    T: timely::progress::Timestamp + differential_dataflow::lattice::Lattice + timely::order::TotalOrder,
{
    let links = similar_pairs(vectors.clone(), tau).map(|(s, a, b, _)| (s, a, b));
    merge_groups(vectors, links)
}

/// The connected components of `links` (`(space, a, b)`, either direction) over the events of `vectors`, each
/// named by its smallest event id: `(space, event, group)` for every event.
pub fn merge_groups<'s, T>(
    vectors: differential_dataflow::VecCollection<'s, T, (String, String, Vec<i16>)>,
    links: differential_dataflow::VecCollection<'s, T, (String, String, String)>,
) -> differential_dataflow::VecCollection<'s, T, (String, String, String)>
where
    T: timely::progress::Timestamp + differential_dataflow::lattice::Lattice + timely::order::TotalOrder,
{
    use differential_dataflow::operators::iterate::Iterate;
    let links = links
        .flat_map(|(s, a, b)| [((s.clone(), a.clone()), (s.clone(), b.clone())), ((s.clone(), b), (s, a))])
        .distinct();
    let nodes = vectors.map(|(s, id, _)| ((s.clone(), id.clone()), id));
    let labels = nodes.clone().iterate(|scope, inner| {
        let nodes = nodes.enter(scope);
        let links = links.enter(scope);
        inner.join_map(links, |_a, label, b| (b.clone(), label.clone())).concat(nodes).reduce(
            |_k, labels: &[(&String, isize)], out: &mut Vec<(String, isize)>| out.push((labels[0].0.clone(), 1)),
        )
    });
    labels.map(|((s, id), group)| (s, id, group))
}
