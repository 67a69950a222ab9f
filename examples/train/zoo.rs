//! The model named on the command line, sized for the data, and its weight
//! EMA.

use tessera::nn::models::{CoAtNet, CoAtNetConfig, ResNet, ResNetConfig, VisionTransformer, VitConfig};
use tessera::nn::Module;
use tessera::tensor::{Result, StateDict};

use super::cli::Args;
use super::common::BoxResult;

/// The model of `args.model` for `in_chans`-channel images of side
/// `img_size` and `classes` classes, with the size overrides of `args`.
pub fn build(args: &Args, img_size: usize, in_chans: usize, classes: usize) -> BoxResult<Box<dyn Module>> {
    let name = args.model.as_str();
    let vit = vit_config(name).is_some();
    if vit && (args.widths.is_some() || args.blocks.is_some()) {
        return Err(format!(
            "--widths and --blocks size ResNets and CoAtNets; {name} takes --embed-dim and --depth"
        )
        .into());
    }
    if !vit && (args.depth.is_some() || args.embed_dim.is_some() || args.num_heads.is_some()) {
        return Err(format!(
            "--depth, --embed-dim and --num-heads size ViTs; {name} takes --widths and --blocks"
        )
        .into());
    }
    if let Some(mut cfg) = resnet_config(name) {
        if let Some((stem, w)) = args.widths {
            cfg = cfg.widths(stem, w);
        }
        if let Some(b) = args.blocks {
            cfg.layers = b;
        }
        let mut cfg = cfg
            .in_chans(in_chans)
            .num_classes(classes)
            .drop_path_rate(args.drop_path);
        if img_size <= 64 {
            cfg = cfg.small_input();
        }
        return Ok(Box::new(ResNet::new(&cfg)?));
    }
    if let Some(cfg) = vit_config(name) {
        let mut cfg = cfg
            .img_size(img_size)
            .patch_size(args.patch_size)
            .in_chans(in_chans)
            .num_classes(classes)
            .drop_path_rate(args.drop_path);
        if let Some(d) = args.depth {
            cfg = cfg.depth(d);
        }
        let dim = args.embed_dim.unwrap_or(cfg.embed_dim);
        let heads = args.num_heads.unwrap_or(cfg.num_heads);
        cfg = cfg.width(dim, heads);
        return Ok(Box::new(VisionTransformer::new(&cfg)?));
    }
    if let Some(mut cfg) = coatnet_config(name) {
        if args.widths.is_some() || args.blocks.is_some() {
            let (stem, dims) = args.widths.unwrap_or((cfg.stem_width, cfg.embed_dim));
            let depths = args.blocks.unwrap_or(cfg.depths);
            cfg = cfg.widths(stem, dims, depths);
        }
        let cfg = cfg
            .img_size(img_size)
            .in_chans(in_chans)
            .num_classes(classes)
            .drop_path_rate(args.drop_path);
        return Ok(Box::new(CoAtNet::new(&cfg)?));
    }
    Err(format!("unknown model {name:?}; see --help").into())
}

/// The default input side of `name`: 32 for CoAtNet (a multiple of 32),
/// else the data's 28.
pub fn default_img_size(name: &str) -> usize {
    if coatnet_config(name).is_some() {
        32
    } else {
        28
    }
}

fn resnet_config(name: &str) -> Option<ResNetConfig> {
    Some(match name {
        "resnet18" => ResNetConfig::resnet18(),
        "resnet34" => ResNetConfig::resnet34(),
        "resnet50" => ResNetConfig::resnet50(),
        "resnet101" => ResNetConfig::resnet101(),
        _ => return None,
    })
}

fn vit_config(name: &str) -> Option<VitConfig> {
    Some(match name {
        "vit_tiny_patch16_224" => VitConfig::vit_tiny_patch16_224(),
        "vit_small_patch16_224" => VitConfig::vit_small_patch16_224(),
        "vit_base_patch16_224" => VitConfig::vit_base_patch16_224(),
        _ => return None,
    })
}

fn coatnet_config(name: &str) -> Option<CoAtNetConfig> {
    Some(match name {
        "coatnet_0_224" => CoAtNetConfig::coatnet_0_224(),
        "coatnet_1_224" => CoAtNetConfig::coatnet_1_224(),
        "coatnet_2_224" => CoAtNetConfig::coatnet_2_224(),
        "coatnet_3_224" => CoAtNetConfig::coatnet_3_224(),
        _ => return None,
    })
}

/// timm's `ModelEmaV2`: a copy of the model whose state is, after every
/// update, `decay·ema + (1 − decay)·model` for float entries (parameters
/// and BatchNorm running statistics) and the model's value for the others
/// (`num_batches_tracked`).
pub struct Ema {
    pub model: Box<dyn Module>,
    pub decay: f64,
}

impl Ema {
    /// An EMA starting from `model`'s current state, in eval mode, held by
    /// `copy` (a second instance of the same architecture).
    pub fn new(mut copy: Box<dyn Module>, model: &dyn Module, decay: f64) -> Result<Ema> {
        copy.load_state_dict(&model.state_dict(), true)?;
        copy.eval();
        Ok(Ema { model: copy, decay })
    }

    /// One EMA step towards `model`'s current state.
    pub fn update(&self, model: &dyn Module) -> Result<()> {
        let current = self.model.state_dict();
        let mut next = StateDict::new();
        for (name, t) in model.state_dict().iter() {
            let e = current.require("Ema::update", name)?;
            let v = if t.dtype().is_float() {
                e.mul_scalar(self.decay)?.add(&t.mul_scalar(1.0 - self.decay)?)?
            } else {
                t.clone()
            };
            next.insert(name, v);
        }
        self.model.load_state_dict(&next, true)?;
        Ok(())
    }
}
