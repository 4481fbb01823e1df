"""Chess-skill suite: scripted players score what they must, hand-checked centipawn losses, the shipped
mate-in-one file re-checked independently, the CLI end to end on a tiny random GPT.

    python -m pytest -q mini/test_chess_eval.py
"""
import errno
import json
import os
import re
import subprocess
import sys
import tempfile

import chess
import pytest
import torch

import mini.chess_eval as ce
from mini.config import EVAL_PATH, MATE_PATH, POOL_PATH
from mini.evaluate import paired_bootstrap
from mini.formats import env_completion, position_key
from mini.games import (OPENINGS, eval_mates, game_starts, load_mates, mate_values, opening_board, policy_move,
                        quick_metrics, self_play, selfplay_summary, selfplay_values)
from mini.loader import load_model, save_model
from mini.positions import mating_moves
from mini.model import GPT, GPTConfig
from mini.stockfish import Annotator, find_stockfish
from mini.tokenizer import Tokenizer

try:
    STOCKFISH = find_stockfish()
except FileNotFoundError:
    STOCKFISH = None
needs_stockfish = pytest.mark.skipif(STOCKFISH is None, reason="Stockfish binary not found (apt-get install stockfish)")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(ce.__file__)))

# hand-made mate-in-one records: back-rank mate (one mate), and a position with two mating moves
MATES = [{"fen": "6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1", "mates": ["a1a8"]},
         {"fen": "k7/8/1K6/8/8/8/8/2R4R w - - 0 1", "mates": ["c1c8", "h1h8"]}]


def fen_of(prompt):
    return prompt[3:].strip()  # "P: " + fen + padding


def answering(move_of):
    """A scripted player: P: prompt -> a completion whose B: move is move_of(board)."""
    return lambda prompts: [f" M: e2e4 E: 0.1 B: {move_of(chess.Board(fen_of(p)))}" for p in prompts]


def first_legal(board):
    return min(m.uci() for m in board.legal_moves)


def perfect_arbiter(prompts):
    """python-chess itself answering A: prompts 'A: fen+move+history+'."""
    out = []
    for p in prompts:
        fen, move, history, _ = p[3:].split("+")
        out.append(env_completion(fen, move, history.split()))
    return out


def greedy_first_legal(prompts):
    """A greedy player of the suite: A: prompts answered perfectly, P: prompts with the first legal move."""
    return [perfect_arbiter([p])[0] if p.startswith("A: ") else answering(first_legal)([p])[0] for p in prompts]


def test_hand_made_mates_are_right():
    for r in MATES:
        assert mating_moves(chess.Board(r["fen"])) == r["mates"]


def test_mate_in_one_scores():
    mates = {r["fen"]: r["mates"] for r in MATES}
    vals, _ = eval_mates(answering(lambda b: mates[b.fen()][0]), MATES)
    assert vals == {"chess_mate_acc": [1.0, 1.0], "chess_mate_invalid": [0.0, 0.0], "chess_mate_illegal": [0.0, 0.0]}
    non_mating = lambda b: next(m.uci() for m in b.legal_moves if m.uci() not in mates[b.fen()])
    assert eval_mates(answering(non_mating), MATES)[0]["chess_mate_acc"] == [0.0, 0.0]
    # an illegal move, and a completion without a B: move
    vals = mate_values(MATES, [" M: a1a8 E: 1.0 B: a1h8", " M: c1c8 E: 999.99"])
    assert vals == {"chess_mate_acc": [0.0, 0.0], "chess_mate_invalid": [0.0, 1.0], "chess_mate_illegal": [1.0, 0.0]}


def test_a_mate_the_files_list_misses_still_counts(tmp_path):
    """A file may list one of two mates (c1c8 of c1c8 and h1h8): the other is a mate all the same, by the board; the
    list's move still counts, a legal move that does not mate does not."""
    path = tmp_path / "mates.jsonl"
    path.write_text(json.dumps(dict(MATES[1], mates=["c1c8"])) + "\n")
    records = load_mates(str(path)) * 3
    assert mate_values(records, [" B: h1h8", " B: c1c8", " B: h1h7"])["chess_mate_acc"] == [1.0, 1.0, 0.0]


def test_policy_move_is_the_word_after_the_last_b():
    assert policy_move(" M: e2e4 E: 0.3 B: e2e4") == "e2e4"
    assert policy_move("garbage B: e7e8q trailing") == "e7e8q"  # M:/E: need not parse
    assert policy_move(" M: e2e4 E: 0.3 B: Nf3") is None and policy_move("B:") is None and policy_move("") is None


def test_selfplay_illegal_move_at_half_move_7_leaves_6():
    def move_of(board):
        return "e1e8" if board.ply() == 6 else first_legal(board)  # ply() counts from the initial position
    games = self_play(answering(move_of), ["initial", "initial"], max_plies=200)
    for g in games:
        assert g["plies"] == 6 and g["end"] == "illegal" and len(g["transitions"]) == 7
        assert g["transitions"][-1][1] == "e1e8" and g["transitions"][-1][2][-1] == "e1e8"
    assert selfplay_values(games) == {"chess_selfplay_plies": [6.0, 6.0], "chess_selfplay_legal_end": [0.0, 0.0]}


def test_selfplay_ends_and_summary():
    calls = []

    def player(prompts):
        calls.append(len(prompts))
        return answering(lambda b: "zzz" if b.fen() == chess.STARTING_FEN else first_legal(b))(prompts)
    starts = ["initial", "ruy_lopez", "initial", "french"]
    games = self_play(player, starts, max_plies=5)
    assert [g["end"] for g in games] == ["unparseable", "max_plies", "unparseable", "max_plies"]
    assert [g["plies"] for g in games] == [0, 5, 0, 5]
    assert calls == [4, 2, 2, 2, 2]  # one batched call per half-move for all live games
    assert games[1]["moves"][:6] == OPENINGS["ruy_lopez"].split()
    summary = selfplay_summary(games)
    assert summary == {"chess_selfplay_plies_median": 2.5, "chess_selfplay_end_max_plies": 0.5,
                       "chess_selfplay_end_unparseable": 0.5}
    assert ce.plies_histogram([0, 5, 9, 10, 37]) == {"0-9": 3, "10-19": 1, "30-39": 1}
    assert game_starts(4) == ["initial", "ruy_lopez", "initial", "sicilian_najdorf"]


def test_selfplay_reaches_checkmate():
    # fool's mate scripted: f3 e5 g4 Qh4#
    line = {0: "f2f3", 1: "e7e5", 2: "g2g4", 3: "d8h4"}
    games = self_play(answering(lambda b: line[b.ply()]), ["initial"])
    assert games[0]["end"] == "checkmate" and games[0]["plies"] == 4
    assert selfplay_values(games)["chess_selfplay_legal_end"] == [1.0]


