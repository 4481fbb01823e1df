"""Game logic by hand: a finished game's score from the player's side for either colour (mate, stalemate,
threefold repetition, the half-move cap), how games end in self-play, the arbiter history of every ply, and
self-play sources that refresh with the weights and a new seed each time.

    python mini/test_games.py
"""
import inspect
import json
import random
import re

import chess
import chess.engine
import pytest
import torch

import mini.chess_eval as ce
import mini.games as gm
import mini.selfplay as selfplay
from mini.dataset import ReplayBuffer
from mini.formats import policy_prompt, policy_sample
from mini.positions import random_env_sample
from mini.selfplay import SelfPlaySource
from mini.test_chess_eval import MATES, answering, first_legal
from mini.test_selfplay import needs_stockfish
from mini.test_train import tiny_gpt
from mini.tokenizer import Tokenizer

SCHOLARS_MATE = "e2e4 e7e5 f1c4 b8c6 d1h5 g8f6 h5f7"   # White mates
FOOLS_MATE = "f2f3 e7e5 g2g4 d8h4"                     # Black mates
KNIGHTS_BACK_AND_FORTH = "g1f3 g8f6 f3g1 f6g8 g1f3 g8f6 f3g1 f6g8"  # the 8th half-move makes the start's third time
ITALIAN_12 = "e2e4 e7e5 g1f3 b8c6 f1c4 f8c5 c2c3 g8f6 d2d4 e5d4 c3d4 c5b4".split()


def played(moves, fen=chess.STARTING_FEN):
    board = chess.Board(fen)
    for m in moves.split():
        board.push_uci(m)
    return board


@pytest.mark.parametrize("board, end, white_score", [
    (played(SCHOLARS_MATE), "checkmate", 1.0),
    (played(FOOLS_MATE), "checkmate", 0.0),
    (played("c6b6", "k7/8/2Q5/8/8/8/8/7K w - - 0 1"), "stalemate", 0.5),
    (played(KNIGHTS_BACK_AND_FORTH), "threefold_repetition", 0.5),
])
def test_a_finished_game_is_scored_for_the_players_colour(board, end, white_score):
    for white, want in ((True, white_score), (False, 1.0 - white_score)):
        game = {"white": white, "end": None, "score": None}
        ce.end_if_over(board, game, 200)
        assert (game["end"], game["score"]) == (end, want)


@pytest.mark.parametrize("board, last", [
    (played(KNIGHTS_BACK_AND_FORTH[:-5]), "f6g8"),  # 7 half-moves: Black could claim a threefold with f6g8
    (played("", "8/8/8/4k3/8/8/8/R3K3 w - - 99 80"), "a1a2"),  # 99 half-moves without a capture or pawn move
])
def test_a_draw_ends_the_game_once_it_happened_not_when_it_could_be_claimed(board, last):
    """game_outcome ends a game at a threefold repetition or the fifty-move rule once on the board; python-chess's
    claim_draw=True ended it a half-move early, where the side to move could claim it with its next move."""
    game = {"white": True, "end": None, "score": None}
    ce.end_if_over(board, game, 200)
    assert (game["end"], game["score"]) == (None, None) and gm.game_outcome(board) is None
    board.push_uci(last)
    ce.end_if_over(board, game, 200)
    assert game["score"] == 0.5 and game["end"] in ("threefold_repetition", "fifty_moves")


def test_the_half_move_cap_adjudicates_a_draw_for_either_colour():
    board = played("e2e4 e7e5 g1f3")
    for white in (True, False):
        game = {"white": white, "end": None, "score": None}
        ce.end_if_over(board, game, 4)  # 3 half-moves of 4: the game goes on
        assert (game["end"], game["score"]) == (None, None)
        ce.end_if_over(board, game, 3)
        assert (game["end"], game["score"]) == ("max_plies", 0.5)


def test_a_mate_on_the_last_half_move_allowed_is_a_mate_not_the_cap():
    """The half-move cap adjudicates only a game the rules have not ended: the fool's mate on half-move 4 of 4 is a
    checkmate in self-play and against Stockfish, scored for either colour."""
    games = gm.self_play(scripted(FOOLS_MATE.split()), ["initial"], max_plies=4)
    assert (games[0]["end"], games[0]["plies"]) == ("checkmate", 4)
    for white, score in ((True, 0.0), (False, 1.0)):
        game = {"white": white, "end": None, "score": None}
        ce.end_if_over(played(FOOLS_MATE), game, 4)
        assert (game["end"], game["score"]) == ("checkmate", score)


