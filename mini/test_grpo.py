"""The GRPO objective against hand-computed examples and naive reference loops.

    python mini/test_grpo.py
"""
import math
import statistics

import pytest
import torch
from hypothesis import example, given, settings, strategies as st
from torch.distributions import Categorical, kl_divergence

from mini.grpo import (AdaptiveKLController, LossSettings, RewardBaseline, ValueHead, aggregate, gae, group_advantages,
                       group_rows, grpo_loss, informative_groups, k3_kl, kl_coef_at, normalisers, policy_loss, read_metrics,
                       value_loss)
from mini.logprobs import Head, entropy, exact_kl, head_logprobs, token_logprobs
from mini.test_model import saved_bytes

LOSS_TYPES = ["grpo", "dr_grpo", "dapo"]
LENS = [6, 3, 2, 1, 6, 2, 4, 5]  # uneven completion lengths, N = 8 = 2 groups of K = 4


def batch(lens=LENS, T=6, V=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    N = len(lens)
    logits = torch.randn(N, T, V, generator=g)
    ids = torch.randint(V, (N, T), generator=g)
    mask = (torch.arange(T)[None] < torch.tensor(lens)[:, None]).float()
    old_logp = token_logprobs(logits, ids) + 0.3 * torch.randn(N, T, generator=g)  # ratios on both sides of the clip
    return logits, ids, mask, old_logp, g


def naive_logp(logits, ids, i, t, temperature=1.0):
    return torch.log_softmax(logits[i, t] / temperature, -1)[ids[i, t]]


def naive_weights(lens, loss_type, budget=6):
    """The weight of each real token in the aggregate, by loss type (budget: Dr. GRPO's constant, the padded T)."""
    N, L, n_tok = len(lens), budget, sum(lens)
    return [{"grpo": 1 / (N * n), "dr_grpo": 1 / (N * L), "dapo": 1 / n_tok}[loss_type] for n in lens]


# ----------------------------------------------------------------------------- advantages

def test_group_advantages_hand_example():
    r = torch.tensor([1, 0, 0, 1, 0.2124, 0.2124, 0.2124, 0.2124, 1, 0.5, 0, 0.5])
    adv, stats = group_advantages(r, 4)
    s1, s3 = math.sqrt(1 / 3) + 1e-4, math.sqrt(1 / 6) + 1e-4  # Bessel std of [1,0,0,1] and [1,.5,0,.5]
    want = [0.5 / s1, -0.5 / s1, -0.5 / s1, 0.5 / s1, 0, 0, 0, 0, 0.5 / s3, 0, -0.5 / s3, 0]
    assert torch.allclose(adv, torch.tensor(want), atol=1e-6)
    assert adv[4:8].eq(0).all()  # exactly zero, though 4 * 0.2124 / 4 need not equal 0.2124
    assert stats["zero_var_share"] == pytest.approx(1 / 3)
    assert stats["adv_abs_mean"] == pytest.approx((4 * 0.5 / s1 + 2 * 0.5 / s3) / 12, abs=1e-6)  # mean |Â|

    centred = [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 0, 0.5, 0, -0.5, 0]
    adv_b, _ = group_advantages(r, 4, scale_rewards="batch")
    assert torch.allclose(adv_b, torch.tensor(centred) / (statistics.stdev(r.tolist()) + 1e-4), atol=1e-6)
    adv_n, _ = group_advantages(r, 4, scale_rewards="none")
    assert torch.allclose(adv_n, torch.tensor(centred), atol=1e-6)
    adv_k, _ = group_advantages(r, 4, scale_rewards="none", baseline=torch.full((12,), 0.25))
    want_k = [0.75, -0.25, -0.25, 0.75, 0, 0, 0, 0, 0.75, 0.25, -0.25, 0.25]  # zero-variance group stays 0
    assert torch.allclose(adv_k, torch.tensor(want_k), atol=1e-6)


def test_a_constant_group_is_zero_even_where_its_float_std_is_not():
    """One group (--batch_size 1) of three rewards of 0.758: in fp32 torch (2.x, CPU) computes its std as 7e-8,
    not 0, the mean rounding. The group is still constant: its advantages are exactly 0, it counts in
    zero_var_share, and dynamic sampling drops it."""
    r = torch.tensor([0.758, 0.758, 0.758])
    adv, stats = group_advantages(r, 3)
    assert adv.eq(0).all() and stats["zero_var_share"] == 1.0
    assert informative_groups(r, 3).tolist() == [False]


def test_informative_groups_keep_a_bessel_std_strictly_above_min_std():
    """Groups of 3: [0, 2, 4] has a Bessel std of exactly 2 (population std 1.63), [1, 1, 1] none, [0, 0, 3]
    sqrt(3) = 1.73 (population 1.41). min_std must be exceeded, not reached: 2 at min_std 2 is dropped."""
    r = torch.tensor([0.0, 2, 4, 1, 1, 1, 0, 0, 3])
    assert informative_groups(r, 3).tolist() == [True, False, True]
    assert informative_groups(r, 3, min_std=2.0).tolist() == [False, False, False]
    assert informative_groups(r, 3, min_std=1.7).tolist() == [True, False, True]
    assert informative_groups(r, 3, min_std=1.9).tolist() == [True, False, False]


def test_reward_baseline_hand_example_and_state():
    tasks = ["P", "P", "A", "A", "P", "P"]  # k = 2: groups P, A, P
    types = ["group_mean", "ema", "adaptive"]
    bl = {t: RewardBaseline(t, ema_decay=0.9) for t in types}
    first = {t: bl[t](torch.tensor([1.0, 0, 1, 1, 0, 0]), tasks, 2) for t in types}
    assert torch.allclose(first["group_mean"], torch.tensor([0.5, 0.5, 1, 1, 0, 0]))
    assert torch.allclose(first["ema"], torch.tensor([0.25, 0.25, 1, 1, 0.25, 0.25]))  # the first batch initialises
    assert bl["ema"].var == pytest.approx({"P": 0.0625, "A": 0.0})

    restored = RewardBaseline("adaptive", ema_decay=0.9)
    restored.load_state_dict(bl["adaptive"].state_dict())
    r2 = torch.tensor([1.0, 1, 0, 1, 1, 0])
    second = {t: bl[t](r2, tasks, 2) for t in types}
    # P: mean 0.9*0.25 + 0.1*0.75 = 0.3, var 0.9*0.0625 + 0.1*((1-.25)^2 + (.5-.25)^2)/2 = 0.0875
    # A: mean 0.9*1 + 0.1*0.5 = 0.95,   var 0.1*(0.5-1)^2 = 0.025
    assert bl["ema"].mean == pytest.approx({"P": 0.3, "A": 0.95})
    assert bl["ema"].var == pytest.approx({"P": 0.0875, "A": 0.025})
    assert torch.allclose(second["ema"], torch.tensor([0.3, 0.3, 0.95, 0.95, 0.3, 0.3]))
    # n (the group means' own noise s^2/K): first P (0.5/2 + 0)/2 = 0.125, A 0; then P 0.125, A 0.1*0.5/2 = 0.025
    assert bl["adaptive"].noise == pytest.approx({"P": 0.125, "A": 0.025})
    # tau^2 = max(v - n, 0): P max(0.0875 - 0.125, 0) = 0, A 0.025 - 0.025 = 0: every group leans on the EMA
    w = 1e-6 / (0.5 + 1e-6)  # w = (K tau^2 + eps) / (K tau^2 + s^2 + eps), s^2 = 0.5
    bA, bP = w * 0.5 + (1 - w) * 0.95, w * 0.5 + (1 - w) * 0.3
    assert torch.allclose(second["adaptive"], torch.tensor([1, 1, bA, bA, bP, bP]))  # s^2 = 0: w = 1
    assert torch.allclose(restored(r2, tasks, 2), second["adaptive"])
    third = bl["adaptive"](torch.tensor([1.0, 1, 0, 0, 1, 0]), ["A"] * 6, 2)  # three A: groups, means 1, 0, 0.5
    # A: v 0.9*0.025 + 0.1*(0.05^2 + 0.95^2 + 0.45^2)/3 = 0.0594167, n 0.9*0.025 + 0.1*(0 + 0 + 0.25)/3 = 0.0308333,
    # tau^2 = 0.0285833; mean 0.9*0.95 + 0.1*0.5 = 0.905; the third group (s^2 = 0.5) weighs its own mean by w
    tau2 = 0.0594167 - 0.0308333
    w = (2 * tau2 + 1e-6) / (2 * tau2 + 0.5 + 1e-6)
    assert bl["adaptive"].noise["A"] == pytest.approx(0.0308333, abs=1e-6) and w == pytest.approx(0.1026, abs=1e-4)
    assert torch.allclose(third, torch.tensor([1, 1, 0, 0, w * 0.5 + (1 - w) * 0.905, w * 0.5 + (1 - w) * 0.905]))


@pytest.mark.parametrize("means, lo, hi", [([0.5] * 4, 0.0, 0.15),  # groups share one mean: lean on the EMA
                                           ([0.1, 0.4, 0.6, 0.9], 0.65, 0.9)])  # K tau^2 / (K tau^2 + s^2) = 0.77
def test_adaptive_baseline_weighs_the_group_mean_by_how_much_groups_differ(means, lo, hi):
    """Inverse-variance weighting: with every group's true mean the same the EMA is the better estimate
    (w near 0, where a v_tau holding the group means' own noise kept w near 0.5); with true means that
    differ by tau^2 = 0.085 and s^2 about 0.2 at K = 8, w is about 0.68 / 0.88."""
    torch.manual_seed(0)
    baseline, ws = RewardBaseline("adaptive", ema_decay=0.9), []
    for _ in range(300):
        rewards = torch.bernoulli(torch.tensor(means).repeat_interleave(8))
        b, g = baseline(rewards, ["P"] * 32, 8), rewards.view(4, 8)
        ema = baseline.mean["P"]
        ws += [((b[8 * i] - ema) / (g[i].mean() - ema)).item() for i in range(4)
               if abs(g[i].mean() - ema) > 0.05 and g[i].var() > 0]  # w, read back from b = w gm + (1 - w) ema
    assert lo < sum(ws) / len(ws) < hi


@pytest.mark.parametrize("baseline_type", ["group_mean", "ema", "adaptive"])
@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_zero_variance_group_gives_zero_gradient(baseline_type, scale):
    logits, ids, mask, old_logp, _ = batch()
    logits.requires_grad_(True)
    rewards = torch.tensor([1.0, 0, 0.5, 1, 0.3, 0.3, 0.3, 0.3])
    tasks = ["P"] * 4 + ["A"] * 4
    base = RewardBaseline(baseline_type)
    base(torch.tensor([0.0, 0.1, 0.2, 0.9, 0.5, 0.6, 0.7, 0.8]), tasks, 4)  # the EMA differs from 0.3
    adv, stats = group_advantages(rewards, 4, scale, baseline=base(rewards, tasks, 4))
    assert stats["zero_var_share"] == 0.5
    loss, _ = grpo_loss(logits, ids, mask, adv, old_logp=old_logp)  # ratios != 1, no KL or entropy term
    loss.backward()
    assert logits.grad[4:].eq(0).all() and logits.grad[:4].abs().sum() > 0


# ----------------------------------------------------------------------------- policy loss

@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_first_iteration_gradient_is_reinforce_with_baseline(loss_type):
    """ratio = 1: ∇L = −Σ_i w_i Â_i Σ_t ∇log π(o_it), w_i the aggregation weight of the loss type."""
    logits, ids, mask, _, g = batch()
    adv, _ = group_advantages(torch.rand(8, generator=g), 4)
    temp = 0.7
    x = logits.clone().requires_grad_(True)
    logp = token_logprobs(x, ids, temp)
    # old_logp as it comes, with its graph: the loss takes no gradient through the behaviour policy's side
    loss, _ = policy_loss(logp, logp, adv, mask, loss_type=loss_type)
    loss.backward()

    y = logits.clone().requires_grad_(True)
    w = naive_weights(LENS, loss_type)
    J = sum(w[i] * adv[i] * naive_logp(y, ids, i, t, temp) for i in range(8) for t in range(LENS[i]))
    (-J).backward()
    assert torch.allclose(x.grad, y.grad, atol=1e-6)
    assert loss.item() == pytest.approx(-sum(w[i] * adv[i].item() * LENS[i] for i in range(8)), abs=1e-6)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_policy_loss_matches_naive_loop(loss_type):
    logits, ids, mask, old_logp, g = batch()
    adv = torch.randn(8, generator=g)
    lo, hi = 0.2, 0.28
    loss, stats = policy_loss(token_logprobs(logits, ids), old_logp, adv, mask, lo, hi, loss_type)
    w, total, n_low, n_high = naive_weights(LENS, loss_type), 0.0, 0, 0
    for i in range(8):
        a = adv[i].item()
        for t in range(LENS[i]):
            rho = math.exp(naive_logp(logits, ids, i, t).item() - old_logp[i, t].item())
            total += w[i] * -min(rho * a, min(max(rho, 1 - lo), 1 + hi) * a)
            n_low += rho < 1 - lo and a < 0
            n_high += rho > 1 + hi and a > 0
    assert loss.item() == pytest.approx(total, abs=1e-6)
    n = sum(LENS)
    assert stats["clip_frac"] == pytest.approx((n_low + n_high) / n) and 0 < n_low + n_high < n
    assert stats["clip_low_frac"] == pytest.approx(n_low / n) and stats["clip_high_frac"] == pytest.approx(n_high / n)
    assert n_low > 0 and n_high > 0


def test_per_token_advantages_weigh_each_token_by_its_own():
    """GAE's advantages (N, T): on-policy (ratio 1) the loss is −aggregate(Â), each token by its own Â; a clipped
    token counts by its own Â's sign. Row 0: Â = 1, 3 (100 on padding); row 1: Â = −2, 4, 0.5."""
    adv = torch.tensor([[1.0, 3.0, 100.0], [-2.0, 4.0, 0.5]])
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    loss, stats = policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), adv, mask)
    assert loss.item() == pytest.approx(-((1 + 3) / 2 + (-2 + 4 + 0.5) / 3) / 2)
    ratio = torch.tensor([[1.5, 0.5, 1.0], [0.5, 1.5, 1.0]])  # clipped: high (0, 0) and (1, 1), low (1, 0)
    _, stats = policy_loss(ratio.log(), torch.zeros(2, 3), adv, mask)
    assert stats["clip_high_frac"] == pytest.approx(2 / 5) and stats["clip_low_frac"] == pytest.approx(1 / 5)


