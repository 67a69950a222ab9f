//! The shared-memory all-reduce of the `local` backend: the ring's bits
//! for every dtype, operator and awkward length (several tiles per chunk
//! included), agreement checks, and failures that end in errors, not hangs.

use crate::common;

use std::time::{Duration, Instant};

use common::{input, TestElem};
use tessera_parallel::{
    fold_reference, CommConfig, CommError, CommExt, Communicator, CpuComm, LocalGroup, ReduceOp,
};
use tessera_tensor::{bf16, f16};

fn cfg(shared_memory: bool, timeout_ms: u64) -> CommConfig {
    CommConfig {
        timeout: Duration::from_millis(timeout_ms),
        shared_memory,
        ..CommConfig::default()
    }
}

fn bits<T: bytemuck::Pod>(v: &[T]) -> &[u8] {
    bytemuck::cast_slice(v)
}

/// Every rank's result equals the ring's fold, bitwise.
fn check_lengths<T: TestElem>(n: usize, lens: &[usize]) {
    for &len in lens {
        for op in ReduceOp::ALL {
            let seed = (len * 31 + n) as u64;
            let inputs: Vec<Vec<T>> = (0..n).map(|k| input(seed, k, len)).collect();
            let want = fold_reference(&inputs, op);
            let res = LocalGroup::run_with(n, cfg(true, 20_000), |c| {
                let mut x = inputs[c.rank()].clone();
                c.all_reduce_slice(&mut x, op).map(|_| x)
            })
            .unwrap();
            for (k, r) in res.into_iter().enumerate() {
                let got = r.unwrap_or_else(|e| panic!("n={n} len={len} {op:?} rank {k}: {e}"));
                assert!(
                    bits(&got) == bits(&want),
                    "n={n} len={len} {op:?} {}: rank {k} differs from the ring's fold",
                    T::DTYPE
                );
            }
        }
    }
}

#[test]
fn every_dtype_operator_and_length_gives_the_rings_bits() {
    for n in [2, 3, 4, 5, 8] {
        // Empty, shorter than n, not divisible by n, and (above 32 KiB per
        // chunk) several tiles per chunk with a short last one.
        let lens = [0, 1, n - 1, n + 1, 7 * n + 3, 40_001, 123_457];
        check_lengths::<f32>(n, &lens);
        check_lengths::<f64>(n, &lens);
        check_lengths::<f16>(n, &lens);
        check_lengths::<bf16>(n, &lens);
        check_lengths::<i64>(n, &lens);
    }
}

#[test]
fn shared_memory_and_ring_agree_and_repeat() {
    let run = |shm: bool| {
        LocalGroup::run_with(3, cfg(shm, 20_000), |c| {
            let mut outs = Vec::new();
            for len in [5, 30_011, 200_003] {
                let mut x = input::<f32>(11, c.rank(), len);
                c.all_reduce_slice(&mut x, ReduceOp::Sum)?;
                outs.push(x);
            }
            Ok::<_, CommError>(outs)
        })
        .unwrap()
        .into_iter()
        .map(Result::unwrap)
        .collect::<Vec<_>>()
    };
    let a = run(true);
    assert!(a.iter().all(|x| x == &a[0]), "ranks differ");
    assert_eq!(a, run(true), "rerun differs");
    assert_eq!(a, run(false), "shared memory differs from the ring");
}

#[test]
fn sub_groups_run_their_rounds_independently() {
    // Two sub-groups of 3 all-reducing at once, many times, beside the world.
    let res = LocalGroup::run(6, |c| {
        let sub = c.split_group(Some((c.rank() % 2) as u32), 0)?.expect("member");
        for i in 0..50 {
            let mut x = vec![(c.rank() + i) as i64; 1000 + i];
            sub.all_reduce_slice(&mut x, ReduceOp::Sum)?;
            let want: i64 = sub.members().iter().map(|&g| (g + i) as i64).sum();
            assert!(x.iter().all(|&v| v == want), "iteration {i}");
            let mut y = vec![1.0f32; 77];
            c.all_reduce_slice(&mut y, ReduceOp::Sum)?;
            assert!(y.iter().all(|&v| v == 6.0));
        }
        Ok::<_, CommError>(())
    })
    .unwrap();
    for r in res {
        r.unwrap();
    }
}

/// Runs `f` on `n` ranks with a short timeout; each rank's result and time.
fn timed(
    n: usize,
    timeout_ms: u64,
    f: impl Fn(&CpuComm) -> tessera_parallel::Result<()> + Sync,
) -> Vec<(tessera_parallel::Result<()>, Duration)> {
    LocalGroup::run_with(n, cfg(true, timeout_ms), |c| {
        let t = Instant::now();
        (f(c), t.elapsed())
    })
    .unwrap()
}

