//! The bf16 GEMM: operands packed as pairs of bf16 along the depth (one
//! `u32` per pair, the even-depth element in the low half), multiplied by
//! bf16 dot-product instructions into f32 accumulators — `tdpbf16ps` tiles
//! (AMX), `vdpbf16ps` vectors (AVX512-BF16) or plain f32 arithmetic — on the
//! shared driver of [`super::gemm`]. Output is f32 (rounded to bf16 once by
//! the caller when a bf16 tensor is wanted).
//!
//! Which path runs is picked at run time ([`Bf16Path::best`]: on Intel
//! cores without AMX the widened f32 kernels, whose FMAs outrun
//! `vdpbf16ps` there); every path is forceable with `TESSERA_GEMM_BF16` or
//! by calling [`gemm_bf16`] with it.
//! Each output element is summed in one fixed order whatever the thread
//! count (the driver's guarantee), so results do not depend on it.

use std::any::TypeId;
use std::ops::Range;
use std::sync::OnceLock;

use super::bf16_kernel as kern;
use super::gemm::{drive, Bias, Epilogue, GemmShape, MatMut, Native, Packing};
use super::kernel::{GemmScalar, Isa, Kernel, PairDirectFn, PairFusedFn};
use super::pack::{prefetch_line, MatRef, L2};
use super::transpose::transpose_rows_8;
use crate::simd::vector::Vf32;
use crate::simd::{simd_fn, Level};
use crate::{bf16, FloatElement};

/// A way to run a bf16 GEMM.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bf16Path {
    /// AMX-BF16 tiles (`tdpbf16ps`), 32×32 output tiles (Intel Sapphire Rapids on).
    Amx,
    /// AVX512-BF16 (`vdpbf16ps`), 8×32 output tiles (Intel Cooper Lake, AMD Zen 4 on).
    Avx512Bf16,
    /// Operands widened to f32 while packing, on the f32 kernels of
    /// [`Isa::best`]: the fastest path where the CPU has no bf16 instructions.
    Widen,
    /// The pair layout with plain f32 arithmetic: any CPU; the reference the
    /// instruction paths are tested against.
    Portable,
}

impl Bf16Path {
    /// The path every bf16 GEMM takes: the one `TESSERA_GEMM_BF16` (`amx`,
    /// `avx512bf16`, `widen`, `portable`) names when this CPU runs it, else
    /// the first of [`Bf16Path::available`] (read once).
    pub fn best() -> Bf16Path {
        static BEST: OnceLock<Bf16Path> = OnceLock::new();
        *BEST.get_or_init(|| {
            let forced = std::env::var("TESSERA_GEMM_BF16")
                .ok()
                .and_then(|v| Bf16Path::parse(&v));
            forced
                .filter(|p| p.supported())
                .unwrap_or(Bf16Path::available()[0])
        })
    }

    /// The path named `amx`, `avx512bf16`, `widen` or `portable` (any case).
    pub fn parse(name: &str) -> Option<Bf16Path> {
        match name.to_ascii_lowercase().as_str() {
            "amx" => Some(Bf16Path::Amx),
            "avx512bf16" => Some(Bf16Path::Avx512Bf16),
            "widen" => Some(Bf16Path::Widen),
            "portable" => Some(Bf16Path::Portable),
            _ => None,
        }
    }

    /// True when this CPU (and, for AMX, the OS) can run this path.
    pub fn supported(self) -> bool {
        self.unsupported_reason().is_none()
    }

    /// Why this CPU cannot run this path, or `None` when it can.
    pub fn unsupported_reason(self) -> Option<String> {
        match self {
            Bf16Path::Amx => kern::amx_unavailable(),
            Bf16Path::Avx512Bf16 => kern::avx512bf16_unavailable(),
            Bf16Path::Widen | Bf16Path::Portable => None,
        }
    }

    /// Every path this CPU runs, fastest first (see [`ranking`]).
    pub fn available() -> Vec<Bf16Path> {
        ranking(kern::avx512bf16_half_rate())
            .into_iter()
            .filter(|p| p.supported())
            .collect()
    }

