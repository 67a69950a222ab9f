//! The bf16 GEMM on every path (and the AMX layout through an emulation of
//! `tdpbf16ps`) against an f64 product of the same bf16 values, over random
//! shapes with every kind of tail, strided operands, scalars and epilogues;
//! and bitwise equal on every thread count.

use proptest::prelude::*;

use super::bf16::{gemm_bf16, ranking, Bf16Path, PairPacking};
use super::gemm::{drive, Bias, Epilogue, GemmShape, MatMut};
use super::pack::MatRef;
use crate::test_util::{layouts_of, rand_f64, values_f64};
use crate::{bf16, Tensor};

/// A way to run the GEMM under test: a path, or the AMX packing on the emulated tile op.
#[derive(Debug, Clone, Copy)]
enum Runner {
    Path(Bf16Path),
    AmxEmulated,
}

/// Every runner this CPU can run (naming the paths it cannot, with why).
fn runners() -> Vec<Runner> {
    let mut all = vec![Runner::AmxEmulated];
    for path in [
        Bf16Path::Amx,
        Bf16Path::Avx512Bf16,
        Bf16Path::Widen,
        Bf16Path::Portable,
    ] {
        match path.unsupported_reason() {
            None => all.push(Runner::Path(path)),
            Some(why) => eprintln!("bf16 GEMM path {path:?} skipped: {why}"),
        }
    }
    all
}

fn run(
    r: Runner,
    s: GemmShape<f32>,
    a: MatRef<bf16>,
    b: MatRef<bf16>,
    c: MatMut<f32>,
    epi: Epilogue<f32>,
    par: bool,
) {
    match r {
        Runner::Path(p) => gemm_bf16(s, a, b, c, epi, p, par),
        Runner::AmxEmulated => drive(&PairPacking::amx_with(tdpbf16ps_emulated), s, a, b, c, epi, par),
    }
}

/// The AMX kernel's contract in plain code: A as 32×16-pair tiles, B as
/// `kc` rows of 32 column pairs, four 16×16 tiles, each sum from zero in
/// depth order (even product, then odd, per pair), then added to C.
unsafe fn tdpbf16ps_emulated(kc: usize, a: *const u32, b: *const u32, c: *mut f32, ldc: usize, add: bool) {
    assert_eq!(kc % 16, 0, "AMX panels span whole tiles");
    // SAFETY: the kernel contract: 32*kc units behind a and b, a 32×32 tile at c.
    let (a, b) = unsafe {
        (
            std::slice::from_raw_parts(a, 32 * kc),
            std::slice::from_raw_parts(b, 32 * kc),
        )
    };
    let lo = |u: u32| f32::from_bits(u << 16);
    let hi = |u: u32| f32::from_bits(u & 0xffff_0000);
    for i in 0..32 {
        for j in 0..32 {
            let mut acc = 0f32;
            for p in 0..kc {
                let (x, y) = (a[(p / 16) * 512 + i * 16 + p % 16], b[p * 32 + j]);
                acc += lo(x) * lo(y);
                acc += hi(x) * hi(y);
            }
            // SAFETY: inside the tile.
            unsafe {
                let d = c.add(i * ldc + j);
                *d = if add { *d + acc } else { acc };
            }
        }
    }
}

fn naive(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            out[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
        }
    }
    out
}

fn pick(values: &[f64], shape: &[usize], sel: usize) -> Tensor {
    let all = layouts_of::<bf16>(values, shape);
    all[sel % all.len()].clone()
}

fn mat(t: &Tensor) -> MatRef<'_, bf16> {
    super::mat_ref(t, t.layout())
}

