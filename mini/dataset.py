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


MAX_BAD_LINES = 100  # beyond this many malformed lines a file is not RookWorld data: stop


def read_records(path, parse, skip_bad_lines=True):
    """parse(line) for each non-empty line of a data file -> (records, number of skipped lines). A bad line
    (not UTF-8, or parse raises ValueError) is reported as file:line and skipped, up to MAX_BAD_LINES;
    with skip_bad_lines off the first one stops. A file with no good line is an error."""
    records, bad = [], 0
    with open(path, "rb") as f:
        for i, raw in enumerate(f, 1):
            try:
                line = raw.decode("utf-8")
                if not line.strip():
                    continue
                records.append(parse(line))
            except (ValueError, KeyError, IndexError, TypeError) as e:  # UnicodeDecodeError is a ValueError
                why = "not UTF-8 text" if isinstance(e, UnicodeDecodeError) else e
                if not skip_bad_lines:
                    raise ValueError(f"{path}:{i}: {why}") from None
                bad += 1
                if bad > MAX_BAD_LINES:
                    raise ValueError(f"{path}: more than {MAX_BAD_LINES} bad lines (the last at line {i}: {why}); "
                                     "is it a RookWorld data file?") from None
                if bad <= 10:  # the first few name the problem, the count covers the rest
                    print(f"{path}:{i}: {why}", file=sys.stderr)
    if bad:
        print(f"{path}: skipped {bad} malformed lines", file=sys.stderr)
    if not records:
        raise ValueError(f"{path} holds no sample" + (f" ({bad} malformed lines)" if bad else " (it is empty)"))
    return records, bad


def load_text(path, skip_bad_lines=True):
    """RookWorld text file -> (samples, number of skipped lines)."""
    return read_records(path, parse_line, skip_bad_lines)


def annotated_sample(line):
    """A line of an annotated-positions JSONL file -> P: sample; None for the header record."""
    r = json.loads(line)
    return policy_sample(r["fen"], r["moves"], r["evals"], history=r.get("history", ())) if "fen" in r else None


def load_jsonl(path, skip_bad_lines=True):
    """Annotated positions (mini/data/*.jsonl, mini/annotate.py --pool_path) -> P: samples."""
    records, _ = read_records(path, annotated_sample, skip_bad_lines)
    return [s for s in records if s is not None]


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
    if cfg.data_source in ("pool", "selfplay"):  # selfplay mixes its positions with the pool's (mini/selfplay.py)
        return load_jsonl(POOL_PATH)
    if cfg.data_source == "file":
        if not cfg.data_file:
            raise ValueError("--data_source file needs --data_file PATH")
        if cfg.data_file.endswith(".jsonl"):  # annotated positions in the pool's format (mini/annotate.py --pool_path)
            return load_jsonl(cfg.data_file, cfg.skip_bad_lines)
        return load_text(cfg.data_file, cfg.skip_bad_lines)[0]
    positions = generate_positions(cfg.steps * cfg.batch_size, cfg.seed)
    with Annotator(cfg.stockfish_path, depth=cfg.stockfish_depth) as ann:
        labels = ann.annotate([fen for fen, _, _ in positions])
    return [policy_sample(fen, *labels[fen], history=h) for fen, h, _ in positions]
