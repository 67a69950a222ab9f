//! Gradient checks (central differences in f64) for every registered
//! differentiable op, driven by proptest over random shapes, broadcasting
//! pairs and strided layouts, and the test that every entry of
//! `DIFFERENTIABLE_OPS` has one.
//!
//! Cases live in one module per op family; each module's `cases!` table is
//! listed in [`all_cases`]. nn-level ops add theirs in `nn.rs`.

#[macro_use]
mod common;
mod binary;
mod checkpoint;
mod nn;
mod norm;
mod reduce;
mod unary;
mod view;

use std::collections::BTreeSet;

use common::Case;
use tessera_autograd::DIFFERENTIABLE_OPS;

/// Every case of every module.
fn all_cases() -> Vec<&'static Case> {
    [
        unary::CASES,
        binary::CASES,
        reduce::CASES,
        view::CASES,
        norm::CASES,
        checkpoint::CASES,
        nn::CASES,
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Every registered op is covered by a case whose checked graphs actually
/// recorded it, and no case recorded an op name missing from the registry
/// (an op recorded under a stray name). Runs each case once.
#[test]
fn every_registered_op_has_a_gradcheck() {
    let mut covered = BTreeSet::new();
    for case in all_cases() {
        let seen = common::run_case(case, 1);
        for op in &seen {
            assert!(
                DIFFERENTIABLE_OPS.contains(op),
                "case `{}` recorded op `{op}`, which is not in DIFFERENTIABLE_OPS",
                case.name
            );
        }
        covered.extend(seen);
    }
    let missing: Vec<&str> = DIFFERENTIABLE_OPS
        .iter()
        .copied()
        .filter(|op| !covered.contains(op))
        .collect();
    assert!(
        missing.is_empty(),
        "registered ops without a gradcheck case: {missing:?}"
    );
}
