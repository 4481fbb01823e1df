"""One GRPO update of Trainer against a reference written the slow, obvious way, and the sampler's
log-probs against the trainer's.

The reference runs the model on each sequence alone (no padding, no masks), takes the log-probs of the
actions at the sampling temperature token by token, counts EOS as the last action of a row that stopped,
groups rows by their prompt, computes the group advantages (or GAE) by hand, and divides each loss
type's sum over the whole rollout. Trainer's rollout -> prepare -> advantages -> update, padded and
micro-batched, must give the same loss and the same gradient for every parameter, in every PPO epoch.

    python mini/test_reference_step.py
"""
import json
import math

import chess
import pytest
import torch

import mini.train as train
from mini.config import POOL_PATH
from mini.flags import parse_args
from mini.loader import load_model, save_model
from mini.sampler import generate
from mini.test_train import EOS, NEVER, tiny_gpt
from mini.tokenizer import Tokenizer

TEMPERATURE = 0.7
MAX_NEW = 10
K = 3
REWARDS = [0.2, 1.0, -0.3, 0.9, 0.4, 0.45]  # two groups of K, each with its own spread


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    # EOS bias 6 at temperature 0.7: ~10% per token, so some rows stop early and some run to MAX_NEW
    return save_model(tiny_gpt(eos_bias=6.0), Tokenizer.gpt2(), str(tmp_path_factory.mktemp("ref") / "model"))


def make_trainer(snapshot, tmp_path, *extra):
    return train.Trainer(parse_args([
        "--model_path", snapshot, "--device", "cpu", "--log_dir", str(tmp_path), "--run_name", "ref",
        "--batch_size", "2", "--k_samples", str(K), "--max_new_tokens", str(MAX_NEW), "--temperature", str(TEMPERATURE),
        "--top_k", "0", "--mix_env_ratio", "0.5", "--lr", "1e-2", "--grad_clip", "0", "--eval_every", "0",
        "--kl_coef", "0.1", "--entropy_coef", "0.01", "--clip_eps_low", "0.2", "--clip_eps_high", "0.28", *extra]))


# ----------------------------------------------------------------------------- the reference, naively

def actions_of(completion, cfg):
    """The tokens the policy chose: the completion, and EOS when it stopped before the budget."""
    return completion + [EOS] if len(completion) < cfg.max_new_tokens else completion


def row_forward(model, prompt, actions, value_head=None, temperature=TEMPERATURE):
    """The row alone: log-probs (L, V) at the sampling temperature of the distribution each action was
    drawn from, and the values (L,) of the same states."""
    h = model.hidden(torch.tensor([prompt + actions]))[0, len(prompt) - 1:-1]  # (L, C): the state before each action
    logp = torch.log_softmax(model.lm_head(h) / temperature, -1)
    values = h @ value_head["value_head.v.weight"][0] + value_head["value_head.v.bias"][0] if value_head else None
    return logp, values


def group_advantages_by_hand(r, rewards):
    """(r_i - mean of its group) / (Bessel std of the group + 1e-4); 0 for a group of equal rewards.
    Groups are the rows that share a prompt."""
    groups = {}
    for i, s in enumerate(r.samples):
        groups.setdefault(s.prompt, []).append(i)
    assert [rows for rows in groups.values()] == [list(range(g * K, g * K + K)) for g in range(len(groups))]
    adv = [0.0] * len(rewards)
    for rows in groups.values():
        x = [rewards[i] for i in rows]
        mean = sum(x) / K
        std = math.sqrt(sum((v - mean) ** 2 for v in x) / (K - 1))
        for i in rows:
            adv[i] = 0.0 if max(x) == min(x) else (rewards[i] - mean) / (std + 1e-4)
    return adv


def gae_by_hand(reward, values, gamma, lam):
    """Per-token GAE advantages and returns of one row, the reward on its last action."""
    adv, ret, next_v, next_a = [0.0] * len(values), [0.0] * len(values), 0.0, 0.0
    for t in reversed(range(len(values))):
        delta = (reward if t == len(values) - 1 else 0.0) + gamma * next_v - values[t]
        next_a = delta + gamma * lam * next_a
        adv[t], ret[t], next_v = next_a, next_a + values[t], values[t]
    return adv, ret


