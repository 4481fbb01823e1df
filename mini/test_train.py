"""The training loop end to end on a tiny model: files, resume after SIGKILL with every piece of state,
NaN recovery, KL stop, signals, the LR schedule and the optimizer groups; and a policy gradient that
moves the policy the way the reward points.

A random model's completions all score -0.3 (no advantage, no policy gradient), so the end-to-end
runs score with scripted_score: the real components, and a reward keyed on the completion's text that
varies within a group; ScoringPool's worker processes get it too. Subprocess runs get it (and the
injected failures) from hooked_main.
mini/test_reference_step.py checks one update against a naive reference.

    python mini/test_train.py
"""
import concurrent.futures
import copy
import functools
import io
import itertools
import json
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import types

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
import torch

import mini.reward_scorer as reward_scorer
import mini.runtime as runtime
import mini.train as train
from mini.autobatch import find_batch_size, optimizer_state_bytes, probe_peak_memory, run_to_the_limit
from mini.config import Config
from mini.dataset import ReplayBuffer
from mini.flags import parse_args
from mini.grpo import RewardBaseline
from mini.loader import load_model, save_model
from mini.model import GPT, GPTConfig
from mini.rollout import MicroBatch, Rollout
from mini.runs import StopRun, load_checkpoint
from mini.runtime import (PhaseTimer, lr_factor, peak_memory_mb, rng_state, score_workers, seed_everything,
                          set_rng_state)
from mini.tokenizer import Tokenizer

TIMING = ("time_", "peak_mem_mb")
EOS = 50256
NEVER = 0  # "!": tiny_gpt gives it a logit bias of -50, so it is never sampled
QUEEN, KNIGHT, BISHOP, ROOK = 16599, 22062, 24233, 10929  # " queen", " knight", " bishop", " rook"


def tiny_gpt(eos_bias, biases=None):
    """A random 2-layer GPT-2 with a fixed logit bias per token: dimension 0 of the last hidden state is
    the constant 1 (ln_f weight 0, bias 1), so wte[:, 0], tied to lm_head, adds to every logit. The EOS
    bias makes completions stop at varied lengths (eos_bias / temperature ~ 8.6: ~10% per token)."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, n_positions=256))
    with torch.no_grad():
        model.transformer.ln_f.weight[0], model.transformer.ln_f.bias[0] = 0.0, 1.0
        for token, bias in {EOS: eos_bias, NEVER: -50.0, **(biases or {})}.items():
            model.transformer.wte.weight[token, 0] = bias
    return model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_model(tiny_gpt(eos_bias=8.5), Tokenizer.gpt2(), str(tmp_path_factory.mktemp("tiny") / "model"))


def scripted_reward(text):
    """Deterministic, in [0, 1], and different for most pairs of random completions."""
    return (sum(map(ord, text)) % 13) / 12


REAL_SCORE = reward_scorer.score


def scripted_score(sample, completion, *args, **kwargs):
    """reward_scorer.score with the reward replaced by scripted_reward; the components stay real."""
    return scripted_reward(completion), REAL_SCORE(sample, completion, *args, **kwargs)[1]


def use_scripted_score(then=None):
    """Initializer of ScoringPool's worker processes: they score with scripted_score too, after ScoringPool's own
    initializer `then`."""
    if then is not None:
        then()
    reward_scorer.score = scripted_score


class ScriptedExecutor(concurrent.futures.ProcessPoolExecutor):
    def __init__(self, *args, initializer=None, **kwargs):
        super().__init__(*args, initializer=functools.partial(use_scripted_score, initializer), **kwargs)


def install_scripted_reward(mp):
    """Every path to a reward (inline, worker processes) ends in reward_scorer.score: script it there."""
    mp.setattr(reward_scorer, "score", scripted_score)
    mp.setattr(concurrent.futures, "ProcessPoolExecutor", ScriptedExecutor)  # ScoringPool imports it when it starts workers


def nan_loss_on(calls):
    """A grpo_loss that returns NaN on the given call numbers (1-based)."""
    count = {"n": 0}

    def loss(*a, **kw):
        count["n"] += 1
        value, metrics = train.grpo.grpo_loss(*a, **kw)
        if count["n"] in calls:
            return value * float("nan"), {**metrics, "loss": float("nan")}
        return value, metrics
    return loss


def install_test_hooks(mp, nan_call=None, kill_after_step=None):
    """The scripted reward; a NaN loss at grpo_loss call nan_call (the trainer rolls back); SIGKILL right
    after step kill_after_step is logged (no chance to save anything)."""
    install_scripted_reward(mp)
    if nan_call is not None:
        mp.setattr(train, "grpo_loss", nan_loss_on({nan_call}))
    if kill_after_step is not None:
        finish_step = train.Trainer.finish_step

        def finish_then_die(self, m, r, tasks):
            finish_step(self, m, r, tasks)
            if self.step == kill_after_step:
                os.kill(os.getpid(), signal.SIGKILL)
        mp.setattr(train.Trainer, "finish_step", finish_then_die)


def hooked_main(argv, nan_call=None, kill_after_step=None):
    """train.main under install_test_hooks; in a subprocess: python -c HOOKED NAN_CALL KILL_AFTER ARGS..."""
    with pytest.MonkeyPatch.context() as mp:
        install_test_hooks(mp, nan_call, kill_after_step)
        return train.main(argv)


HOOKED = ("import sys; from mini.test_train import hooked_main; "
          "n = lambda x: int(x) if x != '-' else None; sys.exit(hooked_main(sys.argv[3:], n(sys.argv[1]), n(sys.argv[2])))")


def run_hooked_cli(argv, nan_call=None, kill_after_step=None):
    n = lambda x: "-" if x is None else str(x)
    return subprocess.run([sys.executable, "-c", HOOKED, n(nan_call), n(kill_after_step), *argv],
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(autouse=True)
def scripted_rewards(monkeypatch):
    install_scripted_reward(monkeypatch)


def args(tiny, log_dir, run, steps, *extra):
    # scripted rewards give advantages; the entropy bonus is one more term through the whole loop
    return ["--model_path", tiny, "--log_dir", str(log_dir), "--run_name", run, "--steps", str(steps),
            "--batch_size", "2", "--k_samples", "3", "--max_new_tokens", "8", "--eval_every", "0",
            "--save_every", "2", "--entropy_coef", "0.05", "--lr", "1e-3", "--warmup_steps", "2", *extra]


def test_a_run_that_fails_in_its_first_step_leaves_no_run_behind(tiny, tmp_path, capsys):
    """--max_new_tokens too long for the model's 256 positions fails in the first rollout; its directory (a config
    and a copy of the start model) would make the corrected command 'already hold a run'."""
    assert train.main(args(tiny, tmp_path, "r", 2, "--max_new_tokens", "250")) == 1
    assert "a prompt plus max_new_tokens needs" in capsys.readouterr().err and not (tmp_path / "r").exists()
    assert train.main(args(tiny, tmp_path, "r", 1)) == 0


def test_auto_resume_with_fewer_steps_than_done_is_refused(tiny, tmp_path, capsys):
    """A run at step 3 continued with --steps 2 said Done, its config.json at 2 steps, final/ at step 3."""
    assert train.main(args(tiny, tmp_path, "r", 3)) == 0
    config = (tmp_path / "r" / "config.json").read_text()
    assert train.main(args(tiny, tmp_path, "r", 2, "--auto_resume")) == 1
    assert capsys.readouterr().err.strip().endswith("step_000003.pt is at step 3, past --steps 2; give --steps above 3 "
                                                    "to train on (a finished run's model is in its final/)")
    assert (tmp_path / "r" / "config.json").read_text() == config


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def without_timing(rows):
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


def assert_same_state(a, b, where="state"):
    """Checkpoint contents equal, tensors bit for bit."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b), where
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), where
        for k in a:
            assert_same_state(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same_state(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


def test_a_short_run_writes_everything(tiny, tmp_path):
    assert train.main(args(tiny, tmp_path, "r", 6, "--eval_every", "3", "--eval_n", "3", "--keep_last", "2")) == 0
    run = tmp_path / "r"
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, 7))
    for key in ("loss", "policy_loss", "kl", "kl_coef", "reward_mean", "reward_std", "reward_mean_P", "format_valid_P",
                "zero_var_share", "clip_frac", "clip_low_frac", "clip_high_frac", "entropy", "grad_norm", "lr",
                "completion_tokens", "completion_len_mean", "completion_clipped_ratio", "time_generate",
                "time_score", "time_update", "peak_mem_mb"):
        assert all(key in m for m in metrics), key
    assert "eval_reward" in metrics[2] and "eval_format_valid_A" in metrics[5]
    assert metrics[0]["lr"] == pytest.approx(1e-3 / 2)  # warmup already applies to the first update
    assert all(m["zero_var_share"] < 1 and m["adv_abs_mean"] > 0 for m in metrics)  # a policy gradient every step
    assert all(m["completion_len_mean"] * 2 * 3 == pytest.approx(m["completion_tokens"]) for m in metrics)
    assert any(0 < m["completion_clipped_ratio"] < 1 for m in metrics)  # some ran to --max_new_tokens 8, some stopped
    assert len(read_jsonl(run / "samples.jsonl")) == 6 * 2
    log = (run / "train.log").read_text()
    assert "Step 6 | Loss" in log and "| P/E " in log
    best = [float(b) for b in re.findall(r"\(best ([0-9.-]+)\)", log)]  # the log line's best: the running maximum
    assert best == pytest.approx([max(m["reward_mean"] for m in metrics[:i]) for i in range(1, 7)], abs=5e-4)
    assert json.loads((run / "config.json").read_text())["steps"] == 6
    assert {"recovery.pt", "stable.pt", "step_000006.pt"} <= set(os.listdir(run / "checkpoints"))
    assert sorted(f for f in os.listdir(run / "checkpoints") if f.startswith("step_")) == [
        "step_000004.pt", "step_000004.pt.sha256", "step_000006.pt", "step_000006.pt.sha256"]  # keep_last
    model, _ = load_model(str(run / "final"))
    start, _ = load_model(tiny)
    assert not torch.equal(model.transformer.wte.weight, start.transformer.wte.weight)  # it trained


