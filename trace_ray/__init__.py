"""trace-ray: capability-targeted agent training (TRACE) on Ray."""

__version__ = "0.1.0"
