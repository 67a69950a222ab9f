//! DataLoader semantics: order, shuffle, drop_last, workers, prefetch,
//! persistent workers, error propagation.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use tessera_data::{DataLoader, Dataset, Error, Result, Rng, VecDataset};

/// Sample i is i; with a pseudo-random delay per sample.
struct Slow {
    n: usize,
    loaded: Arc<AtomicUsize>,
    threads: Arc<Mutex<HashSet<thread::ThreadId>>>,
}

impl Slow {
    fn new(n: usize) -> Self {
        Slow {
            n,
            loaded: Arc::new(AtomicUsize::new(0)),
            threads: Arc::new(Mutex::new(HashSet::new())),
        }
    }
}

impl Dataset for Slow {
    type Item = i64;
    fn len(&self) -> usize {
        self.n
    }
    fn get(&self, i: usize) -> Result<i64> {
        let delay = Rng::keyed(99, &[i as u64]).below(3000);
        thread::sleep(Duration::from_micros(delay));
        self.loaded.fetch_add(1, Ordering::SeqCst);
        self.threads.lock().unwrap().insert(thread::current().id());
        Ok(i as i64)
    }
}

fn epoch_batches<D: Dataset<Item = i64> + 'static>(l: &mut DataLoader<D>) -> Vec<Vec<i64>> {
    l.iter().map(|b| b.unwrap().to_vec::<i64>().unwrap()).collect()
}

#[test]
fn batches_in_order_with_random_delays_any_worker_count() {
    let want: Vec<Vec<i64>> = (0..23i64)
        .collect::<Vec<_>>()
        .chunks(4)
        .map(<[i64]>::to_vec)
        .collect();
    for workers in [0, 1, 3] {
        let mut b = DataLoader::builder(Slow::new(23))
            .batch_size(4)
            .num_workers(workers);
        if workers > 0 {
            b = b.prefetch_factor(3);
        }
        let mut l = b.build().unwrap();
        assert_eq!(l.len(), 6);
        assert_eq!(epoch_batches(&mut l), want, "workers {workers}");
    }
}

#[test]
fn drop_last_and_len() {
    let mut l = DataLoader::builder(VecDataset::new((0..10i64).collect()))
        .batch_size(3)
        .drop_last(true)
        .build()
        .unwrap();
    assert_eq!(l.len(), 3);
    assert_eq!(
        epoch_batches(&mut l),
        vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7, 8]]
    );
}

#[test]
fn shuffle_is_a_function_of_seed_and_epoch() {
    let make = |seed, workers| {
        let mut b = DataLoader::builder(VecDataset::new((0..50i64).collect()))
            .batch_size(7)
            .shuffle(true)
            .seed(seed)
            .num_workers(workers);
        if workers > 0 {
            b = b.persistent_workers(true);
        }
        b.build().unwrap()
    };
    let (mut a, mut b, mut c) = (make(1, 0), make(1, 2), make(2, 0));
    let a0 = epoch_batches(&mut a);
    let a1 = epoch_batches(&mut a);
    assert_eq!(a0, epoch_batches(&mut b), "same seed+epoch, other worker count");
    assert_eq!(a1, epoch_batches(&mut b));
    assert_ne!(a0, a1, "epochs differ");
    assert_ne!(a0, epoch_batches(&mut c), "seeds differ");
    a.set_epoch(0);
    assert_eq!(epoch_batches(&mut a), a0);
    let mut all: Vec<i64> = a1.concat();
    all.sort_unstable();
    assert_eq!(all, (0..50).collect::<Vec<_>>());
}

#[test]
fn random_transforms_identical_for_any_worker_count() {
    let run = |workers| {
        let ds = VecDataset::new((0..40u64).collect()).map_random(5, |x, c| Ok(x as f64 + c.rng.uniform()));
        let mut l = DataLoader::builder(ds)
            .batch_size(6)
            .num_workers(workers)
            .build()
            .unwrap();
        l.set_epoch(3);
        l.iter()
            .map(|b| b.unwrap().to_vec::<f64>().unwrap())
            .collect::<Vec<_>>()
    };
    let base = run(0);
    assert_eq!(base, run(1));
    assert_eq!(base, run(4));
}

struct Failing {
    bad: usize,
    panic: bool,
}

impl Dataset for Failing {
    type Item = i64;
    fn len(&self) -> usize {
        20
    }
    fn get(&self, i: usize) -> Result<i64> {
        if i == self.bad {
            if self.panic {
                panic!("transform exploded on {i}");
            }
            return Err(Error::arg("Failing::get", format!("cannot read sample {i}")));
        }
        Ok(i as i64)
    }
}

#[test]
fn worker_error_and_panic_reach_the_caller() {
    for workers in [0, 2] {
        for panic in [false, true] {
            let mut l = DataLoader::builder(Failing { bad: 9, panic })
                .batch_size(4)
                .num_workers(workers)
                .build()
                .unwrap();
            let got: Vec<_> = l.iter().collect();
            assert_eq!(
                got.len(),
                3,
                "two good batches then the error, then the epoch ends"
            );
            assert!(got[0].is_ok() && got[1].is_ok());
            let err = got[2].as_ref().unwrap_err().to_string();
            let want = if panic {
                "transform exploded on 9"
            } else {
                "cannot read sample 9"
            };
            assert!(err.contains(want), "{err}");
            if panic {
                assert!(err.contains("batch 2"), "{err}");
            }
        }
    }
}

