//! Vision Transformer with timm's `VisionTransformer` structure and
//! state-dict names (`vit_tiny/small/base_patch16_224`).

use tessera_autograd::{scaled_dot_product_attention, AttnOptions, Parameter, Var};
use tessera_tensor::{DType, Error, GeluApprox, Result, Tensor};

use crate::drop_path::{drop_branch, drop_path_at};
use crate::{init, Conv2d, Conv2dOptions, DropPath, Dropout, LayerNorm, Linear, Module, GELU};

/// The shape of a [`VisionTransformer`]; `VitConfig::vit_tiny_patch16_224()`
/// is timm's model of that name, and the builder methods change one thing
/// each, so a 10-class 28×28 one-channel ViT with 4×4 patches is
/// `VitConfig::vit_tiny_patch16_224().img_size(28).patch_size(4).in_chans(1).num_classes(10)`.
#[derive(Debug, Clone, PartialEq)]
pub struct VitConfig {
    /// Input height and width (square).
    pub img_size: usize,
    /// Patch side; must divide `img_size`.
    pub patch_size: usize,
    /// Input channels.
    pub in_chans: usize,
    /// Classifier outputs.
    pub num_classes: usize,
    /// Token width D.
    pub embed_dim: usize,
    /// Number of blocks.
    pub depth: usize,
    /// Attention heads; must divide `embed_dim`.
    pub num_heads: usize,
    /// MLP hidden width = `mlp_ratio · D`.
    pub mlp_ratio: f64,
    /// Bias in the fused `qkv` projection (timm: true).
    pub qkv_bias: bool,
    /// Dropout after the position embedding, in the MLP, after the
    /// projections and before the head (timm's `drop_rate`).
    pub drop_rate: f64,
    /// Dropout on the attention weights.
    pub attn_drop_rate: f64,
    /// Stochastic depth, rising linearly over the blocks to this rate.
    pub drop_path_rate: f64,
}

impl VitConfig {
    fn timm(embed_dim: usize, num_heads: usize) -> VitConfig {
        VitConfig {
            img_size: 224,
            patch_size: 16,
            in_chans: 3,
            num_classes: 1000,
            embed_dim,
            depth: 12,
            num_heads,
            mlp_ratio: 4.0,
            qkv_bias: true,
            drop_rate: 0.0,
            attn_drop_rate: 0.0,
            drop_path_rate: 0.0,
        }
    }

    /// timm `vit_tiny_patch16_224`: D 192, 3 heads, 5,717,416 parameters.
    pub fn vit_tiny_patch16_224() -> VitConfig {
        Self::timm(192, 3)
    }

    /// timm `vit_small_patch16_224`: D 384, 6 heads, 22,050,664 parameters.
    pub fn vit_small_patch16_224() -> VitConfig {
        Self::timm(384, 6)
    }

    /// timm `vit_base_patch16_224`: D 768, 12 heads, 86,567,656 parameters.
    pub fn vit_base_patch16_224() -> VitConfig {
        Self::timm(768, 12)
    }

    /// The same model for `size×size` inputs.
    pub fn img_size(mut self, size: usize) -> Self {
        self.img_size = size;
        self
    }

