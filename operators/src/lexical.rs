//! The lexical side of retrieval: an analyzer (words, stop words, Snowball English stems) and a BM25 index over a
//! space's layer-0 texts, kept in step with the views (a text in, a text out). Dense embeddings miss what a reader
//! finds by the word — a name, a rare noun, a plural of the query's term; retrieval fuses both (`pipeline::query`).

use std::collections::HashMap;

use crate::embed::words;

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
    tf: HashMap<String, u32>,
    len: u32,
}

impl TermCounts {
    pub fn of(text: &str) -> Self {
        let ts = terms(text);
        let mut tf: HashMap<String, u32> = HashMap::new();
        for t in &ts {
            *tf.entry(t.clone()).or_default() += 1;
        }
        TermCounts { tf, len: ts.len() as u32 }
    }
}

/// A query's terms, each once (a repeated query term counts once in BM25).
fn distinct(query: &[String]) -> Vec<&String> {
    let mut qs: Vec<&String> = query.iter().collect();
    qs.sort();
    qs.dedup();
    qs
}

/// BM25's term-frequency saturation and length normalisation (the usual defaults).
pub const K1: f32 = 1.2;
pub const B: f32 = 0.75;

/// A BM25 index over documents named by id. `insert` of an id already present replaces its text.
#[derive(Default, Clone, Debug)]
pub struct LexicalIndex {
    /// term → (document → term frequency).
    postings: HashMap<String, HashMap<String, u32>>,
    /// document → (its length in terms, its distinct terms).
    docs: HashMap<String, (u32, Vec<String>)>,
    total_len: u64,
}

impl LexicalIndex {
    pub fn len(&self) -> usize {
        self.docs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.docs.is_empty()
    }

    pub fn insert(&mut self, id: &str, text: &str) {
        self.remove(id);
        let counts = TermCounts::of(text);
        let mut distinct: Vec<String> = Vec::with_capacity(counts.tf.len());
        for (t, f) in counts.tf {
            self.postings.entry(t.clone()).or_default().insert(id.to_string(), f);
            distinct.push(t);
        }
        self.total_len += u64::from(counts.len);
        self.docs.insert(id.to_string(), (counts.len, distinct));
    }

    pub fn remove(&mut self, id: &str) {
        let Some((len, distinct)) = self.docs.remove(id) else { return };
        self.total_len -= u64::from(len);
        for t in distinct {
            if let Some(p) = self.postings.get_mut(&t) {
                p.remove(id);
                if p.is_empty() {
                    self.postings.remove(&t);
                }
            }
        }
    }

    /// Inverse document frequency of a term (BM25's, never negative); 0 for a term no document has.
    pub fn idf(&self, term: &str) -> f32 {
        let n = self.docs.len() as f32;
        match self.postings.get(term) {
            Some(p) => {
                let df = p.len() as f32;
                (1.0 + (n - df + 0.5) / (df + 0.5)).ln()
            }
            None => 0.0,
        }
    }

    fn avg_len(&self) -> f32 {
        if self.docs.is_empty() {
            1.0
        } else {
            (self.total_len as f32 / self.docs.len() as f32).max(1.0)
        }
    }

    fn weight(&self, tf: f32, len: f32) -> f32 {
        tf * (K1 + 1.0) / (tf + K1 * (1.0 - B + B * len / self.avg_len()))
    }

    /// BM25 of every document that shares a term with the query (each distinct query term counted once).
    pub fn search(&self, query: &str) -> HashMap<&str, f32> {
        self.search_terms(&terms(query))
    }

    /// [`Self::search`] for query terms already analysed (see [`terms`]).
    pub fn search_terms(&self, query: &[String]) -> HashMap<&str, f32> {
        let mut out: HashMap<&str, f32> = HashMap::new();
        for t in distinct(query) {
            let Some(p) = self.postings.get(t) else { continue };
            let idf = self.idf(t);
            for (id, f) in p {
                let len = self.docs.get(id).map_or(0, |d| d.0) as f32;
                *out.entry(id.as_str()).or_default() += idf * self.weight(*f as f32, len);
            }
        }
        out
    }

    /// BM25 of a text that is not in the index (a cluster's summary), against the index's statistics.
    pub fn score_text(&self, query: &[String], text: &str) -> f32 {
        self.score_counts(query, &TermCounts::of(text))
    }

    /// [`Self::score_text`] for a text whose terms are already counted.
    pub fn score_counts(&self, query: &[String], text: &TermCounts) -> f32 {
        distinct(query)
            .into_iter()
            .filter_map(|q| text.tf.get(q).map(|f| self.idf(q) * self.weight(*f as f32, text.len as f32)))
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
        assert!(ix.postings.is_empty());
    }

    #[test]
    fn a_summary_is_scored_against_the_index() {
        let mut ix = LexicalIndex::default();
        ix.insert("a", "chess club on friday");
        ix.insert("b", "football on sunday");
        assert!(ix.score_text(&terms("chess"), "They play chess") > 0.0);
        assert_eq!(ix.score_text(&terms("chess"), "They play cards"), 0.0);
    }
}
