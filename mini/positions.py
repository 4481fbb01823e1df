"""
A seeded generator of varied, plausible chess positions (openings, middlegames, endgames), and random
A: transitions on them (mostly plausible legal moves, some illegal moves and garbage): the source of
the shipped data (mini/annotate.py), of A: prompts in training, and of fresh positions for the warm start.
"""
import itertools
import random

import chess

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
