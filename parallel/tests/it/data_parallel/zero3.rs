//! ZeRO stage 3 on `local` ranks, checked against one process.

use std::sync::Arc;
use tessera_autograd::{Parameter, Var};
use tessera_nn::{Linear, Module};
use tessera_optim::{Adam, AdamOptions, Optimizer, Sgd, SgdOptions};
use tessera_parallel::zero::{comm_model, consolidate_zero3_sharded, memory_model_with};
use tessera_parallel::{
    CommError, Communicator, DdpConfig, DistributedDataParallel, LocalGroup, Zero3, Zero3Config, ZeroStage,
};

use tessera_parallel::tensor_parallel::TrafficMeter;
use tessera_tensor::{DType, Tensor};

use super::{assert_close, loss, Net, HIDDEN};

/// Rows per rank per step.
const B: usize = 2;

fn optimizer(adam: bool, params: Vec<Parameter>) -> Box<dyn Optimizer> {
    if adam {
        Box::new(
            Adam::new(
                params,
                AdamOptions {
                    lr: 0.125,
                    ..Default::default()
                },
            )
            .unwrap(),
        )
    } else {
        Box::new(
            Sgd::new(
                params,
                SgdOptions {
                    lr: 0.125,
                    momentum: 0.5,
                    weight_decay: 0.25,
                    ..Default::default()
                },
            )
            .unwrap(),
        )
    }
}

fn single_process(world: usize, steps: usize, adam: bool) -> (Vec<Vec<f64>>, tessera_tensor::StateDict) {
    let net = Net::new(11);
    let mut opt = optimizer(adam, net.parameters());
    for s in 0..steps {
        opt.step(&loss(&net, s, 0..world * B).backward().unwrap())
            .unwrap();
    }
    (net.values(), net.state_dict())
}

/// Every parameter released between uses (the test models are far below
/// DeepSpeed's persistence threshold), with or without prefetching.
fn released(prefetch: bool) -> Zero3Config {
    Zero3Config {
        param_persistence_threshold: 0,
        prefetch,
    }
}

/// The settings the equivalence runs over: every parameter released, with
/// and without prefetching; the biases persistent and the weights
/// released (units of both kinds); DeepSpeed's defaults (everything
/// persistent here).
fn configs() -> Vec<Zero3Config> {
    vec![
        released(true),
        released(false),
        Zero3Config {
            param_persistence_threshold: HIDDEN,
            prefetch: true,
        },
        Zero3Config::default(),
    ]
}

/// N-rank ZeRO-3 after k steps equals one process on the concatenated
/// batch, for N = 1..4, SGD and Adam, 1 to 3 steps, under every setting of
/// [`configs`]: bitwise for
/// power-of-two N while the sums are exact (two SGD steps on dyadic data;
/// Adam's first step), else within the reduction-order tolerance. Every rank ends with the same parameters, and
/// the consolidated state dict equals the single process's and loads into
/// the model on one process.
#[test]
fn zero3_equals_one_process_on_the_concatenated_batch() {
    for world in 1..=4 {
        for adam in [false, true] {
            for steps in 1..=3 {
                for config in configs() {
                    let (want, want_sd) = single_process(world, steps, adam);
                    let got = LocalGroup::run(world, |comm| {
                        let net = Net::new(11 + 100 * comm.rank() as u64);
                        let opt = optimizer(adam, net.parameters());
                        let mut zero = Zero3::with_config(&net, opt.as_ref(), comm, config.clone())?;
                        let r = comm.rank();
                        for s in 0..steps {
                            zero.backward(&loss(&net, s, r * B..(r + 1) * B))?;
                            zero.step()?;
                        }
                        let sd = zero.consolidated_model_state_dict()?;
                        Ok::<_, CommError>((net.values(), sd))
                    })
                    .unwrap();
                    for (r, g) in got.into_iter().enumerate() {
                        let (values, sd) = g.unwrap();
                        let what = format!("rank {r} of {world}, adam {adam}, {steps} steps, {config:?}");
                        let exact = world.is_power_of_two() && steps <= if adam { 1 } else { 2 };
                        assert_close(&values, &want, exact, &what);
                        let gathered: Vec<Vec<f64>> = want_sd
                            .keys()
                            .map(|k| sd.tensor(k).unwrap().to_vec::<f64>().unwrap())
                            .collect();
                        assert_close(&gathered, &want, exact, &format!("{what}: consolidated"));
                        let one = Net::new(0);
                        one.load_state_dict(&sd, true).unwrap();
                        assert_close(&one.values(), &values, true, &format!("{what}: loaded"));
                    }
                }
            }
        }
    }
}

