//! CoAtNet with timm's `MaxxVit` structure and state-dict names for the
//! `coatnet_0_224` … `coatnet_3_224` configurations ("trying to be like the
//! paper": MBConv stages with pre-norm, depthwise stride and SE, then
//! transformer stages with relative position bias over the whole map).

use tessera_autograd::{scaled_dot_product_attention, AttnMask, AttnOptions, Var};
use tessera_tensor::{Error, GeluApprox, Result};

use crate::drop_path::{drop_branch, drop_path_at};
use crate::init;
use crate::{
    AvgPool2d, BatchNorm, BatchNormOptions, Conv2d, Conv2dOptions, DropPath, Dropout, LayerNorm2d, Linear,
    Module, RelPosBias, SiLU, SqueezeExcite, Visit, Visitor, GELU,
};

/// The shape of a [`CoAtNet`]; `CoAtNetConfig::coatnet_0_224()` is timm's
/// `coatnet_0_224`, and the builder methods change one thing each, so a
/// 10-class 32×32 CoAtNet-0 is
/// `CoAtNetConfig::coatnet_0_224().img_size(32).num_classes(10)`.
///
/// Stages 1–2 are MBConv, 3–4 transformer; each stage halves the
/// resolution (the stem too), so `img_size` must be a multiple of 32
/// (pad 28×28 inputs to 32×32).
#[derive(Debug, Clone, PartialEq)]
pub struct CoAtNetConfig {
    /// Input height and width (square, a multiple of 32).
    pub img_size: usize,
    /// Input channels.
    pub in_chans: usize,
    /// Classifier outputs.
    pub num_classes: usize,
    /// Output width of each stage.
    pub embed_dim: [usize; 4],
    /// Blocks per stage.
    pub depths: [usize; 4],
    /// Stem width.
    pub stem_width: usize,
    /// Width of the head's tanh hidden layer (timm's `head_hidden_size`;
    /// `None` puts a LayerNorm2d `norm` before a plain `head.fc`).
    pub head_hidden_size: Option<usize>,
    /// Channels per attention head (timm: 32).
    pub dim_head: usize,
    /// Expansion of the MBConv and MLP hidden widths (timm: 4).
    pub expand_ratio: f64,
    /// SE hidden width as a fraction of the block's output width (0.25).
    pub se_ratio: f64,
    /// Stochastic depth, rising linearly over all blocks to this rate.
    pub drop_path_rate: f64,
    /// Dropout before the classifier.
    pub drop_rate: f64,
}

impl CoAtNetConfig {
    fn timm(embed_dim: [usize; 4], depths: [usize; 4], stem_width: usize) -> CoAtNetConfig {
        CoAtNetConfig {
            img_size: 224,
            in_chans: 3,
            num_classes: 1000,
            embed_dim,
            depths,
            stem_width,
            head_hidden_size: Some(embed_dim[3]),
            dim_head: 32,
            expand_ratio: 4.0,
            se_ratio: 0.25,
            drop_path_rate: 0.0,
            drop_rate: 0.0,
        }
    }

    /// timm `coatnet_0_224`: 25,036,820 parameters.
    pub fn coatnet_0_224() -> CoAtNetConfig {
        Self::timm([96, 192, 384, 768], [2, 3, 5, 2], 64)
    }

    /// timm `coatnet_1_224`: 42,225,776 parameters.
    pub fn coatnet_1_224() -> CoAtNetConfig {
        Self::timm([96, 192, 384, 768], [2, 6, 14, 2], 64)
    }

    /// timm `coatnet_2_224`: 74,684,744 parameters.
    pub fn coatnet_2_224() -> CoAtNetConfig {
        Self::timm([128, 256, 512, 1024], [2, 6, 14, 2], 128)
    }

    /// timm `coatnet_3_224`: 166,966,264 parameters.
    pub fn coatnet_3_224() -> CoAtNetConfig {
        Self::timm([192, 384, 768, 1536], [2, 6, 14, 2], 192)
    }

    /// The same model for `size×size` inputs (a multiple of 32).
    pub fn img_size(mut self, size: usize) -> Self {
        self.img_size = size;
        self
    }

