//! The index and shaping ops called with random, often invalid shapes, dims,
//! indices and sizes: each returns `Ok` or `Err`, never panics.

use proptest::prelude::*;

use crate::ops::index::embedding_backward;
use crate::ops::pad::PadMode;
use crate::{DType, Tensor};

fn shape() -> impl Strategy<Value = Vec<usize>> {
    proptest::collection::vec(0usize..4, 0..4)
}

fn f32_tensor(shape: &[usize]) -> Tensor {
    let n = shape.iter().product::<usize>();
    Tensor::from_vec((0..n).map(|i| i as f32).collect(), shape).unwrap()
}

fn index_tensor(shape: &[usize], vals: &[i64]) -> Tensor {
    let n = shape.iter().product::<usize>();
    Tensor::from_vec((0..n).map(|i| vals[i % vals.len()]).collect(), shape).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn index_and_shaping_ops_never_panic(
        a in shape(),
        b in shape(),
        dim in -5isize..5,
        vals in proptest::collection::vec(-3i64..6, 1..5),
        sizes in proptest::collection::vec(0usize..5, 0..7),
        k in 0usize..5,
        flip in any::<bool>(),
    ) {
        let x = if flip && !a.is_empty() { f32_tensor(&a).flip(&[0]).unwrap() } else { f32_tensor(&a) };
        let ix = index_tensor(&b, &vals);
        let src = f32_tensor(&b);
        let _ = x.index_select(dim, &ix);
        let _ = x.index_select(dim, &ix.to_dtype(DType::F32).unwrap());
        let _ = x.gather(dim, &ix);
        let _ = x.scatter(dim, &ix, &src);
        let _ = x.scatter(dim, &ix, &x);
        let _ = x.scatter_value(dim, &ix, 1.0);
        let _ = x.scatter_add(dim, &ix, &src);
        let _ = x.masked_fill(&src.to_dtype(DType::Bool).unwrap(), 2.0);
        let _ = ix.one_hot(None);
        let _ = ix.one_hot(Some(k));
        let _ = x.embedding(&ix, None);
        let _ = embedding_backward(&x, &ix, k, Some(k / 2));
        let _ = embedding_backward(&x, &ix, k, None);
        let _ = Tensor::cat(&[&x, &src], dim);
        let _ = Tensor::cat(&[&x, &x.to_dtype(DType::I64).unwrap()], dim);
        let _ = Tensor::stack(&[&x, &src], dim);
        let _ = Tensor::stack(&[&x, &x], dim);
        let _ = x.split(k, dim);
        let _ = x.split_with_sizes(&sizes, dim);
        let _ = x.chunk(k, dim);
        for mode in [PadMode::Constant(1.0), PadMode::Reflect, PadMode::Replicate] {
            let _ = x.pad(&sizes, mode);
        }
        let _ = x.repeat(&sizes);
        let _ = x.tril(dim);
        let _ = x.triu(-dim);
        let _ = x.topk(k, dim, flip, true);
        let _ = x.sort(dim, flip);
        let _ = x.argsort(dim, flip);
    }
}
