//! Dropout in the tensor-parallel GPT against Megatron's RNG scheme: the
//! model-parallel stream is `seed + 2718 + tp_rank` and the default one
//! `seed` on every TP rank; replicated activations stay bitwise equal
//! across ranks; a TP = 2 GPT with dropout equals a serial reference that
//! draws its masks from the same streams the way the tracker defines them
//! (with and without sequence parallelism); eval mode equals the serial
//! model; checkpointed layers replay the same masks.

use std::sync::Arc;

use tessera_autograd::{checkpoint, CrossEntropyOptions, Gradients, Parameter, Target, Var};
use tessera_nn::models::{Gpt, GptBlock, GptConfig};
use tessera_nn::Module;
use tessera_parallel::tensor_parallel::random::{fork_model_parallel, MODEL_PARALLEL_SEED_OFFSET};
use tessera_parallel::tensor_parallel::{
    allreduce_sequence_parallel_grads, model_parallel_manual_seed, shard, GptParallel,
    ParallelTransformerLayer, TensorParallel, TpComm,
};
use tessera_parallel::{Communicator, LocalGroup};
use tessera_tensor::{DType, Generator, Tensor};

const P: f64 = 0.3;
const SEED: u64 = 11;

fn tp_run<R: Send>(t: usize, f: impl Fn(&TpComm, usize) -> R + Sync) -> Vec<R> {
    LocalGroup::run(t, |comm| {
        let g = comm.split(Some(0), comm.rank() as i64).unwrap().unwrap();
        f(&Arc::from(g), comm.rank())
    })
    .unwrap()
}

fn config() -> GptConfig {
    GptConfig::new(32)
        .block_size(8)
        .n_layer(2)
        .n_head(4)
        .n_embd(16)
        .dropout(P)
}

fn vals(t: &Tensor) -> Vec<f64> {
    t.to_dtype(DType::F64)
        .unwrap()
        .contiguous()
        .unwrap()
        .to_vec::<f64>()
        .unwrap()
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.contiguous()
        .unwrap()
        .to_vec::<f32>()
        .unwrap()
        .iter()
        .map(|v| v.to_bits())
        .collect()
}

fn assert_close(a: &Tensor, b: &Tensor, tol: f64, what: &str) {
    assert_eq!(a.shape(), b.shape(), "{what}: shapes");
    let d = vals(a)
        .iter()
        .zip(vals(b))
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max);
    assert!(d <= tol, "{what}: max abs diff {d:e} > {tol:e}");
}

fn tokens(b: usize, s: usize, v: usize, salt: usize) -> Tensor {
    let ids = (0..b * s).map(|i| ((i * 13 + salt * 5 + 1) % v) as i64).collect();
    Tensor::from_vec(ids, &[b, s]).unwrap()
}

/// The scaled keep-mask a dropout of `shape` draws from `gen`: uniforms
/// `u` (f32), kept where `u ≥ p`, scaled by `1/(1 − p)`.
fn draw_mask(shape: &[usize], gen: &mut Generator) -> Tensor {
    let u = Tensor::rand_with(shape, DType::F32, gen).unwrap();
    let keep = u
        .ge_scalar(P as f32 as f64)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    keep.mul_scalar(1.0 / (1.0 - P)).unwrap()
}

/// The masks of the TP = t model as the tracker defines its streams: the
/// default stream `seed` shared by every rank, and the model-parallel
/// stream `seed + 2718 + r` of rank r, each drawn in forward order.
struct Masks {
    default: Generator,
    mp: Vec<Generator>,
    sp: bool,
}

impl Masks {
    fn new(t: usize, sp: bool) -> Masks {
        Masks {
            default: Generator::new(SEED),
            mp: (0..t)
                .map(|r| Generator::new(SEED + MODEL_PARALLEL_SEED_OFFSET + r as u64))
                .collect(),
            sp,
        }
    }

    /// A residual/embedding mask for `[s, b, h]`: the default stream, or
    /// under sequence parallelism each rank's `s/t` rows from its own
    /// model-parallel stream.
    fn hidden(&mut self, s: usize, b: usize, h: usize) -> Tensor {
        if !self.sp {
            return draw_mask(&[s, b, h], &mut self.default);
        }
        let t = self.mp.len();
        let parts: Vec<Tensor> = self.mp.iter_mut().map(|g| draw_mask(&[s / t, b, h], g)).collect();
        Tensor::cat(&parts, 0).unwrap()
    }

