"""Self-play positions (mini/selfplay.py): scripted policies give known games, the Stockfish cache is reused
and survives a cut-off line, held-out positions stay out, a restored source continues exactly.

    python mini/test_selfplay.py
"""
import concurrent.futures
import json
import random
import sys

import chess
import pytest
import torch

from mini.config import EVAL_PATH, POOL_PATH
from mini.dataset import PoolSource, load_jsonl
from mini.formats import env_sample, legal_ucis, position_key
from mini.games import game_starts, load_mates, opening_board
from mini.model import GPT, GPTConfig
from mini.selfplay import SelfPlaySource
from mini.stockfish import find_stockfish
from mini.tokenizer import Tokenizer

try:
    STOCKFISH = find_stockfish()
except FileNotFoundError:
    STOCKFISH = None
needs_stockfish = pytest.mark.skipif(STOCKFISH is None, reason="Stockfish binary not found (apt-get install stockfish)")
RULES = {"first": lambda ms: ms[0], "last": lambda ms: ms[-1]}


def by_model(model, seed, autocast=None):
    """A scripted player per 'model': first or last legal move in sorted UCI order, or a seeded random one."""
    rule = RULES.get(model) or random.Random(seed).choice
    return lambda prompts: [f" M: a1a2 E: 0.0 B: {rule(sorted(legal_ucis(p[3:].strip())))}" for p in prompts]


def source(tmp_path, pool=None, **kw):
    kw = dict(games=3, plies=4, depth=4, workers=1, cache_path=str(tmp_path / "sf.jsonl"), player=by_model, seed=0) | kw
    return SelfPlaySource(None, pool, **kw)


def line(start, rule, n):
    """(FEN, the last 9 moves that led there) before each of n moves by rule from a named start."""
    board, out = opening_board(start), []
    for _ in range(n):
        out.append((board.fen(), [m.uci() for m in board.move_stack[-9:]]))
        board.push_uci(rule(sorted(legal_ucis(board.fen()))))
    return out


def played_by(transitions, rule):
    return all(move == rule(sorted(legal_ucis(fen))) for fen, move, _ in transitions)


@needs_stockfish
def test_positions_follow_the_current_policy(tmp_path):
    with source(tmp_path, max_plies=6) as src:
        src.refresh("first")
        p = src.draw(1)[0]  # nothing labelled yet: waits for Stockfish
        # games start initial, ruy_lopez, initial; the third repeats the first, so it adds nothing
        a, b = line("initial", RULES["first"], 4), line("ruy_lopez", RULES["first"], 4)
        assert list(src.positions) == [position_key(f) for pair in zip(a, b) for f, _ in pair]
        assert [h for _, h, _, _ in src.positions.values()] == [h for pair in zip(a, b) for _, h in pair]
        assert p.task == "P" and position_key(p.fen) in src.positions
        for fen, history, moves, evals in src.positions.values():
            assert len(moves) == len(evals) == 5 and set(moves) <= legal_ucis(fen)  # MultiPV 5, all legal
            assert not chess.Board(fen).is_game_over()
        assert len(src.moves) == 8 and played_by(src.moves.values(), RULES["first"])
        assert all(env_sample(*t).truncated == 0 for t in src.moves.values())  # legal moves
        before = set(src.moves)
        src.refresh("last")  # new weights: the same games go on with the other policy
        new = [t for k, t in src.moves.items() if k not in before]
        assert new and played_by(new, RULES["last"])
        # 6 plies reached after 2 more: every game restarted from the next starts, then played 2 plies
        assert [g["start"] for g in src.games] == game_starts(6)[3:] and [g["plies"] for g in src.games] == [2, 2, 2]
        assert src.pending and all(position_key(f) not in src.positions for f, _ in src.pending)
        keys = [position_key(f) for f, _ in src.pending]
        assert len(keys) == len(set(keys))


@needs_stockfish
def test_windows_keep_the_newest(tmp_path):
    with source(tmp_path, capacity=4) as src:
        src.refresh("first")
        src.draw(1)
        a, b = line("initial", RULES["first"], 4), line("ruy_lopez", RULES["first"], 4)
        assert list(src.positions) == [position_key(f) for pair in zip(a, b) for f, _ in pair][-4:]
        assert [f for f, _, _ in src.moves.values()] == [f for pair in zip(a, b) for f, _ in pair][-4:]


