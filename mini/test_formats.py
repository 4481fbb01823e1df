"""The RookWorld formats token for token, their parsers, and the python-chess ground truth of A:.

    python mini/test_formats.py
"""
import copy

import chess
import pytest

from mini.formats import (check_policy, checked_board, env_completion, env_prompt, env_sample, illegal_kind, parse_env,
                          parse_line, parse_policy, policy_prompt, policy_sample, position_key, repad)
from mini.tokenizer import Tokenizer

# real lines of the published RookWorld data (the P: ones from the validation file, FEN padded to 89)
P_LINES = [
    "P: 8/5k2/r2p1bp1/P6p/2p5/PR4P1/3B1K1P/8 w - - 0 44                                          M: b3b7 b3b5 b3f3 b3b4 b3b1      E: -1.13 -0.8 -2.33 -2.11 -2.42            B: b3b5",
    "P: 2b3k1/Q4rqn/p2p4/4p3/p6p/2PP3P/BP3PP1/R5K1 b - - 0 34                                    M: a4a3 c8f5 h7f6 h7g5 h7f8      E: -3.06 -2.82 -3.21 -3.16 -2.3            B: h7f6",
    "P: 8/8/R7/7p/P2K2k1/7r/8/8 w - - 0 56                                                       M: a4a5 d4c4 a6g6 a6a8 d4c5      E: 0.0 0.0 0.0 0.0 0.0                     B: d4c5",
]
A_LINES = [
    "A: r1bk3r/2p2ppp/2P1p2N/ppb1P3/8/B2B1N2/PPP2PPP/3RK2R w K - 1 18+a3c5+b7b5 a1d1 g8h6 e4d6 e8e7 d6f5 e7d8 f5h6 f8c5 a3c5+r1bk3r/2p2ppp/2P1p2N/ppB1P3/8/3B1N2/PPP2PPP/3RK2R b K - 0 18+0.001+0+0",
    # a published line whose position has no black king (the generator's pseudo-legal play took it), given one on e8
    "A: 4k3/8/6N1/3B4/7Q/4B2P/Pp3K1P/5R2 b - - 0 48+b2b1n+f7f8 b5b4 f8f7 h5h4 g3f2 b4b3 f7e7 b3b2 e7h4 b2b1n+4k3/8/6N1/3B4/7Q/4B2P/P4K1P/1n3R2 w - - 0 49+0.001+0+0",
]
KINGLESS_A_LINE = A_LINES[1].replace("4k3/", "8/")  # as published: impossible, so never a training prompt
TOK = Tokenizer.gpt2()


def generator_line(s):
    """The P: line exactly as the data generator wrote it (FEN padded to 90)."""
    return "P: " + f"{s.fen:90}" + "M: " + f"{' '.join(s.moves):30}" + "E: " + f"{' '.join(map(str, s.evals)):40}" + "B: " + s.best


def test_formats_lines_parse():
    s = parse_line(P_LINES[1])
    assert (s.task, s.fen, s.best) == ("P", "2b3k1/Q4rqn/p2p4/4p3/p6p/2PP3P/BP3PP1/R5K1 b - - 0 34", "h7f6")
    assert s.moves == ["a4a3", "c8f5", "h7f6", "h7g5", "h7f8"] and s.evals == [-3.06, -2.82, -3.21, -3.16, -2.3]
    assert s.completion.startswith(" M: a4a3") and s.completion.endswith("B: h7f6")
    a = parse_line(A_LINES[1])
    assert (a.task, a.move, a.history[-1], len(a.history)) == ("A", "b2b1n", "b2b1n", 10)
    assert (a.next_fen, a.reward, a.terminated, a.truncated) == ("4k3/8/6N1/3B4/7Q/4B2P/P4K1P/1n3R2 w - - 0 49", 0.001, 0, 0)
    with pytest.raises(ValueError, match="^impossible position '8/8/6N1/3B4/7Q/4B2P/Pp3K1P/5R2 b - - 0 48' .no black king.$"):
        parse_line(KINGLESS_A_LINE)
    assert parse_line(A_LINES[0][3:]).prompt == parse_line(A_LINES[0]).prompt  # hub rows lack the prefix
    for line in A_LINES:  # the A: lines agree with python-chess ground truth
        s = parse_line(line)
        assert s.prompt + s.completion == line
        assert env_completion(s.fen, s.move, s.history) == s.completion


