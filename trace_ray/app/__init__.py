"""The top layer: the ``trace-ray`` command line, one module per command (each exposes ``run(config)`` and ``HELP``),
the pipeline and sweeps. The only package that imports ``actors`` and ``serve_apps``; nothing imports it."""
