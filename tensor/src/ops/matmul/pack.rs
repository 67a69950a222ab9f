//! Packing of GEMM operands into the panel order the micro-kernel reads.
//!
//! The packers read any strided operand (transposed, negative or zero
//! strides, an offset view) straight from its storage and convert to the
//! math type on the way (f16/bf16 → f32), so no operand is copied first.

use std::ops::Range;

use super::kernel::GemmScalar;
use crate::simd::cast::{convert_run, fast_pair};
use crate::FloatElement;

/// A read-only strided matrix: element `(i, j)` is
/// `data[off + i*rs + j*cs]`. Every index the driver forms must be in bounds;
/// callers build it from a valid [`crate::Layout`].
#[derive(Clone, Copy)]
pub struct MatRef<'a, S> {
    /// The storage.
    pub data: &'a [S],
    /// Index of element (0, 0).
    pub off: usize,
    /// Row stride, in elements.
    pub rs: isize,
    /// Column stride, in elements.
    pub cs: isize,
}

impl<'a, S> MatRef<'a, S> {
    /// The index of element `(i, j)` in `data`.
    #[inline(always)]
    pub(crate) fn at(&self, i: usize, j: usize) -> usize {
        (self.off as isize + i as isize * self.rs + j as isize * self.cs) as usize
    }

    /// The transpose: the same elements, rows for columns.
    pub(crate) fn t(self) -> MatRef<'a, S> {
        MatRef {
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }

    /// The same view typed as the math type when `S` is its own math type
    /// (f32, f64): the kernels can then read it without converting.
    pub(crate) fn as_math(&self) -> Option<MatRef<'a, S::Math>>
    where
        S: FloatElement,
    {
        if std::any::TypeId::of::<S>() != std::any::TypeId::of::<S::Math>() {
            return None;
        }
        // SAFETY: `S` and `S::Math` are the same type (checked above).
        let data =
            unsafe { std::slice::from_raw_parts(self.data.as_ptr().cast::<S::Math>(), self.data.len()) };
        Some(MatRef {
            data,
            off: self.off,
            rs: self.rs,
            cs: self.cs,
        })
    }
}

/// A 64-byte aligned buffer of `len` math-type elements for packed panels.
/// Its storage comes from, and goes back to, a small per-thread pool, so a
/// GEMM neither zero-fills nor page-faults fresh memory on every call; the
/// packers overwrite every element the kernels read.
pub struct AlignedBuf<T> {
    raw: Vec<Align64>,
    len: usize,
    _t: std::marker::PhantomData<T>,
}

#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
#[repr(C, align(64))]
struct Align64([u8; 64]);

/// Buffers a thread keeps for its next GEMMs, and the bytes it keeps at most.
const POOL_BUFFERS: usize = 4;
const POOL_BYTES: usize = 64 << 20;

thread_local! {
    static POOL: std::cell::RefCell<Vec<Vec<Align64>>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl<T: bytemuck::Pod> AlignedBuf<T> {
    /// A buffer of `len` elements holding unspecified (initialised) values:
    /// the smallest pooled buffer that fits, else a new zeroed one.
    pub fn new(len: usize) -> Self {
        let blocks = (len * std::mem::size_of::<T>()).div_ceil(64);
        let pooled = POOL.with(|p| {
            let mut p = p.borrow_mut();
            let best = (0..p.len())
                .filter(|&i| p[i].len() >= blocks)
                .min_by_key(|&i| p[i].len())?;
            Some(p.swap_remove(best))
        });
        AlignedBuf {
            raw: pooled.unwrap_or_else(|| vec![Align64([0; 64]); blocks]),
            len,
            _t: std::marker::PhantomData,
        }
    }

    /// The elements, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        &mut bytemuck::cast_slice_mut(&mut self.raw)[..self.len]
    }
}

