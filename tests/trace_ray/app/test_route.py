"""``trace-ray route``: oracle labels from greedy episodes per adapter, the logit router's choices, the confusion
matrix."""

import json

import pytest
import torch

from tests.run_dirs import write_capability_run
from trace_ray.app.cli import main
from trace_ray.app.route import confusion
from trace_ray.config_compose import compose_config
from trace_ray.environment_setup import environment_maker
from trace_ray.models import load_model
from trace_ray.routing.adapters import trained_adapters
from trace_ray.routing.logit_router import with_request
from trace_ray.routing.routers import build_router, logit_router
from trace_ray.routing.selection import best_choice

TINY = ["model=tiny_random", "lora.rank=4", "lora.alpha=8"]


def label_logits_by_hand(run_dir, seeds):
    """Per task seed, each option's label-token logit from one plain forward pass of the tiny model over the logit
    router's prompt (no prefix cache, no batching, no ``decide``), and its contextually calibrated score: the
    log-softmax
    over the options minus the log of their mean softmax over the three content-free requests under the same policy."""
    config = compose_config("route", [f"run_dir={run_dir}", *TINY])
    network, tokenizer = load_model(config.model)
    router = logit_router(config, network, tokenizer, trained_adapters(run_dir))
    env = environment_maker(config.env)()

    def label_logits(observation):
        last = network(torch.tensor([router.prompt_ids(observation)])).logits[0, -1]
        return torch.tensor([last[token].item() for _, token in router.labels])

    raw, calibrated = {}, {}
    with torch.no_grad():
        for seed in seeds:
            observation = list(env.reset(seed).messages)
            logits = label_logits(observation)
            free = torch.stack(
                [torch.softmax(label_logits(with_request(observation, text)), 0) for text in ("N/A", "", "[MASK]")]
            )
            raw[seed] = dict(zip(router.names, logits.tolist()))
            calibrated[seed] = dict(zip(router.names, (torch.log_softmax(logits, 0) - free.mean(0).log()).tolist()))
    return raw, calibrated


