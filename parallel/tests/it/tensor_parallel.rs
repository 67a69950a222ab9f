//! Tensor and sequence parallelism against the single-device model (spec
//! §6.7): Megatron's mapping numbers, the column/row-parallel linear
//! oracle, vocabulary-parallel cross-entropy against the CE of the gathered
//! logits, whole blocks for t ∈ {1, 2, 4} with and without sequence
//! parallelism, the 3-D grid's golden groups, and the GPT trained on
//! tp × pp × dp grids (threads and tcp processes) against the serial run.

use std::sync::Arc;

use tessera_autograd::{Gradients, Parameter, Target, Var};
use tessera_nn::models::{Gpt, GptBlock, GptConfig};
use tessera_nn::{Linear, Module};
use tessera_optim::{Optimizer, Sgd, SgdOptions};
use tessera_parallel::pipeline::Schedule;
use tessera_parallel::tensor_parallel::{
    allreduce_sequence_parallel_grads, mappings as m, shard, tp_grad_norm, train_gpt_3d,
    vocab_parallel_cross_entropy, ColumnOptions, ColumnParallelLinear, Gpt3dOptions, GptParallel,
    ParallelMlp, ParallelSelfAttention, ParallelTransformerLayer, RowOptions, RowParallelLinear,
    TensorParallel, TpComm, TrafficMeter,
};
use tessera_parallel::{tcp, CommError, CommExt, Communicator, LocalGroup, ParallelGrid};
use tessera_tensor::{DType, Generator, Tensor};

/// Runs `f(tp group, world rank)` on `world` threads split into TP groups
/// of `t` consecutive ranks.
fn tp_run<R: Send>(world: usize, t: usize, f: impl Fn(&TpComm, usize) -> R + Sync) -> Vec<R> {
    LocalGroup::run(world, |comm| {
        let r = comm.rank();
        let g = comm.split(Some((r / t) as u32), r as i64).unwrap().unwrap();
        f(&Arc::from(g), r)
    })
    .unwrap()
}

fn randn(shape: &[usize], std: f64, seed: u64) -> Tensor {
    Tensor::normal_with(shape, 0.0, std, DType::F32, &mut Generator::new(seed)).unwrap()
}

fn rand(shape: &[usize], seed: u64) -> Tensor {
    Tensor::rand_with(shape, DType::F32, &mut Generator::new(seed)).unwrap()
}

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .contiguous()
        .unwrap()
        .to_vec::<f64>()
        .unwrap()
}

fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
    assert_eq!(a.shape(), b.shape(), "shapes differ");
    vals(a)
        .iter()
        .zip(vals(b))
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

fn assert_close(a: &Tensor, b: &Tensor, tol: f64, what: &str) {
    let d = max_abs_diff(a, b);
    assert!(d <= tol, "{what}: max abs diff {d:e} > {tol:e}");
}

fn grad(g: &Gradients, v: &Var) -> Tensor {
    g.get(v).expect("a gradient").clone()
}

fn pgrad(g: &Gradients, p: &Parameter) -> Tensor {
    p.grad(g).expect("a parameter gradient").clone()
}

