//! `Tensor` and `Var` methods of the same name take the same arguments and
//! return the same shape of result (`Result<Tensor>` / `Result<Var>`, ...):
//! [`parity!`] compiles every shared call with one argument expression for
//! both types, runs both and requires the same values; a second test reads
//! the two crates' sources and fails when a method name shared by both
//! types is missing from the table.

use std::collections::BTreeSet;
use std::path::Path;

use tessera_autograd::Var;
use tessera_tensor::ops::conv::Conv2dParams;
use tessera_tensor::ops::pool::Pool2dParams;
use tessera_tensor::{manual_seed, BatchNormOutput, DType, Device, GeluApprox, PadMode, Result, Tensor};

/// The operands every call draws from, as `S` (`Tensor` or `Var`) where
/// the method takes `S`, and as `Tensor` where both take a tensor.
struct Operands<S> {
    /// `[2, 4, 3, 3]`: the image-like input most calls run on.
    x: S,
    /// `[5, 3]`: a matrix (linear weight, embedding table).
    m: S,
    /// `[4]`: per-channel weights.
    c: S,
    /// `[3]`: weights over the last dim of `x`.
    l: S,
    /// `[6, 4, 2, 2]`: a conv2d weight.
    k: S,
    /// `[4]`: running statistics for batch_norm.
    stats: Tensor,
    /// i64 `[2, 4, 3, 1]`, values in `0..3`: gather/scatter indices along dim -1.
    along: Tensor,
    /// i64 `[2]`: rows for index_select along dim 1.
    rows: Tensor,
    /// i64 `[2, 2]`, values in `0..5`: embedding indices into `m`.
    ids: Tensor,
    /// bool `[3, 3]`: a mask broadcasting against `x`.
    mask: Tensor,
}

fn operands<S>(wrap: impl Fn(Tensor) -> S) -> Result<Operands<S>> {
    manual_seed(11);
    let randn = |shape: &[usize]| Tensor::randn(shape, DType::F64);
    let i64s = |v: Vec<i64>, shape: &[usize]| Tensor::from_vec(v, shape);
    Ok(Operands {
        x: wrap(randn(&[2, 4, 3, 3])?),
        m: wrap(randn(&[5, 3])?),
        c: wrap(randn(&[4])?.abs()?),
        l: wrap(randn(&[3])?),
        k: wrap(randn(&[6, 4, 2, 2])?),
        stats: Tensor::ones(&[4], DType::F64)?,
        along: i64s((0..24).map(|i| i % 3).collect(), &[2, 4, 3, 1])?,
        rows: i64s(vec![3, 0], &[2])?,
        ids: i64s(vec![4, 0, 2, 2], &[2, 2])?,
        mask: i64s((0..9).map(|i| i % 2).collect(), &[3, 3])?.to_dtype(DType::Bool)?,
    })
}

/// What a call returned, as text: tensors as their PyTorch-style `Display`
/// (`Var`s through their tensor), so both sides compare by value.
trait Shown {
    fn shown(&self) -> String;
}

impl Shown for Tensor {
    fn shown(&self) -> String {
        format!("{self} {:?}", self.shape())
    }
}

impl Shown for Var {
    fn shown(&self) -> String {
        self.tensor().shown()
    }
}

impl<T: Shown> Shown for Vec<T> {
    fn shown(&self) -> String {
        self.iter().map(Shown::shown).collect::<Vec<_>>().join(" | ")
    }
}

impl<T: Shown> Shown for Option<T> {
    fn shown(&self) -> String {
        self.as_ref().map_or("None".into(), Shown::shown)
    }
}

impl<A: Shown, B: Shown> Shown for (A, B) {
    fn shown(&self) -> String {
        format!("({}, {})", self.0.shown(), self.1.shown())
    }
}

impl<T: Shown> Shown for BatchNormOutput<T> {
    fn shown(&self) -> String {
        format!(
            "{} {} {}",
            self.y.shown(),
            self.running_mean.shown(),
            self.running_var.shown()
        )
    }
}

macro_rules! shown_by_debug {
    ($($t:ty),*) => {$(
        impl Shown for $t {
            fn shown(&self) -> String {
                format!("{self:?}")
            }
        }
    )*};
}
shown_by_debug!(Device, DType, usize, &[usize]);