def mean_over_rollout(rows, loss_type, budget):
    """rows: per row, a list of per-token terms. grpo: mean over a row's tokens, then over rows; dapo:
    sum over all tokens / their number; dr_grpo: sum / (rows * the generation budget)."""
    if loss_type == "grpo":
        return sum(sum(x) / len(x) for x in rows) / len(rows)
    total = sum(sum(x) for x in rows)
    return total / sum(len(x) for x in rows) if loss_type == "dapo" else total / (len(rows) * budget)


def reference_epoch(cfg, r, rewards, policy, ref, value_head, old):
    """Loss and metrics of one PPO epoch for the policy's current weights; old: the behaviour policy's
    log-probs of the actions and values, per row. Backward of the loss gives the reference gradient."""
    adv = group_advantages_by_hand(r, rewards)
    lo, hi = cfg.clip_eps_low, cfg.clip_eps_high
    terms = {k: [] for k in ("policy", "kl", "entropy", "value", "clipped")}
    for i, (prompt, completion) in enumerate(zip(r.prompts, r.completions)):
        actions = actions_of(completion, cfg)
        logp, values = row_forward(policy, prompt, actions, value_head)
        with torch.no_grad():
            ref_logp, _ = row_forward(ref, prompt, actions)
        old_logp, old_values = old[i]
        if cfg.use_gae:
            a_row, returns = gae_by_hand(rewards[i], old_values, cfg.gamma, cfg.gae_lambda)
        steps = torch.arange(len(actions))
        lp = logp[steps, torch.tensor(actions)]  # (L,) log-probs of the actions
        entropy = -(logp.exp() * logp).sum(-1)  # (L,) of each next-token distribution
        if cfg.kl_type == "k3":  # Schulman's k3 on the sampled token
            d = ref_logp[steps, torch.tensor(actions)] - lp
            kl = torch.exp(d) - d - 1
        else:  # forward KL(pi || ref), exact over the vocabulary
            kl = (logp.exp() * (logp - ref_logp)).sum(-1)
        row = {k: [] for k in terms}
        for t in range(len(actions)):
            A = a_row[t] if cfg.use_gae else adv[i]
            ratio = torch.exp(lp[t] - old_logp[t])
            row["policy"].append(-torch.min(ratio * A, ratio.clamp(1 - lo, 1 + hi) * A))
            row["clipped"].append(float((ratio.item() < 1 - lo and A < 0) or (ratio.item() > 1 + hi and A > 0)))
            row["kl"].append(kl[t])
            row["entropy"].append(entropy[t])
            if cfg.use_gae:
                v, v_old = values[t], old_values[t]
                v_clip = v_old + (v - v_old).clamp(-cfg.value_clip, cfg.value_clip)
                row["value"].append(0.5 * torch.max((v - returns[t]) ** 2, (v_clip - returns[t]) ** 2))
        for k in terms:
            terms[k].append(row[k])
    agg = {k: mean_over_rollout(terms[k], cfg.loss_type, cfg.max_new_tokens) for k in ("policy", "kl", "entropy")}
    loss = agg["policy"] + cfg.kl_coef * agg["kl"] - cfg.entropy_coef * agg["entropy"]
    if cfg.use_gae:
        agg["value"] = mean_over_rollout(terms["value"], cfg.loss_type, cfg.max_new_tokens)
        loss = loss + cfg.value_coef * agg["value"]
    n_tokens = sum(len(x) for x in terms["clipped"])
    per_token = {k: mean_over_rollout(terms[k], "dapo", None).item() for k in ("kl", "entropy")}  # any loss type
    metrics = {"loss": loss.item(), "policy_loss": agg["policy"].item(), **per_token,
               "clip_frac": sum(map(sum, terms["clipped"])) / n_tokens}
    if cfg.use_gae:
        metrics["value_loss"] = agg["value"].item()
    for name, coef, gold in (("env_sft", cfg.env_sft_coef, r.env_sft), ("policy_sft", cfg.policy_sft_coef, r.policy_sft)):
        if gold is None:  # supervised rows: the true completion and EOS, at temperature 1, mean over each term's tokens
            continue
        nll, n = 0.0, 0
        for prompt, completion in zip(gold.prompts, gold.completions):
            truth = completion + [EOS]
            logp, _ = row_forward(policy, prompt, truth, temperature=1.0)
            nll, n = nll - logp[torch.arange(len(truth)), torch.tensor(truth)].sum(), n + len(truth)
        loss = loss + coef * nll / n
        metrics[name + "_nll"] = (nll / n).item()
    return loss, metrics