    /// The same model for `c` input channels.
    pub fn in_chans(mut self, c: usize) -> Self {
        self.in_chans = c;
        self
    }

    /// The same model with `n` classes.
    pub fn num_classes(mut self, n: usize) -> Self {
        self.num_classes = n;
        self
    }

    /// The same model with stage widths `dims`, depths `depths`, stem width
    /// `stem` and a head hidden layer as wide as the last stage.
    pub fn widths(mut self, stem: usize, dims: [usize; 4], depths: [usize; 4]) -> Self {
        self.stem_width = stem;
        self.embed_dim = dims;
        self.depths = depths;
        self.head_hidden_size = Some(dims[3]);
        self
    }

    /// The same model with `d` channels per attention head.
    pub fn dim_head(mut self, d: usize) -> Self {
        self.dim_head = d;
        self
    }

    /// The same model with stochastic depth up to `rate`.
    pub fn drop_path_rate(mut self, rate: f64) -> Self {
        self.drop_path_rate = rate;
        self
    }

    fn check(&self) -> Result<()> {
        let heads_ok = self.dim_head > 0
            && self.embed_dim[2..]
                .iter()
                .all(|d| d.is_multiple_of(self.dim_head));
        let positive = self.img_size > 0
            && self.in_chans > 0
            && self.num_classes > 0
            && self.stem_width > 0
            && !self.embed_dim.contains(&0)
            && !self.depths.contains(&0)
            && self.head_hidden_size != Some(0)
            && self.expand_ratio > 0.0
            && self.se_ratio > 0.0;
        let rates = [self.drop_path_rate, self.drop_rate]
            .iter()
            .all(|r| (0.0..=1.0).contains(r));
        if heads_ok && positive && rates && self.img_size.is_multiple_of(32) {
            return Ok(());
        }
        Err(Error::arg(
            "CoAtNet::new",
            format!("img_size must be a positive multiple of 32, the transformer widths multiples of dim_head, sizes positive and rates in [0, 1]; got {self:?}"),
        ))
    }
}

/// A CoAtNet (timm `MaxxVit` with a `coatnet_N` config): `stem`,
/// `stages.0..3` (MBConv, MBConv, transformer, transformer), an optional
/// final `norm` and `head`. Keys and shapes equal timm's state dict (the
/// relative position index is a non-persistent buffer, as in timm). Init
/// as timm's `vit_eff` scheme: stem and MBConv convolutions normal with std
/// √(2/fan_out) and zero biases; transformer convolutions xavier-uniform
/// with zero biases (the MLP's N(0, 1e-6)); position-bias tables
/// trunc-normal std .02; norms and the head PyTorch's defaults.
#[derive(Module)]
pub struct CoAtNet {
    /// The convolutional stem (÷2).
    pub stem: Stem,
    /// The four stages (each ÷2).
    pub stages: Vec<Stage>,
    /// Final norm, when the head has no hidden layer.
    pub norm: Option<LayerNorm2d>,
    /// The classifier head.
    pub head: Head,
    /// The input side the position biases were built for.
    #[module(skip)]
    pub img_size: usize,
}

/// timm `Stem`: 3×3 stride-2 conv, BN + GELU, 3×3 conv.
#[derive(Debug, Clone, Module)]
pub struct Stem {
    /// Strided convolution.
    pub conv1: Conv2d,
    /// Norm and activation.
    pub norm1: BatchNormAct,
    /// Second convolution.
    pub conv2: Conv2d,
}

/// One stage: its blocks (MBConv or transformer).
#[derive(Module)]
pub struct Stage {
    /// The blocks; the first one halves the resolution.
    pub blocks: Vec<Box<dyn Module>>,
}

/// timm `BatchNormAct2d`: BatchNorm2d (eps 1e-5) then, optionally, GELU;
/// its keys are the BatchNorm's.
#[derive(Debug, Clone, Module)]
pub struct BatchNormAct {
    /// The norm.
    #[module(flatten)]
    pub bn: BatchNorm,
    /// Whether GELU follows.
    #[module(skip)]
    pub gelu: bool,
}