    /// The pair packing of this path (`None` for [`Bf16Path::Widen`]).
    fn packing(self) -> Option<PairPacking> {
        match self {
            Bf16Path::Amx => Some(PairPacking {
                kernel: kern::amx_kernel(),
                a_layout: ALayout::Tiles,
                unit_align: kern::AMX_DEPTH_UNITS,
                direct_a: None,
                fused_b: None,
            }),
            Bf16Path::Avx512Bf16 => Some(PairPacking {
                kernel: kern::avx512bf16_kernel(),
                a_layout: ALayout::PairMajor,
                unit_align: 1,
                direct_a: kern::avx512bf16_direct(),
                fused_b: kern::avx512bf16_fused(),
            }),
            Bf16Path::Portable => Some(PairPacking {
                kernel: kern::portable_kernel(),
                a_layout: ALayout::PairMajor,
                unit_align: 1,
                direct_a: None,
                fused_b: None,
            }),
            Bf16Path::Widen => None,
        }
    }
}

/// The paths fastest first, given whether `vdpbf16ps` runs at half the f32
/// FMA rate: there the widened f32 kernels, which do twice its
/// multiply-adds per cycle, come before it, though they read B's panels at
/// twice the bytes and pack A where the `vdpbf16ps` path reads A in place
/// and packs B as its first tile reads it. Measured on a 2-core Emerald
/// Rapids, both paths alternating in one process, median GFLOP/s
/// `vdpbf16ps` vs widened, 1 thread / 2 threads: 128x784x512 83 vs 117 /
/// 128–138 vs 121–143, 128x512x512 (Bᵀ) 80 vs 105 / 130–138 vs 130–162,
/// 512x128x784 (Aᵀ) 64 vs 95 / 127–132 vs 185–214, 1024³ 2 threads 144 vs
/// 213. Products of few rows reuse a panel of B too little for that:
/// 32x784x512 81 vs 79 / 116 vs 72, 8x784x512 69 vs 44 / 65 vs 26. The
/// order is the machine's alone, not the shape's, so a batch folded into
/// one GEMM sums as its products one at a time would.
pub(super) fn ranking(half_rate: bool) -> [Bf16Path; 4] {
    use Bf16Path::*;
    if half_rate {
        [Amx, Widen, Avx512Bf16, Portable]
    } else {
        [Amx, Avx512Bf16, Widen, Portable]
    }
}

/// One bf16 GEMM `C = alpha·A·B + beta·C` (f32 scalars, f32 output) on
/// `path`, which this CPU must run (see [`Bf16Path::supported`]); `par`
/// lets it use the rayon pool.
pub fn gemm_bf16(
    s: GemmShape<f32>,
    a: MatRef<bf16>,
    b: MatRef<bf16>,
    c: MatMut<f32>,
    epi: Epilogue<f32>,
    path: Bf16Path,
    par: bool,
) {
    if let Some(why) = path.unsupported_reason() {
        panic!("gemm: the {path:?} bf16 path cannot run here: {why}");
    }
    match path.packing() {
        Some(pk) => drive(&pk, s, a, b, c, epi, par),
        None => drive(&Native(Isa::best()), s, a, b, c, epi, par),
    }
}

/// Runs the generic GEMM of element type `S` on [`gemm_bf16`] with
/// [`Bf16Path::best`] when `S` is bf16 (returning `None`), else hands the
/// arguments back.
#[allow(clippy::type_complexity)]
pub(crate) fn route<'a, S: FloatElement>(
    s: GemmShape<S::Math>,
    a: MatRef<'a, S>,
    b: MatRef<'a, S>,
    c: MatMut<'a, S::Math>,
    epi: Epilogue<'a, S::Math>,
    par: bool,
) -> Option<(MatMut<'a, S::Math>, Epilogue<'a, S::Math>)>
where
    S::Math: GemmScalar,
{
    if TypeId::of::<S>() != TypeId::of::<bf16>() || TypeId::of::<S::Math>() != TypeId::of::<f32>() {
        return Some((c, epi));
    }
    // SAFETY: `S` is bf16 and `S::Math` is f32 (checked above): the casts
    // below reinterpret values and slices as the types they are.
    unsafe {
        let f = |x: S::Math| std::mem::transmute_copy::<S::Math, f32>(&x);
        let sl = |x: &'a [S::Math]| std::slice::from_raw_parts(x.as_ptr().cast::<f32>(), x.len());
        let m = |x: MatRef<'a, S>| MatRef {
            data: std::slice::from_raw_parts(x.data.as_ptr().cast::<bf16>(), x.data.len()),
            off: x.off,
            rs: x.rs,
            cs: x.cs,
        };
        let shape = GemmShape {
            m: s.m,
            n: s.n,
            k: s.k,
            alpha: f(s.alpha),
            beta: f(s.beta),
        };
        let out = MatMut {
            data: std::slice::from_raw_parts_mut(c.data.as_mut_ptr().cast::<f32>(), c.data.len()),
            off: c.off,
            rs: c.rs,
            cs: c.cs,
        };
        let epi = Epilogue {
            bias: match epi.bias {
                Bias::None => Bias::None,
                Bias::Row(v) => Bias::Row(sl(v)),
                Bias::Col(v) => Bias::Col(sl(v)),
            },
            relu: epi.relu,
        };
        gemm_bf16(shape, m(a), m(b), out, epi, Bf16Path::best(), par);
    }
    None
}

