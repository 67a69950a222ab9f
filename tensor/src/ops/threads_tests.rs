//! The parallel index and shaping kernels give bit-identical results on one
//! thread and on several.

use crate::ops::index::embedding_backward;
use crate::ops::naive::{i64_tensor, rand_indices};
use crate::ops::pad::PadMode;
use crate::test_util::{rand_f64, tensor_of, values_f64};
use crate::Tensor;

/// Every op's outputs, as f64, for inputs large enough to run in parallel.
fn outputs() -> Vec<Vec<f64>> {
    let (r, c) = (600, 130);
    assert!(r * c > crate::strided::PAR_THRESHOLD);
    let a = tensor_of::<f32>(&rand_f64(1, r * c), &[r, c]);
    let at = a.t().unwrap();
    let idx = i64_tensor(rand_indices(2, r * c, 50), &[r, c]);
    let ids = i64_tensor(rand_indices(3, r, 50), &[r]);
    let (tv, ti) = at.topk(7, 0, true, true).unwrap();
    vec![
        values_f64(
            &tensor_of::<f32>(&[0.0; 50 * 130], &[50, c])
                .scatter_add(0, &idx, &a)
                .unwrap(),
        ),
        values_f64(&embedding_backward(&a, &ids, 50, Some(3)).unwrap()),
        values_f64(
            &a.to_dtype(crate::DType::BF16)
                .unwrap()
                .index_select(0, &ids)
                .unwrap(),
        ),
        values_f64(&at.gather(1, &idx.t().unwrap()).unwrap()),
        values_f64(&Tensor::cat(&[&a, &at.t().unwrap()], 1).unwrap()),
        values_f64(&at.pad(&[5, 5, 3, 3], PadMode::Reflect).unwrap()),
        values_f64(&a.tril(-2).unwrap()),
        values_f64(&at.repeat(&[2, 1, 3]).unwrap()),
        values_f64(&tv),
        values_f64(&ti),
        values_f64(&a.sort(-1, false).unwrap().1),
    ]
}

#[test]
fn results_do_not_depend_on_thread_count() {
    let pool = |n| rayon::ThreadPoolBuilder::new().num_threads(n).build().unwrap();
    let one = pool(1).install(outputs);
    let many = pool(5).install(outputs);
    for (k, (a, b)) in one.iter().zip(&many).enumerate() {
        assert_eq!(a, b, "output {k}");
    }
}
