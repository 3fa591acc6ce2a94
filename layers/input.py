"""Input: tops with fixed shapes that the user fills (``input_param { shape { dim: ... } }``)."""

from __future__ import annotations

from pycaffe_lite.layer import Layer, Traits, register_layer


@register_layer("Input")
class InputLayer(Layer):
    traits = Traits(graph_safe=True)
    exact_num_bottom_blobs = 0
    min_top_blobs = 1

    def layer_setup(self, bottom, top):
        shapes = self.layer_param.input_param.shape
        if len(shapes) not in (0, 1, len(top)):
            raise self.error(
                f"input_param has {len(shapes)} shapes; expected 1 (shared) or one per top ({len(top)})"
            )
        for i, blob in enumerate(top):
            if shapes:
                blob.reshape(tuple(shapes[i if len(shapes) > 1 else 0].dim))

    def reshape(self, bottom, top):
        """Inputs keep whatever shape the user gave them."""

    def forward_cpu(self, bottom, top):
        pass

    forward_gpu = forward_cpu
