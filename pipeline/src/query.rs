//! The query engine over the views. `flat` (top-k by cosine over layer 0, the RAG baseline) is here; CAM's
//! prune-and-grow and CompassMem's planner/explorers come with the hierarchy and event-memory issues.

use serde::{Deserialize, Serialize};
use serde_json::json;

use operators::{Embedder, Node, NodeKind};

use crate::views::SpaceView;
use operators::summary::Explore;

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

/// How many distinct topics among the top events seed `compass` with their other members (CompassMem: the first p
/// topics). `ENGRAM_COMPASS_TOPICS` overrides it, for evaluation.
fn topic_seeds() -> usize {
    static SEEDS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *SEEDS.get_or_init(|| std::env::var("ENGRAM_COMPASS_TOPICS").ok().and_then(|v| v.parse().ok()).unwrap_or(2))
}

/// The most candidates shown to the model in one selection, and the most words of each.
const SELECT_MAX: usize = 30;
const PROMPT_WORDS: usize = 80;

fn clip(text: &str, words: usize) -> String {
    text.split_whitespace().take(words).collect::<Vec<_>>().join(" ")
}


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
    /// Generate an answer from the evidence (default: whenever an LLM is configured).
    #[serde(default)]
    pub answer: Option<bool>,
    /// Let the model steer retrieval — Prune-and-Grow's selection, CompassMem's Planner and Explorers (default:
    /// whenever an LLM is configured); `false` keeps the similarity rules.
    #[serde(default)]
    pub use_model: Option<bool>,
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
    /// Why no answer came back when one was asked for (the model failed or replied off-contract); the evidence
    /// stands regardless.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer_error: Option<String>,
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

