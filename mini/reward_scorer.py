"""
Verifiable rewards for RookWorld completions: Stockfish labels for P:, python-chess for A:.

A completion that does not parse scores -0.3; one that parses scores 0.2 + 0.8 * raw, raw in [0, 1] a
weighted sum of named components (P: best move by rank, candidates, evals; A: next FEN exact and similar,
reward, terminated, truncated). p_reward="engine" scores the best move on Lichess's win-probability scale
with Stockfish judging moves outside the labels (move_quality); shaping="graduated" floors raw to quarters;
shaping="strict" scores a P: answer whose best move cannot be played as an unparseable one (-0.3), where
the continuous reward gives it up to 0.6 for its candidates and evals.
The full specification, with its weights and a table of engine scores, is in the README.
"""
import math
import multiprocessing
import multiprocessing.connection
import os
import sys
import threading
from dataclasses import dataclass, replace

from mini.formats import legal_ucis, parse_env, parse_policy
from mini.stockfish import CP_CAP, MATE_CP, Annotator, cp_loss, find_stockfish

INVALID = -0.3
GRADUATED = (0.2, 0.4, 0.6, 0.8, 1.0)
BEST_BY_RANK = (1.0, 0.5, 0.35, 0.25, 0.15)
LEGAL_BEST, ILLEGAL_PENALTY, EVAL_CLIP = 0.05, 0.5, 10.0
# integer weights over their sum: all components at 1.0 give raw == 1.0 exactly
P_WEIGHTS = {"best": 5, "candidates": 3, "evals": 2}
WIN_K = 0.00368208  # Lichess's win% = 50 + 50 * (2 / (1 + exp(-WIN_K * cp)) - 1), i.e. W = 1 / (1 + exp(-WIN_K * cp))
A_WEIGHTS = {"fen_exact": 4, "fen_similarity": 2, "reward_exact": 2, "terminated_exact": 1, "truncated_exact": 1}


def label_rank(true_evals, move):
    """A labelled move's rank by eval (side to move's view; 0 = the top eval, Stockfish's PV1 for both colours,
    never a text line's B: label, which with Black to move is the weakest): how many labelled moves are strictly
    better. Equal evals share the better rank, so every mate in one of a position, or every drawing move, is best."""
    return sum(e > true_evals[move] for e in true_evals.values())


def levenshtein(a, b):
    while a and b and a[0] == b[0]:  # common ends cost nothing: FENs mostly differ in a few ranks
        a, b = a[1:], b[1:]
    while a and b and a[-1] == b[-1]:
        a, b = a[:-1], b[:-1]
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def clip(x, bound=EVAL_CLIP):
    """x clipped to [-bound, bound]; by default the eval clip, so a mate (+-999.x) cannot swamp an error."""
    return max(-bound, min(bound, x))


def policy_components(sample, completion):
    moves, evals, best = parse_policy(completion)
    true_evals = dict(zip(sample.moves, sample.evals))
    legal = legal_ucis(sample.fen)
    named = dict(zip(moves, evals))  # a repeated move counts once (its last eval)
    if best in true_evals:
        best_score = BEST_BY_RANK[min(label_rank(true_evals, best), len(BEST_BY_RANK) - 1)]
    else:
        best_score = LEGAL_BEST if best in legal else 0.0
    hits = [m for m in named if m in true_evals]
    illegal = sum(m not in legal for m in named)
    errors = [abs(clip(named[m]) - clip(true_evals[m])) for m in hits]
    return {
        "best": best_score,
        "best_legal": float(best in legal),
        "candidates": max(0.0, min(1.0, (len(hits) - ILLEGAL_PENALTY * illegal) / max(len(true_evals), 1))),
        "evals": sum(1 / (1 + e) for e in errors) / len(errors) if errors else 0.0,
    }


