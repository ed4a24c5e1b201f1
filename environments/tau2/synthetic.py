"""Synthetic capability environments on the τ²-bench targets (``synthesis=templates`` for tau2_airline / tau2_retail).

A :class:`Tau2TemplateEnvironment` plays one capability's template
(``environments/tau2/synthetic_templates.py``) at one difficulty: a generated
database under the package's own toolkit (so the tools are the target's,
schema for schema), the domain's policy as the system prompt, and a scripted
user whose request states everything and who answers "yes" to the agent's
questions while the task is not done yet.

Reward (TRACE's rule): 1.0 when the final database equals the oracle's (the
package's database hash) and the final reply reports every required fact
(and no rival value of its kind: no amount or status the oracle's reply does
not state);
0.3 when the database is right but the report is not; 0.0 otherwise. A task
that changes nothing (an information request) scores 1.0 only when reported.
``info["milestones"]`` breaks it down: the database milestone and one report
milestone per fact.
"""

from __future__ import annotations

import hashlib
import json
import random
from functools import lru_cache
from typing import Any

from environments.protocol import Message
from environments.synthetic.seeds import TemplateSeeds
from environments.synthetic.template import CapabilityTemplate
from environments.tau2.airline_templates import AIRLINE_TEMPLATES
from environments.tau2.package import agent_tools
from environments.tau2.retail_templates import RETAIL_TEMPLATES
from environments.tau2.synthetic_data import DATABASE_MODELS, empty_database
from environments.tau2.synthetic_templates import Tau2Draft, Tau2Task, package_environment
from environments.tool_environment import Tool, ToolEnvironment

SPLIT_SEEDS = {"analysis": tuple(range(600_000, 600_032)), "eval": tuple(range(600_032, 600_064))}
TRAIN_SEED_OFFSET = 3_000_000
STATE_ONLY_REWARD = 0.3
MAX_ANSWERS = 5  # questions the scripted user answers before any reply ends the episode
CONFIRMATION = "Yes, please go ahead."
TEMPLATES = {"airline": AIRLINE_TEMPLATES, "retail": RETAIL_TEMPLATES}  # domain -> capability -> template


def tau2_template(domain: str, capability: str) -> CapabilityTemplate:
    if domain not in TEMPLATES:
        raise ValueError(f"no τ²-bench templates for domain {domain!r}; choose one of: {', '.join(TEMPLATES)}")
    templates = TEMPLATES[domain]
    if capability not in templates:
        raise ValueError(
            f"no {domain} template for capability {capability!r}; templates: {', '.join(sorted(templates))}"
        )
    return templates[capability]


@lru_cache(maxsize=256)
def make_task(domain: str, capability: str, difficulty: int, seed: int) -> Tau2Task:
    """The task of ``seed``: the same arguments give the same task."""
    template = tau2_template(domain, capability)
    draft = Tau2Draft(domain, random.Random(f"tau2_{domain}/{capability}/{difficulty}/{seed}"))
    request = template.build(draft, difficulty)
    return draft.finish(capability, request)


def score_task(
    task: Tau2Task, db_hash: str, final_reply: str, success_threshold: float
) -> tuple[float, dict[str, Any]]:
    """The reward of an episode that ended with database hash ``db_hash`` and ``final_reply``, and its breakdown."""
    state_ok = db_hash == task.expected_hash
    reference = task.oracle[-1].get("content") or ""
    reported = [fact.reported_in(final_reply, reference) for fact in task.facts]
    if not state_ok:
        reward = 0.0
    elif all(reported):
        reward = 1.0
    else:
        reward = STATE_ONLY_REWARD if task.writes else 0.0
    state = "the database matches the expected changes" if task.writes else "the database is unchanged"
    milestones = [{"name": state, "reached": state_ok}]
    milestones += [{"name": f"reported {fact.name}", "reached": ok} for fact, ok in zip(task.facts, reported)]
    return reward, {
        "milestones": milestones,
        "score": reward,
        "success": reward >= success_threshold,
        "family": f"synthetic/{task.capability}",
    }


