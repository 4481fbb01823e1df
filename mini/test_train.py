"""The training loop end to end on a tiny model: files, resume after SIGKILL, NaN recovery, KL stop,
signals, the LR schedule and the optimizer groups.

    python mini/test_train.py
"""
import json
import math
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

import mini.train as train
from mini.config import Config
from mini.loader import load_model, save_model
from mini.model import GPT, GPTConfig
from mini.runs import load_checkpoint
from mini.runtime import lr_factor
from mini.tokenizer import Tokenizer

TIMING = ("time_", "peak_mem_mb")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    torch.manual_seed(0)
    return save_model(GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, n_positions=256)), Tokenizer.gpt2(),
                      str(tmp_path_factory.mktemp("tiny") / "model"))


def args(tiny, log_dir, run, steps, *extra):
    # an entropy bonus moves the weights even while a random model's rewards carry no signal
    return ["--model_path", tiny, "--log_dir", str(log_dir), "--run_name", run, "--steps", str(steps),
            "--batch_size", "2", "--k_samples", "3", "--max_new_tokens", "12", "--eval_every", "0",
            "--save_every", "2", "--entropy_coef", "0.05", "--lr", "1e-3", "--warmup_steps", "2", *extra]


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def without_timing(rows):
    return [{k: v for k, v in r.items() if not k.startswith(TIMING)} for r in rows]


def run_cli(argv):
    return subprocess.run([sys.executable, "-m", "mini.train", *argv], capture_output=True, text=True, timeout=300)


def test_a_short_run_writes_everything(tiny, tmp_path):
    assert train.main(args(tiny, tmp_path, "r", 20, "--eval_every", "10", "--eval_n", "3")) == 0
    run = tmp_path / "r"
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, 21))
    for key in ("loss", "policy_loss", "kl", "kl_coef", "reward_mean", "reward_std", "reward_mean_P", "format_valid_P",
                "zero_var_share", "clip_frac", "entropy", "grad_norm", "lr", "completion_tokens", "time_generate",
                "time_score", "time_update", "peak_mem_mb"):
        assert all(key in m for m in metrics), key
    assert "eval_reward" in metrics[9] and "eval_format_valid_A" in metrics[19]
    assert metrics[0]["lr"] == pytest.approx(1e-3 / 2)  # warmup already applies to the first update
    assert len(read_jsonl(run / "samples.jsonl")) == 20 * 2
    log = (run / "train.log").read_text()
    assert "Step 20 | Loss" in log and "| P/E " in log
    assert json.loads((run / "config.json").read_text())["steps"] == 20
    assert {"recovery.pt", "stable.pt", "step_000020.pt"} <= set(os.listdir(run / "checkpoints"))
    assert len([f for f in os.listdir(run / "checkpoints") if f.startswith("step_")]) == 3  # keep_last
    model, _ = load_model(str(run / "final"))
    start, _ = load_model(tiny)
    assert not torch.equal(model.transformer.wte.weight, start.transformer.wte.weight)  # it trained


