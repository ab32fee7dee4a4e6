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

/// The vector a quantised event vector stands for, for the similarity index.
pub fn event_embedding(v: &[i16]) -> crate::model::Embedding {
    crate::model::Embedding::new(v.iter().map(|x| f32::from(*x) / 10_000.0).collect())
}

/// The similarity index's parameters for event pairs: cosine alone (no positional term), `k` neighbours per event
/// from cosine `lo`, the HNSW settings of `index`.
pub fn pair_params(
    lo: f32,
    k: usize,
    index: &crate::similarity::SimilarityParams,
) -> crate::similarity::SimilarityParams {
    crate::similarity::SimilarityParams { alpha: 1.0, theta: lo, k, ..index.clone() }
}

/// Pairs of events of one space (`a < b` by id) where either keeps the other among its `k` nearest events at
/// cosine ≥ `lo` ([`event_embedding`]), with the cosine in millionths: the layer-0 similarity index
/// ([`crate::dataflow::similarity_edges`]) over event vectors, so a new event costs an index lookup, not a pass over
/// the space's events. Each event is its own document: no positional term.
pub fn similar_pairs<'s, T>(
    vectors: differential_dataflow::VecCollection<'s, T, (String, String, Vec<i16>)>,
    lo: f32,
    k: usize,
    index: &crate::similarity::SimilarityParams,
    store: &std::sync::Arc<crate::dataflow::IndexStore>,
) -> differential_dataflow::VecCollection<'s, T, (String, String, String, i64)>
where
    T: timely::progress::Timestamp + differential_dataflow::lattice::Lattice + timely::order::TotalOrder,
{
    let nodes = vectors.map(|(s, id, v)| {
        let id = crate::name::Name::from(id);
        let node = crate::model::Node {
            id: id.clone(),
            kind: crate::model::NodeKind::Summary,
            doc: id,
            pos: 0,
            text: crate::name::Name::default(),
            speaker: None,
            ts: None,
        };
        (s, node, event_embedding(&v))
    });
    crate::dataflow::similarity_edges_in(nodes, pair_params(lo, k, index), store)
        .map(|e| (e.space, e.u, e.v, i64::from(e.weight_micro)))
}

/// Merging (CompassMem): events of one space linked by [`similar_pairs`] at cosine ≥ `tau` (each event's `k`
/// nearest) are merged into groups: the connected components of the links, each named by its smallest event id,
/// from an iterative min-label propagation, so an insert or delete anywhere updates exactly the groups it touches.
/// Output: `(space, event, group)` for every event (a lone event is its own group).
pub fn event_merges<'s, T>(
    vectors: differential_dataflow::VecCollection<'s, T, (String, String, Vec<i16>)>,
    tau: f32,
    k: usize,
    index: &crate::similarity::SimilarityParams,
) -> differential_dataflow::VecCollection<'s, T, (String, String, String)>
where
    T: timely::progress::Timestamp + differential_dataflow::lattice::Lattice + timely::order::TotalOrder,
{
    let links = similar_pairs(vectors.clone(), tau, k, index, &Default::default()).map(|(s, a, b, _)| (s, a, b));
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