class Tau2TemplateEnvironment(TemplateSeeds, ToolEnvironment):
    split_seeds, train_seed_offset = SPLIT_SEEDS, TRAIN_SEED_OFFSET

    def __init__(
        self,
        capability: str,
        difficulty: int,
        max_turns: int = 50,
        max_tool_calls_per_turn: int = 8,
        success_threshold: float = 1.0,
        *,
        domain: str,
    ):
        super().__init__(max_turns=max_turns, max_tool_calls_per_turn=max_tool_calls_per_turn)
        self.template = tau2_template(domain, capability)
        if difficulty not in self.template.difficulties:
            raise ValueError(
                f"difficulty {difficulty} of {capability!r} is not one of {list(self.template.difficulties)}"
            )
        self.domain, self.difficulty, self.success_threshold = domain, difficulty, success_threshold
        self.name = f"synthetic/{capability}"
        self.task: Tau2Task | None = None
        # one package environment (its toolkit, policy and our tools) per instance; each episode puts a fresh database
        # under it
        self._package = package_environment(domain, empty_database(domain))
        self._package_tools = agent_tools(self._package)
        self._answers = 0

    # -- tasks --------------------------------------------------------------------------
    def make_task(self, seed: int) -> Tau2Task:
        return make_task(self.domain, self.template.capability, self.difficulty, seed)

    # -- the episode ----------------------------------------------------------------------
    def start_episode(self, seed: int) -> tuple[list[Message], list[Tool], dict[str, Any]]:
        self.task = self.make_task(seed)
        self._package.tools.db = DATABASE_MODELS[self.domain].model_validate(self.task.db)
        self._answers = 0
        messages = [
            {"role": "system", "content": self._package.get_policy()},
            {"role": "user", "content": self.task.request},
        ]
        task_id = f"tau2_{self.domain}-{self.template.capability}-{seed}"
        info = {"task_id": task_id, "family": self.name, "seed": seed, "difficulty": self.difficulty}
        return messages, self._package_tools, info

    def on_agent_reply(self, text: str) -> tuple[list[Message], bool]:
        """The user says yes to a question while the task is not done (at most MAX_ANSWERS times); any other reply ends
        it."""
        unfinished = self._package.get_db_hash() != self.task.expected_hash
        if "?" in text and unfinished and self._answers < MAX_ANSWERS:
            self._answers += 1
            return [{"role": "user", "content": CONFIRMATION}], False
        return [], True

    def score(self) -> tuple[float, dict[str, Any]]:
        final_reply = self.log.replies[-1] if self.log.replies else ""
        return score_task(self.task, self._package.get_db_hash(), final_reply, self.success_threshold)

    def task_fingerprint(self) -> str:
        if self.task is None:
            raise RuntimeError("task_fingerprint() called before reset(seed)")
        task = self.task
        content = [
            task.request,
            task.db,
            task.oracle,
            [vars(fact) for fact in task.facts],
            task.capability_turns,
            task.expected_hash,
        ]
        return hashlib.sha256(json.dumps(content, sort_keys=True, default=str).encode()).hexdigest()

    # -- demonstrations -------------------------------------------------------------------
    def oracle_message(self) -> Message:
        if self.task is None:
            raise RuntimeError("oracle_message() called before reset(seed)")
        if self.log.turns >= len(self.task.oracle):
            raise RuntimeError("the oracle script is finished")
        return self.task.oracle[self.log.turns]

    def capability_turns(self) -> list[int]:
        return list(self.task.capability_turns)

    def broken_step(self, turn: int) -> Message | None:
        """The template's wrong action for a capability turn (acting without the check), if it has one."""
        return self.task.broken_turns.get(turn)

    def example_exchange(self) -> list[Message]:
        call = {
            "id": "call_example",
            "type": "function",
            "function": {"name": "calculate", "arguments": '{"expression": "12 + 30"}'},
        }
        return [
            {"role": "user", "content": "What is 12 + 30?"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_example", "name": "calculate", "content": "42.0"},
            {"role": "assistant", "content": "12 + 30 is 42."},
        ]


class AirlineTemplateEnvironment(Tau2TemplateEnvironment):
    """``tau2_airline``'s synthetic environments."""

    def __init__(self, capability: str, difficulty: int, **options):
        super().__init__(capability, difficulty, domain="airline", **options)


class RetailTemplateEnvironment(Tau2TemplateEnvironment):
    """``tau2_retail``'s synthetic environments."""

    def __init__(self, capability: str, difficulty: int, **options):
        super().__init__(capability, difficulty, domain="retail", **options)
