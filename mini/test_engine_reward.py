"""--p_reward engine: the win-probability formula by hand, hand-made positions judged by Stockfish, the
cache (memory, file, cut-off line), worker processes, labels mode unchanged, errors.

    python -m pytest -q mini/test_engine_reward.py
"""
import json
import math
import os
import signal
import time

import chess
import pytest

from mini import stockfish
from mini.config import Config
from mini.formats import parse_line, policy_completion, policy_sample
from mini.reward_scorer import (EngineReward, ScoringPool, engine_metrics, engine_reward, group_chunks, move_quality,
                                move_score, score, score_batch, score_chunk, win_prob)
from mini.stockfish import ENGINE_NAMES, MATE_CP, Annotator, EngineFailure, find_stockfish
from mini.test_formats import P_LINES
from mini.test_reward_scorer import alive

try:
    STOCKFISH = find_stockfish()
except FileNotFoundError:
    STOCKFISH = None
needs_stockfish = pytest.mark.skipif(STOCKFISH is None, reason="Stockfish binary not found (apt-get install stockfish)")
DEPTH = 10  # the default --engine_depth: 25 ms a search on one core

# labels: Stockfish 15.1 MultiPV 5 at depth 10 (mini/stockfish.py), side to move's pawns
EQUAL = policy_sample(chess.STARTING_FEN, ["g2g3", "e2e4", "d2d4", "g1f3", "c2c4"], [0.27, 0.27, 0.26, 0.25, 0.24])
# Black to move, +0.8 after fxe4; Qd6-e5?? is taken by the d4 pawn for nothing (mini/data/eval.jsonl's labels)
QUEEN = policy_sample("rn2kb1r/pp2p1pp/2pqb2n/3p1pN1/3PP3/5N2/PPPB1PPP/R2QKB1R b KQkq - 0 7",
                      ["f5e4", "d5e4", "h6f7", "e6g8", "g7g6"], [0.8, -0.57, -2.24, -2.82, -2.86])
# Scandinavian, White to move; labelled without its best move e4d5 (+0.35), which the engine must judge
SCANDI = policy_sample("rnbqkbnr/ppp1pppp/8/3p4/4P3/8/PPPP1PPP/RNBQKBNR w KQkq d6 0 2",
                       ["b1c3", "e4e5", "d2d3", "f1d3"], [0.0, -0.02, -0.43, -0.43])
MATE_FEN = "6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1"  # Ra8#
MATE = policy_sample(MATE_FEN, ["a1a8", "g1f2", "a1a7", "g1g2", "a1a5"], [999.99, 2.98, 2.96, 2.88, 2.82])
MATE_UNLABELLED = policy_sample(MATE_FEN, ["g1f2", "a1a7", "g1g2", "a1a5"], [2.98, 2.96, 2.88, 2.82])


def answer(sample, move):
    """The sample's own M:/E: lines with B: move: only the best component can differ from 1."""
    return policy_completion(sample.moves, sample.evals, move)


def engine(tmp_path=None, **kw):
    return EngineReward(STOCKFISH, DEPTH, cache_path=str(tmp_path / "moves.jsonl") if tmp_path else "", **kw)


def best_of(sample, move, spec):
    return score_chunk([sample], [answer(sample, move)], engine=spec)[0][0][1]["best"]


# ----------------------------------------------------------------------------- the formula, by hand

def test_win_prob_by_hand():
    assert win_prob(0) == 0.5
    assert win_prob(100) == pytest.approx(1 / (1 + math.exp(-0.368208)), abs=1e-12) == pytest.approx(0.591026, abs=1e-6)
    assert win_prob(-300) == pytest.approx(0.248874, abs=1e-6)
    for cp in (-700, -50, 0, 120, 999):  # Lichess's win% = 50 + 50 * (2 / (1 + exp(-k cp)) - 1)
        assert 100 * win_prob(cp) == pytest.approx(50 + 50 * (2 / (1 + math.exp(-0.00368208 * cp)) - 1))
    assert win_prob(5000) == win_prob(1000) == pytest.approx(0.975447, abs=1e-6)  # clipped at 10 pawns
    assert win_prob(-5000) == win_prob(-1000) == pytest.approx(0.024553, abs=1e-6)  # on both sides
    assert (win_prob(99999), win_prob(99001), win_prob(-99997)) == (1.0, 1.0, 0.0)  # mates, labels' 999.97 too


