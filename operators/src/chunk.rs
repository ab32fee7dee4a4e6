//! Chunking as CAM does it: paragraphs packed greedily up to a token budget; a paragraph over the budget is cut at
//! sentence ends, and a sentence over the budget at word boundaries. A token here is a whitespace-separated word: a
//! deterministic, model-free count that tracks sub-word tokenisers within a small factor for prose.

/// Splits `text` into chunks of at most `budget` tokens (words). Never returns an empty chunk; returns one chunk for a
/// text within the budget.
pub fn chunk_text(text: &str, budget: usize) -> Vec<String> {
    let budget = budget.max(1);
    let mut pieces: Vec<(String, usize)> = Vec::new();
    for para in paragraphs(text) {
        let n = count_tokens(para);
        if n <= budget {
            pieces.push((para.to_string(), n));
        } else {
            for sentence in sentences(para) {
                let m = count_tokens(sentence);
                if m <= budget {
                    pieces.push((sentence.to_string(), m));
                } else {
                    let words: Vec<&str> = sentence.split_whitespace().collect();
                    for w in words.chunks(budget) {
                        pieces.push((w.join(" "), w.len()));
                    }
                }
            }
        }
    }
    let mut chunks = Vec::new();
    let mut cur = String::new();
    let mut cur_n = 0;
    for (p, n) in pieces {
        if cur_n > 0 && cur_n + n > budget {
            chunks.push(std::mem::take(&mut cur));
            cur_n = 0;
        }
        if !cur.is_empty() {
            cur.push_str("\n\n");
        }
        cur.push_str(&p);
        cur_n += n;
    }
    if cur_n > 0 {
        chunks.push(cur);
    }
    chunks
}

pub fn count_tokens(s: &str) -> usize {
    s.split_whitespace().count()
}

fn paragraphs(text: &str) -> impl Iterator<Item = &str> {
    text.split("\n\n").map(str::trim).filter(|p| !p.is_empty())
}

/// Sentence ends: `.`, `!` or `?` (optionally followed by closing quotes or brackets) and then whitespace.
fn sentences(para: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let chars: Vec<(usize, char)> = para.char_indices().collect();
    let mut i = 0;
    while i < chars.len() {
        let (_, c) = chars[i];
        if matches!(c, '.' | '!' | '?') {
            let mut j = i + 1;
            while j < chars.len() && matches!(chars[j].1, '"' | '\'' | ')' | ']' | '”' | '’') {
                j += 1;
            }
            if j == chars.len() || chars[j].1.is_whitespace() {
                let end = if j == chars.len() { para.len() } else { chars[j].0 };
                let s = para[start..end].trim();
                if !s.is_empty() {
                    out.push(s);
                }
                start = end;
                i = j;
                continue;
            }
        }
        i += 1;
    }
    let rest = para[start..].trim();
    if !rest.is_empty() {
        out.push(rest);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_one_chunk() {
        assert_eq!(chunk_text("One two three.", 512), vec!["One two three."]);
    }

    #[test]
    fn paragraphs_pack_greedily() {
        let text = "a b c\n\nd e\n\nf g h i";
        assert_eq!(chunk_text(text, 5), vec!["a b c\n\nd e", "f g h i"]);
    }

    #[test]
    fn long_paragraph_cut_at_sentences_then_words() {
        let text = "One two three. Four five six! Seven eight nine ten eleven twelve.";
        let chunks = chunk_text(text, 4);
        assert_eq!(chunks, vec!["One two three.", "Four five six!", "Seven eight nine ten", "eleven twelve."]);
        for c in chunks {
            assert!(count_tokens(&c) <= 4);
        }
    }

    #[test]
    fn every_word_survives() {
        let text = "Alpha beta. Gamma delta epsilon.\n\nZeta eta theta iota kappa lambda mu.\n\n\n\nNu xi.";
        let chunks = chunk_text(text, 3);
        let words: Vec<String> = chunks.iter().flat_map(|c| c.split_whitespace().map(String::from)).collect();
        let orig: Vec<String> = text.split_whitespace().map(String::from).collect();
        assert_eq!(words, orig);
    }
}
