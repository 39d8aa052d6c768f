//! The backward kernels (`kernels/attention_bwd.cu`) and the variants they are compiled
//! into: a type of their own, beside the forward's [`super::Variant`], so the two evolve apart.
//! One cubin per variant holds the three kernels of a backward pass (preprocess, dK/dV, dQ).

use crate::error::Result;
use crate::jit::{self, Header};
use crate::spec::DType;

/// Symbols of the three backward kernels, in launch order.
pub const PREPROCESS_SYMBOL: &str = "flashcore_bwd_preprocess";
pub const DKDV_SYMBOL: &str = "flashcore_bwd_dkdv";
pub const DQ_SYMBOL: &str = "flashcore_bwd_dq";
/// The one-pass variants' kernels after the preprocess: dK, dV and dQ partials, then dQ's
/// conversion from the fp32 accumulator.
pub const ONEPASS_SYMBOL: &str = "flashcore_bwd_onepass";
pub const CONVERT_SYMBOL: &str = "flashcore_bwd_dq_convert";
/// Learnable sinks' gradient, in every variant's cubin, launched only for calls with
/// sinks (kernels/fc_bwd_sink.cuh).
pub const DSINK_SYMBOL: &str = "flashcore_bwd_dsink";
/// Threads of the dsink kernel (one CTA per query head).
pub const DSINK_THREADS: u32 = 256;
/// Every two-pass kernel symbol; the GEMM kernels (the last two) must use wgmma.
pub const SYMBOLS: [&str; 3] = [PREPROCESS_SYMBOL, DKDV_SYMBOL, DQ_SYMBOL];
/// Every one-pass kernel symbol; the GEMM kernel (the second) must use wgmma.
pub const ONEPASS_SYMBOLS: [&str; 3] = [PREPROCESS_SYMBOL, ONEPASS_SYMBOL, CONVERT_SYMBOL];

const SOURCE: &str = include_str!("../../kernels/attention_bwd.cu");

/// The backward's own headers plus the forward headers it includes (read-only for it).
pub const HEADERS: &[(&str, &str)] = embed_headers!(
    "fc_common.cuh",
    "fc_mbarrier.cuh",
    "fc_tma.cuh",
    "fc_wgmma.cuh",
    "fc_wgmma_ops.cuh",
    "fc_wgmma_keys.cuh",
    "fc_bwd_config.cuh",
    "fc_bwd_varlen.cuh",
    "fc_bwd_preprocess.cuh",
    "fc_bwd_dkdv.cuh",
    "fc_bwd_dq.cuh",
    "fc_bwd_onepass.cuh",
    "fc_bwd_mask.cuh",
    "fc_bwd_sink.cuh",
);

/// Keys per dK/dV CTA and query rows per dQ CTA: 64 per consumer warpgroup, two consumers
/// (`kernels/fc_bwd_config.cuh`).
pub const KV_BLOCK_N: usize = 128;
pub const Q_BLOCK_M: usize = 128;
/// Query rows per (batch, head) of the preprocess workspace are padded to a multiple of this
/// ([`BwdVariant::row_pad`]: every streamed tile height must divide it).
pub const ROW_PAD: usize = 128;
/// The padding of variants on 80-row query tiles ([`BwdVariant::qrows80`]): lcm(128, 80).
pub const ROW_PAD_80: usize = 640;
/// Threads of the GEMM kernels (a producer warpgroup and two consumers) and of the preprocess.
pub const GEMM_THREADS: u32 = 384;
pub const PREPROCESS_THREADS: u32 = 256;
/// Query rows per preprocess block (one warp each).
pub const PREPROCESS_ROWS: usize = 8;

/// The streamed tile heights and ring depths of a variant, passed to the kernels as defines so
/// host and device agree by construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BwdTiles {
    /// dK/dV kernel: keys per CTA, query rows per streamed (Q, dO) tile, ring depth.
    pub kv_block_n: usize,
    pub kv_block_m: usize,
    pub kv_stages: usize,
    /// dQ kernel: query rows per CTA, keys per streamed (K, V) block, ring depth.
    pub q_block_m: usize,
    pub q_block_n: usize,
    pub q_stages: usize,
}

