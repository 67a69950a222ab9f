//! The launch wrappers reject bad arguments with an error naming the op and
//! the offending values, and never panic (no device needed: the pointers are
//! never dereferenced).

use half::bf16;
use proptest::prelude::*;
use tessera_cuda_kernels::ops::attention::{attention_fwd, AttnMask, AttnShape};
use tessera_cuda_kernels::ops::conv::{im2col, ConvGeom};
use tessera_cuda_kernels::ops::elementwise::{self as ew, Operand, UnaryOp};
use tessera_cuda_kernels::ops::gemm::{gemm, GemmShape};
use tessera_cuda_kernels::ops::layernorm::layer_norm_fwd;
use tessera_cuda_kernels::ops::optim::{adamw, adamw_tables, AdamConfig, AdamTensor};
use tessera_cuda_kernels::ops::reduce::{reduce, ReduceOp};
use tessera_cuda_kernels::ops::softmax::softmax;
use tessera_cuda_kernels::{DevPtr, Error};

fn p<T>(len: usize) -> DevPtr<T> {
    DevPtr::from_raw(0x1000_0000, len)
}

fn arg_err<T: std::fmt::Debug>(r: Result<T, Error>, needle: &str) {
    match r {
        Err(e @ Error::Arg { .. }) => assert!(e.to_string().contains(needle), "`{e}` lacks `{needle}`"),
        other => panic!("expected an argument error containing `{needle}`, got {other:?}"),
    }
}

#[test]
fn elementwise_checks_views() {
    let x = p::<f32>(10);
    arg_err(
        ew::unary(UnaryOp::Exp, Operand::new(x, &[1]), p(20), &[11]),
        "reaches elements",
    );
    arg_err(
        ew::unary(
            UnaryOp::Exp,
            Operand {
                ptr: x,
                offset: 0,
                strides: &[-1],
            },
            p(10),
            &[2],
        ),
        "reaches elements",
    );
    arg_err(
        ew::unary(UnaryOp::Exp, Operand::new(x, &[1, 1]), p(10), &[2]),
        "strides",
    );
    arg_err(
        ew::unary(UnaryOp::Exp, Operand::new(x, &[1]), p(3), &[4]),
        "output",
    );
    arg_err(
        ew::unary(UnaryOp::Exp, Operand::new(x, &[1, 1]), p(3), &[usize::MAX, 4]),
        "overflows",
    );
    // A flipped view reaching back from its offset is fine.
    assert!(ew::unary(
        UnaryOp::Exp,
        Operand {
            ptr: x,
            offset: 9,
            strides: &[-1]
        },
        p(10),
        &[10]
    )
    .is_ok());
    // Nine dimensions that cannot merge exceed the kernel's limit.
    let shape = [2usize; 9];
    let strides: Vec<isize> = (0..9).map(|d| 3isize.pow(d as u32)).rev().collect();
    arg_err(
        ew::unary(
            UnaryOp::Exp,
            Operand::new(p::<f32>(100_000), &strides),
            p(512),
            &shape,
        ),
        "dimensions",
    );
    arg_err(ew::cast::<f32, f32>(x, x, 10), "itself");
    arg_err(ew::uniform(x, 10, 0, u64::MAX, 0.0, 1.0), "overflows");
}

