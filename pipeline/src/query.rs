//! The query engine over the views. `flat` (top-k by cosine over layer 0, the RAG baseline) is here; CAM's
//! prune-and-grow and CompassMem's planner/explorers come with the hierarchy and event-memory issues.

use serde::{Deserialize, Serialize};
use serde_json::json;

use operators::{Embedder, Node, NodeKind};

use crate::views::SpaceView;


#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    Flat,
    PruneAndGrow,
    Compass,
}

impl Mode {
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Flat => "flat",
            Mode::PruneAndGrow => "prune-and-grow",
            Mode::Compass => "compass",
        }
    }
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueryRequest {
    pub query: String,
    #[serde(default = "default_mode")]
    pub mode: Mode,
    pub budget_words: Option<usize>,
    pub k: Option<usize>,
}

fn default_mode() -> Mode {
    Mode::Flat
}

#[derive(Clone, Debug, Serialize)]
pub struct Evidence {
    pub id: String,
    pub layer: u32,
    pub kind: NodeKind,
    pub text: String,
    pub score: f32,
    pub source: serde_json::Value,
}

#[derive(Clone, Debug, Serialize)]
pub struct QueryResponse {
    pub evidence: Vec<Evidence>,
    pub answer: Option<String>,
    pub as_of: Option<u64>,
    pub trace: Vec<serde_json::Value>,
}

pub fn source_of(node: &Node) -> serde_json::Value {
    json!({
        "doc": node.doc,
        "position": node.pos as f64 / operators::model::POSITION_SCALE as f64,
        "speaker": node.speaker,
        "ts": node.ts,
    })
}

/// Top-k layer-0 nodes by cosine, then cut to the word budget (the last piece truncated at a word boundary).
pub fn flat(view: &SpaceView, embedder: &dyn Embedder, query: &str, k: usize, budget_words: usize) -> (Vec<Evidence>, Vec<serde_json::Value>) {
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

/// A node of any layer as retrieval sees it: layer-0 chunks and turns, and clusters with a summary.
struct Candidate<'a> {
    id: &'a str,
    layer: u32,
    text: &'a str,
    emb: &'a operators::Embedding,
    node: Option<&'a Node>,
}

fn candidate<'a>(view: &'a SpaceView, id: &'a str) -> Option<Candidate<'a>> {
    if let Some((n, e)) = view.nodes.get(id) {
        return Some(Candidate { id, layer: 0, text: &n.text, emb: e, node: Some(n) });
    }
    let c = view.clusters.get(id)?;
    let (text, emb) = c.summary.as_ref()?;
    Some(Candidate { id, layer: c.layer, text, emb, node: None })
}

