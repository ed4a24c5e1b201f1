"""Atomic artifact writes: a reader never sees a half-written file."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any


def atomic_scratch(path: Path) -> str:
    """A readable temporary file beside ``path``, to be renamed onto it once complete."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, scratch = tempfile.mkstemp(prefix=f".{path.name}-", suffix=".tmp", dir=path.parent)
    os.close(handle)
    os.chmod(scratch, 0o644)  # mkstemp makes files private; artifacts are shared like any other output
    return scratch


def write_json(path: Path, value: Any, sort_keys: bool = True) -> None:
    scratch = atomic_scratch(path)
    try:
        with open(scratch, "w") as stream:
            json.dump(value, stream, indent=2, sort_keys=sort_keys, default=str)
            stream.write("\n")
        os.replace(scratch, path)
    except BaseException:
        Path(scratch).unlink(missing_ok=True)
        raise
