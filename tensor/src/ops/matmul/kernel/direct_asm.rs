//! The AVX-512 direct tiles in assembly.
//!
//! A direct tile reads A where it lies, each of its rows `lda` apart, and
//! compiled from intrinsics LLVM rebuilds every row's address at every
//! step of the depth: on the 14-row f32 tile twelve scalar additions
//! beside the 28 FMAs of the step, some of them issued on the two ports
//! the FMAs need. Here four base pointers reach all 14 rows through the
//! addressing modes' scale (`base + lda·{1,2,4,8}`), and four steps of the
//! depth share them with constant displacements, so a step costs 2 loads
//! of B, one broadcast per row and the FMAs, and two prefetches of B's
//! row [`B_AHEAD`] steps on. On the 2-core Xeon,
//! interleaved call by call, median GFLOP/s, intrinsics -> assembly: 512³
//! on 2 threads 280 -> 292 and 278 -> 290, on 1 thread 157 -> 160; 256³
//! 298 -> 303, 1024³ 287 -> 291 (2 threads).
//!
//! Every element sums as the intrinsic tiles sum it (one fused
//! multiply-add per depth step, in order), so results are bitwise those of
//! the packed driver. The packing variant stays in intrinsics: it runs
//! once per part of B.

use std::arch::asm;
use std::arch::x86_64::*;

use super::{x86, Direct, DirectFn, DirectRows};

/// Depth steps ahead of the one it reads that a tile prefetches B's row.
/// A B read in place has its rows a row stride apart (1 KiB at 256³),
/// which the hardware prefetchers do not follow. On the 2-core Xeon, 2
/// threads, interleaved, median GFLOP/s against prefetching the row being
/// read: 256³ 259 -> 267, 320³ 276 -> 292, 128³ and 512³ (a packed B)
/// unchanged; 32 steps read 266 and 295.
const B_AHEAD: usize = 16;

/// The f32 direct kernel of 14 rows with its tiles in assembly.
pub(in crate::ops::matmul) const F32_AVX512: Direct<f32> = Direct {
    mr: x86::f32_avx512::DIRECT.mr,
    rows: |rows| DirectRows {
        tile: f32_tile(rows),
        packing: (x86::f32_avx512::DIRECT.rows)(rows).packing,
    },
};

/// The f64 direct kernel of 8 rows with its tiles in assembly.
pub(in crate::ops::matmul) const F64_AVX512: Direct<f64> = Direct {
    mr: x86::f64_avx512::DIRECT.mr,
    rows: |rows| DirectRows {
        tile: f64_tile(rows),
        packing: (x86::f64_avx512::DIRECT.rows)(rows).packing,
    },
};

