"""Run directories that never lose a run: one process per run (also two starting at once), no run started
over another, the saved config on resume (and a checkpoint's own), a run that goes back drops what it
abandoned, cut-off logs, .tmp leftovers, a full disk, damaged checkpoints, failed starts, and checkpoints
that load without running code.

    python mini/test_runs.py
"""
import dataclasses
import errno
import glob
import json
import multiprocessing
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
import types

import numpy as np
import pytest
import torch

import mini.train as train
from mini.config import Config
import mini.runs as runs
from mini.runs import (RunDir, RunError, given_flags, is_disk_full, load_checkpoint, remove_checkpoint,
                       resume_config, save_checkpoint)
from mini.test_train import args, nan_loss_on, read_jsonl, tiny  # noqa: F401  (tiny is a fixture)


def test_given_flags():
    assert given_flags(["--steps", "3", "--no_bf16", "--lr=1e-4", "--run_name", "--x"]) == {"steps", "bf16", "lr", "run_name"}


def files_of(path):
    """{relative path: bytes} of every file under path."""
    return {os.path.relpath(f, path): open(f, "rb").read()
            for f in glob.glob(os.path.join(path, "**"), recursive=True) if os.path.isfile(f)}


def fails_with(capsys, argv, message):
    """train.main(argv) ends with code 1 and one line that says `message`, no traceback."""
    assert train.main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err, err
    return err


@pytest.fixture
def two_steps(tiny, tmp_path):
    assert train.main(args(tiny, tmp_path, "r", 2)) == 0
    return tmp_path / "r"


def test_a_live_process_owns_its_run(tiny, tmp_path, two_steps, capsys):
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        RunDir(str(tmp_path), "r").take_lock()
        (two_steps / "run.lock").write_text(f"{sleeper.pid} {os.uname().nodename}\n")
        before = files_of(two_steps)
        RunDir(str(tmp_path), "r").release()  # another process's lock (a rank's, a run's) stays
        fails_with(capsys, args(tiny, tmp_path, "r", 4, "--auto_resume"), f"in use by a running process, PID {sleeper.pid}")
        assert files_of(two_steps) == before
        (two_steps / "run.lock").write_text(f"{sleeper.pid} elsewhere\n")
        fails_with(capsys, args(tiny, tmp_path, "r", 4, "--auto_resume"), f"in use by PID {sleeper.pid} on host elsewhere")
    finally:
        sleeper.kill()
        sleeper.wait()
    (two_steps / "run.lock").write_text(f"{sleeper.pid} {os.uname().nodename}\n")  # its process is gone: stale
    assert train.main(args(tiny, tmp_path, "r", 3, "--auto_resume")) == 0
    assert "taking over" in capsys.readouterr().err and not (two_steps / "run.lock").exists()
    assert [m["step"] for m in read_jsonl(two_steps / "metrics.jsonl")] == [1, 2, 3]


def claim_together(log_dir, barrier, outcomes):
    """In a child process: claim the run "race" at the same moment as the other child, reading the lock's
    owner slowly (a busy machine), and stay alive until both have tried."""
    run = RunDir(log_dir, "race")
    read = run.lock_owner
    run.lock_owner = lambda: (time.sleep(0.3), read())[1]
    barrier.wait(timeout=60)
    try:
        run.claim(resume=True)
        outcomes.put("claimed")
    except RunError as e:
        outcomes.put(str(e))
    barrier.wait(timeout=60)


def test_of_two_processes_starting_at_once_one_gets_the_run(tmp_path):
    # spawn, not fork: a child forked from pytest's threads can deadlock at exit, and pytest then waits on it
    ctx = multiprocessing.get_context("spawn")
    barrier, outcomes = ctx.Barrier(2), ctx.Queue()
    children = [ctx.Process(target=claim_together, args=(str(tmp_path), barrier, outcomes), daemon=True)
                for _ in range(2)]
    try:
        for child in children:
            child.start()
        got = [outcomes.get(timeout=120) for _ in children]
        for child in children:
            child.join(timeout=60)
            assert child.exitcode == 0, child.exitcode
    finally:
        for child in children:
            if child.is_alive():
                child.kill()
    assert got.count("claimed") == 1 and any("is in use by a running process" in g for g in got), got


def test_a_run_is_never_started_over_by_accident(tiny, tmp_path, two_steps, capsys):
    before = files_of(two_steps)
    fails_with(capsys, args(tiny, tmp_path, "r", 2), "already holds a run; continue it with --auto_resume, or start "
                                                      "afresh with --overwrite")
    assert files_of(two_steps) == before
    assert train.main(args(tiny, tmp_path, "r", 1, "--overwrite")) == 0
    aside = glob.glob(str(tmp_path / "r.old-*"))
    assert len(aside) == 1 and files_of(aside[0]) == before  # moved, not deleted
    assert [m["step"] for m in read_jsonl(two_steps / "metrics.jsonl")] == [1]


