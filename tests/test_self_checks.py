from environments.device.environment import DeviceEnvironment
from environments.self_checks import run_self_checks, schema_problems


def by_name(results):
    return {result.name: result for result in results}


def test_device_environment_passes_every_self_check():
    env = DeviceEnvironment()
    seeds = env.task_seeds("analysis") + env.task_seeds("eval")
    results = run_self_checks(DeviceEnvironment, seeds)
    assert len(results) == 6
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