impl<T> Drop for AlignedBuf<T> {
    fn drop(&mut self) {
        let raw = std::mem::take(&mut self.raw);
        if raw.len() * 64 > POOL_BYTES {
            return;
        }
        // `try_with`: the pool may be gone while the thread exits.
        let _ = POOL.try_with(|p| {
            let mut p = p.borrow_mut();
            p.push(raw);
            if p.len() > POOL_BUFFERS {
                // Keep the largest: they serve every smaller request too.
                let smallest = (0..p.len()).min_by_key(|&i| p[i].len()).unwrap_or(0);
                p.swap_remove(smallest);
            }
        });
    }
}

/// Packs rows `rows` (starting at a multiple of `mr`), depth `p0 .. p0 +
/// kc` of `a` into `dst` as `ceil(rows.len()/mr)` micro-panels of `mr×kc`
/// (element `(p, i)` of panel `r` at `r*mr*kc + p*mr + i`), zero-padding the
/// last panel's missing rows.
pub fn pack_a<S: FloatElement>(
    dst: &mut [S::Math],
    a: &MatRef<S>,
    rows: Range<usize>,
    p0: usize,
    kc: usize,
    mr: usize,
) where
    S::Math: GemmScalar,
{
    let m = rows.end;
    let dst = &mut dst[..rows.len().div_ceil(mr) * mr * kc];
    if a.rs == 1 {
        // Columns are contiguous (a transposed operand): per depth step, one
        // contiguous run over all the rows, cut into the panels — reading
        // the storage in order, where panel by panel would jump a whole
        // storage row per `mr` elements and stall on memory.
        for p in 0..kc {
            let base = a.at(rows.start, p0 + p);
            let run = &a.data[base..base + rows.len()];
            if p + PREFETCH_AHEAD < kc {
                prefetch_run::<L1, _>(&a.data[a.at(rows.start, p0 + p + PREFETCH_AHEAD)..], rows.len());
            }
            for (r, part) in run.chunks(mr).enumerate() {
                let out = &mut dst[r * mr * kc + p * mr..][..mr];
                widen_run(part, &mut out[..part.len()]);
                out[part.len()..].fill(<S::Math as crate::FloatMath>::ZERO);
            }
        }
        return;
    }
    for (r, out) in dst.chunks_mut(mr * kc).enumerate() {
        let i0 = rows.start + r * mr;
        let rows = mr.min(m - i0);
        if a.cs == 1 {
            // Rows are contiguous: read each row once, scatter by mr, while
            // the next panel's rows are fetched (eight short runs a row
            // apart: the hardware prefetchers have stopped training by the
            // time one ends, and the activations a linear layer packs come
            // from memory).
            let line = |i: usize| {
                let base = a.at(i0 + i, p0);
                &a.data[base..base + kc]
            };
            for i in i0 + mr..m.min(i0 + 2 * mr) {
                prefetch_run::<L2, _>(&a.data[a.at(i, p0)..], kc);
            }
            if rows == 8 {
                scatter_lines_8(std::array::from_fn(line), out, mr);
            } else {
                for i in 0..rows {
                    for (p, &x) in line(i).iter().enumerate() {
                        out[p * mr + i] = x.to_math();
                    }
                }
            }
            for p in 0..kc {
                out[p * mr + rows..(p + 1) * mr].fill(<S::Math as crate::FloatMath>::ZERO);
            }
        } else {
            for p in 0..kc {
                let dst = &mut out[p * mr..(p + 1) * mr];
                for (i, d) in dst[..rows].iter_mut().enumerate() {
                    *d = a.data[a.at(i0 + i, p0 + p)].to_math();
                }
                dst[rows..].fill(<S::Math as crate::FloatMath>::ZERO);
            }
        }
    }
}

