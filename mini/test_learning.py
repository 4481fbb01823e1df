"""The learning demonstration in small (RESULTS.md has the full one): a tiny model warm-started by
sft.py (P: 20% valid), then trained by train.py on P: prompts, must do better on 200 held-out P:
prompts: the 95% paired bootstrap interval of each change must lie above 0. ~4 minutes on 2 cores;
RESULTS.md has the figures of this configuration.

    python -m pytest -q mini/test_learning.py
"""
import mini.sft as sft
import mini.train as train
from mini.evaluate import complete, held_out_samples, paired_bootstrap, per_sample_values
from mini.loader import load_model

N_HELD_OUT = 200
SFT_ARGS = ["--model_path", "scratch", "--n_layer", "4", "--n_head", "4", "--n_embd", "64", "--batch_size", "8",
            "--lr", "3e-3", "--warmup_steps", "30", "--mix_env_ratio", "0.3", "--steps", "800", "--seed", "0"]
GRPO_ARGS = ["--steps", "12", "--batch_size", "8", "--k_samples", "8", "--micro_batch_size", "16",
             "--mix_env_ratio", "0", "--lr", "1e-4", "--temperature", "0.7", "--top_k", "15", "--warmup_steps", "3",
             "--eval_every", "0", "--save_every", "0", "--seed", "0"]


def held_out_values(model_dir, samples):
    model, tok = load_model(model_dir)
    return per_sample_values(samples, complete(model, tok, samples))


def test_grpo_improves_held_out_policy_metrics(tmp_path):
    log_dir = str(tmp_path)
    assert sft.main(SFT_ARGS + ["--log_dir", log_dir, "--run_name", "sft"]) == 0
    samples = held_out_samples(N_HELD_OUT)[:N_HELD_OUT]  # the P: half
    before = held_out_values(f"{log_dir}/sft/final", samples)
    assert train.main(GRPO_ARGS + ["--model_path", f"{log_dir}/sft/final", "--log_dir", log_dir,
                                   "--run_name", "grpo"]) == 0
    after = held_out_values(f"{log_dir}/grpo/final", samples)
    rows = paired_bootstrap(before, after)
    for metric in ("eval_reward_P", "eval_format_valid_P", "eval_P_best_legal"):
        b, a, delta, lo, hi, n = rows[metric]
        assert lo > 0, f"{metric}: {b:.3f} -> {a:.3f}, 95% interval of the change [{lo:+.3f}, {hi:+.3f}] holds 0"


if __name__ == "__main__":
    import sys

    import pytest
    sys.exit(pytest.main([__file__, "-q"]))