@pytest.mark.integration
def test_route_scores_every_router_against_oracle_labels(tmp_path):
    names = ["datetime_reasoning", "information_reporting"]
    write_capability_run(tmp_path, names)
    overrides = ["limit=3", "router.train_limit=4", "model.sampling.max_new_tokens=8"]
    assert main(["route", f"run_dir={tmp_path}", *TINY, *overrides]) == 0
    report = json.loads((tmp_path / "router" / "logit.json").read_text())
    uncalibrated = json.loads((tmp_path / "router" / "logit_uncalibrated.json").read_text())
    assert report["options"] == [*names, "base"] and len(report["tasks"]) == 3
    raw, calibrated = label_logits_by_hand(tmp_path, [task["seed"] for task in report["tasks"]])
    for task, paper in zip(report["tasks"], uncalibrated["tasks"]):
        logits, scores = raw[task["seed"]], calibrated[task["seed"]]
        assert paper["scores"] == pytest.approx(logits, abs=1e-4)
        assert paper["choice"] == max(logits, key=logits.get)  # the highest of the logits computed above (no ties here)
        assert task["scores"] == pytest.approx(scores, abs=1e-4)
        assert task["choice"] == max(scores, key=scores.get)
        # the tiny model earns nothing on device tasks, with or without an adapter: every option ties at 0,
        # and ties go to the base
        assert task["rewards"] == {name: 0.0 for name in [*names, "base"]} and task["oracle"] == "base"
    choices = [task["choice"] for task in report["tasks"]]
    # rows: oracle label (all base), columns: choice, both in the order datetime_reasoning, information_reporting, base
    assert report["confusion"] == [[0, 0, 0], [0, 0, 0], [choices.count(name) for name in [*names, "base"]]]
    assert report["accuracy"] == 1.0  # every option ties at 0 on every task: any choice earns the best reward
    assert report["routed_reward"] == 0.0 and report["regret"] == 0.0
    summary = json.loads((tmp_path / "router" / "summary.json").read_text())
    assert summary["tasks"] == 3 and summary["train_tasks"] == 4 and sum(summary["train_labels"].values()) == 4
    assert summary["oracle_reward"] == summary["base_reward"] == 0.0  # 0 on every task, for every option
    assert summary["comparators"]["always base"]["accuracy"] == 1.0 and summary["eval_labels"] == {"base": 3}
    # router=auto: nothing beats the fallback (always base, best on average on the 4 training tasks by the tie rules)
    selection = json.loads((tmp_path / "router" / "selection.json").read_text())
    assert (
        selection["chosen"] == "fallback"
        and selection["fallback"] == "base"
        and selection["rule"] == {"kind": "constant", "option": "base"}
    )
    analysis, held_out = (
        environment_maker(compose_config("route", TINY).env)().task_seeds("analysis"),
        [t["seed"] for t in report["tasks"]],
    )
    assert selection["train_seeds"] == analysis[:4] and not set(selection["train_seeds"]) & set(held_out)
    assert all(len(result["choices"]) == 4 for result in selection["candidates"].values())
    assert [task["choice"] for task in json.loads((tmp_path / "router" / "auto.json").read_text())["tasks"]] == [
        "base"
    ] * 3
    learned = summary["routers"]["learned"]  # the tiny model earns nothing on device tasks: every label is base
    assert summary["train_labels"] == {"base": 4} and "a gate would learn a constant" in learned["error"]
    assert "a gate would learn a constant" in summary["routers"]["moe"]["error"]
    assert not (tmp_path / "router" / "learned_gate.safetensors").exists()
    text = (tmp_path / "router" / "report.md").read_text()
    assert "## logit: choices against the oracle labels" in text and "| learned | not trained" in text
    # the fitted offsets: every training reward ties at 0, so the fit sends every task to the base (its oracle label)
    fitted = json.loads((tmp_path / "router" / "logit_fitted.json").read_text())
    offsets = json.loads((tmp_path / "router" / "logit_offsets.json").read_text())
    assert offsets["model"] == "tiny_random" and offsets["train_tasks"] == 4 and offsets["offsets"]["base"] == 0.0
    assert offsets["train_accuracy"]["fitted"] == 1.0 and offsets["train_routed_reward"] == {
        "content_free": 0.0,
        "fitted": 0.0,
    }
    for task, free in zip(fitted["tasks"], report["tasks"]):
        assert task["scores"] == pytest.approx(
            {name: free["scores"][name] + offsets["offsets"][name] for name in free["scores"]}, abs=1e-5
        )
    assert [task["choice"] for task in fitted["tasks"]] == ["base"] * 3 and fitted["accuracy"] == 1.0
    assert "| logit (fitted) | 1.000 | 0.000 |" in text


