"""Text-file loading, the position generator, the replay buffer, the task and stream samplers and the shipped data.

    python mini/test_dataset.py
"""
import collections
import itertools
import json
import os
import random
import re
import subprocess
import sys
import threading
from concurrent.futures import Future
from contextlib import closing

import chess
import pytest

from mini import dataset
from mini.config import EVAL_PATH, MATE_PATH, POOL_PATH, REAL_EVAL2_PATH, REAL_EVAL_PATH, Config
from mini.dataset import (MAX_BAD_LINES, PoolSource, ReplayBuffer, StreamSource, held_out_keys, load_jsonl,
                          load_text, make_source, parsed_lines, record_keys, shows_held_out)
from mini.formats import (board_key, env_completion, env_sample, legal_ucis, parse_line, placement, policy_prompt,
                          policy_sample, position_key)
from mini.positions import generate_positions, iter_positions, random_env_sample
from mini.stockfish import Annotator
from mini.test_annotate import needs_stockfish
from mini.test_formats import A_LINES, KINGLESS_A_LINE, P_LINES, PINNED, START

READ_RECORDS = dataset.read_records


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
    path.write_bytes(b"\xef\xbb\xbf" + P_LINES[0].encode() + b"\n" + A_LINES[0].encode() + b"\n")
    assert load_text(str(path)) == ([parse_line(P_LINES[0]), parse_line(A_LINES[0])], 0)  # a byte-order mark
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
    jsonl.write_text(lines[0])  # the header alone
    with pytest.raises(ValueError, match=f"{jsonl} holds no sample, only its header"):
        load_jsonl(str(jsonl))
    jsonl.write_text("".join(lines) + re.sub(r'"evals":\[[^,]+', '"evals":[NaN', lines[2]))  # json reads NaN
    assert len(load_jsonl(str(jsonl))) == 2
    assert "are not all finite numbers" in capsys.readouterr().err


def test_a_file_of_bad_lines_only_is_refused_by_what_was_skipped(tmp_path):
    """A file with lines, every one bad, is not called empty: the refusal counts what was skipped."""
    path = tmp_path / "data.txt"
    path.write_text("junk\n" + KINGLESS_A_LINE + "\n")
    with pytest.raises(ValueError, match=r"holds no sample \(1 malformed line, 1 impossible position\)$"):
        load_text(str(path))


def test_data_file_may_be_annotated_jsonl(tmp_path):
    path = tmp_path / "positions.jsonl"
    with open(POOL_PATH) as src:
        path.write_text("".join(src.readlines()[:4]))  # the header and three positions
    samples = make_source(Config(data_source="file", data_file=str(path))).policy
    assert [s.prompt for s in samples] == [s.prompt for s in load_jsonl(POOL_PATH)[:3]]


def test_a_data_file_never_yields_a_held_out_position(tmp_path):
    path = tmp_path / "positions.jsonl"
    with open(POOL_PATH) as pool, open(EVAL_PATH) as held_out:
        path.write_text("".join(pool.readlines()[1:3] + held_out.readlines()[1:3]))
    assert make_source(Config(data_source="file", data_file=str(path))).policy == load_jsonl(POOL_PATH)[:2]
    path.write_text("".join(open(EVAL_PATH).readlines()[1:3]))
    with pytest.raises(ValueError, match="every position in it is a held-out"):
        make_source(Config(data_source="file", data_file=str(path)))


def test_a_rebuilt_pool_never_yields_a_held_out_position(tmp_path, monkeypatch):
    """The shipped pool's source filters as a file's does: a pool rebuilt with other settings may hold eval positions."""
    path = tmp_path / "pool.jsonl"
    with open(POOL_PATH) as pool, open(EVAL_PATH) as held_out:
        path.write_text("".join(pool.readlines()[:3] + held_out.readlines()[1:3]))
    monkeypatch.setattr("mini.dataset.POOL_PATH", str(path))
    assert make_source(Config()).policy == load_jsonl(POOL_PATH)[:2]


def test_a_file_without_p_positions_says_what_it_cannot_give(tmp_path):
    """A file of A: transitions alone cannot give the P: prompts of --mix_env_ratio below 1 (every prompt would be
    A:, unasked), nor the P: positions --policy_sft_coef draws (it would wait for ever)."""
    path = tmp_path / "transitions.jsonl"
    path.write_text('{"fen": "%s", "move": "e2e4", "history": ["e2e4"]}\n' % chess.STARTING_FEN)
    arbiter_only = dict(data_source="file", data_file=str(path), mix_env_ratio=1.0)
    assert make_source(Config(**arbiter_only)).env  # the arbiter alone: fine
    for ratio in (0.0, 0.2):
        with pytest.raises(ValueError, match="holds no P: position, so the .* of P: prompts that --mix_env_ratio"):
            make_source(Config(**arbiter_only | {"mix_env_ratio": ratio}))
    with pytest.raises(ValueError, match="holds no P: position for --policy_sft_coef"):
        make_source(Config(**arbiter_only, policy_sft_coef=1.0))
    # with --sft_data_file the term draws from that file's source: an arbiter-only prompt source is fine
    assert make_source(Config(**arbiter_only, policy_sft_coef=1.0, sft_data_file=POOL_PATH))


def test_a_held_out_position_with_a_standard_en_passant_square_is_left_out(tmp_path):
    """eval.jsonl writes '-' after d2d4 (no black pawn can take on d3), FEN's standard writes d3: one position."""
    held_out = next(s for s in load_jsonl(EVAL_PATH) if s.fen == "1rbq1rk1/pppp1ppp/7n/3N4/2nPB3/P3P3/P1P3PP/R1BQ1RK1 b - - 0 11")
    same = policy_sample(held_out.fen.replace(" b - - ", " b - d3 "), held_out.moves, held_out.evals)
    pool = load_jsonl(POOL_PATH)[0]
    path = tmp_path / "lines.txt"
    path.write_text("".join(s.prompt + s.completion + "\n" for s in (same, pool)))
    assert [s.fen for s in make_source(Config(data_source="file", data_file=str(path))).policy] == [pool.fen]


