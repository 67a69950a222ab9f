//! `Display` for [`Tensor`], reproducing PyTorch's `repr` (print options at
//! their defaults: 4 digits, 80 columns, summarised above 1000 elements
//! with 3 edge items per dimension).

use std::fmt;

use crate::{DType, Tensor};

/// Above this many elements a tensor is summarised with `...`.
const THRESHOLD: usize = 1000;
/// Items kept at each end of a summarised dimension.
const EDGE: usize = 3;
/// Digits after the decimal point.
const PRECISION: usize = 4;
/// Line width that vectors are wrapped to.
const LINE_WIDTH: usize = 80;

impl fmt::Display for Tensor {
    /// `tensor([[1., 2.],\n        [3., 4.]])`, with `dtype=torch.float64`
    /// and similar suffixes for dtypes other than float32, int64 and bool.
    ///
    /// A GPU tensor is copied to the host first; if that copy fails the
    /// text holds the error instead of the values (formatting cannot fail).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let prefix = "tensor(";
        let indent = prefix.len();
        let mut suffixes = Vec::new();
        if !self.device().is_cpu() {
            suffixes.push(format!("device='{}'", self.device()));
        }
        let host = match self.cpu() {
            Ok(host) => host,
            Err(e) => return write!(f, "{prefix}<{e}>, {})", suffixes.join(", ")),
        };
        let body = if self.numel() == 0 {
            if self.ndim() != 1 {
                suffixes.push(format!("size={}", py_tuple(self.shape())));
            }
            if self.dtype() != DType::F32 {
                suffixes.push(format!("dtype=torch.{}", self.dtype()));
            }
            "[]".to_string()
        } else {
            if !matches!(self.dtype(), DType::F32 | DType::I64 | DType::Bool) {
                suffixes.push(format!("dtype=torch.{}", self.dtype()));
            }
            let summarize = self.numel() > THRESHOLD;
            let mut shown = Vec::new();
            collect_shown(&host, summarize, &mut shown);
            let cell = CellFormat::new(&shown, self.dtype().is_float());
            tensor_str(&host, indent, summarize, &cell)
        };
        f.write_str(&add_suffixes(format!("{prefix}{body}"), &suffixes, indent))
    }
}

/// One element as Python's `tolist()` would give it.
#[derive(Debug, Clone, Copy)]
enum Value {
    Float(f64),
    Int(i64),
    Bool(bool),
}

/// The elements of a 0-d or 1-d tensor, in order.
fn values(t: &Tensor) -> Vec<Value> {
    let d = t.dtype();
    let as_vec = |dt| {
        t.to_dtype(dt)
            .and_then(|v| v.reshape(t.numel()))
            .expect("a host tensor converts and flattens")
    };
    if d.is_float() {
        let v = as_vec(DType::F64).to_vec::<f64>().expect("dtype is f64");
        v.into_iter().map(Value::Float).collect()
    } else if d == DType::Bool {
        let v = as_vec(DType::Bool).to_vec::<bool>().expect("dtype is bool");
        v.into_iter().map(Value::Bool).collect()
    } else {
        let v = as_vec(DType::I64).to_vec::<i64>().expect("dtype is i64");
        v.into_iter().map(Value::Int).collect()
    }
}

/// The indices of dimension 0 that are shown (all, or the edges).
fn shown_indices(n: usize, summarize: bool) -> Vec<usize> {
    if summarize && n > 2 * EDGE {
        (0..EDGE).chain(n - EDGE..n).collect()
    } else {
        (0..n).collect()
    }
}

/// Every element that will be printed, in order (PyTorch's
/// `get_summarized_data`): the formatter's width depends on these only.
fn collect_shown(t: &Tensor, summarize: bool, out: &mut Vec<Value>) {
    if t.ndim() == 0 {
        out.extend(values(t));
        return;
    }
    let n = t.shape()[0];
    let idx = shown_indices(n, summarize);
    if t.ndim() == 1 {
        if idx.len() < n {
            out.extend(values(&t.narrow(0, 0, EDGE).expect("edge in range")));
            out.extend(values(&t.narrow(0, n - EDGE, EDGE).expect("edge in range")));
        } else {
            out.extend(values(t));
        }
        return;
    }
    for i in idx {
        collect_shown(&t.select(0, i as isize).expect("index in range"), summarize, out);
    }
}

/// PyTorch's `_Formatter`: one width and one style for every element.
struct CellFormat {
    floating: bool,
    int_mode: bool,
    sci_mode: bool,
    width: usize,
}

