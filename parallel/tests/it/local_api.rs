//! The `local` backend's errors, point-to-point, tensor forms and sub-groups.

use std::time::{Duration, Instant};

use tessera_parallel::{CommConfig, CommError, CommExt, Communicator, LocalGroup, ReduceOp};
use tessera_tensor::{DType, Tensor};

fn short(timeout_ms: u64) -> CommConfig {
    CommConfig {
        timeout: Duration::from_millis(timeout_ms),
        ..CommConfig::default()
    }
}

fn group_failure(e: &CommError) -> bool {
    matches!(
        e,
        CommError::PeerClosed { .. }
            | CommError::Aborted { .. }
            | CommError::Timeout { .. }
            | CommError::Mismatch { .. }
    )
}

#[test]
fn a_rank_that_exits_mid_all_reduce_fails_the_others() {
    for n in [2, 4] {
        let res = LocalGroup::run_with(n, short(2000), |c| {
            let mut buf = vec![1.0f32; 1 << 20];
            if c.rank() == n - 1 {
                return c
                    .all_reduce_slice(&mut buf, ReduceOp::Sum)
                    .map(|_| Duration::ZERO);
            }
            let t = Instant::now();
            loop {
                c.all_reduce_slice(&mut buf, ReduceOp::Sum)?;
                if t.elapsed() > Duration::from_secs(5) {
                    return Ok(t.elapsed());
                }
            }
        })
        .unwrap();
        assert!(res[n - 1].is_ok());
        for r in &res[..n - 1] {
            let e = r.as_ref().unwrap_err();
            assert!(group_failure(e), "{e}");
        }
    }
}

#[test]
fn a_stalled_rank_makes_everyone_fail_within_the_timeout() {
    let res = LocalGroup::run_with(3, short(300), |c| {
        let mut buf = vec![1.0f64; 1000];
        if c.rank() == 1 {
            std::thread::sleep(Duration::from_millis(1500));
        }
        let t = Instant::now();
        let r = c.all_reduce_slice(&mut buf, ReduceOp::Sum);
        (r, t.elapsed())
    })
    .unwrap();
    for (k, (r, waited)) in res.into_iter().enumerate() {
        let e = r.expect_err("the group must fail");
        assert!(group_failure(&e), "rank {k}: {e}");
        if k != 1 {
            assert!(waited < Duration::from_millis(1200), "rank {k} waited {waited:?}");
        }
    }
}

#[test]
fn ranks_that_disagree_get_errors_naming_the_call() {
    type Call = fn(&tessera_parallel::CpuComm) -> tessera_parallel::Result<()>;
    let cases: [(&str, Call); 5] = [
        ("lengths", |c| {
            c.all_reduce_slice(&mut vec![1f32; 10 + c.rank()], ReduceOp::Sum)
        }),
        ("dtypes", |c| {
            if c.rank() == 0 {
                c.all_reduce_slice(&mut [1f32; 8], ReduceOp::Sum)
            } else {
                c.all_reduce_slice(&mut [1f64; 8], ReduceOp::Sum)
            }
        }),
        ("collectives", |c| {
            if c.rank() == 0 {
                c.all_reduce_slice(&mut [1f32; 8], ReduceOp::Sum)
            } else {
                c.broadcast_slice(&mut [1f32; 8], 0)
            }
        }),
        ("operators", |c| {
            c.all_reduce_slice(
                &mut [1i64; 4],
                if c.rank() == 0 {
                    ReduceOp::Max
                } else {
                    ReduceOp::Min
                },
            )
        }),
        ("roots", |c| {
            c.reduce_slice(&mut [1i64; 4], ReduceOp::Sum, c.rank())
        }),
    ];
    for (what, call) in cases {
        let res = LocalGroup::run_with(3, short(5000), |c| {
            let t = Instant::now();
            (call(c), t.elapsed())
        })
        .unwrap();
        for (k, (r, waited)) in res.into_iter().enumerate() {
            let e = r.expect_err(what);
            assert!(group_failure(&e), "{what}: rank {k}: {e}");
            assert!(
                waited < Duration::from_secs(2),
                "{what}: rank {k} waited {waited:?}"
            );
            let text = e.to_string();
            assert!(
                ["all_reduce", "broadcast", "reduce"]
                    .iter()
                    .any(|op| text.contains(op)),
                "{what}: {text}"
            );
        }
    }
    // Every rank a broadcast root: nobody receives, yet the ranks compare
    // their calls on entry and fail at once.
    let res = LocalGroup::run_with(3, short(5000), |c| {
        let t = Instant::now();
        (c.broadcast_slice(&mut [1i64; 4], c.rank()), t.elapsed())
    })
    .unwrap();
    for (r, waited) in res {
        assert!(
            matches!(r, Err(CommError::Mismatch { .. } | CommError::Aborted { .. })),
            "{r:?}"
        );
        assert!(waited < Duration::from_secs(2), "waited {waited:?}");
    }
}