/// Defines the tiles of the first rows of a direct tile of two vectors a
/// row, one routine per height, and `$select`, the routine of a height.
///
/// Each row entry is `(routine, row, accumulators, broadcast register,
/// address)`: the routine that ends with this row, the row's index, its two
/// accumulator registers, the register its element of A is broadcast
/// into (alternating, so consecutive rows do not wait on one register),
/// and its address from the base pointers `a0 = a`, `a3 = a + 3·lda`,
/// `a5 = a + 5·lda`, `a10 = a + 10·lda` and `l = lda` in bytes.
macro_rules! asm_tiles {
    (
        $t:ty, $select:ident, $feat:literal, $bcast:literal, $fma:literal,
        disp [$d1:literal, $d2:literal, $d3:literal], step $s1:literal, steps $s4:literal,
        $zero:ident, $load:ident, $add:ident, $store:ident, $w:literal,
        [$(($name:ident, $i:tt, $z0:tt, $z1:tt, $zb:tt, $addr:literal)),*]
    ) => {
        /// The routine of the first `rows` rows.
        fn $select(rows: usize) -> DirectFn<$t> {
            asm_tiles!(@select rows, [], [$(($name, $i, $z0, $z1, $zb, $addr))*], $t, $feat, $bcast, $fma,
                $d1, $d2, $d3, $s1, $s4, $zero, $load, $add, $store, $w)
        }
    };
    // One routine for every prefix of the rows: `$done` the rows so far,
    // the routine of the last of them defined inside the match arm.
    (@select $rows:ident, [$($done:tt)*], [($name:ident, $i:tt, $z0:tt, $z1:tt, $zb:tt, $addr:literal) $($rest:tt)*],
        $t:ty, $feat:literal, $bcast:literal, $fma:literal, $d1:literal, $d2:literal, $d3:literal,
        $s1:literal, $s4:literal, $zero:ident, $load:ident, $add:ident, $store:ident, $w:literal) => {
        if $rows == $i + 1 {
            asm_tiles!(@tile $name, [$($done)* ($i, $z0, $z1, $zb, $addr)], $t, $feat, $bcast, $fma,
                $d1, $d2, $d3, $s1, $s4, $zero, $load, $add, $store, $w);
            $name
        } else {
            asm_tiles!(@select $rows, [$($done)* ($i, $z0, $z1, $zb, $addr)], [$($rest)*], $t, $feat, $bcast, $fma,
                $d1, $d2, $d3, $s1, $s4, $zero, $load, $add, $store, $w)
        }
    };
    (@select $rows:ident, [$($done:tt)*], [], $($x:tt)*) => {
        panic!("gemm: no direct kernel of {} rows", $rows)
    };
    // One step of the depth as one template piece: B's row at `{b}` plus
    // the step's offset `$b` (two vectors), the row `B_AHEAD` steps on at
    // `{pf}` plus the same offset prefetched, then each row's element of A
    // at its address plus `$d` broadcast and multiplied-added into its
    // accumulators.
    (@step $b:literal, $d:literal, $bcast:literal, $fma:literal, [$(($zb:tt, $z0:tt, $z1:tt, $addr:literal))*]) => {
        concat!(
            "vmovups zmm28, [{b}", $b, "]\n",
            "vmovups zmm29, [{b}", $b, " + 64]\n",
            "prefetcht0 [{pf}", $b, "]\n",
            "prefetcht0 [{pf}", $b, " + 64]\n",
            $(
                $bcast, " ", $zb, ", [", $addr, $d, "]\n",
                $fma, " ", $z0, ", ", $zb, ", zmm28\n",
                $fma, " ", $z1, ", ", $zb, ", zmm29\n",
            )*
        )
    };
    (@tile $name:ident, [$(($i:tt, $z0:tt, $z1:tt, $zb:tt, $addr:literal))*], $t:ty, $feat:literal, $bcast:literal,
        $fma:literal, $d1:literal, $d2:literal, $d3:literal, $s1:literal, $s4:literal,
        $zero:ident, $load:ident, $add:ident, $store:ident, $w:literal) => {
        /// The tile of these rows ([`DirectFn`]).
        ///
        /// # Safety
        /// As [`DirectFn`]'s.
        #[target_feature(enable = $feat)]
        #[allow(clippy::too_many_arguments)]
        unsafe fn $name(kc: usize, a: *const $t, lda: usize, b: *const $t, ldb: usize, c: *mut $t, ldc: usize, add: bool) {
            const MR: usize = [$($i),*].len();
            let size = size_of::<$t>();
            // Fetch the C tile while the products run (its rows are far
            // apart, beyond the hardware prefetcher's reach).
            for i in 0..MR {
                let row = c.wrapping_add(i * ldc).cast::<i8>();
                _mm_prefetch::<_MM_HINT_T0>(row);
                _mm_prefetch::<_MM_HINT_T0>(row.wrapping_add(2 * $w * size - 1));
            }
            let mut acc = [[$zero(); 2]; MR];
            // SAFETY: the caller guarantees A's elements (i, p) for i < MR,
            // p < kc and B's rows p < kc of 2·$w elements, which are all
            // the loop reads (its prefetches, past B's end too, never
            // fault); it writes only the accumulators and its scratch
            // registers.
            unsafe {
                asm!(
                    "lea {a3}, [{l} + {l} * 2]",
                    "add {a3}, {a0}",
                    "lea {a5}, [{l} + {l} * 4]",
                    "add {a5}, {a0}",
                    "lea {a10}, [{a5} + {l} * 4]",
                    "add {a10}, {l}",
                    "lea {ldb3}, [{ldb} + {ldb} * 2]",
                    "test {n4}, {n4}",
                    "jz 3f",
                    "2:",
                    asm_tiles!(@step "", "", $bcast, $fma, [$(($zb, $z0, $z1, $addr))*]),
                    asm_tiles!(@step " + {ldb}", $d1, $bcast, $fma, [$(($zb, $z0, $z1, $addr))*]),
                    asm_tiles!(@step " + {ldb} * 2", $d2, $bcast, $fma, [$(($zb, $z0, $z1, $addr))*]),
                    asm_tiles!(@step " + {ldb3}", $d3, $bcast, $fma, [$(($zb, $z0, $z1, $addr))*]),
                    concat!("add {a0}, ", $s4),
                    concat!("add {a3}, ", $s4),
                    concat!("add {a5}, ", $s4),
                    concat!("add {a10}, ", $s4),
                    "lea {b}, [{b} + {ldb} * 4]",
                    "lea {pf}, [{pf} + {ldb} * 4]",
                    "dec {n4}",
                    "jnz 2b",
                    "3:",
                    "test {n1}, {n1}",
                    "jz 5f",
                    "4:",
                    asm_tiles!(@step "", "", $bcast, $fma, [$(($zb, $z0, $z1, $addr))*]),
                    concat!("add {a0}, ", $s1),
                    concat!("add {a3}, ", $s1),
                    concat!("add {a5}, ", $s1),
                    concat!("add {a10}, ", $s1),
                    "add {b}, {ldb}",
                    "add {pf}, {ldb}",
                    "dec {n1}",
                    "jnz 4b",
                    "5:",
                    a0 = inout(reg) a => _,
                    a3 = out(reg) _,
                    a5 = out(reg) _,
                    a10 = out(reg) _,
                    l = in(reg) lda * size,
                    b = inout(reg) b => _,
                    ldb = in(reg) ldb * size,
                    pf = inout(reg) b.wrapping_add(ldb * B_AHEAD) => _,
                    ldb3 = out(reg) _,
                    n4 = inout(reg) kc / 4 => _,
                    n1 = inout(reg) kc % 4 => _,
                    $(
                        inout($z0) acc[$i][0],
                        inout($z1) acc[$i][1],
                    )*
                    out("zmm28") _,
                    out("zmm29") _,
                    out("zmm30") _,
                    out("zmm31") _,
                    options(nostack, readonly),
                );
                for (i, row) in acc.iter().enumerate() {
                    for (v, &x) in row.iter().enumerate() {
                        let dst = c.add(i * ldc + v * $w);
                        $store(dst, if add { $add($load(dst), x) } else { x });
                    }
                }
            }
        }
    };
}