/// DeepSpeed's `TestZero3ParamPartitioningBase` layout: a 15-element
/// parameter over 2 ranks is split 8 + 7 (rank 1 zero-padded to 8), and
/// for any N the ranks' ranges cover every parameter exactly once.
#[test]
fn partitions_cover_the_parameters_exactly_once() {
    for world in 1..=4 {
        let got = LocalGroup::run(world, |comm| {
            let m = Linear::new(5, 3, true).unwrap();
            let opt = optimizer(false, m.parameters());
            let zero = Zero3::new(&m, opt.as_ref(), comm).unwrap();
            ["weight", "bias"].map(|n| zero.partition(n).unwrap())
        })
        .unwrap();
        for (k, numel) in [15usize, 3].into_iter().enumerate() {
            let mut covered = vec![0u8; numel];
            for ranges in &got {
                let (lo, hi, ps) = ranges[k];
                assert_eq!(ps, numel.div_ceil(world));
                covered[lo..hi].iter_mut().for_each(|c| *c += 1);
            }
            assert!(covered.iter().all(|&c| c == 1), "N = {world}: {covered:?}");
        }
        if world == 2 {
            assert_eq!(got[0][0], (0, 8, 8));
            assert_eq!(got[1][0], (8, 15, 8));
        }
    }
}

/// A stack of `DEPTH` Linear layers of `W × W` (with bias), f32 unless
/// made by [`Deep::new_in`].
#[derive(Module)]
struct Deep {
    layers: Vec<Linear>,
}

const W: usize = 64;
const DEPTH: usize = 6;

impl Module for Deep {
    fn forward(&self, x: &Var) -> tessera_tensor::Result<Var> {
        let mut h = x.clone();
        for l in &self.layers {
            h = l.forward(&h)?.relu()?;
        }
        Ok(h)
    }
}

impl Deep {
    fn new() -> Deep {
        Deep::new_in(DType::F32)
    }

    fn new_in(dtype: DType) -> Deep {
        let cast = |p: &Parameter| Parameter::new(p.tensor().unwrap().to_dtype(dtype).unwrap());
        let layer = || {
            let l = Linear::new(W, W, true).unwrap();
            Linear {
                weight: cast(&l.weight),
                bias: l.bias.as_ref().map(cast),
            }
        };
        Deep {
            layers: (0..DEPTH).map(|_| layer()).collect(),
        }
    }
}

fn deep_loss(m: &Deep, rank: usize) -> Var {
    let dtype = m.layers[0].weight.dtype();
    let x = Tensor::full(&[2, W], 0.01 * (rank + 1) as f64, dtype).unwrap();
    m.forward(&Var::constant(x))
        .unwrap()
        .square()
        .unwrap()
        .mean(&[], false)
        .unwrap()
}

