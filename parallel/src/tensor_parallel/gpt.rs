//! The GPT of `tessera_nn::models` split over a tensor-parallel group,
//! optionally with sequence parallelism, as one module or as a list of
//! layers for the pipeline engine.

use tessera_autograd::{Parameter, Var};
use tessera_nn::models::{Gpt, GptConfig};
use tessera_nn::{Dropout, Embedding, LayerNorm, Module};
use tessera_tensor::{DType, Error, Result, StateDict, Tensor};

use super::blocks::{copy_norm, norm_role, ParallelTransformerLayer};
use super::cross_entropy::vocab_parallel_cross_entropy;
use super::layers::VocabParallelEmbedding;
use super::mappings::{copy_to_tensor_parallel_region, gather_from_sequence_parallel_region};
use super::random::region_dropout;
use super::{TensorParallel, TpComm, TpRole};
use crate::pipeline::LossFn;

/// A [`Gpt`] split over the group `comm`: the vocabulary-parallel token
/// embedding (also the output projection, tied), replicated position
/// embedding and norms, [`ParallelTransformerLayer`] blocks. `forward`
/// maps tokens `[b, s]` to this rank's logits `[s, b, V/t]`; the loss is the
/// vocabulary-parallel cross-entropy. Built from the master model, so a
/// TP-t model starts identical to the serial one.
#[derive(Clone, Module)]
pub struct GptParallel {
    /// Token and position embeddings.
    pub embed: GptEmbedding,
    /// The blocks.
    pub h: Vec<ParallelTransformerLayer>,
    /// The final norm and the tied output projection.
    pub head: GptHead,
    #[module(skip)]
    config: GptConfig,
    #[module(skip)]
    comm: TpComm,
    #[module(skip)]
    sequence_parallel: bool,
}

/// [`GptParallel`] as pipeline layers: `[embedding, block…, head]`, the
/// parameter roles of all of them, and the tied token embedding as the
/// embedding layer and the head hold it.
pub struct GptParallelLayers {
    /// The layers, in order (for `PipelineModule::new`).
    pub layers: Vec<Box<dyn Module>>,
    /// Every parameter with its role.
    pub roles: Vec<(Parameter, TpRole)>,
    /// The token embedding's shard in the first layer.
    pub wte: Parameter,
    /// The head's copy of it (the same parameter unless `untie` was asked).
    pub head_weight: Parameter,
}

impl GptParallel {
    /// Slices `master` for this rank of `comm` (dropout included: with
    /// `p > 0`, training needs `model_parallel_manual_seed` on each rank's
    /// thread). Errors when the vocabulary, the heads or `4h` do not divide
    /// by the group size.
    pub fn from_master(master: &Gpt, comm: &TpComm, sequence_parallel: bool) -> Result<Self> {
        let wte = VocabParallelEmbedding::from_master(&master.wte, comm)?;
        let head_weight = wte.weight.clone();
        let h = master
            .h
            .iter()
            .map(|b| ParallelTransformerLayer::from_master(b, comm, sequence_parallel))
            .collect::<Result<Vec<_>>>()?;
        Ok(GptParallel {
            embed: GptEmbedding {
                wte,
                wpe: Embedding {
                    weight: Parameter::new(master.wpe.weight.tensor()?),
                    padding_idx: None,
                },
                drop: master.drop.clone(),
                comm: comm.clone(),
                sequence_parallel,
            },
            h,
            head: GptHead {
                ln_f: copy_norm(&master.ln_f)?,
                weight: head_weight,
                comm: comm.clone(),
                sequence_parallel,
            },
            config: master.config().clone(),
            comm: comm.clone(),
            sequence_parallel,
        })
    }

    /// Builds the serial model from `sd` (names as [`Gpt`]'s state dict,
    /// strict) and slices it: the inverse of [`GptParallel::consolidate`].
    pub fn from_state_dict(
        config: &GptConfig,
        sd: &StateDict,
        comm: &TpComm,
        sequence_parallel: bool,
    ) -> Result<Self> {
        let master = Gpt::new(config, 0)?;
        master.load_state_dict(sd, true)?;
        Self::from_master(&master, comm, sequence_parallel)
    }

