from environments.device.environment import DeviceEnvironment
from environments.self_checks import run_self_checks, schema_problems


def by_name(results):
    return {result.name: result for result in results}


def test_device_environment_passes_every_self_check():
    env = DeviceEnvironment()
    seeds = env.task_seeds("analysis") + env.task_seeds("eval")
    results = run_self_checks(DeviceEnvironment, seeds)
    assert [result.name for result in results] == [
        "tool schemas valid", "oracle scores 1.0", "do-nothing agent scores < 1.0, mean <= 0.5",
        "wrong-action agent scores < 1.0, mean <= 0.5", "random-action agent mean <= 0.5", "rewards within [0, 1]",
        "same seed, same task", "different seeds, different tasks",
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

    def broken_oracle_message(self):
        return {"role": "assistant", "content": "Done."}


class NoCapability(DeviceEnvironment):
    """Claims a capability but its broken step is the oracle's own."""

    def broken_oracle_message(self):
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
    good = {"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}}}
    assert schema_problems([good]) == []
    bad_name = {"type": "function", "function": {"name": "has space", "parameters": {"type": "object", "properties": {}}}}
    bad_required = {"type": "function", "function": {"name": "g", "description": "d", "parameters": {"type": "object", "properties": {}, "required": ["y"]}}}
    bad_type = {"type": "function", "function": {"name": "h", "description": "d", "parameters": {"type": "object", "properties": {"z": {"type": "date"}}}}}
    problems = schema_problems([bad_name, bad_required, bad_type, good, good])
    assert len(problems) == 4
    assert any("has space" in p for p in problems)
    assert any("required ['y']" in p for p in problems)
    assert any("argument z has no valid type" in p for p in problems)
    assert any("defined twice" in p for p in problems)
