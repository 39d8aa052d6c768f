//! The measurement loop on the GPU: buffer pools for both classes, one [`Plan`] per slot, a
//! random interleaving of the classes, one device-event pair per launch.
//!
//! Symmetry is what makes the test sound: anything but the secret that differs between the
//! classes (addresses, L2 residency, host work between the events) would show as a "leak". So
//! both classes cycle through pools of the same size and shape, each slot has its own plan (no
//! tensor-map re-encoding between the events after the first launch), and the class of each
//! trial is drawn at random.
//!
//! * Value mode: the fixed class has `pool` buffer sets all holding the class's pattern, the
//!   random class `pool` sets of uniform random values ([`random_bits`]), drawn once. The two
//!   pools swap roles every `swap_every` trials (contents rewritten between batches, then an
//!   untimed launch on every slot), so each class runs on both pools' addresses equally often
//!   and a difference between the pools' placement (DRAM channels, L2 slices, TLB) cannot pass
//!   for a leak.
//! * Secret-length mode: both classes launch on the same `pool` random input sets; they differ
//!   only in the lengths buffer. The random class's lengths are drawn afresh, uniform in [0, S]
//!   per batch entry, after every synchronisation (outside the timed region). Each input set
//!   has two plans and two lengths slots (two halves); which half serves the fixed class is
//!   drawn again at each synchronisation, so each plan (and a decode plan's workspace) serves
//!   both classes equally often.
//! * Decode mode ([`super::decode`]): secret-length mode on a KV-cache decode call, the key
//!   counts in the lengths buffer, K and V the cache (or the page pools and a block table).
//!
//! Each class is measured on up to four builds of the kernel, one after the other, over the same
//! buffers, with the same interleaving and statistics: the kernel itself (shipped, or
//! a control), its cycle-timer build ([`super::cycles`]), the hardware floor, and the floor's
//! cycle-timer build. By default each timed launch is queued behind a short device-side wait
//! ([`super::device::Spin`]), so the event interval holds the kernel alone.

use super::classes::{FixedClass, ValueClass};
use super::cycles::LaunchCycles;
use super::decode::{block_table, DecodeConfig};
use super::device::{CycleTimer, Spin};
use super::stats::{analyze, Analysis, Class, Measurement, Verdict, CROPS};
use super::verdict::{attribute, Attribution, Evidence};
use crate::attention::{AttentionParams, Context, Plan};
use crate::bench::device::{free_bytes, random_bits, set_bytes};
use crate::bench::stats::Stats;
use crate::error::{Error, Result};
use crate::kernels::{LeakyControl, TestBuild};
use cudarc::driver::{sys, CudaEvent, CudaSlice, DevicePtr};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// What one leakage run measures and how.
#[derive(Debug, Clone)]
pub struct LeakageConfig {
    pub params: AttentionParams,
    /// Secret-length mode (classes differ only in true lengths); needs Sq = Sk, except in
    /// decode mode.
    pub secret_len: bool,
    /// Decode mode ([`super::decode`]): the KV-cache decode call with the key counts as the
    /// secret; needs `secret_len` (the length classes), no control, no cycle timer, no floor.
    /// `params.seqlen_k` is the cache's capacity.
    pub decode: Option<DecodeConfig>,
    /// Time this deliberately leaky control kernel instead of the shipped one.
    /// `SkipPastSecretLength` needs `secret_len`, `EarlyExitOnZeroQ` needs it off.
    pub control: Option<LeakyControl>,
    /// Time the hardware-floor build as the kernel itself (`--control floor`).
    pub floor_kernel: bool,
    /// Also measure the cycle-timer build of the kernel (SM cycles per CTA).
    pub cycles: bool,
    /// Also time the hardware-floor build for comparison (and, with `cycles`, measure its
    /// cycle-timer build too). Only for the shipped kernel in value mode: not with a control,
    /// and not in secret-length mode, where the floor build masks by the secret length as the
    /// shipped kernel does and so carries the secret ([`super::verdict`]).
    pub floor: bool,
    /// Queue each timed launch behind a device-side wait of this many nanoseconds (0: launch
    /// straight after the start event, the interval then includes launch latency).
    pub queue_ns: u64,
    /// Timed launches per class test (both classes together).
    pub measurements: usize,
    /// Wall-clock seconds per class test after which it stops early.
    pub budget_s: Option<f64>,
    /// Buffer sets (slots) per class, at least [`MIN_POOL`].
    pub pool: usize,
    /// Launches enqueued between synchronisations.
    pub batch: usize,
    /// Untimed launches before each class test.
    pub warmup: usize,
    /// Cropping thresholds.
    pub crops: usize,
    /// Value mode: the fixed and random pools swap roles after this many trials (rounded up to
    /// whole batches).
    pub swap_every: usize,
    pub seed: u64,
}

