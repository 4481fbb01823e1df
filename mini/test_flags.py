"""Every Config flag reaches the code that uses it: a changed flag changes, to a hand-computed value, what
its consumer receives or returns (the loss settings, the optimizer, the generation call, the advantages, the
prompt sources, the engine reward, the controller of the adaptive KL coefficient). FLAG_TESTS names,
for every field of Config, the test that shows it; test_every_flag_has_a_test keeps it complete.

The trainers here read 8 positions of the shipped pool (--data_source file), so that each starts in < 1 s.

    python mini/test_flags.py
"""
import json
import math
import os
import random
import re
import subprocess
import sys

import pytest
import torch

import mini.train as train
from mini.config import FIELDS, POOL_PATH, Config
from mini.flags import error_sentence, parse_args, problems, wrong_types
from mini.dataset import PoolSource, StreamSource, make_source
from mini.formats import policy_prompt
from mini.loader import save_model
from mini.reward_scorer import EngineReward, engine_reward
from mini.runtime import autocast
from mini.test_train import tiny_gpt
from mini.tokenizer import Tokenizer

HERE = os.path.dirname(os.path.abspath(__file__))
K = 2


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("flags")
    with open(POOL_PATH, encoding="utf-8") as f:
        (d / "pool8.jsonl").write_text("".join(f.readlines()[1:9]))  # the header line, then 8 positions
    return save_model(tiny_gpt(eos_bias=8.5), Tokenizer.gpt2(), str(d / "model")), str(d / "pool8.jsonl")


def flags(files, log_dir, *extra, source=True):
    snapshot, data = files
    return ["--model_path", snapshot, "--device", "cpu", "--log_dir", str(log_dir), "--run_name", "f",
            "--batch_size", "2", "--k_samples", str(K), "--max_new_tokens", "6", "--eval_every", "0", "--save_every", "0",
            *(["--data_source", "file", "--data_file", data] if source else []), *extra]


def trainer(files, log_dir, *extra):
    return train.Trainer(parse_args(flags(files, log_dir, *extra)))


@pytest.fixture(scope="module")
def shared(files, tmp_path_factory):
    """One trainer whose cfg each test changes (monkeypatch restores it): update() reads cfg at call time."""
    return trainer(files, tmp_path_factory.mktemp("shared"))


class Recorder:
    """train.grpo_loss that records the settings, normalisers and keyword arguments of each call."""

    def __init__(self):
        self.calls = []

    def __call__(self, logits, ids, mask, adv, settings, norm, **kw):
        self.calls.append((settings, dict(norm), dict(kw, logits=logits)))
        return train.grpo.grpo_loss(logits, ids, mask, adv, settings, norm, **kw)


def one_update(t, monkeypatch, rewards=(0.0, 1.0, 0.25, 0.5)):
    """rollout, prepare, advantages and update with the given rewards; (rollout, stats, loss calls, the
    optimizer's param_group lrs and gradient norm at each step)."""
    rec, steps = Recorder(), []
    monkeypatch.setattr(train, "grpo_loss", rec)
    step = t.optimizer.step

    def recording_step(*a, **kw):
        grads = [p.grad for g in t.optimizer.param_groups for p in g["params"] if p.grad is not None]
        steps.append(([g["lr"] for g in t.optimizer.param_groups], torch.norm(torch.stack([g.norm() for g in grads])).item()))
        return step(*a, **kw)
    monkeypatch.setattr(t.optimizer, "step", recording_step)
    r = t.rollout()
    t.prepare(r)
    r.rewards = torch.tensor(rewards[:len(r.prompts)])
    adv, returns, _ = t.advantages(r)
    stats = t.update(r, adv, returns)
    return r, stats, rec.calls, steps


# ----------------------------------------------------------------------------- the loss

LOSS_FLAGS = {"temperature": 0.7, "clip_eps_low": 0.13, "clip_eps_high": 0.31, "loss_type": "dapo",
              "kl_type": "forward", "kl_coef": 0.07, "entropy_coef": 0.03, "value_coef": 0.4, "value_clip": 0.6}


@pytest.mark.parametrize("name", LOSS_FLAGS)
def test_loss_flags_reach_the_loss(shared, monkeypatch, name):
    monkeypatch.setattr(shared.cfg, name, LOSS_FLAGS[name])
    _, _, calls, _ = one_update(shared, monkeypatch)
    assert [getattr(s, name) for s, _, _ in calls] == [LOSS_FLAGS[name]]


def test_fused_logprobs_reaches_the_policy_and_reference_heads(files, tmp_path, shared, monkeypatch):
    """--fused_logprobs: the loss gets the policy's and the reference's output layers as fused logprobs.Heads
    (log-probs without the logits); without it, plain ones."""
    monkeypatch.setattr(shared.cfg, "kl_type", "forward")  # an exact KL: the reference's Head reaches the loss
    for t, fused in ((trainer(files, tmp_path, "--fused_logprobs", "--kl_type", "forward"), True), (shared, False)):
        _, _, calls, _ = one_update(t, monkeypatch)
        assert [(kw["logits"].fused, kw["ref_logits"].fused) for _, _, kw in calls] == [(fused, fused)]


def test_entropy_every_skips_the_entropy_between_its_steps(shared, monkeypatch):
    """--entropy_every 3 (--entropy_coef 0): the entropy is computed and logged on steps 0 and 3 of 0-4 only."""
    monkeypatch.setattr(shared.cfg, "entropy_every", 3)
    seen = []
    for step in range(5):
        monkeypatch.setattr(shared, "step", step)
        _, stats, calls, _ = one_update(shared, monkeypatch)
        seen.append(([kw["with_entropy"] for _, _, kw in calls], "entropy" in stats))
    assert seen == [([True], True), ([False], False), ([False], False), ([True], True), ([False], False)]


def test_adaptive_kl_coefficient_reaches_the_loss(shared, monkeypatch):
    """With --adaptive_kl the loss gets the controller's coefficient, not --kl_coef; --kl_warmup_steps ramps
    whichever it is: at step 1 of 4, 0.37 * 1/4 = 0.0925."""
    monkeypatch.setattr(shared, "kl_ctl", train.grpo.AdaptiveKLController(0.37, 0.02, 100))
    monkeypatch.setattr(shared.cfg, "kl_coef", 0.02)
    for adaptive, warmup, step, want in [(True, 0, 0, 0.37), (False, 0, 0, 0.02), (True, 4, 1, 0.0925),
                                         (False, 4, 1, 0.005), (True, 4, 4, 0.37)]:
        monkeypatch.setattr(shared.cfg, "adaptive_kl", adaptive)
        monkeypatch.setattr(shared.cfg, "kl_warmup_steps", warmup)
        monkeypatch.setattr(shared, "step", step)
        _, stats, calls, _ = one_update(shared, monkeypatch)
        assert calls[0][0].kl_coef == pytest.approx(want, abs=1e-12) and stats["kl_coef"] == calls[0][0].kl_coef


