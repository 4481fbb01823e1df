"""
RookWorld task formats, position sources and the python-chess ground truth of the A: task.

Formats (see shared FORMATS.md), reproduced token for token:
    P: <fen padded to 90>M: <moves padded to 30>E: <evals padded to 40>B: <best>
    A: <fen>+<move>+<history>+<new fen>+<reward>+<terminated>+<truncated>
The prompt of a P: sample ends one space short of the padding (that space belongs to the " M" token);
the prompt of an A: sample ends at the third "+".
"""
import itertools
import json
import math
import os
import random
import re
import sys
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import lru_cache

import chess

DATA_DIR = os.path.join(os.path.dirname(__file__), "data")
POOL_PATH = os.path.join(DATA_DIR, "pool.jsonl")
EVAL_PATH = os.path.join(DATA_DIR, "eval.jsonl")
UCI = re.compile(r"[a-h][1-8][a-h][1-8][qrbn]?\Z")


@dataclass
class Sample:
    task: str                # "P" (policy) or "A" (environment)
    fen: str
    prompt: str
    completion: str          # reference text after the prompt
    # P: ground truth; best is Stockfish's PV1 for shipped data, the B: label for text lines
    moves: list = field(default_factory=list)
    evals: list = field(default_factory=list)
    best: str = ""
    history: list = field(default_factory=list)  # A: last half-moves incl. move; P: moves that led here
    # A: ground truth
    move: str = ""
    next_fen: str = ""
    reward: float = 0.0
    terminated: int = 0
    truncated: int = 0


# ----------------------------------------------------------------------------- formats

def policy_prompt(fen):
    """'P: ' + fen padded to 90 columns, less the last space, which merges into the next token ' M'."""
    return "P: " + fen + " " * max(89 - len(fen), 0)


def policy_completion(moves, evals, best):
    return " M: " + f"{' '.join(moves):30}" + "E: " + f"{' '.join(str(float(e)) for e in evals):40}" + "B: " + best


def _history(history):
    return history.split() if isinstance(history, str) else list(history)


def env_prompt(fen, move, history):
    return "A: " + fen + "+" + move + "+" + " ".join(_history(history)) + "+"


def env_completion(fen, move, history=()):
    """Ground truth of the A: task. history (which ends with move) cannot change the result:
    fivefold repetition needs more than the 10 half-moves the format carries."""
    board = chess.Board(fen)
    try:
        m = chess.Move.from_uci(move)
    except ValueError:
        m = None
    if m is None or m not in board.legal_moves:  # illegal or unparsable: state unchanged, episode cut
        return f"{fen}+-1.0+0+1"
    board.push(m)
    outcome = board.outcome()
    reward = 1.0 if board.is_checkmate() else 0.5 if outcome else 0.001
    return f"{board.fen()}+{reward}+{int(outcome is not None)}+0"


@lru_cache(maxsize=4096)  # the k completions of a group share their position
def legal_ucis(fen):
    return frozenset(m.uci() for m in chess.Board(fen).legal_moves)


def parse_policy(text):
    """'M: m1 .. E: e1 .. B: b' -> (moves, evals, best). Raises ValueError saying what is wrong."""
    m, e, b = text.find("M:"), text.find("E:"), text.find("B:")
    if not 0 <= m < e < b or text[:m].strip():
        raise ValueError("expected 'M: ... E: ... B: ...'")
    moves, evals, best = text[m + 2:e].split(), text[e + 2:b].split(), text[b + 2:].split()
    if not 1 <= len(moves) <= 5 or not all(UCI.match(x) for x in moves):
        raise ValueError("M: needs 1 to 5 UCI moves")
    if len(evals) != len(moves):
        raise ValueError(f"{len(moves)} moves but {len(evals)} evals")
    try:
        evals = [float(x) for x in evals]
    except ValueError:
        raise ValueError("E: holds something that is not a number") from None
    if not all(math.isfinite(x) for x in evals):
        raise ValueError("E: holds a non-finite number")
    if len(best) != 1 or not UCI.match(best[0]):
        raise ValueError("B: needs exactly one UCI move")
    return moves, evals, best[0]


def parse_env(text):
    """'new_fen+reward+terminated+truncated' -> (new_fen, reward, terminated, truncated)."""
    parts = [p.strip() for p in text.strip().split("+")]
    if len(parts) != 4:
        raise ValueError(f"expected 4 '+' fields, got {len(parts)}")
    fen, reward, terminated, truncated = parts
    chess.Board(fen)  # ValueError on a FEN python-chess does not accept
    try:
        reward = float(reward)
    except ValueError:
        raise ValueError(f"reward {reward[:20]!r} is not a number") from None
    if not math.isfinite(reward):
        raise ValueError("reward is not finite")
    if terminated not in ("0", "1") or truncated not in ("0", "1"):
        raise ValueError("terminated and truncated must be 0 or 1")
    return fen, reward, int(terminated), int(truncated)


