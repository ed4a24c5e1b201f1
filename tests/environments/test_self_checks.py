import json
import threading
import time

import pytest

from environments.adversaries import DumpAgent, SprayAgent, play_adversary
from environments.device.environment import DeviceEnvironment
from environments.self_checks import run_self_checks, schema_problems


def by_name(results):
    return {result.name: result for result in results}


def test_device_environment_passes_every_self_check():
    env = DeviceEnvironment()
    seeds = env.task_seeds("analysis") + env.task_seeds("eval")
    results = run_self_checks(DeviceEnvironment, seeds)
    assert [result.name for result in results] == [
        "tool schemas valid",
        "oracle scores 1.0",
        "do-nothing agent scores < 1.0, mean <= 0.5",
        "wrong-action agent scores < 1.0, mean <= 0.5",
        "random-action agent mean <= 0.5",
        "dump agent scores < 1.0, mean <= 0.05",
        "spray agent scores < 1.0, mean <= 0.05",
        "rewards within [0, 1]",
        "same seed, same task",
        "different seeds, different tasks",
    ]
    assert all(result.passed for result in results), [r for r in results if not r.passed]


class SloppyOracle(DeviceEnvironment):
    """An environment whose oracle gives up after its first action."""

    def oracle_message(self):
        if self.log.turns == 0:
            return super().oracle_message()
        return {"role": "assistant", "content": "Done."}


class SameTaskEverySeed(DeviceEnvironment):
    def reset(self, seed):
        return super().reset(7)

    def task_fingerprint(self):
        return "constant"


def test_broken_environments_fail_the_checks_that_catch_them():
    seeds = list(range(14))
    sloppy = by_name(run_self_checks(SloppyOracle, seeds))
    assert not sloppy["oracle scores 1.0"].passed
    assert "failing seeds" in sloppy["oracle scores 1.0"].detail
    constant = by_name(run_self_checks(SameTaskEverySeed, seeds))
    assert not constant["different seeds, different tasks"].passed
    assert constant["same seed, same task"].passed


class GenerousScore(DeviceEnvironment):
    """Pays every agent in full, and a little more: weak agents and the reward range give it away."""

    def score(self):
        reward, info = super().score()
        return 1.1, info


class WrongTools(DeviceEnvironment):
    """Renames one tool and changes another's arguments."""

    def reset(self, seed):
        result = super().reset(seed)
        first, second = (dict(tool["function"]) for tool in result.tools[:2])
        first["name"] = "renamed_tool"
        second["parameters"] = {"type": "object", "properties": {}}
        result.tools[:2] = [{"type": "function", "function": first}, {"type": "function", "function": second}]
        return result

    def capability_turns(self):
        return [0]


class NoCapability(DeviceEnvironment):
    """Claims a capability but its broken step is the oracle's own."""

    def capability_turns(self):
        return [0]

    def broken_step(self, turn):
        return self.oracle_message()


def test_weak_agents_rewards_out_of_range_and_synthetic_checks_are_caught():
    seeds = list(range(14))
    generous = by_name(run_self_checks(GenerousScore, seeds))
    assert not generous["do-nothing agent scores < 1.0, mean <= 0.5"].passed
    assert not generous["random-action agent mean <= 0.5"].passed
    assert not generous["rewards within [0, 1]"].passed
    target = DeviceEnvironment().reset(0).tools
    wrong = by_name(run_self_checks(WrongTools, seeds, target_tools=target))
    assert not wrong["tools match the target's"].passed
    assert "renamed_tool" in wrong["tools match the target's"].detail
    assert "parameters differ" in wrong["tools match the target's"].detail
    unneeded = by_name(run_self_checks(NoCapability, seeds, target_tools=target))
    assert unneeded["tools match the target's"].passed
    assert not unneeded["capability necessary (broken step scores < 1.0)"].passed