@pytest.mark.parametrize("line", P_LINES + A_LINES)
def test_prompt_completion_tokens(line):
    """The prompt/completion boundary is a token boundary, and a P: completion starts with the token ' M'."""
    s = parse_line(line)
    full = generator_line(s) if s.task == "P" else line
    assert s.prompt + s.completion == full
    assert TOK.encode(s.prompt) + TOK.encode(s.completion) == TOK.encode(full)
    if s.task == "P":
        assert s.prompt == policy_prompt(s.fen) and TOK.encode(s.completion)[0] == TOK.encode(" M")[0]
        assert set(TOK.encode(s.prompt[3 + len(s.fen):])) == {220}  # padding: one token per space
        # the published 89-wide padding splits the same way
        cut = line.index("M:") - 1
        assert TOK.encode(line[:cut]) + TOK.encode(line[cut:]) == TOK.encode(line)
    else:
        assert s.prompt.endswith("+") and s.prompt.count("+") == 3


@pytest.mark.parametrize("line", P_LINES)
def test_policy_sample_writes_the_generators_line(line):
    """A sample built from labels (a .jsonl record, self-play) is written as the generator wrote the data the
    model was pretrained on: FEN padded to 90, M: to 30, E: to 40 columns; at pad 89 it is the published
    validation line itself. Every padding space is a token, so a width off by one shifts the targets."""
    s = parse_line(line)
    built = policy_sample(s.fen, s.moves, s.evals, s.best)
    assert built.prompt + built.completion == generator_line(s)
    assert repad(built, 89).prompt + built.completion == line


def test_env_prompt_history_forms():
    assert env_prompt("8/8/8/8/8/8/8/K1k5 w - - 0 1", "a1a2", "b1b2 a1a2") == env_prompt("8/8/8/8/8/8/8/K1k5 w - - 0 1", "a1a2", ["b1b2", "a1a2"])
    assert env_prompt("F", "e2e4", ["e2e4"]) == "A: F+e2e4+e2e4+"


