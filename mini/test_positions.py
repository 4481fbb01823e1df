"""Position sources: realistic games (Stockfish at low strength), their A: transitions at every history
length, the held-out split of `annotate.py --games`, and P: prompts at both paddings.

    python mini/test_positions.py
"""
import collections
import itertools
import json
import math
import random

import chess
import chess.engine
import pytest

import mini.positions as positions
from mini.annotate import game_env_records, game_positions, main as annotate_main, play_games, quotas
from mini.config import MATE_PATH, POOL_PATH
from mini.dataset import PoolSource, load_jsonl, pad_policy, shipped_keys
from mini.formats import UCI, legal_ucis, policy_prompt, policy_sample, position_key
from mini.positions import (HISTORY_BUCKETS, build_mates, engine_move, game_fens, game_style, game_transitions,
                            history_bucket, iter_positions, king_constraint, mating_moves, phase, play_game,
                            random_env_sample)
from mini.stockfish import find_stockfish
from mini.test_games import ITALIAN_12, played

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


needs_stockfish = pytest.mark.usefixtures("engine")  # skipped, saying why, without Stockfish


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
    wide = game_env_records(games, random.Random(0), per_bucket=30)  # lengths drawn over each whole bucket
    for lo, hi in HISTORY_BUCKETS:
        lengths = {len(h) for _, _, h in wide if history_bucket(len(h)) == f"{lo}-{hi}"}
        assert min(lengths) == lo and max(lengths) == hi, (lo, hi, lengths)
    keys = {position_key(f) for f, _, _ in records}
    rest = game_env_records(games, random.Random(1), exclude=keys)
    assert rest and not keys & {position_key(f) for f, _, _ in rest}
    assert min(len(h) for _, _, h in rest) == 1  # the games' own starts
    k = len(games[0][0]) - 9  # the plies of the first game with 9 moves before them: in every bucket's reach
    assert len(game_env_records(games[:1], random.Random(0), per_bucket=k)) == 3 * k  # a ply serves each bucket
    after = lambda f, m: position_key(board_after_move(chess.Board(f), chess.Move.from_uci(m)).fen())
    onto = {after(f, m) for f, m, _ in records if m in legal_ucis(f)}  # where the held-out moves lead
    led = game_env_records(games, random.Random(1), exclude=onto)
    assert led and not onto & {after(f, m) for f, m, _ in led if m in legal_ucis(f)}  # no record reaches them


def test_a_bucket_takes_only_plies_whose_history_reaches_its_longest_length():
    """A game of 4 half-moves has histories of 0 to 3 half-moves before its moves: enough for every length of
    1-2 (the move and up to one before it), too short for 3-5, whose lengths must be drawn over the whole
    bucket. Its P: positions, met twice in two copies of the game, are drawn once each."""
    short = [(["e2e4", "e7e5", "g1f3", "b8c6"], "*")]
    records = game_env_records(short, random.Random(0), per_bucket=2)
    assert [history_bucket(len(h)) for _, _, h in records] == ["1-2", "1-2"]
    assert len(game_positions(short * 2, random.Random(0), 10)) == 4
    records = game_env_records(HAND_GAMES, random.Random(0), per_bucket=2)  # plies 9 to 11 of ITALIAN_12 reach 6-10
    assert [history_bucket(len(h)) for _, _, h in records] == ["1-2"] * 2 + ["3-5"] * 2 + ["6-10"] * 2


def test_game_transitions_are_a_tenth_illegal_moves(games):
    """The A: records of games: the move played, an illegal move a tenth of the time (twice random_env_sample's
    default, as the docstring says), no UCI move 2%; over 5 draws of the games' plies."""
    records = [r for seed in range(5) for r in game_env_records(games, random.Random(seed))]
    illegal = sum(UCI.match(m) is not None and m not in legal_ucis(f) for f, m, _ in records) / len(records)
    assert 0.08 < illegal < 0.12, illegal


def test_a_capped_pool_is_the_first_of_the_full_one_and_cut_rate_shortens_histories(games):
    full = game_env_records(games, random.Random(2))
    assert game_env_records(games, random.Random(2), limit=7) == full[:7]  # a uniform draw: the order is shuffled
    mean_history = lambda rate: sum(len(h) for _, _, h in game_env_records(games, random.Random(2), cut_rate=rate))
    assert mean_history(1.0) < mean_history(0.25) < mean_history(0.0)


@needs_stockfish
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
                   "--depth", "2", "--workers", "1", "--cache", "", "--pool_path", str(pool), "--eval_path", str(ev),
                   "--cut_rate", "0"])
    samples = load_jsonl(str(pool))
    assert not ev.exists() and sum(s.task == "A" for s in samples) == 50
    # --cut_rate 0: every transition has the whole history the game gives it, the move and up to 9 before it
    assert all(len(s.history) == min(chess.Board(s.fen).ply(), 9) + 1 for s in samples if s.task == "A")
    assert not first & {position_key(f) for s in samples for f in (s.fen, s.next_fen) if f}


@needs_stockfish
def test_build_from_games_writes_disjoint_pool_and_eval(tmp_path):
    pool, ev = tmp_path / "pool.jsonl", tmp_path / "eval.jsonl"
    annotate_main(["--games", "2", "--eval_games", "2", "--pool", "30", "--eval", "10", "--eval_transitions", "6",
                   "--depth", "2", "--workers", "1", "--cache", "", "--pool_path", str(pool), "--eval_path", str(ev)])
    pool_samples, eval_samples = load_jsonl(str(pool)), load_jsonl(str(ev))
    assert sum(s.task == "P" for s in pool_samples) == 30 and sum(s.task == "P" for s in eval_samples) == 10
    assert sum(s.task == "A" for s in eval_samples) == 6 and sum(s.task == "A" for s in pool_samples) > 100
    held_out = shipped_keys([str(ev)])
    assert not held_out & {position_key(f) for s in pool_samples for f in (s.fen, s.next_fen) if f}
    train_games = play_games("0-train", 2, "", 1, str(tmp_path))  # kept beside the pool: read back, not played
    trained = {position_key(f) for moves, _ in train_games for f in game_fens(moves)} | shipped_keys([POOL_PATH])
    assert not held_out & trained  # no held-out position (nor where its A: move leads) is one training reaches
    assert position_key(chess.STARTING_FEN) not in held_out  # in every game: it stays trainable
    assert any(s.fen == chess.STARTING_FEN for s in pool_samples if s.task == "A")
    assert json.loads(ev.read_text().splitlines()[0])["meta"]["generator"] == "mini.positions.play_game"


