//! The query engine over the views, one module per mode: [`flat`] (top-k by cosine over layer 0, the RAG baseline),
//! [`hybrid`] (the fused relevance ranking over layer 0 alone, the strongest flat baseline), [`prune_and_grow`]
//! (CAM) and [`compass`] (CompassMem). The structured modes rank layer-0 text by [`relevance`]
//! (dense and lexical evidence fused, with the names a question mentions and a turn's neighbours in the
//! conversation); each works with a model (the [`Guide`]) and without one.

mod compass;
mod flat;
mod hybrid;
mod prune_and_grow;
pub mod relevance;

pub use compass::{compass, plan, CompassParams};
pub use flat::flat;
pub use hybrid::hybrid;
pub use prune_and_grow::prune_and_grow;

use serde::{Deserialize, Serialize};
use serde_json::json;

use operators::{Node, NodeKind};

use crate::views::SpaceView;
use operators::llm::Explore;

/// The model's part in retrieval: Prune-and-Grow's selection, CompassMem's Planner and Explorers. Each method
/// returns `Ok(None)` without a model, and the similarity rule applies; an error is traced and the rule applies.
pub trait Guide {
    fn select(&self, question: &str, candidates: &[&str]) -> Result<Option<Vec<usize>>, String>;
    fn plan(&self, question: &str) -> Result<Option<Vec<String>>, String>;
    fn explore(&self, question: &str, subgoal: &str, events: &[&str]) -> Result<Option<Vec<Explore>>, String>;
}

/// Retrieval by the similarity rules alone.
pub struct NoModel;

impl Guide for NoModel {
    fn select(&self, _: &str, _: &[&str]) -> Result<Option<Vec<usize>>, String> {
        Ok(None)
    }
    fn plan(&self, _: &str) -> Result<Option<Vec<String>>, String> {
        Ok(None)
    }
    fn explore(&self, _: &str, _: &str, _: &[&str]) -> Result<Option<Vec<Explore>>, String> {
        Ok(None)
    }
}

/// The most candidates shown to the model in one selection, and the most words of each.
const SELECT_MAX: usize = 30;
const PROMPT_WORDS: usize = 80;

fn clip(text: &str, words: usize) -> String {
    text.split_whitespace().take(words).collect::<Vec<_>>().join(" ")
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Mode {
    Flat,
    Hybrid,
    PruneAndGrow,
    Compass,
}

impl Mode {
    /// The mode of a query that names none (HTTP, `engram query`, `run --ask`): the engine's best retrieval
    /// (docs/EVAL.md); `flat` is the baseline it is measured against.
    pub const DEFAULT: Mode = Mode::Compass;

    pub const fn as_str(self) -> &'static str {
        match self {
            Mode::Flat => "flat",
            Mode::Hybrid => "hybrid",
            Mode::PruneAndGrow => "prune-and-grow",
            Mode::Compass => "compass",
        }
    }
}

#[derive(Clone, Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QueryRequest {
    pub query: String,
    #[serde(default = "default_mode")]
    pub mode: Mode,
    pub budget_words: Option<usize>,
    pub k: Option<usize>,
    /// Generate an answer from the evidence (default: whenever an LLM is configured).
    #[serde(default)]
    pub answer: Option<bool>,
    /// Let the model steer retrieval — Prune-and-Grow's selection, CompassMem's Planner and Explorers (default:
    /// whenever an LLM is configured); `false` keeps the similarity rules.
    #[serde(default)]
    pub use_model: Option<bool>,
}

fn default_mode() -> Mode {
    Mode::DEFAULT
}

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct Evidence {
    /// A node id, or `first..last` for a passage of consecutive nodes.
    pub id: String,
    pub layer: u32,
    /// chunk | turn | summary
    #[schema(value_type = String)]
    pub kind: NodeKind,
    pub text: String,
    pub score: f32,
    /// `{"doc","position","speaker","ts"}`, and `nodes` / `events` for passages.
    #[schema(value_type = Object)]
    pub source: serde_json::Value,
}