def test_game_starts_go_round_the_openings_again():
    """Odd-numbered games take the openings in turn and start over after the eighth: game 17 is the Ruy Lopez again."""
    starts = gm.game_starts(20)
    assert starts[0::2] == ["initial"] * 10 and starts[1::2] == [*gm.OPENINGS, "ruy_lopez", "sicilian_najdorf"]


def test_policy_move_of_a_completion_that_starts_with_its_b():
    assert gm.policy_move("B: e2e4") == "e2e4" and gm.policy_move("B:g1f3") == "g1f3"
    assert gm.policy_move("B: e2e4 B: d2d4") == "d2d4"


def test_load_mates_reads_every_position_and_skips_blank_lines(tmp_path):
    """Blank lines (a trailing one, one after the header) are no damage; a position with two mates listed loads (each
    listed move is tried on the position itself, not after the one before it)."""
    path = tmp_path / "mates.jsonl"
    path.write_text('{"meta": {"n": 2}}\n\n' + "".join(json.dumps(r) + "\n" for r in MATES) + "\n")
    assert gm.load_mates(str(path)) == MATES and gm.load_mates(str(path), 1) == MATES[:1]


@pytest.mark.parametrize("content", [None, "folder", b"\xff\xfe not UTF-8\n"], ids=["missing", "folder", "not-utf8"])
def test_an_unreadable_mate_file_is_one_sentence(tmp_path, content):
    path = tmp_path / "mates.jsonl"
    if content == "folder":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=re.escape(f"cannot read mate-in-one positions from {path} (") + ".*; regen"):
        gm.load_mates(str(path))


@pytest.mark.parametrize("line", ['{"phase": "opening"}', '"fen"', "5", "[" * 100_000],
                         ids=["no-fen", "string", "number", "nested"])
def test_load_mates_names_a_line_that_holds_no_position(tmp_path, line):
    """A JSON value that is no record (an object without a FEN, a string, a number, an array nested too deeply): its
    file and line in one sentence, not a position silently skipped, a TypeError or a RecursionError."""
    path = tmp_path / "mates.jsonl"
    path.write_text(json.dumps(MATES[0]) + "\n" + line + "\n")
    with pytest.raises(ValueError, match=re.escape(f"{path}:2: ") + ".*regenerate it"):
        gm.load_mates(str(path))


def test_quick_metrics_passes_its_settings_to_both_players(monkeypatch):
    """The greedy player (temperature 0, no top-k) and the sampler share the seed, the length and autocast; the
    sampler samples at the temperature and top-k asked for."""
    real, seen = gm.model_player, []

    def player(*a, **kw):
        seen.append(dict(inspect.signature(real).bind(*a, **kw).arguments))
        return answering(first_legal)
    monkeypatch.setattr(gm, "model_player", player)
    gm.quick_metrics("model", "tok", n_mates=1, n_games=1, max_plies=1, temperature=0.9, top_k=7, seed=3,
                     max_new_tokens=40, autocast="ctx")
    common = {"model": "model", "tok": "tok", "seed": 3, "max_new_tokens": 40, "autocast": "ctx"}
    assert seen == [dict(common, temperature=0.0, top_k=0), dict(common, temperature=0.9, top_k=7)]


def scripted(line):
    """A player that plays line[ply] in every game (ply: half-moves from the initial position)."""
    return lambda prompts: [f" M: a1a2 E: 0.0 B: {line[chess.Board(p[3:].strip()).ply()]}" for p in prompts]


@pytest.mark.parametrize("moves, end, plies", [
    (SCHOLARS_MATE, "checkmate", 7), (FOOLS_MATE, "checkmate", 4),
    (KNIGHTS_BACK_AND_FORTH, "threefold_repetition", 8),
])
def test_self_play_ends_by_the_rules_for_either_side(moves, end, plies):
    games = gm.self_play(scripted(moves.split()), ["initial", "initial"])
    assert [(g["end"], g["plies"], g["moves"]) for g in games] == [(end, plies, moves.split())] * 2
    assert gm.selfplay_values(games) == {"chess_selfplay_plies": [float(plies)] * 2, "chess_selfplay_legal_end": [1.0] * 2}
    assert gm.selfplay_summary(games) == {"chess_selfplay_plies_median": float(plies), f"chess_selfplay_end_{end}": 1.0}


