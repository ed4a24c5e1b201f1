"""``trace-ray synthesize``: environments per selected capability, self-checked and calibrated; bad inputs."""

import json

import pytest

from environments.device.facts import TextFact
from environments.device.milestones import All, Reported, SettingIs
from environments.device.synthetic_templates import TEMPLATES
from environments.errors import TraceRayError
from environments.synthetic.template import CapabilityTemplate
from tests.trace_ray.capabilities.test_llm_labeler import server  # noqa: F401  (the recorded OpenAI-compatible server)
from trace_ray.app import synthesize, train
from trace_ray.app.cli import main
from trace_ray.config_compose import compose_config

SETTINGS = ("wifi", "location_service", "cellular_service")


def switch_settings(draft, difficulty):
    """Turn ``difficulty`` settings on, then say which; the capability step is the last switch."""
    names = draft.rng.sample(SETTINGS, difficulty)
    for name in names:
        setattr(draft.state.settings, name, False)
        draft.milestone(f"{name} on", SettingIs(name, True), 2)
        draft.call(f"set_{name}_status", on=True)
    draft.mark_capability_step()
    draft.milestone(
        "reported", All((SettingIs(names[-1], True), Reported((TextFact((names[-1].replace("_", " "),)),))))
    )
    draft.say(f"I turned on {', '.join(n.replace('_', ' ') for n in names)}.")
    return f"Turn on {', '.join(n.replace('_', ' ') for n in names)}."


def no_oracle(draft, difficulty):
    """A template whose oracle does nothing: its self-checks must fail."""
    draft.state.settings.wifi = False
    draft.milestone("wifi on", SettingIs("wifi", True))
    draft.say("Done.")
    draft.mark_capability_step()
    return "Turn on wifi."


@pytest.fixture()
def templates(monkeypatch):
    monkeypatch.setitem(
        TEMPLATES,
        "switching",
        CapabilityTemplate("switching", "turn several settings on", switch_settings, (1, 2, 3), 1),
    )
    monkeypatch.setitem(
        TEMPLATES, "hopeless", CapabilityTemplate("hopeless", "an oracle that fails", no_oracle, (1, 2), 1)
    )


def write_selection(run_dir, *names):
    folder = run_dir / "capabilities"
    folder.mkdir(parents=True, exist_ok=True)
    entries = [{"name": name, "description": f"the {name} capability", "status": "PENDING"} for name in names]
    (folder / "selected.json").write_text(json.dumps(entries))


def scripted_rollouts(env, seeds, label):
    """A base model whose success falls with difficulty: p = 1 - d/5, spread over the seeds."""
    size = 4
    success_per_seed = round(size * (1 - env.difficulty / 5))
    return [[(1.0, True)] * success_per_seed + [(0.0, False)] * (size - success_per_seed) for _ in seeds]


def config_for(run_dir, *overrides):
    return compose_config(
        "synthesize",
        [
            f"run_dir={run_dir}",
            "model=tiny_random",
            "calibration.group_size=4",
            "calibration.num_seeds=3",
            "synthesis.self_check_seeds=6",
            *overrides,
        ],
    )


