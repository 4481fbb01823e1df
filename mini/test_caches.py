"""Caches keyed by every setting that changes their content, and the run lock's view of a process.

Annotator's position cache (MultiPV labels) is keyed by FEN, limit (depth, nodes or time), MultiPV and engine
version; its move cache (evals after a move) by FEN, move, limit and engine version. A record that differs from
this Annotator's settings in any one of them is a miss: a planted record with a value no search gives (moves
["a2a3"] and eval 9.99 for the starting position, 12345 cp after e2e4) comes back only where every key agrees.

    python mini/test_caches.py
"""
import json
import os
import re
import socket

import chess
import chess.engine
import pytest

import mini.runs as runs
from mini import stockfish
from mini.stockfish import ENGINE_NAMES, MOVE_CACHE_RULE, Annotator, append_jsonl
from mini.reward_scorer import EngineReward, close_engines
from mini.selfplay import SelfPlaySource
from mini.test_selfplay import STOCKFISH, needs_stockfish

START = chess.STARTING_FEN
PLANTED = (["a2a3"], [9.99])


def label_record(**kw):
    return {"fen": START, "limit": "depth=2", "multipv": 5, "engine": ENGINE_NAMES[STOCKFISH], "moves": ["a2a3"],
            "evals": [9.99], **kw}


def move_record(**kw):
    return {"fen": START, "move": "e2e4", "limit": "depth=2", "engine": ENGINE_NAMES[STOCKFISH], "rule": MOVE_CACHE_RULE,
            "cp": 12345, **kw}


@needs_stockfish
@pytest.mark.parametrize("settings, record, hit", [
    (dict(depth=2), {}, True),
    (dict(depth=3), {}, False),                                  # depth
    (dict(depth=2), dict(engine="Stockfish 11"), False),         # engine version
    (dict(depth=2, multipv=1), {}, False),                       # MultiPV
    (dict(depth=2, nodes=500), {}, False),                       # nodes instead of a depth
    (dict(depth=2, nodes=500), dict(limit="nodes=500"), True),
    (dict(depth=2, nodes=600), dict(limit="nodes=500"), False),  # other nodes
])
def test_a_label_is_reused_only_under_the_same_settings(tmp_path, settings, record, hit):
    cache = str(tmp_path / "labels.jsonl")
    append_jsonl(cache, [label_record(**record)])
    with Annotator(workers=1, cache_path=cache, **settings) as ann:
        got = ann.annotate([START])[START]
        assert (got == PLANTED) is hit
        if not hit:  # searched: legal moves, and the new label is cached under this Annotator's key
            assert set(got[0]) <= {m.uci() for m in chess.Board().legal_moves}
    with Annotator(workers=1, cache_path=cache, **settings) as again:
        assert again.cache[START] == got


@needs_stockfish
@pytest.mark.parametrize("settings, record, hit", [
    (dict(depth=2), {}, True),
    (dict(depth=3), {}, False),
    (dict(depth=2), dict(engine="Stockfish 11"), False),
    (dict(depth=2, nodes=500), {}, False),
    (dict(depth=2, nodes=500), dict(limit="nodes=500"), True),
    (dict(depth=2, nodes=600), dict(limit="nodes=500"), False),
])
def test_an_eval_after_a_move_is_reused_only_under_the_same_settings(tmp_path, settings, record, hit):
    cache = str(tmp_path / "moves.jsonl")
    append_jsonl(cache, [move_record(**record)])
    with Annotator(workers=1, cache_path="", multipv=1, move_cache_path=cache, **settings) as ann:
        cp = ann.evals_after([(START, "e2e4")])[START, "e2e4"]
        assert (cp == 12345) is hit and ann.stats["hits"] == int(hit) and ann.stats["misses"] == int(not hit)
        assert abs(cp) < 200 or hit  # a searched eval of 1. e4 is near equal


