"""The synthetic capability templates on the device target: self-checks, capability necessity, difficulty, errors."""

from __future__ import annotations

import json
import random
import re

import pytest

from environments.device.capability_evidence import DETECTORS
from environments.device.draft import Draft
from environments.device.environment import DeviceEnvironment
from environments.device.phone_numbers import national_digits
from environments.device.synthetic import DeviceTemplateEnvironment, device_template
from environments.device.synthetic_templates import DIFFICULTIES, LEVEL_0_CAPABILITIES, TEMPLATES
from environments.self_checks import do_nothing, oracle, play, play_broken_oracle, run_self_checks, wrong_action
from trace_ray.capabilities.rules import CATALOGUE

CASES = [(capability, difficulty) for capability in TEMPLATES for difficulty in TEMPLATES[capability].difficulties]


def _seeds(capability: str, difficulty: int, count: int = 8) -> list[int]:
    return DeviceTemplateEnvironment(capability, difficulty).task_seeds("analysis")[:count]


def _replay(env: DeviceTemplateEnvironment, seed: int, messages: list[dict]) -> float:
    """Play a fixed list of assistant messages, then reply "Done." until the episode ends."""
    env.reset(seed)
    for message in messages:
        result = env.step(message)
        if result.done:
            return result.reward
    for _ in range(2):
        result = env.step({"role": "assistant", "content": "Done."})
        if result.done:
            return result.reward
    raise AssertionError("the episode did not end")


def test_there_is_one_template_per_catalogue_capability_with_its_description():
    assert sorted(TEMPLATES) == sorted(DETECTORS)  # one template per capability the device's detectors judge
    for name, template in TEMPLATES.items():
        assert template.capability == name
        assert template.description == CATALOGUE[name].description
        with_level_0 = template.capability in ("tool_calling_precision", "multi_step_task_completion")
        assert template.difficulties == ((0, 1, 2, 3, 4, 5) if with_level_0 else (1, 2, 3, 4, 5))
        assert template.default_difficulty in template.difficulties


@pytest.mark.parametrize("capability,difficulty", CASES)
def test_every_template_passes_the_self_checks_and_needs_its_capability(capability, difficulty):
    seeds = _seeds(capability, difficulty)
    results = run_self_checks(lambda: DeviceTemplateEnvironment(capability, difficulty), seeds)
    assert all(result.passed for result in results), [result for result in results if not result.passed]
    env = DeviceTemplateEnvironment(capability, difficulty)
    for seed in seeds:
        scenario = env.make_scenario(seed)
        assert scenario.capability_turns, f"seed {seed}: no capability step marked"
        assert all(0 <= turn < len(scenario.oracle) for turn in scenario.capability_turns)
        assert len(scenario.milestones) >= 2  # partial credit is possible
        rewards = {
            name: play(env, seed, policy)[0]
            for name, policy in (("oracle", oracle), ("do-nothing", do_nothing), ("wrong-action", wrong_action))
        }
        rewards["broken-oracle"] = play_broken_oracle(env, seed)[0]
        assert all(0.0 <= reward <= 1.0 for reward in rewards.values()), rewards
        assert rewards["oracle"] == 1.0
        assert rewards["broken-oracle"] < 1.0, f"seed {seed}: the task does not need {capability}"


def _half_oracle(env):
    """The oracle's first half, then a reply that ends the episode."""
    if env.log.turns < len(env.scenario.oracle) // 2:
        return env.oracle_message()
    return {"role": "assistant", "content": "Done."}


@pytest.mark.parametrize("capability", list(TEMPLATES))
def test_milestone_weights_give_partial_credit(capability):
    rewards = set()
    for difficulty in DIFFICULTIES:
        env = DeviceTemplateEnvironment(capability, difficulty)
        for seed in _seeds(capability, difficulty, 4):
            rewards |= {play(env, seed, _half_oracle)[0], play_broken_oracle(env, seed)[0]}
    assert any(0.0 < reward < 1.0 for reward in rewards), rewards


@pytest.mark.parametrize("capability", LEVEL_0_CAPABILITIES)
def test_level_1_half_the_time_needs_a_number_only_the_contact_search_gives(capability):
    env = DeviceTemplateEnvironment(capability, 1)
    dependent = 0
    for seed in _seeds(capability, 1, 16):
        scenario = env.make_scenario(seed)
        used = re.sub(r"\D", "", json.dumps(scenario.oracle))  # the send's number or the reply's
        wanted = [
            national_digits(contact.phone_number)
            for contact in scenario.state.contacts
            if national_digits(contact.phone_number) in used
        ]
        if not wanted:
            continue
        dependent += 1
        calls = [call["function"]["name"] for message in scenario.oracle for call in message.get("tool_calls") or []]
        assert "search_contacts" in calls and not any(
            number in re.sub(r"\D", "", scenario.request) for number in wanted
        ), scenario.request
    assert dependent >= 4, dependent


@pytest.mark.parametrize("capability", LEVEL_0_CAPABILITIES)
def test_level_0_changes_settings_only(capability):
    env = DeviceTemplateEnvironment(capability, 0)
    for seed in _seeds(capability, 0, 16):
        calls = [
            call["function"]["name"]
            for message in env.make_scenario(seed).oracle
            for call in message.get("tool_calls") or []
        ]
        assert calls and all(re.fullmatch(r"set_\w+_status", name) for name in calls), calls


