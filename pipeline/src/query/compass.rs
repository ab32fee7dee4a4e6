//! CompassMem's retrieval: a Planner, Explorers walking the event graph, a Responder.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use serde_json::json;

use operators::llm::Explore;
use operators::{Embedder, Node};

use super::relevance::{Relevance, CONTEXT, SEGMENT};
use super::{clip, Evidence, Guide, PROMPT_WORDS};
use crate::views::SpaceView;

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
/// subgoal, the top-k events by the best of their summary's cosine and their turns' [`Relevance`] seed a walk along typed
/// relations (both directions, up to two hops, each hop worth 0.8 of the event it came from). With a model, the
/// seeds and then each hop's new events go to it, and it says per event *answer* (keep), *expand* (keep and walk on)
/// or *skip*; without, events within half of the best score are kept and walked on. *Responder*: every layer-0
/// node ranked by the best of its own relevance (to any subgoal) and [`CONTEXT`] × its kept event's score — the
/// turns of the events the walk found, around and between the best turns; in a long session (a meeting: at least
/// `span_min_session` turns) the events beside the explored ones too, at `span_decay` per event, and an explored
/// event's turns at `span_lift` of its score, for what a question about a meeting asks is a stretch of it —
/// consecutive turns merged into passages, cut to the word budget (the answer itself is generated from them by the
/// caller). A space without events is answered by relevance alone.
pub fn compass(
    view: &SpaceView,
    embedder: &dyn Embedder,
    guide: &dyn Guide,
    query: &str,
    k: usize,
    budget_words: usize,
    params: &CompassParams,
) -> (Vec<Evidence>, Vec<serde_json::Value>) {
    let topic_seeds = params.topics;
    let mut trace = Vec::new();
    let goals = subgoals(guide, query, &mut trace);
    if view.events.is_empty() {
        trace.push(json!({"step": "explore", "why": "no events in this space: the most relevant turns alone"}));
    }
    let rels: Vec<Relevance> = goals.iter().map(|g| Relevance::new(view, embedder, g)).collect();
    // Each subgoal's scores on one scale (see [`super::relevance::fused`]).
    let node_score: HashMap<&str, f32> = super::relevance::fused(&rels);
    let explorer = Explorer { view, guide, query, k, topic_seeds };
    let mut reached: HashMap<&str, f32> = HashMap::new();
    for (g, rel) in goals.iter().zip(&rels) {
        for (id, s) in explorer.explore(g, rel, &mut trace) {
            let e = reached.entry(id).or_insert(f32::MIN);
            *e = e.max(s + SEGMENT * rel.top);
        }
    }
    // In a long session, the events beside an explored one are read too, and an explored event's turns rank
    // nearly as high as it does: what a question about a meeting asks for is a stretch of it.
    let long =
        if params.span_hops > 0 { long_sessions(view, &reached, params.span_min_session) } else { HashSet::new() };
    if !long.is_empty() {
        reached = spread(view, &long, &reached, params.span_hops, params.span_decay);
    }
    // What each reached event lifts its turns to, once per event rather than once per node.
    let lifted: HashMap<&str, f32> = reached
        .iter()
        .map(|(&id, &score)| {
            let long = view.events.get(id).is_some_and(|e| long.contains(&(e.conversation.as_str(), e.session)));
            (id, score * if long { params.span_lift } else { CONTEXT })
        })
        .collect();
    // The scored turns and the turns of the reached events: no other turn can rank above f32::MIN.
    let mut ids: HashSet<&str> = node_score.keys().copied().collect();
    ids.extend(lifted.keys().filter_map(|e| view.events.get(*e)).flat_map(|e| e.turns.iter().map(String::as_str)));
    let mut ranked: Vec<(f32, &Node, &'static str)> = ids
        .into_iter()
        .filter_map(|id| {
            let (n, _) = view.nodes.get(id)?;
            let own = node_score.get(id).copied().unwrap_or(f32::MIN);
            let lift = view.event_of.get(id).and_then(|e| lifted.get(e.as_str()).copied()).unwrap_or(f32::MIN);
            Some(if lift > own {
                (lift, n, "a turn of an explored event")
            } else {
                (own, n, "among the most relevant turns")
            })
        })
        .collect();
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.id.cmp(&b.1.id)));
    let out = super::passages(view, ranked, budget_words, &mut trace);
    (out, trace)
}

/// `compass`'s parameters (the `query.compass-*` keys).
#[derive(Clone, Debug)]
pub struct CompassParams {
    pub topics: usize,
    pub span_hops: usize,
    pub span_decay: f32,
    pub span_lift: f32,
    pub span_min_session: usize,
}

