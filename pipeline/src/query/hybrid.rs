//! `hybrid`: the structured modes' fused [`Relevance`] ranking over layer 0, and nothing else — no clusters, no
//! events, no walks. The question and its clauses (the planner without a model, [`super::plan`]) are each scored,
//! a node takes its best, and the best nodes are merged into passages within the word budget, exactly as `compass`
//! ranks a space without events. It is the strongest flat ranking the engine has: what `prune-and-grow` and
//! `compass` add over it is what the memory's structure adds.

use operators::{Embedder, Node};
use serde_json::json;

use super::relevance::Relevance;
use super::Evidence;
use crate::views::SpaceView;

pub fn hybrid(
    view: &SpaceView,
    embedder: &dyn Embedder,
    query: &str,
    budget_words: usize,
) -> (Vec<Evidence>, Vec<serde_json::Value>) {
    let goals = super::plan(query);
    let mut trace = vec![json!({"step": "seed", "mode": "hybrid", "subgoals": goals, "candidates": view.nodes.len(),
        "why": "the question and its clauses, each ranked by fused relevance over layer 0"})];
    let rels: Vec<Relevance> = goals.iter().map(|g| Relevance::new(view, embedder, g)).collect();
    let mut ranked: Vec<(f32, &Node, &'static str)> = super::relevance::fused(&rels)
        .into_iter()
        .filter_map(|(id, s)| Some((s, &view.nodes.get(id)?.0, "among the most relevant turns")))
        .collect();
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.id.cmp(&b.1.id)));
    let out = super::passages(view, ranked, budget_words, &mut trace);
    (out, trace)
}
