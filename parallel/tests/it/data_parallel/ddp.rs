//! DistributedDataParallel on `local` ranks.

use std::time::{Duration, Instant};

use proptest::prelude::*;
use tessera_autograd::Var;
use tessera_nn::{Buffer, Linear, Module};
use tessera_optim::{Optimizer, Sgd, SgdOptions};
use tessera_parallel::{CommConfig, CommError, Communicator, DdpConfig, DistributedDataParallel, LocalGroup};
use tessera_tensor::Tensor;

use super::{assert_close, grad_values, loss, Net};

/// Rows per rank per step.
const B: usize = 2;

fn sgd(params: Vec<tessera_autograd::Parameter>) -> Sgd {
    Sgd::new(
        params,
        SgdOptions {
            lr: 0.125,
            momentum: 0.5,
            ..Default::default()
        },
    )
    .unwrap()
}

/// One process, `steps` steps on the whole batch of `world · B` rows.
fn single_process(world: usize, steps: usize) -> Vec<Vec<f64>> {
    let net = Net::new(7);
    let mut opt = sgd(net.parameters());
    for s in 0..steps {
        let grads = loss(&net, s, 0..world * B).backward().unwrap();
        opt.step(&grads).unwrap();
    }
    net.values()
}

fn cfg(cap: usize) -> DdpConfig {
    DdpConfig {
        bucket_cap_bytes: cap,
        first_bucket_bytes: cap.min(64),
        ..Default::default()
    }
}

/// `world` ranks, each on its `B` rows of every step; rank r starts from a
/// different seed (DDP must broadcast rank 0's weights). Returns each
/// rank's parameters.
fn ddp_run(world: usize, steps: usize, config: DdpConfig) -> Vec<Vec<Vec<f64>>> {
    LocalGroup::run(world, |comm| {
        let ddp = DistributedDataParallel::new(Net::new(7 + 100 * comm.rank() as u64), comm, config.clone())?;
        let mut opt = sgd(ddp.parameters());
        let r = comm.rank();
        for s in 0..steps {
            let grads = ddp.backward(&loss(&ddp, s, r * B..(r + 1) * B))?;
            opt.step(&grads)?;
        }
        Ok::<_, CommError>(ddp.module().values())
    })
    .unwrap()
    .into_iter()
    .map(|r| r.unwrap())
    .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    /// The main oracle: N-rank DDP after k steps equals one process on the
    /// concatenated batch, bitwise for power-of-two N (dyadic data), for
    /// bucket caps from one parameter per bucket to the whole model. (Two
    /// steps at most: the mantissas of dyadic weights grow with every step
    /// and would outgrow f64's 53 bits by the third.)
    #[test]
    fn ddp_equals_one_process_on_the_concatenated_batch(
        world in 1usize..=4,
        cap in prop::sample::select(vec![0usize, 40, 100, 300, 1 << 20]),
        steps in 1usize..=2,
    ) {
        let want = single_process(world, steps);
        let got = ddp_run(world, steps, cfg(cap));
        for (r, g) in got.iter().enumerate() {
            assert_close(g, &want, world.is_power_of_two(), &format!("rank {r} of {world}, cap {cap}"));
            // Every rank ends bitwise equal to rank 0, whatever N.
            assert_close(g, &got[0], true, &format!("rank {r} vs rank 0"));
        }
    }
}

#[test]
fn buckets_follow_the_caps_in_reverse_definition_order() {
    LocalGroup::run(1, |comm| {
        // Parameters (f64): fc1.weight 32 el (256 B), fc1.bias 8 (64 B),
        // fc2.weight 16 (128 B), fc2.bias 2 (16 B).
        let ddp = DistributedDataParallel::new(
            Net::new(1),
            comm,
            DdpConfig {
                first_bucket_bytes: 256,
                bucket_cap_bytes: 150,
                ..Default::default()
            },
        )
        .unwrap();
        let b: Vec<Vec<usize>> = ddp.buckets().iter().map(|b| b.params.clone()).collect();
        // fc1's weight fills the 256-byte first bucket; its bias stays with
        // it (one module), and fc2 takes a bucket of the 150-byte cap.
        assert_eq!(b, vec![vec![2, 3], vec![0, 1]]);
        let grads = ddp.backward(&loss(&ddp, 0, 0..2)).unwrap();
        let stats = ddp.last_step_stats();
        assert_eq!(stats.buckets, 2);
        // Every bucket left from a hook, during backward.
        assert_eq!(stats.launched_during_backward, 2);
        assert_eq!(stats.bytes_reduced, (32 + 8 + 16 + 2) * 8);
        // Gradients are views into the buckets: fc2's two share a storage.
        let p = ddp.parameters();
        assert!(p[2]
            .grad(&grads)
            .unwrap()
            .shares_storage(p[3].grad(&grads).unwrap()));
        assert!(!p[0]
            .grad(&grads)
            .unwrap()
            .shares_storage(p[2].grad(&grads).unwrap()));
    })
    .unwrap();
}

