"""Stockfish annotations: agreement with a direct engine call, the mate convention, cache, crash recovery."""
import argparse
import codecs
import contextlib
import errno
import gc
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import CancelledError

import chess
import chess.engine
import pytest
from hypothesis import given, settings, strategies as st

import mini.annotate as annotate
from mini.annotate import main
from mini.config import EVAL_PATH, REAL_EVAL_PATH
from mini.dataset import held_out_keys, load_jsonl, record_keys
from mini.formats import position_key
from mini.positions import build_mates, game_fens, history_bucket, phase
from mini.stockfish import (Annotator, EngineFailure, append_jsonl, close_engine, cp_loss, engine_deadline, find_stockfish,
                            open_engine, read_jsonl)

try:
    STOCKFISH = find_stockfish()
except FileNotFoundError:
    STOCKFISH = None
needs_stockfish = pytest.mark.skipif(STOCKFISH is None, reason="Stockfish binary not found (apt-get install stockfish)")

FENS = [
    chess.STARTING_FEN,
    "2b3k1/Q4rqn/p2p4/4p3/p6p/2PP3P/BP3PP1/R5K1 b - - 0 34",
    "8/8/R7/7p/P2K2k1/7r/8/8 w - - 0 56",
    "8/5k2/r2p1bp1/P6p/2p5/PR4P1/3B1K1P/8 w - - 0 44",
]
DEPTH = 8


def test_missing_binary_says_how_to_fix():
    with pytest.raises(FileNotFoundError, match=r"apt-get install stockfish.*--stockfish_path"):
        find_stockfish("/nonexistent/stockfish")
    with pytest.raises(FileNotFoundError, match="^/bin/cat is not a UCI chess engine .* point --stockfish_path"):
        find_stockfish("/bin/cat")  # it runs, but never says uciok


@pytest.mark.parametrize("flags, says", [(["--depth", "0"], "--depth 0 must be at least 1"),
                                         (["--workers", "0"], "--workers 0 must be at least 1"),
                                         (["--time", "-1"], "--time -1.0 must be above 0"),
                                         (["--games", "-2"], "--games -2 must be at least 0"),
                                         (["--pool", "3"], "Stockfish not found")])
def test_bad_flags_and_a_missing_engine_stop_before_any_work(flags, says, tmp_path, capsys):
    """One sentence and exit code 2, before any position is generated or game played (here no engine exists,
    so a build the checks let through would also stop, but on the engine's sentence)."""
    with pytest.raises(SystemExit) as stop:
        main(flags + ["--stockfish_path", "/nonexistent/stockfish", "--cache", "",
                      "--pool_path", str(tmp_path / "pool.jsonl"), "--eval_path", str(tmp_path / "eval.jsonl")])
    err = capsys.readouterr().err
    assert stop.value.code == 2 and says in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("flags, shipped", [(["--pool", "3"], EVAL_PATH), (["--games", "2"], REAL_EVAL_PATH)],
                         ids=["generated", "games"])
def test_a_pool_path_alone_never_overwrites_the_shipped_held_out_set(flags, shipped, tmp_path, capsys):
    """A pool sent to --pool_path with no --eval_path would have written its held-out set over the shipped one
    (which decides what every training source leaves out): one sentence, before any work."""
    with pytest.raises(SystemExit) as stop:
        main(flags + ["--stockfish_path", "/nonexistent/stockfish", "--cache", "", "--pool_path", str(tmp_path / "p.jsonl")])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and not list(tmp_path.iterdir())
    assert f"would write the held-out set over the shipped {os.path.relpath(shipped)}; give --eval_path" in err[0]


def test_jsonl_cache_ends_a_cut_off_line(tmp_path):
    path = str(tmp_path / "sub" / "cache.jsonl")
    append_jsonl(path, [{"a": 1}, {"a": 2}])
    with open(path, "a") as f:
        f.write('{"a": 3, "b"')  # an interrupted write
    append_jsonl(path, [{"a": 4}])  # not swallowed by the cut-off line
    assert list(read_jsonl(path)) == [{"a": 1}, {"a": 2}, {"a": 4}] and list(read_jsonl(str(tmp_path / "none"))) == []


def test_a_damaged_cache_is_read_past_not_a_traceback(tmp_path):
    """Bytes that are no UTF-8, a JSON list, a record without the keys its reader needs: skipped (recomputed)."""
    path = tmp_path / "cache.jsonl"
    path.write_bytes(b'{"a": 1}\n\xff\xfe{"a": 2}\n[1]\n{"b": 3}\n' + b"[" * 100000 + b"\n")
    assert list(read_jsonl(str(path))) == [{"a": 1}, {"b": 3}] and list(read_jsonl(str(path), keys=("a",))) == [{"a": 1}]


def test_cp_loss_clipped():
    assert (cp_loss(30, 10), cp_loss(10, 30), cp_loss(99990, -50), cp_loss(5, -99990, cap=500)) == (20, 0, 1000, 500)


@needs_stockfish
def test_agrees_with_direct_engine_call(tmp_path):
    with Annotator(depth=DEPTH, workers=2, cache_path=str(tmp_path / "cache.jsonl")) as ann:
        got = ann.annotate(FENS)
    engine = chess.engine.SimpleEngine.popen_uci(STOCKFISH)
    try:
        engine.configure({"Threads": 1})
        for fen in FENS:
            infos = engine.analyse(chess.Board(fen), chess.engine.Limit(depth=DEPTH), multipv=5, game=object())
            moves = [i["pv"][0].uci() for i in infos]
            evals = [i["score"].relative.score(mate_score=100000) / 100 for i in infos]
            assert got[fen] == (moves, evals)
    finally:
        engine.quit()


@needs_stockfish
def test_mate_values_side_to_move(tmp_path):
    mate_in_1 = "6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1"  # Ra8#
    mated_in_1 = "k7/8/1K6/8/8/8/8/7R b - - 0 1"      # Kb8 forced, then Rh8#
    with Annotator(depth=DEPTH, workers=1, cache_path="") as ann:
        got = ann.annotate([mate_in_1, mated_in_1])
    assert got[mate_in_1][0][0] == "a1a8" and got[mate_in_1][1][0] == 999.99
    assert got[mated_in_1] == (["a8b8"], [-999.99])


@needs_stockfish
def test_cache_by_fen_and_limit(tmp_path):
    cache = str(tmp_path / "cache.jsonl")
    with Annotator(depth=DEPTH, workers=1, cache_path=cache) as ann:
        first = ann.annotate(FENS[:2])
    assert len(open(cache).readlines()) == 2
    with Annotator(depth=DEPTH, workers=1, cache_path=cache) as ann:
        ann._analyse = None  # any engine call would fail: everything must come from the cache
        assert ann.annotate(FENS[:2]) == first
    assert not Annotator(depth=DEPTH + 1, workers=1, cache_path=cache).cache  # another limit, another result


@needs_stockfish
def test_cache_is_by_engine_version(tmp_path):
    """Another Stockfish labels otherwise: a shared cache's labels from another version are not reused."""
    cache = str(tmp_path / "cache.jsonl")
    record = {"fen": FENS[0], "limit": f"depth={DEPTH}", "multipv": 5, "moves": ["a2a3"], "evals": [0.1]}
    append_jsonl(cache, [{**record, "engine": "Stockfish 11"}, {**record, "fen": FENS[1]}])  # another, none named
    assert not Annotator(depth=DEPTH, workers=1, cache_path=cache).cache
    append_jsonl(cache, [{**record, "engine": open_engine_name()}])
    assert Annotator(depth=DEPTH, workers=1, cache_path=cache).cache == {FENS[0]: (["a2a3"], [0.1])}


def open_engine_name():
    """The installed Stockfish's UCI name, asked directly."""
    engine = chess.engine.SimpleEngine.popen_uci(STOCKFISH)
    try:
        return engine.id["name"]
    finally:
        engine.quit()