def test_shows_held_out_answers_as_a_board_for_every_sample_would():
    """shows_held_out builds a board only for a placement some held-out position has; its answers are those of
    keying every sample, on the shipped pool and held-out set, on held-out positions written another way (other
    counters, the en passant square FEN's standard writes, a crazyhouse promoted-piece mark '~' that
    python-chess drops) and on A: samples whose move leads onto one."""
    held_out = held_out_keys()

    def keyed(s):
        keys = [position_key(s.fen)] + ([" ".join(s.next_fen.split()[:4])] if s.task == "A" and not s.truncated else [])
        return any(k in held_out for k in keys)

    ev = load_jsonl(EVAL_PATH)
    d3 = next(s for s in ev if s.fen == "1rbq1rk1/pppp1ppp/7n/3N4/2nPB3/P3P3/P1P3PP/R1BQ1RK1 b - - 0 11")
    marked = "1rbq~1rk1/pppp1ppp/7n/3N4/2nPB3/P3P3/P1P3PP/R1BQ1RK1 b - d3 7 40"  # the same position
    assert placement(marked) == chess.Board(marked).board_fen() == d3.fen.split()[0]
    written_otherwise = [policy_sample(marked, d3.moves, d3.evals),
                         policy_sample(d3.fen.replace(" 0 11", " 3 60"), d3.moves, d3.evals)]
    onto = [env_sample(s.fen, s.moves[0], []) for s in load_jsonl(POOL_PATH)[:200]]  # where the pool's moves lead
    samples = load_jsonl(POOL_PATH)[:400] + ev + written_otherwise + onto
    answers = [shows_held_out(s, held_out) for s in samples]
    assert answers == [keyed(s) for s in samples]
    assert all(answers[400:400 + len(ev) + 2]) and not any(answers[:400])


def test_an_a_sample_whose_move_leads_onto_a_held_out_position_shows_it():
    """The next position an A: answer writes counts as shown (keyed by its first four FEN fields), its own not held
    out; an illegal move (truncated: the position stays) or a P: sample of the same position shows nothing."""
    after = chess.Board()
    after.push_uci("e2e4")
    held_out = frozenset({board_key(after)})
    assert shows_held_out(env_sample(START, "e2e4", ["e2e4"]), held_out)
    assert not shows_held_out(env_sample(START, "e2e5", ["e2e5"]), held_out)
    assert not shows_held_out(policy_sample(START, ["e2e4"], [0.3]), held_out)


def test_a_held_out_placement_with_another_side_to_move_or_castling_rights_is_not_held_out():
    """Only the whole position key is held out: the same pieces with the other side to move, or other castling
    rights, are another position."""
    after = chess.Board()
    after.push_uci("e2e4")
    held_out = frozenset({board_key(after)})
    assert shows_held_out(policy_sample(after.fen(), ["e7e5"], [0.1]), held_out)
    assert not shows_held_out(policy_sample(after.fen().replace(" b ", " w "), ["d2d4"], [0.1]), held_out)
    assert not shows_held_out(policy_sample(after.fen().replace("KQkq", "Qkq"), ["e7e5"], [0.1]), held_out)


def test_annotated_jsonl_records_are_checked_like_text_lines(tmp_path, capsys):
    good = {"fen": START, "moves": ["e2e4", "d2d4"], "evals": [0.3, 0.2]}
    bad = [({"fen": "not a fen", "moves": ["e2e4"], "evals": [0.1]}, "bad FEN"),
           ({"fen": START, "moves": ["e2e5", "d2d4"], "evals": [0.3, 0.2]}, "move e2e5 is illegal"),
           ({"fen": START, "moves": ["e2e4", "d2d4", "g1f3"], "evals": [0.3]}, "3 moves need 3 evals"),
           ({"fen": "8/8/8/8/8/8/8/8 w - - 0 1", "moves": ["e2e4"], "evals": [0.1]},
            "impossible position '8/8/8/8/8/8/8/8 w - - 0 1' (no white king, no black king, empty)"),  # no pieces
           ({"fen": START, "moves": ["e2e4", "d2d4", "g1f3", "b1c3", "c2c4", "g2g3"], "evals": [0.0] * 6}, "1 to 5 moves"),
           ({"fen": START, "moves": [], "evals": []}, "1 to 5 moves"),
           (dict(good, history=5), "a history is a list of UCI moves or one string of them, not 5"),
           ({"fen": START, "move": "e2e4", "history": ["e2e4", 7]}, "a history is a list of UCI moves")]
    path = tmp_path / "positions.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [{"meta": {}}, good] + [r for r, _ in bad]
                            + [dict(good, history="g1f3 g8f6")]  # a string of moves, as an A: record's may be
                            + [{"fen": START, "move": "e2e9", "history": ["e2e9"]}]))  # the move judged may be garbled
    assert [(s.fen, s.moves, s.best, s.history) for s in load_jsonl(str(path))] == [
        (START, ["e2e4", "d2d4"], "e2e4", []), (START, ["e2e4", "d2d4"], "e2e4", ["g1f3", "g8f6"]),
        (START, [], "", ["e2e9"])]
    err = capsys.readouterr().err.splitlines()
    assert [line.startswith(f"{path}:{i}: ") and what in line
            for i, (line, (_, what)) in enumerate(zip(err, bad), 3)] == [True] * len(bad)
    with pytest.raises(ValueError, match=f"{path}:3: bad FEN"):
        load_jsonl(str(path), skip_bad_lines=False)