    /// The same model with `p×p` patches.
    pub fn patch_size(mut self, p: usize) -> Self {
        self.patch_size = p;
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

    /// The same model with `depth` blocks.
    pub fn depth(mut self, depth: usize) -> Self {
        self.depth = depth;
        self
    }

    /// The same model with width `dim` and `heads` heads.
    pub fn width(mut self, dim: usize, heads: usize) -> Self {
        self.embed_dim = dim;
        self.num_heads = heads;
        self
    }

    /// The same model with stochastic depth up to `rate`.
    pub fn drop_path_rate(mut self, rate: f64) -> Self {
        self.drop_path_rate = rate;
        self
    }

    /// The same model with dropout `rate` (timm's `drop_rate`).
    pub fn drop_rate(mut self, rate: f64) -> Self {
        self.drop_rate = rate;
        self
    }

    fn check(&self) -> Result<()> {
        let sizes_ok = self.patch_size > 0
            && self.img_size > 0
            && self.img_size.is_multiple_of(self.patch_size)
            && self.num_heads > 0
            && self.embed_dim.is_multiple_of(self.num_heads)
            && self.embed_dim > 0
            && self.in_chans > 0
            && self.num_classes > 0
            && self.mlp_ratio > 0.0;
        let rates_ok = [self.drop_rate, self.attn_drop_rate, self.drop_path_rate]
            .iter()
            .all(|r| (0.0..=1.0).contains(r));
        if sizes_ok && rates_ok {
            return Ok(());
        }
        Err(Error::arg(
            "VisionTransformer::new",
            format!("the patch size must divide the image size, the heads the width, sizes must be positive and rates in [0, 1]; got {self:?}"),
        ))
    }
}

/// A Vision Transformer (timm `VisionTransformer` with its defaults:
/// class token, learned position embedding added after the class token is
/// prepended, pre-norm blocks with a fused `qkv`, LayerNorm eps 1e-6,
/// exact GELU, final `norm`, the class token to `head`). Keys and shapes
/// equal timm's state dict. Init as timm: `pos_embed` trunc-normal std
/// .02, `cls_token` normal std 1e-6, Linear weights trunc-normal std .02
/// with zero biases, the patch convolution and norms PyTorch's default.
#[derive(Debug, Clone, Module)]
pub struct VisionTransformer {
    /// The class token `[1, 1, D]`.
    pub cls_token: Parameter,
    /// Position embedding `[1, 1 + patches, D]`.
    pub pos_embed: Parameter,
    /// Patch embedding.
    pub patch_embed: PatchEmbed,
    /// Dropout after the position embedding.
    pub pos_drop: Dropout,
    /// The blocks.
    pub blocks: Vec<VitBlock>,
    /// The final norm.
    pub norm: LayerNorm,
    /// Dropout before the head.
    pub head_drop: Dropout,
    /// The classifier.
    pub head: Linear,
}

/// timm's `PatchEmbed`: a `p×p` stride-`p` convolution, flattened to
/// `[B, patches, D]`.
#[derive(Debug, Clone, Module)]
pub struct PatchEmbed {
    /// The patch projection.
    pub proj: Conv2d,
    /// The expected input `(H, W)`.
    #[module(skip)]
    pub img_size: [usize; 2],
}

/// A pre-norm transformer block (timm `Block`): `x + attn(norm1(x))`,
/// then `x + mlp(norm2(x))`, each branch through DropPath.
#[derive(Debug, Clone, Module)]
pub struct VitBlock {
    /// Norm before attention.
    pub norm1: LayerNorm,
    /// Self-attention.
    pub attn: VitAttention,
    /// Stochastic depth of the attention branch.
    pub drop_path1: Option<DropPath>,
    /// Norm before the MLP.
    pub norm2: LayerNorm,
    /// The MLP.
    pub mlp: Mlp,
    /// Stochastic depth of the MLP branch.
    pub drop_path2: Option<DropPath>,
}

/// timm's `Attention`: fused `qkv` Linear `D → 3D` (rows `[q; k; v]`, each
/// head-major), scaled dot-product attention, `proj` Linear `D → D`.
#[derive(Debug, Clone, Module)]
pub struct VitAttention {
    /// The fused projection.
    pub qkv: Linear,
    /// Dropout on the attention weights.
    pub attn_drop: Dropout,
    /// The output projection.
    pub proj: Linear,
    /// Dropout after `proj`.
    pub proj_drop: Dropout,
    /// Heads.
    #[module(skip)]
    pub num_heads: usize,
}

/// timm's `Mlp`: `fc1`, GELU, dropout, `fc2`, dropout.
#[derive(Debug, Clone, Module)]
pub struct Mlp {
    /// Expansion.
    pub fc1: Linear,
    /// The activation.
    pub act: GELU,
    /// Dropout after the activation.
    pub drop1: Dropout,
    /// Projection.
    pub fc2: Linear,
    /// Dropout after `fc2`.
    pub drop2: Dropout,
}

/// timm `vit_tiny_patch16_224`. Errors only if allocation fails.
pub fn vit_tiny_patch16_224() -> Result<VisionTransformer> {
    VisionTransformer::new(&VitConfig::vit_tiny_patch16_224())
}

/// timm `vit_small_patch16_224`. Errors only if allocation fails.
pub fn vit_small_patch16_224() -> Result<VisionTransformer> {
    VisionTransformer::new(&VitConfig::vit_small_patch16_224())
}

/// timm `vit_base_patch16_224`. Errors only if allocation fails.
pub fn vit_base_patch16_224() -> Result<VisionTransformer> {
    VisionTransformer::new(&VitConfig::vit_base_patch16_224())
}

const LN_EPS: f64 = 1e-6;

impl VisionTransformer {
    /// Builds the model of `cfg` with timm's init. Errors when the
    /// configuration is inconsistent (see [`VitConfig`]'s fields).
    pub fn new(cfg: &VitConfig) -> Result<VisionTransformer> {
        cfg.check()?;
        let d = cfg.embed_dim;
        let grid = cfg.img_size / cfg.patch_size;
        let cls_token = Parameter::new(Tensor::zeros(&[1, 1, d], DType::F32)?);
        let pos_embed = Parameter::new(Tensor::zeros(&[1, grid * grid + 1, d], DType::F32)?);
        let patch = Conv2dOptions::default().stride(cfg.patch_size);
        let patch_embed = PatchEmbed {
            proj: Conv2d::new(cfg.in_chans, d, cfg.patch_size, patch)?,
            img_size: [cfg.img_size; 2],
        };
        let blocks = (0..cfg.depth)
            .map(|i| VitBlock::new(cfg, drop_path_at(cfg.drop_path_rate, i, cfg.depth)))
            .collect::<Result<Vec<_>>>()?;
        let vit = VisionTransformer {
            cls_token,
            pos_embed,
            patch_embed,
            pos_drop: Dropout::new(cfg.drop_rate)?,
            blocks,
            norm: LayerNorm::new(&[d], LN_EPS, true, true)?,
            head_drop: Dropout::new(cfg.drop_rate)?,
            head: Linear::new(d, cfg.num_classes, true)?,
        };
        vit.init()?;
        Ok(vit)
    }

