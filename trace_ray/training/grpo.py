"""The GRPO math, pure torch (no Ray, no I/O): group advantages, minibatches, the clipped surrogate, the KL penalty.

The losses take per-trajectory tensors ``[B, A]`` of action-token quantities
(new and behavior log-probs, an action mask of 1 for the row's action tokens
and 0 for padding); ``action_logprobs.py`` computes the new log-probs.

"Old" log-probs are the behavior log-probs the sampler recorded (not a
recomputation with the current weights, which would make the ratio 1 and the
clipping a no-op).
"""

from __future__ import annotations

import torch

CONSTANT_GROUP_TOL = 1e-8
"""A group whose rewards span at most this much (max - min) counts as constant."""

LOG_RATIO_LIMIT = 20.0
"""Log-ratios on action tokens are clamped to +-this (ratio up to e^20 ~ 4.9e8) before
``exp``: a ratio that large only comes from a sampler/trainer mismatch, and the clamp
keeps one such token from turning the loss into inf/NaN (its gradient is cut)."""


# --------------------------------------------------------------------------- advantages


def group_advantages(
    rewards: torch.Tensor, normalize: str = "std", eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-relative advantages of ``rewards [G, K]`` (G groups of K rollouts of one seed).

    ``normalize="std"``: ``(r - mean_g) / (std_g + eps)`` with the *population* std
    (``unbiased=False``, divide by K): it is the group's own spread, so binary rewards
    with success share p give ``std = sqrt(p (1 - p))`` and ``[1, 0, 0, 1]`` maps to
    ``[1, -1, -1, 1]`` regardless of K (the unbiased std would only rescale all
    advantages by ``sqrt((K-1)/K)``). ``normalize="mean"``: ``r - mean_g``.

    A group is informative when ``max - min > 1e-8``; constant groups (identical up
    to float jitter) get advantage exactly 0 -- they carry no signal and the caller
    drops / re-collects them. The arithmetic runs in float64 so large rewards (1e6)
    do not lose small real differences to float32 rounding.

    Returns ``(advantages [G, K], informative [G] bool)``; advantages keep the
    rewards' floating dtype (float32 for integer rewards).
    """
    if normalize not in ("std", "mean"):
        raise ValueError(f"unknown normalize {normalize!r}; expected 'std' or 'mean'")
    if not isinstance(rewards, torch.Tensor):
        raise ValueError(f"rewards must be a torch.Tensor, got {type(rewards).__name__}")
    if rewards.dim() != 2 or rewards.shape[0] < 1 or rewards.shape[1] < 1:
        raise ValueError(f"rewards must have shape [G, K] with G, K >= 1, got {tuple(rewards.shape)}")
    if not (eps >= 0.0):
        raise ValueError(f"eps must be >= 0, got {eps}")
    r = rewards.detach().to(torch.float64)
    if not torch.isfinite(r).all():
        raise ValueError("rewards contain NaN or inf")
    informative = (r.max(dim=1).values - r.min(dim=1).values) > CONSTANT_GROUP_TOL
    centered = r - r.mean(dim=1, keepdim=True)
    if normalize == "std":
        centered = centered / (r.std(dim=1, unbiased=False, keepdim=True) + eps)
    advantages = torch.where(informative[:, None], centered, torch.zeros_like(centered))
    out_dtype = rewards.dtype if rewards.is_floating_point() else torch.float32
    return advantages.to(out_dtype), informative


# --------------------------------------------------------------------------- batching


def minibatches(n: int, size: int, generator: torch.Generator) -> list[torch.Tensor]:
    """Shuffled index batches of at most ``size`` covering 0..n-1 exactly once."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if size < 1:
        raise ValueError(f"minibatch size must be >= 1, got {size}")
    order = torch.randperm(n, generator=generator)
    return [order[i : i + size] for i in range(0, n, size)]


# --------------------------------------------------------------------------- losses


def _check_token_shapes(name: str, action_mask: torch.Tensor, **tensors: torch.Tensor) -> None:
    if action_mask.dim() != 2:
        raise ValueError(f"{name}: action_mask must be [B, A], got {tuple(action_mask.shape)}")
    for key, t in tensors.items():
        if t.shape != action_mask.shape:
            raise ValueError(f"{name}: {key} has shape {tuple(t.shape)}, action_mask {tuple(action_mask.shape)}")


def _trajectory_mean(per_token: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Token mean within each row over its action tokens, then mean over rows that have any.

    Rows without action tokens are left out of the mean (not NaN). With no action token
    at all the result is a zero that still belongs to the graph of ``per_token``.
    """
    counts = mask.sum(dim=1)
    has = counts > 0
    per_row = (per_token * mask).sum(dim=1) / counts.clamp(min=1.0)
    if not has.any():
        return (per_token * mask).sum() * 0.0
    return per_row[has].mean()


def policy_loss(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    action_mask: torch.Tensor,
    clip_low: float = 0.28,
    clip_high: float | None = None,
    importance_cap: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped GRPO surrogate, with an optional truncated importance weight.

    Per action token: ``rho_t = exp(new_t - old_t)``,
    ``l_t = -min(min(rho_t, importance_cap) A, clip(rho_t, 1 - clip_low, 1 + clip_high) A)``
    (``clip_high=None`` means ``clip_high = clip_low``; ``importance_cap=None``: no cap), with A the trajectory's
    advantage. The cap is the off-policy correction for rollouts sampled by an older adapter version
    (``grpo.max_staleness``): their ratio to the newer policy can be large, and on a token with A < 0 the
    clip bounds the ratio only from below, so ``rho_t A`` is unbounded; truncated at ``importance_cap``
    (> 1 + clip_high) its loss stays at most ``importance_cap |A|`` and its gradient is cut.
    Aggregation: token mean within each trajectory over its action tokens,
    then mean over trajectories (rows without action tokens are skipped), so a short
    and a long trajectory weigh the same.

    Shapes: ``new/old_logprobs, action_mask [B, A]``, ``advantages [B]``.
    Positions with mask 0 take no part: their log-ratio is replaced by 0 before
    ``exp`` (no overflow, zero gradient). Action-token log-ratios are clamped to
    +-``LOG_RATIO_LIMIT``.

    Stats (python floats, over all action tokens of the batch): ``clip_fraction``
    (share of tokens where the clipped term is the active one: A > 0 and
    rho > 1 + clip_high, or A < 0 and rho < 1 - clip_low), ``capped_fraction``
    (share of tokens where the cap is the active one: A < 0 and rho > importance_cap),
    ``approx_kl`` (the k3 estimator ``mean((rho - 1) - log rho)`` of KL(pi_old || pi_new)),
    ``ratio_mean``, ``ratio_max``, ``action_tokens``. With no action tokens: 0, 0, 0, 1, 1, 0.
    """
    if clip_high is None:
        clip_high = clip_low
    if not (0.0 < clip_low < 1.0):
        raise ValueError(f"clip_low must be in (0, 1), got {clip_low}")
    if not (clip_high > 0.0):
        raise ValueError(f"clip_high must be > 0, got {clip_high}")
    if importance_cap is not None and not importance_cap > 1.0 + clip_high:
        raise ValueError(f"importance_cap must be above 1 + clip_high = {1.0 + clip_high}, got {importance_cap}")
    _check_token_shapes("policy_loss", action_mask, new_logprobs=new_logprobs, old_logprobs=old_logprobs)
    if advantages.shape != (action_mask.shape[0],):
        raise ValueError(f"policy_loss: advantages must be [B]={action_mask.shape[0]}, got {tuple(advantages.shape)}")

    keep = action_mask > 0
    mask = keep.to(new_logprobs.dtype)
    old = old_logprobs.to(new_logprobs.dtype).detach()
    adv = advantages.to(new_logprobs.dtype).detach()[:, None]
    log_ratio = torch.where(keep, new_logprobs - old, torch.zeros_like(new_logprobs))
    log_ratio = log_ratio.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    ratio = torch.exp(log_ratio)
    unclipped = (ratio if importance_cap is None else ratio.clamp(max=importance_cap)) * adv
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * adv
    per_token = -torch.minimum(unclipped, clipped)
    loss = _trajectory_mean(per_token, mask)

    with torch.no_grad():
        n = int(keep.sum())
        if n == 0:
            stats = {
                "clip_fraction": 0.0,
                "capped_fraction": 0.0,
                "approx_kl": 0.0,
                "ratio_mean": 1.0,
                "ratio_max": 1.0,
                "action_tokens": 0.0,
            }
        else:
            r = ratio[keep]
            a = adv.expand_as(ratio)[keep]
            binds = ((a > 0) & (r > 1.0 + clip_high)) | ((a < 0) & (r < 1.0 - clip_low))
            capped = (a < 0) & (r > importance_cap) if importance_cap is not None else torch.zeros_like(binds)
            stats = {
                "clip_fraction": float(binds.float().mean()),
                "capped_fraction": float(capped.float().mean()),
                "approx_kl": float(((r - 1.0) - log_ratio[keep]).mean()),
                "ratio_mean": float(r.mean()),
                "ratio_max": float(r.max()),
                "action_tokens": float(n),
            }
    return loss, stats


def kl_penalty(new_logprobs: torch.Tensor, base_logprobs: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(pi_new || pi_base) on the sampled action tokens.

    Per token ``exp(base - new) - (base - new) - 1`` (>= 0, exactly 0 when equal),
    token mean per trajectory, then mean over trajectories with action tokens (the
    aggregation of ``policy_loss``). Masked positions take no part; the log-ratio is
    clamped to +-``LOG_RATIO_LIMIT``. Gradients flow to ``new_logprobs`` only.
    """
    _check_token_shapes("kl_penalty", action_mask, new_logprobs=new_logprobs, base_logprobs=base_logprobs)
    keep = action_mask > 0
    base = base_logprobs.to(new_logprobs.dtype).detach()
    d = torch.where(keep, base - new_logprobs, torch.zeros_like(new_logprobs))
    d = d.clamp(-LOG_RATIO_LIMIT, LOG_RATIO_LIMIT)
    per_token = torch.exp(d) - d - 1.0
    return _trajectory_mean(per_token, keep.to(new_logprobs.dtype))
