//! CAM's Prune-and-Grow over every layer of the hierarchy.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashSet};

use serde_json::json;

use operators::{Embedder, Node, NodeKind};

use super::relevance::Relevance;
use super::{clip, Evidence, Guide, PROMPT_WORDS, SELECT_MAX};
use crate::views::SpaceView;

/// Over an indexed space, the clusters that may seed are the ancestors of this many of the best layer-0 candidates.
pub const ANCESTORS_OF: usize = 4 * SELECT_MAX;

/// CAM's Prune-and-Grow. Seeds: the top-k nodes of every layer (chunks and cluster summaries) by [`Relevance`]
/// (over an indexed space, of its candidates and of the clusters above the best [`ANCESTORS_OF`] of them). Then
/// up to 5 rounds: *prune* the candidates — with a model, to those it selects among the best [`SELECT_MAX`]; without,
/// to those of the best [`SELECT_MAX`] within half of the best score (so that a round grows from a bounded set,
/// whatever the size of the space) — and *grow* the kept ones to their same-layer neighbours and their children
/// (never parents); stop when the candidate set no longer changes. Evidence: the kept layer-0 nodes (the
/// seeds' if none were kept), best first, then the kept summaries, then — by the rule, not after a model's selection
/// — while budget is left the best other layer-0 text by relevance; consecutive chunks of one document merged into
/// one passage, cut to the word budget.
pub fn prune_and_grow(
    view: &SpaceView,
    embedder: &dyn Embedder,
    guide: &dyn Guide,
    query: &str,
    k: usize,
    budget_words: usize,
) -> (Vec<Evidence>, Vec<serde_json::Value>) {
    let rel = Relevance::new(view, embedder, query);
    // Layer 0 in context; a cluster by its summary (none yet: not a candidate), scored once however many rounds
    // ask.
    let scored: RefCell<operators::fasthash::HashMap<&str, Option<f32>>> = RefCell::default();
    let score = |id: &str| -> Option<f32> {
        if let Some(s) = rel.of(id) {
            return Some(s);
        }
        let (id, c) = view.clusters.get_key_value(id)?;
        if let Some(s) = scored.borrow().get(id.as_str()) {
            return *s;
        }
        let s = rel.cluster(view, c);
        scored.borrow_mut().insert(id.as_str(), s);
        s
    };
    // Every node of every layer; over an indexed space, the candidates and the clusters above the best of them
    // (every candidate's ancestors would be most of the upper layers: the cost of a query would grow with them).
    let by_score = |a: &(f32, &str), b: &(f32, &str)| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1));
    let mut all: Vec<(f32, &str)> = if rel.partial() {
        let mut all: Vec<(f32, &str)> = rel.ids().filter_map(|id| rel.of(id).map(|s| (s, id))).collect();
        if all.len() > ANCESTORS_OF {
            all.select_nth_unstable_by(ANCESTORS_OF - 1, by_score);
        }
        let mut seen: HashSet<&str> = HashSet::with_capacity(4 * all.len());
        let mut frontier: Vec<&str> = all.iter().take(ANCESTORS_OF).map(|x| x.1).collect();
        while let Some(id) = frontier.pop() {
            for p in view.parents.get(id).into_iter().flatten() {
                if seen.insert(p.as_str()) {
                    frontier.push(p.as_str());
                    if let Some(s) = score(p.as_str()) {
                        all.push((s, p.as_str()));
                    }
                }
            }
        }
        all
    } else {
        view.nodes
            .keys()
            .map(operators::Name::as_str)
            .chain(view.clusters.keys().map(String::as_str))
            .filter_map(|id| score(id).map(|s| (s, id)))
            .collect()
    };
    all.sort_by(by_score);
    let seeds: BTreeSet<&str> = all.iter().take(k).map(|x| x.1).collect();
    let mut trace = vec![json!({"step": "seed", "mode": "prune-and-grow", "seeds": seeds, "names": rel.names,
                                "why": "top-k over all layers by relevance (cosine, BM25, named speakers, context)"})];
    let (mut kept, by_model) = prune_rounds(view, guide, query, &seeds, &score, &mut trace);
    if kept.is_empty() {
        kept = seeds;
    }
    // The kept source text first, best first; then the kept summaries (what CAM's reader sees of a cluster); then
    // the best remaining source text while budget is left.
    let mut selected: Vec<(f32, &Node)> =
        kept.iter().filter_map(|id| view.nodes.get(*id).map(|(n, _)| (score(id).unwrap_or(f32::MIN), n))).collect();
    selected.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.id.cmp(&b.1.id)));
    let selected_words: usize = selected.iter().map(|(_, n)| super::evidence_words(n)).sum();
    let left = budget_words.saturating_sub(selected_words);
    let summary_items = summary_evidence(view, &kept, &score, left, &mut trace);
    let taken: BTreeSet<&str> = selected.iter().map(|x| x.1.id.as_str()).collect();
    let ranked = selected.into_iter().map(|(s, n)| (s, n, "selected by prune-and-grow")).chain(
        // The model's selection is the evidence; the similarity rule cannot tell where relevance ends, and
        // the best of the rest fills the budget.
        (!by_model)
            .then(|| rel.ranked())
            .into_iter()
            .flatten()
            .filter(|(_, n)| !taken.contains(n.id.as_str()))
            .map(|(s, n)| (s, n, "relevance, to fill the budget")),
    );
    let source_budget = budget_words - summary_items.iter().map(|e| e.text.split_whitespace().count()).sum::<usize>();
    let mut out = super::passages(view, ranked, source_budget, &mut trace);
    out.extend(summary_items);
    (out, trace)
}

