"""Contrastive capability identification: run files, per-run statistics, consistency selection.

Expected values are worked out by hand from the formulas in the comments:
Cov = lf/F, ER- = lf/(lf+pf), ER+ = lp/(lp+pp), Delta = ER- - ER+.
"""

from __future__ import annotations

import json
import math
import random
from fractions import Fraction
from statistics import NormalDist

import numpy as np
import pytest

from environments.errors import TraceRayError
from trace_ray.capabilities.aggregation import (
    CapabilityStats,
    SelectionSettings,
    aggregate,
    pass_matrix,
    run_stats,
    two_proportion_p_value,
    wilson_interval,
)
from trace_ray.capabilities.run_files import (
    LABEL_LISTS,
    RunFile,
    RunFileError,
    read_run_file,
    read_run_files,
    validate_run,
    write_run_file,
)

FAILED = [f"f{i}" for i in range(10)]  # F = 10
PASSED = [f"p{i}" for i in range(10)]  # P = 10


def labels(failed, passed, lf=(), pf=(), lp=(), pp=()):
    """The six lists of one capability; every id neither lacking nor present is NA."""
    return {
        "lacking_failed": list(lf),
        "present_failed": list(pf),
        "na_failed": [t for t in failed if t not in lf and t not in pf],
        "lacking_passed": list(lp),
        "present_passed": list(pp),
        "na_passed": [t for t in passed if t not in lp and t not in pp],
    }


def make_run(source, caps, failed=FAILED, passed=PASSED, attempt=0):
    """A RunFile whose capabilities are given as {name: {"lf": [...], "pf": [...], ...}}."""
    return RunFile(
        attempt, len(failed), len(passed), {c: labels(failed, passed, **spec) for c, spec in caps.items()}, source
    )


def stats_of(spec, failed=FAILED, passed=PASSED, rho=0.10, delta=0.20, undefined_rate="zero"):
    return run_stats(labels(failed, passed, **spec), len(failed), rho, delta, undefined_rate)


def write_raw(path, data):
    path.write_text(json.dumps(data))
    return path


# ---------------------------------------------------------------- per-run statistics


def test_run_stats_hand_computed_case_passes():
    # lf=3, pf=1, lp=1, pp=3, F=10: Cov=3/10=0.3, ER-=3/4=0.75, ER+=1/4=0.25, Delta=0.5
    stats, warnings = stats_of({"lf": FAILED[:3], "pf": FAILED[3:4], "lp": PASSED[:1], "pp": PASSED[1:4]})
    assert (stats.lf, stats.pf, stats.lp, stats.pp) == (3, 1, 1, 3)
    assert stats.cov == pytest.approx(0.3) and stats.er_minus == pytest.approx(0.75)
    assert stats.er_plus == pytest.approx(0.25) and stats.delta == pytest.approx(0.5)
    assert stats.passed and warnings == []


def test_run_stats_fails_on_low_coverage_or_low_delta():
    # lf=1, pf=0, pp=2: Cov=0.1 < rho=0.15 although Delta = 1 - 0 = 1
    low_cov, _ = stats_of({"lf": FAILED[:1], "pp": PASSED[:2]}, rho=0.15)
    assert low_cov.delta == pytest.approx(1.0) and not low_cov.passed
    # lf=5, pf=5, lp=3, pp=5: Cov=0.5 but Delta = 0.5 - 3/8 = 0.125 < 0.2
    low_delta, _ = stats_of({"lf": FAILED[:5], "pf": FAILED[5:], "lp": PASSED[:3], "pp": PASSED[3:8]})
    assert low_delta.cov == pytest.approx(0.5) and low_delta.delta == pytest.approx(0.125) and not low_delta.passed