def test_calibration_picks_the_in_band_difficulty_and_marks_ready(tmp_path, templates, capsys):
    write_selection(tmp_path, "switching", "hopeless")
    synthesize.run(config_for(tmp_path), rollouts=scripted_rollouts)
    folder = tmp_path / "environments" / "switching"
    spec = json.loads((folder / "spec.json").read_text())
    # success 1 - d/5: d=1 0.8 too easy; the bracket [2, 3] bisects to 2: 0.6 of 4 rounds to 2/4 = 0.5, in band
    assert (spec["difficulty"], spec["in_band"], spec["source"], spec["target"]) == (2, True, "templates", "device")
    assert len(spec["self_check_seeds"]) == 6 and len(spec["calibration_seeds"]) == 3
    assert all(check["passed"] for check in spec["self_checks"])
    assert "capability necessary (broken step scores < 1.0)" in [check["check"] for check in spec["self_checks"]]
    calibration = json.loads((folder / "calibration.json").read_text())
    assert [r["difficulty"] for r in calibration["rounds"]] == [1, 2]
    assert [r["verdict"] for r in calibration["rounds"]] == ["too_easy", "in_band"]
    assert calibration["rounds"][1]["stats"]["success_rate"] == 0.5
    assert "| 1 | 1 |" in (folder / "calibration.md").read_text()
    statuses = {e["name"]: e for e in json.loads((tmp_path / "capabilities" / "selected.json").read_text())}
    assert statuses["switching"]["status"] == "READY" and statuses["switching"]["environment"] == "synthetic/switching"
    assert statuses["hopeless"]["status"] == "FAILED"
    assert "self-checks failed at difficulty 1" in statuses["hopeless"]["reason"]
    assert "oracle scores 1.0" in statuses["hopeless"]["reason"]
    # the environment is now usable by name, at its calibrated difficulty, and check-env runs the synthetic checks
    assert main(["check-env", "env=synthetic/switching", f"run_dir={tmp_path}"]) == 0
    assert "all 12 self-checks passed" in capsys.readouterr().out
    env_config = compose_config("score", ["env=synthetic/switching", f"run_dir={tmp_path}"]).env
    from trace_ray.environment_setup import environment_maker

    env = environment_maker(env_config)()
    assert env.difficulty == 2 and env.name == "synthetic/switching"


def easy_rollouts(env, seeds, label):
    """A base model that succeeds on every task at difficulties 1 and 2 and on 3 of 4 rollouts at 3: too easy
    everywhere."""
    successes = 4 if env.difficulty < 3 else 3
    return [[(1.0, True)] * successes + [(0.0, False)] * (4 - successes) for _ in seeds]


def test_a_capability_with_no_level_in_band_is_out_of_band_with_its_nearest_level(tmp_path, templates, capsys):
    write_selection(tmp_path, "switching")
    synthesize.run(config_for(tmp_path), rollouts=easy_rollouts)
    calibration = json.loads((tmp_path / "environments" / "switching" / "calibration.json").read_text())
    # 1 too easy -> bracket [2, 3] bisects to 2, too easy -> 3, too easy (success 3/4 = 0.75 > 0.6) -> bracket empty
    assert [(r["difficulty"], r["verdict"]) for r in calibration["rounds"]] == [
        (1, "too_easy"),
        (2, "too_easy"),
        (3, "too_easy"),
    ]
    [entry] = json.loads((tmp_path / "capabilities" / "selected.json").read_text())
    assert entry["status"] == "OUT_OF_BAND" and entry["environment"] == "synthetic/switching"
    # nearest: the most informative level; 1 and 2 have only all-success groups (informative 0), 3 has none (informative
    # 1).
    # At 3 every group is (1, 1, 1, 0): mean reward 3/4, success 3/4, no all-success and no all-zero group
    assert entry["nearest_level"] == {
        "difficulty": 3,
        "verdict": "too_easy",
        "mean_reward": 0.75,
        "success_rate": 0.75,
        "all_success_fraction": 0.0,
        "all_zero_fraction": 0.0,
        "reasons": ["mean reward 0.75 > 0.60", "success rate 0.75 > 0.60"],
    }
    assert "the nearest, 3, is too_easy (mean reward 0.75 > 0.60; success rate 0.75 > 0.60)" in entry["reason"]
    assert json.loads((tmp_path / "environments" / "switching" / "spec.json").read_text())["difficulty"] == 3
    out = capsys.readouterr().out
    assert "switching OUT_OF_BAND: no difficulty level tried was in the calibration band" in out
    assert "trace-ray train skips switching (OUT_OF_BAND) unless synthesis.accept_out_of_band=true" in out
    # train skips it, with the reason and the fix, unless told to accept it
    train_overrides = [f"run_dir={tmp_path}", "model=tiny_random"]
    with pytest.raises(
        TraceRayError, match="switching: OUT_OF_BAND.*synthesis.accept_out_of_band=true, or re-synthesize"
    ):
        train.train_jobs(compose_config("train", train_overrides))
    [job] = train.train_jobs(compose_config("train", [*train_overrides, "synthesis.accept_out_of_band=true"]))
    assert (job.name, job.env.name, job.env.capability) == ("switching", "synthetic", "switching")
    assert "switching: OUT_OF_BAND, trained anyway (synthesis.accept_out_of_band=true)" in capsys.readouterr().out


