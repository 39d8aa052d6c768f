//! Which kernel variant a call runs: the one home of the forward's and the backward's choice.
//! Every rule is a function of public parameters (shapes, dtype, mask, lengths mode) and, for the
//! light tiles, the SM count; the measurement knobs (`crate::knobs`) may pick another shipped
//! variant, never an unaudited build. The variants that exist are [`super::shipped_variants`]
//! and [`super::backward::shipped_bwd_variants`].

use super::backward::BwdVariant;
use super::{block_n_for, KernelBuild, TestBuild, Variant};
use crate::error::{Error, Result};
use crate::knobs::ForwardTiles;
use crate::spec::{AttentionParams, DType, Lengths, MAX_SEQLEN_Q};

// The prefill's rules, as methods of the variant they pick.
impl Variant {
    /// The variant for a call's shape. Every choice depends on the shape of one sequence only —
    /// never on the batch size — so a sequence's output bits are the same in any batch.
    /// - Short key sequences (Sk ≤ 1024) split their keys across a cluster ([`split_for`]).
    /// - At d64 without split, long queries (Sq ≥ 1024; causal: Sq ≥ 4096) use 192-row tiles with
    ///   three consumer warpgroups: fewer K/V bytes from L2 per FLOP, more softmax work in flight
    ///   (measured +13% non-causal; causal −9% at 8k–16k but slower at 1k–2k, PERF_NOTES step 12).
    pub fn for_shape(
        dtype: DType,
        head_dim: usize,
        causal: bool,
        secret_len: bool,
        seqlen_q: usize,
        seqlen_k: usize,
    ) -> Variant {
        let split = split_for(seqlen_k);
        // Causal gains from 192 rows only at long queries (PERF_NOTES step 12: −9% at 8k and 16k,
        // +3% at 2k, +10% at 1k).
        let long = if causal { 4096 } else { 1024 };
        let block_m = if head_dim == 64 && !secret_len && split == 1 && seqlen_q >= long {
            192
        } else {
            128
        };
        // d128 non-causal with at least 4096 keys: 176-key blocks, as FA3 (PERF_NOTES, "d128
        // non-causal on 176-key blocks": −2 to −4% at 4k–16k, flat below). A rule of Sk alone, never of the batch, so
        // the light-tile rule keeps it (64-row tiles on 176 keys) and bits stay batch-invariant.
        // d256 with at least 1024 keys (causal: 4096): 80-key blocks, as FA3 and FA4 (PERF_NOTES,
        // "d256 on 80-key blocks" and "d256 causal: the rule takes 80-key blocks": non-causal
        // −2.6 to −3.7% from 1k, +2% at 512, where the last block is 40% masked; causal −2.5 to
        // −4% from 4k in 128-row tiles, but +1 to +3.5% in light ones there, −1% / +7% at 2k).
        let keys80_from = if causal { 4096 } else { 1024 };
        let block_n = if head_dim == 128 && !causal && !secret_len && split == 1 && seqlen_k >= 4096
        {
            176
        } else if head_dim == 256 && !secret_len && split == 1 && seqlen_k >= keys80_from {
            80
        } else {
            block_n_for(head_dim)
        };
        Variant {
            dtype,
            head_dim,
            causal,
            block_m,
            block_n,
            secret_len,
            split,
            decode: false,
            kv_public: false,
            paged: false,
            varlen: false,
            softcap: false,
        }
    }

    /// The softcap build for a call with a softcap: over a KV cache (decode, any count mode or
    /// layout) and in varlen, the same build with softcap; otherwise the plain 128-row tile of
    /// this dtype, head dim and mask (light, 192-row and plain-decode tiles have no softcap
    /// build: a softcap in every build would need a second main loop in each, and the 192-row
    /// tiles spill with it). `None` for secret-length prefill, which has none.
    pub fn with_softcap(self) -> Option<Variant> {
        if self.is_kv_cache() || self.varlen {
            return Some(Variant {
                softcap: true,
                ..self
            });
        }
        if self.secret_len {
            return None;
        }
        Some(Variant {
            softcap: true,
            ..Variant::basic(self.dtype, self.head_dim, self.causal, 128)
        })
    }

