"""The pure GRPO math: every expected value is computed by hand in the comments."""

import math

import pytest
import torch

from trace_ray.training.grpo import LOG_RATIO_LIMIT, group_advantages, kl_penalty, minibatches, policy_loss

# --------------------------------------------------------------------------- group_advantages


def test_group_advantages_std_hand_example():
    # group 0: [1, 0, 0, 1] -> mean .5, population std .5 -> (r - .5) / (.5 + 1e-6) = +-1/(1 + 2e-6)
    # group 1: [2, 0, 0, 0] -> mean .5, deviations [1.5, -.5, -.5, -.5], var (2.25 + 3 * .25)/4 = .75,
    #          std sqrt(.75) = .8660254 -> [1.7320508, -.5773503, -.5773503, -.5773503]
    adv, informative = group_advantages(torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 0.0, 0.0, 0.0]]))
    expected = torch.tensor([[1.0, -1.0, -1.0, 1.0], [1.7320508, -0.5773503, -0.5773503, -0.5773503]])
    assert torch.allclose(adv, expected, atol=1e-5)
    assert informative.tolist() == [True, True]
    assert adv.dtype == torch.float32 and adv.shape == (2, 4)


def test_group_advantages_mean_mode():
    # [3, 1, 2] -> mean 2 -> [1, -1, 0]; [0, 0, 4] -> mean 4/3 -> [-4/3, -4/3, 8/3]
    adv, informative = group_advantages(torch.tensor([[3.0, 1.0, 2.0], [0.0, 0.0, 4.0]]), normalize="mean")
    assert torch.allclose(adv, torch.tensor([[1.0, -1.0, 0.0], [-4 / 3, -4 / 3, 8 / 3]]), atol=1e-6)
    assert informative.tolist() == [True, True]


def test_identical_rewards_give_zero_and_are_not_informative():
    # [.7, .7, .7] is constant -> exactly 0 in both modes; [1, 0] next to it is informative (+-1)
    rewards = torch.tensor([[0.7, 0.7, 0.7], [1.0, 0.0, 1.0]])
    for mode in ("std", "mean"):
        adv, informative = group_advantages(rewards, normalize=mode)
        assert informative.tolist() == [False, True]
        assert torch.equal(adv[0], torch.zeros(3))


def test_jitter_up_to_1e8_counts_as_constant():
    # 1e6 with +1e-12 jitter: max - min <= 1e-8 -> constant, advantages exactly 0
    huge = torch.tensor([[1e6, 1e6 + 1e-12, 1e6, 1e6 + 1e-12]], dtype=torch.float64)
    # 1e6 +- 2e-9 is representable in float64 (spacing ~1.2e-10): a real but sub-tolerance jitter
    huge_jitter = torch.tensor([[1e6, 1e6 + 2e-9, 1e6 - 2e-9]], dtype=torch.float64)
    assert float(huge_jitter.max() - huge_jitter.min()) > 0
    # around 0.3 with 1e-10 jitter: constant too (without the tolerance the std would be 5e-11
    # and the "advantages" +-1e-10/(5e-11 + 1e-6) ~ 1e-4: noise promoted to signal)
    tiny = torch.tensor([[0.3, 0.3 + 1e-10, 0.3 - 1e-10, 0.3]], dtype=torch.float64)
    for rewards in (huge, huge_jitter, tiny, torch.full((2, 5), 1e6)):
        adv, informative = group_advantages(rewards)
        assert not informative.any()
        assert torch.equal(adv, torch.zeros_like(adv))


