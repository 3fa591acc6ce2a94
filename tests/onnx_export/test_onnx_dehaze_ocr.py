"""The forks' BReLU (DehazeNet) and ContinuationIndicator (dlunion's OCR fork) export and check."""

from __future__ import annotations

import pytest
from onnx_testing import export_and_check, make_net


@pytest.mark.parametrize("lo,hi", [(0.0, 1.0), (-0.5, 0.25), (1.0, 0.0)])
def test_brelu_exports_as_clip(lo, hi):
    net = make_net(f"""name: "dehaze"
layer {{ name: "in" type: "Input" top: "x" input_param {{ shape {{ dim: 2 dim: 3 dim: 4 dim: 5 }} }} }}
layer {{ name: "b" type: "BReLU" bottom: "x" top: "y" brelu_param {{ minval: {lo} maxval: {hi} }} }}
""")
    report = export_and_check(net, None)
    assert [n.op_type for n in report.exported.model.graph.node] == ["Clip"]


def test_continuation_indicator_exports_as_a_constant():
    net = make_net("""name: "ocr"
layer { name: "in" type: "Input" top: "x" input_param { shape { dim: 2 dim: 3 } } }
layer { name: "cont" type: "ContinuationIndicator" top: "c"
  continuation_indicator_param { time_step: 5 batch_size: 2 } }
layer { name: "sum" type: "Eltwise" bottom: "x" bottom: "x" top: "y" }
""")
    export_and_check(net, None)