/// The order of the units of a packed A panel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ALayout {
    /// Unit `(p, i)` (depth pair `p`, row `i`) at `p*mr + i`: one broadcast
    /// per row and depth pair for the vector kernels.
    PairMajor,
    /// Unit `(i, p)` at `(p/16)*16*mr + i*16 + p%16`: per step of 16 depth
    /// pairs, `mr` rows of 64 bytes, so each AMX tile (16 rows of a step)
    /// is one contiguous kilobyte and a step's tiles follow each other (a
    /// row stride of `units*4` bytes would map a tile's rows to a few L1
    /// sets).
    Tiles,
}

/// Packing into bf16 pairs for one bf16 kernel. B panels are pair-major
/// for every kernel: unit `(p, j)` at `p*nr + j` holds `b[2p][j]` (low half)
/// and `b[2p+1][j]` (high half).
pub(crate) struct PairPacking {
    pub(crate) kernel: Kernel<f32, u32>,
    a_layout: ALayout,
    /// Units per row are padded to a multiple of this (AMX tiles span 16 pairs).
    unit_align: usize,
    /// The kernel reading a row-major A in place, where there is one.
    direct_a: Option<PairDirectFn>,
    /// The kernel packing a row-major B's panel as it reads it, where there is one.
    fused_b: Option<PairFusedFn>,
}

impl PairPacking {
    /// The AMX packing with another tile routine: tests run the AMX layout
    /// through a portable emulation of `tdpbf16ps` on CPUs without AMX.
    #[cfg(test)]
    pub(crate) fn amx_with(run: super::kernel::KernelFn<f32, u32>) -> PairPacking {
        PairPacking {
            kernel: Kernel {
                run,
                ..kern::amx_kernel()
            },
            a_layout: ALayout::Tiles,
            unit_align: kern::AMX_DEPTH_UNITS,
            direct_a: None,
            fused_b: None,
        }
    }
}

impl Packing<bf16> for PairPacking {
    type Unit = u32;
    type Acc = f32;

    fn kernel(&self) -> Kernel<f32, u32> {
        self.kernel
    }

    fn depth_align(&self) -> usize {
        2 * self.unit_align
    }

    fn units(&self, kc: usize) -> usize {
        kc.div_ceil(2).next_multiple_of(self.unit_align)
    }

    fn pack_a(&self, dst: &mut [u32], a: &MatRef<bf16>, rows: Range<usize>, p0: usize, kc: usize, mr: usize) {
        let u = self.units(kc);
        let m = rows.end;
        let dst = &mut dst[..rows.len().div_ceil(mr) * mr * u];
        for (r, out) in dst.chunks_mut(mr * u).enumerate() {
            let i0 = rows.start + r * mr;
            let live = mr.min(m - i0);
            match self.a_layout {
                ALayout::Tiles => {
                    const S: usize = kern::AMX_DEPTH_UNITS;
                    if live < mr || kc.div_ceil(2) < u {
                        out.fill(0);
                    }
                    for i in 0..live {
                        if a.cs == 1 {
                            // A row is already pairs in order: copy it in
                            // runs of one tile row (16 pairs).
                            let line = &a.data[a.at(i0 + i, p0)..][..kc];
                            for (step, src) in line.chunks(2 * S).enumerate() {
                                let dst = &mut out[step * S * mr + i * S..][..S];
                                for (d, two) in dst.iter_mut().zip(src.chunks_exact(2)) {
                                    *d = pair(two[0], two[1]);
                                }
                                if let [.., last] = src {
                                    if src.len() % 2 == 1 {
                                        dst[src.len() / 2] = pair(*last, bf16::ZERO);
                                    }
                                }
                            }
                        } else {
                            line_pairs(a.data, a.at(i0 + i, p0), a.cs, kc, |p, v| {
                                out[(p / S) * S * mr + i * S + p % S] = v
                            });
                        }
                    }
                }
                ALayout::PairMajor if a.cs == 1 => {
                    // Rows are pairs in order already: walk the depth once,
                    // the panel's rows side by side, writing the panel in order.
                    let lines: Vec<&[bf16]> = (0..live).map(|i| &a.data[a.at(i0 + i, p0)..][..kc]).collect();
                    interleave_rows(out, &lines, mr);
                }
                ALayout::PairMajor => {
                    if a.rs == 1 && a.cs >= 0 {
                        // A transposed: each depth's rows are a contiguous
                        // run, two of them interleaved per pair as B's rows.
                        interleave_runs(out, a.data, a.at(i0, p0), a.cs as usize, kc, live, mr);
                    } else {
                        for i in 0..live {
                            line_pairs(a.data, a.at(i0 + i, p0), a.cs, kc, |p, v| out[p * mr + i] = v);
                        }
                    }
                    for (p, step) in out.chunks_mut(mr).enumerate() {
                        if p >= kc.div_ceil(2) {
                            step.fill(0);
                        } else {
                            step[live..].fill(0);
                        }
                    }
                }
            }
        }
    }

