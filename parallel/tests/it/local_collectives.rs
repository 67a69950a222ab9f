//! Every collective on the `local` backend against its single-process oracle.

use crate::common;

use std::time::Duration;

use common::{check_case, check_gloo_pattern, Case, DTYPES};
use proptest::prelude::*;
use tessera_parallel::{CommConfig, CommExt, Communicator, CpuComm, LocalGroup, ReduceOp};

/// Tiny segments (many pieces per chunk) and a path choice: `small` sends
/// everything through the small-message algorithms, otherwise the ring;
/// the shared-memory all-reduce is off (see [`shm_cfg`]).
fn cfg(segment: usize, small: bool) -> CommConfig {
    CommConfig {
        timeout: Duration::from_secs(20),
        max_segment_bytes: segment,
        small_message_bytes: if small { usize::MAX } else { 0 },
        shared_memory: false,
    }
}

/// [`cfg`] with the shared-memory all-reduce on (the default).
fn shm_cfg(segment: usize, small: bool) -> CommConfig {
    CommConfig {
        shared_memory: true,
        ..cfg(segment, small)
    }
}

fn run_ok(n: usize, cfg: CommConfig, f: impl Fn(&CpuComm) -> Result<(), String> + Sync) {
    for (k, r) in LocalGroup::run_with(n, cfg, f)
        .expect("threads")
        .into_iter()
        .enumerate()
    {
        if let Err(e) = r {
            panic!("rank {k}: {e}");
        }
    }
}

#[test]
fn gloo_pattern_every_size() {
    for n in [1, 2, 3, 4, 5, 7, 8] {
        for len in [0, 1, 2, n - 1, n, n + 1, 10, 100, 1000, 10000] {
            for (segment, small) in [(128, false), (1 << 20, false), (1 << 20, true)] {
                run_ok(n, cfg(segment, small), |c| check_gloo_pattern(c, len));
            }
            run_ok(n, shm_cfg(128, false), |c| check_gloo_pattern(c, len));
        }
    }
}

fn dtype_strategy() -> impl Strategy<Value = tessera_tensor::DType> {
    (0..DTYPES.len()).prop_map(|i| DTYPES[i])
}

fn op_strategy() -> impl Strategy<Value = ReduceOp> {
    (0..ReduceOp::ALL.len()).prop_map(|i| ReduceOp::ALL[i])
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Every collective, every dtype and operator, world sizes 1..=8,
    /// lengths 0..10000, shared-memory, ring and small-message paths, bitwise.
    #[test]
    fn every_collective_matches_its_oracle(
        n in 1usize..=8,
        len in prop_oneof![0usize..20, 0usize..10000],
        dtype in dtype_strategy(),
        op in op_strategy(),
        seed in any::<u64>(),
        root in 0usize..8,
        segment in prop_oneof![Just(64usize), Just(4096), Just(1 << 20)],
        small in any::<bool>(),
        shm in any::<bool>(),
    ) {
        let case = Case { seed, len, dtype, op, root };
        let cfg = if shm { shm_cfg(segment, small) } else { cfg(segment, small) };
        let res = LocalGroup::run_with(n, cfg, |c| check_case(c, &case)).expect("threads");
        for r in res {
            prop_assert!(r.is_ok(), "{}", r.unwrap_err());
        }
    }
}

#[test]
fn reruns_and_paths_are_bitwise_identical() {
    let run = |small: bool, shm: bool| {
        let cfg = if shm { shm_cfg(256, small) } else { cfg(256, small) };
        LocalGroup::run_with(5, cfg, |c| {
            let mut x = common::input::<f32>(7, c.rank(), 3001);
            c.all_reduce_slice(&mut x, ReduceOp::Sum).map(|_| x)
        })
        .unwrap()
        .into_iter()
        .map(Result::unwrap)
        .collect::<Vec<_>>()
    };
    let a = run(false, false);
    assert!(a.iter().all(|x| x == &a[0]), "ranks differ");
    assert_eq!(a, run(false, false), "rerun differs");
    assert_eq!(a, run(true, false), "small-message path differs from the ring");
    assert_eq!(a, run(false, true), "shared-memory path differs from the ring");
    assert_eq!(a, run(false, true), "shared-memory rerun differs");
}

