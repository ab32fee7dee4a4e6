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
//! A layer-0 node is read in its **context**, three times: its cosine is mixed ([`PREVIOUS`]) with the cosine of it
//! and the node before it read as one text (the normalised sum of their embeddings: "Yes, two weekends ago" means
//! something after "Did you go camping?"); its *segment* (the run of the document whose positions follow one
//! another: a session of a conversation, a section, a whole article) counts — a node falls [`SEGMENT`] × the gap
//! between its segment's best score and the best segment's, for where one turn answers, the rest of the answer is
//! likeliest; and it scores at least [`CONTEXT`] × the score of its neighbour in the document (the turn before or
//! after it, the chunk beside it) — an answer follows its question.

use std::collections::{BTreeMap, HashMap, HashSet};

use operators::{Embedder, Embedding, Node};

use crate::views::SpaceView;

/// The weight of the normalised BM25 score against the normalised cosine (1).
pub const LEXICAL_WEIGHT: f32 = 1.0;
/// What a turn gains when the question names its speaker.
pub const NAME_WEIGHT: f32 = 0.3;
/// The share of a neighbour's score that a layer-0 node inherits.
pub const CONTEXT: f32 = 0.6;
/// The weight of a layer-0 node's cosine read together with the node before it, against its own cosine (a turn is
/// often an answer to the one before it; docs/EVAL.md has what it adds).
pub const PREVIOUS: f32 = 0.5;
/// The share of the gap between its segment's best score and the best segment's that a node loses (the answer's
/// session holds more of it; docs/EVAL.md has what it adds).
pub const SEGMENT: f32 = 0.5;

pub struct Relevance<'a> {
    pub query: Embedding,
    /// The question's lexical terms (stemmed; named speakers left out), analysed against the space's index.
    terms: operators::lexical::LexicalQuery,
    max_dense: f32,
    max_lexical: f32,
    /// The best segment's best score (before the context lift): how well the question is answered at all.
    pub top: f32,
    /// Every layer-0 node (id, node), each document's in position order; `dense` and `scores` follow it.
    nodes: Vec<(&'a str, &'a Node)>,
    /// Layer-0 node → its index in `nodes`.
    index: operators::fasthash::HashMap<&'a str, usize>,
    /// Each node's cosine in context.
    dense: Vec<f32>,
    /// Each node's score in context.
    scores: Vec<f32>,
    /// The speakers the question names.
    pub names: Vec<&'a str>,
    /// Only candidates were scored ([`Self::partial`]).
    partial: bool,
}

