//! The GEMM driver: `C = alpha·A·B + beta·C` with an optional fused epilogue,
//! BLIS-style.
//!
//! Loop order: columns of B in `nc` blocks → depth in `kc` blocks → a grid
//! of macro-tiles (`mc` rows × a column chunk) run by rayon in one parallel
//! region, whose tasks pack the row blocks of A and the panels of B they
//! need on first use (a panel of B, where the packing has a fused routine,
//! by the first tile over it, as that tile's kernel reads it) →
//! micro-tiles of `mr×nr` by the [`Kernel`]. Every output element is summed
//! in the same order — `kc` blocks in sequence, each one in the kernel's `p`
//! order — whatever the grid, the thread count or which task packed a block,
//! so results are bitwise identical on any number of threads.

use std::ops::Range;

use super::kernel::{GemmScalar, Isa, Kernel, KernelFn, PairDirectFn, PairFusedFn, PairRows, MAX_TILE};
use super::pack::{pack_a, pack_b, prefetch_line, AlignedBuf, MatRef, L2};
use super::shared::{Claim, Shared};
use crate::thread_pool::for_each_grouped;
use crate::{FloatElement, FloatMath};

/// Multiply-adds below which a GEMM runs on the calling thread.
pub const PAR_FLOPS: usize = 1 << 18;

/// What is added to each output row or column after the product, before the activation.
#[derive(Clone, Copy)]
pub enum Bias<'a, T> {
    /// No bias.
    None,
    /// `bias[i]` added to every element of row `i` (conv output channels).
    Row(&'a [T]),
    /// `bias[j]` added to every element of column `j` (linear layer features).
    Col(&'a [T]),
}

/// The fused epilogue, applied once per output element after the last depth block.
#[derive(Clone, Copy)]
pub struct Epilogue<'a, T> {
    /// The bias.
    pub bias: Bias<'a, T>,
    /// Apply `max(x, 0)` (NaN stays NaN) after the bias.
    pub relu: bool,
}

impl<T> Epilogue<'_, T> {
    /// No bias, no activation.
    pub fn none() -> Self {
        Epilogue {
            bias: Bias::None,
            relu: false,
        }
    }
}

/// The output: element `(i, j)` is `data[off + i*rs + j*cs]`. Distinct
/// `(i, j)` must reach distinct elements, all inside `data`.
pub struct MatMut<'a, T> {
    /// The storage.
    pub data: &'a mut [T],
    /// Index of element (0, 0).
    pub off: usize,
    /// Row stride.
    pub rs: isize,
    /// Column stride.
    pub cs: isize,
}

/// The shape and scalars of one GEMM: `C[m×n] = alpha·A[m×k]·B[k×n] + beta·C`.
/// With `beta == 0`, C is not read (NaNs in it do not propagate), as in BLAS.
#[derive(Clone, Copy)]
pub struct GemmShape<T> {
    /// Rows of A and C.
    pub m: usize,
    /// Columns of B and C.
    pub n: usize,
    /// Columns of A, rows of B.
    pub k: usize,
    /// Scale of the product.
    pub alpha: T,
    /// Scale of the existing C.
    pub beta: T,
}

/// Runs one GEMM with the micro-kernel of `isa` (which the CPU must
/// support: pass [`Isa::best`] or one of [`Isa::available`]); `par` lets it
/// use the rayon pool. bf16 operands run on the bf16 kernels of
/// [`super::bf16`] (the path [`super::bf16::Bf16Path::best`] picks), others
/// are converted to their math type while packing.
pub fn gemm<S: FloatElement>(
    s: GemmShape<S::Math>,
    a: MatRef<S>,
    b: MatRef<S>,
    c: MatMut<S::Math>,
    epi: Epilogue<S::Math>,
    isa: Isa,
    par: bool,
) where
    S::Math: GemmScalar,
{
    let Some((mut c, epi)) = super::bf16::route(s, a, b, c, epi, par) else {
        return;
    };
    assert!(isa.supported(), "gemm: this CPU cannot run {isa:?} kernels");
    if super::direct::try_direct(s, a, b, &mut c, &epi, isa, par) {
        return;
    }
    drive(&Native(isa), s, a, b, c, epi, par)
}