/// One compiled specialisation of the backward. Everything that distinguishes variants is public.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct BwdVariant {
    pub dtype: DType,
    pub head_dim: usize,
    pub causal: bool,
    /// The two consumer warpgroups take turns issuing their score GEMMs (`FC_PINGPONG`,
    /// kernels/fc_bwd_config.cuh). Changes the schedule, never the arithmetic.
    pub pingpong: bool,
    /// One pass (`FC_ONEPASS`): dQ partials formed beside dK/dV and added in a shape-fixed
    /// order (kernels/fc_bwd_onepass.cuh), instead of a second kernel recomputing S and dP.
    /// Its consumers work in lockstep (`pingpong` false).
    pub onepass: bool,
    /// Measurement only, never shipped or audited (`FC_OP_DIAG`, `FLASHCORE_BWD_OP_DIAG`): 1 =
    /// the one-pass kernel adds without waiting for its turn (nondeterministic), 2 = it neither
    /// waits nor adds (dQ wrong), 3 = nor runs the dQ GEMM, 4 = nor exchanges dSᵀ between its
    /// warpgroups. What the ordering, the reductions, the fifth GEMM and the lockstep cost.
    pub diag: u8,
    /// The one pass's tile schedule (`FC_BWD_CORE`, kernels/fc_bwd_config.cuh): 0 = the first
    /// one-pass schedule; 1 = dQ's GEMM issued without draining dV's first; 2 = 1
    /// plus dSᵀ stored with `stmatrix`; 3 = 2 plus a 2-stage (Q, dO) ring and two dQ buffers;
    /// 4 = 3 with one dQ writer warp per buffer and a bulk reduction per consumer warpgroup's
    /// piece, each on its own barriers. Same arithmetic in the same order: the same bits. 0 on
    /// two-pass variants. `FLASHCORE_BWD_CORE` picks it ([`default_core`] otherwise).
    pub core: u8,
    /// A sliding window (`FC_WINDOW`: skips query tiles / key blocks outside it and
    /// masks by select; kernels/fc_bwd_mask.cuh). Two-pass only.
    pub window: bool,
    /// Logit softcap (`FC_SOFTCAP`: dS carries the tanh's derivative). Two-pass only;
    /// shipped with `window` (an unbounded window costs a compare, not a variant).
    pub softcap: bool,
    /// Packed variable-length sequences with `cu_seqlens` (`FC_VARLEN`, kernels/fc_bwd_varlen.cuh;
    /// two passes only): the grids' z is the sequence, read from public metadata.
    pub varlen: bool,
    /// The one pass on 80-row query tiles (`FC_KV_BM=80`, kernels/fc_bwd_onepass.cuh: score
    /// GEMMs of N = 80, dQ computed transposed), where it is built: d128 without a causal mask,
    /// schedule 3, no window, softcap or varlen ([`BwdVariant::rows80`]); ignored elsewhere.
    /// The default where built; `FLASHCORE_BWD_QROWS=64` keeps 64-row steps (a measurement knob).
    pub qrows80: bool,
    /// The 80-row build at a 24/240 register split (`FC_BWD_WIDE`, kernels/fc_bwd_config.cuh):
    /// its consumers keep dPᵀ beside Sᵀ and issue dQᵀ's GEMM while dK runs (at 40/232 they give
    /// both overlaps up). Same values in the same order as the 80-row build: the same bits. Only
    /// where that build exists ([`BwdVariant::wide`]); ignored elsewhere. Selected by
    /// `FLASHCORE_BWD_REGS=240` (a measurement knob).
    pub regs240: bool,
}

impl BwdVariant {
    /// A stable, human-readable name, e.g. `bwd_bf16_d128_causal`, `bwd_f16_d64_full_onepass`,
    /// `bwd_f16_d64_full_window_softcap`, `bwd_f16_d64_causal_varlen`.
    pub fn name(&self) -> String {
        format!(
            "bwd_{}_d{}_{}{}{}{}{}{}{}{}",
            self.dtype.name(),
            self.head_dim,
            if self.causal { "causal" } else { "full" },
            if self.onepass {
                [
                    "_onepass",
                    "_onepass_diag1",
                    "_onepass_diag2",
                    "_onepass_diag3",
                    "_onepass_diag4",
                ][self.diag.min(4) as usize]
            } else if self.pingpong {
                ""
            } else {
                "_lockstep"
            },
            ["", "_core1", "_core2", "_core3", "_core4"][self.core.min(4) as usize],
            if self.window { "_window" } else { "" },
            if self.softcap { "_softcap" } else { "" },
            if self.varlen { "_varlen" } else { "" },
            if self.rows80() { "_q80" } else { "" },
            if self.wide() { "_w240" } else { "" }
        )
    }

