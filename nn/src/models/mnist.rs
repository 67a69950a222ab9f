//! The MNIST networks of the first training run: an MLP and a small CNN.

use tessera_tensor::Result;

use crate::{Conv2d, Conv2dOptions, Flatten, Linear, MaxPool2d, ReLU, Sequential};

/// `Flatten – Linear(784, h₁) – ReLU – … – Linear(h_last, 10)`: an MLP over
/// 28×28 images (inputs `[N, 1, 28, 28]` or `[N, 784]`) with the given
/// hidden widths. State-dict names are `1.weight`, `1.bias`, `3.weight`, …
/// as for the same `torch.nn.Sequential`. Errors only if allocation fails.
pub fn mnist_mlp(hidden: &[usize]) -> Result<Sequential> {
    let mut net = Sequential::new().with(Flatten::default());
    let mut width = 28 * 28;
    for &h in hidden {
        net = net.with(Linear::new(width, h, true)?).with(ReLU);
        width = h;
    }
    Ok(net.with(Linear::new(width, 10, true)?))
}

/// The CNN of `examples/train_mnist.rs`, as `torch.nn.Sequential`:
/// `0` conv(1→32, 3×3, pad 1) – ReLU – maxpool 2 – `3` conv(32→64, 3×3,
/// pad 1) – ReLU – maxpool 2 – flatten – `7` linear(3136→128) – ReLU – `9`
/// linear(128→10). 421,642 parameters. Errors only if allocation fails.
pub fn mnist_cnn() -> Result<Sequential> {
    let conv = Conv2dOptions::default().padding(1);
    Ok(Sequential::new()
        .with(Conv2d::new(1, 32, 3, conv)?)
        .with(ReLU)
        .with(MaxPool2d::new(2))
        .with(Conv2d::new(32, 64, 3, conv)?)
        .with(ReLU)
        .with(MaxPool2d::new(2))
        .with(Flatten::default())
        .with(Linear::new(64 * 7 * 7, 128, true)?)
        .with(ReLU)
        .with(Linear::new(128, 10, true)?))
}
