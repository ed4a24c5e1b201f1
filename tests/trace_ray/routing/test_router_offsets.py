"""The logit router's per-option offsets fitted on training tasks (router.calibration=fitted)."""

import itertools
import json
import random

import pytest

from environments.errors import TraceRayError
from trace_ray.routing.logit_router import BASE
from trace_ray.routing.offsets import OFFSETS_FILE, fit_offsets, load_offsets, offset_decisions, save_offsets

ADAPTER = "tool_calling_precision"


def routed_reward(scores, rewards, offsets):
    return sum(task[d.choice] for task, d in zip(rewards, offset_decisions(scores, offsets)))


def test_two_options_over_corrected_toward_base_get_a_threshold_that_routes_the_adapters_wins():
    # content-free scores put base ahead on every task; the adapter wins where its score is closest (gap 0.5, 1.0),
    # ties elsewhere: the fitted offset routes exactly the tasks with gaps below some threshold between 1.0 and 3.0
    gaps = [0.5, 1.0, 3.0, 4.0]
    scores = [{ADAPTER: -gap, BASE: 0.0} for gap in gaps]
    rewards = [
        {ADAPTER: 1.0, BASE: 0.0},
        {ADAPTER: 1.0, BASE: 0.0},
        {ADAPTER: 0.0, BASE: 0.0},
        {ADAPTER: 0.0, BASE: 1.0},
    ]
    labels = [ADAPTER, ADAPTER, BASE, BASE]
    offsets = fit_offsets(scores, rewards, labels)
    assert offsets[BASE] == 0.0 and offsets[ADAPTER] == pytest.approx(2.0)  # the middle of the step between 1.0 and 3.0
    assert [d.choice for d in offset_decisions(scores, offsets)] == labels
    assert (
        routed_reward(scores, rewards, offsets) == 3.0
        and routed_reward(scores, rewards, {ADAPTER: 0.0, BASE: 0.0}) == 1.0
    )


def test_offsets_stay_zero_where_the_training_tasks_give_no_reason_to_move():
    scores = [{ADAPTER: 1.0, BASE: 0.0}, {ADAPTER: -1.0, BASE: 0.0}]
    rewards = [{ADAPTER: 1.0, BASE: 0.0}, {ADAPTER: 0.0, BASE: 1.0}]
    assert fit_offsets(scores, rewards, [ADAPTER, BASE]) == {ADAPTER: 0.0, BASE: 0.0}


def test_between_equal_rewards_the_fit_sends_ties_to_the_base():
    # every option scores alike on every task: the reward cannot tell them apart, the oracle labels (ties: base) can
    scores = [{ADAPTER: 0.5, BASE: 0.0}, {ADAPTER: 2.0, BASE: 0.0}]
    rewards = [{ADAPTER: 0.0, BASE: 0.0}, {ADAPTER: 1.0, BASE: 1.0}]
    offsets = fit_offsets(scores, rewards, [BASE, BASE])
    assert offsets[ADAPTER] == pytest.approx(-3.0)  # below the lowest gap (-2.0) by the end margin
    assert [d.choice for d in offset_decisions(scores, offsets)] == [BASE, BASE]


@pytest.mark.parametrize("seed", range(20))
def test_with_two_options_the_fit_reaches_the_best_routed_reward_of_any_offset(seed):
    rng = random.Random(seed)
    tasks = rng.randint(2, 12)
    scores = [{ADAPTER: rng.gauss(0, 2), BASE: rng.gauss(0, 2)} for _ in range(tasks)]
    rewards = [{ADAPTER: float(rng.random() < 0.4), BASE: float(rng.random() < 0.3)} for _ in range(tasks)]
    labels = [ADAPTER if r[ADAPTER] > r[BASE] else BASE for r in rewards]
    fitted = routed_reward(scores, rewards, fit_offsets(scores, rewards, labels))
    gaps = [s[BASE] - s[ADAPTER] for s in scores]  # the adapter wins a task when its offset exceeds the task's gap
    every_step = [min(gaps) - 1, max(gaps) + 1, *(g + 1e-3 for g in gaps)]
    assert fitted == max(routed_reward(scores, rewards, {ADAPTER: value, BASE: 0.0}) for value in every_step)


def test_three_options_each_get_the_tasks_they_win():
    names = ["datetime_reasoning", ADAPTER, BASE]
    # base's score is highest on every task; each adapter wins the two tasks where it is closest behind
    scores = [dict(zip(names, row)) for row in [(-1, -4, 0), (-1.5, -5, 0), (-4, -1, 0), (-5, -0.5, 0), (-5, -5, 0)]]
    wins = ["datetime_reasoning", "datetime_reasoning", ADAPTER, ADAPTER, BASE]
    rewards = [{name: float(name == winner) for name in names} for winner in wins]
    offsets = fit_offsets(scores, rewards, wins)
    assert [d.choice for d in offset_decisions(scores, offsets)] == wins
    grid = [-6, -3, 0, 1, 2, 3, 4.5, 6]
    best = max(
        routed_reward(scores, rewards, {"datetime_reasoning": a, ADAPTER: b, BASE: 0.0})
        for a, b in itertools.product(grid, grid)
    )
    assert routed_reward(scores, rewards, offsets) == best == 5.0


def test_bad_training_data_raises():
    with pytest.raises(ValueError, match="one score row, reward row and label per training task"):
        fit_offsets([{ADAPTER: 0.0, BASE: 0.0}], [], [])
    with pytest.raises(ValueError, match="one score row"):
        fit_offsets([], [], [])
    with pytest.raises(ValueError, match="have no 'base'"):
        fit_offsets([{ADAPTER: 0.0}], [{ADAPTER: 1.0}], [ADAPTER])


def test_offsets_round_trip_and_a_wrong_or_missing_file_is_a_one_line_error(tmp_path):
    folder = tmp_path / "router"
    names = [ADAPTER, BASE]
    with pytest.raises(
        TraceRayError,
        match=r"offsets in .*logit_offsets.json, which is missing; run trace-ray route "
        r"run_dir=",
    ):
        load_offsets(folder, "smollm2_135m", names)
    save_offsets(folder, {ADAPTER: 1.5, BASE: 0.0}, "smollm2_135m", train_tasks=4)
    assert load_offsets(folder, "smollm2_135m", names) == {ADAPTER: 1.5, BASE: 0.0}
    assert json.loads((folder / OFFSETS_FILE).read_text())["train_tasks"] == 4
    with pytest.raises(TraceRayError, match="fitted for model smollm2_135m .* not tiny_random"):
        load_offsets(folder, "tiny_random", names)
    with pytest.raises(TraceRayError, match=r"not smollm2_135m over \['base', 'datetime_reasoning'\]"):
        load_offsets(folder, "smollm2_135m", ["datetime_reasoning", BASE])
    (folder / OFFSETS_FILE).write_text("{not json")
    with pytest.raises(TraceRayError, match="is not a logit router offsets file"):
        load_offsets(folder, "smollm2_135m", names)