/// The sessions `(conversation, session)` of the `reached` events that hold at least `min` turns.
fn long_sessions<'a>(view: &'a SpaceView, reached: &HashMap<&str, f32>, min: usize) -> HashSet<(&'a str, i64)> {
    reached
        .keys()
        .filter_map(|id| view.events.get(*id))
        .filter(|e| view.sessions.get(&e.conversation).and_then(|c| c.get(&e.session)).is_some_and(|s| s.turns >= min))
        .map(|e| (e.conversation.as_str(), e.session))
        .collect()
}

/// The explored events' scores spread along their long sessions: the events up to `hops` before and after an
/// explored one (in the order of their first turns) reach `decay`^hop of its score, if that is more than they have.
fn spread<'a>(
    view: &'a SpaceView,
    long: &HashSet<(&str, i64)>,
    reached: &HashMap<&'a str, f32>,
    hops: usize,
    decay: f32,
) -> HashMap<&'a str, f32> {
    let mut out = reached.clone();
    for (conv, session) in long {
        let Some(events) = view.sessions.get(*conv).and_then(|c| c.get(session)) else { continue };
        let mut list: Vec<(i64, &'a str)> = events
            .events
            .iter()
            .filter_map(|id| view.events.get_key_value(id))
            .map(|(id, e)| {
                let pos = e.turns.first().and_then(|t| view.nodes.get(t.as_str())).map_or(i64::MAX, |(n, _)| n.pos);
                (pos, id.as_str())
            })
            .collect();
        list.sort();
        for (i, (_, id)) in list.iter().enumerate() {
            let Some(&s) = reached.get(id) else { continue };
            let mut v = s;
            for h in 1..=hops {
                v *= decay;
                for j in [i.checked_sub(h), Some(i + h)].into_iter().flatten() {
                    if let Some((_, to)) = list.get(j) {
                        let e = out.entry(to).or_insert(f32::MIN);
                        *e = e.max(v);
                    }
                }
            }
        }
    }
    out
}

/// The Planner: the model's subgoals, or without one [`plan`]'s.
fn subgoals(guide: &dyn Guide, query: &str, trace: &mut Vec<serde_json::Value>) -> Vec<String> {
    match guide.plan(query) {
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
    }
}

/// The Explorers of one query: the event graph walked per subgoal.
struct Explorer<'a> {
    view: &'a SpaceView,
    guide: &'a dyn Guide,
    query: &'a str,
    k: usize,
    topic_seeds: usize,
}

impl<'a> Explorer<'a> {
    /// An event's score for a subgoal: the best of its summary (and people) and its turns in context.
    fn score(&self, rel: &Relevance, id: &str) -> f32 {
        let e = &self.view.events[id];
        let own = self.view.event_vectors.get(id).map_or(f32::MIN, |v| rel.dense(v));
        e.turns.iter().filter_map(|t| rel.of(t)).fold(own, f32::max)
    }

    /// An event as the model sees it: summary, people, time.
    fn describe(&self, id: &str) -> String {
        let e = &self.view.events[id];
        let mut d = clip(&e.summary, PROMPT_WORDS);
        if !e.people.is_empty() {
            d.push_str(&format!(" (people: {})", e.people.join(", ")));
        }
        if let Some(t) = &e.time {
            d.push_str(&format!(" (time: {t})"));
        }
        d
    }

    /// The Explorer's choice over some events: the model's (and `by_model` is set), else the rule (within half of
    /// the best: expand).
    fn decide(
        &self,
        goal: &str,
        cands: &[(&str, f32)],
        best: f32,
        by_model: &mut bool,
        trace: &mut Vec<serde_json::Value>,
    ) -> Vec<Explore> {
        let texts: Vec<String> = cands.iter().map(|(id, _)| self.describe(id)).collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        if !cands.is_empty() {
            match self.guide.explore(self.query, goal, &refs) {
                Ok(Some(actions)) => {
                    *by_model = true;
                    return actions;
                }
                Ok(None) => {}
                Err(e) => trace.push(json!({"step": "model-error", "stage": "explore", "error": e, "why": "the similarity rule instead"})),
            }
        }
        cands.iter().map(|(_, s)| if *s >= 0.5 * best { Explore::Expand } else { Explore::Skip }).collect()
    }

