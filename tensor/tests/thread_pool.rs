//! `init_thread_pool` in a process of its own (the global pool is built
//! once per process): the calling thread becomes worker 0, parallel ops
//! called from it give the bits of a one-thread pool, and a second call is
//! an error.

use tessera_tensor::{init_thread_pool, DType, Tensor};

#[test]
fn the_caller_becomes_worker_zero_and_results_do_not_change() {
    // Everything before `init_thread_pool` runs in a pool of its own, so
    // that nothing builds the global pool first.
    let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
    let (a, b, want) = one.install(|| {
        let a = Tensor::randn(&[300, 200], DType::F32).unwrap();
        let b = Tensor::randn(&[200, 250], DType::F32).unwrap();
        let want = a.matmul(&b).unwrap().exp().unwrap().sum(&[1], false).unwrap();
        (a, b, want)
    });
    assert!(init_thread_pool(Some(0)).is_err(), "0 threads");
    init_thread_pool(Some(2)).unwrap();
    assert_eq!(rayon::current_thread_index(), Some(0));
    assert_eq!(rayon::current_num_threads(), 2);
    let got = a.matmul(&b).unwrap().exp().unwrap().sum(&[1], false).unwrap();
    assert_eq!(got.to_vec::<f32>().unwrap(), want.to_vec::<f32>().unwrap());
    let err = init_thread_pool(None).unwrap_err();
    assert!(err.to_string().contains("init_thread_pool"), "{err}");
}
