//! ResNet-18/34/50/101 with torchvision's layout and state-dict names
//! (`torchvision.models.resnet`; ResNet-50 is "v1.5", the stride in the 3×3
//! of the bottleneck).

use tessera_autograd::Var;
use tessera_tensor::ops::pool::Pool2dParams;
use tessera_tensor::{Error, Result};

use crate::drop_path::{drop_branch, drop_path_at};
use crate::init::{self, FanMode, Nonlinearity};
use crate::{BatchNorm, BatchNormOptions, Conv2d, Conv2dOptions, DropPath, Linear, MaxPool2d, Module};

/// The residual block of a [`ResNet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResNetBlock {
    /// Two 3×3 convolutions, expansion 1 (ResNet-18/34).
    Basic,
    /// 1×1 – 3×3 (strided) – 1×1 convolutions, expansion 4 (ResNet-50/101).
    Bottleneck,
}

impl ResNetBlock {
    /// Output channels per stage width.
    pub fn expansion(self) -> usize {
        match self {
            ResNetBlock::Basic => 1,
            ResNetBlock::Bottleneck => 4,
        }
    }
}

/// The stem of a [`ResNet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResNetStem {
    /// torchvision's: 7×7 stride-2 convolution, BN, ReLU, 3×3 stride-2 max
    /// pool (÷4 resolution), for 224×224 inputs.
    ImageNet,
    /// The usual stem for 32×32 (CIFAR) or 28×28 inputs: a 3×3 stride-1
    /// convolution, BN, ReLU, no pooling. Keys stay `conv1`/`bn1`.
    Small,
}

/// The shape of a [`ResNet`]; `ResNetConfig::resnet50()` is torchvision's
/// `resnet50`, and the builder methods change one thing each, so a
/// 10-class 32×32 ResNet-18 is
/// `ResNet::new(&ResNetConfig::resnet18().small_input().num_classes(10))`.
#[derive(Debug, Clone, PartialEq)]
pub struct ResNetConfig {
    /// Basic or bottleneck blocks.
    pub block: ResNetBlock,
    /// Blocks per stage (`layer1..layer4`).
    pub layers: [usize; 4],
    /// Stage widths before expansion (torchvision: 64, 128, 256, 512).
    pub widths: [usize; 4],
    /// Stem output channels (torchvision: 64).
    pub stem_width: usize,
    /// The stem.
    pub stem: ResNetStem,
    /// Input channels.
    pub in_chans: usize,
    /// Classifier outputs.
    pub num_classes: usize,
    /// Stochastic depth: the drop probability rises linearly from 0 over
    /// the blocks to this value (timm's `drop_path_rate`; 0 in torchvision).
    pub drop_path_rate: f64,
    /// Start each block's last BN scale at zero, so blocks begin as the
    /// identity (torchvision's `zero_init_residual`).
    pub zero_init_residual: bool,
}

impl ResNetConfig {
    fn torchvision(block: ResNetBlock, layers: [usize; 4]) -> ResNetConfig {
        ResNetConfig {
            block,
            layers,
            widths: [64, 128, 256, 512],
            stem_width: 64,
            stem: ResNetStem::ImageNet,
            in_chans: 3,
            num_classes: 1000,
            drop_path_rate: 0.0,
            zero_init_residual: false,
        }
    }

    /// torchvision `resnet18`: basic blocks [2, 2, 2, 2], 11,689,512
    /// parameters.
    pub fn resnet18() -> ResNetConfig {
        Self::torchvision(ResNetBlock::Basic, [2, 2, 2, 2])
    }

    /// torchvision `resnet34`: basic blocks [3, 4, 6, 3], 21,797,672
    /// parameters.
    pub fn resnet34() -> ResNetConfig {
        Self::torchvision(ResNetBlock::Basic, [3, 4, 6, 3])
    }

    /// torchvision `resnet50`: bottlenecks [3, 4, 6, 3], 25,557,032
    /// parameters.
    pub fn resnet50() -> ResNetConfig {
        Self::torchvision(ResNetBlock::Bottleneck, [3, 4, 6, 3])
    }

    /// torchvision `resnet101`: bottlenecks [3, 4, 23, 3], 44,549,160
    /// parameters.
    pub fn resnet101() -> ResNetConfig {
        Self::torchvision(ResNetBlock::Bottleneck, [3, 4, 23, 3])
    }

    /// The same network with the [`ResNetStem::Small`] stem (32×32 or
    /// 28×28 inputs).
    pub fn small_input(mut self) -> Self {
        self.stem = ResNetStem::Small;
        self
    }

    /// The same network with `n` classes.
    pub fn num_classes(mut self, n: usize) -> Self {
        self.num_classes = n;
        self
    }

    /// The same network for `c` input channels (1 for MNIST).
    pub fn in_chans(mut self, c: usize) -> Self {
        self.in_chans = c;
        self
    }

    /// The same network with stage widths `w` and stem width `stem`.
    pub fn widths(mut self, stem: usize, w: [usize; 4]) -> Self {
        self.stem_width = stem;
        self.widths = w;
        self
    }