def test_auto_resume_runs_under_the_saved_config(tiny, tmp_path, two_steps, capsys):
    with open(two_steps / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "loss": 0.1')  # killed mid-write
    (two_steps / "checkpoints" / "step_000009.pt.tmp").write_bytes(b"half")  # leftovers of a killed write
    (two_steps / ".tmp-final").mkdir()  # and of a killed snapshot
    run = ["--log_dir", str(tmp_path), "--run_name", "r", "--auto_resume"]
    before = files_of(two_steps)
    err = fails_with(capsys, run + ["--lr", "0.5", "--k_samples", "4", "--model_path", str(tmp_path)],
                     "these flags would change it: --k_samples 4 (the run has 3), --lr 0.5 (the run has 0.001), --model_path")
    assert err.count("\n") == 1 and files_of(two_steps) == before
    assert train.main(run + ["--steps", "3"]) == 0  # steps may change
    assert "skipping the last line, cut off" in capsys.readouterr().err
    assert "resume: --steps 2 -> 3" in (two_steps / "train.log").read_text()
    assert json.loads((two_steps / "config.json").read_text())["steps"] == 3
    assert [m["step"] for m in read_jsonl(two_steps / "metrics.jsonl")] == [1, 2, 3]
    assert not glob.glob(str(two_steps / "**" / "*.tmp"), recursive=True) and not (two_steps / ".tmp-final").exists()


def test_a_resume_takes_the_settings_of_the_run_or_refuses(tiny, tmp_path, two_steps, capsys):
    """--resume_from_checkpoint runs under the checkpoint's settings, --recovery_mode under the run's config.json
    like --auto_resume; a given flag that would change the run is refused."""
    step2 = two_steps / "checkpoints" / "step_000002.pt"
    before = files_of(two_steps)
    fails_with(capsys, args(tiny, tmp_path, "c", 3, "--k_samples", "4", "--resume_from_checkpoint", str(step2)),
               "--resume_from_checkpoint continues the run with the checkpoint's settings, and these flags would "
               "change it: --k_samples 4 (the run has 3); drop them")
    assert not (tmp_path / "c").exists()  # a refused start leaves no directory
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(step2.read_bytes()[:1000])
    for path, why in [(tmp_path / "nope.pt", "does not exist"), (damaged, "cannot be read ("),
                      (step2.parent, "is a folder; give a checkpoint file")]:
        fails_with(capsys, ["--log_dir", str(tmp_path), "--run_name", "c", "--resume_from_checkpoint", str(path)],
                   f"error: --resume_from_checkpoint: {path} {why}")
    assert train.main(["--log_dir", str(tmp_path), "--run_name", "c", "--resume_from_checkpoint", str(step2),
                       "--steps", "3"]) == 0
    assert json.loads((tmp_path / "c" / "config.json").read_text())["k_samples"] == 3
    assert [m["step"] for m in read_jsonl(tmp_path / "c" / "metrics.jsonl")] == [3]
    config = two_steps / "config.json"
    saved = config.read_text()
    config.write_text(saved.replace('"lr": 0.001', '"lr": 0.5'))  # no longer the settings of its checkpoints
    fails_with(capsys, ["--log_dir", str(tmp_path), "--run_name", "r", "--auto_resume"],
               "was written by a run with other settings, and these flags would change it: --lr 0.5 (the run has 0.001)")
    config.write_text(saved)
    run = ["--log_dir", str(tmp_path), "--run_name", "r", "--recovery_mode"]
    fails_with(capsys, run + ["--lr", "0.5"], "--recovery_mode continues the run with its own config.json, and these "
                                               "flags would change it: --lr 0.5 (the run has 0.001)")
    assert files_of(two_steps) == before
    assert train.main(run + ["--steps", "3"]) == 0  # the model, sizes and objective come from config.json
    log = (two_steps / "train.log").read_text()
    assert f"Resumed from {two_steps / 'checkpoints' / 'recovery.pt'} at step 2" in log
    assert "resume: --steps 2 -> 3" in log
    assert json.loads((two_steps / "config.json").read_text())["k_samples"] == 3
    assert [m["step"] for m in read_jsonl(two_steps / "metrics.jsonl")] == [1, 2, 3]


def count_loads(monkeypatch):
    """The paths runs.load_checkpoint (a full read: checksum and every tensor) is called on from now on."""
    loads, load = [], runs.load_checkpoint
    monkeypatch.setattr(runs, "load_checkpoint", lambda path: loads.append(path) or load(path))
    return loads


def test_a_run_whose_config_json_is_gone_resumes_under_its_checkpoints_settings(tiny, tmp_path, two_steps, capsys,
                                                                               monkeypatch):
    """config.json deleted: --auto_resume and --recovery_mode take the run's settings from the checkpoint they
    continue from (the defaults would be refused by it, or start the run anew), and write config.json again."""
    config = two_steps / "config.json"
    config.unlink()
    run = ["--log_dir", str(tmp_path), "--run_name", "r"]
    fails_with(capsys, run + ["--recovery_mode", "--lr", "0.5"], f"--recovery_mode continues the run with the settings "
               f"of {two_steps / 'checkpoints' / 'recovery.pt'} (its config.json is missing), and these flags would "
               "change it: --lr 0.5 (the run has 0.001)")
    loads = count_loads(monkeypatch)
    assert train.main(run + ["--auto_resume", "--steps", "3"]) == 0
    assert len(loads) == 1  # the settings are peeked at, the checkpoint loaded once (124M: about 1.5 GB)
    assert re.search(r"Resumed from \S+\.pt at step 2", (two_steps / "train.log").read_text())
    assert json.loads(config.read_text())["k_samples"] == 3
    assert [m["step"] for m in read_jsonl(two_steps / "metrics.jsonl")] == [1, 2, 3]


def test_a_resumed_run_goes_on_from_its_own_latest_step(tiny, tmp_path, two_steps):
    """A run started from another run's checkpoint goes on from its own with --auto_resume (config.json's start
    flags are not obeyed again); taken back to an earlier step, it drops the checkpoints of the later ones."""
    step2 = two_steps / "checkpoints" / "step_000002.pt"
    assert train.main(args(tiny, tmp_path, "b", 3, "--resume_from_checkpoint", str(step2))) == 0
    b = tmp_path / "b"
    assert train.main(["--log_dir", str(tmp_path), "--run_name", "b", "--auto_resume", "--steps", "4"]) == 0
    assert f"Resumed from {b / 'checkpoints' / 'step_000003.pt'} at step 3" in (b / "train.log").read_text()
    config = json.loads((b / "config.json").read_text())
    assert config["auto_resume"] and not config["resume_from_checkpoint"]
    assert [m["step"] for m in read_jsonl(b / "metrics.jsonl")] == [3, 4]
    step3 = b / "checkpoints" / "step_000003.pt"
    assert train.main(args(tiny, tmp_path, "b", 3, "--resume_from_checkpoint", str(step3))) == 0  # back to step 3
    assert sorted(os.listdir(b / "checkpoints")) == ["recovery.pt", "recovery.pt.sha256", "step_000003.pt",
                                                     "step_000003.pt.sha256"]
    assert RunDir(str(tmp_path), "b").latest_valid_checkpoint()[1]["step"] == 3
    assert [m["step"] for m in read_jsonl(b / "metrics.jsonl")] == [3]


def test_a_checkpoint_of_two_ranks_is_resumed_by_two(tiny, tmp_path, two_steps, capsys):
    """A checkpoint written under torchrun by 2 processes holds each rank's own state; a plain run resuming it would
    take rank 0's for the whole batch: refused in one sentence that says how to resume it."""
    for path in glob.glob(str(two_steps / "checkpoints" / "*.pt")):  # regular, recovery: all of that run
        state = load_checkpoint(path)
        rank = {k: state[k] for k in ("sampler", "sft_sampler", "buffer", "selfplay", "rng")}
        save_checkpoint(path, {**state, "ranks": [rank, rank]})
    fails_with(capsys, ["--log_dir", str(tmp_path), "--run_name", "r", "--auto_resume", "--steps", "3"],
               "written by 2 process(es) and this run has 1; resume it with the same number (torchrun --nproc_per_node 2")


def test_a_crash_before_a_steps_row_leaves_no_checkpoint_past_it(tiny, tmp_path, monkeypatch):
    """A step's row is written before its stable.pt (the best held-out reward): a run killed in between resumed
    from stable.pt, past a step that metrics.jsonl never held; now it resumes before it and the step is redone."""
    write_step = train.Trainer.write_step

    def killed_at_step_2(self, m, r, tasks):
        if self.step == 2:
            raise RuntimeError("killed")
        write_step(self, m, r, tasks)
    monkeypatch.setattr(train.Trainer, "write_step", killed_at_step_2)
    with pytest.raises(RuntimeError, match="killed"):
        train.main(args(tiny, tmp_path, "r", 4, "--eval_every", "2", "--eval_n", "2", "--save_every", "3"))
    monkeypatch.setattr(train.Trainer, "write_step", write_step)
    assert train.main(args(tiny, tmp_path, "r", 4, "--eval_every", "2", "--eval_n", "2", "--save_every", "3",
                           "--auto_resume")) == 0
    assert [m["step"] for m in read_jsonl(tmp_path / "r" / "metrics.jsonl")] == [1, 2, 3, 4]


def test_pruning_goes_by_step_and_keeps_the_checkpoint_just_written(tmp_path):
    run = RunDir(str(tmp_path), "p")
    for step in (999_998, 999_999, 1_000_000):  # a seventh digit sorts first by name
        run.save_regular({"step": step}, keep_last=2)
    assert sorted(os.listdir(run.ckpt_dir)) == ["step_1000000.pt", "step_1000000.pt.sha256", "step_999999.pt",
                                                "step_999999.pt.sha256"]
    run.save_regular({"step": 1_000_001}, keep_last=2)  # the oldest by step goes, not the first by name
    assert sorted(os.listdir(run.ckpt_dir)) == ["step_1000000.pt", "step_1000000.pt.sha256", "step_1000001.pt",
                                                "step_1000001.pt.sha256"]
    run.save_regular({"step": 5}, keep_last=1)  # later ones, whatever left them, never push out the new one
    assert sorted(os.listdir(run.ckpt_dir)) == ["step_000005.pt", "step_000005.pt.sha256"]


def test_a_damaged_recovery_checkpoint_is_written_again_or_stops_the_rollback(tiny, tmp_path, two_steps, monkeypatch,
                                                                              capsys):
    """A resume skips a damaged recovery.pt and writes it again from the state it resumed, so that the next
    rollback goes back to exactly that step; damaged during a run, a rollback stops it with one sentence."""
    recovery = two_steps / "checkpoints" / "recovery.pt"
    recovery.write_bytes(b"garbage")
    monkeypatch.setattr(train, "grpo_loss", nan_loss_on({1, 3}))  # the first try of step 3, then step 4
    finish_step = train.Trainer.finish_step

    def finish_then_damage(self, m, r, tasks):
        finish_step(self, m, r, tasks)
        recovery.write_bytes(b"garbage")
    monkeypatch.setattr(train.Trainer, "finish_step", finish_then_damage)
    err = fails_with(capsys, args(tiny, tmp_path, "r", 4, "--auto_resume"),
                     f"non-finite loss or gradient at step 3, and the rollback failed: {recovery} does not match its "
                     "checksum")
    assert "non-finite loss or gradient: rolled back to step 2" in (two_steps / "train.log").read_text()
    assert "continue from the last good checkpoint with --auto_resume" in err
    assert [m["step"] for m in read_jsonl(two_steps / "metrics.jsonl")] == [1, 2, 3]


def test_every_checkpoint_damaged_stops_the_resume(tiny, tmp_path, two_steps, capsys):
    for f in glob.glob(str(two_steps / "checkpoints" / "*.pt")):
        open(f, "wb").write(b"garbage")
    before = files_of(two_steps)
    fails_with(capsys, args(tiny, tmp_path, "r", 4, "--auto_resume"), "every checkpoint of")
    assert files_of(two_steps) == before  # no restart at step 0 on top of the old logs


def test_a_full_disk_keeps_the_last_good_checkpoint(tiny, tmp_path, monkeypatch, capsys):
    real_save, calls = torch.save, []

    def save(obj, path, *a, **kw):  # recovery.pt at the start is written; step 2's checkpoint finds the disk full
        calls.append(path)
        if len(calls) > 1:
            open(path, "wb").write(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device", path)
        real_save(obj, path, *a, **kw)
    monkeypatch.setattr(torch, "save", save)
    err = fails_with(capsys, args(tiny, tmp_path, "full", 4), "disk full writing")
    assert "MiB are free there; free some space, then continue with --auto_resume" in err
    ckpts = tmp_path / "full" / "checkpoints"
    assert sorted(os.listdir(ckpts)) == ["recovery.pt", "recovery.pt.sha256"] and load_checkpoint(str(ckpts / "recovery.pt"))["step"] == 0


def test_a_failed_start_leaves_no_directory(tiny, tmp_path, capsys):
    data = tmp_path / "empty.txt"
    data.write_text("\n")
    fails_with(capsys, args(tiny, tmp_path, "nope", 2, "--data_source", "file", "--data_file", str(data)),
               "holds no sample (it is empty)")
    assert not (tmp_path / "nope").exists()
    (tmp_path / "mine").mkdir()  # a directory the user made beforehand stays, empty as it was
    fails_with(capsys, args(tiny, tmp_path, "mine", 2, "--data_source", "file", "--data_file", str(data)),
               "holds no sample (it is empty)")
    assert (tmp_path / "mine").is_dir() and not list((tmp_path / "mine").iterdir())


def test_checkpoints_load_without_running_code(tiny, tmp_path, two_steps):
    for f in glob.glob(str(two_steps / "checkpoints" / "*.pt")):
        torch.load(f, weights_only=True)  # what load_checkpoint does: plain tensors, numbers, strings
    old = tmp_path / "old.pt"  # the earlier format: numpy's RNG state as a pickled array
    torch.save({"model": {}, "optimizer": {}, "step": 1, "config": {}, "run_name": "x",
                "rng": {"numpy": np.random.get_state()}}, old)
    with pytest.raises(ValueError, match="written by an older mini/train.py in a format that may run code"):
        load_checkpoint(str(old))
    other = tmp_path / "other.pt"  # a plain torch file of something else
    torch.save({"model": {}, "step": 1}, other)
    with pytest.raises(ValueError, match=r"lacks \['config', 'optimizer', 'rng', 'run_name'\]; it is not a checkpoint"):
        load_checkpoint(str(other))
    with pytest.raises(RunError, match="is damaged"):
        (two_steps / "config.json").write_text("{")
        RunDir(str(tmp_path), "r").saved_config()


# ----------------------------------------------------------------------------- by hand, no training

# settings that decide what a run computes (model, data, sampling, objective, optimiser, seed): a resume
# that changed one would not continue the run but splice another onto it
DEFINING = {"model_path": "elsewhere", "seed": 7, "lr": 0.5, "batch_size": 5, "k_samples": 5, "temperature": 0.5,
            "top_k": 3, "max_new_tokens": 9, "mix_env_ratio": 0.9, "data_source": "generate", "kl_coef": 0.5,
            "kl_type": "forward", "loss_type": "dapo", "num_iterations": 3, "clip_eps_low": 0.1, "clip_eps_high": 0.3,
            "warmup_steps": 3, "decay_steps": 3, "weight_decay": 0.5, "reward_shaping": "strict", "scale_rewards": "none",
            "baseline_type": "adaptive", "use_gae": True, "entropy_coef": 0.1, "policy_pad": "89", "bf16": False,
            "dynamic_sampling": True, "p_reward": "engine", "env_sft_coef": 0.1, "adaptive_kl": True}
# settings of how it runs, not what it computes (documented as changeable on resume)
RUNTIME = {"steps": 9, "time_limit_min": 5.0, "eval_every": 7, "eval_n": 3, "eval_chess": True, "log_samples": 1,
           "save_every": 3, "keep_last": 1, "kl_threshold": 1.0, "device": "cpu", "score_workers": 0,
           "micro_batch_size": 2, "grad_checkpointing": True, "compile": True, "compile_decode": True,
           "shared_prefix_decode": False, "fused_logprobs": True, "entropy_every": 4, "stockfish_path": "/x/sf",
           "engine_cache": "", "report_to": "tensorboard", "annotate_workers": 1, "memory_fraction": 0.5,
           "log_dir": "elsewhere", "run_name": "renamed"}


def test_resume_config_applies_runtime_flags_and_refuses_defining_ones():
    saved = dataclasses.asdict(Config(resume_from_checkpoint="old.pt", overwrite=True))
    for name, value in RUNTIME.items():
        cfg, changed = resume_config(Config(auto_resume=True, **{name: value}), {name}, saved, "the run")
        assert getattr(cfg, name) == value and changed == {name: (saved[name], value)}, name
        assert cfg.auto_resume and not cfg.resume_from_checkpoint and not cfg.overwrite  # this start's, not the saved
    for name, value in DEFINING.items():
        with pytest.raises(RunError, match=f"the run, and these flags would change it: --{name} {value!r}"):
            resume_config(Config(auto_resume=True, **{name: value}), {name}, saved, "the run")
        assert resume_config(Config(**{name: value}), set(), saved, "x")[0] == Config()  # not given: the saved one
    assert resume_config(Config(lr=1e-5), {"lr"}, saved, "x") == (Config(), {})  # given, the run's own value


@pytest.mark.parametrize("saved,message", [
    ([1, 2], "it holds a list, not the run's settings"),
    ({"lr": "fast"}, 'it holds a setting no flag could give: --lr "fast" must be a number'),
    ({"lr": True}, "--lr true must be a number"),  # JSON's true is a bool, which Python counts as 1
    ({"steps": 2.5}, "--steps 2.5 must be a whole number"),
    ({"bf16": "yes"}, '--bf16 "yes" must be true or false'),
    ({"run_name": 7}, "--run_name 7 must be text"),
    ({"loss_type": "ppo"}, '--loss_type "ppo" must be one of grpo, dr_grpo, dapo'),
    ({"lr": -1.0}, "--lr -1.0 must be in (0, 1]"),
    ({"data_source": "file", "data_file": "/gone.jsonl"}, "--data_file /gone.jsonl: no such file"),
])
def test_a_saved_setting_the_flags_would_refuse_stops_the_resume_in_one_sentence(saved, message):
    """A config.json edited by hand (or a checkpoint's settings) meets the checks a flag meets; else `"fast"`
    would reach the optimizer as the LR, and a step of 2.5 the loop."""
    with pytest.raises(RunError, match="^the run, but .*" + re.escape(message)):
        resume_config(Config(auto_resume=True), set(), saved, "the run")


def ckpt_state(step, value=0.0):
    return {"model": {"w": torch.full((3,), value)}, "optimizer": {}, "step": step, "config": {}, "run_name": "r",
            "rng": {}}


def test_a_kill_between_a_checkpoint_and_its_checksum_leaves_the_new_one_readable(tmp_path, monkeypatch):
    """recovery.pt is written over again and again: a kill after the new file's rename and before its checksum's
    leaves the new file without a checksum (read unverified), never beside the old file's checksum (damaged)."""
    path = str(tmp_path / "recovery.pt")
    save_checkpoint(path, ckpt_state(1))

    def killed(_):
        raise KeyboardInterrupt
    monkeypatch.setattr(runs, "write_checksum", killed)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, ckpt_state(2))
    assert load_checkpoint(path)["step"] == 2


def test_a_checkpoint_reaches_the_disk_before_its_rename_and_the_rename_after(tmp_path, monkeypatch):
    """A power loss must not leave the new name on an empty file: the .tmp's bytes are synced before the rename
    and the directory (which holds the rename) after it."""
    events, fsync = [], os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"),
                                                                     os.fstat(fd).st_size)) or fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b, replace=os.replace: events.append(("replace", a)) or replace(a, b))
    path = str(tmp_path / "chk_000001.pt")
    save_checkpoint(path, {"step": 1, "w": torch.ones(100)})
    tmp, at = path + ".tmp", {}
    for i, e in enumerate(events):
        at.setdefault(e[:2], i)
    assert at[("fsync", tmp)] < at[("replace", tmp)] < at[("fsync", str(tmp_path))]
    assert events[at[("fsync", tmp)]][2] > 400  # the whole file, not an empty one
    assert torch.load(path, weights_only=True)["step"] == 1