/// The f32 accumulation tolerance of a length-`k` sum of products of values in [-1, 1].
fn within(got: f64, want: f64, k: usize) -> bool {
    (got - want).abs() <= 2e-6 * k as f64 + 1e-6
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20))]

    /// Every path, into a column-major output at an offset (the generic
    /// tile store) and a padded row-major one (whole tiles in place), with
    /// alpha, beta and an epilogue.
    #[test]
    fn every_path_matches_f64_product(m in 1usize..90, k in 0usize..200, n in 1usize..90,
                                      sa in 0usize..5, sb in 0usize..5, seed in 0u64..1000,
                                      beta in prop::sample::select(vec![0.0, 1.0, -0.5]),
                                      alpha in prop::sample::select(vec![1.0, 0.75]),
                                      bias in 0usize..3, relu in any::<bool>()) {
        let a = pick(&rand_f64(seed, m * k), &[m, k], sa);
        let b = pick(&rand_f64(seed + 1, k * n), &[k, n], sb);
        let cv = rand_f64(seed + 2, m * n);
        let biasv: Vec<f32> = rand_f64(seed + 3, m.max(n)).iter().map(|&x| x as f32).collect();
        let prod = naive(&values_f64(&a), &values_f64(&b), m, k, n);
        let want: Vec<f64> = (0..m * n).map(|e| {
            let (i, j) = (e / n, e % n);
            let mut v = alpha * prod[e] + if beta == 0.0 { 0.0 } else { beta * cv[e] as f32 as f64 };
            v += match bias { 1 => biasv[i] as f64, 2 => biasv[j] as f64, _ => 0.0 };
            if relu { v.max(0.0) } else { v }
        }).collect();
        let epi = Epilogue {
            bias: match bias { 1 => Bias::Row(&biasv[..m]), 2 => Bias::Col(&biasv[..n]), _ => Bias::None },
            relu,
        };
        let shape = GemmShape { m, n, k, alpha: alpha as f32, beta: beta as f32 };
        let ld = n + 3;
        for r in runners() {
            let mut cols = vec![f32::NAN; m * n + 5];
            let mut rows = vec![f32::NAN; m * ld];
            for (e, &x) in cv.iter().enumerate() {
                let x = if beta == 0.0 { f32::NAN } else { x as f32 };
                cols[5 + (e % n) * m + e / n] = x;
                rows[(e / n) * ld + e % n] = x;
            }
            run(r, shape, mat(&a), mat(&b), MatMut { data: &mut cols, off: 5, rs: 1, cs: m as isize }, epi, true);
            run(r, shape, mat(&a), mat(&b), MatMut { data: &mut rows, off: 0, rs: ld as isize, cs: 1 }, epi, true);
            for (e, &w) in want.iter().enumerate() {
                let (i, j) = (e / n, e % n);
                let (gc, gr) = (cols[5 + j * m + i] as f64, rows[i * ld + j] as f64);
                prop_assert!(within(gc, w, k) && within(gr, w, k),
                    "{:?} {}x{}x{} at ({}, {}): got {} / {}, want {}", r, m, k, n, i, j, gc, gr, w);
            }
            prop_assert!((0..m).all(|i| rows[i * ld + n..(i + 1) * ld].iter().all(|v| v.is_nan())),
                "{:?} wrote between rows", r);
        }
    }
}

/// Every path gives the same bits on pools of 1, 2 and 5 threads, with
/// several depth blocks, column blocks and tails.
#[test]
fn every_path_is_thread_count_independent() {
    let pools: Vec<rayon::ThreadPool> = [1, 2, 5]
        .iter()
        .map(|&t| rayon::ThreadPoolBuilder::new().num_threads(t).build().unwrap())
        .collect();
    for (m, k, n, sel) in [(130, 1100, 70, 0), (40, 513, 2100, 1), (256, 64, 256, 3)] {
        let a = pick(&rand_f64(31, m * k), &[m, k], sel);
        let b = pick(&rand_f64(32, k * n), &[k, n], sel + 1);
        let want = naive(&values_f64(&a), &values_f64(&b), m, k, n);
        for r in runners() {
            let runs: Vec<Vec<u32>> = pools
                .iter()
                .map(|p| {
                    let mut c = vec![0f32; m * n];
                    let shape = GemmShape {
                        m,
                        n,
                        k,
                        alpha: 1.0,
                        beta: 0.0,
                    };
                    let out = MatMut {
                        data: &mut c,
                        off: 0,
                        rs: n as isize,
                        cs: 1,
                    };
                    p.install(|| run(r, shape, mat(&a), mat(&b), out, Epilogue::none(), true));
                    c.iter().map(|v| v.to_bits()).collect()
                })
                .collect();
            assert!(
                runs.iter().all(|x| x == &runs[0]),
                "{r:?} {m}x{k}x{n}: thread counts disagree"
            );
            let bad = (0..m * n).find(|&e| !within(f32::from_bits(runs[0][e]) as f64, want[e], k));
            assert_eq!(bad, None, "{r:?} {m}x{k}x{n}");
        }
    }
}

