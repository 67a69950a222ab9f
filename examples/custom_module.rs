//! A research script: a pre-norm transformer block by `#[derive(Module)]` (no lists of children), AdamW
//! without decay on biases and norms, cosine warm-up, clipping, `no_grad` evaluation and a checkpoint,
//! on a toy task: is the sum of a sequence's first feature positive?

use tessera::autograd::{no_grad, CrossEntropyOptions, Target, Var};
use tessera::nn::{Dropout, LayerNorm, Linear, Module, MultiheadAttention};
use tessera::optim::{clip_grad_norm, param_groups_weight_decay, AdamW, AdamWOptions};
use tessera::optim::{CosineLR, CosineOptions, LrScheduler, Optimizer};
use tessera::tensor::{manual_seed, Checkpoint, DType, GeluApprox, Result, Tensor};

/// x + drop(attn(ln1(x))), then x + drop(fc2(gelu(fc1(ln2(x))))).
#[derive(Module)]
struct Block {
    ln1: LayerNorm,
    attn: MultiheadAttention,
    ln2: LayerNorm,
    fc1: Linear,
    fc2: Linear,
    drop: Dropout,
}

impl Module for Block {
    fn forward(&self, x: &Var) -> Result<Var> {
        let x = x.add(&self.drop.forward(&self.attn.forward(&self.ln1.forward(x)?)?)?)?;
        let h = self.fc1.forward(&self.ln2.forward(&x)?)?.gelu(GeluApprox::None)?;
        x.add(&self.drop.forward(&self.fc2.forward(&h)?)?)
    }
}

/// Blocks over `[B, L, dim]`, mean-pooled over L, then a linear head.
#[derive(Module)]
struct Classifier {
    blocks: Vec<Block>,
    head: Linear,
}

impl Module for Classifier {
    fn forward(&self, x: &Var) -> Result<Var> {
        let h = self.blocks.iter().try_fold(x.clone(), |h, b| b.forward(&h))?;
        self.head.forward(&h.mean(&[1], false)?)
    }
}

fn classifier(dim: usize, depth: usize) -> Result<Classifier> {
    let ln = || LayerNorm::new(&[dim], 1e-5, true, true);
    let block = || -> Result<Block> {
        Ok(Block {
            ln1: ln()?,
            attn: MultiheadAttention::new(dim, 4, 0.1, true)?,
            ln2: ln()?,
            fc1: Linear::new(dim, 4 * dim, true)?,
            fc2: Linear::new(4 * dim, dim, true)?,
            drop: Dropout::new(0.1)?,
        })
    };
    let blocks = (0..depth).map(|_| block()).collect::<Result<_>>()?;
    let head = Linear::new(dim, 2, true)?;
    Ok(Classifier { blocks, head })
}

pub fn main() -> Result<()> {
    manual_seed(0);
    let batch = |n| -> Result<(Var, Tensor)> {
        let x = Tensor::randn(&[n, 8, 32], DType::F32)?;
        let y = x.narrow(2, 0, 1)?.sum(&[1, 2], false)?.gt_scalar(0.0)?;
        Ok((Var::constant(x), y.to_dtype(DType::I64)?))
    };
    let mut model = classifier(32, 2)?;
    let mut hyper = AdamWOptions::default();
    (hyper.lr, hyper.weight_decay) = (3e-3, 0.05);
    let mut opt = AdamW::with_groups(param_groups_weight_decay(&model.named_parameters(), &hyper, &[]))?;
    let (steps, mut cosine) = (60, CosineOptions::new(60));
    cosine.warmup_t = 6;
    let mut sched = CosineLR::new(&mut opt, cosine)?;
    let ce = CrossEntropyOptions::default();
    for _ in 0..steps {
        let (x, y) = batch(32)?;
        let loss = model.forward(&x)?.cross_entropy(Target::Indices(&y), &ce)?;
        let mut grads = loss.backward()?;
        clip_grad_norm(&mut grads, 1.0, 2.0)?;
        opt.step(&grads)?;
        sched.step(&mut opt)?;
    }
    model.eval(); // reaches every Dropout, also inside the Vec of blocks
    let (x, y) = batch(512)?;
    let logits = no_grad(|| model.forward(&x))?.tensor().clone();
    let right = logits.argmax(Some(1), false)?.eq(&y)?.to_dtype(DType::F32)?;
    println!("eval accuracy {:.3}", right.mean(&[], false)?.to_scalar::<f32>()?);

    let path = std::env::temp_dir().join("custom_module.safetensors");
    let ckpt = Checkpoint::new(model.state_dict()).with_optimizer(opt.state_dict());
    ckpt.with_scheduler(sched.state_dict()).at(1, steps).save(&path)?;
    let (back, mut restored) = (Checkpoint::load(&path)?, classifier(32, 2)?);
    restored.load_state_dict(&back.model, true)?;
    restored.eval();
    let again = no_grad(|| restored.forward(&x))?.tensor().to_vec::<f32>()?;
    assert_eq!(again, logits.to_vec::<f32>()?, "the restored model differs");
    println!("restored step {}: the same logits", back.step);
    Ok(())
}