/// timm `Downsample2d` with `avg2` pooling: 2×2 average pool, then a 1×1
/// `expand` convolution when the width changes.
#[derive(Debug, Clone, Module)]
pub struct Downsample2d {
    /// The pool.
    pub pool: AvgPool2d,
    /// The width change.
    pub expand: Option<Conv2d>,
}

/// timm `MbConvBlock` (pre-activation, expansion from the output width,
/// stride in the depthwise conv, SE after `norm2`).
#[derive(Module)]
pub struct MbConvBlock {
    /// Pool + projection shortcut of a strided block.
    pub shortcut: Option<Downsample2d>,
    /// Pre-norm (no activation).
    pub pre_norm: BatchNormAct,
    /// Expansion 1×1 (no bias).
    pub conv1_1x1: Conv2d,
    /// Norm + GELU.
    pub norm1: BatchNormAct,
    /// Depthwise 3×3 (strided in the first block of a stage).
    pub conv2_kxk: Conv2d,
    /// Norm + GELU.
    pub norm2: BatchNormAct,
    /// Squeeze-excitation with SiLU.
    pub se: SqueezeExcite,
    /// Projection 1×1 (bias).
    pub conv3_1x1: Conv2d,
    /// Stochastic depth.
    pub drop_path: Option<DropPath>,
}

/// timm `TransformerBlock2d` over NCHW maps: `shortcut(x) +
/// attn(norm1(x))`, then `x + mlp(norm2(x))`.
#[derive(Module)]
pub struct TransformerBlock2d {
    /// Pool + projection shortcut of a strided block.
    pub shortcut: Option<Downsample2d>,
    /// LayerNorm2d, followed by a 2×2 pool in a strided block.
    pub norm1: AttnNorm,
    /// Attention with relative position bias.
    pub attn: Attention2d,
    /// Stochastic depth of the attention branch.
    pub drop_path1: Option<DropPath>,
    /// LayerNorm2d before the MLP.
    pub norm2: LayerNorm2d,
    /// The 1×1-conv MLP.
    pub mlp: ConvMlp,
    /// Stochastic depth of the MLP branch.
    pub drop_path2: Option<DropPath>,
}

/// The attention pre-norm: a LayerNorm2d (keys `norm1.*`) or, in a strided
/// block, timm's `Sequential(norm, down)` (keys `norm1.norm.*`).
pub struct AttnNorm {
    /// The norm.
    pub norm: LayerNorm2d,
    /// The pool of a strided block.
    pub down: Option<Downsample2d>,
}

/// timm `Attention2d` (`head_first`, `expand_first`): 1×1 conv `qkv`
/// giving per head `[q; k; v]` channels, softmax(q·kᵀ/√d + bias)·v over
/// all positions, 1×1 conv `proj`.
#[derive(Debug, Clone, Module)]
pub struct Attention2d {
    /// The fused projection `C_in → 3·C_out`.
    pub qkv: Conv2d,
    /// The relative position bias over the whole map.
    pub rel_pos: RelPosBias,
    /// Dropout on the attention weights (0 in timm's configs).
    pub attn_drop: Dropout,
    /// The output projection.
    pub proj: Conv2d,
    /// Channels per head.
    #[module(skip)]
    pub dim_head: usize,
}

/// timm `ConvMlp`: 1×1 conv, GELU, 1×1 conv.
#[derive(Debug, Clone, Module)]
pub struct ConvMlp {
    /// Expansion.
    pub fc1: Conv2d,
    /// Activation.
    pub act: GELU,
    /// Projection.
    pub fc2: Conv2d,
}

/// timm `NormMlpClassifierHead` (with a hidden size) or `ClassifierHead`:
/// global average pool, LayerNorm2d `norm`, `pre_logits.fc` + tanh, `fc`.
#[derive(Debug, Clone, Module)]
pub struct Head {
    /// Norm of the pooled features (with a hidden layer).
    pub norm: Option<LayerNorm2d>,
    /// The tanh hidden layer.
    pub pre_logits: Option<PreLogits>,
    /// Dropout before `fc`.
    pub drop: Dropout,
    /// The classifier.
    pub fc: Linear,
}