/// An indexed space's candidates, grouped by document in position order: the `ann.candidates()` nearest nodes by
/// cosine, the as many best by BM25, and the nodes just before and after each in its document (its context, and the
/// node its cosine is read together with).
fn candidates<'a>(
    view: &'a SpaceView,
    ann: &'a crate::ann::NodeAnn,
    query: &Embedding,
    lexical: &operators::fasthash::HashMap<&'a str, f32>,
) -> Vec<Vec<(i64, &'a operators::Name)>> {
    let c = ann.candidates();
    let mut by_bm25: Vec<(f32, &str)> = lexical.iter().map(|(id, s)| (*s, *id)).collect();
    if by_bm25.len() > c {
        by_bm25.select_nth_unstable_by(c, |a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        by_bm25.truncate(c);
    }
    let hits = ann.search(query, c).into_iter().chain(by_bm25).map(|(_, id)| id);
    let mut docs: HashMap<&'a str, BTreeMap<i64, &'a operators::Name>> = HashMap::new();
    for id in hits {
        let Some((n, _)) = view.nodes.get(id) else { continue };
        let Some(order) = view.order.get(&n.doc) else { continue };
        let doc = docs.entry(n.doc.as_str()).or_default();
        let around = order.range(..n.pos).next_back().into_iter().chain(order.range(n.pos..).take(2));
        for (p, id) in around {
            doc.insert(*p, id);
        }
    }
    let mut out: Vec<(&str, Vec<(i64, &operators::Name)>)> =
        docs.into_iter().map(|(d, o)| (d, o.into_iter().collect())).collect();
    out.sort_by(|a, b| a.0.cmp(b.0));
    out.into_iter().map(|(_, o)| o).collect()
}

/// A positive normaliser: the best score, or 1 when nothing scored above 0.
fn norm(best: f32) -> f32 {
    if best > 1e-6 {
        best
    } else {
        1.0
    }
}

impl<'a> Relevance<'a> {
    pub fn new(view: &'a SpaceView, embedder: &dyn Embedder, question: &str) -> Self {
        Self::with_embedding(view, embedder.embed(question), question)
    }

    pub fn with_embedding(view: &'a SpaceView, query: Embedding, question: &str) -> Self {
        let asked: HashSet<String> = operators::embed::words(question).into_iter().collect();
        let names: Vec<&'a str> = view
            .speakers
            .keys()
            .map(operators::Name::as_str)
            .filter(|s| {
                let ws = operators::embed::words(s);
                !ws.is_empty() && ws.iter().all(|w| asked.contains(w))
            })
            .collect();
        // A named speaker counts through the turns they said, not through the turns that say their name (mostly
        // the other speaker, addressing them): the names leave the lexical query.
        let named_terms: HashSet<String> = names.iter().flat_map(|n| operators::lexical::terms(n)).collect();
        let terms: Vec<String> =
            operators::lexical::terms(question).into_iter().filter(|t| !named_terms.contains(t)).collect();
        let terms = view.lexical.query(&terms);
        let lexical = view.lexical.search_query(&terms);
        // Every layer-0 node once, each document in position order and cut into segments (runs of positions one step
        // apart), so that context is a neighbour in a vector, not a lookup; a node the order does not hold (a
        // position two nodes claim) is a segment of its own. Over an indexed space, only the candidates: the
        // nearest by cosine, the best by BM25, and the nodes beside each in its document.
        let docs: Vec<Vec<(i64, &'a operators::Name)>> = match view.ann.as_ref() {
            None => view.order.values().map(|o| o.iter().map(|(p, id)| (*p, id)).collect()).collect(),
            Some(ann) => candidates(view, ann, &query, &lexical),
        };
        let step = operators::model::POSITION_SCALE;
        let mut nodes: Vec<(&'a str, &'a Node)> = Vec::with_capacity(docs.iter().map(Vec::len).sum());
        let mut dense: Vec<f32> = Vec::with_capacity(nodes.capacity());
        let mut starts: Vec<usize> = Vec::new();
        for order in &docs {
            // (position, cosine) of the node before.
            let mut last: Option<(i64, f32)> = None;
            for (p, id) in order {
                let Some((id, (n, e))) = view.nodes.get_key_value(id.as_str()) else {
                    last = None;
                    continue;
                };
                let d = query.dot(e);
                let follows = last.filter(|(lp, _)| p - lp <= step);
                if follows.is_none() {
                    starts.push(nodes.len());
                }
                // The cosine of the sum of two embeddings is the sum of their cosines over |sum| (kept by the view).
                let with_before = follows.and_then(|(_, before)| {
                    let norm = *view.with_before.get(id.as_str())?;
                    (norm > 1e-6).then(|| (d + before) / norm)
                });
                dense.push(with_before.map_or(d, |c| (1.0 - PREVIOUS) * d + PREVIOUS * c));
                nodes.push((id.as_str(), n));
                last = Some((*p, d));
            }
        }
        let partial = view.ann.is_some();
        if !partial && nodes.len() < view.nodes.len() {
            let seen: HashSet<&str> = nodes.iter().map(|(id, _)| *id).collect();
            for (id, (n, e)) in &view.nodes {
                if !seen.contains(id.as_str()) {
                    starts.push(nodes.len());
                    nodes.push((id.as_str(), n));
                    dense.push(query.dot(e));
                }
            }
        }
        starts.push(nodes.len());
        let max_dense = norm(dense.iter().copied().fold(0.0, f32::max));
        let max_lexical = norm(lexical.values().copied().fold(0.0, f32::max));
        let mut own: Vec<f32> = nodes
            .iter()
            .zip(&dense)
            .map(|((id, n), d)| {
                let named = n.speaker.as_deref().is_some_and(|s| names.contains(&s));
                d / max_dense
                    + LEXICAL_WEIGHT * lexical.get(id).copied().unwrap_or(0.0) / max_lexical
                    + if named { NAME_WEIGHT } else { 0.0 }
            })
            .collect();
        // Segments: a node falls SEGMENT × (the best segment's best − its segment's best), so the segment where the
        // question is best answered keeps its scores and the others fall behind. (A fall, not a gain: a document of
        // one segment changes nothing, and scores keep their scale against events and clusters.)
        let best: Vec<f32> = starts.windows(2).map(|w| own[w[0]..w[1]].iter().copied().fold(0.0, f32::max)).collect();
        let top = best.iter().copied().fold(0.0, f32::max);
        for (w, b) in starts.windows(2).zip(&best) {
            for v in &mut own[w[0]..w[1]] {
                *v += SEGMENT * (b - top);
            }
        }
        // Context: at least CONTEXT × the neighbour before or after in the segment.
        let mut scores = Vec::with_capacity(own.len());
        for w in starts.windows(2) {
            for i in w[0]..w[1] {
                let before = if i > w[0] { own[i - 1] } else { f32::MIN };
                let after = if i + 1 < w[1] { own[i + 1] } else { f32::MIN };
                scores.push(own[i].max(CONTEXT * before.max(after)));
            }
        }
        let index = nodes.iter().enumerate().map(|(i, (id, _))| (*id, i)).collect();
        Relevance { query, terms, max_dense, max_lexical, top, nodes, index, dense, scores, names, partial }
    }

    /// Whether only candidates were scored (an indexed space): a node [`Self::of`] does not know is then not scored,
    /// rather than not live.
    pub fn partial(&self) -> bool {
        self.partial
    }

    /// The layer-0 nodes scored.
    pub fn ids(&self) -> impl Iterator<Item = &'a str> + '_ {
        self.nodes.iter().map(|(id, _)| *id)
    }

    /// A layer-0 node's cosine in context (mixed with it and the node before it read together), unnormalised.
    pub fn dense_of(&self, id: &str) -> Option<f32> {
        self.index.get(id).map(|i| self.dense[*i])
    }

    /// A layer-0 node's score in context (`None` for an id that is not a live node).
    pub fn of(&self, id: &str) -> Option<f32> {
        self.index.get(id).map(|i| self.scores[*i])
    }

    /// A cluster by its summary (`None` before it has one): the summary's cosine and its BM25 against layer 0's
    /// statistics, normalised as layer 0's are.
    pub fn cluster(&self, view: &SpaceView, c: &crate::views::ClusterView) -> Option<f32> {
        let (_, emb) = c.summary.as_ref()?;
        Some(
            self.query.dot(emb) / self.max_dense
                + LEXICAL_WEIGHT * view.lexical.score_query(&self.terms, &c.summary_terms) / self.max_lexical,
        )
    }

    /// An embedding alone (no text to match), normalised as layer 0's cosines are.
    pub fn dense(&self, emb: &Embedding) -> f32 {
        self.query.dot(emb) / self.max_dense
    }

    /// Every layer-0 node, best first (ties by id).
    pub fn ranked(&self) -> Vec<(f32, &'a Node)> {
        let mut out: Vec<(f32, &'a Node)> = self.nodes.iter().zip(&self.scores).map(|((_, n), s)| (*s, *n)).collect();
        out.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.id.cmp(&b.1.id)));
        out
    }
}