impl CellFormat {
    fn new(shown: &[Value], floating: bool) -> Self {
        let mut c = CellFormat {
            floating,
            int_mode: true,
            sci_mode: false,
            width: 1,
        };
        if !floating {
            c.width = shown.iter().map(|&v| c.format(v).len()).max().unwrap_or(1).max(1);
            return c;
        }
        let finite: Vec<f64> = shown
            .iter()
            .filter_map(|v| match *v {
                Value::Float(x) if x.is_finite() && x != 0.0 => Some(x),
                _ => None,
            })
            .collect();
        if finite.is_empty() {
            return c;
        }
        let min = finite.iter().fold(f64::INFINITY, |m, x| m.min(x.abs()));
        let max = finite.iter().fold(0.0f64, |m, x| m.max(x.abs()));
        c.int_mode = finite.iter().all(|x| x.ceil() == *x);
        let widest = |f: &dyn Fn(f64) -> String| finite.iter().map(|&x| f(x).len()).max().unwrap_or(1);
        if c.int_mode {
            if max / min > 1000.0 || max > 1e8 {
                c.sci_mode = true;
                c.width = c.width.max(widest(&py_sci));
            } else {
                c.width = c.width.max(widest(&|x| format!("{x:.0}")) + 1);
            }
        } else if max / min > 1000.0 || max > 1e8 || min < 1e-4 {
            c.sci_mode = true;
            c.width = c.width.max(widest(&py_sci));
        } else {
            c.width = c.width.max(widest(&|x| format!("{x:.PRECISION$}")));
        }
        c
    }

    /// The element's text, unpadded.
    fn format(&self, v: Value) -> String {
        match v {
            Value::Bool(b) => (if b { "True" } else { "False" }).to_string(),
            Value::Int(i) => i.to_string(),
            Value::Float(x) if !x.is_finite() => py_nonfinite(x).to_string(),
            Value::Float(x) if self.floating && self.sci_mode => py_sci(x),
            Value::Float(x) if self.floating && self.int_mode => format!("{x:.0}."),
            Value::Float(x) => format!("{x:.PRECISION$}"),
        }
    }

    /// The element's text, right-aligned to the common width.
    fn padded(&self, v: Value) -> String {
        format!("{:>w$}", self.format(v), w = self.width)
    }
}

/// PyTorch's `_tensor_str_with_formatter`.
fn tensor_str(t: &Tensor, indent: usize, summarize: bool, cell: &CellFormat) -> String {
    match t.ndim() {
        0 => cell.padded(values(t)[0]),
        1 => vector_str(t, indent, summarize, cell),
        dim => {
            let n = t.shape()[0];
            let idx = shown_indices(n, summarize);
            let mut slices = Vec::with_capacity(idx.len() + 1);
            for (k, &i) in idx.iter().enumerate() {
                if idx.len() < n && k == EDGE {
                    slices.push("...".to_string());
                }
                let row = t.select(0, i as isize).expect("index in range");
                slices.push(tensor_str(&row, indent + 1, summarize, cell));
            }
            let sep = format!(",{}{}", "\n".repeat(dim - 1), " ".repeat(indent + 1));
            format!("[{}]", slices.join(&sep))
        }
    }
}

/// PyTorch's `_vector_str`: elements wrapped to the line width.
fn vector_str(t: &Tensor, indent: usize, summarize: bool, cell: &CellFormat) -> String {
    let per_line = (LINE_WIDTH.saturating_sub(indent) / (cell.width + 2)).max(1);
    let n = t.shape()[0];
    let data: Vec<String> = if summarize && n > 2 * EDGE {
        let head = values(&t.narrow(0, 0, EDGE).expect("edge in range"));
        let tail = values(&t.narrow(0, n - EDGE, EDGE).expect("edge in range"));
        let mut d: Vec<String> = head.into_iter().map(|v| cell.padded(v)).collect();
        d.push(" ...".to_string());
        d.extend(tail.into_iter().map(|v| cell.padded(v)));
        d
    } else {
        values(t).into_iter().map(|v| cell.padded(v)).collect()
    };
    let lines: Vec<String> = data.chunks(per_line).map(|l| l.join(", ")).collect();
    format!("[{}]", lines.join(&format!(",\n{}", " ".repeat(indent + 1))))
}

