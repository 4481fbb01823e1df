"""
Verifiable rewards for RookWorld completions: Stockfish labels for P:, python-chess for A:.

Two tiers. Structure: a completion that does not parse (P: "M: <1-5 UCI moves> E: <as many numbers>
B: <one move>"; A: four "+" fields, a FEN python-chess accepts, a number, two 0/1 flags) scores -0.3.
Content: named components in [0, 1] combine into raw in [0, 1]; reward = 0.2 + 0.8 * raw, so a
parseable completion scores 0.2 at least and a perfect one exactly 1.0.

P: raw = 0.5 best + 0.3 candidates + 0.2 evals
   best        1.0 for the best move, then by rank in the top 5 (0.5, 0.35, 0.25, 0.15), 0.05 for another
               legal move, 0 for an illegal one
   candidates  (named moves in the top 5 - 0.5 * named illegal moves) / size of the top 5, in [0, 1];
               matched by move (M:/E: order carries no rank), repeats count once
   evals       mean of 1 / (1 + |error in pawns|) over named moves in the top 5, both evals clipped to
               +-10 pawns first so that a mate (+-999.x) cannot swamp it; 0 when none is in the top 5
   The ranking is [sample.best] + the other labelled moves by eval. For shipped data best is Stockfish's
   PV1. For a RookWorld text line it is the line's B: label (for Black the generator's weakest move, see
   mini/formats.py), so that a line's own completion scores exactly 1.0 against its own labels.
A: raw = 0.4 fen_exact + 0.2 fen_similarity + 0.2 reward_exact + 0.1 terminated_exact + 0.1 truncated_exact
   fen_similarity is 1 - normalized Levenshtein distance.

shaping="graduated" floors raw to quarters, so rewards are 0.2, 0.4, 0.6, 0.8 or 1.0 (-0.3 stays);
the components keep the unquantised raw.
"""
import math

from mini.formats import legal_ucis, parse_env, parse_policy

INVALID = -0.3
GRADUATED = (0.2, 0.4, 0.6, 0.8, 1.0)
BEST_BY_RANK = (1.0, 0.5, 0.35, 0.25, 0.15)
LEGAL_BEST, ILLEGAL_PENALTY, EVAL_CLIP = 0.05, 0.5, 10.0
# integer weights over their sum: all components at 1.0 give raw == 1.0 exactly
P_WEIGHTS = {"best": 5, "candidates": 3, "evals": 2}
A_WEIGHTS = {"fen_exact": 4, "fen_similarity": 2, "reward_exact": 2, "terminated_exact": 1, "truncated_exact": 1}


def ranking(sample):
    """Labelled moves best first: the sample's best, then the rest by eval (side to move's view)."""
    others = sorted((p for p in zip(sample.moves, sample.evals) if p[0] != sample.best), key=lambda p: -p[1])
    return [sample.best] + [m for m, _ in others], dict(zip(sample.moves, sample.evals))


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
    ranked, true_evals = ranking(sample)
    legal = legal_ucis(sample.fen)
    named = dict(zip(moves, evals))  # a repeated move counts once (its last eval)
    if best in ranked:
        best_score = BEST_BY_RANK[min(ranked.index(best), len(BEST_BY_RANK) - 1)]
    else:
        best_score = LEGAL_BEST if best in legal else 0.0
    hits = [m for m in named if m in true_evals]
    illegal = sum(m not in legal for m in named)
    errors = [abs(clip(named[m]) - clip(true_evals[m])) for m in hits]
    return {
        "best": best_score,
        "best_legal": float(best in legal),
        "candidates": max(0.0, min(1.0, (len(hits) - ILLEGAL_PENALTY * illegal) / max(len(ranked), 1))),
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


def score(sample, completion, shaping="continuous"):
    """(reward, components by name) of one completion (the text after the prompt). Never raises on the
    completion; components of an unparseable one are 0."""
    policy = sample.task == "P"
    weights = P_WEIGHTS if policy else A_WEIGHTS
    try:
        comps = (policy_components if policy else env_components)(sample, completion)
    except ValueError:  # the parsers' one way of saying "malformed"
        comps = {k: 0.0 for k in weights} | ({"best_legal": 0.0} if policy else {})
        return INVALID, {"format_valid": 0.0, **comps, "raw": 0.0}
    raw = sum(w * comps[k] for k, w in weights.items()) / sum(weights.values())
    reward = GRADUATED[int(raw * 4 + 1e-9)] if shaping == "graduated" else 0.2 + 0.8 * raw  # floor: 1.0 = perfect
    return reward, {"format_valid": 1.0, **comps, "raw": raw}


def score_batch(samples, completions, shaping="continuous"):
    """score() over pairs; a plain top-level function so that a process pool can run chunks of it."""
    return [score(s, c, shaping) for s, c in zip(samples, completions)]


class ScoringPool:
    """Scores a rollout in worker processes while the caller goes on (the GPU computes reference
    log-probs meanwhile); with workers = 0 it scores in this process. submit() returns a function
    that waits for the (reward, components) list, in order."""

    def __init__(self, workers, shaping="continuous"):
        self.shaping, self.workers = shaping, workers
        self.pool = None
        if workers > 0:  # spawn: forking a process that holds CUDA state is unsafe
            from concurrent.futures import ProcessPoolExecutor
            from multiprocessing import get_context
            self.pool = ProcessPoolExecutor(workers, mp_context=get_context("spawn"))

    def submit(self, samples, completions):
        if self.pool is None:
            result = score_batch(samples, completions, self.shaping)
            return lambda: result
        n = -(-len(samples) // self.workers)  # one chunk per worker
        futures = [self.pool.submit(score_batch, samples[i:i + n], completions[i:i + n], self.shaping)
                   for i in range(0, len(samples), n)]
        return lambda: [x for f in futures for x in f.result()]

    def close(self):
        if self.pool is not None:
            self.pool.shutdown(cancel_futures=True)
