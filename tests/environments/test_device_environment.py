"""The device environment end to end: oracle, do-nothing agent, splits, determinism, blockers, clarification."""

from __future__ import annotations

import json
from collections import Counter

import pytest

from environments.device.clock import to_datetime
from environments.device.environment import DeviceEnvironment
from environments.device.scenarios import BENCHMARK_SEEDS, FAMILIES, MAX_SPLIT_SIZE, make_scenario
from environments.registry import make_environment
from trace_ray.config import DEVICE_MAX_SPLIT

TRAIN_SEEDS = [DeviceEnvironment().train_seed(index) for index in range(50)]


def _run_oracle(env: DeviceEnvironment, seed: int):
    env.reset(seed)
    while True:
        result = env.step(env.oracle_message())
        if result.done:
            return result


def _seed_of(family: str, predicate=lambda scenario: True) -> int:
    return next(
        seed for seed in BENCHMARK_SEEDS if make_scenario(seed).family == family and predicate(make_scenario(seed))
    )


def _call(name: str, **arguments) -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}],
    }


def test_registry_builds_the_environment_with_its_defaults():
    env = make_environment("device", max_turns=50, max_tool_calls_per_turn=8, success_threshold=1.0)
    assert isinstance(env, DeviceEnvironment)
    assert (env.max_turns, env.max_tool_calls_per_turn, env.success_threshold) == (50, 8, 1.0)


def test_splits_are_fixed_disjoint_and_hold_every_family():
    env = DeviceEnvironment()
    analysis, evaluation = env.task_seeds("analysis"), env.task_seeds("eval")
    assert len(analysis) == len(evaluation) == 64 and not set(analysis) & set(evaluation)
    assert not set(TRAIN_SEEDS) & set(analysis + evaluation)
    assert len(set(TRAIN_SEEDS)) == 50
    for seeds in (analysis, evaluation):
        counts = Counter(make_scenario(seed).family for seed in seeds)
        assert set(counts) == set(FAMILIES) and min(counts.values()) >= 9
    with pytest.raises(ValueError, match="train_seed"):
        env.task_seeds("train")
    with pytest.raises(ValueError, match="unknown split"):
        env.task_seeds("test")


@pytest.mark.parametrize("size", [1, 63, 64, 65, 256, 5_000, MAX_SPLIT_SIZE])
def test_larger_splits_keep_the_benchmark_seeds_first_and_never_meet_each_other_or_the_train_seeds(size):
    env = DeviceEnvironment(analysis_size=size, eval_size=size)
    analysis, evaluation = env.task_seeds("analysis"), env.task_seeds("eval")
    assert len(analysis) == len(set(analysis)) == len(evaluation) == len(set(evaluation)) == size
    assert analysis[:64] == list(BENCHMARK_SEEDS[:size])[:64] and evaluation[:64] == list(
        BENCHMARK_SEEDS[64 : 64 + size]
    )
    assert not set(analysis) & set(evaluation)
    # the train seeds at the largest index the run could ask for never reach a split's seeds
    train = {env.train_seed(index) for index in (0, 10 * MAX_SPLIT_SIZE)}
    assert min(train) > max(analysis + evaluation)
    if size >= 7 * 36:  # every family within one task of a seventh of the split
        for seeds in (analysis, evaluation):
            counts = Counter(FAMILIES[seed % len(FAMILIES)] for seed in seeds)
            # the 64 benchmark seeds and the range after them: one each
            assert max(counts.values()) - min(counts.values()) <= 2


def test_the_default_splits_are_the_benchmarks_and_a_split_size_out_of_range_is_refused():
    assert DEVICE_MAX_SPLIT == MAX_SPLIT_SIZE  # the config's bound is the environment's
    default, sized = DeviceEnvironment(), make_environment("device", eval_size=256)
    assert default.task_seeds("eval") == list(range(64, 128)) and default.task_seeds("analysis") == list(range(64))
    assert sized.task_seeds("eval")[64:66] == [300_000, 300_001] and sized.task_seeds("analysis") == default.task_seeds(
        "analysis"
    )
    for size in (0, MAX_SPLIT_SIZE + 1):
        with pytest.raises(ValueError, match="a device split holds 1 to"):
            DeviceEnvironment(eval_size=size).task_seeds("eval")