/// Megatron's `test_mappings.py` numbers: world 8, t = 4.
#[test]
fn mappings_give_megatrons_numbers() {
    tp_run(8, 4, |tp, r| {
        let group_sum = if r < 4 { 6.0 } else { 22.0 };
        let full = |v: f64, shape: &[usize]| Tensor::full(shape, v, DType::F32).unwrap();
        let rank_t = full(r as f64, &[8]);

        let x = Var::leaf(full(1.0, &[8]));
        let y = m::copy_to_tensor_parallel_region(&x, tp).unwrap();
        assert_eq!(vals(y.tensor()), vec![1.0; 8], "copy forward is the identity");
        assert_eq!(
            vals(&grad(&y.backward_with(&rank_t).unwrap(), &x)),
            vec![group_sum; 8]
        );

        let x = Var::leaf(rank_t.clone());
        let y = m::reduce_from_tensor_parallel_region(&x, tp).unwrap();
        assert_eq!(vals(y.tensor()), vec![group_sum; 8]);
        assert_eq!(
            vals(&grad(&y.backward_with(&rank_t).unwrap(), &x)),
            vec![r as f64; 8]
        );

        // Scatter of [8, 4] keeps column r % 4; backward of ones·rank gathers
        // the group's ranks column by column.
        let input = Tensor::arange(0.0, 32.0, 1.0, DType::F32)
            .unwrap()
            .reshape(vec![8, 4])
            .unwrap();
        let x = Var::leaf(input.clone());
        let y = m::scatter_to_tensor_parallel_region(&x, tp).unwrap();
        let col: Vec<f64> = (0..8).map(|i| (i * 4 + r % 4) as f64).collect();
        assert_eq!(vals(y.tensor()), col);
        let g = grad(&y.backward_with(&full(r as f64, &[8, 1])).unwrap(), &x);
        let base = 4 * (r / 4);
        let want: Vec<f64> = (0..32).map(|i| (base + i % 4) as f64).collect();
        assert_eq!(vals(&g), want);

        // Gather is scatter's transpose.
        let x = Var::leaf(full(r as f64, &[8, 1]));
        let y = m::gather_from_tensor_parallel_region(&x, tp).unwrap();
        assert_eq!(vals(y.tensor()), want);
        assert_eq!(vals(&grad(&y.backward_with(&input).unwrap(), &x)), col);

        // Sequence parallel: rows instead of columns.
        let x = Var::leaf(input.clone());
        let y = m::scatter_to_sequence_parallel_region(&x, tp).unwrap();
        let rows: Vec<f64> = (8 * (r % 4)..8 * (r % 4) + 8).map(|i| i as f64).collect();
        assert_eq!(vals(y.tensor()), rows);
        let g = grad(&y.backward_with(&full(r as f64, &[2, 4])).unwrap(), &x);
        let want_rows: Vec<f64> = (0..32).map(|i| (base + i / 8) as f64).collect();
        assert_eq!(vals(&g), want_rows);

        let x = Var::leaf(full(r as f64, &[2, 4]));
        let y = m::gather_from_sequence_parallel_region(&x, tp, true).unwrap();
        assert_eq!(vals(y.tensor()), want_rows);
        let g = grad(&y.backward_with(&full(1.0, &[8, 4])).unwrap(), &x);
        assert_eq!(vals(&g), vec![4.0; 8], "reduce-scatter of ones over 4 ranks");
        let y = m::gather_from_sequence_parallel_region(&x, tp, false).unwrap();
        let g = grad(&y.backward_with(&input).unwrap(), &x);
        assert_eq!(vals(&g), rows, "split of the gradient");

        let x = Var::leaf(full(r as f64, &[8, 4]));
        let y = m::reduce_scatter_to_sequence_parallel_region(&x, tp).unwrap();
        assert_eq!(vals(y.tensor()), vec![group_sum; 8]);
        let g = grad(&y.backward_with(&full(r as f64, &[2, 4])).unwrap(), &x);
        assert_eq!(vals(&g), want_rows);

        // Non-divisible splits are errors, not panics.
        let odd = Var::leaf(full(0.0, &[3, 5]));
        assert!(m::scatter_to_tensor_parallel_region(&odd, tp).is_err());
        assert!(m::scatter_to_sequence_parallel_region(&odd, tp).is_err());
    });
}

fn master_linear(inp: usize, out: usize, seed: u64) -> Linear {
    Linear {
        weight: Parameter::new(randn(&[out, inp], 0.02, seed)),
        bias: Some(Parameter::new(randn(&[out], 0.02, seed + 1))),
    }
}