def test_thresholds_are_inclusive_despite_floating_point():
    # Cov = 1/10 = rho; ER- = 7/10, ER+ = 5/10, Delta = 0.2 = delta (0.7 - 0.5 is 0.19999999999999996 in floats)
    spec = {"lf": FAILED[:1], "pf": FAILED[1:2], "lp": PASSED[:5], "pp": PASSED[5:]}
    spec_delta = {"lf": FAILED[:7], "pf": FAILED[7:], "lp": PASSED[:5], "pp": PASSED[5:]}
    # first case: ER- = 1/2, ER+ = 1/2, Delta 0 -> judged on Cov only with delta = 0
    assert stats_of(spec, rho=0.10, delta=0.0)[0].passed
    assert not stats_of(spec, rho=0.11, delta=0.0)[0].passed
    assert stats_of(spec_delta, delta=0.20)[0].passed
    assert not stats_of(spec_delta, delta=0.21)[0].passed
    assert pass_matrix([make_run("run_00.json", {"c": spec_delta})], ["c"], SelectionSettings(k=1)).tolist() == [[True]]


def test_er_plus_undefined_zero_policy_uses_er_minus_fail_policy_never_passes():
    # needed only by failing tasks: lf=4, pf=1, lp=pp=0 -> Cov=0.4, ER-=0.8, ER+ undefined
    spec = {"lf": FAILED[:4], "pf": FAILED[4:5]}
    zero, warnings = stats_of(spec, undefined_rate="zero")
    assert zero.er_plus is None and zero.delta == pytest.approx(0.8) and zero.passed
    assert warnings == ["ER+ is undefined (no passed trajectory needs it)"]
    fail, warnings = stats_of(spec, undefined_rate="fail")
    assert fail.er_plus is None and fail.delta is None and not fail.passed
    assert warnings == ["ER+ is undefined (no passed trajectory needs it)"]


def test_no_failed_trajectory_makes_cov_and_er_minus_undefined():
    # F = 0, lp=1, pp=1: Cov and ER- undefined, ER+ = 0.5; "zero": Cov 0, Delta = 0 - 0.5 = -0.5
    spec = {"lp": PASSED[:1], "pp": PASSED[1:2]}
    zero, warnings = stats_of(spec, failed=[], rho=0.0, delta=-1.0)
    assert (zero.cov, zero.er_minus, zero.er_plus) == (None, None, 0.5)
    assert zero.delta == pytest.approx(-0.5) and zero.passed  # 0 >= rho=0 and -0.5 >= -1
    assert warnings == [
        "Cov is undefined (the run has no failed trajectory)",
        "ER- is undefined (no failed trajectory needs it)",
    ]
    fail, _ = stats_of(spec, failed=[], rho=0.0, delta=-1.0, undefined_rate="fail")
    assert fail.delta is None and not fail.passed


def test_undefined_rate_through_aggregate_both_policies():
    # datetime_reasoning: Cov=0.4, ER-=0.8, ER+ undefined in each of 8 runs
    runs = [
        make_run(f"run_{i:02d}.json", {"datetime_reasoning": {"lf": FAILED[:4], "pf": FAILED[4:5]}}) for i in range(8)
    ]
    zero = aggregate(runs, {"datetime_reasoning": "dates"}, SelectionSettings(undefined_rate="zero"))
    [cap] = zero.selected
    assert cap.n_runs_passed == 8 and cap.mean_delta == pytest.approx(0.8) and cap.std_delta == pytest.approx(0.0)
    assert cap.er_plus_ci is None and cap.p_value is None  # pooled lp + pp = 0
    assert "run_03: capability 'datetime_reasoning': ER+ is undefined (no passed trajectory needs it)" in zero.warnings
    assert len(zero.warnings) == 8
    fail = aggregate(runs, {"datetime_reasoning": "dates"}, SelectionSettings(undefined_rate="fail"))
    assert fail.selected == [] and fail.all[0].n_runs_passed == 0
    assert fail.all[0].mean_delta is None and fail.all[0].std_delta is None
    assert fail.all[0].mean_cov == pytest.approx(0.4)
    assert "run_03: capability 'datetime_reasoning': ER+ is undefined (no passed trajectory needs it)" in fail.warnings


