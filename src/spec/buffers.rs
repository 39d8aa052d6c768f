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
    /// Rows per page: any size of at least [`MIN_PAGE_SIZE`] (one row). Powers of two of at
    /// least [`TMA_PAGE_SIZE`] rows load as TMA boxes; other sizes are gathered row by row
    /// (the same bits, see [`Pages::tma_boxes`]).
    pub page_size: usize,
    pub num_pages: usize,
}

impl Pages {
    /// Elements of one pool (K or V) for `p`'s heads and head dim.
    pub fn pool_len(&self, p: &AttentionParams) -> usize {
        self.num_pages * self.page_size * p.heads_kv * p.head_dim
    }

    /// Whether the kernel loads this cache's K/V blocks as TMA boxes of `min(page_size,
    /// block)` rows (page sizes that are powers of two of at least [`TMA_PAGE_SIZE`] rows); any
    /// other page size is gathered row by row with `cp.async` into the same shared layout, so
    /// the output bits are the same either way. Public: a function of the page size alone.
    pub fn tma_boxes(&self) -> bool {
        self.page_size >= TMA_PAGE_SIZE && self.page_size.is_power_of_two()
    }

    /// The kernels' division by the page size (`page_div` in kernels/fc_common.cuh): `(mul,
    /// shift)` with `n / page_size == (mulhi(n, mul) + n) >> shift` for every `0 ≤ n < 2^31`
    /// (`mul = ⌊2^32 · (2^shift − d) / d⌋ + 1`, `shift = ⌈log2 d⌉`). Page sizes below 2^31.
    pub fn divisor(&self) -> (u32, i32) {
        let d = self.page_size as u64;
        let shift = d.next_power_of_two().trailing_zeros() as u64;
        let mul = (((1u64 << 32) * ((1u64 << shift) - d)) / d + 1) as u32;
        (mul, shift as i32)
    }

    /// The pool row holding sequence `b`'s cache row `r`, through `table` (`[batch, seqlen_k /
    /// page_size]`, entries already checked against the pool).
    pub fn pool_row(&self, table: &[i32], seqlen_k: usize, b: usize, r: usize) -> usize {
        let page = table[b * (seqlen_k / self.page_size) + r / self.page_size] as usize;
        page * self.page_size + r % self.page_size
    }
}

/// The smallest page: one row (SGLang's default page size).
pub const MIN_PAGE_SIZE: usize = 1;

/// The smallest page loaded as TMA boxes: one box of 16 rows keeps the 128-byte swizzle of a
/// whole block. Smaller pages, and pages whose size is not a power of two, are gathered.
pub const TMA_PAGE_SIZE: usize = 16;

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

#[cfg(test)]
mod page_tests {
    use super::*;

    fn pages(page_size: usize) -> Pages {
        Pages {
            page_size,
            num_pages: 1,
        }
    }

    /// The kernels' multiply-shift division (`page_div`, evaluated here as the device does in
    /// 32-bit arithmetic) equals integer division for every page size tried, over small keys
    /// exhaustively and across the whole i32 range by steps.
    #[test]
    fn divisor_divides_like_the_kernels() {
        let dev = |n: u32, (mul, shift): (u32, i32)| {
            let hi = ((n as u64 * mul as u64) >> 32) as u32;
            (hi.wrapping_add(n)) >> shift
        };
        let sizes = (1..=300usize).chain([1000, 4095, 4096, 4097, 65537, 1 << 20, (1 << 30) + 7]);
        for d in sizes {
            let dv = pages(d).divisor();
            for n in (0u32..20_000).chain((0..2000u32).map(|i| i * 1_073_741 + i)) {
                let n = n.min(i32::MAX as u32);
                assert_eq!(dev(n, dv) as usize, n as usize / d, "{n} / {d}");
            }
            assert_eq!(
                dev(i32::MAX as u32, dv) as usize,
                i32::MAX as usize / d,
                "max / {d}"
            );
        }
    }

    #[test]
    fn tma_boxes_only_for_powers_of_two_of_16_rows_or_more() {
        for d in [16, 32, 64, 128, 256, 1024] {
            assert!(pages(d).tma_boxes(), "{d}");
        }
        for d in [1, 2, 4, 7, 8, 15, 24, 48, 100, 384] {
            assert!(!pages(d).tma_boxes(), "{d}");
        }
    }
}