def test_move_score_by_hand():
    assert move_score(0, 0) == 1.0 and move_score(0, 50) == 1.0  # better than the labelled best: capped
    assert move_score(0, -20) == pytest.approx(0.963, abs=1e-3)
    assert move_score(0, -900) == pytest.approx(2 / (1 + math.exp(0.00368208 * 900)), abs=1e-12)  # 0.070
    assert move_score(300, 0) == pytest.approx(0.5 / 0.751126, abs=1e-6)
    assert move_score(99999, 500) == pytest.approx(0.863072, abs=1e-6)  # a mate missed, still winning
    assert move_score(0, -99999) == 0.0 and move_score(-99999, -99999) == 1.0  # mated whatever: nothing lost
    assert move_score(-1200, -3000) == 1.0  # both beyond the clip: the same W, nothing more to lose


def test_engine_scores_by_hand():
    """to_cp and to_pawns take the side to move's view (python-chess's relative score): +0.5 for Black to move is
    +50 cp, not White's -50; mate in 3 is MATE_CP - 3 cp, 999.97 pawns; mated in 2 is -(MATE_CP - 2), -999.98."""
    import chess.engine
    pov = lambda score, turn=chess.WHITE: chess.engine.PovScore(score, turn)
    assert (stockfish.to_cp(pov(chess.engine.Cp(50), chess.BLACK)), stockfish.to_pawns(pov(chess.engine.Cp(-35)))) == \
        (50, -0.35)
    assert stockfish.to_cp(pov(chess.engine.Mate(3))) == MATE_CP - 3 == 99997
    assert stockfish.to_pawns(pov(chess.engine.Mate(3), chess.BLACK)) == 999.97
    assert (stockfish.to_cp(pov(chess.engine.Mate(-2))), stockfish.to_pawns(pov(chess.engine.Mate(-2)))) == \
        (-99998, -999.98)


def test_move_quality_labelled_and_illegal_moves():
    """No engine needed: labelled moves take their labelled eval, an illegal move scores 0 and costs the cap."""
    q = move_quality(QUEEN, "d5e4")  # -0.57 against the best 0.8: W 0.4477 / 0.5731
    assert q["cpl"] == 137 and q["score"] == pytest.approx(0.4477 / 0.5731, abs=1e-4)
    assert q["winprob_loss"] == pytest.approx(0.5731 - 0.4477, abs=1e-4)
    assert move_quality(QUEEN, "f5e4") == {"score": 1.0, "cpl": 0, "winprob_loss": 0.0}
    assert move_quality(QUEEN, "d6d1") == {"score": 0.0, "cpl": 1000, "winprob_loss": win_prob(80)}
    assert move_quality(QUEEN, None)["score"] == 0.0
    assert move_quality(QUEEN, "d6e5") is None  # legal, unlabelled, no engine eval: the caller falls back
    # the engine finds an unlabelled move better than the labelled best (0.0): nothing lost, never less than 0
    assert move_quality(SCANDI, "e4d5", cp_after=60) == {"score": 1.0, "cpl": 0, "winprob_loss": 0.0}
    # a text line's labels come shuffled (formats.py): the best is the top eval wherever it stands
    shuffled = policy_sample(QUEEN.fen, QUEEN.moves[::-1], QUEEN.evals[::-1], best="f5e4")
    assert move_quality(shuffled, "d5e4") == move_quality(QUEEN, "d5e4") and move_quality(shuffled, "f5e4")["cpl"] == 0