def test_means_under_each_policy_when_cov_is_undefined():
    # run_00: lf=2, pf=2 of F=4, pp=2 -> Cov 0.5, Delta 0.5 - 0 = 0.5
    # run_01: F=0, lp=1, pp=1 -> Cov, ER- undefined; ER+ = 0.5
    failed, passed = FAILED[:4], PASSED[:2]
    runs = [
        make_run("run_00.json", {"a": {"lf": failed[:2], "pf": failed[2:], "pp": passed}}, failed, passed),
        make_run("run_01.json", {"a": {"lp": passed[:1], "pp": passed[1:]}}, [], passed),
    ]
    # "zero": Cov (0.5, 0) -> mean 0.25, std 0.25; Delta (0.5, -0.5) -> mean 0, std 0.5
    [zero] = aggregate(runs, {"a": ""}, SelectionSettings(k=1)).all
    assert (zero.mean_cov, zero.std_cov) == pytest.approx((0.25, 0.25))
    assert (zero.mean_delta, zero.std_delta) == pytest.approx((0.0, 0.5))
    # "fail": only run_00 has defined values -> means 0.5, stds 0
    [fail] = aggregate(runs, {"a": ""}, SelectionSettings(k=1, undefined_rate="fail")).all
    assert (fail.mean_cov, fail.std_cov, fail.mean_delta, fail.std_delta) == pytest.approx((0.5, 0.0, 0.5, 0.0))


# ---------------------------------------------------------------- consistency and records


def test_capability_missing_from_a_run_counts_as_failing_and_means_use_runs_that_have_it():
    # run_00: a has lf=4, pf=1, lp=1, pp=4 -> Cov 0.4, ER- 0.8, ER+ 0.2, Delta 0.6
    # run_02: a has lf=2, pf=2, lp=0, pp=5 -> Cov 0.2, ER- 0.5, ER+ 0.0, Delta 0.5
    # run_01: no a (b labels everything NA)
    runs = [
        make_run(
            "run_00.json", {"a": {"lf": FAILED[:4], "pf": FAILED[4:5], "lp": PASSED[:1], "pp": PASSED[1:5]}, "b": {}}
        ),
        make_run("run_01.json", {"b": {}}),
        make_run("run_02.json", {"a": {"lf": FAILED[:2], "pf": FAILED[2:4], "pp": PASSED[:5]}, "b": {}}),
    ]
    result = aggregate(runs, {"a": "A", "b": "B"}, SelectionSettings(k=2))
    [a] = result.selected
    assert (a.name, a.description, a.n_runs_passed, a.n_runs_total, a.passes_consistency) == ("a", "A", 2, 3, True)
    assert a.mean_cov == pytest.approx(0.3) and a.std_cov == pytest.approx(0.1)  # mean of 0.4, 0.2; population std
    assert a.mean_delta == pytest.approx(0.55) and a.std_delta == pytest.approx(0.05)  # mean of 0.6, 0.5
    assert "run_01: capability 'a' is not labelled; counted as not passing this run" in result.warnings
    # pooled over run_00 and run_02: lf=6, pf=3, lp=1, pp=9
    assert a.er_minus_ci == pytest.approx(list(wilson_interval(6, 9)))
    assert a.er_plus_ci == pytest.approx(list(wilson_interval(1, 10)))
    assert a.p_value == pytest.approx(two_proportion_p_value(6, 9, 1, 10))
    assert aggregate(runs, {"a": "A", "b": "B"}, SelectionSettings(k=3)).selected == []