@pytest.mark.parametrize("record, message", [
    ({"fen": START, "moves": ["e2e4"], "evals": [0.3], "history": ["zz"]}, "history move 'zz' is not a UCI move"),
    ({"fen": START, "move": "e2e4", "history": ["e7e9", "e2e4"]}, "history move 'e7e9' is not a UCI move"),
    ({"fen": START, "move": "e2e4"}, 'an A: record needs "move" as a UCI string and "history"'),
    ({"fen": START, "move": 5, "history": []}, 'an A: record needs "move" as a UCI string'),
    ({"fen": START, "moves": ["e2e4", "e2e4"], "evals": [0.3, 0.2]}, "moves ['e2e4', 'e2e4'] list a move twice"),
    ({"fen": START, "moves": ["e2e4"], "evals": [True]}, "evals [True] hold true or false, not numbers"),
    ({"fen": START, "moves": ["e2e4"], "evals": [10 ** 400]}, "hold an integer too large for a number"),
    ({"fen": START + "\n", "moves": ["e2e4"], "evals": [0.3]}, "its 6 fields are separated by single spaces"),
    ({"fen": START.replace(" ", "  ", 1), "move": "e2e4", "history": ["e2e4"]}, "separated by single spaces"),
    ({"fen": START, "move": "e2e4+", "history": ["e2e4+"]}, "an A: move is one word (or none) of at most 10 characters,"
                                                            " without '+' or spaces"),
    ({"fen": START, "move": "e2 e4", "history": ["e2e4"]}, "an A: move is one word (or none) of at most 10"),
    ({"fen": START, "move": "e2e4" * 1000, "history": ["e2e4" * 1000]}, "an A: move is one word (or none) of at most"),
    ({"fen": START, "move": "", "history": ["g1f3", "zz", ""]}, "history move 'zz' is not a UCI move"),
    ({"fen": START, "move": "e2e4", "history": {"e2e4": 1}}, "a history is a list of UCI moves or one string"),
    ({"fen": START, "move": "e2e4", "history": ["d2d4"]}, "an A: record's history ends with its move 'e2e4'"),
    ({"fen": START, "move": "e2e4", "history": ["g1f3", "g8f6"] * 5 + ["e2e4"]},
     "an A: history holds the last 1 to 10 half-moves, the move included; this one has 11: keep its last 10"),
    ([START, "e2e4"], "a JSON list, not a record of a position"),
    ("fen", "a JSON str, not a record of a position"),  # not Python's "string indices must be integers"
])
def test_records_a_prompt_would_print_wrong_say_so(tmp_path, record, message):
    """A history is printed into A: prompts, an eval of true would be 1.0, a repeated move a second label, a
    FEN's stray whitespace or a move's '+' would break the prompt's fields, a long history would make a prompt
    the model cannot hold (a run stopped mid-way), and so would a garbled move of any length: each refused with its
    line."""
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(record) + "\n")
    with pytest.raises(ValueError, match=re.escape(f"{path}:1: ") + "(bad FEN .*|evals .*)?" + re.escape(message)):
        load_jsonl(str(path), skip_bad_lines=False)


def test_a_large_file_parsed_in_parallel_gives_what_one_process_gives(tmp_path, capsys, monkeypatch):
    """Chunks parsed by worker processes come back in the file's order, with the same skipped lines and messages."""
    path = tmp_path / "positions.jsonl"
    with open(EVAL_PATH) as src:
        lines = src.readlines()[:40]
    lines[5:5] = ["junk\n", "\n", '{"fen": "8/8/8/8/8/8/8/8 w - - 0 1", "moves": ["e2e4"], "evals": [0.1]}\n']
    path.write_bytes("".join(lines).encode() + b"\xff\n")
    serial = [(s.prompt, s.completion) for s in load_jsonl(str(path))]
    serial_err = capsys.readouterr().err
    monkeypatch.setattr("mini.dataset.PARALLEL_MIN_LINES", 2)
    monkeypatch.setattr("mini.dataset.os.cpu_count", lambda: 3)
    assert [(s.prompt, s.completion) for s in load_jsonl(str(path))] == serial and len(serial) == 39
    assert capsys.readouterr().err == serial_err and f"{path}:44: not UTF-8 text" in serial_err
    with pytest.raises(ValueError, match=f"^{path}:6: "):
        load_jsonl(str(path), skip_bad_lines=False)


PARSE_LOCK = threading.Lock()


def parse_under_lock(line):
    """A parser that takes a lock, as an import or the allocator does inside any parser."""
    with PARSE_LOCK:
        return line.strip()


def test_parse_workers_are_not_forked_from_a_caller_whose_threads_hold_locks(tmp_path, monkeypatch):
    """A forked worker inherits the locks the caller's other threads hold at that moment, held for ever: it
    would wait on one and the load never end (a training run hung at start-up so)."""
    path = tmp_path / "lines.txt"
    path.write_text("a\nb\nc\n")
    monkeypatch.setattr("mini.dataset.PARALLEL_MIN_LINES", 2)
    monkeypatch.setattr("mini.dataset.os.cpu_count", lambda: 2)
    held, release, result = threading.Event(), threading.Event(), []

    def hold():
        with PARSE_LOCK:
            held.set()
            release.wait()
    threading.Thread(target=hold, daemon=True).start()
    held.wait()
    load = threading.Thread(target=lambda: result.append(parsed_lines(str(path), parse_under_lock)), daemon=True)
    load.start()
    load.join(60)
    release.set()
    assert result == [[(1, "a", None), (2, "b", None), (3, "c", None)]], "the parse workers hung on a lock held at the fork"