def test_target_kl_and_horizon_steer_the_coefficient_after_each_step(files, tmp_path, shared, monkeypatch):
    """train_step feeds the step's KL to the controller built from --kl_coef, --target_kl, --kl_horizon:
    beta <- 0.05 * (1 + clip(kl / 0.5 - 1, -0.2, 0.2) / 10); without --adaptive_kl it stays --kl_coef."""
    adaptive = trainer(files, tmp_path, "--kl_coef", "0.05", "--target_kl", "0.5", "--kl_horizon", "10", "--adaptive_kl")
    assert (adaptive.kl_ctl.coef, adaptive.kl_ctl.target, adaptive.kl_ctl.horizon) == (0.05, 0.5, 10)
    for t, coef in ((adaptive, 0.05), (shared, shared.kl_ctl.coef)):
        with torch.no_grad():  # a policy away from the reference: the KL is not 0
            for p in t.model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(3)))
        monkeypatch.setattr(t.scorer, "submit", lambda samples, texts: lambda: [(x, {}) for x in (0.0, 1.0, 0.25, 0.5)])
        m = t.train_step()
        assert m["kl"] > 0
        want = coef * (1 + min(max(m["kl"] / 0.5 - 1, -0.2), 0.2) / 10) if t is adaptive else coef
        assert t.kl_ctl.coef == pytest.approx(want, rel=1e-12)


# ----------------------------------------------------------------------------- the optimizer

def test_lr_schedule_flags_reach_the_optimizer(shared, monkeypatch):
    """--lr 1e-3, --steps 10, --warmup_steps 4, --decay_steps 2, --min_lr_ratio 0.5, and a rollback's scale:
    step 1 warms up to 2/4; step 5 is 1/4 into the cosine from 4 to 8: 0.5 + 0.5 * 0.5 * (1 + cos(pi / 4));
    step 9 decays linearly: 0.5 * (10 - 9) / 2."""
    for name, v in {"lr": 1e-3, "steps": 10, "warmup_steps": 4, "decay_steps": 2, "min_lr_ratio": 0.5}.items():
        monkeypatch.setattr(shared.cfg, name, v)
    for step, scale, factor in [(1, 1.0, 0.5), (5, 1.0, 0.5 + 0.25 * (1 + math.cos(math.pi / 4))), (9, 1.0, 0.25),
                                (1, 0.5, 0.25)]:
        monkeypatch.setattr(shared, "step", step)
        monkeypatch.setattr(shared, "lr_scale", scale)
        _, stats, _, steps = one_update(shared, monkeypatch)
        assert steps[0][0] == pytest.approx([1e-3 * factor] * 2, rel=1e-12) and stats["lr"] == steps[0][0][0]


@pytest.fixture(scope="module")
def built(files, tmp_path_factory):
    """A trainer started with non-default flags that only its start reads."""
    return trainer(files, tmp_path_factory.mktemp("built"), "--weight_decay", "0.3", "--adam_beta1", "0.8",
                   "--adam_beta2", "0.9", "--lr", "2e-4", "--use_gae", "--grad_checkpointing", "--reward_shaping",
                   "graduated")