def test_latest_valid_checkpoint_is_the_highest_step_of_the_good_ones(tmp_path, capsys):
    """Regular, stable and recovery checkpoints compete by step; debug ones, damaged ones and non-finite ones
    never win."""
    run = RunDir(str(tmp_path), "r")
    for step in (3, 1, 5):
        run.save_regular(ckpt_state(step), keep_last=0)
    run.save("stable.pt", ckpt_state(4))
    run.save("recovery.pt", ckpt_state(2))
    run.save("debug_step_000009.pt", ckpt_state(9))
    run.save("step_000008.pt", ckpt_state(8, float("nan")))
    run.save("step_000007.pt", ckpt_state(7))
    open(run.checkpoint("step_000007.pt"), "r+b").truncate(100)
    path, state = run.latest_valid_checkpoint()
    assert path == run.checkpoint("step_000005.pt") and state["step"] == 5
    remove_checkpoint(path)
    assert run.latest_valid_checkpoint()[0] == run.checkpoint("stable.pt")
    capsys.readouterr()


def test_latest_valid_checkpoint_loads_from_the_top_down_until_one_is_good(tmp_path, monkeypatch, capsys):
    """Each full load reads and hashes a whole checkpoint (about 1.5 GB at 124M): the steps are peeked at first,
    and only the damaged ones above the winner are loaded beside it."""
    run = RunDir(str(tmp_path), "r")
    for step in (1, 2, 3, 4, 5):
        run.save_regular(ckpt_state(step), keep_last=0)
    run.save("recovery.pt", ckpt_state(4))
    with open(run.checkpoint("step_000005.pt"), "r+b") as f:  # the step still reads; the checksum fails
        f.seek(-30, os.SEEK_END)
        f.write(b"x")
    loads = count_loads(monkeypatch)
    path, state = run.latest_valid_checkpoint()
    assert state["step"] == 4 and os.path.basename(path) in ("step_000004.pt", "recovery.pt")
    assert [os.path.basename(p) for p in loads[:1]] == ["step_000005.pt"] and len(loads) == 2
    assert "step_000005.pt does not match its checksum" in capsys.readouterr().err


