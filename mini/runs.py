"""
A run directory, and what makes a run survive interruption: logs that are cut back on resume and
checkpoints that are written atomically and checked when read.

    logs/<run_name>/config.json    the settings of the run
                    train.log      the log lines
                    metrics.jsonl  one row per step (samples.jsonl: a few completions per step)
                    checkpoints/   step_*.pt (the last keep_last), recovery.pt, stable.pt, debug_step_*.pt
                    final/         a Hugging Face snapshot, at the end
"""
import dataclasses
import glob
import json
import os
import sys

import torch

STEP_LOGS = ("metrics.jsonl", "samples.jsonl")  # JSONL logs with a "step" per row, cut back on resume


def save_checkpoint(path, state):
    """Write to a temporary file, then rename: a crash mid-write never leaves a broken checkpoint."""
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path):
    """The checkpoint's state if it is complete and its weights finite; else a ValueError saying why."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:
        raise ValueError(f"{path} cannot be read ({type(e).__name__}); it is damaged") from None
    missing = {"model", "optimizer", "step", "config", "run_name", "rng"} - set(state)
    if missing:
        raise ValueError(f"{path} lacks {sorted(missing)}; it is not a checkpoint of mini/train.py")
    if not all(torch.isfinite(t).all() for t in state["model"].values()):
        raise ValueError(f"{path} holds non-finite weights")
    return state


class RunDir:
    def __init__(self, log_dir, run_name):
        self.name, self.path = run_name, os.path.join(log_dir, run_name)
        self.ckpt_dir = os.path.join(self.path, "checkpoints")
        os.makedirs(self.ckpt_dir, exist_ok=True)

    def file(self, name):
        return os.path.join(self.path, name)

    def checkpoint(self, name):
        return os.path.join(self.ckpt_dir, name)

    # --- logs
    def log(self, line):
        print(line, flush=True)
        with open(self.file("train.log"), "a") as f:
            f.write(line + "\n")

    def append_jsonl(self, name, rows):
        with open(self.file(name), "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")

    def truncate_logs(self, step):
        """Drop the rows of steps after `step` from the JSONL logs: they are redone after a resume."""
        for name in STEP_LOGS:
            path = self.file(name)
            if os.path.exists(path):
                with open(path) as f:
                    keep = [line for line in f if json.loads(line)["step"] <= step]
                with open(path, "w") as f:
                    f.writelines(keep)

    def save_config(self, cfg):
        with open(self.file("config.json"), "w") as f:
            json.dump(dataclasses.asdict(cfg), f, indent=2)

    # --- checkpoints
    def save(self, name, state):
        save_checkpoint(self.checkpoint(name), state)

    def save_regular(self, state, keep_last):
        """step_<step>.pt, keeping the last keep_last of them (0: all)."""
        self.save(f"step_{state['step']:06d}.pt", state)
        regular = sorted(glob.glob(self.checkpoint("step_*.pt")))
        for old in regular[:-keep_last] if keep_last > 0 else []:
            os.remove(old)

    def latest_valid_checkpoint(self):
        """(path, state) of the valid checkpoint with the highest step among regular, stable and
        recovery ones; None if there is none. Damaged ones are skipped with a message."""
        best = None
        for path in glob.glob(self.checkpoint("*.pt")):
            if os.path.basename(path).startswith("debug"):
                continue
            try:
                state = load_checkpoint(path)
            except ValueError as e:
                print(f"skipping {e}", file=sys.stderr)
                continue
            if best is None or state["step"] > best[1]["step"]:
                best = (path, state)
        return best