def test_labels_mode_is_todays_reward():
    """Rewards of mini/reward_scorer.py before the engine reward existed, for both shapings; the Black line's
    label h7f6 and other move a4a3 by their evals' ranks (5th and 3rd: 0.2 + 0.8 * (5 * 0.15 + 5) / 10 = 0.66,
    and 0.74 with 0.35), since the reward ranks by eval for both colours; on the third line every move is 0.0, so
    the other move is as good as the label (1.0)."""
    samples = [parse_line(line) for line in P_LINES]
    pairs = []
    for s in samples:
        other = next(m for m in s.moves if m != s.best)
        pairs += [(s, s.completion), (s, s.completion.replace("B: " + s.best, "B: " + other)), (s, s.completion[:30]),
                  (s, " M: a1a1 E: 0.0 B: a1a1")]
    pairs += [(samples[0], samples[0].completion.replace("B: b3b5", "B: " + m)) for m in ("d2e3", "b3a3")]
    today = {"continuous": [1.0, 0.8, -0.3, 0.2, 0.6599999999999999, 0.74, -0.3, 0.2, 1.0, 1.0, -0.3, 0.2,
                            0.6200000000000001, 0.6000000000000001],
             "graduated": [1.0, 0.8, -0.3, 0.2, 0.6, 0.6, -0.3, 0.2, 1.0, 1.0, -0.3, 0.2, 0.6, 0.6]}
    for shaping, rewards in today.items():
        scored = score_batch([s for s, _ in pairs], [c for _, c in pairs], shaping)
        assert [r for r, _ in scored] == rewards
        assert scored == [score(s, c, shaping) for s, c in pairs]
        pool = ScoringPool(0, shaping, engine_reward(Config()))  # default --p_reward labels: no engine
        assert pool.submit([s for s, _ in pairs], [c for _, c in pairs])() == scored and pool.take_metrics() == {}


def test_scoring_workers_share_the_cores_among_their_engines(monkeypatch):
    """--p_reward engine with 2 scoring processes on 8 cores: 4 Stockfish processes each, not 8 (16 engines on 8
    cores); a count the settings give stays."""
    monkeypatch.setattr(os, "cpu_count", lambda: 8)
    pool = ScoringPool(2, engine=EngineReward("/usr/games/stockfish"))
    pool.close()
    assert pool.engine.engines == 4
    assert ScoringPool(0, engine=EngineReward("/usr/games/stockfish", engines=3)).engine.engines == 3
    monkeypatch.setattr(os, "cpu_count", lambda: 2)  # more scoring processes than cores: one engine each, not 0
    pool = ScoringPool(3, engine=EngineReward("/usr/games/stockfish"))
    pool.close()
    assert pool.engine.engines == 1


def test_group_chunks_keep_groups_whole():
    s = [parse_line(line) for line in P_LINES]
    batch = [s[0]] * 3 + [s[1]] * 3 + [s[2]] * 3
    assert group_chunks(batch, 2) == [0, 6] and group_chunks(batch, 3) == [0, 3, 6] and group_chunks(batch, 1) == [0]
    assert group_chunks([s[0]] * 9, 4) == [0]


def test_group_chunks_make_no_more_chunks_than_workers():
    """Chunks of ceil(n / parts) samples: 10 distinct prompts in 3 parts are chunks of 4, 4 and 2 (rounding the size
    down to 3 would make a fourth chunk, for a pool of 3 workers); 7 in 2 parts are 4 and 3."""
    board, samples = chess.Board(), []
    for move in ["e2e4", "e7e5", "g1f3", "b8c6", "f1b5", "a7a6", "b5a4", "g8f6", "e1g1", "f8e7"]:
        samples.append(policy_sample(board.fen(), [move], [0.0]))
        board.push_uci(move)
    assert group_chunks(samples, 3) == [0, 4, 8] and group_chunks(samples[:7], 2) == [0, 4]


def test_missing_stockfish_fails_in_one_sentence():
    with pytest.raises(FileNotFoundError, match=r"^--p_reward engine needs Stockfish, which was not found .*"
                                                r"apt-get install stockfish.*--stockfish_path"):
        engine_reward(Config(p_reward="engine", stockfish_path="/nonexistent/stockfish"))


def script(tmp_path, name, body):
    """An executable file of these bytes, for find_stockfish to try."""
    path = tmp_path / name
    path.write_bytes(body)
    path.chmod(0o755)
    return str(path)


def test_a_binary_that_answers_in_other_bytes_is_not_a_uci_engine(tmp_path):
    """--stockfish_path at gzip, say, which answers `uci` with compressed bytes: one sentence, not a
    UnicodeDecodeError."""
    fake = script(tmp_path, "gzipish", b"#!/bin/sh\nprintf '\\037\\213\\377\\376'\n")
    with pytest.raises(FileNotFoundError, match=r"gzipish is not a UCI chess engine .* --stockfish_path"):
        find_stockfish(fake)


