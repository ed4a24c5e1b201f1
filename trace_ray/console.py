"""Printing tables and errors for the command line."""

from __future__ import annotations

import sys
from typing import Any, Sequence

from rich.console import Console
from rich.table import Table

console = Console()


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
