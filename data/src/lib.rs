//! Datasets, data loaders, samplers and augmentation (filled by the data issue).