def test_a_rewarded_token_becomes_more_likely(tmp_path, monkeypatch):
    """The policy gradient points up the reward: paid for each " queen" it says, the policy says it more
    often after a few steps (the advantage's sign, end to end through Trainer)."""
    snapshot = save_model(tiny_gpt(8.5, {QUEEN: 11.0, KNIGHT: 11.0, BISHOP: 11.0, ROOK: 11.0}), Tokenizer.gpt2(),
                          str(tmp_path / "model"))  # four likely words, ~20% each
    monkeypatch.setattr(reward_scorer, "score", lambda sample, completion, *a, **kw: (completion.count(" queen") / 8, {}))
    trainer = train.Trainer(parse_args([
        "--model_path", snapshot, "--log_dir", str(tmp_path), "--run_name", "queen", "--batch_size", "2",
        "--k_samples", "4", "--max_new_tokens", "8", "--lr", "1e-2", "--warmup_steps", "1", "--eval_every", "0",
        "--save_every", "0", "--kl_coef", "0"]))
    prompt = torch.tensor([trainer.tok.encode("P: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1 ")])

    @torch.no_grad()
    def p_queen():
        return torch.softmax(trainer.model(prompt)[0, -1], -1)[QUEEN].item()
    before = p_queen()
    rows = [trainer.train_step() for _ in range(4)]
    assert all(m["zero_var_share"] < 1 for m in rows)
    assert p_queen() > before + 0.1, (before, p_queen())  # ~0.24 -> ~0.46; a flipped sign drives it down


def test_dynamic_sampling_trains_on_the_informative_groups_only(tiny, tmp_path, monkeypatch):
    """Half the prompts score a constant: dynamic sampling drops their groups, fills the batch from more
    rounds, and its loss is the loss of the same kept groups trained without it."""
    constant = lambda sample: sum(map(ord, sample.prompt)) % 2 == 0
    drawn_rewards = []  # every scored completion, kept or dropped

    def score(sample, completion, *a, **kw):
        drawn_rewards.append(0.5 if constant(sample) else scripted_reward(completion))
        return drawn_rewards[-1], REAL_SCORE(sample, completion, *a, **kw)[1]
    monkeypatch.setattr(reward_scorer, "score", score)
    flags = args(tiny, tmp_path, "ds", 1, "--batch_size", "4", "--dynamic_sampling", "--dynamic_sampling_max_rounds", "6")
    trainer, trained = train.Trainer(parse_args(flags)), []
    prepare = trainer.prepare
    monkeypatch.setattr(trainer, "prepare", lambda r: (trained.append(r), prepare(r)))
    m = trainer.train_step()
    r = trained[0]
    assert m["ds_rounds"] >= 2 and m["ds_groups_kept"] == 4 and m["ds_groups_drawn"] == 4 * m["ds_rounds"]
    assert m["zero_var_share"] == 0 and 0 < m["ds_zero_var_share_drawn"] < 1
    assert len(drawn_rewards) == 4 * 3 * m["ds_rounds"]  # the trained groups' reward_mean leaves the dropped out
    assert m["ds_reward_mean_drawn"] == pytest.approx(sum(drawn_rewards) / len(drawn_rewards))
    assert len(r.samples) == 4 * 3 and not any(constant(s) for s in r.samples)
    plain = train.Trainer(parse_args(args(tiny, tmp_path, "plain", 1, "--batch_size", "4")))
    same = Rollout(list(r.samples), list(r.prompts), list(r.completions), list(r.texts), scores=list(r.scores))
    plain.prepare(same)
    same.rewards = torch.tensor([x for x, _ in same.scores])
    stats = plain.update(same, *plain.advantages(same)[:2])
    assert stats["loss"] == pytest.approx(m["loss"], abs=1e-7) and stats["loss"] != 0
    for a, b in zip(trainer.model.parameters(), plain.model.parameters()):
        assert torch.equal(a, b)


def test_a_rollout_walks_its_prompts_one_move_on_into_the_replay_buffer(tiny, tmp_path):
    """A: prompts of later steps start where this step's prompts lead: the position after each drawn P: sample's best
    move, and after each legal A: move, joins the replay buffer."""
    trainer = train.Trainer(parse_args(args(tiny, tmp_path, "walk", 1, "--mix_env_ratio", "0.5", "--batch_size", "6")))
    r = trainer.rollout()
    want = ReplayBuffer()
    for s in r.samples[::trainer.cfg.k_samples]:
        want.add_next(s)
    assert want.items and set(want.items) <= set(trainer.buffer.items)


def test_under_selfplay_the_rollout_prompts_are_the_selfplay_positions(tiny, tmp_path, monkeypatch):
    """--data_source selfplay: a rollout draws its prompts from the self-play source (which mixes in the prompt
    source itself), not from the prompt source; here a stand-in that hands out two positions of the pool."""
    trainer = train.Trainer(parse_args(args(tiny, tmp_path, "selfplay", 1)))
    positions = trainer.source.draw(2)
    monkeypatch.setattr(trainer, "selfplay", types.SimpleNamespace(draw=lambda n: positions[:n]))
    r = trainer.rollout()
    assert [s.prompt for s in r.samples] == [s.prompt for s in positions for _ in range(3)]


def test_a_step_frees_its_gradients_before_the_next_rollout(tiny, tmp_path):
    """The update sets the gradients, the value head's too, to None when it is done: generation, scoring and
    evaluation until the next update do not hold another copy of the weights' size."""
    trainer = train.Trainer(parse_args(args(tiny, tmp_path, "free", 1, "--use_gae")))
    assert trainer.train_step() is not None
    assert all(p.grad is None for p in [*trainer.model.parameters(), *trainer.value_head.parameters()])


