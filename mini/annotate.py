"""The command that builds the shipped data: generated positions labelled by Stockfish (mini/stockfish.py).

    python mini/annotate.py --pool 5000 --eval 500 --depth 10 --seed 0
    python mini/annotate.py --pgn games.pgn --eval 500 --eval_path logs/data/eval-pgn.jsonl   # a set of real games

A quick search screens out most lopsided positions (beyond --max_eval pawns one in four is kept); the rest get
Stockfish's top 5 moves. Analyses are cached on disk, so a cut-off build resumes where it stopped.
"""
import argparse
import codecs
import contextlib
import io
import itertools
import json
import math
import os
import queue
import random
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

if not __package__:  # run as `python mini/x.py`, not installed: import `mini` from this checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import chess
import chess.engine
import chess.pgn
import numpy as np
from tqdm.auto import tqdm

from mini.config import EVAL_PATH, POSITIVE, POOL_PATH, REAL_EVAL_PATH, Config, at_least, between
from mini.flags import Parser, Switch, error_sentence, not_a_device, run_command
from mini.dataset import held_out_keys, load_jsonl, record_keys, shipped_keys
from mini.formats import placement, position_key
from mini.positions import (HISTORY_BUCKETS, KING_CONSTRAINTS, build_mates, game_fens, game_transitions, history_bucket,
                            iter_positions, king_constraint, phase, play_game, random_env_sample)
from mini.stockfish import (DEFAULT_CACHE, ENGINE_NAMES, Annotator, append_jsonl, close_engine, engine_deadline,
                            find_stockfish, open_engine, read_jsonl)


def write_jsonl(path, meta, positions, labels, transitions=(), game_of=None):
    """Header record, then one P: position per line (with its phase when known), then one A: transition per
    line ({"fen", "move", "history"}: python-chess labels it on loading); written to a temporary file first,
    then renamed. game_of: {position_key: game} of a set of real games (first_games), each record's "game"."""
    game = (lambda fen: {}) if game_of is None else (lambda fen: {"game": game_of[position_key(fen)]})
    tmp = path + ".tmp"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(json.dumps({"meta": meta}) + "\n")
            for fen, history, phase_name in positions:
                moves, evals = labels[fen]
                record = {"fen": fen, "moves": moves, "evals": evals, "history": history, "phase": phase_name}
                f.write(json.dumps(record | game(fen), separators=(",", ":")) + "\n")
            for fen, move, history in transitions:
                record = {"fen": fen, "move": move, "history": history}
                f.write(json.dumps(record | game(fen), separators=(",", ":")) + "\n")
    except BaseException:  # a failed or cut-off write (Ctrl-C) leaves no half-written .tmp beside the data
        with contextlib.suppress(OSError):  # open() itself may have failed: no .tmp, and its error is the one
            os.remove(tmp)
        raise
    os.replace(tmp, path)


def header(ann, a, **about):
    """A data file's header record: the engine and limit that labelled it, the seed, what it was drawn from
    (about), and the command that rebuilds it."""
    return {"stockfish": ann.engine, "limit": ann.tag, "multipv": 5, "seed": a.seed, **about,
            "command": "python mini/annotate.py " + " ".join(a.argv)}


GAMES_POOL_PATH = os.path.join("logs", "data", "pool-games.jsonl")  # not shipped: rebuilt by the command in README
PGN_EVAL_PATH = os.path.join("logs", "data", "eval-pgn.jsonl")  # --pgn: the user's games, not shipped