    /// Light tiles for launches that cannot fill the GPU: when the 64-row tiles'
    /// work units fit in one wave (`units ≤ num_sms`; causal units pair two tiles), the kernel
    /// runs 64-row tiles with a single consumer warpgroup — twice the CTAs of 128-row tiles, each
    /// with half the rows, so each SM's chain of key blocks is half as long (PERF_NOTES step 13:
    /// 1,8,512,64 9.6 → 7.2 µs). Secret-length and split builds keep their tiles.
    ///
    /// Unlike [`Variant::for_shape`] this looks at the batch: a row's output bits do not depend on
    /// the tile height (each consumer warpgroup computes its 64 rows with the same instructions
    /// whatever the tile; `tests/gpu_tile_invariance.rs` checks the bits), so batch invariance
    /// holds across the rule's boundary.
    pub fn with_light_tiles(
        self,
        batch: usize,
        heads_q: usize,
        seqlen_q: usize,
        num_sms: usize,
    ) -> Variant {
        if self.split != 1 || self.secret_len {
            return self;
        }
        let tiles_per_head = seqlen_q.div_ceil(64) as u128;
        let units_per_head = if self.causal {
            tiles_per_head.div_ceil(2)
        } else {
            tiles_per_head
        };
        let units = units_per_head * heads_q as u128 * batch as u128;
        if units <= num_sms as u128 {
            Variant {
                block_m: 64,
                ..self
            }
        } else {
            self
        }
    }
}

/// Key-range split across a cluster: measured on the H100 (docs/journal/perf-notes.md, step 4) to
/// be no faster than one CTA per query tile at any shape tried (1,8,512,64: 8.9 µs unsplit vs 9.0 /
/// 14.0 µs split 2 / 4, graph replay), because each CTA's fixed latency dominates and clusters of 4
/// cannot all be resident at one CTA per SM. So no shape splits by default; `FLASHCORE_SPLIT=2|4`
/// forces it for measurement. Whatever the rule, it may depend on the key length only — never on
/// the batch — so a sequence's output bits do not depend on the batch it is launched in.
pub fn split_for(_seqlen_k: usize) -> usize {
    1
}

/// The forward variant a call with `params` in `lengths` mode runs on a GPU of `num_sms` SMs, as
/// `build` (the shipped build, or one of the leakage test's): the decode or KV-cache variant
/// ([`decode`]) or the prefill shape rule ([`Variant::for_shape`]) with light tiles for small
/// grids ([`Variant::with_light_tiles`]) and the measurement knobs, then its softcap twin
/// ([`Variant::with_softcap`]). Combinations with no variant are typed errors.
pub fn forward(
    params: &AttentionParams,
    lengths: Lengths,
    build: TestBuild,
    num_sms: usize,
) -> Result<KernelBuild> {
    let variant = match decode(params, lengths) {
        // The leakage test's builds time the prefill kernel.
        Some(v) if matches!(lengths, Lengths::KvCache { .. }) || build.is_shipped() => v,
        _ => {
            let v = Variant::for_shape(
                params.dtype,
                params.head_dim,
                params.causal,
                lengths != Lengths::None,
                params.seqlen_q,
                params.seqlen_k,
            );
            let v = v.with_light_tiles(params.batch, params.heads_q, params.seqlen_q, num_sms);
            with_knobs(v, crate::knobs::forward_tiles())
        }
    };
    // The window, softcap and sinks: dense calls and KV caches (windows masked by select there: the
    // first block never moves by a count read from memory). Not yet with secret-length
    // prefill, nor in the prefill-consistent mode (its bits would differ from the prefill's,
    // which visits a window's left-edge blocks last).
    if (lengths == Lengths::SecretPadded || lengths.is_prefill_consistent())
        && !params.window.is_unbounded()
    {
        return Err(Error::invalid(
            "window",
            "is not supported with secret-length prefill or a prefill-consistent KV cache yet",
        ));
    }
    // A softcap runs in its own builds (plain 128-row prefill tiles for dense calls of any
    // Sq; the KV-cache builds' own softcap twins). Not with secret-length prefill, nor in
    // the prefill-consistent mode (no test of its bits against the softcap prefill yet).
    if params.softcap > 0.0 && lengths.is_prefill_consistent() {
        return Err(Error::invalid(
            "softcap",
            "is not supported with a prefill-consistent KV cache yet",
        ));
    }
    let variant = if params.softcap > 0.0 {
        variant.with_softcap().ok_or_else(|| {
            Error::invalid("softcap", "is not supported with secret-length prefill yet")
        })?
    } else {
        variant
    };
    // The leakage test's builds (power controls, hardware floor, cycle timer): the same
    // launch, a build that is never shipped.
    Ok(build.apply(variant))
}