    /// The same network with stochastic depth up to `rate`.
    pub fn drop_path_rate(mut self, rate: f64) -> Self {
        self.drop_path_rate = rate;
        self
    }
}

/// A ResNet (torchvision `ResNet`): `conv1`, `bn1`, ReLU, max pool (the
/// ImageNet stem), stages `layer1..layer4`, global average pool and `fc`.
/// Keys and shapes equal torchvision's state dict. Init as torchvision:
/// convolutions kaiming-normal (fan out, ReLU gain), BN scale 1 and shift
/// 0, `fc` PyTorch's Linear default.
#[derive(Debug, Clone, Module)]
pub struct ResNet {
    /// The stem convolution.
    pub conv1: Conv2d,
    /// The stem norm.
    pub bn1: BatchNorm,
    /// The stem pool (ImageNet stem only).
    pub maxpool: Option<MaxPool2d>,
    /// Stage 1 (stride 1).
    pub layer1: Vec<ResidualBlock>,
    /// Stage 2 (stride 2).
    pub layer2: Vec<ResidualBlock>,
    /// Stage 3 (stride 2).
    pub layer3: Vec<ResidualBlock>,
    /// Stage 4 (stride 2).
    pub layer4: Vec<ResidualBlock>,
    /// The classifier.
    pub fc: Linear,
}

/// A torchvision `BasicBlock` or `Bottleneck` (the bottleneck has
/// `conv3`/`bn3`), with an optional `downsample` shortcut and DropPath on
/// the residual branch.
#[derive(Debug, Clone, Module)]
pub struct ResidualBlock {
    /// First convolution (3×3 basic, 1×1 bottleneck).
    pub conv1: Conv2d,
    /// Its norm.
    pub bn1: BatchNorm,
    /// Second convolution (3×3; strided in both kinds).
    pub conv2: Conv2d,
    /// Its norm.
    pub bn2: BatchNorm,
    /// The bottleneck's expanding 1×1 convolution.
    pub conv3: Option<Conv2d>,
    /// Its norm.
    pub bn3: Option<BatchNorm>,
    /// Projection shortcut when the stride or width changes.
    pub downsample: Option<Downsample>,
    /// Stochastic depth on the residual branch (absent at rate 0).
    pub drop_path: Option<DropPath>,
}

/// The projection shortcut `Sequential(conv1x1, BN)`, keys `0.*`, `1.*`.
#[derive(Debug, Clone, Module)]
pub struct Downsample {
    /// 1×1 strided convolution.
    #[module(rename = "0")]
    pub conv: Conv2d,
    /// Its norm.
    #[module(rename = "1")]
    pub bn: BatchNorm,
}

/// torchvision `resnet18` (1000 classes, 224×224). Errors only if
/// allocation fails.
pub fn resnet18() -> Result<ResNet> {
    ResNet::new(&ResNetConfig::resnet18())
}

/// torchvision `resnet34`. Errors only if allocation fails.
pub fn resnet34() -> Result<ResNet> {
    ResNet::new(&ResNetConfig::resnet34())
}

/// torchvision `resnet50`. Errors only if allocation fails.
pub fn resnet50() -> Result<ResNet> {
    ResNet::new(&ResNetConfig::resnet50())
}

/// torchvision `resnet101`. Errors only if allocation fails.
pub fn resnet101() -> Result<ResNet> {
    ResNet::new(&ResNetConfig::resnet101())
}

impl ResNet {
    /// Builds the network of `cfg`, initialised as torchvision does.
    /// Errors when a width, block count, channel or class count is 0, or
    /// the drop-path rate is outside [0, 1].
    pub fn new(cfg: &ResNetConfig) -> Result<ResNet> {
        check_config(cfg)?;
        let no_bias = Conv2dOptions::default().bias(false);
        let (conv1, maxpool) = match cfg.stem {
            ResNetStem::ImageNet => (
                Conv2d::new(cfg.in_chans, cfg.stem_width, 7, no_bias.stride(2).padding(3))?,
                Some(MaxPool2d {
                    params: Pool2dParams::new(3).stride(2).padding(1),
                }),
            ),
            ResNetStem::Small => (
                Conv2d::new(cfg.in_chans, cfg.stem_width, 3, no_bias.padding(1))?,
                None,
            ),
        };
        let total: usize = cfg.layers.iter().sum();
        let mut index = 0;
        let mut in_ch = cfg.stem_width;
        let mut stages: Vec<Vec<ResidualBlock>> = Vec::with_capacity(4);
        for (s, (&n, &width)) in cfg.layers.iter().zip(&cfg.widths).enumerate() {
            let mut blocks = Vec::with_capacity(n);
            for b in 0..n {
                let stride = if s > 0 && b == 0 { 2 } else { 1 };
                let dp = drop_path_at(cfg.drop_path_rate, index, total);
                blocks.push(ResidualBlock::new(cfg.block, in_ch, width, stride, dp)?);
                in_ch = width * cfg.block.expansion();
                index += 1;
            }
            stages.push(blocks);
        }
        let mut stages = stages.into_iter();
        let mut next = || stages.next().unwrap_or_default();
        let net = ResNet {
            conv1,
            bn1: BatchNorm::new_2d(cfg.stem_width, BatchNormOptions::default())?,
            maxpool,
            layer1: next(),
            layer2: next(),
            layer3: next(),
            layer4: next(),
            fc: Linear::new(in_ch, cfg.num_classes, true)?,
        };
        net.init(cfg.zero_init_residual)?;
        Ok(net)
    }