def test_optimizer_flags_reach_adamw(built):
    assert [(g["weight_decay"], g["betas"], g["lr"]) for g in built.optimizer.param_groups] == [
        (0.3, (0.8, 0.9), 2e-4), (0.0, (0.8, 0.9), 2e-4)]
    # --weight_decay reaches the weight matrices only, never the embeddings (wte is also the output layer), the
    # biases or the norms; the value head's matrix is one
    named = [*built.model.named_parameters(), *built.value_head.named_parameters(prefix="value_head")]
    names = {id(p): n for n, p in named}
    groups = [{names[id(p)] for p in g["params"]} for g in built.optimizer.param_groups]
    matrices = [f"transformer.h.{i}.{m}.weight" for i in range(built.model.config.n_layer)
                for m in ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")]
    assert groups[0] == {*matrices, "value_head.v.weight"} and groups[1] == set(names.values()) - groups[0]


def test_grad_clip_reaches_the_clipping(shared, monkeypatch):
    """--grad_clip 1e-3: the optimizer sees a gradient of norm 1e-3; 0: the whole gradient (grad_norm)."""
    monkeypatch.setattr(shared.cfg, "grad_clip", 1e-3)
    _, stats, _, steps = one_update(shared, monkeypatch)
    assert stats["grad_norm"] > 1e-2 and steps[0][1] == pytest.approx(1e-3, rel=1e-4)
    monkeypatch.setattr(shared.cfg, "grad_clip", 0.0)
    _, stats, _, steps = one_update(shared, monkeypatch)
    assert steps[0][1] == pytest.approx(stats["grad_norm"], rel=1e-4)


def test_grad_clip_and_grad_norm_cover_the_value_head(built, monkeypatch):
    """--use_gae: the critic's gradient is clipped with the policy's, one global norm over everything the
    optimizer steps (--grad_clip 1e-3), and is part of the logged grad_norm (--grad_clip 0)."""
    step, head_norms = built.optimizer.step, []

    def step_seeing_the_head(*a, **kw):
        head_norms.append(built.value_head.v.weight.grad.norm().item())
        return step(*a, **kw)
    monkeypatch.setattr(built.optimizer, "step", step_seeing_the_head)
    monkeypatch.setattr(built.cfg, "grad_clip", 1e-3)
    _, stats, _, steps = one_update(built, monkeypatch)
    assert head_norms[-1] > 0 and stats["grad_norm"] > 1e-2 and steps[0][1] == pytest.approx(1e-3, rel=1e-4)
    monkeypatch.setattr(built.cfg, "grad_clip", 0.0)
    _, stats, _, steps = one_update(built, monkeypatch)
    assert head_norms[-1] > 0 and steps[0][1] == pytest.approx(stats["grad_norm"], rel=1e-4)


class NanGradient(torch.autograd.Function):
    """The identity whose backward is NaN: a finite loss with a non-finite gradient (an overflow in backward)."""
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        return grad * float("nan")


def test_a_finite_loss_with_a_non_finite_gradient_is_not_applied(shared, monkeypatch):
    """update() returns None (the caller rolls back) and the weights stay as they were."""
    before = [p.detach().clone() for p in shared.model.parameters()]
    real = train.grpo.grpo_loss
    monkeypatch.setattr(train.grpo, "grpo_loss", lambda *a, **kw: (lambda v, m: (NanGradient.apply(v), m))(*real(*a, **kw)))
    _, stats, _, steps = one_update(shared, monkeypatch)
    assert stats is None and steps == []
    assert all(torch.equal(a, b) for a, b in zip(shared.model.parameters(), before))


def test_epochs_and_micro_batches(shared, monkeypatch):
    """--num_iterations 3, --micro_batch_size 3 over 4 rows: 3 optimizer steps, 2 loss calls each (rows 0-2,
    3), the first epoch on-policy (no old log-probs), the later ones against the behaviour policy."""
    monkeypatch.setattr(shared.cfg, "num_iterations", 3)
    monkeypatch.setattr(shared.cfg, "micro_batch_size", 3)
    r, _, calls, steps = one_update(shared, monkeypatch)
    assert len(steps) == 3 and len(calls) == 6
    assert [kw["old_logp"] is None for _, _, kw in calls] == [True, True, False, False, False, False]
    assert [kw["ref_logp"].shape[0] for _, _, kw in calls] == [3, 1] * 3
    assert all(n["n_seqs"] == 4 and n["budget"] == shared.cfg.max_new_tokens for _, n, _ in calls)
    assert r.old_logp is not None


# ----------------------------------------------------------------------------- sampling and advantages

def test_sampling_flags_reach_generate(shared, monkeypatch):
    seen = []
    real = train.generate

    def generate(model, prompts, max_new_tokens, temperature, top_k, eos, compile_decode=False, shared_prefix=None):
        seen.append((len(prompts), max_new_tokens, temperature, top_k, compile_decode, shared_prefix))
        return real(model, prompts, max_new_tokens, temperature, top_k, eos)
    monkeypatch.setattr(train, "generate", generate)
    for name, v in {"max_new_tokens": 5, "temperature": 0.9, "top_k": 3, "compile_decode": True, "batch_size": 3,
                    "k_samples": 3, "shared_prefix_decode": False}.items():
        monkeypatch.setattr(shared.cfg, name, v)
    monkeypatch.setattr(shared, "local_batch", 3)  # batch_size / world, set at the start
    r = shared.rollout()
    assert seen == [(9, 5, 0.9, 3, True, False)]
    assert [s.prompt for s in r.samples[::3]] == [s.prompt for s in r.samples[2::3]]  # groups of 3, contiguous
    assert all(len(c) <= 5 for c in r.completions)


@pytest.mark.parametrize("scale, want", [
    # rewards (0, 1 | 0.25, 0.5), groups of 2: Bessel variances 0.5^2 + 0.5^2 = 0.5 and 0.125^2 + 0.125^2 = 0.03125;
    # the batch's: mean 0.4375, sum of squares 0.19141 + 0.31641 + 0.03516 + 0.00391 = 0.546875, / 3 -> 0.42696
    ("group", [-0.5 / (0.5 ** 0.5 + 1e-4), 0.5 / (0.5 ** 0.5 + 1e-4), -0.125 / (0.03125 ** 0.5 + 1e-4),
               0.125 / (0.03125 ** 0.5 + 1e-4)]),
    ("batch", [-0.5 / (0.42696 + 1e-4), 0.5 / (0.42696 + 1e-4), -0.125 / (0.42696 + 1e-4), 0.125 / (0.42696 + 1e-4)]),
    ("none", [-0.5, 0.5, -0.125, 0.125]),
])
def test_scale_rewards_reaches_the_advantages(shared, monkeypatch, scale, want):
    monkeypatch.setattr(shared.cfg, "scale_rewards", scale)
    r = shared.rollout()
    r.rewards = torch.tensor([0.0, 1.0, 0.25, 0.5])
    adv, _, _ = shared.advantages(r)
    assert adv.tolist() == pytest.approx(want, abs=2e-5)


def test_baseline_flags_reach_the_baseline(files, tmp_path):
    """--baseline_type ema --ema_decay 0.5, P: groups (0, 1) and (0.25, 0.5): the first batch sets the mean
    to 0.4375; a second batch of the same rewards keeps it, (0.5 * 0.4375 + 0.5 * 0.4375), so every
    advantage is r - 0.4375."""
    t = trainer(files, tmp_path, "--baseline_type", "ema", "--ema_decay", "0.5", "--scale_rewards", "none",
                "--mix_env_ratio", "0")
    assert (t.baseline.baseline_type, t.baseline.decay) == ("ema", 0.5)
    r = t.rollout()
    r.rewards = torch.tensor([0.0, 1.0, 0.25, 0.5])
    t.advantages(r)
    r.rewards = torch.tensor([1.0, 1.0, 0.0, 1.0])  # mean 0.75: 0.5 * 0.4375 + 0.5 * 0.75 = 0.59375
    adv, _, _ = t.advantages(r)
    assert adv.tolist() == pytest.approx([0.0, 0.0, -0.59375, 0.40625], abs=1e-6)


def test_dynamic_sampling_flags(files, tmp_path, monkeypatch):
    """Rounds of 2 groups of 2: (0, 0.1) has std 0.0707, dropped at --dynamic_sampling_min_std 0.1; equal
    rewards are always dropped. Round 1 keeps nothing, round 2 one group, round 3 two: the step has its
    2 groups after 3 rounds; with --dynamic_sampling_max_rounds 2 it ends at round 2 with 1 group."""
    rounds = [[0.0, 0.1, 0.5, 0.5], [0.0, 1.0, 0.3, 0.3], [0.2, 0.9, 1.0, 0.0]]
    t = trainer(files, tmp_path, "--dynamic_sampling", "--dynamic_sampling_min_std", "0.1",
                "--dynamic_sampling_max_rounds", "3")
    for max_rounds, kept in ((3, 2), (2, 1)):
        monkeypatch.setattr(t.cfg, "dynamic_sampling_max_rounds", max_rounds)
        script = iter(rounds)
        monkeypatch.setattr(t.scorer, "submit", lambda samples, texts: (lambda rs=next(script): [(x, {}) for x in rs]))
        r, m = t.informative_rollout(train.PhaseTimer(False))
        drawn = rounds[:max_rounds]
        assert m == {"ds_rounds": max_rounds, "ds_groups_drawn": 2 * max_rounds, "ds_groups_kept": kept,
                     # groups of equal rewards: round 1's second, round 2's second
                     "ds_zero_var_share_drawn": 2 / (2 * max_rounds),
                     "ds_reward_mean_drawn": pytest.approx(sum(map(sum, drawn)) / (4 * max_rounds))}
        assert [x for x, _ in r.scores] == ([0.0, 1.0, 0.2, 0.9] if kept == 2 else [0.0, 1.0])


def test_use_gae_grad_checkpointing_and_shaping(built, shared):
    assert built.value_head is not None and built.model.grad_checkpointing is True
    assert shared.value_head is None and shared.model.grad_checkpointing is False
    trained = {id(p) for g in built.optimizer.param_groups for p in g["params"]}
    assert all(id(p) in trained for p in built.value_head.parameters())
    assert (built.scorer.shaping, shared.scorer.shaping) == ("graduated", "continuous")


def test_use_gae_reports_the_advantages_it_uses(built):
    """With --use_gae the loss gets GAE's per-token advantages; adv_abs_mean is their mean |Â| over the
    completion tokens, not the discarded group advantages'."""
    r = built.rollout()
    built.prepare(r)
    r.rewards = torch.linspace(0.0, 1.0, len(r.prompts))
    adv, _, stats = built.advantages(r)
    m = r.comp_mask.bool()
    assert adv.dim() == 2 and stats["adv_abs_mean"] == pytest.approx(adv[m].abs().mean().item(), rel=1e-6)


def test_bf16_flags_reach_autocast():
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert isinstance(autocast(cpu, Config(bf16_cpu=True)), torch.autocast)
    assert not isinstance(autocast(cpu, Config(bf16_cpu=False, bf16=True)), torch.autocast)
    assert not isinstance(autocast(cuda, Config(bf16=False, bf16_cpu=True)), torch.autocast)


# ----------------------------------------------------------------------------- sources, scorers, evaluation

def test_data_flags_reach_the_source(files, tmp_path):
    _, data = files
    cfg = parse_args(flags(files, tmp_path, "--mix_env_ratio", "0.35", "--seed", "7"))
    s = make_source(cfg, rank=2)
    assert isinstance(s, PoolSource) and s.env_ratio == 0.35 and len(s.policy) == 8
    assert s.rng.getstate() == random.Random(9).getstate()  # seed + rank
    bad = tmp_path / "bad.jsonl"
    bad.write_text(open(data).read() + "not json\n")
    assert len(make_source(Config(data_source="file", data_file=str(bad), skip_bad_lines=True)).policy) == 8
    with pytest.raises(ValueError, match="bad.jsonl:9"):
        make_source(Config(data_source="file", data_file=str(bad), skip_bad_lines=False))


def test_generate_source_gets_depth_and_workers(tmp_path):
    s = make_source(Config(data_source="generate", stockfish_depth=3, annotate_workers=2, mix_env_ratio=0.4, seed=5,
                           policy_pad="89"))
    try:
        assert isinstance(s, StreamSource) and (s.ann.limit.depth, s.ann.workers, s.env_ratio, s.seed) == (3, 2, 0.4, 5)
        assert s.pads == (89,)
    finally:
        s.close()
    s = make_source(Config(data_source="generate", annotate_workers=1, seed=5), rank=2)  # torchrun rank 2's own stream
    s.close()
    assert s.seed == 7


@pytest.mark.parametrize("pad, widths", [(None, {90}), ("90", {90}), ("89", {89}), ("both", {89, 90})])
def test_policy_pad_reaches_the_source(files, tmp_path, pad, widths):
    """--policy_pad 89: every P: prompt the source draws has its FEN padded to 89 columns (3 + 88 characters,
    the last space merging into ' M'), RookWorld's validation file's width; 90 (the default) the generator
    code's; both: some of each."""
    cfg = parse_args(flags(files, tmp_path, *(["--policy_pad", pad] if pad else []), "--mix_env_ratio", "0"))
    drawn = make_source(cfg).draw(64)
    assert {s.task for s in drawn} == {"P"} and all(len(s.fen) < 88 for s in drawn)
    assert {len(s.prompt) - 2 for s in drawn} == widths
    assert all(s.prompt in (policy_prompt(s.fen, 89), policy_prompt(s.fen, 90)) for s in drawn)


def test_selfplay_flags_reach_the_source(files, tmp_path, monkeypatch):
    """--data_source selfplay hands every selfplay flag to SelfPlaySource; --selfplay_refresh 2 refreshes it at
    steps 0, 2 and 4 with the current model."""
    made = []

    class Source:
        def __init__(self, tok, source, **kw):
            made.append(self)
            self.kw, self.source, self.refreshed, self.metrics = kw, source, [], {}

        def refresh(self, model, autocast=None):
            self.refreshed.append(t.step)
            assert model is t.model

        def draw(self, n):
            return self.source.draw(n)

        def close(self):
            pass
    monkeypatch.setattr(train, "SelfPlaySource", Source)
    monkeypatch.setattr(train, "make_source", lambda cfg, buffer, rank: make_source(
        Config(data_source="file", data_file=files[1]), buffer, rank))
    t = train.Trainer(parse_args(flags(files, tmp_path, source=False) + [
        "--data_source", "selfplay", "--selfplay_games", "3", "--selfplay_plies", "5", "--selfplay_refresh", "2",
        "--selfplay_mix", "0.7", "--selfplay_temperature", "0.8", "--selfplay_top_k", "4", "--mix_env_ratio", "0.3",
        "--stockfish_depth", "6", "--annotate_workers", "3", "--stockfish_path", "/usr/games/stockfish",
        "--seed", "11", "--policy_pad", "both"]))
    assert made[0].kw == dict(games=3, plies=5, temperature=0.8, top_k=4, max_new_tokens=6, mix=0.7, env_ratio=0.3,
                              depth=6, workers=3, stockfish_path="/usr/games/stockfish", seed=11, pads=(90, 89))
    monkeypatch.setattr(t.scorer, "submit", lambda samples, texts: lambda: [(float(i % 2), {}) for i in range(len(samples))])
    for _ in range(5):
        t.train_step()
    assert made[0].refreshed == [0, 2, 4]


def test_engine_flags_reach_the_engine_reward(tmp_path):
    cfg = Config(p_reward="engine", engine_depth=7, engine_nodes=500, engine_cache=str(tmp_path / "c.jsonl"),
                 stockfish_path="/usr/games/stockfish")
    assert engine_reward(cfg) == EngineReward("/usr/games/stockfish", 7, 500, str(tmp_path / "c.jsonl"))
    assert engine_reward(Config(p_reward="labels")) is None


def test_evaluation_flags(files, tmp_path, monkeypatch):
    """--eval_every 2 --eval_n 3: 3 P: and 3 A: held-out prompts, evaluated at step 2 and not 1, with the run's
    --reward_shaping and --max_new_tokens; --eval_chess adds quick_metrics."""
    calls = []
    monkeypatch.setattr(train, "evaluate", lambda model, tok, samples, max_new_tokens, **kw: (
        calls.append(("eval", len(samples), max_new_tokens, kw["shaping"])), ({"eval_reward": 0.5}, []))[1])
    monkeypatch.setattr(train, "quick_metrics", lambda model, tok, max_new_tokens, autocast: (
        calls.append(("chess", max_new_tokens)), {"chess_mate_acc": 0.25})[1])
    t = trainer(files, tmp_path, "--eval_every", "2", "--eval_n", "3", "--eval_chess", "--reward_shaping", "graduated")
    assert [s.task for s in t.eval_samples] == ["P"] * 3 + ["A"] * 3
    monkeypatch.setattr(t.scorer, "submit", lambda samples, texts: lambda: [(float(i % 2), {}) for i in range(len(samples))])
    m1, m2 = t.train_step(), t.train_step()
    assert "eval_reward" not in m1 and (m2["eval_reward"], m2["chess_mate_acc"]) == (0.5, 0.25)
    assert calls == [("eval", 6, 6, "graduated"), ("chess", 6)]


def test_log_samples_writes_the_first_row_of_that_many_groups(shared, monkeypatch):
    """Rewards 0, 0.5, 1, 1.5 on the 4 rows: the first rows of the 2 groups are 0 and 1."""
    monkeypatch.setattr(shared.scorer, "submit", lambda samples, texts: lambda: [(0.5 * i, {}) for i in range(4)])
    path = os.path.join(shared.run_dir.path, "samples.jsonl")
    for n, want in ((1, [0.0]), (5, [0.0, 1.0]), (0, [])):
        monkeypatch.setattr(shared.cfg, "log_samples", n)
        before = os.path.getsize(path) if os.path.exists(path) else 0
        shared.train_step()
        with open(path) as f:
            f.seek(before)
            assert [json.loads(x)["reward"] for x in f] == want


# ----------------------------------------------------------------------------- the table

def existing(node):
    path, name = node.split("::")
    with open(os.path.join(HERE, "..", path), encoding="utf-8") as f:
        return re.search(rf"^def {re.escape(name)}\(", f.read(), re.M) is not None


LOSS = "mini/test_flags.py::test_loss_flags_reach_the_loss"
FLAG_TESTS = {
    **{name: LOSS for name in LOSS_FLAGS},
    **{name: "mini/test_flags.py::test_lr_schedule_flags_reach_the_optimizer"
       for name in ("lr", "steps", "warmup_steps", "decay_steps", "min_lr_ratio")},
    **{name: "mini/test_flags.py::test_optimizer_flags_reach_adamw" for name in ("weight_decay", "adam_beta1", "adam_beta2")},
    **{name: "mini/test_flags.py::test_adaptive_kl_coefficient_reaches_the_loss" for name in ("adaptive_kl", "kl_warmup_steps")},
    **{name: "mini/test_flags.py::test_target_kl_and_horizon_steer_the_coefficient_after_each_step"
       for name in ("target_kl", "kl_horizon")},
    "grad_clip": "mini/test_flags.py::test_grad_clip_reaches_the_clipping",
    **{name: "mini/test_flags.py::test_epochs_and_micro_batches" for name in ("num_iterations", "micro_batch_size")},
    **{name: "mini/test_flags.py::test_sampling_flags_reach_generate"
       for name in ("max_new_tokens", "top_k", "compile_decode", "shared_prefix_decode", "batch_size",
                    "k_samples")},
    "fused_logprobs": "mini/test_flags.py::test_fused_logprobs_reaches_the_policy_and_reference_heads",
    "entropy_every": "mini/test_flags.py::test_entropy_every_skips_the_entropy_between_its_steps",
    "scale_rewards": "mini/test_flags.py::test_scale_rewards_reaches_the_advantages",
    **{name: "mini/test_flags.py::test_baseline_flags_reach_the_baseline" for name in ("baseline_type", "ema_decay")},
    **{name: "mini/test_flags.py::test_dynamic_sampling_flags"
       for name in ("dynamic_sampling", "dynamic_sampling_min_std", "dynamic_sampling_max_rounds")},
    **{name: "mini/test_flags.py::test_use_gae_grad_checkpointing_and_shaping"
       for name in ("use_gae", "grad_checkpointing", "reward_shaping")},
    **{name: "mini/test_reference_step.py::test_trainer_update_equals_the_reference" for name in ("gamma", "gae_lambda")},
    **{name: "mini/test_flags.py::test_bf16_flags_reach_autocast" for name in ("bf16", "bf16_cpu")},
    **{name: "mini/test_flags.py::test_data_flags_reach_the_source"
       for name in ("mix_env_ratio", "seed", "data_source", "data_file", "skip_bad_lines")},
    **{name: "mini/test_flags.py::test_generate_source_gets_depth_and_workers"
       for name in ("stockfish_depth", "annotate_workers")},
    **{name: "mini/test_flags.py::test_selfplay_flags_reach_the_source"
       for name in ("selfplay_games", "selfplay_plies", "selfplay_refresh", "selfplay_mix", "selfplay_temperature",
                    "selfplay_top_k", "stockfish_path")},
    **{name: "mini/test_flags.py::test_engine_flags_reach_the_engine_reward"
       for name in ("p_reward", "engine_depth", "engine_nodes", "engine_cache")},
    "policy_pad": "mini/test_flags.py::test_policy_pad_reaches_the_source",
    "score_workers": "mini/test_train.py::test_score_workers_default_takes_spare_cores_on_cuda_only",
    **{name: "mini/test_flags.py::test_evaluation_flags" for name in ("eval_every", "eval_n", "eval_chess")},
    "log_samples": "mini/test_flags.py::test_log_samples_writes_the_first_row_of_that_many_groups",
    # flags shown by the tests of their own module
    "kl_threshold": "mini/test_train.py::test_kl_threshold_stops_cleanly",
    "save_every": "mini/test_train.py::test_injected_nan_is_rolled_back",
    "keep_last": "mini/test_runs.py::test_pruning_goes_by_step_and_keeps_the_checkpoint_just_written",
    "auto_resume": "mini/test_train.py::test_sigkill_then_auto_resume_equals_uninterrupted",
    "resume_from_checkpoint": "mini/test_train.py::test_resume_from_checkpoint_and_recovery_mode_continue_a_run",
    "recovery_mode": "mini/test_train.py::test_resume_from_checkpoint_and_recovery_mode_continue_a_run",
    "overwrite": "mini/test_runs.py::test_a_run_is_never_started_over_by_accident",
    "run_name": "mini/test_runs.py::test_a_live_process_owns_its_run",
    "log_dir": "mini/test_train.py::test_a_short_run_writes_everything",
    "model_path": "mini/test_train.py::test_a_short_run_writes_everything",
    "device": "mini/test_config.py::test_a_bad_flag_is_one_line",
    "report_to": "mini/test_train.py::test_report_to_tensorboard_mirrors_metrics_jsonl",
    "time_limit_min": "mini/test_sft.py::test_time_limit_stops_and_saves",
    "data_workers": "mini/test_sft.py::test_data_workers_draw_their_own_batches_and_train",
    "grow_layers": "mini/test_sft.py::test_grown_model_computes_the_same_function",
    "snapshot_every_min": "mini/test_sft.py::test_snapshots_on_the_way_outlive_a_crash",
    "auto_batch_size": "mini/test_train.py::test_find_batch_size_with_a_fake_memory_probe",
    "memory_fraction": "mini/test_train.py::test_find_batch_size_with_a_fake_memory_probe",
    "compile": "mini/test_reference_step.py::test_trainer_update_equals_the_reference",  # its width-buckets case
    **{name: "mini/test_reference_step.py::test_trainer_update_equals_the_reference"  # its supervised cases
       for name in ("env_sft_coef", "env_sft_batch", "policy_sft_coef", "policy_sft_batch")},
    "sft_data_file": "mini/test_reference_step.py::test_the_supervised_terms_draw_from_their_own_files",
    "policy_only_file": "mini/test_dataset.py::test_policy_only_files_give_p_prompts_and_rows_but_start_no_a_transition",
    **{name: "mini/test_sft.py::test_short_run_learns_and_writes_a_snapshot"
       for name in ("n_layer", "n_head", "n_embd", "n_positions")},
}


def test_policy_only_file_must_be_one_of_the_data_files(tmp_path, monkeypatch):
    """--policy_only_file marks files of --data_file or --sft_data_file, matched by real path; a file of neither
    would be read by nothing, so it is one sentence."""
    (tmp_path / "a.jsonl").write_text("")
    (tmp_path / "b.jsonl").write_text("")
    monkeypatch.chdir(tmp_path)
    files = {"data_source": "file", "data_file": "a.jsonl", "sft_data_file": "b.jsonl", "env_sft_coef": 1.0}
    for marked in ("a.jsonl", "./b.jsonl", f"{tmp_path / 'a.jsonl'},b.jsonl"):
        assert problems({**files, "policy_only_file": marked}) == []
    assert problems({**files, "policy_only_file": "b.jsonl,c.jsonl"}) == [
        "--policy_only_file c.jsonl is not among the files of --data_file (or train.py's --sft_data_file); list it "
        "there too, or drop it here"]
    assert problems({"policy_only_file": "a.jsonl"})[0].startswith("--policy_only_file a.jsonl is not among")
    assert problems({**files, "policy_only_file": "a.jsonl,"}) == [
        "--policy_only_file 'a.jsonl,' has an empty name between its commas; list the files as a.jsonl,b.jsonl"]


def test_every_flag_has_a_test():
    assert sorted(FLAG_TESTS) == sorted(FIELDS)
    assert [node for node in set(FLAG_TESTS.values()) if not existing(node)] == []


def test_overwrite_refuses_to_move_aside_the_model_it_would_load(tmp_path):
    """--model_path logs/t1/final --run_name t1 --overwrite moved the run, model included, then could not load it."""
    (tmp_path / "t1" / "final").mkdir(parents=True)
    flags = {"overwrite": True, "log_dir": str(tmp_path), "run_name": "t1", "model_path": str(tmp_path / "t1" / "final")}
    assert problems(flags) == [f"--overwrite would move the run {tmp_path / 't1'} aside, and with it --model_path "
                               f"{tmp_path / 't1' / 'final'}: copy the model out first, or pick another --run_name"]
    assert problems({**flags, "run_name": "t"}) == problems({**flags, "overwrite": False}) == []



def test_overwrite_refuses_to_move_aside_a_model_that_is_the_run_or_a_data_file_in_it(tmp_path):
    """--run_name naming the model's own snapshot directory, or a --data_file inside the run, with --overwrite: the
    run moved aside with its input, then the start failed on the missing path (the model's 'no config.json')."""
    (tmp_path / "t1").mkdir()
    (tmp_path / "t1" / "d.jsonl").write_text("")
    run = {"overwrite": True, "log_dir": str(tmp_path), "run_name": "t1"}
    assert problems({**run, "model_path": str(tmp_path / "t1")}) == [
        f"--overwrite would move the run {tmp_path / 't1'} aside, and with it --model_path {tmp_path / 't1'}: copy the "
        "model out first, or pick another --run_name"]
    data = {"data_source": "file", "data_file": f"{tmp_path / 't1' / 'd.jsonl'}"}
    assert problems({**run, **data}) == [f"--overwrite would move the run {tmp_path / 't1'} aside, and with it "
                                         f"--data_file {tmp_path / 't1' / 'd.jsonl'}: copy the file out first, or "
                                         "pick another --run_name"]
    assert problems({**run, "run_name": "t", **data}) == problems({**run, "overwrite": False, **data}) == []


def test_a_whole_number_past_a_c_integer_is_refused_in_one_sentence(capsys):
    """--score_workers 10**22 (an OverflowError in Pool()), --eval_n 10**22 (islice's ValueError): tracebacks
    once the model had loaded; now a sentence at parse time."""
    big = 10**22
    assert problems({"score_workers": big}) == [f"--score_workers {big} is too large a number (at most {sys.maxsize})"]
    assert problems({"steps": 10**400}) == [f"--steps 1000000000... is too large a number (at most {sys.maxsize})"]
    assert problems({"eval_n": sys.maxsize, "score_workers": -1}) == []
    with pytest.raises(SystemExit) as e:
        parse_args(["--eval_n", str(big), "--model_path", "x/y"])
    assert e.value.code == 2 and capsys.readouterr().err.endswith(f"--eval_n {big} is too large a number (at most "
                                                                  f"{sys.maxsize})\n")


def test_a_settings_file_value_of_the_wrong_kind_or_outside_the_choices_is_named():
    """A run's config.json is checked field by field: unknown keys are skipped (the next ones still checked), text is
    no number, 1 is no boolean, a choice outside the list is named with the list, shown as JSON up to 40 characters;
    a whole number fits a float field, and sft.py's narrower --data_source choices are not train.py's."""
    assert wrong_types({"nope": 1, "run_name": 5, "lr": "1e-5", "bf16": 1, "loss_type": "ppo", "policy_pad": 90,
                        "kl_type": "x" * 50, "overwrite": None}) == [
        "--run_name 5 must be text", '--lr "1e-5" must be a number', "--bf16 1 must be true or false",
        '--loss_type "ppo" must be one of grpo, dr_grpo, dapo', "--policy_pad 90 must be text",
        '--kl_type "' + "x" * 39 + " must be one of forward, reverse, symmetric, k3",
        "--overwrite null must be true or false"]
    assert wrong_types({"lr": 1, "data_source": "selfplay", "policy_pad": "both", "shared_prefix_decode": None}) == []


def test_numbers_out_of_every_range_are_one_sentence_each():
    """Non-finite floats, and whole numbers beyond a C integer either way (shown whole up to 30 digits)."""
    assert problems({"lr": float("nan"), "temperature": -math.inf}) == ["--lr nan is not a finite number",
                                                                        "--temperature -inf is not a finite number"]
    big = sys.maxsize
    assert problems({"score_workers": -10**22}) == [f"--score_workers {-10**22} is too large a number (at most {big})"]
    assert problems({"seed": 10**29}) == [f"--seed {10**29} is too large a number (at most {big})"]  # 30 digits
    assert problems({"seed": 10**30}) == [f"--seed 1000000000... is too large a number (at most {big})"]
    assert problems({"steps": -1, "k_samples": 1}) == ["--steps -1 must be at least 0",
                                                      "--k_samples 1 must be at least 2"]


def test_the_first_problem_is_the_one_sentence(capsys):
    with pytest.raises(SystemExit) as e:
        parse_args(["--k_samples", "1", "--auto_resume", "--device", "tpu"])
    assert e.value.code == 2 and capsys.readouterr().err.endswith("error: --k_samples 1 must be at least 2\n")


def test_combinations_refuse_only_what_contradicts(monkeypatch):
    """Each combination check refuses its own case and lets its neighbours through."""
    assert problems({"data_source": "generate", "data_file": POOL_PATH}) == [
        "--data_file is read only with --data_source file (not generate); add that or drop --data_file"]
    assert problems({"baseline_type": "ema", "scale_rewards": "batch"}) == []
    assert problems({"baseline_type": "adaptive", "scale_rewards": "group"}) == []
    assert problems({"baseline_type": "ema"})[0].startswith("--baseline_type ema with --scale_rewards group divides")
    monkeypatch.setenv("WORLD_SIZE", "3")
    rows = {"batch_size": 3, "env_sft_batch": 16, "policy_sft_batch": 16}
    assert problems({**rows, "env_sft_coef": 0.0, "policy_sft_coef": 0.0}) == []  # the terms are off: no rows drawn
    assert problems({**rows, "policy_sft_coef": 1.0, "policy_sft_batch": 15}) == []
    assert problems({**rows, "env_sft_coef": 1.0}) == [
        "--env_sft_batch 16 does not divide among the 3 processes torchrun started (it is the global number of rows "
        "per step); use a multiple of 3"]
    assert problems({**rows, "policy_sft_coef": 0.5})[0].startswith("--policy_sft_batch 16 does not divide among the 3")
    assert problems({"steps": 0, "warmup_steps": 0, "decay_steps": 5}) == []  # --steps 0: no schedule to spoil
    assert problems({"steps": 6, "warmup_steps": 0, "decay_steps": 5}) == []


@pytest.mark.parametrize("world", ["x", "", "0", "2.5", "-1", "٣"])
def test_a_world_size_set_by_hand_that_is_no_count_is_one_sentence(monkeypatch, world):
    """torchrun sets WORLD_SIZE; one set by hand to anything else was a ValueError traceback before the run."""
    monkeypatch.setenv("WORLD_SIZE", world)
    assert problems({"batch_size": 3}) == [
        f"WORLD_SIZE={world!r} in the environment is not a number of processes; unset it, or start the run with "
        "torchrun, which sets it"]
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert problems({"batch_size": 3}) == []


def test_overwrite_refuses_a_supervised_file_in_the_run_and_only_when_the_run_exists(tmp_path):
    """--sft_data_file, or the second of a comma list, inside the run dir: refused with --overwrite; a run directory
    not there yet moves nothing aside (its missing file is the one sentence)."""
    (tmp_path / "t1").mkdir()
    inside = tmp_path / "t1" / "d.jsonl"
    inside.write_text("")
    run = {"overwrite": True, "log_dir": str(tmp_path), "run_name": "t1"}
    assert problems({**run, "sft_data_file": str(inside), "env_sft_coef": 1.0}) == [
        f"--overwrite would move the run {tmp_path / 't1'} aside, and with it --sft_data_file {inside}: copy the file "
        "out first, or pick another --run_name"]
    assert len(problems({**run, "data_source": "file", "data_file": f"{POOL_PATH},{inside}"})) == 1
    (tmp_path / "t10").mkdir()  # t1's name is a prefix of it, not a folder above it
    assert problems({**run, "model_path": str(tmp_path / "t10")}) == []
    gone = tmp_path / "t2" / "d.jsonl"
    assert problems({**run, "run_name": "t2", "data_source": "file", "data_file": str(gone)}) == [
        f"--data_file {gone}: no such file"]


def test_a_model_path_that_looks_like_a_path_must_exist(tmp_path, monkeypatch):
    """Absolute, home-relative (~ is not expanded), or under a local folder: a path, checked now; owner/name, with no
    such local folder, is a hub id."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "logs").mkdir()
    for name in ("/nomodel", "~/nomodel", "logs/nomodel", "./nomodel", "a/b/c", "nomodel"):
        assert problems({"model_path": name}) == [
            f"--model_path: model directory {name} does not exist; pass an existing snapshot directory or a hub id like "
            "jrahn/RookWorld-LM-124M"]
    assert problems({"model_path": "owner/nomodel"}) == problems({"model_path": "scratch"}) == []


def test_a_data_file_that_is_a_folder_is_one_sentence_not_three(tmp_path):
    assert problems({"data_source": "file", "data_file": str(tmp_path)}) == [
        f"--data_file {tmp_path} is a folder; name its JSONL files, comma-separated"]
    assert problems({"data_source": "file", "data_file": f"/dev/null,{POOL_PATH}"}) == [
        "--data_file /dev/null is not a regular file (a device or a pipe); name JSONL files"]


def test_an_os_error_is_a_sentence_naming_its_file():
    assert error_sentence(IsADirectoryError(21, "Is a directory", "x/r.json")) == ("x/r.json: is a directory; check "
                                                                                  "the path")
    assert error_sentence(OSError("disk gone")) == "disk gone"  # no file to name
    assert error_sentence(ValueError("bad value")) == "bad value"


def test_shape_flags_at_their_defaults_go_with_a_snapshot_and_sft_offers_no_selfplay(capsys):
    """sft.py takes --n_layer 4 (the default: nothing would be ignored) with a snapshot, and its --data_source
    choices are its own."""
    snapshot = os.path.join(HERE, "data", "rookworld-8m")
    assert parse_args(["--model_path", snapshot, "--n_layer", "4", "--n_positions", "256"], script="sft").n_layer == 4
    with pytest.raises(SystemExit) as e:
        parse_args(["--data_source", "selfplay"], script="sft")
    assert e.value.code == 2 and "invalid choice: 'selfplay'" in capsys.readouterr().err
    assert parse_args(["--data_source", "selfplay"]).data_source == "selfplay"


def with_buffered_stdout():
    """The environment with stdout block-buffered, as in a user's shell (PYTHONUNBUFFERED, set on some machines,
    hides what a buffer that cannot be flushed does)."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}


