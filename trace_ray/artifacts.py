"""Atomic artifact writes: a reader never sees a half-written file."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def atomic_scratch(path: Path) -> str:
    """A readable temporary file beside ``path``, to be renamed onto it once complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, scratch = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".tmp", dir=path.parent)
    os.close(handle)
    os.chmod(scratch, 0o644)  # mkstemp makes files private; artifacts are shared like any other output
    return scratch


@contextlib.contextmanager
def atomic_path(path: Path) -> Iterator[str]:
    """A scratch file to write ``path``'s content to; renamed onto ``path`` on success, deleted on failure."""
    scratch = atomic_scratch(path)
    try:
        yield scratch
        os.replace(scratch, path)
    except BaseException:
        Path(scratch).unlink(missing_ok=True)
        raise


def write_json(path: Path, value: Any, sort_keys: bool = True) -> None:
    with atomic_path(path) as scratch, open(scratch, "w", encoding="utf-8") as stream:
        json.dump(value, stream, indent=2, sort_keys=sort_keys, default=str)
        stream.write("\n")