def test_a_program_that_writes_without_end_is_cut_off_not_kept(tmp_path, monkeypatch):
    """--stockfish_path at `yes`: its answer is read up to HANDSHAKE_BYTES, then it is killed, one sentence at
    once; not gigabytes kept for HANDSHAKE_S (a `uciok` past the cap is not looked for)."""
    monkeypatch.setattr(stockfish, "HANDSHAKE_BYTES", 1000)
    read = []
    handshake = stockfish.uci_handshake
    monkeypatch.setattr(stockfish, "uci_handshake", lambda path: read.append(handshake(path)) or read[-1])
    endless = script(tmp_path, "endless", b"#!/bin/sh\nwhile :; do echo 'id author y'; done\necho uciok\n")
    t0 = time.time()
    with pytest.raises(FileNotFoundError, match=r"endless is not a UCI chess engine"):
        find_stockfish(endless)
    answer, returncode = read[0]
    assert 1000 <= len(answer) < 1000 + (1 << 16) and returncode is None and time.time() - t0 < 5


@pytest.mark.parametrize("body", [b"#!/bin/sh\nexec sleep 10\n", b"#!/bin/sh\nsleep 10\n"])
def test_a_program_that_never_answers_times_out_in_one_sentence(tmp_path, monkeypatch, body):
    """Silent past HANDSHAKE_S: one sentence, the program killed; a child it started that keeps the output
    open (the shell's `sleep`) does not hold the caller."""
    monkeypatch.setattr(stockfish, "HANDSHAKE_S", 1.0)
    silent = script(tmp_path, "silent", body)
    t0 = time.time()
    with pytest.raises(FileNotFoundError, match=r"silent did not answer `uci` within 1 s; point --stockfish_path"):
        find_stockfish(silent)
    assert time.time() - t0 < 5


def test_an_engines_name_is_its_uci_id_name(tmp_path):
    """The name that keys the caches is the text of `id name`, whole; an engine without one is "unnamed engine"."""
    named = script(tmp_path, "named", b"#!/bin/sh\necho 'id author Someone'\necho 'id name FakeFish 2.1'\necho uciok\n")
    unnamed = script(tmp_path, "unnamed", b"#!/bin/sh\necho uciok\n")
    assert find_stockfish(named) == named and ENGINE_NAMES[named] == "FakeFish 2.1"
    assert find_stockfish(unnamed) == unnamed and ENGINE_NAMES[unnamed] == "unnamed engine"


def test_an_engine_killed_after_its_uciok_is_accepted(tmp_path):
    """A signal after the handshake's `uciok` (the engine spoke UCI, then died): accepted under its name, not called
    killed during its handshake; only a kill before `uciok` is (mini/test_faults.py)."""
    killed = script(tmp_path, "killed_after", b"#!/bin/sh\necho 'id name KilledFish'\necho uciok\nkill -9 $$\n")
    assert find_stockfish(killed) == killed and ENGINE_NAMES[killed] == "KilledFish"


def test_stockfish_off_path_is_found_in_usr_games(tmp_path, monkeypatch):
    """Debian installs Stockfish in /usr/games, which is often not on PATH: found there without --stockfish_path."""
    if not os.access("/usr/games/stockfish", os.X_OK):
        pytest.skip("no /usr/games/stockfish")
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing on it
    assert find_stockfish() == "/usr/games/stockfish"


@needs_stockfish
def test_a_short_call_deadline_still_allows_the_handshake(tmp_path):
    """A shallow search's deadline (a fraction of a second once ENGINE_GRACE_S is small) bounds the searches, not
    the engine's start: an engine that takes 1 s to answer `uci` starts, and searches."""
    import chess.engine
    slow = script(tmp_path, "slow", f"#!/bin/sh\nsleep 1\nexec {STOCKFISH}\n".encode())
    engine = stockfish.open_engine(slow, 0.5)
    try:
        assert engine.timeout == 0.5 and engine.analyse(chess.Board(), chess.engine.Limit(depth=1))["pv"]
    finally:
        stockfish.close_engine(engine)


def test_a_file_that_cannot_be_run_is_one_sentence(tmp_path):
    """An executable file the system cannot start (no #! line, not a program): one sentence, no traceback."""
    bad = script(tmp_path, "notaprogram", b"\x00\x01\x02 not a program")
    with pytest.raises(FileNotFoundError, match=r"notaprogram cannot be started \(Exec format error\); point "
                                                r"--stockfish_path at the Stockfish binary"):
        find_stockfish(bad)