/// How a GEMM lays its operands out for one micro-kernel: the kernel and the
/// packers that write the panels it reads. [`Native`] packs in the math
/// type; `bf16::PairPacking` packs bf16 pairs.
pub trait Packing<S>: Sync {
    /// One unit of a packed panel.
    type Unit: bytemuck::Pod + Send + Sync;
    /// The accumulator and output type.
    type Acc: GemmScalar;
    /// The micro-kernel.
    fn kernel(&self) -> Kernel<Self::Acc, Self::Unit>;
    /// Depth blocks other than the last hold a multiple of this many elements.
    fn depth_align(&self) -> usize;
    /// Units one row of a packed A panel (one column of B) holds for a depth
    /// block of `kc` elements: the `kc` the kernel is called with.
    fn units(&self, kc: usize) -> usize;
    /// Packs rows `rows` (starting at a multiple of `mr`), depth `p0 .. p0 +
    /// kc` of `a` into `dst` as `ceil(rows.len()/mr)` micro-panels of `mr ×
    /// units(kc)`, zero-padding what lies outside the matrix.
    fn pack_a(
        &self,
        dst: &mut [Self::Unit],
        a: &MatRef<S>,
        rows: Range<usize>,
        p0: usize,
        kc: usize,
        mr: usize,
    );
    /// The tile routine reading A where it lies (see [`PairDirectFn`]) for a
    /// `k`-deep product of `a`, when this packing has one and `a`'s layout
    /// allows it: whole row panels then skip packing A. `None` (the
    /// default) packs every panel.
    fn direct_a(&self, a: &MatRef<S>, k: usize) -> Option<PairDirectFn<S, Self::Unit, Self::Acc>> {
        let _ = (a, k);
        None
    }
    /// The tile routine packing a `b` panel while it reads it (see
    /// [`PairFusedFn`]), when this packing has one and `b`'s layout allows
    /// it: the first tile over each whole panel of a depth block without
    /// padded units then packs it. A packing that has one lays its A
    /// panels out pair-major (unit `(p, i)` at `p·mr + i`), which is how
    /// the driver describes them to the routine. `None` (the default)
    /// packs every panel with [`Packing::pack_b`].
    fn fused_b(&self, b: &MatRef<S>) -> Option<PairFusedFn<S, Self::Unit, Self::Acc>> {
        let _ = b;
        None
    }
    /// Packs depth `p0 .. p0 + kc`, columns `cols` of `b` into `dst` as
    /// `ceil(cols.len()/nr)` micro-panels of `units(kc) × nr`, zero-padded.
    fn pack_b(
        &self,
        dst: &mut [Self::Unit],
        b: &MatRef<S>,
        p0: usize,
        kc: usize,
        cols: Range<usize>,
        nr: usize,
    );
}

/// Packing in the math type for the micro-kernels of one [`Isa`].
pub struct Native(pub Isa);

impl<S: FloatElement> Packing<S> for Native
where
    S::Math: GemmScalar,
{
    type Unit = S::Math;
    type Acc = S::Math;

    fn kernel(&self) -> Kernel<S::Math> {
        <S::Math as GemmScalar>::kernel(self.0)
    }

    fn depth_align(&self) -> usize {
        1
    }

    fn units(&self, kc: usize) -> usize {
        kc
    }

    fn pack_a(
        &self,
        dst: &mut [S::Math],
        a: &MatRef<S>,
        rows: Range<usize>,
        p0: usize,
        kc: usize,
        mr: usize,
    ) {
        pack_a(dst, a, rows, p0, kc, mr)
    }

    fn pack_b(
        &self,
        dst: &mut [S::Math],
        b: &MatRef<S>,
        p0: usize,
        kc: usize,
        cols: Range<usize>,
        nr: usize,
    ) {
        pack_b(dst, b, p0, kc, cols, nr)
    }
}