/// The AVX512-BF16 kernels that read a row-major A in place and pack a
/// row-major B's panels as they go give the bits of the same values
/// packed beforehand (stored column-major): unaligned rows (odd offsets and
/// row strides), partial row and column panels, several row blocks sharing
/// each panel, several depth blocks, an odd depth (which packs both),
/// row-major and strided outputs with alpha and beta, on 1 and 3 threads.
#[test]
fn operands_read_in_place_sum_as_the_packed_panels() {
    if let Some(why) = Bf16Path::Avx512Bf16.unsupported_reason() {
        eprintln!("in-place operands of the AVX512-BF16 path skipped: {why}");
        return;
    }
    let pools: Vec<rayon::ThreadPool> = [1, 3]
        .iter()
        .map(|&t| rayon::ThreadPoolBuilder::new().num_threads(t).build().unwrap())
        .collect();
    for (m, k, n) in [
        (77, 2050, 70),
        (8, 64, 32),
        (130, 301, 96),
        (19, 2, 33),
        (64, 1024, 64),
        (200, 512, 160),
    ] {
        let (a_rows, a_cols) = both_orders(51, m, k, 5, k + 3);
        let (b_rows, b_cols) = both_orders(52, k, n, 3, n + 1);
        let c0: Vec<f32> = rand_f64(53, m * n).iter().map(|&x| x as f32).collect();
        for (alpha, beta, strided) in [(1.0, 0.0, false), (1.0, 1.0, false), (0.5, -0.5, true)] {
            let shape = GemmShape { m, n, k, alpha, beta };
            let run = |a: MatRef<bf16>, b: MatRef<bf16>, pool: &rayon::ThreadPool| {
                let mut c = c0.clone();
                let (rs, cs) = if strided { (1, m as isize) } else { (n as isize, 1) };
                let out = MatMut {
                    data: &mut c,
                    off: 0,
                    rs,
                    cs,
                };
                pool.install(|| gemm_bf16(shape, a, b, out, Epilogue::none(), Bf16Path::Avx512Bf16, true));
                c.iter().map(|v| v.to_bits()).collect::<Vec<u32>>()
            };
            let want = run(a_cols.view(), b_cols.view(), &pools[0]);
            for pool in &pools {
                for (a, b, what) in [
                    (&a_rows, &b_cols, "A in place"),
                    (&a_cols, &b_rows, "B packed by the kernel"),
                    (&a_rows, &b_rows, "both"),
                ] {
                    assert!(
                        run(a.view(), b.view(), pool) == want,
                        "{m}x{k}x{n} alpha {alpha} beta {beta} strided {strided}: {what} differs"
                    );
                }
            }
        }
    }
}

/// A random `rows × cols` bf16 matrix stored row-major (from `off`, `ld`
/// apart, NaN between the rows) and column-major.
fn both_orders(seed: u64, rows: usize, cols: usize, off: usize, ld: usize) -> (Stored, Stored) {
    let vals: Vec<bf16> = rand_f64(seed, rows * cols)
        .iter()
        .map(|&x| bf16::from_f64(x))
        .collect();
    let mut row_major = vec![bf16::from_f32(f32::NAN); off + rows * ld];
    let mut col_major = vec![bf16::ZERO; rows * cols];
    for i in 0..rows {
        for j in 0..cols {
            row_major[off + i * ld + j] = vals[i * cols + j];
            col_major[j * rows + i] = vals[i * cols + j];
        }
    }
    (
        Stored {
            data: row_major,
            off,
            rs: ld as isize,
            cs: 1,
        },
        Stored {
            data: col_major,
            off: 0,
            rs: 1,
            cs: rows as isize,
        },
    )
}

/// A matrix's storage and layout.
struct Stored {
    data: Vec<bf16>,
    off: usize,
    rs: isize,
    cs: isize,
}

impl Stored {
    fn view(&self) -> MatRef<'_, bf16> {
        MatRef {
            data: &self.data,
            off: self.off,
            rs: self.rs,
            cs: self.cs,
        }
    }
}

/// bf16 `matmul` (which takes [`Bf16Path::best`]) rounds the f32 sum once.
#[test]
fn matmul_rounds_the_f32_sum_once() {
    let (m, k, n) = (33, 300, 47);
    let a = pick(&rand_f64(41, m * k), &[m, k], 0);
    let b = pick(&rand_f64(42, k * n), &[k, n], 2);
    let got = values_f64(&a.matmul(&b).unwrap());
    let want = naive(&values_f64(&a), &values_f64(&b), m, k, n);
    for (g, w) in got.iter().zip(&want) {
        // The f32 tolerance, then one bf16 rounding (relative 2⁻⁸).
        assert!(
            (g - w).abs() <= 2e-6 * k as f64 + 1e-6 + w.abs() / 256.0,
            "{g} vs {w}"
        );
    }
}

#[test]
fn paths_parse_and_widen_always_runs() {
    assert_eq!(Bf16Path::parse("AMX"), Some(Bf16Path::Amx));
    assert_eq!(Bf16Path::parse("avx512bf16"), Some(Bf16Path::Avx512Bf16));
    assert_eq!(Bf16Path::parse("widen"), Some(Bf16Path::Widen));
    assert_eq!(Bf16Path::parse("portable"), Some(Bf16Path::Portable));
    assert_eq!(Bf16Path::parse("sse"), None);
    let avail = Bf16Path::available();
    assert!(avail.contains(&Bf16Path::Widen) && avail.contains(&Bf16Path::Portable));
    assert!(avail.contains(&Bf16Path::best()));
}

