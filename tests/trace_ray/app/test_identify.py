"""``trace-ray identify``: labels -> aggregation -> selected.json, sweeps from cached labels, bad inputs."""

import json
import re

import pyarrow.parquet as pq
import pytest

from tests.run_dirs import episode_row, played_episode
from trace_ray.app.cli import main
from trace_ray.capabilities.run_files import RunFile, write_run_file
from trace_ray.trajectory_store import TrajectoryStore

MANIFEST = {"env": "device", "split": "analysis", "model": "tiny_random"}


def write_trajectories(run_dir, outcomes):
    """One device episode per (seed, success) with an empty conversation."""
    rows = [
        {
            "task_id": f"device-{seed}",
            "family": "simple_settings",
            "split": "analysis",
            "seed": seed,
            "sample_index": 0,
            "env": "device",
            "model": "tiny_random",
            "adapter_name": None,
            "adapter_version": None,
            "messages": "[]",
            "tools": "[]",
            "tool_calls": [],
            "token_ids": [1],
            "action_mask": [0],
            "logprobs": [0.0],
            "reward": 1.0 if success else 0.0,
            "success": success,
            "reward_info": "{}",
            "termination": "agent_reply",
            "turns": 1,
            "generated_tokens": 0,
            "seconds": 0.1,
            "finished_at": 0.0,
        }
        for seed, success in outcomes
    ]
    TrajectoryStore(run_dir, MANIFEST).write_shard(rows)


def labels(lacking_failed, present_failed, na_failed, lacking_passed, present_passed, na_passed):
    return {
        "lacking_failed": lacking_failed,
        "present_failed": present_failed,
        "na_failed": na_failed,
        "lacking_passed": lacking_passed,
        "present_passed": present_passed,
        "na_passed": na_passed,
    }


FAILED = ["device-0#0", "device-1#0", "device-2#0", "device-3#0"]
PASSED = ["device-4#0", "device-5#0"]


def write_precomputed(run_dir, runs=3):
    """``clear`` lacks in 3 of 4 failures and no success (Cov 0.75, Delta 0.75); ``noise`` lacks everywhere (Delta
    0)."""
    folder = run_dir / "capabilities" / "labels"
    folder.mkdir(parents=True)
    for attempt in range(runs):
        run = RunFile(
            attempt,
            4,
            2,
            {
                "clear": labels(FAILED[:3], FAILED[3:], [], [], PASSED, []),
                "noise": labels(FAILED, [], [], PASSED, [], []),
            },
            source=f"run_{attempt:02d}.json",
        )
        write_run_file(folder / run.source, run)
    (folder / "candidates.json").write_text(
        json.dumps(
            {
                "candidates": [
                    {"name": "clear", "description": "a capability the failures lack", "example_trajectories": []},
                    {"name": "noise", "description": "lacking everywhere", "example_trajectories": []},
                ]
            }
        )
    )
    return folder


@pytest.fixture()
def run_dir(tmp_path):
    write_trajectories(tmp_path, [(0, False), (1, False), (2, False), (3, False), (4, True), (5, True)])
    return tmp_path


def identify(run_dir, *overrides):
    return main(["identify", f"run_dir={run_dir}", "labeler=precomputed", "selection.k=3", *overrides])


def test_precomputed_labels_are_aggregated_into_selected_json(run_dir):
    write_precomputed(run_dir)
    assert identify(run_dir) == 0
    selected = json.loads((run_dir / "capabilities" / "selected.json").read_text())
    everything = json.loads((run_dir / "capabilities" / "all_capabilities.json").read_text())
    assert [c["name"] for c in selected] == ["clear"] and [c["name"] for c in everything] == ["clear", "noise"]
    assert list(selected[0]) == [
        "name",
        "description",
        "mean_cov",
        "std_cov",
        "mean_delta",
        "std_delta",
        "n_runs_passed",
        "n_runs_total",
        "passes_consistency",
        "example_failed_cases",
        "er_minus_ci",
        "er_plus_ci",
        "p_value",
        "status",
    ]
    clear = selected[0]
    assert clear["description"] == "a capability the failures lack" and clear["status"] == "PENDING"
    assert (clear["mean_cov"], clear["mean_delta"], clear["n_runs_passed"], clear["n_runs_total"]) == (0.75, 0.75, 3, 3)
    assert clear["example_failed_cases"] == FAILED[:3]