#[derive(Clone, Debug, Serialize, utoipa::ToSchema)]
pub struct QueryResponse {
    pub evidence: Vec<Evidence>,
    pub answer: Option<String>,
    /// Why no answer came back when one was asked for (the model failed or replied off-contract); the evidence
    /// stands regardless.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer_error: Option<String>,
    pub as_of: Option<u64>,
    /// The retrieval's steps: seeds, rounds, walks, and why each node was kept.
    #[schema(value_type = Vec<Object>)]
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

/// A layer-0 node as evidence reads it: a turn with its speaker's name.
fn evidence_text(n: &Node) -> String {
    match &n.speaker {
        Some(sp) => format!("{sp}: {}", n.text),
        None => n.text.to_string(),
    }
}

/// The words of [`evidence_text`], without building it.
fn evidence_words(n: &Node) -> usize {
    n.speaker.as_deref().map_or(0, |sp| sp.split_whitespace().count()) + n.text.split_whitespace().count()
}

/// The Responder's reading: layer-0 nodes taken in rank order until the word budget is spent (a turn counts with
/// its speaker's name), then consecutive ones of one document merged into one passage, best passage first, the last
/// cut at the budget. `why` says, per node, why it was taken (for the trace).
fn passages<'a>(
    view: &'a SpaceView,
    ranked: impl IntoIterator<Item = (f32, &'a Node, &'static str)>,
    budget_words: usize,
    trace: &mut Vec<serde_json::Value>,
) -> Vec<Evidence> {
    let mut chosen: Vec<(f32, &Node, &str)> = Vec::new();
    let mut words = 0;
    for (s, n, why) in ranked {
        if words >= budget_words {
            break;
        }
        words += evidence_words(n);
        chosen.push((s, n, why));
    }
    chosen.sort_by(|a, b| (a.1.doc.as_str(), a.1.pos).cmp(&(b.1.doc.as_str(), b.1.pos)));
    let mut runs: Vec<(f32, Vec<(&Node, &str)>)> = Vec::new();
    for (s, n, why) in chosen {
        match runs.last_mut() {
            Some((best, run))
                if run
                    .last()
                    .is_some_and(|(p, _)| p.doc == n.doc && n.pos - p.pos <= operators::model::POSITION_SCALE) =>
            {
                *best = best.max(s);
                run.push((n, why));
            }
            _ => runs.push((s, vec![(n, why)])),
        }
    }
    runs.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1[0].0.id.cmp(&b.1[0].0.id)));
    let mut out = Vec::new();
    let mut words = 0;
    for (s, run) in runs {
        if words >= budget_words {
            break;
        }
        let text = run.iter().map(|(n, _)| evidence_text(n)).collect::<Vec<_>>().join("\n");
        let ws: Vec<&str> = text.split_whitespace().collect();
        let take = ws.len().min(budget_words - words);
        words += take;
        let first = run[0].0;
        let mut source = source_of(first);
        source["nodes"] = json!(run.iter().map(|(n, _)| n.id.as_str()).collect::<Vec<_>>());
        let events: std::collections::BTreeSet<&String> =
            run.iter().filter_map(|(n, _)| view.event_of.get(n.id.as_str())).collect();
        if !events.is_empty() {
            source["events"] = json!(events);
        }
        let id =
            if run.len() == 1 { first.id.to_string() } else { format!("{}..{}", first.id, run[run.len() - 1].0.id) };
        let why: std::collections::BTreeSet<&str> = run.iter().map(|r| r.1).collect();
        trace.push(json!({"step": "keep", "id": id, "score": s, "why": why}));
        out.push(Evidence {
            id,
            layer: 0,
            kind: first.kind,
            text: if take < ws.len() { ws[..take].join(" ") } else { text },
            score: s,
            source,
        });
    }
    out
}
