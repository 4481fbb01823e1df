"""
The RookWorld text formats, token for token as the model was pretrained on them, their parsers, and
the python-chess ground truth of the A: task.

P: (policy; labels from Stockfish MultiPV 5 at ~0.1 s a position)
    "P: " + f"{fen:90}" + "M: " + f"{' '.join(moves):30}" + "E: " + f"{' '.join(evals):40}" + "B: " + best
  - moves: Stockfish's top 5 first moves in UCI (fewer when fewer are legal), shuffled together with
    their evals in RookWorld's data, so M:/E: order carries no rank: compare by move, never by index.
    This project's own labels (policy_sample, from annotated positions) keep Stockfish's order, best first,
    so B: is the first M: move: the models trained here (mini/data) learned that order, and a report's
    labels stay the same text. Parsers, rewards and metrics never read the order, so either scores alike.
  - evals: side to move's view in pawns, str(cp / 100) ("0.0", "-2.3"); mate in n is +-(1000 - n/100)
    (mate_score=100000), e.g. 999.97, so any eval error must clip mates.
  - B: in the published data is PV1 when White is to move but the LAST MultiPV line (the weakest of
    the five) when Black is to move, a generator bug the model inherited. Rewards use Stockfish's PV1
    for both colours; evaluation reports accuracy against the label and against PV1, by colour.
  - Widths differ between sources (the validation file pads the FEN to 89, the generator to 90), so
    parsers split on the markers. A generation prompt is "P: " + fen padded so that the last padding
    space merges into the next token " M"; the completion is then "M: ... E: ... B: <move>" (~66 tokens).
A: (environment)
    "A: " + fen + "+" + move + "+" + " ".join(history) + "+" + new_fen + "+" + reward + "+" + terminated + "+" + truncated
  - history: the last up to 10 half-moves in UCI, INCLUDING the current move as the last entry.
  - The prompt is everything through the third "+" ("+" is always its own token); completion ~58 tokens.
  - Ground truth of a legal move: new_fen = board.fen() after push; reward 1.0 if it mates, 0.5 if the
    game is drawn (stalemate, insufficient material, 75-move rule, fivefold repetition: env_label sees the
    FEN alone, and no 10-move history can show a fivefold, so a text line's fivefold draw is relabelled as a
    plain move; this project's games stop at threefold), else 0.001;
    terminated = game over; truncated = 0. An illegal or unparsable move leaves the FEN unchanged,
    reward -1.0, terminated 0, truncated 1 (the original generator pushed pseudo-legal moves unchecked;
    this code does not copy that).
Tokens: GPT-2 BPE has no multi-space tokens, so every padding space is a token (id 220); EOS = 50256.
"""
import math
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache

import chess

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
    # an A: text line whose own label python-chess corrected (parse_line); not part of the sample's content
    relabelled: bool = field(default=False, compare=False)
    # the game of a real-game set a record comes from (annotate.py --pgn), for intervals that resample whole games
    game: int | None = field(default=None, compare=False)


# ----------------------------------------------------------------------------- formats

PAD_WIDTHS = (90, 89)  # the FEN's padded width: the generator code's 90, RookWorld's published validation file's 89


def policy_prompt(fen, width=90):
    """'P: ' + fen padded to width columns, less the last space, which merges into the next token ' M'."""
    return "P: " + fen + " " * max(width - 1 - len(fen), 0)


def repad(sample, width):
    """A P: sample with its FEN padded to another width (PAD_WIDTHS); other samples unchanged."""
    return replace(sample, prompt=policy_prompt(sample.fen, width)) if sample.task == "P" else sample


def policy_completion(moves, evals, best):
    return " M: " + f"{' '.join(moves):30}" + "E: " + f"{' '.join(str(float(e)) for e in evals):40}" + "B: " + best


MAX_HISTORY = 10  # half-moves an A: prompt carries, the move included


def _history(history):
    """The moves of a history as a list: from a list of UCI strings or one string of them separated by spaces
    (a hand-made record's "history"); ValueError for anything else, which a prompt would print as garbage."""
    moves = history.split() if isinstance(history, str) else list(history) if isinstance(history, (list, tuple)) else None
    if moves is None or not all(isinstance(m, str) and not _BREAKS_FIELDS.search(m) for m in moves):
        raise ValueError(f"a history is a list of UCI moves or one string of them, not {history!r:.40}")
    return moves


_BREAKS_FIELDS = re.compile(r"[\s+]")  # a move in an A: prompt sits between '+' fields, its history between spaces
MAX_MOVE_CHARS = 10  # of an A: move that may be garbled (a UCI move has 4 or 5): a longer one outran the context


def _played(moves):
    """moves, each a UCI move: the half-moves a game played, which A: prompts print as the history."""
    bad = [m for m in moves if not UCI.match(m)]
    if bad:
        raise ValueError(f"history move {bad[0]!r:.20} is not a UCI move (like e2e4 or e7e8q)")
    return moves


def env_prompt(fen, move, history):
    return "A: " + fen + "+" + move + "+" + " ".join(_history(history)) + "+"


