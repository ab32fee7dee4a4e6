//! Summaries: the extractive summary, the cache that lets a grown cluster keep its summary, and the schedule that
//! decides when a waiting request is sent to the model.
//!
//! The extractive summary is a baseline, not a model: it picks the cluster's most central sentences (those whose
//! words recur across the cluster's texts), in their original order, up to a word budget. Deterministic, so a
//! replay gives the same summaries even without the response log.

use std::collections::HashMap;
use std::time::Duration;

use crate::embed::words;
use crate::fasthash::{HashMap as FastMap, HashSet as FastSet};
use crate::hash::fnv1a;
use crate::request::ModelRequest;

/// The sentences of `text`: cut after `.`, `!` or `?` before whitespace, and at line breaks.
fn sentences(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let b = text.as_bytes();
    for i in 0..b.len() {
        let end = matches!(b[i], b'.' | b'!' | b'?') && (i + 1 == b.len() || b[i + 1].is_ascii_whitespace());
        if end || b[i] == b'\n' {
            let s = text[start..=i].trim();
            if !s.is_empty() {
                out.push(s);
            }
            start = i + 1;
        }
    }
    let rest = text[start..].trim();
    if !rest.is_empty() {
        out.push(rest);
    }
    out
}

/// The most central sentences of `texts`, in order, within `max_words` (at least one sentence, cut to the budget).
pub fn extractive_summary(texts: &[&str], max_words: usize) -> String {
    let all: Vec<(usize, &str)> = texts.iter().flat_map(|t| sentences(t)).enumerate().collect();
    if all.is_empty() {
        return String::new();
    }
    // Document frequency of each word across the texts: a word the whole cluster shares is what it is about.
    let mut df: HashMap<String, f32> = HashMap::new();
    for t in texts {
        let mut seen: Vec<String> = words(t).into_iter().filter(|w| w.len() > 3).collect();
        seen.sort();
        seen.dedup();
        for w in seen {
            *df.entry(w).or_default() += 1.0;
        }
    }
    let mut scored: Vec<(f32, usize, &str)> = all
        .iter()
        .map(|(i, s)| {
            let ws = words(s);
            let score: f32 = ws.iter().filter_map(|w| df.get(w)).sum::<f32>() / (ws.len().max(1) as f32).sqrt();
            (score, *i, *s)
        })
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut chosen: Vec<(usize, &str)> = Vec::new();
    let mut used = 0;
    let top = scored[0].0;
    for (score, i, s) in scored {
        // Peripheral sentences do not fill the budget just because there is room.
        if used > 0 && score < 0.5 * top {
            break;
        }
        let n = s.split_whitespace().count();
        if used > 0 && used + n > max_words {
            continue;
        }
        // A sentence several members share (an upper layer's members quote the same source) is said once.
        if chosen.iter().any(|(_, c)| *c == s) {
            continue;
        }
        chosen.push((i, s));
        used += n;
        if used >= max_words {
            break;
        }
    }
    chosen.sort();
    let text = chosen.iter().map(|c| c.1).collect::<Vec<_>>().join(" ");
    let ws: Vec<&str> = text.split_whitespace().collect();
    if ws.len() > max_words {
        ws[..max_words].join(" ")
    } else {
        text
    }
}

/// What a cluster summary was made from, logged with it so that later requests can reuse it (and a restart knows
/// what it covers).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Coverage {
    pub layer: u32,
    /// The cluster it was made for (informative: reuse goes by content, and cluster ids can change).
    pub cluster: String,
    /// `(member, hash of the member's text)` for every member the summary was made from, sorted by member.
    pub members: Vec<(String, u64)>,
    /// The summary's lineage: a summary made from the content of an earlier one plus more continues that one's
    /// chain with the next `seq` and names it in `from` (the hash of its text); any other starts a chain.
    pub chain: u64,
    pub seq: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<u64>,
}

/// What to do with a cluster that has no summary for its exact content.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// An earlier summary still holds: it was made only from content the cluster still has, and covers at least
    /// `hierarchy.summary-coverage` of its members. No model call.
    Reuse { text: String, coverage: Coverage },
    /// Ask the model; record the answer under this coverage.
    Fresh(Coverage),
}