def reference_update(cfg, snapshot, r, rewards, epochs):
    """The reference's loss, metrics (means over epochs) and gradients per epoch, at the weights each
    of Trainer's epochs had (epochs: (weights, gradients) as its optimizer saw them). The reference
    model is the start snapshot, as the trainer's is."""
    policy, ref = load_model(snapshot)[0].double(), load_model(snapshot)[0].double()  # float64: the exact answer
    ref.requires_grad_(False)
    params = dict(policy.named_parameters())

    def load(weights):
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(weights[n])
        head = {n: w.double().requires_grad_(True) for n, w in weights.items() if n.startswith("value_head")}
        return head or None

    with torch.no_grad():  # the behaviour policy: the weights that sampled, before any update
        head0 = load(epochs[0][0])
        old = []
        for prompt, completion in zip(r.prompts, r.completions):
            logp, values = row_forward(policy, prompt, actions_of(completion, cfg), head0)
            old.append(([logp[t, a] for t, a in enumerate(actions_of(completion, cfg))],
                        values.tolist() if values is not None else None))
    losses, grads = [], []
    for weights, _ in epochs:
        head = load(weights)
        policy.zero_grad(set_to_none=True)
        loss, metrics = reference_epoch(cfg, r, rewards, policy, ref, head, old)
        loss.backward()
        g = {n: p.grad.clone() for n, p in params.items()}
        g.update({n: w.grad.clone() for n, w in (head or {}).items()})
        losses.append(metrics)
        grads.append(g)
    mean = {k: sum(m[k] for m in losses) / len(losses) for k in losses[0]}
    return mean, grads


# ----------------------------------------------------------------------------- Trainer, recorded