@needs_stockfish
def test_no_held_out_position_is_one_that_training_reaches(tmp_path, monkeypatch, capsys):
    """Eval games that repeat the training games, or whose every position is in the shipped pool, leave the held-out
    set empty (only its header is written): no held-out P: position or A: transition, nor where its move leads, is
    a position of a training game or of the shipped pool. A pool larger than the games hold is written, and said."""
    games = {tag: play_games(tag, 1, "", 1, str(tmp_path)) for tag in ("0-train", "0-eval")}
    argv = ["--games", "1", "--eval_games", "1", "--pool", "5", "--eval", "10", "--eval_transitions", "30", "--depth",
            "2", "--workers", "1", "--cache", "", "--pool_path", str(tmp_path / "pool.jsonl")]
    monkeypatch.setattr("mini.annotate.play_games", lambda tag, *a: games["0-train"])  # eval games = training games
    annotate_main(argv + ["--eval_path", str(tmp_path / "same.jsonl")])
    assert len((tmp_path / "same.jsonl").read_text().splitlines()) == 1
    monkeypatch.setattr("mini.annotate.play_games", lambda tag, *a: games[tag])
    every_eval_position = {position_key(f) for moves, _ in games["0-eval"] for f in game_fens(moves)}
    monkeypatch.setattr("mini.annotate.shipped_keys", lambda paths: every_eval_position)  # as if the pool held them
    annotate_main(argv + ["--eval_path", str(tmp_path / "pooled.jsonl"), "--pool", "100000"])
    assert len((tmp_path / "pooled.jsonl").read_text().splitlines()) == 1
    held = sum(s.task == "P" for s in load_jsonl(str(tmp_path / "pool.jsonl")))
    assert f"the 1 games hold {held} positions for a pool of 100000; writing those" in capsys.readouterr().out


@needs_stockfish
def test_played_games_are_seeded_by_tag_and_number_whatever_the_workers(monkeypatch):
    """Game i of play_games(tag, n, ...) is play_game under Random(f"{tag}-{i}"), in order, with one worker or two
    (a stand-in game: its RNG's first draw), so that a rebuild plays the same games and eval and training differ."""
    monkeypatch.setattr("mini.annotate.play_game", lambda engine, rng: ([f"{rng.random():.9f}"], "*"))
    want = [([f"{random.Random(f't-{i}').random():.9f}"], "*") for i in range(5)]
    assert play_games("t", 5, "", 1) == play_games("t", 5, "", 2) == want


@needs_stockfish
def test_played_games_are_kept_and_read_back(tmp_path, monkeypatch):
    games = play_games("kept", 1, "", 1, str(tmp_path))
    monkeypatch.setattr("mini.annotate.play_game", lambda *a: pytest.fail("a kept game was played again"))
    assert play_games("kept", 1, "", 1, str(tmp_path)) == games
    assert (tmp_path / "games-kept-1.jsonl").exists()
    kept = tmp_path / "games-kept-1.jsonl"  # the same file made by another Stockfish: its games are played again
    record = json.loads(kept.read_text().splitlines()[-1])
    kept.write_text(json.dumps({**record, "engine": "Stockfish 0", "games": [[["e2e4"], "*"]]}) + "\n")
    played = []
    monkeypatch.setattr("mini.annotate.play_game", lambda *a: played.append(1) or games[0])
    assert play_games("kept", 1, "", 1, str(tmp_path)) == games and played == [1]


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
    assert len(build_mates(1, seed=11, max_plies=120)) == 1  # its first game holds two: n caps what is kept


@pytest.mark.parametrize("per_game", [1, 2])
def test_build_mates_keeps_at_most_per_game_positions_of_a_game(monkeypatch, per_game):
    """Each position kept is traced to the game it was found in (a game starts at ply 0): no game gives more
    than per_game, and games with more mates than that give exactly per_game (the cap binds, it is not a floor)."""
    game_of, mates_in = {}, []  # fen -> its game's number (from 1); mate-in-one positions met in each game
    mating_moves = positions.mating_moves

    def traced(board):
        if board.ply() == 0:
            mates_in.append(0)
        mates = mating_moves(board)
        if mates:
            game_of[board.fen()] = len(mates_in)
            mates_in[-1] += 1
        return mates
    monkeypatch.setattr(positions, "mating_moves", traced)
    kept = build_mates(12, seed=5, max_plies=120, per_game=per_game)
    per = collections.Counter(game_of[r["fen"]] for r in kept)
    assert max(per.values()) == per_game and len(kept) == 12
    # the last game may be cut short by n
    assert all(per[g] == per_game for g in per if mates_in[g - 1] >= per_game and g < len(mates_in))


