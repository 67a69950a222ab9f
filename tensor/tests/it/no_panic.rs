//! Every public tensor op, called with random and mostly invalid arguments
//! (shapes, dims, indices, dtypes, hyper-parameters), returns `Ok` or `Err`
//! and never panics. Each call runs under `catch_unwind`, so a failure names
//! the op and the arguments.

use std::panic::{catch_unwind, AssertUnwindSafe};

use proptest::prelude::*;
use tessera_tensor::ops::conv::Conv2dParams;
use tessera_tensor::ops::pool::Pool2dParams;
use tessera_tensor::{DType, Layout, PadMode, Storage, Tensor};

/// A small tensor of any dtype, rank 0–4, sizes 0–4, sometimes a
/// transposed or flipped view.
fn any_tensor() -> impl Strategy<Value = Tensor> {
    (
        prop::sample::select(DType::ALL.to_vec()),
        prop::collection::vec(0usize..5, 0..5),
        0u8..3,
        any::<u64>(),
    )
        .prop_map(|(dtype, shape, view, seed)| {
            let n: usize = shape.iter().product();
            let mut s = seed | 1;
            let vals: Vec<f64> = (0..n)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    (s % 11) as f64 - 3.0
                })
                .collect();
            let t = Tensor::from_vec(vals, &shape).unwrap().to_dtype(dtype).unwrap();
            match view {
                1 if shape.len() >= 2 => t.transpose(0, -1).unwrap(),
                2 if !shape.is_empty() => t.flip(&[0]).unwrap(),
                _ => t,
            }
        })
}

/// Index tensors: usually i64 with values in and out of range, sometimes
/// another dtype.
fn any_index() -> impl Strategy<Value = Tensor> {
    (prop::collection::vec(-3i64..8, 0..6), 0usize..3, any::<bool>()).prop_map(|(v, rank, wrong_dtype)| {
        let n = v.len();
        let shape: Vec<usize> = match rank {
            0 if n == 1 => vec![],
            2 if n % 2 == 0 => vec![2, n / 2],
            _ => vec![n],
        };
        let t = Tensor::from_vec(v, &shape).unwrap();
        if wrong_dtype {
            t.to_dtype(DType::F32).unwrap()
        } else {
            t
        }
    })
}

/// The non-tensor arguments of one call (dims, shapes, sizes, a scalar).
#[derive(Debug, Clone)]
pub(crate) struct Args {
    pub dims: Vec<isize>,
    /// A shape with holes (`None`) for reshape/view/expand.
    pub ishape: Vec<Option<usize>>,
    pub ushape: Vec<usize>,
    pub a: usize,
    pub b: usize,
    pub c: usize,
    pub x: f64,
    pub flag: bool,
}

fn any_args() -> impl Strategy<Value = Args> {
    (
        prop::collection::vec(-6isize..6, 0..5),
        prop::collection::vec(prop::option::weighted(0.8, 0usize..7), 0..5),
        prop::collection::vec(0usize..5, 0..5),
        (0usize..6, 0usize..6, 0usize..4),
        prop::sample::select(vec![0.0, -1.0, 1e-5, 0.5, 2.0, f64::NAN, f64::INFINITY, -3.5]),
        any::<bool>(),
    )
        .prop_map(|(dims, ishape, ushape, (a, b, c), x, flag)| Args {
            dims,
            ishape,
            ushape,
            a,
            b,
            c,
            x,
            flag,
        })
}

