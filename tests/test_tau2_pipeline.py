"""``trace-ray pipeline env=tau2_retail``: every stage on the tiny model with a minimal budget and the scripted user."""

import dataclasses
import json

import pytest

from tests.test_pipeline import MINIMAL, stages_of
from trace_ray.cli import compose_config, main
from trace_ray.commands import collect
from trace_ray.trajectory_store import TrajectoryStore

pytest.importorskip("tau2")

TAU2 = ["env=tau2_retail", "env.user.kind=scripted", "labeler=rules", "synthesis=templates"]


def retail_episode(seed, follow_oracle):
    """A finished retail episode with the scripted user: the oracle's, or an agent that replies at once."""
    from environments.tau2.environment import Tau2Environment

    env = Tau2Environment("retail")
    reset = env.reset(seed)
    messages = list(reset.messages)
    while True:
        message = env.oracle_message() if follow_oracle else {"role": "assistant", "content": "Done."}
        step = env.step(message)
        messages += [message, *step.messages]
        if step.done:
            return messages, reset, step


def seed_collection(run_dir):
    """The collect stage's episodes, already on disk: per analysis task the oracle's and a do-nothing one."""
    config = dataclasses.replace(compose_config("pipeline", [*MINIMAL, *TAU2]), split="analysis")
    manifest = collect.collection_manifest(config)
    from environments.tau2.tasks import split_seeds

    rows = []
    for seed in split_seeds("retail", "analysis")[:8]:
        for sample, follow_oracle in ((0, True), (1, False)):
            messages, reset, step = retail_episode(seed, follow_oracle)
            rows.append({
                "task_id": reset.info["task_id"], "family": reset.info["family"], "split": "analysis", "seed": seed,
                "sample_index": sample, "env": "tau2_retail", "model": "tiny_random", "adapter_name": None,
                "adapter_version": None, "messages": json.dumps(messages), "tools": json.dumps(reset.tools), "tool_calls": [],
                "token_ids": [1], "action_mask": [0], "logprobs": [0.0], "reward": step.reward,
                "success": step.info["success"], "reward_info": json.dumps(step.info, default=str),
                "termination": "agent_reply", "turns": 1, "generated_tokens": 0, "seconds": 0.1, "finished_at": 0.0,
            })
    assert {row["success"] for row in rows} == {True, False}  # identification needs both
    TrajectoryStore(run_dir, manifest).write_shard(rows)


@pytest.mark.slow
def test_every_stage_runs_on_tau2_retail(tmp_path, ray_session):
    from environments.tau2.capability_evidence import DETECTORS
    from environments.tau2.retail_templates import RETAIL_TEMPLATES

    seed_collection(tmp_path)
    assert main(["pipeline", f"run_dir={tmp_path}", *TAU2, *MINIMAL]) == 0
    stages = stages_of(tmp_path)
    assert sorted(stages) == sorted(["collect", "identify", "synthesize", "train", "baseline", "route", "evaluate"])
    assert all(entry["status"] == "done" for entry in stages.values())
    [selected] = [c["name"] for c in json.loads((tmp_path / "capabilities" / "selected.json").read_text()) if c["status"] == "READY"]
    assert selected in DETECTORS
    described = {c["name"]: c["description"] for c in json.loads((tmp_path / "capabilities" / "selected.json").read_text())}
    assert described[selected] == RETAIL_TEMPLATES[selected].description  # in the target's words, not the device's
    spec = json.loads((tmp_path / "environments" / selected / "spec.json").read_text())
    assert (spec["target"], spec["source"]) == ("tau2_retail", "templates")
    assert (tmp_path / "adapters" / selected / "adapter_config.json").exists()
    assert (tmp_path / "adapters" / "grpo_on_target" / "adapter_config.json").exists()
    report = json.loads((tmp_path / "eval" / "report.json").read_text())
    methods = {row["method"] for row in report["methods"]}
    assert {"base", f"adapter:{selected}", "TRACE (logit)", "oracle router", "GRPO on target", "prompt injection"} <= methods
    assert report["tasks"] == 2
