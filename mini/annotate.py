"""The command that builds the shipped data: generated positions labelled by Stockfish (mini/stockfish.py).

    python mini/annotate.py --pool 5000 --eval 500 --depth 10 --seed 0

A quick search screens out most lopsided positions (beyond --max_eval pawns one in four is kept); the rest get
Stockfish's top 5 moves. Analyses are cached on disk, so a cut-off build resumes where it stopped.
"""
import itertools
import json
import os
import random
import sys
import time

from mini.config import EVAL_PATH, POOL_PATH, Config, Parser, at_least
from mini.positions import iter_positions
from mini.stockfish import DEFAULT_CACHE, Annotator


def write_jsonl(path, meta, positions, labels):
    """Header record, then one position per line; written to a temporary file first, then renamed."""
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps({"meta": meta}) + "\n")
        for fen, history, _ in positions:
            moves, evals = labels[fen]
            record = {"fen": fen, "moves": moves, "evals": evals, "history": history}
            f.write(json.dumps(record, separators=(",", ":")) + "\n")
    os.replace(tmp, path)


def main(argv=None):
    cfg = Config()
    p = Parser("Annotate generated positions with Stockfish; write the shipped pool and eval set.",
               checks={"pool": at_least(1), "eval": at_least(0)})  # else the slices below write other counts
    p.add_argument("--pool", type=int, default=5000, help="training positions")
    p.add_argument("--eval", type=int, default=500, help="held-out positions, none of them in the pool")
    p.add_argument("--seed", type=int, default=0, help="seed of the position generator")
    p.add_argument("--depth", type=int, default=cfg.stockfish_depth, help="Stockfish depth")
    p.add_argument("--screen_depth", type=int, default=6, help="depth of the quick search that screens positions")
    p.add_argument("--max_eval", type=float, default=4.0, help="beyond this many pawns, keep a position with probability 1/4")
    p.add_argument("--time", type=float, default=None, help="seconds per position instead of a depth")
    p.add_argument("--workers", type=int, default=os.cpu_count(), help="Stockfish processes")
    p.add_argument("--stockfish_path", default=cfg.stockfish_path)
    p.add_argument("--cache", default=DEFAULT_CACHE, help="JSONL cache of analyses ('' for none)")
    p.add_argument("--pool_path", default=POOL_PATH)
    p.add_argument("--eval_path", default=EVAL_PATH)
    a = p.parse_args(argv)
    t0 = time.time()
    need, source, rng, positions = a.pool + a.eval, iter_positions(a.seed), random.Random(a.seed), []
    with Annotator(a.stockfish_path, a.screen_depth, None, a.workers, a.cache, multipv=1) as screen:
        while len(positions) < need:
            batch = list(itertools.islice(source, min(1000, 2 * (need - len(positions)))))
            quick = screen.annotate([fen for fen, _, _ in batch])
            kept = [p for p in batch if abs(quick[p[0]][1][0]) <= a.max_eval or rng.random() < 0.25]
            positions += kept[:need - len(positions)]
    # the positions are distinct, so the eval set and the pool are disjoint
    with Annotator(a.stockfish_path, a.depth, a.time, a.workers, a.cache) as ann:
        labels = ann.annotate([fen for fen, _, _ in positions])
        meta = {"stockfish": ann.engine, "limit": ann.tag, "multipv": 5, "seed": a.seed, "pool": a.pool, "eval": a.eval,
                "screen": f"depth={a.screen_depth}, |eval| > {a.max_eval} kept with p=0.25",
                "generator": "mini.positions.iter_positions",
                "command": "python mini/annotate.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    write_jsonl(a.eval_path, meta, positions[:a.eval], labels)
    write_jsonl(a.pool_path, meta, positions[a.eval:], labels)
    print(f"wrote {a.pool} pool and {a.eval} eval positions ({meta['stockfish']}, {ann.tag}) in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    main()