def test_small_real_difference_is_informative_and_finite():
    # [0, 1e-3, 0, 1e-3]: mean 5e-4, std 5e-4 -> +-5e-4 / (5e-4 + 1e-6) = +-0.998004
    adv, informative = group_advantages(torch.tensor([[0.0, 1e-3, 0.0, 1e-3]]))
    assert informative.tolist() == [True]
    assert torch.isfinite(adv).all()
    assert torch.allclose(adv, torch.tensor([[-0.998004, 0.998004, -0.998004, 0.998004]]), atol=1e-5)
    # a real difference of 1 on top of 1e6 (float64): mean 1e6 + .5, std .5 -> +-1
    adv, informative = group_advantages(torch.tensor([[1e6, 1e6 + 1.0]], dtype=torch.float64))
    assert informative.tolist() == [True]
    assert torch.allclose(adv, torch.tensor([[-1.0, 1.0]], dtype=torch.float64), atol=1e-5)


def test_integer_rewards_give_float_advantages():
    adv, _ = group_advantages(torch.tensor([[1, 0]]))  # mean .5, std .5 -> [1, -1]
    assert adv.dtype == torch.float32
    assert torch.allclose(adv, torch.tensor([[1.0, -1.0]]), atol=1e-5)


@pytest.mark.parametrize("bad", [torch.zeros(4), torch.zeros(2, 3, 1), torch.zeros(0, 3), torch.zeros(2, 0)])
def test_group_advantages_rejects_bad_shapes(bad):
    with pytest.raises(ValueError):
        group_advantages(bad)


def test_group_advantages_rejects_unknown_mode_and_nan():
    with pytest.raises(ValueError, match="normalize"):
        group_advantages(torch.zeros(1, 2), normalize="rank")
    with pytest.raises(ValueError):
        group_advantages(torch.tensor([[1.0, float("nan")]]))


# --------------------------------------------------------------------------- policy_loss


def test_ratio_one_gives_minus_mean_advantage_and_no_clipping():
    # ratio 1 everywhere -> per-token loss -A; trajectories A = 2 and -1 -> loss -(2 - 1)/2 = -.5
    old = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, -0.3, -0.7]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])
    new = old.clone().requires_grad_(True)
    loss, stats = policy_loss(new, old, torch.tensor([2.0, -1.0]), mask)
    assert loss.item() == pytest.approx(-0.5, abs=1e-6)
    assert stats["clip_fraction"] == 0.0
    assert stats["approx_kl"] == pytest.approx(0.0, abs=1e-7)
    assert stats["ratio_mean"] == pytest.approx(1.0) and stats["ratio_max"] == pytest.approx(1.0)
    assert stats["action_tokens"] == 5.0
    loss.backward()
    # d loss / d new_t = -A rho_t / n_tokens / n_rows: row 0 -2 / 2 / 2 = -.5; row 1 +1 / 3 / 2 = 1/6
    assert torch.allclose(new.grad, torch.tensor([[-0.5, -0.5, 0.0], [1 / 6, 1 / 6, 1 / 6]]), atol=1e-6)


def test_positive_advantage_clipped_above_with_zero_gradient():
    # one token, A = 1, ratio 1.5, eps .2: min(1.5, 1.2) = 1.2 -> loss -1.2, gradient 0
    new = torch.tensor([[math.log(1.5)]], requires_grad=True)
    loss, stats = policy_loss(new, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), clip_low=0.2)
    assert loss.item() == pytest.approx(-1.2, abs=1e-6)
    assert stats["clip_fraction"] == 1.0
    # k3: (1.5 - 1) - ln 1.5 = .5 - .4054651 = .0945349
    assert stats["approx_kl"] == pytest.approx(0.0945349, abs=1e-6)
    assert stats["ratio_max"] == pytest.approx(1.5, abs=1e-6)
    loss.backward()
    assert new.grad.item() == 0.0


def test_negative_advantage_clipped_below_with_zero_gradient():
    # one token, A = -1, ratio .5, eps .2: min(-.5, -.8) = -.8 -> loss .8, gradient 0
    new = torch.tensor([[math.log(0.5)]], requires_grad=True)
    loss, stats = policy_loss(new, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1), clip_low=0.2)
    assert loss.item() == pytest.approx(0.8, abs=1e-6)
    assert stats["clip_fraction"] == 1.0
    loss.backward()
    assert new.grad.item() == 0.0