def test_consistency_k_boundary():
    passing = {"lf": FAILED[:3], "pf": FAILED[3:4], "pp": PASSED[:4]}  # Cov 0.3, Delta 0.75 - 0 = 0.75
    failing = {"pf": FAILED[:4], "pp": PASSED[:4]}  # Cov 0
    runs = [
        make_run(f"run_{i:02d}.json", {"eight": passing if i < 8 else failing, "seven": passing if i < 7 else failing})
        for i in range(10)
    ]
    result = aggregate(runs, {"eight": "", "seven": ""}, SelectionSettings(k=8))
    assert [c.name for c in result.selected] == ["eight"]
    assert {c.name: c.n_runs_passed for c in result.all} == {"eight": 8, "seven": 7}
    assert pass_matrix(runs, ["eight", "seven"], SelectionSettings(k=8)).sum(axis=1).tolist() == [8, 7]


def test_k_larger_than_number_of_runs_is_refused():
    runs = [make_run(f"run_{i}.json", {"a": {}}) for i in range(3)]
    with pytest.raises(TraceRayError, match=r"^k=8 exceeds the number of runs \(3\)"):
        aggregate(runs, {"a": ""}, SelectionSettings())
    with pytest.raises(TraceRayError, match="exceeds the number of runs"):
        aggregate([], {"a": ""}, SelectionSettings(k=1))


def test_sorted_by_mean_delta_then_name_with_undefined_last():
    f8, p8 = FAILED[:8], PASSED[:8]  # F = P = 8, so every rate is exact in binary
    caps = {
        "zeta": {"lf": f8[:6], "pf": f8[6:], "pp": p8},  # 6/8 - 0 = 0.75
        "alpha": {"lf": f8[:4], "pf": f8[4:], "lp": p8[:2], "pp": p8[2:]},  # 4/8 - 2/8 = 0.25
        "beta": {"lf": f8[:2], "pf": f8[2:], "pp": p8},  # 2/8 - 0 = 0.25
        "delta_cap": {"lf": f8[:1], "pf": f8[1:], "lp": p8[:5], "pp": p8[5:]},  # 1/8 - 5/8 = -0.5
        "gamma": {"lf": f8[:4], "pf": []},  # ER- = 1, ER+ undefined
    }
    runs = [make_run("run_00.json", caps, f8, p8)]
    fail = aggregate(runs, {}, SelectionSettings(k=1, undefined_rate="fail"))
    assert [c.name for c in fail.all] == ["zeta", "alpha", "beta", "delta_cap", "gamma"]
    assert [c.name for c in fail.selected] == ["zeta", "alpha", "beta"]
    assert "capability 'zeta' has no description" in fail.warnings
    zero = aggregate(runs, {}, SelectionSettings(k=1))  # gamma: Delta = ER- = 1
    assert [c.name for c in zero.all] == ["gamma", "zeta", "alpha", "beta", "delta_cap"]


def test_example_failed_cases_most_often_lacking_then_id_capped_at_eight():
    tasks = [f"t{i:02d}" for i in range(1, 13)]
    lacking = [["t05", "t02", "t09", "t01", "t03"], ["t05", "t02", "t04", "t06"], ["t05", "t09", "t07", "t08", "t10"]]
    runs = [make_run(f"run_{i}.json", {"c": {"lf": lf}}, tasks, []) for i, lf in enumerate(lacking)]
    [c] = aggregate(runs, {"c": ""}, SelectionSettings(k=1)).all
    # counts: t05 3; t02, t09 2; t01, t03, t04, t06, t07, t08, t10 1 -> top 8 by (-count, id)
    assert c.example_failed_cases == ["t05", "t02", "t09", "t01", "t03", "t04", "t06", "t07"]