#[test]
fn invalid_arguments_are_errors() {
    let res = LocalGroup::run_with(2, short(2000), |c| {
        let mut errs = vec![
            c.broadcast_slice(&mut [0f32; 3], 2).unwrap_err(),
            c.send_slice(&[1f32], 5, 0).unwrap_err(),
            c.send_slice(&[1f32], c.rank(), 0).unwrap_err(),
        ];
        let mut out = [0f32; 3];
        errs.push(
            c.reduce_scatter_slice(&[0f32; 5], &mut out, ReduceOp::Sum)
                .unwrap_err(),
        );
        errs
    })
    .unwrap();
    for errs in res {
        assert!(
            errs.iter()
                .all(|e| matches!(e, CommError::Arg { .. } | CommError::Aborted { .. })),
            "{errs:?}"
        );
        assert!(
            errs[0].to_string().contains("root 2 is outside the group of 2"),
            "{}",
            errs[0]
        );
        assert!(errs[1].to_string().contains("rank 5 is outside"), "{}", errs[1]);
    }
}

#[test]
fn point_to_point_slices_bytes_and_tensors() {
    let res = LocalGroup::run_with(3, short(2000), |c| {
        let (n, r) = (c.world_size(), c.rank());
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        // Any dtype and layout: a transposed view of a u8 tensor.
        let t = Tensor::from_vec((0..6u8).map(|i| i + r as u8).collect::<Vec<_>>(), &[2, 3])?.t()?;
        c.send_tensor(&t, next, 1)?;
        c.send_slice(&[r as f64, 0.5], next, 2)?;
        c.send_bytes(&[r as u8; 3], next, 3)?;
        // Tags match out of order.
        let bytes = c.recv_bytes(prev, 3)?;
        let mut s = [0f64; 2];
        c.recv_slice(&mut s, prev, 2)?;
        let got = c.recv_tensor(prev, 1)?;
        assert_eq!(bytes, vec![prev as u8; 3]);
        assert_eq!(s, [prev as f64, 0.5]);
        assert_eq!(got.shape(), &[3, 2]);
        assert_eq!(got.dtype(), DType::U8);
        let want = Tensor::from_vec((0..6u8).map(|i| i + prev as u8).collect::<Vec<_>>(), &[2, 3])?
            .t()?
            .contiguous()
            .unwrap();
        assert_eq!(got.to_vec::<u8>()?, want.to_vec::<u8>()?);
        // A count mismatch is an error, and so is a wait past the timeout.
        c.send_slice(&[1f32; 4], next, 4)?;
        let mut wrong = [0f32; 5];
        let e = c.recv_slice(&mut wrong, prev, 4).unwrap_err();
        assert!(matches!(e, CommError::Mismatch { .. }), "{e}");
        let e = c.recv_bytes(prev, 99).unwrap_err();
        assert!(matches!(e, CommError::Timeout { .. }), "{e}");
        c.barrier()
    })
    .unwrap();
    for r in res {
        r.unwrap();
    }
}