@pytest.mark.integration
def test_the_learned_gate_trains_on_mixed_labels_and_is_scored_on_held_out_tasks(tmp_path):
    names = ["datetime_reasoning", "information_reporting"]
    write_capability_run(tmp_path, names)
    env = "env.name=tests.scripted_environments:OddParityEnvironment"  # the adapters' replies win some tasks
    assert main(["route", f"run_dir={tmp_path}", *TINY, env, "limit=4", "model.sampling.max_new_tokens=9"]) == 0
    summary = json.loads((tmp_path / "router" / "summary.json").read_text())
    assert summary["train_tasks"] == 8 and len(summary["train_labels"]) > 1
    report = json.loads((tmp_path / "router" / "learned.json").read_text())
    assert len(report["tasks"]) == 4 and report["accuracy"] == summary["routers"]["learned"]["accuracy"]
    assert (
        report["accuracy"]
        == sum(task["rewards"][task["choice"]] == max(task["rewards"].values()) for task in report["tasks"]) / 4
    )
    for task in report["tasks"]:  # the oracle label scored the task's best reward, and the base wins a tie
        rewards = task["rewards"]
        assert rewards[task["oracle"]] == max(rewards.values())
        assert task["oracle"] == "base" or rewards["base"] < rewards[task["oracle"]]
    assert summary["oracle_reward"] == sum(task["rewards"][task["oracle"]] for task in report["tasks"]) / 4
    moe = json.loads((tmp_path / "router" / "moe.json").read_text())
    assert len(moe["tasks"]) == 4 and moe["accuracy"] == summary["routers"]["moe"]["accuracy"]
    assert (tmp_path / "router" / "moe" / "moe_gates.safetensors").is_file()
    card = json.loads((tmp_path / "router" / "learned_gate.json").read_text())
    assert card["names"] == [*names, "base"] and card["metrics"]["label_counts"] == {
        name: summary["train_labels"].get(name, 0) for name in card["names"]
    }
    # router=auto: chosen out of fold on the 8 analysis tasks alone, and served (build_router) as route scored it
    selection = json.loads((tmp_path / "router" / "selection.json").read_text())
    assert selection["train_seeds"] == list(range(8)) and selection["folds"] == 4
    chosen = selection["candidates"][selection["chosen"]]["routed_reward"]
    assert chosen >= selection["candidates"]["fallback"]["routed_reward"]
    assert all(chosen >= result["routed_reward"] for result in selection["candidates"].values())
    config = compose_config("serve", [f"run_dir={tmp_path}", *TINY, env, "router=auto"])
    network, tokenizer = load_model(config.model)
    router = build_router(config, tmp_path, network, tokenizer, trained_adapters(tmp_path))
    auto = json.loads((tmp_path / "router" / "auto.json").read_text())
    target = environment_maker(config.env)()
    served = router.route_many([list(target.reset(task["seed"]).messages) for task in auto["tasks"]])
    assert [d.choice for d in served] == [task["choice"] for task in auto["tasks"]] and router.chosen == selection[
        "chosen"
    ]


def test_the_gate_cannot_be_scored_on_its_training_split(tmp_path, capsys):
    assert main(["route", f"run_dir={tmp_path}", *TINY, "split=analysis"]) == 1
    assert "held-out accuracy needs two splits" in capsys.readouterr().err


def test_oracle_label_ties_go_to_base_and_confusion_counts():
    assert best_choice({"base": 0.5, "a": 0.5, "b": 0.2}, ["base", "a", "b"]) == "base"
    assert best_choice({"base": 0.1, "a": 0.5, "b": 0.5}, ["base", "a", "b"]) == "a"
    assert confusion(["a", "base", "a"], ["a", "a", "base"], ["a", "base"]) == [[1, 1], [1, 0]]


def test_no_trained_adapter_is_one_line_error(tmp_path, capsys):
    (tmp_path / "capabilities").mkdir()
    (tmp_path / "capabilities" / "selected.json").write_text(json.dumps([{"name": "a", "status": "READY"}]))
    assert main(["route", f"run_dir={tmp_path}", *TINY]) == 1
    err = capsys.readouterr().err
    assert "no trained capability adapter" in err and "trace-ray train" in err and err.count("\n") == 1


@pytest.mark.integration
def test_the_learned_routers_also_train_on_tasks_of_the_adapters_synthetic_environments(tmp_path):
    names = ["datetime_reasoning", "information_reporting"]
    write_capability_run(tmp_path, names)
    overrides = ["limit=2", "router.train_limit=2", "router.synthetic_train_tasks=3", "model.sampling.max_new_tokens=4"]
    assert main(["route", f"run_dir={tmp_path}", *TINY, *overrides]) == 0
    summary = json.loads((tmp_path / "router" / "summary.json").read_text())
    # 3 analysis tasks of each of the 2 synthetic environments, played with every option: the tiny model earns nothing
    # anywhere, so every label is base and the gates are still not trained, now on 2 + 2 x 3 = 8 examples
    assert summary["synthetic_train_labels"] == {"base": 6} and summary["train_labels"] == {"base": 2}
    assert "a gate would learn a constant" in summary["routers"]["learned"]["error"]
    assert (
        "training labels: base 2 (target), base 6 (synthetic environments)"
        in (tmp_path / "router" / "report.md").read_text()
    )