/// `no_sync` over K micro-batches, then one synchronising backward, gives
/// the gradients of one step on the union of all K·N micro-batches times K
/// (the sum of K means), bitwise for N = 2.
#[test]
fn no_sync_accumulation_equals_one_big_batch() {
    const K: usize = 4;
    const N: usize = 2;
    let net = Net::new(3);
    let want: Vec<Vec<f64>> = grad_values(&net, &loss(&net, 0, 0..K * N * B).backward().unwrap())
        .into_iter()
        .map(|g| g.into_iter().map(|v| v * K as f64).collect())
        .collect();
    let got = LocalGroup::run(N, |comm| {
        let ddp = DistributedDataParallel::new(Net::new(3), comm, DdpConfig::default()).unwrap();
        let r = comm.rank();
        // Micro-batch k of rank r: rows of block k·N + r.
        let rows = |k: usize| (k * N + r) * B..(k * N + r + 1) * B;
        {
            let _local = ddp.no_sync();
            for k in 0..K - 1 {
                let local = ddp.backward(&loss(&ddp, 0, rows(k))).unwrap();
                // Under no_sync the local gradients come back unreduced.
                assert_eq!(
                    grad_values(&ddp, &local),
                    grad_values(ddp.module(), &loss(ddp.module(), 0, rows(k)).backward().unwrap())
                );
            }
        }
        let grads = ddp.backward(&loss(&ddp, 0, rows(K - 1))).unwrap();
        grad_values(&ddp, &grads)
    })
    .unwrap();
    for g in &got {
        assert_close(g, &want, true, "no_sync accumulation");
    }
}

#[test]
fn without_overlap_every_bucket_waits_for_backward() {
    let got = LocalGroup::run(2, |comm| {
        let config = DdpConfig {
            overlap: false,
            ..cfg(0)
        };
        let ddp = DistributedDataParallel::new(Net::new(3), comm, config).unwrap();
        let r = comm.rank();
        let grads = ddp.backward(&loss(&ddp, 0, r * B..(r + 1) * B)).unwrap();
        (ddp.last_step_stats(), grad_values(&ddp, &grads))
    })
    .unwrap();
    let with_overlap = ddp_grads(2, cfg(0));
    for (stats, grads) in &got {
        assert_eq!((stats.buckets, stats.launched_during_backward), (2, 0));
        assert_close(grads, &with_overlap, true, "overlap off");
    }
}

/// Rank 0's gradients of one DDP backward over `world` ranks.
fn ddp_grads(world: usize, config: DdpConfig) -> Vec<Vec<f64>> {
    LocalGroup::run(world, |comm| {
        let ddp = DistributedDataParallel::new(Net::new(3), comm, config.clone()).unwrap();
        let r = comm.rank();
        let grads = ddp.backward(&loss(&ddp, 0, r * B..(r + 1) * B)).unwrap();
        grad_values(&ddp, &grads)
    })
    .unwrap()
    .swap_remove(0)
}

