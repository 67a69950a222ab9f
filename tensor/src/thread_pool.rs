//! The CPU thread pool: rayon's global pool, with the thread that runs the
//! training loop as one of its workers, the way PyTorch's intra-op pool
//! (OpenMP) makes the calling thread thread 0.
//!
//! Without it an op called from `main` hands its work to the pool's
//! workers and sleeps until they finish: on `n` cores `n + 1` threads take
//! turns, and every parallel op pays a wake-up and two context switches.
//! Measured on 2 Zen 4 cores: the autocast MLP step +15–25%, the CNN steps
//! +8–15%.
//!
//! Ops called from a worker also keep the other workers awake for
//! [`LINGER`] ([`keep_warm`]), as OpenMP's threads spin a while before they
//! sleep. Rayon lets an idle worker sleep after a few microseconds, and on
//! a virtual machine waking it again takes 20–100 µs (the host has to
//! schedule the halted vCPU): a training step of many short ops paid that
//! on most of them. Measured on a 2-vCPU Intel Xeon (Emerald Rapids),
//! three runs each: the bf16 autocast MLP step 33.9k/40.1k/32.4k →
//! 42.5k/46.7k/45.0k samples/s, the bf16 CNN step 3.9k/3.5k/3.1k →
//! 4.0k/3.6k/3.8k.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::{Error, Result};

/// Builds rayon's global pool with the calling thread as worker 0 of its
/// `threads` threads (all cores when `None`): parallel ops called from this
/// thread then run on it and the other workers. Call it first in `main`,
/// from the thread that will call the ops, before any parallel op; a thread
/// that only waits on others (the rank threads of a `LocalGroup`) should
/// not be made a worker, since its core would idle while it waits. Results
/// never depend on it (every op sums in a fixed order whatever the pool).
///
/// Ops called from a pool thread keep the other threads looking for work
/// until 300 µs after the op starts or after they last ran work of the
/// pool, whichever is later, before they sleep.
///
/// Errors when the global pool exists already (any parallel op builds it
/// with the defaults), or `threads` is 0.
pub fn init_thread_pool(threads: Option<usize>) -> Result<()> {
    const OP: &str = "init_thread_pool";
    if threads == Some(0) {
        return Err(Error::arg(OP, "a pool needs at least one thread, got 0"));
    }
    rayon::ThreadPoolBuilder::new()
        .num_threads(threads.unwrap_or(0))
        .use_current_thread()
        .build_global()
        .map_err(|e| Error::arg(OP, format!("could not build the global pool: {e}")))
}

/// How long after an op starts, or after they last ran work, the pool's
/// other workers keep looking for work before rayon lets them sleep: a
/// few of a small model's ops, or the gap between two ops longer than it.
pub(crate) const LINGER: Duration = Duration::from_micros(300);

/// Keeps the current pool's other workers looking for work until [`LINGER`]
/// from now, so that the next parallel region finds them running instead of
/// asleep; does nothing when called from a thread outside the pool (a test
/// thread, the rank threads of a `LocalGroup`: threads that only wait on
/// others, whose ops should not keep cores busy) or when the pool has one
/// thread. Every CPU op calls it as it starts.
pub(crate) fn keep_warm() {
    static POOL: Linger = Linger::new();
    POOL.keep_warm();
}

/// Spins between looks at some condition before a yield of the core, so
/// that another runnable thread (a data loader, another process, the
/// worker a spinning thread waits on) is not kept waiting for a whole time
/// slice.
const SPINS_PER_YIELD: u32 = 64;