def read_one_line_then_close(args):
    """Run args with stdout a pipe read for one line and then closed, as `| head -1` does: (that line, the exit
    code, stderr). What the command writes after it is more than a pipe holds, so its writes meet the closed end."""
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=os.path.dirname(HERE),
                         env=with_buffered_stdout())
    first = p.stdout.readline()
    p.stdout.close()
    err = p.stderr.read()
    return first, p.wait(timeout=120), err


def test_a_report_read_through_head_ends_quietly_as_unix_tools_do(tmp_path):
    """`analyze_metrics.py RUN | head` of a long run was a BrokenPipeError traceback; it ends silent, with 141
    (128 + SIGPIPE) as `cat` and `grep` do. Every script's entry point is flags.run_command."""
    rows = "".join(json.dumps({"step": i, "reward_mean": 0.1, "eval_reward": 0.2}) + "\n" for i in range(3000))
    (tmp_path / "metrics.jsonl").write_text(rows)
    first, code, err = read_one_line_then_close([sys.executable, "analyze_metrics.py", str(tmp_path), "--windows",
                                                 "3000"])
    assert (first, code, err) == ("3000 steps\n", 141, "")


def test_a_short_report_whose_reader_left_before_it_ends_quietly_too():
    """A report short enough to wait in stdout's buffer meets the closed pipe only when flushed: run_command
    flushes it itself, then sends what is left to /dev/null, or exit's own flush would fail with a message."""
    script = "from mini.flags import run_command\nrun_command(lambda: print('a short report'))"
    p = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=os.path.dirname(HERE), env=with_buffered_stdout())
    p.stdout.close()  # the reader leaves before the script has written anything
    assert (p.wait(timeout=60), p.stderr.read()) == (141, "")


