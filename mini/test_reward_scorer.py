"""Rewards: a line's true completion (P: with B: at PV1) scores 1.0, alterations score lower in the expected
order, nothing raises."""
import os
import random
import signal
import subprocess
import sys
import time

import chess
import pytest
from hypothesis import given, settings, strategies as st

from mini.evaluate import pv1_of
from mini.formats import parse_line, policy_sample
from mini.reward_scorer import ScoringPool, levenshtein, move_quality, score, score_batch
from mini.test_dataset import run_script
from mini.test_formats import A_LINES, P_LINES

LEVELS = {-0.3, 0.2, 0.4, 0.6, 0.8, 1.0}


@pytest.mark.parametrize("line", P_LINES + A_LINES)
def test_the_true_completion_scores_one(line):
    """A: the line's own completion; P: the line's with B: set to PV1, the best eval (the label on a tie), which
    for Black is not the line's label."""
    s = parse_line(line)
    if s.task == "P":
        s.completion = s.completion.replace("B: " + s.best, "B: " + pv1_of(s))
    for shaping in ("continuous", "graduated", "strict"):
        reward, comps = score(s, s.completion, shaping)
        assert reward == 1.0 and comps["format_valid"] == 1.0 and comps["raw"] == 1.0


def test_policy_alterations_in_order():
    s = parse_line(P_LINES[0])  # white to move; ranking b3b5 (label), b3b7, b3b4, b3f3, b3b1
    ref = s.completion
    r = lambda c: score(s, c)[0]
    shuffled = " M: b3b1 b3b4 b3b5 b3f3 b3b7      E: -2.42 -2.11 -0.8 -2.33 -1.13            B: b3b5"
    second = ref.replace("B: b3b5", "B: b3b7")
    legal_only = ref.replace("B: b3b5", "B: d2e3")       # legal, not in the top 5
    illegal_best = ref.replace("B: b3b5", "B: b3a3")     # onto its own pawn
    illegal_cand = ref.replace("b3b1", "b3a3")          # one illegal candidate, its eval kept
    wrong_evals = " M: b3b7 b3b5 b3f3 b3b4 b3b1 E: -0.13 0.2 -1.33 -1.11 -1.42 B: b3b5"
    format_only = " M: a1a1 E: 0.0 B: a1a1"
    assert r(shuffled) == r(ref) == 1.0
    assert 1.0 > r(illegal_cand) > r(second) > r(legal_only) > r(illegal_best) > r(format_only) == 0.2
    assert 1.0 > r(wrong_evals) > r(second)
    assert score(s, second)[1]["best"] == 0.5 and score(s, illegal_cand)[1]["candidates"] == pytest.approx(0.7)
    for cut in (10, 40, len(ref) - 6):  # truncated text does not parse
        assert r(ref[:cut]) == -0.3
    assert r(ref + " B: b3b5") == -0.3 and r(ref.replace("E:", "E: 1.0")) == -0.3  # two bests, 6 evals


def test_repeating_a_move_cannot_raise_a_policy_reward():
    s = parse_line(P_LINES[0])  # best b3b5 (-0.8) of 5 labelled moves
    for move, ev in zip(s.moves, s.evals):
        once = score(s, f" M: {move} E: {ev} B: b3b5")[0]
        for repeats in (2, 5):
            assert score(s, f" M: {' '.join([move] * repeats)} E: {' '.join([str(ev)] * repeats)} B: b3b5")[0] == once
    best_five_times = " M: b3b5 b3b5 b3b5 b3b5 b3b5 E: -0.8 -0.8 -0.8 -0.8 -0.8 B: b3b5"
    assert score(s, best_five_times)[0] == pytest.approx(0.2 + 0.8 * (0.5 + 0.3 / 5 + 0.2))  # 0.808, not 1.0


@pytest.mark.parametrize("n_labelled", [1, 2, 3])
def test_a_perfect_answer_scores_one_with_fewer_than_five_labelled_moves(n_labelled):
    moves, evals = ["a1a8", "g1f2", "a1a2"][:n_labelled], [999.99, 0.5, 0.1][:n_labelled]
    s = policy_sample("6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1", moves, evals)
    reward, comps = score(s, s.completion)
    assert reward == 1.0 and comps["candidates"] == 1.0  # candidates divide by the labelled moves, not by 5


