//! Queries, as a service every door calls (HTTP, `run --ask`, `eval`): validates a request, retrieves from the
//! current views in the requested mode, and has the model answer when one is configured. Errors are typed; each
//! door maps them to its own form (HTTP: a status and `{"error":{"code","message"}}`).

use std::collections::HashMap;
use std::time::Instant;

use operators::{Embedder, Embedding};

use crate::engine::{ModelGuide, Shared};
use crate::query::{self, Guide, Mode, QueryRequest, QueryResponse};
use crate::views::SpaceView;

/// Why a query was not answered.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The caller's request is invalid; retrying it unchanged cannot help.
    #[error("{0}")]
    BadRequest(String),
    /// The space has no records.
    #[error("no space `{0}`")]
    UnknownSpace(String),
}

impl QueryError {
    /// A stable code for the error (HTTP's `error.code`).
    pub fn code(&self) -> &'static str {
        match self {
            QueryError::BadRequest(_) => "bad_request",
            QueryError::UnknownSpace(_) => "unknown_space",
        }
    }
}

/// Checks a request's values against the limits, with the config's defaults for what it leaves out.
pub fn validate(s: &Shared, req: &QueryRequest) -> Result<(), QueryError> {
    if req.query.trim().is_empty() {
        return Err(QueryError::BadRequest("`query` must not be empty".into()));
    }
    let (chars, max) = (req.query.chars().count(), s.config.query.max_query_chars);
    if chars > max {
        return Err(QueryError::BadRequest(format!(
            "`query` has {chars} characters, more than query.max-query-chars = {max}"
        )));
    }
    let k = req.k.unwrap_or(s.config.query.default_k);
    let budget = req.budget_words.unwrap_or(s.config.query.default_budget_words);
    let q = &s.config.query;
    if !(1..=q.max_k).contains(&k) {
        return Err(QueryError::BadRequest(format!("`k` = {k} must be in 1..=query.max-k = {}", q.max_k)));
    }
    if !(1..=q.max_budget_words).contains(&budget) {
        return Err(QueryError::BadRequest(format!(
            "`budget_words` = {budget} must be in 1..=query.max-budget-words = {}",
            q.max_budget_words
        )));
    }
    let subgoals = query::plan(&req.query).len();
    if subgoals > q.max_subgoals {
        return Err(QueryError::BadRequest(format!(
            "`query` splits into {subgoals} subgoals, more than query.max-subgoals = {}",
            q.max_subgoals
        )));
    }
    Ok(())
}

/// Retrieves in `mode` over one space's view, steered by `guide`.
fn retrieve(
    s: &Shared,
    e: &dyn Embedder,
    view: &SpaceView,
    guide: &dyn Guide,
    req: &QueryRequest,
    k: usize,
    budget: usize,
) -> (Vec<query::Evidence>, Vec<serde_json::Value>) {
    let q = req.query.as_str();
    match req.mode {
        Mode::PruneAndGrow => query::prune_and_grow(view, e, guide, q, k, budget),
        Mode::Compass => query::compass(view, e, guide, q, k, budget, &s.config.query.compass()),
        Mode::Flat => query::flat(view, e, q, k, budget),
        Mode::Hybrid => query::hybrid(view, e, q, budget),
    }
}

/// The embedder a query without a model retrieves with: the texts it will embed (the question, and the planner's
/// subgoals) are embedded when it is made; anything else is asked of the real one.
struct Prepared<'a> {
    inner: &'a dyn Embedder,
    ready: HashMap<String, Embedding>,
}

impl<'a> Prepared<'a> {
    fn new(inner: &'a dyn Embedder, question: &str) -> Self {
        let mut ready = HashMap::new();
        for text in std::iter::once(question.to_string()).chain(query::plan(question)) {
            if let std::collections::hash_map::Entry::Vacant(slot) = ready.entry(text) {
                let e = inner.embed(slot.key());
                slot.insert(e);
            }
        }
        Prepared { inner, ready }
    }
}

impl Embedder for Prepared<'_> {
    fn dim(&self) -> usize {
        self.inner.dim()
    }

    fn embed_batch(&self, texts: &[&str]) -> Vec<Embedding> {
        texts.iter().map(|t| self.ready.get(*t).cloned().unwrap_or_else(|| self.inner.embed(t))).collect()
    }

    fn bit_exact(&self) -> bool {
        self.inner.bit_exact()
    }
}

/// Answers a query from the current views (blocking: call it off the async runtime).
pub fn execute(s: &Shared, space: &str, req: &QueryRequest) -> Result<QueryResponse, QueryError> {
    validate(s, req)?;
    let k = req.k.unwrap_or(s.config.query.default_k);
    let budget = req.budget_words.unwrap_or(s.config.query.default_budget_words);
    let started = Instant::now();
    let has_model = s.has_model();
    let guided = !matches!(req.mode, Mode::Flat | Mode::Hybrid) && req.use_model.unwrap_or(has_model);
    let unknown = || QueryError::UnknownSpace(space.to_string());
    let (evidence, trace, as_of) = if guided {
        // The model takes seconds: retrieve from a copy of the space, so the views (and the dataflow that writes
        // them) are never held while it thinks.
        let (view, as_of) = {
            let views = s.views();
            (views.spaces.get(space).ok_or_else(unknown)?.clone(), views.as_of)
        };
        let guide = ModelGuide { shared: s, space };
        let (evidence, trace) = retrieve(s, s.embedder.as_ref(), &view, &guide, req, k, budget);
        (evidence, trace, as_of)
    } else {
        // The question and the planner's subgoals are embedded before the views are locked: a slow embedding
        // endpoint holds up neither the dataflow's writer nor other queries.
        let prepared = Prepared::new(s.embedder.as_ref(), &req.query);
        let views = s.views();
        let view = views.spaces.get(space).ok_or_else(unknown)?;
        let (evidence, trace) = retrieve(s, &prepared, view, &query::NoModel, req, k, budget);
        (evidence, trace, views.as_of)
    };
    s.metrics.query_duration.with_label_values(&[req.mode.as_str()]).observe(started.elapsed().as_secs_f64());
    // The Responder: a short answer from the evidence, with the views unlocked while the model thinks.
    let wanted = req.answer.unwrap_or(has_model);
    let (mut answer, mut answer_error) = (None, None);
    if wanted && !evidence.is_empty() {
        let texts: Vec<&str> = evidence.iter().map(|e| e.text.as_str()).collect();
        match s.answer(space, &req.query, &texts) {
            Ok(a) => answer = a,
            Err(e) => answer_error = Some(e.to_string()),
        }
    }
    Ok(QueryResponse { evidence, answer, answer_error, as_of, trace })
}
