//! bf16 micro-kernels over pair-packed panels (see [`super::bf16`]): each
//! unit is a `u32` holding two bf16 of consecutive depth, the even one in
//! the low half; products accumulate in f32. A panels are pair-major
//! (unit `(p, i)` at `p*mr + i`) except for AMX, whose A panels are tiles
//! (unit `(i, p)` at `(p/16)*16*mr + i*16 + p%16`, `kc` a multiple of
//! [`AMX_DEPTH_UNITS`]); B panels are pair-major (unit `(p, j)` at `p*nr + j`).

use std::sync::OnceLock;

use super::kernel::{Kernel, PairDirectFn, PairFusedFn};

/// Depth units (bf16 pairs) one AMX tile spans: 64-byte tile rows.
pub const AMX_DEPTH_UNITS: usize = 16;

/// The AMX kernel: a 32×32 output of four 16×16 f32 tiles.
pub fn amx_kernel() -> Kernel<f32, u32> {
    Kernel {
        mr: 32,
        nr: 32,
        mc: 128,
        // Deeper than the vector kernels' blocks: a tile call then has 32
        // steps to spread its fixed cost (zeroing, storing four tiles) over,
        // and a 1024-deep product needs no second block to add (measured:
        // 1024 beat 512 and 2048 at 1024³, under load).
        kc: 1024,
        nc: 2048,
        #[cfg(target_arch = "x86_64")]
        run: x86::amx,
        // Never called: `amx_unavailable` refuses every other target.
        #[cfg(not(target_arch = "x86_64"))]
        run: portable,
        edge: None,
    }
}

/// The AVX512-BF16 kernel: 8 rows × 2 vectors of 16 f32.
pub fn avx512bf16_kernel() -> Kernel<f32, u32> {
    Kernel {
        mr: 8,
        nr: 32,
        // A 2048-deep block (a 128 KiB B panel and a 256 KiB A block, both
        // in a 1 MiB L2) beat 1024 deep with 128 rows by 3–4% at 2048³ and
        // 4096³ on a 2-core Zen 4, alternating runs: half the C traffic.
        mc: 64,
        kc: 1024,
        nc: 2048,
        #[cfg(target_arch = "x86_64")]
        run: x86::avx512bf16,
        // Never called: `avx512bf16_unavailable` refuses every other target.
        #[cfg(not(target_arch = "x86_64"))]
        run: portable,
        edge: None,
    }
}

/// The AVX512-BF16 kernel reading a row-major A where it lies (the tile
/// and sum order of [`avx512bf16_kernel`]); `None` off x86-64.
pub fn avx512bf16_direct() -> Option<PairDirectFn> {
    #[cfg(target_arch = "x86_64")]
    return Some(x86::avx512bf16_direct);
    #[cfg(not(target_arch = "x86_64"))]
    return None;
}

/// The AVX512-BF16 kernel packing the B panel it reads from a row-major B
/// (the tile and sum order of [`avx512bf16_kernel`]); `None` off x86-64.
pub fn avx512bf16_fused() -> Option<PairFusedFn> {
    #[cfg(target_arch = "x86_64")]
    return Some(x86::avx512bf16_fused);
    #[cfg(not(target_arch = "x86_64"))]
    return None;
}

/// The portable kernel: a 4×8 tile in plain f32 arithmetic.
pub fn portable_kernel() -> Kernel<f32, u32> {
    Kernel {
        mr: 4,
        nr: 8,
        mc: 64,
        kc: 512,
        nc: 2048,
        run: portable,
        edge: None,
    }
}

/// Why this machine cannot run the AMX kernel (`None` when it can). The
/// first call asks Linux for permission to use the tile data state
/// (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`), which a process
/// needs before its first tile instruction.
pub fn amx_unavailable() -> Option<String> {
    static WHY: OnceLock<Option<String>> = OnceLock::new();
    WHY.get_or_init(amx_probe).clone()
}