/// Packs depth `p0 .. p0 + kc`, columns `cols` of `b` into `dst` as
/// `ceil(cols.len()/nr)` micro-panels of `kc×nr` (element `(p, j)` of panel
/// `q` at `q*nr*kc + p*nr + j`), zero-padding the last panel's missing columns.
pub fn pack_b<S: FloatElement>(
    dst: &mut [S::Math],
    b: &MatRef<S>,
    p0: usize,
    kc: usize,
    cols: Range<usize>,
    nr: usize,
) where
    S::Math: GemmScalar,
{
    let n = cols.end;
    let dst = &mut dst[..cols.len().div_ceil(nr) * nr * kc];
    if b.cs == 1 {
        // Rows are contiguous: per depth step, one run over all the columns,
        // cut into the panels (storage order, as `pack_a` reads a
        // transposed A).
        for p in 0..kc {
            let base = b.at(p0 + p, cols.start);
            let run = &b.data[base..base + cols.len()];
            for (q, part) in run.chunks(nr).enumerate() {
                let out = &mut dst[q * nr * kc + p * nr..][..nr];
                widen_run(part, &mut out[..part.len()]);
                out[part.len()..].fill(<S::Math as crate::FloatMath>::ZERO);
            }
        }
        return;
    }
    for (q, out) in dst.chunks_mut(nr * kc).enumerate() {
        let jq = cols.start + q * nr;
        let cols = nr.min(n - jq);
        if b.rs == 1 {
            // Columns are contiguous (a transposed operand): read each once,
            // in groups of 8.
            let line = |j: usize| {
                let base = b.at(p0, jq + j);
                &b.data[base..base + kc]
            };
            for g in 0..cols / 8 {
                scatter_lines_8(std::array::from_fn(|i| line(8 * g + i)), &mut out[8 * g..], nr);
            }
            for j in cols / 8 * 8..cols {
                for (p, &x) in line(j).iter().enumerate() {
                    out[p * nr + j] = x.to_math();
                }
            }
            for p in 0..kc {
                out[p * nr + cols..(p + 1) * nr].fill(<S::Math as crate::FloatMath>::ZERO);
            }
        } else {
            for p in 0..kc {
                let dst = &mut out[p * nr..(p + 1) * nr];
                for (j, d) in dst[..cols].iter_mut().enumerate() {
                    *d = b.data[b.at(p0 + p, jq + j)].to_math();
                }
                dst[cols..].fill(<S::Math as crate::FloatMath>::ZERO);
            }
        }
    }
}

/// Writes element `p` of line `i` of the 8 equally long `lines`, in the
/// math type, to `out[p*ld + i]` (`ld ≥ 8`): f32 lines through the register
/// transpose of [`super::transpose`], bf16 and f16 lines widened to f32
/// first, the rest element by element.
fn scatter_lines_8<S: FloatElement>(lines: [&[S]; 8], out: &mut [S::Math], ld: usize) {
    let kc = lines[0].len();
    assert!(lines.iter().all(|l| l.len() == kc) && ld >= 8 && (kc == 0 || out.len() >= (kc - 1) * ld + 8));
    let mut done = 0;
    if std::any::TypeId::of::<S>() == std::any::TypeId::of::<f32>() {
        let ptrs: [*const u32; 8] = std::array::from_fn(|i| lines[i].as_ptr().cast());
        // SAFETY: S is f32 (checked) and so is its math type: each line is
        // `kc` 32-bit units and `out` reaches the units (p, i) (asserted);
        // `out` is borrowed mutably, the lines shared, so they do not overlap.
        done = unsafe { super::transpose::transpose_rows_8(ptrs, kc, out.as_mut_ptr().cast(), ld) };
    } else if fast_pair::<S, f32>() {
        // bf16 and f16 widened a block at a time into f32 lines on the
        // stack, which the same register transpose then scatters.
        const BLOCK: usize = 64;
        let mut buf = [[0f32; BLOCK]; 8];
        while kc - done >= 16 {
            let len = (kc - done).min(BLOCK) / 16 * 16;
            for (line, b) in lines.iter().zip(buf.iter_mut()) {
                convert_run(&line[done..done + len], &mut b[..len]);
            }
            let ptrs: [*const u32; 8] = std::array::from_fn(|i| buf[i].as_ptr().cast());
            // SAFETY: the buffers hold `len` f32 each; the math type of
            // bf16 and f16 is f32, so `out` holds 32-bit units; from unit
            // (done, 0) on reaches the units (p, i) of the lines' remaining
            // `kc - done ≥ len` depths (asserted above) and is not on the stack.
            let wrote = unsafe {
                super::transpose::transpose_rows_8(ptrs, len, out[done * ld..].as_mut_ptr().cast(), ld)
            };
            if wrote < len {
                break;
            }
            done += len;
        }
    }
    for (i, line) in lines.iter().enumerate() {
        for (p, &x) in line.iter().enumerate().skip(done) {
            out[p * ld + i] = x.to_math();
        }
    }
}

