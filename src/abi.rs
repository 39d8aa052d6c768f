//! The kernels' parameter blocks as the host writes them: `repr(C)` mirrors of the CUDA structs,
//! byte for byte, with compile-time checks of their offsets, and the offsets of the pointers to
//! public metadata that the audit is told about. Below the variants and the launch code, which
//! both need them; imports nothing from the crate.

use cudarc::driver::sys;

/// The kernel's `Params` (kernels/attention_fwd.cu), byte for byte.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(crate) struct KernelParams {
    pub(crate) q_map: sys::CUtensorMap,
    pub(crate) k_map: sys::CUtensorMap,
    pub(crate) v_map: sys::CUtensorMap,
    pub(crate) o_ptr: u64,
    pub(crate) lse_ptr: u64,
    pub(crate) lens_ptr: u64,
    pub(crate) q_ptr_for_control: u64,
    pub(crate) o_stride_b: i64,
    pub(crate) o_stride_s: i64,
    pub(crate) o_stride_h: i64,
    pub(crate) seqlen_q: i32,
    pub(crate) seqlen_k: i32,
    pub(crate) heads_q: i32,
    pub(crate) group: i32,
    pub(crate) scale_log2: f32,
    pub(crate) scale: f32,
    pub(crate) num_m_blocks: i32,
    pub(crate) units_per_head: i32,
    pub(crate) num_units: i32,
    pub(crate) pair_tiles: i32,
    pub(crate) ws_o_ptr: u64,
    pub(crate) ws_ml_ptr: u64,
    pub(crate) pack: i32,
    pub(crate) pack_shift: i32,
    pub(crate) split_blocks: i32,
    pub(crate) num_splits: i32,
    pub(crate) table_ptr: u64,
    pub(crate) table_stride: i32,
    pub(crate) num_pages: i32,
    pub(crate) page_shift: i32,
    pub(crate) box_rows: i32,
    pub(crate) starts_ptr: u64,
    pub(crate) sinks_ptr: u64,
    pub(crate) window_left: i32,
    pub(crate) window_right: i32,
    pub(crate) softcap_in: f32,
    pub(crate) softcap_out: f32,
    pub(crate) units_per_head_mul: u32,
    pub(crate) units_per_head_shift: i32,
    pub(crate) heads_q_mul: u32,
    pub(crate) heads_q_shift: i32,
    pub(crate) o_tma: i32,
    pub(crate) o_map: sys::CUtensorMap,
    pub(crate) tile_counter: u64,
    pub(crate) section_heads: i32,
    pub(crate) section_heads_mul: u32,
    pub(crate) section_heads_shift: i32,
    pub(crate) section_units_mul: u32,
    pub(crate) section_units_shift: i32,
    pub(crate) page_size: i32,
    pub(crate) page_mul: u32,
    pub(crate) page_div_shift: i32,
    pub(crate) gather: i32,
    pub(crate) k_ptr: u64,
    pub(crate) v_ptr: u64,
    pub(crate) k_stride: [i64; 3],
    pub(crate) v_stride: [i64; 3],
}

/// `n / d` as `umulhi(n, mul) >> shift` for every `0 <= n < 2^31` (`mul` = 0 stands for d = 1):
/// the scheduler's per-tile divisions by public counts, without the integer-division sequence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FastDiv {
    pub(crate) mul: u32,
    pub(crate) shift: i32,
}

impl FastDiv {
    /// The multiplier and shift for divisor `d` (1 ≤ d < 2^31): shift = ⌈log2 d⌉ − 1 and
    /// mul = ⌈2^(32 + shift) / d⌉, below 2^32, whose rounding error stays under one for n < 2^31.
    pub(crate) fn new(d: u32) -> FastDiv {
        debug_assert!((1..1 << 31).contains(&d), "divisor out of range");
        let d = d.clamp(1, (1 << 31) - 1);
        if d == 1 {
            return FastDiv { mul: 0, shift: 0 };
        }
        let shift = 31 - (d - 1).leading_zeros(); // ⌈log2 d⌉ − 1, since d ≥ 2
        let p = 32 + shift;
        let mul = (1u64 << p).div_ceil(d as u64);
        FastDiv {
            mul: mul as u32,
            shift: shift as i32,
        }
    }

    /// What the device computes (kernels/fc_common.cuh `fast_div`).
    #[cfg(test)]
    pub(crate) fn div(self, n: u32) -> u32 {
        if self.mul == 0 {
            n
        } else {
            ((n as u64 * self.mul as u64) >> 32) as u32 >> self.shift
        }
    }
}