def test_keep_last_0_keeps_every_checkpoint_and_n_keeps_the_n_newest(tmp_path):
    run = RunDir(str(tmp_path), "k")
    for step in (1, 2, 3):
        run.save_regular({"step": step}, keep_last=0)
    assert sorted(f for f in os.listdir(run.ckpt_dir) if f.endswith(".pt")) == [
        "step_000001.pt", "step_000002.pt", "step_000003.pt"]
    run.save_regular({"step": 4}, keep_last=3)
    assert sorted(f for f in os.listdir(run.ckpt_dir) if f.endswith(".pt")) == [
        "step_000002.pt", "step_000003.pt", "step_000004.pt"]
    assert sorted(f for f in os.listdir(run.ckpt_dir) if f.endswith(".sha256")) == [
        "step_000002.pt.sha256", "step_000003.pt.sha256", "step_000004.pt.sha256"]


def test_cut_back_keeps_the_step_it_goes_on_from(tmp_path):
    """cut_back(3): rows of steps 1-3 stay in both logs, checkpoints of steps 4 and 5 go, step 3's stays; so do
    a stable.pt and a recovery.pt of step 3 or before (of later steps: the next test)."""
    run = RunDir(str(tmp_path), "c")
    os.makedirs(run.path)
    for step in (2, 3, 4, 5):
        run.save_regular({"step": step}, keep_last=0)
    run.save("recovery.pt", {"step": 3})
    run.save("stable.pt", {"step": 2})
    for name in ("metrics.jsonl", "samples.jsonl"):
        run.append_jsonl(name, [{"step": s, "x": s} for s in (1, 2, 3, 3, 4, 5)])
    run.cut_back(3)
    assert sorted(f for f in os.listdir(run.ckpt_dir) if f.endswith(".pt")) == [
        "recovery.pt", "stable.pt", "step_000002.pt", "step_000003.pt"]
    for name in ("metrics.jsonl", "samples.jsonl"):
        assert [r["step"] for r in read_jsonl(tmp_path / "c" / name)] == [1, 2, 3, 3]


def run_at_step_6(tmp_path):
    """A run "c" with checkpoints of steps 3 and 6, its best evaluation at 6 (stable.pt), a recovery.pt of step 5."""
    run = RunDir(str(tmp_path), "c")
    os.makedirs(run.path)
    for step in (3, 6):
        run.save_regular(ckpt_state(step), keep_last=0)
    run.save("stable.pt", ckpt_state(6))
    run.save("recovery.pt", ckpt_state(5))
    return run


@pytest.mark.parametrize("row,message", [('{"step": 2', r"metrics.jsonl:2: not a JSON row; the log is damaged"),
                                         ('{"stpe": 2}', r"metrics.jsonl: a row without its step; the log is damaged"),
                                         ("[2]", r"metrics.jsonl: a row without its step; the log is damaged")])
def test_a_damaged_log_stops_going_back_before_anything_is_removed(tmp_path, row, message):
    """Going back from step 6 to 3 over a damaged metrics.jsonl is refused in one sentence (a row without its step
    was a KeyError), and leaves the run as it was: step 6's checkpoint, recovery.pt and stable.pt were already
    gone when the damage was found, so the run moved aside with --overwrite, as the message says, lacked them."""
    run = run_at_step_6(tmp_path)
    run.append_jsonl("samples.jsonl", [{"step": s} for s in range(1, 7)])
    (tmp_path / "c" / "metrics.jsonl").write_text(f'{{"step": 1}}\n{row}\n{{"step": 3}}\n')
    before = files_of(run.path)
    with pytest.raises(RunError, match=message + ": restore it, or move the run aside with --overwrite"):
        run.cut_back(3)
    assert files_of(run.path) == before


def test_auto_resume_after_going_back_does_not_return_to_the_abandoned_branch(tmp_path):
    """A run at step 6 with its best evaluation there (stable.pt) and a recovery.pt of step 5 goes back to step 3
    (--resume_from_checkpoint step_000003.pt): both are of the abandoned branch, so a later --auto_resume goes
    on from step 3, not from 6 on top of the new branch's logs. The recovery.pt goes with step 6's checkpoint;
    the best model is kept, intact, in abandoned/. Going back to the best evaluation's own step keeps it."""
    run = run_at_step_6(tmp_path)
    run.cut_back(3)
    path, state = run.latest_valid_checkpoint()
    assert (os.path.basename(path), state["step"]) == ("step_000003.pt", 3)
    assert sorted(f for f in os.listdir(run.ckpt_dir) if f.endswith(".pt")) == ["step_000003.pt"]
    assert load_checkpoint(run.checkpoint("abandoned/stable_step_000006.pt"))["step"] == 6
    # Going back to the step of the best evaluation itself keeps it: stable.pt and recovery.pt of step 3 are
    # of the branch the run goes on with.
    run.save("stable.pt", ckpt_state(3))
    run.save("recovery.pt", ckpt_state(3))
    run.cut_back(3)
    assert load_checkpoint(run.checkpoint("stable.pt"))["step"] == 3
    assert load_checkpoint(run.checkpoint("recovery.pt"))["step"] == 3
    assert sorted(os.listdir(run.checkpoint("abandoned"))) == ["stable_step_000006.pt", "stable_step_000006.pt.sha256"]


