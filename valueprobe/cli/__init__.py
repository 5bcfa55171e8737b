"""The ``valueprobe`` command line: one module per command group, and the error boundary.

The entry point is `valueprobe.cli.main.main` (``valueprobe`` and ``python -m valueprobe``).
"""