def policy_sample(fen, moves, evals, best=None, history=()):
    """P: sample; moves ranked best first when best is None (Stockfish annotations)."""
    best = best or moves[0]
    return Sample("P", fen, policy_prompt(fen), policy_completion(moves, evals, best),
                  moves=list(moves), evals=[float(e) for e in evals], best=best, history=list(history))


def env_sample(fen, move, history):
    """A: sample with python-chess ground truth."""
    history = _history(history)
    completion = env_completion(fen, move, history)
    next_fen, reward, terminated, truncated = parse_env(completion)
    return Sample("A", fen, env_prompt(fen, move, history), completion, history=history, move=move,
                  next_fen=next_fen, reward=reward, terminated=terminated, truncated=truncated)


def _board(fen):
    try:
        return chess.Board(fen)
    except ValueError as e:
        raise ValueError(f"bad FEN {fen[:90]!r}: {e}") from None


def parse_line(text):
    """One RookWorld text line (P:, or A: with or without its prefix) -> Sample with the line's labels."""
    text = text.strip()
    if text.startswith("P:"):
        m = text.find("M:")
        if m < 0:
            raise ValueError("P: line without 'M:'")
        fen = text[2:m].strip()
        _board(fen)
        moves, evals, best = parse_policy(text[m:])
        for x in moves:
            if x not in legal_ucis(fen):
                raise ValueError(f"move {x} is illegal in the position")
        if best not in moves:
            raise ValueError(f"B: move {best} is not among the M: moves")
        s = policy_sample(fen, moves, evals, best)
        s.completion = " " + text[m:]  # the line's own spacing
        return s
    parts = (text[2:] if text.startswith("A:") else text).split("+")
    if len(parts) != 7:
        raise ValueError(f"neither a P: line nor an A: line with 7 '+' fields (got {len(parts)})")
    fen, move, history = parts[0].strip(), parts[1].strip(), parts[2].split()
    _board(fen)
    completion = "+".join(p.strip() for p in parts[3:])
    next_fen, reward, terminated, truncated = parse_env(completion)
    return Sample("A", fen, env_prompt(fen, move, history), completion, history=history, move=move,
                  next_fen=next_fen, reward=reward, terminated=terminated, truncated=truncated)


# ----------------------------------------------------------------------------- files

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


def position_key(fen):
    """Placement, side, castling, en passant: the same position with other move counters is a duplicate."""
    return " ".join(fen.split()[:4])


# ----------------------------------------------------------------------------- position generator

CENTRE, WIDE_CENTRE = chess.SquareSet(chess.BB_CENTER), chess.SquareSet(0x00003C3C3C3C0000)
VALUE = {chess.PAWN: 1, chess.KNIGHT: 3, chess.BISHOP: 3, chess.ROOK: 5, chess.QUEEN: 9, chess.KING: 0}


def _loses(board, value, square, mover=None):
    """Would a piece of this value be lost on square: attacked by a cheaper piece, or attacked and
    not defended (the piece moving there, mover, does not defend it)."""
    attackers = board.attackers_mask(not board.turn, square)
    if not attackers:
        return False
    # a king (value 0 in VALUE) counts as the dearest attacker: it can take only loose pieces
    cheapest = min(VALUE[board.piece_type_at(s)] or 100 for s in chess.scan_forward(attackers))
    defenders = board.attackers_mask(board.turn, square) & ~(chess.BB_SQUARES[mover] if mover is not None else 0)
    return cheapest < value or not defenders


def _weight(board, move, capture_bias):
    """Plausibility of a move for random play: develop, take the centre, castle, take loose pieces,
    rescue attacked ones, and do not put pieces where they are lost (else positions are lopsided)."""
    piece = board.piece_type_at(move.from_square)
    value = VALUE[piece] or 100
    w = 1.0 + 2.0 * (move.to_square in CENTRE) + 1.0 * (move.to_square in WIDE_CENTRE)
    if piece in (chess.KNIGHT, chess.BISHOP) and chess.square_rank(move.from_square) in (0, 7):
        w += 2.0
    if board.is_castling(move):
        w += 4.0
    elif piece == chess.KING:
        w *= 0.3
    if move.promotion:
        w += 4.0 if move.promotion == chess.QUEEN else 0.0
    gain = VALUE[board.piece_type_at(move.to_square) or chess.PAWN] if board.is_capture(move) else 0
    lost = _loses(board, value, move.to_square, move.from_square)
    if gain >= value or (gain and not lost):
        w += 4.0 * gain  # a winning or safe capture
    else:
        w += capture_bias * gain
    if lost and gain < value:
        w *= 0.1
    elif _loses(board, value, move.from_square):
        w += 4.0  # rescue a piece that is en prise
    return w