def test_build_mates_plays_each_game_at_one_drawn_bias_to_max_plies_and_keeps_plies_drawn_at_random(monkeypatch):
    """With every position a mate in one (a stand-in search): each game is played at one capture bias drawn from
    0.5, 1 and 3, searched before each of its first max_plies plies (0 to 29) and never after; the one position kept
    of each game is drawn from all of them (not its first), labelled with its phase."""
    searched, biases, play = [], [], positions.play
    monkeypatch.setattr(positions, "mating_moves", lambda board: (searched.append(board.ply()), ["a1a2"])[1])

    def spy(board, rng, capture_bias=0.5):
        if board.ply() == 0:
            biases.append(set())
        biases[-1].add(capture_bias)
        play(board, rng, capture_bias)
    monkeypatch.setattr(positions, "play", spy)
    kept = build_mates(20, seed=0, max_plies=30, per_game=1)
    assert max(searched) == 29 and all(len(b) == 1 for b in biases) and set.union(*biases) == {0.5, 1.0, 3.0}
    plies = [chess.Board(r["fen"]).ply() for r in kept]
    assert sum(plies) / len(plies) > 8  # uniform over 0-29 is 14.5; the first of each game, 0-2
    for r, ply in zip(kept, plies):
        board = chess.Board(r["fen"])
        assert r["phase"] == ("opening" if ply <= 16 else "middlegame" if len(board.piece_map()) >= 14 else "endgame")
    assert {r["phase"] for r in kept} >= {"opening", "middlegame"}


QGD_10 = "d2d4 d7d5 c2c4 e7e6 b1c3 g8f6 c1g5 f8e7 e2e3 e8g8".split()  # Black castles


def board_after(moves):
    return played(" ".join(moves))


def test_generated_positions_carry_the_last_nine_moves_that_led_there_in_order(monkeypatch):
    """iter_positions' history is the last 9 half-moves of the game that reached the position, oldest first."""
    boards = iter([board_after(ITALIAN_12), board_after(ITALIAN_12[:3])])
    monkeypatch.setattr(positions, "random_position", lambda rng, phase: next(boards))
    got = [(fen, history) for fen, history, _ in itertools.islice(iter_positions(0), 2)]
    assert got == [(board_after(ITALIAN_12).fen(), ITALIAN_12[3:]), (board_after(ITALIAN_12[:3]).fen(), ITALIAN_12[:3])]


class Scripted(random.Random):
    """A seeded Random whose first random() calls return the given values (the draw that picks a sample's kind)."""

    def __init__(self, firsts, seed=0):
        super().__init__(seed)
        self.firsts = list(firsts)

    def random(self):
        return self.firsts.pop(0) if self.firsts else super().random()


def test_env_sample_kinds_by_their_rate_bands():
    """u < garbage_rate: no UCI move; then up to garbage_rate + illegal_rate: a UCI move that is illegal (never a
    legal one); else a legal move, the given one when a game played it."""
    fen = "4k3/8/8/8/3Q4/8/8/4K3 w - - 0 1"  # few pieces with many moves: a random from-to is often legal
    legal = legal_ucis(fen)
    for seed in range(40):
        garbage = random_env_sample(fen, [], Scripted([0.015], seed))
        assert garbage.truncated and not UCI.match(garbage.move)
        for u in (0.025, 0.065):
            illegal = random_env_sample(fen, [], Scripted([u], seed))
            assert UCI.match(illegal.move) and illegal.move not in legal and illegal.truncated
        ok = random_env_sample(fen, ["d8e8"], Scripted([0.075], seed))
        assert ok.move in legal and not ok.truncated and ok.history == ["d8e8", ok.move]
        played = random_env_sample(chess.STARTING_FEN, [], Scripted([0.075], seed), move="a2a3")
        assert (played.move, played.history) == ("a2a3", ["a2a3"])


def test_env_samples_favour_game_ending_moves():
    """Half the legal A: samples take a game-ending move when there is one (mates are rare otherwise): here
    Ra8#, one of 17 legal moves, drawn about 53% of the time."""
    fen, rng = "6k1/5ppp/8/8/8/8/8/R5K1 w - - 0 1", random.Random(0)
    moves = [random_env_sample(fen, [], rng, illegal_rate=0.0, garbage_rate=0.0).move for _ in range(300)]
    assert 0.4 <= moves.count("a1a8") / 300 <= 0.66


def test_a_legal_a_move_is_drawn_by_plausibility_and_an_illegal_one_never_stays_on_its_square():
    """Nxd4 wins the queen (weight 40 of the 7 legal moves' 42.8): drawn ~93% of the time, not 1 in 7. A lone
    king's illegal moves are random squares, never its own (a from-to of one square is no move)."""
    fen, rng = "4k3/8/8/8/3q4/8/4N3/4K3 w - - 0 1", random.Random(0)
    moves = [random_env_sample(fen, [], rng, illegal_rate=0.0, garbage_rate=0.0).move for _ in range(200)]
    assert moves.count("e2d4") / 200 >= 0.85
    moves = [random_env_sample("4k3/8/8/8/8/8/8/4K3 w - - 0 1", [], rng, illegal_rate=1.0, garbage_rate=0.0).move
             for _ in range(400)]
    assert all(m[:2] == "e1" and m[2:] != "e1" for m in moves) and len(set(moves)) > 40


def test_env_samples_favour_a_stalemating_move_as_a_game_ending_one():
    """A stalemate ends the game too: Qf7, the one stalemating move of 29 (none mates), is drawn about half the time."""
    fen, rng = "7k/8/8/6K1/8/8/8/5Q2 w - - 0 1", random.Random(0)
    moves = [random_env_sample(fen, [], rng, illegal_rate=0.0, garbage_rate=0.0).move for _ in range(300)]
    assert 0.4 <= moves.count("f1f7") / 300 <= 0.66


def test_an_illegal_move_breaks_the_check_rules_half_the_time_and_a_lost_position_gets_one():
    """The illegal A: moves are half the time moves that break only the check rules (here the pinned Ne2's six
    moves), else a random own piece to a random square (which names one of those six ~5% of the time): ~52%.
    A position with no legal move (mated) gets an illegal move every time."""
    fen, rng = "4r1k1/8/8/8/8/8/4N3/4K3 w - - 0 1", random.Random(0)
    pinned = {m.uci() for m in chess.Board(fen).pseudo_legal_moves if m.from_square == chess.E2}
    moves = [random_env_sample(fen, [], rng, illegal_rate=1.0, garbage_rate=0.0).move for _ in range(300)]
    assert len(pinned) == 6 and 0.4 <= sum(m in pinned for m in moves) / 300 <= 0.65
    mated = "rnb1kbnr/pppp1ppp/8/4p3/6Pq/5P2/PPPPP2P/RNBQKBNR w KQkq - 1 3"  # fool's mate
    assert all(random_env_sample(mated, [], rng).truncated for _ in range(20))