/// Default queued-timing wait: longer than the host needs to enqueue a launch and its events.
pub const DEFAULT_QUEUE_NS: u64 = 20_000;
/// Longest queued-timing wait accepted (per launch).
pub const MAX_QUEUE_NS: u64 = 1_000_000;

/// Smallest pool of buffer sets per class.
pub const MIN_POOL: usize = 16;
/// Fewest measurements a run may ask for.
pub const MIN_MEASUREMENTS: usize = 100;

impl LeakageConfig {
    /// The defaults of `flashcore leakage` for a shape.
    pub fn new(params: AttentionParams) -> Self {
        LeakageConfig {
            params,
            secret_len: false,
            decode: None,
            control: None,
            floor_kernel: false,
            cycles: true,
            floor: true,
            queue_ns: DEFAULT_QUEUE_NS,
            measurements: 100_000,
            budget_s: None,
            pool: MIN_POOL,
            batch: 32,
            warmup: 1000,
            crops: CROPS,
            swap_every: 2048,
            seed: 0x1EA4,
        }
    }

    /// Checks everything that needs no device.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if self.measurements < MIN_MEASUREMENTS {
            return Err(format!(
                "--measurements must be at least {MIN_MEASUREMENTS} (got {})",
                self.measurements
            ));
        }
        if let Some(b) = self.budget_s {
            if !(b.is_finite() && b > 0.0) {
                return Err(format!(
                    "--budget-s must be a positive number of seconds (got {b})"
                ));
            }
        }
        if self.pool < MIN_POOL {
            return Err(format!(
                "--pool must be at least {MIN_POOL} (got {})",
                self.pool
            ));
        }
        if self.batch == 0 || self.crops == 0 || self.swap_every == 0 {
            return Err("batch, crops and swap_every must be positive".into());
        }
        if self.queue_ns > MAX_QUEUE_NS {
            return Err(format!(
                "--queue-us must be at most {} (got {})",
                MAX_QUEUE_NS / 1000,
                self.queue_ns as f64 / 1000.0
            ));
        }
        if let Some(d) = &self.decode {
            self.validate_decode(d)?;
        }
        if self.floor && (self.control.is_some() || self.floor_kernel) {
            return Err("the floor comparison is for the shipped kernel, not a control".into());
        }
        if self.floor && self.secret_len {
            return Err(
                "no floor in secret-length mode: the floor build masks by the secret length as \
                 the shipped kernel does, so it carries the secret and cannot clear a difference \
                 (use --no-floor)"
                    .into(),
            );
        }
        if self.floor_kernel && self.control.is_some() {
            return Err("one control at a time".into());
        }
        if self.cycles && self.control == Some(LeakyControl::EarlyExitOnZeroQ) {
            return Err(
                "the early-exit control's CTAs leave before their cycle-timer record: use \
                 --no-cycles"
                    .into(),
            );
        }
        match (self.control, self.secret_len) {
            (Some(LeakyControl::SkipPastSecretLength), false) => {
                return Err("the skip-past-length control runs in secret-length mode".into())
            }
            (Some(LeakyControl::EarlyExitOnZeroQ), true) => {
                return Err("the early-exit control is not a secret-length kernel".into())
            }
            _ => {}
        }
        if let Some(d) = &self.decode {
            return d.validate(&self.params);
        }
        crate::attention::validate::check_params(&self.params).map_err(|e| e.to_string())?;
        if self.secret_len {
            crate::attention::validate::check_secret_len(&self.params)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// What decode mode cannot combine with ([`super::decode`]).
    fn validate_decode(&self, d: &DecodeConfig) -> std::result::Result<(), String> {
        if !self.secret_len {
            return Err(
                "--decode times the length classes (the key counts are the secret): add \
                 --secret-len (with --public-counts for the leaky comparison)"
                    .into(),
            );
        }
        if self.control.is_some() || self.floor_kernel {
            return Err(
                "--control times prefill builds; there is none for the decode call: its leaky \
                 comparison is --public-counts"
                    .into(),
            );
        }
        if self.cycles {
            return Err(
                "no cycle timer in decode mode: the decode call is two kernels (split-KV main \
                 and combine), the cycle-timer build has records for one and no decode variant \
                 (use --no-cycles; `flashcore leakage --decode` leaves it off)"
                    .into(),
            );
        }
        if self.floor {
            return Err(
                "no floor in decode mode: a floor build would mask by the secret counts like the \
                 shipped kernel, so it carries the secret and cannot clear a difference (use \
                 --no-floor; `flashcore leakage --decode` leaves it off)"
                    .into(),
            );
        }
        if d.page_size.is_none() && d.shuffled_pages {
            return Err("shuffled pages need a paged cache (--page-size)".into());
        }
        Ok(())
    }
}

