"""ShuffleChannel (ShuffleNet ports): mix channels across groups.

Bottom (N, C, ...) with ``C = group * k``: viewing the channels as (group, k), the top is the
transpose (k, group), so top channel ``j * group + g`` is bottom channel ``g * k + j``. Backward is
the inverse permutation of the top diff. ``shuffle_channel_param.group`` (default 1: a copy) must
divide C. Not in place (the forks' layer copies through a buffer; here top must differ from bottom).
GPU: the permutation (N, group, k, S) -> (N, k, group, S) of ``pycaffe_lite.gpu.permute``, which
copies whole channel planes (S = the product of the axes after C; 4 elements at a time when S
and the pointers allow) in top order; group 1 is a copy.
"""

from __future__ import annotations

from pycaffe_lite.gpu import permute
from pycaffe_lite.layer import Layer, Traits, register_layer


@register_layer("ShuffleChannel")
class ShuffleChannelLayer(Layer):
    traits = Traits(graph_safe=True, backward_reads=())
    exact_num_bottom_blobs = 1
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        self.group = int(self.layer_param.shuffle_channel_param.group)
        if self.group < 1:
            raise self.error(f"shuffle_channel_param.group must be positive, got {self.group}")

    def reshape(self, bottom, top):
        if top[0] is bottom[0]:
            raise self.error("does not allow in-place computation (top must differ from bottom)")
        if bottom[0].num_axes < 2:
            raise self.error(f"bottom must have a channel axis (N, C, ...), got shape {bottom[0].shape}")
        c = bottom[0].shape[1]
        if c % self.group:
            raise self.error(f"group {self.group} does not divide the {c} channels of bottom "
                             f"{bottom[0].shape}")
        self.num = bottom[0].shape[0]
        self.k = c // self.group
        self.spatial = bottom[0].count_range(2)
        top[0].reshape(bottom[0].shape)
        self._forward = permute.plan((self.num, self.group, self.k, self.spatial), (0, 2, 1, 3))
        self._backward = self._forward.inverse()

    def _view(self, a, rows, cols):
        return a.reshape(self.num, rows, cols, self.spatial)

    def forward_cpu(self, bottom, top):
        x = self._view(bottom[0].cpu_data(), self.group, self.k)
        top[0].mutable_cpu_data()[...] = x.transpose(0, 2, 1, 3).reshape(top[0].shape)

    def backward_cpu(self, top, propagate_down, bottom):
        if propagate_down[0]:
            dy = self._view(top[0].cpu_diff(), self.k, self.group)
            bottom[0].mutable_cpu_diff()[...] = dy.transpose(0, 2, 1, 3).reshape(bottom[0].shape)

    def forward_gpu(self, bottom, top):
        self._forward(bottom[0].gpu_data(), top[0].mutable_gpu_data(), self.dtype)

    def backward_gpu(self, top, propagate_down, bottom):
        if propagate_down[0]:
            self._backward(top[0].gpu_diff(), bottom[0].mutable_gpu_diff(), self.dtype)