def test_perfect_arbiter_agrees_everywhere():
    def move_of(board):  # legal play with an illegal move at ply 9 and a mate-giving position reached via the opening
        return "a1a5" if board.ply() == 9 else first_legal(board)
    games = self_play(answering(move_of), ["initial", "italian"], max_plies=40)
    vals, transitions = ce.eval_arbiter(perfect_arbiter, games)
    assert len(transitions) == sum(len(g["transitions"]) for g in games) > 10
    assert all(v == [1.0] * len(transitions) for v in vals.values())
    capped, first = ce.eval_arbiter(perfect_arbiter, games, max_transitions=7)  # --arbiter_max: the first ones
    assert first == transitions[:7] and all(len(v) == 7 for v in capped.values())
    # a wrong reward only: the reward field and "all" fail, the others agree; garbage fails everything
    wrong = [c.replace("+0.001+", "+0.5+") for c in perfect_arbiter([ce.env_prompt(*t) for t in transitions[:2]])]
    v = ce.arbiter_values(transitions[:2], wrong)
    assert v["chess_arbiter_reward"] == [0.0, 0.0] and v["chess_arbiter_all"] == [0.0, 0.0]
    assert v["chess_arbiter_next_fen"] == [1.0, 1.0] and v["chess_arbiter_truncated"] == [1.0, 1.0]
    assert ce.arbiter_values(transitions[:1], ["nonsense"])["chess_arbiter_truncated"] == [0.0]
    # the truncated flag wrong only: "all" needs the fourth field too
    flag_wrong = [c[:-1] + ("0" if c.endswith("1") else "1") for c in perfect_arbiter([ce.env_prompt(*transitions[0])])]
    v = ce.arbiter_values(transitions[:1], flag_wrong)
    assert v["chess_arbiter_truncated"] == [0.0] and v["chess_arbiter_next_fen"] == [1.0] and v["chess_arbiter_all"] == [0.0]


@needs_stockfish
def test_centipawn_loss_hand_checked():
    queen = "4k3/8/4p3/8/3Q4/8/8/4K3 w - - 0 1"  # a queen against a pawn; Qd5?? exd5 leaves K v K+P, a draw
    start = chess.STARTING_FEN
    with Annotator(depth=8, workers=2, cache_path="", multipv=1) as ann:
        r = ann.move_losses([(MATES[0]["fen"], "a1a8"), (MATES[0]["fen"], "a1a2"), (queen, "d4d5"),
                             (start, "e2e5"), (start, None), (start, "g1f3")])
    assert r[0]["loss"] == 0 and r[0]["best"] == "a1a8"       # the mate itself
    assert r[1]["loss"] == 1000 and r[1]["move_cp"] < 1000     # a missed mate costs the cap
    assert r[2]["best_cp"] > 500 and r[2]["move_cp"] <= 0      # the queen was worth > 5 pawns, then gone
    assert r[2]["loss"] == r[2]["best_cp"] - r[2]["move_cp"]
    assert r[3]["loss"] == r[4]["loss"] == 1000 and r[3]["best"] is None  # illegal, and no move at all
    assert 0 <= r[5]["loss"] < 100                              # a sound developing move
    legal = [True, True, True, False, False, True]
    assert ce.quality_values(r, legal) == {
        "chess_cpl": [0.0, 1000.0, float(r[2]["loss"]), 1000.0, 1000.0, float(r[5]["loss"])],
        "chess_cpl_legal": [0.0, 1000.0, float(r[2]["loss"]), None, None, float(r[5]["loss"])],
        "chess_blunder": [0.0, 1.0, 1.0, 1.0, 1.0, 0.0]}
    assert ce.mean(ce.quality_values(r, legal)["chess_cpl_legal"]) == (1000 + r[2]["loss"] + r[5]["loss"]) / 4


@needs_stockfish
def test_an_illegal_or_missing_move_costs_the_cap_asked_for():
    """move_losses' cap is the loss of a move it need not search, not CP_CAP (1000)."""
    with Annotator(depth=1, workers=1, cache_path="", multipv=1) as ann:
        r = ann.move_losses([(chess.STARTING_FEN, "e2e5"), (chess.STARTING_FEN, None)], cap=300)
    assert [x["loss"] for x in r] == [300, 300]


@needs_stockfish
def test_stockfish_games_illegal_player_loses():
    games = ce.stockfish_games(answering(lambda b: "a1a1"), 2, STOCKFISH, skill=0, nodes=100)
    assert [g["white"] for g in games] == [True, False] and [g["score"] for g in games] == [0.0, 0.0]
    assert [g["plies"] for g in games] == [0, 1] and {g["end"] for g in games} == {"illegal"}
    assert ce.stockfish_values(games)["chess_sf_loss"] == [1.0, 1.0]


@needs_stockfish
def test_a_stockfish_game_does_not_depend_on_the_games_beside_it():
    """Game 0 is the same game alone or beside game 1: Stockfish searches every move with a cold hash. Kept warm
    from its own last move (the last game left running), it played other moves from half-move 5 at 1,000
    nodes, so --compare paired games whose moves depended on how long the others lasted."""
    alone, beside = (ce.stockfish_games(answering(first_legal), n, STOCKFISH, max_plies=60)[0] for n in (1, 2))
    assert alone["moves"] == beside["moves"] and (alone["end"], alone["score"]) == (beside["end"], beside["score"])


@needs_stockfish
def test_stockfish_games_repeat_from_the_openings():
    """At Skill Level 20 a game repeats move for move, so --compare may pair games by index; games 2 and 3
    start after the Ruy Lopez, and plies and moves count from there."""
    def play():
        return ce.stockfish_games(answering(first_legal), 4, STOCKFISH, nodes=50, max_plies=6)
    games = play()
    assert [(g["start"], g["white"]) for g in games] == [("initial", True), ("initial", False),
                                                          ("ruy_lopez", True), ("ruy_lopez", False)]
    board = opening_board("ruy_lopez")
    for uci in games[2]["moves"]:
        board.push_uci(uci)  # legal from the opening's position
    assert games[2]["moves"][0] == first_legal(opening_board("ruy_lopez"))
    assert [g["plies"] for g in games] == [6, 6, 6, 6] and {g["end"] for g in games} == {"max_plies"}
    assert [g["moves"] for g in play()] == [g["moves"] for g in games]


