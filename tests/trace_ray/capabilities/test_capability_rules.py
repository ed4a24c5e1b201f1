"""The rule-based labeler on the device environment: oracle episodes, broken variants, odd trajectories."""

from __future__ import annotations

import copy
import functools
import json

import pytest

from environments.capabilities import CAPABILITIES, CODE_REPAIR_CAPABILITIES
from environments.device.clock import clock_text, date_text, to_datetime
from environments.device.environment import DeviceEnvironment
from environments.device.scenarios import make_scenario
from environments.errors import TraceRayError
from environments.protocol import Environment
from trace_ray.capabilities.rules import CATALOGUE, label_trajectories
from trace_ray.capabilities.rules import DETECTORS as RULE_DETECTORS
from trace_ray.capabilities.trajectories import LACKING, NA, PRESENT, Trajectory

DETECTORS = DeviceEnvironment().capability_detectors()
ANALYSIS = DeviceEnvironment().task_seeds("analysis")


# -- building trajectories ------------------------------------------------------------------
def episode(seed: int, script: list[dict] | None = None, max_turns: int = 50) -> Trajectory:
    """Drive the device environment with ``script`` (default: the oracle) and view the finished episode as a
    Trajectory."""
    env = DeviceEnvironment(max_turns=max_turns)
    messages = list(env.reset(seed).messages)
    turns = iter(script) if script is not None else None
    while True:
        message = next(turns) if turns is not None else env.oracle_message()
        result = env.step(message)
        messages += [message, *result.messages]
        if result.done:
            break
    info = result.info
    return Trajectory(
        id=f"device-{seed}#0",
        task_id=f"device-{seed}",
        env="device",
        seed=seed,
        family=info["family"],
        success=info["success"],
        reward=result.reward,
        messages=messages,
        reward_info=info,
        termination=info["termination"],
    )


@functools.cache
def evidence_of(seed: int) -> dict:
    return DeviceEnvironment().capability_evidence(seed)


def labels(trajectory: Trajectory) -> dict[str, str]:
    evidence = {trajectory.task_id: evidence_of(trajectory.seed)}
    return {name: by_id[trajectory.id] for name, by_id in label_trajectories([trajectory], evidence, DETECTORS).items()}


def expected(seed: int, *lacking: str) -> dict[str, str]:
    """PRESENT for what the task needs, except ``lacking``; NA for the rest."""
    needs = evidence_of(seed)["needs"]
    assert set(lacking) <= set(needs)
    return {name: (LACKING if name in lacking else PRESENT) if name in needs else NA for name in DETECTORS}


def oracle(seed: int) -> list[dict]:
    return copy.deepcopy(make_scenario(seed).oracle)


def call(name: str, arguments: str | dict) -> dict:
    arguments = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": "c", "type": "function", "function": {"name": name, "arguments": arguments}}],
    }


def say(text: str) -> dict:
    return {"role": "assistant", "content": text}


def tool_of(message: dict) -> str | None:
    return message["tool_calls"][0]["function"]["name"] if message.get("tool_calls") else None


def arguments_of(script: list[dict], tool: str) -> dict:
    return json.loads(
        next(message for message in script if tool_of(message) == tool)["tool_calls"][0]["function"]["arguments"]
    )


def without(script: list[dict], *tools: str) -> list[dict]:
    return [message for message in script if tool_of(message) not in tools]


def with_arguments(script: list[dict], tool: str, **changes) -> list[dict]:
    return [
        call(tool, {**arguments_of([message], tool), **changes}) if tool_of(message) == tool else message
        for message in script
    ]


def replying(script: list[dict], text: str) -> list[dict]:
    return [*script[:-1], say(text)]


def task_where(holds) -> int:
    """The first analysis seed whose evidence satisfies ``holds``."""
    return next(seed for seed in ANALYSIS if holds(evidence_of(seed)))


def seed_of(family: str, needs: str | None = None) -> int:
    return task_where(lambda evidence: evidence["family"] == family and (needs is None or needs in evidence["needs"]))


PHONE_LOOKUP = next(seed for seed in ANALYSIS if make_scenario(seed).milestones[-1].name == "reported the phone number")


# -- the oracle ----------------------------------------------------------------------------------
def test_the_oracle_lacks_nothing_on_the_analysis_split():
    for seed in ANALYSIS:
        trajectory = episode(seed)
        assert trajectory.reward == 1.0 and trajectory.success
        assert labels(trajectory) == expected(seed), seed


def test_every_detector_is_needed_by_some_analysis_task():
    needed = {name for seed in ANALYSIS for name in evidence_of(seed)["needs"]}
    assert set(DETECTORS) == needed
    # the device's and code repair's, nothing else
    assert set(CATALOGUE) == set(DETECTORS) | set(CODE_REPAIR_CAPABILITIES)
    assert set(RULE_DETECTORS) == set(CAPABILITIES)  # one detector for each capability of the environments' catalogue
    assert all(CATALOGUE[name].description == CAPABILITIES[name] for name in CATALOGUE)