def test_a_run_name_with_glob_characters_finds_its_own_files(tmp_path):
    """--run_name exp[1]: the run's checkpoints and leftovers are found in its own directory, not matched as a
    pattern (it matched exp1's, and pruning failed on the checkpoint just written: list.remove)."""
    other = RunDir(str(tmp_path), "exp1")  # what the pattern exp[1] matches
    other.save_regular(ckpt_state(9), keep_last=0)
    run = RunDir(str(tmp_path), "exp[1]")
    run.claim(resume=False)
    for step in (1, 2, 3):
        run.save_regular(ckpt_state(step), keep_last=2)
    assert sorted(f for f in os.listdir(run.ckpt_dir) if f.endswith(".pt")) == ["step_000002.pt", "step_000003.pt"]
    assert [step for step, _ in run.resumable_checkpoints()] == [3, 2]
    run.cut_back(2)
    assert sorted(f for f in os.listdir(run.ckpt_dir) if f.endswith(".pt")) == ["step_000002.pt"]
    open(run.checkpoint("step_000003.pt.tmp"), "w").close()
    open(run.file("config.json.tmp"), "w").close()
    os.mkdir(run.file(".tmp-final"))
    run.release()
    run.claim(resume=True)
    assert sorted(os.listdir(run.path)) == ["checkpoints", "run.lock"]
    assert sorted(os.listdir(other.ckpt_dir)) == ["step_000009.pt", "step_000009.pt.sha256"]


@pytest.mark.parametrize("pid", ["0", "-1", str(2**64)])
def test_a_lock_naming_no_possible_process_is_damaged(tmp_path, pid):
    """PID 0 and -1 are no process (os.kill(0, 0) signals this process group: "in use by a running process"),
    and one past the C long overflowed os.kill: a traceback."""
    run = RunDir(str(tmp_path), "r")
    os.makedirs(run.path)
    with open(run.lock, "w") as f:
        f.write(f"{pid} {os.uname().nodename}\n")
    with pytest.raises(RunError, match="names no process: the file is damaged"):
        run.take_lock()


@pytest.mark.parametrize("obj,kind", [(5, "int"), (torch.tensor(1.0), "Tensor"), ([1, 2], "list")])
def test_a_torch_file_of_no_dict_is_not_a_checkpoint(tmp_path, obj, kind):
    """--resume_from_checkpoint of a saved number or tensor: one sentence, not a TypeError from set(state)."""
    path = tmp_path / "x.pt"
    torch.save(obj, path)
    with pytest.raises(ValueError, match=f"x.pt is not a checkpoint of mini/train.py \\(it holds a {kind}, not a dict\\)"):
        load_checkpoint(str(path))


def test_overwrites_within_one_second_each_move_their_run_aside(tmp_path, monkeypatch, capsys):
    """Two --overwrite starts in the same second: the second run is moved to .old-<stamp>-1, not renamed onto
    the first's aside (a traceback, Directory not empty)."""
    monkeypatch.setattr(runs.time, "strftime", lambda fmt: "20250101-000000")
    for i in range(3):
        run = RunDir(str(tmp_path), "r")
        run.claim(resume=False, overwrite=True)
        run.append_jsonl("metrics.jsonl", [{"step": i}])
        run.release()
    assert sorted(os.listdir(tmp_path)) == ["r", "r.old-20250101-000000", "r.old-20250101-000000-1"]
    for name, step in [("r.old-20250101-000000", 0), ("r.old-20250101-000000-1", 1), ("r", 2)]:
        assert read_jsonl(tmp_path / name / "metrics.jsonl") == [{"step": step}]
        assert sorted(os.listdir(tmp_path / name)) == ["metrics.jsonl"]  # the lock stays with no run
    capsys.readouterr()


def test_the_aside_name_of_a_long_run_name_fits_the_file_system(tmp_path, monkeypatch, capsys):
    """A 255-byte --run_name moved aside by --overwrite is cut to fit .old-<stamp> in 255 bytes, and not in the
    middle of a character: 117 two-byte characters (234 bytes) and the 20-byte suffix."""
    monkeypatch.setattr(runs.time, "strftime", lambda fmt: "20250101-000000")
    name = "é" * 127 + "a"  # 255 bytes
    run = RunDir(str(tmp_path), name)
    run.claim(resume=False)
    run.append_jsonl("metrics.jsonl", [{"step": 1}])
    run.release()
    RunDir(str(tmp_path), name).claim(resume=False, overwrite=True)
    assert sorted(os.listdir(tmp_path)) == sorted([name, "é" * 117 + ".old-20250101-000000"])
    capsys.readouterr()


def dead_pid():
    """The PID of a process that has ended."""
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


def test_a_lock_is_taken_again_by_its_process_and_over_from_a_dead_one(tmp_path, capsys):
    """The process holding run.lock may take it again; a lock of a process gone from this host is taken over,
    and a directory holding only such a lock holds no run."""
    run = RunDir(str(tmp_path), "r")
    run.take_lock()
    run.take_lock()
    assert run.lock_owner() == (os.getpid(), os.uname().nodename)
    pid = dead_pid()
    with open(run.lock, "w") as f:
        f.write(f"{pid} {os.uname().nodename}\n")
    assert not run.holds_run()
    run.claim(resume=False)
    assert f"taking over {run.lock} of PID {pid}, which is gone" in capsys.readouterr().err
    assert run.lock_owner() == (os.getpid(), os.uname().nodename)


def test_a_live_or_foreign_lock_is_refused_and_kept(tmp_path):
    """A lock of a live process here, or of any process on another host, is refused (also to --overwrite, which
    would move a run in training aside) and stays: release() drops only this process's own lock."""
    run = RunDir(str(tmp_path), "r")
    os.makedirs(run.path)
    (tmp_path / "r" / "config.json").write_text("{}")
    for owner, message in [(f"{os.getppid()} {os.uname().nodename}", f"in use by a running process, PID {os.getppid()}"),
                           (f"{dead_pid()} elsewhere", "on host elsewhere")]:
        (tmp_path / "r" / "run.lock").write_text(owner + "\n")
        before = files_of(run.path)
        for take in (run.take_lock, lambda: run.claim(resume=False, overwrite=True)):
            with pytest.raises(RunError, match=message):
                take()
        run.release()
        assert files_of(run.path) == before and os.listdir(tmp_path) == ["r"]


def test_a_checkpoint_whose_step_cannot_be_peeked_competes_by_its_loaded_step(tmp_path, monkeypatch):
    """A checkpoint in torch's legacy format cannot be memory-mapped, so its step is not peeked: it is loaded first,
    and then wins by its loaded step (5 over step_000003.pt's 3, with no other load) or loses (1)."""
    run = RunDir(str(tmp_path), "r")
    run.save_regular(ckpt_state(3), keep_last=0)
    recovery = run.checkpoint("recovery.pt")
    torch.save(ckpt_state(5), recovery, _use_new_zipfile_serialization=False)
    assert run.resumable_checkpoints() == [(None, recovery), (3, run.checkpoint("step_000003.pt"))]
    loads = count_loads(monkeypatch)
    path, state = run.latest_valid_checkpoint()
    assert (path, state["step"], loads) == (recovery, 5, [recovery])
    torch.save(ckpt_state(1), recovery, _use_new_zipfile_serialization=False)
    path, state = run.latest_valid_checkpoint()
    assert (path, state["step"]) == (run.checkpoint("step_000003.pt"), 3)


def test_checkpoints_whose_steps_cannot_be_peeked_are_all_loaded(tmp_path, monkeypatch):
    """Each unpeekable checkpoint may hold the highest step: all of them are loaded, not only the first listed."""
    run = RunDir(str(tmp_path), "r")
    for step in (1, 2, 3):
        run.save_regular(ckpt_state(step), keep_last=0)
    monkeypatch.setattr(runs, "saved_step", lambda path: None)
    monkeypatch.setattr(runs.glob, "glob", lambda pattern, glob=glob.glob: sorted(glob(pattern)))  # step 1 first
    path, state = run.latest_valid_checkpoint()
    assert (path, state["step"]) == (run.checkpoint("step_000003.pt"), 3)