/// The driver: one GEMM through packing `pk`, whose kernel the caller has
/// checked this CPU runs; `par` lets it use the rayon pool.
pub(crate) fn drive<S: Sync, P: Packing<S>>(
    pk: &P,
    s: GemmShape<P::Acc>,
    a: MatRef<S>,
    b: MatRef<S>,
    c: MatMut<P::Acc>,
    epi: Epilogue<P::Acc>,
    par: bool,
) {
    type T<P, S> = <P as Packing<S>>::Acc;
    let GemmShape { m, n, k, alpha, beta } = s;
    if m == 0 || n == 0 {
        return;
    }
    assert!(
        reach(c.off, c.rs, c.cs, m, n).is_some_and(|hi| hi < c.data.len()),
        "gemm: output view outside its buffer"
    );
    if let Some(slices) = super::split::slices(m, n, k) {
        return super::split::drive_split(pk, s, a, b, c, epi, par, slices);
    }
    let kern = pk.kernel();
    let par = par && m.saturating_mul(n).saturating_mul(k) >= PAR_FLOPS && rayon::current_num_threads() > 1;
    let out = OutPtr::new(c);
    let first = Accum::of(beta);
    if k == 0 {
        let zeros = [<T<P, S> as FloatMath>::ZERO; MAX_TILE];
        let grid = Grid::new(&kern, m, n);
        for t in 0..grid.tasks() {
            let (r, cc) = grid.task(t);
            for_each_tile(&kern, r, cc, |i0, j0, rows, cols| {
                // SAFETY: tiles lie inside the m×n output; only this thread writes.
                unsafe {
                    store(
                        &zeros,
                        kern.nr,
                        i0,
                        j0,
                        rows,
                        cols,
                        &out,
                        alpha,
                        first,
                        Some(&epi),
                    )
                }
            });
        }
        return;
    }
    let kc = depth_block(k, kern.kc, pk.depth_align());
    let units = pk.units(kc);
    // Whole row panels of A read in place where the packing can: only a
    // row block's partial last panel is packed then.
    let a_direct = pk.direct_a(&a, k);
    if a_direct.is_some() {
        assert!(
            a.rs >= 0 && a.cs == 1 && a.at(m - 1, k - 1) < a.data.len(),
            "gemm: operand view outside its buffer"
        );
    }
    let b_fused = pk.fused_b(&b);
    if b_fused.is_some() {
        assert!(
            b.rs >= 0 && b.cs == 1 && b.at(k - 1, n - 1) < b.data.len(),
            "gemm: operand view outside its buffer"
        );
    }
    let nc_max = kern.nc.min(n);
    let mut pa = AlignedBuf::<P::Unit>::new(m.div_ceil(kern.mr) * kern.mr * units);
    let mut pb = AlignedBuf::<P::Unit>::new(nc_max.div_ceil(kern.nr) * kern.nr * units);
    for jc in (0..n).step_by(kern.nc) {
        let ncb = kern.nc.min(n - jc);
        let grid = Grid::new(&kern, m, ncb);
        for pc in (0..k).step_by(kc) {
            let kcb = kc.min(k - pc);
            let u = pk.units(kcb);
            let accum = if pc == 0 { first } else { Accum::Add };
            let epi = (pc + kcb == k).then_some(&epi);
            let direct = alpha == <T<P, S> as FloatMath>::ONE
                && !matches!(accum, Accum::Scale(_))
                && out.cs == 1
                && out.rs >= kern.nr as isize;
            // The first tile over a B panel packs it in the fused kernel
            // where there is one: whole panels of a depth block without
            // padded units.
            let b_fused = b_fused.filter(|_| 2 * u == kcb);
            // One parallel region per depth block: each task packs the row
            // block of A and the panels of B it needs unless another task
            // already has (or is), so packing runs on every thread without
            // a fork-join of its own.
            let shared_a = Shared::new(pa.as_mut_slice(), grid.row_blocks());
            let shared_b = Shared::new(pb.as_mut_slice(), ncb.div_ceil(kern.nr));
            let task = |t: usize| {
                let (r, cc) = grid.task(t);
                let (ti, _) = grid.block(t);
                let packed = match a_direct {
                    Some(_) => r.start + r.len() / kern.mr * kern.mr..r.end,
                    None => r.clone(),
                };
                let a_len = packed.len().div_ceil(kern.mr) * kern.mr * u;
                let pa: &[P::Unit] = if packed.is_empty() {
                    &[]
                } else {
                    shared_a.get(ti, packed.start * u..packed.start * u + a_len, |dst| {
                        pk.pack_a(dst, &a, packed.clone(), pc, kcb, kern.mr)
                    })
                };
                // The tile buffer of partial tiles: the kernel (or its edge
                // routine) writes the corner `store` reads before it reads.
                let mut acc = std::mem::MaybeUninit::<[T<P, S>; MAX_TILE]>::uninit();
                let acc = acc.as_mut_ptr().cast::<T<P, S>>();
                // One tile from the panel of B at `bp`, or packing it into
                // `fill` with the fused routine as it goes.
                let tile = |i0: usize,
                            j0: usize,
                            rows: usize,
                            cols: usize,
                            bp: &[P::Unit],
                            fill: Option<*mut P::Unit>| {
                    // The tile routine `run` (or the in-place or fused one)
                    // into `c`. SAFETY (of the calls): as at the call sites
                    // below; A's rows i0..i0+mr, depth pc..pc+kcb lie in its
                    // buffer (asserted above with its non-negative strides),
                    // as do B's columns jc+j0..+nr when fused (cols == nr).
                    let kernel = |run: KernelFn<T<P, S>, P::Unit>, c: *mut T<P, S>, ldc: usize, add: bool| unsafe {
                        let packed_a = || &pa[(i0 - packed.start) * u..][..kern.mr * u];
                        let unit = std::mem::size_of::<P::Unit>();
                        match (fill.zip(b_fused), a_direct) {
                            (Some((dst, fused)), direct) => {
                                let rows = match direct {
                                    Some(_) if rows == kern.mr => PairRows {
                                        at: a.data.as_ptr().add(a.at(i0, pc)).cast(),
                                        row: a.rs as usize * std::mem::size_of::<S>(),
                                        pair: 2 * std::mem::size_of::<S>(),
                                    },
                                    _ => PairRows {
                                        at: packed_a().as_ptr().cast(),
                                        row: unit,
                                        pair: kern.mr * unit,
                                    },
                                };
                                let bs = b.data.as_ptr().add(b.at(pc, jc + j0));
                                fused(u, rows, bs, b.rs as usize, dst, c, ldc, add)
                            }
                            (None, Some(direct)) if rows == kern.mr => {
                                let ap = a.data.as_ptr().add(a.at(i0, pc));
                                direct(u, ap, a.rs as usize, bp.as_ptr(), c, ldc, add)
                            }
                            (None, _) => run(u, packed_a().as_ptr(), bp.as_ptr(), c, ldc, add),
                        }
                    };
                    if direct && rows == kern.mr && cols == kern.nr {
                        // A whole tile of a row-contiguous output: the
                        // kernel combines it with C in place; the epilogue
                        // follows while the tile is in L1. The same
                        // operations as `store`, so the same bits.
                        // SAFETY: as below, with the tile inside the output
                        // (rows `i0..i0+mr`, columns `jc+j0..+nr`, `rs ≥ nr`).
                        unsafe {
                            let c = out.ptr.offset(out.at(i0, jc + j0));
                            kernel(kern.run, c, out.rs as usize, matches!(accum, Accum::Add));
                            if let Some(e) = epi {
                                epilogue_rows(c, out.rs as usize, i0, jc + j0, rows, cols, e);
                            }
                        }
                        return;
                    }
                    // SAFETY: the panels hold u*mr and u*nr units, the tile
                    // buffer mr*nr ≤ MAX_TILE elements (the rows × cols
                    // corner `store` reads written by the kernel or its
                    // edge routine, so initialised when read), and the caller
                    // checked the kernel runs here; tasks cover disjoint
                    // tiles of the output.
                    let run = match kern.edge {
                        Some(edge) if rows < kern.mr || cols < kern.nr => edge(rows, cols),
                        _ => kern.run,
                    };
                    unsafe {
                        kernel(run, acc, kern.nr, false);
                        let acc = std::slice::from_raw_parts(acc, (rows - 1) * kern.nr + cols);
                        store(acc, kern.nr, i0, jc + j0, rows, cols, &out, alpha, accum, epi)
                    };
                };
                let span = |q: usize| q * kern.nr * u..(q + 1) * kern.nr * u;
                if b_fused.is_none() {
                    // Pack the task's panels up front, the runs of them no
                    // other task has claimed each in one call: B streamed
                    // along its rows, not a panel's width at a time.
                    let panels = cc.start / kern.nr..cc.end.div_ceil(kern.nr);
                    let mut q = panels.start;
                    while q < panels.end {
                        match shared_b.claim_run(q..panels.end, span) {
                            Some(mut p) => {
                                let run = p.blocks();
                                let cols = jc + run.start * kern.nr..jc + (run.end * kern.nr).min(cc.end);
                                pk.pack_b(p.dst(), &b, pc, kcb, cols, kern.nr);
                                p.ready();
                                q = run.end;
                            }
                            None => q += 1,
                        }
                    }
                }
                let mut panel: &[P::Unit] = &[];
                for_each_tile(&kern, r.clone(), cc.clone(), |i0, j0, rows, cols| {
                    // This task's first tile over the panel packs it unless
                    // another task has (or is): with the fused routine when
                    // there is one for the panel, in a pass of its own else.
                    let mut packer = None;
                    if i0 == r.start {
                        let q = j0 / kern.nr;
                        match shared_b.claim(q, span(q)) {
                            Claim::Mine(p) if b_fused.is_some() && cols == kern.nr => packer = Some(p),
                            Claim::Mine(mut p) => {
                                pk.pack_b(p.dst(), &b, pc, kcb, jc + j0..jc + j0 + cols, kern.nr);
                                panel = p.ready();
                            }
                            Claim::Ready(p) => panel = p,
                        }
                    }
                    if b_fused.is_some() {
                        next_panel_ahead(&b, &shared_b, pc..pc + kcb, jc, j0, &r, &cc, i0, &kern);
                    }
                    let fill = packer.as_mut().map(|p| p.dst().as_mut_ptr());
                    tile(i0, j0, rows, cols, panel, fill);
                    if let Some(p) = packer {
                        panel = p.ready();
                    }
                });
            };
            if par {
                // Each thread starts on a row block of its own (its block of
                // A stays in its L2), or on a column block of its own when
                // there are fewer row blocks than threads. On the 2-core
                // Xeon, interleaved, median GFLOP/s against rayon's
                // contiguous halves of the tasks: bf16 1024³ 259 -> 265,
                // 512³ 232 -> 239, 128x512x512 161 -> 180; f32 `1024_tn`
                // 239 -> 250, `128x784x512_tn` 152 -> 168.
                let (rb, cb) = (grid.row_blocks(), grid.col_blocks());
                if rb >= rayon::current_num_threads() {
                    for_each_grouped(rb, cb, |ti, j| task(ti * cb + j));
                } else {
                    for_each_grouped(cb, rb, |j, ti| task(ti * cb + j));
                }
            } else {
                (0..grid.tasks()).for_each(task);
            }
        }
    }
}

