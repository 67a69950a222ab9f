//! Kernel logic on the CPU: every kernel family runs on the CUDA emulator
//! (the same `.cu` sources compiled as C++) under four thread orders and is
//! checked against naive f64 references; outputs that must be deterministic
//! must also agree bit for bit across orders.

mod common;

use common::{cases_basic as b, cases_mma as m, run_emu};

macro_rules! emu_tests {
    ($($name:ident => $case:path, $det:expr;)*) => {$(
        #[test]
        fn $name() {
            run_emu(stringify!($name), |e| $case(e), $det);
        }
    )*};
}

emu_tests! {
    elementwise_unary => b::elementwise_unary, true;
    elementwise_binary => b::elementwise_binary, true;
    casts_and_philox => b::casts_and_philox, true;
    reductions => b::reductions, true;
    softmax_and_cross_entropy => b::softmax_and_cross_entropy, true;
    layer_norm => b::layer_norm, true;
    adamw_multi_tensor => b::adamw_multi_tensor, true;
    // Backward accumulates with atomics: the order of additions varies.
    embedding => b::embedding, false;
    im2col_col2im => b::im2col_col2im, true;
    gemm_tensor_cores => m::gemm_tensor_cores, true;
    attention_small_head => m::attention_small_head, true;
    attention_large_head => m::attention_large_head, true;
}
