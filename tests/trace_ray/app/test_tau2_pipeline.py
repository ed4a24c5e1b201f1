"""``trace-ray pipeline env=tau2_retail``: every stage on the tiny model with a minimal budget and the scripted user."""

import json

import pytest

from tests.trace_ray.app.test_pipeline import MINIMAL, seed_collection, stages_of
from trace_ray.app.cli import main

pytest.importorskip("tau2", reason="tau2-bench is not installed: make install-tau2")

TAU2 = ["env=tau2_retail", "env.user.kind=scripted", "labeler=rules", "synthesis=templates"]


@pytest.mark.slow
def test_every_stage_runs_on_tau2_retail(tmp_path, ray_session):
    from environments.tau2.capability_evidence import DETECTORS
    from environments.tau2.environment import Tau2Environment
    from environments.tau2.retail_templates import RETAIL_TEMPLATES

    seed_collection(tmp_path, TAU2, Tau2Environment("retail"))
    assert main(["pipeline", f"run_dir={tmp_path}", *TAU2, *MINIMAL]) == 0
    stages = stages_of(tmp_path)
    assert sorted(stages) == sorted(["collect", "identify", "synthesize", "train", "baseline", "route", "evaluate"])
    assert all(entry["status"] == "done" for entry in stages.values())
    [selected] = [
        c["name"]
        for c in json.loads((tmp_path / "capabilities" / "selected.json").read_text())
        if c["status"] in ("READY", "OUT_OF_BAND")
    ]
    assert selected in DETECTORS
    described = {
        c["name"]: c["description"] for c in json.loads((tmp_path / "capabilities" / "selected.json").read_text())
    }
    assert described[selected] == RETAIL_TEMPLATES[selected].description  # in the target's words, not the device's
    spec = json.loads((tmp_path / "environments" / selected / "spec.json").read_text())
    assert (spec["target"], spec["source"]) == ("tau2_retail", "templates")
    assert (tmp_path / "adapters" / selected / "adapter_config.json").exists()
    assert (tmp_path / "adapters" / "grpo_on_target" / "adapter_config.json").exists()
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    methods = {row["method"] for row in report["methods"]}
    assert {
        "base",
        f"adapter:{selected}",
        "TRACE (logit)",
        "oracle router",
        "GRPO on target",
        "prompt injection",
    } <= methods
    assert report["tasks"] == 2