/// Fetches into L2 this tile's share of the B rows of the task's next panel
/// (`depth` × the `nr` columns after `j0`), when no task has claimed it
/// yet: the tile that will pack it with the fused routine then finds B's
/// rows near, where it would wait on memory for each (B's rows are a
/// stride apart, which the hardware prefetchers catch late). The share is
/// spread over the task's row tiles of panel `j0`, tile `i0` among them.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn next_panel_ahead<S, T, U, P>(
    b: &MatRef<S>,
    panels: &Shared<U>,
    depth: Range<usize>,
    jc: usize,
    j0: usize,
    rows: &Range<usize>,
    cols: &Range<usize>,
    i0: usize,
    kern: &Kernel<T, P>,
) {
    let next = j0 + kern.nr;
    if next + kern.nr > cols.end || panels.claimed(next / kern.nr) {
        return;
    }
    let per_tile = depth.len().div_ceil(rows.len().div_ceil(kern.mr));
    let first = (i0 - rows.start) / kern.mr * per_tile;
    let row_bytes = kern.nr * std::mem::size_of::<S>();
    for d in depth.clone().skip(first).take(per_tile) {
        let row = b.data.as_ptr().wrapping_add(b.at(d, jc + next)).cast::<i8>();
        prefetch_line::<L2>(row);
        prefetch_line::<L2>(row.wrapping_add(row_bytes - 1));
    }
}