/// Megatron's `test_column_parallel_linear` / `test_row_parallel_linear`:
/// in = 13·t, out = 17·t, batch 7, loss = Σ Y ⊙ W_loss, grads against the
/// slices of `dL/dA = W_lossᵀ X`, `dL/db = 1ᵀ W_loss`, `dL/dX = W_loss A`
/// (f64 references), max abs error < 1e-6.
#[test]
fn column_and_row_parallel_linear_grads_are_slices_of_the_full_grads() {
    for t in [1, 2, 4] {
        let (inp, out, batch) = (13 * t, 17 * t, 7);
        tp_run(t, t, |tp, r| {
            let master = master_linear(inp, out, 3);
            let x_t = rand(&[batch, inp], 5);
            let wl_t = rand(&[batch, out], 6);
            // f64 references.
            let a = Var::constant(master.weight.tensor().unwrap().to_dtype(DType::F64).unwrap());
            let xf = x_t.to_dtype(DType::F64).unwrap();
            let wl = wl_t.to_dtype(DType::F64).unwrap();
            let d_a = wl.transpose(0, 1).unwrap().matmul(&xf).unwrap();
            let d_b = wl.sum(&[0], false).unwrap();
            let d_x = wl.matmul(a.tensor()).unwrap();

            let col = ColumnParallelLinear::from_master(&master, tp, ColumnOptions::default()).unwrap();
            let x = Var::leaf(x_t.clone());
            let y = col.forward(&x).unwrap();
            let wl_r = wl_t.narrow(1, r * 17, 17).unwrap();
            let g = y
                .mul(&Var::constant(wl_r))
                .unwrap()
                .sum(&[0, 1], false)
                .unwrap()
                .backward()
                .unwrap();
            let w_grad = pgrad(&g, &col.weight);
            assert_close(
                &w_grad,
                &d_a.narrow(0, r * 17, 17).unwrap().to_dtype(DType::F32).unwrap(),
                1e-6,
                "column dA",
            );
            let b_grad = pgrad(&g, col.bias.as_ref().unwrap());
            assert_close(
                &b_grad,
                &d_b.narrow(0, r * 17, 17).unwrap().to_dtype(DType::F32).unwrap(),
                1e-6,
                "column db",
            );
            assert_close(
                &grad(&g, &x),
                &d_x.to_dtype(DType::F32).unwrap(),
                1e-6,
                "column dX",
            );

            let opts = RowOptions {
                input_is_parallel: false,
                sequence_parallel: false,
            };
            let row = RowParallelLinear::from_master(&master, tp, opts).unwrap();
            let x = Var::leaf(x_t.clone());
            let y = row.forward(&x).unwrap();
            let want_y = xf.matmul(&a.tensor().transpose(0, 1).unwrap()).unwrap();
            let want_y = want_y
                .add(
                    &master
                        .bias
                        .as_ref()
                        .unwrap()
                        .tensor()
                        .unwrap()
                        .to_dtype(DType::F64)
                        .unwrap(),
                )
                .unwrap();
            assert_close(y.tensor(), &want_y.to_dtype(DType::F32).unwrap(), 1e-6, "row Y");
            let g = y
                .mul(&Var::constant(wl_t.clone()))
                .unwrap()
                .sum(&[0, 1], false)
                .unwrap()
                .backward()
                .unwrap();
            let w_grad = pgrad(&g, &row.weight);
            assert_close(
                &w_grad,
                &d_a.narrow(1, r * 13, 13).unwrap().to_dtype(DType::F32).unwrap(),
                1e-6,
                "row dA",
            );
            assert_close(
                &pgrad(&g, row.bias.as_ref().unwrap()),
                &d_b.to_dtype(DType::F32).unwrap(),
                1e-6,
                "row db",
            );
            assert_close(&grad(&g, &x), &d_x.to_dtype(DType::F32).unwrap(), 1e-6, "row dX");

            // The shards gather back to the master.
            let (w, b) = col.master_weights().unwrap();
            assert_eq!(vals(&w), vals(&master.weight.tensor().unwrap()));
            assert_eq!(
                vals(&b.unwrap()),
                vals(&master.bias.as_ref().unwrap().tensor().unwrap())
            );
            let (w, _) = row.master_weights().unwrap();
            assert_eq!(vals(&w), vals(&master.weight.tensor().unwrap()));
        });
    }
}

