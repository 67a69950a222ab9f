//! GEMM throughput on all cores, as bench lines
//! `bench\tgemm_f32_<shape>\t<impl>\tthroughput\t<GFLOP/s>` with the fraction
//! of the f32 FMA peak measured in the same run (`fma_peak_f32`), beside
//! PyTorch's numbers when `TESSERA_TORCH_PYTHON` names a python with torch.
//!
//! Shapes `m x k x n` (A is m×k, B is k×n); `_tn` multiplies Aᵀ·B and `_nt`
//! A·Bᵀ with the transposed operand stored the other way round. An argument
//! runs the workloads whose name contains it, or the one product `MxKxN`.

mod peak;

use tessera_tensor::Tensor;

/// `(workload, m, k, n, transpose A, transpose B)`.
const SHAPES: &[(&str, usize, usize, usize, bool, bool)] = &[
    ("gemm_f32_128", 128, 128, 128, false, false),
    ("gemm_f32_256", 256, 256, 256, false, false),
    ("gemm_f32_512", 512, 512, 512, false, false),
    ("gemm_f32_1024", 1024, 1024, 1024, false, false),
    ("gemm_f32_2048", 2048, 2048, 2048, false, false),
    ("gemm_f32_128x784x512", 128, 784, 512, false, false),
    ("gemm_f32_4096x768x3072", 4096, 768, 3072, false, false),
    ("gemm_f32_1024_tn", 1024, 1024, 1024, true, false),
    ("gemm_f32_1024_nt", 1024, 1024, 1024, false, true),
];

fn main() {
    let filter = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let peak = peak::fma_peak();
    let custom = filter.as_deref().and_then(parse_shape);
    let shapes: Vec<(&str, usize, usize, usize, bool, bool)> = match custom {
        Some((m, k, n)) => vec![("gemm_f32_custom", m, k, n, false, false)],
        None => SHAPES.to_vec(),
    };
    for (name, m, k, n, ta, tb) in shapes {
        if custom.is_none() && filter.as_ref().is_some_and(|f| !name.contains(f.as_str())) {
            continue;
        }
        let a = operand(m, k, ta, 1);
        let b = operand(k, n, tb, 2);
        let flop = 2.0 * (m * n * k) as f64;
        let r = peak::rates(flop, peak::reps_for(flop), || {
            std::hint::black_box(a.matmul(&b).expect("matmul"));
        });
        peak::report(name, "tessera", r, peak);
    }
    if filter.is_none() {
        peak::torch_reference("gemm", peak);
    }
}

/// `MxKxN` as a shape (an argument that runs just that product).
fn parse_shape(s: &str) -> Option<(usize, usize, usize)> {
    let v: Vec<usize> = s.split('x').map(|d| d.parse().ok()).collect::<Option<_>>()?;
    match v[..] {
        [m, k, n] => Some((m, k, n)),
        _ => None,
    }
}

/// A `rows × cols` f32 matrix, stored transposed (a `t()` view of a
/// `cols × rows` tensor) when `t`.
fn operand(rows: usize, cols: usize, t: bool, seed: u32) -> Tensor {
    if t {
        let s = Tensor::from_vec(values(rows * cols, seed), &[cols, rows]).expect("shape");
        s.t().expect("2-D")
    } else {
        Tensor::from_vec(values(rows * cols, seed), &[rows, cols]).expect("shape")
    }
}

/// Deterministic values in [-1, 1).
fn values(len: usize, seed: u32) -> Vec<f32> {
    (0..len as u32)
        .map(|i| ((i.wrapping_mul(2_654_435_761).wrapping_add(seed * 97)) % 2001) as f32 / 1000.0 - 1.0)
        .collect()
}
