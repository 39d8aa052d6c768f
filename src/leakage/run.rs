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
//!   per batch entry, after every synchronisation (outside the timed region).

use super::classes::{FixedClass, ValueClass};
use super::stats::{analyze, Analysis, Class, Measurement, Verdict, CROPS};
use crate::attention::{AttentionParams, Context, Plan};
use crate::bench::device::{free_bytes, random_bits, set_bytes};
use crate::bench::stats::Stats;
use crate::error::{Error, Result};
use crate::kernels::LeakyControl;
use cudarc::driver::{sys, CudaEvent, CudaSlice, DevicePtr};
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use std::time::Instant;

/// What one leakage run measures and how.
#[derive(Debug, Clone)]
pub struct LeakageConfig {
    pub params: AttentionParams,
    /// Secret-length mode (classes differ only in true lengths); needs Sq = Sk.
    pub secret_len: bool,
    /// Time this deliberately leaky control kernel instead of the shipped one.
    /// `SkipPastSecretLength` needs `secret_len`, `EarlyExitOnZeroQ` needs it off.
    pub control: Option<LeakyControl>,
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
            control: None,
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
        match (self.control, self.secret_len) {
            (Some(LeakyControl::SkipPastSecretLength), false) => {
                return Err("the skip-past-length control runs in secret-length mode".into())
            }
            (Some(LeakyControl::EarlyExitOnZeroQ), true) => {
                return Err("the early-exit control is not a secret-length kernel".into())
            }
            _ => {}
        }
        crate::attention::validate::check_params(&self.params).map_err(|e| e.to_string())?;
        if self.secret_len {
            crate::attention::validate::check_secret_len(&self.params)
                .map_err(|e| e.to_string())?;
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
}

/// One launch's buffers: raw device pointers and the plan that caches their parameter block.
struct Slot {
    ptrs: [u64; 4],
    lens: u64,
    plan: Plan,
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
    /// Which pool holds the fixed class now (always 0 in secret-length mode).
    fixed_pool: usize,
    /// `2 · pool` slots: pool 0's, then pool 1's. Secret-length mode: fixed slots, then random.
    slots: Vec<Slot>,
    /// Secret-length mode: `2 · pool · batch` i32 lengths, fixed slots first.
    lens: Option<(CudaSlice<i32>, Vec<i32>)>,
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
        let make_plan = || match cfg.control {
            Some(c) => ctx.plan_leaky_control(p, c),
            None if cfg.secret_len => ctx.plan_secret_len(p),
            None => ctx.plan(p),
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
                        plan: make_plan()?,
                    });
                }
            }
            lens = Some((dev, host));
        } else {
            for t in &tensors {
                slots.push(Slot {
                    ptrs: t.ptrs,
                    lens: 0,
                    plan: make_plan()?,
                });
            }
        }
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
            slots,
            lens,
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
                let fixed = l.length(p.seqlen_k);
                let n = self.cfg.pool * p.batch;
                if let Some((_, host)) = &mut self.lens {
                    host[..n].iter_mut().for_each(|x| *x = fixed);
                }
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
            self.launch(class, j)?;
        }
        self.ctx.synchronize()
    }

    /// Secret-length mode: fresh uniform lengths in [0, S] for every random slot, uploaded with
    /// the fixed ones (one copy, outside the timed region).
    fn refresh_random_lengths(&mut self) -> Result<()> {
        let s = self.cfg.params.seqlen_k as i32;
        let n = self.cfg.pool * self.cfg.params.batch;
        if let Some((dev, host)) = &mut self.lens {
            for x in &mut host[n..] {
                *x = self.rng.random_range(0..=s);
            }
            self.ctx.stream().memcpy_htod(host.as_slice(), dev)?;
            self.ctx.synchronize()?;
        }
        Ok(())
    }

    fn launch(&self, class: Class, slot: usize) -> Result<()> {
        let pool = if self.cfg.secret_len {
            class.index()
        } else if class == Class::Fixed {
            self.fixed_pool
        } else {
            1 - self.fixed_pool
        };
        let s = &self.slots[pool * self.cfg.pool + slot];
        let [q, k, v, o] = s.ptrs;
        // SAFETY: every slot's buffers were allocated for exactly this plan's shape and dtype
        // (q_len / kv_len 16-bit elements, batch i32 lengths at a 4-byte-aligned offset of one
        // allocation), cudarc allocations are 256-byte aligned, they live as long as `self`, and
        // every use is on the context's one stream.
        unsafe {
            if s.lens != 0 {
                s.plan.launch_raw_with_lengths(q, k, v, o, 0, s.lens)
            } else {
                s.plan.launch_raw(q, k, v, o, 0)
            }
        }
    }

    /// Runs `trials` launches in batches with a random class each; `record` gets each timed
    /// one. Returns whether the budget stopped it early.
    fn trials(
        &mut self,
        trials: usize,
        deadline: Option<Instant>,
        mut record: impl FnMut(Measurement),
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
            for (t, &c) in classes.iter().enumerate() {
                let slot = next[c.index()] % self.cfg.pool;
                next[c.index()] += 1;
                self.events[2 * t].record(stream)?;
                self.launch(c, slot)?;
                self.events[2 * t + 1].record(stream)?;
            }
            stream.synchronize()?;
            for (t, &c) in classes.iter().enumerate() {
                let ms = self.events[2 * t].elapsed_ms(&self.events[2 * t + 1])?;
                record(Measurement {
                    class: c,
                    time_us: ms as f64 * 1000.0,
                });
            }
            done += b;
            since_swap += b;
            if self.cfg.secret_len {
                self.refresh_random_lengths()?;
            }
        }
        Ok(false)
    }

    /// One fixed-vs-random test: warm-up, `measurements` timed launches (or fewer when the
    /// budget runs out), every statistic.
    pub fn run_class(&mut self, class: FixedClass) -> Result<ClassResult> {
        self.prepare(class)?;
        self.trials(self.cfg.warmup, None, |_| {})?;
        let start = Instant::now();
        let deadline = self
            .cfg
            .budget_s
            .map(|b| start + std::time::Duration::from_secs_f64(b));
        let mut m = Vec::with_capacity(self.cfg.measurements);
        let stopped = self.trials(self.cfg.measurements, deadline, |x| m.push(x))?;
        let elapsed_s = start.elapsed().as_secs_f64();
        Ok(summarize(
            class.name(),
            &m,
            stopped,
            elapsed_s,
            self.cfg.crops,
        ))
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
    }
}