def test_compare_pairs_stockfish_games_only_when_deterministic(tmp_path):
    report = {"suite": "chess", "metrics": {"chess_sf_plies": 2.0}, "values": {"chess_sf_plies": [1.0, 3.0]},
              "items": {"stockfish_games": [["initial", True], ["initial", False]]}, "settings": {"sf_skill": 20}}
    paths = [str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    json.dump(report, open(paths[0], "w"))
    json.dump(dict(report, values={"chess_sf_plies": [2.0, 6.0]}, metrics={"chess_sf_plies": 4.0}), open(paths[1], "w"))
    paired, unpaired = ce.compare(*paths)
    assert paired["chess_sf_plies"][:3] == (2.0, 4.0, 2.0) and not unpaired
    # clock-seeded games are not the same games, even from the same starts (here: an older report's items)
    json.dump(dict(report, settings={"sf_skill": 0}, items={"stockfish_games": [True, False]}), open(paths[0], "w"))
    json.dump(dict(report, values={"chess_sf_plies": [2.0, 6.0]}, metrics={"chess_sf_plies": 4.0}, settings={"sf_skill": 0}),
              open(paths[1], "w"))
    paired, unpaired = ce.compare(*paths)
    assert "chess_sf_plies" not in paired and unpaired["chess_sf_plies"] == (2.0, 4.0, 2.0)


@pytest.mark.parametrize("setting,before,after", [("sf_skill", 5, 1), ("sf_nodes", 1000, 100000),
                                                  ("engine", "Stockfish 15.1", "Stockfish 16")])
def test_compare_refuses_random_games_against_another_opponent(tmp_path, setting, before, after):
    """Below Skill Level 20 the games are compared as means, not paired: still only against the same opponent."""
    report = {"suite": "chess", "metrics": {"chess_sf_score": 0.0}, "values": {"chess_sf_score": [0.0, 0.0]},
              "items": {"stockfish_games": [["initial", True], ["initial", False]]},
              "settings": {"sf_skill": 5, "sf_nodes": 1000, "engine": "Stockfish 15.1"}}
    paths = [str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    json.dump(dict(report, settings={**report["settings"], setting: before}), open(paths[0], "w"))
    json.dump(dict(report, settings={**report["settings"], setting: after}), open(paths[1], "w"))
    with pytest.raises(ValueError, match="stockfish_games sections ran with other settings"):
        ce.compare(*paths)


def test_shipped_mate_file_rechecked():
    """Independent of build_mates: every listed move mates (push and look), every other legal move does not."""
    with open(MATE_PATH) as f:
        header, *records = [json.loads(line) for line in f]
    assert "command" in header["meta"] and len(records) >= 1000
    shipped = set()
    for path in (POOL_PATH, EVAL_PATH):
        with open(path) as f:
            shipped |= {position_key(r["fen"]) for r in map(json.loads, f) if "fen" in r}
    keys, sides = set(), set()
    for r in records:
        board = chess.Board(r["fen"])
        mates = []
        for m in board.legal_moves:
            board.push(m)
            if board.is_checkmate():
                mates.append(m.uci())
            board.pop()
        assert r["mates"] == sorted(mates) and mates, r["fen"]
        key = position_key(r["fen"])
        assert key not in keys and key not in shipped
        keys.add(key)
        sides.add(board.turn)
    assert sides == {chess.WHITE, chess.BLACK}
    assert len({r["phase"] for r in records}) == 3


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    torch.manual_seed(0)
    path = str(tmp_path_factory.mktemp("tiny") / "m")
    save_model(GPT(GPTConfig(n_layer=1, n_head=1, n_embd=32, n_positions=256)), Tokenizer.gpt2(), path)
    return path


def test_cli_end_to_end_and_compare(tiny, tmp_path):
    out = str(tmp_path / "chess.json")
    small = ["--n_mates", "6", "--n_quality", "3", "--games", "3", "--max_plies", "4", "--arbiter_max", "4",
             "--sf_games", "2", "--max_new_tokens", "8", "--device", "cpu"]
    run = subprocess.run([sys.executable, "mini/chess_eval.py", "--model_path", tiny, "--out", out]
                         + small, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    report = json.load(open(out))
    assert report["suite"] == "chess" and "chess_mate_acc" in report["metrics"] and "chess_selfplay_plies" in report["metrics"]
    assert len(report["values"]["chess_mate_acc"]) == 6 and len(report["selfplay"]) == 3
    if STOCKFISH:
        assert len(report["values"]["chess_cpl"]) == 3 and len(report["stockfish_games"]) == 2
    else:
        assert "Stockfish not found" in report["skipped"]["move_quality"]
    run = subprocess.run([sys.executable, "mini/chess_eval.py", "--compare", out, out], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert "chess_mate_acc" in run.stdout and "[+0.0000, +0.0000]" in run.stdout


def test_compare_refuses_other_items(tmp_path):
    base = {"suite": "chess", "metrics": {"chess_mate_acc": 0.5}, "values": {"chess_mate_acc": [0.0, 1.0]},
            "items": {"mate_in_one": ["a", "b"]}}
    other = dict(base, items={"mate_in_one": ["a", "c"]}, values={"chess_mate_acc": [1.0, 1.0]}, metrics={"chess_mate_acc": 1.0})
    paths = [str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    for p, r in zip(paths, (base, other)):
        json.dump(r, open(p, "w"))
    with pytest.raises(ValueError, match="mate_in_one items differ"):
        ce.compare(*paths)
    json.dump(dict(other, items=base["items"]), open(paths[1], "w"))
    paired, _ = ce.compare(*paths)
    assert paired["chess_mate_acc"][:3] == (0.5, 1.0, 0.5)


def test_compare_refuses_other_settings(tmp_path):
    """Self-play values under --max_plies 4 and 200 are not the same measurement: refused, naming the setting.
    A setting of a section that one report did not run, or that an older report does not record, is not checked."""
    base = {"suite": "chess", "metrics": {"chess_selfplay_plies": 2.0}, "values": {"chess_selfplay_plies": [1.0, 3.0]},
            "items": {"selfplay": ["initial", "ruy_lopez"], "move_quality": []},
            "settings": {"sf_skill": 20, "max_plies": 4, "sf_depth": 1, "top_k": 5}}
    longer = dict(base, settings=dict(base["settings"], max_plies=200, sf_depth=20),
                  values={"chess_selfplay_plies": [5.0, 9.0]}, metrics={"chess_selfplay_plies": 7.0})
    paths = [str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    json.dump(base, open(paths[0], "w"))
    json.dump(longer, open(paths[1], "w"))
    with pytest.raises(ValueError, match=r"selfplay sections ran with other settings \(--max_plies 4 and 200\)"):
        ce.compare(*paths)
    del longer["settings"]["top_k"]  # an older report; sf_depth differs, but neither ran move quality
    json.dump(dict(longer, settings=dict(longer["settings"], max_plies=4)), open(paths[1], "w"))
    assert ce.compare(*paths)[0]["chess_selfplay_plies"][:3] == (2.0, 7.0, 5.0)


def test_load_mates_refuses_a_file_without_mates(tmp_path):
    """Another .jsonl of positions (the eval set) and a file with its header only: one sentence each, not a
    KeyError or NaN metrics."""
    with pytest.raises(ValueError, match="is not a mate-in-one file: position .* has no 'mates' list"):
        load_mates(EVAL_PATH, 2)
    header_only = tmp_path / "mates.jsonl"
    header_only.write_text('{"meta": {"n": 0}}\n')
    with pytest.raises(ValueError, match=f"{header_only} holds no mate-in-one position; regenerate it"):
        load_mates(str(header_only))
    assert load_mates(n=2) == [json.loads(line) for line in open(MATE_PATH).readlines()[1:3]]
    assert len(load_mates()) == sum('"fen"' in line for line in open(MATE_PATH)) == 1000  # n=None: every position


@pytest.mark.parametrize("mates", [None, [], ["a1a1"], ["h5f8"], "h5f7", ["h5f7", "zz"], ["h5f7", "c4f7"]])
def test_load_mates_refuses_a_position_whose_mates_do_not_mate(tmp_path, mates):
    """null crashed the scoring (a TypeError); a list holding an impossible or a non-mating move scored answers
    against it. The scholar's mate position: Qh5xf7 mates, Bc4xf7 only gives check."""
    fen = "r1bqkb1r/pppp1ppp/2n2n2/4p2Q/2B1P3/8/PPPP1PPP/RNB1K1NR w KQkq - 4 4"
    path = tmp_path / "mates.jsonl"
    path.write_text(json.dumps({"fen": fen, "mates": ["h5f7"]}) + "\n" + json.dumps({"fen": fen, "mates": mates}) + "\n")
    with pytest.raises(ValueError, match=re.escape(f"{path}:2: 'mates' {mates!r:.60} is not a list of the position's "
                                                   "mating moves (UCI); regenerate it")):
        load_mates(str(path))


def test_compare_counts_a_way_of_ending_one_report_lacks_as_none(tmp_path):
    """A report holds chess_selfplay_end_<kind> only for the ways its games ended: an end that went from a share to
    none (illegal answers 0.25 -> 0) is a row, 0.25 -> 0, not a row left out for want of a key."""
    paths = [str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    for path, ends in zip(paths, ({"illegal": 0.25, "max_plies": 0.75}, {"max_plies": 1.0})):
        metrics = {"chess_selfplay_plies_median": 3.0} | {f"chess_selfplay_end_{k}": v for k, v in ends.items()}
        json.dump({"suite": "chess", "items": {}, "values": {}, "metrics": metrics}, open(path, "w"))
    unpaired = ce.compare(*paths)[1]
    assert unpaired["chess_selfplay_end_illegal"] == (0.25, 0.0, -0.25)
    assert unpaired["chess_selfplay_end_max_plies"] == (0.75, 1.0, 0.25)


def test_more_stockfish_games_than_starts_is_refused_when_they_would_repeat(capsys):
    """At Skill Level 20 the 18 starts and colours give one game each; a 19th would copy the first, and --compare
    would count the copy as another pair. Below 20 Stockfish's games are random, so more are allowed. A run
    with every section off is refused too."""
    model = os.path.join(ROOT, "mini", "data", "rookworld-8m")
    with pytest.raises(SystemExit) as e:
        ce.main(["--model_path", model, "--sf_games", "19"])
    assert e.value.code == 2 and "--sf_games 19 would replay games" in capsys.readouterr().err
    assert ce.parse_args(["--model_path", model, "--sf_games", "19", "--sf_skill", "5"])[1].sf_games == 19
    with pytest.raises(SystemExit) as e:  # every section off: an empty report would pass for a measurement
        ce.main(["--model_path", model, "--n_mates", "0", "--n_quality", "0", "--games", "0", "--sf_games", "0"])
    assert e.value.code == 2 and "all 0: nothing to evaluate" in capsys.readouterr().err


def test_compare_leaves_out_what_has_no_values(tmp_path):
    """Sections with nothing in them (a report of an empty mate file, whose older mean was NaN): no row at all,
    rather than '[+nan, +nan]'."""
    empty = {"suite": "chess", "items": {"mate_in_one": []}, "values": {"chess_mate_acc": []},
             "metrics": {"chess_mate_acc": float("nan"), "chess_selfplay_plies_median": 3.0}}
    path = str(tmp_path / "empty.json")
    json.dump(empty, open(path, "w"))
    assert ce.compare(path, path) == ({}, {"chess_selfplay_plies_median": (3.0, 3.0, 0.0)})


@pytest.mark.parametrize("values, metrics", [({"chess_mate_acc": [float("nan")]}, {}),
                                             ({"chess_mate_acc": [1e999]}, {}),
                                             ({"chess_mate_acc": [10 ** 400]}, {}),
                                             ({}, {"chess_selfplay_plies_median": float("-inf")})])
def test_compare_refuses_a_value_no_float_holds_in_one_sentence(tmp_path, values, metrics):
    """JSON reads NaN, 1e999 (inf) and ints beyond a float: a hand-edited report with one is named, rather than
    a nan row or an OverflowError. A NaN mean stays readable: older reports wrote one for an empty section."""
    report = {"suite": "chess", "items": {"mate_in_one": ["x"]}, "values": values, "metrics": metrics}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(report))
    with pytest.raises(ValueError, match=re.escape(f"{bad}: its ")):
        ce.compare(str(bad), str(bad))


def test_compare_names_a_file_that_is_not_a_report(tmp_path):
    chess_report = str(tmp_path / "chess.json")
    json.dump({"suite": "chess", "metrics": {}, "values": {}, "items": {}}, open(chess_report, "w"))
    evaluate_report = tmp_path / "eval.json"
    evaluate_report.write_text(json.dumps({"data": EVAL_PATH, "n_per_task": 0, "shaping": "continuous", "samples": []}))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(SystemExit, match=re.escape(f"chess_eval.py: {evaluate_report} is not a chess_eval.py report "
                                                   "(run python mini/chess_eval.py --model_path")):
        ce.main(["--compare", chess_report, str(evaluate_report)])
    with pytest.raises(SystemExit, match=re.escape(f"chess_eval.py: {bad} is not JSON")):
        ce.main(["--compare", str(bad), chess_report])
    with pytest.raises(SystemExit, match=re.escape(f"chess_eval.py: {tmp_path / 'nowhere.json'}: no such file")):
        ce.main(["--compare", str(tmp_path / "nowhere.json"), chess_report])  # not "[Errno 2] ..."
    with pytest.raises(SystemExit, match="the two reports share no figure"):  # every section skipped in one
        ce.main(["--compare", chess_report, chess_report])
    edited = tmp_path / "edited.json"  # a setting typed by hand as a string
    edited.write_text(json.dumps({"suite": "chess", "metrics": {}, "values": {}, "items": {}, "settings": {"sf_skill": "20"}}))
    with pytest.raises(SystemExit, match=re.escape(f"chess_eval.py: {edited}: its setting sf_skill is '20', not a number")):
        ce.main(["--compare", chess_report, str(edited)])


def test_a_stockfish_the_user_named_must_be_there(capsys):
    """Without --stockfish_path the engine's sections are skipped when none is found; a path typed is refused."""
    with pytest.raises(SystemExit):
        ce.main(["--model_path", "mini/data/rookworld-10m", "--stockfish_path", "/nonexistent/stockfish"])
    err = capsys.readouterr().err
    assert "error: Stockfish not found (no executable at /nonexistent/stockfish)" in err and err.count("\n") == 1
    with pytest.raises(SystemExit):  # --n sizes --build_mates only: the suite would ignore it
        ce.main(["--model_path", "mini/data/rookworld-10m", "--n", "5"])
    assert "--n 5 is the number of positions --build_mates makes" in capsys.readouterr().err


def test_quick_metrics_on_tiny_model(tiny):
    model, tok = load_model(tiny)
    m = quick_metrics(model, tok, n_mates=4, n_games=2, max_plies=2, max_new_tokens=8)
    assert {"chess_mate_acc", "chess_mate_invalid", "chess_selfplay_plies", "chess_selfplay_legal_end"} <= set(m)
    assert all(isinstance(v, float) for v in m.values())


# ----------------------------------------------------------------------------- by hand, no engine needed

def test_eval_arbiter_asks_about_the_first_max_transitions_in_game_order():
    games = self_play(answering(first_legal), ["initial", "french"], max_plies=4)
    vals, transitions = ce.eval_arbiter(perfect_arbiter, games, max_transitions=6)
    assert transitions == (games[0]["transitions"] + games[1]["transitions"])[:6] and len(transitions) == 6
    assert vals["chess_arbiter_all"] == [1.0] * 6


def test_quality_values_by_hand():
    """The blunder line is loss >= BLUNDER_CP (200) exactly; an illegal or missing move costs the cap in
    chess_cpl and is not measured (None) in chess_cpl_legal."""
    losses = [{"loss": 0}, {"loss": 199}, {"loss": 200}, {"loss": 1000}, {"loss": 1000}]
    legal = [True, True, True, False, True]
    assert ce.quality_values(losses, legal) == {
        "chess_cpl": [0.0, 199.0, 200.0, 1000.0, 1000.0],
        "chess_cpl_legal": [0.0, 199.0, 200.0, None, 1000.0],
        "chess_blunder": [0.0, 0.0, 1.0, 1.0, 1.0]}


class FakeAnnotator:
    """Annotator's move_losses with given losses, recording what it was asked (and a context manager)."""

    def __init__(self, *a, **kw):
        self.asked, self.settings = [], (a, kw)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def move_losses(self, pairs):
        self.asked += pairs
        return [{"loss": [0, 300, 1000, 50][i % 4]} for i in range(len(pairs))]


def test_eval_quality_asks_the_engine_about_the_players_moves_and_marks_illegal_ones():
    fens = [chess.STARTING_FEN, MATES[0]["fen"], MATES[1]["fen"]]
    answers = {fens[0]: " M: e2e4 E: 0.1 B: e2e4", fens[1]: " M: a1a8 E: 1 B: a1h8", fens[2]: " M: c1c8 E: 1"}
    ann = FakeAnnotator()
    vals, rows = ce.eval_quality(lambda prompts: [answers[fen_of(p)] for p in prompts], fens, ann)
    assert ann.asked == [(fens[0], "e2e4"), (fens[1], "a1h8"), (fens[2], None)]
    assert vals == {"chess_cpl": [0.0, 300.0, 1000.0], "chess_cpl_legal": [0.0, None, None],
                    "chess_blunder": [0.0, 1.0, 1.0]}
    assert [r["fen"] for r in rows] == fens and rows[1]["completion"] == answers[fens[1]]


def test_run_suite_reports_the_median_centipawn_loss_and_the_engine(monkeypatch):
    """chess_cpl_median is the median of the per-position losses (0, 300, 1000, 50 -> 175), chess_cpl their mean;
    the engine that judged them is named by its UCI `id name`."""
    monkeypatch.setattr(ce, "stockfish_or_reason", lambda path: ("stockfish", None))
    monkeypatch.setattr(ce, "Annotator", FakeAnnotator)
    monkeypatch.setitem(ce.ENGINE_NAMES, "stockfish", "Stockfish 99")
    a = ce.parse_args(["--n_mates", "0", "--n_quality", "4", "--games", "0", "--sf_games", "0"])[1]
    report = ce.run_suite(answering(first_legal), answering(first_legal), a)
    assert report["values"]["chess_cpl"] == [0.0, 300.0, 1000.0, 50.0]
    assert report["metrics"]["chess_cpl_median"] == 175.0 and report["metrics"]["chess_cpl"] == 337.5
    assert len(report["items"]["move_quality"]) == 4 and report["engine"] == "Stockfish 99"


def last_legal(board):
    return max(m.uci() for m in board.legal_moves)


def test_run_suite_gives_each_section_its_player_and_settings(monkeypatch, tmp_path):
    """Mate in one reads --mates_path; the centipawn loss searches at --sf_depth; self-play samples (the sampler plays
    the last legal move, the greedy player the first) up to --max_plies; the arbiter answers greedily (perfectly
    here); the games against Stockfish are the greedy player's, at --sf_skill, --sf_nodes and --max_plies."""
    annotators, sf_games = [], []
    paths = []
    monkeypatch.setattr(ce, "stockfish_or_reason", lambda path: paths.append(path) or ("stockfish", None))
    monkeypatch.setattr(ce, "Annotator", lambda *a, **kw: annotators.append(FakeAnnotator(*a, **kw)) or annotators[-1])
    monkeypatch.setattr(ce, "stockfish_games", lambda *a: sf_games.append(a) or [])
    monkeypatch.setitem(ce.ENGINE_NAMES, "stockfish", "Stockfish 99")
    mates = tmp_path / "mates.jsonl"
    mates.write_text("".join(json.dumps(r) + "\n" for r in MATES))
    greedy = greedy_first_legal
    a = ce.parse_args(["--mates_path", str(mates), "--n_quality", "2", "--sf_depth", "3", "--games", "2",
                       "--max_plies", "3", "--arbiter_max", "4", "--sf_games", "2", "--sf_skill", "5",
                       "--sf_nodes", "50", "--workers", "3", "--stockfish_path", "/my/stockfish"])[1]
    report = ce.run_suite(greedy, answering(last_legal), a)
    assert report["items"]["mate_in_one"] == [r["fen"] for r in MATES]
    # one search a position, no cache of this suite's own (no file written beside the training runs' caches)
    assert [an.settings for an in annotators] == [(("stockfish",), {"depth": 3, "workers": 3, "cache_path": "",
                                                                    "multipv": 1})]
    fens = report["items"]["move_quality"]
    assert annotators[0].asked == [(f, first_legal(chess.Board(f))) for f in fens] and paths == ["/my/stockfish"] * 2
    assert [(g["plies"], g["end"]) for g in report["selfplay"]] == [(3, "max_plies")] * 2
    assert report["selfplay"][0]["moves"][0] == last_legal(chess.Board())
    assert report["metrics"]["chess_arbiter_all"] == 1.0 and report["metrics"]["chess_arbiter_n"] == 4
    assert sf_games == [(greedy, 2, "stockfish", 5, 50, 3)]


def test_main_builds_a_greedy_player_and_a_sampler_from_the_flags(monkeypatch, tmp_path):
    """The greedy player (mate in one, move quality, the arbiter, the games against Stockfish) and the self-play
    sampler get --seed, --max_new_tokens and --batch_size; the sampler also --temperature and --top_k."""
    players = []
    monkeypatch.setattr(ce, "load_model", lambda path, device: ("model", "tok"))
    monkeypatch.setattr(ce, "autocast", lambda device, cfg: "ctx")
    monkeypatch.setattr(ce, "model_player", lambda *a: players.append(a) or a)
    monkeypatch.setattr(ce, "run_suite", lambda greedy, sampler, a: {
        "skipped": {}, "metrics": {}, "values": {}, "seconds": {}, "items": {}})
    model = os.path.join(ROOT, "mini", "data", "rookworld-8m")
    ce.main(["--model_path", model, "--out", str(tmp_path / "chess.json"), "--temperature", "0.9", "--top_k", "7",
             "--seed", "4", "--max_new_tokens", "30", "--batch_size", "8", "--device", "cpu"])
    assert players == [("model", "tok", 0.0, 0, 4, 30, 8, "ctx"), ("model", "tok", 0.9, 7, 4, 30, 8, "ctx")]


def interrupted(*a, **k):
    raise KeyboardInterrupt


@pytest.mark.parametrize("stage", ["run_suite", "build_mates"])
def test_ctrl_c_during_the_suite_or_the_mate_search_is_one_sentence_and_writes_nothing(monkeypatch, tmp_path, stage):
    """Minutes of games end on Ctrl-C with a sentence that says what was not written, not a traceback."""
    monkeypatch.setattr(ce, "load_model", lambda path, device: ("model", "tok"))
    monkeypatch.setattr(ce, "model_player", lambda *a: a)
    monkeypatch.setattr(ce, stage, interrupted)
    out, mates = tmp_path / "chess.json", tmp_path / "mates.jsonl"
    argv = (["--build_mates", "--mates_path", str(mates)] if stage == "build_mates" else
            ["--model_path", os.path.join(ROOT, "mini", "data", "rookworld-8m"), "--out", str(out), "--device", "cpu"])
    try:
        ce.main(argv)
    except KeyboardInterrupt:  # caught here: escaping, it would stop the whole pytest session
        pytest.fail(f"Ctrl-C during {stage} ended in a traceback")
    except SystemExit as e:
        assert str(e) == (f"chess_eval.py: interrupted (Ctrl-C) before the positions were found; {mates} is unchanged"
                          if stage == "build_mates" else
                          f"chess_eval.py: interrupted (Ctrl-C) before the suite ended; no report was written to {out}")
    else:
        pytest.fail(f"{stage} went on after Ctrl-C")
    assert not out.exists() and not mates.exists()


def test_compare_refuses_moves_judged_by_another_engine(tmp_path):
    """Centipawn losses from Stockfish 15.1 and 16 are not paired; reports without the name (older ones), or a
    section that needs no engine, are."""
    report = {"suite": "chess", "metrics": {"chess_cpl": 0.5}, "values": {"chess_cpl": [0.0, 1.0]},
              "items": {"move_quality": ["f1", "f2"]}, "settings": {"sf_skill": 20, "engine": "Stockfish 15.1"}}
    paths = [str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    json.dump(report, open(paths[0], "w"))
    json.dump(dict(report, settings={"sf_skill": 20, "engine": "Stockfish 16"}), open(paths[1], "w"))
    with pytest.raises(ValueError, match=r"move_quality sections ran with other settings \(the engine Stockfish 15.1 "
                                         r"and Stockfish 16\)"):
        ce.compare(*paths)
    json.dump(dict(report, settings={"sf_skill": 20}), open(paths[1], "w"))
    assert ce.compare(*paths)[0]["chess_cpl"][:3] == (0.5, 0.5, 0.0)
    mates = dict(report, items={"mate_in_one": ["f1", "f2"]}, values={"chess_mate_acc": [0.0, 1.0]}, metrics={})
    json.dump(mates, open(paths[0], "w"))
    json.dump(dict(mates, settings={"sf_skill": 20, "engine": "Stockfish 16"}), open(paths[1], "w"))
    assert ce.compare(*paths)[0]["chess_mate_acc"][:3] == (0.5, 0.5, 0.0)


def test_stockfish_starts_pair_the_colours_and_the_default_plays_each_start_as_both():
    starts = ["initial", *OPENINGS]
    assert [ce.stockfish_start(i) for i in range(5)] == ["initial", "initial", starts[1], starts[1], starts[2]]
    assert ce.stockfish_start(2 * len(starts)) == "initial"  # then round again
    n = ce.parse_args([])[1].sf_games
    assert n == 2 * len(starts)
    assert sorted((ce.stockfish_start(i), i % 2 == 0) for i in range(n)) == sorted((s, w) for s in starts for w in (True, False))


def test_items_of_name_what_each_value_is_about():
    """A game against Stockfish is its start and the player's colour: the same start as the other colour is
    another item."""
    report = {"mate_in_one": [{"fen": "m1"}, {"fen": "m2"}], "move_quality": [{"fen": "q1"}],
              "selfplay": [{"start": "initial"}, {"start": "french"}],
              "stockfish_games": [{"start": "initial", "white": True}, {"start": "initial", "white": False}]}
    assert ce.items_of(report) == {"mate_in_one": ["m1", "m2"], "move_quality": ["q1"],
                                   "selfplay": ["initial", "french"],
                                   "stockfish_games": [["initial", True], ["initial", False]]}
    assert ce.items_of({}) == {"mate_in_one": [], "move_quality": [], "selfplay": [], "stockfish_games": []}


# each section's values depend on these settings (the README): two reports that differ in one are refused
SETTING_OF = [("mate_in_one", "chess_mate_acc", "max_new_tokens", 96, 32),
              ("move_quality", "chess_cpl", "max_new_tokens", 96, 32),
              ("move_quality", "chess_cpl", "sf_depth", 8, 12),
              ("selfplay", "chess_selfplay_plies", "max_new_tokens", 96, 32),
              ("selfplay", "chess_selfplay_plies", "max_plies", 200, 100),
              ("selfplay", "chess_selfplay_plies", "temperature", 0.6, 1.0),
              ("selfplay", "chess_selfplay_plies", "top_k", 5, 0),
              ("stockfish_games", "chess_sf_score", "max_new_tokens", 96, 32),
              ("stockfish_games", "chess_sf_score", "max_plies", 200, 100),
              ("stockfish_games", "chess_sf_score", "sf_nodes", 1000, 2000)]


@pytest.mark.parametrize("section,metric,setting,before,after", SETTING_OF, ids=[f"{s[0]}-{s[2]}" for s in SETTING_OF])
def test_compare_refuses_a_section_run_with_another_setting(tmp_path, section, metric, setting, before, after):
    report = {"suite": "chess", "metrics": {metric: 0.5}, "values": {metric: [0.0, 1.0]},
              "items": {section: [["initial", True], ["initial", False]]}, "settings": {"sf_skill": 20, setting: before}}
    paths = [str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    json.dump(report, open(paths[0], "w"))
    json.dump(dict(report, settings={"sf_skill": 20, setting: after}), open(paths[1], "w"))
    with pytest.raises(ValueError, match=rf"{section} sections ran with other settings \(--{setting} {before} and {after}\)"):
        ce.compare(*paths)
    json.dump(dict(report, settings={"sf_skill": 20, setting: before}), open(paths[1], "w"))
    assert ce.compare(*paths)[0][metric][:3] == (0.5, 0.5, 0.0)


def test_compare_leaves_games_of_reports_without_a_skill_level_unpaired(tmp_path):
    """A report that does not record --sf_skill (older ones) may have played random games: not paired, also beside a
    report at Skill Level 20."""
    report = {"suite": "chess", "metrics": {"chess_sf_score": 0.5, "chess_mate_acc": 0.5},
              "values": {"chess_sf_score": [0.0, 1.0], "chess_mate_acc": [0.0, 1.0]},
              "items": {"stockfish_games": [["initial", True], ["initial", False]], "mate_in_one": ["a", "b"]}}
    paths = [str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    json.dump(report, open(paths[0], "w"))
    json.dump(dict(report, metrics={"chess_sf_score": 1.0, "chess_mate_acc": 0.5}), open(paths[1], "w"))
    paired, unpaired = ce.compare(*paths)
    assert "chess_sf_score" not in paired and unpaired["chess_sf_score"] == (0.5, 1.0, 0.5)
    assert paired["chess_mate_acc"][:3] == (0.5, 0.5, 0.0)
    json.dump(dict(report, settings={"sf_skill": 20}), open(paths[0], "w"))  # one of them at Skill Level 20
    assert "chess_sf_score" not in ce.compare(*paths)[0]


@pytest.mark.parametrize("argv,message", [
    (["--sf_skill", "21"], "--sf_skill 21 must be between 0 and 20"), (["--sf_skill", "-1"], "--sf_skill -1 must be"),
    (["--max_plies", "0"], "--max_plies 0 must be at least 1"), (["--n_mates", "-1"], "--n_mates -1 must be at least 0"),
    (["--sf_nodes", "0"], "--sf_nodes 0 must be at least 1"), (["--workers", "0"], "--workers 0 must be at least 1"),
    (["--games", "-1"], "--games -1 must be at least 0"), (["--sf_depth", "0"], "--sf_depth 0 must be at least 1"),
    (["--n_quality", "-1"], "--n_quality -1 must be at least 0"), (["--sf_games", "-1"], "--sf_games -1 must be"),
    (["--arbiter_max", "-1"], "--arbiter_max -1 must be at least 0"), (["--n", "0"], "--n 0 must be at least 1")])
def test_chess_eval_flags_are_checked(capsys, argv, message):
    with pytest.raises(SystemExit) as e:
        ce.parse_args(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in err, err
    edges = ce.parse_args(["--sf_skill", "0", "--max_plies", "1", "--n_mates", "0", "--n_quality", "0", "--games", "0",
                           "--sf_games", "0", "--arbiter_max", "0", "--sf_nodes", "1", "--workers", "1"])[1]
    assert (edges.sf_skill, edges.max_plies, edges.n_mates) == (0, 1, 0)
    assert ce.parse_args(["--sf_skill", "20"])[1].sf_skill == 20


def test_the_table_counts_the_values_a_mean_is_over(capsys):
    """The n beside a mean over legal answers only is the number of legal answers, not of positions."""
    ce.print_table({"metrics": {"chess_cpl_legal": 100.0, "chess_cpl": 775.0}, "skipped": {}, "seconds": {},
                    "values": {"chess_cpl_legal": [None, None, None, 100.0], "chess_cpl": [1000, 1000, 1000, 100]}})
    rows = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines()[1:-1]}
    assert rows == {"chess_cpl_legal": ["100.0000", "1"], "chess_cpl": ["775.0000", "4"]}


def test_the_suites_defaults_are_the_readmes():
    """The README's suite: 1,000 mates, 200 positions at depth 8, 32 self-play games (sampled at 0.6 and top 5, up to
    200 half-moves, the arbiter on 512 of their moves), 18 games against Stockfish at Skill Level 20 and 1,000 nodes."""
    a = ce.parse_args([])[1]
    assert (a.n_mates, a.n_quality, a.sf_depth, a.games, a.temperature, a.top_k, a.max_plies, a.arbiter_max) == (
        1000, 200, 8, 32, 0.6, 5, 200, 512)
    assert (a.sf_games, a.sf_skill, a.sf_nodes, a.mates_path, a.n, a.seed) == (18, 20, 1000, MATE_PATH, 1000, 0)


def suite_args(*argv):
    """The suite's settings with every section off but those argv turns on."""
    return ce.parse_args(["--n_mates", "0", "--n_quality", "0", "--games", "0", "--sf_games", "0", *argv])[1]


def test_run_suite_reports_self_play_and_the_arbiter():
    """Self-play: per-game values, the median and the ends among the metrics, a histogram of the plies, each game
    with the number of its transitions; the arbiter: its means and n among the metrics, its per-transition values
    beside the paired ones (another model's games are other transitions); the seconds of each section."""
    report = ce.run_suite(greedy_first_legal, answering(last_legal), suite_args("--games", "2", "--max_plies", "3",
                                                                               "--arbiter_max", "4"))
    initial, ruy = chess.Board(), opening_board("ruy_lopez")
    for board in (initial, ruy):
        for _ in range(3):
            board.push_uci(last_legal(board))
    assert report["selfplay"] == [{"start": start, "plies": 3, "end": "max_plies", "transitions": 3,
                                   "moves": [m.uci() for m in board.move_stack]}
                                  for start, board in (("initial", initial), ("ruy_lopez", ruy))]
    assert report["selfplay_plies_histogram"] == {"0-9": 2} and report["items"]["selfplay"] == ["initial", "ruy_lopez"]
    arbiter = {f"chess_arbiter_{k}": 1.0 for k in ("all", "next_fen", "reward", "terminated", "truncated")}
    assert report["metrics"] == {"chess_selfplay_plies": 3.0, "chess_selfplay_plies_median": 3.0,
                                 "chess_selfplay_end_max_plies": 1.0, "chess_selfplay_legal_end": 0.0,
                                 "chess_arbiter_n": 4, **arbiter}
    assert report["arbiter_values"] == {k: [1.0] * 4 for k in arbiter}
    assert set(report["values"]) == {"chess_selfplay_plies", "chess_selfplay_legal_end"}
    assert set(report["seconds"]) == {"selfplay", "arbiter"} and report["skipped"] == {}


def test_run_suite_without_transitions_or_with_the_arbiter_off():
    """Games that end on their first answer (unparseable) leave the arbiter nothing: n 0 and no mean, rather than a
    NaN; --arbiter_max 0 skips the arbiter."""
    unparseable = lambda prompts: [" M: e2e4 E: 0.1"] * len(prompts)
    report = ce.run_suite(greedy_first_legal, unparseable, suite_args("--games", "2"))
    assert report["metrics"]["chess_arbiter_n"] == 0 and report["arbiter_values"]["chess_arbiter_all"] == []
    assert not any(k.startswith("chess_arbiter_") and k != "chess_arbiter_n" for k in report["metrics"])
    report = ce.run_suite(greedy_first_legal, answering(first_legal), suite_args("--games", "2", "--max_plies", "2",
                                                                               "--arbiter_max", "0"))
    assert not any(k.startswith("chess_arbiter_") for k in report["metrics"]) and "arbiter_values" not in report
    assert set(report["seconds"]) == {"selfplay"} and [g["transitions"] for g in report["selfplay"]] == [2, 2]


def test_run_suite_skips_the_engines_sections_without_stockfish(monkeypatch):
    def missing(path):
        raise FileNotFoundError("Stockfish not found (no executable at here)")
    monkeypatch.setattr(ce, "find_stockfish", missing)
    report = ce.run_suite(greedy_first_legal, greedy_first_legal, suite_args("--n_quality", "2", "--sf_games", "2"))
    reason = "skipped: Stockfish not found (no executable at here)"
    assert report["skipped"] == {"move_quality": reason, "stockfish_games": reason} and "engine" not in report
    assert (report["values"], report["metrics"]) == ({}, {})
    assert set(report["seconds"]) == {"move_quality", "stockfish_games"}


def test_run_suite_reports_the_mates_answers_and_the_games_against_stockfish(monkeypatch, tmp_path):
    """Each mate-in-one position with the completion it got; the games against Stockfish with their values, their
    means and the engine that played them."""
    games = [{"start": "initial", "white": True, "score": 1.0, "end": "checkmate", "plies": 9, "moves": []},
             {"start": "initial", "white": False, "score": 0.5, "end": "stalemate", "plies": 20, "moves": []}]
    monkeypatch.setattr(ce, "stockfish_or_reason", lambda path: ("stockfish", None))
    monkeypatch.setattr(ce, "stockfish_games", lambda *a: games)
    monkeypatch.setitem(ce.ENGINE_NAMES, "stockfish", "Stockfish 99")
    mates = tmp_path / "mates.jsonl"
    mates.write_text("".join(json.dumps(r) + "\n" for r in MATES))
    report = ce.run_suite(greedy_first_legal, None, suite_args("--mates_path", str(mates), "--n_mates", "2",
                                                               "--sf_games", "2"))
    assert report["mate_in_one"] == [dict(r, completion=answering(first_legal)([ce.policy_prompt(r["fen"])])[0])
                                     for r in MATES]
    assert report["stockfish_games"] == games and report["engine"] == "Stockfish 99"
    assert report["values"]["chess_sf_score"] == [1.0, 0.5] and report["values"]["chess_sf_plies"] == [9.0, 20.0]
    assert (report["metrics"]["chess_sf_score"], report["metrics"]["chess_sf_win"]) == (0.75, 0.5)
    assert report["items"]["stockfish_games"] == [["initial", True], ["initial", False]]
    assert set(report["seconds"]) == {"mate_in_one", "stockfish_games"}


def write_reports(tmp_path, before, after):
    paths = [str(tmp_path / "before.json"), str(tmp_path / "after.json")]
    for path, report in zip(paths, (before, after)):
        with open(path, "w") as f:
            json.dump(report, f)
    return paths


def test_compare_intervals_are_the_paired_bootstrap_of_the_values(tmp_path):
    """A paired row is evaluate.paired_bootstrap of the two reports' values (2,000 draws, seed 0), over the positions
    measured in both (None: not measured)."""
    before = [10.0, 250.0, None, 40.0, 1000.0, 75.0, 0.0, 300.0]  # centipawn losses: each seed draws other bounds
    after = [5.0, 100.0, 60.0, None, 990.0, 80.0, 30.0, 120.0]
    report = {"suite": "chess", "metrics": {}, "items": {"move_quality": list("abcdefgh")}}
    paths = write_reports(tmp_path, dict(report, values={"chess_cpl_legal": before}),
                          dict(report, values={"chess_cpl_legal": after}))
    row = ce.compare(*paths)[0]["chess_cpl_legal"]
    assert row == paired_bootstrap({"chess_cpl_legal": before}, {"chess_cpl_legal": after}, 2000, 0)["chess_cpl_legal"]
    assert row[:3] == pytest.approx((1635 / 6, 1325 / 6, -310 / 6)) and row[5] == 6 and row[3] < row[2] < row[4]


def test_compare_pairs_what_both_ran_and_leaves_the_rest_out(tmp_path):
    """A section one report skipped (its items empty) is neither checked nor compared: no refusal, and no rows of
    ways self-play ended for a report that played none."""
    before = {"suite": "chess", "items": {"mate_in_one": ["a", "b"], "selfplay": ["initial"]},
              "values": {"chess_mate_acc": [0.0, 1.0], "chess_selfplay_plies": [4.0]},
              "metrics": {"chess_mate_acc": 0.5, "chess_selfplay_plies": 4.0, "chess_selfplay_plies_median": 4.0,
                          "chess_selfplay_end_illegal": 1.0}, "settings": {"sf_skill": 20, "max_plies": 4}}
    after = {"suite": "chess", "items": {"mate_in_one": ["a", "b"], "selfplay": []},
             "values": {"chess_mate_acc": [1.0, 1.0]}, "metrics": {"chess_mate_acc": 1.0},
             "settings": {"sf_skill": 20, "max_plies": 200}}
    paired, unpaired = ce.compare(*write_reports(tmp_path, before, after))
    assert set(paired) == {"chess_mate_acc"} and unpaired == {}


def test_compare_refuses_settings_that_are_not_an_object(tmp_path):
    report = {"suite": "chess", "metrics": {}, "values": {}, "items": {}}
    paths = write_reports(tmp_path, report, dict(report, settings=["sf_skill", 20]))
    with pytest.raises(ValueError, match=re.escape(f"{paths[1]}: its 'settings' is not an object")):
        ce.compare(*paths)


def test_compare_prints_a_row_per_paired_metric(tmp_path, capsys):
    report = {"suite": "chess", "items": {"mate_in_one": ["a", "b"]}, "metrics": {"chess_mate_acc": 0.5},
              "values": {"chess_mate_acc": [0.0, 1.0]}}
    paths = write_reports(tmp_path, report, dict(report, values={"chess_mate_acc": [1.0, 1.0]}))
    ce.main(["--compare", *paths])
    b0, a0, d, lo, hi, n = ce.compare(*paths)[0]["chess_mate_acc"]
    header, row = capsys.readouterr().out.splitlines()
    assert header.split()[:4] == ["metric", "before", "after", "delta"]
    assert row.split() == ["chess_mate_acc", "0.5000", "1.0000", "+0.5000", f"[{lo:+.4f},", f"{hi:+.4f}]", "2"]


def test_the_table_shows_the_histogram_the_skipped_sections_and_the_timings(capsys):
    """The arbiter's n counts its per-transition values, which are kept apart from the paired ones."""
    ce.print_table({"metrics": {"chess_arbiter_all": 0.5}, "values": {},
                    "arbiter_values": {"chess_arbiter_all": [0.0, 1.0, 1.0, 0.0]},
                    "selfplay_plies_histogram": {"0-9": 2, "20-29": 1},
                    "skipped": {"move_quality": "skipped: no engine"},
                    "seconds": {"selfplay": 1.26, "arbiter": 0.04}})
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split() == ["chess_arbiter_all", "0.5000", "4"]
    assert lines[2:] == ["self-play legal half-moves: 0-9: 2, 20-29: 1", "move_quality: skipped: no engine",
                         "seconds: selfplay 1.3, arbiter 0.0"]


def test_main_writes_the_engine_into_the_settings_and_takes_every_start_once(monkeypatch, tmp_path):
    """Games against Stockfish alone are something to evaluate, and at Skill Level 20 all 18 starts and colours may
    be asked for; the Stockfish that played is a setting (--compare checks it), not a top-level field."""
    monkeypatch.setattr(ce, "load_model", lambda path, device: ("model", "tok"))
    monkeypatch.setattr(ce, "model_player", lambda *a: None)
    monkeypatch.setattr(ce, "run_suite", lambda greedy, sampler, a: {
        "engine": "Stockfish 99", "skipped": {}, "metrics": {}, "values": {}, "seconds": {}, "items": {}})
    model, out = os.path.join(ROOT, "mini", "data", "rookworld-8m"), str(tmp_path / "chess.json")
    ce.main(["--model_path", model, "--out", out, "--n_mates", "0", "--n_quality", "0", "--games", "0",
             "--sf_games", "18", "--device", "cpu"])
    report = json.load(open(out))
    assert (report["suite"], report["model_path"], report["settings"]["sf_games"]) == ("chess", model, 18)
    assert report["settings"]["engine"] == "Stockfish 99" and "engine" not in report


def test_an_engine_failure_in_the_suite_is_one_sentence(monkeypatch, tmp_path):
    monkeypatch.setattr(ce, "load_model", lambda path, device: ("model", "tok"))
    monkeypatch.setattr(ce, "model_player", lambda *a: None)

    def fails(greedy, sampler, a):
        raise ce.EngineFailure("FakeFish 1 (sf) stopped answering in a game against the model, at a position")
    monkeypatch.setattr(ce, "run_suite", fails)
    model = os.path.join(ROOT, "mini", "data", "rookworld-8m")
    with pytest.raises(SystemExit, match=re.escape("chess_eval.py: FakeFish 1 (sf) stopped answering in a game")):
        ce.main(["--model_path", model, "--out", str(tmp_path / "chess.json"), "--device", "cpu"])
    assert not os.path.exists(tmp_path / "chess.json")


def test_build_mates_writes_its_header_and_the_positions(monkeypatch, tmp_path):
    """The file's first line describes it (the positions made, which may be fewer than --n, the seed, the phases, how
    many have White to move, the command); then one position a line, which load_mates reads back."""
    board = chess.Board()
    for uci in "f2f3 e7e5 g2g4".split():  # the fool's mate before its mate: Black to move
        board.push_uci(uci)
    black_to_move = {"fen": board.fen(), "mates": mating_moves(board), "phase": "opening"}
    records = [dict(MATES[0], phase="endgame"), black_to_move, dict(MATES[1], phase="endgame")]
    asked = []
    monkeypatch.setattr(ce, "build_mates", lambda n, seed, exclude: asked.append((n, seed)) or records)
    monkeypatch.setattr(ce, "shipped_keys", lambda: set())
    path = str(tmp_path / "mates.jsonl")
    argv = ["--build_mates", "--n", "5", "--seed", "4", "--mates_path", path]
    ce.main(argv)
    with open(path) as f:
        meta = json.loads(f.readline())["meta"]
    assert asked == [(5, 4)] and (meta["n"], meta["seed"], meta["white_to_move"]) == (3, 4, 2)
    assert meta["phases"] == {"endgame": 2, "opening": 1}
    assert meta["command"] == "python mini/chess_eval.py " + " ".join(argv)
    assert load_mates(path) == records and not os.path.exists(path + ".tmp")



def test_build_mates_that_cannot_write_its_file_keeps_the_old_one_and_the_positions(monkeypatch, tmp_path, capsys):
    """A full disk after minutes of play: the mate file there stays as it was, no .tmp is left, and the positions
    are in a spare file that the one sentence names."""
    records = [dict(r, phase="endgame") for r in MATES]
    monkeypatch.setattr(ce, "build_mates", lambda n, seed, exclude: records)
    monkeypatch.setattr(ce, "shipped_keys", lambda: set())
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "spare"))
    os.mkdir(tmp_path / "spare")
    path = tmp_path / "mates.jsonl"
    path.write_text("the old file\n")

    def full(src, dst, replace=os.replace):
        if src.endswith(".tmp"):
            raise OSError(errno.ENOSPC, "No space left on device")
        replace(src, dst)
    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(SystemExit) as e:
        ce.main(["--build_mates", "--mates_path", str(path)])
    [spare] = os.listdir(tmp_path / "spare")
    spare = str(tmp_path / "spare" / spare)
    assert str(e.value) == f"chess_eval.py: could not write {path} (No space left on device); the positions are in {spare}"
    assert path.read_text() == "the old file\n" and not os.path.exists(str(path) + ".tmp")
    assert load_mates(spare) == records

if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
