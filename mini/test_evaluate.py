"""Evaluation harness: labels score 100%, a random model ~100% invalid, hand-computed metrics, the CLI.

    python mini/test_evaluate.py
"""
import argparse
import errno
import json
import os
import re
import subprocess
import sys

import chess
import numpy as np
import pytest
import torch

from mini.chess_eval import main as chess_main
from mini.config import DATA_DIR, EVAL_PATH, MATE_PATH, REAL_EVAL_PATH
import mini.evaluate as ev
from mini.formats import env_sample, legal_ucis, parse_line, policy_sample, repad
from mini.loader import save_model
from mini.model import GPT, GPTConfig
from mini.positions import history_bucket, king_constraint, phase
from mini.reward_scorer import GRADUATED, EngineReward, score
from mini.stockfish import find_stockfish
from mini.test_formats import A_LINES, P_LINES
from mini.tokenizer import Tokenizer

TOK = Tokenizer.gpt2()
SCRIPT = os.path.join(os.path.dirname(ev.__file__), "evaluate.py")


def assert_perfect(metrics, skip=()):
    for k, v in metrics.items():
        if k not in skip:
            assert v == (0.0 if k.endswith(("_invalid", "_mae")) or "_illegal_" in k else 1.0), k


@pytest.fixture(scope="module")
def held_out():
    return ev.held_out_samples(6)


def test_labels_score_full_marks(held_out, monkeypatch):
    """Completions that are the labels: 100% on every accuracy, 0% invalid, through the whole path (batches
    of 5 over 12 prompts, tokenize, decode) with generate replaced by a stub that answers the label."""
    by_prompt = {s.prompt: s.completion for s in held_out}
    stub = lambda model, prompts, max_new_tokens, **kw: [(TOK.encode(by_prompt[TOK.decode(p)]), None) for p in prompts]
    monkeypatch.setattr(ev, "generate", stub)
    model = torch.nn.Linear(1, 1).train()
    metrics, completions = ev.evaluate(model, TOK, held_out, batch_size=5)
    assert completions == [s.completion for s in held_out] and model.training  # train mode restored
    names = {f"eval_P_{k}" for k in ("invalid", "best_legal", "top5_acc", "top5_legal", "eval_mae", "illegal_from",
                                     "illegal_geometry", "illegal_check")}
    names |= {f"eval_P_best_acc_{w}{side}" for w in ("label", "pv1") for side in ("", "_white", "_black", "_legal")
              if side != "_legal" or w == "pv1"}
    # breakdowns by the positions' phases and the A: histories' lengths that these 6 + 6 samples have
    names |= {f"eval_P_best_legal_{phase(chess.Board(s.fen))}" for s in held_out if s.task == "P"}
    names |= {f"eval_P_best_legal_{'' if chess.Board(s.fen).is_check() else 'not_'}in_check"
              for s in held_out if s.task == "P"}
    names |= {f"eval_P_best_legal_{king_constraint(chess.Board(s.fen))}" for s in held_out
              if s.task == "P" and not chess.Board(s.fen).is_check()}
    names |= {f"eval_A_next_state_exact_h{history_bucket(len(s.history))}" for s in held_out if s.task == "A"}
    names |= {f"eval_A_{k}" for k in ("invalid", "next_state_exact", "levenshtein", "reward_exact", "reward_mae",
                                      "terminated_acc", "truncated_acc")}
    names |= {"eval_reward", "eval_reward_P", "eval_reward_A", "eval_format_valid_P", "eval_format_valid_A"}
    assert set(metrics) == names
    assert_perfect(metrics)


def test_breakdowns_by_phase_history_and_legal_answers():
    """Hand-computed: P: best_legal per phase and in check or not, PV1 accuracy and centipawn loss over legal
    answers only; A: exact next state per history bucket (1-2, 3-5, 6-10 half-moves, the move included)."""
    opening = policy_sample("rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1", ["e7e5", "c7c5"], [0.2, 0.3])
    endgame = policy_sample("8/8/4k3/8/8/4K3/4P3/8 w - - 0 60", ["e3d4", "e2e4"], [1.5, 0.9])
    # opening: legal but not PV1 (c7c5 is PV1 at 0.3); endgame: illegal (no piece on a1)
    completions = [" M: e7e5 E: 0.2 B: e7e5", " M: a1a2 E: 0.0 B: a1a2"]
    short = env_sample(chess.STARTING_FEN, "e2e4", ["e2e4"])  # history of 1
    cut = env_sample(opening.fen, "e7e5", ["d2d4", "e2e4", "e7e5"])  # 3 (not a real game: a test string)
    wrong = env_sample(opening.fen, "e7e6", ["e2e4", "e7e6"])  # 2, answered with the input FEN: wrong
    completions += [short.completion, cut.completion, f"{opening.fen}+0.001+0+0"]
    v = ev.per_sample_values([opening, endgame, short, cut, wrong], completions)
    assert v["eval_P_best_legal_opening"] == [1.0] and v["eval_P_best_legal_endgame"] == [0.0]
    assert "eval_P_best_legal_middlegame" not in v
    assert v["eval_P_best_legal_not_in_check"] == [1.0, 0.0] and "eval_P_best_legal_in_check" not in v
    # in check from the bishop on b4: the pawn takes on e5 as if it were not (illegal), the c-pawn blocks
    check = policy_sample("rnbqk1nr/ppp2ppp/8/3pp3/1b1P4/6PN/PPP1PP1P/RNBQKB1R w KQkq - 1 4", ["c2c3"], [0.07])
    in_check = ev.per_sample_values([check, check], [" M: d4e5 E: 0.1 B: d4e5", " M: c2c3 E: 0.1 B: c2c3"])
    assert in_check["eval_P_best_legal_in_check"] == [0.0, 1.0] and "eval_P_best_legal_not_in_check" not in in_check
    assert sorted(k for k in in_check if k.startswith("eval_P_best_legal")) == [  # no king-safety class in check
        "eval_P_best_legal", "eval_P_best_legal_in_check", "eval_P_best_legal_opening"]
    # the knight on e2 is pinned by the rook on e8: its move is illegal, the king's step legal
    pin = policy_sample("k3r3/8/8/8/8/8/4N3/4K3 w - - 0 1", ["e1d1"], [0.0])
    pinned = ev.per_sample_values([pin, pin], [" M: e2c3 E: 0.1 B: e2c3", " M: e1d1 E: 0.1 B: e1d1"])
    assert pinned["eval_P_best_legal_pin"] == [0.0, 1.0] and pinned["eval_P_best_legal_not_in_check"] == [0.0, 1.0]
    assert v["eval_P_best_legal_unconstrained"] == [1.0, 0.0] and "eval_P_best_legal_pin" not in v
    assert v["eval_P_best_acc_pv1_legal"] == [0.0, None]  # one legal answer, not PV1; the illegal one not counted
    assert v["eval_A_next_state_exact_h1-2"] == [1.0, 0.0] and v["eval_A_next_state_exact_h3-5"] == [1.0]
    # top-5 accuracy over the labels a position has (2 here, not 5); legality over the distinct moves named
    assert v["eval_P_top5_acc"] == [0.5, 0.0]
    assert ev.per_sample_values([opening], [" M: e7e5 a1a2 a1a2 E: 0.2 0.0 0.0 B: e7e5"])["eval_P_top5_legal"] == [0.5]
    assert [history_bucket(n) for n in (1, 2, 3, 5, 6, 10)] == ["1-2", "1-2", "3-5", "3-5", "6-10", "6-10"]
    assert [phase(chess.Board(s.fen)) for s in (opening, endgame)] == ["opening", "endgame"]


def test_legality_breakdowns_count_legal_answers_that_are_not_the_label():
    """best_legal_<phase>, _(not_)in_check and _<king constraint> count legal answers, the label or not: c7c5 in
    the opening, the knight interposing (b1d2) against the bishop's check, the king's step aside (e1f1) beside a pin."""
    opening = policy_sample("rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1", ["e7e5"], [0.2])
    check = policy_sample("rnbqk1nr/ppp2ppp/8/3pp3/1b1P4/6PN/PPP1PP1P/RNBQKB1R w KQkq - 1 4", ["c2c3"], [0.07])
    pin = policy_sample("k3r3/8/8/8/8/8/4N3/4K3 w - - 0 1", ["e1d1"], [0.0])
    v = ev.per_sample_values([opening, check, pin], [" M: c7c5 E: 0.3 B: c7c5", " M: b1d2 E: 0.0 B: b1d2",
                                                     " M: e1f1 E: 0.0 B: e1f1"])
    assert v["eval_P_best_acc_label"] == [0.0, 0.0, 0.0]
    assert v["eval_P_best_legal_opening"] == [1.0, 1.0, 1.0] and v["eval_P_best_legal_in_check"] == [1.0]
    assert v["eval_P_best_legal_not_in_check"] == [1.0, 1.0]
    assert v["eval_P_best_legal_unconstrained"] == [1.0] and v["eval_P_best_legal_pin"] == [1.0]


def test_evaluate_passes_its_settings_to_every_generate_call(held_out, monkeypatch):
    """evaluate() decodes greedily (temperature 0, no top-k) in eval mode without gradients, stops at EOS, and hands
    max_new_tokens, batch_size, compile_decode and the autocast context to every batch: 12 prompts in batches of 5,
    5 and 2."""
    by_prompt, calls, entered = {s.prompt: s.completion for s in held_out}, [], []

    def stub(model, prompts, max_new_tokens, **kw):
        assert not model.training and not torch.is_grad_enabled()  # no dropout, no graph kept
        calls.append((len(prompts), max_new_tokens, kw["temperature"], kw["top_k"], kw["eos_id"], kw["compile_decode"]))
        return [(TOK.encode(by_prompt[TOK.decode(p)]), None) for p in prompts]

    class Autocast:
        def __enter__(self):
            entered.append(len(calls))

        def __exit__(self, *exc):
            return False
    monkeypatch.setattr(ev, "generate", stub)
    ev.evaluate(torch.nn.Linear(1, 1), TOK, held_out, max_new_tokens=7, batch_size=5, autocast=Autocast(),
                compile_decode=True)
    assert calls == [(n, 7, 0.0, 0, TOK.eos_token_id, True) for n in (5, 5, 2)] and entered == [0, 1, 2]


