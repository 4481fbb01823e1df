"""On-policy training positions (--data_source selfplay): the current policy plays games against itself
(mini/games.py), Stockfish labels each position it meets in the background, and draws mix them with the pool:
P: samples of the positions, A: samples of every UCI move it tried. Labels become drawable at the next refresh,
never "whenever Stockfish is done", so a resumed run repeats exactly. Details and costs: the README.

    source = SelfPlaySource(tok, PoolSource(load_jsonl(POOL_PATH), env_ratio=0.2, seed=0), games=16, plies=8)
    source.refresh(model)    # every refresh steps: 8 half-moves of 16 games
    samples = source.draw(8)
"""
import random
import time
from collections import OrderedDict

import chess

from mini.dataset import held_out_keys, pad_policy
from mini.formats import env_sample, policy_sample, position_key
from mini.games import game_start, half_move, model_player, opening_board
from mini.stockfish import DEFAULT_CACHE, Annotator


class SelfPlaySource:
    def __init__(self, tok, pool=None, games=16, plies=8, max_plies=200, temperature=1.0, top_k=0, max_new_tokens=96,
                 mix=0.5, env_ratio=0.2, capacity=1024, depth=10, workers=1, cache_path=DEFAULT_CACHE,
                 stockfish_path="", seed=0, exclude=(), player=None, pads=(90,)):
        # first, so that a missing Stockfish is one sentence before anything else starts
        self.ann = Annotator(stockfish_path, depth=depth, workers=workers, cache_path=cache_path, multipv=5)
        self.pool, self.plies, self.max_plies = pool, plies, max_plies
        self.mix, self.env_ratio, self.capacity, self.seed = mix, env_ratio, capacity, seed
        self.pads = pads  # P: prompts' FEN widths (--policy_pad), as the pool's
        # player(model, seed, autocast) -> (prompts -> completion texts); tests plug in scripted ones
        self.player = player or (lambda model, seed, autocast=None: model_player(
            model, tok, temperature, top_k, seed, max_new_tokens, autocast=autocast))
        self.held_out = held_out_keys() | {position_key(f) for f in exclude}
        self.rng, self.refreshes, self.started = random.Random(seed), 0, 0
        self.boards, self.games = [], []
        for _ in range(games):
            self._new_game()
        self.positions = OrderedDict()  # position_key -> (fen, history, moves, evals), drawable
        self.moves = OrderedDict()      # (position_key, move) -> (fen, move, history), drawable
        self.pending, self.futures = [], []  # [(fen, history)] being labelled, and the chunks' futures
        self.metrics = {}

    # ------------------------------------------------------------------------- games

    def _new_game(self, i=None):
        start, self.started = game_start(self.started), self.started + 1
        board, game = opening_board(start), {"start": start, "plies": 0, "end": None, "transitions": []}
        if i is None:
            self.boards.append(board)
            self.games.append(game)
        else:
            self.boards[i], self.games[i] = board, game

    def refresh(self, model, autocast=None):
        """Play `plies` half-moves of every game with the model's current weights (on this thread: it needs
        the model), make the previous refresh's labelled positions drawable, send this one's to Stockfish."""
        t0, self.metrics["selfplay_wait_s"] = time.perf_counter(), 0.0  # waits from here to the next refresh
        player = self.player(model, self.seed * 1_000_003 + self.refreshes, autocast)  # a resumed run replays it
        self.refreshes += 1
        new = []
        for _ in range(self.plies):
            new += [(b.fen(), [m.uci() for m in b.move_stack[-9:]]) for b in self.boards]  # asked to move here
            half_move(player, self.boards, self.games, self.max_plies)
            for i, g in enumerate(self.games):
                for fen, move, history in g["transitions"]:
                    s = env_sample(fen, move, history)
                    if self._clean(fen, s.next_fen) and (position_key(fen), move) not in self.moves:
                        self._keep(self.moves, (position_key(fen), move), (fen, move, history))
                g["transitions"] = []
                if g["end"] is not None:
                    self._new_game(i)
        play_s = time.perf_counter() - t0
        self._promote()  # usually done already: it had a whole refresh interval of training to run
        todo, seen = [], set(self.positions)
        for fen, history in new:
            key = position_key(fen)
            if self._clean(fen) and key not in seen:  # a position already drawable or met twice is labelled once
                seen.add(key)
                todo.append((fen, history))
        searched = sum(f not in self.ann.cache for f, _ in todo)
        self._submit(todo)
        self.metrics.update(selfplay_play_s=play_s, selfplay_new=len(todo), selfplay_searched=searched)

    def _clean(self, *fens):
        return not any(position_key(f) in self.held_out for f in fens)

    def _keep(self, window, key, value):
        window[key] = value
        if len(window) > self.capacity:
            window.popitem(last=False)  # oldest out: the window follows the current policy

    # ------------------------------------------------------------------------- Stockfish in the background

    def _submit(self, todo):
        self.pending = list(todo)
        self.futures = self.ann.submit([f for f, _ in todo])

    def _promote(self):
        """Labelled positions of the last refresh -> drawable (waits for Stockfish if it is not done)."""
        t0 = time.perf_counter()
        labels = {}
        for f in dict.fromkeys(self.futures):  # one future per chunk of FENs
            labels.update(f.result())
        self.metrics["selfplay_wait_s"] = self.metrics.get("selfplay_wait_s", 0.0) + time.perf_counter() - t0
        for fen, history in self.pending:
            self._keep(self.positions, position_key(fen), (fen, history, *labels[fen]))
        self.pending, self.futures = [], []

    # ------------------------------------------------------------------------- samples

    def draw(self, n):
        """n Samples: from the pool with probability 1 - mix, else a self-play A: move with probability
        env_ratio, else a labelled self-play position. Waits for Stockfish only when no position is labelled."""
        out = []
        for _ in range(n):
            if self.pool is not None and self.rng.random() >= self.mix:
                out += self.pool.draw(1)
                continue
            if not self.positions and self.pending:
                self._promote()
            if self.moves and self.rng.random() < self.env_ratio:
                out.append(env_sample(*self.rng.choice(list(self.moves.values()))))
            elif self.positions:
                fen, history, moves, evals = self.rng.choice(list(self.positions.values()))
                out.append(pad_policy(policy_sample(fen, moves, evals, history=history), self.pads, self.rng))
            elif self.pool is not None:  # no self-play yet (no refresh, or everything held out)
                out += self.pool.draw(1)
            else:
                raise ValueError("no self-play position yet: call refresh(model) before draw()")
        self.metrics.update(selfplay_positions=len(self.positions), selfplay_transitions=len(self.moves))
        return out

    # ------------------------------------------------------------------------- checkpoints

    def state_dict(self):
        """Plain types only (checkpoints load with torch.load(weights_only=True))."""
        games = [[g["start"], g["plies"], [m.uci() for m in b.move_stack]] for b, g in zip(self.boards, self.games)]
        return {"games": games, "started": self.started, "refreshes": self.refreshes, "rng": self.rng.getstate(),
                "positions": [list(v) for v in self.positions.values()],
                "moves": [list(v) for v in self.moves.values()], "pending": [list(p) for p in self.pending]}

    def load_state_dict(self, s):
        self.boards, self.games = [], []
        for start, plies, moves in s["games"]:
            board = chess.Board()
            for m in moves:
                board.push_uci(m)
            self.boards.append(board)
            self.games.append({"start": start, "plies": plies, "end": None, "transitions": []})
        self.started, self.refreshes = s["started"], s["refreshes"]
        self.rng.setstate(tuple(tuple(x) if isinstance(x, list) else x for x in s["rng"]))
        self.positions = OrderedDict((position_key(p[0]), tuple(p)) for p in s["positions"])
        self.moves = OrderedDict(((position_key(f), m), (f, m, h)) for f, m, h in s["moves"])
        self._submit([tuple(p) for p in s["pending"]])  # searched again, or found in the cache

    def close(self):
        self.ann.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