    /// The unsharded state dict, with [`Gpt`]'s names and shapes, on every
    /// rank (a collective over the group). Errors when a collective fails.
    pub fn consolidate(&self) -> Result<StateDict> {
        let mut sd = StateDict::new();
        sd.insert("wte.weight", self.embed.wte.master_weight()?);
        sd.insert("wpe.weight", self.embed.wpe.weight.tensor()?);
        for (i, b) in self.h.iter().enumerate() {
            let p = format!("h.{i}.");
            for (name, norm) in [("ln_1", &b.ln_1), ("ln_2", &b.ln_2)] {
                for (k, v) in norm.state_dict().iter() {
                    sd.insert(format!("{p}{name}.{k}"), v.clone());
                }
            }
            let linears = [
                ("attn.c_attn", b.attn.c_attn.master_weights()?),
                ("attn.c_proj", b.attn.c_proj.master_weights()?),
                ("mlp.c_fc", b.mlp.c_fc.master_weights()?),
                ("mlp.c_proj", b.mlp.c_proj.master_weights()?),
            ];
            for (name, (w, bias)) in linears {
                sd.insert(format!("{p}{name}.weight"), w);
                if let Some(bias) = bias {
                    sd.insert(format!("{p}{name}.bias"), bias);
                }
            }
        }
        for (k, v) in self.head.ln_f.state_dict().iter() {
            sd.insert(format!("ln_f.{k}"), v.clone());
        }
        Ok(sd)
    }

    /// The mean next-token cross-entropy of `tokens` `[b, s]` against
    /// `targets` `[b, s]`, the same on every rank.
    pub fn loss(&self, tokens: &Tensor, targets: &Tensor) -> Result<Var> {
        let logits = self.forward(&Var::constant(tokens.clone()))?;
        Self::loss_fn(self.comm.clone())(&logits, targets)
    }

    /// The loss of the pipeline's last stage: local logits `[s, b, V/t]`
    /// and targets `[b, s]` → the mean vocabulary-parallel cross-entropy.
    pub fn loss_fn(comm: TpComm) -> LossFn {
        Box::new(move |logits: &Var, targets: &Tensor| {
            let t = targets.transpose(0, 1)?.contiguous()?;
            vocab_parallel_cross_entropy(logits, &t, &comm, 0.0)?.mean(&[0, 1], false)
        })
    }

    /// The configuration of the master model.
    pub fn config(&self) -> &GptConfig {
        &self.config
    }

    /// Whether it runs with sequence parallelism.
    pub fn sequence_parallel(&self) -> bool {
        self.sequence_parallel
    }

    /// The model as pipeline layers. With `untie`, the head gets its own
    /// copy of the token embedding (for a pipeline whose first and last
    /// stages differ; tie them with `PipelineEngine::tie`).
    pub fn into_layers(self, untie: bool) -> GptParallelLayers {
        let roles = self.tp_params();
        let wte = self.embed.wte.weight.clone();
        let mut head = self.head;
        let mut roles = roles;
        if untie {
            head.weight = Parameter::new(wte.current());
            roles.push((head.weight.clone(), TpRole::Sharded));
        }
        let head_weight = head.weight.clone();
        let mut layers: Vec<Box<dyn Module>> = vec![Box::new(self.embed)];
        layers.extend(self.h.into_iter().map(|b| Box::new(b) as Box<dyn Module>));
        layers.push(Box::new(head));
        GptParallelLayers {
            layers,
            roles,
            wte,
            head_weight,
        }
    }
}

impl Module for GptParallel {
    /// `tokens` `[b, s]` i64 → this rank's logits `[s, b, V/t]`.
    fn forward(&self, tokens: &Var) -> Result<Var> {
        let mut x = self.embed.forward(tokens)?;
        for b in &self.h {
            x = b.forward(&x)?;
        }
        self.head.forward(&x)
    }
}

impl TensorParallel for GptParallel {
    fn tp_params(&self) -> Vec<(Parameter, TpRole)> {
        let mut out = self.embed.tp_params();
        out.extend(self.h.iter().flat_map(TensorParallel::tp_params));
        out.extend(
            self.head
                .tp_params()
                .into_iter()
                .filter(|(p, _)| !p.same(&self.embed.wte.weight)),
        );
        out
    }
}

