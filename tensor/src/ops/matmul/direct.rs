//! GEMMs without packing A: when A is row-major and the product is small
//! or B fits in L2, the micro-kernel reads A where it lies
//! ([`super::kernel::DirectFn`]) instead of copying it into panels first,
//! which at 128³ costs as much as a tenth of the product. B is read in
//! place too when its rows are contiguous, else packed once, whole. Rows below the
//! last whole tile run on the one-row kernel; the columns right of the last
//! whole tile go through the packed driver.
//!
//! Every output element is summed exactly as the packed driver sums it: the
//! same depth blocks, the same kernel operation order inside a block, the
//! blocks added to C in sequence. So which path ran never shows in a result,
//! and results do not depend on the thread count.

use rayon::prelude::*;

use super::gemm::{depth_block, drive, epilogue_rows, Bias, Epilogue, GemmShape, MatMut, Native, PAR_FLOPS};
use super::kernel::{DirectFn, GemmScalar, Isa};
use super::pack::{pack_b, AlignedBuf, MatRef};
use crate::{FloatElement, FloatMath};

/// Multiply-adds up to which a GEMM with a row-major A skips packing it
/// whatever the size of B.
pub const DIRECT_FLOPS: usize = 1 << 22;

/// Bytes of B up to which a larger GEMM with a row-major A skips packing
/// it too: every row panel streams all of B, which then stays in L2
/// (1 MiB a core on Zen 4, 2 MiB on Sapphire Rapids), and A is read once,
/// in place. Measured on a 2-core Zen 4, interleaved: 8320x768x192 181 ->
/// 218 GFLOP/s, 256³ 206 -> 230, 2048x512x512 216 -> 224; with B beyond
/// L2 (8320x768x768, 1024³) packed blocks win by 1–3%.
pub const DIRECT_B_BYTES: usize = 1 << 20;

