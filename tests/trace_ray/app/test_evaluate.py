"""``trace-ray evaluate``: the method table from per-task scores, and the command end to end on the tiny model."""

import itertools
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.run_dirs import write_capability_run
from tests.trace_ray.app.test_route import TINY
from trace_ray.app.cli import main
from trace_ray.artifacts import write_json
from trace_ray.config_compose import compose_config
from trace_ray.evaluation.report import MethodScores, evaluation_report, report_markdown, report_rows
from trace_ray.evaluation.statistics import paired_comparison
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
    assert row["families"] == {
        "a": {"tasks": 2, "perfect": 1, "successes": 1, "mean_reward": 0.75},
        "b": {"tasks": 2, "perfect": 2, "successes": 2, "mean_reward": 1.0},
    }
    versus = row["vs_base"]
    assert versus["mean_difference"] == pytest.approx(0.5) and (versus["wins"], versus["losses"], versus["ties"]) == (
        2,
        0,
        2,
    )
    assert versus["p_value"] == pytest.approx(0.5)  # two non-zero differences (1, 1): 2 of 4 sign patterns reach 2
    text = report_markdown("title", evaluation_report([base, better]), {"TRACE (moe)": "no gates"}, ["a note"])
    assert text.splitlines()[2].startswith("| method |") and "- TRACE (moe): no gates" in text
    assert "| TRACE (logit) | 3/4 | 3/4 | 0.875 [" in text and "+0.500 [" in text


def holm_by_hand(p_values):
    """Holm written out: the k-th smallest of m p-values (k from 0) steps to min(1, (m - k) p); a p-value's adjusted
    value is the largest step up to its own (first) place in the ascending order."""
    ranked = sorted(p_values)
    steps = [min(1.0, (len(ranked) - k) * p) for k, p in enumerate(ranked)]
    return [max(steps[: ranked.index(p) + 1]) for p in p_values]


def test_trace_is_compared_with_grpo_on_target_and_the_best_adapter_with_holm_adjusted_p_values():
    families = ["a"] * 8
    scores = {
        "base": [0.0] * 8,
        "adapter:x": [0.5] * 6 + [0.0] * 2,  # mean 0.375
        "adapter:y": [1.0] * 6 + [0.0] * 2,  # mean 0.75: the best single adapter
        "TRACE (logit)": [1.0] * 8,
        "GRPO on target": [1.0] + [0.0] * 7,
    }
    report = evaluation_report([MethodScores(n, families, r, [x == 1.0 for x in r], 0) for n, r in scores.items()])
    assert report["best_adapter"] == "adapter:y"
    comparisons = {(c["method"], c["baseline"]): c for c in report["comparisons"]}
    assert list(comparisons) == [("TRACE (logit)", "GRPO on target"), ("TRACE (logit)", "adapter:y")]
    # exact sign-flip p-values: k equal non-zero differences reach |sum| only in the all-plus and all-minus patterns, 2
    # / 2^k
    against_grpo = comparisons["TRACE (logit)", "GRPO on target"]  # differences 0, 1 x 7
    assert (against_grpo["mean_difference"], against_grpo["wins"], against_grpo["losses"], against_grpo["ties"]) == (
        0.875,
        7,
        0,
        1,
    )
    assert against_grpo["p_value"] == 2 / 2**7
    against_best = comparisons["TRACE (logit)", "adapter:y"]  # differences 0 x 6, 1, 1
    assert (against_best["mean_difference"], against_best["wins"], against_best["ties"], against_best["p_value"]) == (
        0.25,
        2,
        6,
        0.5,
    )
    assert against_best["role"] == "best single adapter"
    rows = {row["method"]: row for row in report["methods"]}
    raw = [rows[n]["vs_base"]["p_value"] for n in ("adapter:x", "adapter:y", "TRACE (logit)", "GRPO on target")]
    assert raw == [2 / 2**6, 2 / 2**6, 2 / 2**8, 1.0]  # 6, 6, 8 and 1 equal non-zero differences
    # Holm over the 6 p-values, ascending: 1/128 (TRACE-base) 1/64 (TRACE-GRPO) 1/32 (x-base) 1/32 (y-base) 1/2
    # (TRACE-y) 1 (GRPO-base):
    # steps 6/128 = 0.046875, 5/64 = 0.078125, 4/32 = 0.125, 3/32 = 0.09375 -> 0.125 (monotone), 2/2 = 1, 1
    adjusted = [rows[n]["vs_base"]["p_holm"] for n in ("adapter:x", "adapter:y", "TRACE (logit)", "GRPO on target")]
    assert adjusted == pytest.approx([0.125, 0.125, 0.046875, 1.0])
    assert (against_grpo["p_holm"], against_best["p_holm"]) == pytest.approx((0.078125, 1.0))
    text = report_markdown("title", report, {}, [])
    assert "Best single adapter: adapter:y" in text and "over all 6 paired comparisons" in text
    assert "| TRACE (logit) | adapter:y (best single adapter) | +0.250 [" in text and "| 0.5 | 1 | 2/0/6 |" in text
    assert "| TRACE (logit) | GRPO on target | +0.875 [" in text and "| 0.0156 | 0.0781 | 7/0/1 |" in text
    assert "p=0.00781 Holm 0.0469 (8W/0L)" in text  # TRACE against base in the main table


