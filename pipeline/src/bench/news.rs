//! A synthetic news stream for `engram bench scale`: documents of 1–8 chunks over a Zipfian vocabulary, each
//! document about one topic (its topic words mixed into the background words), agency boilerplate shared by many
//! documents, 5 % exact re-publications and 10 % near-duplicates of earlier documents, and topics that drift: the
//! topics in the news move along the topic list as the stream goes on. Deterministic for a seed.

use serde_json::{json, Value};

/// splitmix64: small, fast and good enough for a workload generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n`.
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    fn chance(&mut self, p: f64) -> bool {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }
}

const VOCABULARY: usize = 50_000;
const TOPICS: usize = 2_000;
const TOPIC_WORDS: usize = 12;
/// Topics in the news at one time: a window that slides along the topic list.
const LIVE_TOPICS: usize = 150;

const SYLLABLES: &[&str] = &[
    "ka", "lo", "mi", "ne", "ru", "sa", "te", "vi", "do", "pe", "an", "or", "el", "ix", "ul", "by", "qua", "zen",
    "tor", "mar", "lin", "gor", "fes", "hal", "pri", "sto", "wen", "cla", "dri", "bel",
];

const BOILERPLATE: &[&str] = &[
    "Reporting by our staff correspondents; editing by the news desk.",
    "All rights reserved. This article may not be republished without permission.",
    "Sign up for our daily briefing to get the top stories in your inbox.",
    "Follow our live coverage for the latest updates as the story develops.",
];

fn word(i: usize) -> String {
    let mut i = i + 1;
    let mut w = String::new();
    while i > 0 {
        w.push_str(SYLLABLES[i % SYLLABLES.len()]);
        i /= SYLLABLES.len();
    }
    w
}

/// The generator: call [`News::next_doc`] for the next document's chunk records.
pub struct News {
    rng: Rng,
    space: String,
    /// Cumulative Zipf (s = 1) weights over the vocabulary.
    zipf: Vec<f64>,
    words: Vec<String>,
    docs: usize,
    /// Earlier documents' chunk texts, for re-publications and near-duplicates (a bounded recent window).
    recent: Vec<Vec<String>>,
}

/// The stream `bench scale` grows its synthetic space from, and `bench news` writes.
pub fn stream() -> News {
    News::new("news", 42)
}

/// `engram bench news`: the first `max(--sizes)` chunk records of [`stream`], one JSON object a line.
pub(super) fn write_records(args: &super::BenchArgs) -> anyhow::Result<std::process::ExitCode> {
    use std::io::Write;
    let n = args.sizes.iter().copied().max().unwrap_or(0);
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let mut news = stream();
    let mut written = 0;
    while written < n {
        for r in news.next_doc().into_iter().take(n - written) {
            writeln!(out, "{r}")?;
            written += 1;
        }
    }
    out.flush()?;
    Ok(std::process::ExitCode::SUCCESS)
}

impl News {
    pub fn new(space: &str, seed: u64) -> News {
        let mut acc = 0.0;
        let zipf = (1..=VOCABULARY)
            .map(|r| {
                acc += 1.0 / r as f64;
                acc
            })
            .collect();
        News {
            rng: Rng(seed),
            space: space.into(),
            zipf,
            words: (0..VOCABULARY + TOPICS * TOPIC_WORDS).map(word).collect(),
            docs: 0,
            recent: Vec::new(),
        }
    }

    fn zipf_word(&mut self) -> &str {
        let total = *self.zipf.last().expect("vocabulary");
        let x = (self.rng.next() >> 11) as f64 / (1u64 << 53) as f64 * total;
        let i = self.zipf.partition_point(|c| *c < x).min(VOCABULARY - 1);
        &self.words[i]
    }

    fn topic_word(&mut self, topic: usize) -> &str {
        let i = VOCABULARY + topic * TOPIC_WORDS + self.rng.below(TOPIC_WORDS);
        &self.words[i]
    }

