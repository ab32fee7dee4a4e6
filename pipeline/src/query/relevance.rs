//! How relevant a piece of the memory is to a question, for the structured modes (`flat` stays plain cosine: it is
//! the baseline). Three kinds of evidence, fused:
//!
//! - **dense**: the cosine of the question's and the text's embeddings, divided by the best cosine in the space;
//! - **lexical**: BM25 over stemmed terms ([`operators::lexical`]), divided by the best BM25 — names, rare nouns and
//!   inflections that an embedding blurs;
//! - **named**: a turn whose speaker the question names gains [`NAME_WEIGHT`] ("What did Caroline research?" is
//!   answered by what Caroline said, and her name is not in her own words; the name leaves the lexical query, where
//!   it would find the other speaker addressing her).
//!
//! A layer-0 node is then read in its **context**: it scores at least [`CONTEXT`] × the score of its neighbour in the
//! document (the turn before or after it, the chunk beside it) — an answer follows its question.

use std::collections::{HashMap, HashSet};

use operators::{Embedder, Embedding, Node};

use crate::views::SpaceView;

/// The weight of the normalised BM25 score against the normalised cosine (1).
pub const LEXICAL_WEIGHT: f32 = 1.0;
/// What a turn gains when the question names its speaker.
pub const NAME_WEIGHT: f32 = 0.3;
/// The share of a neighbour's score that a layer-0 node inherits.
pub const CONTEXT: f32 = 0.6;

pub struct Relevance<'a> {
    pub query: Embedding,
    /// The question's lexical terms (stemmed; named speakers left out).
    terms: Vec<String>,
    max_dense: f32,
    max_lexical: f32,
    /// Layer-0 node → its score in context.
    scores: HashMap<&'a str, f32>,
    /// The speakers the question names.
    pub names: Vec<&'a str>,
}

/// A positive normaliser: the best score, or 1 when nothing scored above 0.
fn norm(best: f32) -> f32 {
    if best > 1e-6 { best } else { 1.0 }
}

impl<'a> Relevance<'a> {
    pub fn new(view: &'a SpaceView, embedder: &dyn Embedder, question: &str) -> Self {
        Self::with_embedding(view, embedder.embed(question), question)
    }

    pub fn with_embedding(view: &'a SpaceView, query: Embedding, question: &str) -> Self {
        let dense: HashMap<&'a str, f32> = view.nodes.iter().map(|(id, (_, e))| (id.as_str(), query.dot(e))).collect();
        let asked: HashSet<String> = operators::embed::words(question).into_iter().collect();
        let mut speakers: Vec<&'a str> = view.nodes.values().filter_map(|(n, _)| n.speaker.as_deref()).collect::<HashSet<_>>().into_iter().collect();
        speakers.sort_unstable();
        let names: Vec<&'a str> = speakers
            .into_iter()
            .filter(|s| {
                let ws = operators::embed::words(s);
                !ws.is_empty() && ws.iter().all(|w| asked.contains(w))
            })
            .collect();
        // A named speaker counts through the turns they said, not through the turns that say their name (mostly
        // the other speaker, addressing them): the names leave the lexical query.
        let named_terms: HashSet<String> = names.iter().flat_map(|n| operators::lexical::terms(n)).collect();
        let terms: Vec<String> = operators::lexical::terms(question).into_iter().filter(|t| !named_terms.contains(t)).collect();
        let lexical = view.lexical.search_terms(&terms);
        let max_dense = norm(dense.values().copied().fold(0.0, f32::max));
        let max_lexical = norm(lexical.values().copied().fold(0.0, f32::max));
        let own: HashMap<&'a str, f32> = view
            .nodes
            .iter()
            .map(|(id, (n, _))| {
                let named = n.speaker.as_deref().is_some_and(|s| names.contains(&s));
                let s = dense[id.as_str()] / max_dense
                    + LEXICAL_WEIGHT * lexical.get(id.as_str()).copied().unwrap_or(0.0) / max_lexical
                    + if named { NAME_WEIGHT } else { 0.0 };
                (id.as_str(), s)
            })
            .collect();
        let scores = view
            .nodes
            .iter()
            .map(|(id, (n, _))| {
                let mine = own[id.as_str()];
                let ctx = neighbours(view, n).filter_map(|m| own.get(m)).copied().fold(f32::MIN, f32::max);
                (id.as_str(), mine.max(CONTEXT * ctx))
            })
            .collect();
        Relevance { query, terms, max_dense, max_lexical, scores, names }
    }

    /// A layer-0 node's score in context (`None` for an id that is not a live node).
    pub fn of(&self, id: &str) -> Option<f32> {
        self.scores.get(id).copied()
    }

    /// A cluster by its summary (`None` before it has one): the summary's cosine and its BM25 against layer 0's
    /// statistics, normalised as layer 0's are.
    pub fn cluster(&self, view: &SpaceView, c: &crate::views::ClusterView) -> Option<f32> {
        let (_, emb) = c.summary.as_ref()?;
        Some(self.query.dot(emb) / self.max_dense + LEXICAL_WEIGHT * view.lexical.score_counts(&self.terms, &c.summary_terms) / self.max_lexical)
    }

