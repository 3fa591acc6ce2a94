"""Package version (one place, read by setup.cfg)."""

__version__ = "0.1.0"