/// Up to 5 rounds of prune and grow from the seeds: the kept nodes, and whether the model chose them.
fn prune_rounds<'v>(
    view: &'v SpaceView,
    guide: &dyn Guide,
    query: &str,
    seeds: &BTreeSet<&'v str>,
    score: &dyn Fn(&str) -> Option<f32>,
    trace: &mut Vec<serde_json::Value>,
) -> (BTreeSet<&'v str>, bool) {
    let text_of = |id: &str| -> Option<&str> {
        match view.nodes.get(id) {
            Some((n, _)) => Some(n.text.as_str()),
            None => view.clusters.get(id)?.summary.as_ref().map(|s| s.0.as_str()),
        }
    };
    let mut candidates = seeds.clone();
    let mut kept: BTreeSet<&str> = BTreeSet::new();
    let mut by_model = false;
    for round in 1..=5 {
        let mut scored: Vec<(f32, &str)> = candidates.iter().filter_map(|id| score(id).map(|s| (s, *id))).collect();
        let best = scored.iter().map(|x| x.0).fold(f32::MIN, f32::max);
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        let shown: Vec<(f32, &str)> = scored.iter().take(SELECT_MAX).copied().collect();
        let texts: Vec<String> =
            shown.iter().filter_map(|(_, id)| text_of(id).map(|t| clip(t, PROMPT_WORDS))).collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        kept = match guide.select(query, &refs) {
            Ok(Some(chosen)) => {
                trace.push(json!({"step": "select", "round": round, "shown": shown.len(), "chosen": chosen.len(), "why": "the model's selection"}));
                by_model = true;
                chosen.iter().filter_map(|i| shown.get(*i)).map(|x| x.1).collect()
            }
            other => {
                if let Err(e) = other {
                    trace.push(json!({"step": "model-error", "round": round, "error": e, "why": "the similarity rule instead"}));
                }
                scored.iter().take(SELECT_MAX).filter(|x| x.0 > 0.0 && x.0 >= 0.5 * best).map(|x| x.1).collect()
            }
        };
        let mut grown = kept.clone();
        for id in &kept {
            if let Some(nbrs) = view.adjacency.get(*id) {
                grown.extend(nbrs.keys().map(|k| &**k));
            }
            if let Some(c) = view.clusters.get(*id) {
                grown.extend(c.members.iter().map(operators::Name::as_str));
            }
        }
        trace.push(json!({"step": "round", "round": round, "kept": kept, "grown": grown.len() - kept.len(),
                          "why": "kept: the best, within half of the best score; grown: same-layer neighbours and children"}));
        if grown == candidates {
            break;
        }
        candidates = grown;
    }
    (kept, by_model)
}