def test_black_label_bug_is_not_rewarded():
    """A text line with Black to move labels B: with the weakest of its five moves (the generator's bug); the
    reward ranks by eval, so PV1 gets full credit and the label the last rank, exactly as against the same
    position annotated by Stockfish (PV1 first)."""
    line = parse_line(P_LINES[1])  # h7f8 -2.3, c8f5 -2.82, a4a3 -3.06, h7g5 -3.16, label h7f6 -3.21
    pv1 = line.completion.replace("B: h7f6", "B: h7f8")
    assert score(line, pv1)[0] == 1.0 and score(line, line.completion)[1]["best"] == 0.15
    assert score(line, line.completion.replace("B: h7f6", "B: a4a3"))[1]["best"] == 0.35
    ranked = sorted(zip(line.moves, line.evals), key=lambda p: -p[1])
    truth = policy_sample(line.fen, [m for m, _ in ranked], [e for _, e in ranked])
    for best in line.moves + ["c8b7", "a1a1"]:
        c = line.completion.replace("B: h7f6", "B: " + best)
        assert score(truth, c) == score(line, c)


def test_mates_are_clipped():
    s = policy_sample("6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1", ["a1a8", "g1f2"], [999.99, 0.5])
    near = score(s, " M: a1a8 g1f2 E: 999.97 0.5 B: a1a8")[1]["evals"]   # mate in 3 said for mate in 1
    wrong = score(s, " M: a1a8 g1f2 E: 3.0 0.5 B: a1a8")[1]["evals"]      # mate missed
    assert near == 1.0 and 0.5 < wrong < 1.0  # an error of ~997 pawns would have zeroed it


def test_env_alterations_in_order():
    s = parse_line(A_LINES[0])
    ref = s.completion
    r = lambda c: score(s, c)[0]
    fen, rest = ref.split("+", 1)
    wrong_flag = ref[:-3] + "1+0"
    wrong_trunc = ref[:-1] + "1"
    wrong_reward = ref.replace("+0.001+", "+0.5+")
    off_by_one = ref.replace(" 0 18+", " 1 18+")
    other_fen = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1+" + rest
    assert r(ref) == 1.0
    assert 1.0 > r(wrong_flag) == r(wrong_trunc) > r(wrong_reward) > r(off_by_one) > r(other_fen) > 0.2
    for bad in (ref[:30], ref[:-2], fen + "+0.001+0", "x" + ref, ref.replace("+0+0", "+0+2"), ref.replace("0.001", "inf")):
        assert r(bad) == -0.3
    assert score(s, off_by_one)[1]["fen_similarity"] > 0.95


def test_env_components_by_hand():
    """fen_similarity is 1 - distance / the longer FEN's length (a short guess cannot go below 0), and the
    reward is exact only when equal: 0 is not the 0.001 of a plain move."""
    s = parse_line(A_LINES[0])
    true_fen = s.next_fen
    empty = "8/8/8/8/8/8/8/8 w - - 0 1"  # a well-formed FEN, far shorter than the true one
    comps = score(s, empty + "+0.001+0+0")[1]
    assert comps["format_valid"] == 1.0 and comps["reward_exact"] == 1.0
    assert comps["fen_similarity"] == pytest.approx(1 - naive_levenshtein(empty, true_fen) / len(true_fen))
    assert 0 <= comps["fen_similarity"] < 0.5
    zero = s.completion.replace("+0.001+", "+0+")
    assert score(s, zero)[1]["reward_exact"] == 0.0 and score(s, zero)[1]["fen_exact"] == 1.0


def test_graduated_levels_and_components():
    p, a = parse_line(P_LINES[0]), parse_line(A_LINES[0])
    for s, c in [(p, p.completion.replace("B: b3b5", "B: b3b7")), (p, " M: a1a1 E: 0 B: a1a1"), (p, "junk"),
                 (a, a.completion.replace(" 0 18+", " 1 18+")), (a, "junk")]:
        reward, comps = score(s, c, "graduated")
        assert reward in LEVELS and score(s, c)[0] >= reward  # quantising only rounds down
        assert comps.keys() == score(s, s.completion)[1].keys()
    assert score(p, p.completion.replace("B: b3b5", "B: b3b7"), "graduated")[0] == 0.8


