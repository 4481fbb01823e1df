"""Text-file loading, the position generator, the replay buffer, the task and stream samplers and the shipped data.

    python mini/test_dataset.py
"""
import collections
import itertools
import json
import random
import re
from contextlib import closing

import chess
import pytest

from mini.annotate import Annotator
from mini.config import EVAL_PATH, POOL_PATH, Config
from mini.dataset import (MAX_BAD_LINES, ReplayBuffer, StreamSampler, TaskSampler, held_out_keys, load_jsonl,
                          load_text, make_sampler)
from mini.formats import env_completion, legal_ucis, parse_line, position_key
from mini.positions import generate_positions, iter_positions, random_env_sample
from mini.test_annotate import needs_stockfish
from mini.test_formats import A_LINES, P_LINES, START

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


def test_bad_bytes_empty_files_and_too_many_bad_lines(tmp_path, capsys):
    path = tmp_path / "data.txt"
    path.write_bytes(P_LINES[0].encode() + b"\n\xff\xfe junk\n" + A_LINES[0].encode() + b"\n")
    samples, skipped = load_text(str(path))  # one bad byte costs its line, not the file
    assert [s.task for s in samples] == ["P", "A"] and skipped == 1
    assert f"{path}:2: not UTF-8 text" in capsys.readouterr().err
    path.write_text("\n\n")
    with pytest.raises(ValueError, match=r"holds no sample \(it is empty\)"):
        load_text(str(path))
    path.write_text("junk\n" * (MAX_BAD_LINES + 1) + P_LINES[0] + "\n")
    with pytest.raises(ValueError, match=f"more than {MAX_BAD_LINES} bad lines .*is it a RookWorld data file"):
        load_text(str(path))
    jsonl = tmp_path / "positions.jsonl"
    with open(EVAL_PATH) as src:
        lines = src.readlines()[:3]
    jsonl.write_text("".join(lines) + '{"fen": "8/8')  # a cut-off last line is skipped
    assert len(load_jsonl(str(jsonl))) == 2
    jsonl.write_text("".join(lines) + re.sub(r'"evals":\[[^,]+', '"evals":[NaN', lines[2]))  # json reads NaN
    assert len(load_jsonl(str(jsonl))) == 2
    assert "are not all finite numbers" in capsys.readouterr().err


def test_data_file_may_be_annotated_jsonl(tmp_path):
    path = tmp_path / "positions.jsonl"
    with open(POOL_PATH) as src:
        path.write_text("".join(src.readlines()[:4]))  # the header and three positions
    samples = make_sampler(Config(data_source="file", data_file=str(path))).policy
    assert [s.prompt for s in samples] == [s.prompt for s in load_jsonl(POOL_PATH)[:3]]


def test_a_data_file_never_yields_a_held_out_position(tmp_path):
    path = tmp_path / "positions.jsonl"
    with open(POOL_PATH) as pool, open(EVAL_PATH) as held_out:
        path.write_text("".join(pool.readlines()[1:3] + held_out.readlines()[1:3]))
    assert make_sampler(Config(data_source="file", data_file=str(path))).policy == load_jsonl(POOL_PATH)[:2]
    path.write_text("".join(open(EVAL_PATH).readlines()[1:3]))
    with pytest.raises(ValueError, match="every position in it is a held-out"):
        make_sampler(Config(data_source="file", data_file=str(path)))


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
    assert sum(s.task == "A" for s in draws) == 105  # seed 0: 26% A: tasks for a ratio of 0.25
    assert sum(s.fen == START for s in draws) == 55  # about half of them on the buffer's position
    for s in draws:
        if s.task == "A":
            assert s.completion == env_completion(s.fen, s.move, s.history)
    assert [s.prompt + s.completion for s in draws] == [s.prompt + s.completion for s in draw()]


@needs_stockfish
def test_stream_sampler_labels_as_it_goes_and_resumes_exactly(tmp_path):
    """--data_source generate: P: prompts are the stream's positions in order (held-out ones left out),
    labelled as Stockfish labels them, no more than `ahead` searched before they are needed; a sampler loaded
    from a state_dict draws what the original draws next."""
    ann = Annotator(depth=2, workers=1, cache_path=str(tmp_path / "cache.jsonl"))
    with closing(StreamSampler(ann, env_ratio=0, seed=0, ahead=8)) as sampler:
        drawn = sampler.draw(5)
        assert len(ann.cache) <= 5 + 8  # labelled as needed, at most `ahead` early, not steps x batch_size up front
    held_out = held_out_keys()
    stream = [fen for fen, _, _ in itertools.islice(iter_positions(0), 40)]
    assert any(position_key(f) in held_out for f in stream[:8])  # seed 0 is the stream the eval set came from
    fens = [f for f in stream if position_key(f) not in held_out][:5]
    assert [s.fen for s in drawn] == fens
    with Annotator(depth=2, workers=1, cache_path="") as fresh:  # the labels are Stockfish's, searched anew
        labels = fresh.annotate(fens)
    assert [(s.moves, s.evals) for s in drawn] == [tuple(labels[f]) for f in fens]

    def run(batches, state=None):  # A: prompts from the recent positions (a replay buffer has its own state)
        with closing(StreamSampler(Annotator(depth=2, workers=1, cache_path=str(tmp_path / "cache.jsonl")),
                                   env_ratio=0.4, seed=3, ahead=4)) as sampler:
            if state is not None:
                sampler.load_state_dict(state)
            return [[x.prompt + x.completion for x in sampler.draw(6)] for _ in range(batches)], sampler.state_dict()

    full, _ = run(3)
    _, after_one = run(1)
    assert run(2, after_one)[0] == full[1:]
    assert {p[:3] for batch in full[1:] for p in batch} == {"A: ", "P: "}


def test_generate_without_stockfish_is_one_sentence():
    with pytest.raises(FileNotFoundError, match="apt-get install stockfish"):
        make_sampler(Config(data_source="generate", stockfish_path="/nonexistent/stockfish"))


if __name__ == "__main__":
    import sys
    sys.exit(pytest.main([__file__, "-q"]))