@needs_stockfish
def test_cache_reused_and_survives_a_cut_off_line(tmp_path):
    with source(tmp_path) as first:
        first.refresh("first")
        drawn = [s.completion for s in first.draw(6)]
        assert first.metrics["selfplay_searched"] > 0
    cache = tmp_path / "sf.jsonl"
    with open(cache, "a") as f:
        f.write('{"fen": "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1", "limit": "dep')  # a kill mid-line
    with source(tmp_path) as second:
        search = second.ann._analyse
        second.ann._analyse = lambda fen: pytest.fail(f"searched {fen} again")
        second.refresh("first")
        assert second.metrics["selfplay_searched"] == 0
        assert [s.completion for s in second.draw(6)] == drawn
        second.ann._analyse = search
        second.refresh("last")  # new positions are searched and appended after the cut-off line
        second.draw(1)
        assert second.metrics["selfplay_searched"] > 0
        fens = [f for f, _ in second.pending]
        second._promote()
    with source(tmp_path) as third:
        assert set(fens) <= set(third.ann.cache)
    lines = cache.read_text().splitlines()
    assert sum(1 for x in lines if not x.endswith("}")) == 1  # only the cut-off line is bad, and it is ended


@needs_stockfish
def test_held_out_positions_never_enter(tmp_path):
    banned = line("initial", RULES["first"], 3)[2][0]  # met by game 0 at ply 2
    with source(tmp_path, exclude=[banned], plies=5) as src:
        src.refresh("first")
        src.refresh("first")
        samples = src.draw(200)
        key = position_key(banned)
        assert key not in src.positions and key not in {position_key(f) for f, _ in src.pending}
        assert all(key not in (position_key(s.fen), position_key(s.next_fen or s.fen)) for s in samples)
        assert {s.task for s in samples} == {"P", "A"}
        # the A: move that leads there is out too (its completion shows the position)
        assert all(key != position_key(env_sample(*t).next_fen) for t in src.moves.values())
        shipped = [json.loads(x)["fen"] for x in open(EVAL_PATH) if '"fen"' in x] + [r["fen"] for r in load_mates()]
        assert {position_key(f) for f in shipped} <= src.held_out


@needs_stockfish
def test_state_dict_resumes_exactly(tmp_path):
    pool_samples = load_jsonl(POOL_PATH)[:50]
    pool = PoolSource(pool_samples, 0.2, seed=1)
    with source(tmp_path, pool, mix=0.6, plies=3, max_plies=4, seed=5) as a:  # games end and new ones start
        a.refresh("random")
        a.draw(10)
        a.refresh("random")  # leaves positions waiting for Stockfish: the state must carry them
        a.draw(5)
        assert a.pending
        torch.save({"selfplay": a.state_dict(), "pool_rng": pool.rng.getstate()}, tmp_path / "ckpt.pt")
        saved = torch.load(tmp_path / "ckpt.pt", weights_only=True)
        pool_b = PoolSource(pool_samples, 0.2, seed=99)
        pool_b.rng.setstate(saved["pool_rng"])
        assert a.started > 3  # which opening the next game starts from is part of the state
        with source(tmp_path, pool_b, mix=0.6, plies=3, max_plies=4, seed=5) as b:
            b.load_state_dict(saved["selfplay"])
            for src in (a, b):
                src.out = [src.draw(12), src.refresh("random"), src.draw(12), src.refresh("random"), src.draw(40)]
            texts = [[(s.prompt, s.completion) for s in part] for part in a.out if part]
            assert texts == [[(s.prompt, s.completion) for s in part] for part in b.out if part]
            assert a.state_dict() == b.state_dict()
        pool_prompts = {s.prompt for s in pool_samples}
        drawn = [s for part in a.out if part for s in part]
        assert 0 < sum(s.prompt in pool_prompts for s in drawn) < len(drawn)  # mixed


@needs_stockfish
def test_mix_and_draw_before_refresh(tmp_path):
    pool = PoolSource(load_jsonl(POOL_PATH)[:20], 0.0, seed=0)
    with source(tmp_path, pool, mix=0.0) as src:
        src.refresh("first")
        assert {s.prompt for s in src.draw(20)} <= {s.prompt for s in pool.policy}  # mix 0: the pool only
    with source(tmp_path, pool, mix=1.0) as src:  # before the first refresh the pool stands in for self-play
        assert {s.prompt for s in src.draw(5)} <= {s.prompt for s in pool.policy}
    with source(tmp_path) as src, pytest.raises(ValueError, match="call refresh"):
        src.draw(1)


