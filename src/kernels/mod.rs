//! The CUDA sources we ship and the variants they are compiled into. Sources live in
//! `kernels/` at the repository root and are embedded at build time; NVRTC gets the headers
//! in memory, so no toolkit headers or files on disk are needed at run time.

use crate::error::Result;
use crate::jit::{self, Header};
use crate::spec::DType;

/// Symbol of the forward kernel in every variant's cubin.
pub const FORWARD_SYMBOL: &str = "flashcore_attention_fwd";

/// Symbol of decode mode's combine kernel (decode variants' cubins only).
pub const COMBINE_SYMBOL: &str = "flashcore_decode_combine";

/// Symbol of the KV-cache append kernel (KV-cache variants' cubins only).
pub const APPEND_SYMBOL: &str = "flashcore_kv_append";
/// Symbol of the varlen variants' work-list builder (kernels/fc_varlen_build.cuh).
pub const VARLEN_BUILD_SYMBOL: &str = "flashcore_varlen_build";
/// The varlen variants' `__constant__` work list, which the builder writes and the forward reads.
pub const VARLEN_WORK_SYMBOL: &str = "fc_varlen_work";

const FORWARD_SOURCE: &str = include_str!("../../kernels/attention_fwd.cu");

/// Symbol of the queued-timing wait kernel (`kernels/fc_spin.cu`), used by `flashcore leakage`.
pub const SPIN_SYMBOL: &str = "flashcore_spin";
const SPIN_SOURCE: &str = include_str!("../../kernels/fc_spin.cu");

/// The cubin of the queued-timing wait kernel (one thread spinning on the global timer for its
/// `u64` argument's nanoseconds; reads no data), through the on-disk cache.
pub fn spin_cubin() -> Result<Vec<u8>> {
    jit::compile_cached("spin", SPIN_SOURCE, &[], &jit::base_options())
}

/// Embeds each kernel header under the name the sources `#include` it by.
macro_rules! embed_headers {
    ($($name:literal),* $(,)?) => {
        &[$(($name, include_str!(concat!("../../kernels/", $name)))),*]
    };
}

/// Headers by the name the sources `#include` them.
pub const HEADERS: &[(&str, &str)] = embed_headers!(
    "fc_common.cuh",
    "fc_config.cuh",
    "fc_scheduler.cuh",
    "fc_producer.cuh",
    "fc_consumer.cuh",
    "fc_epilogue.cuh",
    "fc_mbarrier.cuh",
    "fc_tma.cuh",
    "fc_wgmma.cuh",
    "fc_wgmma_ops.cuh",
    "fc_wgmma_keys.cuh",
    "fc_softmax.cuh",
    "fc_cluster.cuh",
    "fc_instrument.cuh",
    "fc_decode.cuh",
    "fc_kv_append.cuh",
    "fc_varlen_build.cuh",
);

// The backward kernels: their own variant type and cubins.
pub mod backward;
// Which variant a call runs.
pub mod select;
// The shipped variants, as data.
pub mod table;

fn headers() -> Vec<Header<'static>> {
    HEADERS
        .iter()
        .map(|(name, source)| Header { name, source })
        .collect()
}

/// Tile shape and pipeline depth of a variant. Decided here, passed to the kernel as defines, so
/// host (grid, shared-memory size) and device agree by construction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tile {
    /// Query rows per CTA (64 per consumer warpgroup).
    pub block_m: usize,
    /// Keys per pipeline stage.
    pub block_n: usize,
    /// Depth of the K/V shared-memory ring.
    pub stages: usize,
    /// Consumer warpgroups.
    pub consumers: usize,
    /// Q tile buffers (2 in decode mode and wherever prefill fits two: the next tile's Q loads
    /// during this one).
    pub q_buffers: usize,
    /// CTAs of a cluster sharing one query tile's keys (1: no split).
    pub split: usize,
}

impl Tile {
    pub fn threads(&self) -> usize {
        128 * (1 + self.consumers)
    }
    /// Dynamic shared memory: Q tile, K and V rings, mbarriers, plus 1 KiB of alignment slack.
    pub fn smem_bytes(&self, head_dim: usize) -> usize {
        let q = self.q_buffers * self.block_m * head_dim * 2;
        let kv = 2 * self.stages * self.block_n * head_dim * 2;
        // + the dynamic order's four hand-over barriers.
        let barriers = (2 * self.q_buffers + 4 * self.stages + 4) * 8;
        let anchor = 128 * self.consumers * 4;
        // Split mode parks an fp32 partial (O, max, sum) per query row for the cluster combine.
        let partial = if self.split > 1 {
            self.block_m * (head_dim + 2) * 4 + 16 // + alignment of part_o
        } else {
            0
        };
        q + kv + barriers + anchor + partial + 1024
    }
}

