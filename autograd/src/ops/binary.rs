//! Elementwise binary ops on [`Var`] with broadcasting, their scalar forms,
//! and `where_`. Both operands must have the same dtype and device (no
//! promotion: each gradient comes back in its input's dtype); gradients are
//! summed back to each input's shape with [`sum_to`].

use std::sync::Arc;

use tessera_tensor::{Result, Tensor};

use super::registry::{self as reg, Op};
use super::{check_same, record_op, sum_to};
use crate::autocast::autocast_entry;
use crate::{Saved, Var};

/// Saves `t` only when `keep` (the input whose gradient reads it requires
/// one), so a frozen operand's partner is not kept alive.
fn keep_if(keep: bool, t: &Var) -> Option<Saved> {
    keep.then(|| t.saved())
}

/// The saved value a backward relies on being present whenever the
/// gradient that reads it is requested. Errors when a parameter saved by
/// reference cannot be read back.
fn saved(t: &Option<Saved>) -> Result<Tensor> {
    t.as_ref()
        .expect("saved when the input that reads it required grad")
        .get()
}

/// Records a binary op; `ga`/`gb` compute the gradient of each input (before
/// [`sum_to`]) and are called only for inputs that need one.
fn binary(
    op: Op,
    y: Tensor,
    a: &Var,
    b: &Var,
    ga: impl FnOnce(&Tensor) -> Result<Tensor> + Send + 'static,
    gb: impl FnOnce(&Tensor) -> Result<Tensor> + Send + 'static,
) -> Result<Var> {
    let (sa, sb) = (a.shape().to_vec(), b.shape().to_vec());
    record_op(op, y, &[a, b], move |g, needs| {
        let da = if needs[0] {
            Some(sum_to(&ga(g)?, &sa)?)
        } else {
            None
        };
        let db = if needs[1] {
            Some(sum_to(&gb(g)?, &sb)?)
        } else {
            None
        };
        Ok(vec![da, db])
    })
}

/// Records a scalar-form op (one input) whose gradient is `grad(g)`.
fn scalar(
    op: Op,
    y: Tensor,
    x: &Var,
    grad: impl FnOnce(&Tensor) -> Result<Tensor> + Send + 'static,
) -> Result<Var> {
    record_op(op, y, &[x], move |g, _| Ok(vec![Some(grad(g)?)]))
}

impl Var {
    /// `self + other`, broadcasting. Errors when dtypes or devices differ or
    /// the shapes do not broadcast.
    pub fn add(&self, other: &Var) -> Result<Var> {
        autocast_entry!(reg::ADD, [self, other], |c| c[0].add(&c[1]));
        check_same(reg::ADD, self, other)?;
        let y = self.tensor().add(other.tensor())?;
        binary(reg::ADD, y, self, other, |g| Ok(g.clone()), |g| Ok(g.clone()))
    }

    /// `self − other`, broadcasting. Errors as [`Var::add`].
    pub fn sub(&self, other: &Var) -> Result<Var> {
        autocast_entry!(reg::SUB, [self, other], |c| c[0].sub(&c[1]));
        check_same(reg::SUB, self, other)?;
        let y = self.tensor().sub(other.tensor())?;
        binary(reg::SUB, y, self, other, |g| Ok(g.clone()), |g| g.neg())
    }

    /// `self · other`, broadcasting. Errors as [`Var::add`].
    pub fn mul(&self, other: &Var) -> Result<Var> {
        autocast_entry!(reg::MUL, [self, other], |c| c[0].mul(&c[1]));
        check_same(reg::MUL, self, other)?;
        let y = self.tensor().mul(other.tensor())?;
        let (b, a) = (
            keep_if(self.requires_grad(), other),
            keep_if(other.requires_grad(), self),
        );
        binary(
            reg::MUL,
            y,
            self,
            other,
            move |g| g.mul(&saved(&b)?),
            move |g| g.mul(&saved(&a)?),
        )
    }

    /// `self / other`, broadcasting; the gradients are g/b and −g·a/b².
    /// Errors as [`Var::add`].
    pub fn div(&self, other: &Var) -> Result<Var> {
        autocast_entry!(reg::DIV, [self, other], |c| c[0].div(&c[1]));
        check_same(reg::DIV, self, other)?;
        let y = self.tensor().div(other.tensor())?;
        let b = Arc::new(other.saved());
        let a = keep_if(other.requires_grad(), self);
        let b2 = b.clone();
        binary(
            reg::DIV,
            y,
            self,
            other,
            move |g| g.div(&b.get()?),
            move |g| g.mul(&saved(&a)?)?.div(&b2.get()?.square()?)?.neg(),
        )
    }

    /// The elementwise larger value, broadcasting; the gradient goes to the
    /// larger operand, split evenly on ties (PyTorch's `maximum`). Errors as
    /// [`Var::add`].
    pub fn maximum(&self, other: &Var) -> Result<Var> {
        self.extremum(other, reg::MAXIMUM, true)
    }

    /// The elementwise smaller value, broadcasting; the gradient goes to the
    /// smaller operand, split evenly on ties. Errors as [`Var::add`].
    pub fn minimum(&self, other: &Var) -> Result<Var> {
        self.extremum(other, reg::MINIMUM, false)
    }

