//! Ready-made networks with PyTorch-equivalent structure and names.

mod mnist;

pub use mnist::{mnist_cnn, mnist_mlp};
