//! Unary, binary and `where` over strided broadcast operands; strided
//! copies; casts; fill; Philox random numbers.

use std::mem::size_of;

use super::Float;
use crate::launch::{check_len, grid_for, to_i64, Arg, DevPtr, KernelType, Launch};
use crate::module::Module;
pub use crate::op_codes::{BinaryOp, CompareOp, UnaryOp};
use crate::{Error, Result};

const BLOCK: u32 = 256;
/// Most dimensions a strided launch takes after merging (the kernel's `EW_MAX_DIMS`).
pub const MAX_DIMS: usize = 8;

/// An input operand: the buffer, its element offset and its strides over the
/// output shape (0 where it broadcasts; negative allowed).
#[derive(Debug, Clone, Copy)]
pub struct Operand<'a, T> {
    /// Buffer holding the operand.
    pub ptr: DevPtr<T>,
    /// Element offset of index (0, …, 0).
    pub offset: usize,
    /// One stride per output dimension, in elements.
    pub strides: &'a [isize],
}

impl<'a, T> Operand<'a, T> {
    /// A contiguous operand of `shape` at offset 0; `strides` must outlive it.
    pub fn new(ptr: DevPtr<T>, strides: &'a [isize]) -> Self {
        Operand {
            ptr,
            offset: 0,
            strides,
        }
    }
}

/// Row-major contiguous strides of `shape`.
pub fn contiguous_strides(shape: &[usize]) -> Vec<isize> {
    let mut s = vec![0isize; shape.len()];
    let mut acc = 1isize;
    for d in (0..shape.len()).rev() {
        s[d] = acc;
        acc = acc.saturating_mul(shape[d] as isize);
    }
    s
}

/// Checks an operand against the output shape and returns the device
/// address of its element (0, …, 0).
fn check_operand<T>(op: &'static str, what: &str, o: &Operand<'_, T>, shape: &[usize]) -> Result<u64> {
    if o.strides.len() != shape.len() {
        return Err(Error::arg(
            op,
            format!(
                "{what} has {} strides for a {}-d output {shape:?}",
                o.strides.len(),
                shape.len()
            ),
        ));
    }
    if shape.contains(&0) {
        return Ok(o.ptr.addr());
    }
    let (mut lo, mut hi) = (o.offset as i128, o.offset as i128);
    for (&n, &s) in shape.iter().zip(o.strides) {
        let span = (n as i128 - 1) * s as i128;
        if span < 0 {
            lo += span;
        } else {
            hi += span;
        }
    }
    if lo < 0 || hi >= o.ptr.len() as i128 {
        return Err(Error::arg(
            op,
            format!(
                "{what} with offset {} and strides {:?} over shape {shape:?} reaches elements {lo}..={hi} of a buffer of {}",
                o.offset,
                o.strides,
                o.ptr.len()
            ),
        ));
    }
    Ok(o.ptr.addr() + (o.offset * size_of::<T>()) as u64)
}

/// Drops size-1 dimensions and merges dimensions that are contiguous in
/// every operand, so most views fit [`MAX_DIMS`].
fn coalesce(shape: &[usize], strides: &[&[isize]]) -> (Vec<usize>, Vec<Vec<isize>>) {
    let mut sh: Vec<usize> = Vec::new();
    let mut st: Vec<Vec<isize>> = vec![Vec::new(); strides.len()];
    for d in 0..shape.len() {
        if shape[d] == 1 {
            continue;
        }
        let mergeable = !sh.is_empty()
            && strides
                .iter()
                .zip(&st)
                .all(|(s, cur)| cur[cur.len() - 1] == s[d] * shape[d] as isize);
        if mergeable {
            let last = sh.len() - 1;
            sh[last] *= shape[d];
            for (k, s) in strides.iter().enumerate() {
                let l = st[k].len() - 1;
                st[k][l] = s[d];
            }
        } else {
            sh.push(shape[d]);
            for (k, s) in strides.iter().enumerate() {
                st[k].push(s[d]);
            }
        }
    }
    (sh, st)
}

