//! Gradcheck cases of the nn-level ops (matmul, convolution, pooling,
//! indexing, joining, dropout, losses, attention), one submodule per
//! family, with forward checks against naive f64 references.

mod attention;
mod conv;
mod index;
mod join;
mod linalg;
mod loss;

use attention::*;
use conv::*;
use index::*;
use join::*;
use linalg::*;
use loss::*;

use proptest::prelude::*;
use tessera_autograd::Var;
use tessera_tensor::Result;

use crate::gradcheck::common::{arrange, fail, Input};

cases! {
    matmul: ["matmul"] => matmul_case;
    linear: ["linear"] => linear_case;
    conv2d: ["conv2d"] => conv2d_case;
    conv2d_depthwise: ["conv2d"] => conv2d_depthwise_case;
    max_pool2d: ["max_pool2d"] => max_pool2d_case;
    avg_pool2d: ["avg_pool2d"] => avg_pool2d_case;
    adaptive_avg_pool2d: ["adaptive_avg_pool2d"] => adaptive_avg_pool2d_case;
    interpolate_bilinear: ["interpolate_bilinear"] => interpolate_case;
    index_select: ["index_select"] => index_select_case;
    gather: ["gather"] => gather_case;
    scatter_add: ["scatter_add"] => scatter_add_case;
    masked_fill: ["masked_fill"] => masked_fill_case;
    embedding: ["embedding"] => embedding_case;
    topk: ["topk"] => topk_case;
    cat: ["cat"] => cat_case;
    stack: ["stack"] => stack_case;
    split: ["split"] => split_case;
    chunk: ["chunk"] => chunk_case;
    pad: ["pad"] => pad_case;
    repeat: ["repeat"] => repeat_case;
    tril_triu: ["tril", "triu"] => tri_case;
    dropout: ["dropout"] => dropout_case;
    cross_entropy_indices: ["cross_entropy"] => cross_entropy_indices_case;
    cross_entropy_probs: ["log_softmax"] => cross_entropy_probs_case;
    nll_loss: ["gather", "mul"] => nll_loss_case;
    mse_loss: ["sub", "mul"] => mse_loss_case;
    bce_with_logits: ["exp", "log1p"] => bce_case;
    attention_masks: ["scaled_dot_product_attention"] => attention_case;
    attention_dropout: ["scaled_dot_product_attention"] => attention_dropout_case;
    attention_composite_masks: ["matmul", "softmax", "masked_fill", "add"] => attention_composite_case;
    attention_composite_dropout: ["matmul", "softmax", "dropout"] => attention_composite_dropout_case;
}

/// The view of leaf `x` that `inp` describes.
fn view(inp: &Input, x: &Var) -> Result<Var> {
    inp.arrange.apply(x)
}

/// The arranged view of `inp` as a constant, for forward checks.
fn seen_var(inp: &Input) -> std::result::Result<Var, TestCaseError> {
    inp.arrange.apply(&Var::constant(inp.leaf())).map_err(fail)
}

/// An input of `shape`, any arrangement, whose values are pairwise at least
/// 0.05 apart (so a max or a top-k is not changed by a finite-difference
/// step).
fn distinct_input(shape: Vec<usize>) -> impl Strategy<Value = Input> {
    arrange().prop_flat_map(move |a| {
        let shape = shape.clone();
        let n: usize = a.stored(&shape).iter().product();
        Just((0..n).collect::<Vec<_>>())
            .prop_shuffle()
            .prop_map(move |perm| Input {
                shape: shape.clone(),
                arrange: a,
                values: perm.iter().map(|&p| p as f64 * 0.05 - n as f64 * 0.025).collect(),
            })
    })
}

/// The flat row-major offset of multi-index `idx` in `shape`, reading a
/// size-1 dim of `shape` at 0 (broadcasting; `idx` may be longer, aligned
/// at the end).
fn bcast_offset(idx: &[usize], shape: &[usize]) -> usize {
    let lead = idx.len() - shape.len();
    shape
        .iter()
        .enumerate()
        .fold(0, |acc, (d, &s)| acc * s + if s == 1 { 0 } else { idx[lead + d] })
}

/// Every multi-index of `shape` in row-major order.
fn indices(shape: &[usize]) -> Vec<Vec<usize>> {
    let n: usize = shape.iter().product();
    (0..n)
        .map(|mut f| {
            let mut idx = vec![0; shape.len()];
            for d in (0..shape.len()).rev() {
                idx[d] = f % shape[d];
                f /= shape[d];
            }
            idx
        })
        .collect()
}