/// Runs `task(group, index)` for every `group < groups` and `index < len`
/// on the current pool's threads and returns when every call has
/// returned; the caller runs tasks too.
///
/// Thread `t` of `T` starts on group `t·groups/T` and takes its indices in
/// order, then helps the following groups: a group's tasks that share data
/// (the direct GEMM's tasks over one part of B, which stays in that core's
/// L2) run on one thread while the threads keep pace. The caller, its own
/// share done, spins until the last task returns instead of sleeping: in a
/// `par_iter` it waits on rayon's latch, and after a few dozen idle looks
/// rayon puts it to sleep, so a call whose threads finished a task's
/// length apart paid the caller's wake-up on top (20–150 µs on the 2-vCPU
/// VMs, against about 900 µs for the whole 512³ f32 GEMM on 2 threads).
///
/// A panicking task ends its thread's share; the others finish the
/// remaining tasks, and the panic resumes in the caller.
pub(crate) fn for_each_grouped<F: Fn(usize, usize) + Sync>(groups: usize, len: usize, task: F) {
    let total = groups.saturating_mul(len);
    let threads = rayon::current_num_threads().min(total);
    if threads <= 1 {
        (0..groups).for_each(|g| (0..len).for_each(|i| task(g, i)));
        return;
    }
    let next: Vec<AtomicUsize> = (0..groups).map(|_| AtomicUsize::new(0)).collect();
    let done = AtomicUsize::new(0);
    let work = |t: usize| {
        for step in 0..groups {
            let g = (t * groups / threads + step) % groups;
            loop {
                let i = next[g].fetch_add(1, Ordering::Relaxed);
                if i >= len {
                    break;
                }
                let _counted = Counted(&done);
                task(g, i);
            }
        }
    };
    rayon::in_place_scope(|s| {
        for t in 1..threads {
            let work = &work;
            s.spawn(move |_| work(t));
        }
        work(0);
        let mut spins = 0u32;
        while done.load(Ordering::Acquire) < total {
            spins = spins.wrapping_add(1);
            if spins.is_multiple_of(SPINS_PER_YIELD) {
                std::thread::yield_now();
            } else {
                std::hint::spin_loop();
            }
        }
    });
}

/// Counts a task as done when dropped, so a task that panics is counted
/// too and the spinning caller of [`for_each_grouped`] never waits on it.
struct Counted<'a>(&'a AtomicUsize);

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_add(1, Ordering::Release);
    }
}

/// The lingering of a pool's workers.
///
/// Each other worker runs one lingering job, which steals and runs the
/// pool's work as it appears (`rayon::yield_now`) and yields its core to
/// other runnable threads now and then. A call while they linger only
/// moves the deadline, and so does each job a lingering worker runs: an op
/// longer than [`LINGER`] would else let them sleep as it ends, and the
/// next op would wait for a wake-up (on the 2-vCPU Xeon, 2 threads, 512³
/// f32 GEMMs back to back: the second thread's start 22 µs late in one
/// call of ten; median GFLOP/s of four 5-second runs 285, 312, 311, 310
/// -> 318, 314, 315, 319).
struct Linger {
    /// When the workers stop, in nanoseconds since [`now_ns`]'s epoch.
    until: AtomicU64,
    /// Lingering jobs spawned and not yet finished.
    active: AtomicUsize,
}

impl Linger {
    const fn new() -> Self {
        Linger {
            until: AtomicU64::new(0),
            active: AtomicUsize::new(0),
        }
    }

    fn keep_warm(&'static self) {
        let Some(me) = rayon::current_thread_index() else {
            return;
        };
        let others = rayon::current_num_threads() - 1;
        if others == 0 {
            return;
        }
        self.extend();
        if self.active.load(Ordering::Relaxed) != 0
            || self
                .active
                .compare_exchange(0, others, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
        {
            return;
        }
        rayon::spawn_broadcast(move |ctx| {
            if ctx.index() != me {
                self.linger();
                self.active.fetch_sub(1, Ordering::AcqRel);
            }
        });
    }

    /// Moves the deadline to [`LINGER`] from now, once half of it is
    /// spent rather than on every call: ops called back to back from
    /// several workers would otherwise all write the one cache line.
    fn extend(&self) {
        let linger = LINGER.as_nanos() as u64;
        let until = now_ns().saturating_add(linger);
        if self.until.load(Ordering::Relaxed) < until - linger / 2 {
            self.until.fetch_max(until, Ordering::Relaxed);
        }
    }

    /// Runs the pool's work as it appears until the deadline.
    fn linger(&self) {
        let mut idle = 0u32;
        while now_ns() < self.until.load(Ordering::Relaxed) {
            match rayon::yield_now() {
                Some(rayon::Yield::Executed) => {
                    idle = 0;
                    self.extend();
                }
                _ => {
                    idle = idle.wrapping_add(1);
                    if idle.is_multiple_of(SPINS_PER_YIELD) {
                        std::thread::yield_now();
                    } else {
                        std::hint::spin_loop();
                    }
                }
            }
        }
    }
}

/// Nanoseconds since the first call.
fn now_ns() -> u64 {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
}

#[cfg(test)]
mod tests {
    use rayon::prelude::*;

    use super::*;

    /// A lingering of its own, so that no other test's ops touch it.
    fn linger() -> &'static Linger {
        Box::leak(Box::new(Linger::new()))
    }