/// The outcome of one fixed-vs-random test.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ClassResult {
    pub class: String,
    /// Timed launches (both classes).
    pub measurements: usize,
    /// The budget ran out before `measurements`.
    pub stopped_by_budget: bool,
    pub elapsed_s: f64,
    /// Device time per launch of each class, microseconds.
    pub fixed_us: Option<Stats>,
    pub random_us: Option<Stats>,
    pub analysis: Analysis,
    /// Largest |t| over every test (null when none could be made or t is infinite).
    pub max_abs_t: Option<f64>,
    pub verdict: Verdict,
    /// The cycle-timer build of the same kernel on the same class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cycles: Option<CycleResult>,
    /// The hardware-floor build, timed the same way on the same class; its `cycles` are the
    /// floor's cycle-timer build (schema version 3).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub floor: Option<Box<ClassResult>>,
    /// Where the difference comes from ([`super::verdict`]).
    pub attribution: Attribution,
}

impl ClassResult {
    /// The evidence for [`attribute`]: this result's time and cycles, and its floor's.
    pub fn evidence(&self) -> Evidence {
        let floor_cycles = self.floor.as_ref().and_then(|f| f.cycles.as_ref());
        Evidence {
            time_t: self.analysis.max_abs_t(),
            cycles_t: self.cycles.as_ref().and_then(|c| c.cycles.max_abs_t()),
            floor_t: self.floor.as_ref().and_then(|f| f.analysis.max_abs_t()),
            floor_cycles_t: floor_cycles.and_then(|c| c.cycles.max_abs_t()),
            cycles_raw_t: self.cycles.as_ref().and_then(|c| c.cycles.raw.map(|r| r.t)),
            floor_cycles_raw_t: floor_cycles.and_then(|c| c.cycles.raw.map(|r| r.t)),
        }
    }

    /// Max |t| of the SM clock (MHz) of its cycle-timer build, where measured.
    pub fn mhz_t(&self) -> Option<f64> {
        self.cycles.as_ref().and_then(|c| c.mhz.max_abs_t())
    }
}

/// The cycle-timer build's measurements of one class: per launch, the mean SM cycles per CTA
/// (the verdict's number), the SM clock, the device-side span, and the build's event time.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CycleResult {
    pub measurements: usize,
    pub stopped_by_budget: bool,
    pub fixed_cycles: Option<Stats>,
    pub random_cycles: Option<Stats>,
    pub cycles: Analysis,
    pub fixed_mhz: Option<Stats>,
    pub random_mhz: Option<Stats>,
    pub mhz: Analysis,
    pub fixed_span_us: Option<Stats>,
    pub random_span_us: Option<Stats>,
    pub span: Analysis,
    /// Event timings of the instrumented build.
    pub time: Analysis,
    pub verdict: Verdict,
}