def env_label(fen, move):
    """Ground truth of the A: task: (next_fen, reward, terminated, truncated) from one board. next_fen of a
    legal move is python-chess's own FEN of the position, so its first four fields are its position_key."""
    board = chess.Board(fen)
    if move not in board_ucis(board):  # illegal or unparsable: state unchanged, episode cut
        return fen, -1.0, 0, 1
    board.push_uci(move)
    outcome = board.outcome()
    mate = outcome is not None and outcome.termination == chess.Termination.CHECKMATE
    return board.fen(), 1.0 if mate else 0.5 if outcome else 0.001, int(outcome is not None), 0


def env_text(label):
    """An env_label as A: completion text: 'next_fen+reward+terminated+truncated'."""
    return "+".join(map(str, label))


def env_completion(fen, move, history=()):
    """The A: completion text of env_label. history (which ends with move) cannot change the result:
    fivefold repetition needs more than the 10 half-moves the format carries."""
    return env_text(env_label(fen, move))


def board_ucis(board):
    """The legal moves of a board in standard UCI (castling e1g1, never king-takes-rook e1h1, which
    python-chess's push_uci also accepts): the one legality rule of every reward, the A: ground truth and
    self-play."""
    return frozenset(m.uci() for m in board.legal_moves)


@lru_cache(maxsize=4096)  # the k completions of a group share their position
def legal_ucis(fen):
    """board_ucis of a FEN."""
    return board_ucis(chess.Board(fen))


ILLEGAL_KINDS = ("from", "geometry", "check")


def illegal_kind(fen, uci):
    """Why a UCI move is illegal in fen, one of ILLEGAL_KINDS: 'from' (no piece of the side to move on its first
    square), 'geometry' (that piece cannot make that move there: its pattern, a blocked path, an own piece on the
    target, a pawn's capture rule, castling without the right or across an attacked square, which python-chess
    never generates) or 'check' (it could, but it leaves its own king in check). A move onto its own square
    (a1a1) is 'from' or 'geometry'; castling written king-takes-rook (e1h1) is 'geometry' (the king onto its own
    rook). None when the move is legal (legal_ucis) or not UCI (0000, e9e4, Nf3)."""
    if not UCI.match(uci) or uci in legal_ucis(fen):
        return None
    board = chess.Board(fen)
    piece = board.piece_at(chess.parse_square(uci[:2]))
    if piece is None or piece.color != board.turn:
        return "from"
    # by UCI text, not board.is_pseudo_legal, which takes e1h1 for castling
    return "check" if uci in {m.uci() for m in board.pseudo_legal_moves} else "geometry"


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
    """'new_fen+reward+terminated+truncated' -> (new_fen, reward, terminated, truncated). Fields may carry
    spaces around them and the reward is read as a number (0.001 and 1e-3 are one reward): the arbiter's
    consumers use the values; the FEN itself is judged as text (reward_scorer.env_components)."""
    parts = [p.strip() for p in text.strip().split("+")]
    if len(parts) != 4:
        raise ValueError(f"expected 4 '+' fields, got {len(parts)}")
    fen, reward, terminated, truncated = parts
    if len(fen.split()) != 6:  # python-chess also takes a bare board, whose defaults would pass for a next state
        raise ValueError("the FEN needs its 6 fields")
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
    """P: sample; moves ranked best first when best is None (Stockfish annotations). Evals must be finite:
    JSON readers accept NaN and Infinity, which would score every completion silently wrong."""
    best = best or moves[0]
    try:
        evals = [float(e) for e in evals]
    except OverflowError:  # JSON's integers have no limit
        raise ValueError(f"evals {evals!r:.60} hold an integer too large for a number") from None
    if not all(map(math.isfinite, evals)):
        raise ValueError(f"evals {evals} are not all finite numbers")
    return Sample("P", fen, policy_prompt(fen), policy_completion(moves, evals, best),
                  moves=list(moves), evals=evals, best=best, history=_played(_history(history)))


def env_sample(fen, move, history):
    """A: sample with python-chess ground truth. The move may be illegal or garbled (the arbiter must say so),
    but not break the prompt's fields; the history holds the last 1 to MAX_HISTORY half-moves, played ones but for
    the move itself at its end."""
    if not isinstance(move, str) or _BREAKS_FIELDS.search(move) or len(move) > MAX_MOVE_CHARS:
        raise ValueError(f"an A: move is one word (or none) of at most {MAX_MOVE_CHARS} characters, without '+' or "
                         f"spaces (the prompt's separators), not {move!r:.40}")
    history = _history(history)
    if len(history) > MAX_HISTORY:
        raise ValueError(f"an A: history holds the last 1 to {MAX_HISTORY} half-moves, the move included; this one "
                         f"has {len(history)}: keep its last {MAX_HISTORY}")
    _played(history[:-1] if history[-1:] == [move] else history)
    label = env_label(fen, move)
    next_fen, reward, terminated, truncated = label
    return Sample("A", fen, env_prompt(fen, move, history), env_text(label), history=history, move=move,
                  next_fen=next_fen, reward=reward, terminated=terminated, truncated=truncated)