def test_build_command_refuses_counts_that_write_wrong_files(tmp_path, capsys):
    paths = ["--cache", "", "--pool_path", str(tmp_path / "pool.jsonl"), "--eval_path", str(tmp_path / "eval.jsonl")]
    for flags, what in [(["--pool", "3", "--eval", "-1"], "--eval -1 must be at least 0"),
                        (["--pool", "0"], "--pool 0 must be at least 1")]:
        with pytest.raises(SystemExit) as stop:
            main(flags + paths)  # paths: were the check gone, the shipped files stay whole
        assert stop.value.code == 2 and capsys.readouterr().err.strip().endswith(what)


@pytest.mark.parametrize("flags, says", [
    (["--pgn", "{d}/g.pgn", "--eval_transitions", "2"], "--eval_transitions 2 are drawn equally from the 3 "
     "history-length buckets (1-2, 3-5, 6-10 half-moves); give a multiple of 3"),
    (["--games", "4", "--eval_transitions", "601"], "give a multiple of 3"),
    (["--pgn", "{d}/g.pgn", "--eval", "0", "--eval_transitions", "0"], "would write a set of nothing"),
    (["--pgn", "{d}/g.pgn", "--eval_path", "{d}/e.jsonl", "--describe", "{d}/g.pgn"],
     "--describe only prints the distributions of files: leave out --stockfish_path, --cache, --eval_path, --pgn, "
     "or run the build alone")])
def test_builds_that_would_write_less_than_asked_are_refused(flags, says, tmp_path, capsys):
    """--eval_transitions are drawn equally per history bucket, so 2 wrote none and 601 wrote 600, without a word;
    --pgn asked for nothing wrote a set that evaluate.py refuses; --describe beside a build printed and skipped it."""
    (tmp_path / "g.pgn").write_text('[Event "x"]\n[Result "*"]\n\n1. e4 e5 2. Nf3 *\n')
    with pytest.raises(SystemExit) as stop:
        main(["--cache", "", "--stockfish_path", "/nonexistent"] + [f.format(d=tmp_path) for f in flags])
    assert stop.value.code == 2 and says in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["g.pgn"]


@pytest.mark.parametrize("flags, says", [
    (["--pool_path", "{d}/same.jsonl", "--eval_path", "{d}/./same.jsonl"], "the pool would be written over the held-out set"),
    (["--games", "2", "--eval_games", "1", "--pool_path", "{d}/same.jsonl", "--eval_path", "{d}/same.jsonl"],
     "the pool would be written over the held-out set"),
    (["--pool_path", "{d}/pool.jsonl", "--eval_path", "{d}/eval.jsonl", "--cache", "{d}/eval.jsonl"], "an output of this run")])
def test_outputs_that_are_one_file_are_refused_before_any_work(flags, says, tmp_path, capsys):
    """One file for the pool and the held-out set kept the pool alone, and said it wrote both."""
    with pytest.raises(SystemExit) as stop:
        main(["--pool", "2", "--eval", "2", "--stockfish_path", "/nonexistent"] + [f.format(d=tmp_path) for f in flags])
    assert stop.value.code == 2 and says in capsys.readouterr().err and not os.listdir(tmp_path)


@needs_stockfish
def test_engine_crash_is_restarted():
    with Annotator(depth=DEPTH, workers=1, cache_path="") as ann:
        ann.annotate(FENS[:1])
        engine = ann.idle.queue[0]
        os.kill(engine.transport.get_pid(), signal.SIGKILL)
        assert ann.annotate(FENS[1:2])[FENS[1]][0]
        assert ann.idle.queue[0] is not engine


@needs_stockfish
def test_move_losses_agree_with_direct_engine_calls():
    """loss = eval of the best move - eval of the move (a search restricted to it), side to move, in [0, cap]."""
    pairs = [(FENS[1], "c8e6"), (FENS[2], "a6a8"), (FENS[3], "b3b7"), (FENS[3], "b3b9"), (FENS[0], None)]
    with Annotator(depth=DEPTH, workers=2, cache_path="", multipv=1) as ann:
        got = ann.move_losses(pairs, cap=1000)
    engine = chess.engine.SimpleEngine.popen_uci(STOCKFISH)
    try:
        engine.configure({"Threads": 1})
        for (fen, move), r in zip(pairs[:3], got):
            board, limit = chess.Board(fen), chess.engine.Limit(depth=DEPTH)
            best = engine.analyse(board, limit, game=object())
            played = engine.analyse(board, limit, root_moves=[chess.Move.from_uci(move)], game=object())
            best_cp, move_cp = (i["score"].relative.score(mate_score=100000) for i in (best, played))
            assert r == {"loss": min(1000, max(0, best_cp - move_cp)), "best": best["pv"][0].uci(),
                         "best_cp": best_cp, "move_cp": move_cp if move != best["pv"][0].uci() else best_cp}
    finally:
        engine.quit()
    assert got[3]["loss"] == got[4]["loss"] == 1000 and got[3]["best"] is None  # not a legal move: the cap
    mated = "R5k1/5ppp/8/8/8/8/8/6K1 b - - 1 1"
    with Annotator(depth=DEPTH, workers=1, cache_path="") as ann, pytest.raises(ValueError, match="finished position"):
        ann.move_losses([(mated, "g8h8")])


@needs_stockfish
def test_build_command_writes_disjoint_files(tmp_path):
    pool, held_out = str(tmp_path / "pool.jsonl"), str(tmp_path / "eval.jsonl")
    main(["--pool", "8", "--eval", "4", "--depth", "4", "--workers", "2", "--cache", "",
          "--pool_path", pool, "--eval_path", held_out])
    p, e = load_jsonl(pool), load_jsonl(held_out)
    assert len(p) == 8 and len(e) == 4 and not {position_key(s.fen) for s in p} & {position_key(s.fen) for s in e}
    meta = json.loads(open(pool).readline())["meta"]
    assert meta["limit"] == "depth=4" and meta["stockfish"].startswith("Stockfish")