def test_capability_stats_to_json_keys_and_values():
    runs = [make_run("run_00.json", {"c": {"lf": FAILED[:3], "pf": FAILED[3:4], "pp": PASSED[:4]}})]
    [c] = aggregate(runs, {"c": "does c"}, SelectionSettings(k=1)).all
    record = c.to_json()
    assert list(record) == [
        "name", "description", "mean_cov", "std_cov", "mean_delta", "std_delta", "n_runs_passed", "n_runs_total",
        "passes_consistency", "example_failed_cases", "er_minus_ci", "er_plus_ci", "p_value", "status",
    ]  # fmt: skip
    assert isinstance(c, CapabilityStats) and record["status"] == "PENDING" and record["description"] == "does c"
    assert json.loads(json.dumps(record)) == record  # plain JSON values, intervals as [low, high]
    assert isinstance(record["er_minus_ci"], list) and len(record["er_minus_ci"]) == 2


def test_selection_settings_validation():
    for bad in ({"rho": 1.5}, {"rho": -0.1}, {"delta": -1.5}, {"k": 0}, {"undefined_rate": "skip"}):
        with pytest.raises(TraceRayError) as error:
            SelectionSettings(**bad)
        assert "\n" not in str(error.value) and list(bad)[0] in str(error.value)
    SelectionSettings(rho=0.0, delta=-1.0, k=1, undefined_rate="fail")


# ---------------------------------------------------------------- small-sample statistics


def test_wilson_interval_hand_computed():
    # z = 1.96, z^2 = 3.8416, n = 10: 1 + z^2/n = 1.38416
    # 0/10: centre = half = 0.19208/1.38416 -> [0, 0.38416/1.38416 = 0.277540]
    assert wilson_interval(0, 10) == pytest.approx((0.0, 0.277540), abs=1e-6)
    # 10/10: mirror image -> [1 - 0.277540, 1]
    assert wilson_interval(10, 10) == pytest.approx((0.722460, 1.0), abs=1e-6)
    # 5/10: centre 0.5, half = 1.96/1.38416 * sqrt(0.025 + 0.009604) = 0.263410
    assert wilson_interval(5, 10) == pytest.approx((0.236590, 0.763410), abs=1e-6)
    assert wilson_interval(0, 0) is None


def test_two_proportion_p_value_hand_computed():
    # 8/10 vs 2/10: pooled 0.5, var = 0.25 * (1/10 + 1/10) = 0.05, z = 0.6 / sqrt(0.05) = 2.683282
    z = 0.6 / math.sqrt(0.05)
    assert two_proportion_p_value(8, 10, 2, 10) == pytest.approx(2 * (1 - NormalDist().cdf(z)))
    assert two_proportion_p_value(8, 10, 2, 10) == pytest.approx(0.00729, abs=1e-5)
    assert two_proportion_p_value(3, 10, 6, 20) == pytest.approx(1.0)  # equal proportions: z = 0
    assert two_proportion_p_value(0, 5, 0, 7) == 1.0 and two_proportion_p_value(5, 5, 7, 7) == 1.0  # pooled variance 0
    assert two_proportion_p_value(1, 0, 1, 3) is None and two_proportion_p_value(1, 3, 0, 0) is None


# ---------------------------------------------------------------- run files


def raw_run(**caps):
    return {"attempt": 2, "totals": {"total_failed": 2, "total_passed": 1}, "labels": caps}


def cap_lists(**given):
    return {key: given.get(key, []) for key in LABEL_LISTS}


