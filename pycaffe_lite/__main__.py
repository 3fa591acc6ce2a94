"""``python -m pycaffe_lite``: the command line (see :mod:`pycaffe_lite.commands.cli`)."""

import sys

from .commands.cli import main

sys.exit(main())