#[derive(Debug)]
struct Made {
    coverage: Coverage,
    text: String,
}

/// Summaries made so far, and the rule that reuses one for a cluster whose content grew.
///
/// A member's content is its text; a member that is itself a cluster shows its summary, and a summary that grew
/// from it (made from its content and more, directly or through others that grew so) stands for it. A summary
/// *holds* for a cluster's current content when every member it was made from is still there, by text or by a
/// summary that grew from it. So a held summary was made from a part of the current content, never from a removed or changed
/// member: deleting a document re-summarises every cluster whose summary saw it, up to the top. It is reused when
/// it covers at least `coverage` of the current members. Matching goes by content, not by cluster id, so a cluster
/// renamed by label propagation or by a new smallest member still finds its summary. Reusing keeps the cluster's
/// text, so its parent's content is unchanged and the parent is not asked again: growth stops cascading up.
#[derive(Debug)]
pub struct SummaryCache {
    coverage: f64,
    /// Summaries remembered at most; past it the cache starts over (reuse is an optimisation: a forgotten summary
    /// only means a call, and a forgotten lineage only means a member must match by its exact text).
    limit: usize,
    /// Per space (looked up by `&str`, no allocation on the hot path): summary text hash → (chain, the text it grew
    /// from).
    lineage: HashMap<String, HashMap<u64, (u64, Option<u64>)>>,
    /// Per space: (layer, a member's chain) → summaries made from that member, newest last (at most `KEEP`).
    by_member: HashMap<String, HashMap<(u32, u64), Vec<std::sync::Arc<Made>>>>,
    /// Summary texts in `lineage`, all spaces.
    texts: usize,
}

/// Summaries indexed per member chain.
const KEEP: usize = 8;

impl SummaryCache {
    /// `coverage` in (0, 1]; 1 reuses nothing (every content change asks the model).
    pub fn new(coverage: f64) -> Self {
        Self::with_limit(coverage, 1 << 20)
    }

    /// As [`SummaryCache::new`], remembering at most `limit` summaries.
    pub fn with_limit(coverage: f64, limit: usize) -> Self {
        SummaryCache { coverage, limit, lineage: HashMap::new(), by_member: HashMap::new(), texts: 0 }
    }

    /// Summary texts remembered.
    pub fn len(&self) -> usize {
        self.texts
    }

    pub fn is_empty(&self) -> bool {
        self.texts == 0
    }

    /// A member text's chain: a recorded summary's, or the text itself.
    fn chain(&self, space: &str, h: u64) -> u64 {
        self.lineage.get(space).and_then(|l| l.get(&h)).map_or(h, |l| l.0)
    }

    /// Whether text `now` is `then` or a summary that grew from it (following `from`, at most 64 steps). Siblings —
    /// two summaries that grew from one — do not stand for each other: one may have seen a member the other lost.
    fn grew_from(&self, space: &str, now: u64, then: u64) -> bool {
        let Some(lineage) = self.lineage.get(space) else { return now == then };
        let mut cur = now;
        for _ in 0..64 {
            if cur == then {
                return true;
            }
            match lineage.get(&cur) {
                Some((_, Some(p))) => cur = *p,
                _ => return false,
            }
        }
        false
    }

