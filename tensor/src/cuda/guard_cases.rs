//! The op table of `guard_tests.rs`: every public op with valid operands.

use crate::ops::conv::{conv2d_backward_bias, conv2d_backward_input, conv2d_backward_weight, Conv2dParams};
use crate::ops::index::embedding_backward;
use crate::ops::interpolate::upsample_bilinear2d_backward;
use crate::ops::matmul::Activation;
use crate::ops::pool::{
    adaptive_avg_pool2d_backward, avg_pool2d_backward, max_pool2d_backward, Pool2dParams,
};
use crate::{
    CrossEntropyOptions, DType, Device, GeluApprox, Generator, PadMode, Result, Tensor, TensorOptions,
};

/// Whether an op only rewrites the layout (it may succeed on a GPU),
/// computes (it must error on the fake device), or creates a tensor on
/// `cuda:0` (it must error here, where there is no driver; it has no CPU
/// run).
#[derive(Clone, Copy, PartialEq)]
pub(super) enum Kind {
    View,
    Compute,
    Create,
}

pub(super) type OpFn = Box<dyn Fn(&[Tensor]) -> Result<()>>;

pub(super) struct Case {
    pub(super) name: &'static str,
    pub(super) kind: Kind,
    pub(super) inputs: Vec<Tensor>,
    pub(super) f: OpFn,
}

/// Deterministic f32 values in (0, 1) of `shape`.
pub(super) fn f(shape: &[usize]) -> Tensor {
    let n: usize = shape.iter().product();
    Tensor::from_vec(
        (0..n)
            .map(|i| ((i * 37 + 11) % 97) as f32 / 97.0 + 0.005)
            .collect(),
        shape,
    )
    .unwrap()
}

fn i64s(v: &[i64], shape: &[usize]) -> Tensor {
    Tensor::from_slice(v, shape).unwrap()
}

fn op(f: impl Fn(&[Tensor]) -> Result<()> + 'static) -> OpFn {
    Box::new(f)
}

fn ok<T>(r: Result<T>) -> Result<()> {
    r.map(|_| ())
}