/// CAM's Prune-and-Grow without an LLM. Seeds: the top-k nodes of every layer (chunks and cluster summaries) by
/// cosine. Then up to 5 rounds: *prune* the candidates to those within half of the best score (the similarity rule
/// standing in for the LLM's choice), *grow* the kept ones to their same-layer neighbours and their children (never
/// parents); stop when the candidate set no longer changes. Evidence: the kept nodes (the seeds if none), best
/// first, consecutive chunks of one document merged into one passage, cut to the word budget.
pub fn prune_and_grow(
    view: &SpaceView,
    embedder: &dyn Embedder,
    query: &str,
    k: usize,
    budget_words: usize,
) -> (Vec<Evidence>, Vec<serde_json::Value>) {
    use std::collections::{BTreeMap, BTreeSet};
    let q = embedder.embed(query);
    let score = |c: &Candidate| q.dot(c.emb);
    let mut all: Vec<(f32, &str)> = view.nodes.keys().map(String::as_str).chain(view.clusters.keys().map(String::as_str))
        .filter_map(|id| candidate(view, id).map(|c| (score(&c), id)))
        .collect();
    all.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
    let seeds: BTreeSet<&str> = all.iter().take(k).map(|x| x.1).collect();
    let mut trace = vec![json!({"step": "seed", "mode": "prune-and-grow", "seeds": seeds, "why": "top-k over all layers by cosine"})];
    let mut candidates = seeds.clone();
    let mut kept: BTreeSet<&str> = BTreeSet::new();
    for round in 1..=5 {
        let scored: Vec<(f32, &str)> =
            candidates.iter().filter_map(|id| candidate(view, id).map(|c| (score(&c), *id))).collect();
        let best = scored.iter().map(|x| x.0).fold(f32::MIN, f32::max);
        kept = scored.iter().filter(|x| x.0 > 0.0 && x.0 >= 0.5 * best).map(|x| x.1).collect();
        let mut grown = kept.clone();
        for id in &kept {
            if let Some(nbrs) = view.adjacency.get(*id) {
                grown.extend(nbrs.keys().map(String::as_str));
            }
            if let Some(c) = view.clusters.get(*id) {
                grown.extend(c.members.iter().map(String::as_str));
            }
        }
        trace.push(json!({"step": "round", "round": round, "kept": kept, "grown": grown.len() - kept.len(),
                          "why": "kept: within half of the best score; grown: same-layer neighbours and children"}));
        if grown == candidates {
            break;
        }
        candidates = grown;
    }
    if kept.is_empty() {
        kept = seeds;
    }
    // Consecutive layer-0 chunks of one document become one passage.
    let mut by_doc: BTreeMap<(&str, i64), (f32, &Node)> = BTreeMap::new();
    let mut items: Vec<(f32, Evidence)> = Vec::new();
    for id in &kept {
        let Some(c) = candidate(view, id) else { continue };
        let s = score(&c);
        match c.node {
            Some(n) => {
                by_doc.insert((n.doc.as_str(), n.pos), (s, n));
            }
            None => items.push((s, Evidence {
                id: c.id.to_string(), layer: c.layer, kind: NodeKind::Summary, text: c.text.to_string(), score: s,
                source: json!({"cluster": c.id, "children": view.clusters.get(c.id).map(|x| x.members.len())}),
            })),
        }
    }
    let mut run: Vec<(f32, &Node)> = Vec::new();
    let flush = |run: &mut Vec<(f32, &Node)>, items: &mut Vec<(f32, Evidence)>| {
        if run.is_empty() {
            return;
        }
        let best = run.iter().map(|r| r.0).fold(f32::MIN, f32::max);
        let first = run[0].1;
        let text = run.iter().map(|r| r.1.text.as_str()).collect::<Vec<_>>().join("\n\n");
        let id = if run.len() == 1 { first.id.clone() } else { format!("{}..{}", first.id, run[run.len() - 1].1.id) };
        let mut source = source_of(first);
        source["nodes"] = json!(run.iter().map(|r| r.1.id.as_str()).collect::<Vec<_>>());
        items.push((best, Evidence { id, layer: 0, kind: first.kind, text, score: best, source }));
        run.clear();
    };
    for ((doc, pos), (s, n)) in by_doc {
        let consecutive = run.last().is_some_and(|(_, p)| p.doc == doc && pos - p.pos <= operators::model::POSITION_SCALE);
        if !consecutive {
            flush(&mut run, &mut items);
        }
        run.push((s, n));
    }
    flush(&mut run, &mut items);
    // The source text first, best first; summaries (navigation, not evidence of their own) fill what budget is left.
    items.sort_by(|a, b| (a.1.layer > 0).cmp(&(b.1.layer > 0)).then(b.0.total_cmp(&a.0)).then_with(|| a.1.id.cmp(&b.1.id)));
    let mut out = Vec::new();
    let mut words = 0;
    for (_, mut e) in items {
        if words >= budget_words {
            trace.push(json!({"step": "budget", "dropped": e.id, "why": "word budget spent"}));
            continue;
        }
        let ws: Vec<&str> = e.text.split_whitespace().collect();
        let take = ws.len().min(budget_words - words);
        if take < ws.len() {
            e.text = ws[..take].join(" ");
        }
        words += take;
        trace.push(json!({"step": "keep", "id": e.id, "layer": e.layer, "score": e.score, "why": "selected by prune-and-grow"}));
        out.push(e);
    }
    (out, trace)
}