START = chess.STARTING_FEN
PINNED = "4k3/4r3/8/8/8/8/4B3/4K3 w - - 0 1"  # the bishop on e2 shields its king from the rook
ENV_CASES = [  # (fen, move, expected completion), checked by hand
    # castling both sides, and the rights that go with it
    ("r3k2r/pppppppp/8/8/8/8/PPPPPPPP/R3K2R w KQkq - 0 1", "e1g1", "r3k2r/pppppppp/8/8/8/8/PPPPPPPP/R4RK1 b kq - 1 1+0.001+0+0"),
    ("r3k2r/pppppppp/8/8/8/8/PPPPPPPP/R3K2R b KQkq - 0 1", "e8c8", "2kr3r/pppppppp/8/8/8/8/PPPPPPPP/R3K2R w KQ - 1 2+0.001+0+0"),
    ("r3k2r/8/8/8/8/8/5r2/R3K2R w KQkq - 0 1", "e1c1", "r3k2r/8/8/8/8/8/5r2/2KR3R b kq - 1 1+0.001+0+0"),
    ("r3k2r/8/8/8/8/8/5r2/R3K2R w KQkq - 0 1", "e1g1", "r3k2r/8/8/8/8/8/5r2/R3K2R w KQkq - 0 1+-1.0+0+1"),  # through check
    ("r3k2r/8/8/8/8/8/5r2/R3K2R w KQkq - 0 1", "a1a8", "R3k2r/8/8/8/8/8/5r2/4K2R b Kk - 0 1+0.001+0+0"),  # both a-side rights go
    # a king move takes both of its side's rights, a rook move its own, a capture-promotion on a8 Black's queen side
    ("r3k2r/pppppppp/8/8/8/8/PPPP1PPP/R3K2R w KQkq - 5 9", "e1e2", "r3k2r/pppppppp/8/8/8/8/PPPPKPPP/R6R b kq - 6 9+0.001+0+0"),
    ("r3k2r/pppppppp/8/8/8/8/PPPPPPP1/R3K2R w KQkq - 5 9", "h1h5", "r3k2r/pppppppp/8/7R/8/8/PPPPPPP1/R3K3 b Qkq - 6 9+0.001+0+0"),
    ("r3k2r/1P6/8/8/8/8/8/R3K2R w KQkq - 0 40", "b7a8n", "N3k2r/8/8/8/8/8/8/R3K2R b KQk - 0 40+0.001+0+0"),
    # the halfmove clock counts on after a knight move, restarts after a pawn move
    ("4k3/8/8/8/8/8/4P3/4K1N1 w - - 37 60", "g1f3", "4k3/8/8/8/8/5N2/4P3/4K3 b - - 38 60+0.001+0+0"),
    ("4k3/8/8/8/8/8/4P3/4K1N1 w - - 37 60", "e2e3", "4k3/8/8/8/8/4P3/8/4K1N1 b - - 0 60+0.001+0+0"),
    # en passant square only when a capture is legal; the capture itself
    ("rnbqkbnr/ppp1pppp/8/8/3p4/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", "e2e4", "rnbqkbnr/ppp1pppp/8/8/3pP3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1+0.001+0+0"),
    (START, "e2e4", "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0"),
    # b5xc6 en passant would bare the king on a5 to the rook on h5: a pseudo-legal capture, so no square; without the rook, c6
    ("7k/2p5/8/KP5r/8/8/8/8 b - - 0 1", "c7c5", "7k/8/8/KPp4r/8/8/8/8 w - - 0 2+0.001+0+0"),
    ("7k/2p5/8/KP6/8/8/8/8 b - - 0 1", "c7c5", "7k/8/8/KPp5/8/8/8/8 w - c6 0 2+0.001+0+0"),
    ("rnbqkbnr/ppp1pppp/8/8/3pP3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1", "d4e3", "rnbqkbnr/ppp1pppp/8/8/8/4p3/PPPP1PPP/RNBQKBNR w KQkq - 0 2+0.001+0+0"),
    # promotion, under-promotion (a lone knight is a draw by insufficient material), promotion piece missing
    ("8/P6k/8/8/8/8/8/K7 w - - 0 1", "a7a8q", "Q7/7k/8/8/8/8/8/K7 b - - 0 1+0.001+0+0"),
    ("8/P6k/8/8/8/8/8/K7 w - - 0 1", "a7a8r", "R7/7k/8/8/8/8/8/K7 b - - 0 1+0.001+0+0"),
    ("8/P6k/8/8/8/8/8/K7 w - - 0 1", "a7a8n", "N7/7k/8/8/8/8/8/K7 b - - 0 1+0.5+1+0"),
    ("8/P6k/8/8/8/8/8/K7 w - - 0 1", "a7a8", "8/P6k/8/8/8/8/8/K7 w - - 0 1+-1.0+0+1"),
    # game ends: mate, stalemate, insufficient material, 75-move rule (and one move before it)
    ("rnbqkbnr/pppp1ppp/8/4p3/6P1/5P2/PPPPP2P/RNBQKBNR b KQkq - 0 2", "d8h4", "rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3+1.0+1+0"),
    ("7k/8/8/6Q1/8/8/8/K7 w - - 0 1", "g5g6", "7k/8/6Q1/8/8/8/8/K7 b - - 1 1+0.5+1+0"),
    ("8/8/8/5r2/8/3B4/8/K5k1 w - - 0 1", "d3f5", "8/8/8/5B2/8/8/8/K5k1 b - - 0 1+0.5+1+0"),
    ("8/8/8/8/8/2k5/8/K6R w - - 149 100", "h1h2", "8/8/8/8/8/2k5/7R/K7 b - - 150 100+0.5+1+0"),
    ("8/8/8/8/8/2k5/8/K6R w - - 148 100", "h1h2", "8/8/8/8/8/2k5/7R/K7 b - - 149 100+0.001+0+0"),
    # illegal (blocked king, pinned piece) and unparsable moves: state unchanged, truncated
    (START, "e1e2", START + "+-1.0+0+1"),
    (PINNED, "e2d3", PINNED + "+-1.0+0+1"),
    (START, "e9e4", START + "+-1.0+0+1"),
    (START, "0000", START + "+-1.0+0+1"),
    (START, "Nf3", START + "+-1.0+0+1"),
    (START, "", START + "+-1.0+0+1"),
    # the state left unchanged is the FEN as given, here with an en passant square no pawn can take on, which
    # python-chess would not write: a real game's FEN as other tools write it after every double step
    ("rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1", "e2e4",
     "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1+-1.0+0+1"),
    # castling written king-takes-rook: python-chess's legal_moves accepts it, the one rule (legal_ucis) does not
    ("r3k2r/pppppppp/8/8/8/8/PPPPPPPP/R3K2R w KQkq - 0 1", "e1h1", "r3k2r/pppppppp/8/8/8/8/PPPPPPPP/R3K2R w KQkq - 0 1+-1.0+0+1"),
    ("r3k2r/pppppppp/8/8/8/8/PPPPPPPP/R3K2R b KQkq - 0 1", "e8a8", "r3k2r/pppppppp/8/8/8/8/PPPPPPPP/R3K2R b KQkq - 0 1+-1.0+0+1"),
]


