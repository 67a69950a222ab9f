use super::*;
use crate::DType;

fn temp(tag: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("tessera-sd-{}-{tag}.safetensors", std::process::id()))
}

fn t(v: &[f32]) -> Tensor {
    Tensor::from_vec(v.to_vec(), &[v.len()]).unwrap()
}

#[test]
fn insertion_order_and_typed_metadata_survive_a_file() {
    let mut inner = StateDict::new();
    // Not alphabetical: the order must come from insertion, not the names.
    inner.insert("z.weight", t(&[1.0, -2.5]));
    inner.insert("a.bias", t(&[3.0]));
    inner.set("lr", 0.1f64 + 0.2);
    inner.set("flag", true);
    inner.set("step", u64::MAX);
    inner.set_serde("t", "betas", &(0.9f64, 0.999f64)).unwrap();
    let mut sd = StateDict::new();
    sd.insert("first", Tensor::scalar(7i64));
    sd.merge_prefixed("optim", inner);
    sd.set("epoch", 7u64);
    let path = temp("order");
    sd.save(&path).unwrap();
    let back = StateDict::load(&path).unwrap();
    std::fs::remove_file(&path).ok();
    assert_eq!(
        back.keys().collect::<Vec<_>>(),
        ["first", "optim.z.weight", "optim.a.bias"]
    );
    let inner = back.prefixed("optim");
    assert_eq!(inner.keys().collect::<Vec<_>>(), ["z.weight", "a.bias"]);
    assert_eq!(
        inner.get::<f64>("t", "lr").unwrap(),
        0.1 + 0.2,
        "f64 survives exactly"
    );
    assert!(inner.get::<bool>("t", "flag").unwrap());
    assert_eq!(
        inner.get::<u64>("t", "step").unwrap(),
        u64::MAX,
        "u64 survives exactly"
    );
    assert_eq!(inner.get::<(f64, f64)>("t", "betas").unwrap(), (0.9, 0.999));
    assert_eq!(back.get::<u64>("t", "epoch").unwrap(), 7);
    assert_eq!(
        inner.require("t", "z.weight").unwrap().to_vec::<f32>().unwrap(),
        vec![1.0, -2.5]
    );
}

#[test]
fn errors_name_the_key_the_value_and_the_shapes() {
    let mut sd = StateDict::new();
    sd.insert("w", Tensor::zeros(&[2, 3], DType::F32).unwrap());
    sd.set("lr", 0.5);
    sd.set("nan", f64::NAN);
    let e = sd.get::<f64>("Adam::load", "momentum").unwrap_err().to_string();
    assert!(e.contains("Adam::load") && e.contains("\"momentum\""), "{e}");
    let e = sd.get::<u64>("op", "lr").unwrap_err().to_string();
    assert!(
        e.contains("\"lr\"") && e.contains("0.5") && e.contains("u64"),
        "{e}"
    );
    // JSON has no NaN: it reads back as an error, never as a number.
    assert!(sd.get::<f64>("op", "nan").is_err());
    let e = sd.require("op", "v").unwrap_err().to_string();
    assert!(e.contains("\"v\""), "{e}");
    let e = sd.require_shape("op", "w", &[3, 2]).unwrap_err().to_string();
    assert!(
        e.contains("\"w\"") && e.contains("[2, 3]") && e.contains("[3, 2]"),
        "{e}"
    );
    sd.set("kind", "Adam");
    assert!(sd.check_kind("op", "Adam").is_ok());
    let e = sd.check_kind("op", "Sgd").unwrap_err().to_string();
    assert!(e.contains("Adam") && e.contains("Sgd"), "{e}");
}

#[test]
fn insert_replaces_in_place_and_foreign_files_sort_by_name() {
    let mut sd: StateDict = [("b".to_string(), t(&[1.0])), ("a".to_string(), t(&[2.0]))]
        .into_iter()
        .collect();
    assert!(sd.insert("b", t(&[5.0])).is_some());
    assert_eq!(sd.keys().collect::<Vec<_>>(), ["b", "a"]);
    assert_eq!(sd.len(), 2);
    let path = temp("foreign");
    crate::safetensors::save(&path, sd.iter()).unwrap();
    let back = StateDict::load(&path).unwrap();
    std::fs::remove_file(&path).ok();
    assert_eq!(back.keys().collect::<Vec<_>>(), ["a", "b"]);
    assert!(back.metadata().is_empty());
}