/// `Linear` + tanh, keys `fc.*`.
#[derive(Debug, Clone, Module)]
pub struct PreLogits {
    /// The hidden layer.
    pub fc: Linear,
}

/// timm `coatnet_0_224`. Errors only if allocation fails.
pub fn coatnet_0_224() -> Result<CoAtNet> {
    CoAtNet::new(&CoAtNetConfig::coatnet_0_224())
}

/// timm `coatnet_1_224`. Errors only if allocation fails.
pub fn coatnet_1_224() -> Result<CoAtNet> {
    CoAtNet::new(&CoAtNetConfig::coatnet_1_224())
}

/// timm `coatnet_2_224`. Errors only if allocation fails.
pub fn coatnet_2_224() -> Result<CoAtNet> {
    CoAtNet::new(&CoAtNetConfig::coatnet_2_224())
}

/// timm `coatnet_3_224`. Errors only if allocation fails.
pub fn coatnet_3_224() -> Result<CoAtNet> {
    CoAtNet::new(&CoAtNetConfig::coatnet_3_224())
}

const BN_EPS: f64 = 1e-5;
const LN_EPS: f64 = 1e-6;

impl CoAtNet {
    /// Builds the model of `cfg` with timm's init. Errors when the
    /// configuration is inconsistent (see [`CoAtNetConfig`]).
    pub fn new(cfg: &CoAtNetConfig) -> Result<CoAtNet> {
        cfg.check()?;
        let no_bias = Conv2dOptions::default().bias(false).padding(1);
        let stem = Stem {
            conv1: eff_conv(cfg.in_chans, cfg.stem_width, 3, no_bias.stride(2))?,
            norm1: BatchNormAct::new(cfg.stem_width, true)?,
            conv2: eff_conv(cfg.stem_width, cfg.stem_width, 3, no_bias)?,
        };
        let total: usize = cfg.depths.iter().sum();
        let mut index = 0;
        let mut in_ch = cfg.stem_width;
        let mut feat = cfg.img_size / 2;
        let mut stages = Vec::with_capacity(4);
        for s in 0..4 {
            feat /= 2;
            let out = cfg.embed_dim[s];
            let mut blocks: Vec<Box<dyn Module>> = Vec::with_capacity(cfg.depths[s]);
            for b in 0..cfg.depths[s] {
                let (block_in, stride) = if b == 0 { (in_ch, 2) } else { (out, 1) };
                let dp = drop_path_at(cfg.drop_path_rate, index, total);
                blocks.push(match s < 2 {
                    true => Box::new(MbConvBlock::new(cfg, block_in, out, stride, dp)?),
                    false => Box::new(TransformerBlock2d::new(cfg, block_in, out, stride, feat, dp)?),
                });
                index += 1;
            }
            stages.push(Stage { blocks });
            in_ch = out;
        }
        let (norm, head) = match cfg.head_hidden_size {
            Some(hidden) => (
                None,
                Head {
                    norm: Some(LayerNorm2d::new(in_ch, LN_EPS)?),
                    pre_logits: Some(PreLogits {
                        fc: Linear::new(in_ch, hidden, true)?,
                    }),
                    drop: Dropout::new(cfg.drop_rate)?,
                    fc: Linear::new(hidden, cfg.num_classes, true)?,
                },
            ),
            None => (
                Some(LayerNorm2d::new(in_ch, LN_EPS)?),
                Head {
                    norm: None,
                    pre_logits: None,
                    drop: Dropout::new(cfg.drop_rate)?,
                    fc: Linear::new(in_ch, cfg.num_classes, true)?,
                },
            ),
        };
        Ok(CoAtNet {
            stem,
            stages,
            norm,
            head,
            img_size: cfg.img_size,
        })
    }

