"""``run_dir/capabilities/selected.json``: the capabilities identification selected, read in one place.

Identification writes it; synthesis marks each entry READY (calibrated in band),
OUT_OF_BAND (an environment whose nearest difficulty level is outside the band)
or FAILED; training, routing, serving, evaluation and the pipeline read it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from environments.errors import TraceRayError
from trace_ray.config import SynthesisConfig

READY = "READY"
OUT_OF_BAND = "OUT_OF_BAND"


def selection_path(run_dir: Path) -> Path:
    return Path(run_dir) / "capabilities" / "selected.json"


def read_selection(
    run_dir: Path, missing_hint: str = "run trace-ray identify run_dir=DIR first"
) -> list[dict[str, Any]]:
    """The selected capabilities (a list of entries with names); one-line errors when missing or malformed."""
    path = selection_path(run_dir)
    if not path.is_file():
        raise TraceRayError(f"no {path}; {missing_hint.replace('DIR', str(run_dir))}")
    try:
        entries = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise TraceRayError(
            f"{path} is not valid JSON ({exc.msg}); rerun trace-ray identify run_dir={run_dir}"
        ) from None
    if not isinstance(entries, list) or not all(
        isinstance(e, dict) and isinstance(e.get("name"), str) for e in entries
    ):
        raise TraceRayError(
            f"{path} is not a list of capabilities with names; rerun trace-ray identify run_dir={run_dir}"
        )
    return entries


def informative_fraction(entry: dict[str, Any]) -> float:
    """The share of calibration groups at an OUT_OF_BAND entry's nearest level whose rewards were not all equal
    (where every group scored alike, GRPO has no advantage to follow)."""
    nearest = entry.get("nearest_level") or {}
    return max(0.0, 1.0 - nearest.get("all_zero_fraction", 0.0) - nearest.get("all_success_fraction", 0.0))


def trainable(entry: dict[str, Any], synthesis: SynthesisConfig) -> bool:
    """Whether the entry's environment is trained: READY; OUT_OF_BAND under ``synthesis.accept_out_of_band`` when
    its nearest level gave GRPO a signal (some informative calibration groups, at least
    ``synthesis.min_informative_fraction`` of them) or ``synthesis.train_without_signal`` allows it anyway."""
    if entry.get("status") == READY:
        return True
    if entry.get("status") != OUT_OF_BAND or not synthesis.accept_out_of_band:
        return False
    share = informative_fraction(entry)
    return synthesis.train_without_signal or (
        share > 1e-9 and share >= (synthesis.min_informative_fraction or 0.0) - 1e-9
    )


def synthesized_entries(run_dir: Path) -> list[dict[str, Any]]:
    """The entries with an environment, READY or OUT_OF_BAND (none when there is no selection yet).

    Training decides whether an OUT_OF_BAND one is trained (``synthesis.accept_out_of_band``); once it
    has an adapter, it is routed, served and evaluated like a READY one.
    """
    if not selection_path(run_dir).is_file():
        return []
    return [entry for entry in read_selection(run_dir) if entry.get("status") in (READY, OUT_OF_BAND)]