/// The depth of the blocks a `k`-deep product is summed in, for a kernel
/// taking at most `kc_max` and blocks that are multiples of `align`: equal
/// blocks (288 = 144 + 144, not 256 + 32), so fewer short, overhead-bound
/// ones. A function of `k` and the kernel alone, so the sum order is too —
/// the packed and the direct driver share it to sum alike.
pub(super) fn depth_block(k: usize, kc_max: usize, align: usize) -> usize {
    k.div_ceil(k.div_ceil(kc_max)).next_multiple_of(align)
}

/// How the first depth block combines with the existing C.
#[derive(Clone, Copy)]
enum Accum<T> {
    Overwrite,
    Add,
    Scale(T),
}

impl<T: GemmScalar> Accum<T> {
    /// The combine of `beta·C`: C not read when 0, added when 1.
    fn of(beta: T) -> Self {
        if beta == <T as FloatMath>::ZERO {
            Accum::Overwrite
        } else if beta == <T as FloatMath>::ONE {
            Accum::Add
        } else {
            Accum::Scale(beta)
        }
    }
}

/// Combines the finished `m × n` sums `acc` (row stride `n`) with the output
/// `c` as the driver combines its tiles — `alpha·acc + beta·C`, then the
/// epilogue — for a driver that summed the product elsewhere (the depth
/// slices of `split.rs`). `c` is a view `drive` has checked.
pub(super) fn combine<T: GemmScalar>(acc: &[T], s: GemmShape<T>, c: MatMut<T>, epi: &Epilogue<T>) {
    assert!(
        acc.len() == s.m * s.n && reach(c.off, c.rs, c.cs, s.m, s.n).is_some_and(|hi| hi < c.data.len()),
        "gemm: combined block outside its buffers"
    );
    // SAFETY: the block is the whole output, inside its buffer (asserted),
    // borrowed mutably here.
    unsafe {
        store(
            acc,
            s.n,
            0,
            0,
            s.m,
            s.n,
            &OutPtr::new(c),
            s.alpha,
            Accum::of(s.beta),
            Some(epi),
        )
    }
}