def test_each_rank_seeds_its_own_sampling(tiny, tmp_path, monkeypatch):
    """Under torchrun rank r seeds its generators with --seed + r, so that the ranks sample different completions
    (rank 0's are a plain run's); here rank 1, without a process group."""
    seeds = []
    monkeypatch.setattr(train, "seed_everything", seeds.append)
    monkeypatch.setattr(train.distributed, "rank", lambda: 1)
    train.Trainer(parse_args(args(tiny, tmp_path, "rank1", 1, "--seed", "5")))
    assert seeds == [6]


def test_the_time_limit_is_in_minutes(tiny, tmp_path, monkeypatch):
    """--time_limit_min 1 on a clock that moves 10 s a reading: the run takes steps, then stops at the limit (a limit
    read as seconds would stop it before its first step)."""
    clock = itertools.count(0, 10)
    monkeypatch.setattr(train, "time", types.SimpleNamespace(time=lambda: float(next(clock)), strftime=time.strftime))
    assert train.main(args(tiny, tmp_path, "limit", 50, "--time_limit_min", "1", "--save_every", "0")) == 0
    stops = [line for line in (tmp_path / "limit" / "train.log").read_text().splitlines() if "Time limit" in line]
    assert len(stops) == 1 and 1 <= int(stops[0].rsplit(" ", 1)[1]) < 50, stops


STOCKFISH_SOURCES = {
    "selfplay": ("--data_source", "selfplay", "--selfplay_refresh", "2", "--selfplay_games", "2", "--selfplay_plies", "2",
                 "--selfplay_mix", "1", "--stockfish_depth", "4", "--annotate_workers", "1", "--mix_env_ratio", "0.5"),
    "generate": ("--data_source", "generate", "--stockfish_depth", "4", "--annotate_workers", "1",
                 "--mix_env_ratio", "0.5"),
}


@pytest.mark.parametrize("source", STOCKFISH_SOURCES)
def test_stockfish_sources_resume_exactly(tiny, tmp_path, source):
    """--data_source selfplay (positions of the policy's games, refreshed every 2 steps) and generate (fresh
    positions labelled as they are needed) end to end: a run resumed from its step-2 checkpoint repeats the
    uninterrupted one (its engine timings aside)."""
    pytest.importorskip("chess.engine")
    if not shutil.which("stockfish") and not shutil.which("/usr/games/stockfish"):
        pytest.skip("Stockfish binary not found (apt-get install stockfish)")
    flags = STOCKFISH_SOURCES[source]
    assert train.main(args(tiny, tmp_path, "a", 4, *flags)) == 0
    step2 = tmp_path / "a" / "checkpoints" / "step_000002.pt"
    assert train.main(args(tiny, tmp_path, "b", 4, *flags, "--resume_from_checkpoint", str(step2))) == 0
    volatile = ("time_", "peak_mem_mb", "selfplay_searched", "selfplay_play_s", "selfplay_wait_s")
    rows = [[{k: v for k, v in m.items() if not k.startswith(volatile)} for m in read_jsonl(tmp_path / run / "metrics.jsonl")]
            for run in ("a", "b")]
    assert rows[0][2:] == rows[1]
    assert source != "selfplay" or all(m["selfplay_positions"] > 0 for m in rows[0])
    samples = read_jsonl(tmp_path / "a" / "samples.jsonl")
    assert samples[4:] == read_jsonl(tmp_path / "b" / "samples.jsonl")


def test_informative_groups_by_hand():
    rewards = torch.tensor([1.0, 1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.5])  # groups of 3: equal, varied, nearly
    assert train.grpo.informative_groups(rewards, 3).tolist() == [False, True, False]
    rewards[8] = 0.51  # std 0.0058
    assert train.grpo.informative_groups(rewards, 3).tolist() == [False, True, True]
    assert train.grpo.informative_groups(rewards, 3, min_std=0.01).tolist() == [False, True, False]


@pytest.mark.parametrize("bf16, fused", [(True, False), (True, True), (False, False)])
def test_the_reference_in_bf16_gives_a_kl_of_exactly_0_at_step_1(tiny, tmp_path, bf16, fused):
    """Under bf16 autocast (--bf16_cpu here, --bf16 on CUDA) the frozen reference holds its matmul weights in bf16
    (GPT.cast_matmuls; the embedding lookup and LayerNorm in fp32), and its log-probs are bitwise the
    policy's at the first step: the KL is exactly 0, also with --fused_logprobs, whose output layer runs after
    the autocast region has closed (in autocast's dtype, logprobs.Head.of). Without autocast the reference
    stays fp32."""
    trainer = train.Trainer(parse_args(args(tiny, tmp_path, "bf16", 1, "--kl_type", "k3", "--micro_batch_size", "4",
                                            *(["--bf16_cpu"] if bf16 else []), *(["--fused_logprobs"] if fused else []))))
    ref = trainer.ref
    want = torch.bfloat16 if bf16 else torch.float32
    assert ref.lm_head.weight.dtype == ref.transformer.h[0].mlp.c_fc.bias.dtype == want
    assert ref.transformer.wte.weight.dtype == ref.transformer.ln_f.weight.dtype == torch.float32
    assert trainer.model.lm_head.weight.dtype == torch.float32
    m = trainer.train_step()
    assert m["kl"] == 0.0


def test_micro_batches_carry_their_groups():
    """6 rows in groups of 2, 4 rows at a time: groups in order of their longest completion (then prompt), each
    micro-batch's groups numbered within it, its columns trimmed to its rows' own, its inputs those columns."""
    prompts = [[4, 5, 6], [4, 5, 6], [1, 2], [1, 2], [3], [3]]
    completions = [[9], [], [7], [7, 7, 7], [8, 8], [8]]  # with EOS, a group's longest: 2, 3 and 3 columns
    r = Rollout([None] * 6, prompts, completions, [""] * 6)
    r.pad(eos=0, max_new_tokens=3, device="cpu")  # row 3 hit the budget: no EOS
    assert r.Tp == 3 and r.comp_lens == [2, 1, 2, 3, 3, 2]
    got = [(mb.rows.tolist(), mb.groups[0].tolist(), mb.groups[1].tolist(), mb.start, mb.Tc)
           for mb in r.micro_batches(4, 2, "cpu")]
    assert got == [([2, 3, 4, 5], [0, 0, 1, 1], [0, 2], 1, 3), ([0, 1], [0, 0], [0], 0, 2)]
    mb = r.micro_batches(4, 2, "cpu")[1]
    ids, mask, Tp = mb.inputs(r)
    assert Tp == 3 and ids.tolist() == [[4, 5, 6, 9, 0], [4, 5, 6, 0, 0]] and mask[1].tolist() == [1, 1, 1, 1, 0]
    assert mb.take(r.comp_ids).tolist() == [[9, 0], [0, 0]] and mb.take(torch.arange(6)).tolist() == [0, 1]
    whole = r.micro_batches(0, 2, "cpu")  # 0: the whole batch at once, in rollout order
    assert len(whole) == 1 and whole[0].rows.tolist() == list(range(6)) and (whole[0].start, whole[0].Tc) == (0, 3)
    parts = [mb.take(r.comp_ids) * 10 for mb in r.micro_batches(2, 2, "cpu")]
    assert torch.equal(MicroBatch.join(r.micro_batches(2, 2, "cpu"), parts, r.comp_ids.shape), r.comp_ids * 10 * r.comp_mask)


