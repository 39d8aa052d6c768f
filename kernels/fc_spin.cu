// The queued-timing wait of `flashcore leakage`: one thread spins on the global
// nanosecond timer for `ns` nanoseconds. Enqueued in front of each timed launch, it keeps the
// device busy while the host enqueues the start event and the kernel, so the event interval
// holds the kernel alone, not the host's launch latency. It reads no data.
extern "C" __global__ void flashcore_spin(unsigned long long ns) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
}