def test_schema_problems_are_named():
    good = {
        "type": "function",
        "function": {
            "name": "f",
            "description": "d",
            "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
        },
    }
    assert schema_problems([good]) == []
    bad_name = {
        "type": "function",
        "function": {"name": "has space", "parameters": {"type": "object", "properties": {}}},
    }
    bad_required = {
        "type": "function",
        "function": {
            "name": "g",
            "description": "d",
            "parameters": {"type": "object", "properties": {}, "required": ["y"]},
        },
    }
    bad_type = {
        "type": "function",
        "function": {
            "name": "h",
            "description": "d",
            "parameters": {"type": "object", "properties": {"z": {"type": "date"}}},
        },
    }
    problems = schema_problems([bad_name, bad_required, bad_type, good, good])
    assert len(problems) == 4
    assert any("has space" in p for p in problems)
    assert any("required ['y']" in p for p in problems)
    assert any("argument z has no valid type" in p for p in problems)
    assert any("defined twice" in p for p in problems)


class PaysForLongReplies(DeviceEnvironment):
    """A grader that pays whoever says a lot: the dump agent farms it."""

    def score(self):
        reward, info = super().score()
        return (1.0 if sum(map(len, self.log.replies)) > 2000 else reward), info


class PaysForWrites(DeviceEnvironment):
    """A grader that pays any successful state change: the spray agent farms it (the dump agent never writes)."""

    def score(self):
        reward, info = super().score()
        writes = [
            call
            for call in self.log.tool_calls
            if call.ok and call.name.startswith(("set_", "add_", "send_", "modify_", "remove_"))
        ]
        return (1.0 if writes else reward), info


def test_farmable_graders_fail_the_farmer_checks():
    seeds = list(range(14))
    dump, spray = "dump agent scores < 1.0, mean <= 0.05", "spray agent scores < 1.0, mean <= 0.05"
    long_replies = by_name(run_self_checks(PaysForLongReplies, seeds))
    assert not long_replies[dump].passed and not long_replies[spray].passed
    assert "mean 1.000" in long_replies[dump].detail and "failing seeds: 0, 1, 2" in long_replies[dump].detail
    writes = by_name(run_self_checks(PaysForWrites, seeds))
    assert writes[dump].passed and not writes[spray].passed


def _first_action(agent_class, seed=0):
    env = DeviceEnvironment()
    agent = agent_class(env.reset(seed))
    return env, agent, agent.act([])


def test_the_dump_agent_reads_every_argument_free_tool_then_says_everything():
    env, agent, action = _first_action(DumpAgent)
    free = [
        tool["function"]["name"] for tool in env.reset(0).tools if not tool["function"]["parameters"].get("required")
    ]
    called = []
    while action.get("tool_calls"):
        called += [call["function"]["name"] for call in action["tool_calls"]]
        assert all(json.loads(call["function"]["arguments"]) == {} for call in action["tool_calls"])
        action = agent.act(env.step(action).messages)
    assert called == free and "search_contacts" in called and "get_current_timestamp" in called
    reply = action["content"]
    owner = env.scenario.state.owner
    assert env.scenario.request in reply and owner.phone_number in reply  # every observation
    for distractor in ("Wednesday", "October", "October 17", "31", "7:45 pm", "19:30", "yes", "no", "off", "$25.00"):
        assert distractor in reply.splitlines(), distractor


def test_the_spray_agent_calls_every_tool_with_seen_values():
    env = DeviceEnvironment()
    agent = SprayAgent(env.reset(3))
    action, calls = agent.act([]), []
    while action.get("tool_calls"):
        calls += [
            (call["function"]["name"], json.loads(call["function"]["arguments"])) for call in action["tool_calls"]
        ]
        action = agent.act(env.step(action).messages)
    names = {contact.name for contact in env.scenario.state.contacts}
    numbers = {contact.phone_number for contact in env.scenario.state.contacts}
    searched = [arguments["name"] for name, arguments in calls if name == "search_contacts" and "name" in arguments]
    # every name of the contact list it read (values seen under the argument's key come first)
    assert names <= set(searched)
    sent = [arguments["phone_number"] for name, arguments in calls if name == "send_message_with_phone_number"]
    assert numbers <= set(sent)
    assert {(name, arguments["on"]) for name, arguments in calls if name == "set_wifi_status"} == {
        ("set_wifi_status", True),
        ("set_wifi_status", False),
    }
    assert {name for name, _ in calls} == {tool["function"]["name"] for tool in env.reset(3).tools}
    assert play_adversary(DeviceEnvironment(), 3, SprayAgent) == 0.0