def test_micro_batches_go_longest_group_first_in_widths_of_the_bucket():
    """Bucket 4, K = 2, 2 rows at a time. Completion lengths with EOS: group 0 (2, 3), group 1 (4, 4), group 2
    (6, 1): by longest completion groups 2, 1, 0 (by shortest it would be 1, 0, 2). Tp = 8; each micro-batch's
    prompt columns (1, 5, 3 tokens -> 4, 8, 4) and completion columns (6, 4, 3 -> 8, 4, 4) are whole buckets, so that
    a compiled forward sees few shapes."""
    prompts = [[3, 3, 3]] * 2 + [[2] * 5] * 2 + [[1]] * 2
    r = Rollout([None] * 6, prompts, [[7], [7, 7], [6] * 3, [6] * 3, [5] * 5, []], [""] * 6)
    r.pad(eos=0, max_new_tokens=10, device="cpu", bucket=4)
    assert (r.Tp, r.comp_ids.shape[1], r.comp_lens) == (8, 8, [2, 3, 4, 4, 6, 1])
    batches = r.micro_batches(2, 2, "cpu")
    assert [(mb.rows.tolist(), mb.start, mb.Tc) for mb in batches] == [([4, 5], 4, 8), ([2, 3], 0, 4), ([0, 1], 4, 4)]
    assert [(mb.inputs(r)[0].shape[1], mb.inputs(r)[2]) for mb in batches] == [(12, 4), (12, 8), (8, 4)]
    ids, mask, _ = batches[2].inputs(r)
    assert ids.tolist() == [[0, 3, 3, 3, 7, 0, 0, 0], [0, 3, 3, 3, 7, 7, 0, 0]]
    assert mask.int().tolist() == [[0, 1, 1, 1, 1, 1, 0, 0], [0, 1, 1, 1, 1, 1, 1, 0]]


STEPS = 6
FULL_STATE = ("--adaptive_kl", "--baseline_type", "adaptive", "--use_gae")  # state beyond weights, optimizer and RNG
NAN_CALL = 2  # the loss of step 2 is NaN: rolled back to the start (recovery.pt of step 0), lr_scale halved


@pytest.fixture(scope="module")
def straight(tiny, tmp_path_factory):
    """An uninterrupted run with every piece of non-default state: the adaptive KL coefficient, the
    adaptive baseline's running mean and variance, the value head, an lr_scale halved by a rollback."""
    log_dir = tmp_path_factory.mktemp("straight")
    argv = args(tiny, log_dir, "straight", STEPS, *FULL_STATE, "--report_to", "tensorboard")
    assert hooked_main(argv, nan_call=NAN_CALL) == 0
    return log_dir / "straight", parse_args(argv)


def test_injected_nan_is_rolled_back(straight):
    run, cfg = straight
    log = (run / "train.log").read_text()
    assert "non-finite loss or gradient: rolled back to step 0, lr scale now 0.5" in log
    assert os.path.exists(run / "checkpoints" / "debug_step_000001.pt")
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1)) and all(math.isfinite(m["loss"]) for m in metrics)
    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()  # the dashboard shows each step once, as redone: the abandoned step 1 is gone
    assert [(e.step, pytest.approx(e.value)) for e in events.Scalars("mini/loss")] == [(m["step"], m["loss"]) for m in metrics]
    for m in metrics:  # the schedule times lr_scale, halved from the redone step 1 on
        assert m["lr"] == pytest.approx(cfg.lr * lr_factor(m["step"] - 1, cfg) * 0.5)
    assert all(m["zero_var_share"] < 1 and m["policy_loss"] != 0 for m in metrics)  # a policy gradient every step
    state = load_checkpoint(str(run / "checkpoints" / f"step_{STEPS:06d}.pt"))
    assert state["scheduler"]["lr_scale"] == 0.5 and state["kl_ctl"]["coef"] != cfg.kl_coef
    assert state["baseline"]["var"]["P"] > 0 and state["value_head"]["v.weight"].abs().sum() > 0
    model, _ = load_model(str(run / "final"))
    assert all(torch.isfinite(p).all() for p in model.parameters())


def assert_same_final_state(a, b):
    """The last checkpoints of two runs are equal, less the run's name and flags."""
    sa, sb = (load_checkpoint(str(run / "checkpoints" / f"step_{STEPS:06d}.pt")) for run in (a, b))
    for key in sa.keys() - {"run_name", "config"}:
        assert_same_state(sa[key], sb[key], key)


@pytest.mark.long(25)
def test_sigkill_then_auto_resume_equals_uninterrupted(straight, tiny, tmp_path):
    straight, _ = straight
    argv = args(tiny, tmp_path, "killed", STEPS, *FULL_STATE)
    killed = run_hooked_cli(argv, nan_call=NAN_CALL, kill_after_step=5)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    run = tmp_path / "killed"
    assert not (run / "final").exists() and len(read_jsonl(run / "metrics.jsonl")) == 5
    for name in ("step_000004.pt", "recovery.pt"):  # both files of step 4 damaged: the one of step 2 is next
        (run / "checkpoints" / name).write_bytes(b"garbage")
    # only the run's name: the model, sizes and objective come from the run's config.json
    resumed = run_hooked_cli(["--log_dir", str(tmp_path), "--run_name", "killed", "--auto_resume"])
    assert resumed.returncode == 0, resumed.stderr
    assert "taking over" in resumed.stderr  # the killed process's lock
    assert resumed.stderr.count("it is damaged") == 2
    assert f"Resumed from {run / 'checkpoints' / 'step_000002.pt'} at step 2" in (run / "train.log").read_text()
    assert without_timing(read_jsonl(straight / "metrics.jsonl")) == without_timing(read_jsonl(run / "metrics.jsonl"))
    assert read_jsonl(straight / "samples.jsonl") == read_jsonl(run / "samples.jsonl")
    wa, wb = load_model(str(straight / "final"))[0].state_dict(), load_model(str(run / "final"))[0].state_dict()
    assert_same_state(wa, wb, "final")
    assert_same_final_state(straight, run)


def test_resume_from_checkpoint_and_recovery_mode_continue_a_run(straight, tiny, tmp_path):
    straight, _ = straight
    step4 = straight / "checkpoints" / "step_000004.pt"
    assert hooked_main(args(tiny, tmp_path, "from", STEPS, *FULL_STATE, "--resume_from_checkpoint", str(step4))) == 0
    (tmp_path / "rec" / "checkpoints").mkdir(parents=True)
    shutil.copy(step4, tmp_path / "rec" / "checkpoints" / "recovery.pt")  # this run's recovery checkpoint
    assert hooked_main(args(tiny, tmp_path, "rec", STEPS, *FULL_STATE, "--recovery_mode")) == 0
    want = without_timing(read_jsonl(straight / "metrics.jsonl"))[4:]
    for run in (tmp_path / "from", tmp_path / "rec"):
        assert without_timing(read_jsonl(run / "metrics.jsonl")) == want
        assert_same_final_state(straight, run)


def test_resume_from_another_runs_checkpoint_never_takes_over_a_run_already_there(straight, tiny, tmp_path, capsys):
    """--resume_from_checkpoint of run a's checkpoint with --run_name b, where b holds a run: refused in one
    sentence, b untouched (it used to be cut back to the checkpoint's step and continued with a's). A run's own
    earlier checkpoint takes it back there."""
    straight, _ = straight
    step4 = straight / "checkpoints" / "step_000004.pt"
    assert train.main(args(tiny, tmp_path, "b", STEPS)) == 0
    files = lambda: {p: p.read_bytes() for p in (tmp_path / "b").rglob("*") if p.is_file()}
    before = files()
    assert train.main(args(tiny, tmp_path, "b", STEPS, "--resume_from_checkpoint", str(step4))) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and err.endswith("already holds a run, and --resume_from_checkpoint names another run's "
                                             "checkpoint: pick another --run_name (the checkpoint's run continues there)")
    assert files() == before
    own = tmp_path / "b" / "checkpoints" / "step_000004.pt"
    assert train.main(args(tiny, tmp_path, "b", STEPS, "--resume_from_checkpoint", str(own))) == 0
    assert [row["step"] for row in read_jsonl(tmp_path / "b" / "metrics.jsonl")] == list(range(1, STEPS + 1))
    assert "Resumed from" in (tmp_path / "b" / "train.log").read_text()