/// PyTorch's `_add_suffixes`: `, dtype=...` on the last line, or on a new
/// line when it would pass the line width.
fn add_suffixes(mut s: String, suffixes: &[String], indent: usize) -> String {
    let mut last_line = match s.rfind('\n') {
        Some(p) => s.len() - p + 1,
        None => s.len() + 2,
    };
    for suffix in suffixes {
        if last_line + suffix.len() + 2 > LINE_WIDTH {
            s.push_str(&format!(",\n{}{suffix}", " ".repeat(indent)));
            last_line = indent + suffix.len();
        } else {
            s.push_str(&format!(", {suffix}"));
            last_line += suffix.len() + 2;
        }
    }
    s.push(')');
    s
}

/// Python's `f"{x:.4e}"`: `1.2346e-05`, exponent signed and at least two digits.
fn py_sci(x: f64) -> String {
    if !x.is_finite() {
        return py_nonfinite(x).to_string();
    }
    let s = format!("{x:.PRECISION$e}");
    let (mantissa, exp) = s.split_once('e').expect("{:e} always has an exponent");
    let exp: i32 = exp.parse().expect("{:e} exponent is an integer");
    let sign = if exp < 0 { '-' } else { '+' };
    format!("{mantissa}e{sign}{:02}", exp.abs())
}

/// Python's spelling of NaN and the infinities.
fn py_nonfinite(x: f64) -> &'static str {
    if x.is_nan() {
        "nan"
    } else if x > 0.0 {
        "inf"
    } else {
        "-inf"
    }
}

