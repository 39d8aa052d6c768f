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
}

// The device's `Params` ends at byte 568 (576 with its 64-byte alignment); cudarc's CUtensorMap is
// 128-aligned, so this mirror pads to 640. The launch copies the kernel's declared size: the
// offsets are what must agree.
const _: () = assert!(std::mem::offset_of!(KernelParams, table_ptr) == 512);
const _: () = assert!(std::mem::offset_of!(KernelParams, box_rows) == 532);
const _: () = assert!(std::mem::offset_of!(KernelParams, starts_ptr) == 536);
const _: () = assert!(std::mem::offset_of!(KernelParams, sinks_ptr) == 544);
const _: () = assert!(std::mem::offset_of!(KernelParams, softcap_out) == 564);

/// Byte offsets in the parameter block of the pointers to public metadata: the key counts of
/// `FC_KV_PUBLIC` builds and the block table of `FC_PAGED` ones. The audit treats what is read
/// through them as public (docs/design.md §1, `Variant::declared` in `kernels`).
pub const LENS_FIELD: u32 = std::mem::offset_of!(KernelParams, lens_ptr) as u32;
pub const TABLE_FIELD: u32 = std::mem::offset_of!(KernelParams, table_ptr) as u32;

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
    pub page_shift: i32,
    pub table_stride: i32,
    pub num_pages: i32,
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
