//! Transforms.
