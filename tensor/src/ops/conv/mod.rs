//! 2-D convolution (NCHW) with stride, padding, dilation and groups, and its
//! backward primitives, as im2col + the packed GEMM.
//!
//! Per sample and group, the forward is `out[og, oh·ow] = W[og, cg·kh·kw] ·
//! cols[cg·kh·kw, oh·ow] + bias` (bias in the GEMM epilogue); grad-input is
//! `col2im(Wᵀ · grad_out)`; grad-weight is `Σₙ grad_out[n] · cols[n]ᵀ`, by
//! GEMMs, or with few taps by long dot products over `N·OH·OW` (`dot`).
//! f16/bf16 compute in f32 and round once. Every output element is summed in
//! an order fixed by the shapes, so results do not depend on the thread count.

mod backward;
#[cfg(feature = "cuda")]
pub(crate) mod cuda;
mod dot;
mod im2col;
#[cfg(test)]
mod tests;

pub use backward::{conv2d_backward_bias, conv2d_backward_input, conv2d_backward_weight};
pub(crate) use backward::{cpu_backward_input, cpu_backward_weight};

use std::ops::Range;

use rayon::prelude::*;

use super::math_view::math_view;
use super::matmul::check_operands;
use super::matmul::direct::DIRECT_B_BYTES;
use super::matmul::gemm::{gemm, Bias, Epilogue, GemmShape, MatMut};
use super::matmul::kernel::{GemmScalar, Isa};
use super::matmul::pack::MatRef;
use crate::{Error, FloatElement, FloatMath, Result, Tensor};

/// Hyper-parameters of [`Tensor::conv2d`], as `(height, width)` pairs where
/// they have two; the default is PyTorch's (stride 1, no padding, dilation
/// 1, one group).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2dParams {
    /// Step between output positions.
    pub stride: [usize; 2],
    /// Implicit zeros on both sides of each spatial dimension.
    pub padding: [usize; 2],
    /// Spacing between kernel taps.
    pub dilation: [usize; 2],
    /// Number of channel groups; `groups == in_channels` is a depthwise convolution.
    pub groups: usize,
}

impl Default for Conv2dParams {
    fn default() -> Self {
        Conv2dParams {
            stride: [1, 1],
            padding: [0, 0],
            dilation: [1, 1],
            groups: 1,
        }
    }
}

impl Conv2dParams {
    /// The same parameters with `stride` in both dimensions.
    pub fn stride(mut self, stride: usize) -> Self {
        self.stride = [stride, stride];
        self
    }

    /// The same parameters with `padding` in both dimensions.
    pub fn padding(mut self, padding: usize) -> Self {
        self.padding = [padding, padding];
        self
    }

    /// The same parameters with `dilation` in both dimensions.
    pub fn dilation(mut self, dilation: usize) -> Self {
        self.dilation = [dilation, dilation];
        self
    }

    /// The same parameters with `groups` groups.
    pub fn groups(mut self, groups: usize) -> Self {
        self.groups = groups;
        self
    }
}

impl Tensor {
    /// 2-D convolution (cross-correlation, as in PyTorch) of `self`
    /// `[N, C, H, W]` with `weight` `[O, C/groups, kh, kw]` and an optional
    /// `bias` `[O]`; returns `[N, O, OH, OW]` with
    /// `OH = (H + 2·pad − dil·(kh − 1) − 1) / stride + 1` (likewise OW).
    ///
    /// Errors when the ranks, channel counts, groups or bias shape do not
    /// fit, a stride/dilation/group count is 0, the output would be empty,
    /// or the dtypes or devices differ.
    pub fn conv2d(&self, weight: &Tensor, bias: Option<&Tensor>, p: &Conv2dParams) -> Result<Tensor> {
        const OP: &str = "conv2d";
        check_operands(OP, self, weight)?;
        let g = Geom::new(OP, self.shape(), weight.shape(), p)?;
        if let Some(b) = bias {
            check_operands(OP, self, b)?;
            if b.shape() != [g.o] {
                return Err(Error::shape(
                    OP,
                    format!(
                        "bias of shape {:?} does not match {} output channels",
                        b.shape(),
                        g.o
                    ),
                ));
            }
        }
        crate::backend::dispatch(OP, &[self, weight, &bias])?.conv2d(self, weight, bias, &g)
    }
}

/// The CPU kernel of [`Tensor::conv2d`] (operands checked against `g`).
pub(crate) fn cpu_forward(x: &Tensor, weight: &Tensor, bias: Option<&Tensor>, g: &Geom) -> Result<Tensor> {
    crate::with_float_dtype!(x.dtype(), S => forward::<S>(x, weight, bias, g),
        else unreachable!("check_operands admits only floats"))
}

