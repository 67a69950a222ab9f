//! GEMM micro-kernels: `MR×NR` register tiles over packed panels, one per
//! instruction-set level, chosen at run time.
//!
//! A kernel is a plain function pointer in a [`Kernel`] record together with
//! its tile shape and cache-block sizes, so a faster kernel (hand-written
//! intrinsics, another ISA) replaces one entry without touching the driver.

use std::sync::OnceLock;

use crate::{Element, FloatMath};

#[cfg(target_arch = "x86_64")]
mod direct_asm;

/// An instruction-set level a micro-kernel is compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// AVX-512F with FMA (x86-64).
    Avx512,
    /// AVX2 with FMA (x86-64).
    Avx2,
    /// Whatever the compile target guarantees (SSE2 on x86-64, NEON on aarch64).
    Portable,
}

impl Isa {
    /// The level every GEMM and convolution uses: the fastest this CPU
    /// supports, or the one `TESSERA_GEMM_ISA` (`avx512`, `avx2`,
    /// `portable`) names when the CPU supports it, so test runs can force
    /// each kernel path (read once).
    pub fn best() -> Isa {
        static BEST: OnceLock<Isa> = OnceLock::new();
        *BEST.get_or_init(|| {
            let forced = std::env::var("TESSERA_GEMM_ISA")
                .ok()
                .and_then(|v| Isa::parse(&v));
            forced.filter(|i| i.supported()).unwrap_or(Isa::available()[0])
        })
    }

    /// The level named `avx512`, `avx2` or `portable` (any case).
    pub fn parse(name: &str) -> Option<Isa> {
        match name.to_ascii_lowercase().as_str() {
            "avx512" => Some(Isa::Avx512),
            "avx2" => Some(Isa::Avx2),
            "portable" => Some(Isa::Portable),
            _ => None,
        }
    }

