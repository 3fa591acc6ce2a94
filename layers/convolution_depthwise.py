"""ConvolutionDepthwise: the depthwise convolution type of the MobileNet v2 / SSDLite forks
(farmingyard/caffe-mobilenet and the Caffe ports copying it).

Reads ``convolution_param`` for kernel, stride, pad, dilation, ``bias_term`` and the fillers; the
top has as many channels as the bottom (C), each channel convolved with its own kernel: weights
``(C, 1, *kernel)``, bias ``(C,)`` (the fork's layout, so its caffemodels load by layer name).
As in the fork, ``num_output`` and ``group`` do not decide anything: the layer is a Convolution with
``num_output = group = C`` (a differing value is logged and ignored). GPU: the depthwise engine.
"""

from __future__ import annotations

import logging
from typing import Any

from pycaffe_lite.layer import CONVOLUTION, Traits, register_layer

from .depthwise_convolution import DepthwiseConvolutionLayer

log = logging.getLogger("pycaffe_lite")


@register_layer("ConvolutionDepthwise")
class ConvolutionDepthwiseLayer(DepthwiseConvolutionLayer):  # its engine choice too
    traits = Traits(graph_safe=True, pure_forward=True, fuses=frozenset({CONVOLUTION}))

    def output_and_group(self, p: Any) -> tuple[int, int]:
        c = self.channels
        for name in ("num_output", "group"):
            if p.HasField(name) and getattr(p, name) != c:
                log.warning("layer '%s' (ConvolutionDepthwise): %s %d ignored; the layer has the bottom's %d "
                            "channels, as in its fork", self.name, name, getattr(p, name), c)
        return c, c
