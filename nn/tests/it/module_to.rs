//! `Module::to`: every parameter and buffer of a tree moves (BatchNorm's
//! running statistics included), gradient keys survive, and a failed move
//! names the parameter and changes nothing.

use tessera_autograd::Var;
use tessera_nn::{BatchNorm, BatchNormOptions, Conv2d, Conv2dOptions, Linear, Module, Sequential};
use tessera_tensor::{DType, Device, Tensor};

fn model() -> Sequential {
    Sequential::new()
        .with(Conv2d::new(1, 2, 3, Conv2dOptions::default()).unwrap())
        .with(BatchNorm::new_2d(2, BatchNormOptions::default()).unwrap())
        .with(Linear::new(4, 3, true).unwrap())
}

#[test]
fn a_failed_move_names_the_parameter_and_changes_nothing() {
    let mut m = model();
    let before = m.state_dict();
    let e = m.to(Device::Cuda(4096)).unwrap_err();
    assert!(e.to_string().contains("0.weight"), "{e}");
    for (name, t) in m.state_dict().iter() {
        assert!(t.device().is_cpu(), "{name} moved");
        assert!(
            t.shares_storage(before.tensor(name).unwrap()),
            "{name} was replaced"
        );
    }
    // Moving to where it already is succeeds and keeps the values.
    m.to(Device::Cpu).unwrap();
}

#[cfg(feature = "cuda")]
#[test]
fn parameters_and_buffers_move_and_come_back() {
    const DEV: Device = Device::Cuda(0);
    if let Err(e) = DEV.available() {
        println!("skipped: no CUDA device ({e})");
        return;
    }
    let mut m = model();
    let before = m.state_dict();
    let ids: Vec<_> = m.parameters().iter().map(|p| p.id()).collect();
    m.to(DEV).unwrap();
    let names: Vec<String> = m.state_dict().iter().map(|(n, _)| n.to_string()).collect();
    assert!(names.iter().any(|n| n == "1.running_mean"), "{names:?}");
    for (name, t) in m.state_dict().iter() {
        assert_eq!(t.device(), DEV, "{name}");
    }
    for (_, b) in m.named_buffers() {
        assert_eq!(b.tensor().device(), DEV);
    }
    assert_eq!(
        ids,
        m.parameters().iter().map(|p| p.id()).collect::<Vec<_>>(),
        "gradient keys kept"
    );
    // A forward pass on the device needs its input there; a CPU input is a
    // clear error.
    let x = Var::constant(Tensor::ones(&[1, 1, 4, 6], DType::F32).unwrap());
    assert!(m.forward(&x).is_err());
    m.to(Device::Cpu).unwrap();
    for (name, t) in m.state_dict().iter() {
        let a = before
            .tensor(name)
            .unwrap()
            .to_dtype(DType::F64)
            .unwrap()
            .to_vec::<f64>()
            .unwrap();
        assert_eq!(
            a,
            t.to_dtype(DType::F64).unwrap().to_vec::<f64>().unwrap(),
            "{name} round trip"
        );
    }
}