#[test]
fn prefetch_is_bounded() {
    let ds = Slow::new(400);
    let loaded = ds.loaded.clone();
    let mut l = DataLoader::builder(ds)
        .batch_size(2)
        .num_workers(2)
        .prefetch_factor(2)
        .build()
        .unwrap();
    let mut it = l.iter();
    it.next().unwrap().unwrap();
    thread::sleep(Duration::from_millis(150));
    // 1 consumed + at most prefetch·workers = 4 batches in flight.
    let n = loaded.load(Ordering::SeqCst);
    assert!(n <= 2 * 5, "{n} samples loaded");
    assert!(n >= 2 * 2, "{n} samples loaded: workers should run ahead");
}

#[test]
fn persistent_workers_survive_epochs() {
    for (persistent, expect_reuse) in [(true, true), (false, false)] {
        let ds = Slow::new(12);
        let threads = ds.threads.clone();
        let mut b = DataLoader::builder(ds).batch_size(3).num_workers(2);
        if persistent {
            b = b.persistent_workers(true);
        }
        let mut l = b.build().unwrap();
        for _ in 0..3 {
            assert_eq!(epoch_batches(&mut l).concat(), (0..12).collect::<Vec<_>>());
        }
        let n = threads.lock().unwrap().len();
        assert_eq!(n <= 2, expect_reuse, "{n} distinct worker threads");
    }
}

#[test]
fn abandoned_epoch_does_not_leak_into_the_next() {
    let mut l = DataLoader::builder(Slow::new(40))
        .batch_size(4)
        .num_workers(3)
        .persistent_workers(true)
        .build()
        .unwrap();
    let first = l.iter().next().unwrap().unwrap().to_vec::<i64>().unwrap();
    assert_eq!(first, vec![0, 1, 2, 3]);
    let all = epoch_batches(&mut l).concat();
    assert_eq!(all, (0..40).collect::<Vec<_>>());
}

#[test]
fn invalid_options_are_errors() {
    let ds = || VecDataset::new(vec![0i64; 4]);
    assert!(DataLoader::builder(ds()).batch_size(0).build().is_err());
    assert!(DataLoader::builder(ds()).prefetch_factor(2).build().is_err());
    assert!(DataLoader::builder(ds())
        .persistent_workers(true)
        .build()
        .is_err());
    assert!(DataLoader::builder(ds())
        .shuffle(true)
        .sampler(tessera_data::SequentialSampler::new(4))
        .build()
        .is_err());
}

/// Sample `stuck` blocks in `get` until the gate opens (a worker stuck on a
/// dead network mount); the others load at once.
struct Stuck {
    n: usize,
    stuck: usize,
    gate: Arc<(Mutex<bool>, Condvar)>,
}

impl Dataset for Stuck {
    type Item = i64;
    fn len(&self) -> usize {
        self.n
    }
    fn get(&self, i: usize) -> Result<i64> {
        if i == self.stuck {
            let (open, cv) = &*self.gate;
            let mut open = open.lock().unwrap();
            while !*open {
                open = cv.wait(open).unwrap();
            }
        }
        Ok(i as i64)
    }
}

/// Opens the gate when dropped, so a failing test leaves no thread stuck.
struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    fn new() -> Self {
        Gate(Arc::new((Mutex::new(false), Condvar::new())))
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        *self.0 .0.lock().unwrap() = true;
        self.0 .1.notify_all();
    }
}

/// Runs `f` on its own thread and returns how long it took; fails when it
/// has not returned after `limit` (it is then left running).
fn finishes_within(limit: Duration, f: impl FnOnce() + Send + 'static) -> Duration {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let t = Instant::now();
        f();
        let _ = tx.send(t.elapsed());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("still running after {limit:?}"))
}

#[test]
fn dropping_an_epoch_does_not_wait_forever_on_a_stuck_worker() {
    let gate = Gate::new();
    let g = gate.0.clone();
    let took = finishes_within(Duration::from_secs(10), move || {
        let ds = Stuck {
            n: 16,
            stuck: 5,
            gate: g,
        };
        let mut l = DataLoader::builder(ds)
            .batch_size(2)
            .num_workers(2)
            .build()
            .unwrap();
        let mut epoch = l.iter();
        assert_eq!(
            epoch.next().unwrap().unwrap().to_vec::<i64>().unwrap(),
            vec![0, 1]
        );
        // Batch 2 (samples 4, 5) never finishes loading; abandon the epoch.
        drop(epoch);
    });
    assert!(took < Duration::from_secs(5), "drop took {took:?}");
}

#[test]
fn timeout_turns_a_stuck_batch_into_an_error() {
    for persistent in [false, true] {
        let gate = Gate::new();
        let g = gate.0.clone();
        let took = finishes_within(Duration::from_secs(10), move || {
            let ds = Stuck {
                n: 16,
                stuck: 5,
                gate: g,
            };
            let mut l = DataLoader::builder(ds)
                .batch_size(2)
                .num_workers(2)
                .persistent_workers(persistent)
                .timeout(Duration::from_millis(200))
                .build()
                .unwrap();
            let got: Vec<_> = l.iter().collect();
            assert_eq!(got.len(), 3, "two batches, then the error");
            let e = got[2].as_ref().unwrap_err().to_string();
            assert!(e.contains("batch 2") && e.contains("0.2"), "{e}");
            drop(l);
        });
        assert!(
            took < Duration::from_secs(3),
            "persistent {persistent}: took {took:?}"
        );
    }
    // As in PyTorch, the timeout applies to workers; without them it is unused.
    let mut l = DataLoader::builder(VecDataset::new(vec![0i64]))
        .timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    assert_eq!(l.iter().count(), 1);
}