def test_a_script_without_a_main_guard_loads_a_large_file_once(tmp_path):
    """Workers that are not forked run the __main__ script again unless it is hidden from them: a script with
    no `if __name__ == "__main__":` guard would load (and print) again in each of them, or stop with a traceback."""
    (tmp_path / "lines.txt").write_text("a\nb\nc\n")
    done = run_script(tmp_path, "import mini.dataset as d\nd.PARALLEL_MIN_LINES = 2\nd.os.cpu_count = lambda: 2\n"
                      f"print('loaded', len(d.parsed_lines({str(tmp_path / 'lines.txt')!r}, str.strip)))\n")
    assert (done.returncode, done.stdout, done.stderr) == (0, "loaded 3\n", "")


def run_script(tmp_path, text):
    """Run `text` as a script of its own (python FILE, no main guard) with mini importable; its result."""
    script = tmp_path / "unguarded.py"
    script.write_text(text)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": root})


def test_a_lines_python_chess_corrects_are_counted_once(tmp_path, capsys):
    wrong = f"A: {PINNED}+e2d3+e2d3+4k3/4r3/8/8/8/3B4/8/4K3 b - - 1 1+0.001+0+0"  # a pinned bishop moved
    path = tmp_path / "lines.txt"
    path.write_text("\n".join([wrong, A_LINES[0], wrong]) + "\n")
    samples, _ = load_text(str(path))
    assert [s.completion for s in samples] == [PINNED + "+-1.0+0+1", A_LINES[0].split("+", 3)[3], PINNED + "+-1.0+0+1"]
    assert capsys.readouterr().err == (f"{path}: 2 A: lines had a label python-chess disagrees with (the original "
                                       "generator pushed pseudo-legal moves); python-chess's labels are used\n")


def test_exactly_max_bad_lines_load_and_impossible_positions_never_count_towards_them(tmp_path):
    """The limit is *more than* MAX_BAD_LINES malformed lines; lines of impossible positions (the published A:
    data holds hundreds) are skipped without counting towards it, and the skipped count reports both kinds."""
    path = tmp_path / "data.txt"
    path.write_text("junk\n" * MAX_BAD_LINES + P_LINES[0] + "\n")
    samples, skipped = load_text(str(path))
    assert [s.task for s in samples] == ["P"] and skipped == MAX_BAD_LINES
    path.write_text((KINGLESS_A_LINE + "\n") * (MAX_BAD_LINES + 5) + "junk\n" + A_LINES[0] + "\n")
    samples, skipped = load_text(str(path))
    assert [s.task for s in samples] == ["A"] and skipped == MAX_BAD_LINES + 6
    kingless = parse_line(A_LINES[1])  # its published position has no black king: an A: record of it is refused too
    jsonl = tmp_path / "transitions.jsonl"
    jsonl.write_text("".join(json.dumps({"fen": fen, "move": kingless.move, "history": kingless.history}) + "\n"
                             for fen in (KINGLESS_A_LINE[3:].split("+")[0], kingless.fen)))
    assert [s.fen for s in load_jsonl(str(jsonl))] == [kingless.fen]


def test_the_first_ten_skipped_lines_are_named_and_the_counts_cover_the_rest(tmp_path, capsys):
    """Each of the first 10 skipped lines is named as file:line; the last stderr line counts both kinds, singular
    for one."""
    path = tmp_path / "data.txt"
    path.write_text("junk\n" * 11 + KINGLESS_A_LINE + "\n" + P_LINES[0] + "\n")
    assert load_text(str(path))[1] == 12
    err = capsys.readouterr().err.splitlines()
    assert [line.split(": ")[0] for line in err] == [f"{path}:{i}" for i in range(1, 11)] + [str(path)]
    assert err[-1] == f"{path}: skipped 11 malformed lines, 1 impossible position"
    path.write_text("junk\n" + P_LINES[0] + "\n")
    load_text(str(path))
    assert capsys.readouterr().err.splitlines()[-1] == f"{path}: skipped 1 malformed line"


def naive_keys(fen, move=None):
    """Placement, side, castling and en passant of a position and, after a legal move, of the next one:
    python-chess directly."""
    board = chess.Board(fen)
    keys = {" ".join(board.fen().split()[:4])}
    try:
        legal = chess.Move.from_uci(move) in board.legal_moves
    except (TypeError, ValueError):  # None, garbage
        legal = False
    if legal:
        board.push_uci(move)
        keys.add(" ".join(board.fen().split()[:4]))
    return keys


def test_held_out_keys_are_every_eval_set_position_and_where_its_a_transitions_lead():
    """The generated eval set, the two of realistic games and the mate-in-one set, each record's position and,
    for a legal A: move, the position it leads to (an A: completion writes that FEN): no more, no less."""
    assert record_keys(START, "e2e4") == naive_keys(START, "e2e4") and len(record_keys(START, "e2e4")) == 2
    assert record_keys(START, "e2e5") == record_keys(START, "Nf3") == record_keys(START) == {position_key(START)}
    want, moves = set(), 0
    for path in (EVAL_PATH, REAL_EVAL_PATH, REAL_EVAL2_PATH, MATE_PATH):
        with open(path) as f:
            for r in map(json.loads, f):
                if "fen" in r:
                    want |= naive_keys(r["fen"], r.get("move"))
                    moves += "move" in r
    assert moves >= 1800 and held_out_keys() == want


def test_replay_buffer_refuses_impossible_positions():
    """A position python-chess reads but calls impossible (the side not to move in check, a pawn on the back
    rank) never becomes an A: prompt."""
    buf = ReplayBuffer()
    buf.held_out = set()
    buf.add("4k3/8/8/8/8/8/4R3/4K3 w - - 0 1")  # Black is in check with White to move
    buf.add("4k3/8/8/8/8/8/8/4K2P w - - 0 1")  # a pawn on h1
    assert len(buf) == 0
    buf.add("4k3/8/8/8/8/8/4R3/4K3 b - - 0 1")
    assert [f for f, _ in buf.items.values()] == ["4k3/8/8/8/8/8/4R3/4K3 b - - 0 1"]