/// The decode variant a call runs, or `None` for the prefill kernel: every KV-cache call
/// (validated to Sq ≤ [`MAX_SEQLEN_Q`]; secret counts in the secret-length build), and calls
/// without lengths of at most that many query positions; secret-length prefill keeps the prefill
/// kernel. The one place that decides.
pub fn decode(p: &AttentionParams, lengths: Lengths) -> Option<Variant> {
    let v = Variant::decode(p.dtype, p.head_dim, p.causal);
    match lengths {
        Lengths::KvCache { secret, pages, .. } => Some(Variant::kv_cache(
            p.dtype,
            p.head_dim,
            p.causal,
            secret,
            pages.is_some(),
        )),
        Lengths::SecretPadded => None,
        Lengths::None => (p.seqlen_q <= MAX_SEQLEN_Q).then_some(v),
    }
}

/// The variant a varlen call runs (its softcap twin for a call with a softcap).
pub fn varlen(params: &AttentionParams) -> Variant {
    Variant {
        softcap: params.softcap > 0.0,
        ..Variant::varlen(params.dtype, params.head_dim, params.causal)
    }
}

/// The variant a varlen call over a paged cache runs (chunked prefill): [`varlen`]'s, reading
/// K/V through the block table.
pub fn varlen_paged(params: &AttentionParams) -> Variant {
    Variant {
        paged: true,
        ..varlen(params)
    }
}

/// The variant a call with these parameters runs: [`backward_call`], plus the
/// window and softcap (softcap runs the window build: an unbounded window masks nothing). A
/// call with either runs the two-pass kernels (the one-pass kernel refuses them:
/// `check_backward_variant` in `attention::backward`) unless `FLASHCORE_BWD_ONEPASS=1`
/// asks for the one-pass kernel; where the one pass is the default ([`default_onepass`]),
/// such a call runs the two passes.
pub fn backward(p: &AttentionParams) -> BwdVariant {
    let base = backward_call_len(p.dtype, p.head_dim, p.causal, p.seqlen_q.min(p.seqlen_k));
    let w = p.effective_window();
    let window = w.left.is_some() || (!p.causal && w.right.is_some()) || p.softcap != 0.0;
    let asked = crate::knobs::bwd_onepass() == Some(true);
    if !window || (base.onepass && asked) {
        return BwdVariant {
            window,
            softcap: p.softcap != 0.0,
            ..base
        };
    }
    BwdVariant {
        window,
        softcap: p.softcap != 0.0,
        onepass: false,
        pingpong: crate::knobs::bwd_pingpong(),
        diag: 0,
        core: 0,
        qrows80: false,
        regs240: false,
        ..base
    }
}