def test_the_arbiter_history_at_every_ply():
    """The A: history of ply i is the last up to 10 half-moves including the move itself: ITALIAN_12[max(0, i - 9):
    i + 1], i.e. 1, 2, ..., 10, 10, 10 entries. A game from an opening carries the book moves before it."""
    games = gm.self_play(scripted(ITALIAN_12), ["initial"], max_plies=12)
    assert games[0]["end"] == "max_plies" and len(games[0]["transitions"]) == 12
    for i, (fen, move, history) in enumerate(games[0]["transitions"]):
        assert (fen, move) == (played(" ".join(ITALIAN_12[:i])).fen(), ITALIAN_12[i])
        assert history == ITALIAN_12[max(0, i - 9):i + 1] and len(history) == min(i + 1, 10)
    book = gm.OPENINGS["sicilian_najdorf"].split()  # 10 half-moves
    games = gm.self_play(lambda prompts: [" M: a1a2 E: 0.0 B: h2h3"], ["sicilian_najdorf"], max_plies=1)
    assert games[0]["transitions"][0][2] == book[-9:] + ["h2h3"]


def test_an_illegal_move_ends_the_game_and_is_still_a_transition():
    games = gm.self_play(scripted(ITALIAN_12[:3] + ["e1e3"]), ["initial"])
    g = games[0]
    assert (g["end"], g["plies"], len(g["transitions"])) == ("illegal", 3, 4)
    assert g["transitions"][-1][2] == ITALIAN_12[:3] + ["e1e3"]


def test_environment_and_replay_histories_at_every_ply():
    """An A: prompt drawn on a position carries the moves that led there plus its own move, the last 10 at most;
    the replay buffer keeps the last 9 moves that led to a position (the P: history)."""
    rng = random.Random(0)
    for n in range(12):
        board, led = played(" ".join(ITALIAN_12[:n])), ITALIAN_12[:n][-9:]
        s = random_env_sample(board.fen(), led, rng, illegal_rate=0.0, garbage_rate=0.0)
        assert s.history == (led + [s.move])[-10:] and len(s.history) == min(n, 9) + 1
        buffer = ReplayBuffer()
        buffer.held_out = frozenset()  # the Italian's early positions are held-out eval positions, which it refuses
        buffer.add_next(policy_sample(board.fen(), [ITALIAN_12[n]], [0.0], history=led))
        assert [h for _, h in buffer.items.values()] == [ITALIAN_12[:n + 1][-9:]]


def test_selfplay_summary_and_means_by_hand():
    """Games of 1, 2, 30 and 40 plies: the median is 16 (the mean would be 18.25); ends as shares of the games; a
    game stopped at the half-move cap did not end by the rules; a metric's mean leaves out what was not measured
    (None)."""
    games = [{"plies": 1, "end": "illegal"}, {"plies": 30, "end": "checkmate"}, {"plies": 2, "end": "illegal"},
             {"plies": 40, "end": "max_plies"}]
    assert gm.selfplay_summary(games) == {"chess_selfplay_plies_median": 16.0, "chess_selfplay_end_checkmate": 1 / 4,
                                          "chess_selfplay_end_illegal": 2 / 4, "chess_selfplay_end_max_plies": 1 / 4}
    assert gm.selfplay_values(games) == {"chess_selfplay_plies": [1.0, 30.0, 2.0, 40.0],
                                         "chess_selfplay_legal_end": [0.0, 1.0, 0.0, 0.0]}
    assert gm.mean([1.0, None, 4.0]) == 2.5 and gm.mean([0.0, None, 3.0]) == 1.5 and gm.mean([]) != gm.mean([])


def test_every_end_by_the_rules_is_a_legal_end():
    """The rules' ends, draws included, count in chess_selfplay_legal_end; an illegal or unparseable answer and the
    half-move cap do not."""
    rules = ["checkmate", "stalemate", "insufficient_material", "seventyfive_moves", "fivefold_repetition",
             "threefold_repetition", "fifty_moves"]
    games = [{"plies": 1, "end": end} for end in rules + ["illegal", "unparseable", "max_plies"]]
    assert gm.selfplay_values(games)["chess_selfplay_legal_end"] == [1.0] * 7 + [0.0] * 3
    assert {t.name.lower() for t in chess.Termination} >= set(rules)  # the names policy_turn gives its ends


