//! Megatron's tensor-parallel layers (spec §6.2, §6.4): column- and
//! row-parallel linear layers with torch's `[out, in]` weight layout, and
//! the vocabulary-parallel embedding. Each is built from the unsharded
//! ("master") layer by slicing it, so a TP-t model starts identical to the
//! serial one, and gives its master weights back with a collective.

use tessera_autograd::{Parameter, Var};
use tessera_nn::{Embedding, Linear, Module};
use tessera_tensor::{DType, Error, Result, Tensor};

use super::mappings::{
    copy_to_tensor_parallel_region, gather_from_sequence_parallel_region, gather_from_tensor_parallel_region,
    reduce_from_tensor_parallel_region, reduce_scatter_to_sequence_parallel_region,
    scatter_to_tensor_parallel_region,
};
use super::shard::{shard, unshard};
use super::{TensorParallel, TpComm, TpRole};

/// Options of a [`ColumnParallelLinear`].
#[derive(Debug, Clone, Copy)]
pub struct ColumnOptions {
    /// All-gather the output's last dim so every rank gets the whole `Y`
    /// (Megatron's `gather_output`); otherwise each rank keeps `Y_r`.
    pub gather_output: bool,
    /// The input is sharded along the sequence (dim 0) and is all-gathered
    /// in forward, reduce-scattered in backward, instead of Megatron's `f`.
    pub sequence_parallel: bool,
    /// The master rows are cut into `stride` interleaved groups (3 for a
    /// fused QKV `[3h, h]`: rank r keeps `q_r, k_r, v_r`).
    pub stride: usize,
}

impl Default for ColumnOptions {
    fn default() -> Self {
        ColumnOptions {
            gather_output: false,
            sequence_parallel: false,
            stride: 1,
        }
    }
}

/// `Y = X·Aᵀ + b` with `A` split by rows (output features) over the
/// tensor-parallel group: rank r holds `A_r` `[out/t, in]` and `b_r`
/// (Megatron's `ColumnParallelLinear`).
#[derive(Clone, Module)]
pub struct ColumnParallelLinear {
    /// This rank's rows of the weight, `[out/t, in]`.
    pub weight: Parameter,
    /// This rank's slice of the bias, `[out/t]`.
    pub bias: Option<Parameter>,
    #[module(skip)]
    comm: TpComm,
    #[module(skip)]
    opts: ColumnOptions,
}

impl ColumnParallelLinear {
    /// Slices `master` (`[out, in]`, the same on every rank) for this rank.
    /// Errors when `out` does not divide by `t · stride` or the stride is 0.
    pub fn from_master(master: &Linear, comm: &TpComm, opts: ColumnOptions) -> Result<Self> {
        let (t, r) = (comm.world_size(), comm.rank());
        let weight = shard(&master.weight.tensor()?, 0, opts.stride, r, t)?;
        let bias = master
            .bias
            .as_ref()
            .map(|b| shard(&b.tensor()?, 0, opts.stride, r, t))
            .transpose()?;
        Ok(ColumnParallelLinear {
            weight: Parameter::new(weight),
            bias: bias.map(Parameter::new),
            comm: comm.clone(),
            opts,
        })
    }

    /// The unsharded `(weight, bias)`, gathered from every rank in the
    /// master's layout (a collective over the group). Errors on a
    /// communication failure.
    pub fn master_weights(&self) -> Result<(Tensor, Option<Tensor>)> {
        let w = unshard(&self.comm, &self.weight.tensor()?, 0, self.opts.stride)?;
        let b = self
            .bias
            .as_ref()
            .map(|b| unshard(&self.comm, &b.tensor()?, 0, self.opts.stride))
            .transpose()?;
        Ok((w, b))
    }
}

impl Module for ColumnParallelLinear {
    /// `x` is `[..., in]` (`[s/t, b, in]` under sequence parallelism);
    /// returns `[..., out/t]`, or `[..., out]` with `gather_output`. Errors
    /// when the shapes do not fit or a collective fails.
    fn forward(&self, x: &Var) -> Result<Var> {
        let x = if self.opts.sequence_parallel {
            gather_from_sequence_parallel_region(x, &self.comm, true)?
        } else {
            copy_to_tensor_parallel_region(x, &self.comm)?
        };
        let b = self.bias.as_ref().map(Parameter::var).transpose()?;
        let y = x.linear(&self.weight.var()?, b.as_ref())?;
        if self.opts.gather_output {
            gather_from_tensor_parallel_region(&y, &self.comm)
        } else {
            Ok(y)
        }
    }
}