def test_a_path_that_is_not_utf8_is_printed_escaped(tmp_path):
    """A folder named in Latin-1 bytes (`r\\xff`) reaches Python as a lone surrogate, which stdout under a strict
    UTF-8 locale (en_US.UTF-8; PYTHONIOENCODING=utf-8 here) could not encode: analyze_metrics.py, train.py and
    evaluate.py printed it in a traceback, after their work. The path is printed escaped, as stderr does."""
    for name in (b"r\xff", b"plain"):
        run = os.path.join(os.fsencode(tmp_path), name)
        try:
            os.makedirs(run)
        except OSError as e:  # a file system that holds UTF-8 names only (EILSEQ) cannot have the case
            pytest.skip(f"this file system refuses a name that is not UTF-8 ({e.strerror})")
        with open(os.path.join(run, b"metrics.jsonl"), "w") as f:
            f.write('{"step": 0, "reward_mean": 0.5}\n')
    p = subprocess.run([sys.executable, "analyze_metrics.py", os.path.join(os.fsencode(tmp_path), b"r\xff"),
                        str(tmp_path / "plain")], capture_output=True, timeout=60, cwd=os.path.dirname(HERE),
                       env={**with_buffered_stdout(), "PYTHONIOENCODING": "utf-8"})
    assert p.returncode == 0 and p.stderr == b"" and b"== r\\udcff ==" in p.stdout


