"""
Held-out evaluation: greedy, batched completions of the shipped eval positions, scored by the reward.

    python mini/evaluate.py --model_path logs/run/final --eval_n 200
"""
import random

import torch

from mini.dataset import EVAL_PATH, load_jsonl, random_env_sample
from mini.model import generate
from mini.reward_scorer import score_batch


def held_out_samples(n_per_task, seed=1234):
    """The first n P: positions of the eval set, and n A: transitions on the same positions (fixed seed)."""
    policy = load_jsonl(EVAL_PATH)[:n_per_task]
    rng = random.Random(seed)
    env = [random_env_sample(s.fen, s.history, rng) for s in policy]
    return policy + env


@torch.no_grad()
def evaluate(model, tokenizer, samples, max_new_tokens=96, batch_size=64, autocast=None, shaping="continuous"):
    """Mean reward and format validity per task ("P", "A"), from greedy completions."""
    was_training = model.training
    model.eval()
    completions = []
    for i in range(0, len(samples), batch_size):
        chunk = samples[i:i + batch_size]
        with autocast or torch.autocast("cpu", enabled=False):
            out = generate(model, [tokenizer.encode(s.prompt) for s in chunk], max_new_tokens, temperature=0,
                           eos_id=tokenizer.eos_token_id)
        completions += [tokenizer.decode(ids) for ids, _ in out]
    model.train(was_training)
    scored = score_batch(samples, completions, shaping)
    metrics = {}
    for task in ("P", "A"):
        rows = [(r, c) for s, (r, c) in zip(samples, scored) if s.task == task]
        if rows:
            metrics[f"eval_reward_{task}"] = sum(r for r, _ in rows) / len(rows)
            metrics[f"eval_format_valid_{task}"] = sum(c["format_valid"] for _, c in rows) / len(rows)
    metrics["eval_reward"] = sum(r for r, _ in scored) / len(scored)
    return metrics, completions


def main():
    from mini.config import parse_args
    from mini.loader import load_model
    cfg = parse_args()
    model, tok = load_model(cfg.model_path, "cuda" if torch.cuda.is_available() and cfg.device != "cpu" else "cpu")
    metrics, _ = evaluate(model, tok, held_out_samples(cfg.eval_n), cfg.max_new_tokens)
    for k, v in metrics.items():
        print(f"{k:24s} {v:.4f}")


if __name__ == "__main__":
    main()
