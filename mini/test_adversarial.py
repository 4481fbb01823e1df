"""Adversarial completions: text before, after and inside a valid answer, each with its exact reward; text
around an answer never parses (-0.3), and no junk inserted into a completion raises its reward.

P: sample: P_LINES[0], ranking b3b5 (label) > b3b7 (-1.13) > b3b4 (-2.11) > b3f3 (-2.33) > b3b1 (-2.42), 5 labelled.
   raw = (5 best + 3 candidates + 2 evals) / 10, reward = 0.2 + 0.8 raw.
A: sample: A_LINES[0], next FEN F, reward 0.001, not terminated, not truncated.
   raw = (4 fen_exact + 2 fen_similarity + 2 reward_exact + terminated_exact + truncated_exact) / 10.

    python mini/test_adversarial.py
"""
import pytest
from hypothesis import given, settings, strategies as st

from mini.games import policy_move
from mini.formats import env_sample, parse_env, parse_line
from mini.reward_scorer import score
from mini.test_formats import A_LINES, P_LINES

P = parse_line(P_LINES[0])
A = parse_line(A_LINES[0])
REF_P, REF_A = P.completion, A.completion
F = A.next_fen  # r1bk3r/2p2ppp/2P1p2N/ppB1P3/8/3B1N2/PPP2PPP/3RK2R b K - 0 18
BOARD = F.split()[0]

P_CASES = {
    "own": (REF_P, 1.0),
    "text before": ("Sure! " + REF_P, -0.3),
    "text after": (REF_P + " Hope this helps", -0.3),
    "a second B:": (REF_P + " B: b3b5", -0.3),
    "EOS text glued to the move": (REF_P + "<|endoftext|>", -0.3),
    "whitespace after": (REF_P + "\n\n", 1.0),
    "the answer twice": (REF_P + REF_P, -0.3),
    "a word among the moves": (" M: b3b5 junk E: -0.8 0 B: b3b5", -0.3),
    "a word among the evals": (" M: b3b5 E: -0.8 junk B: b3b5", -0.3),
    "a word before B:'s move": (" M: b3b5 E: -0.8 B: so b3b5", -0.3),
    "sections out of order": (" B: b3b5 M: b3b5 E: -0.8", -0.3),
    "a NaN eval": (" M: b3b5 E: nan B: b3b5", -0.3),
    "an infinite eval": (" M: b3b5 E: inf B: b3b5", -0.3),
    "no B: move": (" M: b3b5 E: -0.8 B:", -0.3),
    "six moves": (" M: b3b5 b3b7 b3b4 b3f3 b3b1 d2e3 E: -0.8 -1.13 -2.11 -2.33 -2.42 0 B: b3b5", -0.3),
    # best 1, candidates 1/5, evals 1: raw (5 + 0.6 + 2) / 10 = 0.76 -> 0.808
    "only the best": (" M: b3b5 E: -0.8 B: b3b5", 0.808),
    "no spaces": ("M:b3b5 E:-0.8 B:b3b5", 0.808),
    # best second (0.5): raw (2.5 + 0.6 + 2) / 10 = 0.51 -> 0.608
    "best said second": (" M: b3b5 E: -0.8 B: b3b7", 0.608),
    # b3a3 is onto its own pawn: candidates (1 - 0.5) / 5 = 0.1, evals over b3b5 only: raw 0.73 -> 0.784
    "an illegal candidate": (" M: b3b5 b3a3 E: -0.8 0.0 B: b3b5", 0.784),
    # b3b5q is no legal move: best 0; candidates 0.2, evals 1: raw 0.26 -> 0.408
    "a promotion suffix on a rook move": (" M: b3b5 E: -0.8 B: b3b5q", 0.408),
    # evals error 1.0 on b3b5: 1 / (1 + 1) = 0.5: raw (5 + 0.6 + 1) / 10 = 0.66 -> 0.728
    "an eval off by a pawn": (" M: b3b5 E: 0.2 B: b3b5", 0.728),
}

A_CASES = {
    "own": (REF_A, 1.0),
    "text before": ("The answer is " + REF_A, -0.3),
    "text after": (REF_A + " done", -0.3),
    "a fifth field": (REF_A + "+0", -0.3),
    "a second answer": (REF_A + "\nA: " + REF_A, -0.3),
    "a word inside the FEN": (F + " x+0.001+0+0", -0.3),
    "a bare board for the FEN": (BOARD + "+0.001+0+0", -0.3),
    "three fields": (F + "+0.001+0", -0.3),
    "a flag of two digits": (F + "+0.001+00+0", -0.3),
    "a reward that is no number": (F + "+small+0+0", -0.3),
    "whitespace around": (" " + REF_A + " ", 1.0),
    "spaces around the plusses": (F + " + 0.001 + 0 + 0", 1.0),
    # reward_exact 0: raw 0.8 -> 0.84
    "the wrong reward": (F + "+0.5+0+0", 0.84),
    # terminated_exact 0: raw 0.9 -> 0.92
    "terminated": (F + "+0.001+1+0", 0.92),
    # the halfmove clock 1 for 0: one edit in 60 characters, fen_similarity 59/60: raw (2 * 59/60 + 4) / 10
    "off by one": (F.replace(" 0 18", " 1 18") + "+0.001+0+0", 0.2 + 0.8 * (2 * 59 / 60 + 4) / 10),
    # the fullmove 18 written 180: one edit, the answer the longer of the two: 1 - 1/61
    "a digit too many": (F.replace(" 0 18", " 0 180") + "+0.001+0+0", 0.2 + 0.8 * (2 * 60 / 61 + 4) / 10),
    # written 1: one edit, the label the longer: 1 - 1/60
    "a digit too few": (F.replace(" 0 18", " 0 1") + "+0.001+0+0", 0.2 + 0.8 * (2 * 59 / 60 + 4) / 10),
    # 0.002 for 0.001: reward_exact 0, raw 0.8 -> 0.84
    "a reward a thousandth off": (F + "+0.002+0+0", 0.84),
}

