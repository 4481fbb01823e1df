"""
A seeded generator of varied, plausible chess positions (openings, middlegames, endgames), and random
A: transitions on them (mostly plausible legal moves, some illegal moves and garbage): the source of
the shipped data (mini/annotate.py), of A: prompts in training, and of fresh positions for the warm start.
"""
import itertools
import math
import random

import chess
import chess.engine
from tqdm.auto import tqdm

from mini.formats import env_sample, position_key


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


def random_env_sample(fen, history, rng, illegal_rate=0.05, garbage_rate=0.02, move=None):
    """A: sample on a position: `move` (the move a game played) or, when None, a plausible legal move
    (game-ending ones favoured, they are rare); sometimes an illegal move or a string that is no UCI move."""
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
    elif move is None:
        ending = [m for m in legal if _ends(board, m)]
        move = (rng.choice(ending) if ending and rng.random() < 0.5
                else rng.choices(legal, [_weight(board, m, 0.5) for m in legal])[0]).uci()
    return env_sample(fen, move, (list(history) + [move])[-10:])


def _ends(board, move):
    board.push(move)
    over = board.is_game_over()
    board.pop()
    return over


# ----------------------------------------------------------------------------- realistic games

MATE_SCORE = 100000  # centipawns of a mate when softmaxing engine scores
RESIGN_CP, RESIGN_PLIES = 900, 4  # a game this lopsided for this many plies in a row ends (resignation)
DRAW_CP, DRAW_PLIES, DRAW_FROM = 30, 20, 120  # a level game this long after ply DRAW_FROM is agreed drawn
MAX_PLIES = 300


def game_style(rng):
    """One side's strength, drawn per game so that games range from club blunders to solid play: Stockfish's
    node budget, the temperature (centipawns) of the softmax over its MultiPV scores, and how often the side
    plays a merely plausible move instead (a blunder, more often than not)."""
    return {"nodes": rng.choice((100, 300, 1000)), "temperature_cp": math.exp(rng.uniform(math.log(10), math.log(150))),
            "blunder_rate": rng.uniform(0.0, 0.08)}


def engine_move(engine, board, rng, nodes, temperature_cp, multipv=5):
    """(move, the best score in centipawns for the side to move): a move sampled from a softmax over Stockfish's
    MultiPV scores at temperature_cp. One thread and a new game per search (hash cleared) keep it a function of
    the position, the settings and rng."""
    infos = [i for i in engine.analyse(board, chess.engine.Limit(nodes=nodes), multipv=multipv, game=object())
             if i.get("pv")]
    cps = [i["score"].relative.score(mate_score=MATE_SCORE) for i in infos]
    best = max(cps)  # at a few hundred nodes the MultiPV lines are not always in score order
    weights = [math.exp(max(-60.0, (c - best) / temperature_cp)) for c in cps]
    return rng.choices([i["pv"][0] for i in infos], weights)[0], best


def play_game(engine, rng):
    """A game from the initial position, Stockfish at low strength playing both sides (game_style each): a few
    plausible random opening plies for variety, then engine moves; it ends by the rules (mate, stalemate,
    insufficient material, a claimable repetition or 50-move draw), by resignation (the best score at least
    RESIGN_CP either way for RESIGN_PLIES plies in a row, whichever side is to move, since only the moves are
    kept; half the games play on to the end), by an agreed draw in a long level game, or at MAX_PLIES.
    -> (UCI moves, how it ended)."""
    board, styles = chess.Board(), {chess.WHITE: game_style(rng), chess.BLACK: game_style(rng)}
    resigns, lost, level = rng.random() < 0.5, 0, 0
    for _ in range(rng.randint(0, 4)):
        play(board, rng)
    while True:
        outcome = board.outcome(claim_draw=True)
        if outcome:
            return [m.uci() for m in board.move_stack], outcome.termination.name.lower()
        if board.ply() >= MAX_PLIES:
            return [m.uci() for m in board.move_stack], "max_plies"
        style = styles[board.turn]
        if rng.random() < style["blunder_rate"]:
            play(board, rng)
            continue
        move, best_cp = engine_move(engine, board, rng, style["nodes"], style["temperature_cp"])
        lost = lost + 1 if abs(best_cp) >= RESIGN_CP else 0
        level = level + 1 if abs(best_cp) <= DRAW_CP and board.ply() >= DRAW_FROM else 0
        if resigns and lost >= RESIGN_PLIES:
            return [m.uci() for m in board.move_stack], "resignation"
        if level >= DRAW_PLIES:
            return [m.uci() for m in board.move_stack], "agreed_draw"
        board.push(move)


