//! Tape-based, define-by-run automatic differentiation over `tessera-tensor` (filled by the autograd issue).