def test_resume_from_a_checkpoint_that_cannot_be_read_is_one_sentence(tmp_path):
    missing = str(tmp_path / "nowhere.pt")
    with pytest.raises(RunError, match=f"^--resume_from_checkpoint: {re.escape(missing)} does not exist; check the"):
        runs.saved_settings(Config(resume_from_checkpoint=missing))
    assert runs.saved_settings(Config()) == (None, None)  # a new run

def test_a_log_skips_a_bom_and_a_cut_off_last_line_only(tmp_path, capsys):
    """A BOM an editor put first is no damage, and a last line a kill cut off is skipped with a message."""
    log = tmp_path / "metrics.jsonl"
    log.write_text('\ufeff{"step": 1}\n{"step": 2}\n\n{"step": 3, "lo', encoding="utf-8")
    assert runs.read_rows(str(log)) == [{"step": 1}, {"step": 2}]
    assert f"{log}:4: skipping the last line, cut off" in capsys.readouterr().err


def test_a_lost_config_json_is_taken_from_the_latest_checkpoint(tmp_path):
    """config.json gone: --auto_resume takes the settings of the checkpoint it continues from, the highest step's,
    not an older one's (here from before a resume raised --steps)."""
    run = RunDir(str(tmp_path), "r")
    for step, steps in [(1, 2), (3, 4)]:
        run.save_regular({**ckpt_state(step), "config": {"steps": steps}}, keep_last=0)
    saved, source = runs.saved_settings(Config(auto_resume=True, log_dir=str(tmp_path), run_name="r"))
    assert saved == {"steps": 4}
    assert source == (f"--auto_resume continues the run with the settings of {run.checkpoint('step_000003.pt')} "
                      "(its config.json is missing)")


def test_a_full_disk_names_the_space_needed_and_free_in_mib(tmp_path, monkeypatch):
    """In MiB, the free space of the folder the file goes in."""
    asked = []
    monkeypatch.setattr(runs.shutil, "disk_usage", lambda d: asked.append(d) or types.SimpleNamespace(free=5 * 2**20))
    path = str(tmp_path / "x.pt")
    assert runs.disk_full(path, 3 * 2**20) == (
        f"disk full writing {path}: it needs about 3.0 MiB and 5.0 MiB are free there; free some space, then continue "
        "with --auto_resume (the last good checkpoint is kept)")
    assert asked == [str(tmp_path)]


def test_is_disk_full_by_hand():
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(OSError(errno.EDQUOT, "Disk quota exceeded"))
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(FileNotFoundError(errno.ENOENT, "No such file"))
    assert is_disk_full(RuntimeError("[enforce fail at inline_container.cc:603] . unexpected pos 64 vs 0"))
    assert is_disk_full(Exception("Error while serializing: IoError(Os { code: 28, os error 28 })"))
    assert not is_disk_full(RuntimeError("CUDA out of memory"))


def test_the_resume_command_a_signal_prints_can_be_pasted(tmp_path):
    """A --log_dir or --run_name with a space in it is quoted in the printed command (it split into other flags)."""
    log_dir = str(tmp_path / "my logs")
    trainer = types.SimpleNamespace(cfg=Config(log_dir=log_dir), world=1, run_dir=RunDir(log_dir, "run 1"), step=4,
                                    log=lambda line: None, save_regular=lambda: None)
    with pytest.raises(runs.StopRun) as e:
        runs.Resumable.stop_for_signal(trainer, "SIGTERM")
    assert shlex.split(str(e.value).split("saved; resume with: ")[1]) == [
        "python", "mini/train.py", "--log_dir", log_dir, "--run_name", "run 1", "--auto_resume"]
    assert e.value.exit_code == 143


def test_a_run_stopped_by_a_signal_exits_as_the_shell_reports_that_signal():
    # 128 + the number (Linux: SIGINT 2, SIGTERM 15); a stop another rank took counts as a SIGTERM (torchrun's)
    assert [runs.signal_exit_code(n) for n in ("SIGINT", "SIGTERM", None)] == [130, 143, 143]


def test_a_moved_run_resumes_where_it_was_found_not_where_its_config_json_says(tmp_path):
    """A run directory copied or moved elsewhere (its config.json names the old --log_dir) and resumed there with
    --auto_resume or --recovery_mode, --log_dir left at its default: the run goes on in the directory whose
    config.json was read, never in the old one (which it would have cut back and continued)."""
    saved = dataclasses.asdict(Config(log_dir="/old/logs", run_name="old"))
    for start in ("auto_resume", "recovery_mode"):
        cfg, changed = resume_config(Config(run_name="r", **{start: True}), {"run_name", start}, saved, "the run")
        assert (cfg.log_dir, cfg.run_name) == ("logs", "r")
        assert changed == {"log_dir": ("/old/logs", "logs"), "run_name": ("old", "r")}
    # --resume_from_checkpoint without --run_name continues the checkpoint's own run, where it says it is
    cfg, _ = resume_config(Config(resume_from_checkpoint="c.pt"), {"resume_from_checkpoint"}, saved, "the run")
    assert (cfg.log_dir, cfg.run_name) == ("/old/logs", "old")


def test_a_config_json_an_editor_gave_a_bom_is_read(tmp_path):
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "config.json").write_bytes(b"\xef\xbb\xbf" + json.dumps({"steps": 3}).encode())
    assert RunDir(str(tmp_path), "r").saved_config() == {"steps": 3}


def test_a_folder_where_the_run_keeps_a_file_stops_train_py_in_one_sentence(tmp_path, capsys):
    """config.json (or metrics.jsonl, checkpoints/ the other way round) of the wrong kind: one sentence naming it,
    exit code 1, not an IsADirectoryError's traceback."""
    (tmp_path / "r" / "config.json").mkdir(parents=True)
    assert train.main(["--log_dir", str(tmp_path), "--run_name", "r", "--auto_resume", "--device", "cpu"]) == 1
    assert capsys.readouterr().err.strip() == f"error: {tmp_path / 'r' / 'config.json'}: is a directory; check the path"


def test_nbytes_counts_the_tensors_of_nested_dicts_lists_and_tuples():
    """The disk-full message's size of a checkpoint: every tensor's bytes, however deep (an optimizer's state is
    dicts of lists), nothing for numbers and text."""
    state = {"w": torch.zeros(3), "step": 5, "name": "r", "inner": {"b": torch.zeros(4, dtype=torch.uint8)},
             "groups": [torch.zeros(2, dtype=torch.int64), (torch.zeros(1, dtype=torch.float16),)]}
    assert runs.nbytes(state) == 3 * 4 + 2 * 8 + 2 + 4


def test_a_checkpoint_killed_while_written_over_keeps_the_old_one(tmp_path, monkeypatch):
    """recovery.pt is written over at every step: a kill while the new one is written leaves the old one in place
    (unverified: its checksum went first), and no .tmp."""
    path = str(tmp_path / "recovery.pt")
    save_checkpoint(path, ckpt_state(1))

    def killed(state, f):
        open(f, "wb").write(b"partial")
        raise KeyboardInterrupt
    monkeypatch.setattr(torch, "save", killed)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, ckpt_state(2))
    monkeypatch.undo()
    assert load_checkpoint(path)["step"] == 1
    assert sorted(os.listdir(tmp_path)) == ["recovery.pt"]


def test_a_checkpoints_checksum_reaches_the_disk_before_its_rename(tmp_path, monkeypatch):
    """A power loss after the rename must not leave an empty checksum beside a good checkpoint (which would then
    read as damaged): the checksum's .tmp is synced, whole, before it is renamed."""
    events, fsync = [], os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"),
                                                                     os.fstat(fd).st_size)) or fsync(fd))
    monkeypatch.setattr(os, "replace", lambda a, b, replace=os.replace: events.append(("replace", a, 0))
                        or replace(a, b))
    path = str(tmp_path / "step_000001.pt")
    save_checkpoint(path, ckpt_state(1))
    tmp = path + ".sha256.tmp"
    synced = [i for i, e in enumerate(events) if e == ("fsync", tmp, 65)]  # 64 hex digits and a newline
    assert synced and synced[0] < events.index(("replace", tmp, 0))
    assert load_checkpoint(path)["step"] == 1