def test_every_method_needs_the_base_models_tasks():
    base = MethodScores("base", ["a"], [1.0], [True], 0)
    with pytest.raises(ValueError, match="needs the base model's scores"):
        report_rows([MethodScores("x", ["a"], [1.0], [True], 0)])
    with pytest.raises(ValueError, match="not scored on the base model's tasks"):
        report_rows([base, MethodScores("x", ["a", "b"], [1.0, 0.0], [True, False], 0)])


@pytest.mark.integration
def test_an_out_of_band_capability_with_an_adapter_is_routed_like_a_ready_one(tmp_path):
    from trace_ray.routing.adapters import served_adapters, trained_adapters

    statuses = {"a": "READY", "b": "OUT_OF_BAND", "c": "OUT_OF_BAND", "d": "FAILED"}
    (tmp_path / "capabilities").mkdir()
    entries = [
        {"name": n, "description": f"the {n} skill", "status": s, "environment": f"synthetic/{n}"}
        for n, s in statuses.items()
    ]
    (tmp_path / "capabilities" / "selected.json").write_text(json.dumps(entries))
    for name in ("a", "b", "d"):  # c was skipped by train (accept_out_of_band off): no adapter
        (tmp_path / "adapters" / name).mkdir(parents=True)
        (tmp_path / "adapters" / name / "adapter_model.safetensors").write_bytes(b"")
    assert [(a.name, a.description) for a in trained_adapters(tmp_path)] == [("a", "the a skill"), ("b", "the b skill")]
    assert [(a.name, a.description) for a in served_adapters(tmp_path)] == [
        ("a", "the a skill"),
        ("b", "the b skill"),
        ("d", ""),
    ]


def write_metrics(folder, rollouts):
    rows = [
        {
            "iteration": i + 1,
            "reward_mean": 0.1 * i,
            "success_rate": 0.0,
            "groups": n // 4,
            "informative_groups": 1,
            "rollouts": n,
            "rollout_s": 2.0,
            "update_s": 1.0,
        }
        for i, n in enumerate(rollouts)
    ]
    pq.write_table(pa.Table.from_pylist(rows), folder / "metrics.parquet")