def test_persistent_nan_stops_with_a_message(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(train, "grpo_loss", nan_loss_on(set(range(1, 100))))
    assert train.main(args(tiny, tmp_path, "bad", 6)) == 1
    assert "after 3 recoveries; stopping" in capsys.readouterr().err
    assert not (tmp_path / "bad" / "metrics.jsonl").exists()
    log = (tmp_path / "bad" / "train.log").read_text().splitlines()  # three rollbacks in a row, each halving
    assert [line.split("lr scale now ")[1].split()[0] for line in log if "lr scale now" in line] == ["0.5", "0.25", "0.125"]


def test_the_recovery_count_restarts_at_each_checkpoint(tiny, tmp_path, monkeypatch):
    """MAX_RECOVERIES counts rollbacks in a row: four isolated NaN steps (3, 5, 7, 9; one loss call a step
    attempt), each after a fresh recovery.pt (--save_every 2), are four first recoveries, and the run ends."""
    monkeypatch.setattr(train, "grpo_loss", nan_loss_on({3, 6, 9, 12}))
    assert train.main(args(tiny, tmp_path, "r", 10)) == 0
    log = (tmp_path / "r" / "train.log").read_text()
    assert [line.split("rolled back to ")[1][:6] for line in log.splitlines() if "rolled back" in line] == \
        ["step 2", "step 4", "step 6", "step 8"]
    assert log.count("(recovery 1/3)") == 4
    assert [m["step"] for m in read_jsonl(tmp_path / "r" / "metrics.jsonl")] == list(range(1, 11))


def test_stable_checkpoint_is_the_best_evaluation_also_across_a_resume(tiny, tmp_path, monkeypatch):
    """--eval_every 1 with held-out rewards 0.6, 0.4, then after --auto_resume 0.5: stable.pt stays the step-1
    model (0.6), whose reward every checkpoint carries as best_eval and the resumed run compares with."""
    rewards = iter([0.6, 0.4, 0.5])
    monkeypatch.setattr(train, "evaluate", lambda *a, **kw: ({"eval_reward": next(rewards)}, None))
    flags, checkpoints = ("--eval_every", "1", "--save_every", "1"), tmp_path / "e" / "checkpoints"
    for steps, resume in ((2, ()), (3, ("--auto_resume",))):
        assert train.main(args(tiny, tmp_path, "e", steps, *flags, *resume)) == 0
        stable, last = (load_checkpoint(str(checkpoints / name)) for name in ("stable.pt", f"step_{steps:06d}.pt"))
        assert (stable["step"], stable["best_eval"], last["best_eval"]) == (1, 0.6, 0.6), steps


def test_a_completion_budget_past_the_models_positions_is_one_sentence(tiny, tmp_path, capsys):
    assert train.main(args(tiny, tmp_path, "long", 1, "--max_new_tokens", "100000")) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("error: a prompt plus max_new_tokens needs ") and "lower max_new_tokens" in err[-1]
    assert "Traceback" not in "\n".join(err)


def test_scoring_in_worker_processes_changes_nothing(tiny, tmp_path):
    """The rewards differ from row to row, so scores returned out of order would change the logs."""
    assert train.main(args(tiny, tmp_path, "inline", 2, "--loss_type", "dapo")) == 0
    assert train.main(args(tiny, tmp_path, "pool", 2, "--loss_type", "dapo", "--score_workers", "2")) == 0
    a = without_timing(read_jsonl(tmp_path / "inline" / "metrics.jsonl"))
    assert a == without_timing(read_jsonl(tmp_path / "pool" / "metrics.jsonl"))
    samples = read_jsonl(tmp_path / "inline" / "samples.jsonl")
    assert samples == read_jsonl(tmp_path / "pool" / "samples.jsonl")
    assert all(m["zero_var_share"] < 1 and m["policy_loss"] != 0 for m in a)
    assert all(s["reward"] == scripted_reward(s["completion"]) for s in samples) and len({s["reward"] for s in samples}) > 1


def test_score_workers_default_takes_spare_cores_on_cuda_only(monkeypatch):
    """--score_workers -1 (the default): on CUDA one worker per core the training processes leave, at most 4;
    on a CPU none (the cores train); a number given is kept."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    monkeypatch.setattr(os, "cpu_count", lambda: 16)
    assert [score_workers(Config(), cuda, world) for world in (1, 4, 8, 16)] == [4, 3, 1, 0]
    assert score_workers(Config(), cpu) == 0 and score_workers(Config(score_workers=3), cpu) == 3
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert score_workers(Config(), cuda) == 1 and score_workers(Config(score_workers=0), cuda) == 0


def test_signal_handlers_are_restored_after_main(tiny, tmp_path, monkeypatch):
    """train.main catches SIGINT and SIGTERM only while it trains: a test process gets its own back. Its prompt
    source is closed (a generated stream's Stockfish engines) however the run ends."""
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    make_source, closed = train.make_source, []

    def recorded(*a, **kw):
        source = make_source(*a, **kw)
        source.close = lambda: closed.append(source)
        return source
    monkeypatch.setattr(train, "make_source", recorded)
    assert train.main(args(tiny, tmp_path, "ok", 1)) == 0
    assert train.main(args(tiny, tmp_path, "kl", 4, "--kl_threshold", "1e-12")) == 1  # stops inside the loop
    assert {sig: signal.getsignal(sig) for sig in before} == before and len(closed) == 2


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SUITE_WITH_A_SIGNAL = """
import os, signal
import pytest
import mini.runtime as runtime
import mini.train as train
from mini.test_train import args, tiny  # noqa: F401


@pytest.mark.parametrize("run", ["first", "second"])
def test_run(tiny, tmp_path, monkeypatch, run):
    with open(os.environ["RAN"], "a") as f:
        f.write(run + "\\n")
    finish_step = train.Trainer.finish_step

    def finish_then_signal(self, m, r, tasks):
        finish_step(self, m, r, tasks)
        signal.raise_signal(signal.{name})  # as if Ctrl-C or a kill came while the step ran
    monkeypatch.setattr(train.Trainer, "finish_step", finish_then_signal)
    assert train.main(args(tiny, tmp_path, run, 3)) == 1  # the run saved and stopped
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
@pytest.mark.long(13)
def test_a_signal_in_a_run_under_test_stops_the_suite(tmp_path, sig):
    """mini/conftest.py: the run under test takes the signal, saves, and the suite stops after that test (Ctrl-C:
    pytest reports an interrupted session; SIGTERM: the process ends by it) instead of going on to the next."""
    (tmp_path / "test_signalled.py").write_text(SUITE_WITH_A_SIGNAL.format(name=signal.Signals(sig).name))
    env = {**os.environ, "RAN": str(tmp_path / "ran.txt"), "PYTHONPATH": ROOT}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "mini.conftest", "-p", "no:cacheprovider",
                           str(tmp_path / "test_signalled.py")], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=300)
    assert (tmp_path / "ran.txt").read_text().split() == ["first"], proc.stdout + proc.stderr
    if sig == signal.SIGINT:
        assert proc.returncode == 2 and "KeyboardInterrupt" in proc.stdout
    else:
        assert proc.returncode == -signal.SIGTERM


def test_log_line_has_the_digits_and_the_time_left():
    m = {"step": 3, "loss": 1.234e-6, "reward_mean": 0.5, "kl": 2e-7, "time_step": 1.5}
    line = train.log_line(m, ["P"] * 6 + ["A"] * 3, 3, 0.6, eta=125)
    assert line == "Step 3 | Loss 1.23e-06 | Reward 0.500 (best 0.600) | P/E 2/1 | KL 2e-07 | 1.5s | ETA 2m05s"
    assert train.log_line(m, ["P"] * 3, 3, 0.6, eta=None).endswith("| 1.5s")


def test_eta_is_the_pace_since_the_start_times_the_steps_left_and_reads_in_hours(monkeypatch):
    """A resumed run at step 2 that took 60 s for steps 3-5 has 5 steps left at 20 s each: 100 s."""
    monkeypatch.setattr(time, "time", lambda: 160.0)
    assert train.eta(100.0, 2, 5, 10) == pytest.approx(100.0) and train.eta(100.0, 2, 2, 10) is None
    assert [train.duration(s) for s in (7, 59.6, 125, 3725, 36000)] == ["7s", "1m00s", "2m05s", "1h02m", "10h00m"]


def test_log_line_shows_the_evaluation_of_its_step():
    m = {"step": 4, "loss": 0.5, "reward_mean": 0.25, "time_step": 2.0, "eval_reward": 0.4236}
    assert train.log_line(m, ["A"] * 3, 3, 0.3, eta=7) == \
        "Step 4 | Loss 0.5 | Reward 0.250 (best 0.300) | P/E 0/1 | KL 0 | 2.0s | eval 0.424 | ETA 7s"


def test_a_resumed_runs_eta_takes_the_pace_of_the_steps_since_the_resume(tiny, tmp_path, monkeypatch):
    """A run resumed at step 1 has trained only the steps since: the ETA's pace is theirs (eta(t0, 1, step, steps)),
    not its time over every step since step 0."""
    real, calls = train.eta, []
    monkeypatch.setattr(train, "eta", lambda t0, step0, step, steps: calls.append((step0, step, steps)) or
                        real(t0, step0, step, steps))
    assert train.main(args(tiny, tmp_path, "eta", 1, "--save_every", "1")) == 0
    assert train.main(args(tiny, tmp_path, "eta", 2, "--save_every", "1", "--auto_resume")) == 0
    assert calls == [(0, 1, 1), (1, 2, 2)]


def test_kl_threshold_stops_cleanly(tiny, tmp_path, capsys):
    assert train.main(args(tiny, tmp_path, "kl", 6, "--kl_threshold", "1e-12", "--save_every", "0")) == 1
    assert "exceeds --kl_threshold 1e-12 at step 2" in capsys.readouterr().err
    # step 1 has KL 0 (the policy is the reference), step 2 does not: the run stops right there, saved
    assert [m["step"] for m in read_jsonl(tmp_path / "kl" / "metrics.jsonl")] == [1, 2]
    saved = [f for f in os.listdir(tmp_path / "kl" / "checkpoints") if f.startswith("step_") and f.endswith(".pt")]
    assert saved == ["step_000002.pt"]


def test_a_negative_kl_beyond_the_threshold_stops_the_run_too():
    """--kl_threshold bounds |KL|: the k1 estimator's mean (log-ratio) can run away below zero."""
    saved = []
    trainer = types.SimpleNamespace(cfg=Config(kl_threshold=0.1, eval_every=0, save_every=0), step=3, best_reward=0.0,
                                    main=False, save_regular=lambda: saved.append("regular"))
    train.Trainer.finish_step(trainer, {"reward_mean": 0.5, "kl": -0.05}, None, None)  # within: the run goes on
    with pytest.raises(StopRun, match=r"KL -0.2000 exceeds --kl_threshold 0.1 at step 3"):
        train.Trainer.finish_step(trainer, {"reward_mean": 0.5, "kl": -0.2}, None, None)
    assert saved == ["regular"] and trainer.best_reward == 0.5
    trainer.cfg = Config(kl_threshold=0.0, eval_every=0, save_every=0)  # 0: off, whatever the KL
    train.Trainer.finish_step(trainer, {"reward_mean": 0.5, "kl": 5.0}, None, None)
    assert saved == ["regular"]


def test_an_evaluation_that_only_equals_the_best_leaves_the_stable_checkpoint():
    """stable.pt holds the first weights that reached the best held-out reward: a later tie does not replace it, a
    better one does."""
    saved = []
    trainer = types.SimpleNamespace(cfg=Config(eval_every=2, save_every=0), step=4, best_reward=0.0, best_eval=0.5,
                                    main=True, held_out_metrics=lambda: {"eval_reward": 0.5}, save=saved.append,
                                    write_step=lambda m, r, tasks: None)
    train.Trainer.finish_step(trainer, {"reward_mean": 0.5}, None, None)
    assert saved == [] and trainer.best_eval == 0.5
    trainer.held_out_metrics = lambda: {"eval_reward": 0.6}
    train.Trainer.finish_step(trainer, {"reward_mean": 0.5}, None, None)
    assert saved == ["stable.pt"] and trainer.best_eval == 0.6


def test_a_run_of_negative_rewards_has_a_best_reward_and_a_stable_checkpoint(tiny, tmp_path, monkeypatch):
    """The best reward and the best held-out reward start at minus infinity, not 0: a run whose rewards are all
    negative (an untrained model's are -0.3) logs its own best and saves stable.pt at its first evaluation."""
    trainer = train.Trainer(parse_args(args(tiny, tmp_path, "neg", 2, "--eval_every", "1", "--eval_n", "1",
                                            "--save_every", "0")))
    evals, saved, logged = iter([-0.2, -0.4]), [], []
    monkeypatch.setattr(trainer, "held_out_metrics", lambda: {"eval_reward": next(evals)})
    monkeypatch.setattr(trainer, "save", saved.append)
    monkeypatch.setattr(trainer, "write_step",
                        lambda m, r, tasks: logged.append((m["eval_reward"], trainer.best_reward)))
    for step, reward in ((1, -0.3), (2, -0.5)):
        trainer.step = step
        trainer.finish_step({"reward_mean": reward}, None, None)
    assert logged == [(-0.2, -0.3), (-0.4, -0.3)] and saved == ["stable.pt"] and trainer.best_eval == -0.2


def start_and_wait_for_a_step(spawn, tiny, tmp_path, run):
    proc = spawn([sys.executable, "-m", "mini.train", *args(tiny, tmp_path, run, 1000, "--save_every", "0")],
                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / run / "metrics.jsonl"
    while proc.poll() is None and not metrics.exists():
        time.sleep(0.05)
    return proc


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_saves_a_checkpoint(spawn, tiny, tmp_path, sig):
    proc = start_and_wait_for_a_step(spawn, tiny, tmp_path, "sig")
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    name = signal.Signals(sig).name
    assert proc.returncode == 128 + sig and f"{name}: finishing step" in err and "saved; resume with: python mini/train.py" in err
    assert "Traceback" not in err
    assert f"{name}: saving checkpoint at step" in (tmp_path / "sig" / "train.log").read_text()
    saved = [f for f in os.listdir(tmp_path / "sig" / "checkpoints") if f.startswith("step_") and f.endswith(".pt")]
    assert len(saved) == 1 and load_checkpoint(str(tmp_path / "sig" / "checkpoints" / saved[0]))["step"] >= 1
    assert not (tmp_path / "sig" / "run.lock").exists()


@pytest.mark.sends_signals
@pytest.mark.parametrize("times", [1, 2])
def test_a_signal_in_the_last_step_lets_the_run_finish(tiny, tmp_path, monkeypatch, times):
    """Also a SIGTERM delivered twice at once, as `timeout` does (to the process, then to its group): one request."""
    finish_step = train.Trainer.finish_step

    def finish_then_signal(self, m, r, tasks):
        finish_step(self, m, r, tasks)
        if self.step == 2:
            for _ in range(times):
                signal.raise_signal(signal.SIGTERM)  # as if it came while step 2 ran: the run's handler takes it
    monkeypatch.setattr(train.Trainer, "finish_step", finish_then_signal)
    assert train.main(args(tiny, tmp_path, "last", 2)) == 0
    assert (tmp_path / "last" / "final" / "model.safetensors").exists()
    assert "Done: final model" in (tmp_path / "last" / "train.log").read_text()


@pytest.mark.sends_signals
def test_a_signal_while_the_final_model_is_written_lets_it_be_written(tiny, tmp_path, monkeypatch, capsys):
    """--steps 3 with --save_every 2: a Ctrl-C as the last checkpoint is written (step 3, past the last regular one)
    is noted, said, and both it and the final snapshot are written; the run ends as finished."""
    save_regular = train.Trainer.save_regular

    def signal_then_save(self):
        if self.step == 3:
            signal.raise_signal(signal.SIGINT)
        save_regular(self)
    monkeypatch.setattr(train.Trainer, "save_regular", signal_then_save)
    assert train.main(args(tiny, tmp_path, "fin", 3)) == 0  # args: --save_every 2
    assert (tmp_path / "fin" / "final" / "model.safetensors").exists()
    assert load_checkpoint(str(tmp_path / "fin" / "checkpoints" / "step_000003.pt"))["step"] == 3
    assert "SIGINT: writing the last checkpoint and the final model (again to quit at once)" in capsys.readouterr().err


def test_a_second_ctrl_c_quits_at_once_and_damages_nothing(spawn, tiny, tmp_path):
    proc = start_and_wait_for_a_step(spawn, tiny, tmp_path, "twice")
    proc.send_signal(signal.SIGINT)
    first = proc.stderr.readline() + proc.stderr.readline()  # the acknowledgement: the first one was handled
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    err = first + err
    assert "finishing step" in first
    assert proc.returncode == 130 and "quit at once" in err and "Traceback" not in err, err
    ckpts = tmp_path / "twice" / "checkpoints"
    assert not [f for f in os.listdir(ckpts) if f.endswith(".tmp")]  # an interrupted write removes its .tmp
    for f in os.listdir(ckpts):
        if f.endswith(".pt"):
            load_checkpoint(str(ckpts / f))  # every checkpoint is whole, and matches its checksum


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_a_terminal_gets_a_progress_bar(tiny, tmp_path, monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert train.main(args(tiny, tmp_path, "bar", 2)) == 0
    bar = terminal.getvalue()
    assert "2/2" in bar and "reward=" in bar and "kl=" in bar and "<00:00" in bar  # steps, postfix, ETA


def test_report_to_tensorboard_mirrors_metrics_jsonl(tiny, tmp_path):
    pytest.importorskip("tensorboard", reason='tensorboard is an optional extra: pip install -e ".[tensorboard]"')
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    assert train.main(args(tiny, tmp_path, "tb", 2, "--report_to", "tensorboard")) == 0
    events = EventAccumulator(str(tmp_path / "tb" / "tensorboard"))
    events.Reload()
    for row in read_jsonl(tmp_path / "tb" / "metrics.jsonl"):
        for tag, key in (("train/reward", "reward_mean"), ("train/kl", "kl")):
            assert [e.value for e in events.Scalars(tag) if e.step == row["step"]] == [pytest.approx(row[key])]


def test_chess_skill_joins_the_periodic_evaluation(tiny, tmp_path):
    assert train.main(args(tiny, tmp_path, "chess", 2, "--eval_every", "2", "--eval_n", "2", "--eval_chess")) == 0
    row = read_jsonl(tmp_path / "chess" / "metrics.jsonl")[-1]
    assert 0 <= row["chess_mate_acc"] <= 1 and row["chess_selfplay_plies"] >= 0 and "eval_reward" in row


def test_lr_schedule_by_hand():
    cfg = Config(steps=10, warmup_steps=2, decay_steps=2, min_lr_ratio=0.1)
    f = [lr_factor(s, cfg) for s in range(10)]
    assert f[0] == 0.5 and f[1] == 1.0  # warmup applies to the first update
    assert f[2] == pytest.approx(1.0)  # cosine over steps 2..8 starts at the peak
    assert f[5] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 3 / 6)))
    assert f[8] == pytest.approx(0.1) and f[9] == pytest.approx(0.05)  # final linear decay to 0


def test_phase_timer_sums_a_phase_that_repeats_and_times_the_whole_step(monkeypatch):
    """Dynamic sampling generates and scores several times a step: each phase's seconds are summed over its
    repeats, and time_step is the whole step since the timer began, gaps between phases included."""
    clock = iter([100.0, 101.0, 103.0, 103.5, 104.0, 107.0, 110.0, 111.0])  # start; generate 2 s, score 0.5 s, generate 3 s; end
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    timer = PhaseTimer(cuda=False)
    for phase in ("generate", "score", "generate"):
        with timer(phase):
            pass
    assert timer.seconds() == {"time_generate": 5.0, "time_score": 0.5, "time_step": 11.0}


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads Linux's /proc")
def test_peak_memory_on_cpu_is_the_process_high_water_mark_in_mib():
    """On a CPU, peak_mem_mb is the process's resident high-water mark (Linux: VmHWM in kB) in MiB."""
    hwm_kb = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    assert peak_memory_mb(torch.device("cpu")) == pytest.approx(hwm_kb / 1024, rel=0.05)


def test_free_memory_on_cpu_is_mem_available_in_bytes(monkeypatch):
    """On a CPU, free memory is /proc/meminfo's MemAvailable (KiB) in bytes; without that line, unknown (None)."""
    meminfo = "MemTotal:       8000 kB\nMemFree:         100 kB\nMemAvailable:   3000 kB\n"
    monkeypatch.setattr(runtime, "open", lambda path: io.StringIO(meminfo), raising=False)
    assert runtime.free_memory_bytes(torch.device("cpu")) == 3000 * 1024
    meminfo = "MemTotal:       8000 kB\n"
    assert runtime.free_memory_bytes(torch.device("cpu")) is None


def test_optimizer_groups():
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, n_positions=8, vocab_size=10))
    decay, no_decay = model.configure_optimizers(0.01, 1e-3, (0.9, 0.95), "cpu").param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    assert sorted(names[id(p)] for p in decay["params"]) == sorted(
        n for n, p in model.named_parameters() if n.endswith("weight") and "ln" not in n and "wte" not in n and "wpe" not in n)
    assert decay["weight_decay"] > 0 and no_decay["weight_decay"] == 0


