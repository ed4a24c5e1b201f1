"""Synthetic capability environments on the τ²-bench targets: self-checks, tools, reward rule, generated data,
difficulty."""

from __future__ import annotations

import functools
import json

import pytest

pytest.importorskip("tau2", reason="tau2-bench is not installed: make install-tau2")

from environments.self_checks import do_nothing, oracle, play, run_self_checks  # noqa: E402
from environments.synthetic.factory import target_templates, template_environment  # noqa: E402
from environments.tau2.airline_templates import AIRLINE_TEMPLATES  # noqa: E402
from environments.tau2.package import agent_tools, domain_module  # noqa: E402
from environments.tau2.retail_templates import RETAIL_TEMPLATES  # noqa: E402
from environments.tau2.synthetic import (  # noqa: E402
    SPLIT_SEEDS,
    TEMPLATES,  # noqa: E402
    AirlineTemplateEnvironment,
    RetailTemplateEnvironment,
    Tau2TemplateEnvironment,
    make_task,
    score_task,
)
from environments.tau2.synthetic_data import airline, retail  # noqa: E402
from environments.tau2.synthetic_templates import Fact  # noqa: E402

PAPER_CAPABILITIES = {
    "structured_data_reasoning",
    "tool_calling_precision",
    "multi_step_task_completion",
    "precondition_verification",
}
CASES = [
    (domain, capability, difficulty)
    for domain, templates in TEMPLATES.items()
    for capability, template in templates.items()
    for difficulty in template.difficulties
]
MODELS = {"airline": airline.FlightDB, "retail": retail.RetailDB}


@functools.cache
def target_tools(domain: str) -> list[dict]:
    return [tool.schema for tool in agent_tools(domain_module(domain).get_environment())]


def _seeds(count: int = 3) -> list[int]:
    return list(SPLIT_SEEDS["analysis"][:count])


def _replay(env: Tau2TemplateEnvironment, seed: int, final_reply: str | None = None) -> tuple[float, dict]:
    """The oracle, its final reply replaced by ``final_reply`` when given."""
    env.reset(seed)
    while True:
        message = env.oracle_message()
        if final_reply is not None and env.log.turns == len(env.task.oracle) - 1:
            message = {"role": "assistant", "content": final_reply}
        result = env.step(message)
        if result.done:
            return result.reward, result.info


def test_both_targets_have_the_paper_capabilities_and_information_reporting():
    for templates in (AIRLINE_TEMPLATES, RETAIL_TEMPLATES):
        assert set(templates) == PAPER_CAPABILITIES | {"information_reporting"}
        for name, template in templates.items():
            assert template.capability == name and template.description
            assert len(template.difficulties) >= 2 and template.default_difficulty in template.difficulties
    assert target_templates("tau2_airline") is AIRLINE_TEMPLATES and target_templates("tau2_retail") is RETAIL_TEMPLATES
    assert isinstance(
        template_environment("tau2_airline", "tool_calling_precision", 2, max_turns=30), AirlineTemplateEnvironment
    )
    assert isinstance(template_environment("tau2_retail", "tool_calling_precision", 1), RetailTemplateEnvironment)


@pytest.mark.parametrize("domain,capability,difficulty", CASES)
def test_every_template_passes_the_self_checks(domain, capability, difficulty):
    results = run_self_checks(
        lambda: Tau2TemplateEnvironment(capability, difficulty, domain=domain), _seeds(), target_tools(domain)
    )
    assert all(result.passed for result in results), [result for result in results if not result.passed]
    names = {result.name for result in results}
    assert "capability necessary (broken step scores < 1.0)" in names and "tools match the target's" in names


@pytest.mark.parametrize("domain", list(TEMPLATES))
def test_the_oracle_follows_the_policy_one_call_a_turn_and_asks_before_writing(domain):
    writes = ("cancel_", "modify_", "update_", "exchange_", "return_", "book_", "send_")
    for capability, template in TEMPLATES[domain].items():
        for difficulty in template.difficulties:
            for seed in _seeds(2):
                task = make_task(domain, capability, difficulty, seed)
                assert all(len(message.get("tool_calls") or [None]) == 1 for message in task.oracle)
                names = [
                    message["tool_calls"][0]["function"]["name"] if message.get("tool_calls") else None
                    for message in task.oracle
                ]
                first_write = next(
                    (index for index, name in enumerate(names) if name and name.startswith(writes)), None
                )
                assert (first_write is None) == (not task.writes)
                if first_write is not None:
                    assert any("?" in (message.get("content") or "") for message in task.oracle[:first_write]), (
                        capability,
                        difficulty,
                    )
                assert task.oracle[-1]["content"] and task.facts


@pytest.mark.parametrize("domain", list(TEMPLATES))
def test_the_tools_are_the_targets_schema_for_schema(domain):
    policy = domain_module(domain).get_environment().get_policy()
    for capability in TEMPLATES[domain]:
        env = Tau2TemplateEnvironment(capability, 1, domain=domain)
        reset = env.reset(_seeds(1)[0])
        assert reset.tools == target_tools(domain)
        assert reset.messages[0] == {"role": "system", "content": policy}


@pytest.mark.parametrize("domain", list(TEMPLATES))
def test_reward_rule_state_and_report(domain):
    env = Tau2TemplateEnvironment("multi_step_task_completion", 2, domain=domain)
    seed = _seeds(1)[0]
    reward, info = _replay(env, seed)
    assert reward == 1.0 and info["success"] and all(milestone["reached"] for milestone in info["milestones"])
    reward, info = _replay(env, seed, final_reply="All done.")  # right state, nothing reported
    assert reward == 0.3 and not info["success"]
    assert info["milestones"][0]["reached"] and not any(milestone["reached"] for milestone in info["milestones"][1:])
    assert len(info["milestones"]) == 1 + len(env.task.facts) >= 4
    reward, info = play(env, seed, do_nothing)  # the state is wrong
    assert reward == 0.0 and not info["milestones"][0]["reached"]