/// Calls op number `k` on the inputs and discards the result; `name` is set
/// to the op's name before the call (so a panic can report it).
pub(crate) fn call(k: usize, t: &Tensor, u: &Tensor, idx: &Tensor, g: &Args, name: &mut &'static str) {
    let d = g.dims.first().copied().unwrap_or(0);
    let conv = Conv2dParams {
        stride: [g.a, g.b.max(1)],
        padding: [g.c, g.b],
        dilation: [g.c, 1],
        groups: g.b,
    };
    let pool = Pool2dParams {
        kernel: [g.a, g.b],
        stride: [g.c, g.a],
        padding: [g.b, g.c],
        dilation: [g.c.max(1), 1],
        ceil_mode: g.flag,
        count_include_pad: !g.flag,
        divisor_override: if g.flag { Some(g.c) } else { None },
    };
    macro_rules! ops {
        ($($name:literal => $e:expr,)*) => {{
            let table: &[(&'static str, &dyn Fn())] = &[$(($name, &|| { let _ = $e; }),)*];
            let (op, f) = table[k % table.len()];
            *name = op;
            f();
        }};
    }
    ops! {
        "reshape" => t.reshape(&g.ishape),
        "view" => t.view(&g.ishape),
        "flatten" => t.flatten(d, g.dims.get(1).copied().unwrap_or(-1)),
        "transpose" => t.transpose(d, g.dims.get(1).copied().unwrap_or(0)),
        "t" => t.t(),
        "permute" => t.permute(&g.dims),
        "narrow" => t.narrow(d, g.a, g.b),
        "slice" => t.slice(d, g.a, g.b, g.c),
        "select" => t.select(d, g.a as isize - 2),
        "flip" => t.flip(&g.dims),
        "broadcast_to" => t.broadcast_to(&g.ushape),
        "expand" => t.expand(&g.ishape),
        "squeeze" => t.squeeze(d),
        "unsqueeze" => t.unsqueeze(d),
        "size" => t.size(d),
        "to_scalar" => t.to_scalar::<f32>(),
        "to_vec" => t.to_vec::<f32>(),
        "as_slice" => t.as_slice::<i64>().map(|s| s.len()),
        "to_dtype" => t.to_dtype(u.dtype()).unwrap().contiguous().unwrap(),
        "add" => t.add(u),
        "div" => t.div(u),
        "pow" => t.pow(u),
        "maximum" => t.maximum(u),
        "lt" => t.lt(u),
        "logical_and" => t.logical_and(u),
        "where" => Tensor::where_(idx, t, u),
        "clamp" => t.clamp(Some(g.x), Some(-g.x)),
        "clamp_tensor" => t.clamp_tensor(Some(u), None),
        "pow_scalar" => t.pow_scalar(g.x),
        "sum" => t.sum(&g.dims, g.flag),
        "mean" => t.mean(&g.dims, g.flag),
        "max" => t.max(&g.dims, g.flag),
        "min_dim" => t.min_dim(d, g.flag),
        "argmax" => t.argmax(if g.flag { Some(d) } else { None }, g.flag),
        "prod" => t.prod(&g.dims, g.flag),
        "var" => t.var(&g.dims, g.x, g.flag),
        "std" => t.std(&g.dims, g.x, g.flag),
        "logsumexp" => t.logsumexp(&g.dims, g.flag),
        "norm" => t.norm(g.x, &g.dims, g.flag),
        "all" => t.all(&g.dims, g.flag),
        "any" => t.any(&g.dims, g.flag),
        "softmax" => t.softmax(d),
        "log_softmax" => t.log_softmax(d),
        "cumsum" => t.cumsum(d),
        "cumprod" => t.cumprod(d),
        "matmul" => t.matmul(u),
        "linear" => t.linear(u, Some(idx)),
        "addmm" => t.addmm(u, idx, g.x, 1.0),
        "conv2d" => t.conv2d(u, Some(idx), &conv),
        "conv2d_backward_input" => tessera_tensor::ops::conv::conv2d_backward_input(t, u, &g.ushape, &conv),
        "conv2d_backward_weight" => tessera_tensor::ops::conv::conv2d_backward_weight(t, u, &g.ushape, &conv),
        "max_pool2d" => t.max_pool2d(&pool),
        "avg_pool2d" => t.avg_pool2d(&pool),
        "adaptive_avg_pool2d" => t.adaptive_avg_pool2d([g.a, g.b]),
        "max_pool2d_backward" => tessera_tensor::ops::pool::max_pool2d_backward(t, idx, &g.ushape),
        "avg_pool2d_backward" => tessera_tensor::ops::pool::avg_pool2d_backward(t, &g.ushape, &pool),
        "interpolate_size" => t.interpolate_bilinear(Some([g.a, g.b]), None, g.flag),
        "interpolate_scale" => t.interpolate_bilinear(None, Some([g.x, 1.5]), g.flag),
        "layer_norm" => t.layer_norm(&g.ushape, Some(u), None, g.x),
        "layer_norm_backward" => Tensor::layer_norm_backward(t, u, idx, t, &g.ushape, None),
        "batch_norm" => t.batch_norm(Some(u), None, Some(idx), None, g.flag, g.x, 1e-5),
        "batch_norm_stats" => t.batch_norm_stats(),
        "group_norm" => t.group_norm(g.a, Some(u), None, 1e-5),
        "index_select" => t.index_select(d, idx),
        "gather" => t.gather(d, idx),
        "scatter" => t.scatter(d, idx, u),
        "scatter_add" => t.scatter_add(d, idx, u),
        "scatter_value" => t.scatter_value(d, idx, g.x),
        "masked_fill" => t.masked_fill(u, g.x),
        "one_hot" => idx.one_hot(if g.flag { Some(g.a) } else { None }),
        "embedding" => t.embedding(idx, g.flag.then_some(g.a)),
        "embedding_backward" => tessera_tensor::ops::index::embedding_backward(t, idx, g.a, if g.flag { Some(g.b) } else { None }),
        "cat" => Tensor::cat(&[t, u], d),
        "stack" => Tensor::stack(&[t, u], d),
        "split" => t.split(g.a, d),
        "split_with_sizes" => t.split_with_sizes(&g.ushape, d),
        "chunk" => t.chunk(g.a, d),
        "pad_constant" => t.pad(&g.ushape, PadMode::Constant(g.x)),
        "pad_reflect" => t.pad(&g.ushape, PadMode::Reflect),
        "pad_replicate" => t.pad(&g.ushape, PadMode::Replicate),
        "repeat" => t.repeat(&g.ushape),
        "tril" => t.tril(d),
        "triu" => t.triu(d),
        "topk" => t.topk(g.a, d, g.flag, true),
        "sort" => t.sort(d, g.flag),
        "argsort" => t.argsort(d, g.flag),
        "zeros" => Tensor::zeros(&g.ushape, u.dtype()),
        "full" => Tensor::full(&g.ushape, g.x, t.dtype()),
        "arange" => Tensor::arange(g.x, g.a as f64, g.b as f64 - 2.0, t.dtype()),
        "linspace" => Tensor::linspace(g.x, 1.0, g.a, t.dtype()),
        "eye" => Tensor::eye(g.a, Some(g.b), t.dtype()),
        "rand" => Tensor::rand(&g.ushape, t.dtype()),
        "randn" => Tensor::randn(&g.ushape, t.dtype()),
        "bernoulli" => t.bernoulli(),
        "from_vec" => Tensor::from_vec(vec![1.0f32; g.a.min(64)], &g.ushape),
        "from_storage" => Layout::try_new(g.ushape.clone(), g.dims.clone(), g.a)
            .and_then(|l| Tensor::from_storage(Storage::zeros::<f32>("test", g.b)?, l)),
        "display" => format!("{t}"),
        "conv2d_backward_bias" => tessera_tensor::ops::conv::conv2d_backward_bias(t),
    }
}

/// The number of ops in [`call`]'s table.
pub(crate) const OPS: usize = 98;

proptest! {
    #![proptest_config(ProptestConfig { cases: 1500, ..ProptestConfig::default() })]

    #[test]
    fn no_op_panics(k in 0..OPS, t in any_tensor(), u in any_tensor(), idx in any_index(), g in any_args()) {
        let mut name = "?";
        let r = catch_unwind(AssertUnwindSafe(|| call(k, &t, &u, &idx, &g, &mut name)));
        prop_assert!(r.is_ok(), "op #{k} ({name}) panicked on t={t:?} u={u:?} idx={idx:?} args={g:?}");
    }
}

#[test]
fn every_op_is_reached() {
    let t = Tensor::zeros(&[2, 2], DType::F32).unwrap();
    let idx = Tensor::from_vec(vec![0i64], &[1]).unwrap();
    let g = Args {
        dims: vec![0],
        ishape: vec![Some(4)],
        ushape: vec![2],
        a: 1,
        b: 1,
        c: 1,
        x: 1.0,
        flag: false,
    };
    let names: std::collections::HashSet<&str> = (0..OPS)
        .map(|k| {
            let mut name = "?";
            call(k, &t, &t, &idx, &g, &mut name);
            name
        })
        .collect();
    assert_eq!(
        names.len(),
        OPS,
        "OPS must equal the number of entries in the op table"
    );
}
