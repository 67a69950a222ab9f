//! Own test binary: it reads the process-wide live-byte counter, which any other test would move.
//!
//! What autograd keeps alive, measured with tessera-tensor's live-byte
//! counter.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use tessera_autograd::{Gradients, Var};
use tessera_tensor::{live_bytes, manual_seed, DType, Result, Tensor};

/// Serializes the tests of this binary: the counter is process-wide.
static ALONE: Mutex<()> = Mutex::new(());

/// A small MLP-like chain from elementwise ops and reductions:
/// relu(x·w1 + b1) → tanh(h·w2 + b2) → mean of squares.
fn forward(x: &Var, params: &[Var]) -> Result<Var> {
    let h = x.mul(&params[0])?.add(&params[1])?.relu()?;
    let h = h.sum(&[-1], true)?.mul(&params[2])?.add(&params[3])?.tanh()?;
    h.square()?.mean(&[], false)
}

/// Bytes of the distinct storages behind the gradients.
fn grad_bytes(grads: &Gradients) -> usize {
    let mut seen = HashSet::new();
    grads
        .iter()
        .filter(|(_, g)| seen.insert(Arc::as_ptr(g.storage())))
        .map(|(_, g)| g.storage().as_bytes().len())
        .sum()
}

#[test]
fn backward_frees_everything_but_the_gradients() -> Result<()> {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    manual_seed(7);
    let x = Var::constant(Tensor::randn(&[64, 128], DType::F32)?);
    let params: Vec<Var> = [vec![128], vec![128], vec![64, 32], vec![32]]
        .iter()
        .map(|s| Tensor::randn(s, DType::F32).map(Var::leaf))
        .collect::<Result<_>>()?;

    let before = live_bytes();
    let loss = forward(&x, &params)?;
    let after_forward = live_bytes();
    // The saved activations: at least the [64, 128] relu output.
    assert!(
        after_forward >= before + 64 * 128 * 4,
        "{before} -> {after_forward}"
    );

    let grads = loss.backward()?;
    drop(loss);
    let after_backward = live_bytes();
    assert_eq!(grads.len(), params.len());
    assert_eq!(
        after_backward,
        before + grad_bytes(&grads),
        "before {before}, after forward {after_forward}"
    );

    drop(grads);
    assert_eq!(live_bytes(), before);
    Ok(())
}

#[test]
fn a_frozen_weight_gets_no_gradient_and_keeps_nothing_alive() -> Result<()> {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    manual_seed(8);
    let x = Var::constant(Tensor::randn(&[32, 16], DType::F32)?);
    let w = Var::leaf(Tensor::randn(&[16], DType::F32)?);
    let frozen = Var::constant(Tensor::randn(&[16], DType::F32)?);
    let before = live_bytes();
    // x·frozen needs nothing saved (neither operand requires grad), so only
    // the product with w saves its partner.
    let loss = x.mul(&frozen)?.mul(&w)?.sum(&[], false)?;
    let grads = loss.backward()?;
    drop(loss);
    assert!(grads.get(&frozen).is_none());
    assert_eq!(live_bytes(), before + grad_bytes(&grads));
    Ok(())
}

/// `checkpoint_sequential` over blocks with dropout: the gradients equal the
/// plain run's bitwise (the RNG state is replayed), and what the forward
/// leaves alive for backward shrinks to the segment boundaries.
#[test]
fn checkpoint_sequential_matches_plain_bitwise_and_keeps_less() -> Result<()> {
    let _alone = ALONE.lock().unwrap_or_else(|e| e.into_inner());
    manual_seed(9);
    let x = Var::leaf(Tensor::randn(&[16, 64], DType::F32)?);
    let ws: Vec<Var> = (0..8)
        .map(|_| Tensor::randn(&[64], DType::F32).map(Var::leaf))
        .collect::<Result<_>>()?;
    type Block = Box<dyn Fn(&Var) -> Result<Var> + Send + Sync>;
    let blocks = || -> Vec<Block> {
        ws.iter()
            .map(|w| {
                let w = w.clone();
                Box::new(move |h: &Var| h.mul(&w)?.tanh()?.dropout(0.25, true)) as Block
            })
            .collect()
    };
    // Returns the gradients of x and every w, and the bytes the forward
    // left alive.
    let run = |every: Option<usize>| -> Result<(Vec<Vec<u32>>, usize)> {
        manual_seed(10);
        let before = live_bytes();
        let h = match every {
            Some(k) => tessera_autograd::checkpoint_sequential(blocks(), k, &x)?,
            None => blocks().iter().try_fold(x.clone(), |h, b| b(&h))?,
        };
        let loss = h.square()?.sum(&[], false)?;
        let kept = live_bytes() - before;
        let grads = loss.backward()?;
        let bits = std::iter::once(&x)
            .chain(&ws)
            .map(|v| {
                let g = grads.get(v).expect("every leaf gets a gradient");
                g.to_vec::<f32>().map(|g| g.iter().map(|v| v.to_bits()).collect())
            })
            .collect::<Result<_>>()?;
        Ok((bits, kept))
    };
    let (plain, plain_kept) = run(None)?;
    let (ck, ck_kept) = run(Some(4))?;
    assert_eq!(plain, ck, "checkpointed gradients equal the plain ones bitwise");
    // Plain keeps 4 tensors per block (input, tanh output, mask, output);
    // two segments of four keep about their two boundaries.
    assert!(
        ck_kept * 4 < plain_kept,
        "checkpoint_sequential kept {ck_kept} bytes, plain {plain_kept}"
    );
    Ok(())
}
