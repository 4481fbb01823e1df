"""Every logged metric of a training step, by hand, on a mixed batch: P: and A: groups, valid and invalid
completions, one group of equal rewards. Per-task figures are means over that task's rows.

The batch (K = 2; rewards and components from the README's reward spec, see mini/test_adversarial.py):
  group 0  P  own completion                         1.0    best 1   cand 1    evals 1  raw 1
              " M: b3b5 E: -0.8 B: b3b7"             0.608  best .5  cand .2   evals 1  raw .51
  group 1  A  own completion                         1.0    all five 1            raw 1
              "junk"                                 -0.3   all 0, format_valid 0
  group 2  P  "junk"                                 -0.3   all 0, best_legal 0, format_valid 0
              " M: b3b5 b3a3 E: -0.8 0.0 B: b3b5"    0.784  best 1   cand .1   evals 1  raw .73
  group 3  A  F + "+0.001+1+0" twice                 0.92   terminated_exact 0    raw .9  (equal rewards)

    python mini/test_metrics.py
"""
import json
import math
import statistics
import types

import pytest
import torch

import mini.train as train
from mini import distributed
from mini.config import POOL_PATH
from mini.flags import parse_args
from mini.grpo import LossSettings, grpo_loss, normalisers, policy_loss
from mini.loader import save_model
from mini.reward_scorer import score_batch
from mini.rollout import GlobalBatch, InformativeGroups, Rollout, merge_sampling, reward_metrics
from mini.test_adversarial import A, A_CASES, P, P_CASES, REF_A, REF_P
from mini.test_train import tiny_gpt
from mini.tokenizer import Tokenizer

SAMPLES = [P, P, A, A, P, P, A, A]
TEXTS = [REF_P, P_CASES["best said second"][0], REF_A, "junk", "junk", P_CASES["an illegal candidate"][0],
         A_CASES["terminated"][0], A_CASES["terminated"][0]]
REWARDS = [1.0, 0.608, 1.0, -0.3, -0.3, 0.784, 0.92, 0.92]
TASKS = ["P", "P", "A", "A", "P", "P", "A", "A"]
REWARD_METRICS = {
    "reward_mean": 4.632 / 8, "reward_std": statistics.stdev(REWARDS),
    "reward_mean_P": (1.0 + 0.608 - 0.3 + 0.784) / 4, "reward_std_P": statistics.stdev([1.0, 0.608, -0.3, 0.784]),
    "reward_mean_A": (1.0 - 0.3 + 0.92 + 0.92) / 4, "reward_std_A": statistics.stdev([1.0, -0.3, 0.92, 0.92]),
    # P: rows 0, 1, 4, 5
    "format_valid_P": 3 / 4, "best_P": (1 + 0.5 + 0 + 1) / 4, "best_legal_P": 3 / 4,
    "candidates_P": (1 + 0.2 + 0 + 0.1) / 4, "evals_P": 3 / 4, "raw_P": (1 + 0.51 + 0 + 0.73) / 4,
    # A: rows 2, 3, 6, 7
    "format_valid_A": 3 / 4, "fen_exact_A": 3 / 4, "fen_similarity_A": 3 / 4, "reward_exact_A": 3 / 4,
    "terminated_exact_A": 1 / 4, "truncated_exact_A": 3 / 4, "raw_A": (1 + 0 + 0.9 + 0.9) / 4,
}


def test_the_batch_scores_as_the_table_says():
    assert [r for r, _ in score_batch(SAMPLES, TEXTS)] == pytest.approx(REWARDS, abs=1e-12)


def test_reward_metrics_by_hand():
    m = reward_metrics(torch.tensor(REWARDS), TASKS, score_batch(SAMPLES, TEXTS))
    assert m.keys() == REWARD_METRICS.keys()
    for k, v in REWARD_METRICS.items():
        assert m[k] == pytest.approx(v, abs=1e-6), k


