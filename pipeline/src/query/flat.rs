//! `flat`: top-k layer-0 nodes by cosine — the RAG baseline every other mode is measured against.

use serde_json::json;

use operators::{Embedder, Node};

use super::{source_of, Evidence};
use crate::views::SpaceView;

/// Top-k layer-0 nodes by cosine, then cut to the word budget (the last piece truncated at a word boundary).
pub fn flat(
    view: &SpaceView,
    embedder: &dyn Embedder,
    query: &str,
    k: usize,
    budget_words: usize,
) -> (Vec<Evidence>, Vec<serde_json::Value>) {
    let q = embedder.embed(query);
    let order = |a: &(f32, &Node), b: &(f32, &Node)| b.0.total_cmp(&a.0).then_with(|| a.1.id.cmp(&b.1.id));
    // An indexed space is read through its nearest-neighbour index; a smaller one exactly.
    let mut scored: Vec<(f32, &Node)> = match view.ann.as_ref() {
        Some(ann) => ann.search(&q, k).into_iter().filter_map(|(s, id)| Some((s, &view.nodes.get(id)?.0))).collect(),
        None => view.nodes.values().map(|(n, e)| (q.dot(e), n)).collect(),
    };
    if scored.len() > k && k > 0 {
        scored.select_nth_unstable_by(k - 1, order);
    }
    scored.truncate(k);
    scored.sort_by(order);
    let how = if view.ann.is_some() { "nearest-neighbour index" } else { "every node" };
    let mut trace = vec![json!({"step": "seed", "mode": "flat", "k": k, "candidates": view.nodes.len(), "read": how})];
    let mut out = Vec::new();
    let mut words = 0;
    for (score, node) in scored {
        if words >= budget_words {
            trace.push(json!({"step": "budget", "dropped": node.id, "why": "word budget spent"}));
            continue;
        }
        let text: Vec<&str> = node.text.split_whitespace().collect();
        let take = text.len().min(budget_words - words);
        words += take;
        let text = if take == text.len() { node.text.to_string() } else { text[..take].join(" ") };
        trace.push(json!({"step": "keep", "id": node.id, "score": score, "why": "top-k by cosine"}));
        out.push(Evidence { id: node.id.to_string(), layer: 0, kind: node.kind, text, score, source: source_of(node) });
    }
    (out, trace)
}