    /// The feature map `[B, C, H/32, W/32]` before the head. Errors when
    /// the input is not `[B, in_chans, img_size, img_size]`.
    pub fn forward_features(&self, x: &Var) -> Result<Var> {
        let c = self.stem.conv1.weight.shape()[1];
        let side = self.img_size;
        if x.ndim() != 4 || x.shape()[1] != c || x.shape()[2..] != [side, side] {
            return Err(Error::shape(
                "CoAtNet",
                format!("expected input [B, {c}, {side}, {side}], got {:?}", x.shape()),
            ));
        }
        let mut x = self.stem.forward(x)?;
        for stage in &self.stages {
            x = stage.forward(&x)?;
        }
        match &self.norm {
            Some(n) => n.forward(&x),
            None => Ok(x),
        }
    }
}

impl Module for CoAtNet {
    /// Logits `[B, num_classes]`. Errors as [`CoAtNet::forward_features`].
    fn forward(&self, input: &Var) -> Result<Var> {
        self.head.forward(&self.forward_features(input)?)
    }
}

impl Module for Stage {
    fn forward(&self, input: &Var) -> Result<Var> {
        let mut x = input.clone();
        for block in &self.blocks {
            x = block.forward(&x)?;
        }
        Ok(x)
    }
}

impl Module for PreLogits {
    fn forward(&self, input: &Var) -> Result<Var> {
        self.fc.forward(input)?.tanh()
    }
}

impl Module for Stem {
    fn forward(&self, input: &Var) -> Result<Var> {
        let x = self.norm1.forward(&self.conv1.forward(input)?)?;
        self.conv2.forward(&x)
    }
}

impl BatchNormAct {
    fn new(channels: usize, gelu: bool) -> Result<BatchNormAct> {
        let opts = BatchNormOptions {
            eps: BN_EPS,
            ..BatchNormOptions::default()
        };
        Ok(BatchNormAct {
            bn: BatchNorm::new_2d(channels, opts)?,
            gelu,
        })
    }
}

impl Module for BatchNormAct {
    fn forward(&self, input: &Var) -> Result<Var> {
        let y = self.bn.forward(input)?;
        match self.gelu {
            true => y.gelu(GeluApprox::None),
            false => Ok(y),
        }
    }
}

impl Downsample2d {
    /// The pool, and a projection `in_ch → out_ch` (initialised by `conv`)
    /// when the widths differ.
    fn new(in_ch: usize, out_ch: usize, conv: ConvInit) -> Result<Downsample2d> {
        let expand = (in_ch != out_ch)
            .then(|| conv.make(in_ch, out_ch, 1, Conv2dOptions::default()))
            .transpose()?;
        Ok(Downsample2d {
            pool: AvgPool2d::new(2),
            expand,
        })
    }
}

impl Module for Downsample2d {
    fn forward(&self, input: &Var) -> Result<Var> {
        let x = self.pool.forward(input)?;
        match &self.expand {
            Some(c) => c.forward(&x),
            None => Ok(x),
        }
    }
}

impl MbConvBlock {
    fn new(cfg: &CoAtNetConfig, in_ch: usize, out: usize, stride: usize, dp: f64) -> Result<Self> {
        let mid = make_divisible(out as f64 * cfg.expand_ratio);
        let rd = ((cfg.se_ratio * out as f64) as usize).max(1);
        let no_bias = Conv2dOptions::default().bias(false);
        let shortcut = (stride == 2)
            .then(|| Downsample2d::new(in_ch, out, ConvInit::Efficient))
            .transpose()?;
        let se = SqueezeExcite::new(mid, rd, SiLU)?;
        ConvInit::Efficient.apply(&se.fc1)?;
        ConvInit::Efficient.apply(&se.fc2)?;
        let dw = no_bias.stride(stride).padding(1).groups(mid);
        Ok(MbConvBlock {
            shortcut,
            pre_norm: BatchNormAct::new(in_ch, false)?,
            conv1_1x1: eff_conv(in_ch, mid, 1, no_bias)?,
            norm1: BatchNormAct::new(mid, true)?,
            conv2_kxk: eff_conv(mid, mid, 3, dw)?,
            norm2: BatchNormAct::new(mid, true)?,
            se,
            conv3_1x1: eff_conv(mid, out, 1, Conv2dOptions::default())?,
            drop_path: (dp > 0.0).then(|| DropPath::new(dp)).transpose()?,
        })
    }
}

