"""The rule-based labeler on τ²-bench: evidence from the gold actions, gold trajectories and broken variants."""

from __future__ import annotations

import functools
import json

import pytest

pytest.importorskip("tau2", reason="tau2-bench is not installed: make install-tau2")

from environments.tau2.capability_evidence import DETECTORS, tau2_capability_evidence  # noqa: E402
from environments.tau2.package import agent_tools, domain_module, fresh_environment, tau2_module  # noqa: E402
from environments.tool_environment import ToolError  # noqa: E402
from trace_ray.capabilities.rules import CATALOGUE, label_trajectories  # noqa: E402
from trace_ray.capabilities.trajectories import LACKING, NA, PRESENT, Trajectory  # noqa: E402

SDR, TCP, MULTI, PRE, REPORT = DETECTORS


@functools.cache
def tasks(domain: str) -> dict:
    return {task.id: task for task in domain_module(domain).get_tasks(None)}


@functools.cache
def evidence_of(domain: str, task_id: str) -> dict:
    return tau2_capability_evidence(domain, tasks(domain)[task_id])


# -- building trajectories ------------------------------------------------------------------
def gold(domain: str, task_id: str) -> list[tuple[str, dict]]:
    """The task's gold agent calls as (tool, arguments)."""
    actions = tasks(domain)[task_id].evaluation_criteria.actions
    return [(action.name, action.arguments) for action in actions if action.requestor == "assistant"]


def facts(domain: str, task_id: str) -> list[str]:
    return tasks(domain)[task_id].evaluation_criteria.communicate_info or []


def episode(domain: str, task_id: str, script: list[tuple[str, dict]], reply: str | None = None) -> Trajectory:
    """``script``'s calls run by the package's tools on a fresh database, then ``reply`` (default: every fact to
    tell)."""
    tools = {tool.name: tool.fn for tool in agent_tools(fresh_environment(domain))}
    messages = [{"role": "user", "content": tasks(domain)[task_id].user_scenario.instructions.reason_for_call}]
    for index, (name, arguments) in enumerate(script):
        call = {
            "id": f"call_{index}",
            "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments)},
        }
        try:
            result = tools[name](**arguments)
        except ToolError as exc:
            result = f"Error: {exc}"
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": call["id"], "content": result})
    reply = "Done. " + " ".join(facts(domain, task_id)) if reply is None else reply
    messages.append({"role": "assistant", "content": reply})
    milestones = [
        {"name": f"communicate_info:{index}", "reached": fact in reply}
        for index, fact in enumerate(facts(domain, task_id))
    ]
    return Trajectory(
        id=f"{domain}-{task_id}#0",
        task_id=f"{domain}-{task_id}",
        env="tau2",
        seed=0,
        family=domain,
        success=True,
        reward=1.0,
        messages=messages,
        reward_info={"milestones": milestones},
        termination="done",
    )


def labels(domain: str, task_id: str, script: list[tuple[str, dict]], reply: str | None = None) -> dict[str, str]:
    trajectory = episode(domain, task_id, script, reply)
    evidence = {trajectory.task_id: evidence_of(domain, task_id)}
    return {name: by_id[trajectory.id] for name, by_id in label_trajectories([trajectory], evidence, DETECTORS).items()}


def expected(domain: str, task_id: str, *lacking: str) -> dict[str, str]:
    """PRESENT for what the task needs, except ``lacking``; NA for the rest."""
    needs = evidence_of(domain, task_id)["needs"]
    assert set(lacking) <= set(needs)
    return {name: (LACKING if name in lacking else PRESENT) if name in needs else NA for name in DETECTORS}


def changed(script: list[tuple[str, dict]], tool: str, **changes) -> list[tuple[str, dict]]:
    return [(name, {**arguments, **changes} if name == tool else arguments) for name, arguments in script]


# -- the evidence ---------------------------------------------------------------------------
def test_detectors_are_the_papers_four_and_reporting():
    assert DETECTORS == [
        "structured_data_reasoning",
        "tool_calling_precision",
        "multi_step_task_completion",
        "precondition_verification",
        "information_reporting",
    ]
    assert set(DETECTORS) <= set(CATALOGUE)


