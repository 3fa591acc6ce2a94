"""``python -m pycaffe_lite``: the command line (see :mod:`pycaffe_lite.cli`)."""

import sys

from .cli import main

sys.exit(main())