def test_pool_source_of_a_records_alone_and_half_the_a_share_from_them_with_p_positions():
    """A file of A: transitions alone is drawn from entirely; with P: positions too, half the A: prompts are the
    file's transitions and half are python-chess transitions on the P: positions."""
    records = [env_sample(START, m, [m]) for m in ("e2e4", "d2d4", "g1f3")]
    texts = {s.prompt + s.completion for s in records}
    draws = PoolSource(records, env_ratio=0.2, seed=0).draw(60)
    assert len(draws) == 60 and {s.prompt + s.completion for s in draws} == texts
    p = parse_line(P_LINES[0])
    draws = PoolSource(records + [p], env_ratio=1.0, seed=0).draw(400)
    from_file = sum(s.prompt + s.completion in texts for s in draws)
    assert all(s.task == "A" for s in draws) and 150 <= from_file <= 250
    assert sum(s.fen == p.fen for s in draws) == 400 - from_file


def test_pool_a_prompts_carry_the_positions_last_moves_and_p_prompts_the_sources_padding():
    """An A: prompt drawn on a P: position prints the moves that led there and its own move, the last 10
    (MAX_HISTORY); P: prompts have the FEN padded to the source's width, 89 or 90, or either with both."""
    moves = ["g1f3", "g8f6", "f3g1", "f6g8"] * 3  # 12 half-moves back to the start (a test string)
    p = policy_sample(START, ["e2e4"], [0.3], history=moves)
    drawn = PoolSource([p], env_ratio=1.0, seed=0).draw(20)
    assert all(s.task == "A" and s.history == moves[-9:] + [s.move] for s in drawn)
    assert dataset.pad_widths("89") == (89,) and dataset.pad_widths("90") == (90,)
    assert dataset.pad_widths("both") == (90, 89)
    for pads in ((89,), (90,), (90, 89)):
        drawn = PoolSource([p], env_ratio=0.0, seed=0, pads=pads).draw(40)
        assert {len(s.prompt) - 2 for s in drawn} == set(pads)  # 'P: ' and the FEN padded, less the last space
        assert all(s.prompt == policy_prompt(START, len(s.prompt) - 2) for s in drawn)


def test_several_data_files_are_one_source_and_each_rank_draws_with_its_own_seed(tmp_path):
    """--data_file a,b reads both files; torchrun rank r draws with seed --seed + r (else every rank trains on the
    same prompts)."""
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(P_LINES[0] + "\n")
    b.write_text(P_LINES[1] + "\n" + A_LINES[0] + "\n")
    cfg = Config(data_source="file", data_file=f"{a},{b}", mix_env_ratio=0.6)
    source = make_source(cfg)
    assert [s.fen for s in source.policy] == [parse_line(x).fen for x in P_LINES[:2]] and len(source.env) == 1
    assert source.env_ratio == 0.6  # --mix_env_ratio's A: share
    for rank in (0, 1, 3):
        assert make_source(cfg, rank=rank).rng.getstate() == random.Random(cfg.seed + rank).getstate()


def test_policy_only_files_give_p_prompts_and_rows_but_start_no_a_transition(tmp_path, monkeypatch):
    """--policy_only_file: its files' P: positions are P: prompts like the rest, but no A: transition (prompt or
    supervised row) is drawn on them; the file is matched by its real path. Every P: position policy-only with
    no A: sample is one sentence when A: prompts are asked for, and fine when they are not."""
    with open(POOL_PATH) as f:
        header, *records = f.readlines()[:41]
    games, mates = tmp_path / "games.jsonl", tmp_path / "mates.jsonl"
    games.write_text(header + "".join(records[:20]))
    mates.write_text(header + "".join(records[20:]))
    fens = {name: {json.loads(r)["fen"] for r in part} for name, part in (("games", records[:20]), ("mates", records[20:]))}
    monkeypatch.chdir(tmp_path)
    files = {"data_source": "file", "data_file": f"{games},{mates}", "mix_env_ratio": 0.5}
    for only, a_from in (("", fens["games"] | fens["mates"]), ("./mates.jsonl", fens["games"])):
        draws = make_source(Config(**files, policy_only_file=only)).draw(600)
        assert {s.fen for s in draws if s.task == "P"} == fens["games"] | fens["mates"]
        assert {s.fen for s in draws if s.task == "A"} == a_from
    rows = make_source(Config(**files | {"mix_env_ratio": 0.0}, policy_only_file="mates.jsonl", env_sft_coef=1.0))
    assert {s.fen for s in rows.draw(300, env_ratio=1.0)} == fens["games"]  # the supervised A: rows too
    labelled = tmp_path / "a.jsonl"  # labelled A: samples still serve, alone, when every P: file is policy-only
    labelled.write_text('{"fen": "%s", "move": "e2e4", "history": ["e2e4"]}\n' % START)
    draws = make_source(Config(**files | {"data_file": f"{mates},{labelled}"}, policy_only_file=str(mates))).draw(600)
    assert {s.fen for s in draws if s.task == "A"} == {START} and {s.fen for s in draws if s.task == "P"} == fens["mates"]
    with pytest.raises(ValueError, match="no P: position outside --policy_only_file and no A: sample is left"):
        make_source(Config(**files | {"data_file": str(mates)}, policy_only_file=str(mates)))
    with pytest.raises(ValueError, match="no A: prompt or row can be drawn"):  # the A: term from the prompt source
        make_source(Config(**files | {"data_file": str(mates), "mix_env_ratio": 0.0}, policy_only_file=str(mates),
                           env_sft_coef=1.0))
    assert make_source(Config(**files | {"data_file": str(mates), "mix_env_ratio": 0.0}, policy_only_file=str(mates)))