def test_clipping_does_not_bind_in_the_other_direction():
    # A = 1, ratio .5: min(.5, .8) = .5 (unclipped active) -> loss -.5, d/dnew = -A rho = -.5
    new = torch.tensor([[math.log(0.5)]], requires_grad=True)
    loss, stats = policy_loss(new, torch.zeros(1, 1), torch.tensor([1.0]), torch.ones(1, 1), clip_low=0.2)
    assert loss.item() == pytest.approx(-0.5, abs=1e-6)
    assert stats["clip_fraction"] == 0.0
    loss.backward()
    assert new.grad.item() == pytest.approx(-0.5, abs=1e-6)
    # A = -1, ratio 1.5: min(-1.5, -1.2) = -1.5 -> loss 1.5, not clipped
    loss, stats = policy_loss(
        torch.tensor([[math.log(1.5)]]), torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1), clip_low=0.2
    )
    assert loss.item() == pytest.approx(1.5, abs=1e-6) and stats["clip_fraction"] == 0.0


def test_the_importance_cap_truncates_a_stale_token_with_negative_advantage():
    # A = -1, ratios 3 and 1.5 against the behaviour policy, cap 2: token a's unclipped term -3 is truncated to -2
    # (loss 2, gradient cut), token b's -1.5 stays (loss 1.5, d/dnew = -A rho = 1.5); row mean (2 + 1.5)/2
    new = torch.log(torch.tensor([[3.0, 1.5]])).requires_grad_(True)
    loss, stats = policy_loss(new, torch.zeros(1, 2), torch.tensor([-1.0]), torch.ones(1, 2), 0.2, importance_cap=2.0)
    assert loss.item() == pytest.approx(1.75, abs=1e-6)
    assert stats["capped_fraction"] == pytest.approx(0.5) and stats["clip_fraction"] == 0.0
    loss.backward()
    assert torch.allclose(new.grad, torch.tensor([[0.0, 0.75]]), atol=1e-6)
    # uncapped, token a counts whole: (3 + 1.5)/2; with A > 0 the cap never acts (the clip at 1.2 does)
    assert policy_loss(new, torch.zeros(1, 2), torch.tensor([-1.0]), torch.ones(1, 2), 0.2)[0].item() == pytest.approx(
        2.25, abs=1e-6
    )
    ones = torch.ones(1, 2)
    positive, stats = policy_loss(new, torch.zeros(1, 2), torch.tensor([1.0]), ones, 0.2, importance_cap=2.0)
    assert positive.item() == pytest.approx(-1.2, abs=1e-6) and stats["capped_fraction"] == 0.0
    with pytest.raises(ValueError, match="importance_cap must be above 1 \\+ clip_high"):
        policy_loss(new, torch.zeros(1, 2), torch.tensor([1.0]), torch.ones(1, 2), 0.2, importance_cap=1.1)


def test_asymmetric_clip_range():
    # range [1 - .2, 1 + .28] = [.8, 1.28]
    # token a: A = 1, ratio 1.25 -> inside, term 1.25; token b: A = 1, ratio 1.5 -> clipped to 1.28
    # row 0 loss -(1.25 + 1.28)/2 = -1.265
    # token c: A = -1, ratio .7 -> clipped to .8, term -.8; token d: A = -1, ratio .85 -> inside, -.85
    # row 1 loss (.8 + .85)/2 = .825; total (-1.265 + .825)/2 = -.22; clipped tokens b, c -> 2/4
    new = torch.log(torch.tensor([[1.25, 1.5], [0.7, 0.85]]))
    loss, stats = policy_loss(
        new, torch.zeros(2, 2), torch.tensor([1.0, -1.0]), torch.ones(2, 2), clip_low=0.2, clip_high=0.28
    )
    assert loss.item() == pytest.approx(-0.22, abs=1e-6)
    assert stats["clip_fraction"] == pytest.approx(0.5)
    # symmetric .2 instead: token a -> 1.2, b -> 1.2: row 0 -1.2; row 1 unchanged .825 -> (-1.2 + .825)/2 = -.1875
    loss, _ = policy_loss(new, torch.zeros(2, 2), torch.tensor([1.0, -1.0]), torch.ones(2, 2), clip_low=0.2)
    assert loss.item() == pytest.approx(-0.1875, abs=1e-6)