def test_engine_metrics_sum_processes():
    c = {"hits": 3, "misses": 1, "rejected": 0, "seconds": 0.5}
    assert engine_metrics([c, c]) == {"engine_lookups": 8, "engine_cache_hit_rate": 0.75, "engine_seconds": 1.0,
                                      "engine_rejected": 0}
    assert engine_metrics([{}]) == {} and engine_metrics([c | {"hits": 0, "misses": 0}])["engine_cache_hit_rate"] == 1.0
    # a position the engine rejected was a miss already (searched, no score) or never looked up (an invalid board):
    # lookups are hits + misses, whatever the rejected count
    assert engine_metrics([{"hits": 1, "misses": 3, "rejected": 2, "seconds": 0.25}]) == {
        "engine_lookups": 4, "engine_cache_hit_rate": 0.25, "engine_seconds": 0.25, "engine_rejected": 2}


# ----------------------------------------------------------------------------- Stockfish judges

@needs_stockfish
def test_hand_made_positions():
    spec = engine()
    assert best_of(SCANDI, "e4d5", spec) == 1.0  # Stockfish's best, unlabelled here: searched, at least the labels' best
    assert best_of(EQUAL, "b1c3", spec) > 0.9  # ~ +0.03 against +0.27
    assert best_of(QUEEN, "d6e5", spec) < 0.1  # dxe5: ~ -8.7 against +0.8
    assert best_of(QUEEN, "f5e4", spec) == 1.0  # the labelled best
    assert best_of(MATE, "a1a8", spec) == best_of(MATE_UNLABELLED, "a1a8", spec) == 1.0  # mates, labelled or not
    assert best_of(MATE, "a1h8", spec) == 0.0  # illegal
    assert best_of(MATE, "g1f2", spec) == pytest.approx(win_prob(298))  # +2.98 against a mate
    # a labelled move takes the engine's judgement of its labelled eval, also below its rank's: the second of two,
    # a queen lost (-8.7 against +0.8), keeps W(-870) / W(80) = 0.068 of the best's expected score, not rank 2's 0.5
    blunder = policy_sample(QUEEN.fen, ["f5e4", "d6e5"], [0.8, -8.7])
    assert best_of(blunder, "d6e5", spec) == pytest.approx(move_score(80, -870)) == pytest.approx(0.0681, abs=1e-4)
    # the other components stay: a wrong eval costs what it cost before
    wrong = policy_completion(QUEEN.moves, [0.0] * 5, "f5e4")
    assert score_chunk([QUEEN], [wrong], engine=spec)[0] == [score(QUEEN, wrong)]


@needs_stockfish
def test_eval_after_agrees_with_a_direct_search():
    import chess.engine
    ann = engine().annotator()
    cp = ann.evals_after([(QUEEN.fen, "d6e5")])[QUEEN.fen, "d6e5"]
    board = chess.Board(QUEEN.fen)
    board.push_uci("d6e5")
    with chess.engine.SimpleEngine.popen_uci(STOCKFISH) as sf:
        sf.configure({"Threads": 1})
        info = sf.analyse(board, chess.engine.Limit(depth=DEPTH), game=object())
    assert cp == -info["score"].relative.score(mate_score=100000) and cp < -500


@needs_stockfish
def test_a_mate_after_the_move_counts_the_move(tmp_path):
    """Kb6 mates in 2 (Kb8, Rh8#): after it the opponent is mated in 1, so from before it the mover mates in 2,
    MATE_CP - 2, as a search from the root says (and the labels' convention); a move cache of the rule before,
    one short, is searched again."""
    import chess.engine
    fen, move = "k7/8/2K5/8/8/8/8/7R w - - 0 1", "c6b6"
    with chess.engine.SimpleEngine.popen_uci(STOCKFISH) as sf:
        root = sf.analyse(chess.Board(fen), chess.engine.Limit(depth=DEPTH), root_moves=[chess.Move.from_uci(move)])
    assert root["score"].relative.score(mate_score=MATE_CP) == MATE_CP - 2
    path = tmp_path / "moves.jsonl"
    with Annotator(depth=DEPTH, workers=1, cache_path="", multipv=1) as ann:
        old = {"fen": fen, "move": move, "limit": ann.tag, "engine": ann.engine, "cp": MATE_CP - 1}
    path.write_text(json.dumps(old) + "\n")
    with Annotator(depth=DEPTH, workers=1, cache_path="", multipv=1, move_cache_path=str(path)) as ann:
        assert ann.evals_after([(fen, move)])[fen, move] == MATE_CP - 2 and ann.stats["misses"] == 1


