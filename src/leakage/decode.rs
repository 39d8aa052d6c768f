//! Decode mode of the leakage test: the KV-cache decode call — Sq ≤ 16 new queries
//! per sequence over a cache of public capacity S (`--seqlen`), GQA heads, the split-KV main
//! kernel and its combine kernel timed together — with each sequence's key count
//! (`cache_seqlens`) as the secret. The classes are the secret-length ones: a fixed count (0, 1,
//! S/2, S for every sequence) against counts drawn uniformly from [0, S] per sequence and per
//! launch; Q, K and V are the same random sets in both classes.
//!
//! * **Secret counts** (the default): the shipped secret-count build
//!   (`Context::plan_kv_cache(.., secret: true, ..)`) walks the whole capacity and masks by
//!   select, so the time must not depend on the counts.
//! * **Public counts** (`--public-counts`): the same call on the public-count build, whose walk
//!   ends at each count — a deliberately leaky comparison that the test must fail (its power
//!   check in decode mode, where the prefill control kernels do not apply).
//! * **Paged** (`--page-size N`): K and V are pools of `batch · S / N` pages read through one
//!   block table (public, shared by every launch of both classes): pages in a fixed random order
//!   (default) or in order.
//!
//! Neither the cycle-timer build nor the hardware floor applies: the decode call is two kernels
//! (the timer's records cover one), no decode build of either exists, and a floor would mask by
//! the secret count as the shipped kernel does (as in secret-length prefill), so it would carry
//! the secret. A time difference in decode mode is therefore not attributed: it fails.
//!
//! Everything here is GPU-free.

use crate::attention::{AttentionParams, Pages};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::{Deserialize, Serialize};

/// What a decode-mode run times.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DecodeConfig {
    /// The counts are secret (the shipped secret-count build), or public (the walk ends at each
    /// count: the comparison that must leak).
    pub secret_counts: bool,
    /// A paged cache of pages of this many rows (any size ≥ 1 dividing the capacity).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub page_size: Option<usize>,
    /// The block table's order: a fixed random permutation of the pool (true) or the identity.
    #[serde(default)]
    pub shuffled_pages: bool,
}

impl DecodeConfig {
    /// Secret counts, contiguous cache.
    pub fn secret() -> DecodeConfig {
        DecodeConfig {
            secret_counts: true,
            page_size: None,
            shuffled_pages: false,
        }
    }

    /// The paged cache's geometry for `p`: one pool of `batch · capacity / page_size` pages
    /// (every sequence's capacity backed by its own pages; none for a page of no row, which
    /// [`DecodeConfig::validate`]'s page check refuses).
    pub fn pages(&self, p: &AttentionParams) -> Option<Pages> {
        self.page_size.map(|page_size| Pages {
            page_size,
            num_pages: if page_size == 0 {
                0
            } else {
                p.batch * p.seqlen_k.div_ceil(page_size)
            },
        })
    }

    /// "secret counts" / "public counts", with the paging, for titles.
    pub fn describe(&self) -> String {
        let counts = if self.secret_counts {
            "secret counts"
        } else {
            "public counts"
        };
        match self.page_size {
            Some(ps) => format!(
                "{counts}, paged {ps} ({})",
                if self.shuffled_pages {
                    "shuffled"
                } else {
                    "identity"
                }
            ),
            None => format!("{counts}, contiguous"),
        }
    }

    /// The checks that need no device: the KV-cache call's and the paged cache's (the same
    /// ones `Context::plan_kv_cache` makes).
    pub fn validate(&self, p: &AttentionParams) -> Result<(), String> {
        use crate::attention::validate;
        validate::check_params(p).map_err(|e| e.to_string())?;
        validate::check_kv_cache(p).map_err(|e| e.to_string())?;
        if let Some(pg) = self.pages(p) {
            validate::check_pages(p, &pg).map_err(|e| e.to_string())?;
        }
        Ok(())
    }
}

/// The block table of a paged run, `[batch, pages_per_seq]` page indices into a pool of
/// `batch · pages_per_seq` pages: every page used once, in order (`shuffled` false) or in a
/// random order fixed by `seed`.
pub fn block_table(batch: usize, pages_per_seq: usize, shuffled: bool, seed: u64) -> Vec<i32> {
    let mut t: Vec<i32> = (0..(batch * pages_per_seq) as i32).collect();
    if shuffled {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x0B10_C7AB);
        t.shuffle(&mut rng);
    }
    t
}