def test_find_batch_size_with_a_fake_memory_probe():
    peak = lambda b: 1000 + 300 * b  # bytes of a step at batch size b; capacity 10,000 at 85%: b <= 25
    best, measured = find_batch_size(peak, 2, 10_000, 0.85)  # doubled to 32, then halved between 16 and 32
    assert best == 24 and [b for b, _ in measured] == [2, 4, 8, 16, 32, 24, 28, 26]  # within an eighth of 25
    oom = lambda b: None if b >= 8 else 10 * b
    assert find_batch_size(oom, 2, 10_000, 0.85) == (7, [(2, 20), (4, 40), (8, None), (6, 60), (7, 70)])
    assert find_batch_size(peak, 64, 10_000, 0.85)[0] is None  # even the start does not fit
    assert find_batch_size(lambda b: 0, 1, 1, 0.85, max_batch=8) == (8, [(1, 0), (2, 0), (4, 0), (8, 0)])
    assert find_batch_size(lambda b: 0, 12, 1, 0.85, max_batch=8) == (12, [(12, 0)])  # asked for: measured
    assert find_batch_size(lambda b: 0, 3, 1, 0.85, max_batch=8) == (8, [(3, 0), (6, 0), (8, 0)])  # doubled up to the cap
    assert find_batch_size(lambda b: 50.0 * b, 1, 100, 0.5) == (1, [(1, 50.0), (2, 100.0)])  # exactly the fraction fits


