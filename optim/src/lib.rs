//! Optimizers and learning-rate schedules (filled by the nn + optim issue).
