//! Prompt lookup (n-gram) drafting: the context often repeats itself (a rewrite of a given
//! text, code that reuses its names), so what followed the last occurrence of the context's
//! final n tokens is a cheap guess at what follows now.

use super::{Draft, Drafter};
use crate::decode::SequenceDecoder;
use crate::error::{Error, Result};

/// Drafts by prompt lookup: for n from `ngram_max` down to `ngram_min`, finds the most recent
/// earlier occurrence of the context's last n tokens and proposes the tokens that followed it.
/// Its drafts are point masses, so verification is the target's own selection.
#[derive(Clone, Debug)]
pub struct PromptLookup {
    ngram_min: usize,
    ngram_max: usize,
}

impl PromptLookup {
    /// # Errors
    /// [`Error::InvalidArgument`] unless 1 <= `ngram_min` <= `ngram_max`.
    pub fn new(ngram_min: usize, ngram_max: usize) -> Result<PromptLookup> {
        if ngram_min == 0 || ngram_min > ngram_max {
            return Err(Error::invalid_argument(
                "ngram",
                format!("needs 1 <= ngram_min <= ngram_max, got {ngram_min} and {ngram_max}"),
            ));
        }
        Ok(PromptLookup { ngram_min, ngram_max })
    }

    /// Up to `n` tokens that followed the most recent earlier occurrence of the longest
    /// matching suffix of `context` (empty when none matches).
    pub fn lookup(&self, context: &[u32], n: usize) -> Vec<u32> {
        let len = context.len();
        for size in (self.ngram_min..=self.ngram_max.min(len.saturating_sub(1))).rev() {
            let suffix = &context[len - size..];
            // Occurrences starting at i < len - size, most recent first; i + size < len, so
            // at least one token follows.
            if let Some(i) = (0..len - size).rev().find(|&i| &context[i..i + size] == suffix) {
                let start = i + size;
                return context[start..len.min(start + n)].to_vec();
            }
        }
        Vec::new()
    }
}

impl Drafter for PromptLookup {
    fn propose(&mut self, seq: &SequenceDecoder, n: usize) -> Result<Draft> {
        Ok(Draft { tokens: self.lookup(seq.context(), n), distributions: Vec::new() })
    }

    fn draws_from_distributions(&self, _seq: &SequenceDecoder) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_most_recent_longest_match_is_proposed() {
        let d = PromptLookup::new(1, 3).unwrap();
        // "1 2 3" occurs twice before the final "1 2 3": the later one is followed by 9 9.
        let ctx = [1, 2, 3, 4, 5, 1, 2, 3, 9, 9, 7, 1, 2, 3];
        assert_eq!(d.lookup(&ctx, 2), vec![9, 9]);
        assert_eq!(d.lookup(&ctx, 10), vec![9, 9, 7, 1, 2, 3]);
        // No 3-gram or 2-gram match: the 1-gram "8" matches.
        assert_eq!(d.lookup(&[8, 6, 5, 8], 2), vec![6, 5]);
        assert_eq!(d.lookup(&[1, 2, 3], 4), Vec::<u32>::new());
        assert_eq!(PromptLookup::new(2, 3).unwrap().lookup(&[8, 6, 5, 8], 2), Vec::<u32>::new());
        assert!(PromptLookup::new(0, 3).is_err());
        assert!(PromptLookup::new(3, 2).is_err());
    }
}