/// Vocabulary-parallel CE equals the CE of the gathered logits (loss and
/// grad), with and without label smoothing (torch's definition, as the
/// `nn` cross-entropy), issues exactly three collectives, and with t = 1 is
/// the standard cross-entropy.
#[test]
fn vocab_parallel_cross_entropy_equals_ce_on_gathered_logits() {
    for t in [1, 2, 4] {
        let (s, b, v) = (5, 3, 8 * t);
        tp_run(t, t, |tp, r| {
            for alpha in [0.0, 0.1, 0.7] {
                let full = randn(&[s, b, v], 2.0, 9);
                let target =
                    Tensor::from_vec((0..s * b).map(|i| ((i * 7 + 3) % v) as i64).collect(), &[s, b])
                        .unwrap();
                let dloss = rand(&[s, b], 10);

                let whole = Var::leaf(full.clone());
                let opts = tessera_autograd::CrossEntropyOptions {
                    reduction: tessera_autograd::Reduction::None,
                    label_smoothing: alpha,
                    ..Default::default()
                };
                let flat_t = target.reshape(vec![s * b]).unwrap();
                let want = whole
                    .reshape(vec![s * b, v])
                    .unwrap()
                    .cross_entropy(Target::Indices(&flat_t), &opts)
                    .unwrap();
                let want_grad = grad(
                    &want.backward_with(&dloss.reshape(vec![s * b]).unwrap()).unwrap(),
                    &whole,
                );

                let meter = TrafficMeter::new(tp.clone());
                let counted: TpComm = Arc::new(meter.clone());
                let mine = Var::leaf(full.narrow(2, r * 8, 8).unwrap().contiguous().unwrap());
                let loss = vocab_parallel_cross_entropy(&mine, &target, &counted, alpha).unwrap();
                assert_eq!(meter.collectives(), 3, "three all-reduces");
                let what = format!("t={t} label_smoothing={alpha}");
                assert_close(
                    loss.tensor(),
                    &want.tensor().reshape(vec![s, b]).unwrap(),
                    1e-5,
                    &format!("{what} loss"),
                );
                let g = grad(&loss.backward_with(&dloss).unwrap(), &mine);
                assert_close(
                    &g,
                    &want_grad.narrow(2, r * 8, 8).unwrap(),
                    1e-6,
                    &format!("{what} grad"),
                );
            }
            let mine = Var::leaf(randn(&[s, b, 8], 1.0, 11));
            let bad = Tensor::from_vec(vec![v as i64; s * b], &[s, b]).unwrap();
            assert!(
                vocab_parallel_cross_entropy(&mine, &bad, tp, 0.0).is_err(),
                "target out of range"
            );
            let ok = Tensor::from_vec(vec![0i64; s * b], &[s, b]).unwrap();
            for alpha in [-0.1, 1.5, f64::NAN] {
                let e = vocab_parallel_cross_entropy(&mine, &ok, tp, alpha).unwrap_err();
                assert!(e.to_string().contains("label_smoothing"), "{e}");
            }
        });
    }
}

fn tiny_config() -> GptConfig {
    GptConfig::new(32).block_size(8).n_layer(2).n_head(4).n_embd(16)
}

/// (dim, stride) of a serial GPT parameter split over TP; `None` when
/// replicated.
fn split_of(name: &str) -> Option<(usize, usize)> {
    if name.ends_with("c_attn.weight") || name.ends_with("c_attn.bias") {
        Some((0, 3))
    } else if name.ends_with("c_fc.weight") || name.ends_with("c_fc.bias") || name == "wte.weight" {
        Some((0, 1))
    } else if name.ends_with("c_proj.weight") {
        Some((1, 1))
    } else {
        None
    }
}

/// This rank's expected part of a serial tensor.
fn part_of(name: &str, full: &Tensor, r: usize, t: usize) -> Tensor {
    match split_of(name) {
        Some((dim, stride)) => shard(full, dim, stride, r, t).unwrap(),
        None => full.clone(),
    }
}

