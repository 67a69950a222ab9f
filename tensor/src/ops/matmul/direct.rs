//! GEMMs without packing A: when A is row-major, the micro-kernel reads A
//! where it lies ([`super::kernel::DirectFn`]) instead of copying it into
//! panels first, which at 128³ costs as much as a tenth of the product. B
//! is read in place too when its rows are contiguous and it is small;
//! else it is packed into whole column panels, in parts (one per thread,
//! more when B is wide), each part by the first task over it: with its
//! rows contiguous, by that task's kernel as it reads them
//! ([`super::kernel::DirectPackFn`]; on the 2-core Xeon, 2 threads,
//! interleaved, median GFLOP/s against a packing pass of its own: 512³
//! 278 -> 284, 128x784x512 233 -> 242, 1024x512x512 293 -> 296), while
//! tasks that find the part still being packed read B in place rather
//! than wait. The depth runs in regions of whole depth blocks, one
//! parallel region each, so that a part of B of one region fits
//! [`PART_B_BYTES`] and stays in L2 while every row panel streams it:
//! products of any size then take this path. The rows are cut into panels
//! of near-equal heights up to the tile's, each on the kernel of just that
//! many rows; the columns right of the last whole tile go through the
//! packed driver.
//!
//! Every output element is summed exactly as the packed driver sums it: the
//! same depth blocks, the same kernel operation order inside a block, the
//! blocks added to C in sequence. So which path ran never shows in a result,
//! and results do not depend on the thread count.

use super::gemm::{depth_block, drive, epilogue_rows, Bias, Epilogue, GemmShape, MatMut, Native, PAR_FLOPS};
use super::kernel::{DirectRows, GemmScalar, Isa};
use super::pack::{pack_b, AlignedBuf, MatRef};
use super::shared::{Claim, Shared};
use crate::thread_pool::for_each_grouped;
use crate::{FloatElement, FloatMath};

/// Multiply-adds up to which a GEMM reads a B it does not pack in place
/// whatever its size.
pub const DIRECT_FLOPS: usize = 1 << 22;

/// Bytes of an unpacked B up to which a larger GEMM with a row-major A
/// still reads it in place: every row panel streams it, from L2 (1 MiB a
/// core on Zen 4, 2 MiB on Sapphire Rapids). Measured on a 2-core Zen 4,
/// interleaved against packing A: 8320x768x192 181 -> 218 GFLOP/s, 256³
/// 206 -> 230, 2048x512x512 216 -> 224.
pub const DIRECT_B_BYTES: usize = 1 << 20;

/// Bytes of one part of a packed B in one region of the depth, at most:
/// each row panel of the region streams its part, which stays in L2 on
/// both machine kinds (half of Zen 4's 1 MiB). On the 2-core Xeon, 2
/// threads, interleaved, median GFLOP/s against the packed driver (A
/// packed, B's panels in L1): 1024³ 230 -> 244 while the VM runs fast,
/// 158 -> 155 while it runs at half speed; 2048³ 186 -> 217,
/// 4096x768x3072 156 -> 183, 8320x768x768 189 -> 211. Against a budget
/// of 1 MiB: 1024³ 239 -> 244 and 174 -> 187.
pub const PART_B_BYTES: usize = 512 << 10;

/// Bytes of a row-major B above which the direct path packs it (when
/// enough row panels reuse it, [`PACK_MIN_PANELS`]). Rows of B read in
/// place lie a row stride apart, a power of two in most models, so a
/// panel's rows fall into a few L1 sets and every load of them misses;
/// and both cores read all of it. Packed, each core streams the
/// contiguous panels of its own part. On the 2-core Xeon, 2 threads,
/// interleaved, median GFLOP/s in place -> packed: 512³ 155 -> 178,
/// 8320x768x192 209 -> 228; below this size packing cost more than it
/// saved (256³ 211 -> 198, 128³ 163 -> 123).
pub const PACK_B_BYTES: usize = 512 << 10;

/// Row panels that must reuse a packed B for the copy to pay.
const PACK_MIN_PANELS: usize = 8;

/// Column panels a part of a packed B holds at least: more parts would
/// have every thread stream all of A for a sliver of B.
const PART_PANELS: usize = 4;