def test_reward_metrics_of_one_task_and_one_row():
    """A batch without A: has no A: metrics; a task with one row has std 0."""
    m = reward_metrics(torch.tensor([0.608, 1.0]), ["P", "A"], score_batch([P, A], [TEXTS[1], REF_A]))
    assert (m["reward_std_P"], m["reward_std_A"], m["best_P"], m["fen_exact_A"]) == (0.0, 0.0, 0.5, 1.0)
    m = reward_metrics(torch.tensor(REWARDS[:2]), TASKS[:2], score_batch(SAMPLES[:2], TEXTS[:2]))
    assert not [k for k in m if k.endswith("_A")] and m["candidates_P"] == pytest.approx(0.6)


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    d = tmp_path_factory.mktemp("metrics")
    with open(POOL_PATH, encoding="utf-8") as f:
        (d / "pool.jsonl").write_text("".join(f.readlines()[1:5]))
    snapshot = save_model(tiny_gpt(eos_bias=8.5), Tokenizer.gpt2(), str(d / "model"))
    return train.Trainer(parse_args([
        "--model_path", snapshot, "--device", "cpu", "--log_dir", str(d), "--run_name", "m", "--batch_size", "4",
        "--k_samples", "2", "--max_new_tokens", "30", "--eval_every", "0", "--save_every", "0", "--log_samples", "3",
        "--data_source", "file", "--data_file", str(d / "pool.jsonl")]))


def test_a_steps_metrics_row_by_hand(trainer, monkeypatch):
    """A train_step on the batch: the reward metrics above, the token counts of the batch (a completion of 30
    tokens or more ran to --max_new_tokens 30), the group statistics, and samples.jsonl's first row of each
    of --log_samples 3 groups."""
    tok = trainer.tok
    prompts, completions = [tok.encode(s.prompt) for s in SAMPLES], [tok.encode(t) for t in TEXTS]
    r = Rollout(list(SAMPLES), prompts, completions, list(TEXTS))
    monkeypatch.setattr(trainer, "rollout", lambda: r)
    monkeypatch.setattr(trainer.scorer, "submit", lambda samples, texts: lambda: score_batch(samples, texts))
    m = trainer.train_step()
    lens = [len(c) for c in completions]
    assert lens[0] > 30 > lens[1] and lens[3] < 30 and lens[2] > 30  # the P: and A: answers are long, junk short
    # |advantage| of a group of 2 rewards d apart: (d / 2) / (d / sqrt(2) + 1e-4); group 3 has none
    adv = lambda d: (d / 2) / (d / math.sqrt(2) + 1e-4)
    want = {**REWARD_METRICS, "prompt_tokens": sum(map(len, prompts)), "prompt_len_max": max(map(len, prompts)),
            "completion_tokens": sum(lens),
            "completion_len_mean": sum(lens) / 8, "completion_clipped_ratio": sum(n >= 30 for n in lens) / 8,
            "zero_var_share": 1 / 4, "adv_abs_mean": 2 * (adv(0.392) + adv(1.3) + adv(1.084)) / 8, "step": 1}
    for k, v in want.items():
        assert m[k] == pytest.approx(v, abs=1e-5), k
    with open(f"{trainer.run_dir.path}/samples.jsonl") as f:
        rows = [json.loads(line) for line in f]
    assert [(x["task"], x["completion"], x["reward"]) for x in rows] == [
        ("P", TEXTS[0], 1.0), ("A", TEXTS[2], 1.0), ("P", TEXTS[4], -0.3)]
    with open(f"{trainer.run_dir.path}/metrics.jsonl") as f:
        assert json.loads(f.read())["reward_mean_P"] == pytest.approx(REWARD_METRICS["reward_mean_P"])


