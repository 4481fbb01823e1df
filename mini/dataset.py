"""Prompt sources: where training prompts come from. PoolSource mixes P: and A: prompts from a fixed set of
samples (the shipped pool, a RookWorld text file, annotated positions); StreamSource from fresh positions that
Stockfish labels as they are needed; both draw(n) and keep their state in state_dict(). A replay buffer of
positions met in training feeds the A: prompts; held-out positions never enter.
"""
import copy
import json
import multiprocessing
import os
import random
import sys
from collections import OrderedDict, deque
from functools import lru_cache, partial

import chess

from mini.config import DATA_DIR, EVAL_PATH, MATE_PATH, POOL_PATH, REAL_EVAL2_PATH, REAL_EVAL_PATH
from mini.flags import not_a_device
from mini.formats import (PAD_WIDTHS, ImpossiblePosition, board_key, check_policy, checked_board, env_sample,
                          legal_ucis, parse_line, placement, policy_sample, position_key, repad)
from mini.positions import iter_positions, random_env_sample
from mini.stockfish import Annotator


MAX_BAD_LINES = 100  # beyond this many malformed lines a file is not RookWorld data: stop
PARALLEL_MIN_LINES = 20_000  # a smaller file is parsed in the calling process (starting workers costs ~0.1 s)
MAX_PARSE_WORKERS = 16


def parse_lines(parse, numbered):
    """[(line number, parse(line) or None, the error or None)] for the non-empty lines of [(number, raw bytes)]."""
    out = []
    for i, raw in numbered:
        try:
            line = raw.decode("utf-8-sig" if i == 1 else "utf-8")  # an editor's byte-order mark is not a bad line
            if line.strip():
                out.append((i, parse(line), None))
        except (ValueError, KeyError, IndexError, TypeError, RecursionError) as e:  # UnicodeDecodeError: a ValueError
            out.append((i, None, e))
    return out