/// Packs `StridedArgs` of elementwise.cu, or `None` when every operand is
/// contiguous (the fast path).
fn strided_args(op: &'static str, shape: &[usize], strides: &[&[isize]]) -> Result<Option<Arg>> {
    let (sh, st) = coalesce(shape, strides);
    if sh.len() <= 1 && st.iter().all(|s| s.first().is_none_or(|&x| x == 1)) {
        return Ok(None);
    }
    pack_strided(op, &sh, &st).map(Some)
}

fn pack_strided(op: &'static str, sh: &[usize], st: &[Vec<isize>]) -> Result<Arg> {
    if sh.len() > MAX_DIMS {
        return Err(Error::arg(
            op,
            format!("{} dimensions after merging, at most {MAX_DIMS}", sh.len()),
        ));
    }
    let mut fields = vec![Arg::i64(sh.len() as i64)];
    for d in 0..MAX_DIMS {
        fields.push(Arg::i64(sh.get(d).copied().unwrap_or(1) as i64));
    }
    for k in 0..3 {
        for d in 0..MAX_DIMS {
            fields.push(Arg::i64(
                st.get(k).and_then(|s| s.get(d)).copied().unwrap_or(0) as i64
            ));
        }
    }
    Ok(Arg::fields(&fields))
}

fn launch(kernel: String, n: usize, args: Vec<Arg>) -> Launch {
    Launch {
        module: Module::Elementwise,
        kernel,
        grid: [grid_for(n as u64, BLOCK), 1, 1],
        block: [BLOCK, 1, 1],
        shared_mem: 0,
        args,
    }
}

fn out_ptr<T>(op: &'static str, y: DevPtr<T>, shape: &[usize]) -> Result<usize> {
    let n = shape
        .iter()
        .try_fold(1usize, |a, &b| a.checked_mul(b))
        .ok_or_else(|| Error::arg(op, format!("shape {shape:?} overflows")))?;
    check_len(op, "output", &y, n)?;
    Ok(n)
}

/// y = op(x) elementwise; `y` is contiguous with `shape`.
///
/// Errors: operand strides not matching `shape`, an operand reaching outside
/// its buffer, `y` too short, more than [`MAX_DIMS`] non-mergeable dims.
pub fn unary<T: Float>(op: UnaryOp, x: Operand<'_, T>, y: DevPtr<T>, shape: &[usize]) -> Result<Launch> {
    const OP: &str = "unary";
    let n = out_ptr(OP, y, shape)?;
    let xa = check_operand(OP, "x", &x, shape)?;
    let n64 = to_i64(OP, "numel", n)?;
    Ok(match strided_args(OP, shape, &[x.strides])? {
        None => launch(
            format!("unary_contig_{}", T::NAME),
            n,
            vec![Arg::i32(op.code()), Arg::i64(n64), Arg::u64(xa), Arg::ptr(y)],
        ),
        Some(s) => launch(
            format!("unary_strided_{}", T::NAME),
            n,
            vec![Arg::i32(op.code()), Arg::i64(n64), s, Arg::u64(xa), Arg::ptr(y)],
        ),
    })
}

/// y = op(a, b) elementwise with broadcasting through 0 strides.
///
/// Errors: as [`unary`].
pub fn binary<T: Float>(
    op: BinaryOp,
    a: Operand<'_, T>,
    b: Operand<'_, T>,
    y: DevPtr<T>,
    shape: &[usize],
) -> Result<Launch> {
    const OP: &str = "binary";
    let n = out_ptr(OP, y, shape)?;
    let (aa, ba) = (
        check_operand(OP, "a", &a, shape)?,
        check_operand(OP, "b", &b, shape)?,
    );
    let n64 = to_i64(OP, "numel", n)?;
    Ok(match strided_args(OP, shape, &[a.strides, b.strides])? {
        None => launch(
            format!("binary_contig_{}", T::NAME),
            n,
            vec![
                Arg::i32(op.code()),
                Arg::i64(n64),
                Arg::u64(aa),
                Arg::u64(ba),
                Arg::ptr(y),
            ],
        ),
        Some(s) => launch(
            format!("binary_strided_{}", T::NAME),
            n,
            vec![
                Arg::i32(op.code()),
                Arg::i64(n64),
                s,
                Arg::u64(aa),
                Arg::u64(ba),
                Arg::ptr(y),
            ],
        ),
    })
}