    /// torchvision's init: kaiming-normal convolutions (fan out), and the
    /// last BN scale of each block zeroed when asked.
    fn init(&self, zero_init_residual: bool) -> Result<()> {
        let last_bn = match self.layer1.first().is_some_and(|b| b.bn3.is_some()) {
            true => ".bn3.weight",
            false => ".bn2.weight",
        };
        for (name, p) in self.named_parameters() {
            if p.ndim() == 4 {
                init::kaiming_normal_(&p, FanMode::FanOut, Nonlinearity::Relu)?;
            }
            if zero_init_residual && name.starts_with("layer") && name.ends_with(last_bn) {
                init::zeros_(&p)?;
            }
        }
        Ok(())
    }

    /// The pooled features `[B, C]` before `fc`. Errors when the input is
    /// not `[B, in_chans, H, W]` or is too small for the stem.
    pub fn forward_features(&self, x: &Var) -> Result<Var> {
        let mut x = self.bn1.forward(&self.conv1.forward(x)?)?.relu()?;
        if let Some(pool) = &self.maxpool {
            x = pool.forward(&x)?;
        }
        for stage in [&self.layer1, &self.layer2, &self.layer3, &self.layer4] {
            for block in stage {
                x = block.forward(&x)?;
            }
        }
        x.mean(&[2, 3], false)
    }
}

impl Module for ResNet {
    /// Logits `[B, num_classes]` of images `[B, in_chans, H, W]`. Errors
    /// as [`ResNet::forward_features`].
    fn forward(&self, input: &Var) -> Result<Var> {
        self.fc.forward(&self.forward_features(input)?)
    }
}

impl ResidualBlock {
    fn new(
        kind: ResNetBlock,
        in_ch: usize,
        width: usize,
        stride: usize,
        drop_path: f64,
    ) -> Result<ResidualBlock> {
        let bn = |c| BatchNorm::new_2d(c, BatchNormOptions::default());
        let no_bias = Conv2dOptions::default().bias(false);
        let conv3x3 = |i, o, s: usize| Conv2d::new(i, o, 3, no_bias.stride(s).padding(1));
        let out_ch = width * kind.expansion();
        let downsample = match stride != 1 || in_ch != out_ch {
            true => Some(Downsample {
                conv: Conv2d::new(in_ch, out_ch, 1, no_bias.stride(stride))?,
                bn: bn(out_ch)?,
            }),
            false => None,
        };
        let drop_path = (drop_path > 0.0).then(|| DropPath::new(drop_path)).transpose()?;
        Ok(match kind {
            ResNetBlock::Basic => ResidualBlock {
                conv1: conv3x3(in_ch, width, stride)?,
                bn1: bn(width)?,
                conv2: conv3x3(width, width, 1)?,
                bn2: bn(width)?,
                conv3: None,
                bn3: None,
                downsample,
                drop_path,
            },
            ResNetBlock::Bottleneck => ResidualBlock {
                conv1: Conv2d::new(in_ch, width, 1, no_bias)?,
                bn1: bn(width)?,
                conv2: conv3x3(width, width, stride)?,
                bn2: bn(width)?,
                conv3: Some(Conv2d::new(width, out_ch, 1, no_bias)?),
                bn3: Some(bn(out_ch)?),
                downsample,
                drop_path,
            },
        })
    }
}

impl Module for ResidualBlock {
    fn forward(&self, input: &Var) -> Result<Var> {
        let mut y = self.bn1.forward(&self.conv1.forward(input)?)?.relu()?;
        y = self.bn2.forward(&self.conv2.forward(&y)?)?;
        if let (Some(conv3), Some(bn3)) = (&self.conv3, &self.bn3) {
            y = bn3.forward(&conv3.forward(&y.relu()?)?)?;
        }
        let y = drop_branch(&self.drop_path, y)?;
        let shortcut = match &self.downsample {
            Some(d) => d.forward(input)?,
            None => input.clone(),
        };
        y.add(&shortcut)?.relu()
    }
}

impl Module for Downsample {
    fn forward(&self, input: &Var) -> Result<Var> {
        self.bn.forward(&self.conv.forward(input)?)
    }
}

fn check_config(cfg: &ResNetConfig) -> Result<()> {
    let zero = cfg.layers.contains(&0)
        || cfg.widths.contains(&0)
        || cfg.stem_width == 0
        || cfg.in_chans == 0
        || cfg.num_classes == 0;
    if zero || !(0.0..=1.0).contains(&cfg.drop_path_rate) {
        return Err(Error::arg(
            "ResNet::new",
            format!("every block count, width, channel and class count must be positive and drop_path_rate in [0, 1], got {cfg:?}"),
        ));
    }
    Ok(())
}
