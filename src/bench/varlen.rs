//! `flashcore bench --suite varlen`: packed batches of 16k and 64k tokens with
//! seeded length mixes, D 64 / 128 (H = 2048 / D), causal and not, bf16. Per case: the varlen
//! call (work list built on the device, as `flash_attn_varlen_func` runs it) and flashcore's
//! dense call at the same total tokens and mean length (`nb × mean`, the 95% goal),
//! each timed per call and by graph replay.
//!
//! The cases and their mixes are bench/varlen.py's, row for row: both draw the lengths with
//! [`SplitMix64`] seeded from (seed, mix, tokens), so the two tables line up (a CPU test pins
//! the first lengths on both sides). Varlen TFLOPS count the real query–key pairs only
//! (`4·H·n²·D` per sequence of n tokens, halved when causal); the dense rows count their own
//! dense shape.

use super::device::{random_bits, DeviceInfo, Launcher, PlanLauncher};
use super::record::{Env, Method, Mode, Record, Status};
use super::{stats, time_modes, timing, RunOptions};
use crate::attention::launch::varlen::{
    launch_device_list, variant_for, workspace_bytes, Buffers, Target,
};
use crate::attention::launch::LoadedKernel;
use crate::attention::{AttentionParams, Context, DType};
use crate::error::Result;
use cudarc::driver::{CudaSlice, DevicePtr};
use std::fmt::Write;
use std::sync::Arc;

/// The mixes, in run order.
pub const MIXES: [&str; 3] = ["uniform", "skewed", "equal"];
/// Total tokens per batch.
pub const TOKENS: [usize; 2] = [16384, 65536];
pub const HEAD_DIMS: [usize; 2] = [64, 128];

/// SplitMix64 (Steele, Lea, Flood 2014): the generator bench/varlen.py implements too.
pub struct SplitMix64(u64);