    /// True when this CPU can run kernels of this level.
    pub fn supported(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"),
            Isa::Portable => true,
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Every level this CPU can run, fastest first.
    pub fn available() -> Vec<Isa> {
        [Isa::Avx512, Isa::Avx2, Isa::Portable]
            .into_iter()
            .filter(|i| i.supported())
            .collect()
    }
}

/// Computes the tile `acc[i][j] = Σ_{p<kc} a[p*mr + i] · b[p*nr + j]` (in
/// `p` order, from zero) and writes `c[i*ldc + j] = acc[i][j]`, or
/// `c[i*ldc + j] + acc[i][j]` when `add`. `T` is the accumulator and output
/// type, `P` one unit of a packed panel (`T` itself, or a pair of bf16 for
/// the low-precision kernels of `bf16_kernel`, whose `kc` counts units and
/// whose panel order each kernel states).
///
/// # Safety
/// `a` holds `kc*mr` and `b` holds `kc*nr` units, `c[i*ldc + j]` is
/// writable (and readable when `add`) for every `i < mr`, `j < nr`, and the
/// CPU supports the kernel's instructions.
pub type KernelFn<T, P = T> =
    unsafe fn(kc: usize, a: *const P, b: *const P, c: *mut T, ldc: usize, add: bool);

/// Picks the routine for a partial tile of `rows × cols` (`1 ≤ rows ≤ mr`,
/// `1 ≤ cols ≤ nr`): a smaller register tile that reads the same packed
/// panels and writes at least the `rows × cols` corner of the tile (row
/// stride `ldc`), each element summed exactly as the full tile sums it. A
/// 65-column product then spends an eighth, not a third, of its time on
/// its last column.
pub type EdgeFn<T, P = T> = fn(rows: usize, cols: usize) -> KernelFn<T, P>;

/// A micro-kernel with its register tile (`mr × nr`) and the cache blocks the
/// driver uses with it: `kc` (depth of a packed panel, so a `kc×nr` panel of B
/// stays in L1), `mc` (rows of A per task, so an `mc×kc` block stays in L2)
/// and `nc` (columns of B packed at once, sized for L3).
#[derive(Clone, Copy)]
pub struct Kernel<T, P = T> {
    /// Rows of the register tile.
    pub mr: usize,
    /// Columns of the register tile.
    pub nr: usize,
    /// Rows of A per task.
    pub mc: usize,
    /// Greatest depth of a packed panel (the driver splits the depth into
    /// equal blocks no deeper than this).
    pub kc: usize,
    /// Columns of B packed at once.
    pub nc: usize,
    /// The tile routine.
    pub run: KernelFn<T, P>,
    /// The routines of partial tiles, where the kernel has them (`run`
    /// serves every tile otherwise).
    pub edge: Option<EdgeFn<T, P>>,
}

/// The largest `mr * nr` of any kernel (the AMX tile pair of `bf16_kernel`):
/// the size of the driver's tile buffer.
pub const MAX_TILE: usize = 32 * 32;

/// Computes the same tile as [`KernelFn`] with the operands read where they
/// lie instead of from packed panels: element `(i, p)` of A at
/// `a[i*lda + p]`, element `(p, j)` of B at `b[p*ldb + j]` (row-major
/// operands of a small GEMM, which packing would only copy).
///
/// # Safety
/// Those elements are readable for every `i < mr`, `p < kc`, `j < nr`, the
/// tile of `c` as for [`KernelFn`], and the CPU supports the kernel's
/// instructions.
pub type DirectFn<T> =
    unsafe fn(kc: usize, a: *const T, lda: usize, b: *const T, ldb: usize, c: *mut T, ldc: usize, add: bool);

/// Computes the same tile as [`DirectFn`], B read where it lies, and
/// copies each row of B it reads into a packed panel as it goes:
/// `panel[p*nr + j] = b[p*ldb + j]`. The first tile over a panel packs it
/// with its own arithmetic hiding the copy, where a pass of its own would
/// wait on B's rows arriving from L3 (a stride apart, which the hardware
/// prefetchers catch late; the routine prefetches the rows ahead).
///
/// # Safety
/// As [`DirectFn`]'s, and `panel` is writable for `kc*nr` elements and
/// disjoint from the operands.
pub type DirectPackFn<T> = unsafe fn(
    kc: usize,
    a: *const T,
    lda: usize,
    b: *const T,
    ldb: usize,
    panel: *mut T,
    c: *mut T,
    ldc: usize,
    add: bool,
);

/// Computes the same tile as a pair kernel ([`KernelFn`] over `P` units
/// holding two elements of `S` each, `T` sums) with A read where it lies:
/// the unit of depths `2p`, `2p + 1` of row `i` is the two elements at
/// `a[i*lda + 2p]` (the rows of a row-major bf16 A are pairs in order
/// already, so packing would only copy them).
///
/// # Safety
/// `a[i*lda + d]` is readable for every `i < mr`, `d < 2*kc`; B and the
/// tile of `c` as for [`KernelFn`]; the CPU supports the kernel's
/// instructions.
pub type PairDirectFn<S = crate::bf16, P = u32, T = f32> =
    unsafe fn(kc: usize, a: *const S, lda: usize, b: *const P, c: *mut T, ldc: usize, add: bool);

/// Where the A units of one pair-kernel tile lie: the unit of row `i` and
/// depth pair `p` at `at + i*row + p*pair` bytes (a packed panel, or the
/// rows of a row-major A read in place).
#[derive(Clone, Copy)]
pub struct PairRows {
    /// The unit of row 0, pair 0.
    pub at: *const u8,
    /// Bytes from one row's unit to the next row's.
    pub row: usize,
    /// Bytes from one depth pair's unit to the next one's.
    pub pair: usize,
}

/// Computes the same tile as a pair kernel ([`KernelFn`], `kc` units of
/// depth) with A's units at `a` and B read from the rows of a row-major
/// matrix: the unit of depth pair `p`, column `j` holds `b[2p*ldb + j]`
/// (low half) and `b[(2p+1)*ldb + j]`. It writes that unit to
/// `panel[p*nr + j]` as it goes, so the tile that first needs a B panel
/// packs it, overlapped with its own arithmetic, where a separate pass
/// would stall on B's rows arriving from memory.
///
/// # Safety
/// `a`'s units are readable for every `i < mr`, `p < kc`; `b[d*ldb + j]`
/// for every `d < 2*kc`, `j < nr`; `panel` writable for `kc*nr` units and
/// disjoint from the operands; the tile of `c` as for [`KernelFn`]; the
/// CPU supports the kernel's instructions.
pub type PairFusedFn<S = crate::bf16, P = u32, T = f32> = unsafe fn(
    kc: usize,
    a: PairRows,
    b: *const S,
    ldb: usize,
    panel: *mut P,
    c: *mut T,
    ldc: usize,
    add: bool,
);

/// The direct kernels of one [`Isa`]: a register tile of `mr` rows, and
/// its first rows alone, each summed as the whole tile sums it (reading
/// only those rows of A and writing only those rows of C), so a GEMM can
/// cut its rows into panels of any height up to `mr`.
#[derive(Clone, Copy)]
pub struct Direct<T> {
    /// Rows of the tile. It can be taller than the packed kernel's, whose
    /// panels of A have that kernel's height: a taller tile reads each row
    /// of B — from L2 here, not from a packed panel in L1 — for more rows
    /// of A (14 against 8 rows of f32 on AVX-512: at 512³ on the 2-core
    /// Xeon, 1 thread, interleaved, 72 -> 80 GFLOP/s median when the VM
    /// is slow).
    pub mr: usize,
    /// The routines of the first `rows` rows of the tile (`1 ≤ rows ≤ mr`).
    pub rows: fn(rows: usize) -> DirectRows<T>,
}

/// The direct routines of one tile height.
#[derive(Clone, Copy)]
pub struct DirectRows<T> {
    /// The tile, B read where it lies or from a packed panel.
    pub tile: DirectFn<T>,
    /// The tile, B read where it lies and copied into a packed panel.
    pub packing: DirectPackFn<T>,
}

/// A float type the GEMM computes in natively (f32 and f64).
pub trait GemmScalar: FloatMath + Element + bytemuck::Pod {
    /// The micro-kernel for `isa`.
    fn kernel(isa: Isa) -> Kernel<Self>;