    /// Whether every lingering job of `l` ends within ten seconds.
    fn ends(l: &Linger) -> bool {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if l.active.load(Ordering::Acquire) == 0 {
                return true;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        false
    }

    #[test]
    fn workers_linger_while_work_runs_and_stop_after_the_deadline() {
        let l = linger();
        let pool = rayon::ThreadPoolBuilder::new().num_threads(3).build().unwrap();
        let total = pool.install(|| {
            let before = now_ns();
            l.keep_warm();
            let first = l.until.load(Ordering::Relaxed);
            assert!(first >= before + LINGER.as_nanos() as u64);
            let jobs = l.active.load(Ordering::Acquire);
            assert!(jobs <= 2, "{jobs} lingering jobs for the 2 other workers");
            // A second call, after the deadline has passed, moves it and
            // sends no more jobs than are still running.
            std::thread::sleep(Duration::from_millis(1));
            l.keep_warm();
            assert!(l.until.load(Ordering::Relaxed) > first);
            assert!(l.active.load(Ordering::Acquire) <= jobs);
            // Work handed to the pool meanwhile runs, and correctly.
            (0..10_000u64).into_par_iter().map(|x| x * x).sum::<u64>()
        });
        assert_eq!(total, (0..10_000u64).map(|x| x * x).sum::<u64>());
        assert!(
            ends(l),
            "the workers still lingered ten seconds after the deadline"
        );
        // Lingering again after the last ended ends too.
        pool.install(|| l.keep_warm());
        assert!(ends(l));
    }

    #[test]
    fn a_lingering_worker_lingers_on_after_each_job_it_runs() {
        let l = linger();
        let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let linger = LINGER.as_nanos() as u64;
        let job_end = AtomicU64::new(0);
        let returned = one.install(|| {
            l.until.store(now_ns() + linger, Ordering::Relaxed);
            // The job, queued before the lingering starts, runs inside it
            // (the pool's only thread) and outlasts the first deadline.
            rayon::join(
                || l.linger(),
                || {
                    std::thread::sleep(3 * LINGER);
                    job_end.store(now_ns(), Ordering::Relaxed);
                },
            );
            now_ns()
        });
        let job_end = job_end.load(Ordering::Relaxed);
        assert!(
            returned >= job_end + linger / 2,
            "lingering ended {} µs after its last job, not {} or more",
            (returned - job_end) / 1000,
            linger / 2000
        );
    }

    #[test]
    fn threads_outside_the_pool_and_single_thread_pools_do_not_linger() {
        let l = linger();
        l.keep_warm();
        assert_eq!(
            (l.active.load(Ordering::Acquire), l.until.load(Ordering::Relaxed)),
            (0, 0)
        );
        let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        one.install(|| l.keep_warm());
        assert_eq!(
            (l.active.load(Ordering::Acquire), l.until.load(Ordering::Relaxed)),
            (0, 0)
        );
    }

    #[test]
    fn grouped_tasks_each_run_once_on_any_pool() {
        for threads in [1, 2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            for (groups, len) in [(1, 1), (1, 7), (2, 37), (5, 3), (3, 0), (0, 4)] {
                let runs: Vec<AtomicUsize> = (0..groups * len).map(|_| AtomicUsize::new(0)).collect();
                pool.install(|| {
                    for_each_grouped(groups, len, |g, i| {
                        assert!(g < groups && i < len, "task ({g}, {i}) outside {groups}×{len}");
                        runs[g * len + i].fetch_add(1, Ordering::Relaxed);
                    })
                });
                assert!(
                    runs.iter().all(|r| r.load(Ordering::Relaxed) == 1),
                    "{threads} threads, {groups}×{len}: a task ran other than once"
                );
            }
        }
    }

    #[test]
    fn a_panicking_grouped_task_reaches_the_caller_after_the_others_ran() {
        let pool = rayon::ThreadPoolBuilder::new().num_threads(2).build().unwrap();
        let runs = AtomicUsize::new(0);
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            pool.install(|| {
                for_each_grouped(2, 20, |g, i| {
                    if (g, i) == (1, 3) {
                        panic!("task (1, 3) fails");
                    }
                    runs.fetch_add(1, Ordering::Relaxed);
                })
            })
        }));
        assert!(outcome.is_err(), "the task's panic did not reach the caller");
        assert_eq!(
            runs.load(Ordering::Relaxed),
            39,
            "the other tasks did not all run"
        );
    }
}