@pytest.mark.parametrize("fen, value, square, mover, lost", [
    ("4k3/8/8/2b5/8/R7/8/4K3 w - - 0 1", 3, chess.E3, None, False),  # a bishop takes a defended minor piece: even
    ("4k3/8/8/2b5/8/R7/8/4K3 w - - 0 1", 5, chess.E3, None, True),   # a rook there is lost to the bishop
    ("4k3/8/8/2b5/8/R7/8/4K3 w - - 0 1", 3, chess.E3, chess.A3, True),  # the rook moving there does not defend it
    ("4k3/8/8/8/8/8/8/3RK3 w - - 0 1", 3, chess.D7, None, False),  # the king cannot take a defended piece
    ("4k3/8/8/8/8/8/8/3RK3 w - - 0 1", 3, chess.F7, None, True),   # it takes a loose one
    ("4k3/8/8/8/8/8/8/3RK3 w - - 0 1", 3, chess.B5, None, False),  # an unattacked square
])
def test_a_piece_is_lost_where_a_cheaper_piece_or_any_piece_unopposed_takes_it(fen, value, square, mover, lost):
    assert positions._loses(chess.Board(fen), value, square, mover) is lost


@pytest.mark.parametrize("fen, uci, weight", [
    ("4k3/8/8/3p4/8/2N5/8/4K3 w - - 0 1", "c3e4", (1 + 2 + 1) * 0.1),  # centre and wide centre, but the pawn takes
    ("4k3/8/8/3p4/8/2N5/8/4K3 w - - 0 1", "c3d5", 1 + 2 + 1 + 4 * 1),  # a safe capture: 4 x the pawn
    ("4k3/8/8/3p4/8/2N5/8/4K3 w - - 0 1", "e1d2", 1 * 0.3),            # a king step
    ("r3k2r/8/8/8/8/8/8/R3K2R w KQkq - 0 1", "e1g1", 1 + 4),            # castling, no king-step discount
    ("4k3/8/8/8/8/8/8/1N2K3 w - - 0 1", "b1c3", 1 + 1 + 2),             # wide centre, develops from the back rank
    ("4k3/8/8/8/8/8/2p5/1N2K3 w - - 0 1", "b1a3", 1 + 2 + 4),           # develops and rescues a piece en prise
    ("4k3/8/8/8/4n3/3P4/8/4K3 w - - 0 1", "d3e4", 1 + 2 + 1 + 4 * 3),  # the pawn takes a knight: gain >= its value
    ("rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1", "b8c6", 1 + 1 + 2),  # Black develops from rank 8
    ("4k3/1P6/8/8/8/8/8/4K3 w - - 0 1", "b7b8q", 1 + 4),               # a queen promotion
    ("4k3/1P6/8/8/8/8/8/4K3 w - - 0 1", "b7b8n", 1),                   # an underpromotion: nothing more
    ("4k3/8/3p4/4n3/8/5N2/6P1/4K3 w - - 0 1", "f3e5", 1 + 2 + 1 + 4 * 3),  # an even trade: no discount
    ("4k3/8/8/3pP3/8/8/8/4K3 w - d6 0 2", "e5d6", 1 + 1 + 4 * 1),     # en passant takes a pawn from an empty square
])
def test_random_play_weighs_moves_by_hand(fen, uci, weight):
    assert positions._weight(chess.Board(fen), chess.Move.from_uci(uci), 0.5) == pytest.approx(weight)


def test_random_play_weighs_an_unsafe_capture_by_the_capture_bias():
    """Nxd6 takes a pawn the c7 pawn defends (lost, gain 1 < 3): the wide centre's 1 + 1 plus capture_bias x 1,
    then the 0.1 discount; a bishop developing from the back rank gets the same 2 as a knight."""
    board, move = chess.Board("4k3/2p5/3p4/8/4N3/8/8/4K3 w - - 0 1"), chess.Move.from_uci("e4d6")
    assert [positions._weight(board, move, bias) for bias in (0.5, 3.0)] == pytest.approx([(2 + 0.5) * 0.1,
                                                                                           (2 + 3.0) * 0.1])
    board = chess.Board("4k3/8/8/8/8/8/8/2B1K3 w - - 0 1")
    assert positions._weight(board, chess.Move.from_uci("c1e3"), 0.5) == pytest.approx(1 + 1 + 2)


class Extreme(random.Random):
    """A seeded Random whose randint always returns one end of its range (lo or hi)."""

    def __init__(self, seed, end):
        super().__init__(seed)
        self.end = end

    def randint(self, a, b):
        return b if self.end == "hi" else a


def test_random_positions_are_played_to_their_phases_ply_ranges(monkeypatch):
    """An opening is 6-16 plies and a middlegame 20-70 (the ends drawn); an endgame is played capture-happy
    (capture_bias 3) while it has 14 or more pieces, then 0-6 plain plies."""
    for end, opening, middlegame in (("lo", 6, 20), ("hi", 16, 70)):
        for seed in range(3):
            assert positions.random_position(Extreme(seed, end), "opening").ply() == opening
            assert positions.random_position(Extreme(seed, end), "middlegame").ply() == middlegame
    calls, play = [], positions.play
    monkeypatch.setattr(positions, "play", lambda board, rng, capture_bias=0.5: (
        calls.append((board.ply(), len(board.piece_map()), capture_bias)), play(board, rng, capture_bias)))
    for seed in range(6):
        calls.clear()
        board = positions.random_position(Extreme(seed, "hi"), "endgame")
        last = max(i for i, (ply, _, _) in enumerate(calls) if ply == 0)  # the attempt that was returned
        kept = calls[last:]
        plain = [pieces for _, pieces, bias in kept if bias == 0.5]
        assert all(pieces >= 14 for _, pieces, bias in kept if bias == 3.0)
        assert len(plain) == 6 and plain[0] < 14 and board.ply() == len(kept)


