"""Formats, parsing, python-chess ground truth, position sources and the shipped data."""
import collections
import json
import random

import chess
import pytest

from mini.dataset import (EVAL_PATH, POOL_PATH, ReplayBuffer, TaskSampler, env_completion, env_prompt, generate_positions,
                          legal_ucis, load_jsonl, load_text, parse_line, policy_prompt, position_key, random_env_sample)
from mini.tokenizer import Tokenizer

# the real lines quoted in FORMATS.md (the P: ones from the validation file, FEN padded to 89)
P_LINES = [
    "P: 8/5k2/r2p1bp1/P6p/2p5/PR4P1/3B1K1P/8 w - - 0 44                                          M: b3b7 b3b5 b3f3 b3b4 b3b1      E: -1.13 -0.8 -2.33 -2.11 -2.42            B: b3b5",
    "P: 2b3k1/Q4rqn/p2p4/4p3/p6p/2PP3P/BP3PP1/R5K1 b - - 0 34                                    M: a4a3 c8f5 h7f6 h7g5 h7f8      E: -3.06 -2.82 -3.21 -3.16 -2.3            B: h7f6",
    "P: 8/8/R7/7p/P2K2k1/7r/8/8 w - - 0 56                                                       M: a4a5 d4c4 a6g6 a6a8 d4c5      E: 0.0 0.0 0.0 0.0 0.0                     B: d4c5",
]
A_LINES = [
    "A: r1bk3r/2p2ppp/2P1p2N/ppb1P3/8/B2B1N2/PPP2PPP/3RK2R w K - 1 18+a3c5+b7b5 a1d1 g8h6 e4d6 e8e7 d6f5 e7d8 f5h6 f8c5 a3c5+r1bk3r/2p2ppp/2P1p2N/ppB1P3/8/3B1N2/PPP2PPP/3RK2R b K - 0 18+0.001+0+0",
    "A: 8/8/6N1/3B4/7Q/4B2P/Pp3K1P/5R2 b - - 0 48+b2b1n+f7f8 b5b4 f8f7 h5h4 g3f2 b4b3 f7e7 b3b2 e7h4 b2b1n+8/8/6N1/3B4/7Q/4B2P/P4K1P/1n3R2 w - - 0 49+0.001+0+0",
]
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
    assert (a.next_fen, a.reward, a.terminated, a.truncated) == ("8/8/6N1/3B4/7Q/4B2P/P4K1P/1n3R2 w - - 0 49", 0.001, 0, 0)
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


def test_env_prompt_history_forms():
    assert env_prompt("8/8/8/8/8/8/8/K1k5 w - - 0 1", "a1a2", "b1b2 a1a2") == env_prompt("8/8/8/8/8/8/8/K1k5 w - - 0 1", "a1a2", ["b1b2", "a1a2"])
    assert env_prompt("F", "e2e4", ["e2e4"]) == "A: F+e2e4+e2e4+"


START = chess.STARTING_FEN
ENV_CASES = [  # (fen, move, expected completion), checked by hand
    # castling both sides, and the rights that go with it
    ("r3k2r/pppppppp/8/8/8/8/PPPPPPPP/R3K2R w KQkq - 0 1", "e1g1", "r3k2r/pppppppp/8/8/8/8/PPPPPPPP/R4RK1 b kq - 1 1+0.001+0+0"),
    ("r3k2r/pppppppp/8/8/8/8/PPPPPPPP/R3K2R b KQkq - 0 1", "e8c8", "2kr3r/pppppppp/8/8/8/8/PPPPPPPP/R3K2R w KQ - 1 2+0.001+0+0"),
    ("r3k2r/8/8/8/8/8/5r2/R3K2R w KQkq - 0 1", "e1c1", "r3k2r/8/8/8/8/8/5r2/2KR3R b kq - 1 1+0.001+0+0"),
    ("r3k2r/8/8/8/8/8/5r2/R3K2R w KQkq - 0 1", "e1g1", "r3k2r/8/8/8/8/8/5r2/R3K2R w KQkq - 0 1+-1.0+0+1"),  # through check
    ("r3k2r/8/8/8/8/8/5r2/R3K2R w KQkq - 0 1", "a1a8", "R3k2r/8/8/8/8/8/5r2/4K2R b Kk - 0 1+0.001+0+0"),  # both a-side rights go
    # en passant square only when a capture is legal; the capture itself
    ("rnbqkbnr/ppp1pppp/8/8/3p4/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", "e2e4", "rnbqkbnr/ppp1pppp/8/8/3pP3/8/PPPP1PPP/RNBQKBNR b KQkq e3 0 1+0.001+0+0"),
    (START, "e2e4", "rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1+0.001+0+0"),
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
    ("4k3/4r3/8/8/8/8/4B3/4K3 w - - 0 1", "e2d3", "4k3/4r3/8/8/8/8/4B3/4K3 w - - 0 1+-1.0+0+1"),
    (START, "e9e4", START + "+-1.0+0+1"),
    (START, "0000", START + "+-1.0+0+1"),
    (START, "Nf3", START + "+-1.0+0+1"),
    (START, "", START + "+-1.0+0+1"),
]


@pytest.mark.parametrize("fen,move,expected", ENV_CASES)
def test_env_ground_truth(fen, move, expected):
    assert env_completion(fen, move, [move]) == expected