def test_graduated_shaping_gives_a_raw_of_one_quarter_its_level_despite_rounding():
    """raw = (5 * 0 + 3 * 0.7 + 2 * 0.2) / 10 is one quarter, which floats compute as 0.24999999999999994: graduated
    shaping gives it the first quarter's level 0.4 (the continuous 0.2 + 0.8 * 0.25), not 0.2. Four labelled moves
    each said 4 pawns too high (1 / (1 + 4) = 0.2), one illegal candidate ((4 - 0.5) / 5 = 0.7), an illegal best."""
    s = policy_sample(chess.STARTING_FEN, ["e2e4", "d2d4", "g1f3", "c2c4", "g2g3"], [0.5, 0.25, 0.0, -0.5, -1.0])
    reward, comps = score(s, " M: e2e4 d2d4 g1f3 c2c4 e1e2 E: 4.5 4.25 4.0 3.5 0.0 B: e1e2", "graduated")
    assert (comps["best"], comps["candidates"], comps["evals"]) == (0.0, 0.7, 0.2)
    assert comps["raw"] == pytest.approx(0.25) and reward == 0.4


def test_strict_scores_an_illegal_best_move_as_unparseable():
    s, a = parse_line(P_LINES[0]), parse_line(A_LINES[0])  # P: top 5 b3b5 b3b7 b3b4 b3f3 b3b1, white to move
    illegal_best = s.completion.replace("B: b3b5", "B: b3a3")  # onto its own pawn, the rest exact
    legal_only = s.completion.replace("B: b3b5", "B: d2e3")    # legal, not in the top 5
    # continuous: raw = (5 * 0 + 3 * 1 + 2 * 1) / 10 = 0.5 -> 0.2 + 0.8 * 0.5 = 0.6; strict: -0.3, parsed
    assert score(s, illegal_best)[0] == pytest.approx(0.6)
    reward, comps = score(s, illegal_best, "strict")
    assert reward == -0.3 and comps == score(s, illegal_best)[1]
    # legal answers and the arbiter's keep the continuous reward: raw = (5 * 0.05 + 5) / 10 = 0.525 -> 0.62
    for sample, text in [(s, legal_only), (s, s.completion), (a, a.completion), (a, a.completion[:-3]), (s, "junk")]:
        assert score(sample, text, "strict") == score(sample, text)
    assert score(s, legal_only, "strict")[0] == pytest.approx(0.62)
    # with the engine's move reward (best=), a legal move that keeps nothing (0: it walks into a mate the best move
    # avoids) still parses: strict asks whether the move can be played, not what it is worth
    assert score(s, legal_only, "strict", best=0.0) == score(s, legal_only, best=0.0)
    assert score(s, legal_only, "strict", best=0.0)[0] == pytest.approx(0.2 + 0.8 * 0.5)


@pytest.mark.parametrize("workers", [0, 3])
def test_scoring_pool_equals_score_batch(workers):
    samples = [parse_line(x) for x in P_LINES + A_LINES] * 4
    completions = [s.completion if i % 2 else s.completion[:-3] for i, s in enumerate(samples)]
    pool = ScoringPool(workers, "graduated")
    try:
        assert pool.submit(samples, completions)() == score_batch(samples, completions, "graduated")
        # a SIGTERM to the trainer's process group (`timeout`) must not kill the workers the step still needs: each
        # leaves the group as it starts (one that has not run a batch yet may still be importing)
        deadline = time.monotonic() + 30
        while any(os.getpgid(pid) == os.getpgrp() for pid in (pool.pool._processes if workers else ())):
            assert time.monotonic() < deadline, "a scoring worker stayed in the trainer's process group"
            time.sleep(0.1)
    finally:
        pool.close()


def test_a_dead_scoring_worker_costs_one_batch_in_process_not_the_run(capsys):
    """A worker killed (the OOM killer) while idle or while scoring: that batch is scored in this process with the
    same rewards, said in one line, and the next batch goes to a fresh pool; before, a BrokenProcessPool traceback."""
    samples = [parse_line(x) for x in P_LINES + A_LINES] * 2
    completions = [s.completion if i % 2 else s.completion[:-3] for i, s in enumerate(samples)]
    want = score_batch(samples, completions, "graduated")
    pool = ScoringPool(2, "graduated")
    try:
        assert pool.submit(samples, completions)() == want
        for pid in list(pool.pool._processes):
            os.kill(pid, signal.SIGKILL)
        time.sleep(0.5)
        assert pool.submit(samples, completions)() == want
        assert "a scoring worker died" in capsys.readouterr().err
        assert pool.submit(samples, completions)() == want and not capsys.readouterr().err  # the fresh pool
    finally:
        pool.close()


