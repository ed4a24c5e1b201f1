"""Moving up a synthetic environment's levels during training (trace_ray/training/curriculum.py)."""

from __future__ import annotations

import pytest

from environments.errors import TraceRayError
from environments.synthetic.factory import synthetic_levels
from trace_ray.config_compose import compose_config
from trace_ray.training.curriculum import at_level, next_level

LEVELS = [0, 1, 2, 3, 4, 5]


def rows(*pairs):
    return [{"difficulty": level, "success_rate": success} for level, success in pairs]


def test_two_iterations_at_the_threshold_move_training_to_the_next_level():
    assert next_level(rows((0, 0.5), (0, 0.75)), LEVELS, 0, 0.6) == 1  # mean 0.625


def test_one_iteration_or_a_mean_below_the_threshold_keeps_the_level():
    assert next_level(rows((0, 1.0)), LEVELS, 0, 0.6) == 0
    assert next_level(rows((0, 1.0), (0, 0.125)), LEVELS, 0, 0.6) == 0  # mean 0.5625
    assert next_level(rows((0, 1.0), (0, 1.0)), LEVELS, 0, None) == 0  # off


def test_only_the_current_levels_iterations_count():
    history = rows((0, 1.0), (0, 1.0), (1, 0.0), (1, 0.875))
    assert next_level(history, LEVELS, 1, 0.6) == 1  # level 1: 0.0 and 0.875, mean 0.4375
    assert next_level([*history, *rows((1, 0.75))], LEVELS, 1, 0.6) == 2  # 0.875 and 0.75
    assert [row["success_rate"] for row in at_level(history, 1)] == [0.0, 0.875]


def test_the_hardest_level_is_the_last():
    assert next_level(rows((5, 1.0), (5, 1.0)), LEVELS, 5, 0.6) == 5


def test_levels_come_from_the_template_or_the_generated_modules_spec(tmp_path):
    template = tmp_path / "template.json"
    template.write_text(
        '{"source": "templates", "target": "device", "capability": "tool_calling_precision", "difficulty": 0}'
    )
    assert synthetic_levels(str(template)) == ([0, 1, 2, 3, 4, 5], 0)
    assert synthetic_levels(str(template), 2) == ([0, 1, 2, 3, 4, 5], 2)
    generated = tmp_path / "generated.json"
    generated.write_text('{"source": "llm", "module": "module.py", "difficulties": [3, 1, 2], "difficulty": 2}')
    assert synthetic_levels(str(generated)) == ([1, 2, 3], 2)


@pytest.mark.parametrize("value", ["-0.1", "1.5"])
def test_a_threshold_outside_0_1_is_a_one_line_error(value):
    with pytest.raises(TraceRayError, match="grpo.level_up_success must be in"):
        compose_config("train", [f"grpo.level_up_success={value}"])
