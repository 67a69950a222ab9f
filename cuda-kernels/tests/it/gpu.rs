//! The shared test bodies on a real GPU, against the same f64 references as
//! the emulator. Without a device each test prints
//! `skipped: no CUDA device (<reason>)` and passes.

use crate::common;

use common::exec::RtExec;
use common::{cases_basic as b, cases_mma as m};
use tessera_cuda_kernels::{Error, Gpu};

fn device() -> Option<RtExec> {
    match RtExec::gpu() {
        Ok(g) => Some(g),
        Err(why) => {
            println!("skipped: no CUDA device ({why})");
            None
        }
    }
}

macro_rules! gpu_tests {
    ($($name:ident => $case:path;)*) => {$(
        #[test]
        fn $name() {
            if let Some(g) = device() {
                $case(&g);
            }
        }
    )*};
}

gpu_tests! {
    elementwise_unary => b::elementwise_unary;
    elementwise_binary => b::elementwise_binary;
    casts_and_philox => b::casts_and_philox;
    reductions => b::reductions;
    softmax_and_cross_entropy => b::softmax_and_cross_entropy;
    layer_norm => b::layer_norm;
    adamw_multi_tensor => b::adamw_multi_tensor;
    embedding => b::embedding;
    im2col_col2im => b::im2col_col2im;
    gemm_tensor_cores => m::gemm_tensor_cores;
    attention_small_head => m::attention_small_head;
    attention_large_head => m::attention_large_head;
}

/// Opening a device never panics: no driver, no device or no NVRTC is an `Err`.
#[test]
fn missing_driver_is_an_error() {
    match Gpu::new(0) {
        Ok(g) => println!("device present: {}", g.arch()),
        Err(e @ Error::NoDriver(_)) => assert!(e.to_string().starts_with("no CUDA driver found"), "{e}"),
        Err(e) => assert!(matches!(e, Error::NoDevice(_) | Error::NoNvrtc(_)), "{e}"),
    }
}