def test_trajectories_weigh_equally_regardless_of_length():
    # short row: 1 action token, ratio 1.1, A = 1 -> -1.1 (inside [.72, 1.28])
    # long row: 4 action tokens, ratios 1, 1, 1, 1.2, A = 1 -> -(1 + 1 + 1 + 1.2)/4 = -1.05
    # trajectory mean: (-1.1 - 1.05)/2 = -1.075 (a flat token mean would give -(1.1 + 4.2)/5 = -1.06)
    new = torch.log(torch.tensor([[1.1, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.2]]))
    mask = torch.tensor([[1.0, 0.0, 0.0, 0.0], [1.0, 1.0, 1.0, 1.0]])
    loss, stats = policy_loss(new, torch.zeros(2, 4), torch.tensor([1.0, 1.0]), mask)
    assert loss.item() == pytest.approx(-1.075, abs=1e-6)
    # ratio_mean over the 5 action tokens: (1.1 + 3 + 1.2)/5 = 1.06
    assert stats["ratio_mean"] == pytest.approx(1.06, abs=1e-6)


def test_rows_without_action_tokens_are_skipped():
    # row 1 has no action token: loss is row 0 alone, ratio 1, A = 3 -> -3 (not NaN, not halved)
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    new = torch.zeros(2, 2, requires_grad=True)
    loss, _ = policy_loss(new, torch.zeros(2, 2), torch.tensor([3.0, 5.0]), mask)
    assert loss.item() == pytest.approx(-3.0)
    # no action tokens at all: zero loss that can still be backpropagated
    loss, stats = policy_loss(new, torch.zeros(2, 2), torch.tensor([3.0, 5.0]), torch.zeros(2, 2))
    assert loss.item() == 0.0 and stats["action_tokens"] == 0.0
    loss.backward()
    assert torch.equal(new.grad, torch.zeros(2, 2))


def test_masked_tokens_have_no_effect():
    g = torch.Generator().manual_seed(1)
    old = -torch.rand(2, 5, generator=g)
    base_new = old + 0.3 * torch.randn(2, 5, generator=g)
    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0], [1.0, 0.0, 1.0, 1.0, 0.0]])
    adv = torch.tensor([0.7, -1.3])
    new1 = base_new.clone().requires_grad_(True)
    loss1, stats1 = policy_loss(new1, old, adv, mask)
    loss1.backward()
    # change masked positions wildly, including values whose exp would overflow
    junk = torch.tensor([[500.0, 0.0, 0.0, -1e4, 0.0], [0.0, 300.0, 0.0, 0.0, float("-inf")]])
    new2 = torch.where(mask > 0, base_new, junk).requires_grad_(True)
    old2 = torch.where(mask > 0, old, torch.full_like(old, -7.0))
    loss2, stats2 = policy_loss(new2, old2, adv, mask)
    loss2.backward()
    assert loss2.item() == pytest.approx(loss1.item(), abs=1e-7)
    assert stats1 == pytest.approx(stats2)
    assert torch.equal(new2.grad[mask == 0], torch.zeros(int((mask == 0).sum())))
    assert torch.allclose(new1.grad, new2.grad)


def test_extreme_log_ratio_on_action_token_stays_finite():
    # log-ratio 100 on an action token with A < 0 would be exp(100) * A = inf; clamped to e^20
    new = torch.tensor([[100.0, 0.0]], requires_grad=True)
    loss, stats = policy_loss(new, torch.zeros(1, 2), torch.tensor([-1.0]), torch.ones(1, 2))
    loss.backward()
    # -(-e^20 + -1)/2 = (e^20 + 1)/2
    assert loss.item() == pytest.approx((math.exp(LOG_RATIO_LIMIT) + 1) / 2, rel=1e-5)
    assert torch.isfinite(new.grad).all()