@pytest.mark.integration
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
    # route ran and recorded why it trained no learned gate (as on make demo: too few routed tasks)
    constant = "all 8 training labels are 'base': a gate would learn a constant"
    write_json(tmp_path / "router" / "summary.json", {"routers": {"learned": {"error": constant}}})
    assert main(["evaluate", f"run_dir={tmp_path}", *TINY, env, "limit=4", "model.sampling.max_new_tokens=9"]) == 0
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    rows = {row["method"]: row for row in report["methods"]}
    assert list(rows) == [
        "base",
        *(f"adapter:{n}" for n in names),
        "TRACE (logit)",
        "oracle router",
        "GRPO on target",
        "prompt injection",
    ]
    assert report["not_evaluated"]["TRACE (learned)"] == f"route trained none: {constant}"
    for router in ("TRACE (moe)", "TRACE (auto)"):  # trace-ray route trains or chooses them
        assert router in report["not_evaluated"] and "trace-ray route" in report["not_evaluated"][router]
    assert all(row["tasks"] == 4 for row in rows.values())
    assert rows[f"adapter:{names[0]}"]["rollouts"] == 16 and rows["TRACE (logit)"]["rollouts"] == 24
    assert rows["GRPO on target"]["rollouts"] == 24 and rows["prompt injection"]["rollouts"] == 0
    markdown = (tmp_path / "eval" / "report.md").read_text()
    assert all(f"## Training curve: {name}" in markdown for name in [*names, "GRPO on target"])
    option_rows = {"base": "base", **{name: f"adapter:{name}" for name in names}}
    per_task = [{option: rows[row]["rewards"][i] for option, row in option_rows.items()} for i in range(4)]
    # the oracle router plays, on every task, an option that scored the task's highest reward (the base on a tie)
    assert rows["oracle router"]["rewards"] == [max(rewards.values()) for rewards in per_task]
    for rewards, pick in zip(per_task, report["choices"]["oracle"]):
        assert rewards[pick] == max(rewards.values()) and (pick == "base" or rewards["base"] < rewards[pick])
    # TRACE with the logit router scores, task by task, what its chosen option scored alone
    assert len(report["choices"]["logit"]) == 4
    assert rows["TRACE (logit)"]["rewards"] == [
        rewards[pick] for rewards, pick in zip(per_task, report["choices"]["logit"])
    ]
    # TRACE against GRPO on target and the best single adapter, from the per-task scores report.json stores
    seed = compose_config("evaluate", TINY).seed
    rewards = {name: row["rewards"] for name, row in rows.items()}
    assert all(len(r) == 4 for r in rewards.values())
    adapter_means = {name: sum(r) / 4 for name, r in rewards.items() if name.startswith("adapter:")}
    best = next(name for name, mean in adapter_means.items() if mean == max(adapter_means.values()))  # ties: the first
    assert report["best_adapter"] == best
    comparisons = {c["baseline"]: c for c in report["comparisons"] if c["method"] == "TRACE (logit)"}
    assert sorted(comparisons) == sorted({"GRPO on target", best})
    for baseline, comparison in comparisons.items():
        differences = [a - b for a, b in zip(rewards["TRACE (logit)"], rewards[baseline])]
        assert comparison["mean_difference"] == pytest.approx(sum(differences) / 4)
        wins, losses = sum(d > 0 for d in differences), sum(d < 0 for d in differences)
        assert (comparison["wins"], comparison["losses"], comparison["ties"]) == (wins, losses, 4 - wins - losses)
        # the exact sign-flip p-value, enumerated here over all 2^4 sign patterns of the 4 differences
        # (a zero difference flips to itself, so it changes no sum)
        flipped = [
            abs(sum(s * d for s, d in zip(signs, differences))) for signs in itertools.product((1, -1), repeat=4)
        ]
        assert comparison["p_value"] == pytest.approx(sum(f >= abs(sum(differences)) - 1e-12 for f in flipped) / 16)
        # the bootstrap interval is the statistics module's (tested there), drawn with the run's seed and confidence
        expected = paired_comparison(rewards["TRACE (logit)"], rewards[baseline], report["confidence"], seed=seed)
        assert comparison["interval"] == pytest.approx(list(expected.interval))
    paired = [row["vs_base"] for row in rows.values() if "vs_base" in row] + report["comparisons"]
    assert len(paired) == len(rows) - 1 + 2
    assert [c["p_holm"] for c in paired] == pytest.approx(holm_by_hand([c["p_value"] for c in paired]))
    text = (tmp_path / "eval" / "report.md").read_text()
    assert text.splitlines()[2].startswith("| method |")
    assert f"Best single adapter: {best}" in text and "| TRACE (logit) | GRPO on target |" in text
    for plot in ("methods.png", "reward_curves.png"):
        assert (tmp_path / "eval" / plot).stat().st_size > 0
    # every episode a method played itself, with the reward the report scored (routers reuse the options' episodes)
    import pyarrow.parquet as pq

    played = pq.read_table(tmp_path / "eval" / "episodes.parquet").to_pylist()
    itself = ["base", *(f"adapter:{n}" for n in names), "GRPO on target", "prompt injection"]
    assert sorted({row["method"] for row in played}) == sorted(itself)
    for method in itself:
        assert [row["reward"] for row in played if row["method"] == method] == rows[method]["rewards"]
    transcripts = (tmp_path / "eval" / "transcripts.md").read_text()
    for method in itself[1:]:
        above = sum(r > b for r, b in zip(rows[method]["rewards"], rows["base"]["rewards"]))
        assert f"## {method}: {above} of 4 tasks above base" in transcripts


def test_evaluate_without_adapters_is_a_one_line_error(tmp_path, capsys):
    assert main(["evaluate", f"run_dir={tmp_path}", *TINY]) == 1
    err = capsys.readouterr().err
    assert "run trace-ray identify" in err and err.count("\n") == 1 and not (tmp_path / "eval").exists()


