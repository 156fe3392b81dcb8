//! A simulated NVIDIA GPU: stands in for libcuda.so.1 and libnvidia-ml.so.1.