def test_sweep_reaggregates_cached_labels_into_a_table(run_dir):
    folder = write_precomputed(run_dir)
    before = {path.name: path.stat().st_mtime_ns for path in folder.iterdir()}
    assert identify(run_dir, "-m", "selection.rho=0.5,0.8", "selection.delta=0.2,0.9") == 0
    table = pq.read_table(run_dir / "capabilities" / "sweep.parquet").to_pylist()
    chosen = {(row["rho"], row["delta"]): row["selected"] for row in table}
    assert chosen == {(0.5, 0.2): ["clear"], (0.5, 0.9): [], (0.8, 0.2): [], (0.8, 0.9): []}  # Cov 0.75, Delta 0.75
    assert "| 0.5 | 0.2 | 3 | zero | clear |" in (run_dir / "capabilities" / "sweep.md").read_text()
    assert {path.name: path.stat().st_mtime_ns for path in folder.iterdir()} == before  # labels untouched
    assert not (run_dir / "capabilities" / "selected.json").exists()


def test_no_successes_is_one_clear_error_and_writes_nothing(tmp_path, capsys):
    write_trajectories(tmp_path, [(0, False), (1, False)])
    write_precomputed(tmp_path)
    assert identify(tmp_path) == 1
    err = capsys.readouterr().err
    assert "needs successes and failures" in err and "0 successes and 2 failures" in err and "samples_per_task" in err
    assert err.count("\n") == 1 and not (tmp_path / "capabilities" / "selected.json").exists()


def test_malformed_run_file_is_one_clear_error_and_writes_nothing(run_dir, capsys):
    folder = write_precomputed(run_dir)
    (folder / "run_01.json").write_text('{"attempt": 1, "totals": ')
    assert identify(run_dir) == 1
    err = capsys.readouterr().err
    assert "run_01.json: invalid JSON" in err and err.count("\n") == 1
    assert not (run_dir / "capabilities" / "selected.json").exists()


def test_missing_trajectories_and_labels_are_one_line_errors(tmp_path, run_dir, capsys):
    assert main(["identify", f"run_dir={tmp_path / 'empty'}", "labeler=rules"]) == 1
    assert "no trajectories in" in capsys.readouterr().err
    for folder in (run_dir, tmp_path / "empty"):  # no run files to aggregate, with trajectories or without
        assert identify(folder) == 1
        err = capsys.readouterr().err
        assert "no run_*.json files; put precomputed run files there" in err and err.count("\n") == 1


def test_k_above_the_number_of_runs_is_refused(run_dir, capsys):
    write_precomputed(run_dir, runs=2)
    assert identify(run_dir) == 1
    assert "k=3 exceeds the number of runs (2)" in capsys.readouterr().err


def write_device_trajectories(run_dir, seeds, follow_oracle):
    from environments.device.environment import DeviceEnvironment

    env = DeviceEnvironment()
    rows = [episode_row("device", seed, 0, *played_episode(env, seed, follow_oracle)) for seed in seeds]
    TrajectoryStore(run_dir, MANIFEST).write_shard(rows)