/// The variant a varlen call runs ([`backward_call`]'s two-pass kernels with
/// `FC_VARLEN`; the one-pass kernels have no varlen build).
pub fn backward_varlen_call(dtype: DType, head_dim: usize, causal: bool) -> BwdVariant {
    BwdVariant {
        dtype,
        head_dim,
        causal,
        pingpong: crate::knobs::bwd_pingpong(),
        onepass: false,
        diag: 0,
        core: 0,
        varlen: true,
        window: false,
        softcap: false,
        qrows80: false,
        regs240: false,
    }
}

/// The variant a varlen call with these parameters runs: [`backward_varlen_call`]
/// plus the window and softcap, as [`backward`] (softcap runs the window
/// build).
pub fn backward_varlen_params(p: &AttentionParams) -> BwdVariant {
    let w = p.effective_window();
    let window = w.left.is_some() || (!p.causal && w.right.is_some()) || p.softcap != 0.0;
    BwdVariant {
        window,
        softcap: p.softcap != 0.0,
        ..backward_varlen_call(p.dtype, p.head_dim, p.causal)
    }
}

/// The variant a call of this dtype, head dim and mask runs at short sequences:
/// [`backward_call_len`] with length 0.
pub fn backward_call(dtype: DType, head_dim: usize, causal: bool) -> BwdVariant {
    backward_call_len(dtype, head_dim, causal, 0)
}

/// The variant a call of this dtype, head dim, mask and shorter sequence length (min(Sq, Sk),
/// public) runs: [`default_onepass`] unless `FLASHCORE_BWD_ONEPASS` is `0` or `1`; the one pass
/// in schedule [`default_core`] unless `FLASHCORE_BWD_CORE` names one; the two-pass kernels
/// ping-pong unless `FLASHCORE_BWD_PINGPONG=0`; the one pass on 80-row query tiles where they
/// are built unless `FLASHCORE_BWD_QROWS=64`, and there the 24/240-register build with
/// `FLASHCORE_BWD_REGS=240` (measurement knobs; every variant is shipped and
/// audited). The batch size never enters, so a sequence runs the same kernels alone and in a
/// batch (batch invariance).
pub fn backward_call_len(
    dtype: DType,
    head_dim: usize,
    causal: bool,
    min_len: usize,
) -> BwdVariant {
    let onepass = crate::knobs::bwd_onepass().unwrap_or(default_onepass(head_dim, causal, min_len));
    let pingpong = !onepass && crate::knobs::bwd_pingpong();
    let diag = if onepass {
        crate::knobs::bwd_op_diag()
    } else {
        0
    };
    let core = if onepass {
        crate::knobs::bwd_core().unwrap_or(default_core())
    } else {
        0
    };
    let v = BwdVariant {
        dtype,
        head_dim,
        causal,
        pingpong,
        onepass,
        diag,
        core,
        window: false,
        softcap: false,
        varlen: false,
        qrows80: false,
        regs240: false,
    };
    // 80-row query tiles where that build exists: 4.5–5.8% faster than 64-row steps on the H200
    // (PERF_NOTES, "Backward one pass on 80-row query steps").
    let v = if crate::knobs::bwd_qrows() == Some(64) {
        v
    } else {
        v.with_80_row_tiles()
    };
    with_bwd_regs(v, crate::knobs::bwd_regs())
}

/// The 80-row build at 24/240 registers where `regs` asks for it (`FLASHCORE_BWD_REGS=240`) and
/// `v` is an 80-row build ([`BwdVariant::with_240_registers`]); `v` otherwise.
pub fn with_bwd_regs(v: BwdVariant, regs: Option<u32>) -> BwdVariant {
    if regs == Some(240) {
        v.with_240_registers()
    } else {
        v
    }
}