def test_find_batch_size_never_probes_a_size_twice_so_it_ends():
    """Below 8 an eighth of the batch rounds to 0: the halving stops at a gap of 1, where the next midpoint would be
    the last size that fit, probed again for ever. Every limit from 1 to 40, from starts 1 to 5: each size is probed
    once and the answer is within an eighth (or 1) of the limit, never above it."""
    for start in range(1, 6):
        for limit in range(start, 41):
            seen = []

            def probe(b):
                assert b not in seen, f"start {start}, limit {limit}: {b} probed again after {seen}"
                seen.append(b)
                return None if b > limit else 1.0
            best, _ = find_batch_size(probe, start, 10, 0.5)
            assert 0 <= limit - best < max(1, best // 8), (start, limit, best)


def test_a_probe_that_runs_out_of_memory_measures_none_and_puts_the_trainer_back(monkeypatch):
    """Out of memory anywhere in the probe's step (torch's error, or a RuntimeError that says so in any case) is a
    size that does not fit: None, with the RNG and source state, the baseline and the gradients as they were before
    the probe. Any other error is a bug, and raised."""
    for name in ("empty_cache", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, **kw: None)
    p, restored = torch.nn.Parameter(torch.ones(2)), []
    baseline = RewardBaseline("ema")
    baseline(torch.tensor([0.0, 1.0]), ["P", "P"], 2)

    def rollout_failing_with(error):
        def rollout():
            p.grad = torch.ones(2)  # as a backward cut short would leave it
            baseline(torch.tensor([5.0, 6.0]), ["P", "P"], 2)
            raise error
        return rollout
    trainer = types.SimpleNamespace(rank_state=lambda: {"rng": 1}, load_rank_state=restored.append, baseline=baseline,
                                    local_batch=2, optimizer=torch.optim.AdamW([p]), model=torch.nn.Linear(1, 1))
    for error in (torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                  RuntimeError("CUDA error: Out of memory"), RuntimeError("CUBLAS: OUT OF MEMORY")):
        trainer.rollout = rollout_failing_with(error)
        assert probe_peak_memory(trainer, 64) is None
        assert restored.pop() == {"rng": 1} and p.grad is None and baseline.mean == {"P": 0.5}
    trainer.rollout = rollout_failing_with(RuntimeError("mat1 and mat2 shapes cannot be multiplied"))
    with pytest.raises(RuntimeError, match="shapes"):
        probe_peak_memory(trainer, 64)


def test_choose_batch_size_takes_every_ranks_worst_peak_and_sets_the_global_batch(monkeypatch):
    """--auto_batch_size under 2 ranks (CUDA faked): each rank probes its share, the ranks' worst peak decides
    (here rank 1's, 2 GiB a prompt, not this rank's 1), the run takes the largest share that fits half of 80 GiB,
    20, so --batch_size becomes 40, and every measurement is logged as the global batch's."""
    import mini.autobatch as autobatch
    logs, GiB = [], 2**30
    trainer = types.SimpleNamespace(cuda=True, device=torch.device("cuda", 0), local_batch=2, world=2, log=logs.append,
                                    cfg=types.SimpleNamespace(batch_size=4, k_samples=8, memory_fraction=0.5))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(total_memory=80 * GiB))
    monkeypatch.setattr(autobatch, "probe_peak_memory", lambda t, b: GiB * b)  # this rank's
    monkeypatch.setattr(autobatch.distributed, "all_max", lambda peak: 2 * peak)  # the other rank's, twice as high
    autobatch.choose_batch_size(trainer)
    assert (trainer.local_batch, trainer.cfg.batch_size) == (20, 40)
    assert logs[0] == "auto_batch_size: 4 prompts x 8 -> peak 4.0 GiB of 80.0 (the most of 2 ranks)"
    assert logs[-1] == "auto_batch_size: using --batch_size 40"
    trainer.cfg.memory_fraction = 0.01  # not even the start fits
    with pytest.raises(StopRun, match="even 40 prompts x 8 exceed 1% of the GPU; lower --batch_size or --k_samples"):
        autobatch.choose_batch_size(trainer)