@pytest.mark.parametrize("make,message", [
    (lambda p: os.mkdir(p), "is a folder; give a checkpoint file"),
    (lambda p: None, r"does not exist; check the path \(a run's checkpoints are in <log_dir>/<run_name>/checkpoints\)"),
    (lambda p: torch.save({**ckpt_state(1), "model": types.SimpleNamespace()}, p),
     "was written by an older mini/train.py in a format that may run code when loaded, so it is refused"),
    (lambda p: save_checkpoint(p, {**ckpt_state(1), "model": [torch.zeros(2)]}),
     r"is not a checkpoint of mini/train.py \(its model is not weight tensors by name\)"),
    (lambda p: save_checkpoint(p, {**ckpt_state(1), "model": {"w": 3}}),
     r"is not a checkpoint of mini/train.py \(its model is not weight tensors by name\)"),
], ids=["folder", "missing", "pickled-object", "model-a-list", "model-of-numbers"])
def test_a_checkpoint_that_cannot_be_one_is_a_value_error_in_one_sentence(tmp_path, make, message):
    """Each is one sentence naming the path (a model that is no dict of tensors was an AttributeError or a TypeError,
    past latest_valid_checkpoint's skip of damaged files), never a traceback."""
    path = str(tmp_path / "c.pt")
    make(path)
    with pytest.raises(ValueError, match=f"^{re.escape(path)} {message}"):
        load_checkpoint(path)


ran_code = []  # RunsCode's calls


class RunsCode:
    """Unpickled without weights_only, it calls record_call: code a file from elsewhere ran."""

    def __reduce__(self):
        return record_call, ()


def record_call():
    ran_code.append("ran")
    return {}


def test_reading_a_checkpoints_settings_or_step_runs_no_code(tmp_path):
    """Its settings (a resume reads them first) and its step (checkpoints compete by it) are read as cheaply as
    safely: the pickled object is refused, not called."""
    path = str(tmp_path / "c.pt")
    torch.save({**ckpt_state(4), "config": RunsCode()}, path)
    assert runs.saved_step(path) is None
    with pytest.raises(ValueError, match="written by an older mini/train.py"):
        runs.checkpoint_settings(path)
    assert ran_code == []


def test_a_checkpoints_settings_are_read_from_the_file_or_say_why_not(tmp_path):
    path = str(tmp_path / "c.pt")
    save_checkpoint(path, {**ckpt_state(4), "config": {"steps": 9}})
    assert runs.checkpoint_settings(path) == {"steps": 9}
    open(path, "r+b").truncate(50)
    with pytest.raises(ValueError, match=f"^{re.escape(path)} does not match its checksum"):
        runs.checkpoint_settings(path)


def test_blank_lines_in_a_log_are_no_rows_and_a_bad_line_is_named_by_its_number(tmp_path):
    log = tmp_path / "metrics.jsonl"
    log.write_text('{"step": 1}\n\n   \n{"step": 2}\n')
    assert runs.read_rows(str(log)) == [{"step": 1}, {"step": 2}]
    log.write_text('{"step": 1}\n\n{"step": 2\n{"step": 3}\n')
    with pytest.raises(ValueError, match=f"^{re.escape(str(log))}:3: not a JSON row"):
        runs.read_rows(str(log))


def test_json_nested_past_the_stack_is_a_damaged_file_not_a_traceback(tmp_path):
    """A row or a config.json of arrays nested 100,000 deep (damage, or a hostile file) was a RecursionError
    traceback from the JSON decoder in analyze_metrics.py and in --auto_resume; it is the damaged file's sentence."""
    deep = "[" * 100_000 + "]" * 100_000
    log = tmp_path / "metrics.jsonl"
    log.write_text(f'{{"step": 0, "x": {deep}}}\n{{"step": 1}}\n')
    with pytest.raises(ValueError, match=f"^{re.escape(str(log))}:1: not a JSON row"):
        runs.read_rows(str(log))
    log.write_text(f'{{"step": 0}}\n{deep}\n')  # the last line: skipped, as a line cut off by a kill would be
    assert runs.read_rows(str(log)) == [{"step": 0}]
    os.makedirs(tmp_path / "r")
    (tmp_path / "r" / "config.json").write_text(deep)
    with pytest.raises(RunError, match="config.json is damaged \\(not JSON\\); restore it"):
        RunDir(str(tmp_path), "r").saved_config()


def test_train_log_and_the_jsonl_logs_grow_a_line_per_entry(tmp_path):
    run = RunDir(str(tmp_path), "r")
    os.makedirs(run.path)
    run.log("Step 1")
    run.log("Step 2")
    assert (tmp_path / "r" / "train.log").read_text() == "Step 1\nStep 2\n"
    run.append_jsonl("metrics.jsonl", [{"step": 1}, {"step": 1, "x": 2}])
    run.append_jsonl("metrics.jsonl", [{"step": 2}])
    assert (tmp_path / "r" / "metrics.jsonl").read_text() == '{"step": 1}\n{"step": 1, "x": 2}\n{"step": 2}\n'


def test_recovery_mode_without_config_json_takes_recovery_pts_settings(tmp_path, capsys):
    """--recovery_mode continues from recovery.pt, so with config.json gone its settings are recovery.pt's (a
    damaged one: none, and Resumable.resume says why)."""
    run = RunDir(str(tmp_path), "r")
    run.save_regular({**ckpt_state(5), "config": {"steps": 8}}, keep_last=0)
    run.save("recovery.pt", {**ckpt_state(4), "config": {"steps": 6}})
    cfg = Config(recovery_mode=True, log_dir=str(tmp_path), run_name="r")
    assert runs.saved_settings(cfg) == ({"steps": 6}, f"--recovery_mode continues the run with the settings of "
                                                      f"{run.checkpoint('recovery.pt')} (its config.json is missing)")
    open(run.checkpoint("recovery.pt"), "r+b").truncate(50)
    assert runs.saved_settings(cfg) == (None, "--recovery_mode continues the run with its own config.json")
    remove_checkpoint(run.checkpoint("recovery.pt"))
    trainer = types.SimpleNamespace(cfg=cfg, run_dir=run)
    with pytest.raises(runs.StopRun, match=f"^--recovery_mode: {re.escape(run.checkpoint('recovery.pt'))} does not "
                                           "exist; run without it or with --auto_resume$"):
        runs.Resumable.resume(trainer)


def test_resume_config_of_odd_saved_settings(tmp_path):
    """Settings that are no dict are refused in one sentence; one a later version dropped is left out; every flag
    that would change the run is named, not only the first; the start flags are this start's."""
    with pytest.raises(RunError, match=r"^the run, but it holds a list, not the run's settings; restore it"):
        resume_config(Config(auto_resume=True), set(), [1, 2], "the run")
    saved = {**dataclasses.asdict(Config(steps=7)), "a_flag_dropped_since": 3}
    cfg, changed = resume_config(Config(auto_resume=True), set(), saved, "the run")
    assert (cfg.steps, cfg.auto_resume, changed) == (7, True, {})
    with pytest.raises(RunError, match=r"would change it: --lr 0.5 \(the run has 1e-05\), "
                                       r"--seed 7 \(the run has 42\);"):
        resume_config(Config(auto_resume=True, seed=7, lr=0.5), {"seed", "lr"}, dataclasses.asdict(Config()), "the run")


def test_the_step_of_a_regular_checkpoint_is_in_its_name():
    assert runs.checkpoint_step("logs/r/checkpoints/step_000042.pt") == 42
    assert runs.checkpoint_step("step_1234567.pt") == 1234567