/// A shape as a Python tuple: `(2, 0)`, `(0,)`.
fn py_tuple(shape: &[usize]) -> String {
    match shape {
        [n] => format!("({n},)"),
        _ => format!(
            "({})",
            shape.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(", ")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn show(t: &Tensor) -> String {
        t.to_string()
    }

    fn f32s(v: &[f32], shape: &[usize]) -> Tensor {
        Tensor::from_slice(v, shape).unwrap()
    }

    // Every expected string below was printed by PyTorch 2.x.
    #[test]
    fn small_tensors_match_pytorch() {
        assert_eq!(
            show(&f32s(&[1., 2., 3., 4.], &[2, 2])),
            "tensor([[1., 2.],\n        [3., 4.]])"
        );
        assert_eq!(
            show(&f32s(&[1e-5, 1.0], &[2])),
            "tensor([1.0000e-05, 1.0000e+00])"
        );
        let d = Tensor::from_vec(vec![1.0f64, 2.0], &[2]).unwrap();
        assert_eq!(show(&d), "tensor([1., 2.], dtype=torch.float64)");
        assert_eq!(show(&Tensor::scalar(3.5f32)), "tensor(3.5000)");
        let b = Tensor::from_vec(vec![true, false], &[2]).unwrap();
        assert_eq!(show(&b), "tensor([ True, False])");
        let u = Tensor::from_vec(vec![1u8, 236], &[2]).unwrap();
        assert_eq!(show(&u), "tensor([  1, 236], dtype=torch.uint8)");
        assert_eq!(
            show(&f32s(&[f32::NAN, 1.5, f32::INFINITY], &[3])),
            "tensor([   nan, 1.5000,    inf])"
        );
        let h = Tensor::from_vec(vec![f32::NAN, 1.0, f32::NEG_INFINITY], &[3])
            .unwrap()
            .to_dtype(DType::BF16)
            .unwrap();
        assert_eq!(show(&h), "tensor([nan, 1., -inf], dtype=torch.bfloat16)");
        assert_eq!(
            show(&f32s(&[0.0, 5e8, 1e9], &[3])),
            "tensor([0.0000e+00, 5.0000e+08, 1.0000e+09])"
        );
        assert_eq!(show(&f32s(&[0., 0.], &[1, 2])), "tensor([[0., 0.]])");
        assert_eq!(
            show(&Tensor::from_vec(vec![0i64, 0], &[2]).unwrap()),
            "tensor([0, 0])"
        );
    }

    #[test]
    fn higher_ranks_and_integers_match_pytorch() {
        let v: Vec<f32> = (0..12).map(|i| i as f32 - 5.5).collect();
        assert_eq!(
            show(&f32s(&v, &[2, 2, 3])),
            "tensor([[[-5.5000, -4.5000, -3.5000],\n         [-2.5000, -1.5000, -0.5000]],\n\n        \
             [[ 0.5000,  1.5000,  2.5000],\n         [ 3.5000,  4.5000,  5.5000]]])"
        );
        let i = Tensor::from_vec((0..3000i64).collect(), &[3, 1000]).unwrap();
        assert_eq!(
            show(&i),
            "tensor([[   0,    1,    2,  ...,  997,  998,  999],\n        \
             [1000, 1001, 1002,  ..., 1997, 1998, 1999],\n        \
             [2000, 2001, 2002,  ..., 2997, 2998, 2999]])"
        );
        let h = f32s(&[1e-3, 123.456, -7.0, 0.0], &[2, 2])
            .to_dtype(DType::F16)
            .unwrap();
        assert_eq!(
            show(&h),
            "tensor([[ 1.0004e-03,  1.2344e+02],\n        [-7.0000e+00,  0.0000e+00]], dtype=torch.float16)"
        );
        let u = Tensor::from_vec((0..8u8).collect(), &[2, 2, 2, 1]).unwrap();
        assert_eq!(
            show(&u),
            "tensor([[[[0],\n          [1]],\n\n         [[2],\n          [3]]],\n\n\n        \
             [[[4],\n          [5]],\n\n         [[6],\n          [7]]]], dtype=torch.uint8)"
        );
        let b = Tensor::from_vec(Vec::<bool>::new(), &[2, 0]).unwrap();
        assert_eq!(show(&b), "tensor([], size=(2, 0), dtype=torch.bool)");
    }

    #[test]
    fn empty_tensors_show_size_and_dtype() {
        assert_eq!(show(&f32s(&[], &[0, 3])), "tensor([], size=(0, 3))");
        assert_eq!(show(&f32s(&[], &[0])), "tensor([])");
        let i = Tensor::from_vec(Vec::<i64>::new(), &[0]).unwrap();
        assert_eq!(show(&i), "tensor([], dtype=torch.int64)");
    }

    #[test]
    fn long_vectors_wrap_at_80_columns() {
        let v: Vec<f32> = (0..30).map(|i| i as f32 / 7.0).collect();
        let want = "tensor([0.0000, 0.1429, 0.2857, 0.4286, 0.5714, 0.7143, 0.8571, 1.0000, 1.1429,
        1.2857, 1.4286, 1.5714, 1.7143, 1.8571, 2.0000, 2.1429, 2.2857, 2.4286,
        2.5714, 2.7143, 2.8571, 3.0000, 3.1429, 3.2857, 3.4286, 3.5714, 3.7143,
        3.8571, 4.0000, 4.1429])";
        assert_eq!(show(&f32s(&v, &[30])), want);
    }

    #[test]
    fn large_tensors_are_elided() {
        let v: Vec<f32> = (0..2000).map(|i| i as f32).collect();
        let want = "tensor([[0.0000e+00, 1.0000e+00, 2.0000e+00,  ..., 9.7000e+01, 9.8000e+01,
         9.9000e+01],
        [1.0000e+02, 1.0100e+02, 1.0200e+02,  ..., 1.9700e+02, 1.9800e+02,
         1.9900e+02],
        [2.0000e+02, 2.0100e+02, 2.0200e+02,  ..., 2.9700e+02, 2.9800e+02,
         2.9900e+02],
        ...,
        [1.7000e+03, 1.7010e+03, 1.7020e+03,  ..., 1.7970e+03, 1.7980e+03,
         1.7990e+03],
        [1.8000e+03, 1.8010e+03, 1.8020e+03,  ..., 1.8970e+03, 1.8980e+03,
         1.8990e+03],
        [1.9000e+03, 1.9010e+03, 1.9020e+03,  ..., 1.9970e+03, 1.9980e+03,
         1.9990e+03]])";
        assert_eq!(show(&f32s(&v, &[20, 100])), want);
        // A strided view prints its own elements, not its storage's.
        let t = f32s(&v, &[20, 100]).t().unwrap().narrow(0, 0, 2).unwrap();
        assert!(show(&t).starts_with("tensor([[0.0000e+00, 1.0000e+02, 2.0000e+02, 3.0000e+02"));
    }

    #[test]
    fn helpers_spell_like_python() {
        assert_eq!(py_sci(-1234.5678), "-1.2346e+03");
        assert_eq!(py_sci(1e-300), "1.0000e-300");
        assert_eq!(py_tuple(&[2, 0, 1]), "(2, 0, 1)");
        assert_eq!(py_tuple(&[]), "()");
        let long = add_suffixes(
            format!("tensor([{}])", "1".repeat(70)),
            &["dtype=torch.uint8".into()],
            7,
        );
        assert!(long.ends_with("]),\n       dtype=torch.uint8)"), "{long}");
    }
}
