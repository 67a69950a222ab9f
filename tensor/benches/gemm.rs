//! GEMM throughput on all cores, as bench lines
//! `bench\tgemm_<dtype>_<shape>\t<impl>\tthroughput\t<GFLOP/s>` with the
//! fraction of the machine's peak measured in the same run (`fma_peak_f32`
//! for f32; for bf16 the higher of `bf16_peak` — `vdpbf16ps` chains — and
//! `fma_peak_f32`, since where `vdpbf16ps` runs at half the FMA rate, as on
//! Intel cores, the bf16 GEMM widens to f32 FMAs), beside PyTorch's
//! numbers when `TESSERA_TORCH_PYTHON` names a python with torch and
//! `bench\t<workload>\ttessera/torch\tratio\t<x>\tx` (medians). Each side
//! reports its best of `--rounds=N` (3) passes over the workloads, the two
//! sides alternating within a pass (see `peak::Rounds`).
//!
//! Shapes `m x k x n` (A is m×k, B is k×n); `_tn` multiplies Aᵀ·B and `_nt`
//! A·Bᵀ with the transposed operand stored the other way round. An argument
//! runs the workloads whose name contains it, or the one f32 product `MxKxN`.

mod peak;

use tessera_tensor::{DType, Tensor};

/// `(workload, dtype, m, k, n, transpose A, transpose B)`.
type Shape = (&'static str, DType, usize, usize, usize, bool, bool);

const SHAPES: &[Shape] = &[
    ("gemm_f32_64", DType::F32, 64, 64, 64, false, false),
    ("gemm_f32_128", DType::F32, 128, 128, 128, false, false),
    ("gemm_f32_256", DType::F32, 256, 256, 256, false, false),
    ("gemm_f32_512", DType::F32, 512, 512, 512, false, false),
    ("gemm_f32_1024", DType::F32, 1024, 1024, 1024, false, false),
    ("gemm_f32_2048", DType::F32, 2048, 2048, 2048, false, false),
    ("gemm_f32_128x784x512", DType::F32, 128, 784, 512, false, false),
    (
        "gemm_f32_4096x768x3072",
        DType::F32,
        4096,
        768,
        3072,
        false,
        false,
    ),
    ("gemm_f32_1024_tn", DType::F32, 1024, 1024, 1024, true, false),
    ("gemm_f32_1024_nt", DType::F32, 1024, 1024, 1024, false, true),
    // The ViT step's forward linear (8320 tokens, x·Wᵀ with W [192, 192]).
    (
        "gemm_f32_8320x192x192_nt",
        DType::F32,
        8320,
        192,
        192,
        false,
        true,
    ),
    // The ViT step's MLP input gradient (8320 tokens, 768 → 192) and
    // weight gradients (gᵀ·x, summed over the tokens).
    ("gemm_f32_8320x768x192", DType::F32, 8320, 768, 192, false, false),
    (
        "gemm_f32_768x8320x192_tn",
        DType::F32,
        768,
        8320,
        192,
        true,
        false,
    ),
    (
        "gemm_f32_192x8320x192_tn",
        DType::F32,
        192,
        8320,
        192,
        true,
        false,
    ),
    ("gemm_bf16_256", DType::BF16, 256, 256, 256, false, false),
    ("gemm_bf16_512", DType::BF16, 512, 512, 512, false, false),
    ("gemm_bf16_1024", DType::BF16, 1024, 1024, 1024, false, false),
    ("gemm_bf16_2048", DType::BF16, 2048, 2048, 2048, false, false),
    ("gemm_bf16_4096", DType::BF16, 4096, 4096, 4096, false, false),
    // The autocast MLP step's products: forward, input and weight gradients.
    ("gemm_bf16_128x784x512", DType::BF16, 128, 784, 512, false, false),
    (
        "gemm_bf16_128x512x512_nt",
        DType::BF16,
        128,
        512,
        512,
        false,
        true,
    ),
    (
        "gemm_bf16_512x128x784_tn",
        DType::BF16,
        512,
        128,
        784,
        true,
        false,
    ),
];

fn main() {
    // Products called from this thread, as worker 0 of the pool (PyTorch's
    // from its OpenMP thread 0).
    tessera_tensor::init_thread_pool(None).expect("no pool before main");
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let peak = peak::fma_peak();
    let bf16_peak = peak::bf16_peak();
    let custom = filter.as_deref().and_then(parse_shape);
    let shapes: Vec<Shape> = match custom {
        Some((m, k, n)) => vec![("gemm_f32_custom", DType::F32, m, k, n, false, false)],
        None => SHAPES.to_vec(),
    };
    let peak_of = |name: &str| {
        if name.starts_with("gemm_bf16") {
            bf16_peak.filter(|b| b.median > peak.median).unwrap_or(peak)
        } else {
            peak
        }
    };
    let torch = if custom.is_none() {
        peak::Torch::start("gemm")
    } else {
        None
    };
    let mut rounds = peak::Rounds::new(torch);
    for _ in 0..peak::rounds_arg() {
        for &(name, dtype, m, k, n, ta, tb) in &shapes {
            if custom.is_none() && filter.as_ref().is_some_and(|f| !name.contains(f.as_str())) {
                continue;
            }
            let a = operand(m, k, ta, 1, dtype);
            let b = operand(k, n, tb, 2, dtype);
            let flop = 2.0 * (m * n * k) as f64;
            rounds.measure(name, peak_of(name), || {
                peak::rates(flop, peak::reps_for(flop), || {
                    std::hint::black_box(a.matmul(&b).expect("matmul"));
                })
            });
        }
    }
    rounds.report();
}

/// `MxKxN` as a shape (an argument that runs just that product).
fn parse_shape(s: &str) -> Option<(usize, usize, usize)> {
    let v: Vec<usize> = s.split('x').map(|d| d.parse().ok()).collect::<Option<_>>()?;
    match v[..] {
        [m, k, n] => Some((m, k, n)),
        _ => None,
    }
}

/// A `rows × cols` matrix of `dtype`, stored transposed (a `t()` view of
/// a `cols × rows` tensor) when `t`.
fn operand(rows: usize, cols: usize, t: bool, seed: u32, dtype: DType) -> Tensor {
    let (r, c) = if t { (cols, rows) } else { (rows, cols) };
    let s = Tensor::from_vec(values(rows * cols, seed), &[r, c])
        .and_then(|s| s.to_dtype(dtype))
        .expect("shape");
    if t {
        s.t().expect("2-D")
    } else {
        s
    }
}

/// Deterministic values in [-1, 1).
fn values(len: usize, seed: u32) -> Vec<f32> {
    (0..len as u32)
        .map(|i| ((i.wrapping_mul(2_654_435_761).wrapping_add(seed * 97)) % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}