/// Runs `C = A·B + beta·C` (alpha 1, beta 0 or 1) on the direct kernel of
/// `isa` when the shape and strides allow it, returning false (having done
/// nothing) when they do not: A not row-major in the math type, a strided
/// output, another alpha or beta, a B read in place (not packed) of more
/// than [`DIRECT_B_BYTES`] in a product of more than [`DIRECT_FLOPS`], a
/// depth-split product, fewer columns than one tile, or no direct kernel
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
    let nr = kern.nr;
    let (one, zero) = (<T<S> as FloatMath>::ONE, <T<S> as FloatMath>::ZERO);
    let row_major = a.cs == 1 && c.cs == 1 && a.rs >= 0 && c.rs >= n as isize;
    if !row_major || alpha != one || (beta != zero && beta != one) || k == 0 || m == 0 || n < nr {
        return false;
    }
    let nf = n / nr * nr;
    let panels = nf / nr;
    let parallel =
        par && m.saturating_mul(nf).saturating_mul(k) >= PAR_FLOPS && rayon::current_num_threads() > 1;
    // B's rows contiguous in the math type: read where they lie when B is
    // small or too little reused to pack, else by the tasks that pack it.
    let size = size_of::<T<S>>();
    let b_bytes = k.saturating_mul(n).saturating_mul(size);
    let b_rows = b_elems.as_math().filter(|b| b.cs == 1 && b.rs >= 0);
    let pack = b_rows.is_none() || (b_bytes > PACK_B_BYTES && m >= PACK_MIN_PANELS * kernels.mr);
    // Read in place, a large B would stream from memory once per row panel.
    if !pack && m.saturating_mul(n).saturating_mul(k) > DIRECT_FLOPS && b_bytes > DIRECT_B_BYTES {
        return false;
    }
    // A depth-split product sums in slices, which the direct kernels do not.
    if super::split::slices(m, n, k).is_some() {
        return false;
    }
    let kc = depth_block(k, kern.kc, 1);
    // A packed B is cut into parts of whole column panels: one per thread,
    // and more when one depth block of a part would not fit PART_B_BYTES.
    let threads = if parallel { rayon::current_num_threads() } else { 1 };
    let parts = if pack {
        let block_bytes = kc.saturating_mul(nf).saturating_mul(size);
        threads
            .max(block_bytes.div_ceil(PART_B_BYTES))
            .min(panels / PART_PANELS)
            .max(1)
    } else {
        1
    };
    // The depth runs in regions of whole depth blocks, one parallel region
    // each, a part of B of a region no more than PART_B_BYTES, so every row
    // panel of a region finds its part in L2 (all of the depth in one
    // region when B is read in place: it is small then).
    let part_bytes = panels.div_ceil(parts) * nr * kc * size;
    let depth = match pack {
        true => kc * (PART_B_BYTES / part_bytes).max(1),
        false => k,
    };
    let (lda, ldc) = (a.rs as usize, c.rs as usize);
    // A's strides are non-negative with unit columns, so its last element
    // is its largest index; B's likewise when its rows are contiguous.
    assert!(
        a.at(m - 1, k - 1) < a.data.len(),
        "gemm: operand view outside its buffer"
    );
    if let Some(b) = &b_rows {
        assert!(
            b.at(k - 1, n - 1) < b.data.len(),
            "gemm: operand view outside its buffer"
        );
    }
    assert!(
        c.off + (m - 1) * ldc + n <= c.data.len(),
        "gemm: output view outside its buffer"
    );
    // Part `h` is the column panels `part(h)`.
    let part = |h: usize| h * panels / parts..(h + 1) * panels / parts;
    let rows_at = b_rows.map(|b| {
        (
            SendPtr(b.data.as_ptr().wrapping_add(b.off).cast_mut()),
            b.rs as usize,
        )
    });
    let mut buf = pack.then(|| AlignedBuf::<T<S>>::new(nf * depth.min(k)));
    let out = SendPtr(c.data.as_mut_ptr().wrapping_add(c.off));
    let ap = SendPtr(a.data.as_ptr().wrapping_add(a.off).cast_mut());
    // Row panels of near-equal heights: the fewest that the tile's height
    // allows, so no thin panel of leftover rows streams all of B for a few
    // rows of products (128 rows: 8 panels of 13 and 2 of 12, not 9 of 14
    // and one of 2; on the 2-core Xeon, 2 threads, interleaved, median
    // GFLOP/s 128³ 223 -> 234, 128x784x512 217 -> 227, 512³ unchanged).
    // Their count times the parts is a multiple of the threads, so that
    // no thread is left with one task more than the others at the end
    // (256 rows in 20 panels, not 19: 256³ 303 -> 314, 320³ 308 -> 316).
    let row_panels = m
        .div_ceil(kernels.mr)
        .next_multiple_of(threads / gcd(parts, threads))
        .min(m);
    let (height, taller) = (m / row_panels, m % row_panels);
    for r0 in (0..k).step_by(depth) {
        let rk = depth.min(k - r0);
        let last = r0 + rk == k;
        // A packed B is whole column panels of the region's depth, `rk ×
        // nr` each, which the direct kernels read as row-major with `ldb =
        // nr`; part `h` is packed by the first task that needs it.
        let source = match (buf.as_mut(), rows_at) {
            (Some(buf), rows) => BSource::Packed {
                shared: Shared::new(&mut buf.as_mut_slice()[..nf * rk], parts),
                rows,
            },
            (None, Some((b, ldb))) => BSource::InPlace(b, ldb),
            (None, None) => unreachable!("B is packed unless its rows are contiguous"),
        };
        // One task per row panel and part of B: the task's B panels come
        // from L2, its A rows stay in L1.
        let task = |h: usize, r: usize| {
            let (i0, rows) = (r * height + r.min(taller), height + usize::from(r < taller));
            let DirectRows { tile, packing } = (kernels.rows)(rows);
            let q = part(h);
            let span = q.start * rk * nr..q.end * rk * nr;
            let packed = |block: &[T<S>]| (SendPtr(block.as_ptr().cast_mut()), nr, rk * nr);
            let in_place = |(b, ldb): (SendPtr<T<S>>, usize)| {
                (SendPtr(b.get().wrapping_add(r0 * ldb + q.start * nr)), ldb, nr)
            };
            // Column panel `j` of the region's B is at `b + (j -
            // q.start)·panel`, its depth steps `ldb` apart. The first task
            // over the part packs it as it reads B's rows; a task finding
            // it claimed but not yet packed reads B's rows in place rather
            // than wait.
            let mut packer = None;
            let (b, ldb, panel) = match &source {
                &BSource::InPlace(b, ldb) => in_place((b, ldb)),
                BSource::Packed { shared, rows: None } => packed(shared.get(h, span, |dst| {
                    pack_b(dst, &b_elems, r0, rk, q.start * nr..q.end * nr, nr)
                })),
                BSource::Packed {
                    shared,
                    rows: Some(b),
                } => match shared.try_claim(h, span) {
                    Some(Claim::Ready(block)) => packed(block),
                    Some(Claim::Mine(p)) => {
                        packer = Some(p);
                        in_place(*b)
                    }
                    None => in_place(*b),
                },
            };
            let fill = packer.as_mut().map(|p| SendPtr(p.dst().as_mut_ptr()));
            for j in q.clone() {
                let (j0, bj) = (j * nr, b.get().wrapping_add((j - q.start) * panel));
                for p0 in (r0..r0 + rk).step_by(kc) {
                    let kb = kc.min(k - p0);
                    let add = p0 > 0 || beta == one;
                    let (a, b, c) = (
                        ap.get().wrapping_add(i0 * lda + p0),
                        bj.wrapping_add((p0 - r0) * ldb),
                        out.get().wrapping_add(i0 * ldc + j0),
                    );
                    // SAFETY: rows i0..i0+rows ≤ m and depth p0..p0+kb ≤ k
                    // of A, depth p0.. and columns j0..j0+nr ≤ nf of B lie
                    // in their buffers (asserted above with the views'
                    // non-negative strides, or the part's packed panels of
                    // rk×nr), as does the packed panel being filled; those
                    // rows of the tile of C too, and only this task writes
                    // them; the caller picked kernels this CPU runs.
                    unsafe {
                        match fill {
                            Some(dst) => {
                                let dst = dst.get().add(((j - q.start) * rk + p0 - r0) * nr);
                                packing(kb, a, lda, b, ldb, dst, c, ldc, add)
                            }
                            None => tile(kb, a, lda, b, ldb, c, ldc, add),
                        }
                    }
                }
                if last {
                    // SAFETY: the rows just written, ours alone.
                    unsafe { epilogue_rows(out.get().add(i0 * ldc + j0), ldc, i0, j0, rows, nr, epi) };
                }
            }
            if let Some(p) = packer {
                p.ready();
            }
        };
        if parallel {
            // Each thread starts on a part of its own and takes one row
            // panel at a time, so a thread that finishes first (a vCPU the
            // host runs at full speed while the other is slowed, as the
            // 2-core VMs often do) takes over the other's remaining panels.
            for_each_grouped(parts, row_panels, task);
        } else {
            (0..parts).for_each(|h| (0..row_panels).for_each(|r| task(h, r)));
        }
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

/// The greatest common divisor of `a` and `b` (`a` when `b` is 0).
fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Where the direct tasks read B.
enum BSource<'a, T> {
    /// In place: element `(0, 0)` and the row stride.
    InPlace(SendPtr<T>, usize),
    /// Packed into whole column panels, one block per part; `rows` is
    /// where B's rows lie when they are contiguous in the math type (the
    /// packing kernel's source, and where a task reads a part not packed
    /// yet).
    Packed {
        shared: Shared<'a, T>,
        rows: Option<(SendPtr<T>, usize)>,
    },
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