/// MLP, attention and the whole layer equal the serial block (output,
/// input grad, every parameter grad as a slice of the full one) for
/// t ∈ {1, 2, 4}, and sequence parallelism gives the same once the
/// replicated LayerNorm grads are summed over TP.
#[test]
fn parallel_blocks_equal_the_single_device_block() {
    let (b, s) = (2, 8);
    for t in [1, 2, 4] {
        for sp in [false, true] {
            tp_run(t, t, |tp, r| {
                let master: GptBlock = Gpt::new(&tiny_config(), 21).unwrap().h.remove(0);
                let x_t = randn(&[b, s, 16], 1.0, 22);
                let w_t = randn(&[b, s, 16], 1.0, 23);
                let seq_part = |x: &Tensor| -> Tensor {
                    let x = x.transpose(0, 1).unwrap().contiguous().unwrap();
                    if sp {
                        x.narrow(0, r * s / t, s / t).unwrap().contiguous().unwrap()
                    } else {
                        x
                    }
                };
                let mb = &master;
                let cases: Vec<(&str, &dyn Module, Box<dyn ModTp>)> = vec![
                    (
                        "mlp",
                        &mb.mlp,
                        Box::new(ParallelMlp::from_master(&mb.mlp, tp, sp).unwrap()),
                    ),
                    (
                        "attn",
                        &mb.attn,
                        Box::new(ParallelSelfAttention::from_master(&mb.attn, tp, sp).unwrap()),
                    ),
                    (
                        "layer",
                        mb,
                        Box::new(ParallelTransformerLayer::from_master(mb, tp, sp).unwrap()),
                    ),
                ];
                for (what, serial, par) in cases {
                    let xs = Var::leaf(x_t.clone());
                    let ys = serial.forward(&xs).unwrap();
                    let gs = ys
                        .mul(&Var::constant(w_t.clone()))
                        .unwrap()
                        .sum(&[0, 1, 2], false)
                        .unwrap()
                        .backward()
                        .unwrap();

                    let xp = Var::leaf(seq_part(&x_t));
                    let yp = par.forward(&xp).unwrap();
                    let what = format!("{what} t={t} sp={sp}");
                    assert_close(
                        yp.tensor(),
                        &seq_part(ys.tensor()),
                        1e-5,
                        &format!("{what} output"),
                    );
                    let loss = yp
                        .mul(&Var::constant(seq_part(&w_t)))
                        .unwrap()
                        .sum(&[0, 1, 2], false)
                        .unwrap();
                    let mut gp = loss.backward().unwrap();
                    allreduce_sequence_parallel_grads(&par.tp_params(), &mut gp, tp).unwrap();
                    assert_close(
                        &grad(&gp, &xp),
                        &seq_part(&grad(&gs, &xs)),
                        1e-5,
                        &format!("{what} input grad"),
                    );
                    let serial_params = serial.named_parameters();
                    let par_params = par.named_parameters();
                    assert_eq!(serial_params.len(), par_params.len());
                    for ((name, ps), (pname, pp)) in serial_params.iter().zip(&par_params) {
                        assert_eq!(name, pname, "{what}: parameter names follow the serial block");
                        let want = part_of(name, &pgrad(&gs, ps), r, t);
                        assert_close(&pgrad(&gp, pp), &want, 1e-5, &format!("{what} grad of {name}"));
                    }
                }
            });
        }
    }
}

/// A tensor-parallel module for the block test.
trait ModTp: Module + TensorParallel {}
impl<M: Module + TensorParallel> ModTp for M {}