def test_model_player_is_seeded(tmp_path):
    """The same seed samples the same completions, another seed others: self-play's refreshes differ by seed."""
    model, tok = tiny_gpt(eos_bias=-5.0), Tokenizer.gpt2()
    prompts = [policy_prompt(chess.STARTING_FEN)] * 4
    texts = {seed: gm.model_player(model, tok, temperature=1.0, seed=seed, max_new_tokens=6)(prompts) for seed in (1, 2)}
    assert gm.model_player(model, tok, temperature=1.0, seed=1, max_new_tokens=6)(prompts) == texts[1] != texts[2]


def test_model_player_passes_its_settings_to_generation(monkeypatch):
    """Every setting of a player reaches complete_texts: its length, batch size, autocast, temperature, top-k, and
    a generator seeded by its seed."""
    seen = []
    monkeypatch.setattr(gm, "complete_texts", lambda *a, **kw: seen.append((a, kw)) or ["answer"] * len(a[2]))
    model = torch.nn.Linear(1, 1)
    assert gm.model_player(model, "tok", 0.7, 5, 3, 20, 16, "ctx")(["p1", "p2"]) == ["answer", "answer"]
    (args, kw), = seen
    assert args == (model, "tok", ["p1", "p2"], 20, 16, "ctx") and (kw["temperature"], kw["top_k"]) == (0.7, 5)
    assert kw["generator"].initial_seed() == 3


def test_in_batches_answers_every_prompt_in_order():
    """Chunks of batch_size and a shorter last one, each prompt answered once, the answers in the prompts' order."""
    chunks = []

    def echo(prompts):
        chunks.append(len(prompts))
        return [p.upper() for p in prompts]
    assert gm.in_batches(echo, list("abcde"), batch_size=2) == list("ABCDE") and chunks == [2, 2, 1]


def test_quick_metrics_mates_greedily_and_plays_sampled_games_to_the_cap(monkeypatch):
    """--eval_chess: mate in one on the first n_mates positions with the greedy player (here it mates), self-play
    with the sampler (here the first legal move, which never ends a game in 3 plies) up to max_plies."""
    mates = {r["fen"]: r["mates"][0] for r in gm.load_mates(n=3)}
    asked = []

    def player(model, tok, temperature, top_k, seed, max_new_tokens, autocast=None):
        if temperature == 0:  # greedy: the mate where there is one, else no move
            return lambda prompts: asked.extend(prompts) or [f" B: {mates.get(p[3:].strip(), 'none')}" for p in prompts]
        return answering(first_legal)
    monkeypatch.setattr(gm, "model_player", player)
    m = gm.quick_metrics("model", "tok", n_mates=3, n_games=2, max_plies=3)
    assert len(asked) == 3 and (m["chess_mate_acc"], m["chess_mate_illegal"]) == (1.0, 0.0)
    assert (m["chess_selfplay_plies"], m["chess_selfplay_end_max_plies"], m["chess_selfplay_legal_end"]) == (3.0, 1.0, 0.0)


