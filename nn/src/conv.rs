//! Conv2d, including grouped and depthwise convolutions.

use tessera_autograd::{Parameter, Var};
use tessera_tensor::ops::conv::Conv2dParams;
use tessera_tensor::{DType, Error, PadMode, Result, Tensor};

use crate::{init, Module};

/// 2-D convolution (`torch.nn.Conv2d`): weight `[out, in/groups, kh, kw]`,
/// optional bias `[out]`, PyTorch's default init (U(±1/√fan_in) with
/// `fan_in = in/groups · kh · kw`).
#[derive(Debug, Clone, Module)]
pub struct Conv2d {
    /// The filters, `[out_channels, in_channels / groups, kh, kw]`.
    pub weight: Parameter,
    /// The bias, `[out_channels]`, when the layer has one.
    pub bias: Option<Parameter>,
    /// Stride, padding, dilation and groups.
    #[module(skip)]
    pub params: Conv2dParams,
    /// Extra zero padding `[left, right, top, bottom]` applied before the
    /// convolution, for `padding="same"` with an odd total padding (the
    /// extra element goes right and bottom, as in PyTorch).
    #[module(skip)]
    pub pad_same: Option<[usize; 4]>,
}

/// The settings of a [`Conv2d`] besides its channel counts and kernel:
/// PyTorch's defaults are stride 1, padding 0, dilation 1, 1 group, bias.
#[derive(Debug, Clone, Copy)]
pub struct Conv2dOptions {
    /// Stride `(h, w)`.
    pub stride: [usize; 2],
    /// Zero padding `(h, w)` on both sides.
    pub padding: [usize; 2],
    /// PyTorch's `padding="same"`: the output has the input's size
    /// (stride 1 only); `padding` is then ignored.
    pub same: bool,
    /// Dilation `(h, w)`.
    pub dilation: [usize; 2],
    /// Channel groups (`groups == in_channels` is depthwise).
    pub groups: usize,
    /// Whether the layer has a bias.
    pub bias: bool,
}

impl Default for Conv2dOptions {
    fn default() -> Self {
        Conv2dOptions {
            stride: [1, 1],
            padding: [0, 0],
            same: false,
            dilation: [1, 1],
            groups: 1,
            bias: true,
        }
    }
}

impl Conv2dOptions {
    /// The same options with `stride` in both dimensions.
    pub fn stride(mut self, s: usize) -> Self {
        self.stride = [s, s];
        self
    }

    /// The same options with `padding` in both dimensions.
    pub fn padding(mut self, p: usize) -> Self {
        self.padding = [p, p];
        self
    }

    /// The same options with PyTorch's `padding="same"`: the output keeps
    /// the input's height and width (needs stride 1).
    pub fn padding_same(mut self) -> Self {
        self.same = true;
        self
    }

    /// The same options with `dilation` in both dimensions.
    pub fn dilation(mut self, d: usize) -> Self {
        self.dilation = [d, d];
        self
    }

    /// The same options with `groups` groups.
    pub fn groups(mut self, g: usize) -> Self {
        self.groups = g;
        self
    }

    /// The same options with or without a bias.
    pub fn bias(mut self, on: bool) -> Self {
        self.bias = on;
        self
    }
}

impl Conv2d {
    /// A square-kernel convolution `in_channels → out_channels` in f32 with
    /// PyTorch's default init. Errors when `groups` is 0 or does not divide
    /// both channel counts, a stride, dilation or kernel size is 0, or
    /// `padding="same"` is asked for with a stride other than 1.
    pub fn new(
        in_channels: usize,
        out_channels: usize,
        kernel: usize,
        opts: Conv2dOptions,
    ) -> Result<Conv2d> {
        Conv2d::with_kernel(in_channels, out_channels, [kernel, kernel], opts)
    }

    /// Like [`Conv2d::new`] with a `(kh, kw)` kernel.
    pub fn with_kernel(
        in_channels: usize,
        out_channels: usize,
        kernel: [usize; 2],
        opts: Conv2dOptions,
    ) -> Result<Conv2d> {
        let g = opts.groups;
        if g == 0 || !in_channels.is_multiple_of(g) || !out_channels.is_multiple_of(g) {
            return Err(Error::arg(
                "Conv2d::new",
                format!("groups {g} must be positive and divide in_channels {in_channels} and out_channels {out_channels}"),
            ));
        }
        if kernel.contains(&0) || opts.stride.contains(&0) || opts.dilation.contains(&0) {
            return Err(Error::arg(
                "Conv2d::new",
                format!(
                    "kernel {kernel:?}, stride {:?} and dilation {:?} must be positive",
                    opts.stride, opts.dilation
                ),
            ));
        }
        if opts.same && opts.stride != [1, 1] {
            return Err(Error::arg(
                "Conv2d::new",
                format!(
                    "padding='same' is not supported for strided convolutions (stride {:?})",
                    opts.stride
                ),
            ));
        }
        let shape = [out_channels, in_channels / g, kernel[0], kernel[1]];
        let weight = Parameter::new(Tensor::zeros(&shape, DType::F32)?);
        let bias = match opts.bias {
            true => Some(Parameter::new(Tensor::zeros(&[out_channels], DType::F32)?)),
            false => None,
        };
        init::default_layer_init(&weight, bias.as_ref())?;
        let (padding, pad_same) = match opts.same {
            true => same_padding(kernel, opts.dilation),
            false => (opts.padding, None),
        };
        let params = Conv2dParams {
            stride: opts.stride,
            padding,
            dilation: opts.dilation,
            groups: g,
        };
        Ok(Conv2d {
            weight,
            bias,
            params,
            pad_same,
        })
    }
}

impl Module for Conv2d {
    fn forward(&self, input: &Var) -> Result<Var> {
        let b = self.bias.as_ref().map(Parameter::var).transpose()?;
        let w = self.weight.var()?;
        match self.pad_same {
            Some(pads) => {
                let x = input.pad(&pads, PadMode::Constant(0.0))?;
                x.conv2d(&w, b.as_ref(), &self.params)
            }
            None => input.conv2d(&w, b.as_ref(), &self.params),
        }
    }
}

/// The padding of `padding="same"` for a stride-1 convolution: the
/// symmetric part for the convolution itself and, when a dimension's total
/// `dilation·(kernel − 1)` is odd, the whole padding `[left, right, top,
/// bottom]` done up front instead (PyTorch puts the extra element right and
/// bottom).
fn same_padding(kernel: [usize; 2], dilation: [usize; 2]) -> ([usize; 2], Option<[usize; 4]>) {
    let total = [dilation[0] * (kernel[0] - 1), dilation[1] * (kernel[1] - 1)];
    if total.iter().all(|t| t % 2 == 0) {
        return ([total[0] / 2, total[1] / 2], None);
    }
    let [h, w] = total;
    ([0, 0], Some([w / 2, w - w / 2, h / 2, h - h / 2]))
}
