//! `examples/custom_module.rs` runs to completion: it trains, evaluates,
//! checkpoints, restores and checks the restored logits (an `Err` or a
//! failed assertion otherwise).

#[path = "../../examples/custom_module.rs"]
mod custom_module;

#[test]
fn custom_module_example_runs() {
    custom_module::main().unwrap();
}
