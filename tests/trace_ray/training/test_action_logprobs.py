"""Shared-prefix action log-probs: equal to running every trajectory whole, gradients included; lm_head only at
actions."""

from __future__ import annotations

import math
import random

import pytest
import torch

from tests.conftest import model_config
from trace_ray.config import LoRAConfig
from trace_ray.training.action_logprobs import (
    CHUNK_TOKENS,
    ActionLogprobs,
    PrefixGroup,
    ScoredRow,
    common_prefix,
    forward_cost,
    pack_micro_batches,
    prefix_groups,
)
from trace_ray.training.lora_model import lora_parameters, trainable_model

TEMPERATURE = 0.7
LORA = LoRAConfig(
    rank=8,
    alpha=16,
    dropout=0.0,
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
)


def policy_of(model: str):
    policy, _ = trainable_model(model_config(model), LORA, seed=0)
    generator = torch.Generator().manual_seed(1)
    for parameter in lora_parameters(policy):  # a random adapter, so that it changes the log-probs
        parameter.data = torch.randn(parameter.shape, generator=generator) * 0.02
    return policy.train()


@pytest.fixture(scope="module")
def tiny_policy():
    return policy_of("tiny_random")


def whole_sequence_logprobs(policy, rows: list[ScoredRow]) -> torch.Tensor:
    """The reference: every row run whole (right-padded), log-softmax of the full logits, read at the action tokens."""
    width = max(len(row.token_ids) for row in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    attention = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        ids[index, : len(row.token_ids)] = torch.tensor(row.token_ids)
        attention[index, : len(row.token_ids)] = 1
    logits = policy(input_ids=ids, attention_mask=attention, use_cache=False).logits
    logp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)) / TEMPERATURE, dim=-1)
    return torch.cat(
        [
            logp[index, [t - 1 for t in row.actions], [row.token_ids[t] for t in row.actions]]
            for index, row in enumerate(rows)
        ]
    )