def play(board, rng, capture_bias=0.5):
    moves = list(board.legal_moves)  # weights cubed: mostly plausible moves, so fewer lopsided positions
    board.push(rng.choices(moves, [_weight(board, m, capture_bias) ** 3 for m in moves])[0])


def random_position(rng, phase):
    """A legal board, not over, of the phase: opening (6-16 plies), middlegame (20-70 plies,
    >= 14 pieces) or endgame (< 14 pieces, reached by capture-happy play)."""
    while True:
        board = chess.Board()
        if phase == "endgame":
            while len(board.piece_map()) >= 14 and board.ply() < 300 and not board.is_game_over():
                play(board, rng, capture_bias=3.0)
            for _ in range(rng.randint(0, 6)):
                if not board.is_game_over():
                    play(board, rng)
        else:
            for _ in range(rng.randint(6, 16) if phase == "opening" else rng.randint(20, 70)):
                if board.is_game_over():
                    break
                play(board, rng)
        pieces = len(board.piece_map())
        if not board.is_game_over() and (pieces < 14) == (phase == "endgame"):
            return board


def iter_positions(seed):
    """Endless distinct positions as (fen, history of the last 9 moves, phase): ~20% openings, ~60%
    middlegames, ~20% endgames. The same seed gives the same sequence."""
    rng, seen = random.Random(seed), set()
    while True:
        u = rng.random()
        phase = "opening" if u < 0.2 else "middlegame" if u < 0.8 else "endgame"
        board = random_position(rng, phase)
        while position_key(board.fen()) in seen:  # a duplicate is redrawn in its phase to keep the mix
            board = random_position(rng, phase)
        seen.add(position_key(board.fen()))
        yield board.fen(), [m.uci() for m in board.move_stack[-9:]], phase


def generate_positions(n, seed):
    return list(itertools.islice(iter_positions(seed), n))


def random_env_sample(fen, history, rng, illegal_rate=0.05, garbage_rate=0.02):
    """A: sample on a position: mostly a plausible legal move (game-ending ones favoured, they are rare),
    sometimes an illegal move or a string that is no UCI move at all."""
    board, u = chess.Board(fen), rng.random()
    legal = list(board.legal_moves)
    if u < garbage_rate:
        move = rng.choice(["", "e2", "e2e9", "i1a1", "0000", "Nf3", "e7e8k", "resign"])
    elif u < garbage_rate + illegal_rate or not legal:
        # half the time a move that breaks only the check rules (pins, king into check), else any piece anywhere
        pseudo = [m for m in board.pseudo_legal_moves if not board.is_legal(m)]
        own = list(chess.SquareSet(board.occupied_co[board.turn]))
        m = rng.choice(pseudo) if pseudo and rng.random() < 0.5 else None
        while m is None or m.from_square == m.to_square or m in board.legal_moves:
            m = chess.Move(rng.choice(own), rng.randrange(64))
        move = m.uci()
    else:
        ending = [m for m in legal if _ends(board, m)]
        move = (rng.choice(ending) if ending and rng.random() < 0.5
                else rng.choices(legal, [_weight(board, m, 0.5) for m in legal])[0]).uci()
    return env_sample(fen, move, (list(history) + [move])[-10:])


def _ends(board, move):
    board.push(move)
    over = board.is_game_over()
    board.pop()
    return over


# ----------------------------------------------------------------------------- training sources

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
    """Samples of the configured source: the shipped pool, a RookWorld text file, or fresh positions
    annotated with Stockfish (one per training prompt)."""
    if cfg.data_source == "pool":
        return load_jsonl(POOL_PATH)
    if cfg.data_source == "file":
        if not cfg.data_file:
            raise ValueError("--data_source file needs --data_file PATH")
        return load_text(cfg.data_file, cfg.skip_bad_lines)[0]
    from mini.annotate import Annotator  # Stockfish only for this source
    positions = generate_positions(cfg.steps * cfg.batch_size, cfg.seed)
    with Annotator(cfg.stockfish_path, depth=cfg.stockfish_depth) as ann:
        labels = ann.annotate([fen for fen, _, _ in positions])
    return [policy_sample(fen, *labels[fen], history=h) for fen, h, _ in positions]