@pytest.mark.parametrize("fen,move,expected", ENV_CASES)
def test_env_ground_truth(fen, move, expected):
    assert env_completion(fen, move, [move]) == expected
    next_fen, truncated = expected.split("+")[0], expected.endswith("+1")
    if not truncated:  # shows_held_out keys a legal move's next FEN by its fields, without a board
        assert position_key(next_fen) == " ".join(next_fen.split()[:4])


def test_a_threefold_repetition_in_the_history_is_a_plain_move():
    """The ground truth is board.outcome() without claims: the knights out and back twice bring the start position a
    third time, which the side to move may claim (python-chess, replaying the game, agrees) but which does not end
    the game; 0.001, not terminated."""
    shuffle = ["g1f3", "g8f6", "f3g1", "f6g8"] * 2
    game = chess.Board()
    for move in shuffle[:-1]:
        game.push_uci(move)
    fen = game.fen()
    game.push_uci(shuffle[-1])
    assert game.can_claim_threefold_repetition() and game.outcome() is None
    assert env_completion(fen, shuffle[-1], shuffle) == START.replace(" 0 1", " 8 5") + "+0.001+0+0"


@pytest.mark.parametrize("fen,move,expected", [
    (START, "e2e4", None), (START, "e9e4", None), (START, "0000", None), (START, "Nf3", None),  # legal, not UCI
    (START, "e3e4", "from"), (START, "e7e5", "from"),  # an empty square, the opponent's pawn
    (START, "e2e5", "geometry"), (START, "g1g3", "geometry"), (START, "d1d3", "geometry"),  # pattern, blocked
    (START, "b1d2", "geometry"), (START, "e1g1", "geometry"),  # onto an own pawn, castling through pieces
    (PINNED, "e2d3", "check"), ("4k3/8/8/8/8/8/r7/4K3 w - - 0 1", "e1e2", "check"),  # a pin, into check
    (PINNED, "e1e2", "geometry"), ("4k3/8/8/8/8/8/5r2/4K2R w K - 0 1", "e1g1", "geometry"),  # across f1
    (START, "a1a1", "geometry"), (START, "e4e4", "from"), (START, "a8a8", "from"),  # onto its own square
    ("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1", "e1h1", "geometry"),  # castling written king-takes-rook
    ("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1", "e1a1", "geometry"),
])
def test_illegal_kind(fen, move, expected):
    assert illegal_kind(fen, move) == expected