def test_a_users_copy_beside_the_regular_checkpoints_is_no_regular_one(tmp_path):
    """step_000002 copy.pt (a file manager's copy) matches step_*.pt but holds no step in its name: pruning and
    going back pass it by, where int() of its name was a ValueError at every save."""
    run = RunDir(str(tmp_path), "r")
    for step in (1, 2):
        run.save_regular(ckpt_state(step), keep_last=2)
    copy = run.checkpoint("step_000002 copy.pt")
    save_checkpoint(copy, ckpt_state(2))
    run.save_regular(ckpt_state(3), keep_last=2)
    run.cut_back(2)
    assert sorted(f for f in os.listdir(run.ckpt_dir) if f.endswith(".pt")) == [
        "step_000002 copy.pt", "step_000002.pt"]


def test_a_run_link_and_its_real_path_are_the_same_run(tmp_path):
    """contains() decides whether --resume_from_checkpoint names the run's own checkpoint: a link to the run
    directory is the run, a sibling whose name starts the same is not."""
    run = RunDir(str(tmp_path), "r")
    os.makedirs(run.ckpt_dir)
    os.symlink(run.path, tmp_path / "link")
    assert run.contains(str(tmp_path / "link" / "checkpoints" / "step_000001.pt"))
    assert not run.contains(str(tmp_path / "r2" / "checkpoints" / "step_000001.pt"))
    assert RunDir(str(tmp_path), "link").contains(run.checkpoint("step_000001.pt"))


def test_why_a_run_directory_cannot_be_written_is_said_in_one_sentence(tmp_path):
    run = RunDir(str(tmp_path), "x" * 300)
    assert run.cannot_write(OSError(errno.ENAMETOOLONG, "File name too long")) == (
        "--run_name xxxxxxxxxxxxxxxxxxxx... (300 characters) makes a path longer than the file system allows; pick "
        "a shorter --run_name")
    assert run.cannot_write(OSError(errno.EACCES, "Permission denied")) == (
        f"cannot write the run directory {run.path} (Permission denied); point --log_dir at a directory you can "
        "write to")


def test_a_run_without_checkpoints_has_none_to_resume_and_keeps_its_stable_pt(tmp_path, capsys):
    """No checkpoint at all is no damage; going back with no stable.pt, or one of step 0, moves nothing aside."""
    run = RunDir(str(tmp_path), "r")
    assert run.latest_valid_checkpoint() is None
    os.makedirs(run.ckpt_dir)
    run.cut_back(0)
    run.save("stable.pt", ckpt_state(0))
    run.cut_back(0)
    assert sorted(os.listdir(run.ckpt_dir)) == ["stable.pt", "stable.pt.sha256"]
    assert capsys.readouterr().err == ""


def test_a_full_disk_writing_a_text_file_names_its_size(tmp_path, monkeypatch):
    class Full:
        def __init__(self, *a, **kw):
            raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(runs, "open", Full, raising=False)
    with pytest.raises(RunError, match=r"it needs about 3\.0 MiB and"):
        runs.write_text(str(tmp_path / "config.json"), "x" * 3 * 2**20)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("key", ["model", "optimizer", "step", "config", "run_name", "rng"])
def test_a_checkpoint_without_one_of_its_parts_is_refused_by_name(tmp_path, key):
    """Each part train.py reads on resume must be there: a file without one loaded, and failed later on its key."""
    path = str(tmp_path / "c.pt")
    save_checkpoint(path, {k: v for k, v in ckpt_state(1).items() if k != key})
    with pytest.raises(ValueError, match=re.escape(f"lacks {[key]}; it is not a checkpoint of mini/train.py")):
        load_checkpoint(path)


def test_the_start_flags_of_a_config_json_are_neither_checked_nor_taken():
    """config.json holds the start flags of the run's first start (a hand edit may give them any value): this
    start's own are used, so a saved "yes" or 3 there is no setting to refuse."""
    saved = {**dataclasses.asdict(Config()), "auto_resume": "yes", "overwrite": 3, "resume_from_checkpoint": 1}
    cfg, changed = resume_config(Config(auto_resume=True), set(), saved, "the run")
    assert (cfg.auto_resume, cfg.overwrite, cfg.resume_from_checkpoint, changed) == (True, False, "", {})


def test_only_a_sigterm_within_the_echo_window_is_the_first_ones_echo(monkeypatch):
    """timeout's SIGTERM to the process and then its group is one request; a Ctrl-C after a SIGTERM, or a SIGTERM
    past SIGTERM_ECHO_S, is a second request: it quits at once."""
    now = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    monkeypatch.setattr(runs, "caught_signals", [])  # handled by hand here: mini/conftest.py need not stop the suite
    announced = []
    stop = runs.StopSignals(announced.append)
    stop.handle(signal.SIGTERM, None)
    now[0] += 1.0
    stop.handle(signal.SIGTERM, None)  # the echo: the run goes on to its checkpoint
    with pytest.raises(KeyboardInterrupt):
        stop.handle(signal.SIGINT, None)
    now[0] += runs.SIGTERM_ECHO_S
    with pytest.raises(KeyboardInterrupt):
        stop.handle(signal.SIGTERM, None)
    assert (stop.name, announced) == ("SIGTERM", ["SIGTERM"])


def test_a_signal_before_the_last_step_says_a_checkpoint_follows_the_next_step(capsys):
    """Step 4 of 6 done: step 5 is not the last, so the run saves after it instead of finishing."""
    trainer = types.SimpleNamespace(step=4, cfg=types.SimpleNamespace(steps=6), main=True)
    runs.Resumable.announce_stop(trainer, "SIGINT")
    assert capsys.readouterr().err.strip() == ("SIGINT: finishing step 5, then saving a checkpoint "
                                               "(again to quit at once)")


def test_the_resume_command_of_a_torchrun_run_starts_as_many_ranks(tmp_path):
    """A checkpoint of 2 ranks resumes only in 2 (load_state refuses another count): the printed command says so."""
    trainer = types.SimpleNamespace(cfg=Config(log_dir=str(tmp_path)), world=2, run_dir=RunDir(str(tmp_path), "r"),
                                    step=4, log=lambda line: None, save_regular=lambda: None)
    with pytest.raises(runs.StopRun) as e:
        runs.Resumable.stop_for_signal(trainer, "SIGINT")
    assert str(e.value).split("saved; resume with: ")[1].startswith("torchrun --nproc_per_node 2 mini/train.py ")
    assert e.value.exit_code == 130


def test_going_back_one_step_removes_a_recovery_checkpoint_of_the_step_after(tmp_path):
    """cut_back(3) with recovery.pt of step 4: step 4 is redone, so --auto_resume must not return to it."""
    run = RunDir(str(tmp_path), "c")
    os.makedirs(run.path)
    run.save_regular(ckpt_state(3), keep_last=0)
    run.save("recovery.pt", ckpt_state(4))
    run.cut_back(3)
    assert sorted(os.listdir(run.ckpt_dir)) == ["step_000003.pt", "step_000003.pt.sha256"]


def test_a_checkpoint_from_before_the_streamed_sampler_resumes_its_prompt_source():
    """Checkpoints written before the prompt source had a state dict hold its RNG alone, as "sampler_rng"."""
    loaded = []
    buffer = types.SimpleNamespace(items=None, rng=random.Random(0))
    trainer = types.SimpleNamespace(source=types.SimpleNamespace(load_state_dict=loaded.append), sft_source=None,
                                    buffer=buffer, selfplay=None)
    state = {"sampler_rng": (3, 4), "buffer": (["item"], random.Random(5).getstate()), "rng": runs.rng_state()}
    runs.Resumable.load_rank_state(trainer, state)
    assert (loaded, buffer.items, buffer.rng.random()) == ([{"rng": (3, 4)}], ["item"], random.Random(5).random())


def test_the_last_recovery_keeps_the_bad_state_its_stop_names(tmp_path):
    """A non-finite step after MAX_RECOVERIES rollbacks in a row stops the run; its message points at the bad state
    for debugging, so that state is saved before the stop, not only on the rollbacks before it."""
    saved = []
    trainer = types.SimpleNamespace(recoveries=runs.MAX_RECOVERIES, step=7, save=saved.append,
                                    run_dir=RunDir(str(tmp_path), "r"))
    with pytest.raises(runs.StopRun, match=r"after 3 recoveries; stopping\. The bad state is in .*debug_step_000007"):
        runs.Resumable.recover(trainer, "non-finite loss")
    assert saved == ["debug_step_000007.pt"]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