def trainer_update(t, rewards):
    """Trainer's rollout, prepare, advantages and update with the given rewards. Returns the rollout,
    the update's metrics, and for each epoch the weights and gradients its optimizer step was given."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():  # a policy some updates away from the reference: KL and its gradient are not 0
        for p in t.model.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=g))
        if t.value_head is not None:  # values that are not 0, so the critic's gradient reaches the model
            t.value_head.v.weight.copy_(0.3 * torch.randn(t.value_head.v.weight.shape, generator=g))
    r = t.rollout()
    t.prepare(r)
    r.rewards = torch.tensor(rewards)
    names = {p: n for n, p in t.model.named_parameters()}
    if t.value_head is not None:
        names.update({p: n for n, p in t.value_head.named_parameters(prefix="value_head")})
    epochs, step = [], t.optimizer.step

    def recording_step(*a, **kw):
        epochs.append(({n: p.detach().clone() for p, n in names.items()},
                       {n: p.grad.clone() for p, n in names.items()}))
        return step(*a, **kw)
    t.optimizer.step = recording_step
    adv, returns, _ = t.advantages(r)
    stats = t.update(r, adv, returns)
    assert len(epochs) == t.cfg.num_iterations
    return r, stats, epochs


CASES = {  # each loss type; k3 and an exact KL; micro-batches of 1, 2 and the whole rollout; two epochs; GAE; fused
    "grpo-k3-whole": [],
    # a budget no row reaches: Dr. GRPO's constant differs from the padded width
    "dr_grpo-forward-micro2": ["--loss_type", "dr_grpo", "--kl_type", "forward", "--micro_batch_size", "2",
                               "--max_new_tokens", "20", "--seed", "1"],
    "dapo-k3-micro1-2epochs": ["--loss_type", "dapo", "--micro_batch_size", "1", "--num_iterations", "2"],
    "grpo-gae-micro2-2epochs": ["--use_gae", "--gamma", "0.9", "--gae_lambda", "0.8", "--micro_batch_size", "2",
                                "--num_iterations", "2"],
    # the fused output layer (logprobs.Head): log-probs and the entropy bonus from it, the exact KL through its logits
    "dapo-forward-fused-micro2": ["--fused_logprobs", "--loss_type", "dapo", "--kl_type", "forward",
                                  "--micro_batch_size", "2"],
    # --compile's widths, rounded up to multiples of 16 (compiled on CUDA only): more padding, the same update
    "grpo-k3-width-buckets-micro2": ["--compile", "--micro_batch_size", "2"],
    # the supervised A: term beside the GRPO loss: three true transitions in micro-batches of 2 and 1, each epoch
    "grpo-k3-env-sft-micro2-2epochs": ["--env_sft_coef", "0.5", "--env_sft_batch", "3", "--micro_batch_size", "2",
                                       "--num_iterations", "2"],
    # both supervised terms, each the mean over its own tokens: A: transitions and P: analyses
    "grpo-k3-both-sft-micro2": ["--env_sft_coef", "0.5", "--env_sft_batch", "2", "--policy_sft_coef", "0.3",
                                "--policy_sft_batch", "3", "--micro_batch_size", "2"],
}


@pytest.mark.parametrize("case", CASES)
def test_trainer_update_equals_the_reference(snapshot, tmp_path, case):
    t = make_trainer(snapshot, tmp_path, *CASES[case])
    r, stats, epochs = trainer_update(t, REWARDS)
    stopped = sum(len(c) < t.cfg.max_new_tokens for c in r.completions)
    if t.cfg.loss_type == "dr_grpo":
        assert r.comp_mask.shape[1] < t.cfg.max_new_tokens
    else:
        assert 0 < stopped < len(r.completions)  # some rows stopped (EOS is an action), some ran to the budget
    assert len(set(map(len, r.prompts))) > 1  # prompts of different lengths: left padding
    if t.cfg.compile:  # the padded widths are the buckets'
        assert r.Tp % 16 == 0 and r.comp_ids.shape[1] % 16 == 0 and r.Tp > max(map(len, r.prompts))
    if t.cfg.env_sft_coef:  # true next states of A: transitions, of different lengths, not the sampled rows
        assert len(r.env_sft.prompts) == t.cfg.env_sft_batch and len(set(map(len, r.env_sft.completions))) > 1
        assert all(s.task == "A" for s in r.env_sft.samples) and "env_sft_nll" in stats
    if t.cfg.policy_sft_coef:  # Stockfish's analyses of P: positions
        assert len(r.policy_sft.prompts) == 3 and all(s.task == "P" for s in r.policy_sft.samples)
        assert "policy_sft_nll" in stats and stats["policy_sft_nll"] != stats["env_sft_nll"]
    want, ref_grads = reference_update(t.cfg, snapshot, r, REWARDS, epochs)
    for k, v in want.items():
        assert stats[k] == pytest.approx(v, abs=1e-5), k
    if t.cfg.num_iterations > 1:
        assert stats["clip_frac"] > 0 and stats["ratio_mean"] != pytest.approx(1.0, abs=1e-3)  # the clip fires
    for e, ((_, got), want_g) in enumerate(zip(epochs, ref_grads)):
        assert got.keys() == want_g.keys()
        # 1e-5 of each parameter's gradient; fp32 rounding is relative to the gradient's overall scale, so
        # a parameter whose own gradient nearly cancels (ln_f.bias) is held to 1e-6 of the whole instead
        scale = math.sqrt(sum(g.norm().item() ** 2 for g in want_g.values()))
        for n, g in got.items():
            err = (g.double() - want_g[n]).norm().item()
            assert err <= 1e-5 * want_g[n].norm().item() + 1e-6 * scale, f"epoch {e}: {n}: |diff| {err:.3g}, |ref| {want_g[n].norm():.3g}"
        assert want_g["transformer.wte.weight"].norm() > 0


def test_sampler_logprobs_equal_the_trainers_old_logprobs(snapshot, tmp_path):
    """The log-probs generate returns for the sampled tokens, the EOS of a row that stopped included,
    are the trainer's old log-probs: same temperature, same positions, left padding or not."""
    t = make_trainer(snapshot, tmp_path, "--num_iterations", "2")  # old log-probs are kept for several epochs
    torch.manual_seed(7)
    r = t.rollout()
    t.prepare(r)
    assert (~r.mask[:, :r.Tp]).any()  # left padding
    # the same uniforms again with a stop token that is never drawn: the rows run on past their EOS, whose
    # log-prob generate then returns like any other token's
    torch.manual_seed(7)
    through = generate(t.model, r.prompts, MAX_NEW, TEMPERATURE, 0, eos_id=NEVER)
    stopped = 0
    for i, (completion, (tokens, logp)) in enumerate(zip(r.completions, through)):
        n = len(actions_of(completion, t.cfg))
        stopped += n > len(completion)
        assert NEVER not in tokens and tokens[:n] == actions_of(completion, t.cfg)
        assert r.comp_mask[i].sum() == n and r.comp_ids[i, :n].tolist() == tokens[:n]
        assert torch.allclose(r.old_logp[i, :n], logp[:n], atol=1e-5, rtol=0), i
    assert 0 < stopped < len(r.completions)
    torch.manual_seed(7)  # and the rollout's own generate call, which stops at EOS
    for i, (tokens, logp) in enumerate(generate(t.model, r.prompts, MAX_NEW, TEMPERATURE, 0, EOS)):
        assert tokens == r.completions[i] and torch.allclose(logp, r.old_logp[i, :len(tokens)], atol=1e-5, rtol=0)