#[test]
fn a_rank_that_exits_or_panics_mid_all_reduce_fails_the_others_fast() {
    for n in [2, 3, 5] {
        // The last rank leaves after one all-reduce (its communicator is
        // dropped); the others' next one must fail long before the timeout.
        let res = timed(n, 10_000, |c| {
            let mut x = vec![1.0f32; 1 << 16];
            c.all_reduce_slice(&mut x, ReduceOp::Sum)?;
            if c.rank() == n - 1 {
                return Ok(());
            }
            c.all_reduce_slice(&mut x, ReduceOp::Sum)
        });
        for (k, (r, waited)) in res.iter().enumerate().take(n - 1) {
            let e = r.as_ref().expect_err("the group must fail");
            assert!(
                matches!(e, CommError::PeerClosed { .. } | CommError::Aborted { .. }),
                "n={n} rank {k}: {e}"
            );
            assert!(
                *waited < Duration::from_secs(3),
                "n={n} rank {k} waited {waited:?}"
            );
        }
        assert!(res[n - 1].0.is_ok());
    }
}

#[test]
fn panicking_rank_does_not_hang_its_peers() {
    let done = std::sync::Mutex::new(Vec::new());
    let res = LocalGroup::run_with(3, cfg(true, 10_000), |c| {
        let mut x = vec![1.0f64; 5000];
        if c.rank() == 1 {
            panic!("rank 1 fails");
        }
        let t = Instant::now();
        let r = c.all_reduce_slice(&mut x, ReduceOp::Max);
        done.lock().unwrap().push((c.rank(), r.is_err(), t.elapsed()));
    });
    assert!(res.is_err());
    for (k, failed, waited) in done.into_inner().unwrap() {
        assert!(failed, "rank {k} succeeded without rank 1");
        assert!(waited < Duration::from_secs(3), "rank {k} waited {waited:?}");
    }
}

#[test]
fn a_stalled_rank_times_out_everyone() {
    let res = timed(3, 300, |c| {
        if c.rank() == 2 {
            std::thread::sleep(Duration::from_millis(1200));
        }
        c.all_reduce_slice(&mut vec![1i64; 100_000], ReduceOp::Sum)
    });
    for (k, (r, waited)) in res.into_iter().enumerate() {
        let e = r.expect_err("the group must fail");
        if k == 2 {
            // Arrives after the others cancelled the round.
            assert!(matches!(e, CommError::Aborted { .. }), "{e}");
        } else {
            assert!(
                matches!(e, CommError::Timeout { .. } | CommError::Aborted { .. }),
                "rank {k}: {e}"
            );
            assert!(waited < Duration::from_millis(1000), "rank {k} waited {waited:?}");
        }
    }
}

#[test]
fn disagreements_fail_fast_naming_both_sides() {
    type Call = fn(&CpuComm) -> tessera_parallel::Result<()>;
    let cases: [(&str, Call, &str); 5] = [
        (
            "lengths",
            |c| c.all_reduce_slice(&mut vec![1f32; 10_000 + c.rank()], ReduceOp::Sum),
            "elements",
        ),
        (
            "dtypes",
            |c| {
                if c.rank() == 1 {
                    c.all_reduce_slice(&mut [1f64; 8], ReduceOp::Sum)
                } else {
                    c.all_reduce_slice(&mut [1f32; 8], ReduceOp::Sum)
                }
            },
            "dtype",
        ),
        (
            "operators",
            |c| {
                let op = if c.rank() == 2 {
                    ReduceOp::Avg
                } else {
                    ReduceOp::Sum
                };
                c.all_reduce_slice(&mut [1f32; 8], op)
            },
            "operator",
        ),
        (
            "collectives",
            |c| {
                if c.rank() == 0 {
                    c.all_reduce_slice(&mut [1f32; 8], ReduceOp::Sum)
                } else {
                    c.barrier()
                }
            },
            "barrier",
        ),
        (
            "broadcast roots",
            |c| {
                c.broadcast_slice(&mut [1i64; 4], usize::from(c.rank() == 2))
                    .and_then(|_| c.barrier())
            },
            "root",
        ),
    ];
    for (what, call, word) in cases {
        for (k, (r, waited)) in timed(3, 20_000, call).into_iter().enumerate() {
            let e = r.expect_err(what);
            assert!(
                matches!(
                    e,
                    CommError::Mismatch { .. } | CommError::Aborted { .. } | CommError::PeerClosed { .. }
                ),
                "{what}: rank {k}: {e}"
            );
            assert!(
                waited < Duration::from_secs(3),
                "{what}: rank {k} waited {waited:?}"
            );
            if let CommError::Mismatch { msg, .. } = &e {
                assert!(msg.contains(word), "{what}: rank {k}: {e}");
            }
        }
    }
    // Every rank its own broadcast root: each error names two roots.
    for (k, (r, waited)) in timed(3, 20_000, |c| c.broadcast_slice(&mut [1i64; 4], c.rank()))
        .into_iter()
        .enumerate()
    {
        let e = r.expect_err("roots differ");
        assert!(waited < Duration::from_secs(3), "rank {k} waited {waited:?}");
        if let CommError::Mismatch { rank, peer, msg, .. } = &e {
            assert_eq!(
                msg,
                &format!("root {peer} on rank {peer} vs root {rank} on rank {rank}")
            );
        } else {
            assert!(matches!(e, CommError::Aborted { .. }), "rank {k}: {e}");
        }
    }
}