    fn direct_a(&self, a: &MatRef<bf16>, k: usize) -> Option<PairDirectFn> {
        // A row-major A's rows are its pair units already; an odd depth
        // would need its last pair padded, which only packing does.
        self.direct_a
            .filter(|_| a.cs == 1 && a.rs >= 0 && k.is_multiple_of(2))
    }

    fn fused_b(&self, b: &MatRef<bf16>) -> Option<PairFusedFn> {
        // The kernel reads 32 contiguous columns per row.
        self.fused_b.filter(|_| b.cs == 1 && b.rs >= 0)
    }

    fn pack_b(&self, dst: &mut [u32], b: &MatRef<bf16>, p0: usize, kc: usize, cols: Range<usize>, nr: usize) {
        let u = self.units(kc);
        let n = cols.end;
        let dst = &mut dst[..cols.len().div_ceil(nr) * nr * u];
        for (q, out) in dst.chunks_mut(nr * u).enumerate() {
            let jq = cols.start + q * nr;
            let live = nr.min(n - jq);
            if b.cs == 1 && b.rs >= 0 {
                // Rows are contiguous: interleave two rows per depth pair,
                // the whole panel in one call.
                interleave_runs(out, b.data, b.at(p0, jq), b.rs as usize, kc, live, nr);
            } else {
                // A transposed B (contiguous columns) has its columns' pairs
                // in order: eight columns at a time through the register
                // transpose, the rest (and other strides) one at a time.
                let mut j = 0;
                if b.rs == 1 {
                    while j + 8 <= live {
                        let cols: [*const u32; 8] =
                            std::array::from_fn(|i| b.data[b.at(p0, jq + j + i)..][..kc].as_ptr().cast());
                        // SAFETY: each column holds kc ≥ 2·(kc/2) elements,
                        // kc/2 units (sliced above); `out` holds (kc/2)·nr
                        // units from column j, j + 8 ≤ nr, and is our own.
                        let done = unsafe { transpose_rows_8(cols, kc / 2, out[j..].as_mut_ptr(), nr) };
                        for col in j..j + 8 {
                            let at = b.at(p0 + 2 * done, jq + col);
                            line_pairs(b.data, at, 1, kc - 2 * done, |p, v| {
                                out[(done + p) * nr + col] = v
                            });
                        }
                        j += 8;
                    }
                }
                for j in j..live {
                    line_pairs(b.data, b.at(p0, jq + j), b.rs, kc, |p, v| out[p * nr + j] = v);
                }
            }
            // Zero the columns past the matrix and the pairs past the depth.
            let (data, pad) = out.split_at_mut(kc.div_ceil(2) * nr);
            if live < nr {
                data.chunks_mut(nr).for_each(|step| step[live..].fill(0));
            }
            pad.fill(0);
        }
    }
}

