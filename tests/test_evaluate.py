"""``trace-ray evaluate``: the method table from per-task scores, and the command end to end on the tiny model."""

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.run_dirs import write_capability_run
from tests.test_route import TINY
from trace_ray.cli import compose_config, main
from trace_ray.evaluation.report import MethodScores, report_markdown, report_rows
from trace_ray.training.lora_model import export_adapter, trainable_model


def test_rows_count_perfect_and_successes_and_compare_with_base():
    families = ["a", "a", "b", "b"]
    base = MethodScores("base", families, [0.0, 0.5, 1.0, 0.0], [False, False, True, False], 0)
    better = MethodScores("TRACE (logit)", families, [1.0, 0.5, 1.0, 1.0], [True, False, True, True], 64)
    rows = report_rows([base, better])
    assert [row["method"] for row in rows] == ["base", "TRACE (logit)"] and "vs_base" not in rows[0]
    row = rows[1]
    assert (row["tasks"], row["perfect"], row["successes"], row["rollouts"]) == (4, 3, 3, 64)
    assert row["mean_reward"] == pytest.approx(0.875) and row["interval"][0] <= 0.875 <= row["interval"][1]
    assert row["families"] == {"a": {"tasks": 2, "perfect": 1, "successes": 1, "mean_reward": 0.75},
                               "b": {"tasks": 2, "perfect": 2, "successes": 2, "mean_reward": 1.0}}
    versus = row["vs_base"]
    assert versus["mean_difference"] == pytest.approx(0.5) and (versus["wins"], versus["losses"], versus["ties"]) == (2, 0, 2)
    assert versus["p_value"] == pytest.approx(0.5)  # two non-zero differences (1, 1): 2 of 4 sign patterns reach 2
    text = report_markdown("title", rows, {"TRACE (moe)": "no gates"}, ["a note"])
    assert text.splitlines()[2].startswith("| method |") and "- TRACE (moe): no gates" in text
    assert "| TRACE (logit) | 3/4 | 3/4 | 0.875 [" in text and "+0.500 [" in text


def test_every_method_needs_the_base_models_tasks():
    base = MethodScores("base", ["a"], [1.0], [True], 0)
    with pytest.raises(ValueError, match="needs the base model's scores"):
        report_rows([MethodScores("x", ["a"], [1.0], [True], 0)])
    with pytest.raises(ValueError, match="not scored on the base model's tasks"):
        report_rows([base, MethodScores("x", ["a", "b"], [1.0, 0.0], [True, False], 0)])


def write_metrics(folder, rollouts):
    rows = [{"iteration": i + 1, "reward_mean": 0.1 * i, "success_rate": 0.0, "rollouts": n} for i, n in enumerate(rollouts)]
    pq.write_table(pa.Table.from_pylist(rows), folder / "metrics.parquet")


def test_evaluate_scores_every_method_on_the_same_tasks(tmp_path):
    names = ["datetime_reasoning", "information_reporting"]
    write_capability_run(tmp_path, names)
    write_metrics(tmp_path / "adapters" / names[0], [8, 8])
    write_metrics(tmp_path / "adapters" / names[1], [8])
    config = compose_config("train", TINY)
    policy, _ = trainable_model(config.model, config.lora, seed=7)
    export_adapter(policy, tmp_path / "adapters" / "grpo_on_target")
    write_metrics(tmp_path / "adapters" / "grpo_on_target", [8, 8, 8])
    env = "env.name=tests.scripted_environments:OddParityEnvironment"
    assert main(["evaluate", f"run_dir={tmp_path}", *TINY, env, "limit=4", "model.sampling.max_new_tokens=9"]) == 0
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    rows = {row["method"]: row for row in report["methods"]}
    assert list(rows) == ["base", *(f"adapter:{n}" for n in names), "TRACE (logit)", "oracle router", "GRPO on target", "prompt injection"]
    for router in ("TRACE (learned)", "TRACE (moe)"):  # trace-ray route trains them
        assert router in report["not_evaluated"] and "trace-ray route" in report["not_evaluated"][router]
    assert all(row["tasks"] == 4 for row in rows.values())
    assert rows[f"adapter:{names[0]}"]["rollouts"] == 16 and rows["TRACE (logit)"]["rollouts"] == 24
    assert rows["GRPO on target"]["rollouts"] == 24 and rows["prompt injection"]["rollouts"] == 0
    routable = [row["mean_reward"] for name, row in rows.items() if name == "base" or name.startswith(("adapter:", "TRACE"))]
    assert rows["oracle router"]["mean_reward"] >= max(routable)  # the best option of every task: no router does better
    assert len(report["choices"]["logit"]) == 4 and set(report["choices"]["logit"]) <= {*names, "base"}
    text = (tmp_path / "eval" / "report.md").read_text()
    assert text.splitlines()[2].startswith("| method |")
    for plot in ("methods.png", "reward_curves.png"):
        assert (tmp_path / "eval" / plot).stat().st_size > 0


def test_evaluate_without_adapters_is_a_one_line_error(tmp_path, capsys):
    assert main(["evaluate", f"run_dir={tmp_path}", *TINY]) == 1
    err = capsys.readouterr().err
    assert "run trace-ray identify" in err and err.count("\n") == 1 and not (tmp_path / "eval").exists()


def test_evaluate_plays_the_routers_that_route_trained(tmp_path):
    names = ["datetime_reasoning", "information_reporting"]
    write_capability_run(tmp_path, names)
    common = [f"run_dir={tmp_path}", *TINY, "env.name=tests.scripted_environments:OddParityEnvironment", "model.sampling.max_new_tokens=9"]
    assert main(["route", *common, "limit=4"]) == 0  # mixed oracle labels: the learned gate and the MoE train
    assert main(["evaluate", *common, "limit=4"]) == 0
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    rows = {row["method"]: row for row in report["methods"]}
    assert "TRACE (learned)" in rows and "TRACE (moe)" in rows and "TRACE (moe)" not in report["not_evaluated"]
    assert rows["TRACE (moe)"]["tasks"] == 4 and 0 <= rows["TRACE (moe)"]["mean_reward"] <= 1
    learned = json.loads((tmp_path / "router" / "learned.json").read_text())
    assert report["choices"]["learned"] == [task["choice"] for task in learned["tasks"]]  # the saved gate, reloaded