def test_the_supervised_terms_draw_from_their_own_files(snapshot, tmp_path):
    """--sft_data_file: the supervised rows (A: transitions and P: analyses) come from its three positions, not
    from the prompt source (the shipped pool of 5,000); the prompts still come from the pool. Its state goes
    into the checkpoint, so that a resume draws on where it was."""
    with open(POOL_PATH) as f:
        header, *records = f.readlines()[:4]
    own = tmp_path / "own.jsonl"
    own.write_text(header + "".join(records))
    fens = {json.loads(r)["fen"] for r in records}
    t = make_trainer(snapshot, tmp_path, "--env_sft_coef", "0.5", "--env_sft_batch", "6", "--policy_sft_coef", "0.3",
                     "--policy_sft_batch", "5", "--sft_data_file", str(own))
    r = t.rollout()
    t.prepare(r)
    assert {s.fen for s in r.env_sft.samples + r.policy_sft.samples} <= fens
    assert {s.task for s in r.env_sft.samples} == {"A"} and {s.task for s in r.policy_sft.samples} == {"P"}
    assert not {s.fen for s in r.samples} <= fens  # the GRPO prompts: the pool's
    state = t.rank_state()["sft_sampler"]
    drawn = [s.prompt for s in t.supervised_rows("A", 6).samples]
    t.load_rank_state({**t.rank_state(), "sft_sampler": state})
    assert [s.prompt for s in t.supervised_rows("A", 6).samples] == drawn
    # a file of A: transitions alone feeds the A: term, whatever share of P: prompts --mix_env_ratio asks of the pool
    arbiter = tmp_path / "arbiter.jsonl"
    arbiter.write_text('{"fen": "%s", "move": "e2e4", "history": ["e2e4"]}\n' % chess.STARTING_FEN)
    t = make_trainer(snapshot, tmp_path / "a", "--env_sft_coef", "0.5", "--sft_data_file", str(arbiter))
    assert {s.prompt for s in t.supervised_rows("A", 3).samples} == {f"A: {chess.STARTING_FEN}+e2e4+e2e4+"}
    # a policy-only file feeds the P: term alone (no A: row is asked of it, so none need start on its positions)
    t = make_trainer(snapshot, tmp_path / "p", "--policy_sft_coef", "0.3", "--sft_data_file", str(own),
                     "--policy_only_file", str(own))
    assert {s.fen for s in t.supervised_rows("P", 4).samples} <= fens


if __name__ == "__main__":
    import sys
    sys.exit(pytest.main([__file__, "-q"]))