@needs_stockfish
def test_a_move_cache_line_still_being_written_is_read_once_it_is_whole(tmp_path):
    """The move cache is shared with other processes: a line another writer has not finished is left for a later
    read, not skipped as malformed (which would lose it, and garble the read after it)."""
    cache = tmp_path / "moves.jsonl"
    append_jsonl(str(cache), [move_record()])
    line = json.dumps(move_record(move="d2d4", cp=23456)) + "\n"
    with open(cache, "a") as f:
        f.write(line[:30])  # cut mid-record
    with Annotator(workers=1, cache_path="", multipv=1, move_cache_path=str(cache), depth=2) as ann:
        assert (START, "e2e4") in ann.move_cache and (START, "d2d4") not in ann.move_cache
        with open(cache, "a") as f:
            f.write(line[30:])
        assert ann.evals_after([(START, "d2d4")]) == {(START, "d2d4"): 23456}
        assert ann.stats["hits"] == 1 and ann.stats["misses"] == 0


@needs_stockfish
def test_a_move_cache_cut_back_or_made_anew_is_read_from_its_start(tmp_path):
    """Another process empties the shared move cache (or a user deletes it) and writes a shorter one: its lines are
    read from the start, not from the old end past them, where every later hit was missed."""
    cache = tmp_path / "moves.jsonl"
    append_jsonl(str(cache), [move_record(move=m) for m in ("e2e4", "d2d4", "g1f3")])
    with Annotator(workers=1, cache_path="", multipv=1, move_cache_path=str(cache), depth=2) as ann:
        cache.unlink()
        append_jsonl(str(cache), [move_record(move="c2c4", cp=23456)])
        assert ann.evals_after([(START, "c2c4")]) == {(START, "c2c4"): 23456}
        assert ann.stats["hits"] == 1 and ann.stats["misses"] == 0

@needs_stockfish
def test_a_damaged_move_cache_line_is_read_past_not_a_traceback(tmp_path):
    """Lines that are JSON but not a record (a number, a list, a record without its position or its eval, or with a
    position or move that is not text, nesting too deep for the parser) or bytes that are no UTF-8 are skipped like
    a cut-off line: the records around them are read."""
    cache = tmp_path / "moves.jsonl"
    damaged = ["123", "[1, 2]", '"text"', json.dumps({k: v for k, v in move_record().items() if k != "fen"}),
               "[" * 100_000 + "]" * 100_000, json.dumps(move_record(fen=[START])), json.dumps(move_record(move={})),
               json.dumps({k: v for k, v in move_record(move="d2d4").items() if k != "cp"}),
               json.dumps(move_record(move="d2d4", cp="x")), json.dumps(move_record(move="g1f3", cp=1.5))]
    cache.write_bytes(b'{"fen": "\xff"}\n' + ("\n".join(damaged + [json.dumps(move_record())]) + "\n").encode())
    with Annotator(workers=1, cache_path="", multipv=1, move_cache_path=str(cache), depth=2) as ann:
        assert ann.move_cache == {(START, "e2e4"): 12345}


@needs_stockfish
def test_a_label_line_whose_position_is_not_text_is_read_past(tmp_path):
    """A label record of this Annotator's settings whose fen is a list or an object (damaged or hand-edited): skipped,
    not an unhashable-key traceback when the cache loads; the whole record after it is read."""
    cache = str(tmp_path / "labels.jsonl")
    append_jsonl(cache, [label_record(fen=[START]), label_record(fen={"a": 1}), label_record()])
    with Annotator(workers=1, cache_path=cache, depth=2) as ann:
        assert ann.cache == {START: PLANTED}


@needs_stockfish
@pytest.mark.parametrize("moves, evals", [("a2a3", [9.99]), (["a2a3"], ["x"]), (["a2a3"], [9.99, 1.0]),
                                          ([1], [9.99]), (["a2a3"], [None]), (["a2a3"], [True]), ("a", [9.99]),
                                          ({"a2a3": 1}, [9.99])])