    /// The attention-probability mask `[b, n, s, s]`: rank r's heads from
    /// its model-parallel stream.
    fn attention(&mut self, b: usize, n: usize, s: usize) -> Tensor {
        let t = self.mp.len();
        let parts: Vec<Tensor> = self
            .mp
            .iter_mut()
            .map(|g| draw_mask(&[b, n / t, s, s], g))
            .collect();
        Tensor::cat(&parts, 1).unwrap()
    }
}

fn drop(x: &Var, mask: Tensor) -> Var {
    x.mul(&Var::constant(mask)).unwrap()
}

/// The serial block on `[s, b, h]` with the masks applied by hand.
fn reference_block(blk: &GptBlock, x: &Var, masks: &mut Masks) -> Var {
    let (s, b, h) = (x.shape()[0], x.shape()[1], x.shape()[2]);
    let n = blk.attn.n_head;
    let d = h / n;
    let qkv = blk
        .attn
        .c_attn
        .forward(&blk.ln_1.forward(x).unwrap())
        .unwrap()
        .transpose(0, 1)
        .unwrap();
    let heads = |t: &Var| {
        t.reshape(vec![b, s, n, d])
            .unwrap()
            .permute(&[0, 2, 1, 3])
            .unwrap()
    };
    let parts = qkv.chunk(3, -1).unwrap();
    let (q, k, v) = (heads(&parts[0]), heads(&parts[1]), heads(&parts[2]));
    let above = Tensor::from_vec((0..s * s).map(|i| i % s > i / s).collect::<Vec<bool>>(), &[s, s]).unwrap();
    let scores = q
        .matmul(&k.transpose(-2, -1).unwrap())
        .unwrap()
        .mul_scalar(1.0 / (d as f64).sqrt())
        .unwrap()
        .masked_fill(&above, f64::NEG_INFINITY)
        .unwrap();
    let probs = drop(&scores.softmax(-1).unwrap(), masks.attention(b, n, s));
    let y = probs
        .matmul(&v)
        .unwrap()
        .permute(&[0, 2, 1, 3])
        .unwrap()
        .reshape(vec![b, s, h])
        .unwrap()
        .transpose(0, 1)
        .unwrap();
    let a = drop(&blk.attn.c_proj.forward(&y).unwrap(), masks.hidden(s, b, h));
    let x = x.add(&a).unwrap();
    let m = blk
        .mlp
        .c_proj
        .forward(
            &blk.mlp
                .c_fc
                .forward(&blk.ln_2.forward(&x).unwrap())
                .unwrap()
                .gelu(tessera_tensor::GeluApprox::None)
                .unwrap(),
        )
        .unwrap();
    x.add(&drop(&m, masks.hidden(s, b, h))).unwrap()
}

/// The serial name of a `GptParallel` parameter.
fn serial_name(name: &str) -> String {
    if name == "head.weight" {
        return "wte.weight".into();
    }
    name.strip_prefix("embed.")
        .or_else(|| name.strip_prefix("head."))
        .unwrap_or(name)
        .to_string()
}

/// (dim, stride) of a serial parameter split over TP; `None` when replicated.
fn split_of(name: &str) -> Option<(usize, usize)> {
    if name.contains("c_attn.") {
        Some((0, 3))
    } else if name.contains("c_fc.") || name == "wte.weight" {
        Some((0, 1))
    } else if name.ends_with("c_proj.weight") {
        Some((1, 1))
    } else {
        None
    }
}

fn pgrad(g: &Gradients, p: &Parameter) -> Tensor {
    p.grad(g).expect("a parameter gradient").clone()
}

