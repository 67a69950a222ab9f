//! The checkpoint node: gradients through a recomputed segment, including
//! a parameter the segment captures.

use tessera_autograd::{checkpoint, Var};

use crate::gradcheck::common::{check, input, prop, Checked, Domain};

fn checkpointed(n: u32) -> Checked {
    prop(n, input(Domain::Any), |inp| {
        check(&[inp.leaf(), inp.leaf()], |xs| {
            let w = inp.arrange.apply(&xs[1])?;
            let out = checkpoint(
                move |ys: &[Var]| Ok(vec![ys[0].tanh()?.mul(&w)?.exp()?]),
                &[inp.arrange.apply(&xs[0])?],
            )?;
            Ok(out.into_iter().next().expect("one output"))
        })
    })
}

cases! {
    checkpoint: ["checkpoint"] => checkpointed;
}