@pytest.mark.parametrize("domain", list(TEMPLATES))
def test_information_requests_score_only_when_reported(domain):
    env = Tau2TemplateEnvironment("information_reporting", 2, domain=domain)
    seed = _seeds(1)[0]
    assert not env.make_task(seed).writes
    assert _replay(env, seed)[0] == 1.0
    reward, info = _replay(env, seed, final_reply="I looked it all up for you.")
    assert reward == 0.0 and info["milestones"][0] == {"name": "the database is unchanged", "reached": True}


def test_score_task_cases():
    task = make_task("retail", "tool_calling_precision", 1, _seeds(1)[0])
    refund = next(fact for fact in task.facts if fact.amount is not None).amount
    told = f"Cancelled; ${refund:,.2f} will be refunded."
    assert score_task(task, task.expected_hash, told, 1.0)[0] == 1.0
    assert score_task(task, task.expected_hash, "Cancelled.", 1.0)[0] == 0.3
    assert score_task(task, task.initial_hash, told, 1.0)[0] == 0.0
    assert score_task(task, task.expected_hash, "Cancelled.", 0.3)[1]["success"]


def test_facts_match_amounts_to_the_cent_and_phrases_as_whole_words():
    amount = Fact("the fee", amount=1234.5)
    assert amount.found_in("The fee is $1,234.50.") and amount.found_in("1234.5 dollars")
    assert not amount.found_in("The fee is $1,234.55.") and not amount.found_in("$12345")
    status = Fact("the status", (("delayed",), ("HAT123",)))
    assert status.found_in("Flight HAT123 is Delayed.") and not status.found_in("Flight HAT1234 is delayed.")


@pytest.mark.parametrize("domain", list(TEMPLATES))
def test_generated_databases_validate_and_depend_on_the_seed_only(domain):
    first, second = _seeds(2)
    dumps = {}
    for capability in TEMPLATES[domain]:
        task = make_task(domain, capability, 2, first)
        database = MODELS[domain].model_validate_json(json.dumps(task.db))
        assert database.model_dump() == task.db
        make_task.cache_clear()
        assert make_task(domain, capability, 2, first).db == task.db
        assert make_task(domain, capability, 2, second).db != task.db
        dumps[capability] = task.db
    assert len({json.dumps(db, sort_keys=True) for db in dumps.values()}) == len(dumps)


def _complexity(domain: str, capability: str, difficulty: int, seed: int) -> int:
    """Records in the database plus oracle turns."""
    task = make_task(domain, capability, difficulty, seed)
    return sum(len(records) for records in task.db.values()) + len(task.oracle)


@pytest.mark.parametrize("domain", list(TEMPLATES))
def test_harder_difficulty_means_more_records_or_steps(domain):
    seeds = range(6)
    for capability, template in TEMPLATES[domain].items():
        means = [
            sum(_complexity(domain, capability, level, seed) for seed in seeds) / len(seeds)
            for level in template.difficulties
        ]
        assert all(easier < harder for easier, harder in zip(means, means[1:])), (capability, means)


def test_the_precondition_templates_break_by_acting_without_the_check():
    for domain in TEMPLATES:
        env = Tau2TemplateEnvironment("precondition_verification", 1, domain=domain)
        for seed in _seeds():
            task = env.make_task(seed)
            assert task.broken_turns and set(task.broken_turns) <= set(task.capability_turns)
            assert all(
                message["tool_calls"][0]["function"]["name"].startswith(("cancel", "modify"))
                for message in task.broken_turns.values()
            )


def test_scripted_user_confirms_only_unfinished_tasks():
    env = Tau2TemplateEnvironment("tool_calling_precision", 1, domain="airline")
    env.reset(_seeds(1)[0])
    result = env.step({"role": "assistant", "content": "Shall I go ahead?"})
    assert not result.done and result.messages == [{"role": "user", "content": "Yes, please go ahead."}]
    env = Tau2TemplateEnvironment("information_reporting", 1, domain="airline")
    env.reset(_seeds(1)[0])
    assert env.step({"role": "assistant", "content": "Anything else?"}).done


def test_seeds_and_fingerprints():
    env = Tau2TemplateEnvironment("structured_data_reasoning", 2, domain="airline")
    analysis, evaluation = env.task_seeds("analysis"), env.task_seeds("eval")
    assert not set(analysis) & set(evaluation) and env.train_seed(0) not in analysis + evaluation
    seed = analysis[0]
    env.reset(seed)
    other = Tau2TemplateEnvironment("structured_data_reasoning", 2, domain="airline")
    other.reset(seed)
    assert env.task_fingerprint() == other.task_fingerprint()
    other.reset(analysis[1])
    assert env.task_fingerprint() != other.task_fingerprint()
    assert play(env, seed, oracle)[0] == 1.0


def test_bad_inputs_name_the_fix():
    with pytest.raises(ValueError, match="templates: "):
        Tau2TemplateEnvironment("datetime_reasoning", 1, domain="airline")
    with pytest.raises(ValueError, match=r"not one of \[1, 2, 3\]"):
        Tau2TemplateEnvironment("tool_calling_precision", 7, domain="retail")
    with pytest.raises(ValueError, match="choose one of: airline, retail"):
        Tau2TemplateEnvironment("tool_calling_precision", 1, domain="telecom")
    with pytest.raises(ValueError, match="analysis and eval"):
        Tau2TemplateEnvironment("tool_calling_precision", 1, domain="retail").task_seeds("train")