/// Waits up to 20 s for `done`; false if it never came.
fn eventually(done: impl Fn() -> bool) -> bool {
    let t0 = std::time::Instant::now();
    while !done() {
        if t0.elapsed() > std::time::Duration::from_secs(20) {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    true
}

/// Prefetching overlaps communication with compute: from the second step
/// on, once layer i has read its parameters and while it computes, the
/// all-gather of layer i + 1 is issued on the communication thread
/// although nobody has read layer i + 1's parameters yet; the gathered
/// values are the ones it then uses (the loss equals the first step's
/// loss recomputed without prefetching). Without prefetching, a layer's
/// gather is issued only when it is read. Collectives are counted by a
/// [`TrafficMeter`] under the coordinator (it wraps `split` too).
#[test]
fn zero3_prefetches_the_next_layer_while_the_current_one_computes() {
    let mut losses = Vec::new();
    for prefetch in [true, false] {
        let got = LocalGroup::run(2, |comm| {
            let dup = comm.split(Some(0), comm.rank() as i64).unwrap().unwrap();
            let meter = TrafficMeter::new(Arc::from(dup));
            let m = Deep::new();
            let opt = Sgd::new(m.parameters(), SgdOptions::default()).unwrap();
            let mut zero = Zero3::with_config(&m, &opt, &meter, released(prefetch)).unwrap();
            // The first step records the order the layers are read in.
            zero.backward(&deep_loss(&m, comm.rank())).unwrap();
            zero.step().unwrap();
            meter.reset();
            let x = Tensor::full(&[2, W], 0.01, DType::F32).unwrap();
            let mut h = Var::constant(x);
            for (i, l) in m.layers.iter().enumerate() {
                h = l.forward(&h).unwrap().relu().unwrap();
                let read = i as u64 + 1;
                if prefetch && i + 1 < DEPTH {
                    assert!(
                        eventually(|| meter.collectives() > read),
                        "prefetch {prefetch}: the gather of layer {} was not issued while layer {i} computed",
                        i + 1
                    );
                }
                let ahead = u64::from(prefetch && i + 1 < DEPTH);
                assert_eq!(
                    meter.collectives(),
                    read + ahead,
                    "prefetch {prefetch}, after layer {i}"
                );
            }
            h.sum(&[], false).unwrap().tensor().to_scalar::<f32>().unwrap()
        })
        .unwrap();
        losses.push(got);
    }
    assert_eq!(losses[0], losses[1], "prefetched values differ");
}

/// Parameters at or under the persistence threshold (the biases) stay
/// gathered: never released, and after each step equal to the stepped
/// values (those of the consolidated state dict); the weights are
/// released between uses. The elements communicated per step are 3Ψ of
/// the released parameters and 2Ψ of the persistent ones (one gather after
/// the step instead of two per step), and the bytes held count the
/// persistent parameters in full beside every shard.
#[test]
fn small_parameters_persist_and_cost_one_gather_per_step() {
    const N: usize = 4;
    LocalGroup::run(N, |comm| {
        let m = Deep::new();
        let opt = Adam::new(m.parameters(), AdamOptions::default()).unwrap();
        let config = Zero3Config {
            param_persistence_threshold: W,
            prefetch: true,
        };
        let mut zero = Zero3::with_config(&m, &opt, comm, config).unwrap();
        for _ in 0..2 {
            zero.backward(&deep_loss(&m, comm.rank())).unwrap();
            zero.step().unwrap();
            for l in &m.layers {
                assert!(l.weight.is_released());
                assert!(!l.bias.as_ref().unwrap().is_released());
            }
        }
        let (np, p) = (DEPTH * W * W, DEPTH * W);
        assert_eq!(zero.comm_elements(), 3 * np + 2 * p);
        let mem = zero.memory();
        assert_eq!(mem.params, ((np + p) / N + p) * 4, "{mem:?}");
        let sd = zero.consolidated_model_state_dict().unwrap();
        for (i, l) in m.layers.iter().enumerate() {
            let bias = l.bias.as_ref().unwrap().current().to_vec::<f32>().unwrap();
            let stepped = sd
                .tensor(&format!("layers.{i}.bias"))
                .unwrap()
                .to_vec::<f32>()
                .unwrap();
            assert_eq!(bias, stepped, "layer {i}");
        }
    })
    .unwrap();
}

/// With Adam over N = 4 ranks: the bytes a rank holds are within 5% of
/// the paper's `(4 + 4 + 12)Ψ/N` (f32 parameters and gradients, K = 12);
/// the elements communicated per step within 1% of 3Ψ, 1.5× DDP's
/// all-reduce measured on the same model; and the gathered parameter
/// values live at once, measured through the allocator, stay at two
/// modules' worth (the one in use and the prefetched one), a third of the
/// model, in forward and backward. Prints the bench lines.
#[test]
fn zero3_bytes_communication_and_peak_follow_the_models() {
    const N: usize = 4;
    let got = LocalGroup::run(N, |comm| {
        let m = Deep::new();
        let psi = m.num_parameters();
        let opt = Adam::new(m.parameters(), AdamOptions::default()).unwrap();
        let mut zero = Zero3::with_config(&m, &opt, comm, released(true)).unwrap();
        zero.backward(&deep_loss(&m, comm.rank())).unwrap();
        zero.step().unwrap();
        zero.reset_gathered_peak();
        zero.backward(&deep_loss(&m, comm.rank())).unwrap();
        let peak = zero.gathered_peak_bytes();
        let mem = zero.memory();
        zero.step().unwrap();
        (psi, mem, zero.comm_elements(), peak)
    })
    .unwrap();
    let ddp = LocalGroup::run(N, |comm| {
        let ddp = DistributedDataParallel::new(Deep::new(), comm, DdpConfig::default()).unwrap();
        let x = Var::constant(Tensor::full(&[2, W], 0.01, DType::F32).unwrap());
        ddp.backward(
            &ddp.forward(&x)
                .unwrap()
                .square()
                .unwrap()
                .mean(&[], false)
                .unwrap(),
        )
        .unwrap();
        // An all-reduce sends 2Ψ per rank (reduce-scatter + all-gather).
        2 * ddp.last_step_stats().bytes_reduced / 4
    })
    .unwrap();
    let layer_bytes = (W * W + W) * 4;
    for (rank, (psi, mem, comm_elements, peak)) in got.into_iter().enumerate() {
        let model = memory_model_with(ZeroStage::Three, psi as f64, N as f64, 4.0, 4.0, 12.0);
        let ratio = mem.total() as f64 / model;
        assert!((ratio - 1.0).abs() < 0.05, "measured {mem:?} vs model {model}");
        let c = comm_elements as f64 / comm_model(ZeroStage::Three, psi as f64);
        assert!(
            (c - 1.0).abs() < 0.01,
            "{comm_elements} elements vs 3Ψ = {}",
            3 * psi
        );
        let over_ddp = comm_elements as f64 / ddp[rank] as f64;
        assert!(
            (over_ddp - 1.5).abs() < 0.015,
            "{comm_elements} vs DDP {}",
            ddp[rank]
        );
        assert!(peak >= layer_bytes, "a layer is gathered at some point: {peak}");
        assert!(
            peak <= 2 * layer_bytes,
            "gathered values were not freed: peak {peak} bytes, a layer is {layer_bytes}, the model {}",
            psi * 4
        );
        if rank == 0 {
            println!("bench\tzero3_n4\ttessera\tbytes_measured_over_model\t{ratio:.4}\tratio");
            println!("bench\tzero3_n4\ttessera\tcomm_over_ddp\t{over_ddp:.4}\tratio");
            println!(
                "bench\tzero3_n4\ttessera\tgathered_peak_over_model\t{:.4}\tratio",
                peak as f64 / (psi * 4) as f64
            );
        }
    }
}

/// With bf16 parameters (f32 master shards and Adam state) the bytes a
/// rank holds follow the mixed-precision layout `(2 + 2 + 12)Ψ/N` within
/// 5%, and the elements communicated per step are still 3Ψ.
#[test]
fn zero3_bf16_bytes_follow_the_mixed_precision_layout() {
    const N: usize = 4;
    LocalGroup::run(N, |comm| {
        let m = Deep::new_in(DType::BF16);
        let psi = m.num_parameters();
        let opt = Adam::new(m.parameters(), AdamOptions::default()).unwrap();
        let mut zero = Zero3::with_config(&m, &opt, comm, released(true)).unwrap();
        zero.backward(&deep_loss(&m, comm.rank())).unwrap();
        zero.step().unwrap();
        zero.backward(&deep_loss(&m, comm.rank())).unwrap();
        let mem = zero.memory();
        zero.step().unwrap();
        let model = memory_model_with(ZeroStage::Three, psi as f64, N as f64, 2.0, 2.0, 12.0);
        let ratio = mem.total() as f64 / model;
        assert!((ratio - 1.0).abs() < 0.05, "measured {mem:?} vs model {model}");
        assert_eq!(zero.comm_elements(), 3 * psi);
    })
    .unwrap();
}

/// Global-norm clipping over the shards equals `clip_grad_norm` on one
/// process.
#[test]
fn clipping_across_shards_equals_one_process() {
    let net = Net::new(5);
    let mut opt = optimizer(false, net.parameters());
    let mut grads = loss(&net, 0, 0..3 * B).backward().unwrap();
    let want_norm = tessera_optim::clip_grad_norm(&mut grads, 0.25, 2.0).unwrap();
    opt.step(&grads).unwrap();
    let want = net.values();
    let got = LocalGroup::run(3, |comm| {
        let net = Net::new(5);
        let opt = optimizer(false, net.parameters());
        let mut zero = Zero3::with_config(&net, opt.as_ref(), comm, released(true)).unwrap();
        let r = comm.rank();
        zero.backward(&loss(&net, 0, r * B..(r + 1) * B)).unwrap();
        let norm = zero.clip_grad_norm(0.25).unwrap();
        zero.step().unwrap();
        (norm, net.values())
    })
    .unwrap();
    for (norm, values) in got {
        assert!(
            (norm - want_norm).abs() < 1e-12 * want_norm,
            "{norm} vs {want_norm}"
        );
        assert_close(&values, &want, false, "clipped");
    }
}

/// A rank that exits mid-training makes the others' next forward or
/// backward fail within the timeout, with the communicator's error.
#[test]
fn a_dead_rank_fails_the_other_zero3_ranks() {
    let config = tessera_parallel::CommConfig {
        timeout: std::time::Duration::from_secs(5),
        ..Default::default()
    };
    let t0 = std::time::Instant::now();
    let got = LocalGroup::run_with(3, config, |comm| {
        let net = Net::new(11);
        let opt = optimizer(false, net.parameters());
        let mut zero = Zero3::with_config(&net, opt.as_ref(), comm, released(true))?;
        let r = comm.rank();
        zero.backward(&loss(&net, 0, r * B..(r + 1) * B))?;
        zero.step()?;
        if r == 1 {
            return Ok(());
        }
        let (x, t) = super::batch(1, r * B..(r + 1) * B);
        let y = match net.forward(&x) {
            Ok(y) => y,
            Err(e) => {
                // The forward's own error names the failed gather, not a
                // shape error on the released parameter.
                assert!(
                    e.to_string().contains("Zero3::fetch")
                        && e.to_string().contains("gathering the parameters failed"),
                    "{e}"
                );
                return Err(zero.error().expect("the forward failed because a gather did"));
            }
        };
        zero.backward(&y.mse_loss(&t, tessera_autograd::Reduction::Mean).unwrap())
    })
    .unwrap();
    assert!(
        t0.elapsed() < std::time::Duration::from_secs(5),
        "took {:?}",
        t0.elapsed()
    );
    assert!(got[1].is_ok());
    for r in [0, 2] {
        assert!(got[r].as_ref().unwrap_err().is_fatal(), "{:?}", got[r]);
    }
}

/// A sharded checkpoint resumes on the same world size to the bits of an
/// uninterrupted run (Adam, so the moments must come back too), and is
/// refused at another world size.
#[test]
fn zero3_sharded_checkpoints_resume_on_the_same_world_size() {
    let dir = std::env::temp_dir().join(format!("tessera-zero3-shards-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let train = |r: usize, zero: &mut Zero3, net: &Net, steps: std::ops::Range<usize>| {
        for s in steps {
            zero.backward(&loss(net, s, r * B..(r + 1) * B)).unwrap();
            zero.step().unwrap();
        }
    };
    // Persistent parameters (the defaults, here every one) must take the
    // checkpoint's values on loading, released ones are gathered from it.
    for config in [released(true), Zero3Config::default()] {
        let got = LocalGroup::run(2, |comm| {
            let r = comm.rank();
            let net = Net::new(11);
            let opt = optimizer(true, net.parameters());
            let mut zero = Zero3::with_config(&net, opt.as_ref(), comm, config.clone()).unwrap();
            train(r, &mut zero, &net, 0..2);
            zero.save_sharded(&dir).unwrap();
            train(r, &mut zero, &net, 2..4);
            let uninterrupted = net.values();

            let again = Net::new(0);
            let opt = optimizer(true, again.parameters());
            let mut resumed = Zero3::with_config(&again, opt.as_ref(), comm, config.clone()).unwrap();
            resumed.load_sharded(&dir).unwrap();
            train(r, &mut resumed, &again, 2..4);
            (uninterrupted, again.values())
        })
        .unwrap();
        for (uninterrupted, resumed) in &got {
            assert_close(
                resumed,
                uninterrupted,
                true,
                &format!("resumed from shards, {config:?}"),
            );
        }
    }
    let refused = LocalGroup::run(4, |comm| {
        let net = Net::new(11);
        let opt = optimizer(true, net.parameters());
        let mut zero = Zero3::new(&net, opt.as_ref(), comm).unwrap();
        zero.load_sharded(&dir).unwrap_err().to_string()
    })
    .unwrap();
    for e in refused {
        assert!(e.contains("2 ranks") && e.contains("has 4"), "{e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A sharded checkpoint consolidated by one process equals the state
/// gathered from the running job, and resumes on other world sizes (1 and
/// 4 ranks, each taking its share of the same 4-row global batch) as the
/// uninterrupted 2-rank run continues (Adam: masters and moments come back
/// too), within the reduction-order tolerance; a model with other
/// parameters is refused.
#[test]
fn zero3_consolidated_state_resumes_on_any_world_size() {
    const ROWS: usize = 4;
    let dir = std::env::temp_dir().join(format!("tessera-zero3-consolidate-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let train = |comm: &dyn Communicator, zero: &mut Zero3, net: &Net, steps: std::ops::Range<usize>| {
        let (r, n) = (comm.rank(), comm.world_size());
        for s in steps {
            zero.backward(&loss(net, s, r * ROWS / n..(r + 1) * ROWS / n))
                .unwrap();
            zero.step().unwrap();
        }
    };
    let got = LocalGroup::run(2, |comm| {
        let net = Net::new(11);
        let opt = optimizer(true, net.parameters());
        let mut zero = Zero3::with_config(&net, opt.as_ref(), comm, released(true)).unwrap();
        train(comm, &mut zero, &net, 0..2);
        zero.save_sharded(&dir).unwrap();
        let online = zero.consolidated_state_dict().unwrap();
        train(comm, &mut zero, &net, 2..4);
        (net.values(), online)
    })
    .unwrap();
    let offline = consolidate_zero3_sharded(&dir).unwrap();
    let (uninterrupted, online) = &got[0];
    assert_eq!(offline.len(), online.len());
    for (key, t) in online.iter() {
        let o = offline
            .tensor(key)
            .unwrap_or_else(|| panic!("offline lacks {key}"));
        assert_eq!(o.shape(), t.shape(), "{key}");
        assert_eq!(o.to_vec::<f64>().unwrap(), t.to_vec::<f64>().unwrap(), "{key}");
    }
    assert!(offline.contains("optimizer.fc1.weight.exp_avg_sq"));
    assert!(offline.contains("master.fc2.bias"));
    for n in [2, 1, 4] {
        let resumed = LocalGroup::run(n, |comm| {
            let net = Net::new(0);
            let opt = optimizer(true, net.parameters());
            let mut zero = Zero3::with_config(&net, opt.as_ref(), comm, released(true)).unwrap();
            zero.load_consolidated(&offline).unwrap();
            let back = zero.consolidated_state_dict().unwrap();
            for (key, t) in offline.iter() {
                let b = back
                    .tensor(key)
                    .unwrap_or_else(|| panic!("reloaded state lacks {key}"));
                assert_eq!(
                    b.to_vec::<f64>().unwrap(),
                    t.to_vec::<f64>().unwrap(),
                    "{key} after loading on {n} ranks"
                );
            }
            assert_eq!(
                back.metadata(),
                offline.metadata(),
                "metadata after loading on {n} ranks"
            );
            train(comm, &mut zero, &net, 2..4);
            net.values()
        })
        .unwrap();
        for values in &resumed {
            assert_close(values, uninterrupted, false, &format!("resumed on {n} ranks"));
        }
    }
    let refused = LocalGroup::run(2, |comm| {
        let deep = Deep::new();
        let opt = optimizer(true, deep.parameters());
        let mut zero = Zero3::new(&deep, opt.as_ref(), comm).unwrap();
        zero.load_consolidated(&offline).unwrap_err().to_string()
    })
    .unwrap();
    for e in refused {
        assert!(e.contains("other parameters"), "{e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Loss scaling across shards: with finite gradients ZeRO-3 under a
/// GradScaler equals one process under one; when one rank alone produces
/// an inf, every rank skips the step and backs the scale off alike.
#[test]
fn zero3_loss_scaling_skips_the_step_on_every_rank_when_one_overflows() {
    use tessera_optim::{GradScaler, GradScalerOptions};
    let scaler = || {
        GradScaler::new(GradScalerOptions {
            init_scale: 1024.0,
            ..Default::default()
        })
        .unwrap()
    };
    let net = Net::new(3);
    let mut opt = optimizer(false, net.parameters());
    let mut s = scaler();
    let mut grads = s.backward(&loss(&net, 0, 0..2 * B)).unwrap();
    assert!(s.step(opt.as_mut(), &mut grads).unwrap());
    s.update().unwrap();
    let want = net.values();
    let got = LocalGroup::run(2, |comm| {
        let net = Net::new(3);
        let opt = optimizer(false, net.parameters());
        let mut zero = Zero3::with_config(&net, opt.as_ref(), comm, released(true)).unwrap();
        let mut s = scaler();
        let r = comm.rank();
        let l = loss(&net, 0, r * B..(r + 1) * B);
        zero.backward_with(|| s.backward(&l)).unwrap();
        assert!(zero.step_scaled(&mut s).unwrap());
        s.update().unwrap();
        let after_first = net.values();
        // Rank 1's loss overflows; rank 0's does not.
        let l = loss(&net, 1, r * B..(r + 1) * B);
        let l = if r == 1 {
            l.mul_scalar(f64::INFINITY).unwrap()
        } else {
            l
        };
        zero.backward_with(|| s.backward(&l)).unwrap();
        assert!(zero.unscale_(&mut s).unwrap(), "rank {r} sees the overflow");
        assert!(!zero.step_scaled(&mut s).unwrap());
        s.update().unwrap();
        assert_eq!(net.values(), after_first, "rank {r} skipped the step");
        (after_first, s.scale())
    })
    .unwrap();
    for (values, scale) in got {
        assert_close(&values, &want, true, "scaled step");
        assert_eq!(scale, 512.0);
    }
}
