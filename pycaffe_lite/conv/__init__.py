"""The convolution family: geometry, the problem, the CPU path, engines (each with its kernels), autotune."""