def test_a_label_line_of_other_moves_or_evals_is_read_past(tmp_path, moves, evals):
    """A label line whose moves or evals are not a list of UCI strings and as many numbers (hand-edited or damaged) is
    read past, where its "x" reached the policy reward as a string."""
    cache = str(tmp_path / "labels.jsonl")
    append_jsonl(cache, [label_record(moves=moves, evals=evals, fen="8/8/8/8/8/8/8/K6k w - - 0 1"), label_record()])
    with Annotator(workers=1, cache_path=cache, depth=2) as ann:
        assert ann.cache == {START: PLANTED}


@needs_stockfish
@pytest.mark.parametrize("missing", ["moves", "evals", "fen"])
def test_a_label_line_without_its_moves_or_evals_is_read_past(tmp_path, missing):
    """A label line of this Annotator's settings that lacks a key (damaged or hand-edited) is skipped, not a KeyError
    when the cache loads; the whole record after it is read."""
    cache = str(tmp_path / "labels.jsonl")
    damaged = {k: v for k, v in label_record(fen="8/8/8/8/8/8/8/K6k w - - 0 1").items() if k != missing}
    append_jsonl(cache, [damaged, label_record()])
    with Annotator(workers=1, cache_path=cache, depth=2) as ann:
        assert ann.cache == {START: PLANTED}


@needs_stockfish
def test_a_fen_given_twice_is_searched_and_cached_once(tmp_path):
    """annotate() searches each distinct FEN once: a repeated one is neither searched again nor written twice."""
    cache, searched = tmp_path / "labels.jsonl", []
    with Annotator(workers=1, cache_path=str(cache), multipv=1, depth=2) as ann:
        search = ann._search
        ann._search = lambda engine, fen: searched.append(fen) or search(engine, fen)
        got = ann.annotate([START, START])
    assert searched == [START] and len(cache.read_text().splitlines()) == 1 and list(got) == [START]


DYING = """#!/bin/sh
while read cmd rest; do
  case $cmd in
    uci) printf 'id name DyingFish\\noption name Threads type spin default 1 min 1 max 512\\n'
         printf 'option name MultiPV type spin default 1 min 1 max 500\\nuciok\\n';;
    isready) echo readyok;;
    go) exit 3;;
    quit) exit 0;;
  esac
done
"""


@needs_stockfish
def test_a_dying_engine_is_tried_three_times_then_named(tmp_path, monkeypatch):
    """An engine that dies on every search is started 3 times (README: after 3 tries the run stops), then one
    EngineFailure names it, the position and the deadline (MultiPV 5 at depth 1: 10 + 20 x 1.6 ms x 5 = 10.16 s);
    every later call fails at once with it, starting no engine."""
    path = tmp_path / "dying"
    path.write_text(DYING)
    path.chmod(0o755)
    starts, open_engine = [], stockfish.open_engine
    monkeypatch.setattr(stockfish, "open_engine", lambda *a: starts.append(a) or open_engine(*a))
    with Annotator(str(path), workers=1, cache_path="", depth=1) as ann:
        failure = "^" + re.escape(f"DyingFish ({path}) died 3 times on {START} (deadline 10.2 s a call); check the")
        with pytest.raises(stockfish.EngineFailure, match=failure):
            ann.annotate([START])
        assert len(starts) == 3
        with pytest.raises(stockfish.EngineFailure, match=failure):
            ann.evals_after([(START, "e2e4")])
        assert len(starts) == 3


@needs_stockfish
def test_a_pair_asked_twice_in_one_call_is_looked_up_once(tmp_path):
    cache = tmp_path / "moves.jsonl"
    append_jsonl(str(cache), [move_record()])
    with Annotator(workers=1, cache_path="", multipv=1, move_cache_path=str(cache), depth=2) as ann:
        assert ann.evals_after([(START, "e2e4")] * 3) == {(START, "e2e4"): 12345}
        assert ann.stats == {"hits": 1, "misses": 0, "rejected": 0, "seconds": 0.0}