def play_games(tag, n, stockfish_path, workers, cache_dir=""):
    """n games of positions.play_game, game i seeded by (tag, i): the same games whatever the worker count. Kept
    in cache_dir/games-<tag>-<n>.jsonl (by the engine's name), so a rebuild does not play them again. Every
    search is bounded by the engine deadline of play_game's largest one (1000 nodes, MultiPV 5)."""
    path, deadline = find_stockfish(stockfish_path), engine_deadline(chess.engine.Limit(nodes=1000), multipv=5)
    saved = os.path.join(cache_dir, f"games-{tag}-{n}.jsonl") if cache_dir else ""
    for r in read_jsonl(saved, keys=("games",)):
        if r.get("engine") == ENGINE_NAMES[path] and isinstance(r["games"], list) and len(r["games"]) == n:
            return [tuple(g) for g in r["games"]]

    def one(i):
        engine = engines.get()
        try:
            return play_game(engine, random.Random(f"{tag}-{i}"))
        finally:
            engines.put(engine)

    engines = queue.Queue()
    try:  # an engine goes into the queue as soon as it runs, so that it is closed whatever fails next
        for _ in range(workers):
            engine = open_engine(path, deadline)
            engines.put(engine)
            engine.configure({"Threads": 1})
        with ThreadPoolExecutor(workers) as pool:
            games = list(tqdm(pool.map(one, range(n)), total=n, desc=f"{tag} games", unit="game"))
    finally:
        while not engines.empty():
            close_engine(engines.get())
    if saved:
        append_jsonl(saved, [{"engine": ENGINE_NAMES[path], "games": games}])
    return games


def quotas(n, shares):
    """{key: count} that add up to n, each n * share rounded by the largest remainder (ties to the first key), so
    that no count goes negative as rounding each one up could make the last (0.25, 0.25, 0.5 of 30: 8, 7, 15)."""
    exact = {k: n * share for k, share in shares.items()}
    out = {k: math.floor(x) for k, x in exact.items()}
    for k in sorted(exact, key=lambda k: out[k] - exact[k])[:n - sum(out.values())]:  # stable: ties keep the order
        out[k] += 1
    return out


def game_positions(games, rng, n, exclude=frozenset(), king_shares=None):
    """n distinct positions (fen, history, phase) drawn uniformly over the plies of the games, none over
    and none whose key is in exclude. king_shares: {class: share} over positions.king_constraint's classes, that
    share of the n drawn among the positions of each class named, the rest among those of the classes not named
    (the model answers illegally most where its king's safety forbids moves); None: as they come in the games
    (8-9% in check, 37% king_square). Fewer than n when the games hold too few."""
    seen, out = set(exclude), []
    candidates = [(fen, history) for moves, _ in games for fen, history, _ in game_transitions(moves)]
    rng.shuffle(candidates)
    wanted = None
    if king_shares is not None:  # None: every class not named
        wanted = quotas(n, {**king_shares, None: max(0.0, 1 - sum(king_shares.values()))})
    for fen, history in candidates:
        if len(out) == n:  # checked first, so that n = 0 draws none
            break
        key = position_key(fen)
        if key in seen:
            continue
        board = chess.Board(fen)
        if wanted is not None:
            constraint = king_constraint(board)
            drawn = constraint if constraint in wanted else None
            if wanted[drawn] == 0:
                continue
            wanted[drawn] -= 1
        seen.add(key)
        out.append((fen, history, phase(board)))
    return out


def game_env_records(games, rng, exclude=frozenset(), per_bucket=None, cut_rate=0.25, limit=0):
    """Distinct A: transitions of the games as (fen, move, history incl. move): the move played (88%), an illegal
    move (10%) or no UCI move (2%), none on or onto a position whose key is in exclude. The history is the game's
    own, cut to a random shorter length a cut_rate share of the time: a position handed over without its whole
    game. per_bucket: that many of each history-length bucket (HISTORY_BUCKETS), each cut to a length drawn within
    its bucket; else every transition once, or the first `limit` of them in a shuffled order (0: all)."""
    plies = [(fen, history, played) for moves, _ in games for fen, history, played in game_transitions(moves)]
    rng.shuffle(plies)
    out, seen = [], set()
    for lo, hi in HISTORY_BUCKETS if per_bucket is not None else [(None, None)]:
        taken = 0
        for fen, history, played in plies:
            if limit and len(out) == limit:
                break
            if per_bucket is not None:
                if taken == per_bucket:
                    break
                if len(history) < hi - 1:
                    continue
                history = history[len(history) - rng.randint(lo, hi) + 1:]
            elif history and rng.random() < cut_rate:
                history = history[rng.randint(1, len(history)):]
            s = random_env_sample(fen, history, rng, illegal_rate=0.10, move=played)
            key = (position_key(s.fen), s.move, tuple(s.history))
            if key in seen or position_key(s.fen) in exclude or (s.next_fen and position_key(s.next_fen) in exclude):
                continue
            seen.add(key)
            out.append((s.fen, s.move, s.history))
            taken += 1
    return out


