//! The MNIST CNN's two convolutions (3×3, padding 1, batch 128: 1→32 at
//! 28×28 and 32→64 at 14×14): GFLOP/s of the forward, the gradient with
//! respect to the input and the one with respect to the weight, with the
//! fraction of the f32 FMA peak measured in the same run, beside PyTorch's
//! numbers when `TESSERA_TORCH_PYTHON` names a python with torch and the
//! ratio of the medians (each side's best of `--rounds=N` (3) passes, see
//! `peak::Rounds`). The max-pooling of the CNN (2×2 over both activations)
//! is timed too, in GB/s of input read.

mod peak;

use tessera_tensor::ops::conv::{conv2d_backward_input, conv2d_backward_weight, Conv2dParams};
use tessera_tensor::ops::pool::{max_pool2d_backward, Pool2dParams};
use tessera_tensor::Tensor;

/// `(workload, batch, in channels, out channels, size)`.
const SHAPES: &[(&str, usize, usize, usize, usize)] = &[
    ("conv2d_fwd_bwd_1x32x28", 128, 1, 32, 28),
    ("conv2d_fwd_bwd_32x64x14", 128, 32, 64, 14),
];

fn main() {
    let peak = peak::fma_peak();
    let p = Conv2dParams::default().padding(1);
    let mut rounds = peak::Rounds::new(peak::Torch::start("conv"));
    for _ in 0..peak::rounds_arg() {
        for &(name, n, c, o, s) in SHAPES {
            let x = rand(&[n, c, s, s], 1);
            let w = rand(&[o, c, 3, 3], 2);
            let b = rand(&[o], 3);
            let gy = rand(&[n, o, s, s], 4);
            let flop = 2.0 * (n * o * s * s * c * 9) as f64;
            let reps = peak::reps_for(flop);
            rounds.measure(&format!("{name}_fwd"), peak, || {
                peak::rates(flop, reps, || {
                    std::hint::black_box(x.conv2d(&w, Some(&b), &p).expect("conv2d"));
                })
            });
            rounds.measure(&format!("{name}_grad_input"), peak, || {
                peak::rates(flop, reps, || {
                    std::hint::black_box(conv2d_backward_input(&gy, &w, x.shape(), &p).expect("grad input"));
                })
            });
            rounds.measure(&format!("{name}_grad_weight"), peak, || {
                peak::rates(flop, reps, || {
                    std::hint::black_box(
                        conv2d_backward_weight(&gy, &x, w.shape(), &p).expect("grad weight"),
                    );
                })
            });
        }
    }
    rounds.report();
    for (name, shape) in [
        ("max_pool2d_128x32x28", [128, 32, 28, 28]),
        ("max_pool2d_128x64x14", [128, 64, 14, 14]),
    ] {
        let x = rand(&shape, 5);
        let pp = Pool2dParams::new(2);
        let bytes = (x.numel() * 4) as f64;
        let (y, idx) = x.max_pool2d_with_indices(&pp).expect("pool");
        let fwd = peak::rates(bytes, 20, || {
            std::hint::black_box(x.max_pool2d(&pp).expect("pool"));
        });
        peak::line(&format!("{name}_fwd"), "tessera", "bandwidth", fwd.median, "GB/s");
        let bwd = peak::rates(bytes, 20, || {
            std::hint::black_box(max_pool2d_backward(&y, &idx, x.shape()).expect("pool backward"));
        });
        peak::line(&format!("{name}_bwd"), "tessera", "bandwidth", bwd.median, "GB/s");
    }
}

/// A tensor of `shape` with deterministic values in [-1, 1).
fn rand(shape: &[usize], seed: u32) -> Tensor {
    let len: usize = shape.iter().product();
    let v: Vec<f32> = (0..len as u32)
        .map(|i| ((i.wrapping_mul(2_654_435_761).wrapping_add(seed * 97)) % 2001) as f32 / 1000.0 - 1.0)
        .collect();
    Tensor::from_vec(v, shape).expect("shape")
}