def test_the_shipped_sets_transitions_carry_their_positions_history(held_out):
    """On a set of P: positions alone, the i-th A: transition is a move on the i-th position after the moves that
    led there (its last 10 half-moves, the move included), so that the history buckets are those of real games."""
    policy, env = held_out[:6], held_out[6:]
    assert [(a.fen, a.history) for a in env] == [(p.fen, (p.history + [a.move])[-10:]) for p, a in zip(policy, env)]
    assert {history_bucket(len(a.history)) for a in env} == {"6-10"}


def test_history_bucket_edges_in_the_breakdown_and_when_taking_transitions_in_turn():
    """Histories of 2, 3, 5 and 6 half-moves (the move included) fall into 1-2, 3-5, 3-5 and 6-10, in the
    breakdown and when first_of_each_bucket takes transitions in turn, in the file's order; a bucket that has
    run out is passed over."""
    moves = ["g1f3", "g8f6", "f3g1", "f6g8"] * 2  # back to the start (a test string)
    with_history = lambda n: env_sample(chess.STARTING_FEN, "e2e4", moves[:n - 1] + ["e2e4"])
    samples = [with_history(n) for n in (2, 3, 5, 6)]
    v = ev.per_sample_values(samples, [s.completion if i != 1 else "junk" for i, s in enumerate(samples)])
    assert (v["eval_A_next_state_exact_h1-2"], v["eval_A_next_state_exact_h3-5"], v["eval_A_next_state_exact_h6-10"]) \
        == ([1.0], [0.0, 1.0], [1.0])
    stored = [with_history(n) for n in (2, 2, 2, 3, 6, 5, 6)]  # 1-2 thrice, 3-5 and 6-10 twice
    at = {id(s): i for i, s in enumerate(stored)}  # equal samples: told apart by identity
    taken = lambda n: [at[id(s)] for s in ev.first_of_each_bucket(stored, n)]
    assert taken(3) == [0, 3, 4] and taken(5) == [0, 1, 3, 4, 5] and taken(7) == taken(9) == list(range(7))


def test_realistic_eval_set_takes_its_own_transitions_and_padding(tmp_path):
    """A .jsonl with A: records gives those transitions (not random ones), and --pad pads the P: prompts, as it
    does a text file's P: lines, whatever width their FEN had there."""
    path = tmp_path / "games.jsonl"
    path.write_text(json.dumps({"meta": {}}) + "\n" + json.dumps(
        {"fen": chess.STARTING_FEN, "moves": ["e2e4"], "evals": [0.3], "history": []}) + "\n" + json.dumps(
        {"fen": chess.STARTING_FEN, "move": "g1f3", "history": ["g1f3"]}) + "\n")
    for pad in (90, 89):
        p, a = ev.load_eval_set(str(path), 5, pad)
        assert p.prompt == "P: " + chess.STARTING_FEN + " " * (pad - 1 - len(chess.STARTING_FEN))
        assert (a.task, a.move, a.history) == ("A", "g1f3", ["g1f3"])
    text = tmp_path / "lines.txt"
    text.write_text(P_LINES[0] + "\n")
    for pad in (90, 89):
        (p,) = ev.load_eval_set(str(text), 5, pad)
        assert p.prompt == "P: " + p.fen + " " * (pad - 1 - len(p.fen))
    # a text file's first n lines of each task, in the file's order, whatever the order of the tasks
    text.write_text("\n".join(A_LINES[:1] + P_LINES + A_LINES[1:] * 3) + "\n")
    got = ev.load_eval_set(str(text), 2, 90)
    want = [parse_line(line) for line in P_LINES[:2] + A_LINES[:2]]
    assert [(s.task, s.fen, s.move) for s in got] == [(s.task, s.fen, s.move) for s in want]


def test_text_lines_label_versus_pv1():
    """On RookWorld text lines the label is the B: move; for Black that is the generator's weakest move, so
    the label scores 100% against itself and 0% against PV1 there (the bug this metric exposes), and the reward,
    which ranks by eval, gives it the last rank (0.2 + 0.8 * (5 * 0.15 + 3 + 2) / 10 = 0.66)."""
    samples = [parse_line(line) for line in P_LINES + A_LINES]
    values = ev.per_sample_values(samples, [s.completion for s in samples])
    metrics = {k: sum(v) / len(v) for k, v in values.items()}
    assert_perfect(metrics, skip={"eval_P_best_acc_pv1", "eval_P_best_acc_pv1_black", "eval_P_best_acc_pv1_legal",
                                  "eval_reward", "eval_reward_P"})
    assert values["eval_reward"] == pytest.approx([1.0, 0.66] + [1.0] * (len(samples) - 2))
    assert metrics["eval_P_best_acc_pv1_black"] == 0.0 and metrics["eval_P_best_acc_pv1"] == pytest.approx(2 / 3)
    assert metrics["eval_P_best_acc_pv1_legal"] == pytest.approx(2 / 3)  # every label is a legal move
    assert [ev.pv1_of(s) for s in samples[:3]] == ["b3b5", "h7f8", "d4c5"]  # the all-0.0 tie goes to the label
    tied = parse_line(P_LINES[1].replace("-3.06", "-2.3"))  # a4a3 and h7f8 tie at the top, the label is not there
    assert ev.pv1_of(tied) is None
    tied_values = ev.per_sample_values([tied], [tied.completion])
    assert len(tied_values["eval_P_best_acc_label"]) == 1
    assert "eval_P_best_acc_pv1" not in tied_values and "eval_P_best_acc_pv1_legal" not in tied_values  # no PV1 known


def test_accuracy_among_legal_answers_pairs_the_prompts_where_both_answers_are_legal():
    """best_acc_pv1_legal counts legal answers only, so --compare must pair it on the prompts where both models
    answer legally: one list entry per P: prompt, None where the answer is illegal. Kept only for legal answers,
    before (legal on prompts 0, 1) and after (legal on 1, 2) gave two values each, paired 0 with 1 and 1 with 2."""
    samples = [parse_line(line) for line in P_LINES]  # PV1 b3b5, h7f8, d4c5; the labels legal
    illegal = ["b3a3", "h7h7", "d4d8"]  # onto its own pawn, nowhere, four squares for a king
    answer = lambda i, legal: samples[i].completion.replace("B: " + samples[i].best, "B: " + (
        samples[i].best if legal else illegal[i]))
    before, after = ([answer(i, ok) for i, ok in enumerate(legal)] for legal in ((1, 1, 0), (0, 1, 1)))
    values = [ev.per_sample_values(samples, c)["eval_P_best_acc_pv1_legal"] for c in (before, after)]
    assert values == [[1.0, 0.0, None], [None, 0.0, 1.0]]  # the Black label h7f6 is legal, not PV1
    rows = ev.paired_bootstrap(*(ev.per_sample_values(samples, c) for c in (before, after)))
    assert rows["eval_P_best_acc_pv1_legal"] == (0.0, 0.0, 0.0, 0.0, 0.0, 1)  # prompt 1 alone
    assert ev.means(ev.per_sample_values(samples, before))["eval_P_best_acc_pv1_legal"] == 0.5


def test_a_move_the_engine_could_not_judge_keeps_every_quality_list_aligned(monkeypatch):
    """A P: move the engine could not judge (move_quality None) gets None in each move-quality metric,
    cpl_legal included, so every list keeps one entry per P: prompt and --compare pairs by prompt."""
    samples = [parse_line(line) for line in P_LINES + A_LINES[:1]]  # an A: sample has no move quality at all
    judged = [(s.best, {"cpl": 10 * i, "winprob_loss": 0.0, "score": 1.0}) for i, s in enumerate(samples[:3])]
    judged[1] = (samples[1].best, None)
    monkeypatch.setattr(ev, "judge_moves", lambda engine, samples, completions: judged + [(None, None)])
    values = ev.per_sample_values(samples, [s.completion for s in samples], engine=object())
    for name in ("cpl", "winprob_loss", "blunder", "move_score", "cpl_legal"):
        assert len(values[f"eval_P_{name}"]) == 3 and values[f"eval_P_{name}"][1] is None, name
    assert values["eval_P_cpl_legal"] == [0.0, None, 20.0]
    assert not [k for k in values if k.startswith("eval_A_") and "cpl" in k]  # an A: answer is no move to judge


def test_random_model_is_invalid(held_out):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=16, n_positions=256))
    samples = held_out[:3] + held_out[6:9]
    metrics, completions = ev.evaluate(model, TOK, samples, max_new_tokens=12, batch_size=4)
    assert len(completions) == 6 and any(completions) and model.training  # a training model is left training
    ev.complete_texts(model.eval(), TOK, [samples[0].prompt], max_new_tokens=1)
    assert not model.training  # and one in eval mode (train.py's reference) is left in eval mode
    assert metrics["eval_P_invalid"] == metrics["eval_A_invalid"] == 1.0
    assert metrics["eval_reward"] == pytest.approx(-0.3)
    assert "eval_P_eval_mae" not in metrics and "eval_A_reward_mae" not in metrics  # MAEs: valid ones only
    for k in ("eval_P_best_acc_label", "eval_P_top5_acc", "eval_A_next_state_exact", "eval_A_levenshtein"):
        assert metrics[k] == 0.0