/// Fills the pair-major panel `out` (unit `(p, i)` at `p*mr + i`) from
/// `lines`, the panel's live rows (each `kc` contiguous elements, `kc` the
/// same for all), zeroing the rows past them and the pairs past `kc`. A full
/// panel of 8 rows goes through the register transpose of
/// [`super::transpose`] in blocks of 16 pairs where the CPU has it.
pub(super) fn interleave_rows(out: &mut [u32], lines: &[&[bf16]], mr: usize) {
    let kc = lines.first().map_or(0, |l| l.len());
    let full = kc / 2;
    assert!(lines.len() <= mr && out.len() >= kc.div_ceil(2) * mr);
    assert!(lines.iter().all(|l| l.len() == kc));
    let mut done = 0;
    if mr == 8 && lines.len() == 8 {
        // Pairs of consecutive bf16 are the 32-bit units of the transpose.
        let rows: [*const u32; 8] = std::array::from_fn(|i| lines[i].as_ptr().cast());
        // SAFETY: each row holds kc ≥ 2·full elements, `full` units, and
        // `out` at least full·8 units (asserted above); the rows are
        // borrowed from elsewhere, so they do not overlap `out`.
        done = unsafe { transpose_rows_8(rows, full, out.as_mut_ptr(), 8) };
    }
    let (body, rest) = out.split_at_mut(full * mr);
    for (p, step) in body.chunks_exact_mut(mr).enumerate().skip(done) {
        let (live, pad) = step.split_at_mut(lines.len());
        for (d, line) in live.iter_mut().zip(lines) {
            *d = pair(line[2 * p], line[2 * p + 1]);
        }
        if !pad.is_empty() {
            pad.fill(0);
        }
    }
    rest.fill(0);
    if kc % 2 == 1 {
        for (d, line) in rest.iter_mut().zip(lines) {
            *d = pair(line[kc - 1], bf16::ZERO);
        }
    }
}

/// Fills unit `(p, x)` at `out[p*ld + x]`, `x < live`, from the `kc` runs
/// `data[base + d*stride..][..live]` (depth `d`): runs `2p` and `2p + 1`
/// interleaved, the last run paired with zero when `kc` is odd. The rows of
/// a row-major B and the depths of a transposed A are such runs.
fn interleave_runs(
    out: &mut [u32],
    data: &[bf16],
    base: usize,
    stride: usize,
    kc: usize,
    live: usize,
    ld: usize,
) {
    let pairs = kc / 2;
    if pairs > 0 {
        interleave_panel(Level::best(), &data[base..], stride, pairs, live, out, ld);
    }
    if kc % 2 == 1 {
        let lo = &data[base + (kc - 1) * stride..][..live];
        for (s, &l) in out[pairs * ld..][..live].iter_mut().zip(lo) {
            *s = pair(l, bf16::ZERO);
        }
    }
}

simd_fn! {
    /// `out[p*nr + j] = pair(b[2p*rs + j], b[(2p+1)*rs + j])` for `p <
    /// pairs`, `j < live`: the depth pairs of a panel of `live` columns of
    /// a B with contiguous rows `rs` apart.
    fn interleave_panel(b: &[bf16], rs: usize, pairs: usize, live: usize, out: &mut [u32], nr: usize) => interleave_loop
}

#[inline(always)]
fn interleave_loop<V: Vf32>(b: &[bf16], rs: usize, pairs: usize, live: usize, out: &mut [u32], nr: usize) {
    for p in 0..pairs {
        let (lo, hi) = (&b[2 * p * rs..][..live], &b[(2 * p + 1) * rs..][..live]);
        if p + B_AHEAD < pairs {
            // The rows a few pairs on: a stride of two storage rows, which
            // the hardware prefetchers catch late.
            for d in [2 * (p + B_AHEAD), 2 * (p + B_AHEAD) + 1] {
                prefetch_line::<L2>(b[d * rs..].as_ptr().cast());
            }
        }
        for ((s, &l), &h) in out[p * nr..][..live].iter_mut().zip(lo).zip(hi) {
            *s = pair(l, h);
        }
    }
}

/// How many depth pairs ahead [`interleave_panel`] fetches B's rows.
const B_AHEAD: usize = 4;

/// The unit holding `lo` (even depth) and `hi` (odd depth).
#[inline(always)]
fn pair(lo: bf16, hi: bf16) -> u32 {
    u32::from(lo.to_bits()) | u32::from(hi.to_bits()) << 16
}

/// Calls `put(p, unit)` for the `ceil(kc/2)` pairs of the `kc` elements
/// `data[base + d*stride]`, the last one zero-padded when `kc` is odd.
#[inline(always)]
fn line_pairs(data: &[bf16], base: usize, stride: isize, kc: usize, mut put: impl FnMut(usize, u32)) {
    if stride == 1 {
        let line = &data[base..base + kc];
        let mut pairs = line.chunks_exact(2);
        for (p, two) in pairs.by_ref().enumerate() {
            put(p, pair(two[0], two[1]));
        }
        if let [last] = pairs.remainder() {
            put(kc / 2, pair(*last, bf16::ZERO));
        }
    } else {
        let at = |d: usize| data[(base as isize + d as isize * stride) as usize];
        for p in 0..kc / 2 {
            put(p, pair(at(2 * p), at(2 * p + 1)));
        }
        if kc % 2 == 1 {
            put(kc / 2, pair(at(kc - 1), bf16::ZERO));
        }
    }
}