/// For each side, a function running every call on [`Operands`] of that
/// side's type `S`, with the result's type written once in terms of `S`
/// (default `S`); fallible calls are typed `Result<..>`, infallible ones
/// their value. `NAMES` lists the methods covered.
macro_rules! parity {
    (
        |$ops:ident|
        fallible { $($f:ident: $fcall:expr $(=> $fret:ty)?;)* }
        infallible { $($i:ident: $icall:expr => $iret:ty;)* }
    ) => {
        const NAMES: &[&str] = &[$(stringify!($f),)* $(stringify!($i),)*];

        mod tensor_side {
            use super::*;
            type S = Tensor;
            pub(super) fn run($ops: &Operands<S>) -> Vec<(&'static str, String)> {
                parity!(@body $ops; $($f: $fcall $(=> $fret)?;)*; $($i: $icall => $iret;)*)
            }
        }

        mod var_side {
            use super::*;
            type S = Var;
            pub(super) fn run($ops: &Operands<S>) -> Vec<(&'static str, String)> {
                parity!(@body $ops; $($f: $fcall $(=> $fret)?;)*; $($i: $icall => $iret;)*)
            }
        }
    };
    (@body $ops:ident; $($f:ident: $fcall:expr $(=> $fret:ty)?;)*; $($i:ident: $icall:expr => $iret:ty;)*) => {{
        let mut out = Vec::new();
        $(
            let r: Result<parity!(@ret $($fret)?)> = attempt(|| $fcall);
            out.push((stringify!($f), match r {
                Ok(v) => v.shown(),
                Err(e) => format!("Err({e})"),
            }));
        )*
        $(
            let r: $iret = $icall;
            out.push((stringify!($i), r.shown()));
        )*
        out
    }};
    (@ret) => { S };
    (@ret $t:ty) => { $t };
}

/// Runs `f`: lets a table entry use `?` on the operands it builds.
fn attempt<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    f()
}

parity! {
    |o|
    fallible {
        abs: o.x.abs();
        adaptive_avg_pool2d: o.x.adaptive_avg_pool2d([2, 2]);
        add: o.x.add(&o.x);
        add_scalar: o.x.add_scalar(1.5);
        avg_pool2d: o.x.avg_pool2d(&Pool2dParams::new(2));
        batch_norm: o.x.batch_norm(Some(&o.stats), Some(&o.stats), Some(&o.c), Some(&o.c), true, 0.1, 1e-5)
            => BatchNormOutput<S>;
        broadcast_to: o.x.broadcast_to(&[3, 2, 4, 3, 3]);
        cat: S::cat(&[o.x.clone(), o.x.clone()], 1);
        chunk: o.x.chunk(2, 1) => Vec<S>;
        clamp: o.x.clamp(Some(-0.5), Some(0.5));
        contiguous: o.x.transpose(0, 3)?.contiguous();
        conv2d: o.x.conv2d(&o.k, None, &Conv2dParams::default());
        cos: o.x.cos();
        cumsum: o.x.cumsum(1);
        div: o.x.div(&o.x.add_scalar(4.0)?);
        div_scalar: o.x.div_scalar(4.0);
        embedding: o.m.embedding(&o.ids, Some(2));
        erf: o.x.erf();
        exp: o.x.exp();
        expand: o.c.expand((3, ()));
        expm1: o.x.expm1();
        flatten: o.x.flatten(1, -1);
        flip: o.x.flip(&[0, -1]);
        gather: o.x.gather(-1, &o.along);
        gelu: o.x.gelu(GeluApprox::Tanh);
        group_norm: o.x.group_norm(2, Some(&o.c), Some(&o.c), 1e-5);
        index_select: o.x.index_select(1, &o.rows);
        interpolate_bilinear: o.x.interpolate_bilinear(Some([5, 4]), None, false);
        layer_norm: o.x.layer_norm(&[3], Some(&o.l), Some(&o.l), 1e-5);
        linear: o.x.linear(&o.m, None);
        log: o.x.abs()?.log();
        log1p: o.x.abs()?.log1p();
        log_softmax: o.x.log_softmax(-1);
        logsumexp: o.x.logsumexp(&[1, 2], true);
        masked_fill: o.x.masked_fill(&o.mask, -1.0);
        matmul: o.x.matmul(&o.x);
        max: o.x.max(&[-1], false);
        max_pool2d: o.x.max_pool2d(&Pool2dParams::new(2).stride(1));
        max_pool2d_with_indices: o.x.max_pool2d_with_indices(&Pool2dParams::new(2)) => (S, Tensor);
        maximum: o.x.maximum(&o.l);
        mean: o.x.mean(&[0, 2], true);
        min: o.x.min(&[], false);
        minimum: o.x.minimum(&o.l);
        mul: o.x.mul(&o.l);
        mul_scalar: o.x.mul_scalar(-2.0);
        narrow: o.x.narrow(1, 1, 2);
        neg: o.x.neg();
        norm: o.x.norm(2.0, &[1], false);
        pad: o.x.pad(&[1, 0, 0, 2], PadMode::Reflect);
        permute: o.x.permute(&[3, 1, 0, 2]);
        pow: o.x.abs()?.pow(&o.l);
        pow_scalar: o.x.pow_scalar(3.0);
        prod: o.x.prod(&[2], false);
        rdiv_scalar: o.x.add_scalar(4.0)?.rdiv_scalar(2.0);
        recip: o.x.add_scalar(4.0)?.recip();
        relu: o.x.relu();
        repeat: o.c.repeat(&[2, 3]);
        reshape: o.x.reshape((3, (), 2));
        rpow_scalar: o.x.rpow_scalar(2.0);
        rsqrt: o.x.abs()?.add_scalar(1.0)?.rsqrt();
        rsub_scalar: o.x.rsub_scalar(1.0);
        scatter_add: o.x.scatter_add(-1, &o.along, &o.x.narrow(-1, 0, 1)?);
        select: o.x.select(1, -1);
        sigmoid: o.x.sigmoid();
        silu: o.x.silu();
        sin: o.x.sin();
        slice: o.x.slice(1, 0, 4, 2);
        softmax: o.x.softmax(1);
        split: o.x.split(3, 1) => Vec<S>;
        split_with_sizes: o.x.split_with_sizes(&[1, 3], 1) => Vec<S>;
        sqrt: o.x.abs()?.sqrt();
        square: o.x.square();
        squeeze: o.x.narrow(0, 0, 1)?.squeeze(0);
        squeeze_all: o.x.narrow(0, 0, 1)?.squeeze_all();
        stack: S::stack(&[o.x.clone(), o.x.clone()], -1);
        std: o.x.std(&[1], 1.0, false);
        sub: o.x.sub(&o.l);
        sub_scalar: o.x.sub_scalar(0.25);
        sum: o.x.sum(&[0, -1], true);
        t: o.m.t();
        tanh: o.x.tanh();
        to_dtype: o.x.to_dtype(DType::F32);
        topk: o.x.topk(2, -1, false, true) => (S, Tensor);
        transpose: o.x.transpose(1, -1);
        tril: o.x.tril(0);
        triu: o.x.triu(-1);
        unsqueeze: o.x.unsqueeze(-1);
        var: o.x.var(&[0, 1], 0.0, false);
        view: o.x.view(((), 9));
        where_: S::where_(&o.mask, &o.x, &o.l);
    }
    infallible {
        device: o.x.device() => Device;
        dtype: o.x.dtype() => DType;
        ndim: o.x.ndim() => usize;
        numel: o.x.numel() => usize;
        shape: o.x.shape() => &[usize];
    }
}

