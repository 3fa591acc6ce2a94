"""``upgrade_net_proto_text v0_net_proto_file_in net_proto_file_out``: BVLC's tool. Reads a
NetParameter (prototxt) of any old format
(V0, V1 ``layers``, data-layer transformation fields, net-level inputs, old BatchNorm specs), upgrades it
as Caffe does when loading, and writes it back as text. Exit status 1 when some field could not be
carried over, 2 when the input does not parse.
"""

from __future__ import annotations

import argparse
import logging

from ..errors import CaffeError, PrototxtError
from ..proto import protoio, upgrade
from ..schema import caffe_pb2
from . import _tools

NAME = "upgrade_net_proto_text"
HELP = "upgrade an old-format text NetParameter to the current format (BVLC's tool)"
USAGE = "upgrade_net_proto_text v0_net_proto_file_in net_proto_file_out"
GFLAGS = ()
POSITIONAL = ("input_file", "output_file")

log = logging.getLogger("pycaffe_lite")


add_arguments, namespace = _tools.arguments(GFLAGS, POSITIONAL, USAGE)


def run(args: argparse.Namespace) -> int:
    return upgrade_file(args, binary=False)


def upgrade_file(args: argparse.Namespace, binary: bool) -> int:
    """Read, upgrade and write a NetParameter, text or binary (this tool and upgrade_net_proto_binary)."""
    kind = "binary" if binary else "text"
    param = caffe_pb2.NetParameter()
    try:
        (protoio.read_binary if binary else protoio.read_text)(args.input_file, param)
    except PrototxtError as exc:
        log.error("Failed to parse input %s file as NetParameter: %s (%s)", kind, args.input_file, exc)
        return 2
    success = True
    if upgrade.net_needs_upgrade(param) or upgrade.net_needs_data_upgrade(param):
        try:
            success = upgrade.upgrade_net(param, args.input_file)
        except CaffeError as exc:
            log.error("%s", exc)
            success = False
        if not success:
            log.error("Encountered error(s) while upgrading prototxt; see details above.")
    else:
        log.error("File already in latest proto format: %s", args.input_file)
    (protoio.write_binary if binary else protoio.write_text)(args.output_file, param)
    log.info("Wrote upgraded NetParameter %s proto to %s", kind, args.output_file)
    return 0 if success else 1