/// The cycle result from per-launch records and event times (GPU-free).
pub fn summarize_cycles(
    m: &[(Measurement, LaunchCycles)],
    stopped_by_budget: bool,
    crops: usize,
) -> CycleResult {
    let series = |f: &dyn Fn(&(Measurement, LaunchCycles)) -> Option<f64>| -> Vec<Measurement> {
        m.iter()
            .filter_map(|x| {
                f(x).map(|v| Measurement {
                    class: x.0.class,
                    time_us: v,
                })
            })
            .collect()
    };
    let cycles = series(&|x| Some(x.1.cycles));
    let mhz = series(&|x| x.1.mhz);
    let span = series(&|x| Some(x.1.span_ns as f64 / 1000.0));
    let time = series(&|x| Some(x.0.time_us));
    let of = |v: &[Measurement], c: Class| -> Option<Stats> {
        let xs: Vec<f64> = v
            .iter()
            .filter(|x| x.class == c)
            .map(|x| x.time_us)
            .collect();
        Stats::from_samples(&xs)
    };
    let cycles_a = analyze(&cycles, crops);
    CycleResult {
        measurements: m.len(),
        stopped_by_budget,
        fixed_cycles: of(&cycles, Class::Fixed),
        random_cycles: of(&cycles, Class::Random),
        verdict: cycles_a.verdict(),
        cycles: cycles_a,
        fixed_mhz: of(&mhz, Class::Fixed),
        random_mhz: of(&mhz, Class::Random),
        mhz: analyze(&mhz, crops),
        fixed_span_us: of(&span, Class::Fixed),
        random_span_us: of(&span, Class::Random),
        span: analyze(&span, crops),
        time: analyze(&time, crops),
    }
}

/// Which build a set of plans launches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Build {
    /// The kernel under test (shipped, a leaky control, or the floor as `--control floor`).
    Kernel,
    /// Its cycle-timer build.
    Cycles,
    /// The hardware floor, for comparison.
    Floor,
    /// The floor's cycle-timer build.
    FloorCycles,
}

/// One build's plans (one per slot, in the slot order of [`Harness::slots_for`]) and, for a
/// cycle-timer build, its record buffer.
struct PlanSet {
    build: Build,
    plans: Vec<Plan>,
    timer: Option<CycleTimer>,
}

/// One launch's buffers: raw device pointers and the plan that caches their parameter block.
struct Slot {
    ptrs: [u64; 4],
    lens: u64,
    /// Decode mode with a paged cache: the block table (0 otherwise).
    table: u64,
}

struct Tensors {
    q: CudaSlice<u16>,
    k: CudaSlice<u16>,
    v: CudaSlice<u16>,
    _o: CudaSlice<u16>,
    ptrs: [u64; 4],
}

/// Everything a run needs on the device, allocated once and reused by every class test.
pub struct Harness<'a> {
    ctx: &'a Context,
    cfg: LeakageConfig,
    /// Value mode: two pools of `pool` sets (pool 0, then pool 1), each holding the fixed
    /// pattern or the random values as `fixed_pool` says. Secret-length mode: the shared
    /// input sets.
    tensors: Vec<Tensors>,
    /// Value mode: the random sets' contents (q, k, v), to rewrite a pool when roles swap.
    random_host: Vec<[Vec<u16>; 3]>,
    /// Value mode: the fixed class's q and k/v contents.
    fixed_host: Option<(Vec<u16>, Vec<u16>)>,
    /// Which pool holds the fixed class now. Secret-length mode: which half of the slots (their
    /// plans and lengths) serves the fixed class, drawn again at each synchronisation.
    fixed_pool: usize,
    /// Secret-length mode: the fixed class's length (or key count), set per class.
    fixed_len: i32,
    /// `2 · pool` slots: pool 0's, then pool 1's. Secret-length mode: two halves over the same
    /// input sets, each with its own lengths (and plans).
    slots: Vec<Slot>,
    /// The builds measured per class, the kernel's first.
    sets: Vec<PlanSet>,
    /// The queued-timing wait (when `queue_ns` > 0).
    spin: Option<Spin>,
    /// Secret-length mode: `2 · pool · batch` i32 lengths, half 0's slots first.
    lens: Option<(CudaSlice<i32>, Vec<i32>)>,
    /// Decode mode with a paged cache: the block table every slot reads (public, fixed).
    _table: Option<CudaSlice<i32>>,
    events: Vec<CudaEvent>,
    rng: rand::rngs::StdRng,
}

fn ptr(ctx: &Context, s: &CudaSlice<u16>) -> u64 {
    s.device_ptr(ctx.stream()).0
}

