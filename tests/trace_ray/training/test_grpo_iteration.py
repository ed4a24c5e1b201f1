"""The GRPO iteration's plain functions, driven without Ray: dynamic sampling, the iteration's bookkeeping, stopping."""

from __future__ import annotations

import dataclasses
import math

from trace_ray.config_compose import compose_config
from trace_ray.rollout_loop import EpisodeResult
from trace_ray.training.grpo_iteration import (
    TrainState,
    begin_iteration,
    collect_groups,
    end_iteration,
    training_finished,
)
from trace_ray.trajectory import TokenRecord

GRPO = compose_config("train", ["model=tiny_random", "env=device"]).grpo


def grpo(**settings):
    return dataclasses.replace(GRPO, **settings)


def result(seed: int, reward: float) -> EpisodeResult:
    record = TokenRecord([1, 2, 3], [0, 1, 1], [0.0, -0.5, -0.5])
    return EpisodeResult(
        key=f"cap-{seed}",
        task_id=f"t{seed}",
        family="family",
        seed=seed,
        sample_index=0,
        adapter=("cap", 0),
        reward=reward,
        success=reward == 1.0,
        turns=1,
        termination="agent_reply",
        messages=[],
        tools=[],
        record=record,
    )


class Player:
    """Plays one group per seed; seeds in ``informative`` get unequal rewards, the others all zero."""

    def __init__(self, group_size: int, informative: set[int]):
        self.group_size, self.informative, self.calls = group_size, informative, []

    def __call__(self, seeds: list[int]) -> list[list[EpisodeResult]]:
        self.calls.append(list(seeds))
        return [
            [result(seed, float(seed in self.informative and k == 0)) for k in range(self.group_size)] for seed in seeds
        ]


def test_dynamic_sampling_plays_more_batches_until_enough_groups_are_informative():
    settings = grpo(
        groups_per_batch=2, group_size=3, min_informative_groups=2, max_resample_batches=3, max_rollouts=None
    )
    play = Player(3, informative={102, 105})
    groups, cursor = collect_groups(settings, TrainState(seed_cursor=0), lambda i: 100 + i, play)
    assert play.calls == [[100, 101], [102, 103], [104, 105]]  # the third batch brought the second informative group
    assert cursor == 6 and len(groups) == 6 and all(len(group) == 3 for group in groups)


def test_dynamic_sampling_stops_at_the_resample_limit_and_at_the_rollout_budget():
    settings = grpo(
        groups_per_batch=2, group_size=3, min_informative_groups=1, max_resample_batches=1, max_rollouts=None
    )
    play = Player(3, informative=set())
    _, cursor = collect_groups(settings, TrainState(seed_cursor=4), lambda i: i, play)
    assert play.calls == [[4, 5], [6, 7]] and cursor == 8  # one batch and one resample, then it gives up
    budget = grpo(groups_per_batch=2, group_size=3, min_informative_groups=1, max_resample_batches=5, max_rollouts=30)
    spent = TrainState(history=[{"rollouts": 18}])
    play = Player(3, informative=set())
    collect_groups(budget, spent, lambda i: i, play)
    assert len(play.calls) == 2  # 18 spent + 6 + 6 = 30; a third batch would pass max_rollouts


def test_an_iteration_records_its_metrics_and_stops_on_the_plateau():
    settings = grpo(iterations=10, max_iterations=None, plateau_patience=2, plateau_delta=0.01, max_rollouts=None)
    state = TrainState()
    stops = []
    for iteration, reward in enumerate((0.2, 0.5, 0.505, 0.5), 1):
        metrics = begin_iteration(state, {"rows": [object()], "cursor": iteration * 4, "metrics": {"rollouts": 8}})
        assert metrics["skipped"] is False and state.seed_cursor == iteration * 4
        state.iteration = iteration
        stops.append(end_iteration(state, dict(metrics, reward_mean=reward), settings))
    assert stops == [False, False, False, True]  # two iterations without a gain of plateau_delta after 0.5
    assert state.best_reward == 0.505 and state.since_best == 2 and len(state.history) == 4
    assert state.history[-1]["stopped_on_plateau"] and not state.history[-1]["stopped_on_budget"]


def test_a_new_level_starts_the_plateau_rule_over_and_a_finished_run_has_nothing_to_train():
    state = TrainState(iteration=3, best_reward=0.9, since_best=1, difficulty=0)
    metrics = begin_iteration(state, {"rows": [], "cursor": 12, "metrics": {"difficulty": 1}})
    assert metrics["skipped"] is True and state.difficulty == 1
    assert state.best_reward == -math.inf and state.since_best == 0
    settings = grpo(iterations=3, max_iterations=None, max_rollouts=None)
    assert not training_finished(settings, TrainState(iteration=2))
    assert training_finished(settings, TrainState(iteration=3))
    assert training_finished(grpo(iterations=10, max_rollouts=8), TrainState(history=[{"rollouts": 8}]))
