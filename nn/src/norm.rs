//! BatchNorm1d/2d, LayerNorm and GroupNorm.

use tessera_autograd::{Parameter, Var};
use tessera_tensor::{DType, Error, Result, Tensor};

use crate::{Buffer, Module, Training};

/// Batch normalization over the channel dimension of `[N, C, *]`
/// (`torch.nn.BatchNorm1d` / `BatchNorm2d`): affine `weight` (ones) and
/// `bias` (zeros), buffers `running_mean` (zeros), `running_var` (ones)
/// and `num_batches_tracked` (i64 scalar).
///
/// In training mode the batch statistics normalize and the running
/// statistics are updated, `r ← (1 − m)·r + m·batch` with the unbiased
/// batch variance, and `num_batches_tracked` counts the batches; with
/// `momentum: None` the running statistics are the cumulative average
/// (`m = 1 / num_batches_tracked`). In eval mode the running statistics
/// normalize.
#[derive(Debug, Clone, Module)]
#[module(type_name = self.kind.type_name())]
pub struct BatchNorm {
    /// Per-channel scale `[C]`, when affine.
    pub weight: Option<Parameter>,
    /// Per-channel shift `[C]`, when affine.
    pub bias: Option<Parameter>,
    /// Running mean `[C]`, when tracking running statistics.
    pub running_mean: Option<Buffer>,
    /// Running (unbiased) variance `[C]`, when tracking.
    pub running_var: Option<Buffer>,
    /// Batches seen in training, an i64 scalar, when tracking.
    pub num_batches_tracked: Option<Buffer>,
    /// Added to the variance (PyTorch's default 1e-5).
    #[module(skip)]
    pub eps: f64,
    /// Running-average factor (default 0.1); `None` is the cumulative
    /// average.
    #[module(skip)]
    pub momentum: Option<f64>,
    training: Training,
    #[module(skip)]
    kind: BnKind,
}

/// Which PyTorch class a [`BatchNorm`] stands for (the accepted ranks).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BnKind {
    OneD,
    TwoD,
}

impl BnKind {
    fn type_name(self) -> &'static str {
        match self {
            BnKind::OneD => "BatchNorm1d",
            BnKind::TwoD => "BatchNorm2d",
        }
    }
}

/// The settings of a [`BatchNorm`]; the default is PyTorch's.
#[derive(Debug, Clone, Copy)]
pub struct BatchNormOptions {
    /// Added to the variance.
    pub eps: f64,
    /// Running-average factor; `None` for the cumulative average.
    pub momentum: Option<f64>,
    /// Learnable per-channel weight and bias.
    pub affine: bool,
    /// Keep running statistics (otherwise batch statistics are used in
    /// both modes).
    pub track_running_stats: bool,
}

impl Default for BatchNormOptions {
    fn default() -> Self {
        BatchNormOptions {
            eps: 1e-5,
            momentum: Some(0.1),
            affine: true,
            track_running_stats: true,
        }
    }
}

impl BatchNorm {
    /// `BatchNorm1d(num_features)`: inputs `[N, C]` or `[N, C, L]`.
    pub fn new_1d(num_features: usize, opts: BatchNormOptions) -> Result<BatchNorm> {
        BatchNorm::build(num_features, opts, BnKind::OneD)
    }

    /// `BatchNorm2d(num_features)`: inputs `[N, C, H, W]`.
    pub fn new_2d(num_features: usize, opts: BatchNormOptions) -> Result<BatchNorm> {
        BatchNorm::build(num_features, opts, BnKind::TwoD)
    }