def test_hand_computed():
    white, black, env = parse_line(P_LINES[0]), parse_line(P_LINES[1]), parse_line(A_LINES[0])
    # white: label b3b5 = PV1 (-0.8); M: b3b7 -1.13, b3b5 -0.8, b3f3 -2.33, b3b4 -2.11, b3b1 -2.42
    # black: label h7f6 (-3.21), PV1 h7f8 (-2.3); a4a3 -3.06
    fen = env.next_fen
    off_by_one = fen[:-1] + "9"  # fullmove 18 -> 19: still a FEN, one character off
    samples = [white, black, white, black, env, env, env, env]
    completions = [
        " M: b3b5 b3b7 d2e3 E: -0.5 -1.13 0.0 B: b3b5",  # right best; 2 of 5, 3 of 3 legal; errors 0.3, 0
        " M: h7f8 a4a3 E: -2.3 -9.0 B: h7f8",            # PV1, not the label; 2 of 5; errors 0, 5.94
        " M: b3a3 b3b1 E: 1.0 999.97 B: b3a3",           # illegal best; 1 of 5, 1 of 2 legal; mate clipped: 12.42
        " M: h7f8 B:",                                   # garbage
        env.completion,                                  # exact
        f"{fen}+0.001+1+0",                              # wrong terminated flag
        f"{off_by_one}+0.5+0+0",                         # FEN off by one character, wrong reward (error 0.499)
        "r1bk3r/2p2ppp+0.001",                           # garbage
    ]
    values = ev.per_sample_values(samples, completions)
    m = ev.means(values)  # None (an illegal answer's accuracy among legal ones) left out
    sim = 1 - 1 / len(fen)
    expected = {
        "eval_P_invalid": 0.25, "eval_format_valid_P": 0.75, "eval_P_best_legal": 0.5,
        "eval_P_best_acc_label": 0.25, "eval_P_best_acc_label_white": 0.5, "eval_P_best_acc_label_black": 0.0,
        "eval_P_best_acc_pv1": 0.5, "eval_P_best_acc_pv1_white": 0.5, "eval_P_best_acc_pv1_black": 0.5,
        "eval_P_top5_acc": (0.4 + 0.4 + 0.2 + 0) / 4, "eval_P_top5_legal": (1 + 1 + 0.5 + 0) / 4,
        "eval_P_illegal_geometry": 0.25, "eval_P_illegal_from": 0.0, "eval_P_illegal_check": 0.0,  # b3a3: own pawn
        "eval_P_eval_mae": (0.3 + 0 + 0 + 5.94 + 12.42) / 5,
        "eval_A_invalid": 0.25, "eval_format_valid_A": 0.75, "eval_A_next_state_exact": 0.5,
        "eval_A_levenshtein": (1 + 1 + sim + 0) / 4, "eval_A_reward_exact": 0.5, "eval_A_reward_mae": 0.499 / 3,
        "eval_A_terminated_acc": 0.5, "eval_A_truncated_acc": 0.75,
        # A: rewards by hand from the weights 4/2/2/1/1 (reward_scorer docstring): 0.2 + 0.8 * raw
        "eval_reward_A": (1.0 + (0.2 + 0.8 * 0.9) + (0.2 + 0.8 * (2 * sim + 2) / 10) - 0.3) / 4,
        "eval_reward_P": sum(score(s, c)[0] for s, c in zip(samples[:4], completions[:4])) / 4,
    }
    for k, v in expected.items():
        assert m[k] == pytest.approx(v), k
    counts = {"eval_P_eval_mae": 5, "eval_A_reward_mae": 3, "eval_P_best_acc_pv1_black": 2, "eval_reward": 8}
    assert {k: len(values[k]) for k in counts} == counts


def test_reward_mae_clips_the_answered_reward_and_eval_mae_takes_a_repeats_last_eval():
    """An A: reward lies in [-1, 1]: an answered 5.0 for the label 0.001 is 0.999 off, -3 is 1.001 off, 0.5 is 0.499.
    A P: move named twice counts once, with its last eval, as in the reward: b3b5 (-0.8) said 2.0 then -0.8, and
    once among the moves whose legality top5_legal counts."""
    s = env_sample(chess.STARTING_FEN, "e2e4", ["e2e4"])
    answers = [f"{s.next_fen}+{r}+0+0" for r in ("5.0", "-3", "0.5", "0.001")]
    values = ev.per_sample_values([s] * 4, answers)
    assert values["eval_A_reward_mae"] == pytest.approx([0.999, 1.001, 0.499, 0.0])
    # the next state right every time, the reward only in the last answer: two metrics, not one
    assert values["eval_A_next_state_exact"] == [1.0] * 4 and values["eval_A_reward_exact"] == [0.0, 0.0, 0.0, 1.0]
    p = parse_line(P_LINES[0])
    assert ev.per_sample_values([p], [" M: b3b5 b3b5 E: 2.0 -0.8 B: b3b5"])["eval_P_eval_mae"] == [0.0]
    named_twice = ev.per_sample_values([p], [" M: b3b5 b3b5 a1a1 E: 2.0 -0.8 0.1 B: b3b5"])  # one legal of two moves
    assert named_twice["eval_P_top5_legal"] == [0.5]


def test_engine_quality_is_the_reward_function():
    """Move quality by hand for labelled and illegal moves; for an unlabelled move it equals the engine
    reward's best component, both from reward_scorer.move_quality."""
    from mini.stockfish import find_stockfish
    from mini.reward_scorer import EngineReward, score_chunk, win_prob
    try:
        engine = EngineReward(find_stockfish(), depth=8)
    except FileNotFoundError:
        pytest.skip("Stockfish binary not found (apt-get install stockfish)")
    white, black, env = parse_line(P_LINES[0]), parse_line(P_LINES[1]), parse_line(A_LINES[0])
    samples = [white, black, white, black, white, env]
    completions = [white.completion.replace("B: b3b5", "B: b3b7"),  # -1.13 against -0.8: 33 cp
                   black.completion.replace("B: h7f6", "B: a4a3"),  # -3.06 against PV1's -2.3: 76 cp
                   white.completion.replace("B: b3b5", "B: b3a3"),  # illegal: the cap, all of W(best)
                   " M: h7f8 B:",                                   # invalid: the same
                   white.completion.replace("B: b3b5", "B: d2e3"),  # legal, unlabelled: Stockfish judges
                   env.completion]
    values = ev.per_sample_values(samples, completions, engine=engine)
    reward_best = score_chunk(samples[4:5], completions[4:5], engine=engine)[0][0][1]["best"]
    W = win_prob
    assert values["eval_P_cpl"][:4] == [33, 76, 1000, 1000] and 0 <= values["eval_P_cpl"][4] <= 1000
    assert values["eval_P_move_score"] == pytest.approx([W(-113) / W(-80), W(-306) / W(-230), 0, 0, reward_best])
    assert values["eval_P_winprob_loss"][:4] == pytest.approx([W(-80) - W(-113), W(-230) - W(-306), W(-80), W(-230)])
    assert values["eval_P_blunder"][:4] == [0, 0, 1, 1] and len(values["eval_P_cpl"]) == 5
    m = ev.means(values)
    assert m["eval_P_cpl_median"] == sorted(values["eval_P_cpl"])[2]
    reason = ev.engine_or_reason(argparse.Namespace(stockfish_path="/nonexistent/stockfish", engine_depth=8,
                                                       engine_nodes=0, engine_cache=""))
    assert reason[0] is None and reason[1].startswith("move quality skipped: Stockfish not found")
    assert "apt-get install stockfish" in reason[1]


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=16, n_positions=256))
    return save_model(model, TOK, str(tmp_path_factory.mktemp("snap") / "model"))