def test_synthesis_stops_once_enough_capabilities_are_trainable_and_one_without_grpo_signal_does_not_count(
    tmp_path,
    templates,
    monkeypatch,
    capsys,
):
    """In the order given, until synthesis.stop_after are trainable: an OUT_OF_BAND environment whose every calibration
    group scored 0 gives GRPO nothing to learn from, so it is neither counted nor trained, even when accepted."""
    for name in ("unlearnable", "switching_b"):
        monkeypatch.setitem(
            TEMPLATES, name, CapabilityTemplate(name, "turn several settings on", switch_settings, (1, 2, 3), 1)
        )

    def rollouts(env, seeds, label):
        return (
            [[(0.0, False)] * 4 for _ in seeds]
            if env.capability == "unlearnable"
            else scripted_rollouts(env, seeds, label)
        )

    write_selection(tmp_path, "switching_b", "unlearnable", "switching")
    overrides = [
        "synthesis.capabilities=[unlearnable,switching,switching_b]",
        "synthesis.stop_after=1",
        "synthesis.accept_out_of_band=true",
    ]
    synthesize.run(config_for(tmp_path, *overrides), rollouts=rollouts)
    statuses = {e["name"]: e["status"] for e in json.loads((tmp_path / "capabilities" / "selected.json").read_text())}
    assert statuses == {"unlearnable": "OUT_OF_BAND", "switching": "READY", "switching_b": "PENDING"}
    assert "1 capabilities trainable: switching_b left PENDING" in capsys.readouterr().out
    [job] = train.train_jobs(
        compose_config("train", [f"run_dir={tmp_path}", "model=tiny_random", "synthesis.accept_out_of_band=true"])
    )
    assert job.name == "switching"
    assert (
        "unlearnable: OUT_OF_BAND, skipped, too little GRPO signal (0.00 of its calibration groups informative"
        in capsys.readouterr().out
    )
    with_it = compose_config(
        "train",
        [
            f"run_dir={tmp_path}",
            "model=tiny_random",
            "synthesis.accept_out_of_band=true",
            "synthesis.train_without_signal=true",
        ],
    )
    assert sorted(job.name for job in train.train_jobs(with_it)) == ["switching", "unlearnable"]


def test_a_weak_signal_below_min_informative_fraction_is_neither_counted_nor_trained(
    tmp_path, templates, monkeypatch, capsys
):
    """One informative group in three (the last evidence run's information_reporting had one in four): trained when
    accepted, unless
    synthesis.min_informative_fraction asks for more; then synthesis goes on to the next capability."""
    monkeypatch.setitem(
        TEMPLATES, "weak", CapabilityTemplate("weak", "turn several settings on", switch_settings, (1, 2, 3), 1)
    )

    def rollouts(env, seeds, label):
        if env.capability != "weak":
            return scripted_rollouts(env, seeds, label)
        return [[(1.0, True)] + [(0.0, False)] * 3 if i == 0 else [(0.0, False)] * 4 for i, _ in enumerate(seeds)]

    accept = ["synthesis.accept_out_of_band=true", "synthesis.stop_after=1", "synthesis.capabilities=[weak,switching]"]
    write_selection(tmp_path, "weak", "switching")
    synthesize.run(config_for(tmp_path, *accept), rollouts=rollouts)
    statuses = {e["name"]: e["status"] for e in json.loads((tmp_path / "capabilities" / "selected.json").read_text())}
    assert statuses == {"weak": "OUT_OF_BAND", "switching": "PENDING"}  # one informative group counts by default

    strict = tmp_path / "strict"
    write_selection(strict, "weak", "switching")
    synthesize.run(config_for(strict, *accept, "synthesis.min_informative_fraction=0.5"), rollouts=rollouts)
    statuses = {e["name"]: e["status"] for e in json.loads((strict / "capabilities" / "selected.json").read_text())}
    assert statuses == {"weak": "OUT_OF_BAND", "switching": "READY"}
    train_overrides = [f"run_dir={strict}", "model=tiny_random", "synthesis.accept_out_of_band=true"]
    assert sorted(job.name for job in train.train_jobs(compose_config("train", train_overrides))) == [
        "switching",
        "weak",
    ]
    [job] = train.train_jobs(compose_config("train", [*train_overrides, "synthesis.min_informative_fraction=0.5"]))
    assert job.name == "switching"
    assert (
        "weak: OUT_OF_BAND, skipped, too little GRPO signal (0.33 of its calibration groups informative"
        in capsys.readouterr().out
    )