def test_random_play_draws_by_the_cubed_weights():
    board, drawn = chess.Board(), []

    class Spy(random.Random):
        def choices(self, population, weights):
            drawn.append((population, weights))
            return [population[0]]
    positions.play(board, Spy(0))
    moves, weights = drawn[0]
    assert weights == [positions._weight(chess.Board(), m, 0.5) ** 3 for m in moves] and len(board.move_stack) == 1


def test_generated_positions_are_distinct_and_of_their_phase_in_the_documented_mix(monkeypatch):
    """iter_positions: ~20% openings, ~60% middlegames, ~20% endgames (of 150: within 3 standard deviations), an
    endgame with fewer than 14 pieces and the others with 14 or more, no position twice (a repeat is drawn again)."""
    starts = iter(["e2e4", "e2e4", "e2e4", "d2d4", "e2e4", "g1f3"])  # a repeat drawn twice in a row is drawn again
    monkeypatch.setattr(positions, "random_position", lambda rng, phase: played(next(starts)))
    assert [fen for fen, _, _ in itertools.islice(iter_positions(0), 3)] == [played(m).fen() for m in ("e2e4", "d2d4", "g1f3")]
    monkeypatch.undo()
    drawn = list(itertools.islice(iter_positions(3), 150))
    assert list(itertools.islice(iter_positions(3), 5)) == drawn[:5]  # the same seed, the same positions
    assert len({position_key(fen) for fen, _, _ in drawn}) == 150
    for fen, _, kind in drawn:
        assert (len(chess.Board(fen).piece_map()) < 14) == (kind == "endgame")
    shares = collections.Counter(kind for _, _, kind in drawn)
    for kind, share in (("opening", 0.2), ("middlegame", 0.6), ("endgame", 0.2)):
        assert abs(shares[kind] / 150 - share) <= 3 * math.sqrt(share * (1 - share) / 150), shares


def test_mating_moves_are_every_mate_in_one_and_no_other_check():
    """Qb2-b8 and Ra1-a8 mate; Qxg7+ is a check the king answers. The mate-in-one set agrees with a naive search."""
    assert mating_moves(chess.Board("6k1/5ppp/8/8/8/8/1Q6/R5K1 w - - 0 1")) == ["a1a8", "b2b8"]
    with open(MATE_PATH) as f:
        records = [r for r in map(json.loads, f) if "fen" in r][:25]
    for r in records:
        board = chess.Board(r["fen"])
        naive = sorted(m.uci() for m in board.legal_moves if board_after_move(board, m).is_checkmate())
        assert mating_moves(board) == naive == r["mates"]


def board_after_move(board, move):
    after = board.copy(stack=False)
    after.push(move)
    return after


@pytest.mark.parametrize("fen, want", [
    (chess.STARTING_FEN, "unconstrained"),
    ("k7/8/8/8/8/8/8/r3K3 w - - 0 1", "check"),  # the rook on a1 gives check along the first rank
    ("k3r3/8/8/8/8/8/4N3/4K3 w - - 0 1", "pin"),  # the knight shields the king from the rook on e8
    ("k7/8/8/8/8/8/3r4/5K2 w - - 0 1", "king_square"),  # the rook holds e2, f2, g2; the king may go to e1 or g1
    ("k7/8/8/8/8/8/3r4/5K2 b - - 0 1", "unconstrained"),  # the same board, Black to move
])
def test_king_constraint_names_what_the_kings_safety_forbids(fen, want):
    assert king_constraint(chess.Board(fen)) == want


def test_phase_boundaries():
    """opening: the first 16 plies; after them a middlegame with 14 or more pieces, else an endgame."""
    shuffle = ["g1f3", "g8f6", "f3g1", "f6g8"] * 5
    assert [phase(board_after(shuffle[:n])) for n in (0, 16, 17)] == ["opening", "opening", "middlegame"]
    fourteen = "r3k2r/pppp4/8/8/8/8/PPPP4/R3K2R w - - 0 20"
    assert len(chess.Board(fourteen).piece_map()) == 14
    assert phase(chess.Board(fourteen)) == "middlegame"
    assert phase(chess.Board(fourteen.replace("pppp4", "ppp5"))) == "endgame"
    assert phase(chess.Board("4k3/8/8/8/8/8/4P3/4K3 w - - 0 3")) == "opening"  # ply 4: few pieces, still the opening


def test_history_buckets_by_length_edges_included():
    """An A: history of 1-2, 3-5 or 6-10 half-moves (the move included) is in that bucket; others name themselves."""
    assert [history_bucket(n) for n in range(12)] == ["0"] + ["1-2"] * 2 + ["3-5"] * 3 + ["6-10"] * 5 + ["11"]


def test_game_fens_are_every_position_of_the_game_first_and_last_included():
    assert list(game_fens(["e2e4", "e7e5"])) == [chess.STARTING_FEN, board_after(["e2e4"]).fen(),
                                                 board_after(["e2e4", "e7e5"]).fen()]


HAND_GAMES = [(ITALIAN_12, "max_plies"), (QGD_10, "max_plies")]  # they share the start only


def game_histories():
    """position_key -> [(the moves that led there, the move played there)], over HAND_GAMES by hand."""
    out = {}
    for moves, _ in HAND_GAMES:
        for i in range(len(moves)):
            out.setdefault(position_key(board_after(moves[:i]).fen()), []).append((moves[:i][-9:], moves[i]))
    return out


