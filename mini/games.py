"""Games between players, shared by self-play training (mini/selfplay.py) and the chess suite
(mini/chess_eval.py), and the quick chess metrics train.py logs. A player is a function from prompts to
completion texts (model_player wraps generate; tests plug in scripted ones); a P: completion's move is the
first word after its last "B:" when that is a UCI move.
"""
import json
import statistics
from collections import Counter

import chess
import torch
from tqdm.auto import tqdm

from mini.config import MATE_PATH
from mini.evaluate import complete_texts
from mini.flags import not_a_device
from mini.formats import UCI, board_ucis, checked_board, legal_ucis, policy_prompt

LEGAL_ENDS = ("checkmate", "stalemate", "insufficient_material", "seventyfive_moves", "fivefold_repetition",
              "threefold_repetition", "fifty_moves")


# well-known openings in UCI, played from the initial position so that games have a history
OPENINGS = {
    "ruy_lopez": "e2e4 e7e5 g1f3 b8c6 f1b5 a7a6",
    "sicilian_najdorf": "e2e4 c7c5 g1f3 d7d6 d2d4 c5d4 f3d4 g8f6 b1c3 a7a6",
    "french": "e2e4 e7e6 d2d4 d7d5 b1c3 g8f6",
    "caro_kann": "e2e4 c7c6 d2d4 d7d5 b1c3 d5e4 c3e4",
    "queens_gambit_declined": "d2d4 d7d5 c2c4 e7e6 b1c3 g8f6",
    "kings_indian": "d2d4 g8f6 c2c4 g7g6 b1c3 f8g7 e2e4 d7d6",
    "english": "c2c4 e7e5 b1c3 g8f6 g2g3",
    "italian": "e2e4 e7e5 g1f3 b8c6 f1c4 f8c5 c2c3",
}


def model_player(model, tok, temperature=0.0, top_k=0, seed=0, max_new_tokens=96, batch_size=64, autocast=None):
    """prompts -> completion texts of the model; one seeded generator for all calls, so a run repeats."""
    generator = torch.Generator(device=next(model.parameters()).device).manual_seed(seed)
    return lambda prompts: complete_texts(model, tok, prompts, max_new_tokens, batch_size, autocast,
                                          temperature=temperature, top_k=top_k, generator=generator)


def policy_move(text):
    """The B: move of a P: completion: the first word after the last 'B:' if it is a UCI move, else None."""
    b = text.rfind("B:")
    words = text[b + 2:].split() if b >= 0 else []
    return words[0] if words and UCI.match(words[0]) else None


def in_batches(player, prompts, batch_size=64, desc=""):
    """player over prompts in chunks, with a progress bar when there is more than one chunk."""
    out = []
    for i in tqdm(range(0, len(prompts), batch_size), desc=desc, unit="batch", disable=len(prompts) <= batch_size):
        out += player(prompts[i:i + batch_size])
    return out


def mean(xs):
    """The mean of the measured values (None: not measured); nan with none."""
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else float("nan")


def load_mates(path=MATE_PATH, n=None):
    """The first n records {fen, mates, phase} of a mate-in-one file (the header skipped). ValueError in one
    sentence when the file cannot be read, holds no position, or a position lacks its mating moves."""
    fix = "regenerate it with python mini/chess_eval.py --build_mates"
    try:
        with open(not_a_device(path), encoding="utf-8-sig") as f:  # an editor's byte-order mark is not damage
            lines = list(enumerate(f, 1))
    except (OSError, ValueError) as e:  # ValueError: not UTF-8
        raise ValueError(f"cannot read mate-in-one positions from {path} ({e}); {fix}") from None
    records = []
    for i, line in lines:
        try:
            r = json.loads(line) if line.strip() else {"meta": None}
            if not isinstance(r, dict) or not ("fen" in r or "meta" in r):
                raise ValueError("the line holds no position")
            if "fen" in r:
                board = checked_board(r["fen"])
                if "mates" in r and not is_mate_list(board, r["mates"]):
                    raise ValueError(f"'mates' {r['mates']!r:.60} is not a list of the position's mating moves (UCI)")
                records.append(r)
        except (ValueError, RecursionError) as e:  # not JSON, nested too deeply, an impossible position
            raise ValueError(f"{path}:{i}: {e}; {fix}") from None
    if not records:  # every metric would be a mean of nothing
        raise ValueError(f"{path} holds no mate-in-one position; {fix}")
    lacking = next((r["fen"] for r in records if "mates" not in r), None)
    if lacking:  # another .jsonl of positions, such as the eval set
        raise ValueError(f"{path} is not a mate-in-one file: position {lacking} has no 'mates' list; {fix}")
    return records[:n]


def is_mate_list(board, mates):
    """Whether mates is a non-empty list of moves legal on board that each give mate."""
    def mates_here(uci):
        try:
            move = chess.Move.from_uci(uci)
        except (TypeError, ValueError, AttributeError):
            return False
        if move not in board.legal_moves:
            return False
        board.push(move)
        mate = board.is_checkmate()
        board.pop()
        return mate
    return isinstance(mates, list) and bool(mates) and all(isinstance(m, str) and mates_here(m) for m in mates)