/// The validated sizes of one convolution.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Geom {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub o: usize,
    pub kh: usize,
    pub kw: usize,
    pub oh: usize,
    pub ow: usize,
    pub groups: usize,
    /// Input channels per group.
    pub cg: usize,
    /// Output channels per group.
    pub og: usize,
    pub stride: [usize; 2],
    pub padding: [usize; 2],
    pub dilation: [usize; 2],
}

impl Geom {
    /// Checks an input shape and a weight shape against `p`.
    pub fn new(op: &'static str, input: &[usize], weight: &[usize], p: &Conv2dParams) -> Result<Geom> {
        let desc = || format!("input {input:?}, weight {weight:?}, {p:?}");
        let (&[n, c, h, w], &[o, cg, kh, kw]) = (input, weight) else {
            return Err(Error::shape(
                op,
                format!(
                    "expects 4-D input [N, C, H, W] and weight [O, C/groups, kh, kw]: {}",
                    desc()
                ),
            ));
        };
        if p.groups == 0 || p.stride.contains(&0) || p.dilation.contains(&0) {
            return Err(Error::arg(
                op,
                format!("stride, dilation and groups must be positive: {}", desc()),
            ));
        }
        if c % p.groups != 0 || o % p.groups != 0 || cg != c / p.groups {
            return Err(Error::shape(
                op,
                format!("channels do not fit groups (want C and O divisible by groups and weight.shape[1] = C/groups): {}", desc()),
            ));
        }
        let (Some(eh), Some(ew)) = (
            span_out(h, kh, p.stride[0], p.padding[0], p.dilation[0]),
            span_out(w, kw, p.stride[1], p.padding[1], p.dilation[1]),
        ) else {
            return Err(Error::shape(
                op,
                format!(
                    "kernel does not fit the padded input (output would be empty): {}",
                    desc()
                ),
            ));
        };
        Ok(Geom {
            n,
            c,
            h,
            w,
            o,
            kh,
            kw,
            oh: eh,
            ow: ew,
            groups: p.groups,
            cg,
            og: o / p.groups,
            stride: p.stride,
            padding: p.padding,
            dilation: p.dilation,
        })
    }

    /// `cg·kh·kw`: the GEMM depth of the forward.
    pub fn kk(&self) -> usize {
        self.cg * self.kh * self.kw
    }

    /// `oh·ow`.
    pub fn l(&self) -> usize {
        self.oh * self.ow
    }

    /// The output shape `[N, O, OH, OW]`.
    pub fn out_shape(&self) -> [usize; 4] {
        [self.n, self.o, self.oh, self.ow]
    }
}

/// `(size + 2·pad − dil·(k − 1) − 1) / stride + 1`, or `None` when the
/// kernel is empty or does not fit the padded input.
fn span_out(size: usize, k: usize, stride: usize, pad: usize, dil: usize) -> Option<usize> {
    let span = dil.checked_mul(k.checked_sub(1)?)?.checked_add(1)?;
    let padded = size.checked_add(pad.checked_mul(2)?)?;
    Some(padded.checked_sub(span)? / stride + 1)
}

/// Group `grp` of the weight `wm` (math type, row-major) as the GEMM operand
/// `[og, cg·kh·kw]`, or its transpose when `t`.
fn weight_ref<'a, T>(wm: &'a [T], g: &Geom, grp: usize, t: bool) -> MatRef<'a, T> {
    let kk = g.kk() as isize;
    let off = grp * g.og * g.kk();
    if t {
        MatRef {
            data: wm,
            off,
            rs: 1,
            cs: kk,
        }
    } else {
        MatRef {
            data: wm,
            off,
            rs: kk,
            cs: 1,
        }
    }
}