def test_game_transitions_are_the_moves_played_after_the_moves_that_led_there():
    """Every A: record is on a game position; a legal move is the one the game played; its history is the end of
    the moves that led there (the last 9 at most, a shorter end when cut, never an older part) and the move."""
    led = game_histories()
    for cut_rate in (0.0, 1.0):
        records = [r for seed in range(4) for r in game_env_records(HAND_GAMES, random.Random(seed), cut_rate=cut_rate)]
        assert len(records) > 30
        for fen, move, history in records:
            options = led[position_key(fen)]  # two at the start: e2e4 and d2d4 after no move
            before, played = options[0][0], {m for _, m in options}
            assert history[-1] == move and (move in played or move not in legal_ucis(fen))
            kept = history[:-1]
            assert kept == before[len(before) - len(kept):]  # an end of them, in order
            if cut_rate == 0.0:
                assert kept == before
            elif before:
                assert len(kept) < len(before)  # a cut is shorter
    # a capped draw is uniform over the games' plies, not the first plies of the first game
    capped = {f for f, _, _ in game_env_records(HAND_GAMES, random.Random(0), limit=6)}
    assert len(capped) == 6 and capped - {board_after(ITALIAN_12[:i]).fen() for i in range(6)}


SPECIAL_15 = "e2e4 d7d5 e4e5 f7f5 e5f6 b8c6 f6g7 e8f7 g7h8q g8f6 g1f3 a7a6 f1e2 a6a5 e1g1".split()  # e.p., =Q, O-O
FOOLS_MATE = "f2f3 e7e5 g2g4 d8h4".split()
LOYD_STALEMATE = ("e2e3 a7a5 d1h5 a8a6 h5a5 h7h5 h2h4 a6h6 a5c7 f7f6 c7d7 e8f7 d7b7 d8d3 b7b8 d3h7 b8c8 f7g6 "
                  "c8e6").split()


def test_special_moves_keep_their_game_history_and_next_position():
    """En passant, a promotion, castling, a mate and a stalemate in games played by hand: each A: sample of the move
    played is on the position before it, with the game's last moves as its history (the move and up to 9 before it:
    short at the start) and the position after the move as its next one; the mate and the stalemate end the game."""
    for moves in (SPECIAL_15, FOOLS_MATE, LOYD_STALEMATE):
        board = chess.Board()
        for ply, (fen, history, move) in enumerate(game_transitions(moves)):
            s = random_env_sample(fen, history, Scripted([0.5]), move=move)  # 0.5: the legal band, the move played
            assert (s.fen, s.move, s.history) == (board.fen(), moves[ply], moves[max(0, ply - 9):ply + 1])
            board.push_uci(move)
            assert s.next_fen == board.fen() and s.terminated == board.is_game_over() and not s.truncated
        assert board.is_game_over() == (moves is not SPECIAL_15)


def test_game_positions_are_drawn_over_every_ply():
    """n distinct positions drawn uniformly over the games' plies, each with the history that led there and its
    phase, not the first plies of the first game."""
    led = game_histories()
    got = game_positions(HAND_GAMES, random.Random(0), 6)
    assert len({position_key(f) for f, _, _ in got}) == 6
    for fen, history, name in got:
        assert history == led[position_key(fen)][0][0] and name == phase(chess.Board(fen))
    first = [board_after(ITALIAN_12[:i]).fen() for i in range(6)]
    assert [f for f, _, _ in got] != first and {f for f, _, _ in got} - set(first)
    # n = 0 draws none (it drew every position: --eval 0 held out all of them); excluded positions are never drawn
    assert game_positions(HAND_GAMES, random.Random(0), 0) == []
    drawn = {position_key(f) for f, _, _ in got}
    rest = game_positions(HAND_GAMES, random.Random(0), 100, exclude=drawn)
    assert len(rest) == len(led) - 6 and not drawn & {position_key(f) for f, _, _ in rest}


CHECKS_10 = ["e2e4", "d7d5", "f1b5", "c7c6", "b5c6", "b8c6", "d1h5", "g8f6", "h5f7", "e8f7"]  # checks after plies 3, 5, 9


BISHOP_H6_10 = ["d2d4", "g7g6", "g2g4", "f8h6", "d1d3", "a7a6", "e2e4", "f7f6", "h2h3", "a6a5"]  # Bh6 covers d2: Ke1-d2 forbidden after plies 4, 6, 8


def test_king_shares_draw_those_shares_by_what_the_kings_safety_forbids():
    """--king_shares: n * share (largest remainder) of the n positions of each class named, the rest among the classes not
    named, each distinct; where the games hold too few of a class, all of them and no more (n not reached)."""
    games = HAND_GAMES + [(CHECKS_10, "max_plies"), (BISHOP_H6_10, "max_plies")]
    in_check = {position_key(board_after(CHECKS_10[:i]).fen()) for i in (3, 5, 9)}
    king_square = {position_key(board_after(BISHOP_H6_10[:i]).fen()) for i in (4, 6, 8)}
    assert all(board_after(CHECKS_10[:i]).is_check() for i in (3, 5, 9))
    assert all(king_constraint(board_after(BISHOP_H6_10[:i])) == "king_square" for i in (4, 6, 8))
    for n, shares, checks, squares in ((4, {"check": 0.5}, 2, None), (6, {"check": 0.5}, 3, None),
                                       (5, {"check": 0.0}, 0, None), (2, {"check": 1.0}, 2, 0),
                                       (4, {"check": 0.25, "king_square": 0.5}, 1, 2),
                                       (4, {"king_square": 0.25, "unconstrained": 0.75}, 0, 1)):
        got = game_positions(games, random.Random(1), n, king_shares=shares)
        keys = [position_key(f) for f, _, _ in got]
        assert len(got) == n and len(set(keys)) == n
        assert sum(k in in_check for k in keys) == checks
        if squares is not None:
            assert sum(k in king_square for k in keys) == squares
        assert all(chess.Board(f).is_check() == (position_key(f) in in_check) for f, _, _ in got)
    got = game_positions(games, random.Random(1), 4, king_shares={"check": 0.375, "king_square": 0.375, "pin": 0.25})
    assert sorted(king_constraint(chess.Board(f)) for f, _, _ in got) == ["check", "check", "king_square", "pin"]
    got = game_positions(games, random.Random(1), 8, king_shares={"check": 1.0})
    assert {position_key(f) for f, _, _ in got} == in_check  # three in check is all there is
    got = game_positions(games, random.Random(1), 8, king_shares={"king_square": 0.5})
    assert len(got) == 7 and king_square <= {position_key(f) for f, _, _ in got}  # 3 of the 4 wanted, 4 others