impl TensorParallel for ColumnParallelLinear {
    fn tp_params(&self) -> Vec<(Parameter, TpRole)> {
        let mut out = vec![(self.weight.clone(), TpRole::Sharded)];
        out.extend(self.bias.iter().map(|b| (b.clone(), TpRole::Sharded)));
        out
    }
}

/// Options of a [`RowParallelLinear`].
#[derive(Debug, Clone, Copy, Default)]
pub struct RowOptions {
    /// The input already holds this rank's slice of the last dim (the
    /// output of a column-parallel layer); otherwise it is scattered.
    pub input_is_parallel: bool,
    /// Reduce-scatter the output along the sequence (dim 0) instead of
    /// all-reducing it. Needs `input_is_parallel`.
    pub sequence_parallel: bool,
}

/// `Y = X·Aᵀ + b` with `A` split by columns (input features): rank r holds
/// `A_r` `[out, in/t]` and multiplies its slice `X_r`; the partial products
/// are summed over the group, then the replicated bias is added (Megatron's
/// `RowParallelLinear`).
#[derive(Clone, Module)]
pub struct RowParallelLinear {
    /// This rank's columns of the weight, `[out, in/t]`.
    pub weight: Parameter,
    /// The whole bias `[out]`, replicated on every rank.
    pub bias: Option<Parameter>,
    #[module(skip)]
    comm: TpComm,
    #[module(skip)]
    opts: RowOptions,
}

impl RowParallelLinear {
    /// Slices `master` for this rank. Errors when `in` does not divide by
    /// `t`, or with sequence parallelism but not `input_is_parallel`.
    pub fn from_master(master: &Linear, comm: &TpComm, opts: RowOptions) -> Result<Self> {
        if opts.sequence_parallel && !opts.input_is_parallel {
            return Err(Error::arg(
                "RowParallelLinear::from_master",
                "sequence parallelism needs input_is_parallel",
            ));
        }
        let weight = shard(&master.weight.tensor()?, 1, 1, comm.rank(), comm.world_size())?;
        Ok(RowParallelLinear {
            weight: Parameter::new(weight),
            bias: master
                .bias
                .as_ref()
                .map(|b| b.tensor().map(Parameter::new))
                .transpose()?,
            comm: comm.clone(),
            opts,
        })
    }

    /// The unsharded `(weight, bias)` (a collective over the group).
    pub fn master_weights(&self) -> Result<(Tensor, Option<Tensor>)> {
        let w = unshard(&self.comm, &self.weight.tensor()?, 1, 1)?;
        Ok((w, self.bias.as_ref().map(Parameter::tensor).transpose()?))
    }
}

impl Module for RowParallelLinear {
    /// `x` is `[..., in/t]` with `input_is_parallel`, else `[..., in]`;
    /// returns `[..., out]` (`[s/t, b, out]` under sequence parallelism).
    fn forward(&self, x: &Var) -> Result<Var> {
        let x = if self.opts.input_is_parallel {
            x.clone()
        } else {
            scatter_to_tensor_parallel_region(x, &self.comm)?
        };
        let partial = x.linear(&self.weight.var()?, None)?;
        let y = if self.opts.sequence_parallel {
            reduce_scatter_to_sequence_parallel_region(&partial, &self.comm)?
        } else {
            reduce_from_tensor_parallel_region(&partial, &self.comm)?
        };
        match &self.bias {
            Some(b) => y.add(&b.var()?),
            None => Ok(y),
        }
    }
}

impl TensorParallel for RowParallelLinear {
    fn tp_params(&self) -> Vec<(Parameter, TpRole)> {
        // Under sequence parallelism the bias is added to this rank's
        // tokens only, so its gradient is partial (Megatron marks it
        // `sequence_parallel`).
        let bias_role = match self.opts.sequence_parallel {
            true => TpRole::SequenceParallel,
            false => TpRole::Replicated,
        };
        let mut out = vec![(self.weight.clone(), TpRole::Sharded)];
        out.extend(self.bias.iter().map(|b| (b.clone(), bias_role)));
        out
    }
}

/// An embedding table split by rows (vocabulary) over the group: rank r
/// holds rows `[r·V/t, (r+1)·V/t)`, looks up the ids it owns (zeros for the
/// others), and the group all-reduces the lookups (Megatron's
/// `VocabParallelEmbedding`).
#[derive(Clone, Module)]
pub struct VocabParallelEmbedding {
    /// This rank's rows of the table, `[V/t, h]`.
    pub weight: Parameter,
    #[module(skip)]
    comm: TpComm,
}