    /// The unpacked-operand kernel for `isa`, where there is one: the
    /// register tile of [`GemmScalar::kernel`] and the same per-element
    /// operation order, so a tile sums bit for bit as the packed kernel
    /// sums it.
    fn direct(isa: Isa) -> Option<Direct<Self>>;
}

impl GemmScalar for f32 {
    fn kernel(isa: Isa) -> Kernel<f32> {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Kernel {
                mr: 8,
                nr: 32,
                mc: 128,
                kc: 256,
                nc: 2048,
                run: x86::f32_avx512::PACKED,
                edge: Some(x86::f32_avx512::edge),
            },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => Kernel {
                mr: 6,
                nr: 16,
                mc: 120,
                kc: 256,
                nc: 2048,
                run: x86::f32_avx2::PACKED,
                edge: Some(x86::f32_avx2::edge),
            },
            _ => Kernel {
                mr: 4,
                nr: 8,
                mc: 64,
                kc: 256,
                nc: 2048,
                run: f32_portable,
                edge: None,
            },
        }
    }

    fn direct(isa: Isa) -> Option<Direct<f32>> {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Some(direct_asm::F32_AVX512),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => Some(x86::f32_avx2::DIRECT),
            _ => None,
        }
    }
}

impl GemmScalar for f64 {
    fn kernel(isa: Isa) -> Kernel<f64> {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Kernel {
                mr: 8,
                nr: 16,
                mc: 96,
                kc: 256,
                nc: 1024,
                run: x86::f64_avx512::PACKED,
                edge: Some(x86::f64_avx512::edge),
            },
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => Kernel {
                mr: 6,
                nr: 8,
                mc: 96,
                kc: 256,
                nc: 1024,
                run: x86::f64_avx2::PACKED,
                edge: Some(x86::f64_avx2::edge),
            },
            _ => Kernel {
                mr: 4,
                nr: 4,
                mc: 64,
                kc: 256,
                nc: 1024,
                run: f64_portable,
                edge: None,
            },
        }
    }

    fn direct(isa: Isa) -> Option<Direct<f64>> {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Some(direct_asm::F64_AVX512),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => Some(x86::f64_avx2::DIRECT),
            _ => None,
        }
    }
}