impl<'a> Harness<'a> {
    /// Validates the configuration, checks device memory, uploads the pools, builds the plans
    /// (compiling the kernel on first use).
    pub fn new(ctx: &'a Context, cfg: LeakageConfig) -> Result<Harness<'a>> {
        cfg.validate().map_err(Error::Other)?;
        let p = &cfg.params;
        let sets = if cfg.secret_len {
            cfg.pool
        } else {
            2 * cfg.pool
        };
        let need = sets as u64 * set_bytes(p).1;
        let free = free_bytes(ctx)?;
        if need > free / 2 {
            return Err(Error::Other(format!(
                "the buffer pools need {:.1} MiB, more than half the free device memory \
                 ({:.1} MiB): use a smaller shape",
                need as f64 / (1 << 20) as f64,
                free as f64 / (1 << 20) as f64
            )));
        }
        let kernel_build = TestBuild {
            leaky_control: cfg.control,
            floor_control: cfg.floor_kernel,
            cycle_timer: false,
        };
        let make_plan = |build: Build| -> Result<Plan> {
            let b = match build {
                Build::Kernel => kernel_build,
                Build::Cycles => TestBuild {
                    cycle_timer: true,
                    ..kernel_build
                },
                Build::Floor => TestBuild {
                    floor_control: true,
                    ..TestBuild::default()
                },
                Build::FloorCycles => TestBuild {
                    floor_control: true,
                    cycle_timer: true,
                    ..TestBuild::default()
                },
            };
            if let Some(d) = &cfg.decode {
                // Validated: decode mode measures the shipped KV-cache build alone.
                if !b.is_shipped() {
                    return Err(Error::Other(
                        "decode mode times the shipped KV-cache build only".into(),
                    ));
                }
                return ctx.plan_kv_cache(p, d.secret_counts, d.pages(p));
            }
            match b {
                b if b.is_shipped() && cfg.secret_len => ctx.plan_secret_len(p),
                b if b.is_shipped() => ctx.plan(p),
                b => ctx.plan_build(p, cfg.secret_len, b),
            }
        };
        let mut tensors = Vec::with_capacity(sets);
        let mut random_host = Vec::with_capacity(cfg.pool);
        for s in 0..sets {
            // Value mode: both pools start with the random sets' values (pool 0 is refilled
            // with the fixed pattern per class).
            let seed = cfg.seed.wrapping_add(((s % cfg.pool) as u64) << 8);
            let hq = random_bits(p.dtype, p.q_len(), seed);
            let hk = random_bits(p.dtype, p.kv_len(), seed + 1);
            let hv = random_bits(p.dtype, p.kv_len(), seed + 2);
            let q = ctx.upload(&hq)?;
            let k = ctx.upload(&hk)?;
            let v = ctx.upload(&hv)?;
            if !cfg.secret_len && s < cfg.pool {
                random_host.push([hq, hk, hv]);
            }
            let o = ctx.alloc::<u16>(p.q_len())?;
            let ptrs = [ptr(ctx, &q), ptr(ctx, &k), ptr(ctx, &v), ptr(ctx, &o)];
            tensors.push(Tensors {
                q,
                k,
                v,
                _o: o,
                ptrs,
            });
        }
        let pages = cfg.decode.and_then(|d| d.pages(p).map(|pg| (d, pg)));
        let table = match pages {
            Some((d, pg)) => {
                // One pool per input set, `batch · capacity / page_size` pages: K and V as
                // allocated above (the same element count as a contiguous cache).
                if pg.pool_len(p) != p.kv_len() {
                    return Err(Error::Other(format!(
                        "paged cache: a pool of {} elements, the sets hold {}",
                        pg.pool_len(p),
                        p.kv_len()
                    )));
                }
                let t = block_table(p.batch, pg.num_pages / p.batch, d.shuffled_pages, cfg.seed);
                Some(ctx.upload(&t)?)
            }
            None => None,
        };
        let table_ptr = table.as_ref().map_or(0, |t| t.device_ptr(ctx.stream()).0);
        let mut slots = Vec::with_capacity(2 * cfg.pool);
        let mut lens = None;
        if cfg.secret_len {
            let host = vec![p.seqlen_k as i32; 2 * cfg.pool * p.batch];
            let dev = ctx.upload(&host)?;
            let base = dev.device_ptr(ctx.stream()).0;
            for c in 0..2 {
                for (j, t) in tensors.iter().enumerate() {
                    let offset = ((c * cfg.pool + j) * p.batch * 4) as u64;
                    slots.push(Slot {
                        ptrs: t.ptrs,
                        lens: base + offset,
                        table: table_ptr,
                    });
                }
            }
            lens = Some((dev, host));
        } else {
            for t in &tensors {
                slots.push(Slot {
                    ptrs: t.ptrs,
                    lens: 0,
                    table: 0,
                });
            }
        }
        let mut builds = vec![Build::Kernel];
        if cfg.cycles {
            builds.push(Build::Cycles);
        }
        if cfg.floor {
            builds.push(Build::Floor);
            if cfg.cycles {
                builds.push(Build::FloorCycles);
            }
        }
        let mut sets = Vec::with_capacity(builds.len());
        for build in builds {
            let plans = (0..slots.len())
                .map(|_| make_plan(build))
                .collect::<Result<Vec<_>>>()?;
            let timer = match build {
                Build::Cycles | Build::FloorCycles => {
                    Some(CycleTimer::new(ctx, &plans[0], cfg.batch)?)
                }
                _ => None,
            };
            sets.push(PlanSet {
                build,
                plans,
                timer,
            });
        }
        let spin = if cfg.queue_ns > 0 {
            Some(Spin::load(ctx)?)
        } else {
            None
        };
        let mut events = Vec::with_capacity(2 * cfg.batch);
        for _ in 0..2 * cfg.batch {
            events.push(
                ctx.cuda()
                    .new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?,
            );
        }
        ctx.synchronize()?;
        let rng = rand::rngs::StdRng::seed_from_u64(cfg.seed ^ 0x00D0_DEC7);
        Ok(Harness {
            ctx,
            cfg,
            tensors,
            random_host,
            fixed_host: None,
            fixed_pool: 0,
            fixed_len: 0,
            slots,
            sets,
            spin,
            lens,
            _table: table,
            events,
            rng,
        })
    }

    pub fn config(&self) -> &LeakageConfig {
        &self.cfg
    }

    /// Puts the fixed class's values (or lengths) in place.
    fn prepare(&mut self, class: FixedClass) -> Result<()> {
        let p = self.cfg.params.clone();
        match (class, self.cfg.secret_len) {
            (FixedClass::Values(v), false) => self.fill_fixed(v, &p),
            (FixedClass::Length(l), true) => {
                self.fixed_len = l.length(p.seqlen_k);
                self.refresh_random_lengths()
            }
            (c, secret) => Err(Error::Other(format!(
                "class `{}` does not belong to {} mode",
                c.name(),
                if secret { "secret-length" } else { "value" }
            ))),
        }
    }

    fn fill_fixed(&mut self, v: ValueClass, p: &AttentionParams) -> Result<()> {
        let q = v.fill(p.dtype, p.head_dim, p.q_len());
        let kv = v.fill(p.dtype, p.head_dim, p.kv_len());
        self.fixed_host = Some((q, kv));
        self.place(0)
    }

    /// Value mode: writes the fixed pattern into pool `fixed_pool` and the random sets into
    /// the other one (outside the timed region; waits for the copies).
    fn place(&mut self, fixed_pool: usize) -> Result<()> {
        let Some((q, kv)) = &self.fixed_host else {
            return Err(Error::Other("no fixed class prepared".into()));
        };
        let pool = self.cfg.pool;
        let stream = self.ctx.stream();
        for (s, t) in self.tensors.iter_mut().enumerate() {
            if s / pool == fixed_pool {
                stream.memcpy_htod(q, &mut t.q)?;
                stream.memcpy_htod(kv, &mut t.k)?;
                stream.memcpy_htod(kv, &mut t.v)?;
            } else {
                let [hq, hk, hv] = &self.random_host[s % pool];
                stream.memcpy_htod(hq, &mut t.q)?;
                stream.memcpy_htod(hk, &mut t.k)?;
                stream.memcpy_htod(hv, &mut t.v)?;
            }
        }
        self.fixed_pool = fixed_pool;
        self.ctx.synchronize()
    }

    /// Value mode: the pools swap roles, then every slot is launched once, untimed, so that
    /// caches are back in their steady state before timing resumes.
    fn swap_pools(&mut self) -> Result<()> {
        self.place(1 - self.fixed_pool)?;
        for s in 0..self.slots.len() {
            let (class, j) = if s / self.cfg.pool == self.fixed_pool {
                (Class::Fixed, s % self.cfg.pool)
            } else {
                (Class::Random, s % self.cfg.pool)
            };
            for set in 0..self.sets.len() {
                if self.sets[set].timer.is_some() {
                    self.sets[set]
                        .timer
                        .as_ref()
                        .expect("checked")
                        .select(self.ctx, 0)?;
                }
                self.launch(set, class, j)?;
            }
        }
        self.ctx.synchronize()
    }

    /// Secret-length mode: a fresh draw of the half that serves the fixed class, its slots
    /// given the fixed length, the other half's fresh uniform lengths in [0, S], all uploaded in
    /// one copy (outside the timed region).
    fn refresh_random_lengths(&mut self) -> Result<()> {
        let s = self.cfg.params.seqlen_k as i32;
        let n = self.cfg.pool * self.cfg.params.batch;
        if let Some((dev, host)) = &mut self.lens {
            self.fixed_pool = self.rng.random_range(0..2);
            for (half, lens) in host.chunks_mut(n).enumerate() {
                for x in lens {
                    *x = if half == self.fixed_pool {
                        self.fixed_len
                    } else {
                        self.rng.random_range(0..=s)
                    };
                }
            }
            self.ctx.stream().memcpy_htod(host.as_slice(), dev)?;
            self.ctx.synchronize()?;
        }
        Ok(())
    }

    fn launch(&self, set: usize, class: Class, slot: usize) -> Result<()> {
        let pool = if class == Class::Fixed {
            self.fixed_pool
        } else {
            1 - self.fixed_pool
        };
        let index = pool * self.cfg.pool + slot;
        let s = &self.slots[index];
        let plan = &self.sets[set].plans[index];
        let [q, k, v, o] = s.ptrs;
        // SAFETY: every slot's buffers were allocated for exactly this plan's shape and dtype
        // (q_len / kv_len 16-bit elements — a paged plan's pools hold as many —, batch i32
        // lengths at a 4-byte-aligned offset of one allocation, the block table's batch ·
        // capacity / page_size i32 entries, every one inside the pool), cudarc allocations are
        // 256-byte aligned, they live as long as `self`, and every use is on the context's one
        // stream.
        unsafe {
            if s.table != 0 {
                plan.launch_raw_kv_cache(q, k, v, o, 0, s.lens, s.table, 0)
            } else if s.lens != 0 {
                plan.launch_raw_with_lengths(q, k, v, o, 0, s.lens)
            } else {
                plan.launch_raw(q, k, v, o, 0)
            }
        }
    }

    /// Runs `trials` launches of plan set `set` in batches with a random class each; `record`
    /// gets each timed one (with its cycle record for a cycle-timer build). Returns whether the
    /// budget stopped it early.
    fn trials(
        &mut self,
        set: usize,
        trials: usize,
        deadline: Option<Instant>,
        mut record: impl FnMut(Measurement, Option<LaunchCycles>),
    ) -> Result<bool> {
        let mut next = [0usize; 2];
        let mut classes = Vec::with_capacity(self.cfg.batch);
        let mut done = 0;
        let mut since_swap = 0;
        while done < trials {
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(true);
            }
            if !self.cfg.secret_len && since_swap >= self.cfg.swap_every {
                self.swap_pools()?;
                since_swap = 0;
            }
            let b = self.cfg.batch.min(trials - done);
            classes.clear();
            for _ in 0..b {
                classes.push(if self.rng.random::<bool>() {
                    Class::Fixed
                } else {
                    Class::Random
                });
            }
            let stream = self.ctx.stream();
            if let Some(timer) = &self.sets[set].timer {
                timer.clear(self.ctx, b)?;
            }
            for (t, &c) in classes.iter().enumerate() {
                let slot = next[c.index()] % self.cfg.pool;
                next[c.index()] += 1;
                // Outside the interval: where the cycle timer writes, then the queued wait
                // (the kernel is enqueued while it spins, so the interval holds the kernel).
                if let Some(timer) = &self.sets[set].timer {
                    timer.select(self.ctx, t)?;
                }
                if let Some(spin) = &self.spin {
                    spin.enqueue(self.ctx, self.cfg.queue_ns)?;
                }
                self.events[2 * t].record(stream)?;
                self.launch(set, c, slot)?;
                self.events[2 * t + 1].record(stream)?;
            }
            stream.synchronize()?;
            let cycles = match &mut self.sets[set].timer {
                Some(timer) => Some(timer.read(self.ctx, b)?),
                None => None,
            };
            for (t, &c) in classes.iter().enumerate() {
                let ms = self.events[2 * t].elapsed_ms(&self.events[2 * t + 1])?;
                record(
                    Measurement {
                        class: c,
                        time_us: ms as f64 * 1000.0,
                    },
                    cycles.as_ref().map(|v| v[t]),
                );
            }
            done += b;
            since_swap += b;
            if self.cfg.secret_len {
                self.refresh_random_lengths()?;
            }
        }
        Ok(false)
    }

