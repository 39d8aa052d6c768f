//! CPU tests of the timing loops against a fake device with a virtual clock.

use flashcore::bench::timing::{
    graph_schedules, sets_needed, time_graph, time_per_call, Backend, TimingConfig,
};
use flashcore::{Error, Result};

/// Launch `set` costs `cost(set)` µs of device time; marks read the virtual clock.
struct Fake {
    sets: usize,
    cost: fn(usize) -> f64,
    now_us: f64,
    marks: Vec<f64>,
    graphs: Vec<Vec<usize>>,
    /// Every launch, whether direct or inside a replay: (set, in_graph).
    log: Vec<(usize, bool)>,
    captures: usize,
    syncs: usize,
    fail_capture: bool,
}

impl Fake {
    fn new(sets: usize, cost: fn(usize) -> f64) -> Fake {
        Fake {
            sets,
            cost,
            now_us: 0.0,
            marks: Vec::new(),
            graphs: Vec::new(),
            log: Vec::new(),
            captures: 0,
            syncs: 0,
            fail_capture: false,
        }
    }
}

impl Backend for Fake {
    fn sets(&self) -> usize {
        self.sets
    }
    fn launch(&mut self, set: usize) -> Result<()> {
        assert!(set < self.sets, "set {set} out of range");
        self.now_us += (self.cost)(set);
        self.log.push((set, false));
        Ok(())
    }
    fn mark(&mut self, slot: usize) -> Result<()> {
        if self.marks.len() <= slot {
            self.marks.resize(slot + 1, f64::NAN);
        }
        self.marks[slot] = self.now_us;
        self.now_us += 1.0; // gaps between calls are not part of any sample
        Ok(())
    }
    fn sync(&mut self) -> Result<()> {
        self.syncs += 1;
        Ok(())
    }
    fn elapsed_ms(&mut self, start: usize, end: usize) -> Result<f64> {
        Ok((self.marks[end] - self.marks[start] - 1.0) / 1e3)
    }
    fn capture(&mut self, sets: &[usize]) -> Result<usize> {
        if self.fail_capture {
            return Err(Error::Other("capture unsupported".into()));
        }
        self.captures += 1;
        self.graphs.push(sets.to_vec());
        Ok(self.graphs.len() - 1)
    }
    fn replay(&mut self, g: usize) -> Result<()> {
        for s in self.graphs[g].clone() {
            self.now_us += (self.cost)(s);
            self.log.push((s, true));
        }
        Ok(())
    }
}

fn cfg(warmup: usize, reps: usize, graph_calls: usize, graph_reps: usize) -> TimingConfig {
    TimingConfig {
        warmup,
        reps,
        graph_calls,
        graph_reps,
        chunk: 64,
    }
}

#[test]
fn per_call_samples_rotate_and_exclude_warmup() {
    let mut f = Fake::new(5, |s| 10.0 + s as f64);
    let samples = time_per_call(&mut f, &cfg(3, 150, 20, 10)).unwrap();
    assert_eq!(samples.len(), 150);
    // Warm-up covers every set at least once: max(3, 5) = 5 launches, then 150 timed.
    assert_eq!(f.log.len(), 155);
    // Calls go round the sets without a break, warm-up included.
    for (i, &(s, g)) in f.log.iter().enumerate() {
        assert_eq!(s, i % 5);
        assert!(!g);
    }
    // Sample i times exactly the launch on set (5 + i) mod 5.
    for (i, t) in samples.iter().enumerate() {
        let want = 10.0 + ((5 + i) % 5) as f64;
        assert!((t - want).abs() < 1e-9, "sample {i}: {t} vs {want}");
    }
    // One sync after warm-up, one per chunk of 64: 150 → 3 chunks.
    assert_eq!(f.syncs, 4);
}

#[test]
fn warmup_longer_than_sets() {
    let mut f = Fake::new(2, |_| 7.0);
    let s = time_per_call(&mut f, &cfg(11, 4, 20, 1)).unwrap();
    assert_eq!(f.log.len(), 15);
    assert!(s.iter().all(|&t| (t - 7.0).abs() < 1e-9));
}

#[test]
fn graph_replays_cover_every_set_and_divide_by_calls() {
    let mut f = Fake::new(45, |s| s as f64);
    let c = cfg(40, 10, 20, 7);
    let samples = time_graph(&mut f, &c).unwrap();
    // ceil(45 / 20) = 3 graphs of 20 calls; together they touch all 45 sets.
    assert_eq!(f.captures, 3);
    let mut touched: Vec<usize> = f.graphs.iter().flatten().copied().collect();
    touched.sort();
    touched.dedup();
    assert_eq!(touched, (0..45).collect::<Vec<_>>());
    assert!(f.graphs.iter().all(|g| g.len() == 20));
    // Every launch went through a graph.
    assert!(f.log.iter().all(|&(_, g)| g));
    assert_eq!(samples.len(), 7);
    // Warm-up: 3 graphs once + ceil(40/20) = 2 replays; timed replays continue the round robin.
    let mean = |g: usize| f.graphs[g].iter().map(|&s| s as f64).sum::<f64>() / 20.0;
    for (i, t) in samples.iter().enumerate() {
        let g = (2 + i) % 3;
        assert!((t - mean(g)).abs() < 1e-9, "sample {i}: {t} vs {}", mean(g));
    }
}

#[test]
fn graph_capture_errors_propagate() {
    let mut f = Fake::new(4, |_| 1.0);
    f.fail_capture = true;
    let e = time_graph(&mut f, &cfg(1, 1, 20, 5)).unwrap_err();
    assert!(e.to_string().contains("capture unsupported"));
}

#[test]
fn zero_counts_are_usage_errors() {
    let mut f = Fake::new(2, |_| 1.0);
    assert!(time_per_call(&mut f, &cfg(0, 0, 1, 1)).is_err());
    assert!(time_graph(&mut f, &cfg(0, 1, 0, 1)).is_err());
    assert!(time_graph(&mut f, &cfg(0, 1, 1, 0)).is_err());
    // Zero warm-up is allowed (each set is still touched once).
    assert_eq!(time_per_call(&mut f, &cfg(0, 3, 1, 1)).unwrap().len(), 3);
}

#[test]
fn schedules() {
    assert_eq!(graph_schedules(2, 4), vec![vec![0, 1, 0, 1]]);
    assert_eq!(
        graph_schedules(5, 2),
        vec![vec![0, 1], vec![2, 3], vec![4, 0]]
    );
    assert_eq!(graph_schedules(3, 3), vec![vec![0, 1, 2]]);
}

#[test]
fn buffer_sets_exceed_twice_l2() {
    // H100: 50 MiB of L2.
    let l2 = 50 * 1024 * 1024u64;
    // (1,8,512,64) fp16: q, k, v of 512·8·64·2 B = 512 KiB each → 1.5 MiB of inputs per set.
    let inputs = 3 * 512 * 8 * 64 * 2u64;
    let n = sets_needed(l2, inputs, inputs * 4 / 3, u64::MAX);
    assert_eq!(n, 67);
    assert!(n as u64 * inputs >= 2 * l2 && (n as u64 - 1) * inputs < 2 * l2);
    // A set larger than 2×L2 still rotates over two.
    assert_eq!(sets_needed(l2, 300 << 20, 400 << 20, u64::MAX), 2);
    // Memory caps the count; nothing fits → 0.
    assert_eq!(sets_needed(l2, inputs, 2 * inputs, 10 * inputs), 5);
    assert_eq!(sets_needed(l2, 300 << 20, 400 << 20, 100 << 20), 0);
}
