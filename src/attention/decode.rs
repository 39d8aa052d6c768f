//! Decode mode (`kernels/fc_decode.cuh`): calls with few query positions over long key ranges —
//! generation steps, speculative verification. GQA packing puts the query heads that share a K/V
//! head into the rows of one tile; split-KV cuts each tile's key range into work units of a fixed
//! size, whose partial results a second kernel merges in a fixed order.
//!
//! Every choice here is a function of one sequence's shape (Sq, Sk, the head group): never of
//! the batch or the SM count. So a sequence's output bits do not depend on what else is in the
//! batch (`tests/gpu_decode.rs` checks it bitwise).

pub(crate) use crate::abi::CombineParams;
use crate::error::{Error, Result};
use crate::kernels::Tile;
use crate::spec::AttentionParams;
use crate::spec::Lengths;
pub use crate::spec::{Pages, MAX_SEQLEN_Q, MIN_PAGE_SIZE, TMA_PAGE_SIZE};

pub use crate::kernels::select::decode as variant_for;

/// Query heads packed into one tile's rows: the largest power of two that divides the group
/// (Hq / Hkv) and fits 64 rows. Every head of a pack reads the same K/V head.
pub fn pack_for(group: usize) -> usize {
    let mut pack = 1;
    while pack < 64 && group % (2 * pack) == 0 {
        pack *= 2;
    }
    pack
}

/// K/V blocks per split, a function of Sk alone: eight splits of 8 to 32 blocks (1k to 4k
/// keys) up to 64k keys; past that, splits of 16 blocks. Measured on the H100 over the decode
/// suite (PERF_NOTES step 20): once the GPU is full, longer units are faster (each unit's Q load,
/// pipeline fill and partial write are fixed costs; 32-block units beat 8-block ones by 2–6% at
/// large batch), while one sequence needs enough units to spread over the SMs: eight splits of
/// 8 blocks at 8k keys beat four of 16 by 26% at B = 1. Past 64k keys a cache is usually one
/// long request, and a single K/V head (MQA) needs at least 64 units there: 16-block splits give
/// that (30.1 µs against 40.5 with 32 blocks at B = 1 over 131k keys) for 1.4% at GQA.
pub fn split_blocks_for(seqlen_k: usize, block_n: usize) -> usize {
    if let Some(n) = crate::knobs::decode_split_blocks() {
        return n;
    }
    let key_blocks = seqlen_k.div_ceil(block_n);
    if key_blocks > 512 {
        16
    } else {
        key_blocks.div_ceil(8).clamp(8, 32)
    }
}

/// The decode grid: which work units exist and how many CTAs walk them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeSchedule {
    pub pack: usize,
    /// Query tiles per (batch, pack): ceil(Sq / (64 / pack)).
    pub m_blocks: usize,
    pub split_blocks: usize,
    /// Splits per tile: ceil(key blocks / split_blocks).
    pub num_splits: usize,
    /// batch · (Hq / pack) · m_blocks · num_splits.
    pub units: usize,
    /// Persistent CTAs: one per SM at most.
    pub ctas: u32,
}

impl DecodeSchedule {
    /// The grid. Splits come from Sk (a KV cache's capacity) in every mode; with public
    /// KV-cache counts a short sequence's units past its count get no blocks and write empty
    /// partials. In the prefill-consistent mode ([`Lengths::is_prefill_consistent`]) every tile
    /// is one unit over the whole key range: the walk, block by block from key 0, and the
    /// epilogue are then the causal prefill's, so each row gets the prefill row's bits.
    pub fn new(
        p: &AttentionParams,
        tile: &Tile,
        num_sms: usize,
        lengths: Lengths,
    ) -> Result<DecodeSchedule> {
        let pack = pack_for(p.heads_q / p.heads_kv);
        let m_blocks = p.seqlen_q.div_ceil(tile.block_m / pack);
        let key_blocks = p.seqlen_k.div_ceil(tile.block_n);
        let split_blocks = if lengths.is_prefill_consistent() {
            key_blocks.max(1)
        } else {
            split_blocks_for(p.seqlen_k, tile.block_n)
        };
        let num_splits = key_blocks.div_ceil(split_blocks);
        let units =
            p.batch as u128 * (p.heads_q / pack) as u128 * m_blocks as u128 * num_splits as u128;
        let rows = p.batch as u128 * p.heads_q as u128 * p.seqlen_q as u128;
        // The kernels index units, rows · splits partials and rows · D/4 combine threads in i32.
        let limit = i32::MAX as u128;
        if units > limit
            || rows * num_splits as u128 > limit
            || rows * (p.head_dim as u128 / 4) > limit
        {
            return Err(Error::invalid(
                "batch",
                "too large for decode mode: batch · heads_q · seqlen_q · splits must fit in an i32",
            ));
        }
        Ok(DecodeSchedule {
            pack,
            m_blocks,
            split_blocks,
            num_splits,
            units: units as usize,
            ctas: units.min(num_sms.max(1) as u128) as u32,
        })
    }