    /// Whether this variant streams 80-row query tiles: [`BwdVariant::qrows80`] where that build
    /// exists (the d128 non-causal one pass in schedule 3, without window, softcap or varlen).
    /// It sums dQ, dK and dV over the same k16 steps in the same order as the 64-row build, but
    /// in other groupings per tile (and dQ through the transposed product): its bits are a
    /// function of the shape alone, like every build's, not necessarily the 64-row build's.
    pub fn rows80(&self) -> bool {
        self.qrows80
            && self.onepass
            && self.head_dim == 128
            && !self.causal
            && self.core == 3
            && !self.window
            && !self.softcap
            && !self.varlen
    }

    /// Whether this variant is the 80-row build at 24/240 registers: [`BwdVariant::regs240`] on
    /// an 80-row variant ([`BwdVariant::rows80`]).
    pub fn wide(&self) -> bool {
        self.regs240 && self.rows80()
    }

    /// This variant at the 24/240 register split where that build exists (an 80-row variant),
    /// else unchanged: as [`BwdVariant::with_80_row_tiles`], one build is one value.
    pub fn with_240_registers(self) -> BwdVariant {
        let v = BwdVariant {
            regs240: true,
            ..self
        };
        if v.wide() {
            v
        } else {
            self
        }
    }

    /// This variant on 80-row query tiles where that build exists, else unchanged: the flag is
    /// set only where it selects a build, so one build is one `BwdVariant` value.
    pub fn with_80_row_tiles(self) -> BwdVariant {
        let v = BwdVariant {
            qrows80: true,
            ..self
        };
        if v.rows80() {
            v
        } else {
            self
        }
    }

    /// Query rows per (batch, head) of the workspace are padded to a multiple of this: every
    /// streamed tile height divides it ([`ROW_PAD`], or [`ROW_PAD_80`] on 80-row tiles).
    pub fn row_pad(&self) -> usize {
        if self.rows80() {
            ROW_PAD_80
        } else {
            ROW_PAD
        }
    }