/// CAM's Prune-and-Grow. Seeds: the top-k nodes of every layer (chunks and cluster summaries) by cosine. Then up to
/// 5 rounds: *prune* the candidates — with a model, to those it selects among the best [`SELECT_MAX`] by cosine;
/// without, to those within half of the best score — and *grow* the kept ones to their same-layer neighbours and
/// their children (never parents); stop when the candidate set no longer changes. Evidence: the kept nodes (the
/// seeds if none), best first, consecutive chunks of one document merged into one passage, cut to the word budget.
pub fn prune_and_grow(
    view: &SpaceView,
    embedder: &dyn Embedder,
    guide: &dyn Guide,
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
        let mut scored: Vec<(f32, &str)> =
            candidates.iter().filter_map(|id| candidate(view, id).map(|c| (score(&c), *id))).collect();
        let best = scored.iter().map(|x| x.0).fold(f32::MIN, f32::max);
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        let shown: Vec<(f32, &str)> = scored.iter().take(SELECT_MAX).copied().collect();
        let texts: Vec<String> = shown.iter().filter_map(|(_, id)| candidate(view, id).map(|c| clip(c.text, PROMPT_WORDS))).collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        kept = match guide.select(query, &refs) {
            Ok(Some(chosen)) => {
                trace.push(json!({"step": "select", "round": round, "shown": shown.len(), "chosen": chosen.len(), "why": "the model's selection"}));
                chosen.iter().filter_map(|i| shown.get(*i)).map(|x| x.1).collect()
            }
            other => {
                if let Err(e) = other {
                    trace.push(json!({"step": "model-error", "round": round, "error": e, "why": "the similarity rule instead"}));
                }
                scored.iter().filter(|x| x.0 > 0.0 && x.0 >= 0.5 * best).map(|x| x.1).collect()
            }
        };
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

/// The planner without a model: the question, and its clauses when it joins two questions ("… and …", "…? …"),
/// each of at least three words.
pub fn plan(query: &str) -> Vec<String> {
    let mut goals = vec![query.trim().to_string()];
    let parts: Vec<&str> = query
        .split(['?', ';'])
        .flat_map(|p| p.split(" and "))
        .map(str::trim)
        .filter(|p| p.split_whitespace().count() >= 3)
        .collect();
    if parts.len() > 1 {
        goals.extend(parts.into_iter().map(str::to_string));
    }
    goals
}

/// CompassMem's retrieval. *Planner*: the model's 1–5 subgoals, or without a model [`plan`]. *Explorers*: per
/// subgoal, the top-k events by the best of their summary's and their turns' cosine seed a walk along typed
/// relations (both directions, up to two hops, each hop worth 0.8 of the event it came from). With a model, the
/// seeds and then each hop's new events go to it, and it says per event *answer* (keep), *expand* (keep and walk on)
/// or *skip*; without, events within half of the best score are kept and walked on. *Responder*: every layer-0
/// node ranked by the best of its own score and 0.9 × its kept event's score — the turns of the events the walk
/// found, around and between the best turns — consecutive turns merged into passages, cut to the word budget (the
/// answer itself is generated from them by the caller). A space without events is answered as `flat`.
pub fn compass(
    view: &SpaceView,
    embedder: &dyn Embedder,
    guide: &dyn Guide,
    query: &str,
    k: usize,
    budget_words: usize,
) -> (Vec<Evidence>, Vec<serde_json::Value>) {
    use std::collections::{BTreeMap, HashMap};
    let mut trace = Vec::new();
    let goals = match guide.plan(query) {
        Ok(Some(goals)) => {
            trace.push(json!({"step": "plan", "subgoals": goals, "why": "the model's subgoals"}));
            goals
        }
        other => {
            if let Err(e) = other {
                trace.push(json!({"step": "model-error", "stage": "plan", "error": e, "why": "the question and its clauses instead"}));
            }
            let goals = plan(query);
            trace.push(json!({"step": "plan", "subgoals": goals, "why": "the question and its clauses (no model)"}));
            goals
        }
    };
    if view.events.is_empty() {
        let (e, t) = flat(view, embedder, query, k.max(10), budget_words);
        trace.push(json!({"step": "explore", "why": "no events in this space: flat retrieval"}));
        trace.extend(t);
        return (e, trace);
    }
    let qs: Vec<operators::Embedding> = goals.iter().map(|g| embedder.embed(g)).collect();
    let node_score: HashMap<&str, f32> = view
        .nodes
        .iter()
        .map(|(id, (_, e))| (id.as_str(), qs.iter().map(|q| q.dot(e)).fold(f32::MIN, f32::max)))
        .collect();
    let mut related: HashMap<&str, Vec<(&str, &str)>> = HashMap::new();
    for r in &view.relations {
        let kind = r.kind.name();
        related.entry(r.from.as_str()).or_default().push((r.to.as_str(), kind));
        related.entry(r.to.as_str()).or_default().push((r.from.as_str(), kind));
    }
    let mut reached: HashMap<&str, f32> = HashMap::new();
    for (g, q) in goals.iter().zip(&qs) {
        let score = |id: &str| -> f32 {
            let e = &view.events[id];
            let own = view.event_vectors.get(id).map_or(f32::MIN, |v| q.dot(v));
            e.turns.iter().filter_map(|t| view.nodes.get(t)).map(|(_, v)| q.dot(v)).fold(own, f32::max)
        };
        let mut ranked: Vec<(f32, &str)> = view.events.keys().map(|id| (score(id), id.as_str())).collect();
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        let best = ranked.first().map_or(0.0, |r| r.0);
        // The Explorer's choice over some events: the model's, else the rule (within half of the best: expand).
        let by_model = std::cell::Cell::new(false);
        let decide = |cands: &[(&str, f32)], trace: &mut Vec<serde_json::Value>| -> Vec<Explore> {
            let describe = |id: &str| {
                let e = &view.events[id];
                let mut d = clip(&e.summary, PROMPT_WORDS);
                if !e.people.is_empty() {
                    d.push_str(&format!(" (people: {})", e.people.join(", ")));
                }
                if let Some(t) = &e.time {
                    d.push_str(&format!(" (time: {t})"));
                }
                d
            };
            let texts: Vec<String> = cands.iter().map(|(id, _)| describe(id)).collect();
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            if !cands.is_empty() {
                match guide.explore(query, g, &refs) {
                    Ok(Some(actions)) => {
                        by_model.set(true);
                        return actions;
                    }
                    Ok(None) => {}
                    Err(e) => trace.push(json!({"step": "model-error", "stage": "explore", "error": e, "why": "the similarity rule instead"})),
                }
            }
            cands.iter().map(|(_, s)| if *s >= 0.5 * best { Explore::Expand } else { Explore::Skip }).collect()
        };
        // Seeds: the top-k events, and the other members of the first `TOPIC_SEEDS` distinct topics among them.
        let mut seeds: Vec<(&str, f32)> = ranked.iter().take(k).map(|r| (r.1, r.0)).collect();
        let mut topics: Vec<&str> = Vec::new();
        for (id, _) in &seeds {
            if let Some(t) = view.topic_of.get(*id) {
                if !topics.contains(&t.as_str()) && topics.len() < topic_seeds() {
                    topics.push(t);
                }
            }
        }
        if !topics.is_empty() {
            let have: std::collections::HashSet<&str> = seeds.iter().map(|s| s.0).collect();
            let mut more: Vec<(&str, f32)> = view
                .topic_of
                .iter()
                .filter(|(e, t)| topics.contains(&t.as_str()) && !have.contains(e.as_str()))
                .map(|(e, _)| (e.as_str(), score(e)))
                .collect();
            more.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(b.0)));
            seeds.extend(more);
        }
        let kept = decide(&seeds, &mut trace);
        let mut here: BTreeMap<&str, f32> = BTreeMap::new();
        let mut frontier: Vec<(&str, f32)> = Vec::new();
        for ((id, s), action) in seeds.iter().zip(kept) {
            if action != Explore::Skip {
                here.insert(id, *s);
            }
            if action == Explore::Expand {
                frontier.push((id, *s));
            }
        }
        let mut asked: std::collections::HashSet<&str> = seeds.iter().map(|s| s.0).collect();
        let mut walked = Vec::new();
        for _hop in 0..2 {
            // Events one relation away, each at the best of its own score and 0.8 × where it was reached from.
            let mut reach: BTreeMap<&str, (f32, &str, &str)> = BTreeMap::new();
            for (id, s) in &frontier {
                for (to, kind) in related.get(id).map(Vec::as_slice).unwrap_or(&[]) {
                    let got = score(to).max(0.8 * s);
                    if reach.get(to).is_none_or(|r| r.0 < got) {
                        reach.insert(to, (got, id, kind));
                    }
                }
            }
            // Without a model an event already kept is reconsidered when reached at a better score.
            let cands: Vec<(&str, f32)> = reach
                .iter()
                .filter(|(to, (got, _, _))| if by_model.get() { !asked.contains(*to) } else { here.get(*to).is_none_or(|old| old < got) })
                .map(|(to, (got, _, _))| (*to, *got))
                .collect();
            asked.extend(cands.iter().map(|c| c.0));
            let kept = decide(&cands, &mut trace);
            let mut next = Vec::new();
            for ((to, got), action) in cands.iter().zip(kept) {
                if action == Explore::Skip {
                    continue;
                }
                here.insert(to, *got);
                if action == Explore::Expand {
                    next.push((*to, *got));
                }
                let (_, from, kind) = reach[to];
                walked.push(json!({"from": from, "to": to, "relation": kind, "action": action}));
            }
            frontier = next;
        }
        let why = if by_model.get() { "top-k events, then typed relations, as the model chose" } else { "top-k events, then typed relations within half of the best score" };
        trace.push(json!({"step": "explore", "subgoal": g, "events": here.len(), "walked": walked, "why": why}));
        for (id, s) in here {
            let e = reached.entry(id).or_insert(f32::MIN);
            *e = e.max(s);
        }
    }
    // Rank every layer-0 node; a turn of a kept event is lifted to 0.9 × the event's score.
    let mut ranked: Vec<(f32, &Node)> = view
        .nodes
        .iter()
        .map(|(id, (n, _))| {
            let own = node_score[id.as_str()];
            let lift = view.event_of.get(id).and_then(|e| reached.get(e.as_str())).map_or(f32::MIN, |s| 0.9 * s);
            (own.max(lift), n)
        })
        .collect();
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.id.cmp(&b.1.id)));
    let mut chosen: Vec<(f32, &Node)> = Vec::new();
    let mut words = 0;
    for (s, n) in ranked {
        if words >= budget_words {
            break;
        }
        words += n.text.split_whitespace().count();
        chosen.push((s, n));
    }
    // Consecutive turns of one conversation become one passage, in rank order of their best turn.
    chosen.sort_by(|a, b| (a.1.doc.as_str(), a.1.pos).cmp(&(b.1.doc.as_str(), b.1.pos)));
    let mut passages: Vec<(f32, Vec<&Node>)> = Vec::new();
    for (s, n) in chosen {
        match passages.last_mut() {
            Some((best, run)) if run.last().is_some_and(|p| p.doc == n.doc && n.pos - p.pos <= operators::model::POSITION_SCALE) => {
                *best = best.max(s);
                run.push(n);
            }
            _ => passages.push((s, vec![n])),
        }
    }
    passages.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1[0].id.cmp(&b.1[0].id)));
    let mut out = Vec::new();
    let mut words = 0;
    for (s, run) in passages {
        if words >= budget_words {
            break;
        }
        let text = run.iter().map(|n| match &n.speaker { Some(sp) => format!("{sp}: {}", n.text), None => n.text.clone() }).collect::<Vec<_>>().join("\n");
        let ws: Vec<&str> = text.split_whitespace().collect();
        let take = ws.len().min(budget_words - words);
        words += take;
        let first = run[0];
        let mut source = source_of(first);
        source["nodes"] = json!(run.iter().map(|n| n.id.as_str()).collect::<Vec<_>>());
        source["events"] = json!(run.iter().filter_map(|n| view.event_of.get(&n.id)).collect::<std::collections::BTreeSet<_>>());
        let id = if run.len() == 1 { first.id.clone() } else { format!("{}..{}", first.id, run[run.len() - 1].id) };
        trace.push(json!({"step": "keep", "id": id, "score": s, "why": "a turn of an explored event, or among the best turns"}));
        out.push(Evidence { id, layer: 0, kind: first.kind, text: if take < ws.len() { ws[..take].join(" ") } else { text }, score: s, source });
    }
    (out, trace)
}