fn forward<S: FloatElement>(x: &Tensor, w: &Tensor, bias: Option<&Tensor>, g: &Geom) -> Result<Tensor>
where
    S::Math: GemmScalar + FloatElement<Math = S::Math>,
{
    let x = x.contiguous()?;
    let xs = x.as_slice::<S>().expect("contiguous and dtype-checked");
    // Weights and unfolded inputs stay in the storage type: the GEMM packs
    // them (bf16 natively on the bf16 kernels, f16 widened while packing).
    let wm = w.contiguous()?.to_vec::<S>()?;
    let bm = bias.map(math_view::<S>).transpose()?;
    let (kk, l) = (g.kk(), g.l());
    let blk = blocking::<S>(g);
    let Blocking {
        samples: nb, rows, ..
    } = blk;
    let lb = rows * g.ow;
    let par_inner = blk.parallel_inside::<S::Math>(g);
    // Per rayon job: the unfolded inputs of its samples side by side, and
    // the GEMM's `[og, samples·l]` output before it is split per sample.
    let new_bufs = || {
        let staged = if nb > 1 { g.og * nb * l } else { 0 };
        (
            vec![S::ZERO; kk * nb * lb],
            vec![<S::Math as FloatMath>::ZERO; staged],
        )
    };
    let chunk = |(cols, staged): &mut (Vec<S>, Vec<S::Math>), (c, out): (usize, &mut [S::Math])| {
        let m = out.len() / (g.o * l);
        let ld = m * lb;
        for (grp, oy0) in bands(g, rows) {
            unfold_samples(xs, g, c * nb, m, grp, oy0..oy0 + rows, cols, par_inner);
            let epi = Epilogue {
                bias: bm
                    .as_deref()
                    .map_or(Bias::None, |b| Bias::Row(&b[grp * g.og..(grp + 1) * g.og])),
                relu: false,
            };
            let shape = GemmShape {
                m: g.og,
                n: ld,
                k: kk,
                alpha: <S::Math as FloatMath>::ONE,
                beta: <S::Math as FloatMath>::ZERO,
            };
            let c = if m == 1 {
                MatMut {
                    data: &mut out[grp * g.og * l..(grp + 1) * g.og * l],
                    off: oy0 * g.ow,
                    rs: l as isize,
                    cs: 1,
                }
            } else {
                MatMut {
                    data: &mut staged[..g.og * ld],
                    off: 0,
                    rs: ld as isize,
                    cs: 1,
                }
            };
            let cols_ref = MatRef {
                data: &cols[..],
                off: 0,
                rs: ld as isize,
                cs: 1,
            };
            gemm::<S>(
                shape,
                weight_ref(&wm, g, grp, false),
                cols_ref,
                c,
                epi,
                Isa::best(),
                par_inner,
            );
            if m > 1 {
                chunks_maybe_par(out, g.o * l, par_inner, |(j, out)| {
                    for oc in 0..g.og {
                        out[(grp * g.og + oc) * l..][..l].copy_from_slice(&staged[oc * ld + j * l..][..l]);
                    }
                });
            }
        }
    };
    // beta = 0: the GEMMs write every output element.
    let out = Tensor::build_overwrite::<S::Math>("conv2d", &g.out_shape(), |out| {
        if out.is_empty() {
            return;
        }
        if par_inner {
            let mut bufs = new_bufs();
            out.chunks_mut(nb * g.o * l)
                .enumerate()
                .for_each(|job| chunk(&mut bufs, job));
        } else {
            out.par_chunks_mut(nb * g.o * l)
                .enumerate()
                .for_each_init(new_bufs, chunk);
        }
    })?;
    out.to_dtype(S::DTYPE)
}

/// Output positions one GEMM covers at least: samples share a GEMM until
/// their columns reach this many, so a small feature map (ResNet's 4×4
/// last stage) does not repack the whole weight for every sample.
const GEMM_COLUMNS: usize = 512;

/// The fewest output positions of one band (see [`blocking`]): two
/// register tiles' worth, so the weight read per band is used enough.
const MIN_BAND_COLUMNS: usize = 64;

/// How the GEMMs of a convolution cover its samples (see [`blocking`]).
#[derive(Debug, Clone, Copy)]
struct Blocking {
    /// Samples side by side in one GEMM.
    samples: usize,
    /// Output rows per GEMM: all of them, or a band.
    rows: usize,
    /// Whether the GEMMs run one sample's bands on the direct kernels.
    banded: bool,
}

impl Blocking {
    /// Whether the GEMMs run one at a time, each on the whole pool, rather
    /// than side by side, one per thread: when there are fewer of them than
    /// threads, or when they [share large weights](Self::shares_large_weights).
    /// Results do not depend on it.
    fn parallel_inside<T>(&self, g: &Geom) -> bool {
        g.n.div_ceil(self.samples) < rayon::current_num_threads() || self.shares_large_weights::<T>(g)
    }

    /// Whether whole samples share GEMMs whose weight (a group's, in `T`)
    /// exceeds L2: one GEMM on the whole pool then packs it once for every
    /// thread (ResNet's 512×4608 last stage: 512x4608x512 two at once 146
    /// GFLOP/s in all, one on both threads 205).
    fn shares_large_weights<T>(&self, g: &Geom) -> bool {
        let weight_bytes = g.og.saturating_mul(g.kk()).saturating_mul(size_of::<T>());
        !self.banded && weight_bytes > DIRECT_B_BYTES
    }
}

