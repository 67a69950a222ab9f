//! Parameter initialisation with the formulas of `torch.nn.init`.
//!
//! Every function replaces a [`Parameter`]'s value in place (keeping its
//! id, so optimizers holding it see the new value) with samples from this
//! thread's default generator (seed it with
//! [`tessera_tensor::rng::manual_seed`]). Fans follow PyTorch's
//! `_calculate_fan_in_and_fan_out`: for a weight `[out, in, k...]`,
//! `fan_in = in · Πk`, `fan_out = out · Πk`.
//!
//! Inside [`skip_init`] every filling function of this module leaves the
//! parameter as it is, so a model whose weights come from a checkpoint is
//! built without drawing them first.

use std::cell::Cell;

use tessera_autograd::Parameter;
use tessera_tensor::{Error, Result, Tensor};

thread_local! {
    static SKIP: Cell<bool> = const { Cell::new(false) };
}

/// Runs `build` with initialisation switched off on this thread (as
/// `torch.nn.utils.skip_init`): every filling function of this module
/// returns at once, so layers keep the values they were allocated with
/// (zeros for weights and biases, ones for norm scales). For a model whose
/// weights are about to be loaded, or whose structure alone is wanted: the
/// 25-million-parameter ResNet-50 is then built without drawing 25 million
/// random numbers. Nests; the previous setting is restored on return, also
/// when `build` panics.
pub fn skip_init<R>(build: impl FnOnce() -> R) -> R {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            SKIP.with(|s| s.set(self.0));
        }
    }
    let _restore = Restore(SKIP.with(|s| s.replace(true)));
    build()
}

/// True inside [`skip_init`] on this thread.
pub fn is_init_skipped() -> bool {
    SKIP.with(Cell::get)
}

/// `p.set(make())` unless initialisation is skipped.
fn fill(p: &Parameter, make: impl FnOnce() -> Result<Tensor>) -> Result<()> {
    if is_init_skipped() {
        return Ok(());
    }
    p.set(make()?)
}

/// Which fan [`kaiming_uniform_`] and [`kaiming_normal_`] scale by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FanMode {
    /// Preserves the variance of activations in the forward pass (default).
    #[default]
    FanIn,
    /// Preserves the variance of gradients in the backward pass.
    FanOut,
}

/// The non-linearity a gain is computed for (`torch.nn.init.calculate_gain`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Nonlinearity {
    /// Identity / linear layers: gain 1.
    Linear,
    /// Convolutions: gain 1.
    Conv,
    /// Sigmoid: gain 1.
    Sigmoid,
    /// Tanh: gain 5/3.
    Tanh,
    /// ReLU: gain √2.
    Relu,
    /// Leaky ReLU with this negative slope: gain √(2 / (1 + slope²)).
    LeakyRelu(f64),
    /// SELU: gain 3/4.
    Selu,
}

/// The recommended gain for `nonlinearity`, as `calculate_gain`.
pub fn calculate_gain(nonlinearity: Nonlinearity) -> f64 {
    match nonlinearity {
        Nonlinearity::Linear | Nonlinearity::Conv | Nonlinearity::Sigmoid => 1.0,
        Nonlinearity::Tanh => 5.0 / 3.0,
        Nonlinearity::Relu => 2f64.sqrt(),
        Nonlinearity::LeakyRelu(s) => (2.0 / (1.0 + s * s)).sqrt(),
        Nonlinearity::Selu => 0.75,
    }
}

/// `(fan_in, fan_out)` of a weight of shape `shape` (`[out, in, k...]`).
/// Errors for fewer than two dimensions, as PyTorch does.
pub fn fan_in_and_fan_out(shape: &[usize]) -> Result<(usize, usize)> {
    if shape.len() < 2 {
        return Err(Error::shape(
            "fan_in_and_fan_out",
            format!("fan in and fan out need at least 2 dimensions, got shape {shape:?}"),
        ));
    }
    let receptive: usize = shape[2..].iter().product();
    Ok((shape[1] * receptive, shape[0] * receptive))
}

/// Fills `p` with U(a, b). Errors when `a > b` or a bound is not finite.
pub fn uniform_(p: &Parameter, a: f64, b: f64) -> Result<()> {
    fill(p, || Tensor::uniform(&p.shape(), a, b, p.dtype()))
}

