"""The learning demonstration in small (RESULTS.md has the full one): v3 (mini/data/rookworld-8m, the model
before the shipped one; its steps take half the CPU time), trained by train.py for 16 steps on P: prompts,
must name legal moves more often on 500 held-out P: prompts: the 95% paired bootstrap interval of each change
must lie above 0. 5-15 minutes on one core, by the machine; RESULTS.md has the figures of this configuration.

    python -m pytest -q mini/test_learning.py
"""
import pytest

import mini.train as train
from mini.config import CI_MODEL
from mini.evaluate import complete, held_out_samples, paired_bootstrap, per_sample_values
from mini.loader import load_model

N_HELD_OUT = 500
GRPO_ARGS = ["--model_path", CI_MODEL, "--steps", "16", "--batch_size", "8", "--k_samples", "8",
             "--micro_batch_size", "64", "--mix_env_ratio", "0", "--lr", "1.5e-4", "--temperature", "0.7",
             "--top_k", "15", "--warmup_steps", "3", "--eval_every", "0", "--save_every", "0", "--seed", "0"]


def held_out_values(model_dir, samples):
    model, tok = load_model(model_dir)
    return per_sample_values(samples, complete(model, tok, samples))


@pytest.mark.long(600)
def test_grpo_makes_v3s_moves_legal(tmp_path):
    samples = held_out_samples(N_HELD_OUT)[:N_HELD_OUT]  # the P: half
    before = held_out_values(CI_MODEL, samples)
    assert train.main(GRPO_ARGS + ["--log_dir", str(tmp_path), "--run_name", "grpo"]) == 0
    after = held_out_values(f"{tmp_path}/grpo/final", samples)
    rows = paired_bootstrap(before, after)
    for metric in ("eval_P_best_legal", "eval_P_top5_legal"):
        b, a, delta, lo, hi, n = rows[metric]
        assert lo > 0, f"{metric}: {b:.3f} -> {a:.3f}, 95% interval of the change [{lo:+.3f}, {hi:+.3f}] holds 0"


if __name__ == "__main__":
    import sys

    sys.exit(pytest.main([__file__, "-q"]))
