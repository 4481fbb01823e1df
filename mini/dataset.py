"""
Where training prompts come from: the shipped pool of annotated positions, RookWorld text files,
freshly generated positions annotated by Stockfish, and a replay buffer of positions met in training;
TaskSampler mixes P: and A: prompts from them.
"""
import json
import random
import sys
from collections import OrderedDict

import chess

from mini.annotate import Annotator
from mini.config import POOL_PATH
from mini.formats import parse_line, policy_sample, position_key
from mini.positions import generate_positions, random_env_sample


def load_text(path, skip_bad_lines=True):
    """RookWorld text file -> (samples, number of skipped lines). Bad lines are reported as file:line."""
    samples, bad = [], 0
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                samples.append(parse_line(line))
            except ValueError as e:
                if not skip_bad_lines:
                    raise ValueError(f"{path}:{i}: {e}") from None
                bad += 1
                if bad <= 10:  # the first few name the problem, the count covers the rest
                    print(f"{path}:{i}: {e}", file=sys.stderr)
    if bad:
        print(f"{path}: skipped {bad} malformed lines", file=sys.stderr)
    return samples, bad


def load_jsonl(path):
    """Shipped annotated positions (mini/data/*.jsonl) -> P: samples; the header record is skipped."""
    samples = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            try:
                r = json.loads(line)
                if "fen" in r:
                    samples.append(policy_sample(r["fen"], r["moves"], r["evals"], history=r.get("history", ())))
            except (ValueError, KeyError, IndexError) as e:
                raise ValueError(f"{path}:{i}: not an annotated position ({e})") from None
    return samples


class ReplayBuffer:
    """Positions met during training (legal, not over), one entry per position, oldest out first."""

    def __init__(self, capacity=10000, seed=0):
        self.capacity, self.items, self.rng = capacity, OrderedDict(), random.Random(seed)

    def add(self, fen, history=()):
        try:
            board = chess.Board(fen)
        except ValueError:
            return
        key = position_key(fen)
        if key in self.items or not board.is_valid() or board.is_game_over():
            return
        self.items[key] = (fen, list(history)[-9:])
        if len(self.items) > self.capacity:
            self.items.popitem(last=False)

    def add_next(self, sample):
        """The position one ply on from a training sample (new to the pool): after the A: move when it
        was legal, after the best move of a P: sample."""
        if sample.task == "A":
            if not sample.truncated:
                self.add(sample.next_fen, sample.history)
        else:
            board = chess.Board(sample.fen)
            board.push_uci(sample.best)
            self.add(board.fen(), sample.history + [sample.best])

    def sample(self, n):
        return self.rng.sample(list(self.items.values()), min(n, len(self.items)))

    def __len__(self):
        return len(self.items)


class TaskSampler:
    """Training prompts: P: from labelled samples, A: from labelled A: lines when the source has them,
    else python-chess transitions on the P: positions and on the replay buffer's positions."""

    def __init__(self, samples, env_ratio=0.2, seed=0, buffer=None):
        self.policy = [s for s in samples if s.task == "P"]
        self.env = [s for s in samples if s.task == "A"]
        if not samples:
            raise ValueError("no samples to draw training prompts from")
        self.env_ratio, self.rng, self.buffer = env_ratio, random.Random(seed), buffer

    def draw(self, n):
        out = []
        for _ in range(n):
            if self.policy and self.rng.random() >= self.env_ratio:
                out.append(self.rng.choice(self.policy))
            elif self.env:
                out.append(self.rng.choice(self.env))
            else:
                if self.buffer is not None and len(self.buffer) and self.rng.random() < 0.5:
                    fen, history = self.buffer.sample(1)[0]
                else:
                    s = self.rng.choice(self.policy)
                    fen, history = s.fen, s.history
                out.append(random_env_sample(fen, history, self.rng))
        return out


def load_samples(cfg):
    """Samples of the configured source: the shipped pool, a RookWorld text file or a JSONL file of annotated
    positions like the pool, or fresh positions
    annotated with Stockfish (one per training prompt)."""
    if cfg.data_source == "pool":
        return load_jsonl(POOL_PATH)
    if cfg.data_source == "file":
        if not cfg.data_file:
            raise ValueError("--data_source file needs --data_file PATH")
        if cfg.data_file.endswith(".jsonl"):  # annotated positions in the pool's format (mini/annotate.py --pool_path)
            return load_jsonl(cfg.data_file)
        return load_text(cfg.data_file, cfg.skip_bad_lines)[0]
    positions = generate_positions(cfg.steps * cfg.batch_size, cfg.seed)
    with Annotator(cfg.stockfish_path, depth=cfg.stockfish_depth) as ann:
        labels = ann.annotate([fen for fen, _, _ in positions])
    return [policy_sample(fen, *labels[fen], history=h) for fen, h, _ in positions]