/// Fills `p` with N(mean, std²). Errors when `std < 0` or an argument is
/// not finite.
pub fn normal_(p: &Parameter, mean: f64, std: f64) -> Result<()> {
    fill(p, || Tensor::normal(&p.shape(), mean, std, p.dtype()))
}

/// Fills `p` with N(mean, std²) truncated to `[a, b]` (absolute bounds;
/// PyTorch's defaults are -2 and 2). Errors as [`Tensor::trunc_normal`].
pub fn trunc_normal_(p: &Parameter, mean: f64, std: f64, a: f64, b: f64) -> Result<()> {
    fill(p, || Tensor::trunc_normal(&p.shape(), mean, std, a, b, p.dtype()))
}

/// Fills `p` with `value`. Errors only for a dtype `value` cannot fill.
pub fn constant_(p: &Parameter, value: f64) -> Result<()> {
    fill(p, || Tensor::full(&p.shape(), value, p.dtype()))
}

/// Fills `p` with zeros.
pub fn zeros_(p: &Parameter) -> Result<()> {
    constant_(p, 0.0)
}

/// Fills `p` with ones.
pub fn ones_(p: &Parameter) -> Result<()> {
    constant_(p, 1.0)
}

/// Glorot uniform: U(-a, a) with `a = gain · √(6 / (fan_in + fan_out))`.
/// Errors for fewer than two dimensions.
pub fn xavier_uniform_(p: &Parameter, gain: f64) -> Result<()> {
    let (fi, fo) = fan_in_and_fan_out(&p.shape())?;
    let a = gain * (6.0 / (fi + fo).max(1) as f64).sqrt();
    uniform_(p, -a, a)
}

/// Glorot normal: N(0, std²) with `std = gain · √(2 / (fan_in + fan_out))`.
/// Errors for fewer than two dimensions.
pub fn xavier_normal_(p: &Parameter, gain: f64) -> Result<()> {
    let (fi, fo) = fan_in_and_fan_out(&p.shape())?;
    normal_(p, 0.0, gain * (2.0 / (fi + fo).max(1) as f64).sqrt())
}

/// He uniform: U(-b, b) with `b = gain · √(3 / fan)`, the gain of
/// `nonlinearity` and the fan of `mode`. `Nonlinearity::LeakyRelu(√5)` with
/// `FanIn` is the default init of Linear and Conv weights. Errors for fewer
/// than two dimensions.
pub fn kaiming_uniform_(p: &Parameter, mode: FanMode, nonlinearity: Nonlinearity) -> Result<()> {
    let std = kaiming_std(p, mode, nonlinearity)?;
    let bound = 3f64.sqrt() * std;
    uniform_(p, -bound, bound)
}

/// He normal: N(0, std²) with `std = gain / √fan`. Errors for fewer than
/// two dimensions.
pub fn kaiming_normal_(p: &Parameter, mode: FanMode, nonlinearity: Nonlinearity) -> Result<()> {
    let std = kaiming_std(p, mode, nonlinearity)?;
    normal_(p, 0.0, std)
}

/// PyTorch's default init of a Linear/Conv layer: the weight by
/// `kaiming_uniform_(a=√5)` (= U(±1/√fan_in)), and the bias by
/// U(±1/√fan_in) (0 bounds when `fan_in` is 0). Errors when the weight has
/// fewer than two dimensions.
pub fn default_layer_init(weight: &Parameter, bias: Option<&Parameter>) -> Result<()> {
    kaiming_uniform_(weight, FanMode::FanIn, Nonlinearity::LeakyRelu(5f64.sqrt()))?;
    if let Some(b) = bias {
        let (fan_in, _) = fan_in_and_fan_out(&weight.shape())?;
        let bound = if fan_in > 0 {
            1.0 / (fan_in as f64).sqrt()
        } else {
            0.0
        };
        uniform_(b, -bound, bound)?;
    }
    Ok(())
}

fn kaiming_std(p: &Parameter, mode: FanMode, nonlinearity: Nonlinearity) -> Result<f64> {
    let (fi, fo) = fan_in_and_fan_out(&p.shape())?;
    let fan = match mode {
        FanMode::FanIn => fi,
        FanMode::FanOut => fo,
    };
    // PyTorch warns and leaves zero-element tensors alone; a zero fan here
    // means an empty tensor, which any std fills the same.
    Ok(calculate_gain(nonlinearity) / (fan.max(1) as f64).sqrt())
}