def test_a_rank_takes_the_advantages_of_its_own_rows(trainer):
    """Rank 1 of two, its rows from offset 4 of the global batch's rewards: its advantages are those of rows 4-7,
    group (1, 0) giving +-0.5 / (std 0.7071 + 1e-4) and the group of equal rewards 0, not rank 0's rows (0, 1)."""
    r = Rollout(list(SAMPLES[4:]), [[1]] * 4, [[9]] * 4, ["t"] * 4)
    rewards = torch.tensor([0.0, 1.0, 0.2, 0.2, 1.0, 0.0, 0.5, 0.5])
    adv, returns, stats = trainer.advantages(r, rewards, TASKS, offset=4)
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    assert returns is None and adv.tolist() == pytest.approx([a, -a, 0.0, 0.0]) and stats["zero_var_share"] == 0.5


def test_dynamic_sampling_stops_at_the_round_that_fills_the_batch(trainer, monkeypatch):
    """4 places, K = 2: a first round whose 4 groups all have rewards that differ fills the batch, so no second
    round is drawn; the step trains that round's rows, mean reward 3.4 / 8."""
    rounds, drawn = iter([[0.0, 1.0, 0.2, 0.3, 0.5, 0.4, 1.0, 0.0], [0.1, 0.9] * 4]), []

    def rollout():
        drawn.append(Rollout(list(SAMPLES), [[10 * len(drawn) + i] for i in range(8)], [[9]] * 8, list(TEXTS)))
        return drawn[-1]
    monkeypatch.setattr(trainer, "rollout", rollout)
    monkeypatch.setattr(trainer.scorer, "submit",
                        lambda samples, texts: (lambda rs=next(rounds): [(x, {}) for x in rs]))
    r, m = trainer.informative_rollout(train.PhaseTimer(False))
    assert len(drawn) == 1 and r.prompts == [[i] for i in range(8)]
    assert m == pytest.approx({"ds_rounds": 1, "ds_groups_drawn": 4, "ds_groups_kept": 4,
                               "ds_zero_var_share_drawn": 0.0, "ds_reward_mean_drawn": 3.4 / 8})


def test_policy_loss_statistics_are_per_real_token():
    """Ratios row 0 (A = 1): 1, 1.5, 0.5; row 1 (A = -1): 0.7, 1.1, and 5 on padding. eps 0.2: 1.5 is clipped high,
    0.7 low: 2 of 5 real tokens; ratio_mean (1 + 1.5 + 0.5 + 0.7 + 1.1) / 5 = 0.96. Surrogates: row 0
    min(r, clip r) = 1, 1.2, 0.5 (mean 0.9); row 1 min(-r, -clip r) = -0.8, -1.1 (mean -0.95); grpo loss
    -(0.9 - 0.95) / 2 = 0.025."""
    ratio = torch.tensor([[1.0, 1.5, 0.5], [0.7, 1.1, 5.0]])
    mask = torch.tensor([[True, True, True], [True, True, False]])
    loss, stats = policy_loss(ratio.log(), torch.zeros(2, 3), torch.tensor([1.0, -1.0]), mask)
    assert loss.item() == pytest.approx(0.025, abs=1e-6)
    assert stats == pytest.approx({"clip_frac": 0.4, "clip_low_frac": 0.2, "clip_high_frac": 0.2, "ratio_mean": 0.96})
    # the advantages' signs flipped: 0.5 of row 0 is clipped low, nothing of row 1 high (its 5 is padding)
    _, flipped = policy_loss(ratio.log(), torch.zeros(2, 3), torch.tensor([-1.0, 1.0]), mask)
    assert (flipped["clip_low_frac"].item(), flipped["clip_high_frac"].item()) == pytest.approx((0.2, 0.0))