class ImpossiblePosition(ValueError):
    """A FEN python-chess reads, of a position no game reaches (board.is_valid() is False)."""


def checked_board(fen):
    """The board of a FEN of 6 fields that python-chess accepts and calls possible (is_valid); else a ValueError
    naming what is wrong: the FEN's syntax, or the board's status (two white kings, a pawn on the back rank, no
    king, the side not to move in check, ...). python-chess also reads a FEN without its move counters, but an
    illegal move's next state is the FEN itself, which parse_env refuses without them, and every P: position
    becomes an A: one (random_env_sample)."""
    if not isinstance(fen, str):
        raise ValueError(f"the FEN is {type(fen).__name__} {fen!r:.40}, not a string")
    fields = fen.split()
    if " ".join(fields) != fen:  # a prompt prints the FEN as it is
        raise ValueError(f"bad FEN {fen[:90]!r}: its 6 fields are separated by single spaces, with none around them")
    if len(fields) != 6:
        raise ValueError(f"bad FEN {fen[:90]!r}: it needs its 6 fields (board, side, castling, en passant, halfmove "
                         f"and fullmove counters)")
    try:
        board = chess.Board(fen)
    except ValueError as e:
        raise ValueError(f"bad FEN {fen[:90]!r}: {e}") from None
    if not board.is_valid():
        why = ", ".join(s.name.lower().replace("_", " ") for s in chess.Status if s and s in board.status())
        raise ImpossiblePosition(f"impossible position {fen[:90]!r} ({why})")
    return board


def check_policy(fen, moves, evals, best=None):
    """Raises ValueError saying what is wrong with a P: label, wherever it was read from (a text line, a JSONL
    record): a FEN python-chess does not accept or calls impossible (checked_board), other than 1 to 5 moves
    or one eval per move, an illegal move, a B: move (text lines have one) not among the moves."""
    legal = board_ucis(checked_board(fen))  # one board per label: building it is most of a pool's load time
    if not isinstance(moves, list) or not 1 <= len(moves) <= 5:
        raise ValueError("needs a list of 1 to 5 moves")
    if not isinstance(evals, list) or len(evals) != len(moves):
        raise ValueError(f"{len(moves)} moves need {len(moves)} evals, got {evals!r:.40}")
    if any(isinstance(e, bool) for e in evals):  # float(True) is 1.0: a field mixed up, not an eval
        raise ValueError(f"evals {evals!r:.40} hold true or false, not numbers")
    if len(set(moves)) < len(moves):
        raise ValueError(f"moves {moves!r:.60} list a move twice; Stockfish's candidates are distinct")
    for x in moves:
        if x not in legal:
            raise ValueError(f"move {x} is illegal in the position")
    if best is not None and best not in moves:
        raise ValueError(f"B: move {best} is not among the M: moves")


def parse_line(text):
    """One RookWorld text line (P:, or A: with or without its prefix) -> Sample. A P: line keeps its labels; an
    A: line is labelled by python-chess (env_sample), because the original generator pushed pseudo-legal moves
    unchecked, so a line's own next FEN, reward or flags can be wrong: relabelled says the line's differed."""
    text = text.strip()
    if text.startswith("P:"):
        m = text.find("M:")
        if m < 0:
            raise ValueError("P: line without 'M:'")
        fen = text[2:m].strip()
        moves, evals, best = parse_policy(text[m:])
        check_policy(fen, moves, evals, best)
        s = policy_sample(fen, moves, evals, best)
        s.completion = " " + text[m:]  # the line's own spacing
        return s
    parts = (text[2:] if text.startswith("A:") else text).split("+")
    if len(parts) != 7:
        raise ValueError(f"neither a P: line nor an A: line with 7 '+' fields (got {len(parts)})")
    fen, move, history = parts[0].strip(), parts[1].strip(), parts[2].split()
    if move and history[-1:] != [move]:  # an empty move cannot be a history's word
        raise ValueError(f"an A: line's history ends with its move {move!r:.20} (the format's last entry), not "
                         f"{' '.join(history[-1:]) or 'nothing'!r:.20}")
    checked_board(fen)
    own = parse_env("+".join(parts[3:]))  # a malformed label still makes a bad line
    s = env_sample(fen, move, history)
    s.relabelled = own != (s.next_fen, s.reward, s.terminated, s.truncated)
    return s


def position_key(fen):
    """Placement, side, castling, en passant as python-chess writes them (the en passant square only where a
    capture there is legal, castling rights only with their rooks home), so the same position written another
    way or with other move counters is a duplicate. Raises ValueError on a FEN python-chess does not accept."""
    return board_key(chess.Board(fen))


def placement(fen):
    """The piece placement of a FEN python-chess accepts, as position_key writes it, without building a board
    (~100 times faster): python-chess takes no other spelling of a placement than its own but for the
    promoted-piece marks '~' of crazyhouse FENs, which it drops."""
    return fen.split(maxsplit=1)[0].replace("~", "")


def board_key(board):
    """position_key of a board already built."""
    return " ".join(board.fen().split()[:4])


# ----------------------------------------------------------------------------- training sources
