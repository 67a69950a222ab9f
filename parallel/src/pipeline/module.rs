//! [`PipelineModule`]: a list of layers split into contiguous parts, one per
//! virtual stage, and the [`PipelineStage`] a rank keeps of it.

use std::ops::Range;

use tessera_autograd::{Parameter, Var};
use tessera_nn::{Module, Sequential, Visit, Visitor};

use super::partition::Partition;
use crate::error::{CommError, Result};

/// A model as a list of layers, split over `stages · chunks` virtual stages
/// (DeepSpeed's `PipelineModule`). Virtual stage `k = chunk · stages + stage`
/// holds layers `bounds[k] .. bounds[k + 1]` (Megatron's interleaved
/// assignment: with 16 layers, 4 stages and 2 chunks, stage 0 holds layers
/// 0–1 and 8–9).
///
/// Every rank may build the same list (same seed) and keep its own part
/// with [`PipelineModule::into_stage`].
pub struct PipelineModule {
    layers: Vec<Box<dyn Module>>,
    bounds: Vec<usize>,
    stages: usize,
    chunks: usize,
}

impl PipelineModule {
    /// Splits `layers` into `stages · chunks` parts by `partition`. Errors
    /// when `stages` or `chunks` is 0 and as [`Partition::bounds`] does.
    pub fn new(
        layers: Vec<Box<dyn Module>>,
        stages: usize,
        chunks: usize,
        partition: &Partition,
    ) -> Result<Self> {
        let parts = stages.checked_mul(chunks).unwrap_or(0);
        if parts == 0 {
            return Err(CommError::arg(
                "PipelineModule::new",
                format!("needs at least one stage and one chunk per stage, got {stages} and {chunks}"),
            ));
        }
        let weights: Vec<usize> = layers.iter().map(|l| l.num_trainable_parameters()).collect();
        let bounds = partition.bounds(&weights, parts)?;
        Ok(PipelineModule {
            layers,
            bounds,
            stages,
            chunks,
        })
    }

    /// [`PipelineModule::new`] over the layers of a `Sequential`.
    pub fn from_sequential(
        seq: Sequential,
        stages: usize,
        chunks: usize,
        partition: &Partition,
    ) -> Result<Self> {
        Self::new(seq.layers, stages, chunks, partition)
    }

    /// The `stages · chunks + 1` layer boundaries of the virtual stages.
    pub fn bounds(&self) -> &[usize] {
        &self.bounds
    }

    /// The layers of chunk `chunk` on stage `stage`. Panics when either is
    /// out of range (an index, as slices do).
    pub fn layers_of(&self, stage: usize, chunk: usize) -> Range<usize> {
        assert!(
            stage < self.stages && chunk < self.chunks,
            "stage {stage} chunk {chunk} out of range"
        );
        let k = chunk * self.stages + stage;
        self.bounds[k]..self.bounds[k + 1]
    }

    /// Keeps the layers of stage `stage` (its `chunks` parts) and drops the
    /// rest. Errors when `stage` is not below the stage count.
    pub fn into_stage(self, stage: usize) -> Result<PipelineStage> {
        if stage >= self.stages {
            return Err(CommError::arg(
                "PipelineModule::into_stage",
                format!("stage {stage} of a {}-stage pipeline", self.stages),
            ));
        }
        let ranges: Vec<Range<usize>> = (0..self.chunks).map(|c| self.layers_of(stage, c)).collect();
        let mut chunks: Vec<StageChunk> = ranges
            .iter()
            .map(|r| StageChunk {
                first_layer: r.start,
                layers: Vec::with_capacity(r.len()),
            })
            .collect();
        for (i, layer) in self.layers.into_iter().enumerate() {
            if let Some(c) = ranges.iter().position(|r| r.contains(&i)) {
                chunks[c].layers.push(layer);
            }
        }
        Ok(PipelineStage {
            stage,
            stages: self.stages,
            chunks,
        })
    }
}

/// The layers one rank runs: its model chunks, in chunk order.
pub struct PipelineStage {
    stage: usize,
    stages: usize,
    chunks: Vec<StageChunk>,
}

impl PipelineStage {
    /// This stage's index in the pipeline.
    pub fn stage(&self) -> usize {
        self.stage
    }

    /// The number of stages of the pipeline it belongs to.
    pub fn stages(&self) -> usize {
        self.stages
    }

    /// The model chunks of this stage.
    pub fn chunks(&self) -> &[StageChunk] {
        &self.chunks
    }

    /// Every parameter of every chunk with the name it has in the whole
    /// model's `Sequential` (`"4.weight"` for layer 4), in chunk order.
    pub fn named_parameters(&self) -> Vec<(String, Parameter)> {
        self.chunks.iter().flat_map(Module::named_parameters).collect()
    }

    /// The parameters of [`PipelineStage::named_parameters`].
    pub fn parameters(&self) -> Vec<Parameter> {
        self.named_parameters().into_iter().map(|(_, p)| p).collect()
    }

    /// Sets every layer of every chunk to training or evaluation mode.
    pub fn train(&mut self, training: bool) {
        for c in &mut self.chunks {
            c.train(training);
        }
    }
}

/// One model chunk: consecutive layers of the whole model, named by their
/// index in it.
pub struct StageChunk {
    first_layer: usize,
    layers: Vec<Box<dyn Module>>,
}

impl StageChunk {
    /// The whole model's indices of this chunk's layers.
    pub fn layer_range(&self) -> Range<usize> {
        self.first_layer..self.first_layer + self.layers.len()
    }
}

/// Written out rather than derived: the layers are named by their index in
/// the whole model (`first_layer + i`), not in this chunk.
impl Visit for StageChunk {
    fn visit<'a>(&'a self, visitor: &mut dyn Visitor<'a>) {
        for (i, l) in self.layers.iter().enumerate() {
            visitor.child(&(self.first_layer + i).to_string(), l.as_ref());
        }
    }

    fn type_name(&self) -> &'static str {
        "StageChunk"
    }
}

impl Module for StageChunk {
    /// Applies the layers in order; errors with the first layer's error.
    fn forward(&self, input: &Var) -> tessera_tensor::Result<Var> {
        let mut x = input.clone();
        for l in &self.layers {
            x = l.forward(&x)?;
        }
        Ok(x)
    }
}