    /// Every kernel of this variant's cubin (the audit's list): [`BwdVariant::symbols`] and the
    /// dsink kernel.
    pub fn audited_symbols(&self) -> Vec<&'static str> {
        let mut v = self.symbols().to_vec();
        v.push(DSINK_SYMBOL);
        v
    }

    /// The kernel symbols of this variant, in launch order.
    pub fn symbols(&self) -> [&'static str; 3] {
        if self.onepass {
            ONEPASS_SYMBOLS
        } else {
            SYMBOLS
        }
    }

    /// Tile shapes. The score GEMMs' N is 128 where the registers allow it (wider wgmma reads
    /// less shared memory per FLOP): the dK/dV kernel at d128 holds dK, dV, Sᵀ and dPᵀ in fp32
    /// (192 registers at N = 64), so it streams 64-row query tiles there and 128-row ones at d64.
    /// Ring depths: what fits in 227 KiB. d96 takes d128's tiles (its 64-byte-swizzled rows hold
    /// no padding) with a third dQ stage, which fits at 96 dims. d256: the dK/dV CTA owns 64 keys
    /// (its two warpgroups split the head dim, `HSPLIT` in kernels/fc_bwd_config.cuh) and the dQ
    /// kernel streams 64-key blocks through one stage: Q and dO alone take 128 KiB there.
    pub fn tiles(&self) -> BwdTiles {
        let d64 = self.head_dim == 64;
        if self.rows80() {
            // 80-row query tiles: a 2-stage ring and one dQ buffer ([`BwdVariant::dq_bufs`]) fill
            // the 227 KiB; the dQ kernel's tiles are unused (one pass).
            return BwdTiles {
                kv_block_n: KV_BLOCK_N,
                kv_block_m: 80,
                kv_stages: 2,
                q_block_m: Q_BLOCK_M,
                q_block_n: 128,
                q_stages: 2,
            };
        }
        if self.head_dim == 256 {
            return BwdTiles {
                kv_block_n: KV_BLOCK_N / 2,
                kv_block_m: 64,
                kv_stages: 2,
                q_block_m: Q_BLOCK_M,
                q_block_n: 64,
                q_stages: 1,
            };
        }
        BwdTiles {
            kv_block_n: KV_BLOCK_N,
            // Softcap at d64 streams 64-row tiles too: at 128 its tanh temporaries spill.
            kv_block_m: if d64 && !self.softcap { 128 } else { 64 },
            // Core 3: two stages, the freed 32 KiB holding a second dQ buffer.
            kv_stages: if self.onepass && self.core >= 3 { 2 } else { 3 },
            q_block_m: Q_BLOCK_M,
            q_block_n: 128,
            q_stages: if d64 || self.head_dim == 96 { 3 } else { 2 },
        }
    }

    pub fn options(&self) -> Vec<String> {
        let t = self.tiles();
        let mut o = jit::base_options();
        o.push(format!("-DFC_KV_BM={}", t.kv_block_m));
        o.push(format!("-DFC_KV_STAGES={}", t.kv_stages));
        o.push(format!("-DFC_Q_BN={}", t.q_block_n));
        o.push(format!("-DFC_Q_STAGES={}", t.q_stages));
        o.push(format!("-DFC_PINGPONG={}", self.pingpong as u8));
        o.push(format!("-DFC_ONEPASS={}", self.onepass as u8));
        o.push(format!("-DFC_STAGE_STATS={}", self.stage_stats() as u8));
        o.push(format!("-DFC_OP_DIAG={}", self.diag));
        o.push(format!("-DFC_BWD_CORE={}", self.core));
        o.push(format!("-DFC_VARLEN={}", self.varlen as u8));
        o.push(format!("-DFC_HEAD_DIM={}", self.head_dim));
        o.push(format!("-DFC_BF16={}", (self.dtype == DType::Bf16) as u8));
        o.push(format!("-DFC_CAUSAL={}", self.causal as u8));
        o.push(format!("-DFC_WINDOW={}", self.window as u8));
        o.push(format!("-DFC_SOFTCAP={}", self.softcap as u8));
        // Only the 24/240 build passes it: every other build's options stay as they were.
        if self.wide() {
            o.push("-DFC_BWD_WIDE=1".into());
        }
        o
    }

    /// The cubin (all three kernels), through the on-disk cache. Needs NVRTC, not a GPU.
    pub fn cubin(&self) -> Result<Vec<u8>> {
        jit::compile_cached(&self.name(), SOURCE, &headers(), &self.options())
    }

    /// The hash of this variant's compile inputs ([`jit::inputs_key`]); needs no NVRTC.
    pub fn inputs_key(&self) -> String {
        jit::inputs_key(SOURCE, &headers(), &self.options())
    }

    /// The deliberately leaky build (`FC_BWD_LEAKY_CONTROL=1`: each kernel loads from an
    /// address taken from a secret). Never shipped or launched; the audit must flag all three
    /// kernels (tests/audit_backward.rs).
    #[doc(hidden)]
    pub fn leaky_control_cubin(&self) -> Result<Vec<u8>> {
        let headers: Vec<Header<'static>> = HEADERS
            .iter()
            .map(|(name, source)| Header { name, source })
            .collect();
        let mut options = self.options();
        options.push("-DFC_BWD_LEAKY_CONTROL=1".into());
        jit::compile_cached(
            &format!("{}_LEAKY_CONTROL", self.name()),
            SOURCE,
            &headers,
            &options,
        )
    }

    /// Whether the dK/dV kernel loads each tile's LSE₂ and D rows into shared memory with its
    /// Q and dO (kernels/fc_bwd_dkdv.cuh, `FC_STAGE_STATS`): everywhere but the d64 one pass,
    /// whose shared memory has no room for them (the d128 one pass issues them from an idle
    /// producer warp: in the producer's loop they spilled).
    /// `FLASHCORE_BWD_STAGE_STATS=0` (read once per process) reads them from the workspace
    /// everywhere, the A/B knob of PERF_NOTES `bwdlse`.
    pub fn stage_stats(&self) -> bool {
        crate::knobs::bwd_stage_stats() && !(self.onepass && self.head_dim == 64)
    }

    /// Dynamic shared memory of the dK/dV kernel: K and V blocks, the (Q, dO) ring, fp32 LSE₂
    /// and D rows per stage (one row pair when not staged), mbarriers, plus 1 KiB of alignment
    /// slack.
    pub fn dkdv_smem_bytes(&self) -> usize {
        let (d, t) = (self.head_dim, self.tiles());
        let stat_stages = if self.stage_stats() { t.kv_stages } else { 1 };
        2 * t.kv_block_n * d * 2
            + 2 * t.kv_stages * t.kv_block_m * d * 2
            + 2 * stat_stages * t.kv_block_m * 4
            + (1 + 2 * t.kv_stages) * 8
            + 1024
    }

    /// Dynamic shared memory of the one-pass kernel: two dSᵀ tiles (16-bit, KV_BN × KV_BM) and
    /// [`BwdVariant::dq_bufs`] fp32 dQ partials (KV_BM × D) in front of the dK/dV kernel's
    /// layout, two mbarriers per partial after (core 4: per consumer warpgroup's piece of it).
    pub fn onepass_smem_bytes(&self) -> usize {
        let t = self.tiles();
        let split = if self.onepass && self.core >= 4 { 2 } else { 1 };
        2 * t.kv_block_n * t.kv_block_m * 2
            + self.dq_bufs() * t.kv_block_m * self.head_dim * 4
            + self.dkdv_smem_bytes()
            + self.dq_bufs() * split * 2 * 8
    }

    /// fp32 dQ partials in flight in the one-pass kernel (`bw::DQ_BUFS`): two from core 3, one on
    /// 80-row tiles.
    pub fn dq_bufs(&self) -> usize {
        if self.onepass && self.core >= 3 && !self.rows80() {
            2
        } else {
            1
        }
    }

    /// Dynamic shared memory of the dQ kernel: Q and dO tiles, the (K, V) ring, mbarriers, slack.
    pub fn dq_smem_bytes(&self) -> usize {
        let (d, t) = (self.head_dim, self.tiles());
        2 * t.q_block_m * d * 2
            + 2 * t.q_stages * t.q_block_n * d * 2
            + (1 + 2 * t.q_stages) * 8
            + 1024
    }

    /// What the audit is told about this variant's parameters: nothing is secret beyond device
    /// memory; the one-pass variants' turn counters (`BwdParams::flags_ptr`) are a public buffer
    /// that the one-pass kernel writes with public values only (docs/security.md); the varlen
    /// variants' `cu_seqlens_q`, `cu_seqlens_k` and `seqused_k` are public metadata (docs/design.md §1).
    pub fn declared(&self) -> crate::audit::Declared {
        use crate::abi as ab;
        crate::audit::Declared {
            secret_params: self.secret_params(),
            public_fields: if self.onepass {
                vec![(0, ab::FLAGS_FIELD)]
            } else if self.varlen {
                ab::VARLEN_FIELDS.iter().map(|&f| (0, f)).collect()
            } else {
                Vec::new()
            },
            ..Default::default()
        }
    }

    /// Ordinals of kernel parameters that hold secrets (none: Q, K, V, O, dO and the LSE reach
    /// the kernels only through device memory, which the audit treats as secret).
    pub fn secret_params(&self) -> Vec<usize> {
        Vec::new()
    }
}

