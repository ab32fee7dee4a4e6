//! The lexical side of retrieval: an analyzer (words, stop words, Snowball English stems) and a BM25 index over a
//! space's layer-0 texts, kept in step with the views (a text in, a text out). Dense embeddings miss what a reader
//! finds by the word — a name, a rare noun, a plural of the query's term; retrieval fuses both (`pipeline::query`).

use crate::embed::words;
use crate::fasthash::HashMap;
use crate::slots::Slots;

/// English words that carry no topic: skipped by the analyzer (the hash embedder's list).
pub fn is_stop(w: &str) -> bool {
    crate::embed::is_stop(w)
}

/// The index terms of a text: lower-cased alphanumeric words, stop words dropped, Snowball English stems.
pub fn terms(text: &str) -> Vec<String> {
    thread_local! {
        static STEMMER: rust_stemmers::Stemmer = rust_stemmers::Stemmer::create(rust_stemmers::Algorithm::English);
    }
    STEMMER.with(|s| words(text).into_iter().filter(|w| !is_stop(w)).map(|w| s.stem(&w).into_owned()).collect())
}

/// A text's terms counted: what BM25 needs of a text outside the index (a summary), computed once.
#[derive(Default, Clone, Debug)]
pub struct TermCounts {
    /// Each distinct term, its frequency and its [`term_key`], sorted by key then term: a lookup compares integers.
    tf: Box<[(u64, Box<str>, u32)]>,
    len: u32,
}

/// A term's lookup key in [`TermCounts`] (FNV-1a: fixed, so a text's counts mean the same in every process).
fn term_key(term: &str) -> u64 {
    crate::hash::fnv1a(term.as_bytes())
}

impl TermCounts {
    pub fn of(text: &str) -> Self {
        let ts = terms(text);
        let len = ts.len() as u32;
        let mut keyed: Vec<(u64, String)> = ts.into_iter().map(|t| (term_key(&t), t)).collect();
        keyed.sort_unstable();
        let mut tf: Vec<(u64, Box<str>, u32)> = Vec::new();
        for (k, t) in keyed {
            match tf.last_mut() {
                Some((lk, last, n)) if *lk == k && **last == *t => *n += 1,
                _ => tf.push((k, t.into_boxed_str(), 1)),
            }
        }
        TermCounts { tf: tf.into_boxed_slice(), len }
    }

    fn get(&self, key: u64, term: &str) -> Option<u32> {
        let start = self.tf.partition_point(|(k, _, _)| *k < key);
        self.tf[start..].iter().take_while(|(k, _, _)| *k == key).find(|(_, t, _)| **t == *term).map(|x| x.2)
    }
}

/// A query analysed against an index: its distinct terms (a repeated query term counts once in BM25), each with
/// its slot in the index and its inverse document frequency, looked up once however many texts it scores.
#[derive(Default, Clone, Debug)]
pub struct LexicalQuery {
    /// (term, its [`term_key`], its slot in the index, its IDF).
    terms: Vec<(String, u64, Option<u32>, f32)>,
}

/// BM25's term-frequency saturation and length normalisation (the usual defaults).
pub const K1: f32 = 1.2;
pub const B: f32 = 0.75;

/// A BM25 index over documents named by id. `insert` of an id already present replaces its text. Documents and
/// terms are interned ([`Slots`]): each id and each term is stored once, and a posting is three integers.
#[derive(Default, Clone)]
pub struct LexicalIndex {
    docs: Slots<String>,
    /// Document slot → its length in terms and its distinct terms' slots (empty for a released slot).
    doc: Vec<(u32, Box<[u32]>)>,
    terms: Slots<String>,
    /// Term slot → (document slot → (term frequency, the document's length)).
    postings: Vec<HashMap<u32, (u32, u32)>>,
    total_len: u64,
}

impl std::fmt::Debug for LexicalIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LexicalIndex")
            .field("docs", &self.docs.len())
            .field("terms", &self.terms.len())
            .field("total_len", &self.total_len)
            .finish()
    }
}

impl LexicalIndex {
    pub fn len(&self) -> usize {
        self.docs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.docs.is_empty()
    }

    pub fn insert(&mut self, id: &str, text: &str) {
        let counts = TermCounts::of(text);
        let terms: Vec<(&str, u32)> = counts.tf.iter().map(|(_, t, f)| (&**t, *f)).collect();
        self.insert_counts(id, &terms);
    }

    /// Inserts (or replaces) a document given its distinct terms and their frequencies.
    fn insert_counts(&mut self, id: &str, terms: &[(&str, u32)]) {
        self.remove(id);
        let len: u32 = terms.iter().map(|(_, f)| f).sum();
        let (d, new) = self.docs.intern(id);
        if new {
            self.doc.push((0, Box::default()));
        }
        let mut slots = Vec::with_capacity(terms.len());
        for (t, f) in terms {
            let (ts, new) = self.terms.intern(*t);
            if new {
                self.postings.push(HashMap::default());
            }
            self.postings[ts as usize].insert(d, (*f, len));
            slots.push(ts);
        }
        self.total_len += u64::from(len);
        self.doc[d as usize] = (len, slots.into_boxed_slice());
    }