    /// What to do for `cluster` at `layer` (in `space`) whose content is `members` (`(member, text)`) with hash `key`.
    pub fn decide(&self, space: &str, layer: u32, cluster: &str, key: &str, members: &[(String, String)]) -> Decision {
        let mut current: Vec<(String, u64)> = members.iter().map(|(m, t)| (m.clone(), fnv1a(t.as_bytes()))).collect();
        current.sort();
        // Current members by chain: (text hash, index).
        let mut now: HashMap<u64, Vec<(u64, usize)>> = HashMap::new();
        for (i, (_, h)) in current.iter().enumerate() {
            now.entry(self.chain(space, *h)).or_default().push((*h, i));
        }
        let mut best: Option<(usize, &Made)> = None;
        let mut seen = std::collections::HashSet::new();
        let index = self.by_member.get(space);
        for c in now.keys() {
            for m in index.and_then(|i| i.get(&(layer, *c))).into_iter().flatten().rev() {
                if !seen.insert(std::sync::Arc::as_ptr(m)) {
                    continue;
                }
                if let Some(n) = self.matched(space, &m.coverage.members, &now) {
                    if best.is_none_or(|(b, _)| n > b) {
                        best = Some((n, m));
                    }
                }
            }
        }
        match best {
            Some((n, b)) if self.coverage < 1.0 && n as f64 >= self.coverage * current.len() as f64 => {
                Decision::Reuse { text: b.text.clone(), coverage: b.coverage.clone() }
            }
            Some((_, b)) => Decision::Fresh(Coverage {
                layer,
                cluster: cluster.to_string(),
                members: current,
                chain: b.coverage.chain,
                seq: b.coverage.seq + 1,
                from: Some(fnv1a(b.text.as_bytes())),
            }),
            None => Decision::Fresh(Coverage {
                layer,
                cluster: cluster.to_string(),
                members: current,
                chain: fnv1a(key.as_bytes()),
                seq: 0,
                from: None,
            }),
        }
    }

    /// How many current members the summary made from `then` covers, if every one of `then` is still there (by
    /// text, or by a summary that grew from it); `None` if one is not.
    fn matched(&self, space: &str, then: &[(String, u64)], now: &HashMap<u64, Vec<(u64, usize)>>) -> Option<usize> {
        let mut hit = std::collections::HashSet::new();
        for (_, h) in then {
            let list = now.get(&self.chain(space, *h))?;
            let stands = |h2: &u64| self.grew_from(space, *h2, *h);
            let i = list
                .iter()
                .find(|(h2, i)| !hit.contains(i) && stands(h2))
                .or_else(|| list.iter().find(|(h2, _)| stands(h2)))?
                .1;
            hit.insert(i);
        }
        Some(hit.len())
    }

    /// Records a summary made (or reused, or read back from the log) under `coverage`.
    pub fn record(&mut self, space: &str, coverage: &Coverage, text: &str) {
        if self.texts >= self.limit {
            self.lineage.clear();
            self.by_member.clear();
            self.texts = 0;
        }
        let lineage = self.lineage.entry(space.to_string()).or_default();
        if let std::collections::hash_map::Entry::Vacant(e) = lineage.entry(fnv1a(text.as_bytes())) {
            e.insert((coverage.chain, coverage.from));
            self.texts += 1;
        }
        let made = std::sync::Arc::new(Made { coverage: coverage.clone(), text: text.to_string() });
        let chains: std::collections::BTreeSet<u64> =
            coverage.members.iter().map(|(_, h)| self.chain(space, *h)).collect();
        let index = self.by_member.entry(space.to_string()).or_default();
        for c in chains {
            let list = index.entry((coverage.layer, c)).or_default();
            if list.iter().any(|m| m.text == text && m.coverage.members == coverage.members) {
                continue;
            }
            list.push(made.clone());
            if list.len() > KEEP {
                list.remove(0);
            }
        }
    }
}

/// When a waiting request goes to the model. A request (`(space, content key)`) is sent once it has waited
/// `debounce` unchanged — a cluster still changing gets a new content key, and so a new wait — or, for a cluster's
/// summary, once the cluster's *members* have been unchanged that long ([`Scheduler::due_given`]): a cluster above
/// layer 1 gets a new key when a member's summary arrives, and waiting again for each would make the layers' summaries
/// a chain of debounces, one per layer, after a bulk load or a change. It is sent at most once until
/// [`Scheduler::retry`], which waits another debounce whatever the members do. A live session (a meeting being transcribed) changes with every turn and so never
/// waits out the debounce: its newest content is sent anyway once `max_latency` has passed since the session was
/// last sent. Time is whatever the caller counts in (the engine's wall clock, a bench's epochs), from any origin.
#[derive(Debug)]
pub struct Scheduler {
    debounce: Duration,
    max_latency: Duration,
    first_seen: FastMap<(String, String), Duration>,
    sent: FastSet<(String, String)>,
    /// Failed requests: not sent again before this.
    retry_at: FastMap<(String, String), Duration>,
    /// No cluster summary is sent while this holds ([`Scheduler::hold_summaries`]).
    hold: bool,
    /// Per live session `(space, conversation, session)`: since when its newest turns have waited for the model.
    session_since: FastMap<(String, String, i64), Duration>,
    /// The earliest time a request of the last [`Scheduler::due_given`] could fall due without a change (`None`:
    /// none could), and whether the state changed since (a retry, a resend, the hold): see [`Scheduler::check_due`].
    next_at: Option<Duration>,
    changed: bool,
}

