"""Printing tables and errors for the command line."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.table import Table

LOG_COLUMNS = 160

# Tables take a terminal's own width; logs (pipes, Ray job logs) get 160 columns unless COLUMNS says otherwise,
# so the report tables are not squeezed to rich's default 80. Message lines are never broken (soft_wrap):
# a line in a log stays one line, whole, for grep.
console = Console(width=None if sys.stdout.isatty() or "COLUMNS" in os.environ else LOG_COLUMNS, soft_wrap=True)


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    table = Table(title=title)
    for index, column in enumerate(columns):
        table.add_column(column, no_wrap=index == 0)  # row names stay whole; other columns wrap
    for row in rows:
        table.add_row(*[str(cell) for cell in row])
    console.print(table)


def print_error(message: str) -> None:
    """One line on stderr: ``trace-ray: error: <cause>; <fix>``."""
    print(f"trace-ray: error: {message}", file=sys.stderr)