def test_rules_labeler_labels_once_and_selects_what_the_failures_lack(tmp_path):
    write_device_trajectories(tmp_path, range(0, 14), follow_oracle=True)  # two tasks of each family, solved
    write_device_trajectories(tmp_path, range(14, 28), follow_oracle=False)  # the same families, nothing done
    rules = ["identify", f"run_dir={tmp_path}", "labeler=rules", "labeler.runs=3", "selection.k=3"]
    assert main(rules) == 0
    labels = tmp_path / "capabilities" / "labels"
    assert sorted(p.name for p in labels.iterdir()) == [
        "_labeler.json",
        "candidates.json",
        "run_00.json",
        "run_01.json",
        "run_02.json",
    ]
    selected = {c["name"]: c for c in json.loads((tmp_path / "capabilities" / "selected.json").read_text())}
    everything = json.loads((tmp_path / "capabilities" / "all_capabilities.json").read_text())
    # the do-nothing failures lack every capability their tasks need; the oracle's successes lack none:
    # Delta = 1 everywhere, and only coverage (how many failures need it) decides
    assert {"tool_calling_precision", "precondition_verification"} <= set(selected)
    assert all(c["mean_delta"] == 1.0 for c in everything)
    assert all(c["n_runs_passed"] == 3 for c in selected.values())
    assert all(c["mean_cov"] < 0.2 for c in everything if c["name"] not in selected)
    candidates = json.loads((labels / "candidates.json").read_text())["candidates"]
    assert {c["name"] for c in candidates} >= set(selected) and all(c["description"] for c in candidates)
    before = {p.name: p.stat().st_mtime_ns for p in labels.iterdir()}
    assert main([*rules, "selection.delta=0.5"]) == 0  # same labels reused
    assert {p.name: p.stat().st_mtime_ns for p in labels.iterdir()} == before
    assert main([*rules, "labeler.runs=4", "selection.k=4"]) == 0  # new labeler settings: relabeled
    assert len(list(labels.glob("run_*.json"))) == 4
    for plot in ("cov_vs_delta.png", "label_counts.png"):
        assert (tmp_path / "capabilities" / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    rules_labels = json.loads((tmp_path / "capabilities" / "trajectory_labels" / "rules.json").read_text())
    # the families cycle with the seed (seed % 7); only compound requests (seeds 4, 11, 18, 25) ask for two actions:
    # the oracle did both (4, 11), the do-nothing agent neither (18, 25); every other task does not need it
    needed = {name: label for name, label in rules_labels["multi_step_task_completion"].items() if label != "NA"}
    assert needed == {
        "device-4#0": "PRESENT",
        "device-11#0": "PRESENT",
        "device-18#0": "LACKING",
        "device-25#0": "LACKING",
    }
    assert len(rules_labels["multi_step_task_completion"]) == 28


def test_rules_labeler_never_overwrites_run_files_from_elsewhere(run_dir, capsys):
    folder = write_precomputed(run_dir)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    assert main(["identify", f"run_dir={run_dir}", "labeler=rules"]) == 1
    assert "holds run files this project did not write" in capsys.readouterr().err
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


class Analyst:
    """An OpenAI-compatible endpoint on loopback standing in for the analysis model.

    It proposes one candidate, ``multi_step_task_completion`` (a name the rules
    catalogue also has), and labels it LACKING where the conversation holds no
    tool call (the failures here reply at once) and PRESENT otherwise: a
    labeling prompt shows no outcome, so the label comes from the content.
    """

    def __init__(self):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        analyst = self
        self.requests = 0

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                analyst.requests += 1
                prompt = body["messages"][-1]["content"]
                if '"candidates"' in prompt:
                    shown = sorted(set(re.findall(r"trajectory (device-\d+#\d+)", prompt)))
                    answer = {
                        "candidates": [
                            {
                                "name": "multi_step_task_completion",
                                "description": "does the work first",
                                "example_trajectories": shown[:2],
                            }
                        ]
                    }
                else:
                    acted = re.search(r"^call \w+\(", prompt, flags=re.MULTILINE) is not None
                    answer = {"labels": {"multi_step_task_completion": "PRESENT" if acted else "LACKING"}}
                data = json.dumps(
                    {"choices": [{"message": {"role": "assistant", "content": json.dumps(answer)}}]}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def test_llm_labeler_proposes_labels_in_parallel_runs_and_selects(tmp_path, ray_session):
    write_device_trajectories(tmp_path, range(0, 4), follow_oracle=True)
    write_device_trajectories(tmp_path, range(4, 10), follow_oracle=False)
    analyst = Analyst()
    try:
        llm = [
            "identify",
            f"run_dir={tmp_path}",
            "labeler=llm",
            f"labeler.base_url={analyst.url}",
            "labeler.model=analyst",
            "labeler.runs=3",
            "selection.k=3",
        ]
        assert main(llm) == 0
        assert analyst.requests == 1 + 3 * 10  # one proposal, then every trajectory in each of the 3 runs
        [selected] = json.loads((tmp_path / "capabilities" / "selected.json").read_text())
        assert (selected["name"], selected["mean_cov"], selected["mean_delta"], selected["n_runs_passed"]) == (
            "multi_step_task_completion",
            1.0,
            1.0,
            3,
        )
        candidates = json.loads((tmp_path / "capabilities" / "labels" / "candidates.json").read_text())["candidates"]
        assert candidates[0]["description"] == "does the work first" and len(candidates[0]["example_trajectories"]) == 2
        assert main([*llm, "selection.delta=0.5"]) == 0 and analyst.requests == 31  # cached labels: no new request
        assert not (tmp_path / "capabilities" / "agreement.json").exists()
        # now the rules labeler
        assert main(["identify", f"run_dir={tmp_path}", "labeler.runs=3", "selection.k=3"]) == 0
        kappas = json.loads((tmp_path / "capabilities" / "agreement.json").read_text())
        # the 10 trajectories, rules (rows) against the analyst (columns); only device-4 (a compound request,
        # "delete my reminder ... and turn on location") asks for two actions, so the rules call the others NA:
        #                 LLM PRESENT  LLM LACKING
        #   rules NA           4            5        (oracle on 0-3; the do-nothing agent on 5-9)
        #   rules LACKING      0            1        (device-4, do-nothing)
        # p_o = 1/10; p_e = NA 0.9 * 0 + LACKING 0.1 * 0.6 + PRESENT 0 * 0.4 = 0.06; kappa = (0.1 - 0.06) / 0.94
        assert kappas == {"multi_step_task_completion": pytest.approx(0.04 / 0.94)}
    finally:
        analyst.close()


def test_unreachable_labeler_endpoint_is_one_line_and_writes_nothing(tmp_path, capsys):
    import socket

    write_device_trajectories(tmp_path, [0], follow_oracle=True)
    write_device_trajectories(tmp_path, [1], follow_oracle=False)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    status = main(
        [
            "identify",
            f"run_dir={tmp_path}",
            "labeler=llm",
            f"labeler.base_url=http://127.0.0.1:{port}/v1",
            "labeler.model=analyst",
            "labeler.max_retries=1",
        ]
    )
    err = capsys.readouterr().err
    assert status == 1 and "cannot reach the labeler endpoint" in err and err.count("\n") == 1
    assert not (tmp_path / "capabilities").exists()


# -- reference run files alone (no trajectories/) ---------------------------------------------
F = [f"f{i}" for i in range(5)]  # the failed task ids of every run
P = [f"p{i}" for i in range(5)]  # the passed task ids of every run


def reference_lists(lacking_failed, present_failed, lacking_passed, present_passed):
    """The six lists of one capability in one run; the tasks not named are NA."""
    na_failed = [task for task in F if task not in lacking_failed + present_failed]
    na_passed = [task for task in P if task not in lacking_passed + present_passed]
    return labels(lacking_failed, present_failed, na_failed, lacking_passed, present_passed, na_passed)


def reference_run(attempt):
    """Run ``attempt`` of 10, built so that every rate is easy to compute by hand (F = 5 failed, 5 passed).

    alpha, runs 0-7: lf 3, pf 1, lp 1, pp 3 -> Cov 3/5 = 0.6, ER- 3/4, ER+ 1/4, Delta 0.5: passes.
           runs 8-9: lf 1, pf 3, lp 2, pp 2 -> Cov 0.2, ER- 1/4, ER+ 2/4, Delta -0.25: fails.
           8/10 passed; mean Cov (8*0.6 + 2*0.2)/10 = 0.52, mean Delta (8*0.5 - 2*0.25)/10 = 0.35;
           lacking failures: f2 in 10 runs, f0 in 8 (runs 0-7), f1 in 5 (runs 0-4), f4 in 3 (runs 5-7).
    beta,  runs 0-6: every failure lacks it, every success has it -> Cov 1, Delta 1 - 0 = 1: passes.
           runs 7-9: present everywhere -> Cov 0, Delta 0: fails. 7/10 passed < k = 8: never kept.
    gamma, every run: lf 2 (f3, f4), pf 0 -> Cov 0.4, ER- 1.
           runs 0-2: pp 1 (p0), lp 0 -> ER+ 0, Delta 1: passes.
           runs 3-9: no passed task needs it -> ER+ = 0/0 undefined:
             undefined_rate=zero counts it 0 -> Delta 1, passes: 10/10;
             undefined_rate=fail -> the run fails: 3/10.
    """
    if attempt < 5:
        alpha = reference_lists(["f0", "f1", "f2"], ["f3"], ["p0"], ["p1", "p2", "p3"])
    elif attempt < 8:
        alpha = reference_lists(["f0", "f2", "f4"], ["f3"], ["p0"], ["p1", "p2", "p3"])
    else:
        alpha = reference_lists(["f2"], ["f0", "f1", "f3"], ["p0", "p1"], ["p2", "p3"])
    beta = reference_lists(F, [], [], P) if attempt < 7 else reference_lists([], F, [], P)
    gamma = reference_lists(["f3", "f4"], [], [], ["p0"] if attempt < 3 else [])
    return {
        "attempt": attempt,
        "totals": {"total_failed": 5, "total_passed": 5},
        "labels": {"alpha": alpha, "beta": beta, "gamma": gamma},
    }


def write_reference_labels(run_dir):
    """capabilities/labels/ with 10 run files written as plain JSON and candidates.json: nothing else."""
    folder = run_dir / "capabilities" / "labels"
    folder.mkdir(parents=True)
    for attempt in range(10):
        (folder / f"run_{attempt:02d}.json").write_text(json.dumps(reference_run(attempt)))
    (folder / "candidates.json").write_text(
        json.dumps(
            {
                "candidates": [
                    {"name": name, "description": f"the {name} skill", "example_trajectories": []}
                    for name in ("alpha", "beta", "gamma")
                ]
            }
        )
    )
    return folder


def identify_reference(run_dir, undefined_rate="zero"):
    return main(
        [
            "identify",
            f"run_dir={run_dir}",
            "labeler=precomputed",
            "selection.rho=0.1",
            "selection.delta=0.2",
            "selection.k=8",
            f"selection.undefined_rate={undefined_rate}",
        ]
    )


@pytest.mark.parametrize(
    "undefined_rate, kept, runs_passed, mean_cov, mean_delta, examples",
    [
        # zero: gamma 10/10 (mean Delta 1.0) before alpha 8/10 (0.35); beta 7/10 is left out
        ("zero", ["gamma", "alpha"], [10, 8], [0.4, 0.52], [1.0, 0.35], [["f3", "f4"], ["f2", "f0", "f1", "f4"]]),
        # fail: gamma passes only runs 0-2 (3/10), so alpha alone
        ("fail", ["alpha"], [8], [0.52], [0.35], [["f2", "f0", "f1", "f4"]]),
    ],
)
def test_reference_run_files_alone_select_what_hand_computation_says(
    tmp_path,
    capsys,
    undefined_rate,
    kept,
    runs_passed,
    mean_cov,
    mean_delta,
    examples,
):
    write_reference_labels(tmp_path)
    assert identify_reference(tmp_path, undefined_rate) == 0
    assert "aggregating the precomputed run files alone" in capsys.readouterr().out
    assert not (tmp_path / "trajectories").exists()
    selected = json.loads((tmp_path / "capabilities" / "selected.json").read_text())
    assert [c["name"] for c in selected] == kept
    assert [c["n_runs_passed"] for c in selected] == runs_passed
    assert [c["mean_cov"] for c in selected] == pytest.approx(mean_cov)
    assert [c["mean_delta"] for c in selected] == pytest.approx(mean_delta)
    assert [c["example_failed_cases"] for c in selected] == examples
    assert [c["description"] for c in selected] == [f"the {name} skill" for name in kept]
    beta = next(
        c for c in json.loads((tmp_path / "capabilities" / "all_capabilities.json").read_text()) if c["name"] == "beta"
    )
    assert (beta["n_runs_passed"], beta["passes_consistency"], beta["mean_delta"]) == (7, False, pytest.approx(0.7))


def test_reference_run_file_with_overlapping_lists_is_refused_naming_the_file(tmp_path, capsys):
    folder = write_reference_labels(tmp_path)
    run = reference_run(3)
    run["labels"]["alpha"]["present_failed"].append("f1")  # f1 is already lacking_failed in run 3
    (folder / "run_03.json").write_text(json.dumps(run))
    assert identify_reference(tmp_path) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "run_03.json: capability 'alpha': task 'f1' appears in both lacking_failed and present_failed" in err
    assert not (tmp_path / "capabilities" / "selected.json").exists()


def test_reference_run_files_without_a_passed_task_are_refused(tmp_path, capsys):
    folder = tmp_path / "capabilities" / "labels"
    folder.mkdir(parents=True)
    only_failures = labels(["f0"], ["f1"], [], [], [], [])
    (folder / "run_00.json").write_text(
        json.dumps({"attempt": 0, "totals": {"total_failed": 2, "total_passed": 0}, "labels": {"alpha": only_failures}})
    )
    assert main(["identify", f"run_dir={tmp_path}", "labeler=precomputed", "selection.k=1"]) == 1
    err = capsys.readouterr().err
    assert "needs successes and failures" in err and "0 passed and 2 failed" in err and err.count("\n") == 1
    assert not (tmp_path / "capabilities" / "selected.json").exists()