/// The output as a raw pointer, so tasks on different threads can write
/// their disjoint tiles.
struct OutPtr<T> {
    ptr: *mut T,
    len: usize,
    off: usize,
    rs: isize,
    cs: isize,
}

impl<T> OutPtr<T> {
    /// The output `c` as a raw pointer (the caller checked its view).
    fn new(c: MatMut<'_, T>) -> Self {
        OutPtr {
            ptr: c.data.as_mut_ptr(),
            len: c.data.len(),
            off: c.off,
            rs: c.rs,
            cs: c.cs,
        }
    }

    /// The offset of element `(i, j)` from `ptr`.
    #[inline(always)]
    fn at(&self, i: usize, j: usize) -> isize {
        self.off as isize + i as isize * self.rs + j as isize * self.cs
    }
}

// SAFETY: tasks write disjoint elements (see `gemm`); T is a plain float.
unsafe impl<T: Send> Send for OutPtr<T> {}
unsafe impl<T: Send> Sync for OutPtr<T> {}

/// The macro-tile grid over an `m × n` block: tasks of `rows` rows (a
/// multiple of `mr`) by `cols` columns (a multiple of `nr`). Split finer than
/// the cache blocks when the shape is small so that skinny products still
/// give every thread work; the split never changes any result.
struct Grid {
    m: usize,
    n: usize,
    rows: usize,
    cols: usize,
}