def with_gradients(policy, compute) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The values, and the LoRA gradients of a fixed weighted sum of them."""
    policy.zero_grad(set_to_none=True)
    values = compute()
    (values * torch.linspace(-1.0, 1.0, values.numel(), dtype=values.dtype)).sum().backward()
    return values.detach(), [parameter.grad.clone() for parameter in lora_parameters(policy)]


def group_of(
    prompt: list[int], turns_per_member: list[list[tuple[list[int], list[int]]]], group: int
) -> list[ScoredRow]:
    """Members of one group: the shared ``prompt``, then per member its turns as (reply tokens, observation tokens)."""
    rows = []
    for turns in turns_per_member:
        ids, actions = list(prompt), []
        for reply, observation in turns:
            actions += range(len(ids), len(ids) + len(reply))
            ids += reply + observation
        rows.append(ScoredRow(ids, actions, group))
    return rows


def random_tokens(rng: random.Random, count: int) -> list[int]:
    return [rng.randrange(3, 2000) for _ in range(count)]


def cases() -> dict[str, list[ScoredRow]]:
    rng = random.Random(0)
    prompt_a, prompt_b = random_tokens(rng, 90), random_tokens(rng, 70)
    reply = lambda: random_tokens(rng, rng.randint(2, 11))  # noqa: E731
    same_first_turn = (reply(), random_tokens(rng, 6))
    return {
        "single-turn, unequal lengths": group_of(prompt_a, [[(reply(), [])] for _ in range(4)], 0),
        "multi-turn": group_of(prompt_a, [[(reply(), random_tokens(rng, 5)), (reply(), [])] for _ in range(3)], 0),
        "prefix is the whole first turn": group_of(prompt_b, [[same_first_turn, (reply(), [])] for _ in range(3)], 0),
        "two groups and a lone row": (
            group_of(prompt_a, [[(reply(), [])] for _ in range(3)], 0)
            + group_of(prompt_b, [[(reply(), [])] for _ in range(2)], 1)
            + group_of(prompt_b, [[(reply(), [])]], 2)
        ),
    }


@pytest.mark.parametrize("case", list(cases()))
def test_shared_prefix_equals_whole_sequences_with_gradients(tiny_policy, case):
    rows = cases()[case]
    scorer = ActionLogprobs(tiny_policy, TEMPERATURE)
    expected, expected_grads = with_gradients(tiny_policy, lambda: whole_sequence_logprobs(tiny_policy, rows))
    for shared in (True, False):
        found, grads = with_gradients(tiny_policy, lambda shared=shared: scorer(rows, shared_prefix=shared)[0])
        assert found.shape == expected.shape == (sum(len(row.actions) for row in rows),)
        assert torch.allclose(found, expected, atol=1e-5, rtol=0), (case, shared, (found - expected).abs().max())
        for mine, theirs in zip(grads, expected_grads):
            assert torch.allclose(mine, theirs, atol=1e-5, rtol=0), (case, shared, (mine - theirs).abs().max())
    assert max(gradient.abs().max() for gradient in expected_grads) > 1e-3  # the gradients compared are not all zero


def test_gradient_checkpointing_recomputes_layers_and_gives_the_same_log_probs_and_gradients(tiny_policy):
    rows = cases()["two groups and a lone row"]
    kept, kept_grads = with_gradients(tiny_policy, lambda: ActionLogprobs(tiny_policy, TEMPERATURE)(rows)[0])
    policy = policy_of("tiny_random")  # its own copy: checkpointing stays enabled on the model
    scorer = ActionLogprobs(policy, TEMPERATURE, gradient_checkpointing=True)
    calls = []
    # a replay may stop early
    hook = scorer.decoder.layers[0].register_forward_pre_hook(lambda module, inputs: calls.append(1))
    try:
        recomputed, grads = with_gradients(policy, lambda: scorer(rows)[0])
    finally:
        hook.remove()
    # two groups (a prefix run and a members' run each) and the lone row's plain run: 5 forwards of the first layer,
    # each replayed once in backward
    assert len(calls) == 2 * 5
    assert torch.allclose(kept, recomputed, atol=1e-6, rtol=0)
    for mine, theirs in zip(grads, kept_grads):
        assert torch.allclose(mine, theirs, atol=1e-6, rtol=0)


def test_micro_batches_are_packed_by_forward_tokens():
    group = [ScoredRow([1] * 100 + [k] * 10, [100], group=0) for k in range(2, 6)]  # 100 shared tokens, 10 own each
    # shared: 100 + 2 x 10 = 120 for two members, 100 + 4 x 10 = 140 for four; plain: 110 per row
    assert forward_cost(group[:2], shared_prefix=True) == 120 and forward_cost(group, shared_prefix=True) == 140
    assert forward_cost(group[:2], shared_prefix=False) == 220
    assert pack_micro_batches(group, 140, shared_prefix=True) == [[0, 1, 2, 3]]
    assert pack_micro_batches(group, 130, shared_prefix=True) == [[0, 1, 2], [3]]
    assert pack_micro_batches(group, 230, shared_prefix=False) == [[0, 1], [2, 3]]
    # a row over the budget goes alone
    assert pack_micro_batches(group, 50, shared_prefix=False) == [[0], [1], [2], [3]]
    uneven = [ScoredRow([1, 2, 3], [2]), ScoredRow([1] * 9, [8])]  # no group: padded to the longest, 2 x 9
    assert forward_cost(uneven, shared_prefix=True) == 18


def test_the_prefix_of_the_whole_first_turn_reaches_into_the_replies():
    rows = cases()["prefix is the whole first turn"]
    (group,) = prefix_groups(rows, shared_prefix=True)
    assert group.prefix > min(rows[0].actions)  # actions inside the shared prefix are scored from it


def test_the_reference_pass_disables_the_adapter(tiny_policy):
    rows = cases()["multi-turn"]
    scorer = ActionLogprobs(tiny_policy, TEMPERATURE)
    with torch.no_grad():
        reference = scorer(rows, reference=True)[0]
        with tiny_policy.disable_adapter():
            base = whole_sequence_logprobs(tiny_policy, rows)
        adapted = whole_sequence_logprobs(tiny_policy, rows)
    assert torch.allclose(reference, base, atol=1e-5, rtol=0)
    assert (reference - adapted).abs().max() > 1e-3  # the random adapter does change them


def test_lm_head_runs_at_action_positions_only(tiny_policy):
    rows = cases()["two groups and a lone row"]
    scorer = ActionLogprobs(tiny_policy, TEMPERATURE)
    seen = []
    hook = scorer.lm_head.register_forward_hook(lambda module, inputs, output: seen.append(tuple(inputs[0].shape)))
    try:
        with torch.no_grad():
            logprobs, entropies = scorer(rows)
    finally:
        hook.remove()
    actions = sum(len(row.actions) for row in rows)
    assert seen == [(actions, tiny_policy.config.hidden_size)] * 2  # log-probs, then entropies: one chunk each
    assert logprobs.shape == entropies.shape == (actions,)
    assert bool((entropies > 0).all())


def test_uniform_logits_give_log_vocabulary_entropy_and_log_probs():
    policy = policy_of("tiny_random")
    with torch.no_grad():
        policy.get_base_model().get_output_embeddings().weight.zero_()  # every logit 0: the uniform distribution
        logprobs, entropies = ActionLogprobs(policy, TEMPERATURE)(cases()["multi-turn"])
    vocabulary = policy.config.vocab_size
    assert torch.allclose(logprobs, torch.full_like(logprobs, -math.log(vocabulary)), atol=1e-5)
    assert torch.allclose(entropies, torch.full_like(entropies, math.log(vocabulary)), atol=1e-4)


def test_prefix_groups_cases():
    rows = [
        ScoredRow([1, 2, 3, 4, 5], [3, 4], group=0),
        ScoredRow([1, 2, 3, 9], [3], group=0),  # share [1, 2, 3]
        ScoredRow([1, 2], [1], group=1),
        ScoredRow([1, 2, 7], [2], group=1),  # [1, 2] is all of a row: capped at 1
        ScoredRow([5, 6, 7], [2], group=2),  # alone in its group
        ScoredRow([1, 2, 3, 4], [3], group=-1),  # no group
    ]
    assert prefix_groups(rows, shared_prefix=True) == [
        PrefixGroup([4, 5], 0),
        PrefixGroup([0, 1], 3),
        PrefixGroup([2, 3], 1),
    ]
    assert prefix_groups(rows, shared_prefix=False) == [PrefixGroup([0, 1, 2, 3, 4, 5], 0)]
    assert common_prefix([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2 and common_prefix([[4], [5]]) == 0


def test_long_action_runs_are_scored_in_chunks(tiny_policy):
    rng = random.Random(3)
    rows = group_of(random_tokens(rng, 20), [[(random_tokens(rng, CHUNK_TOKENS // 2 + 5), [])] for _ in range(3)], 0)
    scorer = ActionLogprobs(tiny_policy, TEMPERATURE)
    seen = []
    hook = scorer.lm_head.register_forward_hook(lambda module, inputs, output: seen.append(inputs[0].shape[0]))
    try:
        with torch.no_grad():
            found = scorer(rows)[0]
    finally:
        hook.remove()
    with torch.no_grad():
        expected = whole_sequence_logprobs(tiny_policy, rows)
    assert max(seen) == CHUNK_TOKENS and sum(seen) == 2 * found.numel()
    assert torch.allclose(found, expected, atol=1e-5, rtol=0)


@pytest.mark.integration  # the embedded model's weights
@pytest.mark.slow  # a forward of SmolLM2 per row and per group, in float64 too (the tiny model's version is not slow)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_smollm2_shared_prefix_equals_whole_sequences(dtype):
    """float64 with eager attention: the log-probs are equal to 1e-9 (measured 6e-14). The gradients to 1e-6 of the
    largest: the model computes its attention softmax and RMSNorm in float32 even in float64, and the shared path sums
    the members' gradients of the prefix before those float32 steps, the whole path after (measured 1.5e-6 of 8.7).
    float32 with SDPA (the training path): within float32's rounding of a 49k-way log-softmax of logits ~20 (gathering
    the hidden states before lm_head alone moves a log-prob by ~1.3e-5, and the rounding changes with the threads free):
    log-probs within 2e-4, gradients within 5e-5 of the largest gradient (measured: 2.3e-5, and 4.0e-5 on a loaded CI
    machine, on log-probs of -6 to -20; 4.3e-5, and 1.0e-4 loaded, on gradients up to 8.7). A wrong shared path is off
    by a share of the gradient itself, hundreds of times more."""
    policy = policy_of("smollm2_135m").to(dtype)
    if dtype == torch.float64:
        policy.get_base_model().set_attn_implementation("eager")
    rows = cases()["multi-turn"] + cases()["single-turn, unequal lengths"]
    scorer = ActionLogprobs(policy, TEMPERATURE)
    expected, expected_grads = with_gradients(policy, lambda: whole_sequence_logprobs(policy, rows))
    found, grads = with_gradients(policy, lambda: scorer(rows, shared_prefix=True)[0])
    scale = max(gradient.abs().max() for gradient in expected_grads)
    tolerances = ((1e-9, 0.0), (1e-6 * scale, 0.0)) if dtype == torch.float64 else ((2e-4, 0.0), (5e-5 * scale, 0.0))
    (atol, rtol), (grad_atol, grad_rtol) = tolerances
    assert torch.allclose(found, expected, atol=atol, rtol=rtol), (found - expected).abs().max()
    for mine, theirs in zip(grads, expected_grads):
        assert torch.allclose(mine, theirs, atol=grad_atol, rtol=grad_rtol), (mine - theirs).abs().max()