def test_no_skip_bad_lines_stops_at_a_data_files_first_bad_line_and_no_samples_is_refused(tmp_path):
    """--no_skip_bad_lines: the first bad line of a text or .jsonl data file stops the source, named; a source of
    no samples is refused in a sentence (its draw would never end)."""
    text, jsonl = tmp_path / "a.txt", tmp_path / "b.jsonl"
    text.write_text(P_LINES[0] + "\njunk\n")
    with open(POOL_PATH) as src:
        jsonl.write_text("".join(src.readlines()[:3]) + "junk\n")
    for path in (text, jsonl):
        assert make_source(Config(data_source="file", data_file=str(path))).policy  # skipped by default
        with pytest.raises(ValueError, match=re.escape(f"{path}:") + "[24]: "):
            make_source(Config(data_source="file", data_file=str(path), skip_bad_lines=False))
    with pytest.raises(ValueError, match="no samples to draw training prompts from"):
        PoolSource([])
    with pytest.raises(ValueError, match="--data_source file needs --data_file PATH"):  # not a file named ''
        make_source(Config(data_source="file"))


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
    openings = [chess.Board(fen).ply() for fen, _, phase in positions if phase == "opening"]
    assert (min(openings), max(openings)) == (6, 16)  # 6 to 16 plies, both ends met by some of the ~40 openings


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
    assert [history[-1] for _, history in nxt.items.values()] == ["b3b5", "a3c5"]  # the move that led there
    nxt.add_next(env_sample(KIWIPETE, "e1e3", ["e1e3"]))  # illegal: truncated, the position unchanged, not new
    assert len(nxt) == 2


def test_replay_buffer_keeps_a_positions_first_meeting_and_gives_what_it_holds():
    """A position met again (other counters, another history) keeps the FEN and history it was first met with;
    a history keeps its last 9 moves (an A: prompt adds its own); asking for more than it holds gives all of it."""
    buf = ReplayBuffer(seed=0)
    moves = ["g1f3", "g8f6", "f3g1", "f6g8"] * 3  # 12 half-moves back to the start (a test string)
    buf.add(START, moves)
    buf.add(START.replace(" 0 1", " 4 9"), ["e2e4"])
    assert list(buf.items.values()) == [(START, moves[-9:])]
    buf.add(KIWIPETE)
    assert sorted(buf.sample(5)) == sorted([(START, moves[-9:]), (KIWIPETE, [])])


def test_a_default_replay_buffer_holds_ten_thousand_positions():
    """train.py and sft.py build their buffer with the default capacity: 10,000 positions (a K+R v K set of over
    10,000 legal ones, Black to move), not fewer."""
    boards = []
    for wk, bk, rook in itertools.product(range(64), range(64), range(0, 64, 3)):
        if len({wk, bk, rook}) == 3 and len(boards) < 12000:
            board = chess.Board.empty()
            board.set_piece_map({wk: chess.Piece(chess.KING, chess.WHITE), bk: chess.Piece(chess.KING, chess.BLACK),
                                 rook: chess.Piece(chess.ROOK, chess.WHITE)})
            board.turn = chess.BLACK
            boards.append(board)
    kept = [b for b in boards if b.is_valid() and not b.is_game_over()]
    buf = ReplayBuffer()
    buf.held_out = frozenset()
    for board in boards:
        buf.add(board.fen(), board=board)
    assert len(kept) > 10000 and len(buf) == 10000
    assert [f for f, _ in buf.items.values()] == [b.fen() for b in kept[-10000:]]  # the oldest went out


def test_no_training_prompt_shows_a_held_out_position():
    """A pool position one move (a8b8) from an eval position: the replay buffer refuses the eval position, and an
    A: prompt of that move is drawn again, by the pool and by the stream of --data_source generate, so neither an
    A: prompt nor an A: completion shows it."""
    fen = "r1bqkb1r/pppppp1p/2n2p2/8/8/5N2/PPPPPPPP/R1BQKB1R b KQkq - 1 4"
    held_out = held_out_keys()
    assert position_key("1rbqkb1r/pppppp1p/2n2p2/8/8/5N2/PPPPPPPP/R1BQKB1R w KQk - 2 5") in held_out
    buf = ReplayBuffer()
    buf.add("1rbqkb1r/pppppp1p/2n2p2/8/8/5N2/PPPPPPPP/R1BQKB1R w KQk - 2 5")
    buf.add_next(env_sample(fen, "a8b8", ["a8b8"]))  # train.py adds every drawn sample's next position
    assert len(buf) == 0
    draws = PoolSource([policy_sample(fen, ["a8b8"], [0.0])], env_ratio=1.0, seed=0, buffer=buf).draw(300)
    assert len(draws) == 300 and "a8b8" not in {s.move for s in draws}
    stream = StreamSource(LabelsAhead(), env_ratio=1.0, seed=0)
    stream.recent.append((fen, []))
    draws = stream.draw(300)
    assert len(draws) == 300 and "a8b8" not in {s.move for s in draws}


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


def test_a_shipped_file_is_checked_once_and_each_load_gets_its_own_samples(tmp_path, monkeypatch):
    """The files under mini/data are read and checked once a process (again when one changes on disk), and every
    load gets samples of its own, so that one caller's change is not another's; any other file is read each time."""
    reads = []
    monkeypatch.setattr(dataset, "read_records", lambda path, *a: reads.append(path) or READ_RECORDS(path, *a))
    dataset.shipped_records.cache_clear()
    first, second = load_jsonl(EVAL_PATH), load_jsonl(EVAL_PATH)
    assert len(reads) == 1 and first == second and first[0] is not second[0]
    first[0].completion = " changed"
    assert load_jsonl(EVAL_PATH)[0].completion.startswith(" M: ")
    copy = tmp_path / "eval.jsonl"
    copy.write_bytes(open(EVAL_PATH, "rb").read())
    assert load_jsonl(str(copy)) == load_jsonl(str(copy)) == second and len(reads) == 3
    monkeypatch.setattr(dataset, "DATA_DIR", str(tmp_path))  # the copy is a shipped file now: rebuilt, read again
    assert load_jsonl(str(copy)) == second and len(reads) == 4
    copy.write_bytes(b"".join(open(EVAL_PATH, "rb").readlines()[:-1]))
    assert load_jsonl(str(copy)) == second[:-1] and len(reads) == 5
    dataset.shipped_records.cache_clear()