/// Runs `C = A·B + beta·C` (alpha 1, beta 0 or 1) on the direct kernel of
/// `isa` when the shape and strides allow it, returning false (having done
/// nothing) when they do not: A not row-major in the math type, a strided
/// output, another alpha or beta, more than [`DIRECT_FLOPS`] with more than
/// [`DIRECT_B_BYTES`] of B, fewer columns than one tile, or no direct kernel
/// for `isa`.
pub(crate) fn try_direct<S: FloatElement>(
    s: GemmShape<S::Math>,
    a_elems: MatRef<S>,
    b_elems: MatRef<S>,
    c: &mut MatMut<S::Math>,
    epi: &Epilogue<S::Math>,
    isa: Isa,
    par: bool,
) -> bool
where
    S::Math: GemmScalar,
{
    type T<S> = <S as FloatElement>::Math;
    let GemmShape { m, n, k, alpha, beta } = s;
    let (Some(a), Some(kernels)) = (a_elems.as_math(), T::<S>::direct(isa)) else {
        return false;
    };
    let kern = T::<S>::kernel(isa);
    let (one, zero) = (<T<S> as FloatMath>::ONE, <T<S> as FloatMath>::ZERO);
    let row_major = a.cs == 1 && c.cs == 1 && a.rs >= 0 && c.rs >= n as isize;
    if !row_major || alpha != one || (beta != zero && beta != one) || k == 0 || m == 0 || n < kern.nr {
        return false;
    }
    let b_bytes = k.saturating_mul(n).saturating_mul(size_of::<T<S>>());
    if m.saturating_mul(n).saturating_mul(k) > DIRECT_FLOPS && b_bytes > DIRECT_B_BYTES {
        return false;
    }
    // A depth-split product sums in slices, which the direct kernels do not.
    if super::split::slices(m, n, k).is_some() {
        return false;
    }
    let (mf, nf) = (m / kern.mr * kern.mr, n / kern.nr * kern.nr);
    let kc = depth_block(k, kern.kc, 1);
    // B is read in place when its rows are, else packed once: whole column
    // panels of its full depth, `k × nr` each, which the direct kernels read
    // as row-major with `ldb = nr` (a transposed weight, or f16 widened).
    // `panel` is the distance from one column panel of B to the next.
    let mut packed = None;
    let (b_data, ldb, panel) = match b_elems.as_math() {
        Some(b) if b.cs == 1 && b.rs >= 0 => {
            assert!(
                b.at(k - 1, n - 1) < b.data.len(),
                "gemm: operand view outside its buffer"
            );
            (&b.data[b.off..], b.rs as usize, kern.nr)
        }
        _ => {
            let buf = packed.insert(AlignedBuf::<T<S>>::new(nf * k));
            pack_b(buf.as_mut_slice(), &b_elems, 0, k, 0..nf, kern.nr);
            (&buf.as_mut_slice()[..], kern.nr, k * kern.nr)
        }
    };
    let (lda, ldc) = (a.rs as usize, c.rs as usize);
    // A's strides are non-negative with unit columns, so its last element
    // is its largest index.
    assert!(
        a.at(m - 1, k - 1) < a.data.len(),
        "gemm: operand view outside its buffer"
    );
    assert!(
        c.off + (m - 1) * ldc + n <= c.data.len(),
        "gemm: output view outside its buffer"
    );
    let out = SendPtr(c.data.as_mut_ptr().wrapping_add(c.off));
    let ap = SendPtr(a.data.as_ptr().wrapping_add(a.off).cast_mut());
    let bp = SendPtr(b_data.as_ptr().cast_mut());
    // One task per row panel, all column panels: the task's B panels come
    // from L2 (the product is small), its A rows stay in L1. A panel is a
    // whole tile's rows, or one row below the last whole tile.
    let panel = |(i0, rows, run): (usize, usize, DirectFn<T<S>>)| {
        for j0 in (0..nf).step_by(kern.nr) {
            for p0 in (0..k).step_by(kc) {
                let kb = kc.min(k - p0);
                let add = p0 > 0 || beta == one;
                // SAFETY: rows i0..i0+rows ≤ m and depth p0..p0+kb ≤ k of
                // A, depth p0.. and columns j0..j0+nr ≤ nf of B lie in their
                // buffers (asserted above with the views' non-negative
                // strides, or B's nf/nr packed panels of k×nr); those rows
                // of the tile of C too, and only this task writes them; the
                // caller picked a kernel this CPU runs.
                unsafe {
                    run(
                        kb,
                        ap.get().add(i0 * lda + p0),
                        lda,
                        bp.get().add(j0 / kern.nr * panel + p0 * ldb),
                        ldb,
                        out.get().add(i0 * ldc + j0),
                        ldc,
                        add,
                    );
                }
            }
            // SAFETY: the rows just written, ours alone.
            unsafe { epilogue_rows(out.get().add(i0 * ldc + j0), ldc, i0, j0, rows, kern.nr, epi) };
        }
    };
    let panels = (0..mf)
        .step_by(kern.mr)
        .map(|i0| (i0, kern.mr, kernels.tile))
        .chain((mf..m).map(|i0| (i0, 1, kernels.row)));
    if par && m.saturating_mul(nf).saturating_mul(k) >= PAR_FLOPS && rayon::current_num_threads() > 1 {
        panels.collect::<Vec<_>>().into_par_iter().for_each(panel);
    } else {
        panels.for_each(panel);
    }
    // The columns nf.. of every row.
    if nf < n {
        let bias = match epi.bias {
            Bias::Col(v) => Bias::Col(&v[nf..]),
            other => other,
        };
        let shape = GemmShape { n: n - nf, ..s };
        let c = MatMut {
            data: &mut *c.data,
            off: c.off + nf,
            rs: c.rs,
            cs: 1,
        };
        drive(
            &Native(isa),
            shape,
            a_elems,
            MatRef {
                off: b_elems.at(0, nf),
                ..b_elems
            },
            c,
            Epilogue { bias, relu: epi.relu },
            par,
        );
    }
    true
}

/// A raw pointer the panel tasks share: each writes only its own rows of C
/// and reads A and B.
#[derive(Clone, Copy)]
struct SendPtr<T>(*mut T);

impl<T> SendPtr<T> {
    fn get(self) -> *mut T {
        self.0
    }
}

// SAFETY: the tasks write disjoint tiles and only read the operands.
unsafe impl<T> Send for SendPtr<T> {}
unsafe impl<T> Sync for SendPtr<T> {}
