//! Fuzzing the public tensor API: many random calls (the op table of
//! `no_panic`) on random tensors — every dtype, ranks 0–4, strided views
//! (transposed, flipped, narrowed, stepped, broadcast) — with random and
//! often absurd arguments (negative and out-of-range dims and indices,
//! sizes up to `usize::MAX`). Every call must return, `Ok` or `Err`: a panic
//! fails the test naming the op and the inputs, an abort kills the binary.
//!
//! `TESSERA_FUZZ_CALLS` sets the number of calls (default 20000, well under a
//! second in CI; run 100000 or more by hand), `TESSERA_FUZZ_SEED` the seed.

use std::panic::{catch_unwind, AssertUnwindSafe};

use tessera_tensor::{DType, Tensor};

use crate::no_panic::{call, Args, OPS};

/// A xorshift generator: the fuzz must not depend on the crate under test.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())]
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

/// Sizes whose allocation exceeds any address space even at one byte an
/// element (so it fails at once whatever the overcommit policy), or whose
/// products overflow.
const ABSURD: [usize; 5] = [1 << 48, 1 << 62, isize::MAX as usize, usize::MAX, (1 << 47) + 3];

/// A size: usually small, sometimes absurd.
fn size(r: &mut Rng) -> usize {
    if r.chance(4) {
        r.pick(&ABSURD)
    } else {
        r.below(6)
    }
}

/// A dim or signed size: usually in a small range around the valid ones.
fn signed(r: &mut Rng) -> isize {
    if r.chance(3) {
        r.pick(&[isize::MIN, isize::MAX, -(1 << 46), 1 << 46])
    } else {
        r.below(13) as isize - 6
    }
}

/// A tensor of a random dtype and rank, often a strided view of a larger one.
fn tensor(r: &mut Rng) -> Tensor {
    let dtype = r.pick(&DType::ALL);
    let rank = r.below(5);
    let shape: Vec<usize> = (0..rank).map(|_| r.below(5)).collect();
    let n: usize = shape.iter().product();
    let vals: Vec<f64> = (0..n)
        .map(|_| match r.below(20) {
            0 => f64::NAN,
            1 => f64::INFINITY,
            2 => -1e300,
            _ => (r.below(13) as f64 - 6.0) * 0.5,
        })
        .collect();
    let mut t = Tensor::from_vec(vals, &shape).unwrap().to_dtype(dtype).unwrap();
    // Up to three view transformations; failures just keep the tensor.
    for _ in 0..r.below(4) {
        let d = signed(r).rem_euclid(rank.max(1) as isize);
        let v = match r.below(6) {
            0 => t.transpose(d, -1),
            1 => t.flip(&[d]),
            2 => t.narrow(d, r.below(2), r.below(3)),
            3 => t.slice(d, r.below(2), r.below(6), 1 + r.below(3)),
            4 => t.unsqueeze(d).and_then(|u| {
                let mut s: Vec<Option<usize>> = vec![None; u.ndim()];
                s[d as usize] = Some(r.below(4));
                u.expand(s)
            }),
            _ => t.permute(&(0..t.ndim() as isize).rev().collect::<Vec<_>>()),
        };
        if let Ok(v) = v {
            t = v;
        }
    }
    t
}

/// An index tensor: usually i64 with values in and out of range.
fn index(r: &mut Rng) -> Tensor {
    let n = r.below(6);
    let v: Vec<i64> = (0..n)
        .map(|_| {
            if r.chance(5) {
                r.pick(&[i64::MIN, i64::MAX, -1 << 40])
            } else {
                r.below(10) as i64 - 3
            }
        })
        .collect();
    let shape = if n == 4 && r.chance(50) {
        vec![2, 2]
    } else {
        vec![n]
    };
    let t = Tensor::from_vec(v, &shape).unwrap();
    if r.chance(10) {
        t.to_dtype(r.pick(&DType::ALL)).unwrap()
    } else {
        t
    }
}

fn args(r: &mut Rng) -> Args {
    let len = r.below(5);
    Args {
        dims: (0..r.below(5)).map(|_| signed(r)).collect(),
        ishape: (0..len)
            .map(|_| {
                let n = if r.chance(90) {
                    r.below(8) as isize - 1
                } else {
                    signed(r)
                };
                usize::try_from(n).ok()
            })
            .collect(),
        ushape: (0..r.below(5)).map(|_| size(r)).collect(),
        a: size(r),
        b: size(r),
        c: size(r).min(if r.chance(95) { 4 } else { usize::MAX }),
        x: r.pick(&[
            0.0,
            -1.0,
            1e-5,
            0.5,
            2.0,
            3.0,
            f64::NAN,
            f64::INFINITY,
            -3.5,
            1e300,
            -1e-300,
        ]),
        flag: r.chance(50),
    }
}

#[test]
fn random_calls_never_panic() {
    let calls: usize = std::env::var("TESSERA_FUZZ_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20_000);
    let seed: u64 = std::env::var("TESSERA_FUZZ_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0x7e55e7a);
    let mut r = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    // Panics are expected to be caught here; keep the log readable.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let mut failures = Vec::new();
    let started = std::time::Instant::now();
    for i in 0..calls {
        let k = r.below(OPS);
        let (t, u, idx, g) = (tensor(&mut r), tensor(&mut r), index(&mut r), args(&mut r));
        let mut name = "?";
        let outcome = catch_unwind(AssertUnwindSafe(|| call(k, &t, &u, &idx, &g, &mut name)));
        if let Err(p) = outcome {
            let msg = p
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            failures.push(format!("call {i}: op #{k} ({name}) panicked: {msg}\n  t={t:?}\n  u={u:?}\n  idx={idx:?}\n  args={g:?}"));
        }
    }
    std::panic::set_hook(hook);
    eprintln!("fuzz: {calls} calls, seed {seed}, {:?}", started.elapsed());
    assert!(
        failures.is_empty(),
        "{} of {calls} calls panicked:\n{}",
        failures.len(),
        failures[..failures.len().min(10)].join("\n")
    );
}