def test_sigkill_then_auto_resume_equals_uninterrupted(tiny, tmp_path):
    assert train.main(args(tiny, tmp_path, "straight", 6)) == 0
    argv = args(tiny, tmp_path, "killed", 6)
    proc = subprocess.Popen([sys.executable, "-m", "mini.train", *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    metrics = tmp_path / "killed" / "metrics.jsonl"
    while proc.poll() is None and not (metrics.exists() and len(metrics.read_text().splitlines()) >= 3):
        time.sleep(0.05)
    proc.kill()  # SIGKILL: no chance to save anything
    proc.wait()
    assert not (tmp_path / "killed" / "final").exists()
    resumed = run_cli(argv + ["--auto_resume"])
    assert resumed.returncode == 0, resumed.stderr
    assert "Resumed from" in (tmp_path / "killed" / "train.log").read_text()
    a = without_timing(read_jsonl(tmp_path / "straight" / "metrics.jsonl"))
    b = without_timing(read_jsonl(metrics))
    assert a == b
    wa, _ = load_model(str(tmp_path / "straight" / "final"))
    wb, _ = load_model(str(tmp_path / "killed" / "final"))
    for (k, x), (_, y) in zip(wa.state_dict().items(), wb.state_dict().items()):
        assert torch.equal(x, y), k


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


def test_injected_nan_is_rolled_back(tiny, tmp_path, monkeypatch):
    monkeypatch.setattr(train, "grpo_loss", nan_loss_on({4}))
    assert train.main(args(tiny, tmp_path, "nan", 6)) == 0
    run = tmp_path / "nan"
    log = (run / "train.log").read_text()
    assert "rolled back to step 2" in log and "lr scale now 0.5" in log
    assert os.path.exists(run / "checkpoints" / "debug_step_000003.pt")
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == list(range(1, 7)) and all(math.isfinite(m["loss"]) for m in metrics)
    assert metrics[-1]["lr"] < 1e-3 * 0.5 + 1e-12
    model, _ = load_model(str(run / "final"))
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_persistent_nan_stops_with_a_message(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(train, "grpo_loss", nan_loss_on(set(range(1, 100))))
    assert train.main(args(tiny, tmp_path, "bad", 6)) == 1
    assert "after 3 recoveries; stopping" in capsys.readouterr().err
    assert not (tmp_path / "bad" / "metrics.jsonl").exists()


def test_scoring_in_worker_processes_changes_nothing(tiny, tmp_path):
    assert train.main(args(tiny, tmp_path, "inline", 2)) == 0
    assert train.main(args(tiny, tmp_path, "pool", 2, "--score_workers", "2")) == 0
    a = without_timing(read_jsonl(tmp_path / "inline" / "metrics.jsonl"))
    assert a == without_timing(read_jsonl(tmp_path / "pool" / "metrics.jsonl"))


def test_kl_threshold_stops_cleanly(tiny, tmp_path, capsys):
    assert train.main(args(tiny, tmp_path, "kl", 6, "--kl_threshold", "1e-12")) == 1
    assert "exceeds --kl_threshold" in capsys.readouterr().err
    assert os.path.exists(tmp_path / "kl" / "checkpoints" / "step_000002.pt")  # step 1 has KL 0, step 2 does not


def test_sigterm_saves_a_checkpoint(tiny, tmp_path):
    argv = args(tiny, tmp_path, "term", 1000, "--save_every", "0")
    proc = subprocess.Popen([sys.executable, "-m", "mini.train", *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    metrics = tmp_path / "term" / "metrics.jsonl"
    while proc.poll() is None and not metrics.exists():
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1 and "SIGTERM received: checkpoint saved" in err
    saved = [f for f in os.listdir(tmp_path / "term" / "checkpoints") if f.startswith("step_")]
    assert len(saved) == 1 and load_checkpoint(str(tmp_path / "term" / "checkpoints" / saved[0]))["step"] >= 1


def test_lr_schedule_by_hand():
    cfg = Config(steps=10, warmup_steps=2, decay_steps=2, min_lr_ratio=0.1)
    f = [lr_factor(s, cfg) for s in range(10)]
    assert f[0] == 0.5 and f[1] == 1.0  # warmup applies to the first update
    assert f[2] == pytest.approx(1.0)  # cosine over steps 2..8 starts at the peak
    assert f[5] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 3 / 6)))
    assert f[8] == pytest.approx(0.1) and f[9] == pytest.approx(0.05)  # final linear decay to 0


def test_optimizer_groups():
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, n_positions=8, vocab_size=10))
    decay, no_decay = model.configure_optimizers(0.01, 1e-3, (0.9, 0.95), "cpu").param_groups
    names = {id(p): n for n, p in model.named_parameters()}
    assert sorted(names[id(p)] for p in decay["params"]) == sorted(
        n for n, p in model.named_parameters() if n.endswith("weight") and "ln" not in n and "wte" not in n and "wpe" not in n)
    assert decay["weight_decay"] > 0 and no_decay["weight_decay"] == 0


def test_find_batch_size_with_a_fake_memory_probe():
    peak = lambda b: 1000 + 300 * b  # bytes of a step at batch size b; capacity 10,000 at 85%: b <= 25
    best, measured = train.find_batch_size(peak, 2, 10_000, 0.85)
    assert best == 16 and [b for b, _ in measured] == [2, 4, 8, 16, 32]
    oom = lambda b: None if b >= 8 else 10 * b
    assert train.find_batch_size(oom, 2, 10_000, 0.85) == (4, [(2, 20), (4, 40), (8, None)])
    assert train.find_batch_size(peak, 64, 10_000, 0.85)[0] is None  # even the start does not fit
    assert train.find_batch_size(lambda b: 0, 1, 1, 0.85, max_batch=8)[0] == 8


def test_damaged_checkpoint_is_refused(tmp_path):
    path = tmp_path / "x.pt"
    path.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="damaged"):
        load_checkpoint(str(path))
    torch.save({"model": {"w": torch.tensor([float("nan")])}, "optimizer": {}, "step": 1, "config": {},
                "run_name": "x", "rng": {}}, path)
    with pytest.raises(ValueError, match="non-finite"):
        load_checkpoint(str(path))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