def env_components(sample, completion):
    fen, reward, terminated, truncated = parse_env(completion)
    longest = max(len(fen), len(sample.next_fen), 1)
    return {
        "fen_exact": float(fen == sample.next_fen),
        "fen_similarity": 1.0 - levenshtein(fen, sample.next_fen) / longest,
        "reward_exact": float(math.isclose(reward, sample.reward, abs_tol=1e-9)),
        "terminated_exact": float(terminated == sample.terminated),
        "truncated_exact": float(truncated == sample.truncated),
    }


def score(sample, completion, shaping="continuous", best=None):
    """(reward, components by name) of one completion (the text after the prompt). Never raises on the
    completion; components of an unparseable one are 0. best, when given, replaces the P: best component
    of a parseable completion (the engine move reward, see move_quality)."""
    policy = sample.task == "P"
    weights = P_WEIGHTS if policy else A_WEIGHTS
    try:
        comps = (policy_components if policy else env_components)(sample, completion)
    except ValueError:  # the parsers' one way of saying "malformed"
        comps = {k: 0.0 for k in weights} | ({"best_legal": 0.0} if policy else {})
        return INVALID, {"format_valid": 0.0, **comps, "raw": 0.0}
    if policy and best is not None:
        comps["best"] = best
    raw = sum(w * comps[k] for k, w in weights.items()) / sum(weights.values())
    if shaping == "strict" and policy and not comps["best_legal"]:
        return INVALID, {"format_valid": 1.0, **comps, "raw": raw}
    reward = GRADUATED[int(raw * 4 + 1e-9)] if shaping == "graduated" else 0.2 + 0.8 * raw  # floor: 1.0 = perfect
    return reward, {"format_valid": 1.0, **comps, "raw": raw}


# ----------------------------------------------------------------------------- engine move reward

def win_prob(cp):
    """Expected score in [0, 1] of the side to move at an eval of cp centipawns (WIN_K above). A mate
    (|cp| > MATE_CP - 1000: to_cp's +-(100000 - n), the labels' +-(1000 - n/100) pawns * 100) is exactly
    1 or 0; other evals are clipped to +-CP_CAP first, as the eval component clips at 10 pawns."""
    if abs(cp) > MATE_CP - 1000:
        return 1.0 if cp > 0 else 0.0
    return 1 / (1 + math.exp(-WIN_K * max(-CP_CAP, min(CP_CAP, cp))))


def move_score(best_cp, move_cp):
    """W(move) / W(best) in [0, 1]: the share of the best move's expected score that the move keeps.
    A move the engine finds better than the labelled best (another depth) scores 1; when the best
    is mated (W = 0) every legal move has lost already and scores 1."""
    w_best = win_prob(best_cp)
    return 1.0 if w_best == 0 else min(1.0, win_prob(move_cp) / w_best)


def label_cp(pawns):
    return round(pawns * 100)  # 999.97 pawns (mate in 3) -> 99997 cp, to_cp's convention


def move_quality(sample, move, cp_after=None):
    """The one judgement of a P: move that the engine reward and evaluate.py share: {"score":
    move_score, "cpl": centipawn loss in [0, CP_CAP], "winprob_loss": W(best) - W(move) in [0, 1]}
    against the best labelled eval. A labelled (top 5) move takes its labelled eval; another legal move
    takes cp_after (Annotator.evals_after: the eval after the move, mover's view); an illegal move or
    None scores 0, loses CP_CAP and all of W(best). None when a legal unlabelled move has no cp_after
    (the engine rejected the position): the caller falls back to the labels' judgement."""
    if not sample.evals:
        return None
    best_cp, labelled = label_cp(max(sample.evals)), dict(zip(sample.moves, sample.evals))
    if move in labelled:
        move_cp = label_cp(labelled[move])
    elif move in legal_ucis(sample.fen):
        if cp_after is None:
            return None
        move_cp = cp_after
    else:
        return {"score": 0.0, "cpl": CP_CAP, "winprob_loss": win_prob(best_cp)}
    return {"score": move_score(best_cp, move_cp), "cpl": cp_loss(best_cp, move_cp),
            "winprob_loss": max(0.0, win_prob(best_cp) - win_prob(move_cp))}