impl Module for MbConvBlock {
    fn forward(&self, input: &Var) -> Result<Var> {
        let shortcut = match &self.shortcut {
            Some(s) => s.forward(input)?,
            None => input.clone(),
        };
        let x = self.pre_norm.forward(input)?;
        let x = self.norm1.forward(&self.conv1_1x1.forward(&x)?)?;
        let x = self.norm2.forward(&self.conv2_kxk.forward(&x)?)?;
        let x = self.conv3_1x1.forward(&self.se.forward(&x)?)?;
        drop_branch(&self.drop_path, x)?.add(&shortcut)
    }
}

impl TransformerBlock2d {
    fn new(
        cfg: &CoAtNetConfig,
        in_ch: usize,
        out: usize,
        stride: usize,
        feat: usize,
        dp: f64,
    ) -> Result<Self> {
        let strided = stride == 2;
        let shortcut = strided
            .then(|| Downsample2d::new(in_ch, out, ConvInit::Vit { mlp: false }))
            .transpose()?;
        let down = strided
            .then(|| Downsample2d::new(in_ch, in_ch, ConvInit::Vit { mlp: false }))
            .transpose()?;
        let attn_opts = Conv2dOptions::default();
        let heads = out / cfg.dim_head;
        let hidden = (out as f64 * cfg.expand_ratio) as usize;
        let mlp = ConvInit::Vit { mlp: true };
        let drop_path = || (dp > 0.0).then(|| DropPath::new(dp)).transpose();
        Ok(TransformerBlock2d {
            shortcut,
            norm1: AttnNorm {
                norm: LayerNorm2d::new(in_ch, LN_EPS)?,
                down,
            },
            attn: Attention2d {
                qkv: ConvInit::Vit { mlp: false }.make(in_ch, 3 * out, 1, attn_opts)?,
                rel_pos: RelPosBias::new([feat, feat], heads)?,
                attn_drop: Dropout::new(0.0)?,
                proj: ConvInit::Vit { mlp: false }.make(out, out, 1, attn_opts)?,
                dim_head: cfg.dim_head,
            },
            drop_path1: drop_path()?,
            norm2: LayerNorm2d::new(out, LN_EPS)?,
            mlp: ConvMlp {
                fc1: mlp.make(out, hidden, 1, attn_opts)?,
                act: GELU::default(),
                fc2: mlp.make(hidden, out, 1, attn_opts)?,
            },
            drop_path2: drop_path()?,
        })
    }
}

impl Module for TransformerBlock2d {
    fn forward(&self, input: &Var) -> Result<Var> {
        let shortcut = match &self.shortcut {
            Some(s) => s.forward(input)?,
            None => input.clone(),
        };
        let a = self.attn.forward(&self.norm1.forward(input)?)?;
        let x = shortcut.add(&drop_branch(&self.drop_path1, a)?)?;
        let m = self.mlp.forward(&self.norm2.forward(&x)?)?;
        x.add(&drop_branch(&self.drop_path2, m)?)
    }
}

impl Visit for AttnNorm {
    /// A plain norm reports its own items (keys `norm1.weight`); a strided
    /// block's reports `norm` and `down` children, as timm's `Sequential`.
    fn visit<'a>(&'a self, visitor: &mut dyn Visitor<'a>) {
        match &self.down {
            None => self.norm.visit(visitor),
            Some(down) => {
                visitor.child("norm", &self.norm);
                visitor.child("down", down);
            }
        }
    }

    fn type_name(&self) -> &'static str {
        match self.down {
            None => "LayerNorm2d",
            Some(_) => "Sequential",
        }
    }
}

impl Module for AttnNorm {
    fn forward(&self, input: &Var) -> Result<Var> {
        let x = self.norm.forward(input)?;
        match &self.down {
            Some(d) => d.forward(&x),
            None => Ok(x),
        }
    }
}

