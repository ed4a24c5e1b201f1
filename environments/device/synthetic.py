"""Synthetic capability environments on the device target (``synthesis=templates``).

A :class:`DeviceTemplateEnvironment` is the device environment (same tools,
state, policy text, scripted user and milestone score with partial credit)
whose tasks come from one capability's template
(``environments/device/synthetic_templates.py``) at one difficulty, so every
task needs that capability. Its seeds are disjoint from the device benchmark.
"""

from __future__ import annotations

import random

from environments.device.draft import Draft
from environments.device.environment import DeviceEnvironment
from environments.device.scenarios import Scenario
from environments.device.synthetic_templates import TEMPLATES
from environments.protocol import Message
from environments.synthetic.seeds import TemplateSeeds
from environments.synthetic.template import CapabilityTemplate

SYNTHETIC_SPLIT_SEEDS = {"analysis": tuple(range(500_000, 500_032)), "eval": tuple(range(500_032, 500_064))}
SYNTHETIC_TRAIN_SEED_OFFSET = 2_000_000


def device_template(capability: str) -> CapabilityTemplate:
    if capability not in TEMPLATES:
        raise ValueError(f"no device template for capability {capability!r}; templates: {', '.join(sorted(TEMPLATES))}")
    return TEMPLATES[capability]


def make_template_scenario(template: CapabilityTemplate, seed: int, difficulty: int) -> Scenario:
    draft = Draft(random.Random(f"{template.capability}/{difficulty}/{seed}"))
    request = template.build(draft, difficulty)
    draft.finish()
    return Scenario(
        seed,
        f"synthetic/{template.capability}",
        request,
        draft.state,
        draft.milestones,
        draft.minefields,
        draft.oracle,
        draft.clarification,
        tuple(draft.capability_turns),
        dict(draft.broken_turns),
    )


class DeviceTemplateEnvironment(TemplateSeeds, DeviceEnvironment):
    split_seeds, train_seed_offset = SYNTHETIC_SPLIT_SEEDS, SYNTHETIC_TRAIN_SEED_OFFSET

    def __init__(
        self,
        capability: str,
        difficulty: int,
        max_turns: int = 50,
        max_tool_calls_per_turn: int = 8,
        success_threshold: float = 1.0,
    ):
        super().__init__(
            max_turns=max_turns, max_tool_calls_per_turn=max_tool_calls_per_turn, success_threshold=success_threshold
        )
        self.template = device_template(capability)
        if difficulty not in self.template.difficulties:
            raise ValueError(
                f"difficulty {difficulty} of {capability!r} is not one of {list(self.template.difficulties)}"
            )
        self.difficulty = difficulty
        self.name = f"synthetic/{capability}"

    def make_scenario(self, seed: int) -> Scenario:
        return make_template_scenario(self.template, seed, self.difficulty)

    def capability_detectors(self) -> list[str]:
        return []

    def capability_evidence(self, seed: int) -> dict:
        return {}

    def capability_turns(self) -> list[int]:
        return list(self.scenario.capability_turns)

    def broken_step(self, turn: int) -> Message | None:
        return self.scenario.broken_turns.get(turn)