POOL_THEN_WAIT = """
import sys, time
from mini.formats import parse_line
from mini.reward_scorer import ScoringPool
from mini.test_formats import P_LINES
pool = ScoringPool(2)
samples = [parse_line(x) for x in P_LINES]
wait = pool.submit(samples, [s.completion for s in samples])
if sys.argv[1] == "scored":
    wait()
print(*pool.pool._processes, flush=True)  # "starting": the workers may not have run their initializer yet
time.sleep(60)
"""


def alive(pid):
    """Whether a process runs (a zombie that no one reaps, as under a container's init, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("when", ["scored", "starting"])
def test_scoring_workers_end_when_the_trainer_is_killed(spawn, when):
    """A trainer killed with SIGKILL (the OOM killer) closes nothing: its scoring workers, in process groups of
    their own, notice and exit instead of waiting for work forever, also those still starting when it died."""
    proc = spawn([sys.executable, "-c", POOL_THEN_WAIT, when], stdout=subprocess.PIPE, text=True,
                 env={**os.environ, "OMP_NUM_THREADS": "1"})
    workers = [int(pid) for pid in proc.stdout.readline().split()]
    try:
        assert len(workers) == 2
        os.kill(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 60  # a worker still importing on a busy machine finishes that first
        while any(map(alive, workers)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(map(alive, workers))
    finally:
        for pid in filter(alive, workers):
            os.kill(pid, signal.SIGKILL)


def test_a_script_without_a_main_guard_scores_in_workers_once(tmp_path):
    """The scoring workers are spawned, and a spawned worker runs the __main__ script again unless it is
    hidden: a script with no `if __name__ == "__main__":` guard would start a pool of its own there and fail."""
    done = run_script(tmp_path, "from mini.formats import parse_line\nfrom mini.reward_scorer import ScoringPool\n"
                      f"s = parse_line({P_LINES[0]!r})\npool = ScoringPool(2)\n"
                      "print('scored', [r for r, _ in pool.submit([s] * 4, [s.completion] * 4)()])\npool.close()\n")
    assert (done.returncode, done.stdout, done.stderr) == (0, "scored [1.0, 1.0, 1.0, 1.0]\n", "")


@pytest.mark.parametrize("best,want", [("b3b5", 1.0), ("b3b7", 0.5), ("b3b4", 0.35), ("b3f3", 0.25), ("b3b1", 0.15),
                                       ("d2e3", 0.05), ("b3a3", 0.0)])
def test_best_component_by_rank_of_every_labelled_move(best, want):
    """README: best scores 1 for the top eval, then 0.5, 0.35, 0.25, 0.15 by rank, 0.05 for another legal move,
    0 for an illegal one. P_LINES[0] ranks b3b5 (-0.8) > b3b7 (-1.13) > b3b4 (-2.11) > b3f3 (-2.33) > b3b1 (-2.42);
    d2e3 is legal but unlabelled, b3a3 lands on its own pawn."""
    s = parse_line(P_LINES[0])
    reward, comps = score(s, s.completion.replace("B: b3b5", "B: " + best))
    assert comps["best"] == want
    assert reward == pytest.approx(0.2 + 0.8 * (5 * want + 3 + 2) / 10)  # candidates and evals exact


@pytest.mark.parametrize("fen, moves, evals, want", [
    # four mates in one (a position of the mate pool): each is the best move; the fifth mates a move later
    ("8/3k4/8/8/3q4/8/4K3/6q1 b - - 3 85", ["g1d1", "g1f2", "d4d1", "d4e3", "d4e4"], [999.99] * 4 + [999.98],
     [1.0, 1.0, 1.0, 1.0, 0.15]),
    # a tie below the top shares the better rank, and the move after it ranks by how many are better (1, 2, 2, 4)
    (chess.STARTING_FEN, ["e2e4", "d2d4", "g1f3", "c2c4"], [0.3, 0.2, 0.2, 0.1], [1.0, 0.5, 0.5, 0.25]),
])
def test_moves_of_equal_eval_share_the_better_rank(fen, moves, evals, want):
    """README: equal evals share the better rank. Ranking ties by the label's order gave the second of four
    mates in one 0.5 and the others 0.35 and 0.25, though each mates as surely as the first."""
    s = policy_sample(fen, moves, evals)
    assert [score(s, s.completion.replace("B: " + moves[0], "B: " + m))[1]["best"] for m in moves] == want


def test_eval_component_by_hand_with_errors_on_both_sides_and_clipped_mates():
    """evals = mean of 1 / (1 + |error|) over named labelled moves, both evals clipped to +-10 pawns first:
    b3b5 said -1.3 for -0.8 (0.5 too low), b3b7 said 2.87 for -1.13 (4 too high), b3b1 said 999.97 for -2.42
    (clipped: 10 + 2.42), b3f3 said -999.97 for -2.33 (clipped: 10 - 2.33)."""
    s = parse_line(P_LINES[0])
    comps = score(s, " M: b3b5 b3b7 b3b1 b3f3 E: -1.3 2.87 999.97 -999.97 B: b3b5")[1]
    assert comps["evals"] == pytest.approx((1 / 1.5 + 1 / 5 + 1 / (1 + 12.42) + 1 / (1 + 7.67)) / 4, abs=1e-12)
    # a mate said for a 0.5 eval is 9.5 off once clipped; 999.97 for 999.99 is exact
    m = policy_sample("6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1", ["a1a8", "g1f2"], [999.99, 0.5])
    assert score(m, " M: a1a8 g1f2 E: 999.97 999.97 B: a1a8")[1]["evals"] == pytest.approx((1 + 1 / 10.5) / 2)


def test_a_repeated_move_counts_once_with_its_last_eval():
    """b3b5 (-0.8) named twice, first with 2.0 then with -0.8: its eval is the last (exact), and it is one hit;
    an illegal move named twice is one illegal candidate: (1 - 0.5) / 5."""
    s = parse_line(P_LINES[0])
    assert score(s, " M: b3b5 b3b5 E: 2.0 -0.8 B: b3b5")[1]["evals"] == 1.0
    assert score(s, " M: b3b5 b3b5 E: -0.8 2.0 B: b3b5")[1]["evals"] == pytest.approx(1 / 3.8)
    assert score(s, " M: b3b5 b3a3 b3a3 E: -0.8 0.0 0.0 B: b3b5")[1]["candidates"] == pytest.approx(0.1)


def test_the_best_move_ranks_by_the_labels_not_by_the_completions_claims():
    """The best component ranks B: by the labelled evals: b3b1 (-2.42, fifth) said to be +5.0 is still fifth (0.15),
    not the top a ranking over the completion's own claims would give it; and the labelled best b3b5 scores 1.0
    whether or not M: names it (the B: move is judged on its own)."""
    s = parse_line(P_LINES[0])  # b3b5 -0.8 > b3b7 -1.13 > b3b4 -2.11 > b3f3 -2.33 > b3b1 -2.42
    assert score(s, " M: b3b1 E: 5.0 B: b3b1")[1]["best"] == 0.15
    reward, comps = score(s, " M: b3b7 E: -1.13 B: b3b5")
    assert (comps["best"], comps["candidates"], comps["evals"]) == (1.0, 0.2, 1.0)
    assert reward == pytest.approx(0.2 + 0.8 * (5 * 1.0 + 3 * 0.2 + 2 * 1.0) / 10)


def test_a_legal_unlabelled_candidate_is_neither_a_hit_nor_penalised():
    """d2e3 is legal but outside the top 5: naming it earns no hit and costs no illegal-move penalty, and its eval
    is not judged. b3b5 exact plus d2e3: candidates 1 / 5, evals 1; b3a3 (illegal) instead: (1 - 0.5) / 5."""
    s = parse_line(P_LINES[0])
    legal = score(s, " M: b3b5 d2e3 E: -0.8 0.0 B: b3b5")[1]
    assert (legal["candidates"], legal["evals"], legal["best"]) == (pytest.approx(0.2), 1.0, 1.0)
    assert score(s, " M: b3b5 b3a3 E: -0.8 0.0 B: b3b5")[1]["candidates"] == pytest.approx(0.1)


def test_a_position_without_labelled_moves_scores_without_raising():
    """A P: sample with no labelled moves (a mated position: Stockfish has nothing to rank) scores a completion
    rather than raising: no hits of no labels is candidates 0, not a ZeroDivisionError; the engine's judgement
    of the move is None (nothing to measure against)."""
    s = policy_sample("R5k1/5ppp/8/8/8/8/8/6K1 b - - 1 1", [], [], best="0000")  # Ra8#: Black is mated
    reward, comps = score(s, " M: g8h8 E: -999.99 B: g8h8")  # illegal: every component 0
    assert reward == pytest.approx(0.2)
    assert (comps["best"], comps["candidates"], comps["evals"], comps["raw"]) == (0, 0, 0, 0)
    assert score(s, " M: g8h8 E: -999.99 B: g8h8", "strict")[0] == -0.3
    assert move_quality(s, "g8h8") is None and move_quality(s, None) is None


def test_each_env_component_costs_its_weight():
    """README: A: weights fen_exact 4, fen_similarity 2, reward 2, terminated 1, truncated 1 (of 10), so one wrong
    flag costs 0.8 * 0.1, a wrong reward 0.8 * 0.2, and a FEN one character off loses fen_exact (4) and 2 / 60 of
    fen_similarity (2): raw = (2 * (1 - 1 / 60) + 4) / 10."""
    s = parse_line(A_LINES[0])  # next FEN of 60 characters, reward 0.001, neither flag
    ref = s.completion
    assert len(s.next_fen) == 60
    assert score(s, ref[:-3] + "1+0")[0] == score(s, ref[:-1] + "1")[0] == pytest.approx(0.2 + 0.8 * 0.9)
    assert score(s, ref.replace("+0.001+", "+0.5+"))[0] == pytest.approx(0.2 + 0.8 * 0.8)
    assert score(s, ref.replace(" 0 18+", " 1 18+"))[0] == pytest.approx(0.2 + 0.8 * (2 * (1 - 1 / 60) + 4) / 10)


@pytest.mark.parametrize("shaping", ["continuous", "graduated", "strict"])
def test_an_unparseable_completion_scores_invalid_with_every_component_0(shaping):
    """An unparseable completion: -0.3, format_valid 0, raw 0 and every component 0 (the metrics average them),
    under the same keys as a parsed completion's."""
    p, a = parse_line(P_LINES[0]), parse_line(A_LINES[0])
    assert score(p, "junk", shaping) == (-0.3, {"format_valid": 0.0, "best": 0.0, "candidates": 0.0, "evals": 0.0,
                                                "best_legal": 0.0, "raw": 0.0})
    assert score(a, "junk", shaping) == (-0.3, {"format_valid": 0.0, "fen_exact": 0.0, "fen_similarity": 0.0,
                                                "reward_exact": 0.0, "terminated_exact": 0.0, "truncated_exact": 0.0,
                                                "raw": 0.0})