#[test]
fn tensor_collectives_keep_shapes() {
    let res = LocalGroup::run(2, |c| {
        let r = c.rank() as f32;
        let t = Tensor::from_vec(vec![r, r + 1.0, r + 2.0, r + 3.0], &[2, 2])?;
        let sum = c.all_reduce(&t.t()?, ReduceOp::Sum)?;
        let gathered = c.all_gather(&t)?;
        let scattered = c.reduce_scatter(&t, ReduceOp::Max)?;
        let swapped = c.all_to_all(&t)?;
        let bcast = c.broadcast(&Tensor::scalar(r as i64), 1)?;
        let reduced = c.reduce(&t, ReduceOp::Sum, 0)?;
        let err = c
            .all_reduce(&Tensor::from_vec(vec![1u8], &[1])?, ReduceOp::Sum)
            .unwrap_err();
        Ok::<_, CommError>((sum, gathered, scattered, swapped, bcast, reduced, err))
    })
    .unwrap();
    for (k, r) in res.into_iter().enumerate() {
        let (sum, gathered, scattered, swapped, bcast, reduced, err) = r.unwrap();
        assert_eq!(sum.shape(), &[2, 2]);
        assert_eq!(sum.to_vec::<f32>().unwrap(), vec![1.0, 5.0, 3.0, 7.0]);
        assert_eq!(gathered.shape(), &[4, 2]);
        assert_eq!(
            gathered.to_vec::<f32>().unwrap(),
            vec![0.0, 1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 4.0]
        );
        assert_eq!(scattered.shape(), &[1, 2]);
        assert_eq!(
            scattered.to_vec::<f32>().unwrap(),
            if k == 0 { vec![1.0, 2.0] } else { vec![3.0, 4.0] }
        );
        let want_swap = if k == 0 {
            vec![0.0, 1.0, 1.0, 2.0]
        } else {
            vec![2.0, 3.0, 3.0, 4.0]
        };
        assert_eq!(swapped.to_vec::<f32>().unwrap(), want_swap);
        assert_eq!(bcast.to_scalar::<i64>().unwrap(), 1);
        let want_reduce = if k == 0 {
            vec![1.0, 3.0, 5.0, 7.0]
        } else {
            vec![1.0, 2.0, 3.0, 4.0]
        };
        assert_eq!(reduced.to_vec::<f32>().unwrap(), want_reduce);
        assert!(matches!(err, CommError::Arg { .. }), "{err}");
    }
}

#[test]
fn split_makes_independent_sub_groups() {
    let res = LocalGroup::run(6, |c| {
        let r = c.rank();
        // Rows and columns of a 2 × 3 grid, keys reversing the column order.
        let row = c.split(Some((r / 3) as u32), -(r as i64))?.expect("member");
        let col = c.split(Some((r % 3) as u32), r as i64)?.expect("member");
        let none = c.split(None, 0)?;
        let mut a = [r as i64];
        row.all_reduce_slice(&mut a, ReduceOp::Sum)?;
        let mut b = [r as i64];
        col.all_reduce_slice(&mut b, ReduceOp::Sum)?;
        let mut g = [0i64; 3];
        row.all_gather_slice(&[r as i64], &mut g)?;
        Ok::<_, CommError>((a[0], b[0], g, row.rank(), col.rank(), none.is_none()))
    })
    .unwrap();
    for (r, x) in res.into_iter().enumerate() {
        let (a, b, g, row_rank, col_rank, none) = x.unwrap();
        let base = (r / 3 * 3) as i64;
        assert_eq!(a, 3 * base + 3);
        assert_eq!(b, (r % 3) as i64 * 2 + 3);
        assert_eq!(g, [base + 2, base + 1, base]);
        assert_eq!(row_rank, 2 - r % 3);
        assert_eq!(col_rank, r / 3);
        assert!(none);
    }
}

#[test]
fn run_reports_bad_sizes_and_panics() {
    assert!(LocalGroup::run(0, |_| ()).is_err());
    let res = LocalGroup::run_with(2, short(1000), |c| {
        if c.rank() == 1 {
            panic!("rank 1 fails");
        }
        c.all_reduce_slice(&mut [1f32; 4], ReduceOp::Sum)
    });
    let e = res.expect_err("a panicking rank is an error");
    assert!(e.to_string().contains("rank 1 panicked"), "{e}");
}

#[test]
fn a_timeout_of_duration_max_means_forever() {
    // Deadlines used to be `Instant::now() + timeout`, which panics
    // ("overflow when adding duration to instant") for Duration::MAX.
    let cfg = CommConfig {
        timeout: Duration::MAX,
        ..CommConfig::default()
    };
    let res = LocalGroup::run_with(3, cfg, |c| {
        let mut x = [c.rank() as f64; 5];
        c.all_reduce_slice(&mut x, ReduceOp::Sum)?;
        c.barrier()?;
        Ok::<f64, CommError>(x[0])
    })
    .unwrap();
    for r in res {
        assert_eq!(r.unwrap(), 3.0);
    }
}