@needs_stockfish
def test_a_move_that_ends_the_game_is_scored_without_a_search():
    """Rh8 mates at once: MATE_CP - 1 for the mover (mate in 1); Qb6 stalemates and Kxb2 leaves bare kings: 0.
    No engine is asked."""
    mate, stalemate = ("k7/8/1K6/8/8/8/8/7R w - - 0 1", "h1h8"), ("k7/8/2K5/8/8/8/8/1Q6 w - - 0 1", "b1b6")
    bare_kings = ("k7/8/8/8/8/8/1b6/K7 w - - 0 1", "a1b2")  # Kxb2 leaves king against king: a dead draw
    with Annotator(depth=DEPTH, workers=1, cache_path="", multipv=1) as ann:
        ann._with_engine = lambda *a: pytest.fail("a finished game was searched")
        assert ann.evals_after([mate, stalemate, bare_kings]) == {mate: MATE_CP - 1, stalemate: 0, bare_kings: 0}


@needs_stockfish
def test_a_move_that_lets_the_opponent_mate_is_mated_in_as_many_moves():
    """Kh8?? lets Ra8 mate at once: the eval after it, for the mover, is the engine's mate in 1 for the opponent
    negated, -(MATE_CP - 1), as a search from the root restricted to Kh8 says; only the mover's own mates are
    shifted by its move (test_a_mate_after_the_move_counts_the_move)."""
    import chess.engine
    fen, move = "6k1/5ppp/8/8/8/8/8/R5K1 b - - 0 1", "g8h8"
    with chess.engine.SimpleEngine.popen_uci(STOCKFISH) as sf:
        root = sf.analyse(chess.Board(fen), chess.engine.Limit(depth=DEPTH), root_moves=[chess.Move.from_uci(move)])
    assert root["score"].relative.score(mate_score=MATE_CP) == -(MATE_CP - 1)
    with Annotator(depth=DEPTH, workers=1, cache_path="", multipv=1) as ann:
        assert ann.evals_after([(fen, move)]) == {(fen, move): -(MATE_CP - 1)}


@needs_stockfish
def test_batch_dedupe_and_cache(tmp_path, monkeypatch):
    """A group of K asks once per distinct move; the same batch again asks the engine zero times."""
    samples = [EQUAL] * 4 + [QUEEN] * 4
    completions = [answer(EQUAL, m) for m in ("b1c3", "b1c3", "a2a3", "e2e4")] + \
                  [answer(QUEEN, m) for m in ("d6e5", "d6e5", "d6e5", "zzzz")]
    spec = engine(tmp_path)
    first, counters = score_chunk(samples, completions, engine=spec)
    assert counters["misses"] == 3 and counters["hits"] == 0 and counters["seconds"] > 0
    monkeypatch.setattr(spec.annotator(), "_with_engine", None)  # any engine call would fail now
    again, counters = score_chunk(samples, completions, engine=spec)
    assert again == first and counters == {"hits": 3, "misses": 0, "rejected": 0, "seconds": 0.0}
    assert len(open(tmp_path / "moves.jsonl").readlines()) == 3
    assert first[7][0] == -0.3  # "zzzz" does not parse


@needs_stockfish
def test_file_cache_survives_a_cut_off_line(tmp_path):
    path = str(tmp_path / "moves.jsonl")
    pairs = [(EQUAL.fen, "b1c3"), (EQUAL.fen, "a2a3"), (QUEEN.fen, "d6e5")]
    with Annotator(depth=DEPTH, workers=1, cache_path="", multipv=1, move_cache_path=path) as ann:
        want = ann.evals_after(pairs)
    text = open(path).read()
    open(path, "w").write(text[:-20])  # an interrupted write
    with Annotator(depth=DEPTH, workers=1, cache_path="", multipv=1, move_cache_path=path) as ann:
        assert len(ann.move_cache) == 2
        assert ann.evals_after(pairs) == want and ann.stats["misses"] == 1
    with Annotator(depth=DEPTH, workers=1, cache_path="", multipv=1, move_cache_path=path) as ann:
        assert ann.move_cache == {p: want[p] for p in pairs}  # the cut line was ended, the new one is whole
    with Annotator(depth=DEPTH + 1, workers=1, cache_path="", multipv=1, move_cache_path=path) as ann:
        assert not ann.move_cache  # another limit, another result