def test_malformed_lines_say_what_is_wrong(tmp_path):
    bad = {
        "P: 8/8/8 w - - 0 1 M: a1a2 E: 0.1 B: a1a2": "FEN",
        P_LINES[0].replace("E: -1.13 ", "E: "): "5 moves but 4 evals",
        P_LINES[0].replace("-0.8", "x"): "not a number",
        P_LINES[0].replace("b3b7", "b3a3"): "b3a3 is illegal",
        P_LINES[0].replace("B: b3b5", "B: b3b2"): "not among",
        A_LINES[0].replace("+0.001", ""): r"7 .\+. fields \(got 6\)",
        A_LINES[0].replace("+0+0", "+0+2"): "0 or 1",
        "hello": "neither",
    }
    for line, what in bad.items():
        with pytest.raises(ValueError, match=what):
            parse_line(line)
    path = tmp_path / "data.txt"
    path.write_text("\n".join([P_LINES[0], "junk", A_LINES[0], "", P_LINES[0][:50]]) + "\n")
    samples, skipped = load_text(str(path), skip_bad_lines=True)
    assert [s.task for s in samples] == ["P", "A"] and skipped == 2
    with pytest.raises(ValueError, match=rf"^{path}:2: "):
        load_text(str(path), skip_bad_lines=False)


def phase_of(board):
    """Independent of how the generator labels them: pieces for endgames, move number for openings."""
    if len(board.piece_map()) < 14:
        return "endgame"
    return "opening" if board.fullmove_number <= 9 else "middlegame"


def test_generator_reproducible_legal_and_mixed():
    positions = generate_positions(200, seed=1)
    assert positions == generate_positions(200, seed=1)
    assert positions[:20] != generate_positions(20, seed=2)
    assert len({position_key(f) for f, _, _ in positions}) == 200
    mix = collections.Counter()
    for fen, history, phase in positions:
        board = chess.Board(fen)
        assert board.is_valid() and not board.is_game_over() and fen == board.fen()
        assert phase_of(board) == phase and 1 <= len(history) <= 9
        mix[phase] += 1
    assert abs(mix["opening"] / 200 - 0.2) < 0.08 and abs(mix["middlegame"] / 200 - 0.6) < 0.08 and abs(mix["endgame"] / 200 - 0.2) < 0.08


def test_env_samples_from_positions():
    rng = random.Random(0)
    samples = [random_env_sample(fen, h, rng) for fen, h, _ in generate_positions(200, seed=3)]
    truncated = sum(s.truncated for s in samples)
    assert 2 <= truncated <= 30  # ~7% illegal or unparsable
    for s in samples:
        assert s.history[-1] == s.move and len(s.history) <= 10
        assert s.completion == env_completion(s.fen, s.move, s.history)
        assert s.truncated == (s.move not in legal_ucis(s.fen))


def test_replay_buffer():
    buf = ReplayBuffer(capacity=3, seed=0)
    buf.add(START, ["e2e4"])
    buf.add(START.replace(" 0 1", " 4 9"))  # same position, other counters: a duplicate
    buf.add("7k/8/6Q1/8/8/8/8/K7 b - - 1 1")  # stalemate: over, not kept
    buf.add("not a fen")
    assert len(buf) == 1
    fens = [f for f, _, _ in generate_positions(5, seed=4)]
    for fen in fens:
        buf.add(fen)
    assert len(buf) == 3 and {f for f, _ in buf.items.values()} == set(fens[2:])  # oldest out first
    again = ReplayBuffer(capacity=3, seed=0)
    for fen in fens:
        again.add(fen)
    assert buf.sample(2) == again.sample(2)
    nxt = ReplayBuffer()
    nxt.add_next(parse_line(P_LINES[0]))  # after b3b5
    nxt.add_next(parse_line(A_LINES[0]))  # after a3c5
    nxt.add_next(parse_line(A_LINES[0].replace("+0.001+0+0", "+0.001+0+1")))  # truncated: nothing new
    assert [f for f, _ in nxt.items.values()] == ["8/5k2/r2p1bp1/PR5p/2p5/P5P1/3B1K1P/8 b - - 1 44",
                                                  "r1bk3r/2p2ppp/2P1p2N/ppB1P3/8/3B1N2/PPP2PPP/3RK2R b K - 0 18"]
    assert list(nxt.items.values())[1][1][-1] == "a3c5"


def test_shipped_pool_and_eval():
    pool, held_out = load_jsonl(POOL_PATH), load_jsonl(EVAL_PATH)
    assert len(pool) >= 5000 and len(held_out) == 500
    assert not {position_key(s.fen) for s in pool} & {position_key(s.fen) for s in held_out}
    for s in pool + held_out:
        assert 1 <= len(s.moves) <= 5 and len(s.evals) == len(s.moves) and s.best == s.moves[0]
        assert set(s.moves) <= legal_ucis(s.fen) and len(set(s.moves)) == len(s.moves)
        assert s.history and s.completion.startswith(" M: ")
    with open(POOL_PATH) as f:
        meta = json.loads(f.readline())["meta"]
    assert meta["stockfish"].startswith("Stockfish") and meta["multipv"] == 5 and meta["limit"]


def test_task_sampler_mix():
    pool = load_jsonl(EVAL_PATH)

    def draw():
        buf = ReplayBuffer(seed=0)
        buf.add(START, [])
        return TaskSampler(pool, env_ratio=0.25, seed=0, buffer=buf).draw(400)

    draws = draw()
    assert 60 <= sum(s.task == "A" for s in draws) <= 140
    assert any(s.fen == START for s in draws)  # the buffer's position is used for A: tasks
    for s in draws:
        if s.task == "A":
            assert s.completion == env_completion(s.fen, s.move, s.history)
    assert [s.prompt + s.completion for s in draws] == [s.prompt + s.completion for s in draw()]


if __name__ == "__main__":
    import sys
    sys.exit(pytest.main([__file__, "-q"]))