@needs_stockfish
def test_tiny_model_plays_through_model_player(tmp_path):
    torch.manual_seed(0)
    model, tok = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=32, n_positions=256)), Tokenizer.gpt2()
    with SelfPlaySource(tok, games=2, plies=2, max_new_tokens=8, depth=4, cache_path=str(tmp_path / "c.jsonl")) as src:
        src.refresh(model)
        assert all(s.task == "P" for s in src.draw(3))
        assert src.started > 2  # a random model answers nothing parseable: every game ends and restarts


class Pool:
    """A pool source's stand-in: draws marked samples."""
    def draw(self, n):
        return [env_sample(chess.STARTING_FEN, "g1f3", ["g1f3"]) for _ in range(n)]


def test_draw_shares_of_pool_moves_and_positions(monkeypatch):
    """A draw is the pool's with probability 1 - mix, else a self-play A: move with probability env_ratio, else a
    labelled self-play position: here 30%, 14% and 56% of 1000 draws. Which draw is which follows the source's seed."""
    monkeypatch.setattr("mini.selfplay.Annotator", lambda *a, **kw: None)  # nothing to label: no engine
    monkeypatch.setattr("mini.selfplay.held_out_keys", frozenset)  # nor any position to leave out
    src = SelfPlaySource(None, Pool(), games=1, mix=0.7, env_ratio=0.2, player=by_model)
    src.positions["k"] = (chess.STARTING_FEN, [], ["e2e4"], [0.3])
    src.moves["k", "d2d4"] = (chess.STARTING_FEN, "d2d4", ["d2d4"])
    draws = src.draw(1000)
    share = lambda test: sum(map(test, draws)) / len(draws)
    assert abs(share(lambda s: s.task == "A" and s.move == "g1f3") - 0.3) < 0.05
    assert abs(share(lambda s: s.task == "A" and s.move == "d2d4") - 0.14) < 0.04
    assert abs(share(lambda s: s.task == "P") - 0.56) < 0.05

    def drawn(seed):
        other = SelfPlaySource(None, Pool(), games=1, mix=0.7, env_ratio=0.2, player=by_model, seed=seed)
        other.positions, other.moves = src.positions, src.moves
        return [(s.prompt, s.completion) for s in other.draw(30)]
    assert drawn(1) == drawn(1) != drawn(2)  # each --seed draws its own mix, the same each time


class Labeller:
    """Stockfish's stand-in: every position labelled at once with its first legal moves (sorted UCI), evals 0."""

    def __init__(self, *a, **kw):
        self.cache = {}

    def submit(self, fens):
        done = concurrent.futures.Future()
        done.set_result({f: (sorted(legal_ucis(f))[:5], [0.0] * min(5, len(legal_ucis(f)))) for f in fens})
        return [done] * len(fens)

    def close(self):
        pass


def test_a_second_refresh_makes_the_first_ones_labels_drawable(monkeypatch):
    """Two refreshes with no draw between them: the first refresh's positions become drawable at the second (none is
    lost when its pending list is replaced) while the second's wait for the next one; the metrics count them."""
    monkeypatch.setattr("mini.selfplay.Annotator", Labeller)
    monkeypatch.setattr("mini.selfplay.held_out_keys", frozenset)
    src = SelfPlaySource(None, games=1, plies=2, player=by_model)
    src.refresh("first")
    src.refresh("first")
    first, second = line("initial", RULES["first"], 4)[:2], line("initial", RULES["first"], 4)[2:]
    assert list(src.positions) == [position_key(f) for f, _ in first]
    assert [position_key(f) for f, _ in src.pending] == [position_key(f) for f, _ in second]
    assert (src.metrics["selfplay_new"], src.metrics["selfplay_searched"]) == (2, 2)  # none in the cache
    src.draw(1)
    assert (src.metrics["selfplay_positions"], src.metrics["selfplay_transitions"]) == (2, 4)  # 4 moves, 2 labelled