def _loop_policy_loss(new, old, adv, mask, lo, hi):
    rows = []
    for b in range(new.shape[0]):
        terms = []
        for t in range(new.shape[1]):
            if mask[b, t] == 0:
                continue
            rho = math.exp(float(new[b, t]) - float(old[b, t]))
            a = float(adv[b])
            terms.append(-min(rho * a, min(max(rho, 1 - lo), 1 + hi) * a))
        if terms:
            rows.append(sum(terms) / len(terms))
    return sum(rows) / len(rows)


def test_loop_matches_vectorized_on_random_inputs():
    g = torch.Generator().manual_seed(7)
    for lo, hi in ((0.28, None), (0.2, 0.28), (0.1, 0.5)):
        B, T = 6, 9
        old = -2 * torch.rand(B, T, generator=g)
        new = old + 0.5 * torch.randn(B, T, generator=g)
        adv = torch.randn(B, generator=g)
        mask = (torch.rand(B, T, generator=g) < 0.6).float()
        mask[2] = 0.0  # one row without action tokens
        got, _ = policy_loss(new, old, adv, mask, clip_low=lo, clip_high=hi)
        want = _loop_policy_loss(new, old, adv, mask, lo, lo if hi is None else hi)
        assert got.item() == pytest.approx(want, abs=1e-5)


def test_policy_loss_rejects_bad_arguments():
    z = torch.zeros(2, 3)
    with pytest.raises(ValueError):
        policy_loss(z, torch.zeros(2, 4), torch.zeros(2), z)
    with pytest.raises(ValueError):
        policy_loss(z, z, torch.zeros(3), z)
    with pytest.raises(ValueError):
        policy_loss(z, z, torch.zeros(2), z, clip_low=1.0)


# --------------------------------------------------------------------------- kl_penalty


def test_kl_penalty_hand_values():
    # d = base - new; k3 = e^d - d - 1
    # row 0: d = ln 2 -> 2 - .6931472 - 1 = .3068528; d = 0 -> 0; row mean .1534264
    # row 1: d = -ln 2 -> .5 + .6931472 - 1 = .1931472 (one token; the other is masked)
    # mean over trajectories: (.1534264 + .1931472)/2 = .1732868
    new = torch.zeros(2, 2, requires_grad=True)
    base = torch.tensor([[math.log(2.0), 0.0], [-math.log(2.0), 50.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    kl = kl_penalty(new, base, mask)
    assert kl.item() == pytest.approx(0.1732868, abs=1e-6)
    kl.backward()
    # d k3 / d new = 1 - e^d, divided by row tokens and row count: row 0 (1 - 2)/2/2 = -.25, 0;
    # row 1 (1 - .5)/1/2 = .25; masked position 0
    assert torch.allclose(new.grad, torch.tensor([[-0.25, 0.0], [0.25, 0.0]]), atol=1e-6)


def test_kl_penalty_zero_when_equal():
    lp = -torch.rand(3, 4)
    assert kl_penalty(lp, lp.clone(), torch.ones(3, 4)).item() == 0.0


# --------------------------------------------------------------------------- minibatches


def test_minibatches_cover_every_index_once_and_are_deterministic():
    batches = minibatches(10, 4, torch.Generator().manual_seed(3))
    assert [len(b) for b in batches] == [4, 4, 2]
    assert sorted(torch.cat(batches).tolist()) == list(range(10))
    again = minibatches(10, 4, torch.Generator().manual_seed(3))
    assert all(torch.equal(a, b) for a, b in zip(batches, again))
    other = minibatches(10, 4, torch.Generator().manual_seed(4))
    assert not all(torch.equal(a, b) for a, b in zip(batches, other))
    assert minibatches(0, 4, torch.Generator()) == []
    with pytest.raises(ValueError):
        minibatches(5, 0, torch.Generator())