// The device's `Params` is 896 bytes (o_map at 640, 64-byte aligned; 880 used); cudarc's
// CUtensorMap is 128-aligned, which puts it at 640 here too. The launch copies the kernel's
// declared size: the
// offsets are what must agree.
const _: () = assert!(std::mem::offset_of!(KernelParams, table_ptr) == 512);
const _: () = assert!(std::mem::offset_of!(KernelParams, box_rows) == 532);
const _: () = assert!(std::mem::offset_of!(KernelParams, starts_ptr) == 536);
const _: () = assert!(std::mem::offset_of!(KernelParams, sinks_ptr) == 544);
const _: () = assert!(std::mem::offset_of!(KernelParams, softcap_out) == 564);
const _: () = assert!(std::mem::offset_of!(KernelParams, heads_q_mul) == 576);
const _: () = assert!(std::mem::offset_of!(KernelParams, o_map) == 640);
const _: () = assert!(std::mem::offset_of!(KernelParams, section_units_shift) == 792);
const _: () = assert!(std::mem::offset_of!(KernelParams, page_size) == 796);
const _: () = assert!(std::mem::offset_of!(KernelParams, gather) == 808);
const _: () = assert!(std::mem::offset_of!(KernelParams, k_ptr) == 816);
const _: () = assert!(std::mem::offset_of!(KernelParams, v_stride) == 856);
const _: () = assert!(std::mem::size_of::<KernelParams>() == 896);

/// Byte offsets in the parameter block of the pointers to public metadata: the key counts of
/// `FC_KV_PUBLIC` builds and the block table of `FC_PAGED` ones. The audit treats what is read
/// through them as public (docs/design.md §1, `Variant::declared` in `kernels`).
pub const LENS_FIELD: u32 = std::mem::offset_of!(KernelParams, lens_ptr) as u32;
pub const TABLE_FIELD: u32 = std::mem::offset_of!(KernelParams, table_ptr) as u32;
/// Byte offset of the dynamic order's tile counter (declared public to the audit for the prefill
/// builds that may take it: written only with public values, read by atomic adds).
pub const COUNTER_FIELD: u32 = std::mem::offset_of!(KernelParams, tile_counter) as u32;

/// The append kernel's parameter block (`AppendParams` in kernels/fc_kv_append.cuh).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct AppendParams {
    pub k_new: u64,
    pub v_new: u64,
    pub k_cache: u64,
    pub v_cache: u64,
    pub seqlens_ptr: u64,
    pub table_ptr: u64,
    pub counts_ptr: u64,
    pub k_new_stride: [i64; 3],
    pub v_new_stride: [i64; 3],
    pub k_cache_stride: [i64; 3],
    pub v_cache_stride: [i64; 3],
    pub batch: i32,
    pub rows: i32,
    pub heads_kv: i32,
    pub head_dim: i32,
    pub capacity: i32,
    pub page_size: i32,
    pub table_stride: i32,
    pub num_pages: i32,
    pub page_mul: u32,
    pub page_div_shift: i32,
}

/// Offsets of the two public metadata pointers in `AppendParams`, for the audit.
pub const SEQLENS_FIELD: u32 = std::mem::offset_of!(AppendParams, seqlens_ptr) as u32;
pub const APPEND_TABLE_FIELD: u32 = std::mem::offset_of!(AppendParams, table_ptr) as u32;

/// The combine kernel's parameter block (`CombineParams` in kernels/fc_decode.cuh).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub(crate) struct CombineParams {
    pub o_ptr: u64,
    pub lse_ptr: u64,
    pub ws_o_ptr: u64,
    pub ws_ml_ptr: u64,
    pub o_stride_b: i64,
    pub o_stride_s: i64,
    pub o_stride_h: i64,
    pub batch: i32,
    pub heads_q: i32,
    pub seqlen_q: i32,
    pub num_splits: i32,
    pub scale_log2: f32,
    pub scale: f32,
    pub groups: i32,
    /// fp32 `[heads_q]` learnable sinks (secret), or 0.
    pub sinks_ptr: u64,
}