/// Whether a call runs the one-pass kernels by default, by measurement (the performance journal,
/// docs/journal/perf-notes.md): d128 causal at every length, where the turn order matches the order
/// in which key blocks reach a query tile; d128 non-causal once both sequences are at least
/// [`ONEPASS_MIN_LEN_D128`] long and d64 causal from [`ONEPASS_MIN_LEN`] (schedule 3 took 5–7%
/// less time than the two passes at 4096 and 8192; on 80-row query tiles the d128 non-causal one
/// pass took 4.3% less at 2048, tied at 1024 and lost 5% at 512; at 2048 the d64 causal one pass
/// loses). Elsewhere the two passes measured faster or were not measured. Calls the one pass does
/// not serve (windows, softcap, varlen) run the two passes whatever this says.
pub fn default_onepass(head_dim: usize, causal: bool, min_len: usize) -> bool {
    match (head_dim, causal) {
        (128, true) => true,
        (128, false) => min_len >= ONEPASS_MIN_LEN_D128,
        (64, true) => min_len >= ONEPASS_MIN_LEN,
        _ => false,
    }
}

/// The shortest min(Sq, Sk) at which d64 causal calls take the one pass ([`default_onepass`]):
/// the shortest length measured faster (4096; 2048 loses).
pub const ONEPASS_MIN_LEN: usize = 4096;

/// The same for d128 non-causal calls, whose one pass runs 80-row query tiles: 2048 (1024 ties).
pub const ONEPASS_MIN_LEN_D128: usize = 2048;

/// The one pass's default tile schedule ([`BwdVariant::core`]; the performance journal):
/// schedule 3, the fastest or tied at each of the backward suite's shapes in one-pass mode.
pub fn default_core() -> u8 {
    3
}

/// The backward variant a varlen call runs: the two passes (the one-pass kernels have no varlen
/// build; asking for them with `FLASHCORE_BWD_ONEPASS=1` is an error).
pub fn backward_varlen(params: &AttentionParams, onepass: Option<bool>) -> Result<BwdVariant> {
    if onepass == Some(true) {
        return Err(Error::invalid(
            "FLASHCORE_BWD_ONEPASS",
            "the one-pass backward has no varlen build (two passes only): unset it or set it to 0",
        ));
    }
    Ok(backward_varlen_params(params))
}