    pub fn remove(&mut self, id: &str) {
        let Some(d) = self.docs.get(id) else { return };
        let (len, terms) = std::mem::take(&mut self.doc[d as usize]);
        self.total_len -= u64::from(len);
        for t in terms.iter() {
            let p = &mut self.postings[*t as usize];
            p.remove(&d);
            if p.is_empty() {
                *p = HashMap::default();
                self.terms.release(*t);
            }
        }
        self.docs.release(d);
    }

    fn idf_of(&self, df: usize) -> f32 {
        let (n, df) = (self.docs.len() as f32, df as f32);
        (1.0 + (n - df + 0.5) / (df + 0.5)).ln()
    }

    /// Inverse document frequency of a term (BM25's, never negative); 0 for a term no document has.
    pub fn idf(&self, term: &str) -> f32 {
        self.terms.get(term).map_or(0.0, |t| self.idf_of(self.postings[t as usize].len()))
    }

    fn avg_len(&self) -> f32 {
        if self.docs.is_empty() {
            1.0
        } else {
            (self.total_len as f32 / self.docs.len() as f32).max(1.0)
        }
    }

    fn weight(&self, tf: f32, len: f32, avg_len: f32) -> f32 {
        tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * len / avg_len))
    }

    /// Analyses a query's terms (see [`terms`]) against the index's statistics now.
    pub fn query(&self, query: &[String]) -> LexicalQuery {
        let mut qs: Vec<&String> = query.iter().collect();
        qs.sort();
        qs.dedup();
        let terms = qs
            .into_iter()
            .map(|t| {
                let slot = self.terms.get(t.as_str());
                let idf = slot.map_or(0.0, |s| self.idf_of(self.postings[s as usize].len()));
                (t.clone(), term_key(t), slot, idf)
            })
            .collect();
        LexicalQuery { terms }
    }

    /// BM25 of every document that shares a term with the query (each distinct query term counted once).
    pub fn search(&self, query: &str) -> std::collections::HashMap<&str, f32> {
        self.search_terms(&terms(query))
    }

    /// [`Self::search`] for query terms already analysed (see [`terms`]).
    pub fn search_terms(&self, query: &[String]) -> std::collections::HashMap<&str, f32> {
        self.search_query(&self.query(query)).into_iter().collect()
    }

    /// [`Self::search`] for an analysed query.
    pub fn search_query(&self, query: &LexicalQuery) -> HashMap<&str, f32> {
        let avg = self.avg_len();
        let mut by_slot: HashMap<u32, f32> = HashMap::default();
        for (_, _, slot, idf) in &query.terms {
            let Some(t) = slot else { continue };
            let p = &self.postings[*t as usize];
            by_slot.reserve(p.len());
            for (d, (f, len)) in p {
                *by_slot.entry(*d).or_default() += idf * self.weight(*f as f32, *len as f32, avg);
            }
        }
        by_slot.into_iter().map(|(d, s)| (self.docs.key(d).as_str(), s)).collect()
    }

    /// BM25 of a text that is not in the index (a cluster's summary), against the index's statistics.
    pub fn score_text(&self, query: &[String], text: &str) -> f32 {
        self.score_counts(query, &TermCounts::of(text))
    }

    /// [`Self::score_text`] for a text whose terms are already counted.
    pub fn score_counts(&self, query: &[String], text: &TermCounts) -> f32 {
        self.score_query(&self.query(query), text)
    }

    /// [`Self::score_counts`] for an analysed query.
    pub fn score_query(&self, query: &LexicalQuery, text: &TermCounts) -> f32 {
        let avg = self.avg_len();
        query
            .terms
            .iter()
            .filter_map(|(q, key, _, idf)| text.get(*key, q).map(|f| idf * self.weight(f as f32, text.len as f32, avg)))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terms_are_stemmed_and_stop_words_dropped() {
        assert_eq!(terms("The paintings she painted"), vec!["paint", "paint"]);
        assert_eq!(terms("Which cities has John visited?"), vec!["citi", "john", "visit"]);
    }

    #[test]
    fn bm25_prefers_rare_terms_and_matches_inflections() {
        let mut ix = LexicalIndex::default();
        ix.insert("a", "I went hiking with my dog yesterday");
        ix.insert("b", "my dog loves the park");
        ix.insert("c", "my dog sleeps a lot, my dog is old");
        ix.insert("d", "we painted the fence");
        let s = ix.search("Where did she hike?");
        assert_eq!(s.keys().copied().collect::<Vec<_>>(), vec!["a"]);
        let s = ix.search("dog painting");
        // "paint" is in one document, "dog" in three: the painting wins.
        let best = s.iter().max_by(|x, y| x.1.total_cmp(y.1)).unwrap();
        assert_eq!(*best.0, "d");
        assert!(s["c"] > s["b"], "two mentions beat one: {s:?}");
    }

    #[test]
    fn replace_and_remove_keep_the_statistics() {
        let mut ix = LexicalIndex::default();
        ix.insert("a", "apples and pears");
        ix.insert("b", "pears");
        ix.insert("a", "plums");
        assert_eq!(ix.len(), 2);
        assert!(ix.search("apples").is_empty());
        assert_eq!(ix.search("plum").len(), 1);
        ix.remove("b");
        ix.remove("b");
        assert!(ix.search("pears").is_empty());
        ix.remove("a");
        assert!(ix.is_empty());
        assert_eq!(ix.total_len, 0);
        assert!(ix.postings.iter().all(|p| p.is_empty()));
        assert_eq!(ix.terms.len(), 0);
    }

    #[test]
    fn a_summary_is_scored_against_the_index() {
        let mut ix = LexicalIndex::default();
        ix.insert("a", "chess club on friday");
        ix.insert("b", "football on sunday");
        assert!(ix.score_text(&terms("chess"), "They play chess") > 0.0);
        assert_eq!(ix.score_text(&terms("chess"), "They play cards"), 0.0);
    }

    /// BM25 from the live texts alone, as the definition reads.
    fn bm25_reference(live: &std::collections::BTreeMap<String, String>, query: &str) -> Vec<(String, f32)> {
        let docs: Vec<(&String, Vec<String>)> = live.iter().map(|(id, t)| (id, terms(t))).collect();
        let n = docs.len() as f32;
        let avg =
            if docs.is_empty() { 1.0 } else { (docs.iter().map(|d| d.1.len()).sum::<usize>() as f32 / n).max(1.0) };
        let mut qs = terms(query);
        qs.sort();
        qs.dedup();
        let mut out = Vec::new();
        for (id, ts) in &docs {
            let mut score = 0.0f32;
            let mut any = false;
            for q in &qs {
                let tf = ts.iter().filter(|t| *t == q).count() as f32;
                if tf == 0.0 {
                    continue;
                }
                any = true;
                let df = docs.iter().filter(|d| d.1.contains(q)).count() as f32;
                let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln();
                score += idf * tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * ts.len() as f32 / avg));
            }
            if any {
                out.push(((*id).clone(), score));
            }
        }
        out
    }

    proptest::proptest! {
        /// Seeded inserts, replacements and removes: the interned index scores every query as BM25 over the live
        /// texts does, a text scored from its counts as the same text in the index, and the index holds no term or
        /// posting that no live text has.
        #[test]
        fn the_index_equals_bm25_over_the_live_texts(
            ops in proptest::collection::vec(
                (0usize..12, proptest::collection::vec(0usize..9, 0..6), proptest::bool::weighted(0.2)),
                1..60,
            ),
            query in proptest::collection::vec(0usize..9, 1..4),
        ) {
            const WORDS: [&str; 9] = ["apple", "apples", "pear", "plum", "chess", "club", "friday", "dog", "park"];
            let text = |ws: &[usize]| ws.iter().map(|w| WORDS[*w]).collect::<Vec<_>>().join(" ");
            let mut ix = LexicalIndex::default();
            let mut live = std::collections::BTreeMap::new();
            for (doc, ws, delete) in &ops {
                let id = format!("d{doc}");
                if *delete {
                    ix.remove(&id);
                    live.remove(&id);
                } else {
                    ix.insert(&id, &text(ws));
                    live.insert(id, text(ws));
                }
            }
            let q = text(&query);
            for ix in [&ix, &ix.clone()] {
                let got: std::collections::BTreeMap<&str, f32> = ix.search(&q).into_iter().collect();
                let want = bm25_reference(&live, &q);
                proptest::prop_assert_eq!(got.len(), want.len());
                for (id, s) in &want {
                    let g = got.get(id.as_str()).copied();
                    let close = g.is_some_and(|g| (g - s).abs() <= 1e-4 * s.abs().max(1.0));
                    proptest::prop_assert!(close, "{id}: {g:?} vs {s}");
                }
                // A text scored from its counts (a summary's path) scores as the same text in the index does.
                for (id, t) in &live {
                    let from_counts = ix.score_text(&terms(&q), t);
                    let indexed = got.get(id.as_str()).copied().unwrap_or(0.0);
                    let close = (from_counts - indexed).abs() <= 1e-4 * indexed.abs().max(1.0);
                    proptest::prop_assert!(close, "{id}: {from_counts} vs {indexed}");
                }
                proptest::prop_assert_eq!(ix.len(), live.len());
                let live_terms: std::collections::BTreeSet<String> = live.values().flat_map(|t| terms(t)).collect();
                proptest::prop_assert_eq!(ix.terms.len(), live_terms.len());
            }
        }
    }
}