impl Grid {
    fn new<T, P>(kern: &Kernel<T, P>, m: usize, n: usize) -> Grid {
        const MIN_TASKS: usize = 8;
        let mut rows = kern.mc.min(m.div_ceil(kern.mr) * kern.mr);
        let mut cols = (kern.nr * 16).min(n.div_ceil(kern.nr) * kern.nr);
        while m.div_ceil(rows) * n.div_ceil(cols) < MIN_TASKS {
            if cols >= rows && cols > kern.nr {
                cols = (cols / 2).div_ceil(kern.nr) * kern.nr;
            } else if rows > kern.mr {
                rows = (rows / 2).div_ceil(kern.mr) * kern.mr;
            } else {
                break;
            }
        }
        Grid { m, n, rows, cols }
    }

    fn row_blocks(&self) -> usize {
        self.m.div_ceil(self.rows)
    }

    fn col_blocks(&self) -> usize {
        self.n.div_ceil(self.cols)
    }

    fn tasks(&self) -> usize {
        self.row_blocks() * self.col_blocks()
    }

    /// The row block and column block of task `t`. Threads start on row
    /// blocks spread over the grid (`for_each_grouped`): row block `ti`
    /// starts at column block `ti·cb/rb` (spread the same way) and odd row
    /// blocks walk the columns backwards (serpentine), so threads starting
    /// on different row blocks pack different blocks of B instead of one
    /// waiting while the other packs the block both need, and a thread
    /// moving to its next row block finds the B block it just used.
    fn block(&self, t: usize) -> (usize, usize) {
        let (rb, cb) = (self.row_blocks(), self.col_blocks());
        let (ti, j) = (t / cb, t % cb);
        let j = if ti % 2 == 1 { cb - 1 - j } else { j };
        (ti, (j + ti * cb / rb) % cb)
    }

    /// Row range and column range of task `t`.
    fn task(&self, t: usize) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
        let (ti, tj) = self.block(t);
        let r0 = ti * self.rows;
        let c0 = tj * self.cols;
        (r0..(r0 + self.rows).min(self.m), c0..(c0 + self.cols).min(self.n))
    }
}

/// Calls `f(i0, j0, rows, cols)` for the micro-tiles of a macro-tile, column
/// panels outer so one `kc×nr` panel of B stays in L1 across the row panels.
fn for_each_tile<T, P>(
    kern: &Kernel<T, P>,
    r: std::ops::Range<usize>,
    c: std::ops::Range<usize>,
    mut f: impl FnMut(usize, usize, usize, usize),
) {
    for j0 in c.clone().step_by(kern.nr) {
        for i0 in r.clone().step_by(kern.mr) {
            f(i0, j0, kern.mr.min(r.end - i0), kern.nr.min(c.end - j0));
        }
    }
}