/// Element types the comparison kernels take: the floats, i64 and bool
/// (bytes holding 0 or 1).
pub trait Comparable: KernelType {}
impl Comparable for f32 {}
impl Comparable for half::f16 {}
impl Comparable for half::bf16 {}
impl Comparable for i64 {}
impl Comparable for u8 {}

/// y = `op`(a, b) elementwise as bytes (1 = true), with broadcasting
/// (zero strides); float and bool operands widened to f32, which is exact
/// for every dtype taken, i64 operands compared as integers.
///
/// Errors: as [`binary`].
pub fn compare<T: Comparable>(
    op: CompareOp,
    a: Operand<'_, T>,
    b: Operand<'_, T>,
    y: DevPtr<u8>,
    shape: &[usize],
) -> Result<Launch> {
    const OP: &str = "compare";
    let n = out_ptr(OP, y, shape)?;
    let (aa, ba) = (
        check_operand(OP, "a", &a, shape)?,
        check_operand(OP, "b", &b, shape)?,
    );
    let (sh, st) = coalesce(shape, &[a.strides, b.strides]);
    let s = pack_strided(OP, &sh, &st)?;
    Ok(launch(
        format!("compare_strided_{}", T::NAME),
        n,
        vec![
            Arg::i32(op.code()),
            Arg::i64(to_i64(OP, "numel", n)?),
            s,
            Arg::u64(aa),
            Arg::u64(ba),
            Arg::ptr(y),
        ],
    ))
}

/// y = x clamped to [`lo`, `hi`] in f32 (NaN stays NaN; `lo > hi` gives
/// `hi`), rounded once to `T`.
///
/// Errors: as [`unary`].
pub fn clamp<T: Float>(x: Operand<'_, T>, y: DevPtr<T>, shape: &[usize], lo: f32, hi: f32) -> Result<Launch> {
    const OP: &str = "clamp";
    let n = out_ptr(OP, y, shape)?;
    let xa = check_operand(OP, "x", &x, shape)?;
    let (sh, st) = coalesce(shape, &[x.strides]);
    let s = pack_strided(OP, &sh, &st)?;
    Ok(launch(
        format!("clamp_strided_{}", T::NAME),
        n,
        vec![
            Arg::i64(to_i64(OP, "numel", n)?),
            s,
            Arg::u64(xa),
            Arg::ptr(y),
            Arg::f32(lo),
            Arg::f32(hi),
        ],
    ))
}

/// The kernel suffix of an element size.
fn width_of<T>(op: &'static str) -> Result<&'static str> {
    Ok(match size_of::<T>() {
        1 => "b1",
        2 => "b2",
        4 => "b4",
        8 => "b8",
        n => return Err(Error::arg(op, format!("no kernel for {n}-byte elements"))),
    })
}

/// y[i] = x[off_x(i) + idx[off_idx(i)] · `dim_stride`] over the output
/// `shape` (index_select, gather): `x`'s strides are 0 along `dim`, where
/// the index picks one of `dim_size` positions `dim_stride` apart. Any
/// element type by size.
///
/// Errors: layouts reaching past their buffers (x checked over all
/// `dim_size` positions), sizes overflowing. The index values themselves
/// are the caller's to check (`0..dim_size`).
#[allow(clippy::too_many_arguments)]
pub fn gather<T: KernelType>(
    x: Operand<'_, T>,
    dim: usize,
    dim_size: usize,
    dim_stride: isize,
    idx: Operand<'_, i64>,
    y: DevPtr<T>,
    shape: &[usize],
) -> Result<Launch> {
    const OP: &str = "gather";
    let width = width_of::<T>(OP)?;
    let n = out_ptr(OP, y, shape)?;
    if dim >= shape.len() {
        return Err(Error::arg(OP, format!("dim {dim} of a {}-d output", shape.len())));
    }
    let xa = check_operand(OP, "x", &x, shape)?;
    if n > 0 && dim_size > 0 {
        let (mut sh, mut st) = (shape.to_vec(), x.strides.to_vec());
        sh[dim] = dim_size;
        st[dim] = dim_stride;
        check_operand(OP, "x", &Operand { strides: &st, ..x }, &sh)?;
    }
    let ia = check_operand(OP, "idx", &idx, shape)?;
    let (sh, st) = coalesce(shape, &[x.strides, idx.strides]);
    let s = pack_strided(OP, &sh, &st)?;
    Ok(launch(
        format!("gather_strided_{width}"),
        n,
        vec![
            Arg::i64(to_i64(OP, "numel", n)?),
            s,
            Arg::u64(xa),
            Arg::u64(ia),
            Arg::i64(dim_stride as i64),
            Arg::ptr(y),
        ],
    ))
}

/// How [`scatter`] combines into the output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scatter {
    /// out = src (the last write in the index's row-major order wins).
    Src,
    /// out = this value: the element's bits in the low bytes.
    Value(u64),
    /// out += src in f32, rounded per addition (floats only).
    Add,
}