def test_settings_reach_the_annotator_and_the_model_player(monkeypatch):
    """Stockfish labels at the given depth, workers and cache with 5 lines; the model plays at the given temperature,
    top_k and max_new_tokens, with the seed and autocast each refresh passes."""
    made, players = [], []
    monkeypatch.setattr("mini.selfplay.Annotator", lambda *a, **kw: made.append((a, kw)))
    monkeypatch.setattr("mini.selfplay.model_player", lambda *a, **kw: players.append((a, kw)))
    monkeypatch.setattr("mini.selfplay.held_out_keys", frozenset)
    src = SelfPlaySource("tok", games=1, temperature=0.7, top_k=5, max_new_tokens=40, depth=6, workers=2,
                         cache_path="c.jsonl", stockfish_path="sf")
    assert made == [(("sf",), {"depth": 6, "workers": 2, "cache_path": "c.jsonl", "multipv": 5})]
    src.player("model", 11, "bf16")
    assert players == [(("model", "tok", 0.7, 5, 11, 40), {"autocast": "bf16"})]


def test_self_play_moves_keep_the_moves_that_led_to_them(monkeypatch):
    """A self-play A: move is kept with its position and the last 9 moves that led there, the move at the end."""
    monkeypatch.setattr("mini.selfplay.Annotator", Labeller)
    monkeypatch.setattr("mini.selfplay.held_out_keys", frozenset)
    src = SelfPlaySource(None, games=1, plies=12, player=by_model)
    src.refresh("first")
    want = {}  # a position met again with the same move is kept once
    for fen, history in line("initial", RULES["first"], 12):
        move = RULES["first"](sorted(legal_ucis(fen)))
        want.setdefault((position_key(fen), move), (fen, move, history + [move]))
    assert list(src.moves.values()) == list(want.values()) and max(len(h) for _, _, h in want.values()) == 10


@pytest.mark.parametrize("games,plies,max_plies", [(1, 2, 2), (2, 6, 200)])
def test_a_restored_source_keeps_no_transition_twice(monkeypatch, games, plies, max_plies):
    """One game of 2 plies from initial, then ruy_lopez, then initial again: the third game replays the first one's
    positions and transitions. Restored between the second and third refresh, the source keeps each once, as the one
    never stopped does, and the two end in the same state. Two games of 6 plies a refresh: the ruy_lopez game is 18
    half-moves deep when restored, its board rebuilt from all of them."""
    monkeypatch.setattr("mini.selfplay.Annotator", Labeller)
    monkeypatch.setattr("mini.selfplay.held_out_keys", frozenset)
    a, b = (SelfPlaySource(None, games=games, plies=plies, max_plies=max_plies, player=by_model) for _ in range(2))
    a.refresh("first")
    a.refresh("first")
    b.load_state_dict(a.state_dict())
    assert [x.fen() for x in b.boards] == [x.fen() for x in a.boards]
    for src in (a, b):
        src.refresh("first")
    assert a.state_dict() == b.state_dict()
    if games == 1:
        assert len(b.moves) == len(a.moves) == 4 and len(b.positions) == len(a.positions) == 4
        assert a.metrics["selfplay_new"] == b.metrics["selfplay_new"] == 0  # the replayed positions: none is new


@pytest.mark.parametrize("pads", [(89,), (90, 89)])
def test_self_play_prompts_take_the_policy_pad(monkeypatch, pads):
    """--policy_pad reaches the self-play P: prompts as it does the pool's: the FEN padded to each width asked
    for ('P: ' + FEN + spaces, less the space that merges into ' M'), never to 90 alone."""
    monkeypatch.setattr("mini.selfplay.Annotator", lambda *a, **kw: None)
    monkeypatch.setattr("mini.selfplay.held_out_keys", frozenset)
    src = SelfPlaySource(None, games=1, mix=1.0, env_ratio=0.0, player=by_model, pads=pads)
    src.positions["k"] = (chess.STARTING_FEN, [], ["e2e4"], [0.3])
    widths = {len(s.prompt) - len("P: ") + 1 for s in src.draw(40)}
    assert widths == set(pads)


def test_no_stockfish_is_one_sentence(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"^Stockfish not found .*apt-get install stockfish") as e:
        source(tmp_path, stockfish_path="/nonexistent/stockfish")
    assert "\n" not in str(e.value) and str(e.value).count(". ") == 0


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