@needs_stockfish
def test_an_engine_answer_without_a_score_is_rejected_not_a_traceback(tmp_path):
    """A search whose info holds no score (an engine that answers bestmove alone): None, rejected, not cached."""
    cache = tmp_path / "moves.jsonl"
    with Annotator(workers=1, cache_path="", multipv=1, move_cache_path=str(cache), depth=2) as ann:
        ann._with_engine = lambda work, fen: {}
        assert ann.evals_after([(START, "e2e4")]) == {(START, "e2e4"): None}
        assert (ann.stats["misses"], ann.stats["rejected"], ann.move_cache) == (1, 1, {}) and not cache.exists()


@needs_stockfish
def test_a_finished_position_has_no_label_one_sentence_and_nothing_cached(tmp_path):
    """A position with no legal move (mate, stalemate): the engine gives a line without a move; a ValueError that
    names the position, not a KeyError, and no label written."""
    cache, mated = tmp_path / "labels.jsonl", "R5k1/5ppp/8/8/8/8/8/6K1 b - - 1 1"
    with Annotator(workers=1, cache_path=str(cache), depth=2) as ann:
        with pytest.raises(ValueError, match=f"^no legal move to annotate in {mated}$"):
            ann.annotate([mated])
    assert not cache.exists()


@needs_stockfish
def test_a_search_without_a_score_is_not_cached(tmp_path, monkeypatch):
    """An eval the engine did not give (None) is rejected and searched again next time, never written."""
    cache = tmp_path / "moves.jsonl"
    monkeypatch.setattr(Annotator, "_eval_after", lambda self, fen, move: (None, 0.0))
    with Annotator(workers=1, cache_path="", multipv=1, move_cache_path=str(cache), depth=2) as ann:
        for _ in range(2):
            assert ann.evals_after([(START, "e2e4")]) == {(START, "e2e4"): None}
        assert ann.stats["misses"] == 2 and ann.stats["rejected"] == 2 and not cache.exists()


@needs_stockfish
@pytest.mark.parametrize("settings, limit", [(dict(depth=3), chess.engine.Limit(depth=3)),
                                             (dict(depth=3, nodes=500), chess.engine.Limit(nodes=500)),
                                             (dict(depth=3, time_s=0.05), chess.engine.Limit(time=0.05))])
def test_the_search_limit_is_the_one_its_cache_lines_are_tagged_with(settings, limit):
    with Annotator(workers=1, cache_path="", **settings) as ann:
        assert ann.limit == limit
        assert ann.tag == ("time=0.05" if limit.time else f"nodes={limit.nodes}" if limit.nodes else f"depth={limit.depth}")


@needs_stockfish
def test_an_annotator_runs_one_engine_per_core_and_closes_them(monkeypatch):
    """Without a worker count, one engine per core; every engine started is gone once the Annotator closes."""
    monkeypatch.setattr(os, "cpu_count", lambda: 3)
    with Annotator(cache_path="", depth=2) as ann:
        assert ann.workers == 3 and ann.idle.qsize() == 3
    with Annotator(workers=1, cache_path="", multipv=1, depth=2) as ann:
        ann.evals_after([(START, "e2e4")])
        engine = ann.idle.queue[0]
        assert engine.transport.get_returncode() is None
    ended = engine.transport.get_returncode() is not None
    stockfish.close_engine(engine, kill=True)  # a no-op once closed; an engine left running would hold the tests
    assert ended


@needs_stockfish
@pytest.mark.parametrize("call", ["annotate", "evals_after"])
def test_an_annotator_used_after_close_says_so_and_does_not_wait(call):
    """close() takes its engines out of the idle queue: a search after it used to wait there for ever."""
    import concurrent.futures
    with Annotator(workers=1, cache_path="", multipv=1, depth=2) as ann:
        ann.annotate([START])
    work = {"annotate": lambda: ann.annotate(["8/8/8/4k3/8/8/3PK3/8 w - - 0 1"]),
            "evals_after": lambda: ann.evals_after([(START, "d2d4")])}[call]
    waiter = concurrent.futures.ThreadPoolExecutor(1)
    try:
        with pytest.raises(RuntimeError, match="this Annotator is closed; make a new one"):
            waiter.submit(work).result(timeout=20)
    finally:
        ann.failed = RuntimeError("the test is over")  # a thread left waiting (the bug) then ends without a search
        ann.idle.put(None)
        waiter.shutdown(wait=False)