# where the two flags differ: an illegal move (the bishop on a3 along a file: the state stays, reward -1, truncated)
# and a mate (scholar's mate: reward 1, terminated)
ILLEGAL = env_sample(A.fen, "a3a8", ["a3a8"])
MATE = env_sample("r1bqkb1r/pppp1ppp/2n2n2/4p2Q/2B1P3/8/PPPP1PPP/RNB1K1NR w KQkq - 4 4", "h5f7", ["g8f6", "h5f7"])
FLAG_CASES = {
    "illegal, own": (ILLEGAL, f"{A.fen}+-1.0+0+1", 1.0),
    "illegal, not truncated": (ILLEGAL, f"{A.fen}+-1.0+0+0", 0.92),      # raw 0.9
    "illegal, both flags flipped": (ILLEGAL, f"{A.fen}+-1.0+1+0", 0.84),  # raw 0.8
    "illegal, played as legal": (ILLEGAL, f"{A.fen}+0.001+0+0", 0.76),    # reward and truncated wrong: raw 0.7
    "mate, own": (MATE, MATE.completion, 1.0),
    "mate, not terminated": (MATE, MATE.next_fen + "+1.0+0+0", 0.92),
    "mate, both flags flipped": (MATE, MATE.next_fen + "+1.0+0+1", 0.84),
    "mate, called a draw": (MATE, MATE.next_fen + "+0.5+1+0", 0.84),
}


@pytest.mark.parametrize("case", P_CASES)
def test_policy_completions_score_exactly(case):
    text, want = P_CASES[case]
    assert score(P, text)[0] == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("case", A_CASES)
def test_env_completions_score_exactly(case):
    text, want = A_CASES[case]
    assert score(A, text)[0] == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("case", FLAG_CASES)
def test_env_flags_are_judged_each_against_its_own(case):
    sample, text, want = FLAG_CASES[case]
    assert score(sample, text)[0] == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("sample, text, want", [
    (P, P_CASES["only the best"][0], 0.8),                  # raw 0.76: 3 quarters
    (P, P_CASES["best said second"][0], 0.6),               # 0.51: 2
    (P, P_CASES["an illegal candidate"][0], 0.6),           # 0.73: 2
    (P, P_CASES["a promotion suffix on a rook move"][0], 0.4),  # 0.26: 1
    (P, " M: a1a1 E: 0.0 B: a1a1", 0.2),                    # 0: none
    (P, REF_P, 1.0),
    (A, A_CASES["the wrong reward"][0], 0.8),               # 0.8: 3 (floored from 3.2)
    (A, A_CASES["off by one"][0], 0.6),                     # 0.597: 2
    (A, "junk", -0.3),
])
def test_graduated_rewards_floor_raw_to_quarters(sample, text, want):
    reward, comps = score(sample, text, "graduated")
    assert reward == want and comps == score(sample, text)[1]


def test_a_bare_board_is_not_a_fen():
    """python-chess reads 'r1bk3r/.../3RK2R' as that board, White to move, no castling: the parser wants all 6
    fields, so such an answer cannot earn the flags' and the similarity's share (0.65 before this check)."""
    with pytest.raises(ValueError, match="6 fields"):
        parse_env(BOARD + "+0.001+0+0")
    assert parse_env(F + "+0.001+0+0") == (F, 0.001, 0, 0)


def test_policy_move_is_the_first_word_after_the_last_b():
    """games.policy_move (the chess suite's games) reads a move without the format: the first word after the
    last 'B:', if it is UCI."""
    assert policy_move(REF_P + " B: b3b7 and more") == "b3b7"
    assert policy_move(" M: junk B: b3b5q!") is None and policy_move("b3b5") is None
    assert policy_move(" B:e2e4") == "e2e4"


NOISE = st.text(alphabet="xyzQ!?#@<|>é+:\n ", min_size=1, max_size=12).filter(str.strip)
CLEAN = [(P, REF_P), (P, P_CASES["best said second"][0]), (P, P_CASES["an illegal candidate"][0]),
         (P, P_CASES["an eval off by a pawn"][0]), (A, REF_A), (A, A_CASES["the wrong reward"][0]),
         (A, A_CASES["off by one"][0])]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(CLEAN), NOISE, st.data())
def test_junk_inserted_anywhere_never_raises_a_reward(clean, noise, data):
    sample, text = clean
    at = data.draw(st.integers(0, len(text)))
    assert score(sample, text[:at] + noise + text[at:])[0] <= score(sample, text)[0]


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(CLEAN), NOISE, st.sampled_from(["before", "after", "after a space"]))
def test_junk_before_or_after_an_answer_makes_it_invalid(clean, noise, where):
    sample, text = clean
    mangled = {"before": noise + text, "after": text + noise, "after a space": text + " " + noise}[where]
    reward, comps = score(sample, mangled)
    assert reward == -0.3 and comps["format_valid"] == 0.0 and comps["raw"] == 0.0


if __name__ == "__main__":
    import sys
    sys.exit(pytest.main([__file__, "-q"]))
