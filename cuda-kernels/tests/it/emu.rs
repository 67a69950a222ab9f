//! Kernel logic on the CPU: every kernel family runs on the CUDA emulator
//! (the same `.cu` sources compiled as C++) under four thread orders and is
//! checked against naive f64 references; outputs that must be deterministic
//! must also agree bit for bit across orders.

use crate::common;

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

mod strided_views {
    use super::common::exec::RtExec;
    use super::common::Exec;
    use proptest::prelude::*;
    use tessera_cuda_kernels::emu::ThreadOrder;
    use tessera_cuda_kernels::ops::elementwise::{binary, BinaryOp, Operand};

    /// Strides of a view of a contiguous buffer of `shape` with its
    /// dimensions permuted by `perm` (a rotation), flipped where `flip`,
    /// broadcast (stride 0) where `bcast`; plus the offset of element 0.
    fn view(shape: &[usize], rot: usize, flip: &[bool], bcast: &[bool]) -> (Vec<isize>, usize, usize) {
        let n = shape.len();
        let order: Vec<usize> = (0..n).map(|i| (i + rot) % n.max(1)).collect();
        let mut strides = vec![0isize; n];
        let mut acc = 1usize;
        for &d in order.iter().rev() {
            if !bcast[d] {
                strides[d] = acc as isize;
                acc *= shape[d];
            }
        }
        let mut offset = 0usize;
        for d in 0..n {
            if flip[d] && strides[d] != 0 {
                offset += (shape[d] - 1) * strides[d] as usize;
                strides[d] = -strides[d];
            }
        }
        (strides, offset, acc)
    }

    fn at(shape: &[usize], strides: &[isize], offset: usize, mut i: usize) -> usize {
        let mut o = offset as isize;
        for d in (0..shape.len()).rev() {
            o += (i % shape[d]) as isize * strides[d];
            i /= shape[d];
        }
        o as usize
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// Permuted, flipped and broadcast operands against direct indexing.
        #[test]
        fn binary_over_random_views(
            shape in prop::collection::vec(1usize..5, 0..5),
            rot in 0usize..4,
            flips in prop::collection::vec(any::<bool>(), 8),
            bcast in prop::collection::vec(any::<bool>(), 4),
        ) {
            let n = shape.len();
            let (sa, oa, la) = view(&shape, rot, &flips[..n], &vec![false; n]);
            let (sb, ob, lb) = view(&shape, 0, &flips[4..4 + n], &bcast[..n]);
            let a: Vec<f32> = (0..la).map(|i| i as f32 * 0.5).collect();
            let b: Vec<f32> = (0..lb).map(|i| 1000.0 + i as f32).collect();
            let numel: usize = shape.iter().product();
            let e = RtExec::emu(ThreadOrder::Forward);
            let (pa, pb, y) = (e.upload(&a), e.upload(&b), e.upload(&vec![0f32; numel]));
            let l = binary(BinaryOp::Add, Operand { ptr: pa, offset: oa, strides: &sa }, Operand { ptr: pb, offset: ob, strides: &sb }, y, &shape).unwrap();
            e.go(&[l]);
            let want: Vec<f32> = (0..numel).map(|i| a[at(&shape, &sa, oa, i)] + b[at(&shape, &sb, ob, i)]).collect();
            prop_assert_eq!(e.download(y), want);
        }
    }
}
