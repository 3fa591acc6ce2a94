"""``upgrade_solver_proto_text old_solver_proto_file_in solver_proto_file_out``: BVLC's tool. The
legacy ``solver_type`` enum becomes the ``type`` string (SGD, Nesterov, AdaGrad, RMSProp, AdaDelta,
Adam); the file is written back as text.
"""

from __future__ import annotations

import argparse
import logging

from ..errors import CaffeError, PrototxtError
from ..proto import protoio
from ..schema import caffe_pb2
from ..solvers.solver import upgrade_solver_param
from . import _tools

NAME = "upgrade_solver_proto_text"
HELP = "upgrade a solver prototxt's solver_type to type (BVLC's tool)"
USAGE = "upgrade_solver_proto_text old_solver_proto_file_in solver_proto_file_out"
GFLAGS = ()
POSITIONAL = ("input_file", "output_file")

log = logging.getLogger("pycaffe_lite")


add_arguments, namespace = _tools.arguments(GFLAGS, POSITIONAL, USAGE)


def run(args: argparse.Namespace) -> int:
    param = caffe_pb2.SolverParameter()
    try:
        protoio.read_text(args.input_file, param)
    except PrototxtError as exc:
        log.error("Failed to parse input text file as SolverParameter: %s (%s)", args.input_file, exc)
        return 2
    success = True
    if param.HasField("solver_type"):
        try:
            upgrade_solver_param(param, args.input_file)
        except CaffeError as exc:
            log.error("%s", exc)
            log.error("Encountered error(s) while upgrading prototxt; see details above.")
            success = False
    else:
        log.error("File already in latest proto format: %s", args.input_file)
    protoio.write_text(args.output_file, param)
    log.info("Wrote upgraded SolverParameter text proto to %s", args.output_file)
    return 0 if success else 1