@pytest.mark.parametrize("seed", list(BENCHMARK_SEEDS) + TRAIN_SEEDS)
def test_oracle_scores_exactly_one_and_doing_nothing_does_not(seed):
    env = DeviceEnvironment()
    result = _run_oracle(env, seed)
    assert result.reward == 1.0, result.info
    assert result.info["success"] and result.info["termination"] == "agent_reply"
    assert env.log.turns == len(env.scenario.oracle)
    env.reset(seed)
    idle = env.step({"role": "assistant", "content": "OK."})
    assert idle.done and idle.reward < 1.0 and not idle.info["success"]


def test_reset_info_and_messages():
    env = DeviceEnvironment()
    result = env.reset(5)
    assert result.info == {"task_id": "device-5", "family": FAMILIES[5], "seed": 5}
    assert [message["role"] for message in result.messages] == ["system", "user"]
    assert "UTC" in result.messages[0]["content"] and result.messages[1]["content"] == make_scenario(5).request
    assert {tool["function"]["name"] for tool in result.tools} >= {
        "get_current_timestamp",
        "send_message_with_phone_number",
    }


def test_same_seed_same_episode_and_different_seeds_differ():
    first, second = DeviceEnvironment().reset(17), DeviceEnvironment().reset(17)
    assert (first.messages, first.tools, first.info) == (second.messages, second.tools, second.info)
    assert make_scenario(17) == make_scenario(17)
    requests = {make_scenario(seed).request for seed in BENCHMARK_SEEDS}
    assert len(requests) > 100
    assert make_scenario(3).state != make_scenario(10).state  # same family, different phone


def test_episodes_do_not_change_the_scenario():
    env = DeviceEnvironment()
    _run_oracle(env, 2)
    assert env.state != make_scenario(2).state
    assert env.scenario.state == make_scenario(2).state


def test_blocked_settings_really_block():
    seed = _seed_of("blocked_settings", lambda scenario: "wifi" in json.dumps(scenario.oracle[0]))
    env = DeviceEnvironment()
    env.reset(seed)
    refused = env.step(_call("set_wifi_status", on=True))
    assert refused.messages[0]["content"].startswith("Error: PermissionError")
    assert refused.info["tool_errors"][0]["name"] == "set_wifi_status"
    env.step(_call("set_low_battery_mode_status", on=False))
    assert env.step(_call("set_wifi_status", on=True)).messages[0]["content"] == "wifi is now on"
    done = env.step({"role": "assistant", "content": "Wifi is on."})
    assert done.reward == pytest.approx(3 / 4)  # did not mention low battery mode


def test_message_blocked_without_cellular_service():
    seed = _seed_of("message_contact", lambda scenario: not scenario.state.settings.cellular_service)
    env = DeviceEnvironment()
    env.reset(seed)
    for message in env.scenario.oracle[:2]:
        result = env.step(message)
    assert result.messages[0]["content"] == "Error: ConnectionError: no cellular service"


def test_some_relative_reminders_cross_day_month_and_year_boundaries():
    crossed = set()
    for seed in BENCHMARK_SEEDS:
        scenario = make_scenario(seed)
        if scenario.family == "relative_reminder":
            added = json.loads(scenario.oracle[-2]["tool_calls"][0]["function"]["arguments"])
            start, end = to_datetime(scenario.state.now), to_datetime(added["reminder_timestamp"])
            crossed.update(unit for unit in ("year", "month", "day") if getattr(start, unit) != getattr(end, unit))
    assert crossed == {"year", "month", "day"}


