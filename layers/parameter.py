"""Parameter: exposes a learned blob as its top (no bottoms).

The param has ``parameter_param.shape`` (initialised to zeros, or loaded from weights); the top
shares its data and diff, so what consumers write into the top's diff is the param's gradient.
"""

from __future__ import annotations

from pycaffe_lite.layer import Layer, Traits, register_layer


@register_layer("Parameter")
class ParameterLayer(Layer):
    traits = Traits(graph_safe=True)
    exact_num_bottom_blobs = 0
    exact_num_top_blobs = 1

    def layer_setup(self, bottom, top):
        shape = tuple(self.layer_param.parameter_param.shape.dim)
        if self.blobs:
            if len(self.blobs) != 1:
                raise self.error(f"has {len(self.blobs)} param blobs, expected 1")
            self.check_param_shapes([shape])
        else:
            self.blobs = [self.make_param_blob(shape)]

    def reshape(self, bottom, top):
        top[0].reshape(self.blobs[0].shape)
        top[0].share_data(self.blobs[0])
        top[0].share_diff(self.blobs[0])

    def forward_cpu(self, bottom, top):
        """Nothing to compute: the top is the param (shared in reshape)."""

    def forward_gpu(self, bottom, top):
        """Nothing to compute: the top is the param (shared in reshape)."""
