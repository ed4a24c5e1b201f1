"""Next-token sampling: the nucleus, the reported log-probs, per-row generators."""

import math

import torch

from trace_ray.engines.sampling import nucleus, sample_one, scaled_logprobs


def generators(*seeds):
    return [torch.Generator().manual_seed(seed) for seed in seeds]


def test_nucleus_is_the_smallest_most_likely_set_reaching_top_p():
    probs = torch.tensor([0.1, 0.5, 0.05, 0.3, 0.05])
    kept, token_ids = nucleus(probs, 0.75)
    assert token_ids.tolist() == [1, 3] and torch.allclose(kept, torch.tensor([0.5, 0.3]))
    assert nucleus(probs, 0.01)[1].tolist() == [1]  # the most likely token always stays
    assert sorted(nucleus(probs, 1.0)[1].tolist()) == [0, 1, 2, 3, 4]


def sample_rows(logits, temperatures, top_ps, row_generators):
    """One (token, log-prob) per row of ``logits``, as the engine draws them."""
    logprobs = scaled_logprobs(logits, temperatures)
    return [
        sample_one(logprobs[row], temperature, top_p, generator)
        for row, (temperature, top_p, generator) in enumerate(zip(temperatures, top_ps, row_generators))
    ]


def test_logprob_is_that_of_the_distribution_sampled_from():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -3.0]] * 200)
    picks = sample_rows(logits, [0.5] * 200, [0.8] * 200, generators(*range(200)))
    probs = torch.softmax(logits[0] / 0.5, dim=-1)
    kept, token_ids = nucleus(probs, 0.8)
    assert {token for token, _ in picks} <= set(token_ids.tolist())  # nothing outside the nucleus is ever drawn
    for token, logprob in picks:
        assert math.isclose(logprob, math.log(probs[token] / kept.sum()), rel_tol=1e-5)
    [(token, logprob)] = sample_rows(logits[:1], [0.5], [1.0], generators(0))  # top_p = 1: the whole policy
    assert math.isclose(logprob, float(torch.log_softmax(logits[0] / 0.5, -1)[token]), rel_tol=1e-5)


def test_greedy_rows_take_the_argmax_with_its_unscaled_logprob_beside_sampled_rows():
    logits = torch.tensor([[0.0, 3.0, 1.0], [0.0, 3.0, 1.0]])
    (token, logprob), _ = sample_rows(logits, [0.0, 1.0], [1.0, 1.0], generators(0, 1))
    assert token == 1 and math.isclose(logprob, float(torch.log_softmax(logits[0], -1)[1]), rel_tol=1e-6)


def test_a_draw_takes_one_random_number_from_its_generator_and_a_greedy_pick_none():
    """What lets the engine verify drafts of sampled rows: the n-th token of a row is drawn with the n-th number of
    its generator, however many tokens a pass gives."""
    logprobs = scaled_logprobs(torch.zeros(1, 1000), [1.0])[0]
    for temperature, top_p, numbers_taken in [(1.0, 1.0, 1), (1.0, 0.5, 1), (0.0, 1.0, 0)]:
        used, fresh = generators(5, 5)
        sample_one(logprobs, temperature, top_p, used)
        for _ in range(numbers_taken):
            torch.rand((), generator=fresh)
        assert torch.rand((), generator=used) == torch.rand((), generator=fresh)