/// One compiled specialisation of the forward kernel. Everything that distinguishes variants
/// is public (docs/design.md §1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Variant {
    pub dtype: DType,
    pub head_dim: usize,
    pub causal: bool,
    /// Query rows per CTA: 64 per consumer warpgroup (64, 128 or 192).
    pub block_m: usize,
    /// Keys per K/V pipeline stage (64 or 128).
    pub block_n: usize,
    /// Secret-length mode: per-batch true lengths from device memory mask keys and zero rows.
    pub secret_len: bool,
    /// Key-range split across a cluster of this many CTAs (1: none); see [`select::split_for`].
    pub split: usize,
    /// Decode mode (`kernels/fc_decode.cuh`): GQA-packed 64-row tiles, the key range split over
    /// work units of a size fixed by Sk, partials merged by a second kernel ([`Variant::decode`]).
    pub decode: bool,
    /// KV-cache decode with public key counts (`FC_KV_PUBLIC`): each sequence's count, read from
    /// device memory as public metadata, bounds its walk ([`Variant::kv_cache`]).
    pub kv_public: bool,
    /// A paged KV cache (`FC_PAGED`): K/V pages read through a block table.
    pub paged: bool,
    /// Variable-length prefill (`FC_VARLEN`): packed `[total, heads, dim]` sequences
    /// walked through a public work list ([`Variant::varlen`]).
    pub varlen: bool,
    /// Softcap builds (`FC_SOFTCAP`): scores go through `cap · tanh(s / cap)` before
    /// the softmax. Plain prefill tiles of 128 rows, varlen and KV-cache decode builds
    /// ([`Variant::with_softcap`]).
    pub softcap: bool,
}

/// The deliberately leaky kernels that prove `flashcore leakage` can fail (and that the audit
/// flags). Built only on request by the leakage test; never part of [`shipped_variants`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LeakyControl {
    /// Every CTA exits at once when the first element of its Q tile is +0.0.
    EarlyExitOnZeroQ = 1,
    /// Secret-length mode that skips the key blocks past the true length.
    SkipPastSecretLength = 2,
}

/// A build that is not shipped, asked for by the timing test: a leaky control, the hardware
/// floor, the cycle timer (the last two may be combined). The default is the shipped build.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct TestBuild {
    /// A deliberately leaky build for the timing test's power control.
    pub leaky_control: Option<LeakyControl>,
    /// The timing test's hardware floor (`FC_FLOOR_CONTROL`, kernels/fc_instrument.cuh): the
    /// softmax sees a public pattern instead of the scores; loads and GEMMs are the shipped
    /// ones.
    pub floor_control: bool,
    /// The cycle timer (`FC_CYCLE_TIMER`, kernels/fc_instrument.cuh): each CTA writes its SM
    /// clock and global-timer readings to a buffer the host names. Public-only, audited.
    pub cycle_timer: bool,
}

impl TestBuild {
    pub fn is_shipped(&self) -> bool {
        *self == TestBuild::default()
    }
    /// What a launch of `shipped` compiles in this build. Test builds never split keys across
    /// a cluster (the controls and the timer know one CTA per tile).
    pub fn apply(&self, shipped: Variant) -> KernelBuild {
        let variant = if self.is_shipped() {
            shipped
        } else {
            Variant {
                split: 1,
                ..shipped
            }
        };
        KernelBuild {
            variant,
            test: *self,
        }
    }
}

/// What is compiled and loaded: a shipped [`Variant`], or one of the timing test's builds of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KernelBuild {
    pub variant: Variant,
    pub test: TestBuild,
}

impl From<Variant> for KernelBuild {
    fn from(variant: Variant) -> KernelBuild {
        KernelBuild {
            variant,
            test: TestBuild::default(),
        }
    }
}