def test_the_batch_probe_counts_the_widest_step_and_the_optimizer_state():
    """A probe at step 0 has run no optimizer step and sampled completions of its own lengths: it adds
    AdamW's two moments (8 bytes a float32 parameter) and runs every completion to --max_new_tokens."""
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, n_positions=16, vocab_size=20))
    optimizer = torch.optim.AdamW(model.parameters())
    n = sum(p.numel() for p in model.parameters())
    assert optimizer_state_bytes(optimizer) == 8 * n
    model(torch.zeros(1, 2, dtype=torch.long))[0].sum().backward()
    optimizer.step()
    assert optimizer_state_bytes(optimizer) == 0  # a measured peak holds them already
    model.transformer.wpe.weight.requires_grad_(False)  # a frozen parameter gets no moments
    frozen = model.transformer.wpe.weight.numel()
    assert optimizer_state_bytes(torch.optim.AdamW(model.parameters())) == 8 * (n - frozen)
    r = Rollout([None] * 2, [[1, 2], [3]], [[5], [6, 7, 8]], ["a", "b"])
    assert run_to_the_limit(r, 4, 0).completions == [[5, 0, 0, 0], [6, 7, 8, 0]]


def test_the_batch_probe_leaves_the_trainer_as_it_found_it(tiny, tmp_path, monkeypatch):
    """--auto_batch_size's probe runs a whole step: afterwards the RNGs, the prompt source and the adaptive
    baseline are those before it, so the run is the one given that batch size directly (CUDA's memory counters
    faked: the probe's state handling is the same on the CPU)."""
    for name in ("empty_cache", "reset_peak_memory_stats"):
        monkeypatch.setattr(torch.cuda, name, lambda *a, **kw: None)
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a, **kw: 1000)
    t = train.Trainer(parse_args(args(tiny, tmp_path, "probe", 1, *FULL_STATE)))
    state, baseline = copy.deepcopy(t.rank_state()), copy.deepcopy(t.baseline.state_dict())
    weights, moments = copy.deepcopy(t.model.state_dict()), optimizer_state_bytes(t.optimizer)
    assert probe_peak_memory(t, 2) == 1000 + moments
    assert_same_state(t.rank_state(), state, "rank_state")
    assert_same_state(t.baseline.state_dict(), baseline, "baseline")
    assert_same_state(t.model.state_dict(), weights, "weights")  # forward and backward only: no optimizer step
    assert not t.optimizer.state and all(p.grad is None for p in t.model.parameters())


def test_damaged_checkpoint_is_refused(tmp_path):
    path = tmp_path / "x.pt"
    with pytest.raises(ValueError, match="x.pt does not exist"):  # not "damaged": there is nothing there
        load_checkpoint(str(path))
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="damaged"):
        load_checkpoint(str(path))
    torch.save({"model": {"w": torch.tensor([float("nan")])}, "optimizer": {}, "step": 1, "config": {},
                "run_name": "x", "rng": {}}, path)
    with pytest.raises(ValueError, match="non-finite"):
        load_checkpoint(str(path))


def test_the_largest_seed_plus_a_rank_still_seeds_numpy():
    """--seed 2**32 - 1 is valid, and torchrun's rank 1 seeds seed + 1: numpy takes it modulo 2**32."""
    seed_everything(2**32)
    wrapped = np.random.random()
    seed_everything(0)
    assert np.random.random() == wrapped


def test_seed_everything_seeds_every_generator_and_their_state_round_trips():
    """python, numpy and torch each repeat after the same seed; rng_state taken mid-way (numpy inside its key
    block) and set back after more draws gives the same draws again, as a resumed run needs."""
    draws = lambda: (random.random(), np.random.random(3).tolist(), torch.rand(2).tolist())
    seed_everything(5)
    first = draws()
    seed_everything(5)
    assert draws() == first
    state = rng_state()
    want = draws()
    draws()
    set_rng_state(state)
    assert draws() == want


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))