/// The golden lists of Megatron's docstring (16 ranks, t = 2, p = 4, d = 2)
/// and DeepSpeed's (8 ranks, 2 × 2 × 2: pipe groups [0,4],[1,5],...), the
/// partition properties for many shapes, and the groups `ParallelGrid::new`
/// builds with `split` on 16 threads.
#[test]
fn grid_reproduces_megatrons_golden_groups() {
    let g = ParallelGrid::groups(16, 2, 4, 2).unwrap();
    let pairs = |v: &[[usize; 2]]| v.iter().map(|p| p.to_vec()).collect::<Vec<_>>();
    assert_eq!(
        g.tp,
        pairs(&[
            [0, 1],
            [2, 3],
            [4, 5],
            [6, 7],
            [8, 9],
            [10, 11],
            [12, 13],
            [14, 15]
        ])
    );
    assert_eq!(
        g.dp,
        pairs(&[
            [0, 2],
            [1, 3],
            [4, 6],
            [5, 7],
            [8, 10],
            [9, 11],
            [12, 14],
            [13, 15]
        ])
    );
    assert_eq!(
        g.pp,
        vec![
            vec![0, 4, 8, 12],
            vec![1, 5, 9, 13],
            vec![2, 6, 10, 14],
            vec![3, 7, 11, 15]
        ]
    );
    assert_eq!(
        ParallelGrid::groups(8, 2, 2, 2).unwrap().pp,
        pairs(&[[0, 4], [1, 5], [2, 6], [3, 7]])
    );
    assert!(ParallelGrid::groups(16, 3, 4, 2).is_err());
    assert!(ParallelGrid::groups(16, 0, 4, 2).is_err());

    for (tp, pp, dp) in [(1, 1, 1), (2, 2, 2), (4, 1, 2), (1, 3, 2), (2, 3, 1), (3, 2, 2)] {
        let world = tp * pp * dp;
        let g = ParallelGrid::groups(world, tp, pp, dp).unwrap();
        for (kind, groups) in [("tp", &g.tp), ("dp", &g.dp), ("pp", &g.pp)] {
            let mut seen = vec![0; world];
            groups.iter().flatten().for_each(|&r| seen[r] += 1);
            assert!(
                seen.iter().all(|&c| c == 1),
                "{kind} groups partition the world ({tp},{pp},{dp})"
            );
        }
        for r in 0..world {
            let find = |gs: &Vec<Vec<usize>>| gs.iter().find(|x| x.contains(&r)).unwrap().clone();
            let (a, b, c) = (find(&g.tp), find(&g.dp), find(&g.pp));
            let common: Vec<usize> = a
                .iter()
                .filter(|x| b.contains(x) && c.contains(x))
                .copied()
                .collect();
            assert_eq!(common, vec![r], "TP ∩ DP ∩ PP = {{rank}}");
        }
    }

    let golden = ParallelGrid::groups(16, 2, 4, 2).unwrap();
    let live = LocalGroup::run(16, |comm| -> Result<_, CommError> {
        let grid = ParallelGrid::new(comm, 2, 4, 2)?;
        let me = [comm.rank() as i64];
        let members = |c: &dyn Communicator| -> Result<Vec<usize>, CommError> {
            let mut out = vec![0i64; c.world_size()];
            c.all_gather_slice(&me, &mut out)?;
            Ok(out.into_iter().map(|x| x as usize).collect())
        };
        let emb = grid.embedding.as_deref().map(members).transpose()?;
        Ok((
            members(grid.tp.as_ref())?,
            members(grid.dp.as_ref())?,
            members(grid.pp.as_ref())?,
            emb,
        ))
    })
    .unwrap();
    for (r, got) in live.into_iter().enumerate() {
        let (tp, dp, pp, emb) = got.unwrap();
        assert!(golden.tp.contains(&tp) && tp.contains(&r), "rank {r} tp {tp:?}");
        assert!(golden.dp.contains(&dp) && dp.contains(&r), "rank {r} dp {dp:?}");
        assert!(golden.pp.contains(&pp) && pp.contains(&r), "rank {r} pp {pp:?}");
        let ends = pp[0] == r || pp[3] == r;
        assert_eq!(emb, ends.then(|| vec![pp[0], pp[3]]), "rank {r} embedding group");
    }
}

/// Tokens and next-token targets of one step, the same on every rank.
fn lm_batch(step: usize, rows: usize, seq: usize, vocab: usize) -> (Tensor, Tensor) {
    let mut g = Generator::new(100 + step as u64);
    let raw = Tensor::rand_with(&[rows * (seq + 1)], DType::F64, &mut g)
        .unwrap()
        .to_vec::<f64>()
        .unwrap();
    let ids: Vec<i64> = raw
        .iter()
        .map(|u| (u * vocab as f64) as i64 % vocab as i64)
        .collect();
    let (mut x, mut y) = (Vec::new(), Vec::new());
    for row in ids.chunks(seq + 1) {
        x.extend_from_slice(&row[..seq]);
        y.extend_from_slice(&row[1..]);
    }
    (
        Tensor::from_vec(x, &[rows, seq]).unwrap(),
        Tensor::from_vec(y, &[rows, seq]).unwrap(),
    )
}

const LR: f64 = 0.2;
const STEPS: usize = 3;
const ROWS: usize = 8;

fn sgd(params: Vec<Parameter>) -> tessera_tensor::Result<Box<dyn Optimizer>> {
    let o = SgdOptions {
        lr: LR,
        momentum: 0.9,
        ..SgdOptions::default()
    };
    Ok(Box::new(Sgd::new(params, o)?))
}

