"""
On-policy training positions (--data_source selfplay): games the current policy plays against itself,
each position it meets labelled by Stockfish in the background, mixed with the shipped pool.

    pool = TaskSampler(load_jsonl(POOL_PATH), env_ratio=0.2, seed=0)
    source = SelfPlaySource(tok, pool, games=16, plies=8, mix=0.5, depth=10, workers=2, seed=0)
    for step in range(steps):
        if step % refresh == 0:
            source.refresh(model)          # plays 8 half-moves of 16 games on the model's device
        samples = source.draw(8)           # P: and A: Samples; pool ones with probability 1 - mix
    source.close()

Games: `games` boards advance together through chess_eval's self-play (model_player sampling at
`temperature`/`top_k`, one batched call per half-move, chess_eval.policy_turn's rules: a game ends by the
rules, at an illegal or unparseable move, or after max_plies half-moves) and are restarted from
chess_eval.game_start in turn when they end. Each refresh plays `plies` half-moves with the weights of
that moment, so the cost of a refresh is fixed whatever the game lengths.

Positions: every position the policy was asked to move in becomes a P: sample once Stockfish has
labelled it (annotate.Annotator, MultiPV 5 at `depth`, `workers` engine processes, its append-only JSONL
cache keyed by FEN and limit: a resumed or repeated run searches nothing twice). Every UCI move the
policy tried, legal or not, becomes an A: sample (formats.env_sample of fen, move, history). Both are
kept in windows of the last `capacity` distinct entries (position_key; (position_key, move) for moves),
so an opening that every game passes through weighs as much as any other position. Held-out positions
(eval.jsonl, mate_in_one.jsonl, `exclude`) never enter, nor A: transitions that lead to one.

Determinism (exact resume): a refresh's positions are searched in a background thread while training
goes on and become drawable at the next refresh (or at the first draw that finds no labelled position,
which then waits), never "whenever Stockfish is done"; the player of refresh r is seeded by (seed, r).
state_dict() holds games, windows, positions waiting for labels and the RNG, in plain types; the pool
sampler's RNG is the caller's to save (train.py saves it already).

Cost (2 busy CPU cores): Stockfish depth 10 MultiPV 5 takes ~0.2 s a position on one worker, ~12 ms of it
Python in this process (python-chess reading the engine), so a refresh of 16 games x 8 half-moves (<= 128
new positions) needs ~26 engine-seconds, hidden behind training when refresh * step time exceeds
26 s / workers. Threads suffice to drive the engines: the search runs in the engines' own processes.
"""
import random
import time
from collections import OrderedDict

import chess

from mini.annotate import DEFAULT_CACHE, Annotator
from mini.chess_eval import game_start, half_move, model_player, opening_board
from mini.dataset import held_out_keys
from mini.formats import env_sample, policy_sample, position_key


class SelfPlaySource:
    def __init__(self, tok, pool=None, games=16, plies=8, max_plies=200, temperature=1.0, top_k=0, max_new_tokens=96,
                 mix=0.5, env_ratio=0.2, capacity=1024, depth=10, workers=1, cache_path=DEFAULT_CACHE,
                 stockfish_path="", seed=0, exclude=(), player=None):
        # first, so that a missing Stockfish is one sentence before anything else starts
        self.ann = Annotator(stockfish_path, depth=depth, workers=workers, cache_path=cache_path, multipv=5)
        self.pool, self.plies, self.max_plies = pool, plies, max_plies
        self.mix, self.env_ratio, self.capacity, self.seed = mix, env_ratio, capacity, seed
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
                out.append(policy_sample(fen, moves, evals, history=history))
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
