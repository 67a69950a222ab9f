//! Unary, binary and `where` over strided broadcast operands; strided
//! copies; casts; fill; Philox random numbers.

use std::mem::size_of;

use super::Float;
use crate::launch::{check_len, grid_for, to_i64, Arg, DevPtr, KernelType, Launch};
use crate::module::Module;
pub use crate::op_codes::{BinaryOp, UnaryOp};
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

/// y = cond ? a : b elementwise (cond is bytes, nonzero = true).
///
/// Errors: as [`unary`].
pub fn where_<T: Float>(
    cond: Operand<'_, u8>,
    a: Operand<'_, T>,
    b: Operand<'_, T>,
    y: DevPtr<T>,
    shape: &[usize],
) -> Result<Launch> {
    const OP: &str = "where";
    let n = out_ptr(OP, y, shape)?;
    let ca = check_operand(OP, "cond", &cond, shape)?;
    let (aa, ba) = (
        check_operand(OP, "a", &a, shape)?,
        check_operand(OP, "b", &b, shape)?,
    );
    let (sh, st) = coalesce(shape, &[cond.strides, a.strides, b.strides]);
    let s = pack_strided(OP, &sh, &st)?;
    Ok(launch(
        format!("where_strided_{}", T::NAME),
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
    let width = match size_of::<T>() {
        1 => "b1",
        2 => "b2",
        4 => "b4",
        8 => "b8",
        n => return Err(Error::arg(OP, format!("no copy kernel for {n}-byte elements"))),
    };
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