impl KernelBuild {
    /// The variant's name, with the test build's suffixes (`_LEAKY_CONTROL1`, `_FLOOR`, `_CYCLES`).
    pub fn name(&self) -> String {
        let v = &self.variant;
        let control = self
            .test
            .leaky_control
            .map_or(String::new(), |c| format!("_LEAKY_CONTROL{}", c as u8));
        let probes = format!(
            "{}{}",
            if self.test.floor_control {
                "_FLOOR"
            } else {
                ""
            },
            if self.test.cycle_timer { "_CYCLES" } else { "" }
        );
        format!("{}{control}{probes}", v.stem()) + if v.softcap { "_softcap" } else { "" }
    }

    pub fn options(&self) -> Vec<String> {
        self.variant.options_for(self.test)
    }

    /// The cubin, through the on-disk cache. Needs NVRTC, not a GPU.
    pub fn cubin(&self) -> Result<Vec<u8>> {
        jit::compile_cached(&self.name(), FORWARD_SOURCE, &headers(), &self.options())
    }
}

impl Variant {
    /// A stable, human-readable name, e.g. `fwd_bf16_d128_causal`.
    pub fn name(&self) -> String {
        KernelBuild::from(*self).name()
    }

    /// The name up to the test-build and softcap suffixes.
    fn stem(&self) -> String {
        let split = if self.split > 1 {
            format!("_split{}", self.split)
        } else {
            String::new()
        };
        let block_n = if self.block_n == 128 {
            String::new()
        } else {
            format!("_n{}", self.block_n)
        };
        let split = if self.decode {
            format!(
                "{split}_decode{}{}",
                if self.kv_public { "_kvpub" } else { "" },
                if self.paged { "_paged" } else { "" }
            )
        } else {
            split
        };
        format!(
            "fwd_{}_d{}_{}_m{}{block_n}{}{split}{}",
            self.dtype.name(),
            self.head_dim,
            if self.causal { "causal" } else { "full" },
            self.block_m,
            if self.secret_len { "_slen" } else { "" },
            match (self.varlen, self.paged) {
                (true, true) => "_varlen_paged",
                (true, false) => "_varlen",
                _ => "",
            },
        )
    }

    /// A plain variant (no secret length, no split, not a control) with the given tile height.
    pub fn basic(dtype: DType, head_dim: usize, causal: bool, block_m: usize) -> Variant {
        Variant {
            dtype,
            head_dim,
            causal,
            block_m,
            block_n: block_n_for(head_dim),
            secret_len: false,
            split: 1,
            decode: false,
            kv_public: false,
            paged: false,
            varlen: false,
            softcap: false,
        }
    }

    /// The decode variant: one 64-row consumer warpgroup whose rows are GQA-packed query
    /// heads, the key range split over work units ([`crate::attention::decode`]).
    pub fn decode(dtype: DType, head_dim: usize, causal: bool) -> Variant {
        Variant {
            decode: true,
            ..Variant::basic(dtype, head_dim, causal, 64)
        }
    }

    /// The varlen prefill variant (`FC_VARLEN`): 128-row tiles of packed sequences, each tile's
    /// token offsets and counts read from a public work list (in `__constant__` memory) built on
    /// the host
    /// ([`crate::attention::launch::varlen`]). The tile shape depends on nothing of the batch,
    /// so a sequence's bits do not depend on its neighbours.
    pub fn varlen(dtype: DType, head_dim: usize, causal: bool) -> Variant {
        Variant {
            varlen: true,
            ..Variant::basic(dtype, head_dim, causal, 128)
        }
    }

    /// The varlen variant over a paged KV cache (`FC_VARLEN` and `FC_PAGED`: chunked prefill):
    /// [`Variant::varlen`]'s tile and code, K/V read through the block table, so its output bits
    /// are those of the same cache stored contiguously.
    pub fn varlen_paged(dtype: DType, head_dim: usize, causal: bool) -> Variant {
        Variant {
            paged: true,
            ..Variant::varlen(dtype, head_dim, causal)
        }
    }

    /// The KV-cache decode variant: key counts public ([`Variant::kv_public`]) or secret (the
    /// secret-length build walks the capacity), contiguous or `paged`.
    /// A KV-cache build (`FC_KV_CACHE`): decode with key counts, public or secret.
    pub fn is_kv_cache(&self) -> bool {
        self.decode && (self.kv_public || self.secret_len)
    }

