"""InnerProduct (fully connected): ``top = bottom · Wᵀ + b`` over the axes from ``axis`` on.

bottom (M, K) flattened at ``axis``; weight (N, K), or (K, N) with ``transpose: true``; bias (N,).
top shape: ``bottom.shape[:axis] + (N,)``.
"""

from __future__ import annotations

import numpy as np

from pycaffe_lite import fillers
from pycaffe_lite.gpu import blas
from pycaffe_lite.gpu import math_functions as gm
from pycaffe_lite.layer import Layer, Traits, register_layer
from pycaffe_lite.memcheck import check_fits


@register_layer("InnerProduct")
class InnerProductLayer(Layer):
    traits = Traits(half=True, half_kernels=True, graph_safe=True)
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.inner_product_param
        if not p.HasField("num_output"):
            raise self.error("inner_product_param.num_output is required")
        if p.num_output < 1:
            raise self.error(f"inner_product_param.num_output must be >= 1, got {p.num_output}")
        self.N = p.num_output
        self.bias_term = p.bias_term
        self.transpose = p.transpose
        self.axis = bottom[0].canonical_axis(p.axis)
        self.K = bottom[0].count_range(self.axis)
        w_shape = (self.K, self.N) if self.transpose else (self.N, self.K)

        check_fits(self.where, f"the {self.N}x{self.K} weights", self.N * self.K,
                   np.dtype(self.dtype).itemsize)
        shapes = [w_shape] + ([(self.N,)] if self.bias_term else [])
        if self.blobs:
            if len(self.blobs) != len(shapes):
                raise self.error(f"has {len(self.blobs)} param blobs, expected {len(shapes)}")
            self.check_param_shapes(shapes)
            return
        self.blobs = [self.make_param_blob(w_shape)]
        fillers.fill(self.blobs[0], p.weight_filler)
        if self.bias_term:
            self.blobs.append(self.make_param_blob((self.N,)))
            fillers.fill(self.blobs[1], p.bias_filler)

    def reshape(self, bottom, top):
        axis = bottom[0].canonical_axis(self.layer_param.inner_product_param.axis)
        k = bottom[0].count_range(axis)
        if k != self.K:
            raise self.error(
                f"input size incompatible with inner product parameters: bottom {bottom[0].shape} "
                f"gives {k} inputs per row at axis {axis}, weights expect {self.K}"
            )
        self.M = bottom[0].count_range(0, axis)
        top[0].reshape(bottom[0].shape[:axis] + (self.N,))

    # -- CPU --------------------------------------------------------------------------------
    def _weight_nk(self, w: np.ndarray) -> np.ndarray:
        return w.T if self.transpose else w

    def forward_cpu(self, bottom, top):
        x = bottom[0].cpu_data().reshape(self.M, self.K)
        w = self._weight_nk(self.blobs[0].cpu_data())
        y = x @ w.T
        if self.bias_term:
            y += self.blobs[1].cpu_data()
        top[0].mutable_cpu_data()[...] = y.reshape(top[0].shape)

    def backward_cpu(self, top, propagate_down, bottom):
        dy = top[0].cpu_diff().reshape(self.M, self.N)
        x = bottom[0].cpu_data().reshape(self.M, self.K)
        if self.param_propagate_down[0]:
            dw = self.blobs[0].mutable_cpu_diff()
            dw += (x.T @ dy) if self.transpose else (dy.T @ x)
        if self.bias_term and self.param_propagate_down[1]:
            self.blobs[1].mutable_cpu_diff()[...] += dy.sum(axis=0)
        if propagate_down[0]:
            w = self._weight_nk(self.blobs[0].cpu_data())
            np.matmul(dy, w, out=bottom[0].mutable_cpu_diff().reshape(self.M, self.K))

    # -- GPU (cuBLAS, row-major adapter) ----------------------------------------------------
    def forward_gpu(self, bottom, top):
        M, N, K, dt = self.M, self.N, self.K, self.dtype
        y = top[0].mutable_gpu_data()
        # y(M,N) = x(M,K) · op(W); W is (N,K) -> transposed, or (K,N) -> as is
        blas.gemm(False, not self.transpose, M, N, K, 1.0, bottom[0].gpu_data(), self.blobs[0].gpu_data(), 0.0, y, dt)
        if self.bias_term:
            gm.add_bias(M, N, self.blobs[1].gpu_data(), y, dt)

    def backward_gpu(self, top, propagate_down, bottom):
        M, N, K, dt = self.M, self.N, self.K, self.dtype
        dy = top[0].gpu_diff()
        if self.param_propagate_down[0]:
            if self.transpose:  # dW(K,N) += xᵀ(K,M) · dy(M,N)
                blas.gemm(True, False, K, N, M, 1.0, bottom[0].gpu_data(), dy, 1.0, self.blobs[0].mutable_gpu_diff(), dt)
            else:  # dW(N,K) += dyᵀ(N,M) · x(M,K)
                blas.gemm(True, False, N, K, M, 1.0, dy, bottom[0].gpu_data(), 1.0, self.blobs[0].mutable_gpu_diff(), dt)
        if self.bias_term and self.param_propagate_down[1]:
            gm.sum_rows_into(M, N, dy, self.blobs[1].mutable_gpu_diff(), dt, beta=1.0)
        if propagate_down[0]:
            # dx(M,K) = dy(M,N) · W(N,K), or dy · Wᵀ when W is (K,N)
            blas.gemm(False, self.transpose, M, K, N, 1.0, dy, self.blobs[0].gpu_data(), 0.0, bottom[0].mutable_gpu_diff(), dt)
