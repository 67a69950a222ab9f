//! Shared test bodies: every case runs on any [`Exec`] backend (the CPU
//! emulator under several thread orders, or a real GPU) and checks the
//! kernels against naive f64 references written here.
#![allow(dead_code)]

pub mod cases_basic;
pub mod cases_mma;
pub mod exec;

use exec::RtExec;
use half::{bf16, f16};
use tessera_cuda_kernels::emu::ThreadOrder;
use tessera_cuda_kernels::ops::Float;
use tessera_cuda_kernels::{DevPtr, Launch};

/// A backend the test bodies run on.
pub trait Exec {
    /// For messages.
    fn name(&self) -> String;
    /// Copies `data` into a new buffer that lives as long as the backend.
    fn upload<T: Copy>(&self, data: &[T]) -> DevPtr<T>;
    /// Copies a buffer made by [`Exec::upload`] back.
    fn download<T: Copy>(&self, p: DevPtr<T>) -> Vec<T>;
    /// Runs one launch to completion.
    fn run(&self, l: &Launch) -> Result<(), String>;
    /// Runs launches in order, panicking with the backend's message on error.
    fn go(&self, ls: &[Launch]) {
        for l in ls {
            if let Err(e) = self.run(l) {
                panic!("[{}] {e}", self.name());
            }
        }
    }
}

/// Element types of the tests, with their rounding and tolerance.
pub trait TF: Float {
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    /// Unit roundoff of the type.
    const EPS: f64;
}
impl TF for f32 {
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    const EPS: f64 = 6e-8;
}
impl TF for f16 {
    fn from_f64(v: f64) -> Self {
        f16::from_f64(v)
    }
    fn to_f64(self) -> f64 {
        f16::to_f64(self)
    }
    const EPS: f64 = 4.9e-4;
}
impl TF for bf16 {
    fn from_f64(v: f64) -> Self {
        bf16::from_f64(v)
    }
    fn to_f64(self) -> f64 {
        bf16::to_f64(self)
    }
    const EPS: f64 = 3.9e-3;
}

/// Deterministic xorshift64* numbers.
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// `n` values of `T` uniform in [lo, hi), already rounded to `T`.
    pub fn vec<T: TF>(&mut self, n: usize, lo: f64, hi: f64) -> Vec<T> {
        (0..n).map(|_| T::from_f64(self.uniform(lo, hi))).collect()
    }
}

pub fn to64<T: TF>(v: &[T]) -> Vec<f64> {
    v.iter().map(|x| x.to_f64()).collect()
}

/// Asserts |got - want| <= atol + rtol |want| elementwise (NaN matches NaN,
/// infinities must match exactly), naming the first failures.
pub fn assert_close(what: &str, got: &[f64], want: &[f64], rtol: f64, atol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let bad: Vec<String> = got
        .iter()
        .zip(want)
        .enumerate()
        .filter(|(_, (g, w))| {
            if w.is_nan() || g.is_nan() {
                return !(w.is_nan() && g.is_nan());
            }
            if w.is_infinite() || g.is_infinite() {
                return g != w;
            }
            (*g - *w).abs() > atol + rtol * w.abs()
        })
        .take(5)
        .map(|(i, (g, w))| format!("[{i}] got {g} want {w}"))
        .collect();
    assert!(
        bad.is_empty(),
        "{what}: mismatches (rtol {rtol}, atol {atol}): {}",
        bad.join(", ")
    );
}

/// Digest of a case's outputs, compared bit for bit across thread orders.
#[derive(Default)]
pub struct Digest(pub Vec<u64>);
impl Digest {
    pub fn add<T: TF>(&mut self, v: &[T]) {
        self.0.extend(v.iter().map(|x| x.to_f64().to_bits()));
    }
    pub fn add64(&mut self, v: &[f64]) {
        self.0.extend(v.iter().map(|x| x.to_bits()));
    }
}

/// The thread orders every emulator test runs under.
pub const ORDERS: [ThreadOrder; 4] = [
    ThreadOrder::Forward,
    ThreadOrder::Reverse,
    ThreadOrder::Random(0x5eed),
    ThreadOrder::Random(0xbeef),
];

/// Runs `case` on the emulator under forward, reverse and two random thread
/// orders; each run checks itself against the reference, and when
/// `deterministic` the outputs must also agree bit for bit across orders (a
/// difference means a missing barrier).
pub fn run_emu(name: &str, case: fn(&RtExec) -> Digest, deterministic: bool) {
    let mut first: Option<Digest> = None;
    for order in ORDERS {
        let e = RtExec::emu(order);
        let d = case(&e);
        match &first {
            None => first = Some(d),
            Some(f) if deterministic => {
                let diff = f.0.iter().zip(&d.0).position(|(a, b)| a != b);
                assert!(
                    f.0.len() == d.0.len() && diff.is_none(),
                    "{name}: output {diff:?} differs between emu(forward) and {}: a missing barrier?",
                    e.name()
                );
            }
            Some(_) => {}
        }
    }
}