def excluded_keys(paths):
    """--exclude: position_key of every position in these files, which a held-out set of --games keeps off. A data
    file's records (each position and, for a legal A: move, the one it leads to, as shipped_keys) or a games file
    of play_games (every position of every game). Read strictly, since a line skipped would let its positions
    into the held-out set: ValueError in one sentence for a line that is none of these."""
    keys = set()
    for path in paths:
        with open(not_a_device(path), encoding="utf-8") as f:
            for i, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    r = json.loads(line)
                    if "games" in r:
                        keys |= {position_key(fen) for moves, _ in r["games"] for fen in game_fens(moves)}
                    elif "fen" in r:
                        keys |= record_keys(r["fen"], r.get("move"))
                    elif "meta" not in r:
                        raise ValueError("no fen, games or meta")
                except (ValueError, TypeError, KeyError, AttributeError, RecursionError) as e:  # a bad FEN or move too
                    raise ValueError(f"{path} line {i} is no record, header or games line of annotate.py ({e}); give "
                                     "--exclude the data files or games files that training read") from e
    return keys


def build_from_games(a):
    """--games: realistic data. Eval games (seeded "<seed>-eval") give the held-out P: positions and A:
    transitions per history bucket, none on a position that any training game, the shipped pool or an --exclude
    file reaches (the start position and common openings stay trainable); training games ("<seed>-train") the
    pool's P: positions and every one of their A: transitions, none on a held-out position."""
    t0 = time.time()
    kept = os.path.dirname(os.path.abspath(a.pool_path))  # the games are kept beside the pool
    eval_games = play_games(f"{a.seed}-eval", a.eval_games, a.stockfish_path, a.workers, kept) if a.eval_games else []
    train_games = play_games(f"{a.seed}-train", a.games, a.stockfish_path, a.workers, kept)
    trained = shipped_keys([POOL_PATH]) | a.excluded | {
        position_key(fen) for moves, _ in train_games for fen in game_fens(moves)}
    # one RNG per draw, so that each set depends on its own settings only
    eval_positions = game_positions(eval_games, random.Random(f"{a.seed}-eval-P"), a.eval, exclude=trained)
    eval_env = game_env_records(eval_games, random.Random(f"{a.seed}-eval-A"), exclude=trained,
                                per_bucket=a.eval_transitions // len(HISTORY_BUCKETS))
    held_out = set(held_out_keys())  # the shipped held-out sets, then this build's own (the same file when rebuilt)
    for fen, _, _ in eval_positions:
        held_out.add(position_key(fen))
    for fen, move, _ in eval_env:
        held_out |= record_keys(fen, move)
    pool_positions = game_positions(train_games, random.Random(f"{a.seed}-pool-P"), a.pool, exclude=held_out,
                                    king_shares=a.king_shares)
    if len(pool_positions) < a.pool:
        shares = "" if a.king_shares is None else " at --king_shares " + ",".join(
            f"{k}={v}" for k, v in a.king_shares.items())
        print(f"annotate.py: the {a.games} games hold {len(pool_positions)} positions for a pool of {a.pool}{shares}; "
              "writing those")
    pool_env = game_env_records(train_games, random.Random(f"{a.seed}-pool-A"), exclude=held_out, cut_rate=a.cut_rate,
                                limit=a.transitions)
    with Annotator(a.stockfish_path, a.depth, a.time, a.workers, a.cache) as ann:
        meta = header(ann, a, generator="mini.positions.play_game")
        if a.eval_games:  # --eval_games 0: more training games only, the shipped held-out set untouched
            labels = ann.annotate([fen for fen, _, _ in eval_positions])  # the held-out set first: it is small
            write_jsonl(a.eval_path, {**meta, "games": a.eval_games}, eval_positions, labels, eval_env)
        labels = ann.annotate([fen for fen, _, _ in pool_positions])
    write_jsonl(a.pool_path, {**meta, "games": a.games}, pool_positions, labels, pool_env)
    print(f"wrote {len(pool_positions)} pool positions and {len(pool_env)} A: transitions of {a.games} games, "
          f"{len(eval_positions)} eval positions and {len(eval_env)} A: transitions of {a.eval_games} games "
          f"({meta['stockfish']}, {ann.tag}) in {time.time() - t0:.0f} s")


class _QuietGameBuilder(chess.pgn.GameBuilder):
    def handle_error(self, error):  # kept in game.errors and counted by read_pgn, not logged game by game
        self.game.errors.append(error)


def read_pgn(paths):
    """The games of PGN files as (UCI moves, result), in file order: standard chess from the initial position
    only (a Chess960 game from the standard start is one), as game_transitions expects. -> (games, {why: count}
    of the games skipped: a variant, a set-up start position (puzzles, studies), a move or a game python-chess
    cannot read, a null move, no moves)."""
    games, skipped = [], Counter()
    for path in paths:
        with open(not_a_device(path), "rb", buffering=PGN_SNIFF_BYTES) as raw, \
                io.TextIOWrapper(raw, encoding=pgn_encoding(raw), errors="replace") as f:
            while True:
                try:
                    game = chess.pgn.read_game(f, Visitor=_QuietGameBuilder)
                    if game is None:
                        break
                    why, moves = _skipped_or_moves(game)
                except Exception:  # python-chess fails on some malformed games (IndexError, a bad FEN header)
                    why = "that python-chess cannot read"
                if why:
                    skipped[why] += 1
                else:
                    games.append((moves, game.headers.get("Result", "*")))
    return games, skipped


PGN_SNIFF_BYTES = 1 << 16


def pgn_encoding(raw):
    """The encoding of an open PGN file, from the bytes its buffer holds (peeked: a pipe is read once): UTF-16
    where it opens with its byte-order mark (an export of some Windows programs), else UTF-8 (python-chess drops a
    UTF-8 byte-order mark itself); ValueError for a file that is not text, which would read as one game without
    moves."""
    head = raw.peek(PGN_SNIFF_BYTES)[:PGN_SNIFF_BYTES]
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return "utf-16"
    if b"\0" in head:
        raise ValueError(f"{raw.name} is not a text PGN file (it holds NUL bytes: UTF-16 without its byte-order "
                         "mark, or binary); save the games as UTF-8 PGN text")
    return "utf-8"


STANDARD_NAMES = {name.lower() for name in chess.Board.aliases}  # "Standard", "Normal", "From Position", ...


def _skipped_or_moves(game):
    """(why read_pgn skips a game, None) or (None, its moves in standard UCI). A Chess960 game from the standard
    start position is standard chess (castling included) and is kept, its castling moves rewritten from
    Chess960's king-takes-rook (e1h1) to standard UCI (e1g1); any other Chess960 start is a variant."""
    board = game.board()
    chess960_standard = board.chess960 and type(board) is chess.Board and board.fen() == chess.STARTING_FEN
    if game.headers.get("Variant", "Standard").lower() not in STANDARD_NAMES and not chess960_standard:
        return "of a variant", None
    if board.fen() != chess.STARTING_FEN:
        return "set up from a FEN", None
    if game.errors:
        return "with a move python-chess cannot read", None
    moves = list(game.mainline_moves())
    if not all(moves):  # a null move ("--"), which no position has
        return "with a null move", None
    if not moves:
        return "without moves", None
    ucis = []
    for move in moves:
        ucis.append(board.uci(move, chess960=False))
        board.push(move)
    return None, ucis


def first_games(games, fens):
    """{position_key: index of the first of the games that reaches it} of each of fens' positions: a record of a
    real-game set names its game, so that evaluate.py --compare --by_game resamples whole games (the positions of
    one game are not independent); a position two games share is the first one's."""
    wanted, out = {position_key(fen) for fen in fens}, {}
    placed = {key.split(" ", 1)[0] for key in wanted}
    for g, (moves, _) in enumerate(games):
        for fen in game_fens(moves):
            # position_key builds a board: only for a ply whose placement some record has
            if placement(fen) in placed and (key := position_key(fen)) in wanted:
                out.setdefault(key, g)
    return out


def build_from_pgn(a):
    """--pgn: a held-out set from games the user gives (real games): --eval P: positions drawn over their plies
    and --eval_transitions A: transitions, equal per history bucket, of the moves played, each record with the
    index of its game in read_pgn's order (first_games); nothing excluded, as a real game's opening is also in
    the training games."""
    t0 = time.time()
    try:
        games, skipped = read_pgn(a.pgn)
    except (OSError, ValueError) as e:  # a file that cannot be read, or is not text (its existence was checked)
        sys.exit(f"annotate.py --pgn: {error_sentence(e)}")
    said = "; skipped " + ", ".join(f"{n} {why}" for why, n in skipped.items()) if skipped else ""
    if not games:
        sys.exit(f"annotate.py --pgn: no game of standard chess from the initial position in {', '.join(a.pgn)}{said}")
    positions = game_positions(games, random.Random(f"{a.seed}-pgn-P"), a.eval)
    env = game_env_records(games, random.Random(f"{a.seed}-pgn-A"), per_bucket=a.eval_transitions // len(HISTORY_BUCKETS))
    if len(positions) < a.eval or len(env) < a.eval_transitions:
        print(f"annotate.py: the {len(games)} games hold {len(positions)} of the {a.eval} positions and {len(env)} of "
              f"the {a.eval_transitions} transitions asked; writing those")
    with Annotator(a.stockfish_path, a.depth, a.time, a.workers, a.cache) as ann:
        labels = ann.annotate([fen for fen, _, _ in positions])
        meta = header(ann, a, games=len(games), pgn=[os.path.basename(path) for path in a.pgn])
    game_of = first_games(games, [fen for fen, _, _ in positions] + [fen for fen, _, _ in env])
    write_jsonl(a.eval_path, meta, positions, labels, env, game_of)
    print(f"wrote {len(positions)} P: positions and {len(env)} A: transitions of {len(games)} games to {a.eval_path}"
          f"{said} ({meta['stockfish']}, {ann.tag}) in {time.time() - t0:.0f} s")


def build_mate_pool(a):
    """--mates: a training pool of a.pool mate-in-one positions (P: only, no history), labelled like the rest: so
    that a GRPO run meets mates in every few steps (the generated and realistic pools hold about 2.5% mate
    positions). Disjoint by position from every held-out set, the mate-in-one test set included."""
    t0 = time.time()
    records = build_mates(a.pool, a.seed, exclude=held_out_keys())
    positions = [(r["fen"], [], r["phase"]) for r in records]
    with Annotator(a.stockfish_path, a.depth, a.time, a.workers, a.cache) as ann:
        labels = ann.annotate([fen for fen, _, _ in positions])
        meta = header(ann, a, pool=a.pool, generator="mini.positions.build_mates")
    write_jsonl(a.pool_path, meta, positions, labels)
    print(f"wrote {len(positions)} mate-in-one positions to {a.pool_path} ({meta['stockfish']}, {ann.tag}) "
          f"in {time.time() - t0:.0f} s")


def describe(path):
    """The distributions of a data file, as lines: move number, pieces on the board, phase, the share in check
    and what the king's safety forbids (positions.king_constraint) of its P: positions; history length of its
    A: transitions (the move included)."""
    samples = load_jsonl(path)
    boards = [chess.Board(s.fen) for s in samples if s.task == "P"]
    lines = [f"{path}: {len(boards)} P: positions, {len(samples) - len(boards)} A: transitions"]
    for name, values in (("move number", [b.fullmove_number for b in boards]),
                         ("pieces", [len(b.piece_map()) for b in boards])):
        if values:
            lines.append(f"  {name:12s} p10 / p50 / p90: " + " / ".join(f"{np.percentile(values, q):.0f}" for q in (10, 50, 90)))
    if boards:
        phases = Counter(phase(b) for b in boards)
        lines.append("  phase        " + ", ".join(f"{k} {100 * phases[k] / len(boards):.0f}%"
                                                    for k in ("opening", "middlegame", "endgame")))
        safety = Counter(king_constraint(b) for b in boards)
        lines.append(f"  in check     {100 * safety['check'] / len(boards):.1f}%")
        lines.append("  king safety  " + ", ".join(f"{k} {100 * safety[k] / len(boards):.0f}%"
                                                  for k in KING_CONSTRAINTS))
    env = Counter(history_bucket(len(s.history)) for s in samples if s.task == "A")
    if env:
        lines.append("  A: history   " + ", ".join(f"{k} {100 * v / sum(env.values()):.0f}%" for k, v in sorted(
            env.items(), key=lambda kv: int(kv[0].split("-")[0]))))
    return lines


def king_shares(text):
    """--king_shares "check=0.2,king_square=0.5" as {"check": 0.2, "king_square": 0.5}: known classes, each
    share in [0, 1], their sum at most 1, and 1 when every class is named (the rest goes to the classes not
    named: with none, a pool would come out short)."""
    out = {}
    for part in text.split(","):
        name, _, share = part.partition("=")
        name = name.strip()
        if name not in KING_CONSTRAINTS:
            raise argparse.ArgumentTypeError(f"{name!r} is not a class of positions.king_constraint; "
                                             f"name some of {', '.join(KING_CONSTRAINTS)}, as in check=0.4")
        if name in out:  # silently keeping one of two shares would build a pool the user did not ask for
            raise argparse.ArgumentTypeError(f"{name!r} is named twice in {text!r}; give each class one share")
        try:
            out[name] = float(share)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{part!r} needs a share after '=', as in check=0.4") from None
        if not 0 <= out[name] <= 1:
            raise argparse.ArgumentTypeError(f"{part!r}: a share is between 0 and 1")
    if sum(out.values()) > 1 + 1e-9:
        raise argparse.ArgumentTypeError(f"the shares of {text!r} add up to {sum(out.values()):g}; at most 1")
    if set(out) == set(KING_CONSTRAINTS) and sum(out.values()) < 1 - 1e-9:
        raise argparse.ArgumentTypeError(f"the shares of {text!r} name every class and add up to "
                                         f"{sum(out.values()):g}; with every class named they add up to 1")
    return out


def main(argv=None):
    cfg = Config()
    p = Parser("Annotate generated positions with Stockfish; write the shipped pool and eval set.",
               # checked before any engine starts: else the slices below write other counts, or a build fails late
               checks={"pool": at_least(1), "eval": at_least(0), "transitions": at_least(0), "cut_rate": between(0, 1),
                       "games": at_least(0), "eval_games": at_least(0), "eval_transitions": at_least(0),
                       "workers": at_least(1), "depth": at_least(1), "screen_depth": at_least(1), "time": POSITIVE,
                       "max_eval": at_least(0)})
    p.add_argument("--pool", type=int, default=5000, help="training positions")
    p.add_argument("--eval", type=int, default=500, help="held-out positions, none of them in the pool")
    p.add_argument("--seed", type=int, default=0, help="seed of the position generator")
    p.add_argument("--depth", type=int, default=cfg.stockfish_depth, help="Stockfish depth")
    p.add_argument("--screen_depth", type=int, default=6, help="depth of the quick search that screens positions")
    p.add_argument("--max_eval", type=float, default=4.0, help="beyond this many pawns, keep a position with probability 1/4")
    p.add_argument("--time", type=float, default=None, help="seconds per position instead of a depth")
    p.add_argument("--workers", type=int, default=os.cpu_count(), help="Stockfish processes")
    p.add_argument("--stockfish_path", default=cfg.stockfish_path)
    p.add_argument("--cache", default=DEFAULT_CACHE, help="JSONL cache of analyses ('' for none)")
    p.add_argument("--pool_path", default=None, help=f"default {POOL_PATH}; with --games {GAMES_POOL_PATH}")
    p.add_argument("--eval_path", default=None, help=f"default {EVAL_PATH}; with --games {REAL_EVAL_PATH}")
    p.add_argument("--games", type=int, default=0, help="training games of realistic play (positions.play_game) "
                   "instead of generated positions: the pool's positions and A: transitions come from them")
    p.add_argument("--eval_games", type=int, default=100, help="held-out games (with --games; 0 writes no held-out "
                   "set: a further training pool under another --seed, free of every shipped held-out position)")
    p.add_argument("--eval_transitions", type=int, default=600, help="held-out A: transitions, equal per history bucket "
                   "(with --games or --pgn)")
    p.add_argument("--transitions", type=int, default=0, help="at most this many A: transitions in the pool, drawn "
                   "uniformly (with --games; 0: every one)")
    p.add_argument("--cut_rate", type=float, default=0.25, help="share of the pool's A: transitions whose history is cut "
                   "to a random shorter length, as for a position handed over without its game (with --games)")
    p.add_argument("--king_shares", type=king_shares, default=None, metavar="CLASS=SHARE,...",
                   help="shares of the pool's P: positions drawn by what the king's safety forbids (positions."
                   "king_constraint: check, pin, king_square, unconstrained), the rest among the classes not named, "
                   "e.g. check=0.4 (with --games; default: as they come, 9%% check, 5%% pin, 37%% king_square)")
    p.add_argument("--mates", action=Switch, default=False, help="instead of generated positions: --pool positions with a "
                   "mate in one (positions.build_mates, the generator of the mate-in-one test set, under --seed; none "
                   "held out), a training pool written to --pool_path, which it needs")
    p.add_argument("--pgn", nargs="+", metavar="FILE", help="instead of generated positions: a held-out set (no pool) "
                   f"from the games of these PGN files, --eval positions and --eval_transitions A: transitions, "
                   f"written to --eval_path (default {PGN_EVAL_PATH})")
    p.add_argument("--exclude", nargs="+", metavar="FILE", default=[], help="with --games and --eval_games: data files "
                   "or games files (games-*.jsonl) of earlier training whose positions the held-out set keeps off too, "
                   "so that a set built after its pools is disjoint from them")
    p.add_argument("--describe", nargs="+", metavar="FILE", help="print the distributions of data files and exit")
    a = p.parse_args(argv)
    if a.describe:
        builds = [f"--{k}" for k, v in vars(a).items() if k != "describe" and v != p.get_default(k)]
        if builds:  # else a build asked for beside it would be silently skipped
            p.error(f"--describe only prints the distributions of files: leave out {', '.join(builds)}, or run the "
                    "build alone")
        for path in a.describe:
            try:
                print("\n".join(describe(path)))
            except (OSError, ValueError) as e:  # a missing, unreadable or malformed file
                sys.exit(f"annotate.py --describe: {error_sentence(e)}")
        return
    a.argv = sys.argv[1:] if argv is None else argv
    if a.pgn:
        clash = [f"--{k}" for k in ("games", "mates", "pool", "pool_path") if getattr(a, k) != p.get_default(k)]
        if clash:
            p.error(f"--pgn writes a held-out set of the games given: leave out {', '.join(clash)}")
        for path in a.pgn:
            if not os.path.isfile(path):
                kind = "a folder" if os.path.isdir(path) else "not a regular file" if os.path.exists(path) else "no such file"
                p.error(f"--pgn {path}: {kind}; give PGN files of games")
            for flag, out in (("--eval_path", a.eval_path), ("--cache", a.cache)):  # else the user's games are lost
                if out and os.path.realpath(out) == os.path.realpath(path):
                    p.error(f"{flag} {out} is also a PGN file of --pgn: it would be written over; give it a file of "
                            "its own")
    games_only = [f"--{k}" for k in ("eval_games", "eval_transitions", "transitions", "cut_rate", "king_shares")
                  if getattr(a, k) != p.get_default(k) and not (a.pgn and k == "eval_transitions")]
    if games_only and not a.games:  # --pgn and --mates refuse --games: for them the one way is to leave them out
        p.error(f"{', '.join(games_only)} draw from played games: " + (
            f"--{'pgn' if a.pgn else 'mates'} plays none, leave them out" if a.pgn or a.mates
            else "give --games N too, or leave them out"))
    buckets = len(HISTORY_BUCKETS)
    if (a.games or a.pgn) and a.eval_transitions % buckets:  # drawn equally per bucket: the rest would be dropped
        p.error(f"--eval_transitions {a.eval_transitions} are drawn equally from the {buckets} history-length buckets "
                f"({', '.join(f'{lo}-{hi}' for lo, hi in HISTORY_BUCKETS)} half-moves); give a multiple of {buckets}")
    if a.pgn and a.eval == 0 and a.eval_transitions == 0:
        p.error("--pgn with --eval 0 and --eval_transitions 0 would write a set of nothing; ask for one of them")
    writes_held_out = not a.mates and not a.pgn and (a.eval_games > 0 if a.games else a.eval > 0)
    if a.pool_path and not a.eval_path and writes_held_out:  # a pool sent elsewhere: its held-out set would not be
        p.error(f"--pool_path alone would write the held-out set over the shipped "
                f"{os.path.relpath(REAL_EVAL_PATH if a.games else EVAL_PATH)}; give --eval_path PATH too, or "
                f"{'--eval_games 0' if a.games else '--eval 0'} for a training pool only")
    same = lambda x, y: x and y and os.path.realpath(x) == os.path.realpath(y)
    if writes_held_out and same(a.pool_path, a.eval_path):
        p.error(f"--pool_path and --eval_path are both {a.pool_path}: the pool would be written over the held-out "
                "set; give them two files")
    if any(same(a.cache, path) for path in (a.pool_path, a.eval_path)):
        p.error(f"--cache {a.cache} is also an output of this run; give the analyses' cache a file of its own")
    if a.exclude and not (a.games and a.eval_games):  # else silently unused
        p.error("--exclude keeps a held-out set of played games off earlier training: give it with --games N and "
                "--eval_games N")
    try:  # read before any engine starts: a damaged file costs nothing
        a.excluded = frozenset(excluded_keys(a.exclude))
    except (OSError, ValueError) as e:
        p.error(f"--exclude: {error_sentence(e)}")
    try:  # before any game is played or position screened, so that a missing engine costs nothing
        a.stockfish_path = find_stockfish(a.stockfish_path)
    except FileNotFoundError as e:
        p.error(str(e))
    if a.mates:
        if not a.pool_path or a.games or a.eval != p.get_default("eval") or a.eval_path:  # else silently unused
            p.error("--mates writes a training pool of its own: give it --pool_path PATH (and --pool N), and no "
                    "--games, --eval or --eval_path")
        build = build_mate_pool
    elif a.pgn:
        a.eval_path, build = a.eval_path or PGN_EVAL_PATH, build_from_pgn
    elif a.games:
        a.pool_path, a.eval_path = a.pool_path or GAMES_POOL_PATH, a.eval_path or REAL_EVAL_PATH
        build = build_from_games
    else:
        a.pool_path, a.eval_path = a.pool_path or POOL_PATH, a.eval_path or EVAL_PATH
        build = build_from_generated
    kept = "the analyses done so far are in the --cache file, if one was given, and a rerun with the same flags " \
           "reads them back"
    try:
        build(a)
    except KeyboardInterrupt:  # hours of analyses: those done are kept, one line per position, as they come
        sys.exit(f"annotate.py: interrupted (Ctrl-C) before its files were written; {kept}")
    except OSError as e:  # a full disk as the files are written
        sys.exit(f"annotate.py: {error_sentence(e)}; {kept}")


def build_from_generated(a):
    """The shipped pool and eval set: positions of iter_positions, screened (a lopsided one kept at p=0.25)."""
    t0 = time.time()
    need, source, rng, positions = a.pool + a.eval, iter_positions(a.seed), random.Random(a.seed), []
    with Annotator(a.stockfish_path, a.screen_depth, None, a.workers, a.cache, multipv=1) as screen:
        while len(positions) < need:
            batch = list(itertools.islice(source, min(1000, 2 * (need - len(positions)))))
            quick = screen.annotate([fen for fen, _, _ in batch])
            kept = [p for p in batch if abs(quick[p[0]][1][0]) <= a.max_eval or rng.random() < 0.25]
            positions += kept[:need - len(positions)]
    # the positions are distinct, so the eval set and the pool are disjoint
    with Annotator(a.stockfish_path, a.depth, a.time, a.workers, a.cache) as ann:
        labels = ann.annotate([fen for fen, _, _ in positions])
        meta = header(ann, a, pool=a.pool, eval=a.eval, screen=f"depth={a.screen_depth}, |eval| > {a.max_eval} kept "
                      "with p=0.25", generator="mini.positions.iter_positions")
    if a.eval:  # --eval 0: a training pool only, the shipped held-out set untouched
        write_jsonl(a.eval_path, meta, positions[:a.eval], labels)
    write_jsonl(a.pool_path, meta, positions[a.eval:], labels)
    print(f"wrote {a.pool} pool and {a.eval} eval positions ({meta['stockfish']}, {ann.tag}) in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    run_command(main)