    pub fn kv_cache(
        dtype: DType,
        head_dim: usize,
        causal: bool,
        secret: bool,
        paged: bool,
    ) -> Variant {
        Variant {
            secret_len: secret,
            kv_public: !secret,
            paged,
            ..Variant::decode(dtype, head_dim, causal)
        }
    }

    pub fn tile(&self) -> Tile {
        // Decode streams K/V with little compute per byte: at d128 a third stage keeps more of
        // it in flight (what fits in 227 KiB beside two Q buffers). d64 keeps four (six measured
        // no better: PERF_NOTES step 16).
        // d256 decode: two Q buffers (64 KiB) leave room for two 64-key stages (64 KiB each).
        let stages = match (self.decode, self.head_dim) {
            (_, 64) => 4,
            (false, _) | (true, 256) => 2,
            (true, _) => 3,
        };
        let tile = Tile {
            block_m: self.block_m,
            block_n: self.block_n,
            stages,
            consumers: self.block_m / 64,
            q_buffers: if self.decode { 2 } else { 1 },
            split: self.split,
        };
        // Prefill tiles double-buffer Q where it fits (not d256 at 128 rows, nor 176-key
        // blocks, nor 192-row tiles, whose 160-register consumers spill with it): the next
        // tile's Q and first K/V stages then load under this tile's last blocks and epilogue
        // (PERF_NOTES). A split's CTA has one tile: one buffer. Nor the light causal d256
        // tile on 80-key blocks: it spilled with the second buffer (one word), and a light
        // launch is a single wave, where the next tile's Q has little to hide behind.
        let two = Tile {
            q_buffers: 2,
            ..tile
        };
        let light_causal_keys80 = self.causal && tile.consumers == 1 && self.block_n == 80;
        if !self.decode
            && self.split == 1
            && tile.consumers <= 2
            && !light_causal_keys80
            && two.smem_bytes(self.head_dim) <= MAX_SMEM_BYTES
        {
            two
        } else {
            tile
        }
    }

    pub fn options(&self) -> Vec<String> {
        self.options_for(TestBuild::default())
    }

    /// The options of this variant in `test`'s build (the shipped build passes
    /// `FC_LEAKY_CONTROL=0` and neither probe define, as it always has: same cache keys).
    fn options_for(&self, test: TestBuild) -> Vec<String> {
        let t = self.tile();
        let mut o = jit::base_options();
        o.push(format!("-DFC_BLOCK_M={}", t.block_m));
        o.push(format!("-DFC_BLOCK_N={}", t.block_n));
        o.push(format!("-DFC_STAGES={}", t.stages));
        o.push(format!("-DFC_CONSUMERS={}", t.consumers));
        o.push(format!("-DFC_HEAD_DIM={}", self.head_dim));
        o.push(format!("-DFC_BF16={}", (self.dtype == DType::Bf16) as u8));
        o.push(format!("-DFC_CAUSAL={}", self.causal as u8));
        o.push(format!("-DFC_SECRET_LEN={}", self.secret_len as u8));
        o.push(format!("-DFC_SPLIT={}", self.split));
        o.push(format!(
            "-DFC_LEAKY_CONTROL={}",
            test.leaky_control.map_or(0, |c| c as u8)
        ));
        // Prefill tiles with two Q buffers (decode builds default to two).
        if !self.decode && t.q_buffers == 2 {
            o.push("-DFC_QBUF=2".into());
        }
        // Decode builds only: prefill variants keep their options (and cache keys) unchanged.
        if self.decode {
            o.push("-DFC_DECODE=1".into());
        }
        // KV-cache builds only: the other decode variants keep theirs.
        if self.kv_public {
            o.push("-DFC_KV_PUBLIC=1".into());
        }
        if self.paged {
            o.push("-DFC_PAGED=1".into());
        }
        // Varlen builds only.
        if self.varlen {
            o.push("-DFC_VARLEN=1".into());
        }
        // Builds with the dynamic tile order only.
        if self.dynamic_order() {
            o.push("-DFC_DYN_ORDER=1".into());
        }
        // Softcap builds only.
        if self.softcap {
            o.push("-DFC_SOFTCAP=1".into());
        }
        // The row-major gather in paged builds, asked for by a measurement knob.
        if self.paged && crate::knobs::row_gather() {
            o.push("-DFC_ROW_GATHER=1".into());
        }
        // Measurement builds only: shipped variants pass neither define (both default to 0).
        if test.floor_control {
            o.push("-DFC_FLOOR_CONTROL=1".into());
        }
        if test.cycle_timer {
            o.push("-DFC_CYCLE_TIMER=1".into());
        }
        o
    }