def test_an_a_completion_may_space_its_fields():
    """parse_env reads fields with spaces around them, as a model may write them; the FEN stays text."""
    fen = "8/8/8/8/8/2k5/7R/K7 b - - 1 100"
    assert parse_env(f" {fen} + 0.001 +0+ 0 ") == (fen, 0.001, 0, 0) == parse_env(f"{fen}+1e-3+0+0")


def test_parse_policy_takes_only_uci_moves():
    """A move is UCI as python-chess writes it: a promotion to a king (e7e8k), an upper-case piece (e7e8Q) or a move
    with text glued to it (b3b5!) makes the answer unparseable, in M: as in B:; an underpromotion (e7e8n) is a move."""
    assert parse_policy(" M: e7e8n e7e8q E: 2.5 9.1 B: e7e8n") == (["e7e8n", "e7e8q"], [2.5, 9.1], "e7e8n")
    for bad in ("e7e8k", "e7e8Q", "b3b5!", "b3b5q5"):
        with pytest.raises(ValueError, match="^M: needs 1 to 5 UCI moves$"):
            parse_policy(f" M: {bad} E: 0.0 B: b3b5")
        with pytest.raises(ValueError, match="^B: needs exactly one UCI move$"):
            parse_policy(f" M: b3b5 E: 0.0 B: {bad}")


def test_a_p_lines_labels_are_checked_against_its_position():
    """A P: text line is checked as a .jsonl record is: a B: move that is not among its M: moves (a label the reward
    could not rank) or an M: move illegal in its position (b3a3: the rook onto its own pawn) makes a bad line."""
    fen = parse_line(P_LINES[0]).fen
    with pytest.raises(ValueError, match="^B: move d2e3 is not among the M: moves$"):
        parse_line(f"P: {fen} M: b3b5 b3b7 E: -0.8 -1.13 B: d2e3")
    with pytest.raises(ValueError, match="^move b3a3 is illegal in the position$"):
        parse_line(f"P: {fen} M: b3b5 b3a3 E: -0.8 0.0 B: b3b5")


def test_a_line_is_read_without_its_line_end_or_indent():
    """Data files hand parse_line their lines with the line end (\\n or \\r\\n), maybe indented: the sample is
    the line's own, its completion without the line end (which would become a training target)."""
    for line in (P_LINES[0], A_LINES[0]):
        completion = line[line.index(" M:"):] if line.startswith("P:") else line.split("+", 3)[3]
        for raw in (line + "\n", "  " + line + "\r\n"):
            assert parse_line(raw) == parse_line(line) and parse_line(raw).completion == completion


def test_a_p_lines_completion_is_its_own_text():
    """A P: line's reference completion is the line's text from M: on, as written (compact, an eval written 0), not
    rewritten to the generator's widths; its labels are read from that text."""
    fen = parse_line(P_LINES[0]).fen
    s = parse_line(f"P: {fen} M: b3b5 b3b7 E: -0.8 0 B: b3b5")
    assert s.completion == " M: b3b5 b3b7 E: -0.8 0 B: b3b5"
    assert (s.moves, s.evals, s.best) == (["b3b5", "b3b7"], [-0.8, 0.0], "b3b5")


def test_an_a_line_is_labelled_by_python_chess():
    """The original generator pushed pseudo-legal moves unchecked: its label for a pinned bishop's move is a
    moved bishop; python-chess's is the position unchanged, reward -1, truncated."""
    pushed = "4k3/4r3/8/8/8/3B4/8/4K3 b - - 1 1+0.001+0+0"
    s = parse_line(f"A: {PINNED}+e2d3+e2d3+{pushed}")
    assert (s.completion, s.next_fen, s.reward, s.terminated, s.truncated, s.relabelled) == (
        f"{PINNED}+-1.0+0+1", PINNED, -1.0, 0, 1, True)
    assert not any(parse_line(line).relabelled for line in A_LINES)  # lines python-chess agrees with