    /// One fixed-vs-random test per build (the kernel, its cycle-timer build, the floor, the
    /// floor's cycle-timer build): warm-up, `measurements` timed launches each (or fewer when the budget runs out),
    /// every statistic, and the attribution.
    pub fn run_class(&mut self, class: FixedClass) -> Result<ClassResult> {
        self.prepare(class)?;
        let mut kernel = None;
        let mut cycles = None;
        let mut floor = None;
        let mut floor_cycles = None;
        for set in 0..self.sets.len() {
            self.trials(set, self.cfg.warmup, None, |_, _| {})?;
            let start = Instant::now();
            let deadline = self
                .cfg
                .budget_s
                .map(|b| start + std::time::Duration::from_secs_f64(b));
            let mut m = Vec::with_capacity(self.cfg.measurements);
            let mut mc = Vec::new();
            let stopped = self.trials(set, self.cfg.measurements, deadline, |x, c| {
                m.push(x);
                if let Some(c) = c {
                    mc.push((x, c));
                }
            })?;
            let elapsed_s = start.elapsed().as_secs_f64();
            match self.sets[set].build {
                Build::Kernel => {
                    kernel = Some(summarize(
                        class.name(),
                        &m,
                        stopped,
                        elapsed_s,
                        self.cfg.crops,
                    ))
                }
                Build::Cycles => cycles = Some(summarize_cycles(&mc, stopped, self.cfg.crops)),
                Build::FloorCycles => {
                    floor_cycles = Some(summarize_cycles(&mc, stopped, self.cfg.crops))
                }
                Build::Floor => {
                    floor = Some(Box::new(summarize(
                        class.name(),
                        &m,
                        stopped,
                        elapsed_s,
                        self.cfg.crops,
                    )))
                }
            }
        }
        let mut r = kernel.ok_or_else(|| Error::Other("no kernel measured".into()))?;
        r.cycles = cycles;
        if let Some(f) = floor.as_mut() {
            // The floor's own verdict, as `--control floor` would give it (no floor under it).
            f.cycles = floor_cycles;
            f.attribution = attribute(f.evidence());
        }
        r.floor = floor;
        r.attribution = attribute(r.evidence());
        Ok(r)
    }
}

/// The result of a class test from its measurements (GPU-free).
pub fn summarize(
    class: &str,
    m: &[Measurement],
    stopped_by_budget: bool,
    elapsed_s: f64,
    crops: usize,
) -> ClassResult {
    let of = |c: Class| -> Vec<f64> {
        m.iter()
            .filter(|x| x.class == c)
            .map(|x| x.time_us)
            .collect()
    };
    let analysis = analyze(m, crops);
    let verdict = analysis.verdict();
    let attribution = attribute(Evidence {
        time_t: analysis.max_abs_t(),
        ..Evidence::default()
    });
    ClassResult {
        class: class.to_string(),
        measurements: m.len(),
        stopped_by_budget,
        elapsed_s,
        fixed_us: Stats::from_samples(&of(Class::Fixed)),
        random_us: Stats::from_samples(&of(Class::Random)),
        max_abs_t: analysis.max_abs_t().filter(|t| t.is_finite()),
        analysis,
        verdict,
        cycles: None,
        floor: None,
        attribution,
    }
}