def test_selfplay_player_samples_at_its_settings(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(selfplay, "model_player", lambda *a, **kw: seen.append((a, kw)))
    monkeypatch.setattr(selfplay, "Annotator", lambda *a, **kw: None)
    src = SelfPlaySource("tok", temperature=0.6, top_k=7, max_new_tokens=33, seed=2)
    src.player("model", 99, "ctx")
    assert seen == [(("model", "tok", 0.6, 7, 99, 33), {"autocast": "ctx"})]


def test_stockfish_and_arbiter_values_by_hand():
    games = [{"score": s, "plies": p} for s, p in ((1.0, 9), (0.5, 40), (0.0, 3), (0.0, 12))]
    assert ce.stockfish_values(games) == {
        "chess_sf_score": [1.0, 0.5, 0.0, 0.0], "chess_sf_plies": [9.0, 40.0, 3.0, 12.0],
        "chess_sf_win": [1.0, 0.0, 0.0, 0.0], "chess_sf_draw": [0.0, 1.0, 0.0, 0.0], "chess_sf_loss": [0.0, 0.0, 1.0, 1.0]}
    start = chess.STARTING_FEN
    after_e4 = played("e2e4").fen()
    transitions = [(start, "e2e4", ["e2e4"]), (start, "e2e5", ["e2e5"]), (start, "e2e4", ["e2e4"])]
    answers = [f"{after_e4}+0.001+0+0", f"{start}+-1.0+1+0", "junk"]  # right; terminated wrong; unparseable
    assert ce.arbiter_values(transitions, answers) == {
        "chess_arbiter_all": [1.0, 0.0, 0.0], "chess_arbiter_next_fen": [1.0, 1.0, 0.0],
        "chess_arbiter_reward": [1.0, 1.0, 0.0], "chess_arbiter_terminated": [1.0, 0.0, 0.0],
        "chess_arbiter_truncated": [1.0, 0.0, 0.0]}


class ScriptedEngine:
    """Stockfish's stand-in in stockfish_games: plays line[ply] while the line lasts, then the first legal move in
    UCI order; records its options, the half-moves it was asked at and its search limits."""

    def __init__(self, line):
        self.line, self.options, self.asked, self.limits, self.closed = line, {}, [], [], False

    def configure(self, options):
        self.options.update(options)

    def play(self, board, limit, game=None):
        ply = board.ply()
        self.asked.append(ply)
        self.limits.append(limit)
        return chess.engine.PlayResult(chess.Move.from_uci(self.line[ply] if ply < len(self.line) else
                                                           first_legal(board)), None)

    def quit(self):
        self.closed = True

    def close(self):
        pass


def test_stockfish_games_by_hand_with_a_scripted_engine(monkeypatch):
    """Both sides play the fool's mate: as White the player is mated on half-move 4 (0), as Black it mates (1).
    The engine moves only for the other colour, at the Skill Level and node limit asked for. From the Ruy Lopez the
    half-move cap and the plies count from the opening's position; an illegal answer loses for either colour."""
    engines = []
    monkeypatch.setattr(ce, "find_stockfish", lambda path: "sf")
    monkeypatch.setattr(ce, "open_engine", lambda path, deadline: engines.append(ScriptedEngine(FOOLS_MATE.split()))
                        or engines[-1])
    games = ce.stockfish_games(scripted(FOOLS_MATE.split()), 2, skill=3, nodes=77, max_plies=10)
    assert [(g["white"], g["end"], g["score"], g["plies"], g["moves"]) for g in games] == [
        (True, "checkmate", 0.0, 4, FOOLS_MATE.split()), (False, "checkmate", 1.0, 4, FOOLS_MATE.split())]
    engine = engines[0]
    assert engine.asked == [0, 1, 2, 3] and engine.closed  # its colour only: White in game 1, Black in game 0
    assert engine.options == {"Threads": 1, "Skill Level": 3}
    assert all(limit == chess.engine.Limit(nodes=77) for limit in engine.limits)
    games = ce.stockfish_games(answering(first_legal), 4, max_plies=2)
    ruy = gm.opening_board("ruy_lopez")
    ruy.push_uci(first_legal(ruy))
    assert [(g["start"], g["end"], g["score"], g["plies"]) for g in games] == [
        ("initial", "max_plies", 0.5, 2), ("initial", "max_plies", 0.5, 2),
        ("ruy_lopez", "max_plies", 0.5, 2), ("ruy_lopez", "max_plies", 0.5, 2)]
    assert games[2]["moves"] == games[3]["moves"] == [ruy.peek().uci(), first_legal(ruy)]
    games = ce.stockfish_games(lambda prompts: [" B: a1a1"] * len(prompts), 2)
    assert [(g["end"], g["score"], g["plies"]) for g in games] == [("illegal", 0.0, 0), ("illegal", 0.0, 1)]


def stockfish_stand_in(monkeypatch, engine_class=ScriptedEngine):
    """stockfish_games' engine replaced: engine_class instances (in the list returned) for every game, and the
    (engine, kill) of each close_engine call."""
    engines, closed = [], []
    monkeypatch.setattr(ce, "find_stockfish", lambda path: "sf")
    monkeypatch.setattr(ce, "open_engine", lambda path, deadline: engines.append(engine_class([])) or engines[-1])
    monkeypatch.setattr(ce, "close_engine", lambda engine, kill=False: closed.append((engine, kill)))
    monkeypatch.setitem(ce.ENGINE_NAMES, "sf", "FakeFish 1")
    return engines, closed


def test_an_unparseable_answer_loses_against_stockfish_and_the_games_keep_no_transitions(monkeypatch):
    """Also: the engine is the one found at the path given, and may take as long as a search at the nodes asked for."""
    engines, closed = stockfish_stand_in(monkeypatch)
    found, deadlines = [], []
    monkeypatch.setattr(ce, "find_stockfish", lambda path: found.append(path) or "sf")
    monkeypatch.setattr(ce, "open_engine", lambda path, deadline: deadlines.append((path, deadline))
                        or engines.append(ScriptedEngine([])) or engines[-1])
    games = ce.stockfish_games(lambda prompts: [" M: e2e4 E: 0.1"] * len(prompts), 2, "/my/sf", nodes=50_000)
    assert found == ["/my/sf"] and deadlines == [("sf", ce.engine_deadline(chess.engine.Limit(nodes=50_000)))]
    assert [(g["end"], g["score"], g["plies"]) for g in games] == [("unparseable", 0.0, 0), ("unparseable", 0.0, 1)]
    assert [set(g) for g in games] == [{"start", "white", "score", "end", "plies", "moves"}] * 2
    assert closed == [(engines[0], False)]  # quit when done


class FailingEngine(ScriptedEngine):
    """An engine whose search dies (line empty) or times out (line ["timeout"])."""

    def play(self, board, limit, game=None):
        if self.line == ["timeout"]:
            raise TimeoutError()
        raise chess.engine.EngineTerminatedError("engine process died unexpectedly (exit code: -9)")


def test_an_engine_or_a_player_failing_in_a_game_is_named_and_the_engine_killed(monkeypatch):
    """A search that fails, or times out, is an EngineFailure naming the engine, its path and the position; then as
    on any error (here the model's) the engine is killed, not asked to quit."""
    engines, closed = stockfish_stand_in(monkeypatch, FailingEngine)
    after_a3 = played("a2a3").fen()
    died = "engine process died unexpectedly (exit code: -9)"
    message = f"FakeFish 1 (sf) failed ({died}) in a game against the model, at {after_a3}; point --stockfish_path"
    with pytest.raises(ce.EngineFailure, match=re.escape(message + " at a working Stockfish")):
        ce.stockfish_games(answering(first_legal), 1)
    monkeypatch.setattr(ce, "open_engine", lambda path, deadline: engines.append(FailingEngine(["timeout"]))
                        or engines[-1])
    with pytest.raises(ce.EngineFailure, match=re.escape(f"FakeFish 1 (sf) stopped answering in a game against the "
                                                         f"model, at {after_a3};")):
        ce.stockfish_games(answering(first_legal), 1)

    def crashing(prompts):
        raise RuntimeError("the model crashed")
    with pytest.raises(RuntimeError, match="the model crashed"):
        ce.stockfish_games(crashing, 1)
    assert closed == [(engine, True) for engine in engines] and len(engines) == 3


def recording_player(calls):
    """SelfPlaySource's player factory: records (model, seed) of each refresh; plays ITALIAN_12."""
    def factory(model, seed, autocast=None):
        calls.append((model, seed))
        return scripted(ITALIAN_12)
    return factory


@needs_stockfish
def test_each_refresh_plays_with_the_current_weights_and_a_new_seed(tmp_path):
    """Refresh r of a source seeded s plays with the model given to it and seed s * 1_000_003 + r; the P:
    positions it sends to Stockfish carry the moves that led there: one more at each ply, then the last 9."""
    calls = []
    with SelfPlaySource(None, games=1, plies=3, depth=1, workers=1, cache_path=str(tmp_path / "sf.jsonl"), seed=5,
                        player=recording_player(calls)) as src:
        src.held_out = frozenset()  # the Italian's early positions are held-out eval positions, which it leaves out
        src.refresh("weights A")
        assert [len(h) for _, h in src.pending] == [0, 1, 2]
        src.refresh("weights B")
        assert [len(h) for _, h in src.pending] == [3, 4, 5]
        src.refresh("weights C")
        src.refresh("weights D")
        assert [h for _, h in src.pending] == [ITALIAN_12[:n][-9:] for n in (9, 10, 11)]
        assert [len(h) for _, h in src.pending] == [9, 9, 9]
    assert calls == [("weights A", 5_000_015), ("weights B", 5_000_016), ("weights C", 5_000_017),
                     ("weights D", 5_000_018)]


def test_a_mate_file_saved_with_a_byte_order_mark_is_read(tmp_path):
    """A mate-in-one file saved by an editor that writes a byte-order mark loads, as data files do, where its first
    line was "Unexpected UTF-8 BOM"."""
    path, record = tmp_path / "mates.jsonl", {"fen": "6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1", "mates": ["a1a8"]}
    path.write_bytes(b"\xef\xbb\xbf" + json.dumps(record).encode() + b"\r\n")
    assert gm.load_mates(str(path)) == [record]


if __name__ == "__main__":
    import sys
    sys.exit(pytest.main([__file__, "-q"]))
