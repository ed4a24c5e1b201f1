"""Synthetic capability environments from their spec (``run_dir/environments/<capability>/spec.json``).

``trace-ray synthesize`` writes the spec; ``env=synthetic/<capability>``
builds the environment from it: a target's template environment
(``source: templates``) or a generated module run in a sandboxed process
(``source: llm``), at the spec's calibrated difficulty unless one is given.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from environments.protocol import Environment
from environments.synthetic.sandbox import SandboxedEnvironment, SandboxLimits

# target -> (its templates, the environment that plays them); a new target adds its pair here
TEMPLATE_TARGETS: dict[str, tuple[str, str]] = {
    "device": (
        "environments.device.synthetic_templates:TEMPLATES",
        "environments.device.synthetic:DeviceTemplateEnvironment",
    ),
    "tau2_airline": (
        "environments.tau2.airline_templates:AIRLINE_TEMPLATES",
        "environments.tau2.synthetic:AirlineTemplateEnvironment",
    ),
    "tau2_retail": (
        "environments.tau2.retail_templates:RETAIL_TEMPLATES",
        "environments.tau2.synthetic:RetailTemplateEnvironment",
    ),
    "code_repair": (
        "environments.code_repair.synthetic_templates:TEMPLATES",
        "environments.code_repair.synthetic:CodeRepairTemplateEnvironment",
    ),
}


def _load(reference: str) -> Any:
    module_name, attribute = reference.split(":")
    return getattr(importlib.import_module(module_name), attribute)


def target_templates(target: str) -> dict:
    """Capability -> template of ``target`` (empty when the target has none)."""
    return _load(TEMPLATE_TARGETS[target][0]) if target in TEMPLATE_TARGETS else {}


def template_environment(target: str, capability: str, difficulty: int, **options) -> Environment:
    return _load(TEMPLATE_TARGETS[target][1])(capability, difficulty, **options)


def read_spec(path: str | Path) -> dict[str, Any]:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def synthetic_environment(spec: str, difficulty: int | None = None, **options) -> Environment:
    """The environment ``spec`` describes; ``options`` are the turn limits and success threshold."""
    document = read_spec(spec)
    level = document["difficulty"] if difficulty is None else difficulty
    if document["source"] == "templates":
        return template_environment(document["target"], document["capability"], level, **options)

    module = Path(spec).parent / document["module"]
    return SandboxedEnvironment(module, level, limits=SandboxLimits(**document["sandbox"]), **options)


def synthetic_levels(spec: str, difficulty: int | None = None) -> tuple[list[int], int]:
    """(the difficulty levels of the environment ``spec`` describes, easiest first; the one it plays: ``difficulty``, or
    the spec's calibrated one when None)."""
    document = read_spec(spec)
    level = document["difficulty"] if difficulty is None else difficulty
    if document["source"] == "templates":
        return sorted(target_templates(document["target"])[document["capability"]].difficulties), level
    return sorted(document["difficulties"]), level
