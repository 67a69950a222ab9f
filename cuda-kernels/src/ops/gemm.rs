//! Tensor-core GEMM (`mma.sync` m16n8k16, f16/bf16 in, f32 accumulate).

use super::Half;
use crate::launch::{check_len, to_i32, to_i64, Arg, DevPtr, Launch};
use crate::module::Module;
use crate::{Error, Result};

const TILE: usize = 128;
const THREADS: u32 = 256;
/// Dynamic shared memory: 3 stages x 2 operands x 128x40 halves.
const SHARED_BYTES: u32 = 3 * 2 * 128 * 40 * 2;

/// Shape and layout of a (batched) GEMM C = op(A) · op(B), all row-major
/// with leading dimensions in elements. op(A) is m x k: A is stored m x k,
/// or k x m when `trans_a`. op(B) is k x n: B is stored k x n, or n x k when
/// `trans_b`. Batch i reads A at `i * stride_a` (0 broadcasts A), etc.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GemmShape {
    /// Rows of C.
    pub m: usize,
    /// Columns of C.
    pub n: usize,
    /// Inner dimension.
    pub k: usize,
    /// Number of products.
    pub batch: usize,
    /// A is stored transposed (k x m).
    pub trans_a: bool,
    /// B is stored transposed (n x k).
    pub trans_b: bool,
    /// Leading dimension of A as stored.
    pub lda: usize,
    /// Leading dimension of B as stored.
    pub ldb: usize,
    /// Leading dimension of C.
    pub ldc: usize,
    /// Elements between batches of A.
    pub stride_a: usize,
    /// Elements between batches of B.
    pub stride_b: usize,
    /// Elements between batches of C.
    pub stride_c: usize,
}

impl GemmShape {
    /// A single contiguous, untransposed m x k by k x n product.
    pub fn new(m: usize, n: usize, k: usize) -> Self {
        GemmShape {
            m,
            n,
            k,
            batch: 1,
            trans_a: false,
            trans_b: false,
            lda: k,
            ldb: n,
            ldc: n,
            stride_a: m * k,
            stride_b: k * n,
            stride_c: m * n,
        }
    }
}

/// Elements an operand stored `rows` x `cols` with `ld` spans over `batch`.
fn extent(
    op: &'static str,
    what: &str,
    batch: usize,
    stride: usize,
    rows: usize,
    cols: usize,
    ld: usize,
) -> Result<usize> {
    if cols > ld && rows > 1 {
        return Err(Error::arg(
            op,
            format!("{what}: leading dimension {ld} is below the row length {cols}"),
        ));
    }
    if rows == 0 || cols == 0 || batch == 0 {
        return Ok(0);
    }
    let err = || Error::arg(op, format!("{what}: size overflows"));
    let last = (batch - 1).checked_mul(stride).ok_or_else(err)?;
    let inner = (rows - 1)
        .checked_mul(ld)
        .and_then(|v| v.checked_add(cols))
        .ok_or_else(err)?;
    last.checked_add(inner).ok_or_else(err)
}

/// C = op(A) · op(B) for each batch, output in the input type.
///
/// Errors: leading dimensions below the row lengths, buffers too short,
/// m/n/k above i32::MAX, batch above 65535.
pub fn gemm<T: Half>(g: &GemmShape, a: DevPtr<T>, b: DevPtr<T>, c: DevPtr<T>) -> Result<Launch> {
    const OP: &str = "gemm";
    check_operands(OP, g, &a, &b, &c)?;
    if g.batch > 65_535 {
        return Err(Error::arg(OP, format!("batch {} above 65535", g.batch)));
    }
    let aligned = [g.lda, g.ldb, g.stride_a, g.stride_b].iter().all(|v| v % 8 == 0)
        && a.addr().is_multiple_of(16)
        && b.addr().is_multiple_of(16);
    let variant = match (g.trans_a, g.trans_b) {
        (false, false) => "nn",
        (false, true) => "nt",
        (true, false) => "tn",
        (true, true) => "tt",
    };
    Ok(Launch {
        module: Module::Gemm,
        kernel: format!("gemm_{}_{variant}", T::NAME),
        grid: [
            g.n.div_ceil(TILE) as u32,
            g.m.div_ceil(TILE) as u32,
            g.batch as u32,
        ],
        block: [THREADS, 1, 1],
        shared_mem: SHARED_BYTES,
        args: vec![
            Arg::ptr(a),
            Arg::ptr(b),
            Arg::ptr(c),
            Arg::i32(to_i32(OP, "m", g.m)?),
            Arg::i32(to_i32(OP, "n", g.n)?),
            Arg::i32(to_i32(OP, "k", g.k)?),
            Arg::i64(to_i64(OP, "lda", g.lda)?),
            Arg::i64(to_i64(OP, "ldb", g.ldb)?),
            Arg::i64(to_i64(OP, "ldc", g.ldc)?),
            Arg::i64(to_i64(OP, "stride_a", g.stride_a)?),
            Arg::i64(to_i64(OP, "stride_b", g.stride_b)?),
            Arg::i64(to_i64(OP, "stride_c", g.stride_c)?),
            Arg::i32(aligned as i32),
        ],
    })
}

/// Checks the f32 GEMM `g` of [`crate::Runtime::sgemm`] (cuBLAS on a GPU):
/// the same layout rules as [`gemm`], and every size within cuBLAS's `i32`.
///
/// Errors: leading dimensions below the row lengths, buffers too short,
/// m/n/k/ld/batch above i32::MAX.
pub fn check_sgemm(g: &GemmShape, a: &DevPtr<f32>, b: &DevPtr<f32>, c: &DevPtr<f32>) -> Result<()> {
    const OP: &str = "sgemm";
    check_operands(OP, g, a, b, c)?;
    for (what, v) in [
        ("m", g.m),
        ("n", g.n),
        ("k", g.k),
        ("lda", g.lda),
        ("ldb", g.ldb),
        ("ldc", g.ldc),
        ("batch", g.batch),
    ] {
        to_i32(OP, what, v)?;
    }
    for (what, v) in [
        ("stride_a", g.stride_a),
        ("stride_b", g.stride_b),
        ("stride_c", g.stride_c),
    ] {
        to_i64(OP, what, v)?;
    }
    Ok(())
}

/// Checks that A, B and C hold what `g` reaches in them.
fn check_operands<T>(
    op: &'static str,
    g: &GemmShape,
    a: &DevPtr<T>,
    b: &DevPtr<T>,
    c: &DevPtr<T>,
) -> Result<()> {
    let (ar, ac) = if g.trans_a { (g.k, g.m) } else { (g.m, g.k) };
    let (br, bc) = if g.trans_b { (g.n, g.k) } else { (g.k, g.n) };
    check_len(op, "A", a, extent(op, "A", g.batch, g.stride_a, ar, ac, g.lda)?)?;
    check_len(op, "B", b, extent(op, "B", g.batch, g.stride_b, br, bc, g.ldb)?)?;
    check_len(op, "C", c, extent(op, "C", g.batch, g.stride_c, g.m, g.n, g.ldc)?)
}