@pytest.mark.integration
def test_evaluate_plays_the_routers_that_route_trained_and_reuses_its_episodes(tmp_path, capsys):
    names = ["datetime_reasoning", "information_reporting"]
    write_capability_run(tmp_path, names)
    common = [
        f"run_dir={tmp_path}",
        *TINY,
        "env.name=tests.scripted_environments:OddParityEnvironment",
        "model.sampling.max_new_tokens=9",
    ]
    assert main(["route", *common, "limit=4"]) == 0  # mixed oracle labels: the learned gate and the MoE train
    # evaluate reuses route's greedy episodes of the eval tasks: marked here with a reward odd parity never gives
    kept = tmp_path / "router" / "episodes.parquet"
    rows = pq.read_table(kept).to_pylist()
    route_rewards = {
        task["seed"]: task["rewards"] for task in json.loads((tmp_path / "router" / "logit.json").read_text())["tasks"]
    }
    marked = next(row for row in rows if row["option"] == "base" and row["seed"] in route_rewards)
    marked["reward"] = 0.5
    pq.write_table(pa.Table.from_pylist(rows, schema=pq.read_schema(kept)), kept)
    capsys.readouterr()
    # the logit router with route's offsets
    assert main(["evaluate", *common, "limit=4", "router.calibration=fitted"]) == 0
    assert "greedy episodes: 4 tasks x 3 options, 12 already played, 0 to play" in capsys.readouterr().out
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    rows = {row["method"]: row for row in report["methods"]}
    expected = [0.5 if seed == marked["seed"] else route_rewards[seed]["base"] for seed in report["seeds"]]
    assert rows["base"]["rewards"] == expected
    assert "TRACE (learned)" in rows and "TRACE (moe)" in rows and "TRACE (moe)" not in report["not_evaluated"]
    moe = rows["TRACE (moe)"]
    # odd-parity rewards are 1 or 0, a success exactly where the reward is 1: the mean is the share of successes
    assert moe["tasks"] == 4 and len(moe["rewards"]) == 4 and set(moe["rewards"]) <= {0.0, 1.0}
    assert moe["mean_reward"] == sum(moe["rewards"]) / 4 == moe["successes"] / 4
    learned = json.loads((tmp_path / "router" / "learned.json").read_text())
    assert report["choices"]["learned"] == [task["choice"] for task in learned["tasks"]]  # the saved gate, reloaded
    fitted = json.loads((tmp_path / "router" / "logit_fitted.json").read_text())
    assert report["choices"]["logit"] == [task["choice"] for task in fitted["tasks"]]  # the saved offsets, reloaded
    offsets = json.loads((tmp_path / "router" / "logit_offsets.json").read_text())
    assert offsets["train_routed_reward"]["fitted"] >= offsets["train_routed_reward"]["content_free"]
    # router=auto: the rule route chose on the analysis tasks, reloaded from router/selection.json
    selection = json.loads((tmp_path / "router" / "selection.json").read_text())
    auto = json.loads((tmp_path / "router" / "auto.json").read_text())
    assert report["choices"]["auto"] == [task["choice"] for task in auto["tasks"]]
    assert rows["TRACE (auto)"]["rewards"] == [
        rows[row]["rewards"][i]
        for i, row in enumerate("base" if pick == "base" else f"adapter:{pick}" for pick in report["choices"]["auto"])
    ]
    routing = report["routing"]
    fallback = f"always {selection['fallback']} (best on analysis)"
    assert sorted(routing) == sorted(
        ["TRACE (logit)", "TRACE (learned)", "TRACE (auto)", "always base", fallback, "oracle router"]
    )
    assert routing["oracle router"]["accuracy"] == 1.0 and routing["oracle router"]["regret"] == 0.0
    options = {"base": "base", **{name: f"adapter:{name}" for name in names}}
    per_task = [{option: rows[row]["rewards"][i] for option, row in options.items()} for i in range(4)]
    picks = report["choices"]["auto"]
    assert routing["TRACE (auto)"]["accuracy"] == sum(r[p] == max(r.values()) for r, p in zip(per_task, picks)) / 4
    assert routing["TRACE (auto)"]["regret"] == pytest.approx(
        sum(max(r.values()) - r[p] for r, p in zip(per_task, picks)) / 4
    )
    assert "## Routing" in (tmp_path / "eval" / "report.md").read_text()