def best_move(sample, completion):
    """The B: move of a parseable P: completion, else None."""
    if sample.task != "P":
        return None
    try:
        return parse_policy(completion)[2]
    except ValueError:
        return None


def engine_pairs(samples, moves):
    """The (fen, move) pairs only the engine can judge: legal moves outside the labelled top 5."""
    return [(s.fen, m) for s, m in zip(samples, moves)
            if m is not None and m not in s.moves and m in legal_ucis(s.fen)]


def judge_moves(engine, samples, completions):
    """(B: move or None, move_quality or None) of each completion, for P: samples: each distinct unlabelled
    legal move is looked up once (Annotator.evals_after, cached)."""
    moves = [best_move(s, c) for s, c in zip(samples, completions)]
    cps = engine.annotator().evals_after(engine_pairs(samples, moves))
    return [(m, move_quality(s, m, cps.get((s.fen, m))) if s.task == "P" else None) for s, m in zip(samples, moves)]


@dataclass(frozen=True)
class EngineReward:
    """The settings of --p_reward engine: picklable, so that a spawned scoring worker starts its own
    engines (annotator()) with the same limit and cache file."""
    stockfish_path: str
    depth: int = 10
    nodes: int = 0
    cache_path: str = ""
    engines: int = 0  # Stockfish processes of one scoring process (0: one per core)

    def annotator(self):
        """This process's Annotator for these settings, started on first use, closed at exit."""
        if self not in _ANNOTATORS:
            if not _ANNOTATORS:  # python-chess's engine threads are not daemons: close them before the
                threading._register_atexit(close_engines)  # interpreter joins threads (atexit runs after that)
            _ANNOTATORS[self] = Annotator(self.stockfish_path, depth=self.depth, nodes=self.nodes or None,
                                          workers=self.engines or None, cache_path="", multipv=1,
                                          move_cache_path=self.cache_path)
        return _ANNOTATORS[self]


_ANNOTATORS = {}


def close_engines():
    while _ANNOTATORS:
        _ANNOTATORS.popitem()[1].close()


def engine_reward(cfg):
    """EngineReward for cfg.p_reward == "engine" (None for "labels"); raises FileNotFoundError in one
    sentence when Stockfish is missing, so that a run fails at start, not at its first step."""
    if cfg.p_reward != "engine":
        return None
    try:
        path = find_stockfish(cfg.stockfish_path)
    except FileNotFoundError as e:
        raise FileNotFoundError(str(e).replace("Stockfish not found", "--p_reward engine needs Stockfish, which was not found", 1)) from None
    return EngineReward(path, cfg.engine_depth, cfg.engine_nodes, cfg.engine_cache)


def score_chunk(samples, completions, shaping="continuous", engine=None):
    """(score() of each pair, engine counters {hits, misses, rejected, seconds} of this call). With an
    EngineReward the best component of a P: completion is move_quality's score: each distinct unlabelled
    legal move is searched once (cached across calls), a rejected position keeps the labels' score."""
    if engine is None:
        return [score(s, c, shaping) for s, c in zip(samples, completions)], {}
    ann = engine.annotator()
    before = dict(ann.stats)
    out = [score(s, c, shaping, best=None if m is None or q is None else q["score"])
           for s, c, (m, q) in zip(samples, completions, judge_moves(engine, samples, completions))]
    return out, {k: ann.stats[k] - before[k] for k in before}


def score_batch(samples, completions, shaping="continuous", engine=None):
    """score() over pairs; a plain top-level function so that a process pool can run chunks of it."""
    return score_chunk(samples, completions, shaping, engine)[0]


def engine_metrics(counters):
    """Per-batch metrics of the engine reward from score_chunk's counters ({} in labels mode):
    engine_lookups (distinct unlabelled moves), engine_cache_hit_rate (share answered by the cache;
    1.0 when there was nothing to look up), engine_seconds (engine time summed over processes and
    threads) and engine_rejected (positions scored by the labels instead)."""
    counters = [c for c in counters if c]
    if not counters:
        return {}
    total = {k: sum(c[k] for c in counters) for k in counters[0]}
    lookups = total["hits"] + total["misses"]
    return {"engine_lookups": lookups, "engine_cache_hit_rate": total["hits"] / lookups if lookups else 1.0,
            "engine_seconds": total["seconds"], "engine_rejected": total["rejected"]}