/// The kernels' `BwdParams` (kernels/fc_bwd_config.cuh), byte for byte.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(crate) struct BwdKernelParams {
    pub(crate) q_map: sys::CUtensorMap,
    pub(crate) k_map: sys::CUtensorMap,
    pub(crate) v_map: sys::CUtensorMap,
    pub(crate) do_map: sys::CUtensorMap,
    pub(crate) o_ptr: u64,
    pub(crate) do_ptr: u64,
    pub(crate) lse_ptr: u64,
    pub(crate) dq_ptr: u64,
    pub(crate) dk_ptr: u64,
    pub(crate) dv_ptr: u64,
    pub(crate) lse2_ptr: u64,
    pub(crate) dvec_ptr: u64,
    pub(crate) q_stride_b: i64,
    pub(crate) q_stride_s: i64,
    pub(crate) q_stride_h: i64,
    pub(crate) k_stride_b: i64,
    pub(crate) k_stride_s: i64,
    pub(crate) k_stride_h: i64,
    pub(crate) batch: i32,
    pub(crate) seqlen_q: i32,
    pub(crate) seqlen_k: i32,
    pub(crate) heads_q: i32,
    pub(crate) group: i32,
    pub(crate) sq_pad: i32,
    pub(crate) scale_log2: f32,
    pub(crate) scale: f32,
    pub(crate) kv_m_blocks: i32,
    pub(crate) q_n_blocks: i32,
    pub(crate) dq_acc_ptr: u64,
    pub(crate) flags_ptr: u64,
    pub(crate) kv_n_blocks: i32,
    // Window, softcap and sinks (kernels/fc_bwd_mask.cuh, fc_bwd_sink.cuh).
    pub(crate) window_left: i32,
    pub(crate) window_right: i32,
    pub(crate) softcap_in: f32,
    pub(crate) softcap_out: f32,
    pub(crate) pad0: i32,
    pub(crate) sinks_ptr: u64,
    pub(crate) dsink_ptr: u64,
    // Varlen (kernels/fc_bwd_varlen.cuh): the pack's totals and its public metadata.
    pub(crate) vl_total_q: i32,
    pub(crate) vl_total_k: i32,
    pub(crate) cu_q_ptr: u64,
    pub(crate) cu_k_ptr: u64,
    pub(crate) used_k_ptr: u64,
    pub(crate) used_q_ptr: u64,
    pub(crate) reserved: [i32; 2],
}

const _: () = assert!(std::mem::size_of::<BwdKernelParams>() == 768);

/// Byte offset of the turn counters' pointer in the parameter block (declared public to the
/// audit for the one-pass variants: `BwdVariant::declared` in `kernels::backward`).
pub const FLAGS_FIELD: u32 = std::mem::offset_of!(BwdKernelParams, flags_ptr) as u32;

/// Byte offsets of the varlen variants' metadata pointers (`cu_seqlens_q`, `cu_seqlens_k`,
/// `seqused_k`, `seqused_q`), declared public to the audit (`BwdVariant::declared` in `kernels::backward`).
pub const VARLEN_FIELDS: [u32; 4] = [
    std::mem::offset_of!(BwdKernelParams, cu_q_ptr) as u32,
    std::mem::offset_of!(BwdKernelParams, cu_k_ptr) as u32,
    std::mem::offset_of!(BwdKernelParams, used_k_ptr) as u32,
    std::mem::offset_of!(BwdKernelParams, used_q_ptr) as u32,
];

