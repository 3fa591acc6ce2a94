"""``upgrade_net_proto_binary v0_net_proto_file_in net_proto_file_out``: BVLC's tool. Reads a
NetParameter (binary, e.g. a .caffemodel) of any old format
(V0, V1 ``layers``, data-layer transformation fields, net-level inputs, old BatchNorm specs), upgrades it
as Caffe does when loading, and writes it back as binary. Exit status 1 when some field could not be
carried over, 2 when the input does not parse.
"""

from __future__ import annotations

import argparse

from . import _tools
from .upgrade_net_proto_text import GFLAGS, POSITIONAL, upgrade_file

NAME = "upgrade_net_proto_binary"
HELP = "upgrade an old-format binary NetParameter to the current format (BVLC's tool)"
USAGE = "upgrade_net_proto_binary v0_net_proto_file_in net_proto_file_out"
__all__ = ["GFLAGS", "HELP", "NAME", "POSITIONAL", "USAGE", "add_arguments", "namespace", "run"]

add_arguments, namespace = _tools.arguments(GFLAGS, POSITIONAL, USAGE)


def run(args: argparse.Namespace) -> int:
    return upgrade_file(args, binary=True)