def test_an_a_lines_history_ends_with_its_move():
    """The format's last history entry is the move judged (as for an A: record of a .jsonl file): a line whose
    history is empty or ends otherwise is a bad line; a line with no move needs none."""
    fen, after = chess.STARTING_FEN, "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1"
    for history, last in (("", "nothing"), ("d2d4", "d2d4"), ("e2e4 d2d4", "d2d4")):
        with pytest.raises(ValueError, match=f"^an A: line's history ends with its move 'e2e4' .the format's last "
                                             f"entry., not '{last}'$"):
            parse_line(f"A: {fen}+e2e4+{history}+{after}+0.001+0+0")
    assert parse_line(f"A: {fen}+e2e4+d2d4 e2e4+{after}+0.001+0+0").history == ["d2d4", "e2e4"]
    assert parse_line(f"A: {fen}++e2e4 +{fen}+-1.0+0+1").truncated == 1  # a garbled move: empty


def test_an_a_lines_played_history_is_uci_and_its_garbled_move_short():
    """As for an A: record of a .jsonl file: the moves that led to the position are UCI moves (a prompt prints them),
    and a garbled move judged is at most 10 characters, where 4,000 made a prompt past the model's context."""
    fen, after = chess.STARTING_FEN, "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1"
    with pytest.raises(ValueError, match="^history move 'zz' is not a UCI move"):
        parse_line(f"A: {fen}+e2e4+zz e2e4+{after}+0.001+0+0")
    with pytest.raises(ValueError, match="^an A: move is one word .or none. of at most 10 characters"):
        parse_line(f"A: {fen}+resign_now+g1f3 resign_now+{fen}+-1.0+0+1".replace("resign_now", "resign_now!"))
    assert parse_line(f"A: {fen}+resign_now+g1f3 resign_now+{fen}+-1.0+0+1").truncated == 1  # 10: garbled, judged


def test_a_position_without_its_move_counters_is_a_bad_line_not_an_unscorable_label():
    """python-chess reads a 4-field FEN, and an illegal move's next state is the FEN itself: a label the scorer
    refuses, so that even the true completion would score as invalid. A P: position becomes an A: one too."""
    four = "7k/8/6K1/8/8/8/8/5R2 w - -"
    for line in (f"A: {four}+f1f1+f1f1+{four}+-1.0+0+1", f"A: {four}+f1f2+f1f2+7k/8/6K1/8/8/8/5R2/8 b - - 1 1+0.001+0+0",
                 f"P: {four} M: f1f8 E: 999.99 B: f1f8"):
        with pytest.raises(ValueError, match="6 fields"):
            parse_line(line)
    s = parse_line(f"A: {four} 0 1+f1f1+f1f1+{four} 0 1+-1.0+0+1")  # with them it is a line like any other
    assert (s.next_fen, s.reward, s.truncated) == (f"{four} 0 1", -1.0, 1)


def test_position_key_writes_en_passant_as_python_chess_does():
    # after 1. e4 e5 standard FEN names e6, but no white pawn can take there: the same position as with '-'
    assert position_key("rnbqkbnr/pppp1ppp/8/4p3/4P3/8/PPPP1PPP/RNBQKBNR w KQkq e6 0 2") == \
        "rnbqkbnr/pppp1ppp/8/4p3/4P3/8/PPPP1PPP/RNBQKBNR w KQkq -"
    # a capture there is legal (e5xf6): the square is part of the position
    assert position_key("rnbqkbnr/ppppp1pp/8/4Pp2/8/8/PPPP1PPP/RNBQKBNR w KQkq f6 0 3") == \
        "rnbqkbnr/ppppp1pp/8/4Pp2/8/8/PPPP1PPP/RNBQKBNR w KQkq f6"
    # a capture there is pseudo-legal only (b5xc6 would bare the king on a5 to the rook): not part of the position
    assert position_key("7k/8/8/KPp4r/8/8/8/8 w - c6 0 2") == "7k/8/8/KPp4r/8/8/8/8 w - -"