    fn build(c: usize, opts: BatchNormOptions, kind: BnKind) -> Result<BatchNorm> {
        let param = |v: f64| -> Result<Option<Parameter>> {
            Ok(opts
                .affine
                .then(|| Tensor::full(&[c], v, DType::F32))
                .transpose()?
                .map(Parameter::new))
        };
        let buffer = |t: Result<Tensor>| -> Result<Option<Buffer>> {
            Ok(opts
                .track_running_stats
                .then_some(t)
                .transpose()?
                .map(Buffer::new))
        };
        Ok(BatchNorm {
            weight: param(1.0)?,
            bias: param(0.0)?,
            running_mean: buffer(Tensor::zeros(&[c], DType::F32))?,
            running_var: buffer(Tensor::ones(&[c], DType::F32))?,
            num_batches_tracked: buffer(Ok(Tensor::scalar(0i64)))?,
            eps: opts.eps,
            momentum: opts.momentum,
            training: Training::default(),
            kind,
        })
    }

    fn check_rank(&self, x: &Var) -> Result<()> {
        let ok = match self.kind {
            BnKind::OneD => x.ndim() == 2 || x.ndim() == 3,
            BnKind::TwoD => x.ndim() == 4,
        };
        if ok {
            return Ok(());
        }
        let want = match self.kind {
            BnKind::OneD => "2D or 3D",
            BnKind::TwoD => "4D",
        };
        Err(Error::shape(
            self.kind.type_name(),
            format!("expected {want} input, got shape {:?}", x.shape()),
        ))
    }
}

impl Module for BatchNorm {
    fn forward(&self, input: &Var) -> Result<Var> {
        self.check_rank(input)?;
        let w = self.weight.as_ref().map(Parameter::var).transpose()?;
        let b = self.bias.as_ref().map(Parameter::var).transpose()?;
        let stats = match (&self.running_mean, &self.running_var) {
            (Some(m), Some(v)) => Some((m.tensor(), v.tensor())),
            _ => None,
        };
        let training = self.training.get();
        let use_batch_stats = training || stats.is_none();
        let mut momentum = self.momentum.unwrap_or(0.0);
        let mut batches = None;
        if training {
            if let Some(nbt) = &self.num_batches_tracked {
                let n = nbt.tensor().to_scalar::<i64>()? + 1;
                batches = Some((nbt, n));
                if self.momentum.is_none() {
                    momentum = 1.0 / n as f64;
                }
            }
        }
        let out = input.batch_norm(
            stats.as_ref().map(|s| &s.0),
            stats.as_ref().map(|s| &s.1),
            w.as_ref(),
            b.as_ref(),
            use_batch_stats,
            momentum,
            self.eps,
        )?;
        if let Some((nbt, n)) = batches {
            // The counter stays on the buffer's device.
            nbt.set(Tensor::scalar(n).to_device(nbt.tensor().device())?)?;
        }
        if training {
            if let (Some(m), Some(t)) = (&self.running_mean, out.running_mean) {
                m.set(t)?;
            }
            if let (Some(v), Some(t)) = (&self.running_var, out.running_var) {
                v.set(t)?;
            }
        }
        Ok(out.y)
    }
}

/// Layer normalization over the trailing `normalized_shape` dims
/// (`torch.nn.LayerNorm`): elementwise affine `weight` (ones) and `bias`
/// (zeros) shaped `normalized_shape`, `eps` 1e-5 by default.
#[derive(Debug, Clone, Module)]
pub struct LayerNorm {
    /// The normalized trailing shape.
    #[module(skip)]
    pub normalized_shape: Vec<usize>,
    /// Scale, when elementwise-affine.
    pub weight: Option<Parameter>,
    /// Shift, when elementwise-affine (and `bias` was asked for).
    pub bias: Option<Parameter>,
    /// Added to the variance.
    #[module(skip)]
    pub eps: f64,
}

impl LayerNorm {
    /// `LayerNorm(normalized_shape, eps, elementwise_affine, bias)` in f32.
    /// Errors only if the parameters cannot be allocated.
    pub fn new(normalized_shape: &[usize], eps: f64, affine: bool, bias: bool) -> Result<LayerNorm> {
        let make = |v: f64| Tensor::full(normalized_shape, v, DType::F32).map(Parameter::new);
        Ok(LayerNorm {
            normalized_shape: normalized_shape.to_vec(),
            weight: affine.then(|| make(1.0)).transpose()?,
            bias: (affine && bias).then(|| make(0.0)).transpose()?,
            eps,
        })
    }
}

