"""
Reward scoring throughput, completions per second on one core, for P: and A:.

    python mini/bench_scoring.py

Completions are realistic: the reference, mutated ones (other best move, illegal candidate, shifted evals,
wrong FEN character, FEN not updated, wrong flags, cut short) and garbage, in equal shares, on the shipped eval positions.
"""
import random
import time

from mini.dataset import EVAL_PATH, legal_ucis, load_jsonl, random_env_sample
from mini.reward_scorer import score_batch


def policy_variants(s, rng):
    ref = s.completion
    other = rng.choice(sorted(legal_ucis(s.fen)))
    return [ref,
            ref.replace("B: " + s.best, "B: " + other),
            ref.replace(s.moves[-1], "a1a1", 1),
            " M: " + " ".join(s.moves) + " E: " + " ".join(str(e + 0.3) for e in s.evals) + " B: " + s.best,
            ref[:rng.randrange(1, len(ref))],
            "".join(rng.choice("abcdefgh12345678 MEB:.-") for _ in range(60))]


def env_variants(s, rng):
    ref = s.completion
    i = rng.randrange(len(s.next_fen))
    return [ref,
            ref[:i] + ("x" if ref[i] != "x" else "y") + ref[i + 1:],
            ref[:-3] + ("0" if s.terminated else "1") + ref[-2:],
            f"{s.fen}+0.001+0+0",  # the position not updated
            ref.replace(f"+{s.reward}+", "+0.5+"),
            ref[:rng.randrange(1, len(ref))],
            "".join(rng.choice("rnbqkpRNBQKP12345678/ w-+.") for _ in range(60))]


def bench(samples, variants, rng, repeat=3):
    pairs = [(s, c) for s in samples for c in variants(s, rng)]
    ss, cs = [s for s, _ in pairs], [c for _, c in pairs]
    best = float("inf")
    for _ in range(repeat):
        legal_ucis.cache_clear()  # legal moves are computed once per position, as for a group of completions
        t = time.perf_counter()
        score_batch(ss, cs)
        best = min(best, time.perf_counter() - t)
    return len(pairs), len(pairs) / best


def main():
    rng = random.Random(0)
    policy = load_jsonl(EVAL_PATH)
    env = [random_env_sample(s.fen, s.history, rng) for s in policy]
    for task, samples, variants in (("P:", policy, policy_variants), ("A:", env, env_variants)):
        n, rate = bench(samples, variants, rng)
        print(f"{task} {rate:,.0f} completions/s per core ({n} completions: reference, mutated, garbage)")


if __name__ == "__main__":
    main()
