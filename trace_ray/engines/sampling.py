"""Next-token sampling from a batch of logits, each row with its own settings and random generator.

The log-prob returned for a token is its log-prob under the distribution it
was drawn from: the temperature-scaled softmax, renormalized over the top-p
nucleus when ``top_p < 1`` (what vLLM reports as ``processed_logprobs``, so
both engines agree). With ``top_p == 1`` it is the temperature-scaled
policy's log-prob over the whole vocabulary, which a trainer can recompute.
Greedy rows (temperature 0) report the unscaled log-prob.

A draw takes one uniform number from the row's generator and inverts the
cumulative distribution (of the vocabulary, or of the nucleus in order of
probability): a few passes over the vocabulary, where ``torch.multinomial``
draws one exponential number per vocabulary entry (1 ms for SmolLM2's 49k
tokens on this CPU) and a full sort for the nucleus took 3.4 ms a row. The
nucleus comes from the ``NUCLEUS_CANDIDATES`` most likely tokens when they
hold ``top_p`` of the mass, else from a full sort.
"""

from __future__ import annotations

import torch

NUCLEUS_CANDIDATES = 256


def nucleus(probs: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept probabilities, their token ids), most likely first: the smallest most-likely set whose mass reaches
    ``top_p``."""
    count = min(NUCLEUS_CANDIDATES, probs.shape[-1])
    sorted_probs, token_ids = torch.topk(probs, count)
    if count < probs.shape[-1] and float(sorted_probs.sum()) < top_p:  # the candidates fall short: all of them
        sorted_probs, token_ids = torch.sort(probs, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    keep = mass_before < top_p
    keep[0] = True
    return sorted_probs[keep], token_ids[keep]


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """The index drawn from ``probs`` (summing to about 1) with one uniform number: the first whose cumulative
    mass passes it."""
    cumulative = torch.cumsum(probs, dim=-1)
    target = float(torch.rand((), generator=generator)) * float(cumulative[-1])
    return min(int(torch.searchsorted(cumulative, torch.tensor([target]), right=True)), probs.shape[-1] - 1)


def scaled_logprobs(logits: torch.Tensor, temperatures: list[float]) -> torch.Tensor:
    """The log-softmax of each row of ``logits`` ([rows, vocab]) at its temperature (greedy rows: unscaled)."""
    scales = torch.tensor([temperature if temperature > 0 else 1.0 for temperature in temperatures])
    return torch.log_softmax(logits.float() / scales[:, None], dim=-1)


def sample_one(
    logprobs: torch.Tensor, temperature: float, top_p: float, generator: torch.Generator
) -> tuple[int, float]:
    """One token and its log-prob from a row of :func:`scaled_logprobs`, drawing at most one uniform number from
    ``generator`` (none for a greedy row)."""
    if temperature == 0:
        token = int(torch.argmax(logprobs))
        return token, float(logprobs[token])
    if top_p < 1:
        kept, token_ids = nucleus(logprobs.exp(), top_p)
        token = int(token_ids[draw(kept, generator)])
        return token, float(logprobs[token] - torch.log(kept.sum()))
    token = draw(logprobs.exp(), generator)
    return token, float(logprobs[token])
