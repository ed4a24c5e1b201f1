"""Gold replay of a τ²-bench domain: the package's own verdict on each task's gold actions beside our adapter's.

For every task of the domain:

- package: the gold actions run on a fresh package environment through its
  ``get_response`` (which turns a failing call into an error message, as its
  orchestrator does), then the oracle's closing reply; the package's
  evaluators score that trajectory;
- ours: :class:`Tau2Environment` with the scripted user, played by its oracle
  (the same gold calls, one per turn, then the same reply) through our tool
  validation, error observations, user turns and termination.

A difference only fails the replay where the package scores 1.0 and we do
not. The reason column says why a task scores what it scores: failing gold
calls (and whether they are reads), and the components below 1.0.
"""

from __future__ import annotations

import functools
import json
import multiprocessing
import os
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from typing import Any

from environments.self_checks import oracle, play
from environments.tau2.environment import Tau2Environment, gold_actions, initial_environment, oracle_reply
from environments.tau2.package import tau2_module
from environments.tau2.scoring import score_episode
from environments.tau2.tasks import domain_tasks
from environments.tau2.user_simulator import GREETING, ScriptedUser


@dataclass
class GoldReplayRow:
    task_id: str
    package_reward: float
    our_reward: float
    reason: str

    @property
    def match(self) -> bool:
        return self.package_reward == self.our_reward

    @property
    def regression(self) -> bool:
        """The package's gold actions pass and ours do not: the adapter is wrong."""
        return self.package_reward == 1.0 and self.our_reward < 1.0


def package_gold_trajectory(domain: str, task: Any, seed: int) -> tuple[list[Any], list[str]]:
    """The gold actions' trajectory built with the package alone, and a note per failing gold call."""
    messages = tau2_module("data_model.message")
    environment = initial_environment(domain, task)
    trajectory = [
        messages.AssistantMessage(role="assistant", content=GREETING),
        messages.UserMessage(role="user", content=ScriptedUser().start(task, seed)),
    ]
    failures = []
    for index, action in enumerate(gold_actions(task)):
        call = messages.ToolCall(id=f"gold_{index}", name=action.name, arguments=action.arguments)
        answer = environment.get_response(call)
        trajectory += [messages.AssistantMessage(role="assistant", tool_calls=[call]), answer]
        if answer.error:
            kind = environment.tools.tool_type(action.name).value
            arguments = ", ".join(f"{key}={json.dumps(value)}" for key, value in action.arguments.items())
            failures.append(f"gold {kind} call {action.name}({arguments}) fails ({answer.content})")
    trajectory.append(messages.AssistantMessage(role="assistant", content=oracle_reply(task)))
    return trajectory, failures


def _zero_components(breakdown: dict[str, Any]) -> list[str]:
    return [kind for kind in breakdown["reward_basis"] if breakdown["components"][kind] == 0.0]


def replay_task(domain: str, seed: int) -> GoldReplayRow:
    task = domain_tasks(domain)[seed]
    trajectory, failures = package_gold_trajectory(domain, task, seed)
    package_reward, package_breakdown = score_episode(domain, task, trajectory, ended_by_user=True, judge=None)
    our_reward, our_breakdown = play(Tau2Environment(domain), seed, oracle)
    reasons = list(failures)
    if failures and package_breakdown["db_match"]:
        reasons.append("the evaluator's gold run fails alike, so the DB check still passes")
    if package_reward < 1.0:
        reasons.append(f"package: {', '.join(_zero_components(package_breakdown))} = 0")
    if our_reward != package_reward:
        zero = _zero_components(our_breakdown) or [our_breakdown.get("termination_reason", "?")]
        reasons.append(f"ours: {', '.join(zero)} = 0 (ended by {our_breakdown.get('termination_reason')})")
    if not reasons:
        reasons.append(
            "gold actions reproduce the gold database"
            if gold_actions(task)
            else "no gold actions: the database must stay unchanged"
        )
    return GoldReplayRow(task.id, package_reward, our_reward, "; ".join(reasons))


def gold_replay(domain: str, seeds: list[int], workers: int | None = None) -> Iterator[GoldReplayRow]:
    """One row per task of ``seeds``, in their order, each as soon as it is ready.

    Each task costs about a second of CPU, mostly parsing and hashing
    databases inside the package's evaluators, so ``workers`` processes
    (default: one per CPU) share the tasks.
    """
    workers = min(workers or os.cpu_count() or 1, len(seeds))
    if workers <= 1:
        yield from (replay_task(domain, seed) for seed in seeds)
        return
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        yield from pool.map(functools.partial(replay_task, domain), seeds)