#[test]
fn shapes_are_checked() {
    arg_err(reduce(ReduceOp::Sum, p::<f32>(10), p(10), 2, 0, 1), "length 0");
    arg_err(reduce(ReduceOp::Sum, p::<f32>(10), p(10), 2, 6, 1), "x has");
    arg_err(softmax(p::<f32>(10), p(10), 3, 4, false), "needs 12");
    arg_err(
        layer_norm_fwd(p::<f32>(12), None, None, p(12), p(3), p(3), 3, 4, 0.0),
        "eps",
    );
    arg_err(
        layer_norm_fwd(p::<f32>(12), Some(p(3)), None, p(12), p(3), p(3), 3, 4, 1e-5),
        "gamma",
    );
    arg_err(
        gemm::<bf16>(
            &GemmShape {
                lda: 2,
                ..GemmShape::new(4, 4, 3)
            },
            p(100),
            p(100),
            p(100),
        ),
        "leading dimension",
    );
    arg_err(
        gemm::<bf16>(&GemmShape::new(4, 4, 4), p(15), p(16), p(16)),
        "A has",
    );
    arg_err(
        gemm::<bf16>(
            &GemmShape {
                batch: 70_000,
                stride_a: 0,
                stride_b: 0,
                stride_c: 0,
                ..GemmShape::new(1, 1, 1)
            },
            p(1),
            p(1),
            p(1),
        ),
        "batch",
    );
    let s = AttnShape {
        batch: 1,
        heads: 1,
        lq: 4,
        lk: 4,
        head_dim: 129,
    };
    let m = AttnMask {
        scale: 1.0,
        causal: false,
        kv_len: None,
    };
    arg_err(
        attention_fwd::<f32>(&s, &m, p(1 << 20), p(1 << 20), p(1 << 20), p(1 << 20), p(4)),
        "head_dim",
    );
    let s = AttnShape { head_dim: 8, ..s };
    arg_err(
        attention_fwd::<f32>(&s, &m, p(32), p(31), p(32), p(32), p(4)),
        "k has",
    );
    arg_err(
        attention_fwd::<f32>(
            &s,
            &AttnMask { scale: f32::NAN, ..m },
            p(32),
            p(32),
            p(32),
            p(32),
            p(4),
        ),
        "scale",
    );
    let g = ConvGeom {
        batch: 1,
        channels: 1,
        input: [2, 2],
        kernel: [3, 3],
        padding: [0, 0],
        stride: [1, 1],
        dilation: [1, 1],
    };
    arg_err(im2col::<f32>(&g, p(4), p(100)), "exceeds");
    arg_err(
        im2col::<f32>(
            &ConvGeom {
                dilation: [usize::MAX, 1],
                ..g
            },
            p(4),
            p(100),
        ),
        "overflows",
    );
    arg_err(
        im2col::<f32>(&ConvGeom { stride: [0, 1], ..g }, p(4), p(100)),
        "zero",
    );
}

#[test]
fn adamw_checks_its_group() {
    let t = AdamTensor::<f32> {
        param: p(5),
        grad: p(4),
        exp_avg: p(5),
        exp_avg_sq: p(5),
    };
    arg_err(adamw_tables(&[t]), "tensor 0");
    let c = AdamConfig {
        lr: 1e-3,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        decoupled: true,
        maximize: false,
        step: 0,
        grad_scale: 1.0,
    };
    arg_err(adamw::<f32>(p(5), p(2), 1, &c), "step 0");
    arg_err(
        adamw::<f32>(p(5), p(1), 1, &AdamConfig { step: 1, ..c }),
        "chunks",
    );
    let ok = adamw_tables(&[AdamTensor::<f32> {
        param: p(5000),
        grad: p(5000),
        exp_avg: p(5000),
        exp_avg_sq: p(5000),
    }])
    .unwrap();
    assert_eq!(ok.chunks.len(), 4, "5000 elements take two chunks of 4096");
}

proptest! {
    /// Any view: either a launch or an argument error, never a panic; and
    /// a launch only when the view stays inside its buffer.
    #[test]
    fn unary_never_panics(
        shape in prop::collection::vec(0usize..5, 0..5),
        strides in prop::collection::vec(-7isize..8, 5),
        offset in 0usize..40,
        len in 0usize..60,
    ) {
        let st = &strides[..shape.len()];
        let r = ew::unary(UnaryOp::Neg, Operand { ptr: p::<f32>(len), offset, strides: st }, p(1000), &shape);
        if r.is_ok() && !shape.contains(&0) {
            let lo: isize = offset as isize + shape.iter().zip(st).map(|(&n, &s)| (n as isize - 1) * s.min(0)).sum::<isize>();
            let hi: isize = offset as isize + shape.iter().zip(st).map(|(&n, &s)| (n as isize - 1) * s.max(0)).sum::<isize>();
            prop_assert!(lo >= 0 && (hi as usize) < len);
        }
    }
}