def test_ambiguous_contact_clarifies_and_wrong_contact_is_a_minefield():
    seed = _seed_of("ambiguous_contact")
    env = DeviceEnvironment()
    env.reset(seed)
    scenario = env.scenario
    env.step(scenario.oracle[0])
    matches = json.loads(env.log.tool_calls[0].result)
    assert len(matches) == 2 and matches[0]["name"].split()[0] == matches[1]["name"].split()[0]
    answer = env.step({"role": "assistant", "content": "Which one do you mean?"})
    assert not answer.done and answer.messages == [{"role": "user", "content": scenario.clarification}]
    target = json.loads(scenario.oracle[2]["tool_calls"][0]["function"]["arguments"])
    wrong = next(match["phone_number"] for match in matches if match["phone_number"] != target["phone_number"])
    env.step(_call("send_message_with_phone_number", phone_number=wrong, content=target["content"]))
    env.step(scenario.oracle[2])
    result = env.step({"role": "assistant", "content": "Sent. Anything else?"})  # a second question ends the episode
    assert result.done and result.reward == 0.0
    assert result.info["minefields_hit"] == ["texted someone else", "changed what the task did not ask for"]


def test_guessing_without_asking_loses_credit():
    seed = _seed_of("ambiguous_contact")
    env = DeviceEnvironment()
    env.reset(seed)
    env.step(env.scenario.oracle[0])
    env.step(env.scenario.oracle[2])
    result = env.step({"role": "assistant", "content": "Sent."})
    assert result.done and result.reward == pytest.approx(3 / 4)


def test_questions_end_the_episode_when_there_is_nothing_to_clarify():
    env = DeviceEnvironment()
    env.reset(_seed_of("simple_settings"))
    assert env.step({"role": "assistant", "content": "Which setting?"}).done


def test_asking_which_contact_earns_credit_only_when_the_question_names_them():
    seed = _seed_of("ambiguous_contact")
    for question, reward in (
        ("Which one do you mean?", 3 / 4),
        ("Do you mean {0} or {1}?", 1.0),
        ("{0}, {1} or {2}?", 3 / 4),
    ):
        env = DeviceEnvironment()
        env.reset(seed)
        env.step(env.scenario.oracle[0])
        matches = [match["name"] for match in json.loads(env.log.tool_calls[0].result)]
        other = next(
            contact.name
            for contact in env.scenario.state.contacts
            if contact.name not in matches and not contact.is_self
        )
        env.step({"role": "assistant", "content": question.format(*matches, other)})
        env.step(env.scenario.oracle[2])
        result = env.step({"role": "assistant", "content": "Sent."})
        assert result.done and result.reward == pytest.approx(reward), question


def test_partial_progress_earns_partial_credit():
    seed = _seed_of("relative_reminder")
    env = DeviceEnvironment()
    env.reset(seed)
    add = next(
        message
        for message in env.scenario.oracle
        if message.get("tool_calls") and message["tool_calls"][0]["function"]["name"] == "add_reminder"
    )
    arguments = json.loads(add["tool_calls"][0]["function"]["arguments"])
    env.step(
        _call(
            "add_reminder", content=arguments["content"], reminder_timestamp=arguments["reminder_timestamp"] + 2 * 86400
        )
    )
    result = env.step({"role": "assistant", "content": "Done."})
    assert result.reward == pytest.approx(1 / 3)  # the reminder's task (1), not its time (2)


def test_oracle_message_errors_outside_its_script():
    env = DeviceEnvironment()
    with pytest.raises(RuntimeError, match="reset"):
        env.oracle_message()
    _run_oracle(env, 0)
    with pytest.raises(RuntimeError, match="finished"):
        env.oracle_message()


def test_example_exchange_uses_one_device_tool():
    exchange = DeviceEnvironment().example_exchange()
    assert [message["role"] for message in exchange] == ["user", "assistant", "tool", "assistant"]
    call = exchange[1]["tool_calls"][0]
    assert call["function"]["name"] == "set_wifi_status" and exchange[2]["tool_call_id"] == call["id"]
    assert call["function"]["name"] in {tool["function"]["name"] for tool in DeviceEnvironment().reset(0).tools}
    env = DeviceEnvironment()
    env.reset(0)
    assert env.step(exchange[1]).messages[0]["content"] == exchange[2]["content"]  # the example shows the real result