def test_pool_source_mix():
    pool = load_jsonl(POOL_PATH)

    def draw():
        buf = ReplayBuffer(seed=0)
        buf.add(START, [])
        return PoolSource(pool, env_ratio=0.25, seed=0, buffer=buf).draw(400)

    draws = draw()
    assert sum(s.task == "A" for s in draws) == 100  # seed 0: 25% A: tasks for a ratio of 0.25
    assert sum(s.fen == START for s in draws) == 50  # about half of them on the buffer's position
    for s in draws:
        if s.task == "A":
            assert s.completion == env_completion(s.fen, s.move, s.history)
    assert [s.prompt + s.completion for s in draws] == [s.prompt + s.completion for s in draw()]
    first = PoolSource(pool, env_ratio=0.25, seed=0)  # a source loaded from a state_dict draws what it would next
    first.draw(30)
    resumed = PoolSource(pool, env_ratio=0.25, seed=0)
    resumed.load_state_dict(first.state_dict())
    assert [s.prompt + s.completion for s in resumed.draw(30)] == [s.prompt + s.completion for s in first.draw(30)]
    source = PoolSource(pool, env_ratio=0.25, seed=0)  # one draw's own A: share (--env_sft_batch: only A:)
    assert {s.task for s in source.draw(50, env_ratio=1.0)} == {"A"}
    assert {s.task for s in source.draw(50, env_ratio=0.0)} == {"P"}


@needs_stockfish
def test_stream_source_labels_as_it_goes_and_resumes_exactly(tmp_path):
    """--data_source generate: P: prompts are the stream's positions in order (held-out ones left out),
    labelled as Stockfish labels them, no more than `ahead` searched before they are needed; a source loaded
    from a state_dict draws what the original draws next."""
    ann = Annotator(depth=2, workers=1, cache_path=str(tmp_path / "cache.jsonl"))
    with closing(StreamSource(ann, env_ratio=0, seed=0, ahead=8)) as source:
        drawn = source.draw(5)
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
        with closing(StreamSource(Annotator(depth=2, workers=1, cache_path=str(tmp_path / "cache.jsonl")),
                                  env_ratio=0.4, seed=3, ahead=4)) as source:
            if state is not None:
                source.load_state_dict(state)
            return [[x.prompt + x.completion for x in source.draw(6)] for _ in range(batches)], source.state_dict()

    full, _ = run(3)
    _, after_one = run(1)
    assert run(2, after_one)[0] == full[1:]
    assert {p[:3] for batch in full[1:] for p in batch} == {"A: ", "P: "}
    with closing(StreamSource(Annotator(depth=2, workers=1, cache_path=str(tmp_path / "cache.jsonl")),
                              env_ratio=0.4, seed=3, ahead=4)) as source:
        assert [s.task for s in source.draw(3, env_ratio=1.0)] == ["P", "A", "A"]  # A: once it has a position


class LabelsAhead:
    """Annotator's stand-in for StreamSource: submit() labels every FEN at once (e2e4 as if legal: unchecked)."""

    def submit(self, fens):
        future = Future()
        future.set_result({f: (["e2e4"], [0.1]) for f in fens})
        return [future] * len(fens)

    def close(self):
        pass


class CountedLabels(LabelsAhead):
    """LabelsAhead that counts the positions sent to be labelled."""

    def __init__(self):
        self.submitted = 0

    def submit(self, fens):
        self.submitted += len(fens)
        return super().submit(fens)


def test_stream_source_labels_no_more_than_ahead_positions_before_they_are_needed(monkeypatch):
    """After every draw, the positions sent to Stockfish are those taken plus at most `ahead` more."""
    monkeypatch.setattr("mini.dataset.held_out_keys", frozenset)  # not the point here
    labels = CountedLabels()
    source = StreamSource(labels, env_ratio=0.0, seed=0, ahead=8)
    for _ in range(20):
        source.draw(1)
        assert source.taken <= labels.submitted <= source.taken + 8
    # an A: prompt needs a position drawn before: the first prompt of a fresh source is P:
    assert [s.task for s in StreamSource(LabelsAhead(), env_ratio=1.0, seed=0).draw(3)] == ["P", "A", "A"]


def test_stream_source_tops_its_window_up_once_half_of_it_is_drawn(monkeypatch):
    """Stockfish stays at least half a window ahead: with ahead 8, the 5th draw sends 4 more (8 + 4 by then), so a
    position is never asked for only when it is needed."""
    monkeypatch.setattr("mini.dataset.held_out_keys", frozenset)  # not the point here
    labels = CountedLabels()
    source = StreamSource(labels, env_ratio=0.0, seed=0, ahead=8)
    sent = []
    for _ in range(12):
        source.draw(1)
        sent.append(labels.submitted)
    assert sent == [8] * 4 + [12] * 4 + [16] * 4


def test_generate_source_takes_its_settings_from_the_config(monkeypatch):
    """make_source for --data_source generate: Stockfish at --stockfish_depth with --annotate_workers, the A: share
    --mix_env_ratio, the FEN width --policy_pad, seed --seed + rank, a window of 1024 recent positions."""
    made = []

    class Made(LabelsAhead):
        def __init__(self, *a, **kw):
            made.append((a, kw))
    monkeypatch.setattr(dataset, "Annotator", Made)
    cfg = Config(data_source="generate", stockfish_path="sf", stockfish_depth=7, annotate_workers=3, mix_env_ratio=0.4,
                 seed=5, policy_pad="89")
    source = make_source(cfg, rank=2)
    assert made == [(("sf",), {"depth": 7, "workers": 3})]
    assert (source.env_ratio, source.pads, source.recent.maxlen) == (0.4, (89,), 1024)
    assert source.rng.getstate() == random.Random(7).getstate() and source.seed == 7