@needs_stockfish
def test_build_command_resumes_from_its_cache(tmp_path, monkeypatch):
    """A run cut off part way (half its cache, the last line cut mid-write) is resumed: the same files, every search
    cached once, none twice; two engines without the cache write the same records. A rerun then finds the screen's
    and the labels' searches in the cache: no engine call, the same files."""
    cache = tmp_path / "cache.jsonl"
    args = ["--pool", "6", "--eval", "2", "--depth", "4", "--workers", "1", "--cache", str(cache),
            "--pool_path", str(tmp_path / "pool.jsonl"), "--eval_path", str(tmp_path / "eval.jsonl")]
    main(args)
    first = [open(tmp_path / f).read() for f in ("pool.jsonl", "eval.jsonl")]
    searches = cache.read_text().splitlines(keepends=True)
    cache.write_text("".join(searches[:len(searches) // 2]) + searches[len(searches) // 2][:30])
    main(args)
    assert [open(tmp_path / f).read() for f in ("pool.jsonl", "eval.jsonl")] == first
    as_text = lambda records: sorted(json.dumps(r, sort_keys=True) for r in records)
    assert as_text(read_jsonl(str(cache))) == as_text(map(json.loads, searches))
    fresh = args[:args.index("--workers")] + ["--workers", "2", "--cache", ""] + args[args.index("--cache") + 2:]
    main(fresh)  # two engines, no cache: the same records (the header's command says how it ran)
    records = lambda texts: [text.splitlines()[1:] for text in texts]
    assert records(open(tmp_path / f).read() for f in ("pool.jsonl", "eval.jsonl")) == records(first)

    def no_engine(self, fen):
        raise AssertionError(f"searched {fen} again")
    monkeypatch.setattr(Annotator, "_analyse", no_engine)
    main(args)
    assert [open(tmp_path / f).read() for f in ("pool.jsonl", "eval.jsonl")] == first


@needs_stockfish
def test_mate_pool_is_labelled_mates_and_held_out_free(tmp_path, capsys, monkeypatch):
    """--mates: positions with a mate in one, Stockfish's PV1 a mate (eval 999.99), none held out (here: the
    first two the seed would give, declared held out); without --pool_path it would overwrite the shipped pool,
    so it refuses."""
    with pytest.raises(SystemExit) as stop:
        main(["--mates", "--pool", "2"])
    assert stop.value.code == 2 and "--pool_path" in capsys.readouterr().err
    held_out = {position_key(r["fen"]) for r in build_mates(2, seed=3)}
    monkeypatch.setattr(annotate, "held_out_keys", lambda: held_out_keys() | held_out)
    pool = str(tmp_path / "mates.jsonl")
    main(["--mates", "--pool", "4", "--seed", "3", "--depth", "4", "--workers", "1", "--cache", "", "--pool_path", pool])
    samples = load_jsonl(pool)
    assert len(samples) == 4 and not {position_key(s.fen) for s in samples} & (held_out_keys() | held_out)
    for s in samples:
        board = chess.Board(s.fen)
        board.push_uci(s.best)
        assert board.is_checkmate() and s.evals[s.moves.index(s.best)] == 999.99


def test_write_jsonl_writes_whole_files_or_leaves_the_old_one(tmp_path):
    """The header, one P: record per position with its labels, history and phase, then one A: record per transition;
    a write that fails part way (here a position without its labels) leaves the previous file as it was, so that a
    build cut off keeps what it had, and its temporary file removed."""
    path, fen = str(tmp_path / "data.jsonl"), chess.STARTING_FEN
    annotate.write_jsonl(path, {"seed": 1}, [(fen, [], "opening")], {fen: (["e2e4"], [0.3])}, [(fen, "g1f3", ["g1f3"])])
    first = open(path).read()
    assert [json.loads(x) for x in first.splitlines()] == [
        {"meta": {"seed": 1}}, {"fen": fen, "moves": ["e2e4"], "evals": [0.3], "history": [], "phase": "opening"},
        {"fen": fen, "move": "g1f3", "history": ["g1f3"]}]
    with pytest.raises(KeyError):
        annotate.write_jsonl(path, {"seed": 2}, [(fen, [], "opening"), (FENS[1], [], "middlegame")],
                             {fen: (["e2e4"], [0.3])})
    assert open(path).read() == first and os.listdir(tmp_path) == ["data.jsonl"]  # and no half-written .tmp


def test_describe_prints_the_distributions_of_a_data_file(tmp_path):
    """Hand-computed over 4 P: positions (move numbers 1, 4, 18, 60; pieces 32, 32, 26, 3; one in check, one whose
    king may not step onto d7 or e7, held by the c6 pawn and the c5 bishop) and 4 A:
    transitions with histories of 2, 3, 5 and 6 half-moves (the buckets' edges); percentiles interpolate
    linearly (numpy's default)."""
    fens = [chess.STARTING_FEN, "rnbqk1nr/ppp2ppp/8/3pp3/1b1P4/6PN/PPP1PP1P/RNBQKB1R w KQkq - 1 4",  # a bishop checks
            "r1bk3r/2p2ppp/2P1p2N/ppB1P3/8/3B1N2/PPP2PPP/3RK2R b K - 0 18", "8/8/4k3/8/8/4K3/4P3/8 w - - 0 60"]
    lines = [{"fen": f, "moves": [m], "evals": [0.0], "history": []}
             for f, m in zip(fens, ["e2e4", "c2c3", "d8e8", "e3d4"])]
    cycle = ["g1f3", "g8f6", "f3g1", "f6g8"] * 3  # a history ends with its own move
    lines += [{"fen": chess.STARTING_FEN, "move": "g1f3", "history": cycle[:n - 1] + ["g1f3"]}
              for n in (6, 2, 5, 3)]  # out of order: the buckets are printed shortest first all the same
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    assert annotate.describe(str(path)) == [
        f"{path}: 4 P: positions, 4 A: transitions",
        "  move number  p10 / p50 / p90: 2 / 11 / 47",   # 1 + 0.3 * 3 = 1.9; (4 + 18) / 2; 18 + 0.7 * 42 = 47.4
        "  pieces       p10 / p50 / p90: 10 / 29 / 32",  # 3 + 0.3 * 23 = 9.9; (26 + 32) / 2; 32
        "  phase        opening 50%, middlegame 25%, endgame 25%",
        "  in check     25.0%",
        "  king safety  check 25%, pin 0%, king_square 25%, unconstrained 50%",
        "  A: history   1-2 25%, 3-5 50%, 6-10 25%"]
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "header.jsonl").write_text('{"meta": {}}\n{"fen": "8/8/8 w", "moves": ["e2e4"]}\n')  # a damaged line
    for bad, says in ((tmp_path, f"{tmp_path}: is a directory; check the path"),
                      (tmp_path / "nowhere.jsonl", f"{tmp_path / 'nowhere.jsonl'}: no such file or directory"),
                      (tmp_path / "empty.jsonl", f"{tmp_path / 'empty.jsonl'} holds no sample (it is empty)"),
                      (tmp_path / "header.jsonl", f"{tmp_path / 'header.jsonl'} holds no sample, only its header")):
        with pytest.raises(SystemExit, match=re.escape(f"annotate.py --describe: {says}")):  # no traceback
            main(["--describe", str(bad)])


RUY_20 = "1. e4 e5 2. Nf3 Nc6 3. Bb5 a6 4. Ba4 Nf6 5. O-O Be7 6. Re1 b5 7. Bb3 d6 8. c3 O-O 9. h3 Nb8 10. d4 Nbd7 1/2-1/2"
RUY_20_UCI = ("e2e4 e7e5 g1f3 b8c6 f1b5 a7a6 b5a4 g8f6 e1g1 f8e7 f1e1 b7b5 a4b3 d7d6 c2c3 e8g8 h2h3 c6b8 d2d4 "
              "b8d7").split()


def write_pgn(path, *games):
    tags = lambda i, headers: f'[Event "test {i}"]' + (f"\n{headers}" if headers else "")
    path.write_text("\ufeff" + "\n\n".join(f"{tags(i, headers)}\n\n{moves}" for i, (headers, moves) in enumerate(games))
                    + "\n", encoding="utf-8")  # with a byte-order mark, as some editors write


def test_read_pgn_keeps_standard_games_from_the_initial_position(tmp_path):
    """The games as UCI moves with their result (a Variant header of any of python-chess's names of standard chess
    kept); a variant, a set-up position, an illegal move, a null move, a game without moves and a FEN header
    python-chess cannot read are skipped and counted, the file's other games still read."""
    path = tmp_path / "g.pgn"
    write_pgn(path, ('[Result "1/2-1/2"]', RUY_20),
              ('[Variant "Atomic"]', "1. e4 e5 *"),
              ('[SetUp "1"]\n[FEN "8/8/4k3/8/8/4K3/4P3/8 w - - 0 60"]', "60. Kd4 *"),
              ("", "1. e4 e5 2. Ke3 *"),  # illegal
              ("", "1. e4 -- 2. d4 *"),  # a null move
              ("", "*"),
              ('[SetUp "1"]\n[FEN "not a position"]', "1. e4 *"),
              ('[Variant "Standard"]\n[Result "1-0"]', "1. f3 e5 2. g4 Qh4# 0-1"),
              ('[Variant "Normal"]', "1. f3 e5 2. g4 Qh4# 0-1"),  # python-chess's other names of standard chess
              ('[Variant "From Position"]', "1. f3 e5 2. g4 Qh4# 0-1"))
    games, skipped = annotate.read_pgn([str(path)])
    assert games == [(RUY_20_UCI, "1/2-1/2"), ("f2f3 e7e5 g2g4 d8h4".split(), "1-0"),  # the header's result
                     ("f2f3 e7e5 g2g4 d8h4".split(), "0-1"), ("f2f3 e7e5 g2g4 d8h4".split(), "0-1")]
    assert skipped == {"of a variant": 1, "set up from a FEN": 1, "with a move python-chess cannot read": 1,
                       "with a null move": 1, "without moves": 1, "that python-chess cannot read": 1}


def test_read_pgn_keeps_chess960_games_from_the_standard_start_in_standard_uci(tmp_path):
    """A Chess960 game from the standard start is standard chess: kept, its castling written e1g1 (standard UCI), not
    Chess960's king-takes-rook e1h1; a Chess960 game from another start is a variant."""
    path = tmp_path / "960.pgn"
    write_pgn(path, ('[Variant "Chess960"]', "1. e4 e5 2. Nf3 Nc6 3. Bc4 Bc5 4. O-O Nf6 5. d3 O-O *"),
              ('[Variant "Chess960"]\n[SetUp "1"]\n[FEN "bbqnnrkr/pppppppp/8/8/8/8/PPPPPPPP/BBQNNRKR w KQkq - 0 1"]',
               "1. e4 e5 *"))
    games, skipped = annotate.read_pgn([str(path)])
    assert games == [("e2e4 e7e5 g1f3 b8c6 f1c4 f8c5 e1g1 g8f6 d2d3 e8g8".split(), "*")]
    assert skipped == {"of a variant": 1}


PGN_PIECES = ['[Event "x"]', '[SetUp "1"]', '[FEN "8/8/8/8/8/8/8/8 w - - 0 1"]', '[FEN "bad"]', '[Variant "Atomic"]',
              "1.", "e4", "e5", "Nf3", "Kf8", "O-O", "e8=Q", "--", "Z0", "(", ")", "{", "}", "$1", "!?", ";c", "%",
              "0-1", "*", "\n", "\n\n", " ", "\ufeff", "é"]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(PGN_PIECES), max_size=60).map(" ".join))