#[test]
fn tensor_and_var_calls_agree() {
    let tensors = operands(|t| t).unwrap();
    let vars = operands(Var::leaf).unwrap();
    let (t, v) = (tensor_side::run(&tensors), var_side::run(&vars));
    assert_eq!(t.len(), NAMES.len());
    for ((name, t), (_, v)) in t.iter().zip(&v) {
        assert!(!t.starts_with("Err("), "{name} failed on Tensor: {t}");
        assert_eq!(t, v, "{name}: Tensor and Var disagree");
    }
}

/// Every `pub fn` that both `impl Tensor` (tensor crate) and `impl Var`
/// (this crate) define is in the [`parity!`] table, so a new method with one
/// name on both types cannot drift apart unnoticed.
#[test]
fn every_shared_method_is_in_the_table() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tensor = pub_fns(&root.join("../tensor/src"), "Tensor");
    let var = pub_fns(&root.join("src"), "Var");
    assert!(tensor.len() > 100 && var.len() > 50, "the scan found too little");
    let table: BTreeSet<&str> = NAMES.iter().copied().collect();
    let missing: Vec<&String> = tensor
        .intersection(&var)
        .filter(|n| !table.contains(n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "methods of both Tensor and Var missing from parity!: {missing:?}"
    );
}

/// The names of the `pub fn`s in the `impl <ty> {` blocks (rustfmt layout:
/// the block opens and closes at column 0) of the `.rs` files under `dir`.
fn pub_fns(dir: &Path, ty: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut stack = vec![dir.to_path_buf()];
    let open = format!("impl {ty} {{");
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let mut inside = false;
            for line in std::fs::read_to_string(&path).unwrap().lines() {
                if line == open {
                    inside = true;
                } else if line == "}" {
                    inside = false;
                } else if let Some(rest) = line.strip_prefix("    pub fn ").filter(|_| inside) {
                    let name: String = rest
                        .chars()
                        .take_while(|c| c.is_alphanumeric() || *c == '_')
                        .collect();
                    names.insert(name);
                }
            }
        }
    }
    names
}