def test_cli_end_to_end(snapshot):
    run = subprocess.run([sys.executable, SCRIPT, "--model_path", snapshot, "--n", "2", "--max_new_tokens", "8"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    with open(os.path.join(snapshot, "eval.json")) as f:
        report = json.load(f)
    assert report["counts"]["eval_P_invalid"] == report["counts"]["eval_A_invalid"] == 2
    assert report["metrics"]["eval_P_invalid"] == 1.0 and len(report["samples"]) == 4
    assert "eval_A_next_state_exact" in run.stdout and "count" in run.stdout


def test_an_n_beyond_the_set_says_what_is_evaluated(snapshot, tmp_path, capsys):
    data = tmp_path / "lines.txt"
    data.write_text("\n".join(P_LINES + A_LINES[:1]) + "\n")
    ev.main(["--model_path", snapshot, "--data", str(data), "--n", "1000", "--max_new_tokens", "2",
             "--out", str(tmp_path / "r.json")])
    assert f"--n 1000 is more than {data} holds; evaluating its {len(P_LINES)} P: and 1 A: prompts" in \
        capsys.readouterr().err
    ev.main(["--model_path", snapshot, "--data", str(data), "--n", "1", "--max_new_tokens", "2",
             "--out", str(tmp_path / "r.json")])
    assert "is more than" not in capsys.readouterr().err


def test_a_report_over_an_input_is_refused_before_the_evaluation(snapshot, tmp_path, capsys):
    """--out naming the data file, or a file of the snapshot (its config.json, or a checksum beside a file: the
    model would no longer load), or chess_eval.py's mate file: refused, the input left whole; so is a
    --stockfish_path that is no Stockfish (the move quality was skipped after the evaluation)."""
    data = tmp_path / "lines.txt"
    data.write_text("\n".join(P_LINES) + "\n")
    config, checksum = (os.path.join(snapshot, name) for name in ("config.json", "model.safetensors.sha256"))
    kept = {path: open(path).read() for path in (str(data), config, checksum, MATE_PATH)}
    for main, flags in [(ev.main, ["--data", str(data), "--out", str(tmp_path / "." / "lines.txt")]),
                        (ev.main, ["--data", str(data), "--out", config]),
                        (ev.main, ["--data", str(data), "--out", checksum]),
                        (chess_main, ["--n_mates", "1", "--out", MATE_PATH]),
                        (ev.main, ["--engine_quality", "--stockfish_path", str(tmp_path / "none")])]:
        with pytest.raises(SystemExit) as stop:
            main(["--model_path", snapshot, *flags])
        assert stop.value.code == 2 and ("over an input of this evaluation" in (err := capsys.readouterr().err)
                                         or f"Stockfish not found (no executable at {tmp_path / 'none'})" in err)
    assert all(open(path).read() == text for path, text in kept.items())


def test_the_default_eval_set_and_compared_reports_are_inputs_no_output_overwrites(snapshot, tmp_path, capsys,
                                                                                   monkeypatch):
    """Without --data the shipped eval set is the input: --out naming it is refused as --out naming a --data file is
    (here a stand-in copy, so that a failure cannot touch the real one); --plot naming a report it compares is
    refused before the comparison, the report left whole."""
    stand_in = tmp_path / "eval.jsonl"
    stand_in.write_text(open(EVAL_PATH).read())
    monkeypatch.setattr(ev, "EVAL_PATH", str(stand_in))
    reports = garbage_then_labels(tmp_path)
    kept = {path: open(path).read() for path in (str(stand_in), *reports)}
    for argv in (["--model_path", snapshot, "--n", "1", "--max_new_tokens", "2", "--out", str(stand_in)],
                 ["--compare", *reports, "--plot", reports[1]]):
        with pytest.raises(SystemExit) as stop:
            ev.main(argv)
        err = capsys.readouterr().err
        assert stop.value.code == 2 and re.search("over an input of this evaluation|over a report it compares", err)
    assert all(open(path).read() == text for path, text in kept.items())


def test_a_report_never_goes_over_a_shipped_file(snapshot, tmp_path, capsys, monkeypatch):
    """--out naming a file under mini/data/ (another held-out set, the pool, a model's file) is refused before the
    evaluation, here with a stand-in folder; chess_eval.py's reports take the same path check."""
    shipped = tmp_path / "data"
    (shipped / "m").mkdir(parents=True)
    for name in ("eval_games.jsonl", "m/config.json"):
        (shipped / name).write_text("kept")
    monkeypatch.setattr(ev, "DATA_DIR", str(shipped))
    for name in ("eval_games.jsonl", "m/config.json"):
        with pytest.raises(SystemExit) as stop:
            ev.main(["--model_path", snapshot, "--n", "1", "--max_new_tokens", "2", "--out", str(shipped / name)])
        assert stop.value.code == 2 and "over a file the project ships (mini/data/)" in capsys.readouterr().err
        assert (shipped / name).read_text() == "kept"


def test_cli_text_file(snapshot, tmp_path, capsys):
    data, out = tmp_path / "lines.txt", tmp_path / "sub" / "report.json"
    data.write_text("\n".join(P_LINES + A_LINES) + "\n")
    ev.main(["--model_path", snapshot, "--data", str(data), "--n", "2", "--max_new_tokens", "4", "--out", str(out),
             "--pad", "89"])
    report = json.loads(out.read_text())
    assert report["counts"]["eval_P_invalid"] == 2 and report["counts"]["eval_A_invalid"] == 2
    # the report records its padding, which compare needs to rebuild the same prompts
    assert report["max_new_tokens"] == 4  # compare refuses reports whose completions were cut at other lengths
    assert report["pad"] == 89 and [s["prompt"] for s in report["samples"]] == [
        repad(parse_line(x), 89).prompt for x in P_LINES[:2] + A_LINES[:2]]
    assert "wrote" in capsys.readouterr().out


def test_cli_bad_paths(snapshot, tmp_path):
    missing = str(tmp_path / "no_such_model")
    run = subprocess.run([sys.executable, SCRIPT, "--model_path", missing], capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and missing in run.stderr  # looked for at parse time, before any model loads
    assert len(run.stderr.strip().splitlines()) == 1 and "Traceback" not in run.stderr
    with pytest.raises(SystemExit, match="no_such_file"):
        ev.main(["--model_path", snapshot, "--data", str(tmp_path / "no_such_file.txt")])


def test_compare_gives_paired_deltas_with_intervals(tmp_path):
    samples = ev.held_out_samples(6)
    def report(path, completions):
        samples_json = [{"task": s.task, "prompt": s.prompt, "completion": c} for s, c in zip(samples, completions)]
        path.write_text(json.dumps({"data": EVAL_PATH, "n_per_task": 6, "shaping": "continuous", "samples": samples_json}))
        return str(path)
    garbage = report(tmp_path / "before.json", ["garbage"] * len(samples))
    labels = report(tmp_path / "after.json", [s.completion for s in samples])
    same = ev.compare(garbage, garbage)
    assert all(d == lo == hi == 0 for _, _, d, lo, hi, _ in same.values())
    rows = ev.compare(garbage, labels)
    b, a, d, lo, hi, n = rows["eval_reward"]
    assert (b, a, n) == (pytest.approx(-0.3), pytest.approx(1.0), 12) and d == pytest.approx(1.3) and lo == hi == d
    b, a, d, lo, hi, n = rows["eval_format_valid_A"]
    assert (b, a, d, n) == (0.0, 1.0, 1.0, 6)
    assert not any(k.endswith("_mae") for k in rows)  # not paired prompt by prompt
    other = report(tmp_path / "other.json", ["x"] * len(samples))
    json.dump({**json.load(open(other)), "samples": []}, open(other, "w"))
    with pytest.raises(ValueError, match="same prompts"):
        ev.compare(garbage, other)
    try:  # with the engine: move quality paired too (labelled moves need no search)
        engine = EngineReward(find_stockfish(), cache_path="")
    except FileNotFoundError:
        return
    b, a, d, lo, hi, n = ev.compare(garbage, labels, engine=engine)["eval_P_cpl"]
    assert (b, a, n) == (1000, 0, 6) and lo == hi == d == -1000  # invalid costs the cap, the label's best move 0


def test_evaluate_py_passes_its_flags_to_the_generation_and_the_report(snapshot, tmp_path, monkeypatch):
    """--max_new_tokens, --batch_size and --compile_decode reach every generate call; --shaping scores the answers
    and is recorded; the report names the shipped set it was made on and stores each prompt's label (compare
    checks both); without --engine_quality no engine judges the moves."""
    samples = ev.held_out_samples(2)
    answers = {s.prompt: f" M: {s.best} E: {s.evals[s.moves.index(s.best)]} B: {s.best}" if s.task == "P" else
               s.completion for s in samples}  # B: and its eval alone: graduated and continuous rewards differ
    calls = []

    def stub(model, prompts, max_new_tokens, **kw):
        calls.append((len(prompts), max_new_tokens, kw["compile_decode"]))
        return [(TOK.encode(answers[TOK.decode(p)]), None) for p in prompts]
    monkeypatch.setattr(ev, "generate", stub)
    out = tmp_path / "r.json"
    ev.main(["--model_path", snapshot, "--n", "2", "--max_new_tokens", "5", "--batch_size", "3", "--compile_decode",
             "--shaping", "graduated", "--out", str(out)])
    report = json.loads(out.read_text())
    assert calls == [(3, 5, True), (1, 5, True)]
    graduated = [score(s, answers[s.prompt], "graduated")[0] for s in samples]
    assert graduated != [score(s, answers[s.prompt])[0] for s in samples]
    assert report["metrics"]["eval_reward"] == pytest.approx(sum(graduated) / 4)
    assert (report["shaping"], report["data"], report["engine"]) == ("graduated", EVAL_PATH, None)
    assert "eval_P_cpl" not in report["metrics"]  # no --engine_quality: no move quality
    assert [x["label"] for x in report["samples"]] == [s.completion for s in samples]


def test_report_path_defaults_and_the_shipped_folders_edges(tmp_path, monkeypatch):
    """Without --out a report goes into the snapshot's folder, or the working directory for a hub id (no folder
    named after it); --out may name a new file in mini/data/ or a file beside that folder whose name starts with
    'data', not a file the project ships there (here a stand-in folder)."""
    parser = argparse.ArgumentParser()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(ev, "DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "data").mkdir()
    for path in (tmp_path / "data" / "eval.jsonl", tmp_path / "data.json"):
        path.write_text("kept")
    assert ev.report_path(parser, "", "org/model", "eval.json") == os.path.join(".", "eval.json")
    assert ev.report_path(parser, "", str(tmp_path), "eval.json") == str(tmp_path / "eval.json")
    for out in (tmp_path / "data" / "new.json", tmp_path / "data.json"):
        assert ev.report_path(parser, str(out), "org/model", "eval.json") == str(out)
    with pytest.raises(SystemExit):
        ev.report_path(parser, str(tmp_path / "data" / "eval.jsonl"), "org/model", "eval.json")


def test_recorded_eval_set_swaps_in_this_checkouts_copy_only_of_a_missing_shipped_set(tmp_path):
    """A report's '' is the shipped set; a missing .../mini/data/NAME (another checkout's) is this checkout's NAME;
    a set that exists is read where it is, even in another checkout's mini/data/; a missing .../data/NAME outside
    a mini/ folder is named as missing."""
    name = os.path.basename(EVAL_PATH)
    assert ev.recorded_eval_set("") == EVAL_PATH
    assert ev.recorded_eval_set(str(tmp_path / "gone" / "mini" / "data" / name)) == os.path.join(DATA_DIR, name)
    kept = tmp_path / "other" / "mini" / "data" / name
    kept.parent.mkdir(parents=True)
    kept.write_text(open(EVAL_PATH).read())
    assert ev.recorded_eval_set(str(kept)) == str(kept)
    with pytest.raises(ValueError, match="does not exist here"):
        ev.recorded_eval_set(str(tmp_path / "gone" / "data" / name))


def test_compare_resamples_with_its_n_boot_and_seed(tmp_path):
    """compare's intervals come from the n_boot and seed it is given (here 7 draws, seed 5), not the defaults."""
    samples = ev.held_out_samples(3)
    completions = [["garbage"] * 6, [s.completion if i % 2 else "garbage" for i, s in enumerate(samples)]]
    paths = [write_report(tmp_path / f"{i}.json", samples, c) for i, c in enumerate(completions)]
    want = ev.paired_bootstrap(*(ev.per_sample_values(samples, c) for c in completions), n_boot=7, seed=5)
    assert ev.compare(*paths, n_boot=7, seed=5) == want != ev.compare(*paths)


def test_a_report_nested_too_deeply_is_not_json(tmp_path):
    """json.load raises RecursionError on 100,000 brackets: one sentence naming the file, not a traceback."""
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 100_000)
    with pytest.raises(ValueError, match=f"^{re.escape(str(deep))} is not JSON"):
        ev.compare(str(deep), str(deep))


def test_a_metric_measured_on_no_answer_has_no_mean_and_no_median():
    """Every move unjudged by the engine: no cpl mean and no median (numpy's NaN of an empty list)."""
    assert ev.means({"eval_P_cpl": [None, None], "eval_reward": [1.0, 0.0]}) == {"eval_reward": 0.5}


def test_bad_flags_and_files_are_one_sentence(snapshot, tmp_path, capsys):
    """--n 0, no --model_path, a data file of no valid line, a report to compare that does not exist: each ends
    evaluate.py with one sentence, before any evaluation."""
    for argv, said in ((["--model_path", snapshot, "--n", "0"], "--n 0 must be at least 1"),
                       ([], "--model_path is required")):
        with pytest.raises(SystemExit) as stop:
            ev.main(argv)
        assert stop.value.code == 2 and said in capsys.readouterr().err
    junk, missing = tmp_path / "junk.txt", tmp_path / "missing.json"
    junk.write_text("not a RookWorld line\n")
    with pytest.raises(SystemExit, match=f"^evaluate.py: {re.escape(str(junk))} holds no sample"):
        ev.main(["--model_path", snapshot, "--data", str(junk), "--out", str(tmp_path / "r.json")])
    with pytest.raises(SystemExit, match=f"^evaluate.py: .*{re.escape(str(missing))}"):
        ev.main(["--compare", str(missing), str(missing)])


def test_out_of_memory_while_generating_is_one_sentence(snapshot, tmp_path, monkeypatch):
    """A --batch_size too large for the GPU was torch's traceback from the decode; it says what to lower, and writes
    no report. Any other error of the decode is a bug, raised as it is."""
    def decode_failing_with(error):
        def complete(*args, **kwargs):
            raise error
        return complete
    argv = ["--model_path", snapshot, "--n", "2", "--batch_size", "512", "--out", str(tmp_path / "r.json")]
    monkeypatch.setattr(ev, "complete", decode_failing_with(torch.OutOfMemoryError("CUDA out of memory. Tried")))
    with pytest.raises(SystemExit, match="^evaluate.py: out of memory generating 512 prompts at once; lower "
                                         "--batch_size$"):
        ev.main(argv)
    monkeypatch.setattr(ev, "complete", decode_failing_with(RuntimeError("shapes cannot be multiplied")))
    with pytest.raises(RuntimeError, match="shapes"):
        ev.main(argv)
    assert not (tmp_path / "r.json").exists()


def test_compare_checks_the_labels_of_both_reports(tmp_path):
    """A report made on other labels than the set holds now, the AFTER one as well as the BEFORE one, is refused:
    its answers would be scored against labels they were not made on."""
    samples = ev.held_out_samples(3)
    before = write_report(tmp_path / "b.json", samples, ["junk"] * len(samples))
    after = write_report(tmp_path / "a.json", samples, [s.completion for s in samples])
    report = json.loads(open(after).read())
    report["samples"][0]["label"] = report["samples"][0]["label"].replace("B:", "B: a1a1 ")
    with open(after, "w") as f:
        json.dump(report, f)
    with pytest.raises(ValueError, match="no longer holds the prompts and labels"):
        ev.compare(before, after)


def test_the_engine_judge_takes_depth_nodes_and_cache_from_the_flags(tmp_path):
    cache = str(tmp_path / "c.jsonl")
    engine, reason = ev.engine_or_reason(argparse.Namespace(stockfish_path="", engine_depth=7, engine_nodes=500,
                                                            engine_cache=cache))
    if engine is None:
        pytest.skip(reason)
    assert (engine.depth, engine.nodes, engine.cache_path) == (7, 500, cache)


def test_report_counts_leave_out_unmeasured_answers(snapshot, tmp_path):
    """An untrained model's answers are all invalid: PV1 among legal answers is measured on none of them, so its
    count is 0 and it has no mean, not a count of 2 beside a mean of nothing."""
    out = tmp_path / "r.json"
    ev.main(["--model_path", snapshot, "--n", "2", "--max_new_tokens", "8", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["counts"]["eval_P_best_acc_pv1_legal"] == 0 and "eval_P_best_acc_pv1_legal" not in report["metrics"]


def write_report(path, samples, completions, data=EVAL_PATH, shaping="continuous", labels=True):
    """An evaluate.py report (the keys compare reads) of completions of the first half P:, second half A: samples."""
    rows = [dict(task=s.task, prompt=s.prompt, completion=c, **({"label": s.completion} if labels else {}))
            for s, c in zip(samples, completions)]
    path.write_text(json.dumps({"data": data, "n_per_task": len(samples) // 2, "shaping": shaping, "samples": rows}))
    return str(path)


def test_compare_refuses_a_changed_eval_set(tmp_path):
    """compare re-reads the eval set the reports name: when it no longer holds their prompts (other positions
    first) or their labels (an eval changed), it refuses rather than score completions against other positions."""
    with open(EVAL_PATH) as f:
        header, *lines = f.read().splitlines(True)[:7]
    data = tmp_path / "data.jsonl"
    data.write_text(header + "".join(lines))
    samples = ev.held_out_samples(3, path=str(data))
    before = write_report(tmp_path / "before.json", samples, ["garbage"] * 6, str(data))
    after = write_report(tmp_path / "after.json", samples, [s.completion for s in samples], str(data))
    assert ev.compare(before, after)["eval_P_best_acc_label"][:3] == (0.0, 1.0, 1.0)
    data.write_text(header + "".join(lines[3:] + lines[:3]))  # the same name, other positions first
    with pytest.raises(ValueError, match=re.escape(f"{data} no longer holds the prompts and labels")):
        ev.compare(before, after)
    record = json.loads(lines[0])
    record["evals"][0] -= 0.5  # the same position, another label
    data.write_text(header + json.dumps(record) + "\n" + "".join(lines[1:]))
    with pytest.raises(ValueError, match="no longer holds the prompts and labels"):
        ev.compare(before, after)
    # reports of older versions store no label: their prompts alone are checked
    unlabelled = [write_report(tmp_path / f"{name}.json", samples, ["garbage"] * 6, str(data), labels=False)
                  for name in ("b", "a")]
    assert ev.compare(*unlabelled)["eval_reward"][:3] == pytest.approx((-0.3, -0.3, 0.0))
    data.write_text(header + "".join(lines[3:] + lines[:3]))  # other positions first: the prompts alone tell
    with pytest.raises(ValueError, match="no longer holds the prompts and labels"):
        ev.compare(*unlabelled)


def test_compare_finds_a_shipped_set_recorded_by_another_checkout(tmp_path):
    """A report made in a clone or worktree names that checkout's mini/data/eval.jsonl: compare reads this
    checkout's (and still checks its prompts and labels); a set that exists nowhere is named in one sentence."""
    samples = ev.held_out_samples(3)
    elsewhere = str(tmp_path / "clone" / "mini" / "data" / "eval.jsonl")
    before = write_report(tmp_path / "before.json", samples, ["garbage"] * 6, elsewhere)
    after = write_report(tmp_path / "after.json", samples, [s.completion for s in samples])
    assert ev.compare(before, after)["eval_P_best_acc_label"][:3] == (0.0, 1.0, 1.0)
    gone = write_report(tmp_path / "gone.json", samples, ["garbage"] * 6, str(tmp_path / "clone" / "eval.jsonl"))
    with pytest.raises(ValueError, match="eval.jsonl, the eval set the reports were made on, does not exist here"):
        ev.compare(gone, after)


def test_compare_refuses_other_shaping(tmp_path):
    """The same completions scored under --shaping continuous and graduated: eval_reward would be two functions."""
    samples = ev.held_out_samples(2)
    completions = [s.completion for s in samples]
    paths = [write_report(tmp_path / f"{shaping}.json", samples, completions, shaping=shaping)
             for shaping in ("continuous", "graduated")]
    with pytest.raises(ValueError, match="--shaping continuous and graduated"):
        ev.compare(*paths)


def test_compare_refuses_completions_cut_at_another_length(tmp_path):
    """Completions cut at 8 tokens against whole ones: the shorter ones would score as worse answers."""
    samples = ev.held_out_samples(2)
    paths = [write_report(tmp_path / f"{n}.json", samples, [s.completion for s in samples]) for n in (8, 96)]
    for path, n in zip(paths, (8, 96)):
        with open(path) as f:
            report = json.load(f)
        with open(path, "w") as f:
            json.dump(dict(report, max_new_tokens=n), f)
    with pytest.raises(ValueError, match="cut at --max_new_tokens 8 and 96; evaluate both with the same"):
        ev.compare(*paths)
    assert ev.compare(paths[1], paths[1])["eval_reward"][2] == 0  # the same length compares


def test_compare_names_a_file_that_is_not_a_report(tmp_path):
    """A chess_eval.py report, or a file that is not JSON: one sentence that names the file."""
    samples = ev.held_out_samples(1)
    good = write_report(tmp_path / "good.json", samples, ["garbage"] * 2)
    chess = tmp_path / "chess.json"
    chess.write_text(json.dumps({"suite": "chess", "values": {}, "items": {}, "metrics": {}}))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    message = f"evaluate.py: {chess} is not an evaluate.py report (run python mini/evaluate.py --model_path"
    with pytest.raises(SystemExit, match=re.escape(message)):
        ev.main(["--compare", good, str(chess)])
    with pytest.raises(ValueError, match=re.escape(f"{bad} is not JSON")):
        ev.compare(str(bad), good)
    report = json.loads(open(good).read())
    bad.write_text(json.dumps({**report, "samples": [{"prompt": x["prompt"]} for x in report["samples"]]}))
    with pytest.raises(ValueError, match=re.escape(f"{bad}: its 'samples' is ")):  # no completion to score
        ev.compare(good, str(bad))


class FailingEngine:
    """An EngineReward whose engine has no eval after any move (as when Stockfish crashes on a position)."""

    def annotator(self):
        return self

    def evals_after(self, pairs):
        return {p: None for p in pairs}


def test_engine_failures_stay_aligned_with_the_samples():
    """A move the engine cannot judge is None in its sample's place, so that paired_bootstrap pairs a sample
    only where both sides were judged: here sample 2 alone (1000 -> 0), not [0, 1000] against [1000, 0]."""
    samples = ev.held_out_samples(3)[:3]
    unlabelled = lambda s: s.completion.replace(f"B: {s.best}", f"B: {min(legal_ucis(s.fen) - set(s.moves))}")
    illegal = lambda s: s.completion.replace(f"B: {s.best}", "B: a1a1")
    before = ev.per_sample_values(samples, [unlabelled(samples[0]), samples[1].completion, illegal(samples[2])],
                                  engine=FailingEngine())
    after = ev.per_sample_values(samples, [illegal(samples[0]), unlabelled(samples[1]), samples[2].completion],
                                 engine=FailingEngine())
    assert before["eval_P_cpl"] == [None, 0.0, 1000.0] and after["eval_P_cpl"] == [1000.0, None, 0.0]
    assert before["eval_P_blunder"] == [None, 0.0, 1.0]
    assert ev.paired_bootstrap(before, after)["eval_P_cpl"] == (1000.0, 0.0, -1000.0, -1000.0, -1000.0, 1)
    m = ev.means(before)
    assert (m["eval_P_cpl"], m["eval_P_cpl_median"], m["eval_P_blunder"]) == (500.0, 500.0, 0.5)
    assert ev.paired_bootstrap({"m": [None, 1.0], "e": []}, {"m": [2.0, None], "e": []}) == {}  # no pair: no row


def test_blunder_is_a_loss_of_200_cp_or_more_and_cpl_legal_leaves_out_illegal_answers():
    """README: blunder = cpl >= 200. Labelled moves need no search: e2e4 0.5 (best), d2d4 -1.5 (loses exactly
    200 cp), g1f3 -1.49 (199 cp); an illegal move and an invalid answer cost the cap, 1000, and are left out of
    cpl_legal, the loss over legal answers."""
    s = policy_sample(chess.STARTING_FEN, ["e2e4", "d2d4", "g1f3"], [0.5, -1.5, -1.49])
    answers = [f" M: e2e4 E: 0.5 B: {b}" for b in ("e2e4", "d2d4", "g1f3", "e2e5")] + ["junk"]
    v = ev.per_sample_values([s] * 5, answers, engine=FailingEngine())
    assert v["eval_P_cpl"] == [0, 200, 199, 1000, 1000]
    assert v["eval_P_blunder"] == [0, 1, 0, 1, 1]
    assert v["eval_P_cpl_legal"] == [0, 200, 199, None, None]
    assert ev.means(v)["eval_P_cpl_legal"] == pytest.approx(133)


def test_compare_scores_with_the_reports_shaping(tmp_path):
    """Two reports made with --shaping graduated: compare's eval_reward is each side's graduated reward
    (quarters), not the continuous one, which differs on these answers (B: and its eval alone)."""
    samples = ev.held_out_samples(3)
    answers = [f" M: {s.best} E: {s.evals[s.moves.index(s.best)]} B: {s.best}" if s.task == "P" else s.completion
               for s in samples]
    before = write_report(tmp_path / "b.json", samples, ["junk"] * 6, shaping="graduated")
    after = write_report(tmp_path / "a.json", samples, answers, shaping="graduated")
    graduated = [score(s, c, "graduated")[0] for s, c in zip(samples, answers)]
    assert set(graduated) <= set(GRADUATED) and graduated != [score(s, c)[0] for s, c in zip(samples, answers)]
    b, a, d, lo, hi, n = ev.compare(before, after)["eval_reward"]
    assert (b, n) == (pytest.approx(-0.3), 6) and a == pytest.approx(sum(graduated) / 6)


def test_compare_rebuilds_the_prompts_at_the_reports_padding(tmp_path):
    """Reports made with --pad 89 hold P: prompts padded to 89: compare rebuilds the eval set at that padding
    (at 90 the prompts would differ and compare would call the eval set changed)."""
    samples, paths = [repad(s, 89) for s in ev.held_out_samples(3)], []
    for name, completions in (("b", ["junk"] * 6), ("a", [s.completion for s in samples])):
        path = tmp_path / f"{name}.json"
        write_report(path, samples, completions)
        path.write_text(json.dumps({**json.loads(path.read_text()), "pad": 89}))
        paths.append(str(path))
    assert ev.compare(*paths)["eval_P_best_acc_label"][:3] == (0.0, 1.0, 1.0)


def test_paired_bootstrap_matches_the_normal_approximation():
    """Half the prompts gain 1: delta 0.5, 95% interval 0.5 +- 1.96 * sqrt(0.25 / 400) = [0.451, 0.549]."""
    before = {"m": [0.0] * 400, "eval_P_eval_mae": [1.0] * 400}
    after = {"m": [1.0, 0.0] * 200, "eval_P_eval_mae": [0.0] * 400}
    rows = ev.paired_bootstrap(before, after, n_boot=4000)
    b, a, d, lo, hi, n = rows["m"]
    assert (b, a, d, n) == (0.0, 0.5, 0.5, 400)
    assert lo == pytest.approx(0.451, abs=0.01) and hi == pytest.approx(0.549, abs=0.01)
    assert list(rows) == ["m"]  # MAEs are not paired prompt by prompt


def test_paired_bootstrap_equals_a_plain_loop_over_the_same_draws():
    """Against a plain reference: the pairs where both sides are measured, each of n_boot resamples of their
    deltas (drawn from default_rng([seed, n]), the docstring's seeding) averaged, the 2.5th and 97.5th percentiles
    by linear interpolation between the sorted means (continuous deltas too, whose sorted means differ, so that
    the interpolation shows). Lists of other lengths are not the same prompts: no row."""
    def plain(before, after, n_boot, seed):
        pairs = [(b, a) for b, a in zip(before, after) if b is not None and a is not None]
        n = len(pairs)
        means = sorted(sum(pairs[i][1] - pairs[i][0] for i in row) / n
                       for row in np.random.default_rng([seed, n]).integers(0, n, (n_boot, n)).tolist())

        def percentile(q):
            at = (len(means) - 1) * q / 100
            return means[int(at)] + (means[min(int(at) + 1, len(means) - 1)] - means[int(at)]) * (at - int(at))
        return (sum(b for b, _ in pairs) / n, sum(a for _, a in pairs) / n, sum(a - b for b, a in pairs) / n,
                percentile(2.5), percentile(97.5), n)
    before, after = [0.0, 1.0, 1.0, 0.0, 1.0, None, 0.5, 0.25], [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, None, 1.0]
    assert ev.paired_bootstrap({"m": before}, {"m": after}, n_boot=50, seed=3)["m"] == pytest.approx(
        plain(before, after, 50, 3)) and plain(before, after, 50, 3)[-1] == 6
    before, after = np.random.default_rng(0).random(9).tolist(), np.random.default_rng(1).random(9).tolist()
    assert ev.paired_bootstrap({"m": before}, {"m": after}, n_boot=30, seed=4)["m"] == pytest.approx(
        plain(before, after, 30, 4), rel=1e-12)
    assert ev.paired_bootstrap({"m": [1.0, 2.0], "x": [1.0]}, {"m": [1.0], "x": [0.0]}) == {"x": (1.0, 0.0, -1.0,
                                                                                                -1.0, -1.0, 1)}
    assert ev.paired_bootstrap({"m": [None, 1.0]}, {"m": [0.0, None]}) == {}  # no pair measured on both sides: no row


def test_compare_refuses_a_report_whose_padding_or_size_no_report_holds(tmp_path):
    """A report's pad is 89 or 90 (formats.PAD_WIDTHS), its n_per_task a positive integer that a slice takes (10**30
    was islice's error), its max_new_tokens a positive integer ("96" was 'cut at 96 and 96'), its shaping one of
    --shaping's (a hand-edited "Strict" was scored, silently, as continuous): another value is named in one
    sentence."""
    samples = ev.held_out_samples(1)
    good = write_report(tmp_path / "good.json", samples, ["garbage"] * 2)
    for key, value in (("pad", 91), ("pad", "89"), ("n_per_task", 0), ("n_per_task", True),
                       ("n_per_task", 10**30), ("max_new_tokens", "96"), ("max_new_tokens", 0), ("shaping", "Strict"),
                       ("shaping", ["strict"])):
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({**json.loads(open(good).read()), key: value}))
        with pytest.raises(ValueError, match=re.escape(f"{bad}: its {key!r} is {json.dumps(value)}, which no ")):
            ev.compare(good, str(bad))


def test_paired_bootstrap_pairs_prompts_and_shares_draws():
    """Every prompt gains exactly 0.1 on a before that varies from 0 to 1: paired, the delta has no
    spread at all (an unpaired bootstrap would give an interval ~0.1 wide). A metric's interval is
    the same whichever other metrics come with it."""
    before = [i / 399 for i in range(400)]
    rows = ev.paired_bootstrap({"m": before}, {"m": [x + 0.1 for x in before]})
    _, _, d, lo, hi, _ = rows["m"]
    assert (d, lo, hi) == pytest.approx((0.1, 0.1, 0.1))
    x, y = [0.0, 1.0] * 100, [1.0, 1.0] * 100
    alone = ev.paired_bootstrap({"x": x}, {"x": y})["x"]
    assert ev.paired_bootstrap({"other": y, "x": x}, {"other": x, "x": y})["x"] == alone


def garbage_then_labels(tmp_path):
    """Two reports on 3 + 3 shipped held-out prompts: every completion garbage, then every one the label."""
    samples, paths = ev.held_out_samples(3), []
    for name, completions in (("before", ["garbage"] * len(samples)), ("after", [s.completion for s in samples])):
        rows = [{"task": s.task, "prompt": s.prompt, "completion": c} for s, c in zip(samples, completions)]
        (tmp_path / name).write_text(json.dumps({"data": EVAL_PATH, "n_per_task": 3, "shaping": "continuous",
                                                 "samples": rows}))
        paths.append(str(tmp_path / name))
    return paths


def test_compare_table_lines_up_whatever_the_names(tmp_path, capsys):
    ev.main(["--compare", *garbage_then_labels(tmp_path)])
    lines = capsys.readouterr().out.splitlines()
    names = [line.split()[0] for line in lines[1:]]
    assert "eval_P_best_legal_not_in_check" in names or "eval_P_best_legal_in_check" in names
    assert len({len(line) for line in lines}) == 1  # every row as long as the header: no name pushes its numbers


def test_compare_plot(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason='matplotlib is an optional extra: pip install -e ".[plot]"')
    paths = garbage_then_labels(tmp_path)
    ev.main(["--compare", *paths, "--plot", str(tmp_path / "plots" / "compare.png")])
    assert (tmp_path / "plots" / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "wrote" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        ev.main(["--plot", "x.png"])
    assert "--plot goes with --compare" in capsys.readouterr().err


def test_compare_with_engine_quality_pairs_the_move_quality(tmp_path, capsys):
    """--compare A B --engine_quality judges both reports' moves: invalid answers cost the cap, 1000 cp, the labels'
    best moves 0 (labelled moves need no search), so eval_P_cpl goes from 1000 to 0 in the table."""
    try:
        find_stockfish()
    except FileNotFoundError:
        pytest.skip("Stockfish binary not found (apt-get install stockfish)")
    ev.main(["--compare", *garbage_then_labels(tmp_path), "--engine_quality", "--engine_cache", ""])
    (row,) = [line.split() for line in capsys.readouterr().out.splitlines() if line.startswith("eval_P_cpl ")]
    assert row[1:4] == ["1000.0000", "0.0000", "-1000.0000"] and row[-1] == "3"


def test_a_plot_of_a_format_matplotlib_lacks_stops_before_the_comparison_and_a_failed_write_keeps_the_table(
        tmp_path, capsys, monkeypatch):
    pytest.importorskip("matplotlib", reason='matplotlib is an optional extra: pip install -e ".[plot]"')
    from mini import plots
    paths = garbage_then_labels(tmp_path)
    monkeypatch.setattr(ev, "compare", lambda *a, **k: pytest.fail("a refused --plot ran the comparison"))
    with pytest.raises(SystemExit) as stop:
        ev.main(["--compare", *paths, "--plot", str(tmp_path / "compare.txt")])
    assert stop.value.code == 2 and "matplotlib writes no .txt file" in capsys.readouterr().err
    monkeypatch.undo()

    def disk_full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(plots, "compare_bars", disk_full)
    with pytest.raises(SystemExit, match=re.escape("evaluate.py: could not write --plot ")) as stop:
        ev.main(["--compare", *paths, "--plot", str(tmp_path / "compare.png")])
    assert "the table above is the comparison" in str(stop.value) and "eval_reward" in capsys.readouterr().out


def test_a_report_cut_off_while_written_leaves_the_one_there_whole(tmp_path, monkeypatch):
    """A full disk half-way through json.dump: the report already at out is kept as it was, no .tmp is left, and
    the new one goes to the spare file that the one sentence names."""
    out = tmp_path / "r.json"
    out.write_text(json.dumps({"metrics": {"x": 0.0}}))
    dump, calls = json.dump, []

    def half_then_full(obj, f, **kw):
        calls.append(f.name)
        if len(calls) == 1:
            f.write('{"metr')
            raise OSError(errno.ENOSPC, "No space left on device")
        dump(obj, f, **kw)
    monkeypatch.setattr(ev.json, "dump", half_then_full)
    with pytest.raises(SystemExit) as stop:
        ev.save_report({"metrics": {"x": 1.0}}, str(out), "evaluate.py")
    monkeypatch.undo()
    assert json.loads(out.read_text()) == {"metrics": {"x": 0.0}} and os.listdir(tmp_path) == ["r.json"]
    spare = str(stop.value).rsplit(" ", 1)[1]
    assert json.loads(open(spare).read()) == {"metrics": {"x": 1.0}}
    os.remove(spare)


def test_a_report_saved_with_a_byte_order_mark_is_read(tmp_path, capsys):
    """An editor on Windows saves UTF-8 with a BOM: the report still compares."""
    before, after = garbage_then_labels(tmp_path)
    with open(after, "rb") as f:
        text = f.read()
    with open(after, "wb") as f:
        f.write(b"\xef\xbb\xbf" + text)
    ev.main(["--compare", before, after])
    assert "eval_reward" in capsys.readouterr().out


def test_fewer_realistic_transitions_than_the_set_come_from_every_history_bucket():
    """eval_games.jsonl stores its A: transitions bucket by bucket: --n 30 takes 10 of each, in the file's order,
    and --n 600 takes the file as it is (so that reports made before pair with those made now)."""
    stored = [s for s in ev.load_jsonl(REAL_EVAL_PATH) if s.task == "A"]
    taken = [s for s in ev.held_out_samples(30, path=REAL_EVAL_PATH) if s.task == "A"]
    buckets = [history_bucket(len(s.history)) for s in taken]
    assert buckets == ["1-2"] * 10 + ["3-5"] * 10 + ["6-10"] * 10
    assert [stored.index(s) for s in taken] == sorted(stored.index(s) for s in taken)
    assert [s for s in ev.held_out_samples(600, path=REAL_EVAL_PATH) if s.task == "A"] == stored



def interrupted(*a, **k):
    raise KeyboardInterrupt


@pytest.mark.parametrize("stage", ["complete", "per_sample_values"])
def test_ctrl_c_during_the_generation_or_scoring_is_one_sentence_and_writes_no_report(snapshot, tmp_path, monkeypatch,
                                                                                      stage):
    """Ctrl-C in the minutes of generation, or of --engine_quality's searches, ends with a sentence that says no
    report was written, not a traceback."""
    monkeypatch.setattr(ev, stage, interrupted)
    out = tmp_path / "r.json"
    try:
        ev.main(["--model_path", snapshot, "--n", "1", "--device", "cpu", "--out", str(out)])
    except KeyboardInterrupt:  # caught here: escaping, it would stop the whole pytest session
        pytest.fail(f"Ctrl-C during {stage} ended in a traceback")
    except SystemExit as e:
        assert str(e) == f"evaluate.py: interrupted (Ctrl-C) before the evaluation ended; no report was written to {out}"
    else:
        pytest.fail("the evaluation went on after Ctrl-C")
    assert not out.exists()


def test_ctrl_c_during_a_comparison_is_one_sentence(monkeypatch):
    """--compare --engine_quality searches each answer's move: minutes, which Ctrl-C ends without a traceback."""
    monkeypatch.setattr(ev, "paired_reports", lambda *paths: ([], []))  # the reports read; the searches under way
    monkeypatch.setattr(ev, "compare_paired", interrupted)
    try:
        ev.main(["--compare", "a.json", "b.json"])
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C during the comparison ended in a traceback")
    except SystemExit as e:
        assert str(e) == "evaluate.py: interrupted (Ctrl-C) before the comparison ended"
    else:
        pytest.fail("the comparison went on after Ctrl-C")


def test_out_with_compare_is_refused_not_ignored(tmp_path, capsys):
    """--compare writes no report: an --out given with it was ignored, and the file asked for never came."""
    with pytest.raises(SystemExit) as e:
        ev.main(["--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--out", str(tmp_path / "c.json")])
    assert e.value.code == 2 and "--out names an evaluation's report; --compare writes none" in capsys.readouterr().err


@pytest.mark.parametrize("flags, named", [(["--data", "x.txt", "--n", "5"], "--data, --n set"),
                                          (["--pad", "89"], "--pad sets"),
                                          (["--max_new_tokens", "8"], "--max_new_tokens sets"),
                                          (["--shaping", "strict"], "--shaping sets"),
                                          (["--model_path", os.path.join(os.path.dirname(EVAL_PATH), "rookworld-8m"),
                                            "--device", "cpu"], "--model_path, --device set")])
def test_evaluation_flags_with_compare_are_refused_not_ignored(flags, named, tmp_path, capsys):
    """--compare reads the data, padding, shaping and cut of the two reports: --pad 89 or --shaping given with it
    were silently ignored, and the table taken for a comparison under them."""
    with pytest.raises(SystemExit) as e:
        ev.main(["--compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")] + flags)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and err.endswith(f"{named} an evaluation; --compare reads its settings from the two "
                                              "reports: evaluate both models with them, then compare"), err


def test_paired_bootstrap_by_cluster_equals_a_plain_loop_over_the_same_draws():
    """clusters, against a plain reference: the pairs measured on both sides, their clusters numbered in the order
    of their first pair (a cluster whose every pair is unmeasured is not one of the C), each of n_boot draws of C
    clusters from default_rng([seed, C]) (the docstring's seeding), a draw's delta the sum of its clusters' deltas
    over the number of their pairs, not the mean of their means (the clusters differ in size here); the point
    estimates and n are those without clusters. A metric without clusters is resampled by prompt."""
    def plain(before, after, ids, n_boot, seed):
        kept = [(b, a, c) for b, a, c in zip(before, after, ids) if b is not None and a is not None]
        order = list(dict.fromkeys(c for _, _, c in kept))
        deltas = [[a - b for b, a, c in kept if c == cluster] for cluster in order]
        draws = np.random.default_rng([seed, len(order)]).integers(0, len(order), (n_boot, len(order))).tolist()
        means = sorted(sum(sum(deltas[j]) for j in row) / sum(len(deltas[j]) for j in row) for row in draws)

        def percentile(q):
            at = (len(means) - 1) * q / 100
            return means[int(at)] + (means[min(int(at) + 1, len(means) - 1)] - means[int(at)]) * (at - int(at))
        n = len(kept)
        return (sum(b for b, _, _ in kept) / n, sum(a for _, a, _ in kept) / n, sum(a - b for b, a, _ in kept) / n,
                percentile(2.5), percentile(97.5), n)
    before = [0.0, 1.0, 1.0, 0.0, 1.0, None, 0.5, 0.25, 0.0, 1.0, 0.75]
    after = [1.0, 1.0, 0.0, 0.0, 1.0, 1.0, None, 1.0, 1.0, 0.0, 0.25]
    games = [7, 2, 7, 5, 2, 9, 9, 2, 7, 11, 7]  # game 9 has no pair measured on both sides: C = 4
    rows = ev.paired_bootstrap({"m": before, "x": before}, {"m": after, "x": after}, n_boot=60, seed=3,
                               clusters={"m": games})
    assert rows["m"] == pytest.approx(plain(before, after, games, 60, 3), rel=1e-12)
    assert rows["m"][-1] == 9 and rows["m"][:3] == rows["x"][:3] and rows["m"][3:5] != rows["x"][3:5]
    assert rows["x"] == ev.paired_bootstrap({"x": before}, {"x": after}, n_boot=60, seed=3)["x"]
    before, after = np.random.default_rng(0).random(30).tolist(), np.random.default_rng(1).random(30).tolist()
    games = np.random.default_rng(2).integers(0, 6, 30).tolist()
    assert ev.paired_bootstrap({"m": before}, {"m": after}, n_boot=40, seed=4, clusters={"m": games})["m"] == \
        pytest.approx(plain(before, after, games, 40, 4), rel=1e-12)


def test_intervals_by_cluster_by_hand():
    """Clusters whose pairs' deltas average 0.25 each (the pairs' own deltas vary) give [0.25, 0.25]: every draw's
    pairs average 0.25, where by prompt the interval is wide. 20 games of 10 prompts, each game's prompts all gaining
    1 or all 0, 10 of each: a draw's delta is Binomial(20, 1/2) / 20, whose 2.5% and 97.5% quantiles are 0.30 and
    0.70 (P(X <= 5) = 0.021 < 0.025 <= P(X <= 6) = 0.058), against [0.43, 0.57] by prompt, as if the 200 were
    independent. Clusters of one prompt each give the interval by prompt exactly (the same draws)."""
    before, after = [0.0, 0.5, 0.0, 0.1, 0.2, 0.3], [0.5, 0.5, 0.25, 0.35, 0.45, 0.55]
    rows = ev.paired_bootstrap({"m": before, "x": before}, {"m": after, "x": after}, clusters={"m": [0, 0, 1, 2, 2, 2]})
    assert rows["m"][2:5] == pytest.approx((0.25, 0.25, 0.25), abs=1e-12) and rows["x"][4] - rows["x"][3] > 0.2
    games = [g for g in range(20) for _ in range(10)]
    gained = [float(g % 2) for g in games]
    rows = ev.paired_bootstrap({"m": [0.0] * 200, "x": [0.0] * 200}, {"m": gained, "x": gained}, n_boot=20000,
                               clusters={"m": games})
    assert rows["m"][2:] == pytest.approx((0.5, 0.30, 0.70, 200), abs=1e-9)
    assert rows["x"][3] == pytest.approx(0.43, abs=0.01) and rows["x"][4] == pytest.approx(0.57, abs=0.01)
    before, after = np.random.default_rng(0).random(25).tolist(), np.random.default_rng(1).random(25).tolist()
    by_prompt = ev.paired_bootstrap({"m": before}, {"m": after}, n_boot=500, seed=2)
    assert ev.paired_bootstrap({"m": before}, {"m": after}, n_boot=500, seed=2,
                               clusters={"m": [f"game {i}" for i in range(25)]}) == by_prompt


def test_per_sample_values_groups_sample_values_by_metric():
    """sample_values yields each value with the index of its sample, sample after sample; per_sample_values is
    those values by metric, in order (as before the generator)."""
    samples = ev.held_out_samples(3)
    completions = [s.completion if i % 3 else "garbage" for i, s in enumerate(samples)]
    triples = list(ev.sample_values(samples, completions))
    grouped = {}
    for _, name, v in triples:
        grouped.setdefault(name, []).append(v)
    assert ev.per_sample_values(samples, completions) == dict(sorted(grouped.items()))
    indices = [i for i, _, _ in triples]
    assert indices == sorted(indices) and set(indices) == set(range(len(samples)))
    for i, name, _ in triples:
        assert name == "eval_reward" or f"_{samples[i].task}_" in name + "_", (i, name)


def games_set(tmp_path, env=True):
    """A set of real games as annotate.py --pgn writes it: 3 P: positions of the shipped eval set, each with its
    game (0, 0, 1), and (env) 3 A: transitions on them (the labels' best move), of games 1, 2 and 0."""
    with open(EVAL_PATH) as f:
        header, *lines = f.read().splitlines()[:4]
    policy = [dict(json.loads(line), game=g) for line, g in zip(lines, (0, 0, 1))]
    transitions = [{"fen": r["fen"], "move": r["moves"][0], "history": [r["moves"][0]], "game": g}
                   for r, g in zip(policy, (1, 2, 0))] if env else []
    path = tmp_path / ("games.jsonl" if env else "positions.jsonl")
    path.write_text("\n".join([header] + [json.dumps(r) for r in policy + transitions]) + "\n")
    return str(path)


def test_compare_by_game_resamples_the_games_of_the_values_samples(tmp_path, capsys):
    """compare(by_game=True) on a set of real games: each metric's clusters are the games of the samples its values
    come from (eval_reward all 6, eval_reward_A the A: ones); the point estimates and n stay, the intervals change;
    the table says so and how many games. A set of P: positions alone gives its A: transitions their position's
    game. --by_game without --compare, or on a set that records no games, is one sentence."""
    data = games_set(tmp_path)
    samples = ev.held_out_samples(3, path=data)
    assert [s.game for s in samples] == [0, 0, 1, 1, 2, 0]
    completions = [["garbage"] * 6, [s.completion if i in (0, 3, 4) else "garbage" for i, s in enumerate(samples)]]
    paths = [write_report(tmp_path / f"{i}.json", samples, c, data) for i, c in enumerate(completions)]
    values = [ev.per_sample_values(samples, c) for c in completions]
    games = [s.game for s in samples]
    clusters = {"eval_reward": games, "eval_reward_A": games[3:], "eval_P_best_legal": games[:3]}
    want = ev.paired_bootstrap(*values, clusters=clusters)
    rows, plain = ev.compare(*paths, by_game=True), ev.compare(*paths)
    assert {k: rows[k] for k in clusters} == {k: want[k] for k in clusters} and rows.keys() == plain.keys()
    assert all(rows[k][::5] == plain[k][::5] and rows[k][:3] == plain[k][:3] for k in rows)
    assert rows["eval_reward"][3:5] != plain["eval_reward"][3:5]
    ev.main(["--compare", *paths, "--by_game"])
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "95% CI of delta: resampling whole games (3 games), not prompts" and out[1].startswith("metric")
    (row,) = [line.split() for line in out if line.startswith("eval_reward ")]
    b, a, d, lo, hi, n = rows["eval_reward"]
    assert row[-3:] == [f"[{lo:+.4f},", f"{hi:+.4f}]", str(n)]
    positions = ev.held_out_samples(3, path=games_set(tmp_path, env=False))
    assert [(s.task, s.game) for s in positions] == [("P", 0), ("P", 0), ("P", 1), ("A", 0), ("A", 0), ("A", 1)]
    with pytest.raises(SystemExit) as stop:
        ev.main(["--by_game"])
    assert stop.value.code == 2 and capsys.readouterr().err.strip().endswith(
        "--by_game goes with --compare BEFORE AFTER: it resamples whole games in the comparison's intervals")
    shipped = garbage_then_labels(tmp_path)
    with pytest.raises(SystemExit) as stop:
        ev.main(["--compare", *shipped, "--by_game"])
    assert str(stop.value) == (f"evaluate.py: {EVAL_PATH} records no games (6 of the 6 prompts compared have none); "
                               "sets built by annotate.py --pgn do; leave out --by_game")
    assert capsys.readouterr().out == ""


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