def test_read_pgn_takes_any_text(tmp_path_factory, text):
    """Garbled PGN never raises: each game is read, or skipped and counted."""
    path = tmp_path_factory.mktemp("pgn") / "g.pgn"
    path.write_text(text, encoding="utf-8")
    games, skipped = annotate.read_pgn([str(path)])
    assert all(moves and all(isinstance(m, str) for m in moves) for moves, _ in games)
    assert all(n > 0 for n in skipped.values())


@pytest.mark.parametrize("flags, says", [(["--games", "2"], "--pgn writes a held-out set of the games given: leave out --games"),
                                         (["--pool_path", "p.jsonl"], "leave out --pool_path"),
                                         (["--transitions", "5"], "--transitions draw from played games"),
                                         ([], "--pgn games.pgn: no such file; give PGN files of games"),
                                         (["--pgn", "."], "--pgn .: a folder; give PGN files of games"),
                                         (["--pgn", "/dev/null"], "--pgn /dev/null: not a regular file; give PGN files"),
                                         (["--eval_path", "./games.pgn"], "--eval_path ./games.pgn is also a PGN"),
                                         (["--cache", "games.pgn"], "--cache games.pgn is also a PGN file of --pgn")])
def test_pgn_flags_that_cannot_apply_stop_before_any_work(flags, says, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if flags:  # else the file is missing
        write_pgn(tmp_path / "games.pgn", ("", RUY_20))
    with pytest.raises(SystemExit) as stop:
        main(["--pgn", "games.pgn", "--stockfish_path", "/nonexistent/stockfish", "--cache", ""] + flags)
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and says in err[0]


def test_each_build_writes_its_own_default_files(tmp_path, monkeypatch):
    """Without --pool_path and --eval_path: --games writes the realistic pool (not the shipped generated one) and the
    shipped realistic held-out set, --pgn a held-out set of its own (never the shipped ones); the builds stand in."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(annotate, "find_stockfish", lambda path: path)  # no engine is started
    write_pgn(tmp_path / "games.pgn", ("", RUY_20))
    wrote = []
    monkeypatch.setattr(annotate, "build_from_games", lambda a: wrote.append((a.pool_path, a.eval_path)))
    monkeypatch.setattr(annotate, "build_from_pgn", lambda a: wrote.append(a.eval_path))
    main(["--games", "2", "--cache", ""])
    main(["--pgn", "games.pgn", "--cache", ""])
    assert wrote == [(annotate.GAMES_POOL_PATH, REAL_EVAL_PATH), annotate.PGN_EVAL_PATH]


@needs_stockfish
def test_pgn_set_is_the_games_positions_and_moves_labelled(tmp_path, capsys, monkeypatch):
    """--pgn: P: positions of the games' plies with the moves that led there, Stockfish's labels; A: transitions
    of the moves played (or an illegal one) with histories cut within each bucket from the game's own; fewer than
    asked is said; a file of no usable game, or one that cannot be read, is one sentence."""
    pgn, out = tmp_path / "g.pgn", tmp_path / "eval-pgn.jsonl"
    write_pgn(pgn, ("", RUY_20), ('[Variant "Atomic"]', "1. e4 e5 *"))
    main(["--pgn", str(pgn), "--eval", "30", "--eval_transitions", "9", "--depth", "4", "--workers", "1",
          "--cache", "", "--eval_path", str(out)])
    printed = capsys.readouterr().out
    assert "the 1 games hold 20 of the 30 positions and 9 of the 9 transitions asked" in printed
    assert "skipped 1 of a variant" in printed
    meta = json.loads(out.read_text().splitlines()[0])["meta"]
    assert meta["games"] == 1 and meta["pgn"] == ["g.pgn"] and meta["limit"] == "depth=4"
    samples = load_jsonl(str(out))
    before = {}  # each ply's position -> the moves that led there
    board = chess.Board()
    for move in RUY_20_UCI:
        before[board.fen()] = [m.uci() for m in board.move_stack]
        board.push_uci(move)
    policy, env = [s for s in samples if s.task == "P"], [s for s in samples if s.task == "A"]
    assert sorted(s.fen for s in policy) == sorted(before)
    for s in policy:
        assert s.history == before[s.fen][-9:] and s.best in {m.uci() for m in chess.Board(s.fen).legal_moves}
    assert sorted(history_bucket(len(s.history)) for s in env) == ["1-2"] * 3 + ["3-5"] * 3 + ["6-10"] * 3
    for s in env:
        led = before[s.fen]
        assert s.history[:-1] == led[len(led) - len(s.history) + 1:]  # a cut of the game's own history
    with pytest.raises(SystemExit, match="no game of standard chess from the initial position in .*skipped 1 of a variant"):
        write_pgn(pgn, ('[Variant "Atomic"]', "1. e4 e5 *"))
        main(["--pgn", str(pgn), "--depth", "4", "--workers", "1", "--cache", "", "--eval_path", str(out)])

    def unreadable(paths):
        raise PermissionError(13, "Permission denied", paths[0])
    monkeypatch.setattr(annotate, "read_pgn", unreadable)
    with pytest.raises(SystemExit, match=re.escape(f"annotate.py --pgn: {pgn}: permission denied; check the path")):
        main(["--pgn", str(pgn), "--depth", "4", "--workers", "1", "--cache", "", "--eval_path", str(out)])


class ScreenAnnotator:
    """Annotator's stand-in: position 'p<i>' scores +-4.0 pawns (level enough, the bound) for even i, -9.0 or +9.0
    (lopsided for one side or the other) for odd i; made: the arguments after the engine's path of each one made."""
    engine, tag, made = "fake", "depth=0", []

    def __init__(self, *a, **kw):
        self.made.append((a[1:], kw))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def annotate(self, fens):
        score = lambda i: (4.0 if i % 4 == 0 else -4.0) if i % 2 == 0 else (-9.0 if i % 4 == 1 else 9.0)
        return {f: (["e2e4"], [score(int(f[1:]))]) for f in fens}


def test_the_screen_keeps_level_positions_and_a_quarter_of_lopsided_ones_for_either_side(tmp_path, monkeypatch):
    """Beyond --max_eval pawns for either side a position is kept with probability 1/4, within it (the bound
    included) always; the eval set is the first kept positions, the pool the next ones, in the stream's order. The
    screen searches at --screen_depth for one line, the labels at --depth for five, both with --workers and --cache."""
    monkeypatch.setattr(annotate, "Annotator", ScreenAnnotator)
    monkeypatch.setattr(annotate, "find_stockfish", lambda path: path)  # no engine is started
    monkeypatch.setattr(ScreenAnnotator, "made", [])
    monkeypatch.setattr(annotate, "iter_positions", lambda seed: ((f"p{i}", ["e2e4", f"m{i}"], "endgame")
                                                                  for i in itertools.count()))
    pool, ev = tmp_path / "pool.jsonl", tmp_path / "eval.jsonl"
    main(["--pool", "50", "--eval", "10", "--max_eval", "4", "--workers", "3", "--cache", "c.jsonl", "--depth", "7",
          "--screen_depth", "2", "--pool_path", str(pool), "--eval_path", str(ev)])
    assert ScreenAnnotator.made == [((2, None, 3, "c.jsonl"), {"multipv": 1}), ((7, None, 3, "c.jsonl"), {})]
    records = [json.loads(x) for path in (ev, pool) for x in path.read_text().splitlines()[1:]]
    kept = [int(r["fen"][1:]) for r in records]
    assert all(r == {"fen": f"p{i}", "moves": ["e2e4"], "evals": [ScreenAnnotator().annotate([f"p{i}"])[f"p{i}"][1][0]],
                     "history": ["e2e4", f"m{i}"], "phase": "endgame"} for i, r in zip(kept, records))
    assert len(kept) == 60 and kept == sorted(kept)
    assert set(range(0, kept[-1] + 1, 2)) <= set(kept)  # every level one
    lopsided = [i for i in kept if i % 2]
    assert 0.05 < len(lopsided) / (kept[-1] // 2) < 0.45  # about a quarter of those met (7 of 52 here)
    assert {i % 4 for i in lopsided} == {1, 3}  # either side's

    shipped = os.stat(EVAL_PATH).st_mtime_ns  # --eval 0 with --pool_path: the pool only
    argv = ["--pool", "5", "--eval", "0", "--seed", "3", "--workers", "1", "--cache", "",
            "--pool_path", str(tmp_path / "only.jsonl")]
    main(argv)
    lines = (tmp_path / "only.jsonl").read_text().splitlines()
    assert len(lines) == 1 + 5 and os.stat(EVAL_PATH).st_mtime_ns == shipped
    assert json.loads(lines[0])["meta"] == {  # the header says what labelled the file and how to rebuild it
        "stockfish": "fake", "limit": "depth=0", "multipv": 5, "seed": 3, "pool": 5, "eval": 0,
        "screen": "depth=6, |eval| > 4.0 kept with p=0.25", "generator": "mini.positions.iter_positions",
        "command": "python mini/annotate.py " + " ".join(argv)}


@needs_stockfish
def test_each_submitted_fen_gets_its_own_chunks_labels():
    """submit() labels in chunks of 8 per worker; each FEN's future is the one of the chunk that holds it."""
    for workers, sizes in ((1, [8, 8, 4]), (2, [16, 4])):
        ann = Annotator(depth=1, workers=workers, cache_path="")
        ann.annotate = lambda fens: {f: (["e2e4"], [0.0]) for f in fens}  # no engine needed
        try:
            fens = [f"p{i}" for i in range(20)]
            futures = ann.submit(fens)
            assert all(f in future.result() for f, future in zip(fens, futures))
            assert [len(future.result()) for future in dict.fromkeys(futures)] == sizes
        finally:
            ann.close()


@needs_stockfish
def test_close_lets_the_chunk_being_searched_finish_and_cancels_the_rest(monkeypatch):
    """A Ctrl-C during annotation closes the Annotator: the chunk its thread is searching ends with its labels
    (and caches them), the chunks not started are cancelled, and none ends in an error."""
    import time
    ann = Annotator(depth=1, workers=1, cache_path="")
    search = ann._search
    monkeypatch.setattr(ann, "_search", lambda engine, fen: time.sleep(0.05) or search(engine, fen))
    board, fens = chess.Board(), []
    for move in ["e2e4", "e7e5", "g1f3", "b8c6", "f1b5", "a7a6", "b5a4", "g8f6", "e1g1", "f8e7", "f1e1", "b7b5"]:
        board.push_uci(move)
        fens.append(board.fen())
    futures = ann.submit(fens)  # chunks of 8 and 4
    while not futures[0].running():
        time.sleep(0.01)
    ann.close()
    assert set(futures[0].result()) == set(fens[:8]) and set(fens[:8]) <= set(ann.cache)
    assert futures[-1].cancelled()


def test_engine_deadline_by_hand():
    """ENGINE_GRACE_S + 20 x the search's guess (its time; 100k nodes a second; 1 ms x 1.6^depth, depth at most
    40) x MultiPV lines."""
    assert engine_deadline(chess.engine.Limit(time=2.0)) == 10 + 20 * 2.0
    assert engine_deadline(chess.engine.Limit(nodes=100_000), multipv=5) == 10 + 20 * 1.0 * 5
    assert engine_deadline(chess.engine.Limit(depth=10), multipv=2) == pytest.approx(10 + 20 * 1e-3 * 109.9511627776 * 2)
    # the guess stops growing at depth 40 (1.6^40 ms, about 40 hours): a deeper search still has a deadline
    assert engine_deadline(chess.engine.Limit(depth=60)) == engine_deadline(chess.engine.Limit(depth=40)) < 5e6


class LabelAnnotator(ScreenAnnotator):
    """ScreenAnnotator for real FENs: each labelled with its first legal move in UCI order, eval 0.0."""

    def annotate(self, fens):
        return {f: ([min(m.uci() for m in chess.Board(f).legal_moves)], [0.0]) for f in fens}


FOOLS_MATE, FOOLS_MATE_UCI = "1. f3 e5 2. g4 Qh4# 0-1", "f2f3 e7e5 g2g4 d8h4".split()


def plies_before(moves):
    """{fen of each position a move of the game is played from: the moves that led there}."""
    board, out = chess.Board(), {}
    for move in moves:
        out[board.fen()] = [m.uci() for m in board.move_stack]
        board.push_uci(move)
    return out


RUY_20_FENS = list(plies_before(RUY_20_UCI))


def test_read_pgn_reads_every_file_in_order_whatever_its_encoding(tmp_path):
    """Games of several files, in file then game order: a Latin-1 file (é of a player's name is no UTF-8) and one of
    CRLF lines are read; a game without a Result header has the result its moves end on; a variation is not the
    game's; Z0 and 0000 are null moves; a set-up position that is the initial one is kept; an empty file holds no
    game."""
    latin, crlf, empty = tmp_path / "latin.pgn", tmp_path / "crlf.pgn", tmp_path / "empty.pgn"
    latin.write_bytes('[Event "x"]\n[White "Réti"]\n[Result "1-0"]\n\n1. e4 (1. d4 d5) e5 1-0\n\n'
                      '[Event "y"]\n\n1. e4 Z0 2. d4 *\n'.encode("latin-1"))
    crlf.write_bytes(b'[Event "z"]\r\n[SetUp "1"]\r\n[FEN "' + chess.STARTING_FEN.encode() + b'"]\r\n\r\n1. d4 d5 *\r\n'
                     b'\r\n1. f3 e5 2. g4 Qh4# 0-1\r\n\r\n1. e4 0000 *\r\n')
    empty.write_bytes(b"")
    games, skipped = annotate.read_pgn([str(latin), str(empty), str(crlf)])
    assert games == [(["e2e4", "e7e5"], "1-0"), (["d2d4", "d7d5"], "*"), (FOOLS_MATE_UCI, "0-1")]
    assert skipped == {"with a null move": 2}
    many = tmp_path / "many.pgn"
    write_pgn(many, *[("", FOOLS_MATE)] * 500)
    assert annotate.read_pgn([str(many)]) == ([(FOOLS_MATE_UCI, "0-1")] * 500, {})


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be"])
def test_a_utf_16_pgn_is_read_with_its_byte_order_mark_and_refused_without(tmp_path, encoding):
    """Some Windows programs export UTF-16; read as UTF-8, the file was one game "without moves". With its
    byte-order mark it is read; without one (or any file of NUL bytes) it is refused in one sentence."""
    path, text = tmp_path / "g.pgn", '[Event "x"]\n[White "Réti"]\n\n' + FOOLS_MATE + "\n"
    bom = {"utf-16": b"", "utf-16-le": codecs.BOM_UTF16_LE, "utf-16-be": codecs.BOM_UTF16_BE}[encoding]
    path.write_bytes(bom + text.encode(encoding))
    assert annotate.read_pgn([str(path)]) == ([(FOOLS_MATE_UCI, "0-1")], {})
    path.write_bytes(text.encode("utf-16-le"))
    with pytest.raises(ValueError, match=f"^{re.escape(str(path))} is not a text PGN file \\(it holds NUL bytes"):
        annotate.read_pgn([str(path)])


def test_pgn_build_draws_equal_buckets_says_what_it_skipped_and_follows_its_seed(tmp_path, capsys, monkeypatch):
    """--pgn without an engine (the labels stand in): of two files' games, --eval distinct P: positions among their
    23 plies, each with the moves that led there; --eval_transitions 9 is 3 per history bucket (annotate.py refuses
    a count the 3 buckets do not divide); more than the games hold is written and said; the skipped games are counted by why; another --seed draws
    another set, the same seed the same file. The labels are searched at --depth with --workers and --cache."""
    monkeypatch.setattr(annotate, "Annotator", LabelAnnotator)
    monkeypatch.setattr(annotate, "find_stockfish", lambda path: path)
    monkeypatch.setattr(ScreenAnnotator, "made", [])
    pgn, other, out = tmp_path / "a.pgn", tmp_path / "b.pgn", tmp_path / "out" / "set.jsonl"
    write_pgn(pgn, ("", RUY_20), ('[Variant "Atomic"]', "1. e4 e5 *"),
              ('[SetUp "1"]\n[FEN "8/8/4k3/8/8/4K3/4P3/8 w - - 0 60"]', "60. Kd4 *"),
              ('[SetUp "1"]\n[FEN "8/8/4k3/8/8/3K4/4P3/8 b - - 0 60"]', "60... Kd5 *"))
    write_pgn(other, ('[Result "0-1"]', FOOLS_MATE))
    before = {**plies_before(FOOLS_MATE_UCI), **plies_before(RUY_20_UCI)}
    assert len(before) == 23  # the initial position is in both games

    def run(*flags):
        main(["--pgn", str(pgn), str(other), "--cache", "c.jsonl", "--eval_path", str(out), "--depth", "3",
              "--workers", "2", *flags])
        printed, lines = capsys.readouterr().out, out.read_text().splitlines()
        return printed, json.loads(lines[0])["meta"], [json.loads(x) for x in lines[1:]]

    printed, meta, records = run("--eval", "12", "--eval_transitions", "9")
    assert ScreenAnnotator.made == [((3, None, 2, "c.jsonl"), {})]
    assert printed.startswith(f"wrote 12 P: positions and 9 A: transitions of 2 games to {out}; skipped 1 of a "
                              "variant, 2 set up from a FEN (fake, depth=0) in ")
    assert "asked; writing those" not in printed
    assert {k: meta[k] for k in ("games", "pgn", "seed", "multipv")} == {"games": 2, "pgn": ["a.pgn", "b.pgn"],
                                                                         "seed": 0, "multipv": 5}
    policy, env = [r for r in records if "moves" in r], [r for r in records if "move" in r]
    assert len(policy) == 12 and len({position_key(r["fen"]) for r in policy}) == 12
    assert all(r["fen"] in before and r["history"] == before[r["fen"]][-9:] for r in policy)
    assert all(r["phase"] == phase(chess.Board(r["fen"])) for r in policy)
    assert sorted(history_bucket(len(r["history"])) for r in env) == ["1-2"] * 3 + ["3-5"] * 3 + ["6-10"] * 3
    again = run("--eval", "12", "--eval_transitions", "9")[2]
    reseeded = run("--eval", "12", "--eval_transitions", "9", "--seed", "1")[2]
    assert again == records and {r["fen"] for r in reseeded if "moves" in r} != {r["fen"] for r in policy}
    assert [r for r in reseeded if "move" in r] != env
    printed, _, records = run("--eval", "30", "--eval_transitions", "12")
    assert "the 2 games hold 23 of the 30 positions and 12 of the 12 transitions asked; writing those" in printed
    assert len(records) == 23 + 12
    printed = run("--eval", "5", "--eval_transitions", "3000")[0]
    assert re.search(r"the 2 games hold 5 of the 5 positions and \d+ of the 3000 transitions asked", printed)
    write_pgn(pgn, ('[Variant "Atomic"]', "1. e4 e5 *"))
    with pytest.raises(SystemExit, match=re.escape(f"annotate.py --pgn: no game of standard chess from the initial "
                                                   f"position in {pgn}; skipped 1 of a variant")):
        main(["--pgn", str(pgn), "--cache", "", "--eval_path", str(out)])


@pytest.mark.parametrize("flags, says", [
    (["--pgn", "games.pgn", "--eval_games", "5"],
     "--eval_games draw from played games: --pgn plays none, leave them out"),
    (["--mates", "--pool_path", "p.jsonl", "--cut_rate", "0.5"],
     "--cut_rate draw from played games: --mates plays none, leave them out"),
    (["--eval_games", "5"], "--eval_games draw from played games: give --games N too, or leave them out"),
    (["--mates", "--pool_path", "p.jsonl", "--games", "2"], "--mates writes a training pool of its own: give it "
     "--pool_path PATH (and --pool N), and no --games, --eval or --eval_path"),
    (["--mates", "--pool_path", "p.jsonl", "--eval_path", "e.jsonl"], "and no --games, --eval or --eval_path"),
    (["--mates", "--pool_path", "p.jsonl", "--eval", "5"], "and no --games, --eval or --eval_path"),
    (["--pgn", "games.pgn", "--pool", "50"], "--pgn writes a held-out set of the games given: leave out --pool")])
def test_flags_of_played_games_say_the_one_way_out(flags, says, tmp_path, capsys, monkeypatch):
    """--pgn and --mates refuse --games, so a flag of played games with them is to be left out; it said "give --games N
    too", which the next run then refused. A flag the build would not read is refused too (--mates writes no
    held-out set, --pgn no pool), where it was silently ignored."""
    monkeypatch.chdir(tmp_path)
    write_pgn(tmp_path / "games.pgn", ("", RUY_20))
    monkeypatch.setattr(annotate, "find_stockfish", lambda path: path)  # no engine is started
    for build in ("build_mate_pool", "build_from_pgn", "build_from_games"):  # a build let through ends at once
        monkeypatch.setattr(annotate, build, lambda a: None)
    with pytest.raises(SystemExit) as stop:
        main(flags + ["--cache", ""])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and len(err) == 1 and err[0].endswith(says) and not os.path.exists("p.jsonl")


def test_games_with_no_eval_games_take_a_pool_path_alone(tmp_path, monkeypatch):
    """--games N --eval_games 0 writes no held-out set, so --pool_path alone is no danger to the shipped one."""
    monkeypatch.setattr(annotate, "find_stockfish", lambda path: path)
    built = []
    monkeypatch.setattr(annotate, "build_from_games", lambda a: built.append((a.pool_path, a.eval_games)))
    main(["--games", "2", "--eval_games", "0", "--cache", "", "--pool_path", str(tmp_path / "p.jsonl")])
    assert built == [(str(tmp_path / "p.jsonl"), 0)]


def test_describe_prints_every_file_given_and_a_file_of_one_kind(tmp_path, capsys):
    """--describe A B: each file's lines in turn; a file of A: transitions only has no P: lines, one of P: positions
    only no A: line."""
    only_a, only_p = tmp_path / "a.jsonl", tmp_path / "p.jsonl"
    only_a.write_text(json.dumps({"fen": chess.STARTING_FEN, "move": "e2e4", "history": ["e2e4"]}) + "\n")
    only_p.write_text(json.dumps({"fen": chess.STARTING_FEN, "moves": ["e2e4"], "evals": [0.1], "history": []}) + "\n")
    main(["--describe", str(only_a), str(only_p)])
    assert capsys.readouterr().out.splitlines() == [
        f"{only_a}: 0 P: positions, 1 A: transitions", "  A: history   1-2 100%",
        f"{only_p}: 1 P: positions, 0 A: transitions", "  move number  p10 / p50 / p90: 1 / 1 / 1",
        "  pieces       p10 / p50 / p90: 32 / 32 / 32", "  phase        opening 100%, middlegame 0%, endgame 0%",
        "  in check     0.0%", "  king safety  check 0%, pin 0%, king_square 0%, unconstrained 100%"]


def test_king_shares_take_spaces_and_float_sums_of_one():
    """0.33 + 0.56 + 0.11 is 1.0000000000000002 in floats: a sum of one, not above it; every class named, 0.2 + 0.4
    + 0.3 + 0.1 is too, and 0.1 + 0.5 + 0.3 + 0.1 is 0.9999999999999999: one, not short of it; spaces around a name
    are kept out."""
    assert annotate.king_shares(" check=0.33, pin = 0.56,king_square=0.11") == {"check": 0.33, "pin": 0.56,
                                                                                "king_square": 0.11}
    every = annotate.king_shares("check=0.2,pin=0.4,king_square=0.3,unconstrained=0.1")
    assert every == {"check": 0.2, "pin": 0.4, "king_square": 0.3, "unconstrained": 0.1}
    assert annotate.king_shares("check=0.1,pin=0.5,king_square=0.3,unconstrained=0.1")["pin"] == 0.5
    for text, says in (("check=0.5,pin=0.5,king_square=0.001", "add up to 1.001; at most 1"),
                       ("check=0.5,pin=0.2,king_square=0.2,unconstrained=0.099", "add up to 0.999; with every class")):
        with pytest.raises(argparse.ArgumentTypeError, match=says):
            annotate.king_shares(text)


def test_write_jsonl_makes_its_folder_and_writes_no_transitions_by_default(tmp_path):
    path, fen = tmp_path / "a" / "b" / "set.jsonl", chess.STARTING_FEN
    annotate.write_jsonl(str(path), {}, [(fen, ["e2e4"], "opening")], {fen: (["d2d4"], [0.2])})
    record = {"fen": fen, "moves": ["d2d4"], "evals": [0.2], "history": ["e2e4"], "phase": "opening"}
    assert path.read_text().splitlines() == ['{"meta": {}}', json.dumps(record, separators=(",", ":"))]
    assert os.listdir(path.parent) == ["set.jsonl"]  # the temporary file renamed


def test_realistic_build_holds_out_what_training_reaches_without_an_engine(tmp_path, capsys, monkeypatch):
    """--games with the games and labels standing in: the held-out P: positions are the eval game's plies that no
    training game nor the shipped pool reaches; its A: transitions start and land off them, 2 per bucket; the pool
    draws from the training games and leaves out every held-out position (this build's and the shipped sets'),
    its A: transitions every one of the training games' plies not held out."""
    monkeypatch.setattr(annotate, "Annotator", LabelAnnotator)
    monkeypatch.setattr(annotate, "find_stockfish", lambda path: path)
    train, held = [("e2e4 e7e5 g1f3 b8c6".split(), "*"), (FOOLS_MATE_UCI, "0-1")], [(RUY_20_UCI, "1/2-1/2")]
    monkeypatch.setattr(annotate, "play_games", lambda tag, *a: held if tag.endswith("-eval") else train)
    board = chess.Board()
    board.push_uci("f2f3")
    shipped_pool, shipped_held = {position_key(RUY_20_FENS[19])}, {position_key(board.fen())}
    monkeypatch.setattr(annotate, "shipped_keys", lambda paths: set(shipped_pool))
    monkeypatch.setattr(annotate, "held_out_keys", lambda: frozenset(shipped_held))
    pool, ev = tmp_path / "pool.jsonl", tmp_path / "eval.jsonl"
    main(["--games", "2", "--eval_games", "1", "--pool", "50", "--eval", "50", "--eval_transitions", "6",
          "--cut_rate", "0", "--cache", "", "--pool_path", str(pool), "--eval_path", str(ev)])
    read = lambda path: [json.loads(x) for x in path.read_text().splitlines()[1:]]
    trained = {position_key(f) for moves, _ in train for f in game_fens(moves)} | shipped_pool
    eval_p, eval_a = [r for r in read(ev) if "moves" in r], [r for r in read(ev) if "move" in r]
    assert {position_key(r["fen"]) for r in eval_p} == {position_key(f) for f in RUY_20_FENS} - trained
    assert sorted(history_bucket(len(r["history"])) for r in eval_a) == ["1-2"] * 2 + ["3-5"] * 2 + ["6-10"] * 2
    held_out = shipped_held | {k for r in read(ev) for k in record_keys(r["fen"], r.get("move"))}
    assert not {k for r in eval_a for k in record_keys(r["fen"], r["move"])} & trained
    pool_p, pool_a = [r for r in read(pool) if "moves" in r], [r for r in read(pool) if "move" in r]
    train_plies = {position_key(f) for moves, _ in train for f in plies_before(moves)}
    assert {position_key(r["fen"]) for r in pool_p} == train_plies - held_out
    assert "the 2 games hold 6 positions for a pool of 50; writing those" in capsys.readouterr().out
    assert not {k for r in pool_a for k in record_keys(r["fen"], r["move"])} & held_out and pool_a
    assert all(len(r["history"]) == chess.Board(r["fen"]).ply() + 1 for r in pool_a)  # --cut_rate 0: the whole game
    assert not any("game" in r for r in read(ev) + read(pool))  # only a set of real games (--pgn) names them
    main(["--games", "2", "--eval_games", "1", "--eval_transitions", "6", "--transitions", "4", "--cache", "",
          "--pool_path", str(pool), "--eval_path", str(ev)])
    assert sum("move" in r for r in read(pool)) == 4  # --transitions: at most that many


def test_exclude_keeps_the_held_out_set_off_earlier_training_files(tmp_path, monkeypatch, capsys):
    """--exclude: the positions of a data file (a P: record; an A: record's position and the one its move leads
    to) and of a games file of play_games stay out of a --games held-out set, beside its own training games'.
    A line that is none of these, or --exclude without a held-out set of games, is one sentence."""
    monkeypatch.setattr(annotate, "Annotator", LabelAnnotator)
    monkeypatch.setattr(annotate, "find_stockfish", lambda path: path)
    train, held = [(FOOLS_MATE_UCI, "0-1")], [(RUY_20_UCI, "1/2-1/2")]
    monkeypatch.setattr(annotate, "play_games", lambda tag, *a: held if tag.endswith("-eval") else train)
    data, games = tmp_path / "pool.jsonl", tmp_path / "games-9-train-1.jsonl"
    data.write_text("\n".join(json.dumps(r) for r in (
        {"meta": {}}, {"fen": RUY_20_FENS[10], "moves": [RUY_20_UCI[10]], "evals": [0.0]},
        {"fen": RUY_20_FENS[12], "move": RUY_20_UCI[12], "history": RUY_20_UCI[3:12]})) + "\n")
    games.write_text(json.dumps({"engine": "sf", "games": [[RUY_20_UCI[:8], "*"]]}) + "\n")
    pool, ev = tmp_path / "p.jsonl", tmp_path / "e.jsonl"
    run = lambda *flags: main(["--games", "1", "--eval_games", "1", "--pool", "5", "--eval", "50", "--eval_transitions",
                               "0", "--cache", "", "--pool_path", str(pool), "--eval_path", str(ev), *flags])
    run("--exclude", str(data), str(games))
    held_p = {position_key(json.loads(x)["fen"]) for x in ev.read_text().splitlines()[1:]}
    trained = {position_key(f) for f in game_fens(FOOLS_MATE_UCI)}
    assert held_p == {position_key(RUY_20_FENS[i]) for i in (9, 11, *range(14, 20))} - trained
    run()  # without --exclude, those positions are held out again
    assert len(ev.read_text().splitlines()[1:]) == 19  # every position a move is played from but the start
    for bad in ({"fen": "not a fen"}, {"position": RUY_20_FENS[3]}, [1]):
        data.write_text(json.dumps({"meta": {}}) + "\n" + json.dumps(bad) + "\n")
        with pytest.raises(SystemExit) as stop:
            run("--exclude", str(data))
        says = f"--exclude: {data} line 2 is no record, header or games line of annotate.py"
        assert stop.value.code == 2 and says in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["--pool", "3", "--exclude", str(games), "--cache", ""])
    err = capsys.readouterr().err.strip().splitlines()
    assert stop.value.code == 2 and err[-1].endswith("--exclude keeps a held-out set of played games off earlier "
                                                     "training: give it with --games N and --eval_games N")


def test_a_full_disk_as_the_files_are_written_is_one_sentence(tmp_path, monkeypatch):
    """After hours of analyses, an OSError as the files are written (a full disk) was a traceback; one sentence
    names the file and says where the analyses are."""
    def full(a):
        raise OSError(errno.ENOSPC, "No space left on device", a.pool_path)
    monkeypatch.setattr(annotate, "find_stockfish", lambda path: path)
    monkeypatch.setattr(annotate, "build_from_games", full)
    pool = str(tmp_path / "p.jsonl")
    with pytest.raises(SystemExit) as stop:
        main(["--games", "2", "--eval_games", "0", "--pool_path", pool, "--cache", ""])
    assert str(stop.value) == (f"annotate.py: {pool}: no space left on device; check the path; the analyses done so far "
                               "are in the --cache file, if one was given, and a rerun with the same flags reads them "
                               "back")


@needs_stockfish
def test_an_engine_killed_as_its_search_starts_leaves_no_error_report_at_exit(caplog):
    """A kill in the first milliseconds of a search (Ctrl-C, a deadline) failed the caller's call, as it should,
    and also a future nobody awaited, which asyncio printed at exit with a traceback under annotate.py's one
    sentence (about half of such kills). Each engine's loop now reports every error but the engine's death."""
    caught = []
    for trial in range(20):
        engine = open_engine(STOCKFISH, 60)
        def search():
            try:
                engine.analyse(chess.Board(), chess.engine.Limit(depth=30), multipv=5, game=object())
            except (chess.engine.EngineError, CancelledError) as e:  # either, by the moment of the kill
                caught.append(type(e).__name__)  # not e: its traceback would keep the futures from collection
        worker = threading.Thread(target=search)
        worker.start()
        time.sleep(0.0005 * trial)  # from at once to 10 ms in: the start of the search
        pid = engine.transport.get_pid()
        os.kill(pid, signal.SIGKILL)
        worker.join()
        close_engine(engine, kill=True)
        for thread in threading.enumerate():  # the engine's loop ends, and what it held is collected
            if f"(pid={pid})" in thread.name:
                thread.join(10)
        del engine
        gc.collect()
    assert len(caught) == 20
    assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text
    engine = open_engine(STOCKFISH, 60)  # an error that is not the engine's death is still reported
    lost = engine.protocol.loop.create_future()
    lost.set_exception(ValueError("not about the engine"))
    del lost
    gc.collect()
    close_engine(engine)
    assert "not about the engine" in caplog.text


@needs_stockfish
def test_ctrl_c_during_the_analyses_is_one_sentence_and_keeps_them_in_the_cache(tmp_path, spawn):
    """Hours of annotation end on Ctrl-C with a sentence, not a traceback: no data file is written, and the
    analyses done so far stay in the cache that a rerun reads back."""
    pool, cache = tmp_path / "p.jsonl", tmp_path / "c.jsonl"
    proc = spawn([sys.executable, "-m", "mini.annotate", "--pool", "400", "--eval", "0", "--pool_path", str(pool),
                  "--cache", str(cache), "--workers", "1", "--depth", "14", "--screen_depth", "14",
                  "--stockfish_path", STOCKFISH], stderr=subprocess.PIPE, text=True,
                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # a shell's background job ignores it
    deadline = time.time() + 300
    while not (cache.exists() and cache.read_text().count("\n") >= 1) and time.time() < deadline:
        time.sleep(0.2)  # the screen has written an analysis: the build is under way (not the imports)
    assert proc.poll() is None and cache.exists(), "no analysis in 5 minutes"
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=120)[1].strip().splitlines()
    assert proc.returncode == 1 and err[-1] == (
        "annotate.py: interrupted (Ctrl-C) before its files were written; the analyses done so far are in the --cache "
        "file, if one was given, and a rerun with the same flags reads them back"), err[-3:]
    assert not any("Traceback" in line for line in err) and not pool.exists() and next(read_jsonl(str(cache)), None)



@needs_stockfish
def test_ctrl_c_cuts_off_the_searches_under_way():
    """Ctrl-C while the pool's threads search: the pool's shutdown waited for the search under way (a minute at
    this limit) and every queued one; the engine searching is killed and the queue fails at once, so the
    interrupt comes through in moments, and the Annotator says it was interrupted if used again."""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)  # a shell's background job ignores SIGINT
    with Annotator(STOCKFISH, time_s=60, workers=1, cache_path="") as ann, contextlib.ExitStack() as restore:
        restore.callback(signal.signal, signal.SIGINT, before)
        def interrupt_once_searching():
            while not ann.busy:
                time.sleep(0.05)
            time.sleep(0.5)  # into the search
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # a signal wakes the waiting thread
        threading.Thread(target=interrupt_once_searching, daemon=True).start()
        t0 = time.monotonic()
        with pytest.raises(KeyboardInterrupt):
            ann.annotate(FENS[:3])
        assert time.monotonic() - t0 < 30
        with pytest.raises(EngineFailure, match="the searches were interrupted"):
            ann.annotate(FENS[3:4])