def test_stream_source_pads_its_p_prompts_at_the_configured_width(monkeypatch):
    """--data_source generate with --policy_pad 89: the stream's P: prompts are 89 wide, as the pool's are; each
    keeps the moves that led to its position (the replay buffer extends them with the best move)."""
    monkeypatch.setattr("mini.dataset.held_out_keys", frozenset)  # not the point here
    drawn = StreamSource(LabelsAhead(), env_ratio=0.0, seed=0, ahead=2, pads=(89,)).draw(2)
    assert [s.prompt for s in drawn] == [policy_prompt(s.fen, 89) for s in drawn]
    assert [s.history for s in drawn] == [h for _, h, _ in itertools.islice(iter_positions(0), 2)] and drawn[0].history
    assert {len(s.prompt) for s in drawn} == {3 + 88}


def test_stream_a_prompts_carry_the_moves_that_led_to_their_position(monkeypatch):
    """An A: prompt on a recent stream position prints the moves that led there (the stream's history) and its own."""
    monkeypatch.setattr("mini.dataset.held_out_keys", frozenset)  # not the point here
    source = StreamSource(LabelsAhead(), env_ratio=0.0, seed=0, ahead=2)
    source.draw(4)
    history = {fen: h for fen, h, _ in itertools.islice(iter_positions(0), 4)}
    drawn = source.draw(30, env_ratio=1.0)
    assert all(s.task == "A" and s.history == history[s.fen] + [s.move] for s in drawn)
    assert all(history.values())


KIWIPETE = "r3k2r/p1ppqpb1/bn2pnp1/3PN3/1p2P3/2N2Q1p/PPPBBPPP/R3K2R w KQkq - 0 1"  # not a stream position


def test_stream_source_a_prompts_use_every_recent_position_and_the_buffer_half_the_time(monkeypatch):
    """--data_source generate: an A: prompt is drawn on a uniformly chosen recent stream position or, half the
    time when there is a replay buffer, on one of the buffer's; a resumed source keeps its window of `capacity`
    recent positions and draws what the original draws."""
    monkeypatch.setattr("mini.dataset.held_out_keys", frozenset)  # not the point here
    source = StreamSource(LabelsAhead(), env_ratio=0.0, seed=0, ahead=2)
    fens = [s.fen for s in source.draw(8)]
    a_fens = [s.fen for s in source.draw(200, env_ratio=1.0)]
    assert set(a_fens) == set(fens) and max(map(a_fens.count, fens)) < 50  # each ~25 times, not the newest only
    buffer = ReplayBuffer(seed=0)
    buffer.add(KIWIPETE)
    source = StreamSource(LabelsAhead(), env_ratio=0.0, seed=0, ahead=2, buffer=buffer)
    source.draw(8)
    a_fens = [s.fen for s in source.draw(400, env_ratio=1.0)]
    assert 160 <= a_fens.count(KIWIPETE) <= 240 and set(a_fens) - {KIWIPETE} <= set(fens)

    source = StreamSource(LabelsAhead(), env_ratio=0.5, seed=0, ahead=2, capacity=3)
    source.draw(2, env_ratio=0.0)
    resumed = StreamSource(LabelsAhead(), env_ratio=0.5, seed=0, ahead=2, capacity=3)
    resumed.load_state_dict(source.state_dict())
    for s in (source, resumed):
        s.draw(5, env_ratio=0.0)
    assert len(resumed.recent) == resumed.recent.maxlen == 3
    assert [x.prompt + x.completion for x in resumed.draw(20)] == [x.prompt + x.completion for x in source.draw(20)]


def test_generate_without_stockfish_is_one_sentence():
    with pytest.raises(FileNotFoundError, match="apt-get install stockfish"):
        make_source(Config(data_source="generate", stockfish_path="/nonexistent/stockfish"))


@pytest.mark.parametrize("game, shown", [(-1, "-1"), (True, "true"), ("3", '"3"'), (None, "null"), (2.0, "2.0")])
def test_a_records_game_is_a_non_negative_integer(tmp_path, game, shown):
    """A record's "game" (annotate.py --pgn: the index of the game it comes from) is a non-negative integer, not a bool
    (true is 1 to isinstance): anything else is one sentence with its line, on a P: record or an A: one."""
    path = tmp_path / "r.jsonl"
    for record in ({"fen": START, "moves": ["e2e4"], "evals": [0.3]}, {"fen": START, "move": "e2e4", "history": ["e2e4"]}):
        path.write_text(json.dumps(dict(record, game=game)) + "\n")
        with pytest.raises(ValueError, match="^" + re.escape(f'{path}:1: a record\'s "game" is the index of the game it '
                                                             f"comes from, a non-negative integer, not {shown}") + "$"):
            load_jsonl(str(path), skip_bad_lines=False)


def test_p_and_a_records_carry_their_game():
    """A P: or A: record's "game" is its sample's (0 included), None without one; it is not part of the content."""
    policy = {"fen": START, "moves": ["e2e4"], "evals": [0.3]}
    env = {"fen": START, "move": "e2e4", "history": ["e2e4"]}
    got = [dataset.annotated_sample(json.dumps(dict(r, **extra))) for r in (policy, env)
           for extra in ({"game": 0}, {"game": 12}, {})]
    assert [(s.task, s.game) for s in got] == [("P", 0), ("P", 12), ("P", None), ("A", 0), ("A", 12), ("A", None)]
    assert got[0] == got[1] == got[2] and got[3] == got[4] == got[5]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
