//! How a call's tensors sit in memory: element strides, a paged cache's geometry, and what a
//! per-sequence lengths buffer means. Plain descriptions, shared by validation, planning and
//! launch.

use super::params::{AttentionParams, Layout};

/// Element strides of a 4-D attention tensor's (batch, seq, head) dims; the head-dim stride is
/// 1. A dim of extent 1 may carry any stride (it is never stepped over).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Strides {
    pub batch: i64,
    pub seq: i64,
    pub head: i64,
}

impl Strides {
    /// Strides of a contiguous tensor in `layout`.
    pub fn contiguous(layout: Layout, seqlen: usize, heads: usize, head_dim: usize) -> Strides {
        let [b, s, h] = layout.strides(seqlen, heads, head_dim);
        Strides {
            batch: b as i64,
            seq: s as i64,
            head: h as i64,
        }
    }

    pub(crate) fn as_array(self) -> [i64; 3] {
        [self.batch, self.seq, self.head]
    }

    /// Extent-1 dims get a stride TMA accepts (any value is right for them: only index 0 exists).
    pub(crate) fn normalized(self, extents: [usize; 3], head_dim: usize) -> Strides {
        let fix = |stride: i64, extent: usize| {
            if extent == 1 {
                head_dim as i64
            } else {
                stride
            }
        };
        Strides {
            batch: fix(self.batch, extents[0]),
            seq: fix(self.seq, extents[1]),
            head: fix(self.head, extents[2]),
        }
    }
}

/// A caller-owned device tensor: base address and element strides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DeviceTensor {
    pub ptr: u64,
    pub strides: Strides,
}

/// A paged KV cache's geometry: K and V are pools of `num_pages` pages of `page_size` rows
/// (`[num_pages, page_size, heads_kv, head_dim]`); sequence b's row r lives in page
/// `block_table[b][r / page_size]`, row `r % page_size`. The capacity `seqlen_k` is the table's
/// row length times `page_size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Pages {
    /// Rows per page: a power of two, at least [`MIN_PAGE_SIZE`].
    pub page_size: usize,
    pub num_pages: usize,
}

impl Pages {
    /// Elements of one pool (K or V) for `p`'s heads and head dim.
    pub fn pool_len(&self, p: &AttentionParams) -> usize {
        self.num_pages * self.page_size * p.heads_kv * p.head_dim
    }

    /// The pool row holding sequence `b`'s cache row `r`, through `table` (`[batch, seqlen_k /
    /// page_size]`, entries already checked against the pool).
    pub fn pool_row(&self, table: &[i32], seqlen_k: usize, b: usize, r: usize) -> usize {
        let page = table[b * (seqlen_k / self.page_size) + r / self.page_size] as usize;
        page * self.page_size + r % self.page_size
    }
}

/// The smallest page: one TMA box of 16 rows keeps the 128-byte swizzle of a whole block.
pub const MIN_PAGE_SIZE: usize = 16;

/// What the per-sequence lengths buffer of a plan means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Lengths {
    /// No lengths: every sequence fills the shape.
    None,
    /// Secret-length prefill (Sq = Sk): each sequence's true length inside the padded one;
    /// query rows and keys past it are masked.
    SecretPadded,
    /// KV cache (decode, Sq ≤ [`super::MAX_SEQLEN_Q`]): each sequence's key count in a cache of
    /// capacity Sk; the Sq queries are the last positions of those keys (a causal mask is
    /// aligned to the count). The counts are public metadata (the walk ends at each count), or
    /// with `secret` kept secret (the kernel walks the capacity and masks by select). `pages`:
    /// a paged cache, K and V pools of `[num_pages, page_size, Hkv, D]` read through a block
    /// table of `[batch, Sk / page_size]` page indices (public). `prefill_consistent`: one work
    /// unit per tile over the whole key range instead of capacity-sized splits, so each query
    /// row gets exactly the bits of the same row of a causal prefill over the same keys
    /// (`DecodeSchedule::new` in the decode planner).
    KvCache {
        secret: bool,
        pages: Option<Pages>,
        prefill_consistent: bool,
    },
}

impl Lengths {
    /// A KV-cache mode (split-KV, not prefill-consistent).
    pub fn kv_cache(secret: bool, pages: Option<Pages>) -> Lengths {
        Lengths::KvCache {
            secret,
            pages,
            prefill_consistent: false,
        }
    }

    /// The same KV-cache mode, prefill-consistent (no effect on other modes).
    pub fn prefill_consistent(self) -> Lengths {
        match self {
            Lengths::KvCache { secret, pages, .. } => Lengths::KvCache {
                secret,
                pages,
                prefill_consistent: true,
            },
            other => other,
        }
    }

    /// Whether decode runs one unit per tile (bits of the causal prefill's rows).
    pub fn is_prefill_consistent(self) -> bool {
        matches!(
            self,
            Lengths::KvCache {
                prefill_consistent: true,
                ..
            }
        )
    }

    /// The paged cache's geometry, if any.
    pub fn pages(self) -> Option<Pages> {
        match self {
            Lengths::KvCache { pages, .. } => pages,
            _ => None,
        }
    }
}
