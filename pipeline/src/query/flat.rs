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
    let mut scored: Vec<(f32, &Node)> = view.nodes.values().map(|(n, e)| (q.dot(e), n)).collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.id.cmp(&b.1.id)));
    scored.truncate(k);
    let mut trace = vec![json!({"step": "seed", "mode": "flat", "k": k, "candidates": view.nodes.len()})];
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
        let text = if take == text.len() { node.text.clone() } else { text[..take].join(" ") };
        trace.push(json!({"step": "keep", "id": node.id, "score": score, "why": "top-k by cosine"}));
        out.push(Evidence { id: node.id.clone(), layer: 0, kind: node.kind, text, score, source: source_of(node) });
    }
    (out, trace)
}