/// Token (vocabulary-parallel) plus position embedding and dropout, as
/// `[s, b, h]`; under sequence parallelism only this rank's `s/t`
/// positions: the token lookups are reduce-scattered along the sequence
/// (Megatron's `reduce_scatter_embeddings`) and this rank adds its rows of
/// the position table.
#[derive(Clone, Module)]
pub struct GptEmbedding {
    /// This rank's rows of the token embedding.
    pub wte: VocabParallelEmbedding,
    /// The position embedding (replicated).
    pub wpe: Embedding,
    /// Dropout after the sum (default stream, or the model-parallel one
    /// under sequence parallelism).
    pub drop: Dropout,
    #[module(skip)]
    comm: TpComm,
    #[module(skip)]
    sequence_parallel: bool,
}

impl Module for GptEmbedding {
    /// `tokens` `[b, s]` i64 → `[s, b, h]` (`[s/t, b, h]` with sequence
    /// parallelism). Errors when `s` exceeds the position table, does not
    /// divide by the group size under sequence parallelism, or dropout
    /// needs the model-parallel RNG and it was not seeded.
    fn forward(&self, tokens: &Var) -> Result<Var> {
        const OP: &str = "GptEmbedding";
        let s = match tokens.shape() {
            &[_, s] if s <= self.wpe.weight.shape()[0] => s,
            other => {
                return Err(Error::shape(
                    OP,
                    format!(
                        "tokens must be [b, s ≤ {}], got {other:?}",
                        self.wpe.weight.shape()[0]
                    ),
                ))
            }
        };
        let x = if self.sequence_parallel {
            let x = self.wte.forward_reduce_scatter(tokens)?;
            let part = x.shape()[0];
            let first = (self.comm.rank() * part) as i64;
            let pos = Var::constant(Tensor::arange_int(first, first + part as i64, 1, DType::I64)?);
            x.add(&self.wpe.forward(&pos)?.unsqueeze(1)?)?
        } else {
            let pos = Var::constant(Tensor::arange_int(0, s as i64, 1, DType::I64)?);
            let x = self.wte.forward(tokens)?.add(&self.wpe.forward(&pos)?)?;
            x.transpose(0, 1)?.contiguous()?
        };
        region_dropout(&self.drop, &x, self.sequence_parallel, OP)
    }
}

impl TensorParallel for GptEmbedding {
    fn tp_params(&self) -> Vec<(Parameter, TpRole)> {
        let mut out = self.wte.tp_params();
        // Under sequence parallelism each rank adds only its positions' rows.
        out.push((self.wpe.weight.clone(), norm_role(self.sequence_parallel)));
        out
    }
}

/// The final norm and the output projection on this rank's vocabulary
/// rows: `[s, b, h]` → `[s, b, V/t]`.
#[derive(Clone, Module)]
pub struct GptHead {
    /// The final norm (replicated).
    pub ln_f: LayerNorm,
    /// This rank's rows of the (tied) token embedding, `[V/t, h]`.
    pub weight: Parameter,
    #[module(skip)]
    comm: TpComm,
    #[module(skip)]
    sequence_parallel: bool,
}

impl Module for GptHead {
    fn forward(&self, x: &Var) -> Result<Var> {
        let x = self.ln_f.forward(x)?;
        let x = match self.sequence_parallel {
            true => gather_from_sequence_parallel_region(&x, &self.comm, true)?,
            false => copy_to_tensor_parallel_region(&x, &self.comm)?,
        };
        x.linear(&self.weight.var()?, None)
    }
}

impl TensorParallel for GptHead {
    fn tp_params(&self) -> Vec<(Parameter, TpRole)> {
        let role = norm_role(self.sequence_parallel);
        let mut out: Vec<(Parameter, TpRole)> =
            self.ln_f.parameters().into_iter().map(|p| (p, role)).collect();
        out.push((self.weight.clone(), TpRole::Sharded));
        out
    }
}
