//! Hand-written CUDA kernels and typed launch wrappers over cudarc (filled by the cuda-kernels issue).
