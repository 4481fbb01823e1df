"""Run directories that never lose a run: one process per run, no run started over another, the saved
config on resume, cut-off logs, .tmp leftovers, a full disk, damaged checkpoints, failed starts, and
checkpoints that load without running code.

    python mini/test_runs.py
"""
import errno
import glob
import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

import mini.train as train
from mini.runs import RunDir, RunError, load_checkpoint
from mini.test_train import args, read_jsonl, tiny  # noqa: F401  (tiny is a fixture)


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
    (two_steps / "checkpoints" / "step_000003.pt.tmp").write_bytes(b"half")
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
    assert not glob.glob(str(two_steps / "**" / "*.tmp"), recursive=True)


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
    assert sorted(os.listdir(ckpts)) == ["recovery.pt"] and load_checkpoint(str(ckpts / "recovery.pt"))["step"] == 0


def test_a_failed_start_leaves_no_directory(tiny, tmp_path, capsys):
    fails_with(capsys, args(tiny, tmp_path, "nope", 2) + ["--model_path", str(tmp_path / "missing")],
               f"model directory {tmp_path / 'missing'} does not exist")
    data = tmp_path / "empty.txt"
    data.write_text("\n")
    fails_with(capsys, args(tiny, tmp_path, "nope", 2, "--data_source", "file", "--data_file", str(data)),
               "holds no sample (it is empty)")
    assert not (tmp_path / "nope").exists()


def test_checkpoints_load_without_running_code(tiny, tmp_path, two_steps):
    for f in glob.glob(str(two_steps / "checkpoints" / "*.pt")):
        torch.load(f, weights_only=True)  # what load_checkpoint does: plain tensors, numbers, strings
    old = tmp_path / "old.pt"  # the earlier format: numpy's RNG state as a pickled array
    torch.save({"model": {}, "optimizer": {}, "step": 1, "config": {}, "run_name": "x",
                "rng": {"numpy": np.random.get_state()}}, old)
    with pytest.raises(ValueError, match="written by an older mini/train.py in a format that may run code"):
        load_checkpoint(str(old))
    with pytest.raises(RunError, match="is damaged"):
        (two_steps / "config.json").write_text("{")
        RunDir(str(tmp_path), "r").saved_config()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