def test_tasks_that_do_not_need_a_capability_are_na():
    simple = labels(episode(seed_of("simple_settings")))
    assert simple == {name: PRESENT if name == "tool_calling_precision" else NA for name in DETECTORS}
    lookup = labels(episode(PHONE_LOOKUP))
    assert lookup == {name: PRESENT if name == "information_reporting" else NA for name in DETECTORS}


def test_evidence_is_plain_json_and_depends_on_the_seed_only():
    env = DeviceEnvironment()
    for seed in ANALYSIS[:14]:
        evidence = env.capability_evidence(seed)
        assert json.loads(json.dumps(evidence)) == evidence
        env.reset(seed + 1)
        assert env.capability_evidence(seed) == evidence
    blocked = env.capability_evidence(seed_of("blocked_settings"))
    assert [blocker["tool"] for blocker in blocked["blockers"]] == [
        action["tool"] for action in blocked["actions"] if action["requested"]
    ]
    reminder = env.capability_evidence(seed_of("relative_reminder"))
    assert reminder["prechecks"] == {"add_reminder": ["get_current_timestamp"]}


# -- permission_error_recovery -----------------------------------------------------------------
def test_skipping_the_fix_after_a_permission_error_lacks_recovery():
    seed = seed_of("blocked_settings")
    # its reply still says low battery mode was turned off, which is now false: the report is lacking too
    assert labels(episode(seed, without(oracle(seed), "set_low_battery_mode_status"))) == expected(
        seed,
        "permission_error_recovery",
        "information_reporting",
    )
    seed = task_where(
        lambda evidence: evidence["family"] == "message_contact" and "PermissionError" in str(evidence["blockers"])
    )
    assert labels(episode(seed, without(oracle(seed), "set_low_battery_mode_status"))) == expected(
        seed, "permission_error_recovery"
    )


# -- datetime_reasoning --------------------------------------------------------------------------
def test_a_wrong_reminder_timestamp_lacks_datetime_reasoning():
    seed = seed_of("relative_reminder")
    script = oracle(seed)
    wrong = with_arguments(
        script, "add_reminder", reminder_timestamp=arguments_of(script, "add_reminder")["reminder_timestamp"] + 3600
    )
    assert labels(episode(seed, wrong)) == expected(seed, "datetime_reasoning")


def test_a_wrong_reported_date_lacks_datetime_reasoning_and_reporting():
    seed = seed_of("lookup_report", "datetime_reasoning")
    script = oracle(seed)
    moment = to_datetime(arguments_of(script, "timestamp_to_datetime_info")["timestamp"] + 86400 + 3600)
    wrong = replying(script, f"Your reminder is set for {date_text(moment)} at {clock_text(moment)}.")
    assert labels(episode(seed, wrong)) == expected(seed, "datetime_reasoning", "information_reporting")


# -- tool_calling_precision ---------------------------------------------------------------------
def test_the_right_tool_with_a_wrong_argument_lacks_precision():
    seed = seed_of("simple_settings")
    script = oracle(seed)
    tool = tool_of(script[0])
    flipped = with_arguments(script, tool, on=not arguments_of(script, tool)["on"])
    assert labels(episode(seed, flipped)) == expected(seed, "tool_calling_precision")
    assert labels(episode(seed, [call(tool, "on: yes"), script[-1]])) == expected(seed, "tool_calling_precision")
    seed = task_where(lambda evidence: "add_contact" in [action["tool"] for action in evidence["actions"]])
    assert labels(episode(seed, with_arguments(oracle(seed), "add_contact", relationship="landlord"))) == expected(
        seed, "tool_calling_precision"
    )


def test_message_text_missing_a_required_word_lacks_precision():
    seed = seed_of("message_contact")
    wrong = with_arguments(oracle(seed), "send_message_with_phone_number", content="Hello there!")
    assert labels(episode(seed, wrong)) == expected(seed, "tool_calling_precision")


# -- multi_step_task_completion ----------------------------------------------------------------
def test_stopping_before_the_last_requested_action_lacks_multi_step_completion():
    seed = task_where(
        lambda evidence: len(evidence["actions"]) == 3 and evidence["actions"][-1]["tool"].startswith("set_")
    )
    script = oracle(seed)
    last = max(index for index, message in enumerate(script) if message.get("tool_calls"))
    assert labels(episode(seed, [*script[:last], script[-1]])) == expected(seed, "multi_step_task_completion")


# -- precondition_verification ------------------------------------------------------------------
def test_changing_state_without_the_required_check_lacks_precondition_verification():
    for family, check in (("message_contact", "search_contacts"), ("relative_reminder", "get_current_timestamp")):
        seed = seed_of(family)
        assert labels(episode(seed, without(oracle(seed), check))) == expected(seed, "precondition_verification"), (
            family
        )


def test_texting_before_asking_which_contact_lacks_precondition_verification():
    seed = seed_of("ambiguous_contact")
    script = oracle(seed)  # search, ask, send, reply
    assert labels(episode(seed, [script[0], script[2], script[3]])) == expected(seed, "precondition_verification")