def test_repad_leaves_an_a_sample_as_it_is():
    """Only a P: prompt pads its FEN: an A: prompt is the FEN and its '+' fields, whatever the width asked."""
    a = parse_line(A_LINES[0])
    assert repad(a, 89) == a and repad(a, 89).prompt == A_LINES[0][:A_LINES[0].index("+r1bk3r")] + "+"


def test_a_move_or_history_word_with_a_tab_or_newline_is_refused():
    """Any whitespace, not only a space, would split an A: prompt's move or history word in two."""
    for move in ("e2e4\t", "e2\ne4"):
        with pytest.raises(ValueError, match="^an A: move is one word"):
            env_sample(START, move, [move])
    with pytest.raises(ValueError, match="^a history is a list of UCI moves or one string of them"):
        env_sample(START, "e2e4", ["g1f3\tf3g1", "e2e4"])


def test_parse_policy_reads_a_compact_answer():
    """The markers need no space after them: 'M:e2e4 d2d4 E:0.3 -0.2 B:e2e4' is the answer written spaced."""
    assert parse_policy("M:e2e4 d2d4 E:0.3 -0.2 B:e2e4") == (["e2e4", "d2d4"], [0.3, -0.2], "e2e4")


def test_parse_env_gives_terminated_then_truncated():
    """A mate is terminated and not truncated, an illegal move the reverse: the flags keep their places."""
    fen = "rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3"
    assert parse_env(f"{fen}+1.0+1+0") == (fen, 1.0, 1, 0) and parse_env(f"{fen}+-1.0+0+1") == (fen, -1.0, 0, 1)


def test_values_that_are_no_move_fen_or_eval_are_one_sentence():
    """A JSON record's null move or FEN, or an eval of 400 digits (JSON integers have no limit), is a ValueError
    that says so, not a TypeError, AttributeError or OverflowError from deep inside."""
    with pytest.raises(ValueError, match="^an A: move is one word .* not None$"):
        env_sample(START, None, ["e2e4"])
    with pytest.raises(ValueError, match="^the FEN is NoneType None, not a string$"):
        checked_board(None)
    with pytest.raises(ValueError, match="hold an integer too large for a number$"):
        policy_sample(START, ["e2e4"], [10**400])


def test_an_a_line_wrong_in_its_truncated_flag_alone_is_relabelled():
    """relabelled compares all four fields of the line's label: a legal move flagged truncated is corrected."""
    after = "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1"
    assert [parse_line(f"A: {START}+e2e4+e2e4+{after}+0.001+0+{flag}").relabelled for flag in (1, 0)] == [True, False]


def test_a_label_of_six_moves_or_of_more_evals_than_moves_is_refused():
    """A JSONL record's label is checked as a text line's: Stockfish's MultiPV gives 1 to 5 moves, one eval each."""
    six = ["e2e4", "d2d4", "g1f3", "b1c3", "c2c4", "a2a3"]
    with pytest.raises(ValueError, match="^needs a list of 1 to 5 moves$"):
        check_policy(START, six, [0.0] * 6)
    check_policy(START, six[:5], [0.0] * 5)
    with pytest.raises(ValueError, match=r"^1 moves need 1 evals, got \[0.1, 0.2\]$"):
        check_policy(START, ["e2e4"], [0.1, 0.2])


def test_a_samples_game_survives_repad_and_copies_and_is_not_its_content():
    """The game a real-game sample comes from (annotate.py --pgn) is kept by repad and copy.copy (load_jsonl's copies
    of a shipped file's samples), and left out of equality, as relabelled is: the same position from another game is
    the same sample."""
    p = policy_sample(START, ["e2e4"], [0.3])
    p.game = 4
    assert repad(p, 89).game == copy.copy(p).game == 4 and repad(p, 89).prompt != p.prompt
    a = parse_line(A_LINES[0])
    a.game = 0
    assert repad(a, 89).game == copy.copy(a).game == 0
    assert p == policy_sample(START, ["e2e4"], [0.3]) and policy_sample(START, ["e2e4"], [0.3]).game is None


if __name__ == "__main__":
    import sys
    sys.exit(pytest.main([__file__, "-q"]))