asm_tiles!(
    f32, f32_tile, "avx512f", "vbroadcastss", "vfmadd231ps",
    disp ["+4", "+8", "+12"], step "4", steps "16",
    _mm512_setzero_ps, _mm512_loadu_ps, _mm512_add_ps, _mm512_storeu_ps, 16,
    [
        (f32_1, 0, "zmm0", "zmm1", "zmm30", "{a0}"),
        (f32_2, 1, "zmm2", "zmm3", "zmm31", "{a0} + {l}"),
        (f32_3, 2, "zmm4", "zmm5", "zmm30", "{a0} + {l} * 2"),
        (f32_4, 3, "zmm6", "zmm7", "zmm31", "{a3}"),
        (f32_5, 4, "zmm8", "zmm9", "zmm30", "{a0} + {l} * 4"),
        (f32_6, 5, "zmm10", "zmm11", "zmm31", "{a3} + {l} * 2"),
        (f32_7, 6, "zmm12", "zmm13", "zmm30", "{a5} + {l}"),
        (f32_8, 7, "zmm14", "zmm15", "zmm31", "{a3} + {l} * 4"),
        (f32_9, 8, "zmm16", "zmm17", "zmm30", "{a0} + {l} * 8"),
        (f32_10, 9, "zmm18", "zmm19", "zmm31", "{a5} + {l} * 4"),
        (f32_11, 10, "zmm20", "zmm21", "zmm30", "{a10}"),
        (f32_12, 11, "zmm22", "zmm23", "zmm31", "{a3} + {l} * 8"),
        (f32_13, 12, "zmm24", "zmm25", "zmm30", "{a10} + {l} * 2"),
        (f32_14, 13, "zmm26", "zmm27", "zmm31", "{a5} + {l} * 8")
    ]
);