@needs_stockfish
def test_each_engine_searches_with_one_thread(monkeypatch):
    """Threads 1, set once when the engine starts: a search with one thread and a cleared hash repeats exactly."""
    configured, configure = [], stockfish.DeadlineEngine.configure
    monkeypatch.setattr(stockfish.DeadlineEngine, "configure",
                        lambda self, options: configured.append(options) or configure(self, options))
    with Annotator(workers=1, cache_path="", multipv=1, depth=2) as ann:
        ann.evals_after([(START, "e2e4"), (START, "d2d4")])
    assert configured == [{"Threads": 1}]


@needs_stockfish
def test_a_label_has_as_many_lines_as_the_multipv_asked(tmp_path):
    """MultiPV 2 labels the two best moves (of the 20 legal ones), and the line written says 2."""
    cache = tmp_path / "labels.jsonl"
    with Annotator(workers=1, cache_path=str(cache), multipv=2, depth=2) as ann:
        moves, evals = ann.annotate([START])[START]
    assert len(moves) == len(evals) == 2 and len(set(moves)) == 2
    assert json.loads(cache.read_text())["multipv"] == 2


@needs_stockfish
def test_engine_reward_settings_reach_its_annotator(tmp_path):
    """--engine_depth and --engine_nodes are the limit, hence the cache key, of the engine reward's evals."""
    try:
        by_depth = EngineReward(STOCKFISH, depth=3, cache_path=str(tmp_path / "c.jsonl")).annotator()
        by_nodes = EngineReward(STOCKFISH, depth=3, nodes=700, cache_path=str(tmp_path / "c.jsonl")).annotator()
        assert (by_depth.tag, by_nodes.tag) == ("depth=3", "nodes=700")
        assert (by_depth.move_cache_path, by_depth.multipv) == (str(tmp_path / "c.jsonl"), 1)
    finally:
        close_engines()


@needs_stockfish
def test_selfplay_labels_are_multipv_5_at_its_depth(tmp_path):
    with SelfPlaySource(None, games=1, depth=3, workers=2, cache_path=str(tmp_path / "sf.jsonl"), player=None) as src:
        assert (src.ann.tag, src.ann.multipv, src.ann.cache_path) == ("depth=3", 5, str(tmp_path / "sf.jsonl"))
        assert src.ann.workers == 2


def killing(exc):
    def kill(pid, sig):
        assert sig == 0
        if exc:
            raise exc
    return kill


@pytest.mark.parametrize("exc, alive", [(None, True), (PermissionError, True), (ProcessLookupError, False)])
def test_pid_alive(monkeypatch, exc, alive):
    """os.kill(pid, 0): delivered (ours), PermissionError (another user's live process) or ProcessLookupError."""
    monkeypatch.setattr(runs.os, "kill", killing(exc))
    assert runs.pid_alive(4242) is alive


@pytest.mark.parametrize("exc", [PermissionError, ProcessLookupError])
def test_a_lock_held_by_a_process_that_cannot_be_signalled_is_kept(tmp_path, monkeypatch, exc):
    """A run.lock of PID 4242 on this host: a process we may not signal is alive (the run is refused, the lock
    stays); a process that does not exist is gone (the lock is taken over)."""
    run = runs.RunDir(str(tmp_path), "r")
    os.makedirs(run.path)
    with open(run.lock, "w") as f:
        f.write(f"4242 {socket.gethostname()}\n")
    monkeypatch.setattr(runs.os, "kill", killing(exc))
    if exc is PermissionError:
        with pytest.raises(runs.RunError, match="in use by a running process, PID 4242"):
            run.claim(resume=False)
        assert run.lock_owner() == (4242, socket.gethostname())
    else:
        run.claim(resume=False)
        assert run.lock_owner() == (os.getpid(), socket.gethostname())


if __name__ == "__main__":
    import sys
    sys.exit(pytest.main([__file__, "-q"]))