    /// The cubin, through the on-disk cache. Needs NVRTC, not a GPU.
    pub fn cubin(&self) -> Result<Vec<u8>> {
        KernelBuild::from(*self).cubin()
    }

    /// The hash of this variant's compile inputs ([`jit::inputs_key`]); needs no NVRTC.
    pub fn inputs_key(&self) -> String {
        jit::inputs_key(FORWARD_SOURCE, &headers(), &self.options())
    }

    /// Ordinals of kernel parameters that hold secrets (none: secrets reach the kernel only
    /// through device memory).
    pub fn secret_params(&self) -> Vec<usize> {
        Vec::new()
    }

    /// Whether this build may take its tiles in the dynamic order (kernels/fc_scheduler.cuh,
    /// `FC_DYN_ORDER`); the host passes a counter for shapes with more tile pairs than SMs and at
    /// least 8 query tiles per head. The causal prefill builds of 128 rows and 128-key blocks at
    /// d64, d96 and d128, with public or secret lengths: measured 2–6% faster from S = 1k at d64,
    /// 1–2% at d128 (d96 and secret lengths not measured). Not the 192-row d64 builds nor d256,
    /// whose consumers spill with it (the audit's gate), nor split, decode or varlen builds.
    pub fn dynamic_order(&self) -> bool {
        !self.decode
            && !self.varlen
            && self.split == 1
            && self.causal
            && matches!(self.head_dim, 64 | 96 | 128)
            && self.block_m == 128
            && self.block_n == 128
    }

    /// What the audit is told about kernel `kernel` of this variant's cubin: its secret
    /// parameters and, for the forward kernel of a decode variant without secret lengths, the
    /// pointers to public KV-cache metadata (`cache_seqlens`, the block table: docs/design.md §1),
    /// and for a build with the dynamic order its tile counter. Everything else read from device
    /// memory stays secret.
    pub fn declared(&self, kernel: &str) -> crate::audit::Declared {
        use crate::abi::{LENS_FIELD, TABLE_FIELD};
        let mut public_fields = Vec::new();
        if kernel == APPEND_SYMBOL {
            // The append is addressed by the counts and the table in every KV-cache kind.
            use crate::abi::{APPEND_TABLE_FIELD, SEQLENS_FIELD};
            public_fields.push((0, SEQLENS_FIELD));
            public_fields.push((0, APPEND_TABLE_FIELD));
        }
        if kernel == FORWARD_SYMBOL {
            if self.kv_public {
                public_fields.push((0, LENS_FIELD));
            }
            if self.paged {
                public_fields.push((0, TABLE_FIELD));
            }
            if self.dynamic_order() {
                public_fields.push((0, crate::abi::COUNTER_FIELD));
            }
        }
        if kernel == VARLEN_BUILD_SYMBOL && self.varlen {
            // cu_seqlens_q, cu_seqlens_k, seqused_k, seqused_q: pointer parameters 0 to 3.
            public_fields.extend([(0, 0), (1, 0), (2, 0), (3, 0)]);
        }
        crate::audit::Declared {
            secret_params: self.secret_params(),
            public_fields,
            ..Default::default()
        }
    }
}

/// Keys per K/V stage for a head dim: 128, or 64 at d256, whose two consumer warpgroups each
/// hold a 128-register O accumulator — with 128-key scores (64 registers) and their fragments
/// (32) beside it they would spill at 232 registers (PERF_NOTES) — and whose
/// 128-row Q tile (64 KiB) leaves room for two 64-key stages of 64 KiB.
pub fn block_n_for(head_dim: usize) -> usize {
    if head_dim > 128 {
        64
    } else {
        128
    }
}

/// The most dynamic shared memory a CTA may use on sm_90 (227 KiB).
pub const MAX_SMEM_BYTES: usize = 232_448;

/// Every variant the library can launch: the rows of [`table::FORWARD`].
pub fn shipped_variants() -> Vec<Variant> {
    table::forward_variants()
}

/// Every backward variant the library can launch: the rows of [`table::BACKWARD`].
pub fn shipped_bwd_variants() -> Vec<backward::BwdVariant> {
    table::backward_variants()
}