/// A request waiting for the model: `((space, content key), request)`; shared with the views that list it, so that
/// taking the waiting list every tick copies no member texts.
pub type Waiting = ((String, String), std::sync::Arc<ModelRequest>);

impl Scheduler {
    pub fn new(debounce: Duration, max_latency: Duration) -> Self {
        Scheduler {
            debounce,
            max_latency,
            first_seen: FastMap::default(),
            sent: FastSet::default(),
            retry_at: FastMap::default(),
            hold: false,
            session_since: FastMap::default(),
            next_at: None,
            changed: true,
        }
    }

    /// Whether [`Scheduler::due_given`] could return anything at `now` for the same waiting list as its last call:
    /// the state changed since, or a request's wait ends by `now`. A caller that calls it only then (and whenever the
    /// waiting list changes) sends what it would send calling it every tick, at the same ticks.
    pub fn check_due(&self, now: Duration) -> bool {
        self.changed || self.next_at.is_some_and(|at| now >= at)
    }

    /// The requests of `waiting` (everything waiting now) that are due at `now`, in the order given; forgets the
    /// requests no longer waiting.
    pub fn due<'a>(&mut self, waiting: &'a [Waiting], now: Duration) -> Vec<&'a Waiting> {
        self.due_given(waiting, now, |_, _| None)
    }

    /// [`Scheduler::due`], where `members_since(space, cluster)` is when a cluster's members last changed (`None`:
    /// not known): a summary whose cluster's members have been unchanged for the debounce is due at once.
    pub fn due_given<'a>(
        &mut self,
        waiting: &'a [Waiting],
        now: Duration,
        members_since: impl Fn(&str, &str) -> Option<Duration>,
    ) -> Vec<&'a Waiting> {
        let live: FastSet<&(String, String)> = waiting.iter().map(|w| &w.0).collect();
        self.first_seen.retain(|k, _| live.contains(k));
        self.sent.retain(|k| live.contains(k));
        self.retry_at.retain(|k, _| live.contains(k));
        let sessions: FastSet<(&str, &str, i64)> = waiting
            .iter()
            .filter_map(|((space, _), r)| match r.as_ref() {
                ModelRequest::Session { conversation, session, .. } => {
                    Some((space.as_str(), conversation.as_str(), *session))
                }
                _ => None,
            })
            .collect();
        self.session_since.retain(|(s, c, n), _| sessions.contains(&(s.as_str(), c.as_str(), *n)));
        self.changed = false;
        let mut next_at: Option<Duration> = None;
        let mut wake = |at: Duration| next_at = Some(next_at.map_or(at, |n| n.min(at)));
        let mut due = Vec::new();
        for w in waiting {
            let (key, request) = w;
            if self.sent.contains(key) {
                continue;
            }
            let seen = *self.first_seen.entry(key.clone()).or_insert(now);
            let since = match request.as_ref() {
                ModelRequest::Summary { cluster, .. } => members_since(&key.0, cluster),
                _ => None,
            };
            // When it is stable: its wait, or its members' (whichever ends first), and no earlier than a retry.
            let waited = since.map_or(seen, |m| m.min(seen)) + self.debounce;
            let retry = self.retry_at.get(key).copied();
            let stable_at = retry.map_or(waited, |r| r.max(waited));
            let held = self.hold && matches!(request.as_ref(), ModelRequest::Summary { .. });
            let stable = now >= stable_at && !held;
            let session = match request.as_ref() {
                ModelRequest::Session { conversation, session, .. } => {
                    Some((key.0.clone(), conversation.clone(), *session))
                }
                _ => None,
            };
            let overdue_at =
                session.as_ref().map(|s| *self.session_since.entry(s.clone()).or_insert(now) + self.max_latency);
            let overdue = overdue_at.is_some_and(|at| now >= at);
            if stable || overdue {
                self.sent.insert(key.clone());
                if let Some(s) = session {
                    self.session_since.insert(s, now);
                }
                due.push(w);
                continue;
            }
            if !held {
                wake(stable_at);
            }
            if let Some(at) = overdue_at {
                wake(at);
            }
        }
        self.next_at = next_at;
        due
    }

    /// Holds every cluster summary back (while the hierarchy works through a load, its clusters are still moving), or
    /// lets them go again. A held request keeps its wait: once let go it is due as it would have been.
    pub fn hold_summaries(&mut self, hold: bool) {
        self.changed |= self.hold != hold;
        self.hold = hold;
    }

    /// A request that failed: sent again after another debounce from `now`.
    pub fn retry(&mut self, key: &(String, String), now: Duration) {
        self.sent.remove(key);
        self.first_seen.insert(key.clone(), now);
        self.retry_at.insert(key.clone(), now + self.debounce);
        self.changed = true;
    }

    /// A reply that could not be kept: the request is due again at once.
    pub fn resend(&mut self, key: &(String, String)) {
        self.sent.remove(key);
        self.changed = true;
    }
}