def test_min_informative_fraction_outside_0_1_is_a_config_error(tmp_path):
    with pytest.raises(TraceRayError, match=r"synthesis.min_informative_fraction must be in \[0, 1\], got 1.5"):
        compose_config("train", [f"run_dir={tmp_path}", "synthesis.min_informative_fraction=1.5"])


@pytest.mark.parametrize("start, rounds", [("default", [3]), ("easiest", [1, 2])])
def test_calibration_starts_at_the_default_or_the_easiest_level(tmp_path, monkeypatch, start, rounds):
    # success 1 - d/5 over 4 rollouts: d=3 rounds 1.6 up to 2/4, in band at once; d=1 is too easy, then 2 is in band
    monkeypatch.setitem(
        TEMPLATES,
        "switching",
        CapabilityTemplate("switching", "turn several settings on", switch_settings, (1, 2, 3), 3),
    )
    write_selection(tmp_path, "switching")
    synthesize.run(config_for(tmp_path, f"calibration.start={start}"), rollouts=scripted_rollouts)
    calibration = json.loads((tmp_path / "environments" / "switching" / "calibration.json").read_text())
    assert [r["difficulty"] for r in calibration["rounds"]] == rounds
    assert calibration["in_band"]


def test_every_capability_failing_is_an_error(tmp_path, templates):
    write_selection(tmp_path, "hopeless")
    with pytest.raises(TraceRayError, match="no capability got an environment"):
        synthesize.run(config_for(tmp_path), rollouts=scripted_rollouts)
    [entry] = json.loads((tmp_path / "capabilities" / "selected.json").read_text())
    assert entry["status"] == "FAILED"