/// How many depth steps ahead [`pack_a`] prefetches a transposed A's runs.
const PREFETCH_AHEAD: usize = 8;

/// The prefetch hints of [`prefetch_run`]: into L1 for the next few depth
/// steps, into L2 for the next panel (into L1 it would evict the B panel
/// the kernel is reading: 256 deep × 32 f32 fill a 32 KiB L1).
#[cfg(target_arch = "x86_64")]
const L1: i32 = std::arch::x86_64::_MM_HINT_T0;
#[cfg(target_arch = "x86_64")]
pub(super) const L2: i32 = std::arch::x86_64::_MM_HINT_T1;
#[cfg(not(target_arch = "x86_64"))]
const L1: i32 = 0;
#[cfg(not(target_arch = "x86_64"))]
pub(super) const L2: i32 = 0;

/// Asks for the cache lines of the first `len` elements of `run` ahead of
/// their use, into the caches `HINT` names (an `_MM_HINT_*`): the runs of a
/// transposed operand lie a whole storage row apart, a stride the hardware
/// prefetchers catch late.
#[inline(always)]
fn prefetch_run<const HINT: i32, T>(run: &[T], len: usize) {
    let bytes = len.min(run.len()) * std::mem::size_of::<T>();
    let base = run.as_ptr().cast::<i8>();
    for off in (0..bytes).step_by(64) {
        prefetch_line::<HINT>(base.wrapping_add(off));
    }
}

/// Asks for the cache line holding `p` into the caches `HINT` names (a
/// no-op off x86-64).
#[inline(always)]
pub(super) fn prefetch_line<const HINT: i32>(p: *const i8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults, whatever the address.
    unsafe {
        std::arch::x86_64::_mm_prefetch::<HINT>(p)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Asks for the cache line holding `p` in a state this core may write
/// (`prefetchw`), so stores to it need not ask for ownership (a no-op off
/// x86-64). Call it only from kernels for CPUs that have the instruction
/// (every one with AVX-512 does); `asm!` because the `prfchw` target
/// feature is not stable.
#[inline(always)]
pub(super) fn prefetch_line_for_write(p: *const i8) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch never faults and changes no architectural state.
    unsafe {
        std::arch::asm!("prefetchw [{0}]", in(reg) p, options(nostack, readonly, preserves_flags))
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Converts a contiguous run to the math type: bf16 and f16 through the
/// SIMD slice conversions of [`crate::simd::cast`] (a shift at the CPU's
/// vector width; F16C / AVX-512 `vcvtph2ps`), so widening them does not
/// cost a call per element; other types in blocks of 8 elements (f32 and
/// f64 a copy).
#[inline]
fn widen_run<S: FloatElement>(src: &[S], dst: &mut [S::Math]) {
    if fast_pair::<S, S::Math>() {
        convert_run(src, dst);
        return;
    }
    // Fixed blocks of 8: the runs are panel rows (8–32 elements), and as
    // one loop the compiler turned them into `memcpy` calls that cost more
    // than the copies.
    let (mut d8, mut s8) = (dst.chunks_exact_mut(8), src.chunks_exact(8));
    for (d, s) in (&mut d8).zip(&mut s8) {
        for k in 0..8 {
            d[k] = s[k].to_math();
        }
    }
    for (d, &x) in d8.into_remainder().iter_mut().zip(s8.remainder()) {
        *d = x.to_math();
    }
}