def test_on_policy_tokens_count_as_unclipped_even_at_clip_ranges_of_0():
    """The first epoch's ratio is exactly 1: at --clip_eps_low 0 and --clip_eps_high 0 it sits on both bounds, where
    the gradient still flows (REINFORCE's), so no token counts as clipped."""
    logp = torch.randn(2, 3, generator=torch.Generator().manual_seed(0)).requires_grad_(True)
    loss, stats = policy_loss(logp, logp, torch.tensor([1.0, -1.0]), torch.ones(2, 3), 0.0, 0.0)
    assert stats == {"clip_frac": 0.0, "clip_low_frac": 0.0, "clip_high_frac": 0.0, "ratio_mean": 1.0}
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-1.0], [1.0]]).expand(2, 3) / 6)


def test_dr_grpo_divides_by_the_generation_budget_by_hand():
    """Dr. GRPO: Σ_i Σ_t x_it / (G · MAX_TOKENS), MAX_TOKENS the budget, not the batch's longest completion."""
    x = torch.tensor([[1.0, 2.0, 0.0, 0.0], [3.0, 4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    assert aggregate(x, mask, "dr_grpo", normalisers(mask, budget=8)).item() == pytest.approx(21 / (2 * 8))
    assert aggregate(x, mask, "dr_grpo").item() == pytest.approx(21 / (2 * 4))  # default: the padded width
    short = mask[:, :2]  # the same rows trimmed: shorter completions must not change the denominator
    assert aggregate(x[:, :2], short, "dr_grpo", normalisers(short, budget=8)).item() == pytest.approx(10 / 16)
    assert aggregate(x, mask, "grpo").item() == pytest.approx((3 / 2 + 18 / 4) / 2)
    assert aggregate(x, mask, "dapo").item() == pytest.approx(21 / 6)


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_a_batch_without_real_tokens_aggregates_to_zero(loss_type):
    """No real token at all: the normalisers' token count is floored at 1, so every loss type gives 0, not NaN."""
    mask = torch.zeros(2, 3)
    assert normalisers(mask)["n_tokens"] == 1
    assert aggregate(torch.randn(2, 3), mask, loss_type).item() == 0.0


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_padding_that_holds_inf_or_nan_leaves_the_aggregate_as_it_is(loss_type):
    """A token term on padding can overflow (a ratio or k3 of log-probs of tokens nobody sampled): aggregate selects
    the real tokens rather than multiplying by the mask, for inf · 0 is NaN."""
    x = torch.tensor([[1.0, 2.0, math.inf], [3.0, math.nan, -math.inf]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    want = {"grpo": (3 / 2 + 3) / 2, "dr_grpo": 6 / (2 * 3), "dapo": 6 / 3}[loss_type]
    assert aggregate(x, mask, loss_type).item() == pytest.approx(want)


def test_aggregate_rejects_unknown_type():
    with pytest.raises(ValueError):
        aggregate(torch.ones(2, 3), torch.ones(2, 3), "sum")


@pytest.mark.parametrize("kl_type", ["k3", "forward"])
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_micro_batching_gives_same_loss_and_gradient(loss_type, kl_type):
    logits, ids, mask, old_logp, g = batch()
    ref_logits = logits + 0.5 * torch.randn(logits.shape, generator=g)
    adv, _ = group_advantages(torch.rand(8, generator=g), 4)
    values0, returns = torch.randn(8, 6, generator=g), torch.randn(8, 6, generator=g)
    s = LossSettings(temperature=0.8, clip_eps_low=0.2, clip_eps_high=0.28, loss_type=loss_type, kl_type=kl_type,
                     kl_coef=0.1, entropy_coef=0.01, value_coef=0.1, value_clip=0.2)

    def run(rows_per_micro):
        x, v = logits.clone().requires_grad_(True), values0.clone().requires_grad_(True)
        norm, total, metrics = normalisers(mask), 0.0, {}
        for i in range(0, 8, rows_per_micro):
            r = slice(i, i + rows_per_micro)
            T = int(mask[r].sum(1).max())  # each micro-batch trimmed to its own longest completion
            loss, m = grpo_loss(x[r, :T], ids[r, :T], mask[r, :T], adv[r], s, norm, old_logp=old_logp[r, :T],
                                ref_logits=ref_logits[r, :T], values=v[r, :T], old_values=values0[r, :T] + 0.1,
                                returns=returns[r, :T])
            loss.backward()
            total += loss.item()
            metrics = {k: metrics.get(k, 0.0) + m[k] for k in m}
        return total, x.grad, v.grad, metrics

    full, micro = run(8), run(2)
    assert micro[0] == pytest.approx(full[0], abs=1e-6)
    assert torch.allclose(micro[1], full[1], atol=1e-7) and torch.allclose(micro[2], full[2], atol=1e-7)
    assert read_metrics(micro[3]) == pytest.approx(read_metrics(full[3]), abs=1e-6)  # metrics are summable shares too
    assert set(full[3]) >= {"loss", "policy_loss", "kl", "entropy", "clip_frac", "ratio_mean", "value_loss"}
    assert all(val.dim() == 0 and not val.requires_grad for val in full[3].values())  # nothing graph-attached
    assert all(type(val) is float for val in read_metrics(full[3]).values())  # read once, as numbers


def test_grpo_loss_terms_and_on_policy_default():
    logits, ids, mask, _, g = batch()
    ref_logits = logits + 0.5 * torch.randn(logits.shape, generator=g)
    adv, _ = group_advantages(torch.rand(8, generator=g), 4)
    loss, m = grpo_loss(logits, ids, mask, adv, LossSettings(kl_type="reverse", kl_coef=0.1, entropy_coef=0.01),
                        ref_logits=ref_logits)
    assert m["ratio_mean"] == pytest.approx(1.0) and m["clip_frac"] == 0.0
    kl_t, ent_t = exact_kl(logits, ref_logits, "reverse"), entropy(logits)
    kl, ent = aggregate(kl_t, mask), aggregate(ent_t, mask)
    assert loss.item() == pytest.approx(m["policy_loss"] + 0.1 * kl.item() - 0.01 * ent.item(), abs=1e-6)
    m_dr = grpo_loss(logits, ids, mask, adv, LossSettings(kl_type="reverse", loss_type="dr_grpo"),
                     {**normalisers(mask), "budget": 2 * mask.size(1)}, ref_logits=ref_logits)[1]
    for metrics in (m, m_dr):  # the KL and entropy metrics are per-token means whatever the loss averages
        assert metrics["kl"] == pytest.approx((kl_t * mask).sum().item() / mask.sum().item())
        assert metrics["entropy"] == pytest.approx((ent_t * mask).sum().item() / mask.sum().item())
    _, m_no_ref = grpo_loss(logits, ids, mask, adv)
    assert "kl" not in m_no_ref
    values, returns = torch.randn(8, 6, generator=g), torch.randn(8, 6, generator=g)  # the critic at --value_coef
    old_values = values + 0.3 * torch.randn(8, 6, generator=g)  # --value_clip 0.05 clips some
    critic_loss, critic = grpo_loss(logits, ids, mask, adv, LossSettings(value_coef=0.4, value_clip=0.05),
                                    values=values, old_values=old_values, returns=returns)
    assert critic_loss.item() == pytest.approx(critic["policy_loss"].item() + 0.4 * critic["value_loss"].item(),
                                               abs=1e-6)  # the metric unweighted, aggregated like the policy loss
    assert critic["value_loss"].item() == pytest.approx(value_loss(values, old_values, returns, mask, 0.05).item())
    assert critic["value_loss"].item() != pytest.approx(value_loss(values, old_values, returns, mask, 0.2).item())


def test_grpo_loss_and_gradient_equal_a_naive_float64_loop():
    """Every term sends its gradient: the clipped surrogate (ε_low 0.1, ε_high 0.3, ratios on both sides), β·k3 and
    −c_H·entropy, each per token at the temperature, against autograd through a loop over the real tokens."""
    logits, ids, mask, old_logp, g = batch()
    logits, old_logp = logits.double(), old_logp.double()
    q = token_logprobs(logits + 0.5 * torch.randn(logits.shape, generator=g, dtype=torch.float64), ids, 0.8)
    adv = torch.randn(8, generator=g, dtype=torch.float64)
    s = LossSettings(temperature=0.8, clip_eps_low=0.1, clip_eps_high=0.3, loss_type="dapo", kl_coef=0.1,
                     entropy_coef=0.05)
    x, y = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    loss, m = grpo_loss(x, ids, mask, adv, s, old_logp=old_logp, ref_logp=q)
    loss.backward()
    terms, clipped = [], 0
    for i in range(8):
        for t in range(LENS[i]):
            lp_all = torch.log_softmax(y[i, t] / 0.8, -1)
            lp, d = lp_all[ids[i, t]], q[i, t] - lp_all[ids[i, t]]
            rho = torch.exp(lp - old_logp[i, t])
            clipped += bool(rho < 0.9 and adv[i] < 0 or rho > 1.3 and adv[i] > 0)
            terms.append(-torch.min(rho * adv[i], rho.clamp(0.9, 1.3) * adv[i])
                         + 0.1 * (torch.exp(d) - d - 1) + 0.05 * (lp_all.exp() * lp_all).sum())
    want = sum(terms) / sum(LENS)
    want.backward()
    assert 0 < clipped and m["clip_frac"].item() == pytest.approx(clipped / sum(LENS))
    assert loss.item() == pytest.approx(want.item(), abs=1e-12) and m["loss"].item() == loss.item()
    assert torch.allclose(x.grad, y.grad, atol=1e-12, rtol=0) and y.grad.abs().sum() > 0


def test_a_non_finite_k3_on_padding_sends_no_nan_gradient():
    """Padding positions hold whatever the models say after the completion: a reference log-prob 100 above the
    policy's there overflows k3's exp in fp32. The KL is masked there, so the loss and its gradient stay finite
    (a NaN gradient would roll the step back)."""
    logits, ids = torch.zeros(1, 2, 4, requires_grad=True), torch.zeros(1, 2, dtype=torch.long)
    mask, ref_logp = torch.tensor([[1, 0]]), torch.tensor([[math.log(0.25), 100.0]])
    loss, m = grpo_loss(logits, ids, mask, torch.ones(1), LossSettings(kl_coef=0.1), ref_logp=ref_logp)
    loss.backward()
    assert m["kl"].item() == pytest.approx(0, abs=1e-6) and torch.isfinite(logits.grad).all()
    assert logits.grad[0, 1].eq(0).all() and logits.grad[0, 0].abs().sum() > 0


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_a_ratio_past_exps_range_on_padding_sends_no_nan_gradient(sign):
    """From the second epoch on, the behaviour policy's log-prob on padding may lie 100 below the policy's: exp
    overflows there. The ratio is 1 on padding, so loss and gradient stay finite, whatever the advantage's sign
    (a negative one takes the overflowing branch of the min), and the real token's gradient is the surrogate's."""
    logits, ids = torch.zeros(1, 2, 4, requires_grad=True), torch.zeros(1, 2, dtype=torch.long)
    mask, old_logp = torch.tensor([[1, 0]]), torch.tensor([[math.log(0.25), -100.0]])
    loss, m = grpo_loss(logits, ids, mask, torch.tensor([sign]), LossSettings(), old_logp=old_logp)
    loss.backward()
    assert torch.isfinite(loss) and m["ratio_mean"].item() == pytest.approx(1.0) and torch.isfinite(logits.grad).all()
    assert logits.grad[0, 1].eq(0).all()
    # at ratio 1, -d(ratio * A)/d logits = -A (onehot - softmax) at the real token
    assert torch.allclose(logits.grad[0, 0], -sign * (torch.eye(4)[0] - 0.25))


def test_k3_from_reference_logits_is_taken_at_the_temperature():
    """k3 given ref_logits computes the reference log-probs itself: at the sampling temperature, like the
    policy's, so it equals k3 given those log-probs (the trainer's path), the formula by hand, and 0 against itself."""
    logits, ids, mask, _, g = batch()
    ref_logits = logits + 0.5 * torch.randn(logits.shape, generator=g)
    adv, s = torch.zeros(len(ids)), LossSettings(temperature=0.7, kl_type="k3", kl_coef=0.1)
    from_logits = grpo_loss(logits, ids, mask, adv, s, ref_logits=ref_logits)[1]["kl"].item()
    from_logp = grpo_loss(logits, ids, mask, adv, s, ref_logp=token_logprobs(ref_logits, ids, 0.7))[1]["kl"].item()
    p, q = token_logprobs(logits, ids, 0.7), token_logprobs(ref_logits, ids, 0.7)
    by_hand = (((torch.exp(q - p) - (q - p) - 1) * mask).sum() / mask.sum()).item()
    assert from_logits == pytest.approx(from_logp, abs=1e-7) and from_logits == pytest.approx(by_hand, abs=1e-6)
    assert grpo_loss(logits, ids, mask, adv, s, ref_logits=logits.clone())[1]["kl"].item() == pytest.approx(0, abs=1e-7)


# ----------------------------------------------------------------------------- KL, entropy, log-probs

def test_token_logprobs_fp32_chunked_and_direct():
    """The hand-written backward against autograd through log_softmax, at a chunk size that does not divide
    the positions and at one chunk."""
    logits, ids, _, _, _ = batch()
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(3))  # a loss that is not a plain sum
    ref = logits.clone().requires_grad_(True)
    want = torch.log_softmax(ref / 0.7, -1).gather(-1, ids[..., None]).squeeze(-1)
    (want * weights).sum().backward()
    for chunk_size in (5, 10**6):
        x = logits.clone().requires_grad_(True)
        got = token_logprobs(x, ids, 0.7, chunk_size=chunk_size)
        assert got.dtype == torch.float32 and torch.allclose(got, want, atol=1e-6)
        (got * weights).sum().backward()
        assert torch.allclose(x.grad, ref.grad, atol=1e-6)
    low = logits.bfloat16().requires_grad_(True)
    lp = token_logprobs(low, ids)
    lp.sum().backward()
    assert lp.dtype == torch.float32 and low.grad.dtype == torch.bfloat16


def test_exact_kl_zero_for_identical_models():
    logits, ids, _, _, _ = batch()
    for kl_type in ["forward", "reverse", "symmetric"]:
        assert exact_kl(logits, logits.clone(), kl_type, temperature=0.7).abs().max() == 0
    lp = token_logprobs(logits, ids)
    assert k3_kl(lp, lp.clone()).abs().max() == 0


def test_exact_kl_matches_direct_computation():
    logits, _, _, _, g = batch()
    ref = logits + torch.randn(logits.shape, generator=g)
    P, Q = Categorical(logits=logits / 0.8), Categorical(logits=ref / 0.8)
    fwd, rev = kl_divergence(P, Q), kl_divergence(Q, P)
    assert torch.allclose(exact_kl(logits, ref, "forward", 0.8), fwd, atol=1e-6)
    assert torch.allclose(exact_kl(logits, ref, "reverse", 0.8), rev, atol=1e-6)
    assert torch.allclose(exact_kl(logits, ref, "symmetric", 0.8), (fwd + rev) / 2, atol=1e-6)
    assert (fwd > 0).all()


@pytest.mark.parametrize("kl_type", ["forward", "reverse", "symmetric"])
def test_exact_kl_chunked_equals_unchunked(kl_type):
    logits, _, _, _, g = batch()
    ref = (logits + torch.randn(logits.shape, generator=g)).requires_grad_(True)
    out = []
    for chunk in [1, 7, 10**6]:
        x = logits.clone().requires_grad_(True)
        kl = exact_kl(x, ref, kl_type, chunk_size=chunk)
        (kl * torch.arange(48.0).view(8, 6)).sum().backward()
        out.append((kl.detach(), x.grad))
    for kl, grad in out[:2]:
        assert torch.allclose(kl, out[2][0], atol=1e-7) and torch.allclose(grad, out[2][1], atol=1e-6)
    assert ref.grad is None  # the reference is frozen


def test_exact_kl_and_entropy_keep_no_vocabulary_wide_temporaries_for_backward():
    """Each chunk is recomputed in the backward pass: autograd keeps the inputs (x, and the reference for the
    KL), not the chunks' (M, V) log-softmaxes and their exponentials for the whole batch."""
    x = torch.randn(4, 40, 500, requires_grad=True)
    ref = torch.randn(4, 40, 500)
    inputs = x.numel() * x.element_size()
    for kl_type in ("forward", "reverse", "symmetric"):
        assert saved_bytes(lambda: exact_kl(x, ref, kl_type, chunk_size=16).sum()) <= 2 * inputs
    assert saved_bytes(lambda: entropy(x, chunk_size=16).sum()) <= inputs


def test_kl_and_entropy_of_no_positions_are_empty():
    """A batch of no rows (N = 0) gives (0, T) values and an empty gradient, like the log-probs, not a reshape error."""
    x = torch.randn(0, 5, 11, requires_grad=True)
    ids = torch.zeros(0, 5, dtype=torch.long)
    outs = [exact_kl(x, x.detach(), kl_type) for kl_type in ("forward", "reverse", "symmetric")]
    outs += [entropy(x), token_logprobs(x, ids)]
    assert all(o.shape == (0, 5) for o in outs)
    sum(o.sum() for o in outs).backward()
    assert x.grad.shape == x.shape


@settings(max_examples=300, deadline=None)
@given(st.floats(-30, 30), st.one_of(st.floats(-30, 30), st.floats(-1e-6, 1e-6)))
@example(0.0, 4e-8)  # fp32 exp(d) - d - 1 = -6e-8 here
def test_k3_nonnegative(p, d):
    q = p + d
    k3 = k3_kl(torch.tensor([p]), torch.tensor([q])).item()
    assert k3 >= 0
    assert k3 == pytest.approx(math.exp(q - p) - (q - p) - 1, rel=1e-4, abs=1e-6)


def test_k3_sends_no_gradient_into_the_reference():
    """∂k3/∂p = 1 − exp(q − p) per token, and none to q, the reference's log-prob, even when it has a graph."""
    p = torch.tensor([-1.0, -2.0, -0.5], requires_grad=True)
    q = torch.tensor([-1.5, -1.0, -0.5], requires_grad=True)
    k3_kl(p, q).sum().backward()
    assert q.grad is None
    assert torch.allclose(p.grad, 1 - torch.exp(q.detach() - p.detach()))


def test_k3_is_unbiased_for_kl_on_policy_samples():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 1, 7, generator=g)
    ref = logits + 0.3 * torch.randn(logits.shape, generator=g)  # close distributions
    ids = torch.multinomial(torch.softmax(logits[:, 0], -1), 100_000, replacement=True, generator=g)  # (4, S)
    lp = torch.log_softmax(logits[:, 0], -1).gather(1, ids)
    lq = torch.log_softmax(ref[:, 0], -1).gather(1, ids)
    estimate, exact = k3_kl(lp, lq).mean(1), exact_kl(logits, ref)[:, 0]
    assert torch.allclose(estimate, exact, rtol=0.05, atol=1e-4), (estimate, exact)


def test_entropy_matches_direct_computation():
    logits, _, _, _, _ = batch()
    want = Categorical(logits=logits / 1.3).entropy()
    assert torch.allclose(entropy(logits, 1.3), want, atol=1e-6)
    assert torch.allclose(entropy(logits, 1.3, chunk_size=5), want, atol=1e-6)


@pytest.mark.parametrize("chunk_size", [1, 5, 64])
def test_entropy_in_the_logprob_pass_matches_direct_computation(chunk_size):
    """token_logprobs(with_entropy=True), the metric path of a step at --entropy_coef 0: in fp64 the entropy of
    softmax(x / T) from the log-probs' own chunk exponentials, the log-probs and their gradient unchanged,
    and no gradient into the entropy. Extreme logits (±80) test the max-shift."""
    g = torch.Generator().manual_seed(3)
    x = (torch.randn(3, 7, 50, generator=g, dtype=torch.float64) * 4).requires_grad_()
    x.data[0, 0, :3] = torch.tensor([80.0, -80.0, 79.0], dtype=torch.float64)
    ids = torch.randint(0, 50, (3, 7), generator=g)
    lp, ent = token_logprobs(x, ids, 0.7, chunk_size=chunk_size, with_entropy=True)
    assert torch.allclose(ent, Categorical(logits=x.detach() / 0.7).entropy(), atol=1e-12, rtol=0)
    assert not ent.requires_grad
    want = token_logprobs(x, ids, 0.7, chunk_size=chunk_size)
    assert torch.equal(lp, want)
    w = torch.randn(3, 7, generator=g, dtype=torch.float64)
    assert torch.equal(torch.autograd.grad((lp * w).sum(), x)[0], torch.autograd.grad((want * w).sum(), x)[0])
    lp_h, ent_h = head_logprobs(x, ids, 0.7, with_entropy=True, entropy_grad=False)  # grpo_loss's call
    assert torch.allclose(ent_h, ent, atol=1e-12, rtol=0) and torch.equal(lp_h, token_logprobs(x, ids, 0.7))
    assert not ent_h.requires_grad  # the metric from the log-probs' pass, not a second pass that keeps a graph


def test_bf16_and_extreme_fp32_logits_are_computed_in_fp32():
    """bf16 logits (and a bf16 output layer) give fp32 log-probs, entropies and KLs: those of the same values upcast
    to fp32, not of a bf16 softmax. fp32 logits of ±80 at T = 0.7 (exp(228) overflows fp32) stay finite: every
    path shifts by the row's maximum."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 7, 50, generator=g) * 3
    x[0, 0, :3] = torch.tensor([80.0, -80.0, 79.0])
    ids = torch.randint(0, 50, (3, 7), generator=g)
    for logits in (x.bfloat16(), x):
        up = logits.float()
        lp_all = torch.log_softmax(up / 0.7, -1)
        want_lp, want_ent = lp_all.gather(-1, ids[..., None])[..., 0], -(lp_all.exp() * lp_all).sum(-1)
        lp, ent = token_logprobs(logits, ids, 0.7, chunk_size=4, with_entropy=True)
        assert lp.dtype == ent.dtype == entropy(logits, 0.7).dtype == torch.float32
        assert torch.allclose(lp, want_lp, atol=1e-5) and torch.allclose(ent, want_ent, atol=1e-5)
        assert torch.allclose(entropy(logits, 0.7), want_ent, atol=1e-5)
        ref = logits.flip(-1)
        want_kl = (lp_all.exp() * (lp_all - torch.log_softmax(ref.float() / 0.7, -1))).sum(-1)
        assert torch.allclose(exact_kl(logits, ref, "forward", 0.7), want_kl, atol=1e-4)
    h, w = torch.randn(3, 7, 16, generator=g).bfloat16(), (torch.randn(50, 16, generator=g) * 3).bfloat16()
    lp_all = torch.log_softmax((h @ w.T).float() / 0.7, -1)  # the bf16 matmul's logits, upcast
    lp, ent = head_logprobs(Head(h, w), ids, 0.7, chunk_size=4)
    assert lp.dtype == ent.dtype == torch.float32
    assert torch.allclose(lp, lp_all.gather(-1, ids[..., None])[..., 0], atol=1e-5)
    assert torch.allclose(ent, -(lp_all.exp() * lp_all).sum(-1), atol=1e-5)


@pytest.mark.parametrize("temperature,chunk", [(1.0, 64), (0.7, 5)])  # chunks that do not divide the positions
def test_fused_head_equals_the_plain_output_layer(temperature, chunk):
    """head_logprobs from (hidden states, weight), chunked with recomputation in backward, against
    log_softmax(h @ W.T / T).gather and the entropy of the same distribution, in fp64: values, and gradients
    with respect to h and W of a loss weighing both."""
    g = torch.Generator().manual_seed(0)
    N, T, C, V = 3, 7, 16, 50
    h = torch.randn(N, T, C, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(V, C, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, V, (N, T), generator=g)
    a, b = torch.randn(N, T, generator=g, dtype=torch.float64), torch.randn(N, T, generator=g, dtype=torch.float64)
    lp_all = torch.log_softmax(h @ w.T / temperature, -1)
    want_lp, want_ent = lp_all.gather(2, ids[..., None])[..., 0], -(lp_all.exp() * lp_all).sum(-1)
    want_grads = torch.autograd.grad((a * want_lp + b * want_ent).sum(), (h, w))
    for head in (lambda: Head(h, w), lambda: Head(h, w, fused=False), lambda: h @ w.T):  # fused, plain, logits
        lp, ent = head_logprobs(head(), ids, temperature, chunk_size=chunk)
        assert torch.allclose(lp, want_lp, atol=1e-12, rtol=0) and torch.allclose(ent, want_ent, atol=1e-12, rtol=0)
        for got, want in zip(torch.autograd.grad((a * lp + b * ent).sum(), (h, w)), want_grads):
            assert torch.allclose(got, want, atol=1e-12, rtol=0)
    lp, ent = head_logprobs(Head(h, w), ids, temperature, with_entropy=False, chunk_size=chunk)  # log-probs alone
    assert ent is None and torch.allclose(lp, want_lp, atol=1e-12, rtol=0)
    want_lp = torch.log_softmax(h @ w.T / temperature, -1).gather(2, ids[..., None])[..., 0]  # a new graph
    for got, want in zip(torch.autograd.grad((a * lp).sum(), (h, w)), torch.autograd.grad((a * want_lp).sum(), (h, w))):
        assert torch.allclose(got, want, atol=1e-12, rtol=0)


def test_the_fused_entropy_alone_sends_its_gradient():
    """A loss on the fused head's entropy alone (the log-probs unused): its backward gets no log-prob gradient and
    must still give the entropy's, dH/dx = -p (log p + H), against autograd through the plain output layer."""
    g = torch.Generator().manual_seed(1)
    h = torch.randn(2, 5, 8, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(30, 8, generator=g, dtype=torch.float64, requires_grad=True)
    ids, b = torch.randint(0, 30, (2, 5), generator=g), torch.randn(2, 5, generator=g, dtype=torch.float64)
    lp_all = torch.log_softmax(h @ w.T / 0.7, -1)
    want = torch.autograd.grad((b * -(lp_all.exp() * lp_all).sum(-1)).sum(), (h, w))
    _, ent = head_logprobs(Head(h, w), ids, 0.7, chunk_size=3)
    for got, ref in zip(torch.autograd.grad((b * ent).sum(), (h, w)), want):
        assert torch.allclose(got, ref, atol=1e-12, rtol=0)


@pytest.mark.parametrize("fused", [True, False])
def test_a_head_computes_its_logits_in_its_autocast_dtype(fused):
    """Head.of inside a bf16 autocast region records bf16, and the log-probs, entropy and their gradients are then
    those of the bf16 matmul's logits (the sampler's), upcast: fused or not, forward and backward, though h and W
    are fp32 and the call runs outside the region. fp32 logits would differ by ~1e-2 and give a KL above 0."""
    g = torch.Generator().manual_seed(2)
    h = torch.randn(3, 7, 16, generator=g, requires_grad=True)
    w = (torch.randn(50, 16, generator=g) * 3).requires_grad_()
    ids, a = torch.randint(0, 50, (3, 7), generator=g), torch.randn(3, 7, generator=g)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        head = Head.of(h, w, fused)
    assert head.dtype == torch.bfloat16 and head.fused is fused and Head.of(h, w).dtype is None
    lp_all = torch.log_softmax((h.bfloat16() @ w.bfloat16().T).float() / 0.7, -1)
    want_lp, want_ent = lp_all.gather(-1, ids[..., None])[..., 0], -(lp_all.exp() * lp_all).sum(-1)
    lp, ent = head_logprobs(head, ids, 0.7, chunk_size=4)
    assert lp.dtype == ent.dtype == torch.float32
    assert torch.allclose(lp, want_lp, atol=1e-4) and torch.allclose(ent, want_ent, atol=1e-4)
    assert not torch.allclose(lp, torch.log_softmax(h @ w.T / 0.7, -1).gather(-1, ids[..., None])[..., 0], atol=1e-3)
    want = torch.autograd.grad((a * want_lp + a * want_ent).sum(), (h, w))
    for got, ref in zip(torch.autograd.grad((a * lp + a * ent).sum(), (h, w)), want):
        assert got.dtype == torch.float32 and torch.allclose(got, ref, atol=0.05 * ref.abs().max().item())


def test_grpo_loss_without_entropy_leaves_the_loss_and_skips_the_metric():
    logits, ids, mask, old_logp, g = batch()
    adv = torch.randn(len(ids), generator=g)
    with_ent = grpo_loss(logits, ids, mask, adv, old_logp=old_logp)
    without = grpo_loss(logits, ids, mask, adv, old_logp=old_logp, with_entropy=False)
    assert without[0] == with_ent[0] and "entropy" in with_ent[1] and "entropy" not in without[1]
    s = LossSettings(entropy_coef=0.01)  # a bonus in the loss: computed whatever with_entropy says
    assert "entropy" in grpo_loss(logits, ids, mask, adv, s, old_logp=old_logp, with_entropy=False)[1]


def test_read_metrics_reduces_the_shares_not_the_same_values():
    """Under torchrun the ranks' shares are summed (reduce); a value already every rank's (the grad norm) is not."""
    got = read_metrics({"loss": torch.tensor(0.25), "n": 2}, lambda v: v * 4, grad_norm=torch.tensor(1.5))
    assert got == {"loss": 1.0, "n": 8.0, "grad_norm": 1.5} and all(type(v) is float for v in got.values())


def test_group_rows_of_a_micro_batch():
    """Rows 2..6 of groups of 3: the tail of group 0, group 1, the head of group 2; and rows in another
    order (a length-sorted micro-batch), groups numbered as they first appear."""
    of_row, firsts = group_rows([2, 3, 4, 5, 6], 3)
    assert of_row.tolist() == [0, 1, 1, 1, 2] and firsts.tolist() == [0, 1, 4]
    assert [t.tolist() for t in group_rows([6, 7, 8, 0, 1, 2, 4], 3)] == [[0, 0, 0, 1, 1, 1, 2], [0, 3, 6]]


# ----------------------------------------------------------------------------- critic

def test_gae_hand_example():
    values = torch.tensor([[0.5, 0.6, 0.7], [0.2, 0.4, 9.9]])  # row 1 has 2 tokens; 9.9 is padding
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    adv, ret = gae(torch.tensor([1.0, 0.5]), values, mask, gamma=0.9, lam=0.8)
    # row 0: δ = [0.9*.6-.5, 0.9*.7-.6, 1-.7] = [.04, .03, .3]; Â_2 = .3, Â_1 = .03+.72*.3, Â_0 = .04+.72*.246
    # row 1: the reward on its last real token: δ = [0.9*.4-.2, .5-.4] = [.16, .1];  Â_1 = .1, Â_0 = .16+.72*.1
    assert torch.allclose(adv, torch.tensor([[0.21712, 0.246, 0.3], [0.232, 0.1, 0]]), atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[0.71712, 0.846, 1.0], [0.432, 0.5, 0.0]]), atol=1e-6)
    mc, _ = gae(torch.tensor([1.0, 0.5]), values, mask, gamma=1.0, lam=1.0)  # Monte Carlo: R − V_t
    assert torch.allclose(mc, torch.tensor([[0.5, 0.4, 0.3], [0.3, 0.1, 0]]), atol=1e-6)


def test_value_loss_hand_example_and_head():
    values, old = torch.tensor([[1.0, 0.6]]), torch.tensor([[0.5, 0.5]])
    returns = torch.tensor([[2.0, 0.0]])
    # token 0: max((1-2)^2, (0.7-2)^2) / 2 = 0.845; token 1: clip inactive, 0.36 / 2 = 0.18
    assert value_loss(values, old, returns, torch.ones(1, 2), 0.2).item() == pytest.approx((0.845 + 0.18) / 2)
    head = ValueHead(16)
    v = head(torch.randn(3, 5, 16))
    assert v.shape == (3, 5) and v.eq(0).all()


# ----------------------------------------------------------------------------- KL coefficient

def test_adaptive_kl_controller():
    up = AdaptiveKLController(0.1, target=0.02, horizon=100)
    assert up.update(0.03) == pytest.approx(0.1 * (1 + 0.2 / 100))  # error 0.5, clipped to 0.2
    down = AdaptiveKLController(0.1, target=0.02, horizon=100)
    assert down.update(0.019) == pytest.approx(0.1 * (1 - 0.05 / 100))
    assert down.update(0.01, n_steps=4) == pytest.approx(0.1 * (1 - 0.05 / 100) * (1 - 0.2 * 4 / 100))
    assert down.update(float("nan")) == pytest.approx(0.1 * (1 - 0.05 / 100) * (1 - 0.2 * 4 / 100))  # NaN: no change
    for _ in range(5000):
        up.update(1.0, n_steps=10)
        down.update(0.0, n_steps=10)
    assert (up.coef, down.coef) == (10.0, 1e-4)  # the documented bounds, as literals
    assert AdaptiveKLController(9.99, target=0.02, horizon=100).update(1.0, n_steps=10) == 10.0  # 10.19 clamped
    restored = AdaptiveKLController(0.5, target=0.02, horizon=100)
    restored.load_state_dict(up.state_dict())
    assert restored.coef == up.coef


def test_kl_warmup():
    assert [kl_coef_at(s, 0.02, 10) for s in (0, 5, 10, 50)] == pytest.approx([0, 0.01, 0.02, 0.02])
    assert kl_coef_at(0, 0.02, 0) == 0.02


if __name__ == "__main__":
    import sys
    sys.exit(pytest.main([__file__, "-q"]))
