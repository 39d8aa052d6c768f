//! The named suites of shapes. `bench/sdpa.py` holds the same lists (a CPU test compares them).

use crate::attention::{AttentionParams, DType, Layout};

/// A named list of shapes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Suite {
    /// The seed shapes: latency (1,8,512,64), (1,16,1024,64), and throughput shapes up to 16k.
    Seed,
    /// FlashAttention-3 paper sweep: 16k tokens, S = 512..16k, D ∈ {64, 128, 256}, hidden 2048.
    Fa3,
    /// Decode: one or four query positions over 1k–128k cached keys, GQA 32/8 and 8/1 at
    /// D 128, MHA 16/16 at D 64, bf16.
    Decode,
    /// The training shapes of the backward table, bf16 (for `--backward`).
    Backward,
    /// Varlen prefill: packs of 16k and 64k tokens with seeded length mixes, D 64/128,
    /// causal and not, bf16, beside flashcore's dense call at the same tokens and mean length
    /// (bench/varlen.py's cases, src/bench/varlen.rs).
    Varlen,
}

impl Suite {
    pub fn name(self) -> &'static str {
        match self {
            Suite::Seed => "seed",
            Suite::Fa3 => "fa3",
            Suite::Decode => "decode",
            Suite::Backward => "backward",
            Suite::Varlen => "varlen",
        }
    }

    /// The suite's shapes in `layout`, in run order.
    pub fn shapes(self, layout: Layout) -> Vec<AttentionParams> {
        match self {
            Suite::Seed => seed(layout),
            Suite::Fa3 => fa3(layout),
            Suite::Decode => decode(layout),
            Suite::Backward => backward(layout),
            // The varlen calls' parameters (batch: sequences, seqlen: the longest), bshd only.
            Suite::Varlen => super::varlen::cases(0x5EED)
                .iter()
                .map(|c| c.params().layout(layout))
                .collect(),
        }
    }
}

/// fp16 then bf16 × (B, H, S, D, causal): (1,8,512,64) causal and not; (1,16,1024,64) causal;
/// (16,16,2048,64) causal and not; (2,16,8192,128) causal and not; (1,16,16384,128) non-causal.
pub fn seed(layout: Layout) -> Vec<AttentionParams> {
    const SHAPES: [(usize, usize, usize, usize, bool); 8] = [
        (1, 8, 512, 64, false),
        (1, 8, 512, 64, true),
        (1, 16, 1024, 64, true),
        (16, 16, 2048, 64, false),
        (16, 16, 2048, 64, true),
        (2, 16, 8192, 128, false),
        (2, 16, 8192, 128, true),
        (1, 16, 16384, 128, false),
    ];
    let mut out = Vec::new();
    for dtype in [DType::F16, DType::Bf16] {
        for (b, h, s, d, causal) in SHAPES {
            out.push(
                AttentionParams::new(b, h, s, d)
                    .dtype(dtype)
                    .layout(layout)
                    .causal(causal),
            );
        }
    }
    out
}

/// fp16 then bf16 × D ∈ {64, 128, 256} × non-causal then causal × S ∈ {512, …, 16384}, with
/// B = 16384 / S and H = 2048 / D (d256: H = 8).
pub fn fa3(layout: Layout) -> Vec<AttentionParams> {
    let mut out = Vec::new();
    for dtype in [DType::F16, DType::Bf16] {
        for d in [64usize, 128, 256] {
            for causal in [false, true] {
                for s in [512usize, 1024, 2048, 4096, 8192, 16384] {
                    out.push(
                        AttentionParams::new(16384 / s, 2048 / d, s, d)
                            .dtype(dtype)
                            .layout(layout)
                            .causal(causal),
                    );
                }
            }
        }
    }
    out
}

/// (heads_q, heads_kv, head_dim, [(batch, seqlen_k)]) of the decode suite: caches up to 4.3 GB
/// of K/V (bf16), so several rotated sets fit beside each other in an H100's memory.
/// (heads_q, heads_kv, head_dim, [(batch, seqlen_k)]).
type DecodeGroup = (usize, usize, usize, &'static [(usize, usize)]);
const DECODE_SHAPES: [DecodeGroup; 3] = [
    (
        32,
        8,
        128,
        &[
            (1, 8192),
            (1, 32768),
            (1, 131072),
            (8, 8192),
            (8, 32768),
            (32, 4096),
            (32, 16384),
            (128, 1024),
            (128, 4096),
        ],
    ),
    (
        8,
        1,
        128,
        &[(1, 131072), (8, 32768), (32, 8192), (128, 2048)],
    ),
    (
        16,
        16,
        64,
        &[(1, 32768), (8, 8192), (64, 1024), (128, 4096)],
    ),
];

/// bf16 × Sq ∈ {1, 4 causal (speculative verification)} × [`DECODE_SHAPES`].
pub fn decode(layout: Layout) -> Vec<AttentionParams> {
    let mut out = Vec::new();
    for (sq, causal) in [(1usize, false), (4, true)] {
        for (hq, hkv, d, shapes) in DECODE_SHAPES {
            for &(b, sk) in shapes {
                let mut p = AttentionParams::new(b, hq, sq, d)
                    .seqlen_k(sk)
                    .dtype(DType::Bf16)
                    .layout(layout)
                    .causal(causal);
                p.heads_kv = hkv;
                out.push(p);
            }
        }
    }
    out
}

/// bf16 × (B, H, S, D, causal) of the backward table: (2,16,8192,128) causal and not,
/// (8,16,2048,128), (8,32,2048,64), (2,32,8192,64) causal, (32,16,512,128) causal.
pub fn backward(layout: Layout) -> Vec<AttentionParams> {
    const SHAPES: [(usize, usize, usize, usize, bool); 6] = [
        (2, 16, 8192, 128, false),
        (2, 16, 8192, 128, true),
        (8, 16, 2048, 128, false),
        (8, 32, 2048, 64, false),
        (2, 32, 8192, 64, true),
        (32, 16, 512, 128, true),
    ];
    SHAPES
        .iter()
        .map(|&(b, h, s, d, causal)| {
            AttentionParams::new(b, h, s, d)
                .dtype(DType::Bf16)
                .layout(layout)
                .causal(causal)
        })
        .collect()
}

/// A short label: `b1 h8 s512 d64` (`h32/8` with grouped heads, `s512/1024` when Sq ≠ Sk),
/// then ` causal` when masked.
pub fn label(p: &AttentionParams) -> String {
    let heads = if p.heads_q == p.heads_kv {
        p.heads_q.to_string()
    } else {
        format!("{}/{}", p.heads_q, p.heads_kv)
    };
    let seq = if p.seqlen_q == p.seqlen_k {
        p.seqlen_q.to_string()
    } else {
        format!("{}/{}", p.seqlen_q, p.seqlen_k)
    };
    format!(
        "b{} h{} s{} d{}{}{}",
        p.batch,
        heads,
        seq,
        p.head_dim,
        if p.causal { " causal" } else { "" },
        if p.window.is_unbounded() {
            String::new()
        } else {
            let (l, r) = p.window.to_flash_attn();
            format!(" window {l},{r}")
        }
    )
}