/// Why this CPU cannot run the AVX512-BF16 kernel (`None` when it can).
pub fn avx512bf16_unavailable() -> Option<String> {
    #[cfg(target_arch = "x86_64")]
    {
        if is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512bf16")
        {
            return None;
        }
        Some("the CPU lacks AVX512-BF16 (vdpbf16ps) or AVX512-BW".into())
    }
    #[cfg(not(target_arch = "x86_64"))]
    Some("AVX512-BF16 is an x86-64 extension".into())
}

/// True where `vdpbf16ps` does no more multiply-adds per cycle than f32
/// FMAs: Intel cores issue it at half the rate of their two FMA pipes
/// (measured on a 2-core Emerald Rapids: `bf16_peak` 170 against
/// `fma_peak_f32` 348 GFLOP/s, and PyTorch's bf16 GEMM at the former),
/// where AMD's Zen 4 runs it at twice the FMA rate (468 against 231).
/// Read from the CPU vendor (CPUID leaf 0), so the choice it drives is the
/// same in every process on a machine.
pub(super) fn avx512bf16_half_rate() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let id = std::arch::x86_64::__cpuid(0);
        let vendor = [id.ebx, id.edx, id.ecx].map(u32::to_le_bytes).concat();
        vendor == b"GenuineIntel"
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn amx_probe() -> Option<String> {
    use std::arch::x86_64::__cpuid_count;
    let (max_leaf, leaf7) = (__cpuid_count(0, 0).eax, __cpuid_count(7, 0));
    let (amx_bf16, amx_tile) = (leaf7.edx >> 22 & 1 == 1, leaf7.edx >> 24 & 1 == 1);
    if max_leaf < 7 || !amx_bf16 || !amx_tile {
        return Some("the CPU lacks AMX-BF16 tiles (tdpbf16ps)".into());
    }
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a plain system call with integer arguments.
    let rc = unsafe { libc::syscall(libc::SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        return Some(format!("Linux refused the AMX tile state (arch_prctl: {err})"));
    }
    None
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn amx_probe() -> Option<String> {
    Some("AMX tiles are used on x86-64 Linux only (arch_prctl tile permission)".into())
}

/// The portable tile: per depth pair, the odd product then the even one is
/// added to the f32 accumulator (the order `vdpbf16ps` documents; products
/// of two bf16 are exact in f32).
///
/// # Safety
/// The contract of [`super::kernel::KernelFn`] with the pair-major panels
/// of this module.
unsafe fn portable(kc: usize, a: *const u32, b: *const u32, c: *mut f32, ldc: usize, add: bool) {
    const MR: usize = 4;
    const NR: usize = 8;
    let lo = |u: u32| f32::from_bits(u << 16);
    let hi = |u: u32| f32::from_bits(u & 0xffff_0000);
    let mut acc = [[0f32; NR]; MR];
    for p in 0..kc {
        // SAFETY: the caller guarantees kc*MR units behind `a` and kc*NR behind `b`.
        let (av, bv) = unsafe {
            (
                a.add(p * MR).cast::<[u32; MR]>().read_unaligned(),
                b.add(p * NR).cast::<[u32; NR]>().read_unaligned(),
            )
        };
        for i in 0..MR {
            for j in 0..NR {
                acc[i][j] += hi(av[i]) * hi(bv[j]);
                acc[i][j] += lo(av[i]) * lo(bv[j]);
            }
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

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;
    use std::arch::x86_64::*;

    use super::super::kernel::PairRows;
    use super::super::pack::prefetch_line_for_write;
    use crate::bf16;

    /// 8 rows × 32 columns: per depth pair, two vectors of B (16 column
    /// pairs each) and one broadcast pair of A per row.
    ///
    /// # Safety
    /// The contract of [`super::super::kernel::KernelFn`] with pair-major
    /// panels, on a CPU with AVX512-BF16.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn avx512bf16(kc: usize, a: *const u32, b: *const u32, c: *mut f32, ldc: usize, add: bool) {
        // SAFETY: pair p of row i is unit p*8 + i of the panel (the contract).
        unsafe { avx512bf16_tile(kc, |i, p| a.add(p * 8 + i), packed(b), c, ldc, add) }
    }

    /// [`avx512bf16`] with A read where it lies: the pair of depths `2p`,
    /// `2p + 1` of row `i` is the two bf16 at `a + i*lda + 2p`, which are
    /// the unit of the packed panel (even depth in the low half), so every
    /// element is summed exactly as [`avx512bf16`] sums it.
    ///
    /// # Safety
    /// The contract of [`super::super::kernel::PairDirectFn`], on a CPU with
    /// AVX512-BF16.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub unsafe fn avx512bf16_direct(
        kc: usize,
        a: *const bf16,
        lda: usize,
        b: *const u32,
        c: *mut f32,
        ldc: usize,
        add: bool,
    ) {
        let rows: [*const bf16; 8] = std::array::from_fn(|i| a.wrapping_add(i * lda));
        // SAFETY: rows i < 8 hold 2*kc elements from `a + i*lda` (the contract).
        unsafe {
            avx512bf16_tile(
                kc,
                |i, p| rows[i].add(2 * p).cast::<u32>(),
                packed(b),
                c,
                ldc,
                add,
            )
        }
    }

    /// [`avx512bf16`] with A's units where `a` says and B's pairs
    /// interleaved from two rows of a row-major B per depth pair (a
    /// permute of 16-bit lanes each), stored to `panel` in the packed
    /// order and used at once: the same units in the same order as the
    /// packed kernels read, so the same sums.
    ///
    /// # Safety
    /// The contract of [`super::super::kernel::PairFusedFn`], on a CPU with
    /// AVX512-BW and AVX512-BF16.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn avx512bf16_fused(
        kc: usize,
        a: PairRows,
        b: *const bf16,
        ldb: usize,
        panel: *mut u32,
        c: *mut f32,
        ldc: usize,
        add: bool,
    ) {
        /// Lane `2j` takes column `j` of the even row (index `j`), lane
        /// `2j + 1` column `j` of the odd one (index `32 + j`), for the
        /// columns from `first`.
        const fn pairs_from(first: u16) -> [u16; 32] {
            let mut idx = [0; 32];
            let mut t = 0;
            while t < 32 {
                idx[t] = first + (t as u16 / 2) + if t % 2 == 1 { 32 } else { 0 };
                t += 1;
            }
            idx
        }
        const LOW: [u16; 32] = pairs_from(0);
        const HIGH: [u16; 32] = pairs_from(16);
        // B's rows are a stride apart that the hardware prefetchers catch
        // late; ask for them this many depth pairs ahead.
        const AHEAD: usize = 8;
        // SAFETY: the index tables are 64 bytes each.
        let (low, high) = unsafe {
            (
                _mm512_loadu_si512(LOW.as_ptr().cast()),
                _mm512_loadu_si512(HIGH.as_ptr().cast()),
            )
        };
        let b_at = |p: usize| {
            // SAFETY: rows 2p and 2p + 1 hold the tile's 32 columns and
            // `panel` kc*32 units (the contract); prefetches never fault.
            unsafe {
                let even = b.add(2 * p * ldb);
                if p + AHEAD < kc {
                    for row in [even.add(2 * AHEAD * ldb), even.add((2 * AHEAD + 1) * ldb)] {
                        _mm_prefetch::<_MM_HINT_T0>(row.cast());
                        _mm_prefetch::<_MM_HINT_T0>(row.cast::<i8>().add(63));
                    }
                }
                let (x0, x1) = (
                    _mm512_loadu_si512(even.cast()),
                    _mm512_loadu_si512(even.add(ldb).cast()),
                );
                let (u0, u1) = (
                    _mm512_permutex2var_epi16(x0, low, x1),
                    _mm512_permutex2var_epi16(x0, high, x1),
                );
                _mm512_storeu_si512(panel.add(p * 32).cast(), u0);
                _mm512_storeu_si512(panel.add(p * 32 + 16).cast(), u1);
                std::mem::transmute::<[__m512i; 2], [__m512bh; 2]>([u0, u1])
            }
        };
        // SAFETY: A's units where `a` says (the contract).
        unsafe {
            avx512bf16_tile(
                kc,
                |i, p| a.at.add(i * a.row + p * a.pair).cast::<u32>(),
                b_at,
                c,
                ldc,
                add,
            )
        }
    }

    /// The B of the packed kernels: pair `p`'s 32 units at `b + 32p`.
    ///
    /// # Safety
    /// `b` holds the `kc*32` units of the panel the tile reads.
    #[inline(always)]
    unsafe fn packed(b: *const u32) -> impl Fn(usize) -> [__m512bh; 2] {
        // SAFETY: pair p < kc lies in the panel (the contract); __m512i and
        // __m512bh are both 64 plain bytes.
        move |p| unsafe {
            let bp = b.add(p * 32);
            std::mem::transmute::<[__m512i; 2], [__m512bh; 2]>([
                _mm512_loadu_si512(bp.cast()),
                _mm512_loadu_si512(bp.add(16).cast()),
            ])
        }
    }

    /// The 8×32 tile over A's pair `(i, p)` at `a_at(i, p)` (possibly
    /// unaligned) and B's two vectors of pair `p` from `b_at(p)`: the loop
    /// every AVX512-BF16 kernel shares, so they sum alike.
    ///
    /// # Safety
    /// `a_at(i, p)` is readable for `i < 8`, `p < kc`, `b_at(p)` safe to
    /// call for `p < kc`; C as for [`super::super::kernel::KernelFn`];
    /// called from a function enabling AVX512-BF16.
    #[inline(always)]
    unsafe fn avx512bf16_tile(
        kc: usize,
        a_at: impl Fn(usize, usize) -> *const u32,
        b_at: impl Fn(usize) -> [__m512bh; 2],
        c: *mut f32,
        ldc: usize,
        add: bool,
    ) {
        const MR: usize = 8;
        const NR: usize = 32;
        // Fetch C's lines for writing, so the tile's stores find them owned
        // instead of asking for ownership when the sums are done (measured
        // against read prefetches at 1024³ on Zen 4: +1.8% on one core,
        // +0.5–1.2% on two).
        for i in 0..MR {
            prefetch_line_for_write(c.wrapping_add(i * ldc).cast());
            prefetch_line_for_write(c.wrapping_add(i * ldc + NR - 1).cast());
        }
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        for p in 0..kc {
            let [b0, b1] = b_at(p);
            // SAFETY: A's pairs as the caller guarantees; __m512i and
            // __m512bh are both 64 plain bytes.
            unsafe {
                for (i, acc) in acc.iter_mut().enumerate() {
                    let pair = a_at(i, p).read_unaligned();
                    let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(pair as i32));
                    acc[0] = _mm512_dpbf16_ps(acc[0], av, b0);
                    acc[1] = _mm512_dpbf16_ps(acc[1], av, b1);
                }
            }
        }
        for (i, acc) in acc.iter().enumerate() {
            for (v, &x) in acc.iter().enumerate() {
                // SAFETY: the caller guarantees the tile behind `c`.
                unsafe {
                    let dst = c.add(i * ldc + v * 16);
                    let x = if add {
                        _mm512_add_ps(_mm512_loadu_ps(dst), x)
                    } else {
                        x
                    };
                    _mm512_storeu_ps(dst, x);
                }
            }
        }
    }

    /// The AMX tile configuration: palette 1; tiles 0–3 the 16×16 f32
    /// outputs, 4–5 two 16-row blocks of A, 6–7 two 16-column blocks of B,
    /// each 16 rows of 64 bytes.
    #[repr(C, align(64))]
    struct TileConfig {
        palette: u8,
        start_row: u8,
        reserved: [u8; 14],
        colsb: [u16; 16],
        rows: [u8; 16],
    }

    static CONFIG: TileConfig = TileConfig {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        colsb: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
        rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
    };

    thread_local! {
        /// Whether this thread has loaded [`CONFIG`] into its tile state.
        static CONFIGURED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// The AMX kernel: loads the tile configuration the first time a thread
    /// runs it (tile registers and their configuration are per thread, so
    /// every rayon worker and calling thread loads its own) and keeps it
    /// for the thread's later tiles: reloading it and `tilerelease` on every
    /// tile cost 15–40% of the 1024³ product (measured under load). Nothing
    /// else in the process configures tiles, so the configuration stays
    /// ours; the OS saves and restores it with the thread's state.
    ///
    /// # Safety
    /// As [`amx_body`].
    pub unsafe fn amx(kc: usize, a: *const u32, b: *const u32, c: *mut f32, ldc: usize, add: bool) {
        // SAFETY: the configuration is a valid palette-1 layout; the tile
        // instructions run on a CPU and OS that allow them (the contract).
        unsafe {
            if !CONFIGURED.get() {
                asm!("ldtilecfg [{}]", in(reg) &CONFIG, options(nostack, readonly));
                CONFIGURED.set(true);
            }
            amx_body(kc, a, b, c, ldc, add);
        }
    }

    /// 32 rows × 32 columns in four f32 tiles, 16 depth pairs per step:
    /// `tmm(2r + c) += A rows 16r.. · B columns 16c..`.
    ///
    /// # Safety
    /// The contract of [`super::super::kernel::KernelFn`] with tiled A
    /// panels (`kc` a multiple of 16), on a CPU with AMX-BF16 whose tile
    /// state the OS granted (`amx_unavailable` returned `None`), with
    /// [`CONFIG`] loaded on this thread.
    #[target_feature(enable = "avx512f")]
    unsafe fn amx_body(kc: usize, a: *const u32, b: *const u32, c: *mut f32, ldc: usize, add: bool) {
        let (sa, sb) = (16usize * 4, 32usize * 4);
        // SAFETY (all blocks): tiles read and write only the panels and the
        // 32×32 tile of C the caller guarantees; the tile registers are
        // unknown to the compiler, so they keep their values between blocks.
        unsafe {
            asm!(
                "tilezero tmm0",
                "tilezero tmm1",
                "tilezero tmm2",
                "tilezero tmm3",
                options(nomem, nostack)
            );
            for q in (0..kc).step_by(super::AMX_DEPTH_UNITS) {
                asm!(
                    "tileloadd tmm4, [{a0} + {sa}*1]",
                    "tileloadd tmm5, [{a1} + {sa}*1]",
                    "tileloadd tmm6, [{b0} + {sb}*1]",
                    "tileloadd tmm7, [{b0} + {sb}*1 + 64]",
                    "tdpbf16ps tmm0, tmm4, tmm6",
                    "tdpbf16ps tmm1, tmm4, tmm7",
                    "tdpbf16ps tmm2, tmm5, tmm6",
                    "tdpbf16ps tmm3, tmm5, tmm7",
                    a0 = in(reg) a.add(q * 32), a1 = in(reg) a.add(q * 32 + 256),
                    b0 = in(reg) b.add(q * 32), sa = in(reg) sa, sb = in(reg) sb,
                    options(nostack, readonly),
                );
            }
            // The tile sums start from zero and are added to C afterwards,
            // as every kernel does, so a tile rounds the same whether the
            // driver hands it C or its own buffer.
            let mut sums = [0f32; 32 * 32];
            let (dst, ld) = if add { (sums.as_mut_ptr(), 32) } else { (c, ldc) };
            let (d2, sd) = (dst.add(16 * ld), ld * 4);
            asm!(
                "tilestored [{d} + {s}*1], tmm0",
                "tilestored [{d} + {s}*1 + 64], tmm1",
                "tilestored [{d2} + {s}*1], tmm2",
                "tilestored [{d2} + {s}*1 + 64], tmm3",
                d = in(reg) dst, d2 = in(reg) d2, s = in(reg) sd,
                options(nostack),
            );
            if add {
                for (i, row) in sums.chunks_exact(32).enumerate() {
                    let out = std::slice::from_raw_parts_mut(c.add(i * ldc), 32);
                    out.iter_mut().zip(row).for_each(|(o, &v)| *o += v);
                }
            }
        }
    }
}