def test_quotas_add_up_to_n_by_the_largest_remainder():
    """Rounding each share (7.5, 7.5, 15 of 30) would give 8 + 8 + 15 = 31 and the rest -1, which drew without
    limit; the largest remainder gives 8, 7, 15 and 0."""
    assert quotas(30, {"check": 0.25, "pin": 0.25, "king_square": 0.5, None: 0.0}) == {
        "check": 8, "pin": 7, "king_square": 15, None: 0}
    assert quotas(10, {"a": 0.34, "b": 0.33, None: 0.33}) == {"a": 4, "b": 3, None: 3}
    assert quotas(24000, {"check": 0.4, None: 0.6}) == {"check": 9600, None: 14400}
    assert quotas(20000, {"check": 0.2, "pin": 0.1, "king_square": 0.5, None: 0.2}) == {
        "check": 4000, "pin": 2000, "king_square": 10000, None: 4000}


@pytest.mark.parametrize("games, text, says", [(1, "checks=0.4", "not a class"), (1, "check=x", "needs a share"),
                                               (1, "check=1.5", "between 0 and 1"),
                                               (1, "pin=-0.1", "between 0 and 1"),
                                               (1, "check=0.6,pin=0.5", "add up to 1.1"),
                                               (1, "check=0.4,check=0.3", "'check' is named twice"),
                                               (1, "check=0.25,pin=0.25,king_square=0.25,unconstrained=0.15",
                                                "name every class and add up to 0.9"),
                                               (0, "check=0.4", "--king_shares draw from played games")])
def test_king_shares_flag_says_what_is_wrong(games, text, says, capsys):
    with pytest.raises(SystemExit):  # no Stockfish, so that a build the checks let through fails at once
        annotate_main(["--games", str(games), "--king_shares", text, "--stockfish_path", "/nonexistent/stockfish"])
    assert says in capsys.readouterr().err


class FakeEngine:
    """analyse() answers MultiPV lines for the first legal moves in UCI order, scored score(board, i) centipawns for
    the side to move."""

    def __init__(self, score):
        self.score = score

    def analyse(self, board, limit, multipv=1, game=None):
        moves = sorted(board.legal_moves, key=lambda m: m.uci())[:multipv]
        return [{"pv": [m], "score": chess.engine.PovScore(chess.engine.Cp(self.score(board, i)), board.turn)}
                for i, m in enumerate(moves)]


def test_engine_move_samples_near_the_best_score_for_the_side_to_move():
    """Black to move, lines scored -50, 200, 0, -400, 100 cp for Black: the best score is 200 and, at a temperature
    of 10 cp, its move is played (the next is e^-10 as likely)."""
    board = chess.Board("rnbqkbnr/pppppppp/8/8/4P3/8/PPPP1PPP/RNBQKBNR b KQkq - 0 1")
    engine = FakeEngine(lambda b, i: [-50, 200, 0, -400, 100][i])
    second = sorted(m.uci() for m in board.legal_moves)[1]
    for seed in range(20):
        move, best = engine_move(engine, board, random.Random(seed), 100, 10.0)
        assert (move.uci(), best) == (second, 200)


def test_engine_move_searches_five_lines_at_the_styles_node_budget():
    """The best of five MultiPV lines is the fifth here (400 cp against 0): at 10 cp it is played; the search is
    limited to the style's nodes."""
    board, asked = chess.Board(), []

    class Spy(FakeEngine):
        def analyse(self, board, limit, multipv=1, game=None):
            asked.append((limit.nodes, multipv))
            return super().analyse(board, limit, multipv, game)
    fifth = sorted(m.uci() for m in board.legal_moves)[4]
    move, best = engine_move(Spy(lambda b, i: [0, 0, 0, 0, 400][i]), board, random.Random(0), 300, 10.0)
    assert (move.uci(), best, asked) == (fifth, 400, [(300, 5)])


def test_game_ending_thresholds_are_those_the_shipped_games_were_played_with():
    """The shipped realistic games (mini/data/eval_games.jsonl, the games pools) were played with these since they
    were introduced: a change would make a rebuild of them another data set."""
    assert (positions.RESIGN_CP, positions.RESIGN_PLIES) == (900, 4)
    assert (positions.DRAW_CP, positions.DRAW_PLIES, positions.DRAW_FROM, positions.MAX_PLIES) == (30, 20, 120, 300)


def steady(cp):
    return FakeEngine(lambda board, i: cp)


def plain_style(monkeypatch):
    """No blunders, so that every ply after the random opening ones is an engine move; counts the opening plies."""
    monkeypatch.setattr(positions, "game_style", lambda rng: {"nodes": 100, "temperature_cp": 10.0, "blunder_rate": 0.0})
    opening, play = [], positions.play
    monkeypatch.setattr(positions, "play", lambda board, rng, *a: (opening.append(1), play(board, rng, *a)))
    return opening


def test_games_open_with_up_to_four_random_plies_and_a_blunder_replaces_the_engine_move(monkeypatch):
    """play_game opens with 0 to 4 plausible random plies (each count met in 40 games); a blunder (at the side's
    blunder_rate, here every ply) is a random ply played instead of the engine's move, never beside it."""
    opening = plain_style(monkeypatch)
    monkeypatch.setattr(positions, "MAX_PLIES", 8)
    counts = set()
    for seed in range(40):
        opening.clear()
        play_game(steady(0), random.Random(seed))
        counts.add(len(opening))
    assert counts == {0, 1, 2, 3, 4}
    monkeypatch.setattr(positions, "game_style", lambda rng: {"nodes": 100, "temperature_cp": 10.0, "blunder_rate": 1.0})

    class NoEngine:
        def analyse(self, *a, **kw):
            pytest.fail("the engine was asked for a move beside a blunder")
    opening.clear()
    moves, end = play_game(NoEngine(), random.Random(0))
    assert (len(moves), end) == (8, "max_plies") and len(opening) == 8