# -- structured_data_reasoning ---------------------------------------------------------------------
def test_texting_the_wrong_contact_lacks_structured_data_reasoning():
    seed = seed_of("message_contact")
    script = oracle(seed)
    target = arguments_of(script, "send_message_with_phone_number")["phone_number"]
    other = next(
        contact
        for contact in make_scenario(seed).state.contacts
        if not contact.is_self and contact.phone_number != target
    )
    wrong = with_arguments(script, "send_message_with_phone_number", phone_number=other.phone_number)
    assert labels(episode(seed, wrong)) == expected(seed, "structured_data_reasoning")


def test_texting_the_other_namesake_lacks_structured_data_reasoning():
    seed = seed_of("ambiguous_contact")
    script = oracle(seed)
    first = arguments_of(script, "search_contacts")["name"]
    target = arguments_of(script, "send_message_with_phone_number")["phone_number"]
    other = next(
        contact
        for contact in make_scenario(seed).state.contacts
        if contact.name.startswith(first + " ") and contact.phone_number != target
    )
    wrong = with_arguments(script, "send_message_with_phone_number", phone_number=other.phone_number)
    assert labels(episode(seed, wrong)) == expected(seed, "structured_data_reasoning")


def test_reporting_an_older_message_lacks_structured_data_reasoning_and_reporting():
    seed = seed_of("lookup_report", "structured_data_reasoning")
    script = oracle(seed)
    sender = arguments_of(script, "search_messages").get("sender_phone_number")
    received = sorted(
        (message for message in make_scenario(seed).state.messages if sender in (None, message.sender_phone_number)),
        key=lambda message: message.creation_timestamp,
    )
    wrong = replying(script, f'The last one says: "{received[0].content}"')
    assert labels(episode(seed, wrong)) == expected(seed, "structured_data_reasoning", "information_reporting")


# -- information_reporting --------------------------------------------------------------------------
def test_right_state_but_nothing_or_a_wrong_fact_told_lacks_reporting():
    seed = seed_of("blocked_settings")
    assert labels(episode(seed, replying(oracle(seed), "Done, it is on now."))) == expected(
        seed, "information_reporting"
    )
    seed = PHONE_LOOKUP
    assert labels(episode(seed, replying(oracle(seed), "I found the contact."))) == expected(
        seed, "information_reporting"
    )
    assert labels(episode(seed, replying(oracle(seed), "It is +1-415-555-0000."))) == expected(
        seed, "information_reporting"
    )


# -- odd trajectories ------------------------------------------------------------------------------
def _all_lacking(seed: int) -> dict[str, str]:
    return expected(seed, *evidence_of(seed)["needs"])


def test_odd_trajectories_lack_every_needed_capability():
    for seed in ANALYSIS:
        tools = {action["tool"] for action in evidence_of(seed)["actions"]} or {"search_contacts"}
        malformed = [call(tool, "{not json") for tool in sorted(tools)] + [call("get_wifi_status", "[1]")]
        odd = [
            episode(seed, [say("Sorry, I can't help with that.")]),
            episode(seed, [*malformed, say("Done.")]),
            episode(seed, [call("get_wifi_status", {})], max_turns=1),
        ]
        for trajectory in odd:
            assert labels(trajectory) == _all_lacking(seed), (seed, trajectory.messages[2:])


def test_garbage_messages_never_crash_a_detector():
    seed = seed_of("compound_request")
    messages = [
        "not a message",
        None,
        {"role": "assistant", "tool_calls": "x"},
        {"role": "assistant", "tool_calls": [None, {"function": None}]},
        {"role": "assistant", "tool_calls": [{"function": {"name": 5, "arguments": 7}}]},
        {"role": "tool", "content": None},
        {"role": "assistant", "content": None},
    ]
    for reward_info in ({}, {"milestones": "x"}, {"milestones": [None, {"name": 3, "reached": True}]}):
        trajectory = Trajectory(
            "t#0",
            f"device-{seed}",
            "device",
            seed,
            "compound_request",
            False,
            0.0,
            messages,
            reward_info,
            "context_limit",
        )
        assert labels(trajectory) == _all_lacking(seed)


# -- the labeler's interface ------------------------------------------------------------------------
def test_label_trajectories_maps_capability_to_trajectory_id():
    trajectories = [episode(seed) for seed in ANALYSIS[:3]]
    evidence = {trajectory.task_id: evidence_of(trajectory.seed) for trajectory in trajectories}
    result = label_trajectories(trajectories, evidence, ["information_reporting", "tool_calling_precision"])
    assert list(result) == ["information_reporting", "tool_calling_precision"]
    assert list(result["information_reporting"]) == [trajectory.id for trajectory in trajectories]
    without_evidence = label_trajectories(trajectories, {}, ["tool_calling_precision"])
    assert without_evidence == {"tool_calling_precision": {trajectory.id: NA for trajectory in trajectories}}
    with pytest.raises(TraceRayError, match="unknown rule capabilities"):
        label_trajectories(trajectories, evidence, ["telepathy"])


def test_other_environments_default_to_no_detectors():
    env = DeviceEnvironment()
    assert Environment.capability_detectors(env) == [] and Environment.capability_evidence(env, 0) == {}
