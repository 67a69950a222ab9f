//! Embedding: a lookup table of vectors.

use tessera_autograd::{Parameter, Var};
use tessera_tensor::{DType, Error, Result, Tensor};

use crate::Module;

/// A table of `num_embeddings` vectors of size `embedding_dim`
/// (`torch.nn.Embedding`): `forward` maps integer indices of any shape to
/// `[*, embedding_dim]`. Initialised N(0, 1) as PyTorch does, with the
/// `padding_idx` row zero (and receiving no gradient).
#[derive(Debug, Clone, Module)]
pub struct Embedding {
    /// The table, `[num_embeddings, embedding_dim]`.
    pub weight: Parameter,
    /// The row that stays zero and gets no gradient, if any.
    #[module(skip)]
    pub padding_idx: Option<usize>,
}

impl Embedding {
    /// A table in f32 drawn from the default generator. Errors when
    /// `padding_idx` is not a row of the table.
    pub fn new(num_embeddings: usize, embedding_dim: usize, padding_idx: Option<usize>) -> Result<Embedding> {
        if let Some(p) = padding_idx.filter(|&p| p >= num_embeddings) {
            return Err(Error::index(
                "Embedding::new",
                format!("padding_idx {p} must be within num_embeddings {num_embeddings}"),
            ));
        }
        let mut w = Tensor::randn(&[num_embeddings, embedding_dim], DType::F32)?;
        if let Some(p) = padding_idx {
            let row = p * embedding_dim..(p + 1) * embedding_dim;
            w.make_mut::<f32>()?[row].fill(0.0);
        }
        Ok(Embedding {
            weight: Parameter::new(w),
            padding_idx,
        })
    }
}

impl Module for Embedding {
    /// `input` holds integer indices (a constant `Var`). Errors for a
    /// non-integer dtype or an index out of range.
    fn forward(&self, input: &Var) -> Result<Var> {
        self.weight.var()?.embedding(input.tensor(), self.padding_idx)
    }
}
