"""Environments for tests of training: rewards a randomly initialised model earns about half the time.

Loaded by name as ``env.name=tests.scripted_environments:ParityEnvironment``
(the registry imports ``package.module:Factory``), in the driver and in Ray
workers alike.
"""

from __future__ import annotations

import time
from typing import Any

from environments.tool_environment import Tool, ToolEnvironment


class ParityEnvironment(ToolEnvironment):
    """One reply per task; reward 1.0 when it has an even number of characters, else 0.0."""

    name = "parity"

    def __init__(self, max_turns: int = 50, max_tool_calls_per_turn: int = 8, success_threshold: float = 1.0):
        super().__init__(max_turns=max_turns, max_tool_calls_per_turn=max_tool_calls_per_turn)
        self.seed = None

    def task_seeds(self, split: str) -> list[int]:
        return list(range(8)) if split == "analysis" else list(range(8, 16))

    def train_seed(self, index: int) -> int:
        return 1000 + index

    def start_episode(self, seed: int):
        self.seed = seed
        messages = [
            {"role": "system", "content": "Reply."},
            {"role": "user", "content": f"Task {seed}: say something."},
        ]
        return (
            messages,
            [Tool("noop", "Does nothing.", {"type": "object", "properties": {}}, lambda: "ok")],
            {"task_id": f"parity-{seed}", "family": "parity"},
        )

    def on_agent_reply(self, text: str):
        return [], True

    def score(self) -> tuple[float, dict[str, Any]]:
        reply = self.log.replies[-1] if self.log.replies else ""
        reward = 1.0 if self.log.replies and len(reply) % 2 == 0 else 0.0
        return reward, {"success": reward == 1.0, "family": "parity"}

    def oracle_message(self):
        return {"role": "assistant", "content": "ok"}

    def task_fingerprint(self) -> str:
        return f"parity-{self.seed}"


class OddParityEnvironment(ParityEnvironment):
    """ParityEnvironment with the reward flipped: 1.0 for an odd number of characters."""

    name = "odd_parity"

    def score(self) -> tuple[float, dict[str, Any]]:
        reward, info = super().score()
        reward = 1.0 - reward if self.log.replies else 0.0
        return reward, {**info, "success": reward == 1.0}


class SlowTwoTurnParityEnvironment(ParityEnvironment):
    """ParityEnvironment over two replies (the user asks once more after the first), the first step taking
    ``FIRST_STEP_S``: longer than an update of the tiny model even on a loaded machine (0.5 s was not, with make test
    beside make test-slow), so an adapter version published while a batch plays ahead reaches its second turns."""

    name = "slow_two_turn_parity"
    FIRST_STEP_S = 4.0

    def on_agent_reply(self, text: str):
        if len(self.log.replies) < 2:
            return [{"role": "user", "content": "Once more."}], False
        return [], True

    def step(self, assistant_message):
        if not self.log.replies:
            time.sleep(self.FIRST_STEP_S)
        return super().step(assistant_message)