/// Tuning knobs for measurements: `FLASHCORE_SPLIT=1|2|4` (d64), `FLASHCORE_BLOCK_M=64|128|192`
/// (192: d64 only) and `FLASHCORE_BLOCK_N=64|80|128|176` (80: d256, 176: d128
/// non-causal) override the shape rule. Each is public and deterministic: it changes which kernel
/// runs, never what it computes. Values outside these sets are ignored, and so is any combination
/// that is not a shipped (audited) variant: the knobs never run a kernel `flashcore audit` has not
/// checked.
fn with_knobs(shape_rule: Variant, knobs: ForwardTiles) -> Variant {
    let ForwardTiles {
        split,
        block_m,
        block_n,
    } = knobs;
    let mut variant = shape_rule;
    let d64 = variant.head_dim == 64;
    if let Some(n @ (1 | 2 | 4)) = split {
        if d64 {
            variant.split = n;
            if n > 1 && variant.block_m != 128 {
                variant.block_m = 128;
            }
        }
    }
    match block_m {
        Some(m @ (64 | 128)) => variant.block_m = m,
        Some(192) if d64 && variant.split == 1 && !variant.secret_len => variant.block_m = 192,
        _ => {}
    }
    if let Some(n @ (64 | 80 | 128 | 176)) = block_n {
        variant.block_n = n;
    }
    if super::shipped_variants().contains(&variant) {
        variant
    } else {
        shape_rule
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::DType;

    #[test]
    fn row_gather_is_compiled_only_into_paged_builds_and_only_when_asked() {
        let asked = crate::knobs::row_gather();
        for v in crate::kernels::shipped_variants() {
            let rows = KernelBuild::from(v)
                .options()
                .contains(&"-DFC_ROW_GATHER=1".to_string());
            assert_eq!(rows, asked && v.paged, "{}", v.name());
        }
    }

    #[test]
    fn knobs_pick_only_shipped_variants() {
        let k = |split, block_m, block_n| ForwardTiles {
            split,
            block_m,
            block_n,
        };
        let rule = Variant::basic(DType::F16, 64, false, 128);
        let light = with_knobs(rule, k(None, Some(64), None));
        assert_eq!(light.block_m, 64);
        assert_eq!(with_knobs(rule, k(None, Some(192), None)).block_m, 192);
        assert_eq!(with_knobs(light, k(Some(2), None, None)).split, 2);
        assert_eq!(with_knobs(light, k(Some(2), None, None)).block_m, 128);
        // Not shipped: 64-key blocks, 64-row split tiles, 192 rows at d128.
        assert_eq!(with_knobs(rule, k(None, None, Some(64))), rule);
        assert_eq!(with_knobs(rule, k(Some(2), Some(64), None)), rule);
        let d128 = Variant::basic(DType::Bf16, 128, true, 128);
        assert_eq!(with_knobs(d128, k(None, Some(192), None)), d128);
        assert_eq!(with_knobs(d128, k(Some(2), None, None)), d128);
        // Nothing asked: the rule.
        assert_eq!(with_knobs(rule, k(None, None, None)), rule);
    }

    /// `FLASHCORE_BWD_REGS=240` moves only the 80-row build (the d128 non-causal one pass from
    /// `ONEPASS_MIN_LEN_D128`) to its 24/240 twin; every other call's variant, and every call
    /// without the knob, is unchanged. (The rule is given the knob's value: the environment is
    /// not touched.)
    #[test]
    fn bwd_regs_240_moves_only_the_80_row_build() {
        let shipped = crate::kernels::shipped_bwd_variants();
        let q80 = |dtype| {
            BwdVariant {
                dtype,
                head_dim: 128,
                causal: false,
                pingpong: false,
                onepass: true,
                diag: 0,
                core: default_core(),
                window: false,
                softcap: false,
                varlen: false,
                qrows80: false,
                regs240: false,
            }
            .with_80_row_tiles()
        };
        for dtype in [DType::Bf16, DType::F16] {
            let v = q80(dtype);
            assert!(v.rows80());
            let w = with_bwd_regs(v, Some(240));
            assert!(w.wide() && w.name().ends_with("_q80_w240"), "{}", w.name());
            assert!(shipped.contains(&w), "{} is not shipped", w.name());
            assert_eq!(with_bwd_regs(v, None), v);
            // Not 80-row builds: the 64-row one pass, causal, d64, varlen, two passes, schedule 4.
            let others = [
                BwdVariant {
                    qrows80: false,
                    ..v
                },
                BwdVariant {
                    causal: true,
                    qrows80: false,
                    ..v
                },
                BwdVariant {
                    head_dim: 64,
                    causal: true,
                    qrows80: false,
                    ..v
                },
                backward_varlen_call(dtype, 128, false),
                BwdVariant {
                    onepass: false,
                    pingpong: true,
                    core: 0,
                    qrows80: false,
                    ..v
                },
                BwdVariant {
                    core: 4,
                    qrows80: false,
                    ..v
                },
            ];
            for o in others {
                assert!(!o.rows80());
                assert_eq!(with_bwd_regs(o, Some(240)), o, "{}", o.name());
            }
        }
        if std::env::var_os("FLASHCORE_BWD_REGS").is_none()
            && std::env::var_os("FLASHCORE_BWD_ONEPASS").is_none()
            && std::env::var_os("FLASHCORE_BWD_CORE").is_none()
            && std::env::var_os("FLASHCORE_BWD_QROWS").is_none()
        {
            // Without the knob the selected 80-row build is the 40/232 one.
            let long = backward_call_len(DType::Bf16, 128, false, ONEPASS_MIN_LEN_D128);
            assert!(long.rows80() && !long.wide(), "{}", long.name());
            assert_eq!(with_bwd_regs(long, Some(240)), long.with_240_registers());
            let short = backward_call_len(DType::Bf16, 128, false, ONEPASS_MIN_LEN_D128 - 1);
            assert_eq!(with_bwd_regs(short, Some(240)), short);
        }
    }
}