impl SplitMix64 {
    pub fn new(seed: u64) -> Self {
        SplitMix64(seed)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `[lo, hi]` (modulo reduction: a bias below 2^-50 at these ranges).
    pub fn int(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }
}

/// The sequence lengths of mix `name` filled to `total` tokens: "uniform" (uniform in
/// [1, 4096]), "skewed" (two sequences of a quarter of the tokens each, the rest uniform in
/// [1, 256]), "equal" (sequences of 4096); the last sequence cut to fit. None for another name.
pub fn mix(name: &str, total: usize, seed: u64) -> Option<Vec<usize>> {
    let index = MIXES.iter().position(|m| *m == name)? as u64;
    let mut r = SplitMix64::new(
        seed.wrapping_mul(1_000_003)
            .wrapping_add((total as u64).wrapping_mul(7))
            .wrapping_add(index),
    );
    let mut lens: Vec<usize> = Vec::new();
    let sum = |l: &[usize]| l.iter().sum::<usize>();
    match name {
        "uniform" => {
            while sum(&lens) < total {
                lens.push(r.int(1, 4096));
            }
        }
        "skewed" => {
            lens = vec![total / 4, total / 4];
            while sum(&lens) < total {
                lens.push(r.int(1, 256));
            }
        }
        _ => lens = vec![4096; total.div_ceil(4096)],
    }
    let over = sum(&lens) - total;
    if let Some(last) = lens.last_mut() {
        *last -= over;
    }
    lens.retain(|&n| n > 0);
    Some(lens)
}

/// One row group of the suite.
#[derive(Debug, Clone, PartialEq)]
pub struct Case {
    pub mix: &'static str,
    pub tokens: usize,
    pub lens: Vec<usize>,
    pub head_dim: usize,
    pub heads: usize,
    pub causal: bool,
}

impl Case {
    /// The varlen call's parameters: `batch` sequences, `max_seqlen` their longest.
    pub fn params(&self) -> AttentionParams {
        let max = self.lens.iter().copied().max().unwrap_or(1);
        AttentionParams::new(self.lens.len(), self.heads, max, self.head_dim)
            .dtype(DType::Bf16)
            .causal(self.causal)
    }
    /// FLOPs of the real query–key pairs.
    pub fn useful_flops(&self) -> f64 {
        flops(&self.lens, self.heads, self.head_dim, self.causal)
    }
    /// The dense shape at the same total tokens and mean length: `nb` sequences of `mean`.
    pub fn dense(&self) -> AttentionParams {
        let (nb, mean) = dense_shape(&self.lens, self.tokens);
        AttentionParams::new(nb, self.heads, mean, self.head_dim)
            .dtype(DType::Bf16)
            .causal(self.causal)
    }
    /// The suite tag of its records: `varlen/<mix>/<tokens>`.
    pub fn tag(&self) -> String {
        format!("varlen/{}/{}", self.mix, self.tokens)
    }
}

/// (sequences, length) of the dense batch at `total` tokens and the mean length of `lens`,
/// rounded half up in integers (bench/varlen.py's `dense_shape`).
pub fn dense_shape(lens: &[usize], total: usize) -> (usize, usize) {
    let b = lens.len().max(1);
    let mean = ((2 * total + b) / (2 * b)).max(1);
    (((2 * total + mean) / (2 * mean)).max(1), mean)
}

/// `4·H·n²·D` per sequence of n tokens, halved when causal (bench/varlen.py's `flops`).
pub fn flops(lens: &[usize], heads: usize, d: usize, causal: bool) -> f64 {
    lens.iter()
        .map(|&n| {
            4.0 * heads as f64 * n as f64 * n as f64 * d as f64 / if causal { 2.0 } else { 1.0 }
        })
        .sum()
}

/// The suite's cases in bench/varlen.py's order: tokens, mix, head dim, non-causal then causal.
pub fn cases(seed: u64) -> Vec<Case> {
    let mut out = Vec::new();
    for tokens in TOKENS {
        for m in MIXES {
            let lens = mix(m, tokens, seed).expect("a known mix");
            for d in HEAD_DIMS {
                for causal in [false, true] {
                    out.push(Case {
                        mix: m,
                        tokens,
                        lens: lens.clone(),
                        head_dim: d,
                        heads: 2048 / d,
                        causal,
                    });
                }
            }
        }
    }
    out
}

struct PackSet {
    _bufs: [CudaSlice<u16>; 4],
    _ws: CudaSlice<u8>,
    ptrs: [u64; 4],
    ws: u64,
}

/// Varlen launches over rotating packed buffer sets, as `Context::attention_varlen_device` runs
/// them (device-built work list, no host synchronisation: capturable), with each set's own
/// workspace allocated once.
struct VarlenLauncher {
    params: AttentionParams,
    kernel: Arc<LoadedKernel>,
    num_sms: usize,
    stream: cudarc::driver::sys::CUstream,
    _cu: CudaSlice<i32>,
    cu_ptr: u64,
    total: usize,
    sets: Vec<PackSet>,
}

impl VarlenLauncher {
    fn new(ctx: &Context, case: &Case, sets: usize, seed: u64) -> Result<Self> {
        let p = case.params();
        let total = case.tokens;
        let mut cu = vec![0i32];
        for &n in &case.lens {
            cu.push(cu.last().copied().unwrap_or(0) + n as i32);
        }
        crate::attention::launch::varlen::check_varlen(
            &p,
            &cu,
            &cu,
            total * p.heads_q * p.head_dim,
            [total * p.heads_kv * p.head_dim; 2],
            total * p.heads_q * p.head_dim,
            None,
        )?;
        let stream = ctx.stream().clone();
        let dcu = ctx.upload(&cu)?;
        let cu_ptr = dcu.device_ptr(&stream).0;
        let n = total * p.heads_q * p.head_dim;
        let mut out = Vec::new();
        for s in 0..sets.max(1) {
            let base = seed.wrapping_add((s as u64) << 8);
            let q = ctx.upload(&random_bits(p.dtype, n, base))?;
            let k = ctx.upload(&random_bits(p.dtype, n, base + 1))?;
            let v = ctx.upload(&random_bits(p.dtype, n, base + 2))?;
            let o = ctx.alloc::<u16>(n)?;
            let ws = ctx.alloc::<u8>(workspace_bytes(&p).max(16))?;
            let ptrs = [
                q.device_ptr(&stream).0,
                k.device_ptr(&stream).0,
                v.device_ptr(&stream).0,
                o.device_ptr(&stream).0,
            ];
            let wsp = ws.device_ptr(&stream).0;
            out.push(PackSet {
                _bufs: [q, k, v, o],
                _ws: ws,
                ptrs,
                ws: wsp,
            });
        }
        stream.synchronize()?;
        Ok(VarlenLauncher {
            kernel: ctx.kernel(variant_for(&p))?,
            num_sms: ctx.num_sms(),
            stream: stream.cu_stream(),
            params: p,
            _cu: dcu,
            cu_ptr,
            total,
            sets: out,
        })
    }
}

impl Launcher for VarlenLauncher {
    fn sets(&self) -> usize {
        self.sets.len()
    }
    fn launch(&mut self, set: usize) -> Result<()> {
        let s = &self.sets[set];
        let [q, k, v, o] = s.ptrs;
        let target = Target {
            stream: self.stream,
            num_sms: self.num_sms,
            kernel: &self.kernel,
        };
        let bufs = Buffers::contiguous(&self.params, [q, k, v, o, 0], [self.total, self.total]);
        // SAFETY: each set holds `total` packed rows of q, k, v, o (checked against cu_seqlens
        // above) and its own workspace of workspace_bytes; all live as long as `self`, and every
        // launch is on the context's stream.
        unsafe {
            launch_device_list(
                &target,
                &self.params,
                bufs,
                [self.cu_ptr, self.cu_ptr, 0, 0],
                s.ws,
            )
        }
    }
}

/// Per mode: the samples (µs) or why none, the method, the environment.
type Timed = Vec<(
    Mode,
    std::result::Result<Vec<f64>, String>,
    Option<Method>,
    Env,
)>;

/// The records of one implementation of one case in every mode (skipped ones with the reason).
fn records_of(
    implementation: &str,
    case: &Case,
    shape: &AttentionParams,
    flops: f64,
    timed: std::result::Result<Timed, String>,
    opts: &RunOptions,
    env: &Env,
) -> Vec<Record> {
    let rows = match timed {
        Ok(r) => r,
        Err(reason) => opts
            .modes
            .iter()
            .map(|&m| (m, Err(reason.clone()), None, env.clone()))
            .collect(),
    };
    rows.into_iter()
        .map(|(mode, samples, method, env)| {
            let mut r = super::make_record(shape, mode, samples, method, Some(case.tag()), env);
            r.implementation = implementation.to_string();
            r.flops = flops;
            r.tflops = r.time_us.map(|t| stats::tflops(flops, t.median));
            r
        })
        .collect()
}

/// Times one launcher built by `make` over enough buffer sets to defeat L2.
fn time_one(
    ctx: &Context,
    info: &DeviceInfo,
    set_bytes: (u64, u64),
    opts: &RunOptions,
    env: &Env,
    make: impl FnOnce(usize) -> Result<Box<dyn Launcher>>,
) -> std::result::Result<Timed, String> {
    let free = super::device::free_bytes(ctx).map_err(|e| e.to_string())?;
    let budget = (free as f64 * opts.mem_fraction) as u64;
    let sets = timing::sets_needed(info.l2_bytes, set_bytes.0, set_bytes.1, budget);
    if sets == 0 {
        return Err(format!(
            "one buffer set ({} bytes) does not fit in {budget} bytes",
            set_bytes.1
        ));
    }
    let launcher = make(sets).map_err(|e| e.to_string())?;
    let mut env = env.clone();
    env.date = super::env::now_utc();
    Ok(time_modes(ctx, info, launcher, set_bytes.0, opts, &mut env)
        .into_iter()
        .map(|(m, samples, method, env)| (m, samples, Some(method), env))
        .collect())
}

/// Runs `cases` (varlen, then dense) and returns the records; `progress` sees each case's.
pub fn run(
    cases: &[Case],
    opts: &RunOptions,
    mut progress: impl FnMut(usize, &[Record]),
) -> Result<Vec<Record>> {
    let ctx = Context::new(opts.device)?;
    let info = super::device::device_info(&ctx)?;
    let env0 = super::base_env(&info, opts.device);
    let mut all = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let p = case.params();
        let e = p.dtype.size() as u64;
        let n = (case.tokens * p.heads_q * p.head_dim) as u64 * e;
        let timed = time_one(
            &ctx,
            &info,
            (3 * n, 4 * n + workspace_bytes(&p) as u64),
            opts,
            &env0,
            |sets| {
                Ok(Box::new(VarlenLauncher::new(&ctx, case, sets, opts.seed)?)
                    as Box<dyn Launcher>)
            },
        );
        let mut recs = records_of(
            "flashcore",
            case,
            &p,
            case.useful_flops(),
            timed,
            opts,
            &env0,
        );
        let d = case.dense();
        let timed = ctx.plan(&d).map_err(|e| e.to_string()).and_then(|_| {
            time_one(
                &ctx,
                &info,
                super::device::set_bytes(&d),
                opts,
                &env0,
                |sets| {
                    Ok(Box::new(PlanLauncher::new(&ctx, &d, sets, opts.seed)?)
                        as Box<dyn Launcher>)
                },
            )
        });
        recs.extend(records_of(
            "flashcore-dense",
            case,
            &d,
            d.flops(),
            timed,
            opts,
            &env0,
        ));
        progress(i, &recs);
        all.extend(recs);
    }
    Ok(all)
}