ITALIAN = "1. e4 e5 2. Nf3 Nc6 3. Bc4 Bc5 4. c3 Nf6 5. d3 d6 *"  # its first 4 plies are RUY_20's


def test_pgn_records_name_the_first_game_that_reaches_their_position(tmp_path, capsys, monkeypatch):
    """--pgn writes each record's "game": the index, in read_pgn's order (a skipped game has none), of the first game
    that reaches its position (an A: record's: the one its move is played from), so the positions the two games share
    are game 0's; the records are otherwise those written without games, byte for byte, and load with their game."""
    monkeypatch.setattr(annotate, "Annotator", LabelAnnotator)
    monkeypatch.setattr(annotate, "find_stockfish", lambda path: path)
    pgn, out = tmp_path / "g.pgn", tmp_path / "set.jsonl"
    write_pgn(pgn, ('[Variant "Atomic"]', "1. e4 e5 *"), ("", ITALIAN), ("", RUY_20))
    italian = {position_key(fen) for fen in game_fens(annotate.read_pgn([str(pgn)])[0][0][0])}

    def build():
        main(["--pgn", str(pgn), "--eval", "40", "--eval_transitions", "12", "--cache", "", "--eval_path", str(out)])
        return out.read_text().splitlines()
    lines = build()
    records = [json.loads(line) for line in lines[1:]]
    assert all(r["game"] == (0 if position_key(r["fen"]) in italian else 1) for r in records)
    assert len(records) == 25 + 12 and sum("moves" in r and r["game"] == 0 for r in records) == 10
    shared = {position_key(f) for f in RUY_20_FENS[:5]}
    assert {r["game"] for r in records if position_key(r["fen"]) in shared} == {0}
    assert [s.game for s in load_jsonl(str(out))] == [r["game"] for r in records]
    monkeypatch.setattr(annotate, "first_games", lambda games, fens: None)  # written as before games were
    assert [re.sub(r',"game":\d+}$', "}", line) for line in lines] == build()


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