def test_partition_errors_name_file_capability_and_task(tmp_path):
    cases = [
        (
            raw_run(x=cap_lists(lacking_failed=["device-5#0"], present_failed=["device-5#0", "f2"], na_passed=["p1"])),
            "run_02.json: capability 'x': task 'device-5#0' appears in both lacking_failed and present_failed",
        ),
        (
            raw_run(x=cap_lists(na_failed=["f1", "f1", "f2"], na_passed=["p1"])),
            "run_02.json: capability 'x': task 'f1' appears twice in na_failed",
        ),
        (
            raw_run(
                x=cap_lists(na_failed=["f1", "f2"], na_passed=["p1"]), y=cap_lists(na_failed=["f1"], na_passed=["p1"])
            ),
            "run_02.json: capability 'y': failed task 'f2' is missing from its *_failed lists "
            "(another capability labels it failed)",
        ),
        (
            raw_run(
                x=cap_lists(na_failed=["f1", "f2"], na_passed=["p1"]),
                y=cap_lists(na_failed=["f1"], present_passed=["f2", "p1"]),
            ),
            "run_02.json: capability 'y': task 'f2' is labelled as passed but capability 'x' labels it as failed",
        ),
        (
            raw_run(x=cap_lists(na_failed=["f1"], na_passed=["p1"])),
            "run_02.json: totals.total_failed is 2 but the labels name 1 failed tasks",
        ),
    ]
    for data, message in cases:
        with pytest.raises(RunFileError) as error:
            read_run_file(write_raw(tmp_path / "run_02.json", data))
        assert str(error.value) == message
    assert issubclass(RunFileError, TraceRayError)


def test_in_memory_runs_are_validated_by_aggregate():
    run = make_run("run_05.json", {"a": {"lf": ["f0"], "pf": ["f0"]}})
    with pytest.raises(RunFileError, match=r"^run_05.json: capability 'a': task 'f0' appears in both"):
        validate_run(run)
    with pytest.raises(RunFileError):
        aggregate([run], {}, SelectionSettings(k=1))


def test_malformed_run_files(tmp_path):
    path = tmp_path / "run_01.json"
    good = raw_run(x=cap_lists(na_failed=["f1", "f2"], na_passed=["p1"]))
    path.write_text('{"attempt": 1,')
    with pytest.raises(RunFileError, match=r"^run_01.json: invalid JSON \("):
        read_run_file(path)
    broken = [
        ({k: v for k, v in good.items() if k != "labels"}, "run_01.json: missing key 'labels'"),
        ({**good, "attempt": "1"}, "run_01.json: 'attempt' must be an integer"),
        (
            {**good, "totals": {"total_failed": -1, "total_passed": 1}},
            "run_01.json: totals.total_failed must be a non-negative integer",
        ),
        (
            {**good, "labels": {"x": {**good["labels"]["x"], "na_failed": ["f1", 2]}}},
            "run_01.json: capability 'x': 'na_failed' must be a list of task id strings",
        ),
        ({**good, "labels": {"x": {k: v for k, v in good["labels"]["x"].items() if k != "na_passed"}}}, None),
        ([good], "run_01.json: the top level must be a JSON object"),
    ]
    for data, message in broken:
        with pytest.raises(RunFileError) as error:
            read_run_file(write_raw(path, data))
        assert str(error.value).startswith("run_01.json: ") and "\n" not in str(error.value)
        if message is not None:
            assert str(error.value) == message
    with pytest.raises(RunFileError, match=r"^run_09.json: cannot be read"):
        read_run_file(tmp_path / "run_09.json")
    assert read_run_file(write_raw(path, {**good, "notes": "extra top-level keys are ignored"})).attempt == 2


def test_write_read_round_trip_keeps_the_exact_schema(tmp_path):
    run = make_run(
        "memory", {"tool_use": {"lf": FAILED[:2], "pf": FAILED[2:3], "lp": PASSED[:1]}, "dates": {}}, attempt=3
    )
    write_run_file(tmp_path / "run_03.json", run)
    data = json.loads((tmp_path / "run_03.json").read_text())
    assert LABEL_LISTS == (
        "lacking_failed",
        "present_failed",
        "na_failed",
        "lacking_passed",
        "present_passed",
        "na_passed",
    )
    assert list(data) == ["attempt", "totals", "labels"] and data["attempt"] == 3
    assert data["totals"] == {"total_failed": 10, "total_passed": 10} and list(data["totals"]) == [
        "total_failed",
        "total_passed",
    ]
    assert list(data["labels"]) == ["tool_use", "dates"]
    assert all(list(lists) == list(LABEL_LISTS) for lists in data["labels"].values())
    back = read_run_file(tmp_path / "run_03.json")
    assert back.source == str(tmp_path / "run_03.json")
    assert (back.attempt, back.total_failed, back.total_passed, back.labels) == (3, 10, 10, run.labels)
    write_run_file(tmp_path / "run_04.json", back)
    assert (tmp_path / "run_04.json").read_bytes() == (tmp_path / "run_03.json").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run_03.json", "run_04.json"]  # no temporary file left