class OneEpisodeAtATime(DeviceEnvironment):
    """Fails if two threads ever use one instance; counts the episodes in flight across instances."""

    in_flight, most_in_flight, created, guard = 0, 0, 0, threading.Lock()

    def __init__(self):
        super().__init__()
        self.busy = threading.Lock()
        with OneEpisodeAtATime.guard:
            OneEpisodeAtATime.created += 1

    def step(self, message):
        if not self.busy.acquire(blocking=False):
            raise AssertionError("two threads stepped one environment at once")
        cls = OneEpisodeAtATime
        with cls.guard:
            cls.in_flight += 1
            cls.most_in_flight = max(cls.most_in_flight, cls.in_flight)
        try:
            time.sleep(0.002)  # an episode that waits, as a pytest subprocess does
            return super().step(message)
        finally:
            with cls.guard:
                cls.in_flight -= 1
            self.busy.release()


def test_workers_play_episodes_at_once_each_on_its_own_environment_with_the_same_results():
    seeds = list(range(12))
    decided, played = [], []
    one = run_self_checks(DeviceEnvironment, seeds)
    three = run_self_checks(OneEpisodeAtATime, seeds, workers=3, on_check=decided.append, on_episode=played.append)
    assert [(r.name, r.passed, r.detail) for r in three] == [(r.name, r.passed, r.detail) for r in one]
    assert decided == three  # every check reported, in order, as it was decided
    agents = ["oracle", "do-nothing", "wrong-action", "random-action", "dump", "spray"]
    assert sorted(set(played)) == sorted(agents) and all(played.count(agent) == len(seeds) for agent in agents)
    assert OneEpisodeAtATime.most_in_flight >= 2
    assert OneEpisodeAtATime.created <= 2 + 2  # the checks' own two, which serve one worker, and one per other worker
    OneEpisodeAtATime.created = 0
    run_self_checks(OneEpisodeAtATime, seeds[:2])
    assert OneEpisodeAtATime.created == 2  # one worker plays on the checks' own environment: no third
    with pytest.raises(ValueError, match="workers must be >= 1"):
        run_self_checks(DeviceEnvironment, seeds, workers=0)


def test_check_agents_plays_the_named_agents_and_the_oracle_and_refuses_unknown_names(tmp_path, capsys):
    seeds = DeviceEnvironment().task_seeds("analysis")[:3]
    played = []
    results = run_self_checks(DeviceEnvironment, seeds, agents=["do-nothing", "spray"], on_episode=played.append)
    assert sorted(set(played)) == ["do-nothing", "oracle", "spray"] and len(played) == 9
    agent_checks = [r.name for r in results if " agent " in r.name or r.name.startswith("oracle")]
    assert agent_checks == [
        "oracle scores 1.0",
        "do-nothing agent scores < 1.0, mean <= 0.5",
        "spray agent scores < 1.0, mean <= 0.05",
    ]
    assert {"rewards within [0, 1]", "same seed, same task"} <= {r.name for r in results} and all(
        r.passed for r in results
    )
    with pytest.raises(
        ValueError, match="no self-check agent named nope; this environment's agents: do-nothing, wrong-action"
    ):
        run_self_checks(DeviceEnvironment, seeds, agents=["nope"])
    from trace_ray.app.cli import main

    assert main(["check-env", "env=device", "limit=1", "check_agents=[nope]"]) == 1
    err = capsys.readouterr().err
    assert "check_agents: no self-check agent named nope" in err and err.count("\n") == 1
