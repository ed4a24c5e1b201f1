"""One module per ``trace-ray`` command; each exposes ``run(config)`` and ``HELP``."""