/// The kept summaries (what CAM's reader sees of a cluster), best first, within `left` words.
fn summary_evidence(
    view: &SpaceView,
    kept: &BTreeSet<&str>,
    score: &dyn Fn(&str) -> Option<f32>,
    mut left: usize,
    trace: &mut Vec<serde_json::Value>,
) -> Vec<Evidence> {
    let mut summaries: Vec<(f32, &str)> = kept
        .iter()
        .filter(|id| view.clusters.contains_key(**id))
        .filter_map(|id| score(id).map(|s| (s, *id)))
        .collect();
    summaries.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    let mut summary_items = Vec::new();
    for (s, id) in summaries {
        if left == 0 {
            break;
        }
        let c = &view.clusters[id];
        let Some((text, _)) = &c.summary else { continue };
        let ws: Vec<&str> = text.split_whitespace().collect();
        let take = ws.len().min(left);
        left -= take;
        trace.push(
            json!({"step": "keep", "id": id, "layer": c.layer, "score": s, "why": "a summary kept by prune-and-grow"}),
        );
        summary_items.push(Evidence {
            id: id.to_string(),
            layer: c.layer,
            kind: NodeKind::Summary,
            text: ws[..take].join(" "),
            score: s,
            source: json!({"cluster": id, "children": c.members.len()}),
        });
    }
    summary_items
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ann::AnnParams;
    use crate::views::{ViewUpdate, Views};
    use operators::HashEmbedder;

    /// 2,000 turns on four subjects, a layer-1 cluster over each run of 10 with a summary of its subject, and a
    /// layer-2 cluster over each subject's layer-1 clusters; read exactly and through the index.
    fn space(ann: AnnParams) -> Views {
        let e = HashEmbedder::default();
        let subjects = [
            "pottery kiln glaze bowl",
            "sailing harbour wind boat",
            "budget invoice audit cost",
            "garden tomato soil seed",
        ];
        let mut v = Views { ann, ..Views::default() };
        let mut updates = Vec::new();
        for i in 0..2000 {
            let node = Node {
                id: format!("c#D{}:{}", i / 200 + 1, i % 200 + 1).into(),
                kind: NodeKind::Turn,
                doc: "c".into(),
                pos: i as i64 * operators::model::POSITION_SCALE,
                text: format!("{} said {} at {}", ["Ana", "Ben"][i % 2], subjects[(i / 10) % 4], i % 37).into(),
                speaker: Some(["Ana", "Ben"][i % 2].into()),
                ts: None,
            };
            let emb = e.embed(&node.embedding_text());
            let cluster = format!("L1:{}", i / 10);
            updates.push((ViewUpdate::Cluster("s".into(), 1, cluster.into(), node.id.clone()), 1));
            updates.push((ViewUpdate::Node("s".into(), Box::new(node), emb), 1));
        }
        for c in 0..200 {
            let subject = subjects[c % 4];
            updates.push((
                ViewUpdate::Summary("s".into(), 1, format!("L1:{c}").into(), format!("talk of {subject}").into()),
                1,
            ));
            updates.push((
                ViewUpdate::Cluster("s".into(), 2, format!("L2:{}", c % 4).into(), format!("L1:{c}").into()),
                1,
            ));
        }
        for (c, subject) in subjects.iter().enumerate() {
            updates.push((
                ViewUpdate::Summary("s".into(), 2, format!("L2:{c}").into(), format!("all about {subject}").into()),
                1,
            ));
        }
        v.apply_with(updates, &|t| e.embed(t));
        v
    }

    /// Over an indexed space only the clusters above the best candidates are scored, and the summaries kept are the
    /// exact pass's: the subject's clusters, at both layers.
    #[test]
    fn an_indexed_space_keeps_the_summaries_the_exact_pass_keeps() {
        let e = HashEmbedder::default();
        let exact = space(AnnParams::default());
        let indexed = space(AnnParams { exhaustive_below: 500, candidates: 64, ef_search: 256, ..Default::default() });
        assert!(exact.spaces["s"].ann.is_none() && indexed.spaces["s"].ann.is_some());
        let q = "what was said of the sailing harbour wind";
        let summaries = |v: &Views| {
            let (ev, trace) = prune_and_grow(&v.spaces["s"], &e, &super::super::NoModel, q, 8, 400);
            let mut ids: Vec<String> = ev.into_iter().filter(|x| x.kind == NodeKind::Summary).map(|x| x.id).collect();
            ids.sort();
            (ids, trace)
        };
        let (want, _) = summaries(&exact);
        let (got, trace) = summaries(&indexed);
        assert!(!want.is_empty() && want.iter().any(|id| id == "L2:1"), "{want:?}");
        assert!(want
            .iter()
            .all(|id| id == "L2:1" || id.strip_prefix("L1:").is_some_and(|c| c.parse::<usize>().unwrap() % 4 == 1)));
        assert_eq!(got, want, "{trace:?}");
    }
}