def test_transcripts_show_each_win_with_both_sides_actions_and_milestones():
    from trace_ray.evaluation.transcripts import wins_markdown
    from trace_ray.rollout_loop import EpisodeResult
    from trace_ray.trajectory import TokenRecord

    def episode(task, reward, messages, reached):
        info = {"milestones": [{"name": name, "reached": ok} for name, ok in reached]}
        return EpisodeResult(
            f"k{task}",
            f"device-{task}",
            "simple_settings",
            task,
            0,
            None,
            reward,
            reward == 1.0,
            2,
            "agent_reply",
            messages,
            [],
            TokenRecord(),
            info,
        )

    request = {"role": "user", "content": "Turn on wifi."}
    call = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"function": {"name": "set_wifi_status", "arguments": {"on": True}}}],
    }
    base = [
        episode(1, 0.0, [request, {"role": "assistant", "content": "Sure."}], [("wifi on", False)]),
        episode(2, 1.0, [request, call, {"role": "assistant", "content": "Done."}], [("wifi on", True)]),
    ]
    adapter = [
        episode(1, 1.0, [request, call, {"role": "assistant", "content": "Wifi is on."}], [("wifi on", True)]),
        episode(2, 0.5, [request, {"role": "assistant", "content": "No."}], [("wifi on", False)]),
    ]
    text = wins_markdown(base, {"adapter:x": adapter})
    assert "## adapter:x: 1 of 2 tasks above base" in text
    assert "### device-1 (simple_settings): base 0.000 -> 1.000" in text and "device-2" not in text  # task 2: a loss
    assert "**base** (agent_reply, 2 turns; milestones: met 0/1)" in text
    assert "**adapter:x** (agent_reply, 2 turns; milestones: met 1/1: wifi on)" in text
    assert '- call `set_wifi_status` {"on": true}' in text and "- says: Wifi is on." in text and "- says: Sure." in text


def test_code_repair_episodes_become_swe_bench_prediction_files(tmp_path):
    from trace_ray.evaluation.transcripts import write_predictions
    from trace_ray.rollout_loop import EpisodeResult
    from trace_ray.trajectory import TokenRecord

    def episode(task, info):
        return EpisodeResult(
            f"k{task}", f"t{task}", "", task, 0, None, 0.0, False, 1, "submitted", [], [], TokenRecord(), info
        )

    patched = [
        episode(1, {"instance_id": "pkg__001", "model_patch": "--- a/x.py\n+++ b/x.py\n"}),
        episode(2, {"instance_id": "pkg__002", "model_patch": ""}),
    ]
    written = write_predictions(
        tmp_path, {"base": patched, "TRACE (logit)": patched, "device": [episode(3, {})]}, "smollm2_135m"
    )
    # no file for episodes without patches
    assert sorted(path.name for path in written) == ["TRACE__logit.jsonl", "base.jsonl"]
    rows = [json.loads(line) for line in (tmp_path / "TRACE__logit.jsonl").read_text().splitlines()]
    assert rows == [
        {
            "instance_id": "pkg__001",
            "model_name_or_path": "smollm2_135m/TRACE (logit)",
            "model_patch": "--- a/x.py\n+++ b/x.py\n",
        },
        {"instance_id": "pkg__002", "model_name_or_path": "smollm2_135m/TRACE (logit)", "model_patch": ""},
    ]


def test_the_report_shows_each_training_curve_with_its_informative_groups_and_seconds():
    base = MethodScores("base", ["a", "a"], [0.0, 0.5], [False, False], 0)
    history = [
        {
            "iteration": 1,
            "reward_mean": 0.125,
            "success_rate": 0.0625,
            "groups": 2,
            "informative_groups": 1,
            "rollouts": 16,
            "rollout_s": 30.4,
            "update_s": 12.0,
        },
        {
            "iteration": 2,
            "reward_mean": 0.25,
            "success_rate": 0.125,
            "groups": 4,
            "informative_groups": 3,
            "rollouts": 32,
            "rollout_s": 50.0,
            "update_s": 0.2,
        },
    ]
    leveled = [dict(row, difficulty=level) for row, level in zip(history, (0, 1))]
    text = report_markdown(
        "title", {**evaluation_report([base]), "training": {"skill": history, "leveled": leveled}}, {}, []
    )
    assert "## Training curve: skill" in text
    assert "| 1 | - | 0.125 | 0.062 | 1/2 | 16 | 42 |" in text  # seconds: 30.4 rollouts + 12.0 update
    assert "| 2 | - | 0.250 | 0.125 | 3/4 | 32 | 50 |" in text
    assert "| 2 | 1 | 0.250 | 0.125 | 3/4 | 32 | 50 |" in text  # the synthetic environment's level