/// Every field of each mirror against the CUDA struct it copies: the structs are parsed from the
/// kernel headers, laid out by C's rules, and compared field by field (in declaration order) with
/// `offset_of!` on the mirror. A field added on one side only, or moved, fails here.
#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    /// (offset, size) of each field of `struct NAME { ... };` in `source`, in C layout.
    fn c_layout(source: &str, name: &str) -> Vec<(usize, usize)> {
        let start = source
            .find(&format!("struct {name} {{"))
            .unwrap_or_else(|| panic!("no struct {name}"));
        let body = &source[start..];
        let body = &body[body.find('{').unwrap() + 1..body.find("};").unwrap()];
        let mut fields = Vec::new();
        let mut offset = 0usize;
        for line in body.lines() {
            let code = line.split("//").next().unwrap().trim();
            let Some(decl) = code.strip_suffix(';') else {
                assert!(code.is_empty(), "{name}: cannot read `{code}`");
                continue;
            };
            let (ty, names) = decl.split_once(' ').unwrap();
            let (size, align) = match ty {
                "TensorMap" => (128, 64),
                "uint64_t" | "int64_t" => (8, 8),
                "int32_t" | "uint32_t" | "float" => (4, 4),
                other => panic!("{name}: type `{other}` not known to this test"),
            };
            for n in names.split(',') {
                let n = n.trim();
                let count = match n.split_once('[') {
                    Some((_, len)) => len.trim_end_matches(']').parse::<usize>().unwrap(),
                    None => 1,
                };
                offset = offset.next_multiple_of(align);
                fields.push((offset, size * count));
                offset += size * count;
            }
        }
        fields
    }

    /// Offsets of a mirror's fields, in declaration order.
    macro_rules! offsets {
        ($t:ty: $($f:ident),* $(,)?) => {
            vec![$(offset_of!($t, $f)),*]
        };
    }

    fn check(name: &str, source: &str, rust: Vec<usize>) {
        let c: Vec<usize> = c_layout(source, name).iter().map(|f| f.0).collect();
        assert_eq!(c, rust, "{name}: field offsets, CUDA vs Rust mirror");
    }

    #[test]
    fn forward_params_match_the_kernel_field_by_field() {
        let rust = offsets!(KernelParams: q_map, k_map, v_map, o_ptr, lse_ptr, lens_ptr,
            q_ptr_for_control, o_stride_b, o_stride_s, o_stride_h, seqlen_q, seqlen_k, heads_q,
            group, scale_log2, scale, num_m_blocks, units_per_head, num_units, pair_tiles,
            ws_o_ptr, ws_ml_ptr, pack, pack_shift, split_blocks, num_splits, table_ptr,
            table_stride, num_pages, page_shift, box_rows, starts_ptr, sinks_ptr, window_left,
            window_right, softcap_in, softcap_out, units_per_head_mul, units_per_head_shift,
            heads_q_mul, heads_q_shift, o_tma, o_map, tile_counter, section_heads,
            section_heads_mul, section_heads_shift, section_units_mul, section_units_shift,
            page_size, page_mul, page_div_shift, gather, k_ptr, v_ptr, k_stride, v_stride);
        check("Params", include_str!("../kernels/fc_config.cuh"), rust);
    }

    #[test]
    fn backward_params_match_the_kernel_field_by_field() {
        let rust = offsets!(BwdKernelParams: q_map, k_map, v_map, do_map, o_ptr, do_ptr, lse_ptr,
            dq_ptr, dk_ptr, dv_ptr, lse2_ptr, dvec_ptr, q_stride_b, q_stride_s, q_stride_h,
            k_stride_b, k_stride_s, k_stride_h, batch, seqlen_q, seqlen_k, heads_q, group, sq_pad,
            scale_log2, scale, kv_m_blocks, q_n_blocks, dq_acc_ptr, flags_ptr, kv_n_blocks,
            window_left, window_right, softcap_in, softcap_out, pad0, sinks_ptr, dsink_ptr,
            vl_total_q, vl_total_k, cu_q_ptr, cu_k_ptr, used_k_ptr, used_q_ptr, reserved);
        check(
            "BwdParams",
            include_str!("../kernels/fc_bwd_config.cuh"),
            rust,
        );
    }

    #[test]
    fn append_params_match_the_kernel_field_by_field() {
        let rust = offsets!(AppendParams: k_new, v_new, k_cache, v_cache, seqlens_ptr, table_ptr,
            counts_ptr, k_new_stride, v_new_stride, k_cache_stride, v_cache_stride, batch, rows,
            heads_kv, head_dim, capacity, page_size, table_stride, num_pages, page_mul,
            page_div_shift);
        check(
            "AppendParams",
            include_str!("../kernels/fc_kv_append.cuh"),
            rust,
        );
    }

    #[test]
    fn combine_params_match_the_kernel_field_by_field() {
        let rust = offsets!(CombineParams: o_ptr, lse_ptr, ws_o_ptr, ws_ml_ptr, o_stride_b,
            o_stride_s, o_stride_h, batch, heads_q, seqlen_q, num_splits, scale_log2, scale,
            groups, sinks_ptr);
        check(
            "CombineParams",
            include_str!("../kernels/fc_decode.cuh"),
            rust,
        );
    }

    #[test]
    fn fast_division_is_exact_below_2_pow_31() {
        let edges = |d: u32| {
            let mut v = vec![0, 1, d - 1, d, d + 1, (1 << 31) - 1, (1 << 31) - 2];
            for k in [2u64, 3, 1000, 65_535, 65_536, (1u64 << 31) / d as u64] {
                for e in [-1i64, 0, 1] {
                    let n = k as i64 * d as i64 + e;
                    if (0..1i64 << 31).contains(&n) {
                        v.push(n as u32);
                    }
                }
            }
            v
        };
        let mut divisors: Vec<u32> = (1..=5000).collect();
        divisors.extend([
            65_535,
            65_536,
            65_537,
            1 << 20,
            (1 << 30) + 1,
            (1 << 31) - 1,
        ]);
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for d in divisors {
            let f = FastDiv::new(d);
            for n in edges(d) {
                assert_eq!(f.div(n), n / d, "{n} / {d}");
            }
            for _ in 0..200 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let n = (state >> 33) as u32; // below 2^31
                assert_eq!(f.div(n), n / d, "{n} / {d}");
            }
        }
    }

    #[test]
    fn the_layout_reader_sees_every_field() {
        let src = "struct S {\n    TensorMap a, b; // x\n    int32_t c;\n    uint64_t d;\n    int32_t e[3];\n};";
        assert_eq!(
            c_layout(src, "S"),
            [(0, 128), (128, 128), (256, 4), (264, 8), (272, 12)]
        );
    }
}