    /// An embedding alone (no text to match), normalised as layer 0's cosines are.
    pub fn dense(&self, emb: &Embedding) -> f32 {
        self.query.dot(emb) / self.max_dense
    }

    /// Every layer-0 node, best first (ties by id).
    pub fn ranked(&self, view: &'a SpaceView) -> Vec<(f32, &'a Node)> {
        let mut out: Vec<(f32, &'a Node)> = view.nodes.iter().map(|(id, (n, _))| (self.scores[id.as_str()], n)).collect();
        out.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.id.cmp(&b.1.id)));
        out
    }
}

/// The nodes just before and after a node in its document (one position step away at most: sessions and sections
/// that the positions keep apart stay apart).
pub fn neighbours<'a>(view: &'a SpaceView, n: &Node) -> impl Iterator<Item = &'a str> {
    let step = operators::model::POSITION_SCALE;
    let order = view.order.get(&n.doc);
    let before = order.and_then(|o| o.range(..n.pos).next_back()).filter(|(p, _)| n.pos - **p <= step);
    let after = order.and_then(|o| o.range(n.pos + 1..).next()).filter(|(p, _)| **p - n.pos <= step);
    before.into_iter().chain(after).map(|(_, id)| id.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::views::{ViewUpdate, Views};
    use operators::{HashEmbedder, NodeKind};

    fn views(turns: &[(&str, &str, &str)]) -> (Views, HashEmbedder) {
        let e = HashEmbedder::default();
        let mut v = Views::default();
        let updates = turns
            .iter()
            .map(|(id, speaker, text)| {
                let node = Node {
                    id: format!("c#{id}"),
                    kind: NodeKind::Turn,
                    doc: "c".into(),
                    pos: operators::ingest::turn_position(id) * operators::model::POSITION_SCALE,
                    text: text.to_string(),
                    speaker: Some(speaker.to_string()),
                    ts: None,
                };
                let emb = e.embed(&node.embedding_text());
                (ViewUpdate::Node("s".into(), node, emb), 1)
            })
            .collect();
        v.apply(updates);
        (v, e)
    }

    const TURNS: &[(&str, &str, &str)] = &[
        ("D1:1", "Ana", "How was the weekend?"),
        ("D1:2", "Ben", "Great, I painted a sunset over the lake."),
        ("D1:3", "Ana", "I went to a pottery class and made a bowl."),
        ("D1:4", "Ben", "Nice. What colour is it?"),
        ("D1:5", "Ana", "Blue, with white spots."),
        ("D2:1", "Ben", "Morning! Any plans for the holidays?"),
    ];

    #[test]
    fn inflections_match_and_the_named_speaker_ranks_up() {
        let (v, e) = views(TURNS);
        let view = &v.spaces["s"];
        let r = Relevance::new(view, &e, "What did Ben paint?");
        assert_eq!(r.names, vec!["Ben"]);
        assert_eq!(r.ranked(view)[0].1.id, "c#D1:2", "'paint' matches 'painted' by its stem");
        // A turn by the named speaker beats the same words by another.
        let r = Relevance::new(view, &e, "What did Ana say about plans?");
        let (ben, ana) = (r.of("c#D2:1").unwrap(), r.of("c#D1:1").unwrap());
        assert!(ben > ana, "{ben} {ana}");
        let r = Relevance::new(view, &e, "What did Ben say about plans?");
        assert!(r.of("c#D2:1").unwrap() - r.of("c#D1:1").unwrap() >= NAME_WEIGHT * 0.99);
    }

    #[test]
    fn an_answer_inherits_from_its_question_but_not_across_sessions() {
        let (v, e) = views(TURNS);
        let view = &v.spaces["s"];
        let r = Relevance::new(view, &e, "What colour is the bowl?");
        // "Blue, with white spots." shares no word with the question: its score is its neighbour's share.
        let (q, a) = (r.of("c#D1:4").unwrap(), r.of("c#D1:5").unwrap());
        assert!(a >= CONTEXT * q - 1e-6 && a > 0.0, "{q} {a}");
        // D2:1 is the next turn in the document but in another session: no inheritance from D1:5.
        let n: Vec<&str> = neighbours(view, &view.nodes["c#D1:5"].0).collect();
        assert_eq!(n, vec!["c#D1:4"]);
        // A removed turn leaves the lexical index and the document order.
        let mut v = v;
        let (node, emb) = v.spaces["s"].nodes["c#D1:4"].clone();
        v.apply(vec![(ViewUpdate::Node("s".into(), node, emb), -1)]);
        let view = &v.spaces["s"];
        assert!(neighbours(view, &view.nodes["c#D1:5"].0).next().is_none());
        assert!(view.lexical.search("colour").is_empty());
    }
}