@pytest.mark.parametrize(
    "setup, overrides, message",
    [
        (lambda d: None, [], "run trace-ray identify"),
        (lambda d: write_selection(d), [], "selects no capability; lower selection.rho"),
        (
            lambda d: write_selection(d, "juggling"),
            [],
            "env=device has no template for juggling; generate them with synthesis=llm",
        ),
        (lambda d: write_selection(d, "switching"), ["synthesis.capabilities=[juggling]"], "does not select"),
        (lambda d: write_selection(d, "switching"), ["env=synthetic/switching"], "env= names the target environment"),
    ],
)
def test_bad_inputs_are_one_line_errors(tmp_path, templates, capsys, setup, overrides, message):
    setup(tmp_path)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    assert main(["synthesize", f"run_dir={tmp_path}", "model=tiny_random", *overrides]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written


def test_synthetic_environment_without_spec_names_the_fix(tmp_path, capsys):
    assert main(["check-env", "env=synthetic/switching", f"run_dir={tmp_path}"]) == 1
    assert "run trace-ray synthesize" in capsys.readouterr().err


def test_llm_synthesis_needs_an_endpoint(tmp_path, capsys):
    write_selection(tmp_path, "switching")
    assert main(["synthesize", f"run_dir={tmp_path}", "synthesis=llm"]) == 1
    assert "synthesis.model" in capsys.readouterr().err


def test_calibration_with_the_base_model_on_ray(tmp_path, ray_session):
    """Real rollouts of a built-in template: the tiny random model on Ray rollout workers, two rounds at most."""
    write_selection(tmp_path, "information_reporting")
    config = config_for(
        tmp_path,
        "calibration.group_size=2",
        "calibration.num_seeds=2",
        "calibration.max_rounds=2",
        "model.sampling.max_new_tokens=8",
        "rollout.max_episode_tokens=32",
    )
    synthesize.run(config)
    calibration = json.loads((tmp_path / "environments" / "information_reporting" / "calibration.json").read_text())
    rounds = calibration["rounds"]
    # 8 new tokens of the random model hold no tool call and no reported fact: all 2 x 2 rollouts score 0 at every
    # level.
    # Mean 0 < 0.2, success 0 < 0.2, all-zero groups 2/2 = 1 > 0.2: too hard. Levels 1-5 start at 2; too hard leaves
    # the bracket [1], which is too hard too: the bracket is empty after 2 rounds. Neither is in band; both tie on
    # informative groups (0) and distance to the band's middle (0.4), so the easier level, 1, is kept.
    assert TEMPLATES["information_reporting"].difficulties == (1, 2, 3, 4, 5)
    assert (
        [round_["difficulty"] for round_ in rounds]
        == [TEMPLATES["information_reporting"].default_difficulty, 1]
        == [2, 1]
    )
    for round_ in rounds:
        stats = round_["stats"]
        assert (stats["n_groups"], stats["group_size"]) == (2, 2)
        assert (
            stats["mean_reward"],
            stats["success_rate"],
            stats["all_zero_fraction"],
            stats["informative_fraction"],
        ) == (0, 0, 1, 0)
        assert round_["verdict"] == "too_hard"
        assert round_["reasons"] == [
            "mean reward 0.00 < 0.20",
            "success rate 0.00 < 0.20",
            "all-zero groups 1.00 > 0.20",
        ]
    assert (calibration["difficulty"], calibration["in_band"]) == (1, False)
    [entry] = json.loads((tmp_path / "capabilities" / "selected.json").read_text())
    assert entry["status"] == "OUT_OF_BAND"


DEVICE_MODULE = '''\
"""A generated module that plays a device template (its tools are the device's, so they match the target's)."""
from environments.device.synthetic import DeviceTemplateEnvironment

DIFFICULTIES = (1, 2, 3)


def make_environment(difficulty, max_turns, max_tool_calls_per_turn, success_threshold):
    return DeviceTemplateEnvironment("information_reporting", difficulty, max_turns, max_tool_calls_per_turn, \
success_threshold)
'''


def test_llm_synthesis_admits_a_generated_module_and_plays_it_in_the_sandbox(tmp_path, server):  # noqa: F811 (the fixture, imported)
    write_selection(tmp_path, "reporting_from_scratch")
    server.reply("```python\nthis is not python\n```", f"```python\n{DEVICE_MODULE}```")
    # the module plays a device template, which imports more of the project than a generated module may (the
    # contract: environments.protocol, environments.tool_environment and the standard library), so it runs in the
    # weak sandbox; tests/environments/test_sandbox_hostile.py covers the strict one
    config = config_for(
        tmp_path,
        "synthesis=llm",
        f"synthesis.base_url={server.url}",
        "synthesis.model=writer",
        "synthesis.max_attempts=2",
        "synthesis.self_check_seeds=4",
        "synthesis.sandbox=weak",
    )
    synthesize.run(config, rollouts=scripted_rollouts)
    folder = tmp_path / "environments" / "reporting_from_scratch"
    spec = json.loads((folder / "spec.json").read_text())
    assert spec["sandbox"]["mode"] == "weak" and spec["isolation"].startswith("weak: ")  # recorded in the report
    assert (spec["source"], spec["module"], spec["difficulties"]) == ("llm", "module.py", [1, 2, 3])
    assert (folder / "module.py").read_text() == DEVICE_MODULE
    log = (folder / "check_log.md").read_text()
    assert "attempt 1" in log.lower() and "admitted" in log
    assert "Your module was rejected" in server.requests[1]["body"]["messages"][-1]["content"]
    [entry] = json.loads((tmp_path / "capabilities" / "selected.json").read_text())
    assert entry["status"] == "READY"
    # through the sandbox
    assert main(["check-env", "env=synthetic/reporting_from_scratch", f"run_dir={tmp_path}"]) == 0