/// The portable register tile in plain arrays, small enough for the
/// baseline vector registers (separate multiply and add: a fused one is a
/// library call without the `fma` target feature).
#[inline(always)]
unsafe fn tile<T: GemmScalar, const MR: usize, const NR: usize>(
    kc: usize,
    mut a: *const T,
    mut b: *const T,
    c: *mut T,
    ldc: usize,
    add: bool,
) {
    let mut acc = [[<T as FloatMath>::ZERO; NR]; MR];
    for _ in 0..kc {
        // SAFETY: the caller guarantees kc*MR elements behind `a` and kc*NR behind `b`.
        let (av, bv) = unsafe {
            (
                a.cast::<[T; MR]>().read_unaligned(),
                b.cast::<[T; NR]>().read_unaligned(),
            )
        };
        for i in 0..MR {
            for j in 0..NR {
                acc[i][j] += av[i] * bv[j];
            }
        }
        // SAFETY: stays within (or one past) the panels.
        unsafe {
            a = a.add(MR);
            b = b.add(NR);
        }
    }
    for (i, row) in acc.iter().enumerate() {
        // SAFETY: the caller guarantees row i of the tile behind `c`.
        let dst = unsafe { std::slice::from_raw_parts_mut(c.add(i * ldc), NR) };
        for (d, &v) in dst.iter_mut().zip(row) {
            *d = if add { *d + v } else { v };
        }
    }
}

unsafe fn f32_portable(kc: usize, a: *const f32, b: *const f32, c: *mut f32, ldc: usize, add: bool) {
    // SAFETY: forwarded contract of `KernelFn`.
    unsafe { tile::<f32, 4, 8>(kc, a, b, c, ldc, add) }
}

unsafe fn f64_portable(kc: usize, a: *const f64, b: *const f64, c: *mut f64, ldc: usize, add: bool) {
    // SAFETY: forwarded contract of `KernelFn`.
    unsafe { tile::<f64, 4, 4>(kc, a, b, c, ldc, add) }
}