/// Scatters along `dim` of the index `shape`: for each index position `p`,
/// `out[p with dim replaced by idx[p]] (∘)= src[p]`, in the index's
/// row-major order (one thread per lane along `dim`, so the result is
/// deterministic). `out` (strides of the output, whose `dim` has
/// `out_dim_size` positions) is written in place.
///
/// Errors: layouts reaching past their buffers, [`Scatter::Add`] on a
/// non-float type, sizes overflowing. The index values are the caller's to
/// check (`0..out_dim_size`).
#[allow(clippy::too_many_arguments)]
pub fn scatter<T: KernelType>(
    how: Scatter,
    src: Option<Operand<'_, T>>,
    idx: Operand<'_, i64>,
    out: Operand<'_, T>,
    dim: usize,
    out_dim_size: usize,
    shape: &[usize],
) -> Result<Launch> {
    const OP: &str = "scatter";
    if dim >= shape.len() {
        return Err(Error::arg(OP, format!("dim {dim} of a {}-d index", shape.len())));
    }
    // With a value no source is read: its strides are the index's.
    let (sa, src_strides) = match (how, src) {
        (Scatter::Value(_), _) => (0, idx.strides),
        (_, Some(src)) => (check_operand(OP, "src", &src, shape)?, src.strides),
        (_, None) => return Err(Error::arg(OP, "scatter without a source")),
    };
    let ia = check_operand(OP, "idx", &idx, shape)?;
    let mut wide = shape.to_vec();
    wide[dim] = out_dim_size;
    let oa = check_operand(OP, "out", &out, &wide)?;
    let mut lane = shape.to_vec();
    lane[dim] = 1;
    let lanes = lane
        .iter()
        .try_fold(1usize, |a, &b| a.checked_mul(b))
        .ok_or_else(|| Error::arg(OP, format!("shape {shape:?} overflows")))?;
    let (sh, st) = coalesce(&lane, &[src_strides, idx.strides, out.strides]);
    let s = pack_strided(OP, &sh, &st)?;
    let len = if shape.contains(&0) || out_dim_size == 0 {
        0
    } else {
        shape[dim]
    };
    let mut args = vec![
        Arg::i64(to_i64(OP, "lanes", lanes)?),
        s,
        Arg::i64(to_i64(OP, "len", len)?),
        Arg::i64(src_strides[dim] as i64),
        Arg::i64(idx.strides[dim] as i64),
        Arg::i64(out.strides[dim] as i64),
        Arg::u64(sa),
        Arg::u64(ia),
        Arg::u64(oa),
    ];
    let kernel = match how {
        Scatter::Add => {
            if !["f32", "f16", "bf16"].contains(&T::NAME) {
                return Err(Error::arg(OP, format!("no scatter_add kernel for {}", T::NAME)));
            }
            format!("scatter_add_{}", T::NAME)
        }
        Scatter::Src | Scatter::Value(_) => {
            let v = match how {
                Scatter::Value(v) => v,
                _ => 0,
            };
            args.extend([Arg::i32(matches!(how, Scatter::Value(_)) as i32), Arg::u64(v)]);
            format!("scatter_{}", width_of::<T>(OP)?)
        }
    };
    Ok(launch(kernel, lanes, args))
}