def parsed_lines(path, parse):
    """parse_lines over a whole file; a large file is parsed by one process per core, in order (python-chess
    checks every line: ~0.5 ms each, minutes for the 200,000 lines of a games pool on one core)."""
    with open(not_a_device(path), "rb") as f:
        numbered = list(enumerate(f, 1))
    workers = min(os.cpu_count() or 1, MAX_PARSE_WORKERS)
    if workers < 2 or len(numbered) < PARALLEL_MIN_LINES:
        return parse_lines(parse, numbered)
    size = -(-len(numbered) // (workers * 4))  # a few chunks per worker even out their speeds
    chunks = [numbered[k:k + size] for k in range(0, len(numbered), size)]
    # never fork the caller: a lock that another of its threads held at the fork stays held in the child
    # forever (a training run hung at start-up so); forkserver's children come from a fresh process.
    from mini.runtime import caller_script_hidden  # here: the workers import this module, and need no torch
    with caller_script_hidden(), \
            multiprocessing.get_context("forkserver" if sys.platform == "linux" else "spawn").Pool(workers) as pool:
        return [r for part in pool.map(partial(parse_lines, parse), chunks) for r in part]


def read_records(path, parse, skip_bad_lines=True):
    """parse(line) for each non-empty line of a data file -> (records, number of skipped lines). A bad line
    (not UTF-8, or parse raises ValueError) is reported as file:line and skipped, up to MAX_BAD_LINES
    malformed ones (a well-formed line of an impossible position, which the published A: data holds, does not
    count towards them); with skip_bad_lines off the first one stops. A file with no good line is an error."""
    records, bad, impossible = [], 0, 0
    for i, record, e in parsed_lines(path, parse):
        if e is None:
            records.append(record)
            continue
        why = ("not UTF-8 text" if isinstance(e, UnicodeDecodeError) else "JSON nested too deeply"
               if isinstance(e, RecursionError) else e)
        if not skip_bad_lines:
            raise ValueError(f"{path}:{i}: {why}") from None
        impossible += isinstance(e, ImpossiblePosition)
        bad += not isinstance(e, ImpossiblePosition)
        if bad > MAX_BAD_LINES:
            raise ValueError(f"{path}: more than {MAX_BAD_LINES} bad lines (the last at line {i}: {why}); "
                             "is it a RookWorld data file?") from None
        if bad + impossible <= 10:  # the first few name the problem, the counts cover the rest
            print(f"{path}:{i}: {why}", file=sys.stderr)
    skipped = ", ".join(f"{n} {what}{'s' * (n > 1)}" for n, what in ((bad, "malformed line"), (impossible, "impossible position"))
                        if n)
    if skipped:
        print(f"{path}: skipped {skipped}", file=sys.stderr)
    if not records:
        raise ValueError(f"{path} holds no sample" + (f" ({skipped})" if skipped else " (it is empty)"))
    return records, bad + impossible


def load_text(path, skip_bad_lines=True):
    """RookWorld text file -> (samples, number of skipped lines). A: lines take python-chess's label (parse_line);
    how many of them it corrected is said once, on stderr."""
    samples, bad = read_records(path, parse_line, skip_bad_lines)
    relabelled = sum(s.relabelled for s in samples)
    if relabelled:
        print(f"{path}: {relabelled} A: lines had a label python-chess disagrees with (the original generator "
              "pushed pseudo-legal moves); python-chess's labels are used", file=sys.stderr)
    return samples, bad


def annotated_sample(line):
    """A line of an annotated JSONL file -> P: sample, checked as a P: text line is (check_policy), or, for an
    A: transition record {"fen", "move", "history"} (mini/annotate.py --games), the A: sample python-chess labels,
    either with its "game" when it has one (annotate.py --pgn); None for the header record ({"meta": ...}); a
    ValueError saying what is wrong with any other line."""
    r = json.loads(line)
    if not isinstance(r, dict):
        raise ValueError(f"a JSON {type(r).__name__}, not a record of a position")
    if "fen" not in r:
        if "meta" in r:
            return None
        raise ValueError("the record holds no position (no \"fen\")")
    if "game" in r and (type(r["game"]) is not int or r["game"] < 0):  # not isinstance: true is an int
        raise ValueError(f'a record\'s "game" is the index of the game it comes from, a non-negative integer, not '
                         f'{json.dumps(r["game"])[:40]}')
    if "move" in r:
        checked_board(r["fen"])  # as an A: text line is
        if not isinstance(r["move"], str) or "history" not in r:
            raise ValueError('an A: record needs "move" as a UCI string and "history", the recent moves ending '
                             'with it (mini/annotate.py --games writes them)')
        sample = env_sample(r["fen"], r["move"], r["history"])
        if sample.history[-1:] != [r["move"]]:
            raise ValueError(f"an A: record's history ends with its move {r['move']!r:.20} (the format's last entry)")
    else:
        check_policy(r["fen"], r.get("moves"), r.get("evals"))
        sample = policy_sample(r["fen"], r["moves"], r["evals"], history=r.get("history", ()))
    sample.game = r.get("game")
    return sample


@lru_cache(maxsize=8)
def shipped_records(path, stamp, skip_bad_lines):
    """read_records of a file under mini/data, once a process for each (inode, size, mtime) stamp: checking its
    lines with python-chess takes seconds, and the test suite starts hundreds of runs in its worker processes."""
    return read_records(path, annotated_sample, skip_bad_lines)[0]


def load_jsonl(path, skip_bad_lines=True):
    """Annotated positions and transitions (mini/data/*.jsonl, mini/annotate.py --pool_path) -> samples; a shipped
    file's samples come from shipped_records, copied so that a caller's change stays its own."""
    real = os.path.realpath(path)
    if os.path.dirname(real) == os.path.realpath(DATA_DIR):
        stat = os.stat(real)
        stamp = (stat.st_ino, stat.st_size, stat.st_mtime_ns)  # a file rebuilt (or replaced) is read again
        records = [copy.copy(s) for s in shipped_records(real, stamp, skip_bad_lines)]
    else:
        records, _ = read_records(path, annotated_sample, skip_bad_lines)
    samples = [s for s in records if s is not None]  # None: the header line
    if not samples:
        raise ValueError(f"{path} holds no sample, only its header")
    return samples


def shipped_keys(paths=(POOL_PATH, EVAL_PATH)):
    """position_key of every position in the given shipped files (by default the pool and the eval set): each
    record's position and, for an A: transition, the position its move leads to."""
    keys = set()
    for path in paths:
        with open(path, encoding="utf-8") as f:
            for r in map(json.loads, f):
                if "fen" in r:
                    keys |= record_keys(r["fen"], r.get("move"))
    return keys


def record_keys(fen, move=None):
    """position_key of a record's position and, for an A: transition with a legal move, of the position after it."""
    keys = {position_key(fen)}
    if move in legal_ucis(fen):
        board = chess.Board(fen)
        board.push_uci(move)
        keys.add(board_key(board))
    return keys


@lru_cache(maxsize=1)  # the buffer, the sources and self-play each ask at start-up: one read of the files
def held_out_keys():
    """Positions no training prompt may show: the eval sets (generated and two of realistic games) and the
    mate-in-one test set."""
    return frozenset(shipped_keys((EVAL_PATH, REAL_EVAL_PATH, REAL_EVAL2_PATH, MATE_PATH)))


@lru_cache(maxsize=8)
def placements(keys):
    """The piece placements of a frozenset of position keys."""
    return frozenset(k.split(" ", 1)[0] for k in keys)


def shows_held_out(sample, held_out):
    """Whether a sample shows a held-out position (held_out: a frozenset of position keys): its own, or the next
    one its A: completion writes (after a legal move; env_label wrote that FEN with python-chess, so its key is
    its first four fields). A board is built only for a placement some held-out position has: building one
    for every sample took 22 of the 40 s that loading a pool of 100,000 records took."""
    if placement(sample.fen) in placements(held_out) and position_key(sample.fen) in held_out:
        return True
    return sample.task == "A" and not sample.truncated and " ".join(sample.next_fen.split()[:4]) in held_out


class ReplayBuffer:
    """Positions met during training (legal, not over, not held out), one entry per position, oldest out first."""

    def __init__(self, capacity=10000, seed=0):
        self.capacity, self.items, self.rng = capacity, OrderedDict(), random.Random(seed)
        self.held_out = held_out_keys()  # its positions become A: prompts

    def add(self, fen, history=(), board=None):
        """board: the position's board when the caller has it (a data worker's time goes to parsing FENs)."""
        try:
            board = chess.Board(fen) if board is None else board
        except ValueError:
            return
        key = board_key(board)
        if key in self.items or key in self.held_out or not board.is_valid() or board.is_game_over():
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
            self.add(board.fen(), sample.history + [sample.best], board)

    def sample(self, n):
        return self.rng.sample(list(self.items.values()), min(n, len(self.items)))

    def __len__(self):
        return len(self.items)


def pad_widths(policy_pad):
    """--policy_pad -> the FEN widths P: prompts are drawn at."""
    return PAD_WIDTHS if policy_pad == "both" else (int(policy_pad),)


def pad_policy(sample, pads, rng):
    """The P: sample at one of the widths pads (drawn with rng only when there are two, so that a single width
    leaves the draws of a run as they were)."""
    return repad(sample, pads[0] if len(pads) == 1 else rng.choice(pads))


class PoolSource:
    """Training prompts: P: from labelled samples; A: from labelled A: samples when the source has them, half the
    time when it has A: bases too, else python-chess transitions on the bases (the P: positions of env_bases,
    default all of them) and on the replay buffer's positions; a transition onto a held-out position is drawn
    again."""

    def __init__(self, samples, env_ratio=0.2, seed=0, buffer=None, pads=(90,), env_bases=None):
        self.pads = pads  # P: prompts' FEN widths, one drawn per P: prompt when there are two
        self.policy = [s for s in samples if s.task == "P"]
        self.env = [s for s in samples if s.task == "A"]
        self.env_bases = self.policy if env_bases is None else [s for s in env_bases if s.task == "P"]
        if not samples:
            raise ValueError("no samples to draw training prompts from")
        self.env_ratio, self.rng, self.buffer = env_ratio, random.Random(seed), buffer
        self.held_out = held_out_keys()

    def draw(self, n, env_ratio=None):
        """n training samples; env_ratio: the A: share for this draw (default: the source's)."""
        env_ratio = self.env_ratio if env_ratio is None else env_ratio
        out = []
        while len(out) < n:
            if self.policy and self.rng.random() >= env_ratio:
                out.append(pad_policy(self.rng.choice(self.policy), self.pads, self.rng))
            elif self.env and (not self.env_bases or self.rng.random() < 0.5):
                out.append(self.rng.choice(self.env))
            else:
                if self.buffer is not None and len(self.buffer) and self.rng.random() < 0.5:
                    fen, history = self.buffer.sample(1)[0]
                else:
                    s = self.rng.choice(self.env_bases)
                    fen, history = s.fen, s.history
                s = random_env_sample(fen, history, self.rng)
                if not shows_held_out(s, self.held_out):  # else drawn again
                    out.append(s)
        return out

    def state_dict(self):
        return {"rng": self.rng.getstate()}

    def load_state_dict(self, s):
        self.rng.setstate(s["rng"])

    def close(self):
        """Nothing to release: the samples are in memory (StreamSource has engines to stop)."""


class StreamSource:
    """--data_source generate: an endless stream of fresh positions (positions.iter_positions, the eval and
    mate-in-one positions left out), each the P: prompt of one training prompt, labelled by Stockfish in the
    background up to `ahead` positions before it is needed (Annotator.submit, with the annotator's disk cache). So a
    run pays for the positions it uses as it goes, not for steps x batch_size of them before the first step.
    A: prompts (share env_ratio) are python-chess transitions (random_env_sample) on a position drawn before or,
    half the time, on one of the replay buffer's. Deterministic: which prompt is which depends on the RNG and
    the stream only, never on Stockfish's speed. state_dict() holds the RNG, the stream offset and the recent
    positions; load_state_dict replays the stream to the offset (~10 ms a position, labels from the cache)."""

    def __init__(self, annotator, env_ratio=0.2, seed=0, buffer=None, ahead=64, capacity=1024, pads=(90,)):
        self.ann, self.env_ratio, self.seed, self.buffer, self.ahead = annotator, env_ratio, seed, buffer, ahead
        self.pads = pads
        self.held_out, self.rng, self.recent = held_out_keys(), random.Random(seed), deque(maxlen=capacity)
        self._seek(0)

    def _seek(self, taken):
        """Restart the stream at its `taken`-th position; nothing is labelled ahead yet."""
        self.stream = (p[:2] for p in iter_positions(self.seed) if position_key(p[0]) not in self.held_out)
        self.taken, self.queue = taken, deque()  # queue: (fen, history, future of its label) in stream order
        for _ in range(taken):
            next(self.stream)

    def _next_policy(self):
        if len(self.queue) <= self.ahead // 2:  # top the labelled-ahead window up, in chunks Stockfish can share out
            new = [next(self.stream) for _ in range(self.ahead - len(self.queue))]
            self.queue.extend((fen, h, future) for (fen, h), future in zip(new, self.ann.submit([f for f, _ in new])))
        fen, history, future = self.queue.popleft()
        self.taken += 1
        self.recent.append((fen, history))
        # waits only if Stockfish is behind
        return pad_policy(policy_sample(fen, *future.result()[fen], history=history), self.pads, self.rng)

    def draw(self, n, env_ratio=None):
        """n training samples; env_ratio: the A: share for this draw (default: the source's)."""
        env_ratio = self.env_ratio if env_ratio is None else env_ratio
        out = []
        while len(out) < n:
            if self.recent and self.rng.random() < env_ratio:
                if self.buffer is not None and len(self.buffer) and self.rng.random() < 0.5:
                    fen, history = self.buffer.sample(1)[0]
                else:
                    fen, history = self.rng.choice(self.recent)
                s = random_env_sample(fen, history, self.rng)
                if not shows_held_out(s, self.held_out):  # else drawn again
                    out.append(s)
            else:
                out.append(self._next_policy())
        return out

    def state_dict(self):
        """Plain types only (checkpoints load with torch.load(weights_only=True))."""
        return {"rng": self.rng.getstate(), "taken": self.taken, "recent": [list(p) for p in self.recent]}

    def load_state_dict(self, s):
        self.rng.setstate(s["rng"])
        self.recent = deque((tuple(p) for p in s["recent"]), maxlen=self.recent.maxlen)
        if s["taken"] != self.taken:  # else the stream and the labels queued ahead are already where they belong
            self._seek(s["taken"])

    def close(self):
        self.ann.close()


def make_source(cfg, buffer=None, rank=0):
    """The configured prompt source: the shipped pool (also what selfplay mixes its own positions with), a
    RookWorld text file or a JSONL file of annotated positions like the pool, or (generate) fresh positions
    labelled by Stockfish as they are needed, seeded cfg.seed + rank (each torchrun rank draws its own).
    Held-out positions (held_out_keys) are left out of every source; the P: positions of --policy_only_file's
    files are no A: prompt's start. A ValueError or OSError says what is wrong with a data file; a
    FileNotFoundError that Stockfish is missing."""
    if cfg.data_source == "generate":
        ann = Annotator(cfg.stockfish_path, depth=cfg.stockfish_depth, workers=cfg.annotate_workers)
        return StreamSource(ann, cfg.mix_env_ratio, seed=cfg.seed + rank, buffer=buffer, pads=pad_widths(cfg.policy_pad))
    held_out = held_out_keys()  # also out of the shipped pool, which a rebuild by other settings could mix in
    unseen = lambda loaded: [s for s in loaded if not shows_held_out(s, held_out)]
    if cfg.data_source == "file":
        if not cfg.data_file:
            raise ValueError("--data_source file needs --data_file PATH")
        samples, env_bases = [], []
        policy_only = {os.path.realpath(path) for path in cfg.policy_only_file.split(",") if path}
        for path in cfg.data_file.split(","):  # several files are one source
            if path.endswith(".jsonl"):  # annotated positions in the pool's format (mini/annotate.py --pool_path)
                loaded = unseen(load_jsonl(path, cfg.skip_bad_lines))
            else:
                loaded = unseen(load_text(path, cfg.skip_bad_lines)[0])
            samples += loaded
            env_bases += [] if os.path.realpath(path) in policy_only else loaded
    else:
        samples = env_bases = unseen(load_jsonl(POOL_PATH))
    if not samples:
        raise ValueError(f"{cfg.data_file or POOL_PATH}: every position in it is a held-out eval or mate-in-one "
                         "position")
    has_policy = any(s.task == "P" for s in samples)
    feeds_policy_sft = cfg.policy_sft_coef > 0 and not cfg.sft_data_file  # else the term draws from that file's source
    if feeds_policy_sft and not has_policy:
        raise ValueError(f"{cfg.data_file or POOL_PATH} holds no P: position for --policy_sft_coef to learn from: add "
                         "a file with P: positions, or leave --policy_sft_coef at 0")
    if cfg.mix_env_ratio < 1 and not has_policy:  # else every prompt would be A:, unasked
        raise ValueError(f"{cfg.data_file or POOL_PATH} holds no P: position, so the {1 - cfg.mix_env_ratio:.0%} of "
                         "P: prompts that --mix_env_ratio asks for cannot be drawn: add a file with P: positions, or "
                         "set --mix_env_ratio 1 to train the arbiter alone")
    needs_env = cfg.mix_env_ratio > 0 or cfg.env_sft_coef > 0 and not cfg.sft_data_file
    if needs_env and not env_bases and not any(s.task == "A" for s in samples):
        raise ValueError(f"{cfg.data_file}: no P: position outside --policy_only_file and no A: sample is left once "
                         "the held-out positions are out, so no A: prompt or row can be drawn: take a file out of "
                         "--policy_only_file, add one with A: transitions, or ask for no A: (--mix_env_ratio 0, and "
                         "--env_sft_coef only with --sft_data_file)")
    return PoolSource(samples, cfg.mix_env_ratio, seed=cfg.seed + rank, buffer=buffer, pads=pad_widths(cfg.policy_pad),
                      env_bases=env_bases)