def test_an_exchange_takes_the_named_order_and_items_read_from_results():
    evidence = evidence_of("retail", "0")  # "exchange ... of order #W2378156", items and payment read off results
    assert evidence["actions"] == [
        {
            "tool": "exchange_delivered_order_items",
            "arguments": {
                "order_id": "#W2378156",
                "item_ids": ["1151293680", "4983901480"],
                "new_item_ids": ["7706410293", "7747408585"],
                "payment_method_id": "credit_card_9513926",
            },
            "roles": {
                "order_id": "literal",
                "item_ids": "entity",
                "new_item_ids": "entity",
                "payment_method_id": "entity",
            },
            "requested": True,
        }
    ]
    checks = ["find_user_id_by_name_zip", "get_order_details", "get_product_details"]
    assert evidence["prechecks"] == {"exchange_delivered_order_items": checks}
    assert evidence["reports"] == evidence["choice_reports"] == evidence["failed_calls"] == []
    assert evidence["needs"] == [SDR, TCP, PRE]


def test_an_upgrade_and_two_cancellations_with_a_total_to_tell():
    # reservations XEHM4B and 59XX6W named; flights and card read off the reservation
    evidence = evidence_of("airline", "7")
    assert [(action["tool"], action["roles"]) for action in evidence["actions"]] == [
        (
            "update_reservation_flights",
            {"reservation_id": "literal", "cabin": "literal", "flights": "entity", "payment_id": "entity"},
        ),
        ("cancel_reservation", {"reservation_id": "literal"}),
        ("cancel_reservation", {"reservation_id": "literal"}),
    ]
    assert [action["arguments"]["reservation_id"] for action in evidence["actions"]] == ["XEHM4B", "XEHM4B", "59XX6W"]
    assert evidence["prechecks"] == {"update_reservation_flights": ["get_reservation_details"]}
    assert evidence["reports"] == ["communicate_info:0"] and evidence["choice_reports"] == []
    assert evidence["needs"] == DETECTORS


def test_facts_read_off_one_record_among_several_are_choice_reports():
    # the gift card's balance and the card brand, among the user's payment methods
    evidence = evidence_of("retail", "40")
    assert evidence["reports"] == evidence["choice_reports"] == ["communicate_info:0", "communicate_info:1"]
    assert evidence["actions"][0]["roles"] == {"order_id": "entity", "payment_method_id": "entity"}
    assert evidence["needs"] == [SDR, PRE, REPORT]


def test_a_failing_gold_read_is_recorded_and_skipped():
    evidence = evidence_of("retail", "2")  # reads product 6086499569, which is in no product
    assert evidence["failed_calls"] == [
        {"tool": "get_product_details", "arguments": {"product_id": "6086499569"}, "error": "Product not found"}
    ]
    assert [action["tool"] for action in evidence["actions"]] == ["return_delivered_order_items"]
    # a count, read off no record
    assert evidence["reports"] == ["communicate_info:0"] and evidence["choice_reports"] == []
    assert evidence["needs"] == [SDR, PRE, REPORT]


def test_a_task_without_writes_needs_only_what_it_reports():
    assert evidence_of("airline", "0")["needs"] == []  # the agent must refuse: nothing to change, nothing to tell
    assert evidence_of("airline", "3")["needs"] == [REPORT]


def test_evidence_is_plain_json_and_the_same_on_every_call():
    for domain, task_id in (("airline", "7"), ("retail", "0"), ("retail", "40")):
        evidence = tau2_capability_evidence(domain, tasks(domain)[task_id])
        assert json.loads(json.dumps(evidence)) == evidence
        assert tau2_capability_evidence(domain, tasks(domain)[task_id]) == evidence == evidence_of(domain, task_id)


def test_the_users_own_gold_actions_are_left_out():
    task = tasks("retail")["0"].model_copy(deep=True)
    action = tau2_module("data_model.tasks").Action(
        action_id="user_0", requestor="user", name="toggle_airplane_mode", arguments={}
    )
    task.evaluation_criteria.actions.insert(1, action)
    assert tau2_capability_evidence("retail", task) == evidence_of("retail", "0")


