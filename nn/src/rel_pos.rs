//! Relative position bias for attention over a fixed 2-D window (Swin,
//! CoAtNet; timm's `RelPosBias`).

use tessera_autograd::{Parameter, Var};
use tessera_tensor::{DType, Error, Result, Tensor};

use crate::{init, Buffer, Module};

/// A learned bias added to the attention logits of every head, indexed by
/// the relative offset of query and key inside an `H×W` window (timm's
/// `RelPosBias`): a table `relative_position_bias_table`
/// `[(2H−1)(2W−1), heads]` (trunc-normal, std 0.02) and a non-persistent
/// index buffer `relative_position_index` `[HW·HW]` (i64) that is not in
/// the state dict, as in timm. Entry `(i, j)` reads table row
/// `(Δh + H − 1)·(2W − 1) + (Δw + W − 1)` with `Δ = coords_i − coords_j`
/// (tokens in row-major order).
///
/// [`Module::forward`] adds the bias to logits `[B, heads, HW, HW]`;
/// [`RelPosBias::bias`] gives it as `[1, heads, HW, HW]` for an attention
/// mask. The bias is differentiable in the table.
#[derive(Debug, Clone, Module)]
pub struct RelPosBias {
    /// The learned biases, `[(2H−1)(2W−1), heads]`.
    pub relative_position_bias_table: Parameter,
    /// Table row of each (query, key) pair, `[HW·HW]`; not persistent.
    pub relative_position_index: Buffer,
    /// The window `(H, W)`.
    #[module(skip)]
    pub window: [usize; 2],
}

impl RelPosBias {
    /// A bias for an `H×W` window and `num_heads` heads. Errors when a
    /// window side or the head count is 0.
    pub fn new(window: [usize; 2], num_heads: usize) -> Result<RelPosBias> {
        let [h, w] = window;
        if h == 0 || w == 0 || num_heads == 0 {
            return Err(Error::arg(
                "RelPosBias::new",
                format!("window {window:?} and num_heads {num_heads} must be positive"),
            ));
        }
        let rows = (2 * h - 1) * (2 * w - 1);
        let table = Parameter::new(Tensor::zeros(&[rows, num_heads], DType::F32)?);
        init::trunc_normal_(&table, 0.0, 0.02, -2.0, 2.0)?;
        let n = h * w;
        let index = Tensor::build::<i64>("RelPosBias::new", &[n * n], |out| {
            for (k, slot) in out.iter_mut().enumerate() {
                let (i, j) = (k / n, k % n);
                let dh = (i / w) as i64 - (j / w) as i64 + h as i64 - 1;
                let dw = (i % w) as i64 - (j % w) as i64 + w as i64 - 1;
                *slot = dh * (2 * w as i64 - 1) + dw;
            }
        })?;
        Ok(RelPosBias {
            relative_position_bias_table: table,
            relative_position_index: Buffer::non_persistent(index),
            window,
        })
    }

    /// The number of heads.
    pub fn num_heads(&self) -> usize {
        self.relative_position_bias_table.shape()[1]
    }

    /// The bias `[1, heads, HW, HW]`, differentiable in the table. Errors
    /// only if a tensor cannot be allocated.
    pub fn bias(&self) -> Result<Var> {
        let n = self.window[0] * self.window[1];
        let rows = self
            .relative_position_bias_table
            .var()?
            .index_select(0, &self.relative_position_index.tensor())?;
        rows.reshape([n, n, self.num_heads()])?
            .permute(&[2, 0, 1])?
            .unsqueeze(0)
    }
}

impl Module for RelPosBias {
    /// `logits + bias` for logits `[B, heads, HW, HW]`. Errors when the
    /// logits' trailing shape is not `[heads, HW, HW]`.
    fn forward(&self, input: &Var) -> Result<Var> {
        let n = self.window[0] * self.window[1];
        let want = [self.num_heads(), n, n];
        if input.ndim() != 4 || input.shape()[1..] != want {
            return Err(Error::shape(
                "RelPosBias",
                format!(
                    "expected logits [B, {}, {n}, {n}], got {:?}",
                    want[0],
                    input.shape()
                ),
            ));
        }
        input.add(&self.bias()?)
    }
}