def game_transitions(moves):
    """(fen, history, played move) before every move of a game from the initial position: history is the last
    up to 9 half-moves that led to the position, so short at the start of a game, as in real data."""
    board = chess.Board()
    for move in moves:
        yield board.fen(), [m.uci() for m in board.move_stack[-9:]], move
        board.push_uci(move)


def game_fens(moves):
    """Every position of a game from the initial position, the last (after the final move) included."""
    board = chess.Board()
    yield board.fen()
    for move in moves:
        board.push_uci(move)
        yield board.fen()


def phase(board):
    """opening (the first 16 plies), endgame (fewer than 14 pieces) or middlegame."""
    return "opening" if board.ply() <= 16 else "middlegame" if len(board.piece_map()) >= 14 else "endgame"


KING_CONSTRAINTS = ("check", "pin", "king_square", "unconstrained")  # king_constraint's classes, most forbidding first


def king_constraint(board):
    """What the safety of the side to move's king forbids: "check" (it is in check), "pin" (a move of another
    piece that would expose it), "king_square" (only king steps onto attacked squares) or "unconstrained"
    (every pseudo-legal move is legal; python-chess's pseudo-legal moves never castle through an attacked
    square, so a position where only that is forbidden is unconstrained). The policy's illegal answers gather
    in the first three."""
    if board.is_check():
        return "check"
    forbidden = [m for m in board.pseudo_legal_moves if not board.is_legal(m)]
    if any(m.from_square != board.king(board.turn) for m in forbidden):
        return "pin"
    return "king_square" if forbidden else "unconstrained"


def mating_moves(board):
    """Every move that checkmates, sorted UCI."""
    out = []
    for m in board.legal_moves:
        if board.gives_check(m):  # cheap filter: a mate is a check
            board.push(m)
            if board.is_checkmate():
                out.append(m.uci())
            board.pop()
    return sorted(out)


def build_mates(n, seed=0, max_plies=200, per_game=2, exclude=()):
    """n distinct positions (by position_key, none in exclude) with a mate in one: plausible random games
    (positions.play, capture bias drawn per game so that some games thin out into endgames) are played to
    their end or max_plies, and up to per_game of each game's mate-in-one positions are kept, drawn at random,
    so that no single game dominates."""
    rng, seen, out = random.Random(seed), set(exclude), []
    with tqdm(total=n, desc="mate-in-one positions") as bar:
        while len(out) < n:
            board, bias, found = chess.Board(), rng.choice([0.5, 1.0, 3.0]), []
            while not board.is_game_over() and board.ply() < max_plies:
                mates = mating_moves(board)
                if mates and position_key(board.fen()) not in seen:
                    found.append({"fen": board.fen(), "mates": mates, "phase": phase(board)})
                play(board, rng, bias)
            for r in rng.sample(found, min(per_game, len(found))):
                if len(out) < n and position_key(r["fen"]) not in seen:
                    seen.add(position_key(r["fen"]))
                    out.append(r)
                    bar.update()
    return out


HISTORY_BUCKETS = ((1, 2), (3, 5), (6, 10))  # A: history lengths, the move included (evaluate.py reports each)


def history_bucket(n):
    """'1-2', '3-5' or '6-10': the HISTORY_BUCKETS bucket of an A: history length (str(n) outside them)."""
    return next((f"{lo}-{hi}" for lo, hi in HISTORY_BUCKETS if lo <= n <= hi), str(n))