impl VocabParallelEmbedding {
    /// Slices `master` (`[V, h]`) for this rank. Errors when `V` does not
    /// divide by `t` (pad the vocabulary, as Megatron does).
    pub fn from_master(master: &Embedding, comm: &TpComm) -> Result<Self> {
        Self::from_table(&master.weight.tensor()?, comm)
    }

    /// Slices the table `[V, h]` for this rank (errors as
    /// [`VocabParallelEmbedding::from_master`]).
    pub fn from_table(table: &Tensor, comm: &TpComm) -> Result<Self> {
        let weight = shard(table, 0, 1, comm.rank(), comm.world_size())?;
        Ok(VocabParallelEmbedding {
            weight: Parameter::new(weight),
            comm: comm.clone(),
        })
    }

    /// The vocabulary rows `start .. end` this rank owns.
    pub fn vocab_range(&self) -> std::ops::Range<usize> {
        let rows = self.weight.shape()[0];
        self.comm.rank() * rows..(self.comm.rank() + 1) * rows
    }

    /// The unsharded table `[V, h]` (a collective over the group).
    pub fn master_weight(&self) -> Result<Tensor> {
        unshard(&self.comm, &self.weight.tensor()?, 0, 1)
    }

    /// The lookup for sequence parallelism (Megatron's
    /// `reduce_scatter_embeddings=True`): `ids` `[b, s]` → this rank's
    /// `s/t` positions `[s/t, b, h]`, the ranks' partial lookups
    /// reduce-scattered along the sequence (and the gradient all-gathered
    /// back) instead of all-reduced and then cut. Errors as
    /// [`Module::forward`], for ids that are not `[b, s]`, and when `s`
    /// does not divide by the group size.
    pub fn forward_reduce_scatter(&self, ids: &Var) -> Result<Var> {
        const OP: &str = "VocabParallelEmbedding::forward_reduce_scatter";
        if ids.ndim() != 2 {
            return Err(Error::shape(
                OP,
                format!("token ids must be [b, s], got {:?}", ids.shape()),
            ));
        }
        let rows = self.partial_lookup(ids, OP)?.transpose(0, 1)?.contiguous()?;
        reduce_scatter_to_sequence_parallel_region(&rows, &self.comm)
    }

    /// This rank's rows for the ids it owns, zeros for the others: `[*, h]`.
    fn partial_lookup(&self, ids: &Var, op: &'static str) -> Result<Var> {
        let ids_t = ids.tensor();
        if ids_t.dtype() != DType::I64 {
            return Err(Error::dtype(
                op,
                format!("token ids must be i64, got {}", ids_t.dtype()),
            ));
        }
        let range = self.vocab_range();
        let vocab = range.len() * self.comm.world_size();
        let all = ids_t.to_vec::<i64>()?;
        if let Some(bad) = all.iter().find(|&&i| i < 0 || i as u64 >= vocab as u64) {
            return Err(Error::index(
                op,
                format!("token id {bad} outside the vocabulary 0..{vocab}"),
            ));
        }
        let owned = |i: i64| range.contains(&(i as usize));
        let local: Vec<i64> = all
            .iter()
            .map(|&i| if owned(i) { i - range.start as i64 } else { 0 })
            .collect();
        let keep: Vec<f32> = all.iter().map(|&i| if owned(i) { 1.0 } else { 0.0 }).collect();
        let mut keep_shape = ids_t.shape().to_vec();
        keep_shape.push(1);
        let local = Tensor::from_vec(local, ids_t.shape())?;
        let keep = Var::constant(Tensor::from_vec(keep, &keep_shape)?);
        self.weight.var()?.embedding(&local, None)?.mul(&keep)
    }
}

impl Module for VocabParallelEmbedding {
    /// `ids` holds i64 token ids of any shape; returns `[*, h]`, the ranks'
    /// partial lookups all-reduced. Errors for a non-i64 input, an id
    /// outside `0 .. V`, or a failed all-reduce.
    fn forward(&self, ids: &Var) -> Result<Var> {
        let rows = self.partial_lookup(ids, "VocabParallelEmbedding")?;
        reduce_from_tensor_parallel_region(&rows, &self.comm)
    }
}

impl TensorParallel for VocabParallelEmbedding {
    fn tp_params(&self) -> Vec<(Parameter, TpRole)> {
        vec![(self.weight.clone(), TpRole::Sharded)]
    }
}