/// Every one-pass schedule that is shipped (and so audited): [`BwdVariant::core`] 0 to 4.
pub const SHIPPED_CORES: [u8; 5] = [0, 1, 2, 3, 4];

/// Head dims the one-pass kernels serve (`FLASHCORE_BWD_ONEPASS=1`); the two-pass kernels serve
/// every backward head dim (`validate::BACKWARD_HEAD_DIMS`).
pub const ONEPASS_HEAD_DIMS: [usize; 2] = [64, 128];

pub use super::shipped_bwd_variants;

fn headers() -> Vec<Header<'static>> {
    HEADERS
        .iter()
        .map(|(name, source)| Header { name, source })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The one pass is the default at d128 causal and at long d128 non-causal and d64 causal
    /// calls (as measured: docs/journal/perf-notes.md), and a call it
    /// does not serve — a window or softcap, at that shape class too — still gets the two passes
    /// by default instead of a refusal. (Reads `FLASHCORE_BWD_ONEPASS`: unset in the test suite.)
    #[test]
    fn one_pass_is_the_default_at_d128_causal_for_calls_it_serves() {
        use crate::attention::{AttentionParams, Window};
        use crate::kernels::select::{
            default_core, default_onepass, ONEPASS_MIN_LEN, ONEPASS_MIN_LEN_D128,
        };
        for len in [0, 512, ONEPASS_MIN_LEN] {
            assert!(default_onepass(128, true, len));
            assert!(!default_onepass(64, false, len));
            assert!(!default_onepass(96, true, len) && !default_onepass(256, true, len));
        }
        for (d, causal, min) in [
            (128, false, ONEPASS_MIN_LEN_D128),
            (64, true, ONEPASS_MIN_LEN),
        ] {
            assert!(!default_onepass(d, causal, min - 1), "d{d} causal {causal}");
            assert!(default_onepass(d, causal, min), "d{d} causal {causal}");
        }
        if std::env::var_os("FLASHCORE_BWD_ONEPASS").is_some() {
            return; // a measurement run chose the kernels itself
        }
        let p = AttentionParams::new(2, 4, 1000, 128).causal(true);
        let v = crate::kernels::select::backward(&p);
        assert!(v.onepass && !v.window && v.diag == 0, "{v:?}");
        assert!(crate::attention::backward::check_backward_variant(v).is_ok());
        assert!(!crate::kernels::select::backward(&p.clone().causal(false)).onepass);
        if std::env::var_os("FLASHCORE_BWD_CORE").is_none() {
            assert_eq!(v.core, default_core());
        }
        // Long d128 non-causal and d64 causal calls take the one pass; a short side keeps them
        // on the two passes; the batch size never decides.
        let long = AttentionParams::new(1, 4, ONEPASS_MIN_LEN_D128, 128);
        assert!(crate::kernels::select::backward(&long).onepass);
        if std::env::var_os("FLASHCORE_BWD_QROWS").is_none() {
            assert!(crate::kernels::select::backward(&long).rows80());
        }
        assert!(!crate::kernels::select::backward(&long.clone().seqlen_k(1024)).onepass);
        let long64 = AttentionParams::new(3, 4, ONEPASS_MIN_LEN, 64).causal(true);
        assert!(crate::kernels::select::backward(&long64).onepass);
        assert!(!crate::kernels::select::backward(&long64.clone().causal(false)).onepass);
        let mut b1 = long64.clone();
        b1.batch = 1;
        assert_eq!(
            crate::kernels::select::backward(&b1),
            crate::kernels::select::backward(&long64)
        );
        for q in [
            p.clone().window(Window::from_flash_attn(64, 0)),
            p.clone().softcap(30.0),
        ] {
            let v = crate::kernels::select::backward(&q);
            assert!(!v.onepass && v.window && v.pingpong, "{v:?}");
            assert!(crate::attention::backward::check_backward_variant(v).is_ok());
        }
    }

    /// 80-row query tiles exist for the d128 non-causal one pass in schedule 3 only; elsewhere
    /// the flag changes nothing (same name, same defines). Its shared memory fits, its padding is
    /// a multiple of 80 and of 128, and it is shipped (both dtypes).
    #[test]
    fn eighty_row_tiles_only_where_built() {
        let base = BwdVariant {
            dtype: DType::Bf16,
            head_dim: 128,
            causal: false,
            pingpong: false,
            onepass: true,
            diag: 0,
            core: 3,
            window: false,
            softcap: false,
            varlen: false,
            qrows80: false,
            regs240: false,
        };
        let v = BwdVariant {
            qrows80: true,
            ..base
        };
        assert!(v.rows80() && v.name().ends_with("_q80"), "{}", v.name());
        assert!(v.options().contains(&"-DFC_KV_BM=80".to_string()));
        assert_eq!((v.tiles().kv_stages, v.dq_bufs()), (2, 1));
        assert!(v.onepass_smem_bytes() <= super::super::MAX_SMEM_BYTES);
        assert_eq!(v.row_pad() % 80, 0);
        assert_eq!(v.row_pad() % ROW_PAD, 0);
        for w in [
            BwdVariant { causal: true, ..v },
            BwdVariant { head_dim: 64, ..v },
            BwdVariant { core: 4, ..v },
            BwdVariant {
                onepass: false,
                core: 0,
                ..v
            },
        ] {
            let plain = BwdVariant {
                qrows80: false,
                ..w
            };
            assert!(!w.rows80());
            assert_eq!((w.name(), w.options()), (plain.name(), plain.options()));
            assert_eq!(w.row_pad(), ROW_PAD);
        }
        let shipped = shipped_bwd_variants();
        assert_eq!(shipped.iter().filter(|s| s.rows80()).count(), 4);
        assert!(shipped.contains(&v));
    }

    /// The 24/240 build exists only beside the 80-row one: elsewhere the flag changes nothing
    /// (same name, same defines); where built it is the 80-row build's tiles, padding and shared
    /// memory with one define more, and it is shipped (both dtypes).
    #[test]
    fn the_240_register_build_only_on_80_row_tiles() {
        let q80 = shipped_bwd_variants()
            .into_iter()
            .find(|v| v.rows80() && v.dtype == DType::Bf16 && !v.regs240)
            .unwrap();
        let w = q80.with_240_registers();
        assert!(
            w.wide() && w.name() == format!("{}_w240", q80.name()),
            "{}",
            w.name()
        );
        let mut opts = q80.options();
        opts.push("-DFC_BWD_WIDE=1".into());
        assert_eq!(w.options(), opts);
        assert_eq!(
            (w.tiles(), w.row_pad(), w.onepass_smem_bytes()),
            (q80.tiles(), q80.row_pad(), q80.onepass_smem_bytes())
        );
        for other in [
            BwdVariant {
                qrows80: false,
                ..q80
            },
            BwdVariant {
                causal: true,
                ..q80
            },
            BwdVariant { core: 4, ..q80 },
        ] {
            assert_eq!(other.with_240_registers(), other);
            let flagged = BwdVariant {
                regs240: true,
                ..other
            };
            assert!(!flagged.wide());
            assert_eq!(
                (flagged.name(), flagged.options()),
                (other.name(), other.options())
            );
        }
        let shipped = shipped_bwd_variants();
        assert_eq!(shipped.iter().filter(|s| s.wide()).count(), 2);
        assert!(shipped.contains(&w));
    }

    #[test]
    fn stats_are_staged_everywhere_but_the_d64_one_pass() {
        if std::env::var_os("FLASHCORE_BWD_STAGE_STATS").is_some() {
            return; // a measurement run chose the path itself
        }
        let vs = shipped_bwd_variants();
        for v in &vs {
            assert_eq!(
                v.stage_stats(),
                !(v.onepass && v.head_dim == 64),
                "{}",
                v.name()
            );
            let flag = format!("-DFC_STAGE_STATS={}", v.stage_stats() as u8);
            assert!(v.options().contains(&flag), "{}", v.name());
        }
        // The staged rows cost shared memory: 2 · stages · KV_BM fp32 more than one row pair.
        let v = vs.iter().find(|v| !v.onepass && v.head_dim == 128).unwrap();
        let t = v.tiles();
        let unstaged = 2 * t.kv_block_n * 128 * 2
            + 2 * t.kv_stages * t.kv_block_m * 128 * 2
            + 2 * t.kv_block_m * 4
            + (1 + 2 * t.kv_stages) * 8
            + 1024;
        assert_eq!(
            v.dkdv_smem_bytes() - unstaged,
            2 * (t.kv_stages - 1) * t.kv_block_m * 4
        );
    }

    #[test]
    fn shared_memory_fits_and_names_are_distinct() {
        let vs = shipped_bwd_variants();
        // Per dtype and mask: every head dim × (ping-pong, lockstep, window, window+softcap,
        // varlen, varlen+window, varlen+window+softcap), plus the one pass at its head dims in
        // each shipped schedule; and per dtype the d128 non-causal one pass on 80-row tiles, at
        // 40/232 and at 24/240 registers.
        let per_mask = crate::spec::BACKWARD_HEAD_DIMS.len() * 7
            + ONEPASS_HEAD_DIMS.len() * SHIPPED_CORES.len();
        assert_eq!(vs.len(), 2 * 2 * per_mask + 2 * 2);
        let names: std::collections::HashSet<String> = vs.iter().map(|v| v.name()).collect();
        assert_eq!(names.len(), vs.len());
        for v in &vs {
            assert!(
                v.dkdv_smem_bytes() <= super::super::MAX_SMEM_BYTES,
                "{}",
                v.name()
            );
            assert!(
                v.dq_smem_bytes() <= super::super::MAX_SMEM_BYTES,
                "{}",
                v.name()
            );
            // Only the one-pass variants launch the one-pass kernel (its dQ tile would not fit
            // beside the d256 layout).
            assert!(
                !v.onepass || v.onepass_smem_bytes() <= super::super::MAX_SMEM_BYTES,
                "{}",
                v.name()
            );
        }
    }
}
