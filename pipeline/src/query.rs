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
