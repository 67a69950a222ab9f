use super::ShapeArg;
use crate::Error;

fn arg(s: impl Into<ShapeArg>) -> ShapeArg {
    s.into()
}

fn message(e: Error) -> String {
    e.to_string()
}

#[test]
// `&[2, 3]` is one of the spellings under test.
#[allow(clippy::needless_borrows_for_generic_args)]
fn every_spelling_converts() {
    let v = vec![2usize, 3];
    let d = |dims: &[Option<usize>]| dims.to_vec();
    assert_eq!(arg([2, 3]).dims(), d(&[Some(2), Some(3)]));
    assert_eq!(arg(&[2, 3]), arg([2, 3]));
    assert_eq!(arg(&v), arg([2, 3]));
    assert_eq!(arg(&v[..]), arg([2, 3]));
    assert_eq!(arg(v.clone()), arg([2, 3]));
    assert_eq!(arg((2, 3)), arg([2, 3]));
    assert_eq!(arg(6).dims(), d(&[Some(6)]));
    assert!(arg([]).is_empty());
    assert_eq!(arg((2, ())).dims(), d(&[Some(2), None]));
    assert_eq!(arg(((), 1, 2, 3, 4, 5)).len(), 6);
    assert_eq!(arg(vec![None, Some(4)]).dims(), d(&[None, Some(4)]));
    assert_eq!(format!("{:?}", arg((2, (), 4))), "[2, _, 4]");
}

#[test]
fn reshape_fills_the_hole() {
    assert_eq!(arg((3, ())).resolve_reshape("r", &[2, 6]).unwrap(), vec![3, 4]);
    assert_eq!(arg(((),)).resolve_reshape("r", &[2, 6]).unwrap(), vec![12]);
    assert_eq!(
        arg([]).resolve_reshape("r", &[1, 1]).unwrap(),
        Vec::<usize>::new()
    );
    assert!(arg(((), 0)).resolve_reshape("r", &[]).is_err());
    assert_eq!(arg([0, 5]).resolve_reshape("r", &[5, 0]).unwrap(), vec![0, 5]);
}

#[test]
fn reshape_errors_name_the_op_and_both_shapes() {
    let two_holes = message(arg(((), ())).resolve_reshape("view", &[2, 6]).unwrap_err());
    assert!(
        two_holes.contains("view") && two_holes.contains("[_, _]") && two_holes.contains("[2, 6]"),
        "{two_holes}"
    );
    let mismatch = message(arg((5, ())).resolve_reshape("reshape", &[2, 6]).unwrap_err());
    assert!(
        mismatch.contains("reshape") && mismatch.contains("[5, _]") && mismatch.contains("[2, 6]"),
        "{mismatch}"
    );
    let plain = message(arg([5]).resolve_reshape("reshape", &[2, 3]).unwrap_err());
    assert!(plain.contains("[5]") && plain.contains("6 elements"), "{plain}");
    let ambiguous = message(arg((0, ())).resolve_reshape("reshape", &[0, 6]).unwrap_err());
    assert!(
        ambiguous.contains("ambiguous") && ambiguous.contains("[0, 6]"),
        "{ambiguous}"
    );
    let big = 1usize << 40;
    let overflow = message(arg([big, big]).resolve_reshape("reshape", &[4]).unwrap_err());
    assert!(
        overflow.contains("reshape") && overflow.contains(&format!("[{big}, {big}]")),
        "{overflow}"
    );
    let overflow_hole = message(arg((big, big, ())).resolve_reshape("reshape", &[4]).unwrap_err());
    assert!(overflow_hole.contains("more elements"), "{overflow_hole}");
}

#[test]
fn expand_keeps_the_size_under_each_hole() {
    assert_eq!(
        arg((2, (), ())).resolve_expand("expand", &[3, 1]).unwrap(),
        vec![2, 3, 1]
    );
    assert_eq!(
        arg((2, 3, 4)).resolve_expand("expand", &[1, 4]).unwrap(),
        vec![2, 3, 4]
    );
    assert_eq!(
        arg([]).resolve_expand("expand", &[]).unwrap(),
        Vec::<usize>::new()
    );
}

#[test]
fn expand_errors_name_the_op_and_both_shapes() {
    let fewer = message(arg([4]).resolve_expand("expand", &[2, 4]).unwrap_err());
    assert!(
        fewer.contains("expand") && fewer.contains("[2, 4]") && fewer.contains("[4]"),
        "{fewer}"
    );
    let leading = message(arg(((), 4)).resolve_expand("expand", &[4]).unwrap_err());
    assert!(
        leading.contains("expand") && leading.contains("[_, 4]") && leading.contains("[4]"),
        "{leading}"
    );
    let big = 1usize << 62;
    let overflow = message(arg((big, ())).resolve_expand("expand", &[4]).unwrap_err());
    assert!(
        overflow.contains("expand") && overflow.contains("more elements"),
        "{overflow}"
    );
}
