"""
Every setting of the project, in one dataclass. Command-line flags are generated from its fields,
so a default lives in exactly one place:

    python mini/train.py --steps 100 --batch_size 8 --k_samples 8 --lr 1e-5
    python mini/train.py --no_bf16 --kl_type k3
"""
import argparse
import os
from dataclasses import dataclass, field, fields

DATA_DIR = os.path.join(os.path.dirname(__file__), "data")
POOL_PATH = os.path.join(DATA_DIR, "pool.jsonl")  # annotated training positions, shipped
EVAL_PATH = os.path.join(DATA_DIR, "eval.jsonl")  # held-out positions, none of them in the pool
# Stockfish evals after a move (--p_reward engine), shared across runs
ENGINE_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "rookworld-mini", "stockfish-moves.jsonl")


def opt(default, help, choices=None):
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass
class Config:
    # model, run, io
    model_path: str = opt("jrahn/RookWorld-LM-124M", "hub id or local snapshot directory of the model to train")
    device: str = opt("auto", "cuda, cpu or auto (cuda when available)")
    run_name: str = opt("", "name of the run directory under log_dir (empty: a timestamp)")
    log_dir: str = opt("logs", "where run directories are written")
    seed: int = opt(42, "seed for python, numpy and torch")

    # sampling: log-probs everywhere are those of this tempered (and top-k truncated) distribution
    temperature: float = opt(1.0, "sampling temperature of rollouts (the same divides logits in the loss)")
    top_k: int = opt(0, "sample from the k most likely tokens only, renormalised (0: off)")
    max_new_tokens: int = opt(96, "longest completion; P: needs ~66 tokens, A: ~58")

    # tasks and data
    mix_env_ratio: float = opt(0.2, "probability that a prompt is an A: (environment) task instead of P:")
    data_source: str = opt("pool", "where training positions come from", ["pool", "file", "generate"])
    data_file: str = opt("", "RookWorld-format text file, or a .jsonl of annotated positions like the pool, with --data_source file")
    skip_bad_lines: bool = opt(True, "skip malformed data lines with a count (else stop at the first one)")
    stockfish_path: str = opt("", "Stockfish binary (empty: look on PATH and in /usr/games)")
    stockfish_depth: int = opt(10, "Stockfish search depth for annotating positions")
    reward_shaping: str = opt("continuous", "keep the raw reward or quantise it to 0.2 steps", ["continuous", "graduated"])
    score_workers: int = opt(0, "processes that score a rollout while the GPU computes reference log-probs (0: inline)")
    p_reward: str = opt("labels", "best move of a P: completion: by its rank in the labels' top 5, or by its win "
                        "probability against the best with Stockfish judging moves outside the top 5", ["labels", "engine"])
    engine_depth: int = opt(10, "Stockfish depth of --p_reward engine (the labels' depth)")
    engine_nodes: int = opt(0, "Stockfish nodes of --p_reward engine instead of a depth (0: use the depth)")
    engine_cache: str = opt(ENGINE_CACHE, "JSONL cache of --p_reward engine evals, shared across runs ('' for none)")

    # GRPO objective
    steps: int = opt(100, "optimizer steps (one rollout batch each)")
    batch_size: int = opt(8, "prompts per step")
    k_samples: int = opt(8, "completions sampled per prompt (the group size)")
    num_iterations: int = opt(1, "PPO epochs over one rollout batch")
    micro_batch_size: int = opt(0, "completions per forward/backward pass (0: the whole batch)")
    clip_eps_low: float = opt(0.2, "PPO clip range below 1")
    clip_eps_high: float = opt(0.2, "PPO clip range above 1 (larger: clip-higher)")
    loss_type: str = opt("grpo", "how token losses are averaged", ["grpo", "dr_grpo", "dapo"])
    scale_rewards: str = opt("group", "divide advantages by this std", ["group", "batch", "none"])
    baseline_type: str = opt("group_mean", "what is subtracted from rewards", ["group_mean", "ema", "adaptive"])
    ema_decay: float = opt(0.9, "decay of the per-task running mean reward (ema and adaptive baselines)")
    kl_type: str = opt("k3", "KL to the reference", ["forward", "reverse", "symmetric", "k3"])
    kl_coef: float = opt(0.02, "weight of the KL penalty")
    adaptive_kl: bool = opt(False, "steer kl_coef towards target_kl")
    target_kl: float = opt(0.02, "KL the adaptive controller aims at")
    kl_horizon: int = opt(100, "steps over which the adaptive controller closes the gap")
    kl_warmup_steps: int = opt(0, "ramp kl_coef linearly from 0 over these steps")
    entropy_coef: float = opt(0.0, "entropy bonus weight (entropy is logged either way)")
    use_gae: bool = opt(False, "add a value head and use GAE advantages (off: GRPO proper, no critic)")
    gamma: float = opt(1.0, "GAE discount")
    gae_lambda: float = opt(0.95, "GAE lambda")
    value_coef: float = opt(0.1, "value loss weight")
    value_clip: float = opt(0.2, "value loss clip range")

    # optimisation
    lr: float = opt(1e-5, "peak learning rate (GRPO wants it small: 2e-4 made an 8M model drift, see RESULTS.md)")
    weight_decay: float = opt(0.01, "AdamW decay on matrices (never on biases, norms, embeddings)")
    adam_beta1: float = opt(0.9, "AdamW beta1")
    adam_beta2: float = opt(0.95, "AdamW beta2")
    grad_clip: float = opt(1.0, "clip the gradient norm to this (0: off)")
    warmup_steps: int = opt(10, "linear warmup, applied from the first update")
    decay_steps: int = opt(0, "final linear decay to zero over the last steps")
    min_lr_ratio: float = opt(0.1, "cosine floor as a fraction of lr")
    bf16: bool = opt(True, "bf16 autocast on CUDA (master weights stay fp32)")
    bf16_cpu: bool = opt(False, "bf16 autocast on CPU too: ~2x faster where the CPU has AVX512-BF16 or AMX")
    compile: bool = opt(False, "torch.compile the model on CUDA")
    compile_decode: bool = opt(False, "torch.compile the static-shape decode step (CUDA graphs on CUDA)")
    grad_checkpointing: bool = opt(False, "recompute activations in the backward pass")
    auto_batch_size: bool = opt(False, "on CUDA, probe growing batch sizes and keep the largest that fits")
    memory_fraction: float = opt(0.85, "peak memory target of --auto_batch_size, as a fraction of the device")

    # evaluation, logging, checkpoints
    eval_every: int = opt(50, "held-out evaluation every so many steps (0: off)")
    eval_n: int = opt(100, "held-out prompts per task at each evaluation")
    eval_chess: bool = opt(False, "add chess skill to each evaluation: mate in one on 100 positions, 16 self-play games")
    log_samples: int = opt(4, "prompts, completions and rewards written to samples.jsonl per step")
    save_every: int = opt(50, "regular checkpoint every so many steps (0: off)")
    keep_last: int = opt(3, "regular checkpoints kept")
    resume_from_checkpoint: str = opt("", "checkpoint file to resume from")
    auto_resume: bool = opt(False, "resume from the latest valid checkpoint of this run")
    recovery_mode: bool = opt(False, "start from this run's recovery checkpoint")
    kl_threshold: float = opt(0.0, "stop the run cleanly when |KL| exceeds this (0: off)")

    # supervised warm start (mini/sft.py): --model_path scratch makes a new model of this shape
    n_layer: int = opt(4, "layers of a model made from scratch")
    n_head: int = opt(4, "attention heads of a model made from scratch")
    n_embd: int = opt(256, "width of a model made from scratch")
    n_positions: int = opt(256, "context length of a model made from scratch (a P: line is ~150 tokens)")
    time_limit_min: float = opt(0.0, "stop after this many minutes of training (0: only --steps counts)")


def parse_args(argv=None):
    """Flags from the fields of Config; booleans get --name and --no_name."""
    p = argparse.ArgumentParser(description="Fine-tune RookWorld-LM with GRPO.")
    for f in fields(Config):
        default, meta = f.default, f.metadata
        if isinstance(default, bool):
            p.add_argument(f"--{f.name}", dest=f.name, action="store_true", help=f"{meta['help']} (default: {default})")
            p.add_argument(f"--no_{f.name}", dest=f.name, action="store_false")
        else:
            p.add_argument(f"--{f.name}", type=type(default), choices=meta["choices"], help=meta["help"])
        p.set_defaults(**{f.name: default})
    return Config(**vars(p.parse_args(argv)))