@needs_stockfish
def test_rejected_positions_keep_the_labels_score(monkeypatch):
    bad = policy_sample("4k3/8/8/8/8/8/4R3/4K3 w - - 0 1", ["e2e3"], [10.0])  # Black, not to move, is in check
    spec = engine()
    got, counters = score_chunk([bad], [answer(bad, "e1d1")], engine=spec)
    assert got == [score(bad, answer(bad, "e1d1"))] and counters["rejected"] == 1
    ann = spec.annotator()

    def crash(work, fen):
        raise EngineFailure(f"Stockfish died 3 times on {fen}")
    monkeypatch.setattr(ann, "_with_engine", crash)
    with pytest.raises(EngineFailure):  # an engine that keeps failing stops the run (mini/test_faults.py)
        score_chunk([EQUAL], [answer(EQUAL, "h2h4")], engine=spec)
    assert (EQUAL.fen, "h2h4") not in ann.move_cache


@needs_stockfish
def test_dead_engine_is_restarted():
    spec = engine()
    ann = spec.annotator()
    ann.evals_after([(EQUAL.fen, "b1c3")])
    rejected = ann.stats["rejected"]
    victim = ann.idle.queue[0] or ann.idle.queue[-1]
    assert os.getpgid(victim.transport.get_pid()) != os.getpgrp()  # a SIGTERM to the caller's group spares it
    os.kill(victim.transport.get_pid(), signal.SIGKILL)
    for m in ("a2a3", "h2h3", "b2b3"):  # every engine of the pool gets a turn
        score_chunk([EQUAL], [answer(EQUAL, m)], engine=spec)
    assert ann.stats["rejected"] == rejected and all((EQUAL.fen, m) in ann.move_cache for m in ("a2a3", "h2h3", "b2b3"))


@needs_stockfish
def test_closing_the_pool_closes_every_engine():
    """ScoringPool.close ends the Stockfish processes of every engine-reward setting this process started (each
    with the number of engines its settings give), not one: python-chess's engine threads would hold the exit."""
    a, b = engine(engines=2), EngineReward(STOCKFISH, DEPTH + 1, engines=1)
    pool = ScoringPool(0, engine=a)
    pool.submit([EQUAL, EQUAL], [answer(EQUAL, "b1c3"), answer(EQUAL, "a2a3")])()
    b.annotator().evals_after([(EQUAL.fen, "h2h3")])
    anns = [a.annotator(), b.annotator()]
    assert [ann.workers for ann in anns] == [2, 1]
    pids = [e.transport.get_pid() for ann in anns for e in ann.idle.queue if e is not None]
    assert len(pids) >= 2
    pool.close()
    assert all(ann.closed for ann in anns) and not any(map(alive, pids))


@needs_stockfish
def test_worker_process_agrees_with_inline():
    samples = [EQUAL] * 3 + [QUEEN] * 3
    completions = [answer(EQUAL, m) for m in ("b1c3", "g2g4", "e2e4")] + [answer(QUEEN, m) for m in ("d6e5", "a7a6", "f5e4")]
    inline = ScoringPool(0, engine=engine())
    want = inline.submit(samples, completions)()
    assert inline.submit(samples, completions)() == want  # a second round of dynamic sampling, from the cache
    m = inline.take_metrics()  # both rounds, not the last alone
    assert (m["engine_lookups"], m["engine_cache_hit_rate"], m["engine_rejected"]) == (8, 0.5, 0)
    assert inline.take_metrics() == {}  # taken once a step
    inline.close()
    pool = ScoringPool(1, engine=engine())
    try:
        assert pool.submit(samples, completions)() == want
        metrics = pool.take_metrics()
        assert metrics["engine_lookups"] == 4 and metrics["engine_cache_hit_rate"] == 0.0
    finally:
        pool.close()


if __name__ == "__main__":
    import sys
    sys.exit(pytest.main([__file__, "-q"]))
