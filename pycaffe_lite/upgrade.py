"""Bringing old net definitions up to date, as Caffe's upgrade_proto does.

Handled now: net-level ``input`` / ``input_shape`` / ``input_dim`` become an Input layer.
"""

from __future__ import annotations

from .net_filter import upgrade_net_inputs
from .proto import caffe_pb2


def upgrade_net(param: caffe_pb2.NetParameter, source: str = "<NetParameter>") -> None:
    """Upgrade ``param`` in place to the current (V2, ``layer``) form."""
    upgrade_net_inputs(param)