    /// The seeds of a walk: the top-k events, and the other members of the first `topic_seeds` distinct topics among
    /// them.
    fn seeds(&self, rel: &Relevance, ranked: &[(f32, &'a str)]) -> Vec<(&'a str, f32)> {
        let view = self.view;
        let mut seeds: Vec<(&str, f32)> = ranked.iter().take(self.k).map(|r| (r.1, r.0)).collect();
        let mut topics: Vec<&str> = Vec::new();
        for (id, _) in &seeds {
            if let Some(t) = view.topic_of.get(*id) {
                if !topics.contains(&t.as_str()) && topics.len() < self.topic_seeds {
                    topics.push(t);
                }
            }
        }
        if !topics.is_empty() {
            let have: HashSet<&str> = seeds.iter().map(|s| s.0).collect();
            let mut more: Vec<(&str, f32)> = view
                .topic_of
                .iter()
                .filter(|(e, t)| topics.contains(&t.as_str()) && !have.contains(e.as_str()))
                .map(|(e, _)| (e.as_str(), self.score(rel, e)))
                .collect();
            more.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(b.0)));
            seeds.extend(more);
        }
        seeds
    }

    /// One subgoal's walk: the seeds, then up to two hops along typed relations (each hop worth 0.8 of the event it
    /// came from); the kept events with their scores.
    fn explore(&self, goal: &str, rel: &Relevance, trace: &mut Vec<serde_json::Value>) -> BTreeMap<&'a str, f32> {
        // Every event; over an indexed space, the events of the candidates.
        let events: Vec<&'a str> = if rel.partial() {
            let ids: BTreeSet<&'a str> =
                rel.ids().filter_map(|t| self.view.event_of.get(t)).map(String::as_str).collect();
            ids.into_iter().filter(|e| self.view.events.contains_key(*e)).collect()
        } else {
            self.view.events.keys().map(String::as_str).collect()
        };
        let mut ranked: Vec<(f32, &str)> = events.into_iter().map(|id| (self.score(rel, id), id)).collect();
        ranked.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| a.1.cmp(b.1)));
        let best = ranked.first().map_or(0.0, |r| r.0);
        let mut by_model = false;
        let seeds = self.seeds(rel, &ranked);
        let kept = self.decide(goal, &seeds, best, &mut by_model, trace);
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
        let mut asked: HashSet<&str> = seeds.iter().map(|s| s.0).collect();
        let mut walked = Vec::new();
        for _hop in 0..2 {
            // Events one relation away, each at the best of its own score and 0.8 × where it was reached from.
            let mut reach: BTreeMap<&str, (f32, &str, &str)> = BTreeMap::new();
            for (id, s) in &frontier {
                for (to, kind) in self.view.related(id) {
                    let got = self.score(rel, to).max(0.8 * s);
                    if reach.get(to).is_none_or(|r| r.0 < got) {
                        reach.insert(to, (got, id, kind));
                    }
                }
            }
            // Without a model an event already kept is reconsidered when reached at a better score.
            let cands: Vec<(&str, f32)> = reach
                .iter()
                .filter(
                    |(to, (got, _, _))| {
                        if by_model {
                            !asked.contains(*to)
                        } else {
                            here.get(*to).is_none_or(|old| old < got)
                        }
                    },
                )
                .map(|(to, (got, _, _))| (*to, *got))
                .collect();
            asked.extend(cands.iter().map(|c| c.0));
            let kept = self.decide(goal, &cands, best, &mut by_model, trace);
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
        let why = if by_model {
            "top-k events, then typed relations, as the model chose"
        } else {
            "top-k events, then typed relations within half of the best score"
        };
        trace.push(json!({"step": "explore", "subgoal": goal, "events": here.len(), "walked": walked, "why": why}));
        here
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::views::{ViewUpdate, Views};
    use operators::events::EventRow;
    use operators::model::POSITION_SCALE;
    use operators::NodeKind;

    /// Three made-up words from `seed`, shared with no other seed's.
    fn words(seed: &str) -> String {
        let h = blake3::hash(seed.as_bytes());
        let w = |b: &[u8]| b.iter().map(|x| (b'a' + x % 26) as char).collect::<String>();
        format!("{} {} {}", w(&h.as_bytes()[0..6]), w(&h.as_bytes()[6..12]), w(&h.as_bytes()[12..18]))
    }

    /// A space of two conversations: `long` with `long_events` events of 8 turns each, `short` with 7 of 8.
    fn space(long_events: usize) -> Views {
        let mut updates = Vec::new();
        for (conv, events) in [("long", long_events), ("short", 7)] {
            for e in 0..events {
                let turns: Vec<String> = (0..8).map(|t| format!("{conv}-{}", e * 8 + t)).collect();
                for (i, id) in turns.iter().enumerate() {
                    let n = Node {
                        id: id.as_str().into(),
                        kind: NodeKind::Turn,
                        doc: conv.into(),
                        pos: ((e * 8 + i) as i64) * POSITION_SCALE,
                        text: words(id).into(),
                        speaker: None,
                        ts: None,
                    };
                    let emb = operators::HashEmbedder::new(64).embed(&n.text);
                    updates.push((ViewUpdate::Node("s".into(), Box::new(n), emb), 1));
                }
                let row = EventRow {
                    id: format!("{conv}-e{e}"),
                    conversation: conv.into(),
                    session: 1,
                    turns,
                    summary: String::new(),
                    people: vec![],
                    time: None,
                };
                updates.push((ViewUpdate::Event("s".into(), Box::new(row)), 1));
            }
        }
        let mut v = Views::default();
        v.apply(updates);
        v
    }

    #[test]
    fn only_a_long_session_spreads_to_the_events_beside_an_explored_one() {
        let v = space(10);
        let view = &v.spaces["s"];
        let reached: HashMap<&str, f32> = HashMap::from([("long-e5", 1.0), ("short-e1", 1.0)]);
        let long = long_sessions(view, &reached, 64);
        assert_eq!(long, HashSet::from([("long", 1)]), "80 turns is long, 56 is not");
        assert_eq!(view.sessions["long"][&1].turns, 80);
        let out = spread(view, &long, &reached, 2, 0.5);
        let got = |id: &str| out.get(id).copied();
        assert_eq!(got("long-e5"), Some(1.0));
        assert_eq!((got("long-e4"), got("long-e6")), (Some(0.5), Some(0.5)));
        assert_eq!((got("long-e3"), got("long-e7")), (Some(0.25), Some(0.25)));
        assert_eq!((got("long-e2"), got("long-e8")), (None, None), "beyond two hops");
        assert_eq!((got("short-e0"), got("short-e2")), (None, None), "a short session does not spread");
        // A neighbour keeps the better of its own score and the spread one.
        let reached: HashMap<&str, f32> = HashMap::from([("long-e5", 1.0), ("long-e6", 0.9)]);
        let out = spread(view, &long, &reached, 1, 0.5);
        assert_eq!((out["long-e6"], out["long-e5"], out["long-e7"]), (0.9, 1.0, 0.45));
    }

    #[test]
    fn the_responder_reads_the_stretch_around_what_it_found_in_a_long_session_only() {
        let v = space(10);
        let view = &v.spaces["s"];
        let e = operators::HashEmbedder::new(64);
        // The turns a reading returns, by number (a passage's id is `first..last`).
        let read = |params: &CompassParams, conv: &str, q: usize| -> BTreeSet<usize> {
            let (evidence, _) =
                compass(view, &e, &crate::query::NoModel, &words(&format!("{conv}-{q}")), 4, 60, params);
            let num = |id: &str| id.rsplit('-').next().and_then(|n| n.parse::<usize>().ok());
            evidence
                .iter()
                .filter_map(|x| {
                    let (a, b) = x.id.split_once("..").unwrap_or((&x.id, &x.id));
                    Some(num(a)?..=num(b)?)
                })
                .flatten()
                .collect()
        };
        // The shipped defaults (default.toml).
        let on = crate::config::Config::load(None, Vec::new(), &Default::default()).unwrap().query.compass();
        let off = CompassParams { span_hops: 0, ..on.clone() };
        // Turn 42 is in the event of turns 40..48; its neighbours hold 32..40 and 48..56. 60 words are 20 turns.
        let found = read(&off, "long", 42);
        assert!(found.contains(&42), "{found:?}");
        let spread = read(&on, "long", 42);
        let around = |got: &BTreeSet<usize>| got.iter().filter(|t| (32..56).contains(*t)).count();
        assert_eq!(around(&spread), spread.len(), "all of it from the stretch around turn 42: {spread:?}");
        assert!(spread.len() >= 18 && spread.contains(&39) && spread.contains(&48), "{spread:?}");
        assert!(around(&found) < around(&spread), "{found:?} against {spread:?}");
        // In a short session the same reading changes nothing, unless the gate is lowered to it.
        let short = read(&off, "short", 26);
        assert_eq!(read(&on, "short", 26), short);
        let ungated = CompassParams { span_min_session: 56, ..on.clone() };
        assert_ne!(read(&ungated, "short", 26), short, "{short:?}");
    }
}