/// y = tril (`lower`) or triu of the contiguous `x` = [batch, rows, cols]:
/// element (i, j) kept when j − i ≤ `diag` (lower) or ≥ `diag`, else
/// all-zero bits; any element type by size.
///
/// Errors: buffers too short, an element size without a kernel.
pub fn tri<T: KernelType>(
    x: DevPtr<T>,
    y: DevPtr<T>,
    batch: usize,
    rows: usize,
    cols: usize,
    diag: i64,
    lower: bool,
) -> Result<Launch> {
    const OP: &str = "tri";
    let width = width_of::<T>(OP)?;
    let n = batch
        .checked_mul(rows)
        .and_then(|v| v.checked_mul(cols))
        .ok_or_else(|| Error::arg(OP, format!("[{batch}, {rows}, {cols}] overflows")))?;
    check_len(OP, "x", &x, n)?;
    check_len(OP, "y", &y, n)?;
    Ok(launch(
        format!("tri_{width}"),
        n,
        vec![
            Arg::i64(to_i64(OP, "numel", n)?),
            Arg::i64(to_i64(OP, "rows", rows)?.max(1)),
            Arg::i64(to_i64(OP, "cols", cols)?.max(1)),
            Arg::i64(diag),
            Arg::i32(lower as i32),
            Arg::ptr(x),
            Arg::ptr(y),
        ],
    ))
}

/// y = cond ? a : b elementwise (cond is bytes, nonzero = true), for any
/// element type (by its size: 1, 2, 4 or 8 bytes).
///
/// Errors: as [`unary`], and other element sizes.
pub fn where_<T: KernelType>(
    cond: Operand<'_, u8>,
    a: Operand<'_, T>,
    b: Operand<'_, T>,
    y: DevPtr<T>,
    shape: &[usize],
) -> Result<Launch> {
    const OP: &str = "where";
    let width = width_of::<T>(OP)?;
    let n = out_ptr(OP, y, shape)?;
    let ca = check_operand(OP, "cond", &cond, shape)?;
    let (aa, ba) = (
        check_operand(OP, "a", &a, shape)?,
        check_operand(OP, "b", &b, shape)?,
    );
    let (sh, st) = coalesce(shape, &[cond.strides, a.strides, b.strides]);
    let s = pack_strided(OP, &sh, &st)?;
    Ok(launch(
        format!("where_strided_{width}"),
        n,
        vec![
            Arg::i64(to_i64(OP, "numel", n)?),
            s,
            Arg::u64(ca),
            Arg::u64(aa),
            Arg::u64(ba),
            Arg::ptr(y),
        ],
    ))
}

/// `y` at its layout = `x` at its layout, over `shape`: a copy between any
/// two views of one shape, for any element type (by its size: 1, 2, 4 or 8
/// bytes). `y`'s layout must not reach one element twice (an injective
/// view: narrow, select, a slice, a permutation), else the copy races.
///
/// Errors: an element size other than 1, 2, 4 or 8, strides not matching
/// `shape`, an operand reaching outside its buffer, a self-overlapping
/// destination (a 0 stride over more than one element), more than
/// [`MAX_DIMS`] non-mergeable dims.
pub fn copy_strided<T: KernelType>(x: Operand<'_, T>, y: Operand<'_, T>, shape: &[usize]) -> Result<Launch> {
    const OP: &str = "copy_strided";
    let width = width_of::<T>(OP)?;
    let n = shape
        .iter()
        .try_fold(1usize, |a, &b| a.checked_mul(b))
        .ok_or_else(|| Error::arg(OP, format!("shape {shape:?} overflows")))?;
    let xa = check_operand(OP, "x", &x, shape)?;
    let ya = check_operand(OP, "y", &y, shape)?;
    if shape.iter().zip(y.strides).any(|(&d, &s)| d > 1 && s == 0) {
        return Err(Error::arg(
            OP,
            format!(
                "destination strides {:?} over {shape:?} write one element twice",
                y.strides
            ),
        ));
    }
    let (sh, st) = coalesce(shape, &[x.strides, y.strides]);
    let s = pack_strided(OP, &sh, &st)?;
    Ok(launch(
        format!("copy_strided_{width}"),
        n,
        vec![Arg::i64(to_i64(OP, "numel", n)?), s, Arg::u64(xa), Arg::u64(ya)],
    ))
}