    fn extremum(&self, other: &Var, op: Op, max: bool) -> Result<Var> {
        autocast_entry!(op, [self, other], |c| c[0].extremum(&c[1], op, max));
        check_same(op, self, other)?;
        let (a, b) = (self.tensor(), other.tensor());
        let y = if max { a.maximum(b)? } else { a.minimum(b)? };
        // Weight of each operand: 1 where it wins, ½ on a tie, 0 elsewhere.
        let weight = move |x: &Tensor, o: &Tensor| -> Result<Tensor> {
            let wins = if max { x.gt(o)? } else { x.lt(o)? };
            let ties = x.eq(o)?.to_dtype(x.dtype())?.mul_scalar(0.5)?;
            wins.to_dtype(x.dtype())?.add(&ties)
        };
        let (a1, b1) = (a.clone(), b.clone());
        let (a2, b2) = (a.clone(), b.clone());
        binary(
            op,
            y,
            self,
            other,
            move |g| g.mul(&weight(&a1, &b1)?),
            move |g| g.mul(&weight(&b2, &a2)?),
        )
    }

    /// `self` to the power `exponent` elementwise, broadcasting. The
    /// gradients are b·a^(b−1)·g (0 where b = 0) and ln(a)·a^b·g (0 where
    /// a = 0 and b ≥ 0), as PyTorch's. Errors as [`Var::add`].
    pub fn pow(&self, exponent: &Var) -> Result<Var> {
        autocast_entry!(reg::POW, [self, exponent], |c| c[0].pow(&c[1]));
        check_same(reg::POW, self, exponent)?;
        let (a, b) = (self.tensor().clone(), exponent.tensor().clone());
        let y = a.pow(&b)?;
        let y_saved = keep_if(exponent.requires_grad(), &Var::constant(y.clone()));
        let (a1, b1) = (a.clone(), b.clone());
        binary(
            reg::POW,
            y,
            self,
            exponent,
            move |g| {
                let d = b1.mul(&a1.pow(&b1.sub_scalar(1.0)?)?)?;
                let d = Tensor::where_(&b1.eq_scalar(0.0)?, &d.zeros_like(None)?, &d)?;
                g.mul(&d)
            },
            move |g| {
                let d = saved(&y_saved)?.mul(&a.log()?)?;
                let zero_base = a.eq_scalar(0.0)?.logical_and(&b.ge_scalar(0.0)?)?;
                let d = Tensor::where_(&zero_base, &d.zeros_like(None)?, &d)?;
                g.mul(&d)
            },
        )
    }

    /// `a` where `cond` (a bool tensor) is true, else `b`, broadcasting all
    /// three; the gradient flows to the chosen operand. Errors when `cond` is
    /// not bool, `a` and `b` differ in dtype or device, or the shapes do not
    /// broadcast.
    pub fn where_(cond: &Tensor, a: &Var, b: &Var) -> Result<Var> {
        autocast_entry!(reg::WHERE, [a, b], |c| Var::where_(cond, &c[0], &c[1]));
        check_same(reg::WHERE, a, b)?;
        let y = Tensor::where_(cond, a.tensor(), b.tensor())?;
        let (c1, c2) = (cond.clone(), cond.clone());
        binary(
            reg::WHERE,
            y,
            a,
            b,
            move |g| Tensor::where_(&c1, g, &Tensor::zeros(&[], g.dtype())?),
            move |g| Tensor::where_(&c2, &Tensor::zeros(&[], g.dtype())?, g),
        )
    }

    /// `self + s`. Errors as [`Tensor::add_scalar`].
    pub fn add_scalar(&self, s: f64) -> Result<Var> {
        scalar(reg::ADD_SCALAR, self.tensor().add_scalar(s)?, self, |g| {
            Ok(g.clone())
        })
    }

    /// `self − s`. Errors as [`Tensor::sub_scalar`].
    pub fn sub_scalar(&self, s: f64) -> Result<Var> {
        scalar(reg::SUB_SCALAR, self.tensor().sub_scalar(s)?, self, |g| {
            Ok(g.clone())
        })
    }

    /// `s − self`. Errors as [`Tensor::rsub_scalar`].
    pub fn rsub_scalar(&self, s: f64) -> Result<Var> {
        scalar(reg::RSUB_SCALAR, self.tensor().rsub_scalar(s)?, self, |g| g.neg())
    }

    /// `self · s`. Errors as [`Tensor::mul_scalar`].
    pub fn mul_scalar(&self, s: f64) -> Result<Var> {
        scalar(reg::MUL_SCALAR, self.tensor().mul_scalar(s)?, self, move |g| {
            g.mul_scalar(s)
        })
    }

    /// `self / s`. Errors as [`Tensor::div_scalar`].
    pub fn div_scalar(&self, s: f64) -> Result<Var> {
        scalar(reg::DIV_SCALAR, self.tensor().div_scalar(s)?, self, move |g| {
            g.div_scalar(s)
        })
    }

    /// `s / self`; the gradient is −s·g/x². Errors as [`Tensor::rdiv_scalar`].
    pub fn rdiv_scalar(&self, s: f64) -> Result<Var> {
        let x = self.tensor().clone();
        scalar(reg::RDIV_SCALAR, self.tensor().rdiv_scalar(s)?, self, move |g| {
            g.mul_scalar(-s)?.div(&x.mul(&x)?)
        })
    }
}
