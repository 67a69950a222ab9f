//! Layer partitions against hand-worked and brute-force splits.

use super::*;

#[test]
fn uniform_gives_the_remainder_to_the_first_parts() {
    assert_eq!(Partition::Layers.bounds(&[1; 10], 3).unwrap(), [0, 4, 7, 10]);
    assert_eq!(Partition::Layers.bounds(&[1; 4], 4).unwrap(), [0, 1, 2, 3, 4]);
}

#[test]
fn parameters_minimise_the_largest_part() {
    // An embedding-heavy first layer gets a part of its own.
    let w = [100, 10, 10, 10, 10, 100];
    assert_eq!(Partition::Parameters.bounds(&w, 3).unwrap(), [0, 1, 5, 6]);
    // Brute force over every split of 7 layers into 3 parts.
    let w = [5, 1, 8, 2, 2, 9, 3];
    let b = Partition::Parameters.bounds(&w, 3).unwrap();
    let max_of = |b: &[usize]| {
        b.windows(2)
            .map(|x| w[x[0]..x[1]].iter().sum::<usize>())
            .max()
            .unwrap()
    };
    let mut best = usize::MAX;
    for i in 1..6 {
        for j in i + 1..7 {
            best = best.min(max_of(&[0, i, j, 7]));
        }
    }
    assert_eq!(max_of(&b), best);
}

#[test]
fn bad_partitions_are_errors() {
    assert!(Partition::Layers.bounds(&[1; 2], 3).is_err());
    assert!(Partition::Layers.bounds(&[1; 2], 0).is_err());
    assert!(Partition::Explicit(vec![0, 2, 2, 4]).bounds(&[1; 4], 3).is_err());
    assert!(Partition::Explicit(vec![0, 2, 4]).bounds(&[1; 5], 2).is_err());
    assert_eq!(
        Partition::Explicit(vec![0, 3, 4]).bounds(&[1; 4], 2).unwrap(),
        [0, 3, 4]
    );
}
