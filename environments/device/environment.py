"""``DeviceEnvironment``: a ToolSandbox-style phone assistant task per seed."""

from __future__ import annotations

import hashlib
from typing import Any

from environments.device.capability_evidence import DETECTORS, device_capability_evidence
from environments.device.milestones import score_episode
from environments.device.scenarios import TRAIN_SEED_OFFSET, Scenario, make_scenario, split_seeds
from environments.device.state import DeviceState
from environments.device.tools import DeviceTools
from environments.protocol import Message
from environments.tool_environment import Tool, ToolEnvironment

POLICY = (
    "You are a phone assistant. Use the tools to do what the user asks, then reply to the user in plain text; "
    "that reply ends the conversation unless it asks the user a question. All times are UTC; timestamps are in "
    "seconds. "
    "'Next <weekday>' means the first such day after today. If a request is ambiguous, ask the user. "
    "Tell the user about any other setting you had to change."
)


class DeviceEnvironment(ToolEnvironment):
    name = "device"

    def __init__(
        self,
        max_turns: int = 50,
        max_tool_calls_per_turn: int = 8,
        success_threshold: float = 1.0,
        analysis_size: int = 64,
        eval_size: int = 64,
    ):
        super().__init__(max_turns=max_turns, max_tool_calls_per_turn=max_tool_calls_per_turn)
        self.success_threshold = success_threshold
        self.split_sizes = {"analysis": analysis_size, "eval": eval_size}
        self.scenario: Scenario | None = None
        self.state: DeviceState | None = None
        self._clarified = False

    # -- tasks --------------------------------------------------------------------------
    def task_seeds(self, split: str) -> list[int]:
        if split == "train":
            raise ValueError("the train split has unlimited seeds; use train_seed(index)")
        if split not in self.split_sizes:
            raise ValueError(f"unknown split {split!r}; choose analysis, eval or train")
        return split_seeds(split, self.split_sizes[split])

    def train_seed(self, index: int) -> int:
        if index < 0:
            raise ValueError("train seed index must be >= 0")
        return TRAIN_SEED_OFFSET + index

    # -- the episode ----------------------------------------------------------------------
    def make_scenario(self, seed: int) -> Scenario:
        """The task of ``seed`` (synthetic capability environments draw theirs from a template)."""
        return make_scenario(seed)

    def start_episode(self, seed: int) -> tuple[list[Message], list[Tool], dict[str, Any]]:
        self.scenario = self.make_scenario(seed)
        self.state = self.scenario.state.copy()
        self._clarified = False
        messages = [{"role": "system", "content": POLICY}, {"role": "user", "content": self.scenario.request}]
        info = {"task_id": f"device-{seed}", "family": self.scenario.family, "seed": seed}
        return messages, DeviceTools(self.state).tools(), info

    def on_agent_reply(self, text: str) -> tuple[list[Message], bool]:
        """The scripted user answers the first question of an ambiguous task; any other reply ends the episode."""
        if self.scenario.clarification and not self._clarified and "?" in text:
            self._clarified = True
            return [{"role": "user", "content": self.scenario.clarification}], False
        return [], True

    def score(self) -> tuple[float, dict[str, Any]]:
        return score_episode(
            self.scenario.milestones,
            self.scenario.minefields,
            self.state,
            self.log,
            self.success_threshold,
            self.scenario.family,
        )

    def task_fingerprint(self) -> str:
        if self.scenario is None:
            raise RuntimeError("task_fingerprint() called before reset(seed)")
        return hashlib.sha256(repr(self.scenario).encode()).hexdigest()

    # -- ground truth for the rule-based capability labeler ----------------------------------
    def capability_detectors(self) -> list[str]:
        return list(DETECTORS)

    def capability_evidence(self, seed: int) -> dict[str, Any]:
        """Derived from the scenario of ``seed`` by replaying its oracle (see ``capability_evidence.py``)."""
        return device_capability_evidence(seed)

    # -- demonstrations ---------------------------------------------------------------------
    def oracle_message(self) -> Message:
        """The next message of the scenario's oracle script (valid while the episode follows it)."""
        if self.scenario is None:
            raise RuntimeError("oracle_message() called before reset(seed)")
        if self.log.turns >= len(self.scenario.oracle):
            raise RuntimeError("the oracle script is finished")
        return self.scenario.oracle[self.log.turns]

    def example_exchange(self) -> list[Message]:
        """One call with an argument: measured to make the embedded model write valid calls.

        (An argument-free example made it copy empty or placeholder arguments.)
        """
        call = {
            "id": "call_example",
            "type": "function",
            "function": {"name": "set_wifi_status", "arguments": '{"on": false}'},
        }
        return [
            {"role": "user", "content": "Turn off wifi."},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_example", "name": "set_wifi_status", "content": "wifi is now off"},
            {"role": "assistant", "content": "Wifi is now off."},
        ]
