"""Position sources: realistic games (Stockfish at low strength), their A: transitions at every history
length, the held-out split of `annotate.py --games`, and P: prompts at both paddings.

    python mini/test_positions.py
"""
import json
import random

import chess
import chess.engine
import pytest

from mini.annotate import game_env_records, main as annotate_main, play_games
from mini.dataset import PoolSource, load_jsonl, pad_policy, shipped_keys
from mini.formats import policy_prompt, policy_sample, position_key
from mini.positions import HISTORY_BUCKETS, build_mates, game_transitions, history_bucket, play_game
from mini.stockfish import find_stockfish

ENDS = {"checkmate", "stalemate", "insufficient_material", "threefold_repetition", "fifty_moves",
        "fivefold_repetition", "seventyfive_moves", "resignation", "agreed_draw", "max_plies"}


@pytest.fixture(scope="module")
def engine():
    try:
        path = find_stockfish()
    except FileNotFoundError as e:
        pytest.skip(str(e))
    engine = chess.engine.SimpleEngine.popen_uci(path)
    engine.configure({"Threads": 1})
    yield engine
    engine.quit()


@pytest.fixture(scope="module")
def games(engine):
    return [play_game(engine, random.Random(f"test-{i}")) for i in range(3)]


def test_games_are_legal_seeded_and_end_by_a_named_rule(engine, games):
    assert play_game(engine, random.Random("test-0")) == games[0]  # the same seed, the same game
    assert games[0][0] != games[1][0]
    for moves, end in games:
        board = chess.Board()
        for m in moves:
            assert chess.Move.from_uci(m) in board.legal_moves
            board.push_uci(m)
        assert end in ENDS
        if end == "checkmate":
            assert board.is_checkmate()


def test_transitions_carry_the_history_that_led_there(games):
    moves = games[0][0]
    for ply, (fen, history, played) in enumerate(game_transitions(moves)):
        assert history == moves[max(0, ply - 9):ply] and played == moves[ply]  # short at the start of the game
        board = chess.Board()
        for m in moves[:ply]:
            board.push_uci(m)
        assert fen == board.fen()


def test_held_out_transitions_fill_every_history_bucket(games):
    records = game_env_records(games, random.Random(0), per_bucket=5)
    assert [history_bucket(len(h)) for _, _, h in records] == [f"{lo}-{hi}" for lo, hi in HISTORY_BUCKETS for _ in range(5)]
    assert all(h[-1] == m for _, m, h in records)  # the move is the history's last entry
    keys = {position_key(f) for f, _, _ in records}
    rest = game_env_records(games, random.Random(1), exclude=keys)
    assert rest and not keys & {position_key(f) for f, _, _ in rest}
    assert min(len(h) for _, _, h in rest) == 1  # the games' own starts


def test_a_capped_pool_is_the_first_of_the_full_one_and_cut_rate_shortens_histories(games):
    full = game_env_records(games, random.Random(2))
    assert game_env_records(games, random.Random(2), limit=7) == full[:7]  # a uniform draw: the order is shuffled
    mean_history = lambda rate: sum(len(h) for _, _, h in game_env_records(games, random.Random(2), cut_rate=rate))
    assert mean_history(1.0) < mean_history(0.25) < mean_history(0.0)


def test_a_further_pool_leaves_every_shipped_held_out_position_out(tmp_path, monkeypatch):
    """--eval_games 0: no held-out set is written, and the pool has no position of the shipped held-out sets (here
    a fake one that holds every position of the first training game)."""
    import mini.dataset as dataset
    games = play_games("2-train", 2, "", 1, str(tmp_path))
    first = {position_key(fen) for fen, _, _ in game_transitions(games[0][0])} - {position_key(chess.STARTING_FEN)}
    monkeypatch.setattr(dataset, "held_out_keys", lambda: frozenset(first))
    monkeypatch.setattr("mini.annotate.held_out_keys", dataset.held_out_keys)
    pool, ev = tmp_path / "pool.jsonl", tmp_path / "eval.jsonl"
    annotate_main(["--games", "2", "--eval_games", "0", "--pool", "20", "--transitions", "50", "--seed", "2",
                   "--depth", "2", "--workers", "1", "--cache", "", "--pool_path", str(pool), "--eval_path", str(ev)])
    samples = load_jsonl(str(pool))
    assert not ev.exists() and sum(s.task == "A" for s in samples) == 50
    assert not first & {position_key(f) for s in samples for f in (s.fen, s.next_fen) if f}


def test_build_from_games_writes_disjoint_pool_and_eval(tmp_path):
    pool, ev = tmp_path / "pool.jsonl", tmp_path / "eval.jsonl"
    annotate_main(["--games", "2", "--eval_games", "2", "--pool", "30", "--eval", "10", "--eval_transitions", "6",
                   "--depth", "2", "--workers", "1", "--cache", "", "--pool_path", str(pool), "--eval_path", str(ev)])
    pool_samples, eval_samples = load_jsonl(str(pool)), load_jsonl(str(ev))
    assert sum(s.task == "P" for s in pool_samples) == 30 and sum(s.task == "P" for s in eval_samples) == 10
    assert sum(s.task == "A" for s in eval_samples) == 6 and sum(s.task == "A" for s in pool_samples) > 100
    held_out = shipped_keys([str(ev)])
    assert not held_out & {position_key(f) for s in pool_samples for f in (s.fen, s.next_fen) if f}
    assert position_key(chess.STARTING_FEN) not in held_out  # in every game: it stays trainable
    assert any(s.fen == chess.STARTING_FEN for s in pool_samples if s.task == "A")
    assert json.loads(ev.read_text().splitlines()[0])["meta"]["generator"] == "mini.positions.play_game"


def test_played_games_are_kept_and_read_back(tmp_path, monkeypatch):
    games = play_games("kept", 1, "", 1, str(tmp_path))
    monkeypatch.setattr("mini.annotate.play_game", lambda *a: pytest.fail("a kept game was played again"))
    assert play_games("kept", 1, "", 1, str(tmp_path)) == games
    assert (tmp_path / "games-kept-1.jsonl").exists()


def test_policy_prompts_at_both_paddings():
    s = policy_sample("8/8/4k3/8/8/4K3/4P3/8 w - - 0 60", ["e3d4"], [1.5])
    assert len(policy_prompt(s.fen, 90)) == 3 + 89 and len(policy_prompt(s.fen, 89)) == 3 + 88
    rng = random.Random(0)
    assert pad_policy(s, (90,), rng).prompt == s.prompt
    widths = {len(pad_policy(s, (90, 89), rng).prompt) for _ in range(20)}
    assert widths == {92, 91}
    source = PoolSource([s], env_ratio=0.0, pads=(89,))
    assert source.draw(1)[0].prompt == policy_prompt(s.fen, 89)


def test_build_is_deterministic_and_excludes():
    a = build_mates(3, seed=3, max_plies=120)
    assert a == build_mates(3, seed=3, max_plies=120) and len({position_key(r["fen"]) for r in a}) == 3
    b = build_mates(2, seed=3, max_plies=120, exclude={position_key(r["fen"]) for r in a[:2]})
    assert not {position_key(r["fen"]) for r in b} & {position_key(r["fen"]) for r in a[:2]}


if __name__ == "__main__":
    import sys
    sys.exit(pytest.main([__file__, "-q"]))
