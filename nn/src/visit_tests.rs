//! `#[derive(Module)]`: every field kind is reached by the one walk, so no
//! child can be forgotten by `train`/`eval`, the parameter list or the state
//! dict.

use tessera_autograd::{Parameter, Var};
use tessera_tensor::{DType, Result, Tensor};

use crate::{Buffer, Dropout, Linear, Module, Sequential, Training, Visit};

/// Dropouts in every container a field may use, never named in a list.
#[derive(Module)]
struct Nested {
    direct: Dropout,
    in_vec: Vec<Dropout>,
    in_option: Option<Dropout>,
    absent: Option<Dropout>,
    in_array: [Dropout; 2],
    boxed: Box<dyn Module>,
    in_vec_of_options: Vec<Option<Inner>>,
    #[module(rename = "proj_weight")]
    proj: Parameter,
    stats: Buffer,
    #[module(skip)]
    width: usize,
}

#[derive(Module)]
struct Inner {
    fc: Linear,
    drop: Dropout,
    training: Training,
}

impl Module for Inner {
    fn forward(&self, x: &Var) -> Result<Var> {
        self.drop.forward(&self.fc.forward(x)?)
    }
}

impl Module for Nested {
    fn forward(&self, x: &Var) -> Result<Var> {
        Ok(x.clone())
    }
}

fn dropout() -> Dropout {
    Dropout::new(0.5).unwrap()
}

fn nested() -> Nested {
    let inner = || Inner {
        fc: Linear::new(2, 2, false).unwrap(),
        drop: dropout(),
        training: Training::default(),
    };
    Nested {
        direct: dropout(),
        in_vec: vec![dropout(), dropout()],
        in_option: Some(dropout()),
        absent: None,
        in_array: [dropout(), dropout()],
        boxed: Box::new(Sequential::new().with(dropout())),
        in_vec_of_options: vec![None, Some(inner())],
        proj: Parameter::new(Tensor::zeros(&[3], DType::F32).unwrap()),
        stats: Buffer::new(Tensor::zeros(&[1], DType::I64).unwrap()),
        width: 2,
    }
}

/// Every training flag in the tree, with its module's dotted name.
fn flags(m: &Nested) -> Vec<(String, bool)> {
    let mut out = Vec::new();
    crate::walk(m, &mut |name, e| {
        if let crate::Entry::Training(t) = e {
            out.push((name.to_string(), t.get()));
        }
    });
    out
}

#[test]
fn eval_and_train_reach_every_nested_dropout() {
    let mut m = nested();
    let names: Vec<String> = flags(&m).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "direct",
            "in_vec.0",
            "in_vec.1",
            "in_option",
            "in_array.0",
            "in_array.1",
            "boxed.0",
            "in_vec_of_options.1",
            "in_vec_of_options.1.drop",
        ]
    );
    m.eval();
    assert!(flags(&m).iter().all(|(_, on)| !on), "{:?}", flags(&m));
    assert!(!m.is_training());
    // The nested dropout really is off: the identity in eval mode.
    let x = Var::constant(Tensor::ones(&[64], DType::F32).unwrap());
    let y = m.in_vec[1].forward(&x).unwrap();
    assert_eq!(y.tensor().to_vec::<f32>().unwrap(), vec![1.0; 64]);
    m.train(true);
    assert!(flags(&m).iter().all(|(_, on)| *on));
}

#[test]
fn names_come_from_fields_renames_and_indices_in_pytorch_order() {
    let m = nested();
    let keys: Vec<String> = m.state_dict().keys().map(String::from).collect();
    // Own parameters, then own buffers, then children in field order.
    assert_eq!(keys, ["proj_weight", "stats", "in_vec_of_options.1.fc.weight"]);
    let params: Vec<String> = m.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(params, ["proj_weight", "in_vec_of_options.1.fc.weight"]);
    assert_eq!(m.named_buffers().len(), 1);
    assert_eq!(m.type_name(), "Nested");
    // A skipped field is plain data, in no list.
    assert_eq!(m.width, 2);
}

#[test]
fn non_persistent_buffers_are_walked_but_not_saved() {
    #[derive(Module)]
    struct WithIndex {
        index: Buffer,
        scale: Buffer,
    }
    impl Module for WithIndex {
        fn forward(&self, x: &Var) -> Result<Var> {
            Ok(x.clone())
        }
    }
    let m = WithIndex {
        index: Buffer::non_persistent(Tensor::zeros(&[4], DType::I64).unwrap()),
        scale: Buffer::new(Tensor::ones(&[1], DType::F32).unwrap()),
    };
    assert_eq!(m.named_buffers().len(), 2);
    assert_eq!(m.state_dict().keys().collect::<Vec<_>>(), ["scale"]);
}
