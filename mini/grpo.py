"""
The GRPO objective as pure functions over tensors; the training loop calls them per micro-batch.

A rollout batch has N = n_prompts * K rows, groups contiguous (rows g*K .. g*K+K-1 share a prompt).
Completions are right-padded to T: ids (N, T), mask (N, T) 1 on real tokens, and logits (N, T, V)
are aligned (logits[:, t] predicts ids[:, t]).

Distribution: every log-prob, KL and entropy here is of the tempered softmax(logits / temperature),
the one the sampler draws from, computed in fp32. With top_k > 0 the sampler renormalises over k
tokens (and any tied with the k-th) while the loss uses the full tempered distribution (as TRL does):
ratio and KL are then those of the untruncated policy, exact for top_k = 0.

Micro-batching: each loss divides by global normalisers of the full rollout batch (normalisers()),
so the losses and metrics of the micro-batches sum to those of the full batch.

Papers: PPO (Schulman et al. 2017), GAE (Schulman et al. 2016), adaptive KL (Ziegler et al. 2019),
GRPO (Shao et al. 2024, DeepSeekMath eq. 3-4), DAPO (Yu et al. 2025), Dr. GRPO (Liu et al. 2025).
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn

from mini.logprobs import exact_kl, head_logprobs, logits_of


def k3_kl(logp, ref_logp):
    """Schulman's k3 estimator of KL(πθ‖πref) on sampled tokens (DeepSeekMath eq. 4):
    exp(q − p) − (q − p) − 1 ≥ 0 with q = log πref, p = log πθ. (N, T), (N, T) -> (N, T).
    expm1 and the clamp keep it ≥ 0 in fp32 where q ≈ p."""
    d = ref_logp.detach() - logp
    return (torch.expm1(d) - d).clamp(min=0)


# ----------------------------------------------------------------------------- advantages

def group_advantages(rewards, k, scale_rewards="group", baseline=None, eps=1e-4):
    """GRPO outcome advantages (DeepSeekMath §4.1.2): Â_i = (r_i − b_i) / s for every token of o_i,
    b = the group mean (or the given per-row baseline (N,)), s = group std + eps, batch std + eps,
    or 1 (Dr. GRPO); stds Bessel-corrected. A group whose K rewards are equal carries no signal:
    its advantage is exactly 0 whatever the baseline. Group scaling is meant for baselines near the group mean
    (group_mean, adaptive): with the EMA, [0.9, 0.9, 0.9, 0.91] against μ = 0.53 would give Â ≈ 73, so
    flags.problems refuses that pair. rewards (N,) -> advantages (N,), stats."""
    r = rewards.float().view(-1, k)  # (G, K)
    b = r.mean(1, keepdim=True) if baseline is None else baseline.float().view(-1, k)
    std = {"group": r.std(1, keepdim=True), "batch": r.std()}  # (G, 1) or ()
    s = 1.0 if scale_rewards == "none" else std[scale_rewards] + eps
    zero_var = r.amax(1) == r.amin(1)  # (G,)
    adv = torch.where(zero_var[:, None], 0.0, (r - b) / s)  # (G, K)
    stats = {"zero_var_share": zero_var.float().mean().item(), "adv_abs_mean": adv.abs().mean().item()}
    return adv.view(-1), stats


def informative_groups(rewards, k, min_std=0.0):
    """DAPO's dynamic-sampling filter: True for the groups that carry a signal, whose K rewards are not all
    equal and whose (Bessel-corrected) std exceeds min_std. rewards (N,) -> (G,) bool."""
    r = rewards.float().view(-1, k)  # (G, K)
    return (r.amax(1) > r.amin(1)) & (r.std(1) > min_std)


class RewardBaseline:
    """Per-row baseline b_i for group_advantages, by baseline_type:
      group_mean  the mean reward of the row's group (GRPO);
      ema         a running mean μ_τ of the reward per task type τ ("P", "A"),
                  μ_τ ← d·μ_τ + (1−d)·(mean reward of τ in the batch);
      adaptive    the group mean shrunk towards the EMA by inverse-variance weighting,
                  b = w·mean_g + (1−w)·μ_τ,  w = (K·τ² + eps) / (K·τ² + s_g² + eps),
                  s_g² the group's reward variance (its mean has variance s_g²/K) and τ² the EMA's error
                  as a predictor of a group's true mean: τ² = max(v_τ − n_τ, 0), v_τ a running mean of
                  (mean_g − μ_τ)², which holds each group mean's own noise too, and n_τ a running mean of
                  s_g²/K, that noise. Groups whose true means differ trust their own mean (w → 1); groups
                  that share one (τ² → 0) lean on the EMA, the better estimate of it.
    The state is updated with the batch before use (the first batch initialises it) for every type."""

    def __init__(self, baseline_type="group_mean", ema_decay=0.9, eps=1e-6):
        assert baseline_type in ("group_mean", "ema", "adaptive"), baseline_type
        self.baseline_type, self.decay, self.eps = baseline_type, ema_decay, eps
        self.mean, self.var, self.noise = {}, {}, {}  # per task type

    def __call__(self, rewards, tasks, k):
        """rewards (N,), tasks: N task types (constant within a group) -> baseline (N,)."""
        g = rewards.float().view(-1, k)  # (G, K)
        gm, gvar, gtask = g.mean(1), g.var(1), list(tasks)[::k]  # (G,), (G,), one task per group
        for t in set(gtask):
            rows = [i for i, u in enumerate(gtask) if u == t]
            x = gm[rows]
            m = self.mean.get(t, x.mean().item())
            d = self.decay if t in self.mean else 0.0
            self.var[t] = d * self.var.get(t, 0.0) + (1 - d) * ((x - m) ** 2).mean().item()
            self.noise[t] = d * self.noise.get(t, 0.0) + (1 - d) * (gvar[rows] / k).mean().item()
            self.mean[t] = d * m + (1 - d) * x.mean().item()
        group_mean = gm.repeat_interleave(k)  # (N,)
        if self.baseline_type == "group_mean":
            return group_mean
        ema = torch.tensor([self.mean[t] for t in tasks], device=g.device)  # (N,)
        if self.baseline_type == "ema":
            return ema
        tau2 = torch.tensor([max(self.var[t] - self.noise[t], 0.0) for t in tasks], device=g.device)  # (N,)
        w = (k * tau2 + self.eps) / (k * tau2 + gvar.repeat_interleave(k) + self.eps)
        return w * group_mean + (1 - w) * ema

    def state_dict(self):
        return {"mean": dict(self.mean), "var": dict(self.var), "noise": dict(self.noise)}

    def load_state_dict(self, state):
        self.mean, self.var = dict(state["mean"]), dict(state["var"])
        self.noise = dict(state.get("noise", {}))  # a checkpoint from before n_τ: it builds up from 0


def group_rows(rows, k, device=None):
    """The groups of some rollout rows (a list of row indices, each group's rows together; groups of k
    contiguous rows in the rollout) for GPT.completion_hidden, numbered within the list: each row's group (B,)
    and the position of each group's first row (U,). Known from the layout, so the forward needs no
    torch.unique (a sort and a host sync)."""
    of_row, firsts, seen = [], [], {}
    for j, i in enumerate(rows):
        if i // k not in seen:
            seen[i // k] = len(firsts)
            firsts.append(j)
        of_row.append(seen[i // k])
    return torch.tensor(of_row, device=device), torch.tensor(firsts, device=device)


# ----------------------------------------------------------------------------- losses

def normalisers(mask, budget=None):
    """Global denominators of a full rollout batch, given to the loss of each of its micro-batches:
    n_seqs (rows with a completion token: every sampled row has one, its EOS at least; a weightless
    placeholder's have none), n_tokens (real completion tokens) and budget, Dr. GRPO's constant MAX_TOKENS:
    the generation budget (max_new_tokens), the same for every batch whatever its completions' lengths
    (default: the padded width T of mask)."""
    return {"n_seqs": int(mask.bool().any(1).sum()), "n_tokens": max(int(mask.sum()), 1),
            "budget": budget or mask.size(1)}


def aggregate(x, mask, loss_type="grpo", norm=None):
    """A micro-batch's share of the full-batch mean of per-token terms x (N, T):
      grpo     (1/G) Σ_i (1/|o_i|) Σ_t x_it          (DeepSeekMath eq. 3)
      dr_grpo  (1/(G·L)) Σ_i Σ_t x_it, L the budget   (Dr. GRPO: a constant, so no length bias)
      dapo     (1/Σ_i |o_i|) Σ_i Σ_t x_it             (DAPO eq. 8, token level)
    with G (rows), L, Σ|o_i| from norm (default: this batch's own)."""
    norm = norm or normalisers(mask)
    m = mask.bool()
    s = torch.where(m, x, 0.0).sum(1)  # (N,)
    G = max(norm["n_seqs"], 1)  # a batch without a real token aggregates to 0
    if loss_type == "grpo":
        return (s / m.sum(1).clamp(min=1)).sum() / G
    if loss_type == "dr_grpo":
        return s.sum() / (G * norm["budget"])
    if loss_type == "dapo":
        return s.sum() / norm["n_tokens"]
    raise ValueError(f"unknown loss_type {loss_type!r}")


def policy_loss(logp, old_logp, adv, mask, clip_eps_low=0.2, clip_eps_high=0.2, loss_type="grpo", norm=None):
    """PPO clipped surrogate per token (GRPO eq. 3, clip-higher of DAPO), the ratio taken per token
    against the behaviour policy that sampled (not the reference):
      ρ_t = exp(log πθ − log π_old),  L_t = −min(ρ_t Â, clip(ρ_t, 1 − ε_low, 1 + ε_high) Â).
    logp (N, T) with grad, old_logp (N, T), adv (N,) or per token (N, T) -> loss, stats (0-dim tensors)."""
    norm = norm or normalisers(mask)
    a = adv[:, None] if adv.dim() == 1 else adv  # (N, 1) or (N, T)
    # (N, T), 1 on padding: the models may disagree there past exp's range, and a masked inf has a NaN gradient
    ratio = torch.exp(torch.where(mask.bool(), logp - old_logp.detach(), 0.0))
    r, m = ratio.detach(), mask.bool()
    low = (r < 1 - clip_eps_low) & (a < 0) & m  # clipped: no gradient there (TRL's clip_ratio/low_mean)
    high = (r > 1 + clip_eps_high) & (a > 0) & m  # (clip_ratio/high_mean)
    # the min taken by its cases: the clipped term where it is strictly the smaller, else ρ Â. So at a tie (ρ = 1
    # on-policy, on both bounds at ε = 0) the gradient is ρ Â's, REINFORCE's, whatever torch does at min's ties and
    # clamp's bounds (torch 2.14 gives clamp no gradient at a bound: torch.min then passes half of it)
    surrogate = torch.where(low | high, r.clamp(1 - clip_eps_low, 1 + clip_eps_high) * a, ratio * a)
    loss = aggregate(-surrogate, mask, loss_type, norm)
    stats = {"clip_frac": (low | high).sum() / norm["n_tokens"],
             "clip_low_frac": low.sum() / norm["n_tokens"], "clip_high_frac": high.sum() / norm["n_tokens"],
             "ratio_mean": torch.where(m, r, 0.0).sum() / norm["n_tokens"]}
    return loss, stats


def supervised_nll(logp, mask, n_tokens):
    """Negative log-likelihood of teacher-forced true tokens: -sum of their log-probs (n, T) under mask / n_tokens,
    the whole batch's count (a micro-batch's share of the batch mean)."""
    return -(logp * mask).sum() / max(n_tokens, 1)


def value_loss(values, old_values, returns, mask, value_clip=0.2, loss_type="grpo", norm=None):
    """Clipped value loss (PPO implementations): ½·max((V − R)², (V_old + clip(V − V_old, ±c) − R)²)
    per token, aggregated like the policy loss. values (N, T) with grad, old_values, returns (N, T)."""
    v_clip = old_values + (values - old_values).clamp(-value_clip, value_clip)
    return aggregate(0.5 * torch.max((values - returns) ** 2, (v_clip - returns) ** 2), mask, loss_type, norm)


# ----------------------------------------------------------------------------- KL coefficient

class AdaptiveKLController:
    """Proportional controller of the KL coefficient β (Ziegler et al. 2019, §2.2):
    e = clip(KL/target − 1, −0.2, 0.2),  β ← β·(1 + e·n_steps/horizon), clamped to [min_coef, max_coef]."""

    def __init__(self, init_coef, target, horizon, min_coef=1e-4, max_coef=10.0):
        self.coef, self.target, self.horizon = float(init_coef), target, horizon
        self.min_coef, self.max_coef = min_coef, max_coef

    def update(self, kl, n_steps=1):
        if math.isfinite(kl):  # a non-finite KL (a bad step the loop rolls back) leaves β as it was
            e = min(max(kl / self.target - 1, -0.2), 0.2)
            self.coef = min(max(self.coef * (1 + e * n_steps / self.horizon), self.min_coef), self.max_coef)
        return self.coef

    def state_dict(self):
        return {"coef": self.coef}

    def load_state_dict(self, state):
        self.coef = float(state["coef"])


def kl_coef_at(step, coef, warmup_steps):
    """β at optimizer step `step` (0-based): linear ramp from 0 over warmup_steps, then coef."""
    return coef * min(1.0, step / warmup_steps) if warmup_steps > 0 else coef


# ----------------------------------------------------------------------------- optional critic

class ValueHead(nn.Module):
    """V(s_t) from the last hidden state that also produces logits[:, t]: (N, T, C) -> (N, T) fp32.
    Zero-initialised, so values start at 0."""

    def __init__(self, n_embd):
        super().__init__()
        self.v = nn.Linear(n_embd, 1)
        nn.init.zeros_(self.v.weight)
        nn.init.zeros_(self.v.bias)

    def forward(self, h):
        return self.v(h).squeeze(-1).float()


@torch.no_grad()
def gae(reward, values, mask, gamma=1.0, lam=0.95):
    """GAE (Schulman et al. 2016, eq. 16) over completion tokens, the terminal reward (N,) on each
    row's last real token: δ_t = r_t + γ·V_{t+1} − V_t, Â_t = δ_t + γλ·Â_{t+1}, V and Â zero after
    the last real token. values (N, T), mask (N, T) right-padded -> advantages, returns (N, T)."""
    m, v = mask.float(), values.float()
    r = torch.zeros_like(v)
    r[torch.arange(v.size(0)), (m.sum(1).long() - 1).clamp(min=0)] = reward.float()
    adv, next_v, next_a = torch.zeros_like(v), torch.zeros_like(v[:, 0]), torch.zeros_like(v[:, 0])
    for t in reversed(range(v.size(1))):
        next_a = (r[:, t] + gamma * next_v - v[:, t] + gamma * lam * next_a) * m[:, t]
        next_v = v[:, t] * m[:, t]
        adv[:, t] = next_a
    return adv, (adv + v) * m


# ----------------------------------------------------------------------------- the loss of a micro-batch

@dataclass
class LossSettings:
    """The constants of the loss (train.py fills them from Config; kl_coef is the step's β)."""
    temperature: float = 1.0
    clip_eps_low: float = 0.2
    clip_eps_high: float = 0.2
    loss_type: str = "grpo"    # grpo | dr_grpo | dapo, see aggregate()
    kl_type: str = "k3"        # k3 | forward | reverse | symmetric
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    value_coef: float = 0.1
    value_clip: float = 0.2


def grpo_loss(logits, ids, mask, adv, s=LossSettings(), norm=None, *, old_logp=None, ref_logits=None,
              ref_logp=None, values=None, old_values=None, returns=None, with_entropy=True):
    """Loss of one micro-batch: policy + β·KL − c_H·entropy [+ c_V·value] (DeepSeekMath eq. 3-4).
    logits, ref_logits: (N, T, V) tensors or Heads (the fused log-probs, see head_logprobs).
    old_logp None: on-policy (first PPO epoch), old = current log-probs detached, so ρ = 1.
    KL: k3 needs ref_logp (or ref_logits), exact types need ref_logits; with neither it is skipped.
    with_entropy False and entropy_coef 0: the entropy is neither computed nor in the metrics.
    Every term uses the global normalisers `norm` (default: this batch's own), so losses and
    metrics of the micro-batches sum to those of the full batch. The kl and entropy metrics are means per
    completion token whatever the loss type, so that --target_kl and --kl_threshold mean one thing.
    Returns (loss, metrics): 0-dim detached tensors on the device, summable over micro-batches and read with
    one host sync by read_metrics; nothing here waits for the device."""
    norm = norm or normalisers(mask)
    agg = lambda x: aggregate(x, mask, s.loss_type, norm)
    per_token = lambda x: aggregate(x.detach(), mask, "dapo", norm)
    grad_if = lambda coef: torch.set_grad_enabled(coef != 0 and torch.is_grad_enabled())
    logp, ent_t = head_logprobs(logits, ids, s.temperature, with_entropy or s.entropy_coef != 0,  # (N, T) each
                                entropy_grad=s.entropy_coef != 0)
    pl, metrics = policy_loss(logp, logp.detach() if old_logp is None else old_logp, adv, mask,
                              s.clip_eps_low, s.clip_eps_high, s.loss_type, norm)
    loss = pl
    if ref_logp is not None or ref_logits is not None:
        with grad_if(s.kl_coef):
            if s.kl_type == "k3":
                q = ref_logp if ref_logp is not None else head_logprobs(ref_logits, ids, s.temperature, False)[0]
                # (N, T), 0 on padding, where q − p may overflow exp: a masked inf still gives a NaN gradient
                kl_t = k3_kl(torch.where(mask.bool(), logp, q), q)
            else:
                kl_t = exact_kl(logits_of(logits), logits_of(ref_logits), s.kl_type, s.temperature)
        loss = loss + s.kl_coef * agg(kl_t)
        metrics["kl"] = per_token(kl_t)
    if s.entropy_coef != 0:  # else the entropy's backward is skipped (a metric only)
        loss = loss - s.entropy_coef * agg(ent_t)
    if ent_t is not None:
        metrics["entropy"] = per_token(ent_t)
    if values is not None:
        vl = value_loss(values, old_values, returns, mask, s.value_clip, s.loss_type, norm)
        loss = loss + s.value_coef * vl
        metrics["value_loss"] = vl.detach()
    metrics.update(loss=loss.detach(), policy_loss=pl.detach())
    return loss, metrics


def read_metrics(metrics, reduce=None, **same):
    """{name: float} of metrics (0-dim tensors on the device, or numbers), then of `same`, read in one host
    sync; reduce: applied to the metrics' stacked float64 values first (distributed.all_sum under torchrun), not
    to `same` (values already equal on every rank)."""
    device = next((v.device for v in [*metrics.values(), *same.values()] if torch.is_tensor(v)), None)
    stack = lambda d: torch.stack([torch.as_tensor(v, dtype=torch.float64, device=device) for v in d.values()])
    values = stack(metrics) if reduce is None else reduce(stack(metrics))
    return dict(zip([*metrics, *same], (torch.cat([values, stack(same)]) if same else values).tolist()))
