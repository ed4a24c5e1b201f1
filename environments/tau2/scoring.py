"""τ²-bench's reward of one episode, computed by the package's own evaluators.

The episode comes as the package's message list (greeting, user and agent
messages, tool calls with their results). Components, each 1.0 or 0.0:

- ``DB``: the package's EnvironmentEvaluator replays the episode's tool
  calls on a fresh database and the task's gold actions on another, and
  compares the two databases' hashes (``ENV_ASSERTION``: its assertions);
- ``ACTION``: the ActionEvaluator (every gold action among the calls);
- ``COMMUNICATE``: the CommunicateEvaluator (every ``communicate_info``
  string in an agent message); each string is also a milestone
  ``communicate_info:<i>``, which the rule-based detectors read;
- ``NL_ASSERTION``: the judge's verdicts, when a judge is configured.

The reward is the product of the components the task's ``reward_basis``
names, as τ²-bench combines them; an episode the user did not end (turn
limit, too many tool errors) scores 0, as τ²-bench scores a premature end.
"""

from __future__ import annotations

import functools
from typing import Any

from environments.tau2.judge import NLAssertionJudge
from environments.tau2.package import fresh_environment, tau2_module

JUDGE_OFF = "not scored: no judge (set env.judge.base_url to score NL assertions)"


def score_episode(
    domain: str, task: Any, trajectory: list[Any], ended_by_user: bool, judge: NLAssertionJudge | None
) -> tuple[float, dict[str, Any]]:
    """(reward, breakdown) of an episode of ``task`` given as the package's messages."""
    env_evaluator = tau2_module("evaluator.evaluator_env").EnvironmentEvaluator
    action_evaluator = tau2_module("evaluator.evaluator_action").ActionEvaluator
    communicate_evaluator = tau2_module("evaluator.evaluator_communicate").CommunicateEvaluator
    criteria = task.evaluation_criteria

    env_result = env_evaluator.calculate_reward(
        environment_constructor=functools.partial(fresh_environment, domain), task=task, full_trajectory=trajectory
    )
    action_result = action_evaluator.calculate_reward(task=task, full_trajectory=trajectory)
    communicate_result = communicate_evaluator.calculate_reward(task=task, full_trajectory=trajectory)
    assertions = (criteria.nl_assertions or []) if criteria else []
    verdicts = judge.check(assertions, trajectory) if judge and assertions else None

    components: dict[str, float | None] = {
        "DB": env_result.db_check.db_reward if env_result.db_check else 1.0,
        "ENV_ASSERTION": float(all(check.met for check in env_result.env_assertions or [])),
        "ACTION": action_result.reward,
        "COMMUNICATE": communicate_result.reward,
        "NL_ASSERTION": float(all(verdict["met"] for verdict in verdicts))
        if verdicts is not None
        else (None if assertions else 1.0),
    }
    basis = [kind.value for kind in criteria.reward_basis] if criteria else []
    reward = 1.0
    for kind in basis:
        if components[kind] is not None:  # an unjudged NL basis leaves the reward to the other components
            reward *= components[kind]

    if verdicts is not None:
        nl_report: Any = verdicts
    elif not assertions:
        nl_report = "none in this task"
    elif judge is None:
        nl_report = JUDGE_OFF
    else:
        nl_report = "not scored: the judge's answer was not the requested JSON"
    breakdown: dict[str, Any] = {
        "reward_basis": basis,
        "components": components,
        "db_match": components["DB"] == 1.0,
        "actions": [
            {"action_id": check.action.action_id, "name": check.action.name, "matched": check.action_match}
            for check in action_result.action_checks or []
        ],
        "milestones": [
            {"name": f"communicate_info:{index}", "reached": check.met, "info": check.info}
            for index, check in enumerate(communicate_result.communicate_checks or [])
        ],
        "nl_assertions": nl_report,
    }
    if not ended_by_user:
        reward = 0.0
        breakdown["note"] = "the user did not end the conversation: τ²-bench scores a premature end 0"
    return reward, breakdown