/// Every layer-0 node some relevance scored, at its best over `rels`, each lifted by SEGMENT × its relevance's best
/// segment's best (each relevance lowers the other segments against its best): nodes of several subgoals compare on
/// one scale, a well-answered subgoal above a vague one. Over an indexed space only the candidates are scored, so
/// this costs what the candidates cost, not what the space holds.
pub fn fused<'a>(rels: &[Relevance<'a>]) -> HashMap<&'a str, f32> {
    let mut out: HashMap<&'a str, f32> = HashMap::new();
    for r in rels {
        for ((id, _), s) in r.nodes.iter().zip(&r.scores) {
            let v = out.entry(*id).or_insert(f32::MIN);
            *v = v.max(s + SEGMENT * r.top);
        }
    }
    out
}

/// The nodes just before and after a node in its document (one position step away at most: sessions and sections
/// that the positions keep apart stay apart).
pub fn neighbours<'a>(view: &'a SpaceView, n: &Node) -> impl Iterator<Item = &'a str> {
    let step = operators::model::POSITION_SCALE;
    let after = view.order.get(&n.doc).and_then(|o| o.range(n.pos + 1..).next()).filter(|(p, _)| **p - n.pos <= step);
    view.before(n).into_iter().chain(after.map(|(_, id)| id.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::views::{ViewUpdate, Views};
    use operators::{HashEmbedder, NodeKind};

    fn views(turns: &[(&str, &str, &str)]) -> (Views, HashEmbedder) {
        (views_with(crate::ann::AnnParams::default(), turns), HashEmbedder::default())
    }

    /// Turns `(id, speaker, text)` of one conversation in space "s", with the views' index parameters.
    fn views_with(ann: crate::ann::AnnParams, turns: &[(&str, &str, &str)]) -> Views {
        let e = HashEmbedder::default();
        let mut v = Views { ann, ..Views::default() };
        let updates = turns
            .iter()
            .map(|(id, speaker, text)| {
                let node = Node {
                    id: format!("c#{id}").into(),
                    kind: NodeKind::Turn,
                    doc: "c".into(),
                    pos: operators::ingest::turn_position(id) * operators::model::POSITION_SCALE,
                    text: (*text).into(),
                    speaker: Some((*speaker).into()),
                    ts: None,
                };
                let emb = e.embed(&node.embedding_text());
                (ViewUpdate::Node("s".into(), Box::new(node), emb), 1)
            })
            .collect();
        v.apply(updates);
        v
    }

    const TURNS: &[(&str, &str, &str)] = &[
        ("D1:1", "Ana", "How was the weekend?"),
        ("D1:2", "Ben", "Great, I painted a sunset over the lake."),
        ("D1:3", "Ana", "I went to a pottery class and made a bowl."),
        ("D1:4", "Ben", "Nice. What colour is it?"),
        ("D1:5", "Ana", "Blue, with white spots."),
        ("D2:1", "Ben", "Morning! Any plans for the holidays?"),
    ];

    /// A space of 3,000 turns, read exactly and through the index: the candidates hold the exact ranking's best
    /// (by cosine, by BM25 and in context), each scored as the exact pass scores it, and far fewer than every node.
    #[test]
    fn an_indexed_space_scores_its_candidates_as_the_exact_pass_does() {
        let e = HashEmbedder::default();
        let topics = ["pottery kiln glaze", "sailing harbour wind", "budget invoice audit", "garden tomato soil"];
        let turns: Vec<(String, String, String)> = (0..3000)
            .map(|i| {
                let speaker = ["Ana", "Ben", "Cleo"][i % 3].to_string();
                let text = format!("{} number {} said {}", topics[(i / 7) % 4], i % 50, ["yes", "no", "maybe"][i % 3]);
                (format!("D{}:{}", i / 300 + 1, i % 300 + 1), speaker, text)
            })
            .collect();
        let refs: Vec<(&str, &str, &str)> =
            turns.iter().map(|(i, s, t)| (i.as_str(), s.as_str(), t.as_str())).collect();
        let build = |ann: crate::ann::AnnParams| views_with(ann, &refs);
        let exact = build(crate::ann::AnnParams::default());
        // Over a space this full of identical turns (600 texts, each 5 times) a narrow walk can miss part of the best
        // plateau: the test reads at ef 1,024, where the walk is exact, so that what it checks is the index path's
        // scoring, not the graph's recall.
        let indexed = build(crate::ann::AnnParams {
            exhaustive_below: 1000,
            candidates: 64,
            ef_search: 1024,
            ..Default::default()
        });
        assert!(exact.spaces["s"].ann.is_none() && indexed.spaces["s"].ann.is_some());
        let q = "what did Ben say about the harbour wind, number 17";
        let all = Relevance::new(&exact.spaces["s"], &e, q);
        let some = Relevance::new(&indexed.spaces["s"], &e, q);
        assert!(!all.partial() && some.partial());
        let n = some.ids().count();
        assert!((64..600).contains(&n), "{n} candidates");
        assert_eq!(some.names, vec!["Ben"]);
        let (best, top) = (all.ranked()[0].1.id.clone(), all.ranked()[0].0);
        assert_eq!(some.ranked()[0].1.id, best, "the exact best is a candidate and ranks first");
        assert!((some.ranked()[0].0 - top).abs() < 0.05, "{} {top}", some.ranked()[0].0);
        for (_, node) in all.ranked().into_iter().take(10) {
            assert!(some.of(&node.id).is_some(), "{} of the exact top 10 is not a candidate", node.id);
        }
        // flat over the index finds the exact top-k cosines (an easy space: the walk is exact here; the space is
        // full of identical turns, so which of the tied ids is another matter).
        let flat = |v: &Views| {
            let (ev, _) = crate::query::flat::flat(&v.spaces["s"], &e, q, 5, 500);
            ev.into_iter().map(|x| (x.score * 1e4).round() as i64).collect::<Vec<_>>()
        };
        assert_eq!(flat(&indexed), flat(&exact));
        // A copy of the view (what a model-guided query reads) has no index and is read exactly.
        let copy = indexed.spaces["s"].clone();
        assert!(copy.ann.is_none() && !Relevance::new(&copy, &e, q).partial());
    }

    #[test]
    fn inflections_match_and_the_named_speaker_ranks_up() {
        let (v, e) = views(TURNS);
        let view = &v.spaces["s"];
        let r = Relevance::new(view, &e, "What did Ben paint?");
        assert_eq!(r.names, vec!["Ben"]);
        assert_eq!(r.ranked()[0].1.id, "c#D1:2", "'paint' matches 'painted' by its stem");
        // A turn by the named speaker beats the same words by another.
        let r = Relevance::new(view, &e, "What did Ana say about plans?");
        let (ben, ana) = (r.of("c#D2:1").unwrap(), r.of("c#D1:1").unwrap());
        assert!(ben > ana, "{ben} {ana}");
        let r = Relevance::new(view, &e, "What did Ben say about plans?");
        assert!(r.of("c#D2:1").unwrap() - r.of("c#D1:1").unwrap() >= NAME_WEIGHT * 0.99);
    }

    #[test]
    fn a_turn_is_read_with_the_turn_before_it() {
        // The same reply after a question on the subject and after small talk.
        let (v, e) = views(&[
            ("D1:1", "Ana", "Did you finish the pottery bowl in class?"),
            ("D1:2", "Ben", "Yes, it came out of the kiln yesterday."),
            ("D2:1", "Ana", "Lovely weather for the match today."),
            ("D2:2", "Ben", "Yes, it came out of the kiln yesterday."),
        ]);
        let view = &v.spaces["s"];
        let r = Relevance::new(view, &e, "pottery bowl");
        let (after_q, after_chat) = (r.dense_of("c#D1:2").unwrap(), r.dense_of("c#D2:2").unwrap());
        assert!(after_q > after_chat + 0.05, "{after_q} {after_chat}");
        // The formula: own cosine mixed with the cosine of the normalised sum (the first turn has no turn before).
        let emb = |id: &str| &view.nodes[id].1;
        let q = e.embed("pottery bowl");
        let (a, b) = (emb("c#D1:1"), emb("c#D1:2"));
        let sum: Vec<f32> = a.to_dense().iter().zip(b.to_dense().iter()).map(|(x, y)| x + y).collect();
        let n = sum.iter().map(|x| x * x).sum::<f32>().sqrt();
        let want = (1.0 - PREVIOUS) * q.dot(b) + PREVIOUS * (q.dot(a) + q.dot(b)) / n;
        assert!((after_q - want).abs() < 1e-4, "{after_q} {want}");
        assert!((r.dense_of("c#D1:1").unwrap() - q.dot(a)).abs() < 1e-6);
    }

    #[test]
    fn the_session_that_answers_best_lifts_its_other_turns() {
        let (v, e) = views(&[
            ("D1:1", "Ana", "The pottery class made a blue bowl with a white glaze."),
            ("D1:2", "Ben", "The weather is fine."),
            ("D1:3", "Ben", "I like the kiln."),
            ("D2:1", "Ana", "The weather is fine."),
            ("D2:2", "Ben", "I like the kiln."),
        ]);
        let view = &v.spaces["s"];
        let r = Relevance::new(view, &e, "pottery bowl glaze kiln");
        // The same words after the same turn: only their sessions differ, and session 1 holds the best turn.
        let (in_best, elsewhere) = (r.of("c#D1:3").unwrap(), r.of("c#D2:2").unwrap());
        assert!(in_best > elsewhere + 0.05, "{in_best} {elsewhere}");
        assert!((r.of("c#D1:1").unwrap() - r.top).abs() < 1e-6, "the best turn keeps its score");
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
        v.apply(vec![(ViewUpdate::Node("s".into(), Box::new(node), emb), -1)]);
        let view = &v.spaces["s"];
        assert!(neighbours(view, &view.nodes["c#D1:5"].0).next().is_none());
        assert!(view.lexical.search("colour").is_empty());
    }
}
