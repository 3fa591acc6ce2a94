"""DummyData: tops filled by fillers (``dummy_data_param``), no bottoms.

Shapes: one ``shape`` per top or one shared; or the legacy ``num/channels/height/width`` lists
(each with one entry or one per top). Fillers: none (constant 0), one shared, or one per top.
Tops with a ``constant`` filler are filled once at set-up; the others are refilled every forward.
"""

from __future__ import annotations

from pycaffe_lite import fillers
from pycaffe_lite.layer import Layer, Traits, register_layer
from pycaffe_lite.schema import caffe_pb2


@register_layer("DummyData")
class DummyDataLayer(Layer):
    traits = Traits()  # a host-side reader: runs plainly before a replayed graph
    exact_num_bottom_blobs = 0
    min_top_blobs = 1

    def layer_setup(self, bottom, top):
        p = self.layer_param.dummy_data_param
        n_top = len(top)
        if len(p.data_filler) not in (0, 1, n_top):
            raise self.error(
                f"has {len(p.data_filler)} data_filler entries; expected 0, 1 or one per top ({n_top})"
            )
        legacy = {"num": p.num, "channels": p.channels, "height": p.height, "width": p.width}
        if any(len(v) for v in legacy.values()):
            if len(p.shape):
                raise self.error("give either shape or the legacy num/channels/height/width, not both")
            for field, values in legacy.items():
                if len(values) not in (1, n_top):
                    raise self.error(
                        f"legacy field '{field}' has {len(values)} entries; expected 1 or one per top ({n_top})"
                    )
            shapes = [
                tuple(int(v[i if len(v) > 1 else 0]) for v in legacy.values()) for i in range(n_top)
            ]
        else:
            if len(p.shape) not in (1, n_top):
                raise self.error(f"has {len(p.shape)} shape entries; expected 1 or one per top ({n_top})")
            shapes = [tuple(p.shape[i if len(p.shape) > 1 else 0].dim) for i in range(n_top)]
        if len(p.data_filler) == 0:
            self.fillers = [caffe_pb2.FillerParameter(type="constant", value=0)]
        else:
            self.fillers = list(p.data_filler)
        self.refill = [f.type != "constant" for f in self.fillers]
        for t, shape in zip(top, shapes):
            t.reshape(shape)
        for i, t in enumerate(top):  # every top once; constant ones are never filled again
            fillers.fill(t, self._filler_of(i))

    def _filler_of(self, top_index: int) -> caffe_pb2.FillerParameter:
        return self.fillers[top_index if len(self.fillers) > 1 else 0]

    def reshape(self, bottom, top):
        """Shapes are fixed at set-up."""

    def forward_cpu(self, bottom, top):
        for i, t in enumerate(top):
            if self.refill[i if len(self.fillers) > 1 else 0]:
                fillers.fill(t, self._filler_of(i))
