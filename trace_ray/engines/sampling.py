"""Next-token sampling from a batch of logits, each row with its own settings and random generator.

The log-prob returned for a token is its log-prob under the distribution it
was drawn from: the temperature-scaled softmax, renormalized over the top-p
nucleus when ``top_p < 1`` (what vLLM reports as ``processed_logprobs``, so
both engines agree). With ``top_p == 1`` it is the temperature-scaled
policy's log-prob over the whole vocabulary, which a trainer can recompute.
Greedy rows (temperature 0) report the unscaled log-prob.
"""

from __future__ import annotations

import torch


def nucleus(probs: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(kept probabilities, their token ids): the smallest most-likely set whose mass reaches ``top_p``."""
    sorted_probs, token_ids = torch.sort(probs, descending=True)
    mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
    keep = mass_before < top_p
    keep[0] = True
    return sorted_probs[keep], token_ids[keep]


def sample_next(
    logits: torch.Tensor, temperatures: list[float], top_ps: list[float], generators: list[torch.Generator]
) -> tuple[list[int], list[float]]:
    """One token and its log-prob per row of ``logits`` ([rows, vocab])."""
    logits = logits.float()
    tokens, logprobs = [], []
    for row, (temperature, top_p, generator) in enumerate(zip(temperatures, top_ps, generators)):
        if temperature == 0:
            row_logprobs = torch.log_softmax(logits[row], dim=-1)
            token = int(torch.argmax(row_logprobs))
            logprob = float(row_logprobs[token])
        else:
            row_logprobs = torch.log_softmax(logits[row] / temperature, dim=-1)
            kept, token_ids = nucleus(row_logprobs.exp(), top_p) if top_p < 1 else (row_logprobs.exp(), None)
            choice = int(torch.multinomial(kept, 1, generator=generator))
            token = choice if token_ids is None else int(token_ids[choice])
            logprob = float(row_logprobs[token] - (torch.log(kept.sum()) if top_p < 1 else 0.0))
        tokens.append(token)
        logprobs.append(logprob)
    return tokens, logprobs