    /// Output rows (batch · heads_q · seqlen_q).
    pub fn rows(p: &AttentionParams) -> usize {
        p.batch * p.heads_q * p.seqlen_q
    }

    /// Bytes of fp32 workspace the split partials need: per row and split, D outputs, a max
    /// and a sum. Zero with one split (the kernel then writes the output directly).
    pub fn workspace_bytes(&self, p: &AttentionParams) -> usize {
        if self.num_splits == 1 {
            return 0;
        }
        Self::rows(p) * self.num_splits * (p.head_dim + 2) * 4
    }

    /// (partial outputs, partial (max, sum)) addresses inside a workspace at `ws`.
    pub fn workspace_parts(&self, p: &AttentionParams, ws: u64) -> (u64, u64) {
        if self.num_splits == 1 {
            return (0, 0);
        }
        let o_bytes = Self::rows(p) * self.num_splits * p.head_dim * 4;
        (ws, ws + o_bytes as u64)
    }
}

/// Bytes of workspace a call needs (0 when it is not a decode call or runs one split): what a
/// framework allocates and passes with [`super::external::ExternalCall::workspace`].
pub fn workspace_bytes(p: &AttentionParams, lengths: Lengths) -> usize {
    // The SM count only sets the CTA count, never the splits: any value gives the same size.
    variant_for(p, lengths)
        .and_then(|v| DecodeSchedule::new(p, &v.tile(), 1, lengths).ok())
        .map_or(0, |s| s.workspace_bytes(p))
}

/// Threads per CTA of the combine kernel (`COMBINE_THREADS` in kernels/fc_decode.cuh).
pub(crate) const COMBINE_THREADS: u32 = 256;

/// Split groups per row in the combine kernel: the largest power of two up to 8 and up to the
/// split count. A row is merged by `head_dim / 4 · groups` threads, each summing every
/// `groups`-th split in order, then the groups in order: a function of the split count (of Sk)
/// alone, so the bits stay batch-invariant.
/// A row's threads never outnumber the CTA's (d256: at most 4 groups of 64 quads).
pub(crate) fn combine_groups(num_splits: usize, head_dim: usize) -> usize {
    let mut g = 1;
    while g < 8 && 2 * g <= num_splits && head_dim / 4 * 2 * g <= COMBINE_THREADS as usize {
        g *= 2;
    }
    g
}