/// The op table: every public op with valid operands.
pub(super) fn cases() -> Vec<Case> {
    let m = f(&[3, 4]);
    let x4 = f(&[2, 3, 4, 4]);
    let conv = Conv2dParams::default().stride(1);
    let pool = Pool2dParams::new(2);
    let go = f(&[2, 2, 2, 2]);
    let go2 = f(&[2, 3, 2, 2]);
    let (_, pool_idx) = x4.max_pool2d_with_indices(&pool).unwrap();
    let (_, ln_mean, ln_rstd) = m.layer_norm_forward(&[4], None, None, 1e-5).unwrap();
    let bn = x4
        .batch_norm_forward(None, None, None, None, true, 0.1, 1e-5)
        .unwrap();
    let (_, gn_mean, gn_rstd) = x4.group_norm_forward(3, None, None, 1e-5).unwrap();
    let target = i64s(&[0, 3, 1], &[3]);
    let ce = CrossEntropyOptions::default();
    let (loss, lse) = m.cross_entropy_forward(&target, ce).unwrap();
    let dloss = loss.ones_like(None).unwrap();
    let idx2 = i64s(&[2, 0], &[2]);
    let gidx = i64s(&[0, 1, 2, 3, 3, 2, 1, 0, 1, 1, 2, 2], &[3, 4]);
    let mask = m.gt_scalar(0.5).unwrap();
    let cuda = TensorOptions {
        dtype: DType::F32,
        device: Device::Cuda(0),
    };

    let mut v: Vec<Case> = Vec::new();
    let mut add = |name: &'static str, kind: Kind, inputs: &[&Tensor], f: OpFn| {
        v.push(Case {
            name,
            kind,
            inputs: inputs.iter().map(|&t| t.clone()).collect(),
            f,
        });
    };
    use Kind::{Compute as C, Create as N, View as V};
    macro_rules! unary {
        ($($name:ident),*) => {$(
            add(stringify!($name), C, &[&m], op(|x| ok(x[0].$name())));
        )*};
    }
    unary!(neg, abs, sign, square, relu, floor, ceil, round, exp, log, log1p, expm1, sqrt, rsqrt, recip);
    unary!(sin, cos, tanh, sigmoid, silu, erf, logical_not, batch_norm_stats);
    add("gelu", C, &[&m], op(|x| ok(x[0].gelu(GeluApprox::Tanh))));
    add("clamp", C, &[&m], op(|x| ok(x[0].clamp(Some(0.2), Some(0.7)))));
    add(
        "clamp_tensor",
        C,
        &[&m, &m, &m],
        op(|x| ok(x[0].clamp_tensor(Some(&x[1]), Some(&x[2])))),
    );
    macro_rules! binary {
        ($($name:ident),*) => {$(
            add(stringify!($name), C, &[&m, &m], op(|x| ok(x[0].$name(&x[1]))));
        )*};
    }
    binary!(
        add,
        sub,
        mul,
        div,
        maximum,
        minimum,
        pow,
        eq,
        ne,
        lt,
        le,
        gt,
        ge,
        logical_and,
        logical_or,
        logical_xor
    );
    macro_rules! scalar {
        ($($name:ident),*) => {$(
            add(stringify!($name), C, &[&m], op(|x| ok(x[0].$name(0.5))));
        )*};
    }
    scalar!(
        add_scalar,
        sub_scalar,
        rsub_scalar,
        mul_scalar,
        div_scalar,
        rdiv_scalar,
        pow_scalar,
        rpow_scalar
    );
    scalar!(eq_scalar, ne_scalar, lt_scalar, le_scalar, gt_scalar, ge_scalar);
    add(
        "where_",
        C,
        &[&mask, &m, &m],
        op(|x| ok(Tensor::where_(&x[0], &x[1], &x[2]))),
    );
    macro_rules! reduce {
        ($($name:ident),*) => {$(
            add(stringify!($name), C, &[&m], op(|x| ok(x[0].$name(&[1], false))));
        )*};
    }
    reduce!(sum, mean, prod, max, min, logsumexp, all, any);
    add("max_dim", C, &[&m], op(|x| ok(x[0].max_dim(1, true))));
    add("min_dim", C, &[&m], op(|x| ok(x[0].min_dim(1, true))));
    add("argmax", C, &[&m], op(|x| ok(x[0].argmax(Some(1), false))));
    add("argmin", C, &[&m], op(|x| ok(x[0].argmin(None, false))));
    add("var", C, &[&m], op(|x| ok(x[0].var(&[1], 1.0, false))));
    add("std", C, &[&m], op(|x| ok(x[0].std(&[0], 1.0, true))));
    add("var_mean", C, &[&m], op(|x| ok(x[0].var_mean(&[], 0.0, false))));
    add("norm", C, &[&m], op(|x| ok(x[0].norm(2.0, &[1], false))));
    add("softmax", C, &[&m], op(|x| ok(x[0].softmax(-1))));
    add("log_softmax", C, &[&m], op(|x| ok(x[0].log_softmax(0))));
    add(
        "softmax_backward",
        C,
        &[&m, &m],
        op(|x| ok(Tensor::softmax_backward(&x[0], &x[1], 1))),
    );
    add(
        "log_softmax_backward",
        C,
        &[&m, &m],
        op(|x| ok(Tensor::log_softmax_backward(&x[0], &x[1], 1))),
    );
    add("cumsum", C, &[&m], op(|x| ok(x[0].cumsum(1))));
    add("cumprod", C, &[&m], op(|x| ok(x[0].cumprod(0))));
    add("matmul", C, &[&m, &f(&[4, 5])], op(|x| ok(x[0].matmul(&x[1]))));
    add(
        "linear",
        C,
        &[&m, &f(&[5, 4]), &f(&[5])],
        op(|x| ok(x[0].linear(&x[1], Some(&x[2])))),
    );
    add(
        "linear_act",
        C,
        &[&m, &f(&[5, 4]), &f(&[5])],
        op(|x| ok(x[0].linear_act(&x[1], Some(&x[2]), Activation::Relu))),
    );
    add(
        "addmm",
        C,
        &[&f(&[3, 5]), &m, &f(&[4, 5])],
        op(|x| ok(x[0].addmm(&x[1], &x[2], 0.5, 2.0))),
    );
    add(
        "conv2d",
        C,
        &[&x4, &f(&[2, 3, 3, 3]), &f(&[2])],
        op(move |x| ok(x[0].conv2d(&x[1], Some(&x[2]), &conv))),
    );
    add(
        "conv2d_backward_input",
        C,
        &[&go, &f(&[2, 3, 3, 3])],
        op(move |x| ok(conv2d_backward_input(&x[0], &x[1], &[2, 3, 4, 4], &conv))),
    );
    add(
        "conv2d_backward_weight",
        C,
        &[&go, &x4],
        op(move |x| ok(conv2d_backward_weight(&x[0], &x[1], &[2, 3, 3, 3], &conv))),
    );
    add(
        "conv2d_backward_bias",
        C,
        &[&go],
        op(|x| ok(conv2d_backward_bias(&x[0]))),
    );
    add("max_pool2d", C, &[&x4], op(move |x| ok(x[0].max_pool2d(&pool))));
    add(
        "max_pool2d_with_indices",
        C,
        &[&x4],
        op(move |x| ok(x[0].max_pool2d_with_indices(&pool))),
    );
    add("avg_pool2d", C, &[&x4], op(move |x| ok(x[0].avg_pool2d(&pool))));
    add(
        "max_pool2d_backward",
        C,
        &[&go2, &pool_idx],
        op(|x| ok(max_pool2d_backward(&x[0], &x[1], &[2, 3, 4, 4]))),
    );
    add(
        "avg_pool2d_backward",
        C,
        &[&go2],
        op(move |x| ok(avg_pool2d_backward(&x[0], &[2, 3, 4, 4], &pool))),
    );
    add(
        "adaptive_avg_pool2d",
        C,
        &[&x4],
        op(|x| ok(x[0].adaptive_avg_pool2d([3, 2]))),
    );
    add(
        "adaptive_avg_pool2d_backward",
        C,
        &[&go2],
        op(|x| ok(adaptive_avg_pool2d_backward(&x[0], &[2, 3, 4, 4]))),
    );
    add(
        "interpolate_bilinear",
        C,
        &[&x4],
        op(|x| ok(x[0].interpolate_bilinear(Some([6, 5]), None, false))),
    );
    add(
        "upsample_bilinear2d",
        C,
        &[&x4],
        op(|x| ok(x[0].upsample_bilinear2d([6, 6], true, [None, None]))),
    );
    add(
        "upsample_bilinear2d_backward",
        C,
        &[&f(&[2, 3, 6, 6])],
        op(|x| {
            ok(upsample_bilinear2d_backward(
                &x[0],
                &[2, 3, 4, 4],
                false,
                [None, None],
            ))
        }),
    );
    add(
        "layer_norm",
        C,
        &[&m, &f(&[4]), &f(&[4])],
        op(|x| ok(x[0].layer_norm(&[4], Some(&x[1]), Some(&x[2]), 1e-5))),
    );
    add(
        "layer_norm_forward",
        C,
        &[&m, &f(&[4]), &f(&[4])],
        op(|x| ok(x[0].layer_norm_forward(&[4], Some(&x[1]), Some(&x[2]), 1e-5))),
    );
    add(
        "layer_norm_backward",
        C,
        &[&m, &m, &ln_mean, &ln_rstd, &f(&[4])],
        op(|x| {
            ok(Tensor::layer_norm_backward(
                &x[0],
                &x[1],
                &x[2],
                &x[3],
                &[4],
                Some(&x[4]),
            ))
        }),
    );
    add(
        "batch_norm",
        C,
        &[&x4, &f(&[3]), &f(&[3]), &f(&[3]), &f(&[3])],
        op(|x| {
            ok(x[0].batch_norm(
                Some(&x[1]),
                Some(&x[2]),
                Some(&x[3]),
                Some(&x[4]),
                true,
                0.1,
                1e-5,
            ))
        }),
    );
    add(
        "batch_norm_forward",
        C,
        &[&x4, &f(&[3]), &f(&[3]), &f(&[3]), &f(&[3])],
        op(|x| {
            ok(x[0].batch_norm_forward(
                Some(&x[1]),
                Some(&x[2]),
                Some(&x[3]),
                Some(&x[4]),
                true,
                0.1,
                1e-5,
            ))
        }),
    );
    add(
        "batch_norm_backward",
        C,
        &[&x4, &x4, &bn.mean, &bn.invstd, &f(&[3])],
        op(|x| {
            ok(Tensor::batch_norm_backward(
                &x[0],
                &x[1],
                &x[2],
                &x[3],
                Some(&x[4]),
                true,
            ))
        }),
    );
    add(
        "group_norm",
        C,
        &[&x4, &f(&[3]), &f(&[3])],
        op(|x| ok(x[0].group_norm(3, Some(&x[1]), Some(&x[2]), 1e-5))),
    );
    add(
        "group_norm_forward",
        C,
        &[&x4, &f(&[3]), &f(&[3])],
        op(|x| ok(x[0].group_norm_forward(3, Some(&x[1]), Some(&x[2]), 1e-5))),
    );
    add(
        "group_norm_backward",
        C,
        &[&x4, &x4, &gn_mean, &gn_rstd, &f(&[3])],
        op(|x| {
            ok(Tensor::group_norm_backward(
                &x[0],
                &x[1],
                &x[2],
                &x[3],
                3,
                Some(&x[4]),
            ))
        }),
    );
    add(
        "cross_entropy_forward",
        C,
        &[&m, &target],
        op(move |x| ok(x[0].cross_entropy_forward(&x[1], ce))),
    );
    add(
        "cross_entropy_backward",
        C,
        &[&dloss, &m, &target, &lse],
        op(move |x| ok(Tensor::cross_entropy_backward(&x[0], &x[1], &x[2], &x[3], ce))),
    );
    add(
        "embedding",
        C,
        &[&f(&[5, 4]), &idx2],
        op(|x| ok(x[0].embedding(&x[1], None))),
    );
    add(
        "embedding_backward",
        C,
        &[&f(&[2, 4]), &idx2],
        op(|x| ok(embedding_backward(&x[0], &x[1], 5, Some(0)))),
    );
    add(
        "index_select",
        C,
        &[&m, &idx2],
        op(|x| ok(x[0].index_select(0, &x[1]))),
    );
    add("gather", C, &[&m, &gidx], op(|x| ok(x[0].gather(1, &x[1]))));
    add(
        "scatter",
        C,
        &[&m, &gidx, &m],
        op(|x| ok(x[0].scatter(1, &x[1], &x[2]))),
    );
    add(
        "scatter_add",
        C,
        &[&m, &gidx, &m],
        op(|x| ok(x[0].scatter_add(1, &x[1], &x[2]))),
    );
    add(
        "scatter_value",
        C,
        &[&m, &gidx],
        op(|x| ok(x[0].scatter_value(1, &x[1], 2.0))),
    );
    add(
        "masked_fill",
        C,
        &[&m, &mask],
        op(|x| ok(x[0].masked_fill(&x[1], -1.0))),
    );
    add("one_hot", C, &[&target], op(|x| ok(x[0].one_hot(Some(4)))));
    add("cat", C, &[&m, &m], op(|x| ok(Tensor::cat(x, 0))));
    add(
        "stack",
        C,
        &[&m, &m],
        op(|x| ok(Tensor::stack(&[&x[0], &x[1]], 1))),
    );
    add(
        "pad",
        C,
        &[&m],
        op(|x| ok(x[0].pad(&[1, 2], PadMode::Constant(0.5)))),
    );
    add(
        "pad",
        C,
        &[&m],
        op(|x| ok(x[0].pad(&[1, 2, 1, 1], PadMode::Reflect))),
    );
    add("repeat", C, &[&m], op(|x| ok(x[0].repeat(&[2, 1, 3]))));
    add("tril", C, &[&m], op(|x| ok(x[0].tril(0))));
    add("triu", C, &[&m], op(|x| ok(x[0].triu(1))));
    add("topk", C, &[&m], op(|x| ok(x[0].topk(2, 1, true, true))));
    add("sort", C, &[&m], op(|x| ok(x[0].sort(0, true))));
    add("argsort", C, &[&m], op(|x| ok(x[0].argsort(1, false))));
    add("split", V, &[&m], op(|x| ok(x[0].split(2, 1))));
    add(
        "split_with_sizes",
        V,
        &[&m],
        op(|x| ok(x[0].split_with_sizes(&[1, 3], 1))),
    );
    add("chunk", V, &[&m], op(|x| ok(x[0].chunk(2, 0))));
    add("reshape", V, &[&m], op(|x| ok(x[0].reshape((4, ())))));
    add("reshape", C, &[&m.t().unwrap()], op(|x| ok(x[0].reshape(((),)))));
    add("view", V, &[&m], op(|x| ok(x[0].view([2, 6]))));
    add("flatten", V, &[&x4], op(|x| ok(x[0].flatten(1, 2))));
    add("transpose", V, &[&m], op(|x| ok(x[0].transpose(0, 1))));
    add("t", V, &[&m], op(|x| ok(x[0].t())));
    add("permute", V, &[&x4], op(|x| ok(x[0].permute(&[3, 1, 0, 2]))));
    add("narrow", V, &[&m], op(|x| ok(x[0].narrow(1, 1, 2))));
    add("slice", V, &[&m], op(|x| ok(x[0].slice(1, 0, 4, 2))));
    add("select", V, &[&m], op(|x| ok(x[0].select(0, -1))));
    add("flip", V, &[&m], op(|x| ok(x[0].flip(&[0, 1]))));
    add(
        "broadcast_to",
        V,
        &[&m],
        op(|x| ok(x[0].broadcast_to(&[2, 3, 4]))),
    );
    add("expand", V, &[&m], op(|x| ok(x[0].expand((2, (), 4)))));
    add(
        "squeeze",
        V,
        &[&m.unsqueeze(0).unwrap()],
        op(|x| ok(x[0].squeeze(0))),
    );
    add("unsqueeze", V, &[&m], op(|x| ok(x[0].unsqueeze(1))));
    add("contiguous", C, &[&m.t().unwrap()], op(|x| ok(x[0].contiguous())));
    add("to_dtype", C, &[&m], op(|x| ok(x[0].to_dtype(DType::F16))));
    add("to_dtype", C, &[&m], op(|x| ok(x[0].to_dtype(DType::I64))));
    add("to_vec", C, &[&m], op(|x| ok(x[0].to_vec::<f32>())));
    add("to_scalar", C, &[&loss], op(|x| ok(x[0].to_scalar::<f64>())));
    add("as_slice", C, &[&m], op(|x| ok(x[0].as_slice::<f32>())));
    add("to_device", C, &[&m], op(|x| ok(x[0].to_device(Device::Cpu))));
    add("cpu", C, &[&m], op(|x| ok(x[0].cpu())));
    add(
        "zip_map",
        C,
        &[&m, &m],
        op(|x| ok(x[0].zip_map::<f32, f32, f32>(&x[1], "zip_map", |a, b| a * b))),
    );
    add(
        "zip3_map",
        C,
        &[&m, &m, &m],
        op(|x| ok(x[0].zip3_map::<f32, f32, f32, f32>(&x[1], &x[2], "zip3_map", |a, b, c| a * b + c))),
    );
    add(
        "zip_map_",
        C,
        &[&m, &m],
        op(|x| x[0].clone().zip_map_::<f32, f32>(&x[1], "zip_map_", |a, b| a + b)),
    );
    add(
        "make_mut",
        C,
        &[&m],
        op(|x| ok(x[0].clone().make_mut::<f32>().map(|s| s.len()))),
    );
    add(
        "save",
        C,
        &[&m],
        op(|x| {
            let path = std::env::temp_dir().join(format!("tessera-guard-{}.safetensors", std::process::id()));
            let r = crate::safetensors::save(&path, [("m", &x[0])]);
            let _ = std::fs::remove_file(&path);
            r
        }),
    );
    // `*_like` read only their operand's metadata and create on its device.
    add("zeros_like", N, &[&m], op(|x| ok(x[0].zeros_like(None))));
    add("ones_like", N, &[&m], op(|x| ok(x[0].ones_like(DType::F16))));
    add("full_like", N, &[&m], op(|x| ok(x[0].full_like(2.5, None))));
    add("rand_like", N, &[&m], op(|x| ok(x[0].rand_like(None))));
    add("randn_like", N, &[&m], op(|x| ok(x[0].randn_like(DType::BF16))));
    add("bernoulli", C, &[&m], op(|x| ok(x[0].bernoulli())));
    add(
        "bernoulli_with",
        C,
        &[&m],
        op(|x| ok(x[0].bernoulli_with(&mut Generator::new(1)))),
    );
    // Creation on a GPU: no operand; `cuda:0` must work where a device (or
    // the emulator) is present and be an `Err` elsewhere, never a panic.
    add("zeros", N, &[], op(move |_| ok(Tensor::zeros(&[2, 3], cuda))));
    add("ones", N, &[], op(move |_| ok(Tensor::ones(&[2], cuda))));
    add("full", N, &[], op(move |_| ok(Tensor::full(&[2], 1.5, cuda))));
    add(
        "arange",
        N,
        &[],
        op(move |_| ok(Tensor::arange(0.0, 3.0, 0.5, cuda))),
    );
    add(
        "arange_int",
        N,
        &[],
        op(move |_| ok(Tensor::arange_int(0, 9, 2, cuda))),
    );
    add(
        "linspace",
        N,
        &[],
        op(move |_| ok(Tensor::linspace(0.0, 1.0, 5, cuda))),
    );
    add("eye", N, &[], op(move |_| ok(Tensor::eye(3, None, cuda))));
    add("rand", N, &[], op(move |_| ok(Tensor::rand(&[5], cuda))));
    add("randn", N, &[], op(move |_| ok(Tensor::randn(&[5], cuda))));
    add(
        "randint",
        N,
        &[],
        op(move |_| ok(Tensor::randint(0, 7, &[5], cuda))),
    );
    add(
        "bernoulli_scalar",
        N,
        &[],
        op(move |_| ok(Tensor::bernoulli_scalar(0.3, &[5], cuda))),
    );
    add("randperm", N, &[], op(move |_| ok(Tensor::randperm(5, cuda))));
    add(
        "normal",
        N,
        &[],
        op(move |_| ok(Tensor::normal(&[5], 1.0, 2.0, cuda))),
    );
    add(
        "uniform",
        N,
        &[],
        op(move |_| ok(Tensor::uniform(&[5], -1.0, 2.0, cuda))),
    );
    add(
        "trunc_normal",
        N,
        &[],
        op(move |_| ok(Tensor::trunc_normal(&[5], 0.0, 1.0, -2.0, 2.0, cuda))),
    );
    v
}