def test_each_side_plays_its_own_style(monkeypatch):
    """White blunders every ply and Black never (game_style is drawn for White first): the engine is asked for
    Black's moves only, every one after the opening plies."""
    opening = plain_style(monkeypatch)
    styles = iter([{"nodes": 100, "temperature_cp": 10.0, "blunder_rate": rate} for rate in (1.0, 0.0)])
    monkeypatch.setattr(positions, "game_style", lambda rng: next(styles))
    monkeypatch.setattr(positions, "MAX_PLIES", 12)
    asked = []

    class Spy(FakeEngine):
        def analyse(self, board, *a, **kw):
            asked.append(board.turn)
            return super().analyse(board, *a, **kw)
    moves, end = play_game(Spy(lambda board, i: 0), random.Random(0))
    assert (len(moves), end) == (12, "max_plies") and len(opening) + len(asked) == 12
    assert set(asked) == {chess.BLACK} and len(asked) >= 4


def test_resignation_after_four_lost_plies_in_about_half_the_games(monkeypatch):
    """A side scored beyond RESIGN_CP for RESIGN_PLIES plies in a row resigns on the 4th (3 engine moves played
    after the opening) in the games that resign, about half; the others play on to MAX_PLIES."""
    opening = plain_style(monkeypatch)
    monkeypatch.setattr(positions, "MAX_PLIES", 16)
    ends = collections.defaultdict(list)
    for cp in (1000, positions.RESIGN_CP, -positions.RESIGN_CP):  # the bound counts as lost, for either side
        for seed in range(24):
            opening.clear()
            moves, end = play_game(steady(cp), random.Random(seed))
            assert (end, len(moves)) in {("resignation", len(opening) + positions.RESIGN_PLIES - 1), ("max_plies", 16)}
            ends[cp].append(end)
    assert ends[1000] == ends[positions.RESIGN_CP] == ends[-positions.RESIGN_CP]
    assert 6 <= ends[1000].count("resignation") <= 18
    for seed in range(24):  # a playable ply every third breaks the run: nobody resigns
        moves, end = play_game(FakeEngine(lambda board, i: 0 if board.ply() % 3 == 0 else 1000), random.Random(seed))
        assert (end, len(moves)) == ("max_plies", 16)


def test_agreed_draw_after_draw_plies_level_plies_from_draw_from(monkeypatch):
    """A level game (|score| <= DRAW_CP) is agreed drawn on its DRAW_PLIES-th level ply counted from ply DRAW_FROM;
    a lost one (a score of -1000 for the side to move) never is."""
    plain_style(monkeypatch)
    monkeypatch.setattr(positions, "DRAW_FROM", 10)
    for seed, cp in itertools.product(range(4), (0, positions.DRAW_CP, -positions.DRAW_CP)):  # the bound is level
        moves, end = play_game(steady(cp), random.Random(seed))
        assert (end, len(moves)) == ("agreed_draw", 10 + positions.DRAW_PLIES - 1)
    monkeypatch.setattr(positions, "MAX_PLIES", 10 + positions.DRAW_PLIES + 4)
    for seed in range(8):  # a lost game is not level, for either side: it is resigned or played on
        for cp in (-1000, 1000):
            assert play_game(steady(cp), random.Random(seed))[1] in ("resignation", "max_plies")


class ShuttleEngine:
    """analyse() answers one line: the knights out and back (Ng1-f3-g1, Ng8-f6-g8), level."""

    def analyse(self, board, limit, multipv=1, game=None):
        move = next(chess.Move.from_uci(u) for u in ("g1f3", "f3g1", "g8f6", "f6g8")
                    if chess.Move.from_uci(u) in board.legal_moves)
        return [{"pv": [move], "score": chess.engine.PovScore(chess.engine.Cp(0), board.turn)}]


def test_a_game_ends_where_a_repetition_can_be_claimed(monkeypatch):
    """Knights out and back from the initial position: after 7 plies Black's next move would make the start
    position's third occurrence, a draw a side can claim, which ends the game there (not at the fivefold
    repetition of ply 16 that python-chess ends on its own)."""
    plain_style(monkeypatch)
    monkeypatch.setattr(positions, "play", lambda board, rng, *a: None)  # no random opening plies
    moves, end = play_game(ShuttleEngine(), random.Random(0))
    assert (end, moves) == ("threefold_repetition", ["g1f3", "g8f6", "f3g1", "f6g8", "g1f3", "g8f6", "f3g1"])


def test_a_game_stops_at_max_plies(monkeypatch):
    plain_style(monkeypatch)
    monkeypatch.setattr(positions, "MAX_PLIES", 12)
    for seed in range(4):
        moves, end = play_game(steady(300), random.Random(seed))
        assert (end, len(moves)) == ("max_plies", 12)
        board_after(moves)  # legal


def test_game_styles_span_their_documented_ranges():
    """Nodes 100, 300 or 1000; softmax temperature log-uniform over 10-150 cp; blunder rate 0-8%."""
    styles = [game_style(random.Random(i)) for i in range(300)]
    assert {s["nodes"] for s in styles} == {100, 300, 1000}
    temps, rates = [s["temperature_cp"] for s in styles], [s["blunder_rate"] for s in styles]
    assert 10 <= min(temps) < 12 and 130 < max(temps) <= 150 and 0 <= min(rates) < 0.005 and 0.075 < max(rates) <= 0.08
    assert 0.4 < sum(t < math.sqrt(10 * 150) for t in temps) / 300 < 0.6  # log-uniform: half below the geometric mean


if __name__ == "__main__":
    import sys
    sys.exit(pytest.main([__file__, "-q"]))
