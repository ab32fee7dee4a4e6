//! Answer scores for `engram eval`, as the papers compute them: token F1 and BLEU-1 for LoCoMo (CompassMem's scoring:
//! lowercase, strip `.,!?`, split on whitespace) and ROUGE-L for QMSum (rouge-score's: lowercase, every run of
//! characters other than a–z and 0–9 is a separator; the F-measure of the longest common subsequence).

use std::collections::HashMap;

/// CompassMem's normalisation: lowercase, `.,!?` removed, whitespace-separated tokens.
pub fn tokens(s: &str) -> Vec<String> {
    s.to_lowercase().replace(['.', ',', '!', '?'], "").split_whitespace().map(String::from).collect()
}

fn counts(t: &[String]) -> HashMap<&str, usize> {
    let mut m = HashMap::new();
    for w in t {
        *m.entry(w.as_str()).or_default() += 1;
    }
    m
}

/// Clipped unigram matches between `pred` and `gold`.
fn overlap(pred: &[String], gold: &[String]) -> usize {
    let g = counts(gold);
    counts(pred).iter().map(|(w, n)| (*n).min(g.get(w).copied().unwrap_or(0))).sum()
}

/// Token F1 of a predicted answer against the gold one (0 when either is empty).
pub fn f1(pred: &str, gold: &str) -> f64 {
    let (p, g) = (tokens(pred), tokens(gold));
    let common = overlap(&p, &g);
    if common == 0 {
        return 0.0;
    }
    let precision = common as f64 / p.len() as f64;
    let recall = common as f64 / g.len() as f64;
    2.0 * precision * recall / (precision + recall)
}

/// BLEU-1 (nltk's `sentence_bleu` with weights (1, 0, 0, 0)): clipped unigram precision times the brevity penalty.
pub fn bleu1(pred: &str, gold: &str) -> f64 {
    let (p, g) = (tokens(pred), tokens(gold));
    if p.is_empty() || g.is_empty() {
        return 0.0;
    }
    let precision = overlap(&p, &g) as f64 / p.len() as f64;
    let bp = if p.len() >= g.len() { 1.0 } else { (1.0 - g.len() as f64 / p.len() as f64).exp() };
    bp * precision
}

/// rouge-score's tokens: lowercase, split on anything that is not an ASCII letter or digit.
fn rouge_tokens(s: &str) -> Vec<String> {
    s.to_lowercase().split(|c: char| !c.is_ascii_alphanumeric()).filter(|t| !t.is_empty()).map(String::from).collect()
}

fn lcs(a: &[String], b: &[String]) -> usize {
    let mut prev = vec![0usize; b.len() + 1];
    let mut cur = vec![0usize; b.len() + 1];
    for x in a {
        for (j, y) in b.iter().enumerate() {
            cur[j + 1] = if x == y { prev[j] + 1 } else { cur[j].max(prev[j + 1]) };
        }
        std::mem::swap(&mut prev, &mut cur);
    }
    prev[b.len()]
}

/// ROUGE-L F-measure of a predicted answer against the gold one.
pub fn rouge_l(pred: &str, gold: &str) -> f64 {
    let (p, g) = (rouge_tokens(pred), rouge_tokens(gold));
    if p.is_empty() || g.is_empty() {
        return 0.0;
    }
    let l = lcs(&p, &g) as f64;
    if l == 0.0 {
        return 0.0;
    }
    let (precision, recall) = (l / p.len() as f64, l / g.len() as f64);
    2.0 * precision * recall / (precision + recall)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn f1_counts_shared_tokens_after_normalising() {
        assert!(close(f1("7 May 2023", "7 may, 2023."), 1.0));
        // pred {the, cat, sat}, gold {a, cat, sat, down}: 2 shared → P 2/3, R 2/4.
        assert!(close(f1("The cat sat", "a cat sat down"), 2.0 * (2.0 / 3.0) * 0.5 / (2.0 / 3.0 + 0.5)));
        assert_eq!(f1("nothing alike", "entirely different"), 0.0);
        assert_eq!(f1("", "x"), 0.0);
        // Repeated words are clipped to the gold's count.
        assert!(close(f1("paris paris paris", "paris"), 2.0 * (1.0 / 3.0) / (1.0 / 3.0 + 1.0)));
    }

    #[test]
    fn bleu1_is_clipped_precision_with_a_brevity_penalty() {
        assert!(close(bleu1("the cat", "the cat"), 1.0));
        // Shorter than the reference: precision 1, penalty e^(1 - 4/2).
        assert!(close(bleu1("the cat", "the cat sat down"), (1.0f64 - 2.0).exp()));
        // Longer: no penalty; 2 of 4 tokens match.
        assert!(close(bleu1("the cat was here", "the cat"), 0.5));
        assert!(close(bleu1("the the the", "the"), 1.0 / 3.0));
    }

    #[test]
    fn rouge_l_uses_the_longest_common_subsequence() {
        // LCS of "police killed the gunman" and "police kill the gunman" is "police the gunman" (3).
        let r = rouge_l("police killed the gunman", "police kill the gunman");
        assert!(close(r, 0.75), "{r}");
        assert!(close(rouge_l("The team chose Rust.", "the team chose rust"), 1.0));
        assert_eq!(rouge_l("a b", "c d"), 0.0);
        assert_eq!(rouge_l("", "c d"), 0.0);
    }
}