impl Module for Attention2d {
    /// Attention over all positions of `[B, C, H, W]` (H×W must be the
    /// bias window). Errors when the shapes do not fit.
    fn forward(&self, input: &Var) -> Result<Var> {
        if input.ndim() != 4 || input.shape()[2..] != self.rel_pos.window {
            return Err(Error::shape(
                "Attention2d",
                format!(
                    "expected a [B, C, {}, {}] map, got {:?}",
                    self.rel_pos.window[0],
                    self.rel_pos.window[1],
                    input.shape()
                ),
            ));
        }
        let (b, h, w) = (input.shape()[0], input.shape()[2], input.shape()[3]);
        let heads = self.rel_pos.num_heads();
        let dh = self.dim_head;
        let qkv = self.qkv.forward(input)?.reshape([b, heads, 3 * dh, h * w])?;
        let part = |i: usize| qkv.narrow(2, i * dh, dh)?.transpose(-1, -2);
        let (q, k, v) = (part(0)?, part(1)?, part(2)?);
        let bias = self.rel_pos.bias()?;
        let opts = AttnOptions {
            mask: Some(AttnMask::Additive(&bias)),
            dropout_p: if self.attn_drop.is_training() {
                self.attn_drop.p
            } else {
                0.0
            },
            ..AttnOptions::default()
        };
        let o = scaled_dot_product_attention(&q, &k, &v, &opts)?;
        let o = o.transpose(-1, -2)?.reshape([b, heads * dh, h, w])?;
        self.proj.forward(&o)
    }
}

impl Module for ConvMlp {
    fn forward(&self, input: &Var) -> Result<Var> {
        let h = self.act.forward(&self.fc1.forward(input)?)?;
        self.fc2.forward(&h)
    }
}

impl Module for Head {
    /// `[B, C, H, W]` features → logits `[B, classes]`.
    fn forward(&self, input: &Var) -> Result<Var> {
        let mut x = input.mean(&[2, 3], true)?;
        if let Some(n) = &self.norm {
            x = n.forward(&x)?;
        }
        let mut x = x.flatten(1, -1)?;
        if let Some(p) = &self.pre_logits {
            x = p.forward(&x)?;
        }
        self.fc.forward(&self.drop.forward(&x)?)
    }
}

/// timm's `vit_eff` init of a convolution, by where it sits.
#[derive(Debug, Clone, Copy)]
enum ConvInit {
    /// Stem and MBConv: N(0, 2/fan_out), `fan_out = k²·out/groups`, zero
    /// bias (EfficientNet).
    Efficient,
    /// Transformer blocks: xavier-uniform, zero bias, or N(0, 1e-12) bias
    /// inside the MLP.
    Vit { mlp: bool },
}

impl ConvInit {
    fn make(self, in_ch: usize, out: usize, k: usize, opts: Conv2dOptions) -> Result<Conv2d> {
        let conv = Conv2d::new(in_ch, out, k, opts)?;
        self.apply(&conv)?;
        Ok(conv)
    }

    fn apply(self, conv: &Conv2d) -> Result<()> {
        match self {
            ConvInit::Efficient => {
                let s = conv.weight.shape();
                let fan_out = s[0] * s[2] * s[3] / conv.params.groups;
                init::normal_(&conv.weight, 0.0, (2.0 / fan_out as f64).sqrt())?;
            }
            ConvInit::Vit { .. } => init::xavier_uniform_(&conv.weight, 1.0)?,
        }
        match (self, &conv.bias) {
            (ConvInit::Vit { mlp: true }, Some(b)) => init::normal_(b, 0.0, 1e-6),
            (_, Some(b)) => init::zeros_(b),
            (_, None) => Ok(()),
        }
    }
}

fn eff_conv(in_ch: usize, out: usize, k: usize, opts: Conv2dOptions) -> Result<Conv2d> {
    ConvInit::Efficient.make(in_ch, out, k, opts)
}

/// timm's `make_divisible(v, 8)`: `v` rounded to a multiple of 8, at least
/// 8, and not below 90 % of `v`.
fn make_divisible(v: f64) -> usize {
    const DIVISOR: usize = 8;
    let rounded = ((v + DIVISOR as f64 / 2.0) as usize / DIVISOR * DIVISOR).max(DIVISOR);
    match (rounded as f64) < 0.9 * v {
        true => rounded + DIVISOR,
        false => rounded,
    }
}