def test_the_synthetic_environment_has_the_device_tools():
    def signature(tools):
        return [(tool["function"]["name"], tool["function"]["parameters"]) for tool in tools]

    device = signature(DeviceEnvironment().reset(0).tools)
    for capability in TEMPLATES:
        env = DeviceTemplateEnvironment(capability, 2)
        assert signature(env.reset(env.task_seeds("analysis")[0]).tools) == device


def _complexity(capability: str, difficulty: int, seed: int) -> int:
    """Oracle turns plus the records (contacts, messages, reminders) the template adds to the phone."""
    draft = Draft(random.Random(seed))
    before = len(draft.state.contacts) + len(draft.state.messages) + len(draft.state.reminders)
    TEMPLATES[capability].build(draft, difficulty)
    after = len(draft.state.contacts) + len(draft.state.messages) + len(draft.state.reminders)
    return len(draft.oracle) + after - before


@pytest.mark.parametrize("capability", list(TEMPLATES))
def test_difficulty_adds_steps_or_distractors(capability):
    seeds = range(16)
    means = [
        sum(_complexity(capability, difficulty, seed) for seed in seeds) / len(seeds) for difficulty in DIFFICULTIES
    ]
    assert all(easier <= harder for easier, harder in zip(means, means[1:])), means
    assert means[-1] > means[0], means


def test_same_seed_same_task_across_instances_and_difficulties_differ():
    for capability in TEMPLATES:
        seed = _seeds(capability, 3)[0]
        first, second = DeviceTemplateEnvironment(capability, 3), DeviceTemplateEnvironment(capability, 3)
        assert first.make_scenario(seed).request == second.make_scenario(seed).request
        assert repr(first.make_scenario(seed)) == repr(second.make_scenario(seed))
        assert DeviceTemplateEnvironment(capability, 1).make_scenario(seed).request != first.make_scenario(seed).request


def test_unknown_capability_and_difficulty_are_clear_errors():
    with pytest.raises(ValueError, match="no device template for capability 'nope'; templates: .*datetime_reasoning"):
        DeviceTemplateEnvironment("nope", 2)
    with pytest.raises(ValueError, match="no device template"):
        device_template("nope")
    with pytest.raises(ValueError, match=r"difficulty 9 of 'datetime_reasoning' is not one of \[1, 2, 3, 4, 5\]"):
        DeviceTemplateEnvironment("datetime_reasoning", 9)
    for template in TEMPLATES.values():
        with pytest.raises(ValueError, match=r"difficulty must be one of \[(0, )?1, 2, 3, 4, 5\], got 6"):
            template.build(Draft(random.Random(0)), 6)


# -- what each capability's step means ------------------------------------------------------
def _without(oracle_script: list[dict], turns) -> list[dict]:
    return [message for index, message in enumerate(oracle_script) if index not in set(turns)]


def test_permission_retry_without_the_fix_fails():
    for difficulty in DIFFICULTIES:
        env = DeviceTemplateEnvironment("permission_error_recovery", difficulty)
        for seed in _seeds("permission_error_recovery", difficulty, 4):
            scenario = env.make_scenario(seed)
            fixes = [scenario.oracle[turn]["tool_calls"][0]["function"]["name"] for turn in scenario.capability_turns]
            assert set(fixes) <= {"set_low_battery_mode_status", "set_cellular_service_status"}
            assert _replay(env, seed, _without(scenario.oracle, scenario.capability_turns)) < 1.0


def test_precondition_acting_without_asking_loses_credit():
    for difficulty in DIFFICULTIES:
        env = DeviceTemplateEnvironment("precondition_verification", difficulty)
        for seed in _seeds("precondition_verification", difficulty, 4):
            scenario = env.make_scenario(seed)
            question = [turn for turn in scenario.capability_turns if not scenario.oracle[turn].get("tool_calls")]
            assert len(question) == 1 and "?" in scenario.oracle[question[0]]["content"]
            assert _replay(env, seed, _without(scenario.oracle, question)) < 1.0


def test_structured_reporting_a_distractor_zeroes_the_score():
    env = DeviceTemplateEnvironment("structured_data_reasoning", 4)
    seed = next(seed for seed in env.task_seeds("analysis") if env.make_scenario(seed).request.startswith("What did"))
    scenario = env.make_scenario(seed)
    everything = " ".join(message.content for message in scenario.state.messages)
    answer = {"role": "assistant", "content": f"Here is everything: {everything}"}
    assert _replay(env, seed, [*scenario.oracle[:-1], answer]) == 0.0
    assert _replay(env, seed, scenario.oracle) == 1.0


def test_information_reporting_harder_means_more_facts():
    for difficulty, facts in zip(DIFFICULTIES, (1, 1, 2, 3, 4)):
        env = DeviceTemplateEnvironment("information_reporting", difficulty)
        for seed in _seeds("information_reporting", difficulty, 4):
            scenario = env.make_scenario(seed)
            reports = [milestone for milestone in scenario.milestones if milestone.weight == 2]
            assert len(reports) == facts
            assert scenario.capability_turns == (len(scenario.oracle) - 1,)