/// The table: one row per case, implementation and mode (bench/varlen.py's columns), then the
/// varlen/dense TFLOPS ratio of each case in graph mode (the goal: ≥ 0.95).
pub fn format(cases: &[Case], records: &[Record]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:8} {:>6} {:>4} {:>3} {:6} {:22} {:>9} {:>8} {:>7}",
        "mix", "tokens", "B", "D", "causal", "impl", "us", "TFLOP/s", "/dense"
    );
    for case in cases {
        let mine: Vec<&Record> = records
            .iter()
            .filter(|r| {
                r.suite.as_deref() == Some(case.tag().as_str())
                    && r.shape.head_dim == case.head_dim
                    && r.shape.causal == case.causal
            })
            .collect();
        let tf = |imp: &str, mode: Mode| {
            mine.iter()
                .find(|r| r.implementation == imp && r.mode == mode && r.status == Status::Ok)
                .and_then(|r| r.tflops)
        };
        for r in &mine {
            let label = format!("{} {}", r.implementation, r.mode.name());
            let ratio = match (
                r.implementation.as_str(),
                tf("flashcore", r.mode),
                tf("flashcore-dense", r.mode),
            ) {
                ("flashcore", Some(a), Some(b)) if b > 0.0 => format!("{:.3}", a / b),
                _ => String::new(),
            };
            let head = format!(
                "{:8} {:>6} {:>4} {:>3} {:6} {:22}",
                case.mix,
                case.tokens,
                case.lens.len(),
                case.head_dim,
                case.causal,
                label
            );
            match (r.status, r.time_us) {
                (Status::Ok, Some(t)) => {
                    let _ = writeln!(
                        s,
                        "{head} {:>9.1} {:>8.1} {:>7}",
                        t.median,
                        r.tflops.unwrap_or(f64::NAN),
                        ratio
                    );
                }
                _ => {
                    let _ = writeln!(
                        s,
                        "{head} skipped: {}",
                        r.skip_reason.as_deref().unwrap_or("no samples")
                    );
                }
            }
        }
    }
    s
}