def test_kl_and_entropy_metrics_are_per_token_whatever_the_loss_type():
    """Uniform logits over 4 tokens: entropy log 4 at every token. Reference log-probs d above the policy's:
    k3 = e^d - d - 1, 0 on row 0's 3 tokens and e - 2 on row 1's one token: per token (e - 2) / 4, where the
    grpo mean over rows would be (e - 2) / 2."""
    logits, ids = torch.zeros(2, 3, 4), torch.zeros(2, 3, dtype=torch.long)
    mask = torch.tensor([[True, True, True], [True, False, False]])
    ref_logp = torch.full((2, 3), math.log(0.25)) + torch.tensor([[0.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    for loss_type in ("grpo", "dr_grpo", "dapo"):
        _, m = grpo_loss(logits, ids, mask, torch.zeros(2), LossSettings(loss_type=loss_type, kl_coef=0.1), ref_logp=ref_logp)
        assert m["kl"] == pytest.approx((math.e - 2) / 4, abs=1e-6) and m["entropy"] == pytest.approx(math.log(4), abs=1e-6)


def test_the_global_batch_of_two_ranks_by_hand(monkeypatch):
    """GlobalBatch.gather on rank 1 of two (distributed.gather stubbed with both ranks' parts): every rank's rows in
    rank order, this rank's rewards from its offset, the prompt tokens of both ranks and the longest of their
    prompts; a completion of --max_new_tokens tokens (30) or more ran out of room: clipped."""
    parts = [([(1.0, {}), (0.0, {})], ["P", "P"], [30, 4], 11, 9, {}),
             ([(0.5, {}), (-1.0, {})], ["A", "A"], [31, 29], 7, 7, {})]
    monkeypatch.setattr(distributed, "gather", lambda mine: parts)
    r = types.SimpleNamespace(scores=parts[1][0], tasks=["A", "A"], completions=[[0] * 31, [0] * 29], prompts=[[0] * 7],
                              weightless=False)
    g = GlobalBatch.gather(r, {}, rank=1)
    assert g.offset == 2 and g.rewards.tolist() == [1.0, 0.0, 0.5, -1.0] and r.rewards.tolist() == [0.5, -1.0]
    m = g.metrics(30)
    assert (m["prompt_tokens"], m["prompt_len_max"], m["completion_tokens"], m["completion_len_mean"]) == (18, 9, 94, 23.5)
    assert m["completion_clipped_ratio"] == 0.5 and m["reward_mean_A"] == -0.25


def test_merged_sampling_metrics_weigh_ranks_by_groups_drawn():
    """Rank 0 drew 2 groups (zero-variance share 0.5, reward mean 0.2), rank 1 drew 6 (1/3, 0.6): over 8 groups
    (1 + 2) / 8 and (0.4 + 3.6) / 8; rounds the most of either."""
    parts = [{"ds_rounds": 1, "ds_groups_drawn": 2, "ds_groups_kept": 1, "ds_zero_var_share_drawn": 0.5,
              "ds_reward_mean_drawn": 0.2},
             {"ds_rounds": 3, "ds_groups_drawn": 6, "ds_groups_kept": 2, "ds_zero_var_share_drawn": 1 / 3,
              "ds_reward_mean_drawn": 0.6}]
    assert merge_sampling(parts) == pytest.approx({
        "ds_rounds": 3, "ds_groups_drawn": 8, "ds_groups_kept": 3, "ds_zero_var_share_drawn": 3 / 8,
        "ds_reward_mean_drawn": 4 / 8})
    assert merge_sampling([{}]) == {} and merge_sampling([parts[1]]) == parts[1]


def test_dynamic_sampling_that_keeps_no_group_trains_the_last_rollout_whole():
    """Every round's groups of equal rewards (all wrong early in a run, or --dynamic_sampling_max_rounds 1): the
    step trains on the last round's rollout whole, its groups in order, so the KL term still acts."""
    def scored(first, reward):  # 2 groups of K = 2, every reward the same
        ids = [[first + i] for i in range(4)]
        return Rollout(list("abcd"), ids, [[9]] * 4, list("wxyz"), scores=[(reward, {})] * 4)

    groups = InformativeGroups(K=2, min_std=0.0)
    for r in (scored(1, 0.0), scored(5, 0.5)):
        groups.add(r)
    out = groups.rollout(2)
    assert out.prompts == [[5], [6], [7], [8]] and out.scores == [(0.5, {})] * 4
    out.pad(eos=0, max_new_tokens=4, device="cpu")
    assert out.ids.shape == (4, 3)  # prompt, completion, EOS
    assert groups.metrics(2) == {"ds_rounds": 2, "ds_groups_drawn": 4, "ds_groups_kept": 0,
                                 "ds_zero_var_share_drawn": 1.0, "ds_reward_mean_drawn": 0.25}


def test_a_rank_that_kept_no_group_while_another_did_sends_a_weightless_placeholder(monkeypatch):
    """Under torchrun, no group kept here but some on another rank: the last rollout's first group (K = 2) as a
    placeholder whose completions are padding, whose rows GlobalBatch leaves out (rewards 0 here, none sent), that
    logs no sample and that the normaliser G does not count."""
    groups = InformativeGroups(K=2, min_std=0.0)
    groups.add(Rollout(list("abcd"), [[1], [2], [3], [4]], [[9], [8]] * 2, list("wxyz"), scores=[(0.5, {})] * 4))
    out = groups.rollout(2, others_kept=True)
    assert out.weightless and out.prompts == [[1], [2]] and out.scores == [(0.5, {})] * 2
    out.pad(eos=0, max_new_tokens=4, device="cpu")
    assert out.ids.shape == (2, 3) and not out.comp_mask.any() and out.mask[:, :out.Tp].all()
    assert normalisers(out.comp_mask)["n_seqs"] == 0 and out.logged(1, 4, 2) == []
    sent = []
    monkeypatch.setattr(distributed, "gather", lambda mine: sent.append(mine) or [
        ([(1.0, {}), (0.0, {})], ["P", "P"], [3, 4], 5, 3, {}), mine])
    g = GlobalBatch.gather(out, {}, rank=1)
    assert sent == [([], [], [], 0, 0, {})] and g.rewards.tolist() == [1.0, 0.0] and out.rewards.tolist() == [0.0, 0.0]
    assert not groups.rollout(2).weightless  # no rank kept a group: the last rollout whole, as before


def test_a_rank_that_kept_groups_trains_them_whatever_another_rank_kept():
    """others_kept asks for a placeholder only of a rank that kept no group: one that kept some trains them."""
    groups = InformativeGroups(K=2, min_std=0.0)
    groups.add(Rollout(list("abcd"), [[1], [2], [3], [4]], [[9]] * 4, list("wxyz"),
                       scores=[(0.5, {}), (0.5, {}), (0.0, {}), (1.0, {})]))
    out = groups.rollout(2, others_kept=True)
    assert not out.weightless and out.prompts == [[3], [4]] and out.scores == [(0.0, {}), (1.0, {})]


def test_dynamic_sampling_keeps_the_first_groups_drawn_and_counts_only_equal_rewards_as_zero_variance():
    """min_std 0.3, K = 2. Round 1: rewards (0, 0) equal, (0, 0.2) std 0.14 (dropped, yet not of zero variance),
    (0, 1) kept. Round 2: (1, 0) kept, (0.5, 0.5) equal, (0, 1) kept. Three groups kept for 2 places: the first
    two in draw order. Zero variance 2 of 6 groups drawn; mean reward (1.2 + 3) / 12 = 0.35."""
    def scored(first, rewards):
        n = len(rewards)
        return Rollout(["s"] * n, [[first + i] for i in range(n)], [[9]] * n, ["t"] * n,
                       scores=[(x, {}) for x in rewards])

    groups = InformativeGroups(K=2, min_std=0.3)
    groups.add(scored(1, [0.0, 0.0, 0.0, 0.2, 0.0, 1.0]))
    groups.add(scored(11, [1.0, 0.0, 0.5, 0.5, 0.0, 1.0]))
    assert groups.rollout(2).prompts == [[5], [6], [11], [12]]
    assert groups.metrics(2) == pytest.approx({"ds_rounds": 2, "ds_groups_drawn": 6, "ds_groups_kept": 2,
                                               "ds_zero_var_share_drawn": 2 / 6, "ds_reward_mean_drawn": 0.35})


if __name__ == "__main__":
    import sys
    sys.exit(pytest.main([__file__, "-q"]))