def test_read_run_files_sorted_by_name_and_refuses_an_empty_folder(tmp_path):
    with pytest.raises(RunFileError, match="no run_\\*.json files"):
        read_run_files(tmp_path)
    for name, attempt in (("run_10.json", 10), ("run_02.json", 2)):
        write_run_file(tmp_path / name, make_run("memory", {"a": {}}, attempt=attempt))
    write_raw(tmp_path / "notes.json", {"not": "a run"})
    assert [run.attempt for run in read_run_files(tmp_path)] == [2, 10]


# ---------------------------------------------------------------- loop versus vectorized


def random_runs(rng):
    """1-5 runs over up to 4 capabilities with 0-6 failed and passed tasks (zero denominators are common)."""
    names = [f"c{i}" for i in range(rng.randint(1, 4))]
    runs = []
    for r in range(rng.randint(1, 5)):
        failed = [f"f{i}" for i in range(rng.randint(0, 6))]
        passed = [f"p{i}" for i in range(rng.randint(0, 6))]
        caps = {}
        for name in names:
            if rng.random() < 0.2:
                continue  # capability missing from this run
            lists = {key: [] for key in LABEL_LISTS}
            for task in failed:
                lists[rng.choice(LABEL_LISTS[:3])].append(task)
            for task in passed:
                lists[rng.choice(LABEL_LISTS[3:])].append(task)
            caps[name] = lists
        runs.append(RunFile(r, len(failed), len(passed), caps, f"run_{r:02d}.json"))
    return runs, names


def boundary_thresholds(rng, runs):
    """(rho, delta) equal to the exact Cov and Delta of a random labelled capability, so that decisions
    sit on the threshold (e.g. 3/5 - 2/5 = 0.19999999999999996 in floats against delta = 0.2)."""
    lists = rng.choice([lists for run in runs for lists in run.labels.values()] or [None])
    if lists is None:
        return 0.0, 0.0
    lf, pf = len(lists["lacking_failed"]), len(lists["present_failed"])
    lp, pp = len(lists["lacking_passed"]), len(lists["present_passed"])
    failed = lf + pf + len(lists["na_failed"])
    rho = Fraction(lf, failed) if failed else Fraction(0)
    delta = (Fraction(lf, lf + pf) if lf + pf else 0) - (Fraction(lp, lp + pp) if lp + pp else 0)
    return float(rho), float(delta)


def test_pass_matrix_agrees_with_run_stats_loop():
    rng = random.Random(20240601)
    for _ in range(200):
        runs, names = random_runs(rng)
        for policy in ("zero", "fail"):
            rho, delta = boundary_thresholds(rng, runs)
            settings = SelectionSettings(rho=rho, delta=delta, k=1, undefined_rate=policy)
            loop = np.array(
                [
                    [
                        name in run.labels
                        and run_stats(run.labels[name], run.total_failed, rho, delta, policy)[0].passed
                        for run in runs
                    ]
                    for name in names
                ],
                dtype=bool,
            ).reshape(len(names), len(runs))
            vectorized = pass_matrix(runs, names, settings)
            assert vectorized.dtype == bool and vectorized.shape == (len(names), len(runs))
            assert np.array_equal(vectorized, loop)
            by_name = {c.name: c.n_runs_passed for c in aggregate(runs, {}, settings).all}
            assert [by_name.get(name, 0) for name in names] == vectorized.sum(axis=1).tolist()