/// y = x converted from `I` to `O` (round to nearest even), `n` elements.
///
/// Errors: `I == O`, a buffer shorter than `n`.
pub fn cast<I: Float, O: Float>(x: DevPtr<I>, y: DevPtr<O>, n: usize) -> Result<Launch> {
    const OP: &str = "cast";
    if I::NAME == O::NAME {
        return Err(Error::arg(OP, format!("cast from {} to itself", I::NAME)));
    }
    check_len(OP, "x", &x, n)?;
    check_len(OP, "y", &y, n)?;
    Ok(launch(
        format!("cast_{}_{}", I::NAME, O::NAME),
        n,
        vec![Arg::i64(to_i64(OP, "n", n)?), Arg::ptr(x), Arg::ptr(y)],
    ))
}

/// Sets `n` elements of `y` to `value` (rounded to `T`).
///
/// Errors: `y` shorter than `n`.
pub fn fill<T: Float>(y: DevPtr<T>, n: usize, value: f32) -> Result<Launch> {
    check_len("fill", "y", &y, n)?;
    Ok(launch(
        format!("fill_{}", T::NAME),
        n,
        vec![Arg::i64(to_i64("fill", "n", n)?), Arg::f32(value), Arg::ptr(y)],
    ))
}

/// Philox uniforms in [low, high) for `n` elements from stream word `offset`
/// (see [`crate::philox`] for the stream convention): `low + (high - low) *
/// u` in f32, where `u` holds as many random bits as `T` has significand
/// bits (24, 11, 8), so [0, 1) gives exactly tessera-tensor's `rand`.
///
/// Errors: `y` shorter than `n`, `offset + n` overflowing u64.
pub fn uniform<T: Float>(
    y: DevPtr<T>,
    n: usize,
    seed: u64,
    offset: u64,
    low: f32,
    high: f32,
) -> Result<Launch> {
    const OP: &str = "uniform";
    check_len(OP, "y", &y, n)?;
    offset
        .checked_add(n as u64)
        .ok_or_else(|| Error::arg(OP, format!("offset {offset} + {n} overflows")))?;
    let mut l = launch(
        format!("philox_uniform_{}", T::NAME),
        n.div_ceil(4) + 1,
        vec![
            Arg::i64(to_i64(OP, "n", n)?),
            Arg::u64(seed),
            Arg::u64(offset),
            Arg::f32(low),
            Arg::f32(high),
            Arg::ptr(y),
        ],
    );
    l.module = Module::Philox;
    Ok(l)
}

/// Philox normals with `mean` and `std` for `n` elements, two per counter
/// block from block `block` on (Box-Muller in f64 on 53-bit uniforms,
/// rounded once to `T`): tessera-tensor's `randn`/`normal` layout (see
/// [`crate::philox::normal`]). Block counters wrap like the CPU's.
///
/// Errors: `y` shorter than `n`.
pub fn normal<T: Float>(
    y: DevPtr<T>,
    n: usize,
    seed: u64,
    block: u64,
    mean: f64,
    std: f64,
) -> Result<Launch> {
    const OP: &str = "normal";
    check_len(OP, "y", &y, n)?;
    let mut l = launch(
        format!("philox_normal_{}", T::NAME),
        n.div_ceil(2),
        vec![
            Arg::i64(to_i64(OP, "n", n)?),
            Arg::u64(seed),
            Arg::u64(block),
            Arg::f64(mean),
            Arg::f64(std),
            Arg::ptr(y),
        ],
    );
    l.module = Module::Philox;
    Ok(l)
}
