"""ContinuationIndicator (dlunion's CaffeLSTM-OCR fork): the sequence-continuation input of the
LSTM / RNN layers for sequences that all start at the first time step.

``continuation_indicator_param``: ``time_step`` T (required, positive), ``batch_size`` N (default 1).
Top ``(T, N)``: 0 at ``t = 0`` (a new sequence begins) and 1 at every later step. No bottom is needed;
one bottom (some files link the image blob to place the layer) is accepted and not read. No gradient.
"""

from __future__ import annotations

from pycaffe_lite.layer import Layer, Traits, register_layer


@register_layer("ContinuationIndicator")
class ContinuationIndicatorLayer(Layer):
    min_bottom_blobs = 0
    max_bottom_blobs = 1
    exact_num_top_blobs = 1
    traits = Traits()  # computed on the host (as PriorBox): GPU mode copies it up

    def layer_setup(self, bottom, top):
        p = self.layer_param.continuation_indicator_param
        if not p.HasField("time_step") or p.time_step <= 0:
            raise self.error("continuation_indicator_param.time_step is required and must be positive")
        if p.batch_size <= 0:
            raise self.error(f"continuation_indicator_param.batch_size must be positive, got {p.batch_size}")
        self.time_step, self.batch_size = int(p.time_step), int(p.batch_size)

    def allow_force_backward(self, bottom_index: int) -> bool:
        return False

    def reshape(self, bottom, top):
        top[0].reshape((self.time_step, self.batch_size))

    def forward_cpu(self, bottom, top):
        y = top[0].mutable_cpu_data()
        y[0] = 0
        y[1:] = 1