def mate_values(records, completions):
    """Per position: mate (B: is a legal move that mates, by the board: a file's list may miss a mate), invalid
    (no B: move), illegal (a UCI move, not legal)."""
    vals = {"chess_mate_acc": [], "chess_mate_invalid": [], "chess_mate_illegal": []}
    for r, text in zip(records, completions, strict=True):
        move, board = policy_move(text), chess.Board(r["fen"])
        legal = move is not None and move in board_ucis(board)
        if legal:
            board.push_uci(move)
        vals["chess_mate_acc"].append(float(legal and board.is_checkmate()))
        vals["chess_mate_invalid"].append(float(move is None))
        vals["chess_mate_illegal"].append(float(move is not None and not legal))
    return vals


def eval_mates(player, records):
    completions = in_batches(player, [policy_prompt(r["fen"]) for r in records], desc="mate in one")
    return mate_values(records, completions), completions


def opening_board(name):
    board = chess.Board()
    for uci in OPENINGS[name].split() if name != "initial" else ():
        board.push_uci(uci)
    return board


def game_start(i):
    """Game i's start: even-numbered games from the initial position, odd ones from the openings in turn."""
    return "initial" if i % 2 == 0 else list(OPENINGS)[(i // 2) % len(OPENINGS)]


def game_starts(n):
    return [game_start(i) for i in range(n)]


def game_outcome(board):
    """The game's end by the rules once it has happened: python-chess's outcome (checkmate, stalemate,
    insufficient material, the 75-move rule, fivefold), and a threefold repetition or fifty moves without a
    capture or pawn move once they are on the board, as an arbiter ends them. Not outcome(claim_draw=True),
    which also ends a game where the side to move could claim a draw with its next move: one ply early, and
    for a side (Stockfish winning) that would never claim it."""
    outcome = board.outcome()
    if outcome is None and board.is_repetition(3):
        return chess.Outcome(chess.Termination.THREEFOLD_REPETITION, None)
    if outcome is None and board.is_fifty_moves():
        return chess.Outcome(chess.Termination.FIFTY_MOVES, None)
    return outcome


def policy_turn(board, text, game, max_plies):
    """Play the move of one completion on board; set game["end"] when the game is over. The move, if UCI,
    is recorded as an arbiter transition (fen, move, last <= 10 half-moves including it)."""
    move, fen = policy_move(text), board.fen()
    if move is None:
        game["end"] = "unparseable"
        return
    game["transitions"].append((fen, move, [m.uci() for m in board.move_stack[-9:]] + [move]))
    if move not in legal_ucis(fen):
        game["end"] = "illegal"
        return
    board.push_uci(move)
    game["plies"] += 1
    outcome = game_outcome(board)
    if outcome:
        game["end"] = outcome.termination.name.lower()
    elif game["plies"] >= max_plies:
        game["end"] = "max_plies"


def half_move(player, boards, games, max_plies):
    """One player call for every live game (end None): each plays its move (policy_turn). Shared by
    self_play and mini/selfplay.py's training games."""
    live = [i for i, g in enumerate(games) if g["end"] is None]
    completions = player([policy_prompt(boards[i].fen()) for i in live])
    for i, text in zip(live, completions, strict=True):
        policy_turn(boards[i], text, games[i], max_plies)


def self_play(player, starts, max_plies=200):
    """Games of the player against itself from the named starts; each half-move is one player call for
    all live games. Returns one dict per game: start, plies (legal half-moves played), end, moves, transitions."""
    boards = [opening_board(s) for s in starts]
    games = [{"start": s, "plies": 0, "end": None, "transitions": []} for s in starts]
    with tqdm(desc="self-play", unit="half-move", total=max_plies, disable=len(games) < 8) as bar:
        while any(g["end"] is None for g in games):
            half_move(player, boards, games, max_plies)
            bar.update()
    for g, b in zip(games, boards):
        g["moves"] = [m.uci() for m in b.move_stack]
    return games


def selfplay_values(games):
    return {"chess_selfplay_plies": [float(g["plies"]) for g in games],
            "chess_selfplay_legal_end": [float(g["end"] in LEGAL_ENDS) for g in games]}


def selfplay_summary(games):
    """Means that are not per-game values: the median and the share of each way a game ended."""
    ends = Counter(g["end"] for g in games)
    out = {"chess_selfplay_plies_median": float(statistics.median(g["plies"] for g in games))}
    out.update({f"chess_selfplay_end_{k}": v / len(games) for k, v in sorted(ends.items())})
    return out


def quick_metrics(model, tok, n_mates=100, n_games=16, max_plies=100, temperature=0.6, top_k=5, seed=0,
                  max_new_tokens=96, autocast=None):
    """The chess skill train.py's periodic evaluation logs (--eval_chess): mate in one on the first n_mates
    positions and n_games self-play games, as a flat dict of chess_* means."""
    greedy = model_player(model, tok, 0.0, 0, seed, max_new_tokens, autocast=autocast)
    sampler = model_player(model, tok, temperature, top_k, seed, max_new_tokens, autocast=autocast)
    values, _ = eval_mates(greedy, load_mates(MATE_PATH, n_mates))
    games = self_play(sampler, game_starts(n_games), max_plies)
    values.update(selfplay_values(games))
    return dict(sorted({**selfplay_summary(games), **{k: mean(v) for k, v in values.items()}}.items()))