/// Where `vdpbf16ps` runs at half rate the widened f32 kernels rank before
/// it, behind AMX; elsewhere after it. On this machine the ranking follows
/// the vendor `/proc/cpuinfo` names (an oracle independent of the CPUID
/// probe): Intel cores run `vdpbf16ps` at half rate.
#[test]
fn half_rate_dot_products_rank_after_the_widened_kernels() {
    use Bf16Path::*;
    assert_eq!(ranking(true), [Amx, Widen, Avx512Bf16, Portable]);
    assert_eq!(ranking(false), [Amx, Avx512Bf16, Widen, Portable]);
    let intel = std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|s| {
        s.lines()
            .any(|l| l.starts_with("vendor_id") && l.ends_with("GenuineIntel"))
    });
    let want: Vec<Bf16Path> = ranking(intel).into_iter().filter(|p| p.supported()).collect();
    assert_eq!(Bf16Path::available(), want);
}

/// Whether `/proc/cpuinfo` lists AMX-BF16 tiles: an oracle independent of
/// the path's own CPUID probe.
fn cpuinfo_lists_amx() -> bool {
    std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|s| {
        s.lines()
            .any(|l| l.starts_with("flags") && l.split_whitespace().any(|f| f == "amx_bf16"))
    })
}

/// Where the CPU has AMX-BF16 the AMX path must run (the tile permission
/// granted, so the proptests above really execute `tdpbf16ps`), on every
/// rayon worker at once, and agree with the f64 product; elsewhere it says
/// why it is skipped.
#[test]
fn amx_path_runs_where_the_cpu_has_it() {
    let why = Bf16Path::Amx.unsupported_reason();
    if let Some(why) = &why {
        assert!(
            !cpuinfo_lists_amx(),
            "the CPU lists amx_bf16 but the AMX path refuses: {why}"
        );
        eprintln!("AMX path skipped: {why}");
        return;
    }
    assert_eq!(
        Bf16Path::best(),
        Bf16Path::Amx,
        "AMX is the fastest path where it runs"
    );
    let pool = rayon::ThreadPoolBuilder::new().num_threads(4).build().unwrap();
    let (m, k, n) = (96, 70, 160);
    let a = pick(&rand_f64(51, m * k), &[m, k], 0);
    let b = pick(&rand_f64(52, k * n), &[k, n], 0);
    let want = naive(&values_f64(&a), &values_f64(&b), m, k, n);
    let results: Vec<Vec<f32>> = pool.install(|| {
        use rayon::prelude::*;
        (0..8)
            .into_par_iter()
            .map(|_| {
                let mut c = vec![f32::NAN; m * n];
                let shape = GemmShape {
                    m,
                    n,
                    k,
                    alpha: 1.0,
                    beta: 0.0,
                };
                let out = MatMut {
                    data: &mut c,
                    off: 0,
                    rs: n as isize,
                    cs: 1,
                };
                gemm_bf16(
                    shape,
                    mat(&a),
                    mat(&b),
                    out,
                    Epilogue::none(),
                    Bf16Path::Amx,
                    false,
                );
                c
            })
            .collect()
    });
    for c in &results {
        assert!(
            c.iter().zip(&want).all(|(&g, &w)| within(g as f64, w, k)),
            "AMX result off"
        );
        assert_eq!(c, &results[0]);
    }
    eprintln!(
        "AMX path ran: {} concurrent {m}x{k}x{n} products on tdpbf16ps",
        results.len()
    );
}

/// The A panel packer (the AVX-512 transpose of full 8-row panels in blocks
/// of 16 pairs where the CPU has it, scalar otherwise) against the unit
/// definition: every depth (odd ones pad a zero), full and partial panels.
#[test]
fn interleave_rows_packs_pair_major_panels() {
    for kc in [0usize, 1, 2, 31, 32, 33, 64, 97, 130] {
        for live in [8usize, 5, 1] {
            let data: Vec<bf16> = (0..live * kc).map(|i| bf16::from_f32(i as f32 - 300.0)).collect();
            let lines: Vec<&[bf16]> = data.chunks(kc.max(1)).take(live).map(|l| &l[..kc]).collect();
            let lines = if kc == 0 { vec![&data[..0]; live] } else { lines };
            let mut out = vec![u32::MAX; kc.div_ceil(2) * 8];
            super::bf16::interleave_rows(&mut out, &lines, 8);
            for p in 0..kc.div_ceil(2) {
                for i in 0..8 {
                    let at = |d: usize| {
                        if i < live && d < kc {
                            lines[i][d].to_bits() as u32
                        } else {
                            0
                        }
                    };
                    assert_eq!(
                        out[p * 8 + i],
                        at(2 * p) | at(2 * p + 1) << 16,
                        "kc {kc} live {live} ({p}, {i})"
                    );
                }
            }
        }
    }
}