/// Register tiles with explicit vector intrinsics: LLVM's auto-vectoriser
/// does not keep a plain-array tile of this size in registers.
#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Rows of B ahead of the one it reads that a packing direct kernel
    /// prefetches: a few hundred cycles of arithmetic, an L3 access.
    const AHEAD: usize = 16;

    /// Defines a kernel with `$mr` rows and `$nv` vectors of `$w` lanes per
    /// row, and its direct kernel of `$dmr` rows with the routines of its
    /// first `$dr` rows (every count from 1 to `$dmr`): `$set1` broadcasts
    /// an element of A, `$fma` multiplies-adds.
    macro_rules! simd_kernel {
        ($name:ident, $feat:literal, $t:ty, $mr:literal, $nv:literal, $w:literal,
         direct $dmr:literal [$($dr:literal),*],
         $zero:ident, $load:ident, $store:ident, $set1:ident, $fma:ident, $add:ident) => {
            /// One register tile in two addressings.
            pub mod $name {
                use super::*;

                /// The packed kernel ([`super::super::KernelFn`]): the
                /// whole register tile.
                pub const PACKED: super::super::KernelFn<$t> = part::<$mr, $nv>;

                /// The partial-tile routines ([`super::super::EdgeFn`]):
                /// one row, half the rows or all of them, by one vector or
                /// all of them — the fewest that cover `rows × cols`.
                pub fn edge(rows: usize, cols: usize) -> super::super::KernelFn<$t> {
                    const HALF: usize = $mr / 2;
                    match (rows, cols <= $w) {
                        (1, true) => part::<1, 1>,
                        (1, false) => part::<1, $nv>,
                        (r, true) if r <= HALF => part::<HALF, 1>,
                        (r, false) if r <= HALF => part::<HALF, $nv>,
                        (_, true) => part::<$mr, 1>,
                        _ => part::<$mr, $nv>,
                    }
                }

                /// The first `MR` rows and `NV` vectors of the packed
                /// kernel's tile, from the same panels.
                ///
                /// # Safety
                /// As [`super::super::KernelFn`]'s.
                #[target_feature(enable = $feat)]
                unsafe fn part<const MR: usize, const NV: usize>(
                    kc: usize,
                    a: *const $t,
                    b: *const $t,
                    c: *mut $t,
                    ldc: usize,
                    add: bool,
                ) {
                    // SAFETY: packed panels are the strided operands with
                    // A's rows one unit apart and depth steps mr (A), nr (B);
                    // this tile reads and writes a corner of the full one.
                    unsafe { tile::<MR, NV, false>(kc, a, 1, $mr, b, $nv * $w, std::ptr::null_mut(), c, ldc, add) }
                }

                /// The direct kernels: the whole tile of `$dmr` rows and
                /// its first rows.
                pub const DIRECT: super::super::Direct<$t> = super::super::Direct {
                    mr: $dmr,
                    rows: direct_rows,
                };

                /// The direct routines of the first `rows` rows of the tile.
                fn direct_rows(rows: usize) -> super::super::DirectRows<$t> {
                    match rows {
                        $($dr => super::super::DirectRows {
                            tile: direct::<$dr>,
                            packing: direct_packing::<$dr>,
                        },)*
                        _ => panic!("gemm: no direct kernel of {rows} rows"),
                    }
                }

                /// The first `MR` rows of the direct kernel's tile
                /// ([`super::super::DirectFn`]).
                #[target_feature(enable = $feat)]
                #[allow(clippy::too_many_arguments)]
                unsafe fn direct<const MR: usize>(
                    kc: usize,
                    a: *const $t,
                    lda: usize,
                    b: *const $t,
                    ldb: usize,
                    c: *mut $t,
                    ldc: usize,
                    add: bool,
                ) {
                    // SAFETY: the contract of `DirectFn`.
                    unsafe { tile::<MR, $nv, false>(kc, a, lda, 1, b, ldb, std::ptr::null_mut(), c, ldc, add) }
                }

                /// The first `MR` rows of the direct kernel's tile, packing
                /// B's panel ([`super::super::DirectPackFn`]).
                #[target_feature(enable = $feat)]
                #[allow(clippy::too_many_arguments)]
                unsafe fn direct_packing<const MR: usize>(
                    kc: usize,
                    a: *const $t,
                    lda: usize,
                    b: *const $t,
                    ldb: usize,
                    panel: *mut $t,
                    c: *mut $t,
                    ldc: usize,
                    add: bool,
                ) {
                    // SAFETY: the contract of `DirectPackFn`.
                    unsafe { tile::<MR, $nv, true>(kc, a, lda, 1, b, ldb, panel, c, ldc, add) }
                }

                /// The `MR × NV` register tile over strided operands: A's
                /// element `(i, p)` at `a[i*ars + p*aps]`, B's `(p, j)` at
                /// `b[p*bps + j]`, inlined into every kernel with its
                /// constant strides, so each compiles its own addressing.
                /// With `PACK` it also copies B's row `p` to
                /// `panel[p*nr..][..nr]`, prefetching the rows ahead.
                ///
                /// # Safety
                /// As the kernels', and only ever inlined into them
                /// (`inline(always)`), whose target features its intrinsics
                /// need; with `PACK`, `panel` writable for `kc*nr` elements.
                #[inline(always)]
                #[allow(clippy::too_many_arguments)]
                unsafe fn tile<const MR: usize, const NV: usize, const PACK: bool>(
                    kc: usize,
                    a: *const $t,
                    ars: usize,
                    aps: usize,
                    b: *const $t,
                    bps: usize,
                    panel: *mut $t,
                    c: *mut $t,
                    ldc: usize,
                    add: bool,
                ) {
                    let nr = NV * $w;
                    // Fetch the C tile while the products run (its rows are
                    // far apart, beyond the hardware prefetcher's reach).
                    for i in 0..MR {
                        // SAFETY: prefetches never fault; the addresses are in the tile.
                        unsafe {
                            let row = c.add(i * ldc).cast::<i8>();
                            _mm_prefetch::<_MM_HINT_T0>(row);
                            _mm_prefetch::<_MM_HINT_T0>(row.add(nr * size_of::<$t>() - 1));
                        }
                    }
                    // SAFETY: the kernels inlining this have the features.
                    let mut acc = [[unsafe { $zero() }; NV]; MR];
                    for p in 0..kc {
                        // SAFETY: the callers guarantee the elements of A and B
                        // these strides reach for i < mr, p < kc, j < nr.
                        unsafe {
                            let bp = b.add(p * bps);
                            let bv: [_; NV] = std::array::from_fn(|v| $load(bp.add(v * $w)));
                            if PACK {
                                // B's rows `AHEAD` on: prefetches never fault.
                                let ahead = bp.wrapping_add(AHEAD * bps).cast::<i8>();
                                _mm_prefetch::<_MM_HINT_T0>(ahead);
                                _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(nr * size_of::<$t>() - 1));
                                for v in 0..NV {
                                    $store(panel.add(p * nr + v * $w), bv[v]);
                                }
                            }
                            let ap = a.add(p * aps);
                            for i in 0..MR {
                                let av = $set1(*ap.add(i * ars));
                                for v in 0..NV {
                                    acc[i][v] = $fma(av, bv[v], acc[i][v]);
                                }
                            }
                        }
                    }
                    for i in 0..MR {
                        for v in 0..NV {
                            // SAFETY: the caller guarantees the tile behind `c`.
                            unsafe {
                                let dst = c.add(i * ldc + v * $w);
                                let x = if add {
                                    $add($load(dst), acc[i][v])
                                } else {
                                    acc[i][v]
                                };
                                $store(dst, x);
                            }
                        }
                    }
                }
            }
        };
    }

    simd_kernel!(
        f32_avx512,
        "avx512f,avx2,fma",
        f32,
        8,
        2,
        16,
        direct 14 [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14],
        _mm512_setzero_ps,
        _mm512_loadu_ps,
        _mm512_storeu_ps,
        _mm512_set1_ps,
        _mm512_fmadd_ps,
        _mm512_add_ps
    );
    simd_kernel!(
        f64_avx512,
        "avx512f,avx2,fma",
        f64,
        8,
        2,
        8,
        direct 8 [1, 2, 3, 4, 5, 6, 7, 8],
        _mm512_setzero_pd,
        _mm512_loadu_pd,
        _mm512_storeu_pd,
        _mm512_set1_pd,
        _mm512_fmadd_pd,
        _mm512_add_pd
    );
    simd_kernel!(
        f32_avx2,
        "avx2,fma",
        f32,
        6,
        2,
        8,
        direct 6 [1, 2, 3, 4, 5, 6],
        _mm256_setzero_ps,
        _mm256_loadu_ps,
        _mm256_storeu_ps,
        _mm256_set1_ps,
        _mm256_fmadd_ps,
        _mm256_add_ps
    );
    simd_kernel!(
        f64_avx2,
        "avx2,fma",
        f64,
        6,
        2,
        4,
        direct 6 [1, 2, 3, 4, 5, 6],
        _mm256_setzero_pd,
        _mm256_loadu_pd,
        _mm256_storeu_pd,
        _mm256_set1_pd,
        _mm256_fmadd_pd,
        _mm256_add_pd
    );
}