#[test]
fn parameters_and_buffers_start_from_rank_0() {
    #[derive(Module)]
    struct WithBuffer {
        fc: Linear,
        stat: Buffer,
    }
    impl Module for WithBuffer {
        fn forward(&self, x: &Var) -> tessera_tensor::Result<Var> {
            self.fc.forward(x)
        }
    }
    let got = LocalGroup::run(3, |comm| {
        let r = comm.rank() as f32;
        let m = WithBuffer {
            fc: Linear::new(2, 2, true).unwrap(),
            stat: Buffer::new(Tensor::from_vec(vec![r, r + 1.0], &[2]).unwrap()),
        };
        m.fc.weight
            .set(Tensor::full(&[2, 2], r as f64, tessera_tensor::DType::F32).unwrap())
            .unwrap();
        let ddp = DistributedDataParallel::new(m, comm, DdpConfig::default()).unwrap();
        let m = ddp.module();
        (
            m.fc.weight.tensor().unwrap().to_vec::<f32>().unwrap(),
            m.stat.tensor().to_vec::<f32>().unwrap(),
        )
    })
    .unwrap();
    for (w, s) in got {
        assert_eq!(w, vec![0.0; 4]);
        assert_eq!(s, vec![0.0, 1.0]);
    }
}

#[test]
fn a_parameter_without_gradient_is_named_unless_find_unused() {
    #[derive(Module)]
    struct Partly {
        used: Linear,
        unused: Linear,
    }
    impl Module for Partly {
        fn forward(&self, x: &Var) -> tessera_tensor::Result<Var> {
            self.used.forward(x)
        }
    }
    let run = |find_unused: bool| {
        LocalGroup::run(2, |comm| {
            let m = Partly {
                used: Linear::new(2, 1, true).unwrap(),
                unused: Linear::new(2, 1, false).unwrap(),
            };
            let config = DdpConfig {
                find_unused_parameters: find_unused,
                ..Default::default()
            };
            let ddp = DistributedDataParallel::new(m, comm, config).unwrap();
            let x = Var::constant(Tensor::ones(&[1, 2], tessera_tensor::DType::F32).unwrap());
            let grads = ddp.backward(&ddp.forward(&x).unwrap().sum(&[], false).unwrap())?;
            Ok::<_, CommError>(
                ddp.module()
                    .unused
                    .weight
                    .grad(&grads)
                    .map(|g| g.to_vec::<f32>().unwrap()),
            )
        })
        .unwrap()
    };
    for r in run(false) {
        let e = r.unwrap_err().to_string();
        assert!(
            e.contains("unused.weight") && e.contains("find_unused_parameters"),
            "{e}"
        );
    }
    for r in run(true) {
        assert_eq!(r.unwrap(), Some(vec![0.0, 0.0]));
    }
}

#[test]
fn ranks_with_different_shapes_are_refused() {
    let got = LocalGroup::run(2, |comm| {
        let m = Linear::new(2, 1 + comm.rank(), true).unwrap();
        DistributedDataParallel::new(m, comm, DdpConfig::default()).map(|_| ())
    })
    .unwrap();
    for r in got {
        let e = r.unwrap_err().to_string();
        assert!(e.contains("ranks [1]"), "{e}");
    }
}

/// A rank that exits mid-training makes every other rank's backward fail
/// promptly (its communicator is gone), not hang.
#[test]
fn a_dead_rank_fails_the_others_within_the_timeout() {
    let timeout = Duration::from_secs(5);
    let config = CommConfig {
        timeout,
        ..Default::default()
    };
    let t0 = Instant::now();
    let got = LocalGroup::run_with(3, config, |comm| {
        let ddp = DistributedDataParallel::new(Net::new(1), comm, cfg(100))?;
        let r = comm.rank();
        ddp.backward(&loss(&ddp, 0, r * B..(r + 1) * B))?;
        if r == 2 {
            return Ok(()); // rank 2 dies: its communicator is dropped
        }
        ddp.backward(&loss(&ddp, 1, r * B..(r + 1) * B)).map(|_| ())
    })
    .unwrap();
    assert!(t0.elapsed() < timeout, "took {:?}", t0.elapsed());
    assert!(got[2].is_ok());
    for r in &got[..2] {
        assert!(r.as_ref().unwrap_err().is_fatal(), "{:?}", r.as_ref().err());
    }
}

