"""``route`` and ``evaluate`` run their model work on Ray workers: the driver loads no model weights."""

import json

import pytest

from tests.run_dirs import write_capability_run
from trace_ray.app.cli import main

TINY = ["model=tiny_random", "lora.rank=4", "lora.alpha=8", "model.sampling.max_new_tokens=8"]


def refuse_weights_here(monkeypatch):
    """From now on, any model weights loaded in this (the driver's) process fail the test; Ray's workers are
    untouched."""
    import transformers

    def refuse(*args, **kwargs):
        raise AssertionError("the driver loaded model weights")

    for loader in ("from_pretrained", "from_config"):
        monkeypatch.setattr(transformers.AutoModelForCausalLM, loader, refuse)
    monkeypatch.setattr("trace_ray.models.load_model", refuse)


@pytest.mark.integration
def test_route_and_evaluate_load_no_weights_in_the_driver(tmp_path, monkeypatch, capsys):
    write_capability_run(tmp_path, ["datetime_reasoning", "information_reporting"])
    refuse_weights_here(monkeypatch)
    assert main(["route", f"run_dir={tmp_path}", *TINY, "limit=2", "router.train_limit=2"]) == 0
    assert main(["evaluate", f"run_dir={tmp_path}", *TINY, "limit=2"]) == 0
    summary = json.loads((tmp_path / "router" / "summary.json").read_text())
    assert summary["tasks"] == 2 and "logit" in summary["routers"]
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    assert report["tasks"] == 2 and {"base", "TRACE (logit)", "prompt injection"} <= {
        m["method"] for m in report["methods"]
    }
    out = capsys.readouterr().out
    assert "on a Ray model worker" in out


def test_model_work_that_the_cluster_cannot_place_is_one_line(tmp_path, capsys):
    write_capability_run(tmp_path, ["datetime_reasoning"])
    assert main(["evaluate", f"run_dir={tmp_path}", *TINY, "limit=1", "rollout.worker_gpus=1"]) == 1
    err = capsys.readouterr().err
    assert "cannot be placed: it needs 1 model task x 1 CPU + 1 GPU" in err and err.count("\n") == 1