/// NCCL's Avg divides after the sum; DDP divides first. They agree bitwise
/// for power-of-two groups on integer data, and both approximate the mean.
#[test]
fn pre_divide_vs_post_divide_average() {
    for (n, shm) in [2, 4, 8, 3, 5].into_iter().flat_map(|n| [(n, false), (n, true)]) {
        let cfg = if shm {
            shm_cfg(1 << 20, false)
        } else {
            cfg(1 << 20, false)
        };
        let res = LocalGroup::run_with(n, cfg, |c| {
            let ints: Vec<f32> = (0..257).map(|j| ((j * 7 + c.rank() * 13) % 61) as f32).collect();
            let mut post = ints.clone();
            c.all_reduce_slice(&mut post, ReduceOp::Avg)?;
            let mut pre: Vec<f32> = ints.iter().map(|x| x / n as f32).collect();
            c.all_reduce_slice(&mut pre, ReduceOp::Sum)?;
            let rand = common::input::<f32>(3, c.rank(), 257);
            let mut rpost = rand.clone();
            c.all_reduce_slice(&mut rpost, ReduceOp::Avg)?;
            let mut rpre: Vec<f32> = rand.iter().map(|x| x / n as f32).collect();
            c.all_reduce_slice(&mut rpre, ReduceOp::Sum)?;
            Ok::<_, tessera_parallel::CommError>((post, pre, rpost, rpre))
        })
        .unwrap();
        let inputs: Vec<Vec<f32>> = (0..n).map(|k| common::input::<f32>(3, k, 257)).collect();
        for r in res {
            let (post, pre, rpost, rpre) = r.unwrap();
            if n.is_power_of_two() {
                assert_eq!(
                    post, pre,
                    "n = {n}: pre- and post-division differ on integer data"
                );
            }
            for j in 0..257 {
                let exact: f64 = inputs.iter().map(|x| x[j] as f64).sum::<f64>() / n as f64;
                let tol = 1e-5 * inputs.iter().map(|x| x[j].abs() as f64).sum::<f64>().max(1e-30);
                assert!((rpost[j] as f64 - exact).abs() <= tol, "n={n} post {j}");
                assert!((rpre[j] as f64 - exact).abs() <= tol, "n={n} pre {j}");
            }
        }
    }
}

/// DeepSpeed's reduce-scatter vectors (spec §1.5), n = 2, Avg.
#[test]
fn deepspeed_reduce_scatter_vectors() {
    let res = LocalGroup::run(2, |c| {
        let r = c.rank() as f32;
        let mut out = vec![0f32; 3];
        c.reduce_scatter_slice(&[r; 6], &mut out, ReduceOp::Avg)?;
        let x: Vec<f32> = (0..6).map(|i| r * i as f32).collect();
        let mut y = vec![0f32; 3];
        c.reduce_scatter_slice(&x, &mut y, ReduceOp::Avg)?;
        Ok::<_, tessera_parallel::CommError>((out, y))
    })
    .unwrap();
    let (out0, y0) = res[0].clone().unwrap();
    let (out1, y1) = res[1].clone().unwrap();
    assert_eq!(out0, vec![0.5; 3]);
    assert_eq!(out1, vec![0.5; 3]);
    assert_eq!(y0, vec![0.0, 0.5, 1.0]);
    assert_eq!(y1, vec![1.5, 2.0, 2.5]);
}

#[test]
fn all_to_all_block_pattern_and_broadcast_from_every_root() {
    for n in 1..=6 {
        run_ok(n, cfg(64, false), |c| {
            let (n, r) = (c.world_size(), c.rank());
            let b = 5;
            let input: Vec<i64> = (0..n * b).map(|i| (r * n + i / b) as i64).collect();
            let mut out = vec![0i64; n * b];
            c.all_to_all_slice(&input, &mut out).map_err(|e| e.to_string())?;
            let want: Vec<i64> = (0..n * b).map(|i| ((i / b) * n + r) as i64).collect();
            if out != want {
                return Err(format!("all_to_all rank {r}: {out:?} vs {want:?}"));
            }
            for root in 0..n {
                for len in [0, 3, 1000] {
                    let mut x: Vec<f64> = (0..len).map(|i| (i * 31 + r) as f64).collect();
                    c.broadcast_slice(&mut x, root).map_err(|e| e.to_string())?;
                    if x.iter().enumerate().any(|(i, &v)| v != (i * 31 + root) as f64) {
                        return Err(format!("broadcast root {root} len {len} rank {r}"));
                    }
                }
            }
            Ok(())
        });
    }
}

#[test]
fn barrier_waits_for_everyone() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let arrived = AtomicUsize::new(0);
    let res = LocalGroup::run(6, |c| {
        std::thread::sleep(Duration::from_millis(5 * c.rank() as u64));
        arrived.fetch_add(1, Ordering::SeqCst);
        c.barrier().map(|_| arrived.load(Ordering::SeqCst))
    })
    .unwrap();
    assert!(res.into_iter().all(|r| r.unwrap() == 6));
}