/// The serial GPT after [`STEPS`] SGD steps: its state dict and losses.
fn serial_run(cfg: &GptConfig) -> (tessera_tensor::StateDict, Vec<f64>) {
    let model = Gpt::new(cfg, 42).unwrap();
    let mut opt = sgd(model.parameters()).unwrap();
    let mut losses = Vec::new();
    for step in 0..STEPS {
        let (x, y) = lm_batch(step, ROWS, cfg.block_size, cfg.vocab_size);
        let loss = model.loss(&x, &y).unwrap();
        losses.push(vals(loss.tensor())[0]);
        opt.step(&loss.backward().unwrap()).unwrap();
    }
    (model.state_dict(), losses)
}

/// A TP = 2 GPT (with and without sequence parallelism) trains like the
/// serial one: same losses, consolidated weights equal after 3 steps, the
/// consolidated state dict loads back into the same shards, and the global
/// grad norm counts replicated parameters once.
#[test]
fn tensor_parallel_gpt_trains_like_the_serial_gpt() {
    let cfg = tiny_config();
    let (want, want_losses) = serial_run(&cfg);
    for sp in [false, true] {
        tp_run(2, 2, |tp, _| {
            let master = Gpt::new(&cfg, 42).unwrap();
            let model = GptParallel::from_master(&master, tp, sp).unwrap();
            let roles = model.tp_params();
            assert_eq!(
                roles.len(),
                model.parameters().len(),
                "every parameter has a role"
            );
            let mut opt = sgd(model.parameters()).unwrap();
            for (step, want_loss) in want_losses.iter().enumerate() {
                let (x, y) = lm_batch(step, ROWS, cfg.block_size, cfg.vocab_size);
                let loss = model.loss(&x, &y).unwrap();
                let got = vals(loss.tensor())[0];
                assert!(
                    (got - want_loss).abs() < 1e-5,
                    "sp={sp} step {step}: loss {got} vs {}",
                    want_loss
                );
                let mut g = loss.backward().unwrap();
                allreduce_sequence_parallel_grads(&roles, &mut g, tp).unwrap();
                if step == 0 {
                    let serial = Gpt::new(&cfg, 42).unwrap();
                    let gs = serial.loss(&x, &y).unwrap().backward().unwrap();
                    let norm_s: f64 = serial
                        .parameters()
                        .iter()
                        .map(|p| vals(&pgrad(&gs, p)).iter().map(|v| v * v).sum::<f64>())
                        .sum::<f64>()
                        .sqrt();
                    let norm_p = tp_grad_norm(&roles, &g, tp, None).unwrap();
                    assert!(
                        (norm_s - norm_p).abs() < 1e-5 * norm_s,
                        "grad norm {norm_p} vs serial {norm_s}"
                    );
                }
                opt.step(&g).unwrap();
            }
            let sd = model.consolidate().unwrap();
            assert_eq!(sd.len(), want.len(), "consolidated keys");
            for (k, w) in want.iter() {
                let got = sd
                    .tensor(k)
                    .unwrap_or_else(|| panic!("consolidated state has {k}"));
                assert_close(got, w, 2e-5, &format!("sp={sp} {k} after {STEPS} steps"));
            }
            let back = GptParallel::from_state_dict(&cfg, &sd, tp, sp).unwrap();
            for ((n, a), (_, b)) in back.named_parameters().iter().zip(model.named_parameters()) {
                assert_eq!(
                    vals(&a.tensor().unwrap()),
                    vals(&b.tensor().unwrap()),
                    "{n} round trip"
                );
            }
        });
    }
}

/// The serial name of a pipeline layer's parameter (`"1.attn.c_attn.weight"`
/// is block 0's; the last layer is the head).
fn serial_name(name: &str, n_layer: usize) -> String {
    let (idx, rest) = name.split_once('.').unwrap();
    let idx: usize = idx.parse().unwrap();
    match (idx, rest) {
        (0, r) => r.to_string(),
        (i, "weight") if i == n_layer + 1 => "wte.weight".into(),
        (i, r) if i == n_layer + 1 => r.to_string(),
        (i, r) => format!("h.{}.{r}", i - 1),
    }
}