asm_tiles!(
    f64, f64_tile, "avx512f", "vbroadcastsd", "vfmadd231pd",
    disp ["+8", "+16", "+24"], step "8", steps "32",
    _mm512_setzero_pd, _mm512_loadu_pd, _mm512_add_pd, _mm512_storeu_pd, 8,
    [
        (f64_1, 0, "zmm0", "zmm1", "zmm30", "{a0}"),
        (f64_2, 1, "zmm2", "zmm3", "zmm31", "{a0} + {l}"),
        (f64_3, 2, "zmm4", "zmm5", "zmm30", "{a0} + {l} * 2"),
        (f64_4, 3, "zmm6", "zmm7", "zmm31", "{a3}"),
        (f64_5, 4, "zmm8", "zmm9", "zmm30", "{a0} + {l} * 4"),
        (f64_6, 5, "zmm10", "zmm11", "zmm31", "{a3} + {l} * 2"),
        (f64_7, 6, "zmm12", "zmm13", "zmm30", "{a5} + {l}"),
        (f64_8, 7, "zmm14", "zmm15", "zmm31", "{a3} + {l} * 4")
    ]
);

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs every height of `asm` and of the intrinsic kernel `reference`
    /// over depths around the 4-step unrolling, with strided operands,
    /// overwriting and adding to C, and requires the same bits.
    fn same_bits<T: bytemuck::Pod + PartialEq + std::fmt::Debug + From<f32>>(
        asm: Direct<T>,
        reference: Direct<T>,
        nr: usize,
    ) {
        assert_eq!(asm.mr, reference.mr);
        let (lda, ldb, ldc) = (263 + 7, nr + 5, nr + 3);
        for rows in 1..=asm.mr {
            for kc in [0, 1, 3, 4, 5, 8, 11, 256, 259] {
                let value = |i: usize| T::from(((i * 7919 % 2003) as f32 - 1001.0) / 997.0);
                let a: Vec<T> = (0..rows * lda).map(value).collect();
                let b: Vec<T> = (0..kc.max(1) * ldb).map(|i| value(i + 17)).collect();
                for add in [false, true] {
                    let c0: Vec<T> = (0..rows * ldc).map(|i| value(i + 5)).collect();
                    let (mut got, mut want) = (c0.clone(), c0);
                    // SAFETY: the avx512f feature was checked by the
                    // caller; A holds `rows` rows of `lda ≥ kc` elements, B
                    // `kc` rows of `ldb ≥ nr`, C `rows` rows of `ldc ≥ nr`.
                    unsafe {
                        ((asm.rows)(rows).tile)(
                            kc,
                            a.as_ptr(),
                            lda,
                            b.as_ptr(),
                            ldb,
                            got.as_mut_ptr(),
                            ldc,
                            add,
                        );
                        ((reference.rows)(rows).tile)(
                            kc,
                            a.as_ptr(),
                            lda,
                            b.as_ptr(),
                            ldb,
                            want.as_mut_ptr(),
                            ldc,
                            add,
                        );
                    }
                    assert!(
                        got.iter().zip(&want).all(|(g, w)| bytemuck::bytes_of(g) == bytemuck::bytes_of(w)),
                        "{rows} rows, depth {kc}, add {add}: the assembly tile differs from the intrinsic one"
                    );
                }
            }
        }
    }

    #[test]
    fn assembly_tiles_sum_bit_for_bit_as_the_intrinsic_tiles() {
        if !is_x86_feature_detected!("avx512f") {
            eprintln!("skipped: this CPU has no AVX-512F");
            return;
        }
        same_bits::<f32>(F32_AVX512, x86::f32_avx512::DIRECT, 32);
        same_bits::<f64>(F64_AVX512, x86::f64_avx512::DIRECT, 16);
    }
}
