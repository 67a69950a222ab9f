//! Ready-made networks with PyTorch-equivalent structure and names:
//! torchvision's ResNets, timm's Vision Transformers and CoAtNets (same
//! state-dict keys and shapes, so their checkpoints load by name), and the
//! MNIST networks of the first training run. Each family has a config
//! struct whose builder methods size a variant in one line (a 32×32
//! ResNet-18, a 28×28 ViT, ...).

mod coatnet;
mod gpt;
mod mnist;
mod resnet;
mod vit;

pub use coatnet::{
    coatnet_0_224, coatnet_1_224, coatnet_2_224, coatnet_3_224, Attention2d, AttnNorm, BatchNormAct, CoAtNet,
    CoAtNetConfig, ConvMlp, Downsample2d, Head, MbConvBlock, PreLogits, Stage, Stem, TransformerBlock2d,
};
pub use gpt::{causal_attention, sample, Gpt, GptAttention, GptBlock, GptConfig, GptMlp};
pub use mnist::{mnist_cnn, mnist_mlp};
pub use resnet::{
    resnet101, resnet18, resnet34, resnet50, Downsample, ResNet, ResNetBlock, ResNetConfig, ResNetStem,
    ResidualBlock,
};
pub use vit::{
    vit_base_patch16_224, vit_small_patch16_224, vit_tiny_patch16_224, Mlp, PatchEmbed, VisionTransformer,
    VitAttention, VitBlock, VitConfig,
};