    /// timm's default (`''`) init.
    fn init(&self) -> Result<()> {
        init::trunc_normal_(&self.pos_embed, 0.0, 0.02, -2.0, 2.0)?;
        init::normal_(&self.cls_token, 0.0, 1e-6)?;
        let mut linears: Vec<&Linear> = vec![&self.head];
        for b in &self.blocks {
            linears.extend([&b.attn.qkv, &b.attn.proj, &b.mlp.fc1, &b.mlp.fc2]);
        }
        for l in linears {
            init::trunc_normal_(&l.weight, 0.0, 0.02, -2.0, 2.0)?;
            if let Some(b) = &l.bias {
                init::zeros_(b)?;
            }
        }
        Ok(())
    }

    /// The normalised tokens `[B, 1 + patches, D]` before pooling. Errors
    /// when the input is not `[B, in_chans, img_size, img_size]`.
    pub fn forward_features(&self, x: &Var) -> Result<Var> {
        let x = self.patch_embed.forward(x)?;
        let b = x.shape()[0];
        let d = self.cls_token.shape()[2];
        let cls = self.cls_token.var()?.expand([b, 1, d])?;
        let x = Var::cat(&[cls, x], 1)?.add(&self.pos_embed.var()?)?;
        let mut x = self.pos_drop.forward(&x)?;
        for block in &self.blocks {
            x = block.forward(&x)?;
        }
        self.norm.forward(&x)
    }
}

impl Module for VisionTransformer {
    /// Logits `[B, num_classes]` from the class token. Errors as
    /// [`VisionTransformer::forward_features`].
    fn forward(&self, input: &Var) -> Result<Var> {
        let x = self.forward_features(input)?.select(1, 0)?;
        self.head.forward(&self.head_drop.forward(&x)?)
    }
}

impl Module for PatchEmbed {
    /// `[B, C, H, W]` → `[B, patches, D]`. Errors when `(H, W)` is not the
    /// configured image size (the position embedding is fixed to it).
    fn forward(&self, input: &Var) -> Result<Var> {
        let c = self.proj.weight.shape()[1];
        if input.ndim() != 4 || input.shape()[1] != c || input.shape()[2..] != self.img_size {
            return Err(Error::shape(
                "PatchEmbed",
                format!(
                    "expected input [B, {c}, {}, {}], got {:?}",
                    self.img_size[0],
                    self.img_size[1],
                    input.shape()
                ),
            ));
        }
        self.proj.forward(input)?.flatten(2, -1)?.transpose(1, 2)
    }
}

impl VitBlock {
    fn new(cfg: &VitConfig, drop_path: f64) -> Result<VitBlock> {
        let d = cfg.embed_dim;
        let hidden = (d as f64 * cfg.mlp_ratio) as usize;
        let dp = || (drop_path > 0.0).then(|| DropPath::new(drop_path)).transpose();
        Ok(VitBlock {
            norm1: LayerNorm::new(&[d], LN_EPS, true, true)?,
            attn: VitAttention {
                qkv: Linear::new(d, 3 * d, cfg.qkv_bias)?,
                attn_drop: Dropout::new(cfg.attn_drop_rate)?,
                proj: Linear::new(d, d, true)?,
                proj_drop: Dropout::new(cfg.drop_rate)?,
                num_heads: cfg.num_heads,
            },
            drop_path1: dp()?,
            norm2: LayerNorm::new(&[d], LN_EPS, true, true)?,
            mlp: Mlp {
                fc1: Linear::new(d, hidden, true)?,
                act: GELU {
                    approximate: GeluApprox::None,
                },
                drop1: Dropout::new(cfg.drop_rate)?,
                fc2: Linear::new(hidden, d, true)?,
                drop2: Dropout::new(cfg.drop_rate)?,
            },
            drop_path2: dp()?,
        })
    }
}

impl Module for VitBlock {
    fn forward(&self, input: &Var) -> Result<Var> {
        let a = self.attn.forward(&self.norm1.forward(input)?)?;
        let x = input.add(&drop_branch(&self.drop_path1, a)?)?;
        let m = self.mlp.forward(&self.norm2.forward(&x)?)?;
        x.add(&drop_branch(&self.drop_path2, m)?)
    }
}

impl Module for VitAttention {
    /// Self-attention of `[B, N, D]`. Errors when the last dim is not D.
    fn forward(&self, input: &Var) -> Result<Var> {
        let d = self.proj.in_features();
        if input.ndim() != 3 || input.shape()[2] != d {
            return Err(Error::shape(
                "VitAttention",
                format!("expected tokens [B, N, {d}], got {:?}", input.shape()),
            ));
        }
        let (b, n) = (input.shape()[0], input.shape()[1]);
        let qkv = self
            .qkv
            .forward(input)?
            .reshape([b, n, 3, self.num_heads, d / self.num_heads])?
            .permute(&[2, 0, 3, 1, 4])?;
        let (q, k, v) = (qkv.select(0, 0)?, qkv.select(0, 1)?, qkv.select(0, 2)?);
        let opts = AttnOptions {
            dropout_p: if self.attn_drop.is_training() {
                self.attn_drop.p
            } else {
                0.0
            },
            ..AttnOptions::default()
        };
        let o = scaled_dot_product_attention(&q, &k, &v, &opts)?;
        let o = o.transpose(1, 2)?.reshape([b, n, d])?;
        self.proj_drop.forward(&self.proj.forward(&o)?)
    }
}

impl Module for Mlp {
    fn forward(&self, input: &Var) -> Result<Var> {
        let h = self
            .drop1
            .forward(&self.act.forward(&self.fc1.forward(input)?)?)?;
        self.drop2.forward(&self.fc2.forward(&h)?)
    }
}