/// How the GEMMs of a convolution cover it: whole samples side by side or
/// bands of output rows of one sample. Bands are used when a band's unfolding
/// (`kk × rows·ow`) fits [`DIRECT_B_BYTES`] with a whole number of register
/// tiles of columns (at least [`MIN_BAND_COLUMNS`]) and the bands tile the
/// output rows: it is then made and read in L2 and the GEMM runs on the
/// direct kernels, which read the weight in place, so nothing is packed
/// (layer 1 of a CIFAR ResNet: 64x576x1024 packed 92 GFLOP/s on one core,
/// four 64x576x256 bands 116). Otherwise [`samples_per_gemm`] whole
/// samples. A function of the shapes and the CPU's kernels only.
fn blocking<S: FloatElement>(g: &Geom) -> Blocking
where
    S::Math: GemmScalar + FloatElement,
{
    let isa = Isa::best();
    let direct =
        S::DTYPE == <S::Math as crate::Element>::DTYPE && <S::Math as GemmScalar>::direct(isa).is_some();
    let nr = <S::Math as GemmScalar>::kernel(isa).nr;
    let col_bytes = g.kk().saturating_mul(size_of::<S::Math>()).max(1);
    let max_rows = (DIRECT_B_BYTES / col_bytes / g.ow.max(1)).min(g.oh);
    let band = (1..=max_rows)
        .rev()
        .find(|&r| g.oh.is_multiple_of(r) && (r * g.ow).is_multiple_of(nr) && r * g.ow >= MIN_BAND_COLUMNS);
    match band {
        Some(rows) if direct => Blocking {
            samples: 1,
            rows,
            banded: true,
        },
        _ => Blocking {
            samples: samples_per_gemm(g),
            rows: g.oh,
            banded: false,
        },
    }
}

/// Every (group, first output row) of the bands of `rows` output rows.
fn bands(g: &Geom, rows: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
    (0..g.groups).flat_map(move |grp| (0..g.oh).step_by(rows).map(move |oy0| (grp, oy0)))
}

/// `blocks` row-major `[rows, cols]` matrices, one after the other, each
/// transposed to `[cols, rows]` (a weight's groups and their transposes).
fn transpose_blocks<T: Copy>(src: &[T], blocks: usize, rows: usize, cols: usize) -> Vec<T> {
    let mut dst = Vec::with_capacity(src.len());
    for block in src.chunks_exact(rows * cols).take(blocks) {
        dst.extend((0..rows * cols).map(|i| block[(i % rows) * cols + i / rows]));
    }
    dst
}

/// How many samples of `g` share one GEMM: a function of the shapes only,
/// so every sum's order, and the result, never depend on the thread count.
fn samples_per_gemm(g: &Geom) -> usize {
    GEMM_COLUMNS.div_ceil(g.l().max(1)).clamp(1, g.n.max(1))
}

/// Copies rows `grp·og ..` of samples `n0 .. n0 + m` of `go` (`[N, O, l]`)
/// side by side into `dst` (`[og, m·l]`), the layout of one GEMM over those
/// samples; a row at a time on the rayon pool when `par`.
fn gather_samples<T: Copy + Send + Sync>(
    go: &[T],
    g: &Geom,
    n0: usize,
    m: usize,
    grp: usize,
    dst: &mut [T],
    par: bool,
) {
    let (l, ld) = (g.l(), m * g.l());
    chunks_maybe_par(&mut dst[..g.og * ld], ld, par, |(oc, row)| {
        for j in 0..m {
            row[j * l..][..l].copy_from_slice(&go[((n0 + j) * g.o + grp * g.og + oc) * l..][..l]);
        }
    });
}

/// Unfolds output rows `band` of group `grp` of samples `n0 .. n0 + m` side
/// by side into `cols` (`[kk, m·band.len()·ow]`); a channel at a time on
/// the rayon pool when `par`.
#[allow(clippy::too_many_arguments)]
fn unfold_samples<S: Copy + Default + Send + Sync>(
    xs: &[S],
    g: &Geom,
    n0: usize,
    m: usize,
    grp: usize,
    band: Range<usize>,
    cols: &mut [S],
    par: bool,
) {
    let (plane, taps, lb) = (g.h * g.w, g.kh * g.kw, band.len() * g.ow);
    let ld = m * lb;
    // One channel's taps are `taps` consecutive rows of the unfolding.
    let one = Geom { cg: 1, ..*g };
    chunks_maybe_par(&mut cols[..g.cg * taps * ld], taps * ld, par, |(ci, rows)| {
        for j in 0..m {
            let x = &xs[((n0 + j) * g.c + grp * g.cg + ci) * plane..][..plane];
            im2col::im2col_strided(x, &one, band.clone(), &mut rows[j * lb..], ld, |v| v);
        }
    });
}

/// `f((index, chunk))` for every `size`-element chunk of `data`, on the
/// rayon pool when `par`.
fn chunks_maybe_par<T: Send>(
    data: &mut [T],
    size: usize,
    par: bool,
    f: impl Fn((usize, &mut [T])) + Send + Sync,
) {
    if par {
        data.par_chunks_mut(size).enumerate().for_each(f);
    } else {
        data.chunks_mut(size).enumerate().for_each(f);
    }
}