/// Writes the `rows × cols` corner of the tile `acc` (row stride `nr`) to
/// output rows `i0..` and columns `j0..`, combining per `accum` and applying
/// the epilogue when given.
///
/// # Safety
/// The tile lies inside the output and no other thread writes it concurrently.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn store<T: GemmScalar>(
    acc: &[T],
    nr: usize,
    i0: usize,
    j0: usize,
    rows: usize,
    cols: usize,
    out: &OutPtr<T>,
    alpha: T,
    accum: Accum<T>,
    epi: Option<&Epilogue<T>>,
) {
    let scale = alpha != <T as FloatMath>::ONE;
    if out.cs == 1 && out.rs >= 0 {
        // Row slices, the combine hoisted out of the element loop (the
        // partial tiles of small products, e.g. attention's 65-key blocks):
        // the same operations in the same order as the loop below.
        for i in 0..rows {
            let row = out.at(i0 + i, j0);
            debug_assert!(row >= 0 && row as usize + cols <= out.len);
            // SAFETY: row i of the tile, in bounds and ours by the contract.
            let dst = unsafe { std::slice::from_raw_parts_mut(out.ptr.offset(row), cols) };
            let src = &acc[i * nr..i * nr + cols];
            let pairs = dst.iter_mut().zip(src);
            match (accum, scale) {
                (Accum::Overwrite, false) => dst.copy_from_slice(src),
                (Accum::Overwrite, true) => pairs.for_each(|(d, &v)| *d = alpha * v),
                (Accum::Add, false) => pairs.for_each(|(d, &v)| *d += v),
                (Accum::Add, true) => pairs.for_each(|(d, &v)| *d += alpha * v),
                (Accum::Scale(beta), false) => pairs.for_each(|(d, &v)| *d = beta * *d + v),
                (Accum::Scale(beta), true) => pairs.for_each(|(d, &v)| *d = beta * *d + alpha * v),
            }
        }
        if let Some(e) = epi {
            // SAFETY: the same block, as above.
            unsafe {
                epilogue_rows(
                    out.ptr.offset(out.at(i0, j0)),
                    out.rs as usize,
                    i0,
                    j0,
                    rows,
                    cols,
                    e,
                )
            };
        }
        return;
    }
    for i in 0..rows {
        let row = out.off as isize + (i0 + i) as isize * out.rs + j0 as isize * out.cs;
        for j in 0..cols {
            let idx = (row + j as isize * out.cs) as usize;
            debug_assert!(idx < out.len);
            // SAFETY: in bounds by the caller's contract; this tile is ours.
            let p = unsafe { out.ptr.add(idx) };
            let mut v = acc[i * nr + j];
            if scale {
                v = alpha * v;
            }
            v = match accum {
                Accum::Overwrite => v,
                // SAFETY: as above.
                Accum::Add => (unsafe { *p }) + v,
                // SAFETY: as above.
                Accum::Scale(beta) => beta * unsafe { *p } + v,
            };
            if let Some(e) = epi {
                match e.bias {
                    Bias::None => {}
                    Bias::Row(bias) => v += bias[i0 + i],
                    Bias::Col(bias) => v += bias[j0 + j],
                }
                if e.relu && v < <T as FloatMath>::ZERO {
                    v = <T as FloatMath>::ZERO;
                }
            }
            // SAFETY: as above.
            unsafe { *p = v };
        }
    }
}

/// Applies the epilogue to the `rows × cols` block at `c` (row stride
/// `ldc`, unit column stride), whose element (0, 0) is output `(i0, j0)`.
///
/// # Safety
/// The block lies inside the output and no other thread writes it concurrently.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn epilogue_rows<T: GemmScalar>(
    c: *mut T,
    ldc: usize,
    i0: usize,
    j0: usize,
    rows: usize,
    cols: usize,
    e: &Epilogue<T>,
) {
    for i in 0..rows {
        // SAFETY: row i of the block, ours by the caller's contract.
        let row = unsafe { std::slice::from_raw_parts_mut(c.add(i * ldc), cols) };
        match e.bias {
            Bias::None => {}
            Bias::Row(bias) => row.iter_mut().for_each(|v| *v += bias[i0 + i]),
            Bias::Col(bias) => row
                .iter_mut()
                .zip(&bias[j0..j0 + cols])
                .for_each(|(v, &b)| *v += b),
        }
        if e.relu {
            for v in row.iter_mut() {
                if *v < <T as FloatMath>::ZERO {
                    *v = <T as FloatMath>::ZERO;
                }
            }
        }
    }
}

/// The largest index a non-empty `m × n` view at `off` with strides
/// `(rs, cs)` touches, or `None` when it reaches below 0 (the tiles write
/// through raw pointers, so a bad view must stop here, not corrupt memory).
fn reach(off: usize, rs: isize, cs: isize, m: usize, n: usize) -> Option<usize> {
    let (dr, dc) = ((m as isize - 1) * rs, (n as isize - 1) * cs);
    let lo = off as isize + dr.min(0) + dc.min(0);
    let hi = off as isize + dr.max(0) + dc.max(0);
    (lo >= 0).then_some(hi as usize)
}
