"""Next-token sampling: the nucleus, the reported log-probs, per-row generators."""

import math

import torch

from trace_ray.engines.sampling import nucleus, sample_next


def generators(*seeds):
    return [torch.Generator().manual_seed(seed) for seed in seeds]


def test_nucleus_is_the_smallest_most_likely_set_reaching_top_p():
    probs = torch.tensor([0.1, 0.5, 0.05, 0.3, 0.05])
    kept, token_ids = nucleus(probs, 0.75)
    assert token_ids.tolist() == [1, 3] and torch.allclose(kept, torch.tensor([0.5, 0.3]))
    assert nucleus(probs, 0.01)[1].tolist() == [1]  # the most likely token always stays
    assert sorted(nucleus(probs, 1.0)[1].tolist()) == [0, 1, 2, 3, 4]


def test_logprob_is_that_of_the_distribution_sampled_from():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -3.0]] * 200)
    tokens, logprobs = sample_next(logits, [0.5] * 200, [0.8] * 200, generators(*range(200)))
    probs = torch.softmax(logits[0] / 0.5, dim=-1)
    kept, token_ids = nucleus(probs, 0.8)
    assert set(tokens) <= set(token_ids.tolist())  # nothing outside the nucleus is ever drawn
    for token, logprob in zip(tokens, logprobs):
        assert math.isclose(logprob, math.log(probs[token] / kept.sum()), rel_tol=1e-5)
    [token], [logprob] = sample_next(logits[:1], [0.5], [1.0], generators(0))  # top_p = 1: the whole policy
    assert math.isclose(logprob, float(torch.log_softmax(logits[0] / 0.5, -1)[token]), rel_tol=1e-5)


def test_greedy_rows_take_the_argmax_with_its_unscaled_logprob_beside_sampled_rows():
    logits = torch.tensor([[0.0, 3.0, 1.0], [0.0, 3.0, 1.0]])
    tokens, logprobs = sample_next(logits, [0.0, 1.0], [1.0, 1.0], generators(0, 1))
    assert tokens[0] == 1 and math.isclose(logprobs[0], float(torch.log_softmax(logits[0], -1)[1]), rel_tol=1e-6)


def test_each_row_draws_from_its_own_generator():
    logits = torch.zeros(3, 1000)
    first, _ = sample_next(logits, [1.0] * 3, [1.0] * 3, generators(5, 6, 7))
    alone, _ = sample_next(logits[:1], [1.0], [1.0], generators(6))
    again, _ = sample_next(logits, [1.0] * 3, [1.0] * 3, generators(5, 6, 7))
    assert first == again and first[1] == alone[0] and len(set(first)) == 3