def group_chunks(samples, parts):
    """Start indices of about `parts` equal chunks that never split a run of one prompt (a group), so
    that the group's repeated moves are searched once."""
    n, starts = -(-len(samples) // parts), [0]
    while starts[-1] + n < len(samples):
        i = starts[-1] + n
        while i < len(samples) and samples[i].prompt == samples[i - 1].prompt:
            i += 1
        if i == len(samples):
            break
        starts.append(i)
    return starts


def detached_worker():
    """A scoring worker's start: it leaves the caller's process group, so that a SIGTERM or Ctrl-C sent to the
    group (`timeout`, a terminal) reaches the trainer alone, which finishes its step on the pool, saves and
    closes it; and it exits when the trainer ends by a kill -9 or the OOM killer, which close nothing (its
    Stockfish engines then see their input close and quit). The parent's sentinel is ready once the parent has
    gone, also when it went while this worker was still starting."""
    os.setpgrp()
    parent = multiprocessing.parent_process()

    def watch():
        multiprocessing.connection.wait([parent.sentinel])
        os._exit(0)
    if parent is not None:
        threading.Thread(target=watch, daemon=True, name="parent-watch").start()


class ScoringPool:
    """Scores a rollout in worker processes while the caller goes on (the GPU computes reference
    log-probs meanwhile); with workers = 0 it scores in this process. submit() returns a function
    that waits for the (reward, components) list, in order; take_metrics() then gives the engine_metrics of
    every batch waited for since it was last called (one step's, however many rounds dynamic sampling drew).
    engine: an EngineReward for --p_reward engine (engine_reward(cfg)), None for labels."""

    def __init__(self, workers, shaping="continuous", engine=None):
        self.shaping, self.workers, self.counters = shaping, workers, []
        if engine is not None and not engine.engines:  # share the cores among the scoring processes
            engine = replace(engine, engines=max(1, (os.cpu_count() or 1) // max(1, workers)))
        self.engine, self.pool = engine, self.new_pool() if workers > 0 else None

    def new_pool(self):
        from concurrent.futures import ProcessPoolExecutor
        from multiprocessing import get_context
        # spawn: forking a process that holds CUDA state is unsafe
        return ProcessPoolExecutor(self.workers, mp_context=get_context("spawn"), initializer=detached_worker)

    def submit(self, samples, completions):
        if self.pool is None:
            done = [score_chunk(samples, completions, self.shaping, self.engine)]
            collect = lambda: done
        else:
            from concurrent.futures.process import BrokenProcessPool
            from mini.runtime import caller_script_hidden  # here: the workers import this module, and need no torch
            bounds = group_chunks(samples, self.workers) + [len(samples)]
            try:
                with caller_script_hidden():  # submit spawns the workers, which would run an unguarded script again
                    futures = [self.pool.submit(score_chunk, samples[a:b], completions[a:b], self.shaping, self.engine)
                               for a, b in zip(bounds, bounds[1:])]
            except BrokenProcessPool:  # a worker died since the last batch
                futures = None

            def collect():
                try:
                    if futures is not None:
                        return [f.result() for f in futures]
                except BrokenProcessPool:  # a worker died on this batch (the OOM killer, a stray kill)
                    pass
                print("a scoring worker died: this batch is scored in the trainer's process (the same rewards), "
                      "and the workers are started again", file=sys.stderr)
                self.pool.shutdown(cancel_futures=True)
                self.pool = self.new_pool()
                return [score_chunk(samples, completions, self.shaping, self.engine)]

        def wait():
            parts = collect()
            self.counters += [counters for _, counters in parts]
            return [x for scores, _ in parts for x in scores]
        return wait

    def take_metrics(self):
        metrics, self.counters = engine_metrics(self.counters), []
        return metrics

    def close(self):
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
        if self.engine is not None:
            close_engines()