/// CTAs of the combine kernel for `rows` output rows: each holds whole rows.
pub(crate) fn combine_ctas(rows: usize, head_dim: usize, groups: usize) -> usize {
    let rows_per_cta = COMBINE_THREADS as usize / (head_dim / 4 * groups);
    rows.div_ceil(rows_per_cta.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::DType;

    #[test]
    fn pack_is_the_largest_power_of_two_dividing_the_group() {
        assert_eq!(pack_for(1), 1);
        assert_eq!(pack_for(4), 4);
        assert_eq!(pack_for(6), 2);
        assert_eq!(pack_for(7), 1);
        assert_eq!(pack_for(8), 8);
        assert_eq!(pack_for(128), 64);
    }

    #[test]
    fn split_size_depends_on_sk_only() {
        assert_eq!(split_blocks_for(1, 128), 8);
        assert_eq!(split_blocks_for(2048, 128), 8);
        assert_eq!(split_blocks_for(8192, 128), 8);
        assert_eq!(split_blocks_for(16384, 128), 16);
        assert_eq!(split_blocks_for(20000, 128), 20);
        assert_eq!(split_blocks_for(32768, 128), 32);
        assert_eq!(split_blocks_for(65536, 128), 32);
        assert_eq!(split_blocks_for(65537, 128), 16);
        assert_eq!(split_blocks_for(1 << 17, 128), 16);
        assert_eq!(split_blocks_for(1 << 20, 128), 16);
        let tile = crate::kernels::Variant::decode(DType::Bf16, 128, false).tile();
        let p = |b| AttentionParams::new(b, 32, 1, 128).seqlen_k(8192);
        let mut one = p(1);
        one.heads_kv = 8;
        let mut many = p(64);
        many.heads_kv = 8;
        let a = DecodeSchedule::new(&one, &tile, 132, Lengths::None).unwrap();
        let b = DecodeSchedule::new(&many, &tile, 7, Lengths::None).unwrap();
        assert_eq!((a.pack, a.split_blocks, a.num_splits), (4, 8, 8));
        assert_eq!(
            (b.pack, b.split_blocks, b.num_splits),
            (a.pack, a.split_blocks, a.num_splits)
        );
        assert_eq!(a.units, 8 * 8);
        assert_eq!(b.units, 64 * a.units);
        assert_eq!(b.ctas, 7);
        assert_eq!(a.workspace_bytes(&one), 32 * 8 * 130 * 4);
    }

    #[test]
    fn combine_groups_are_powers_of_two_up_to_eight_and_tile_the_cta() {
        assert_eq!(combine_groups(1, 128), 1);
        assert_eq!(combine_groups(2, 128), 2);
        assert_eq!(combine_groups(3, 128), 2);
        assert_eq!(combine_groups(7, 128), 4);
        assert_eq!(combine_groups(8, 128), 8);
        assert_eq!(combine_groups(200, 128), 8);
        // d256: a row's 64 quads in at most 4 groups fill the CTA; d96's 24 quads in 8 groups
        // leave 64 threads idle (kernels/fc_decode.cuh).
        assert_eq!(combine_groups(200, 256), 4);
        assert_eq!(combine_groups(200, 96), 8);
        assert_eq!(combine_ctas(5, 96, 8), 5);
        assert_eq!(combine_ctas(5, 256, 4), 5);
        for d in crate::spec::SUPPORTED_HEAD_DIMS {
            for n in [1, 2, 3, 8, 200] {
                assert!(d / 4 * combine_groups(n, d) <= COMBINE_THREADS as usize);
            }
        }
        // d128, 8 groups: one row per CTA; d64, 2 groups: eight rows per CTA.
        assert_eq!(combine_ctas(8, 128, 8), 8);
        assert_eq!(combine_ctas(17, 64, 2), 3);
        for d in [64, 128] {
            for g in [1, 2, 4, 8] {
                assert_eq!(COMBINE_THREADS as usize % (d / 4 * g), 0);
            }
        }
    }

    #[test]
    fn prefill_consistent_mode_runs_one_unit_per_tile() {
        let tile = crate::kernels::Variant::decode(DType::Bf16, 128, true).tile();
        let mut p = AttentionParams::new(3, 32, 4, 128).seqlen_k(8192 + 5);
        p.heads_kv = 8;
        let kv = Lengths::kv_cache(false, None);
        let split = DecodeSchedule::new(&p, &tile, 132, kv).unwrap();
        let whole = DecodeSchedule::new(&p, &tile, 132, kv.prefill_consistent()).unwrap();
        assert!(split.num_splits > 1);
        assert_eq!((whole.num_splits, whole.split_blocks), (1, 65));
        assert_eq!(whole.units, split.units / split.num_splits);
        assert_eq!(whole.workspace_bytes(&p), 0);
        assert_eq!(workspace_bytes(&p, kv.prefill_consistent()), 0);
        assert!(kv.prefill_consistent().is_prefill_consistent());
        assert!(!kv.is_prefill_consistent());
        // Only KV-cache modes have the option.
        assert_eq!(Lengths::None.prefill_consistent(), Lengths::None);
    }

    #[test]
    fn decode_needs_few_queries_and_public_lengths() {
        let p = AttentionParams::new(1, 8, 16, 64).seqlen_k(4096);
        assert!(variant_for(&p, Lengths::None).is_some());
        assert!(variant_for(&p, Lengths::SecretPadded).is_none());
        assert!(variant_for(&AttentionParams::new(1, 8, 17, 64), Lengths::None).is_none());
        assert_eq!(workspace_bytes(&p, Lengths::SecretPadded), 0);
        assert!(workspace_bytes(&p, Lengths::None) > 0);
    }
}
