//! The collective suite shared by the `local` and `tcp` tests: every rank
//! generates every rank's input from a seed, runs each collective, and
//! checks its own result against a sequential oracle, bitwise.

#![allow(dead_code)]

use tessera_parallel::{fold_reference, CommElement, CommExt, Communicator, ReduceOp};
use tessera_tensor::{bf16, f16, DType};

/// One case of the suite.
#[derive(Debug, Clone)]
pub struct Case {
    pub seed: u64,
    pub len: usize,
    pub dtype: DType,
    pub op: ReduceOp,
    pub root: usize,
}

/// The five payload dtypes.
pub const DTYPES: [DType; 5] = [DType::F32, DType::F64, DType::F16, DType::BF16, DType::I64];

/// A counter-based generator: the same numbers for the same (seed, rank, i).
pub fn rand_u64(seed: u64, rank: usize, i: usize) -> u64 {
    let mut z = seed
        ^ (rank as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
        ^ (i as u64).wrapping_mul(0xD1B5_4A32_D192_ED03);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Element types the suite generates data for.
pub trait TestElem: CommElement {
    fn gen(bits: u64) -> Self;
}

fn unit(bits: u64) -> f64 {
    // Mixed magnitudes so that the fold order matters for rounding.
    let m = (bits >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0;
    m * [1.0, 1e-3, 1e3, 0.5][(bits & 3) as usize]
}

impl TestElem for f32 {
    fn gen(bits: u64) -> Self {
        unit(bits) as f32
    }
}
impl TestElem for f64 {
    fn gen(bits: u64) -> Self {
        unit(bits)
    }
}
impl TestElem for f16 {
    fn gen(bits: u64) -> Self {
        f16::from_f64(unit(bits) / 8.0)
    }
}
impl TestElem for bf16 {
    fn gen(bits: u64) -> Self {
        bf16::from_f64(unit(bits))
    }
}
impl TestElem for i64 {
    fn gen(bits: u64) -> Self {
        (bits % 2001) as i64 - 1000
    }
}

/// Rank `rank`'s input of `len` elements.
pub fn input<T: TestElem>(seed: u64, rank: usize, len: usize) -> Vec<T> {
    (0..len).map(|i| T::gen(rand_u64(seed, rank, i))).collect()
}

fn bits<T: CommElement>(v: &[T]) -> &[u8] {
    bytemuck::cast_slice(v)
}

fn expect_eq<T: CommElement>(
    what: &str,
    case: &Case,
    rank: usize,
    got: &[T],
    want: &[T],
) -> Result<(), String> {
    if bits(got) == bits(want) {
        return Ok(());
    }
    let i = got
        .iter()
        .zip(want)
        .position(|(a, b)| bits(std::slice::from_ref(a)) != bits(std::slice::from_ref(b)));
    Err(format!(
        "{what} on rank {rank} ({case:?}): lengths {} vs {}, first difference at {i:?}: {:?} vs {:?}",
        got.len(),
        want.len(),
        i.map(|i| got[i]),
        i.map(|i| want[i])
    ))
}

/// Runs every collective of `case` on `comm` and checks this rank's results.
pub fn check_case<C: Communicator + ?Sized>(comm: &C, case: &Case) -> Result<(), String> {
    match case.dtype {
        DType::F32 => check_typed::<f32, C>(comm, case),
        DType::F64 => check_typed::<f64, C>(comm, case),
        DType::F16 => check_typed::<f16, C>(comm, case),
        DType::BF16 => check_typed::<bf16, C>(comm, case),
        DType::I64 => check_typed::<i64, C>(comm, case),
        d => Err(format!("no payload dtype {d}")),
    }
}

fn check_typed<T: TestElem, C: Communicator + ?Sized>(comm: &C, case: &Case) -> Result<(), String> {
    let (n, r, len, op) = (comm.world_size(), comm.rank(), case.len, case.op);
    let root = case.root % n;
    let e = |what: &'static str| {
        move |err: tessera_parallel::CommError| format!("{what} failed on rank {r}: {err}")
    };
    let inputs: Vec<Vec<T>> = (0..n).map(|k| input(case.seed, k, len)).collect();
    let folded = fold_reference(&inputs, op);

    // all_reduce, in place, against the sequential fold in ring order.
    let mut buf = inputs[r].clone();
    comm.all_reduce_slice(&mut buf, op).map_err(e("all_reduce"))?;
    expect_eq("all_reduce", case, r, &buf, &folded)?;

    // reduce_scatter over n·c elements: this rank's block of the fold.
    let c = len / n;
    let rs_inputs: Vec<Vec<T>> = inputs.iter().map(|x| x[..n * c].to_vec()).collect();
    let rs_fold = fold_reference(&rs_inputs, op);
    let mut out = vec![T::ZERO; c];
    comm.reduce_scatter_slice(&rs_inputs[r], &mut out, op)
        .map_err(e("reduce_scatter"))?;
    expect_eq("reduce_scatter", case, r, &out, &rs_fold[r * c..(r + 1) * c])?;

    // all_gather(reduce_scatter(x)) == all_reduce(x), bit for bit.
    let mut gathered = vec![T::ZERO; n * c];
    comm.all_gather_slice(&out, &mut gathered)
        .map_err(e("all_gather"))?;
    expect_eq("all_gather of reduce_scatter", case, r, &gathered, &rs_fold)?;

    // all_gather of raw inputs: concatenation in rank order.
    let g = len.min(997);
    let mut gathered = vec![T::ZERO; n * g];
    comm.all_gather_slice(&inputs[r][..g], &mut gathered)
        .map_err(e("all_gather"))?;
    let want: Vec<T> = inputs.iter().flat_map(|x| x[..g].iter().copied()).collect();
    expect_eq("all_gather", case, r, &gathered, &want)?;

    // broadcast from `root`.
    let mut buf = inputs[r].clone();
    comm.broadcast_slice(&mut buf, root).map_err(e("broadcast"))?;
    expect_eq("broadcast", case, r, &buf, &inputs[root])?;

    // reduce to `root`: the fold there, the input unchanged elsewhere.
    let mut buf = inputs[r].clone();
    comm.reduce_slice(&mut buf, op, root).map_err(e("reduce"))?;
    expect_eq(
        "reduce",
        case,
        r,
        &buf,
        if r == root { &folded } else { &inputs[r] },
    )?;

    // all_to_all: block j of rank k goes to rank j.
    let b = len / n;
    let mut out = vec![T::ZERO; n * b];
    comm.all_to_all_slice(&inputs[r][..n * b], &mut out)
        .map_err(e("all_to_all"))?;
    let want: Vec<T> = (0..n)
        .flat_map(|k| inputs[k][r * b..(r + 1) * b].iter().copied())
        .collect();
    expect_eq("all_to_all", case, r, &out, &want)?;

    comm.barrier().map_err(e("barrier"))?;
    Ok(())
}

/// gloo's integer pattern (spec §1.5): `x_r[j] = j·n + r`, whose sum is
/// `j·n² + n(n-1)/2` in any order; exact in f32 below 2^24.
pub fn check_gloo_pattern<C: Communicator + ?Sized>(comm: &C, len: usize) -> Result<(), String> {
    let (n, r) = (comm.world_size(), comm.rank());
    let mut a: Vec<f32> = (0..len).map(|j| (j * n + r) as f32).collect();
    let mut b: Vec<f64> = (0..len).map(|j| (j * n + r) as f64).collect();
    let mut c: Vec<i64> = (0..len).map(|j| (j * n + r) as i64).collect();
    comm.all_reduce_slice(&mut a, ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    comm.all_reduce_slice(&mut b, ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    comm.all_reduce_slice(&mut c, ReduceOp::Sum)
        .map_err(|e| e.to_string())?;
    for j in 0..len {
        let want = (j * n * n + n * (n - 1) / 2) as i64;
        if a[j] != want as f32 || b[j] != want as f64 || c[j] != want {
            return Err(format!(
                "gloo pattern n={n} len={len} rank {r} at {j}: {} {} {} vs {want}",
                a[j], b[j], c[j]
            ));
        }
    }
    Ok(())
}