def test_a_run_whose_stdout_reader_has_gone_goes_on_logging_to_its_file(tmp_path):
    """`train.py | head` (or `sft.py`): the first log line after the reader left raised a BrokenPipeError in the
    training loop and ended the run. The run goes on, its lines in its log file alone, and ends as it would have."""
    script = ("import os, sys\nfrom mini.runs import RunDir\nrun = RunDir(sys.argv[1], 'r')\nos.makedirs(run.path)\n"
              "for i in range(3000):\n    run.log(f'step {i} ' + 'x' * 60, 'sft.log')\nprint('finished', file=sys.stderr)")
    first, code, err = read_one_line_then_close([sys.executable, "-c", script, str(tmp_path)])
    assert (first, code, err) == ("step 0 " + "x" * 60 + "\n", 0, "finished\n")
    assert (tmp_path / "r" / "sft.log").read_text().splitlines()[-1] == "step 2999 " + "x" * 60


def test_a_broken_pipe_elsewhere_is_still_a_fault():
    """The quiet exit is for stdout's reader alone: a BrokenPipeError of another pipe (a dying Stockfish's stdin)
    while stdout is read is a fault, raised with its traceback, not an exit that looks like `| head`."""
    script = "from mini.flags import run_command\ndef main():\n    raise BrokenPipeError('engine')\nrun_command(main)"
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                       cwd=os.path.dirname(HERE))
    assert p.returncode == 1 and p.stderr.rstrip().endswith("BrokenPipeError: engine")


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