/// The tracker's streams: the default generator is `seed` on every rank,
/// the model-parallel stream `seed + 2718 + tp_rank` (so the ranks' masks
/// differ), both reproducible from the seed; without the seeding, dropout
/// in the TP region is an error naming the layer.
#[test]
fn model_parallel_stream_differs_per_rank_and_default_stream_is_shared() {
    let out = tp_run(2, |_, r| {
        let draw = || Tensor::rand(&[64], DType::F32).unwrap();
        model_parallel_manual_seed(SEED, r).unwrap();
        let mp = fork_model_parallel("test", || Ok(draw())).unwrap();
        let dflt = draw();
        let mp2 = fork_model_parallel("test", || Ok(draw())).unwrap();
        let mut g = Generator::new(SEED + 2718 + r as u64);
        let want = Tensor::rand_with(&[64], DType::F32, &mut g).unwrap();
        let want2 = Tensor::rand_with(&[64], DType::F32, &mut g).unwrap();
        assert_eq!(bits(&mp), bits(&want), "rank {r}: the model-parallel stream");
        assert_eq!(bits(&mp2), bits(&want2), "rank {r}: it continues across forks");
        let want_d = Tensor::rand_with(&[64], DType::F32, &mut Generator::new(SEED)).unwrap();
        assert_eq!(bits(&dflt), bits(&want_d), "rank {r}: the default stream");
        (bits(&mp), bits(&dflt))
    });
    assert_ne!(out[0].0, out[1].0, "model-parallel draws differ across TP ranks");
    assert_eq!(out[0].1, out[1].1, "default draws agree across TP ranks");

    // A fresh thread has no model-parallel stream.
    tp_run(2, |tp, _| {
        let master = Gpt::new(&config(), 3).unwrap();
        let model = GptParallel::from_master(&master, tp, false).unwrap();
        let e = model
            .loss(&tokens(2, 8, 32, 0), &tokens(2, 8, 32, 1))
            .unwrap_err();
        assert!(e.to_string().contains("model_parallel_manual_seed"), "{e}");
    });
}

/// Without sequence parallelism the residual stream is replicated: with
/// dropout on, every TP rank's layer output is bitwise the same (the
/// residual masks come from the shared default stream), and it differs
/// from the eval-mode output (dropout did act).
#[test]
fn replicated_activations_stay_bitwise_equal_across_tp_ranks() {
    let outs = tp_run(2, |tp, r| {
        model_parallel_manual_seed(SEED, r).unwrap();
        let master = Gpt::new(&config(), 5).unwrap().h.remove(0);
        let mut layer = ParallelTransformerLayer::from_master(&master, tp, false).unwrap();
        let x = Var::constant(Tensor::randn_with(&[8, 2, 16], DType::F32, &mut Generator::new(6)).unwrap());
        let y1 = layer.forward(&x).unwrap();
        let y2 = layer.forward(&x).unwrap();
        layer.eval();
        let y_eval = layer.forward(&x).unwrap();
        assert_ne!(bits(y1.tensor()), bits(y_eval.tensor()), "dropout acted");
        assert_ne!(bits(y1.tensor()), bits(y2.tensor()), "fresh masks each forward");
        (bits(y1.tensor()), bits(y2.tensor()))
    });
    assert_eq!(outs[0], outs[1], "layer outputs equal bitwise on both TP ranks");
}

/// A TP = 2 GPT with dropout p = 0.3 (embedding, attention probabilities,
/// both residual branches) equals the serial GPT computed by hand with the
/// masks drawn from the tracker's streams: the loss, and every parameter
/// gradient as the slice of the serial one, with and without sequence
/// parallelism; over two steps, so the streams' continuation is covered.
/// In eval mode the TP model equals the serial `Gpt` itself.
#[test]
fn tp2_gpt_with_dropout_equals_the_serial_model_with_the_same_masks() {
    let t = 2;
    for sp in [false, true] {
        tp_run(t, |tp, r| {
            model_parallel_manual_seed(SEED, r).unwrap();
            let master = Gpt::new(&config(), 7).unwrap();
            let mut model = GptParallel::from_master(&master, tp, sp).unwrap();
            let roles = model.tp_params();
            let mut masks = Masks::new(t, sp);
            for step in 0..2 {
                let (x, y) = (tokens(2, 8, 32, step), tokens(2, 8, 32, step + 7));
                let loss = model.loss(&x, &y).unwrap();
                let mut g = loss.backward().unwrap();
                allreduce_sequence_parallel_grads(&roles, &mut g, tp).unwrap();
                let want = reference_loss_with(&master, &x, &y, &mut masks);
                let what = format!("sp={sp} step {step}");
                assert_close(loss.tensor(), want.tensor(), 1e-5, &format!("{what} loss"));
                let gs = want.backward().unwrap();
                let serial: Vec<(String, Parameter)> = master.named_parameters();
                for (name, p) in model.named_parameters() {
                    let sname = serial_name(&name);
                    let sparam = &serial.iter().find(|(n, _)| *n == sname).unwrap().1;
                    let full = pgrad(&gs, sparam);
                    let part = match split_of(&sname) {
                        Some((dim, stride)) => shard(&full, dim, stride, r, t).unwrap(),
                        None => full,
                    };
                    assert_close(&pgrad(&g, &p), &part, 1e-5, &format!("{what} grad of {name}"));
                }
            }

            model.eval();
            let (x, y) = (tokens(2, 8, 32, 3), tokens(2, 8, 32, 4));
            let mut serial = Gpt::new(&config(), 7).unwrap();
            serial.eval();
            let got = model.loss(&x, &y).unwrap();
            let want = serial.loss(&x, &y).unwrap();
            assert_close(got.tensor(), want.tensor(), 1e-5, &format!("sp={sp} eval loss"));
        });
    }
}