/// Runs one rank of the 3-D GPT and checks its parameters against the
/// serial run's slices. Returns the losses it saw.
fn check_3d_rank(world: &dyn Communicator, tp: usize, pp: usize, dp: usize, sp: bool) -> Vec<Option<f64>> {
    let cfg = tiny_config();
    let (want, _) = serial_run(&cfg);
    let master = Gpt::new(&cfg, 42).unwrap();
    let opts = Gpt3dOptions {
        tp,
        dp,
        schedule: Schedule::one_f_one_b(pp, 2).unwrap(),
        sequence_parallel: sp,
        seed: 1,
    };
    let mut losses = Vec::new();
    let outcome = train_gpt_3d(
        world,
        &master,
        &opts,
        &sgd,
        STEPS,
        &mut |step| Ok(lm_batch(step, ROWS, cfg.block_size, cfg.vocab_size)),
        &mut |_, r| losses.push(r.loss),
    )
    .unwrap();
    let r_tp = world.rank() % tp;
    if let Some(sd) = &outcome.state_dict {
        assert_eq!(world.rank(), 0, "only world rank 0 gets the consolidated model");
        assert_eq!(sd.len(), want.len());
        for (k, w) in want.iter() {
            assert_close(
                sd.tensor(k).expect("every key"),
                w,
                2e-5,
                &format!("consolidated {k}"),
            );
        }
    } else {
        assert_ne!(world.rank(), 0, "world rank 0 gets the consolidated model");
    }
    for (name, p) in outcome.params {
        let sname = serial_name(&name, cfg.n_layer);
        let full = want.tensor(&sname).unwrap_or_else(|| panic!("{name} → {sname}"));
        let expect = part_of(&sname, full, r_tp, tp);
        assert_close(
            &p.tensor().unwrap(),
            &expect,
            2e-5,
            &format!("rank {} {name}", world.rank()),
        );
    }
    losses
}

/// DP × PP × TP = 2 × 2 × 2 on 8 threads (and the same with sequence
/// parallelism) equals the serial GPT after 3 SGD steps.
#[test]
fn gpt_on_a_2x2x2_grid_equals_the_serial_run() {
    let (_, want_losses) = serial_run(&tiny_config());
    for sp in [false, true] {
        let out = LocalGroup::run(8, |comm| check_3d_rank(comm, 2, 2, 2, sp)).unwrap();
        // Ranks 4..8 hold the last stage; replica d's TP rank 0 is 4 + 2d.
        // Each reports the loss of its half of the batch.
        for (step, want) in want_losses.iter().enumerate() {
            let half = |r: usize| out[r][step].expect("the last stage reports its loss");
            let got = (half(4) + half(6)) / 2.0;
            assert!(
                (got - want).abs() < 1e-5,
                "sp={sp} step {step}: loss {got} vs serial {want}"
            );
            assert_eq!(half(4), half(5), "TP ranks agree on the loss");
        }
        assert!(out[0].iter().all(Option::is_none), "the first stage has no loss");
    }
}

/// Set in the rank processes of [`gpt_2x1x2_over_tcp_processes_equals_the_serial_run`].
const TCP_CHILD: &str = "TESSERA_TP_TCP_CHILD";

/// One rank of the tcp test: joins from torchrun's environment and checks
/// its parameters. A no-op in the ordinary test run.
#[test]
fn tp_tcp_rank_child() {
    if std::env::var(TCP_CHILD).is_err() {
        return;
    }
    let comm = tcp::init_from_env().unwrap();
    check_3d_rank(&comm, 2, 1, 2, false);
    println!("rank ok");
}

/// DP × PP × TP = 2 × 1 × 2 over `tcp` between 4 processes (this test
/// binary as the ranks) equals the serial GPT.
#[test]
fn gpt_2x1x2_over_tcp_processes_equals_the_serial_run() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let children: Vec<_> = (0..4)
        .map(|rank| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "tensor_parallel::tp_tcp_rank_child",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(TCP_CHILD, "1")
                .env("RANK", rank.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("WORLD_SIZE", "4")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env(tcp::TIMEOUT_VAR, "60")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("rank ok"),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