def naive_levenshtein(a, b):
    """Wagner-Fischer over the whole strings, without levenshtein's common-ends shortcut."""
    d = [[i + j if i * j == 0 else 0 for j in range(len(b) + 1)] for i in range(len(a) + 1)]
    for i in range(1, len(a) + 1):
        for j in range(1, len(b) + 1):
            d[i][j] = min(d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] != b[j - 1]))
    return d[-1][-1]


def test_levenshtein_against_the_plain_dynamic_programme():
    """Textbook distances, then 400 random pairs over a small alphabet (shared characters inside the strings,
    where a wrong substitution or insertion cost shows) against the full table."""
    for a, b, want in [("kitten", "sitting", 3), ("flaw", "lawn", 2), ("", "abc", 3), ("abc", "", 3), ("ab", "ba", 2),
                       ("rnbqk/8 w", "rnbk/8 b", 2), ("8/8/8 w - - 0 1", "8/8/8 w - - 0 1", 0)]:
        assert levenshtein(a, b) == levenshtein(b, a) == want
    rng = random.Random(0)
    for _ in range(400):
        a, b = ("".join(rng.choice("ab1/ ") for _ in range(rng.randint(0, 9))) for _ in range(2))
        assert levenshtein(a, b) == naive_levenshtein(a, b), (a, b)


FEN = "r1bk3r/2p2ppp/2P1p2N/ppB1P3/8/3B1N2/PPP2PPP/3RK2R b K - 0 18"
PIECES = ["M:", "E:", "B:", "+", " ", "  ", "b3b5", "b3b7", "a1a1", "e7e8q", "0.5", "-2.42", "999.97", "nan", "-1e999",
          "1_0", "0", "1", FEN, "8/8/8", "\n", "é", "<|endoftext|>"]


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.text(max_size=200), st.lists(st.sampled_from(PIECES), max_size=20).map("".join)),
       st.sampled_from(["continuous", "graduated", "strict"]))
def test_any_string_scores_in_range(text, shaping):
    for s in (parse_line(P_LINES[0]), parse_line(A_LINES[0])):
        reward, comps = score(s, text, shaping)
        assert -0.3 <= reward <= 1.0
        assert all(0.0 <= v <= 1.0 for v in comps.values())


if __name__ == "__main__":
    import sys
    sys.exit(pytest.main([__file__, "-q"]))