@pytest.mark.slow  # 164 replays, each on a fresh database: about 30 s on idle CPUs, a minute on busy ones
def test_every_task_of_both_domains_has_evidence():
    for domain in ("airline", "retail"):
        needed = set()
        for task in tasks(domain).values():
            evidence = tau2_capability_evidence(domain, task)
            assert set(evidence["needs"]) <= set(DETECTORS) and json.loads(json.dumps(evidence)) == evidence
            needed.update(evidence["needs"])
        assert needed == set(DETECTORS), domain


# -- gold trajectories ----------------------------------------------------------------------
GOLD_TASKS = [
    ("airline", "7"),
    ("airline", "38"),
    ("airline", "42"),
    ("retail", "0"),
    ("retail", "2"),
    ("retail", "31"),
    ("retail", "40"),
    ("retail", "43"),
    ("retail", "87"),
    ("retail", "13"),
]  # its gold makes a refund call the tool refuses


@pytest.mark.parametrize("domain, task_id", GOLD_TASKS)
def test_the_gold_trajectory_lacks_nothing(domain, task_id):
    assert labels(domain, task_id, gold(domain, task_id)) == expected(domain, task_id)


@pytest.mark.filterwarnings("ignore:Pydantic serializer warnings")  # the package stores the 2.0 bags as given
def test_arguments_compare_as_data_not_as_spelling():
    gold_exchange = dict(gold("retail", "0"))["exchange_delivered_order_items"]
    reordered = {name: value[::-1] if isinstance(value, list) else value for name, value in gold_exchange.items()}
    # the same pairs, listed the other way round
    script = changed(gold("retail", "0"), "exchange_delivered_order_items", **reordered)
    assert labels("retail", "0", script) == expected("retail", "0")
    script = changed(gold("airline", "12"), "update_reservation_baggages", total_baggages=2.0)
    assert labels("airline", "12", script) == expected("airline", "12")


# -- broken variants ------------------------------------------------------------------------
def test_a_wrong_literal_argument_lacks_precision():
    script = changed(gold("retail", "0"), "exchange_delivered_order_items", order_id="#W2378157")
    assert labels("retail", "0", script) == expected("retail", "0", TCP)
    script = changed(gold("airline", "7"), "update_reservation_flights", cabin="business")
    assert labels("airline", "7", script) == expected("airline", "7", TCP)


def test_a_wrong_entity_lacks_structured_data_reasoning():
    # a clicky full-size keyboard with white backlight: the user asked for RGB, else none
    script = changed(gold("retail", "0"), "exchange_delivered_order_items", new_item_ids=["6342039236", "7747408585"])
    assert labels("retail", "0", script) == expected("retail", "0", SDR)
    script = gold("airline", "42")
    # another of the user's reservations, not one to cancel
    script[-1] = ("cancel_reservation", {"reservation_id": "PUNERT"})
    assert labels("airline", "42", script) == expected("airline", "42", SDR)


def test_a_dropped_second_write_lacks_multi_step_completion():
    script = gold("airline", "42")[:-1]  # the second of two cancellations
    assert labels("airline", "42", script) == expected("airline", "42", MULTI)
    script = [(name, arguments) for name, arguments in gold("retail", "31") if name != "return_delivered_order_items"]
    assert labels("retail", "31", script) == expected("retail", "31", MULTI)


def test_a_write_without_the_preceding_read_lacks_precondition_verification():
    script = [(name, arguments) for name, arguments in gold("retail", "0") if name != "get_order_details"]
    assert labels("retail", "0", script) == expected("retail", "0", PRE)
    script = [(name, arguments) for name, arguments in gold("airline", "38") if name != "get_user_details"]
    assert labels("airline", "38", script) == expected("airline", "38", PRE)


def test_a_reply_without_the_facts_lacks_reporting():
    assert labels("retail", "2", gold("retail", "2"), reply="Your return is on its way.") == expected(
        "retail", "2", REPORT
    )
    # facts chosen among several records: a wrong choice lacks structured data reasoning as well
    wrong = labels("retail", "40", gold("retail", "40"), reply="Your balance is 0 and you paid by visa.")
    assert wrong == expected("retail", "40", SDR, REPORT)