/// What the summariser does with a due request.
#[derive(Clone, Debug, PartialEq)]
pub enum Plan {
    /// An earlier summary holds for this cluster's content: log it under the new key, no call.
    Reuse { text: String, coverage: Coverage },
    /// Ask the model; a cluster summary is recorded in the cache under its coverage.
    Ask(Option<Coverage>),
}

impl SummaryCache {
    /// The plan for a due request: a cluster may reuse an earlier summary; sessions and judgements always ask.
    pub fn plan(&self, space: &str, key: &str, request: &ModelRequest) -> Plan {
        match request {
            ModelRequest::Summary { layer, cluster, members } => {
                match self.decide(space, *layer, cluster, key, members) {
                    Decision::Reuse { text, coverage } => Plan::Reuse { text, coverage },
                    Decision::Fresh(coverage) => Plan::Ask(Some(coverage)),
                }
            }
            ModelRequest::Session { .. } | ModelRequest::Judge { .. } => Plan::Ask(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(space: &str, key: &str, cluster: &str, text: &str) -> Waiting {
        let members = vec![("n1".to_string(), text.to_string())];
        let request = ModelRequest::Summary { layer: 2, cluster: cluster.into(), members };
        ((space.into(), key.into()), std::sync::Arc::new(request))
    }

    /// A request waits out the debounce on its key, unless its cluster's members have been unchanged that long (a
    /// member's new summary gives an upper cluster a new key); a retried request waits a debounce whatever its
    /// members do; each is sent once.
    #[test]
    fn a_summary_waits_for_its_key_or_its_settled_members() {
        let s = Duration::from_secs;
        let keys = |due: Vec<&Waiting>| due.into_iter().map(|w| w.0 .1.clone()).collect::<Vec<_>>();
        let mut sch = Scheduler::new(s(10), Duration::MAX);
        let waiting = vec![summary("a", "k1", "L2:x", "one"), summary("a", "k2", "L2:y", "two")];
        // L2:x's members changed at 0, L2:y's at 5; both keys first seen at 12.
        let since = |_: &str, c: &str| Some(if c == "L2:x" { s(0) } else { s(5) });
        assert_eq!(keys(sch.due_given(&waiting, s(12), since)), ["k1"], "settled members: due at once");
        assert!(sch.due_given(&waiting, s(14), since).is_empty(), "sent once; L2:y's members not settled");
        assert_eq!(keys(sch.due_given(&waiting, s(15), since)), ["k2"]);
        // Without what the members did, the key's own wait.
        let mut plain = Scheduler::new(s(10), Duration::MAX);
        assert!(plain.due(&waiting, s(12)).is_empty());
        assert_eq!(keys(plain.due(&waiting, s(22))), ["k1", "k2"]);
        // A failure: another debounce, even though the members settled long ago.
        sch.retry(&("a".into(), "k1".into()), s(20));
        assert!(sch.due_given(&waiting, s(25), since).is_empty());
        assert_eq!(keys(sch.due_given(&waiting, s(30), since)), ["k1"]);
        // A request no longer waiting is forgotten: back again, it is new.
        assert!(sch.due_given(&waiting[1..], s(31), since).is_empty());
        assert_eq!(keys(sch.due_given(&waiting, s(32), since)), ["k1"]);
        // Held: no summary goes, whatever its wait; let go, it is due as before.
        let later = vec![summary("a", "k3", "L2:z", "three")];
        sch.hold_summaries(true);
        assert!(sch.due_given(&later, s(40), since).is_empty());
        assert!(sch.due_given(&later, s(60), since).is_empty());
        sch.hold_summaries(false);
        assert_eq!(keys(sch.due_given(&later, s(61), since)), ["k3"]);
    }

    /// Asking only when the waiting list changed or [`Scheduler::check_due`] says so sends what asking every tick
    /// sends, at the same ticks: seeded random waiting lists, members' changes, holds, retries and resends.
    #[test]
    fn asking_when_check_due_says_so_equals_asking_every_tick() {
        use rand::{Rng, SeedableRng};
        let s = Duration::from_millis;
        for seed in 0..40u64 {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
            let pool: Vec<Waiting> = (0..12)
                .map(|i| {
                    if i % 4 == 3 {
                        let request =
                            ModelRequest::Session { conversation: format!("c{}", i % 2), session: 0, turns: vec![] };
                        (("a".to_string(), format!("seg{i}")), std::sync::Arc::new(request))
                    } else {
                        summary("a", &format!("k{i}"), &format!("L2:{}", i % 5), "text")
                    }
                })
                .collect();
            let (debounce, latency) = (s(rng.gen_range(1..6) * 20), s(rng.gen_range(2..12) * 20));
            let mut every = Scheduler::new(debounce, latency);
            let mut lazy = Scheduler::new(debounce, latency);
            let mut waiting: Vec<Waiting> = Vec::new();
            let mut since: HashMap<String, Duration> = HashMap::new();
            let mut changed = true;
            for tick in 0..300u64 {
                let now = s(tick * 20);
                if rng.gen_bool(0.1) {
                    let w = &pool[rng.gen_range(0..pool.len())];
                    match waiting.iter().position(|x| x.0 == w.0) {
                        Some(at) => drop(waiting.remove(at)),
                        None => waiting.push(w.clone()),
                    }
                    changed = true;
                }
                if rng.gen_bool(0.05) {
                    since.insert(format!("L2:{}", rng.gen_range(0..5)), now);
                    changed = true;
                }
                if rng.gen_bool(0.03) {
                    let hold = rng.gen_bool(0.5);
                    every.hold_summaries(hold);
                    lazy.hold_summaries(hold);
                }
                if rng.gen_bool(0.03) && !waiting.is_empty() {
                    let key = waiting[rng.gen_range(0..waiting.len())].0.clone();
                    if rng.gen_bool(0.5) {
                        every.retry(&key, now);
                        lazy.retry(&key, now);
                    } else {
                        every.resend(&key);
                        lazy.resend(&key);
                    }
                }
                let given = |_: &str, c: &str| since.get(c).copied();
                let a: Vec<String> =
                    every.due_given(&waiting, now, given).into_iter().map(|w| w.0 .1.clone()).collect();
                let b: Vec<String> = if changed || lazy.check_due(now) {
                    lazy.due_given(&waiting, now, given).into_iter().map(|w| w.0 .1.clone()).collect()
                } else {
                    Vec::new()
                };
                changed = false;
                assert_eq!(a, b, "seed {seed}, tick {tick}");
            }
        }
    }

    #[test]
    fn picks_central_sentences_in_order_within_budget() {
        let texts = [
            "The storm flooded the harbour. Gulls were seen.",
            "Harbour flooding closed the quay after the storm. A cat slept.",
            "Clean-up of the flooded harbour began on Monday.",
        ];
        let s = extractive_summary(&texts, 20);
        assert!(s.split_whitespace().count() <= 20, "{s}");
        assert!(s.contains("harbour") || s.contains("Harbour"), "{s}");
        assert!(!s.contains("cat slept"), "peripheral sentence kept: {s}");
        assert_eq!(s, extractive_summary(&texts, 20), "deterministic");
    }

    #[test]
    fn a_sentence_shared_by_members_is_said_once() {
        let texts =
            ["The sea wall was approved. Gulls.", "The sea wall was approved. The vote was close on the sea wall."];
        let s = extractive_summary(&texts, 40);
        assert_eq!(s.matches("The sea wall was approved.").count(), 1, "{s}");
        assert!(s.contains("vote was close"), "{s}");
    }

    fn ms(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    fn made(
        cache: &mut SummaryCache,
        space: &str,
        cluster: &str,
        members: &[(String, String)],
        text: &str,
    ) -> Coverage {
        match cache.decide(space, cluster[1..2].parse().unwrap(), cluster, "k", members) {
            Decision::Fresh(c) => {
                cache.record(space, &c, text);
                c
            }
            Decision::Reuse { .. } => panic!("expected a fresh summary"),
        }
    }

    #[test]
    fn a_grown_cluster_reuses_its_summary_until_coverage_drops() {
        let mut cache = SummaryCache::new(0.75);
        made(&mut cache, "s", "L1:a", &ms(&[("a", "x"), ("b", "y"), ("c", "z")]), "S1");
        // 3 of 4 members covered: reused.
        match cache.decide("s", 1, "L1:a", "k2", &ms(&[("a", "x"), ("b", "y"), ("c", "z"), ("d", "w")])) {
            Decision::Reuse { text, coverage } => {
                assert_eq!(text, "S1");
                assert_eq!(coverage.members.len(), 3);
            }
            d => panic!("{d:?}"),
        }
        // 3 of 5: a fresh summary, continuing the chain.
        let grown = ms(&[("a", "x"), ("b", "y"), ("c", "z"), ("d", "w"), ("e", "v")]);
        let Decision::Fresh(c) = cache.decide("s", 1, "L1:a", "k3", &grown) else { panic!("coverage 3/5 reused") };
        assert_eq!(c.seq, 1);
        assert_eq!(c.members.len(), 5);
        // Another space: nothing to reuse. Another cluster id (renamed) with the grown content: matched by content.
        assert!(matches!(cache.decide("t", 1, "L1:a", "k", &grown[..4]), Decision::Fresh(_)));
        assert!(matches!(cache.decide("s", 1, "L1:b", "k", &grown[..4]), Decision::Reuse { .. }));
        assert!(matches!(cache.decide("s", 2, "L2:a", "k", &grown[..4]), Decision::Fresh(_)), "another layer");
        // Coverage 1: never reuse.
        let mut strict = SummaryCache::new(1.0);
        made(&mut strict, "s", "L1:a", &grown[..3], "S1");
        assert!(matches!(strict.decide("s", 1, "L1:a", "k", &grown[..4]), Decision::Fresh(_)));
    }

    #[test]
    fn a_sibling_summary_does_not_stand_for_one_that_saw_a_lost_member() {
        let mut cache = SummaryCache::new(0.75);
        made(&mut cache, "s", "L1:k", &ms(&[("a", "x"), ("b", "y")]), "child M");
        // The child grows by `x2`: a fresh summary A grown from M, which the parent sees.
        let Decision::Fresh(c) = cache.decide("s", 1, "L1:k", "k1", &ms(&[("a", "x"), ("b", "y"), ("c", "z")])) else {
            panic!("2/3 reused at 0.75")
        };
        cache.record("s", &c, "child A");
        made(&mut cache, "s", "L2:p", &ms(&[("L1:k", "child A"), ("L1:m", "other")]), "parent of A");
        // `c` is deleted and `d` joins: A no longer holds, M does; B grows from M, a sibling of A, not a descendant.
        let Decision::Fresh(c) = cache.decide("s", 1, "L1:k", "k2", &ms(&[("a", "x"), ("b", "y"), ("d", "w")])) else {
            panic!("2/3 reused at 0.75")
        };
        assert_eq!(c.from, Some(fnv1a(b"child M")));
        cache.record("s", &c, "child B");
        // The parent's summary quoted A, which saw the deleted `c`: it must not hold.
        assert!(matches!(
            cache.decide("s", 2, "L2:p", "k3", &ms(&[("L1:k", "child B"), ("L1:m", "other")])),
            Decision::Fresh(_)
        ));
    }

    #[test]
    fn a_full_cache_starts_over() {
        let mut cache = SummaryCache::with_limit(0.5, 2);
        made(&mut cache, "s", "L1:a", &ms(&[("a", "x"), ("b", "y")]), "S1");
        made(&mut cache, "s", "L1:c", &ms(&[("c", "u"), ("d", "v")]), "S2");
        assert!(matches!(
            cache.decide("s", 1, "L1:a", "k", &ms(&[("a", "x"), ("b", "y"), ("e", "z")])),
            Decision::Reuse { .. }
        ));
        // The third summary finds the cache full: it starts over with S3 alone.
        made(&mut cache, "s", "L1:f", &ms(&[("f", "p"), ("g", "q")]), "S3");
        assert!(matches!(
            cache.decide("s", 1, "L1:a", "k", &ms(&[("a", "x"), ("b", "y"), ("e", "z")])),
            Decision::Fresh(_)
        ));
        assert!(matches!(
            cache.decide("s", 1, "L1:f", "k", &ms(&[("f", "p"), ("g", "q"), ("h", "r")])),
            Decision::Reuse { .. }
        ));
    }

    #[test]
    fn a_removed_or_changed_member_is_never_reused() {
        let mut cache = SummaryCache::new(0.5);
        let first = made(&mut cache, "s", "L1:a", &ms(&[("a", "x"), ("b", "y"), ("c", "z")]), "S1");
        // `c` deleted, `d` joined: S1 saw `c`, so it does not hold; a new chain starts.
        let Decision::Fresh(c) = cache.decide("s", 1, "L1:a", "k2", &ms(&[("a", "x"), ("b", "y"), ("d", "w")])) else {
            panic!("a summary of a deleted member was reused")
        };
        assert_ne!(c.chain, first.chain);
        assert_eq!(c.seq, 0);
        // `c` replaced by new text.
        assert!(matches!(
            cache.decide("s", 1, "L1:a", "k3", &ms(&[("a", "x"), ("b", "y"), ("c", "changed")])),
            Decision::Fresh(_)
        ));
    }

    #[test]
    fn a_parent_holds_while_its_children_only_grow() {
        let mut cache = SummaryCache::new(0.75);
        let kids = ms(&[("a", "x"), ("b", "y")]);
        made(&mut cache, "s", "L1:k", &kids, "child one");
        made(&mut cache, "s", "L2:p", &ms(&[("L1:k", "child one"), ("L1:m", "other")]), "parent");
        // The child grows past its coverage: a fresh summary in the same chain.
        let grown = ms(&[("a", "x"), ("b", "y"), ("c", "z"), ("d", "w")]);
        let Decision::Fresh(c) = cache.decide("s", 1, "L1:k", "k2", &grown) else { panic!("2/4 reused") };
        cache.record("s", &c, "child two");
        // The parent's summary still holds: its child's new text continues the chain it saw.
        match cache.decide("s", 2, "L2:p", "k3", &ms(&[("L1:k", "child two"), ("L1:m", "other")])) {
            Decision::Reuse { text, .. } => assert_eq!(text, "parent"),
            d => panic!("{d:?}"),
        }
        // The child loses a member: a new chain, and the parent must be summarised again.
        let Decision::Fresh(c) = cache.decide("s", 1, "L1:k", "k4", &ms(&[("a", "x"), ("c", "z"), ("d", "w")])) else {
            panic!("reused after a removal")
        };
        cache.record("s", &c, "child three");
        assert!(matches!(
            cache.decide("s", 2, "L2:p", "k5", &ms(&[("L1:k", "child three"), ("L1:m", "other")])),
            Decision::Fresh(_)
        ));
    }
}