impl Module for LayerNorm {
    fn forward(&self, input: &Var) -> Result<Var> {
        let w = self.weight.as_ref().map(Parameter::var).transpose()?;
        let b = self.bias.as_ref().map(Parameter::var).transpose()?;
        input.layer_norm(&self.normalized_shape, w.as_ref(), b.as_ref(), self.eps)
    }
}

/// Group normalization of `[N, C, *]` in `num_groups` channel groups
/// (`torch.nn.GroupNorm`): per-channel affine `weight` (ones) and `bias`
/// (zeros), `eps` 1e-5 by default.
#[derive(Debug, Clone, Module)]
pub struct GroupNorm {
    /// The number of channel groups.
    #[module(skip)]
    pub num_groups: usize,
    /// Per-channel scale `[C]`, when affine.
    pub weight: Option<Parameter>,
    /// Per-channel shift `[C]`, when affine.
    pub bias: Option<Parameter>,
    /// Added to the variance.
    #[module(skip)]
    pub eps: f64,
}

impl GroupNorm {
    /// `GroupNorm(num_groups, num_channels, eps, affine)` in f32. Errors
    /// when `num_groups` is 0 or does not divide `num_channels`.
    pub fn new(num_groups: usize, num_channels: usize, eps: f64, affine: bool) -> Result<GroupNorm> {
        if num_groups == 0 || !num_channels.is_multiple_of(num_groups) {
            return Err(Error::arg(
                "GroupNorm::new",
                format!("num_channels {num_channels} must be divisible by num_groups {num_groups} (> 0)"),
            ));
        }
        let make = |v: f64| Tensor::full(&[num_channels], v, DType::F32).map(Parameter::new);
        Ok(GroupNorm {
            num_groups,
            weight: affine.then(|| make(1.0)).transpose()?,
            bias: affine.then(|| make(0.0)).transpose()?,
            eps,
        })
    }
}

impl Module for GroupNorm {
    fn forward(&self, input: &Var) -> Result<Var> {
        let w = self.weight.as_ref().map(Parameter::var).transpose()?;
        let b = self.bias.as_ref().map(Parameter::var).transpose()?;
        input.group_norm(self.num_groups, w.as_ref(), b.as_ref(), self.eps)
    }
}

/// Layer normalization of `[N, C, H, W]` over the channels at each
/// position (timm's `LayerNorm2d`): per-channel `weight` (ones) and `bias`
/// (zeros), `eps` 1e-6 by default in timm.
#[derive(Debug, Clone, Module)]
pub struct LayerNorm2d {
    /// Per-channel scale `[C]`.
    pub weight: Parameter,
    /// Per-channel shift `[C]`.
    pub bias: Parameter,
    /// Added to the variance.
    #[module(skip)]
    pub eps: f64,
}

impl LayerNorm2d {
    /// `LayerNorm2d(num_channels, eps)` in f32. Errors only if the
    /// parameters cannot be allocated.
    pub fn new(num_channels: usize, eps: f64) -> Result<LayerNorm2d> {
        Ok(LayerNorm2d {
            weight: Parameter::new(Tensor::ones(&[num_channels], DType::F32)?),
            bias: Parameter::new(Tensor::zeros(&[num_channels], DType::F32)?),
            eps,
        })
    }
}

impl Module for LayerNorm2d {
    /// Errors when the input is not `[N, C, H, W]` with this norm's `C`.
    fn forward(&self, input: &Var) -> Result<Var> {
        let c = self.weight.numel();
        if input.ndim() != 4 || input.shape()[1] != c {
            return Err(Error::shape(
                "LayerNorm2d",
                format!("expected input [N, {c}, H, W], got {:?}", input.shape()),
            ));
        }
        let (w, b) = (self.weight.var()?, self.bias.var()?);
        input
            .permute(&[0, 2, 3, 1])?
            .layer_norm(&[c], Some(&w), Some(&b), self.eps)?
            .permute(&[0, 3, 1, 2])
    }
}
