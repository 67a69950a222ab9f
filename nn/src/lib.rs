//! # tessera-nn
//!
//! Neural-network modules with PyTorch's names, layouts, defaults and
//! initialisation.
//!
//! - [`Module`]: `#[derive(Module)]` reads a module's parameters, buffers,
//!   training flag and children from its fields (no hand-kept lists);
//!   `forward`, parameters and buffers named as in PyTorch's `state_dict`
//!   (`features.0.weight`, `bn1.running_mean`, `bn1.num_batches_tracked`),
//!   `train`/`eval`, parameter counts. [`walk`] visits the whole tree.
//! - [`state_dict`]: load by name (missing, unexpected and wrongly shaped
//!   keys reported; an error when strict) and save through safetensors, so
//!   checkpoints move between tessera and PyTorch.
//! - Layers: [`Linear`], [`Conv2d`], [`BatchNorm`] (1d/2d), [`LayerNorm`],
//!   [`GroupNorm`], [`Dropout`], [`Embedding`], [`MaxPool2d`],
//!   [`AvgPool2d`], [`AdaptiveAvgPool2d`], [`Flatten`], [`Identity`],
//!   activations, [`Sequential`], [`ModuleList`], [`MultiheadAttention`],
//!   [`TransformerEncoderLayer`], timm's [`DropPath`], [`SqueezeExcite`],
//!   [`RelPosBias`] and [`LayerNorm2d`]; losses ([`CrossEntropyLoss`], ...).
//! - [`init`]: `torch.nn.init`'s schemes; every layer starts with
//!   PyTorch's default init.
//! - [`models`]: ready-made networks with torchvision/timm names and
//!   structure (ResNet, ViT, CoAtNet) and the MNIST MLP and CNN.
//!
//! ```
//! use tessera_nn::{Linear, Module, ReLU, Sequential};
//! let net = Sequential::new()
//!     .with(Linear::new(4, 8, true)?)
//!     .with(ReLU)
//!     .with(Linear::new(8, 2, true)?);
//! let names: Vec<String> = net.named_parameters().into_iter().map(|(n, _)| n).collect();
//! assert_eq!(names, ["0.weight", "0.bias", "2.weight", "2.bias"]);
//! assert_eq!(net.num_parameters(), 4 * 8 + 8 + 8 * 2 + 2);
//! # Ok::<(), tessera_tensor::Error>(())
//! ```

// The derive names this crate `::tessera_nn`, also inside it.
extern crate self as tessera_nn;

mod activation;
mod attention;
mod buffer;
mod container;
mod conv;
mod drop_path;
mod embedding;
pub mod init;
mod linear;
mod loss;
pub mod models;
mod module;
mod norm;
mod pool;
mod rel_pos;
mod se;
pub mod state_dict;
mod training;
mod transformer;
mod visit;

pub use activation::{Dropout, ReLU, SiLU, Sigmoid, Softmax, Tanh, GELU};
pub use attention::{MhaMasks, MultiheadAttention};
pub use buffer::Buffer;
pub use container::{ModuleList, Sequential};
pub use conv::{Conv2d, Conv2dOptions};
pub use drop_path::DropPath;
pub use embedding::Embedding;
pub use linear::{Flatten, Identity, Linear};
pub use loss::{BCEWithLogitsLoss, CrossEntropyLoss, MSELoss, NLLLoss};
pub use module::Module;
pub use norm::{BatchNorm, BatchNormOptions, GroupNorm, LayerNorm, LayerNorm2d};
pub use pool::{AdaptiveAvgPool2d, AvgPool2d, MaxPool2d};
pub use rel_pos::RelPosBias;
pub use se::SqueezeExcite;
pub use state_dict::LoadReport;
pub use tessera_autograd::{Parameter, Reduction, Var};
pub use tessera_derive::Module;
pub use training::Training;
pub use transformer::{Activation, TransformerEncoderLayer, TransformerOptions};
pub use visit::{walk, Entry, ModuleField, Visit, Visitor};
