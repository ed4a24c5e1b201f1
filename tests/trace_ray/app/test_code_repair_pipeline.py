"""``trace-ray pipeline env=code_repair``: every stage on the tiny model, tasks on a local package (env.tasks_dir)."""

import json

import pytest

from environments.code_repair.environment import CodeRepairEnvironment
from environments.code_repair.sources import PackageSource, write_task_folder
from environments.code_repair.synthetic_templates import TEMPLATES
from environments.code_repair.tasks import build_tasks
from tests.environments.test_code_repair_tasks import SHAPES, shapes  # noqa: F401  (the package fixture)
from tests.trace_ray.app.test_pipeline import MINIMAL, seed_collection, stages_of
from trace_ray.app.cli import main


@pytest.mark.slow
def test_every_stage_runs_on_code_repair(tmp_path, shapes, ray_session):  # noqa: F811
    tasks = build_tasks(SHAPES, shapes, digest="d" * 64, count=3, seed=1)
    splits = ["analysis", "analysis", "eval"]
    folder = write_task_folder(
        tmp_path / "tasks", [(SHAPES, shapes)], [{**t, "split": s} for t, s in zip(tasks, splits)]
    )
    overrides = [
        "env=code_repair",
        f"env.tasks_dir={folder}",
        "labeler=rules",
        "synthesis=templates",
        "pipeline.eval_limit=1",
    ]
    run_dir = tmp_path / "run"
    seed_collection(run_dir, overrides, CodeRepairEnvironment(source=PackageSource.from_folder(folder)))
    assert main(["pipeline", f"run_dir={run_dir}", *MINIMAL, *overrides]) == 0
    stages = stages_of(run_dir)
    assert all(entry["status"] == "done" for entry in stages.values()) and len(stages) == 7
    [selected] = [
        c["name"]
        for c in json.loads((run_dir / "capabilities" / "selected.json").read_text())
        if c["status"] in ("READY", "OUT_OF_BAND")
    ]
    assert selected in TEMPLATES
    spec = json.loads((run_dir / "environments" / selected / "spec.json").read_text())
    assert (spec["target"], spec["source"]) == ("code_repair", "templates")
    assert (run_dir / "adapters" / selected / "adapter_config.json").exists()
    report = json.loads((run_dir / "eval" / "report.json").read_text())
    assert report["tasks"] == 1 and {"base", f"adapter:{selected}", "GRPO on target"} <= {
        row["method"] for row in report["methods"]
    }
    predictions = (run_dir / "eval" / "predictions" / "base.jsonl").read_text().splitlines()
    assert json.loads(predictions[0])["instance_id"] == tasks[2]["instance_id"]