    fn sentence(&mut self, topic: usize) -> String {
        let n = 8 + self.rng.below(14);
        let mut s: Vec<String> = Vec::with_capacity(n);
        for _ in 0..n {
            let w = if self.rng.chance(0.3) { self.topic_word(topic) } else { self.zipf_word() };
            s.push(w.to_string());
        }
        let mut out = s.join(" ");
        if let Some(c) = out.get_mut(0..1) {
            c.make_ascii_uppercase();
        }
        out.push('.');
        out
    }

    fn fresh_doc(&mut self) -> Vec<String> {
        // Drift: the live window moves one topic every 200 documents.
        let base = self.docs / 200;
        let topic = (base + self.rng.below(LIVE_TOPICS)) % TOPICS;
        let chunks = 1 + self.rng.below(8);
        let mut out = Vec::with_capacity(chunks);
        for c in 0..chunks {
            let sentences = 3 + self.rng.below(4);
            let mut text: Vec<String> = (0..sentences).map(|_| self.sentence(topic)).collect();
            if c + 1 == chunks && self.rng.chance(0.6) {
                text.push(BOILERPLATE[self.rng.below(BOILERPLATE.len())].to_string());
            }
            out.push(text.join(" "));
        }
        out
    }

    /// The next document's chunk records.
    pub fn next_doc(&mut self) -> Vec<Value> {
        let texts = if !self.recent.is_empty() && self.rng.chance(0.05) {
            // An exact re-publication (another outlet, another id).
            self.recent[self.rng.below(self.recent.len())].clone()
        } else if !self.recent.is_empty() && self.rng.chance(0.1 / 0.95) {
            // A near-duplicate: an update of an earlier story, a few words changed.
            let mut t = self.recent[self.rng.below(self.recent.len())].clone();
            for chunk in &mut t {
                let mut words: Vec<String> = chunk.split(' ').map(String::from).collect();
                for _ in 0..(1 + words.len() / 20) {
                    let at = self.rng.below(words.len());
                    words[at] = self.zipf_word().to_string();
                }
                *chunk = words.join(" ");
            }
            t
        } else {
            self.fresh_doc()
        };
        if self.recent.len() < 2_000 {
            self.recent.push(texts.clone());
        } else {
            let at = self.rng.below(self.recent.len());
            self.recent[at] = texts.clone();
        }
        let doc = format!("wire-{:07}", self.docs);
        self.docs += 1;
        let day = self.docs / 500;
        texts
            .into_iter()
            .enumerate()
            .map(|(seq, text)| {
                json!({"space": self.space, "kind": "chunk", "doc": doc, "seq": seq, "text": text,
                       "ts": format!("2026-{:02}-{:02}T12:00:00Z", 1 + (day / 28) % 12, 1 + day % 28)})
            })
            .collect()
    }

    /// A question about a topic in the news now: a few of its words.
    pub fn question(&mut self) -> String {
        let topic = (self.docs / 200 + self.rng.below(LIVE_TOPICS)) % TOPICS;
        let words: Vec<String> = (0..4).map(|_| self.topic_word(topic).to_string()).collect();
        format!("What happened with {}?", words.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_is_deterministic_and_has_its_duplicates() {
        let mut a = News::new("news", 7);
        let mut b = News::new("news", 7);
        let docs_a: Vec<Vec<Value>> = (0..400).map(|_| a.next_doc()).collect();
        let docs_b: Vec<Vec<Value>> = (0..400).map(|_| b.next_doc()).collect();
        assert_eq!(docs_a, docs_b);
        let texts: Vec<Vec<&str>> =
            docs_a.iter().map(|d| d.iter().map(|c| c["text"].as_str().unwrap()).collect()).collect();
        assert!(texts.iter().all(|d| (1..=8).contains(&d.len())));
        let mut exact = 0;
        for (i, d) in texts.iter().enumerate() {
            if texts[..i].contains(d) {
                exact += 1;
            }
        }
        // 5 % re-publications, give or take.
        assert!((8..=40).contains(&exact), "{exact} exact re-publications in 400");
        let ids: std::collections::BTreeSet<&str> = docs_a.iter().map(|d| d[0]["doc"].as_str().unwrap()).collect();
        assert_eq!(ids.len(), 400, "every document has its own id");
    }
}