/// The serial GPT's mean loss computed by hand with the masks drawn from
/// `masks` (whose streams continue from one call to the next, as the TP
/// model's do).
fn reference_loss_with(master: &Gpt, x: &Tensor, y: &Tensor, masks: &mut Masks) -> Var {
    let (b, s) = (x.shape()[0], x.shape()[1]);
    let h = master.config().n_embd;
    let pos = Var::constant(Tensor::arange_int(0, s as i64, 1, DType::I64).unwrap());
    let e = master
        .wte
        .forward(&Var::constant(x.clone()))
        .unwrap()
        .add(&master.wpe.forward(&pos).unwrap())
        .unwrap()
        .transpose(0, 1)
        .unwrap();
    let mut hcur = drop(&e, masks.hidden(s, b, h));
    for blk in &master.h {
        hcur = reference_block(blk, &hcur, masks);
    }
    let v = master.config().vocab_size;
    let logits = master
        .ln_f
        .forward(&hcur)
        .unwrap()
        .linear(&master.wte.weight.var().unwrap(), None)
        .unwrap()
        .reshape(vec![s * b, v])
        .unwrap();
    let t_flat = y
        .transpose(0, 1)
        .unwrap()
        .contiguous()
        .unwrap()
        .reshape(vec![s * b])
        .unwrap();
    logits
        .cross_entropy(Target::Indices(&t_flat), &CrossEntropyOptions::default())
        .unwrap()
}

/// A checkpointed TP layer with dropout (attention on the model-parallel
/// stream, residuals on the default one) recomputes the same masks in
/// backward: gradients bitwise equal to the plain run's.
#[test]
fn checkpointed_tp_layer_replays_both_streams() {
    tp_run(2, |tp, r| {
        let master = Gpt::new(&config(), 9).unwrap().h.remove(0);
        let layer = Arc::new(ParallelTransformerLayer::from_master(&master, tp, false).unwrap());
        let x0 = Tensor::randn_with(&[8, 2, 16], DType::F32, &mut Generator::new(10)).unwrap();
        let run = |ckpt: bool| -> Vec<Vec<u32>> {
            model_parallel_manual_seed(SEED, r).unwrap();
            let x = Var::leaf(x0.clone());
            let y = if ckpt {
                let l = layer.clone();
                checkpoint(
                    move |xs: &[Var]| Ok(vec![l.forward(&xs[0])?]),
                    std::slice::from_ref(&x),
                )
                .unwrap()
                .remove(0)
            } else {
                layer.forward(&x).unwrap()
            };
            let g = y
                .mul(&y)
                .unwrap()
                .sum(&[0, 1, 2], false)
                .unwrap()
                .backward()
                .unwrap();
            let mut out = vec![bits(g.get(&x).unwrap())];
            out.extend(layer.parameters().iter().map(|p| bits(&pgrad(&g, p))));
            out
        };
        assert_eq!(
            run(false),
            run(true),
            "rank {r}: checkpointed grads equal the plain ones"
        );
    });
}