/// The same equivalence over `tcp` (two ranks as threads of this process
/// talking through loopback sockets): DDP and ZeRO-2 after two steps equal
/// one process on the concatenated batch, bitwise.
#[test]
fn ddp_and_zero_over_tcp_equal_one_process() {
    use tessera_parallel::tcp::{connect, TcpConfig};
    use tessera_parallel::{ZeroConfig, ZeroOptimizer, ZeroStage};
    const N: usize = 2;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let want = single_process(N, 2);
    let got: Vec<_> = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..N)
            .map(|rank| {
                s.spawn(move || {
                    let comm = connect(&TcpConfig {
                        master_addr: "127.0.0.1".into(),
                        master_port: port,
                        rank,
                        world_size: N,
                        connect_timeout: Duration::from_secs(30),
                        comm: CommConfig::default(),
                    })
                    .unwrap();
                    let rows = |s: usize| (s, rank * B..(rank + 1) * B);
                    let ddp =
                        DistributedDataParallel::new(Net::new(7 + rank as u64), &comm, cfg(100)).unwrap();
                    let mut opt = sgd(ddp.parameters());
                    for step in 0..2 {
                        let (s, r) = rows(step);
                        opt.step(&ddp.backward(&loss(&ddp, s, r)).unwrap()).unwrap();
                    }
                    let net = Net::new(7);
                    let opt = sgd(net.parameters());
                    let mut zero =
                        ZeroOptimizer::new(&opt, &comm, ZeroConfig::stage(ZeroStage::Two)).unwrap();
                    for step in 0..2 {
                        let (s, r) = rows(step);
                        zero.backward(&loss(&net, s, r)).unwrap();
                        zero.step().unwrap();
                    }
                    (ddp.module().values(), net.values())
                })
            })
            .collect();
        ranks.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for (ddp, zero) in &got {
        assert_close(ddp, &want, true, "DDP over tcp");
        assert_close(zero, &want, true, "ZeRO-2 over tcp");
    }
}

/// A model that defines its layers in the reverse of the order it uses
/// them: the static plan launches the bucket of the last gradients first,
/// so the first step's buckets wait for the end of backward; after it the
/// buckets are rebuilt in the observed order (every rank takes rank 0's),
/// and training still equals one process.
#[test]
fn buckets_are_rebuilt_in_the_observed_gradient_order() {
    #[derive(Module)]
    struct Reversed {
        head: Linear,
        body: Linear,
    }
    impl Module for Reversed {
        fn forward(&self, x: &Var) -> tessera_tensor::Result<Var> {
            self.head.forward(&self.body.forward(x)?.relu()?)
        }
    }
    let build = || {
        let net = Net::new(5);
        Reversed {
            head: net.fc2,
            body: net.fc1,
        }
    };
    let single = build();
    let mut opt = sgd(single.parameters());
    for s in 0..2 {
        opt.step(&loss(&single, s, 0..2 * B).backward().unwrap()).unwrap();
    }
    let want: Vec<Vec<f64>> = single
        .parameters()
        .iter()
        .map(|p| p.tensor().unwrap().to_vec::<f64>().unwrap())
        .collect();
    let got = LocalGroup::run(2, |comm| {
        let ddp = DistributedDataParallel::new(build(), comm, cfg(0)).unwrap();
        let mut opt = sgd(ddp.parameters());
        let plan = |ddp: &DistributedDataParallel<'_, Reversed>| -> Vec<Vec<usize>> {
            ddp.buckets().iter().map(|b| b.params.clone()).collect()
        };
        // Definition order head (0, 1), body (2, 3); reversed: body first.
        assert_eq!(plan(&ddp), vec![vec![2, 3], vec![0, 1]]);
        let r = comm.rank();
        let mut plans = Vec::new();
        for s in 0..2 {
            let grads = ddp.backward(&loss(&ddp, s, r * B..(r + 1) * B)).unwrap();
            opt.step(&grads).unwrap();
            plans.push(plan(&ddp));
        }
        let values: Vec<Vec<f64>> = ddp
            .parameters()
            .iter()
            .map(|p| p.tensor().unwrap().to_vec::<f64>().unwrap())
            .collect();
        (plans, values)
    })
    .unwrap();
    for (plans, values) in got {
        // The head's gradients arrive first: its bucket now leaves first.
        for p in &plans {
            assert_eq!(
                p.iter().map(|b| b[0].min(b[b.len() - 1])).collect::<Vec<_>>(),
                vec![0, 2]
            );
        }
        assert_eq!(plans[0], plans[1], "rebuilt once");
        assert_close(&values, &want, true, "after the rebuild");
    }
}
