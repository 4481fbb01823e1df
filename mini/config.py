"""
Every setting of the project, in one dataclass, and where the shipped data lies. Command-line flags are
generated from its fields (mini/flags.py), so a default lives in exactly one place:

    python mini/train.py --steps 100 --batch_size 8 --k_samples 8 --lr 1e-5
    python mini/train.py --no_bf16 --kl_type k3
"""
import os
from dataclasses import dataclass, field, fields

DATA_DIR = os.path.join(os.path.dirname(__file__), "data")
POOL_PATH = os.path.join(DATA_DIR, "pool.jsonl")  # annotated training positions, shipped
EVAL_PATH = os.path.join(DATA_DIR, "eval.jsonl")  # held-out positions, none of them in the pool
MATE_PATH = os.path.join(DATA_DIR, "mate_in_one.jsonl")  # held-out mate-in-one positions (mini/chess_eval.py)
REAL_EVAL_PATH = os.path.join(DATA_DIR, "eval_games.jsonl")  # held-out positions and A: transitions of realistic games
# a second such set, twice the first, built after the training pools and kept off them (annotate.py --exclude)
REAL_EVAL2_PATH = os.path.join(DATA_DIR, "eval_games2.jsonl")
SHIPPED_MODEL = os.path.join(DATA_DIR, "rookworld-10m")  # the best RookWorld-format model made here; needs no network
# v3, the smaller model before it: mini/test_learning.py trains it, as its GRPO steps take half the CPU time
CI_MODEL = os.path.join(DATA_DIR, "rookworld-8m")
# Stockfish evals after a move (--p_reward engine), shared across runs
ENGINE_CACHE = os.path.join(os.path.expanduser("~"), ".cache", "rookworld-mini", "stockfish-moves.jsonl")


TRAIN, SFT, BOTH = ("train",), ("sft",), ("train", "sft")  # which scripts list a flag in their --help


def choices_of(field, script="train"):
    """The values `script` accepts for a Config field (None: any of its type)."""
    choices = field.metadata["choices"]
    return choices[script] if isinstance(choices, dict) else choices


def opt(default, help, choices=None, check=None, scripts=TRAIN):
    """A Config field: its default, its --help text, and what parse_args checks: `choices` (or a dict
    script -> its choices, where a script takes fewer), or `check` = (predicate, what it must be) for
    numbers; `scripts` that take the flag."""
    return field(default=default, metadata={"help": help, "choices": choices, "check": check, "scripts": scripts})


def at_least(n):
    return (lambda v: v >= n), f"at least {n}"


def between(lo, hi):
    return (lambda v: lo <= v <= hi), f"between {lo} and {hi}"


POSITIVE = (lambda v: v > 0), "above 0"
FRACTION = (lambda v: 0 < v <= 1), "in (0, 1]"
SEED = (lambda v: 0 <= v < 2**32), "between 0 and 2**32 - 1"


@dataclass
class Config:
    # model, run, io
    model_path: str = opt("jrahn/RookWorld-LM-124M", "hub id or local snapshot directory of the model to train "
                          "(sft.py: 'scratch' makes a new model of the --n_layer/--n_head/--n_embd shape)", scripts=BOTH)
    device: str = opt("auto", "cuda, cuda:N, cpu or auto (cuda when available)", scripts=BOTH)
    run_name: str = opt("", "name of the run directory under log_dir (empty: a timestamp)", scripts=BOTH)
    log_dir: str = opt("logs", "where run directories are written", scripts=BOTH)
    overwrite: bool = opt(False, "start afresh in a run directory that holds a run: the old one is moved aside "
                          "to <run_name>.old-<time>, never deleted", scripts=BOTH)
    seed: int = opt(42, "seed for python, numpy and torch", check=SEED, scripts=BOTH)
    report_to: str = opt("none", "live dashboard of metrics.jsonl: tensorboard (pip install -e '.[tensorboard]', "
                         "writes <run>/tensorboard) or wandb (pip install -e '.[wandb]', honours WANDB_MODE)",
                         ["none", "tensorboard", "wandb"], scripts=BOTH)

    # sampling: log-probs everywhere are those of this tempered (and top-k truncated) distribution
    temperature: float = opt(1.0, "sampling temperature of rollouts (the same divides logits in the loss)", check=POSITIVE)
    top_k: int = opt(0, "sample from the k most likely tokens only, renormalised (0: off)", check=at_least(0))
    max_new_tokens: int = opt(96, "longest completion; P: needs ~66 tokens, A: ~58", check=at_least(1))

    # tasks and data
    mix_env_ratio: float = opt(0.2, "probability that a prompt is an A: (environment) task instead of P:",
                               check=between(0, 1), scripts=BOTH)
    data_source: str = opt("pool", "where training positions come from (generate: fresh positions labelled by Stockfish "
                           "in the background as they are needed; selfplay: games of the current policy, labelled "
                           "the same way, mixed with the pool by --selfplay_mix; train.py only)",
                           {"train": ("pool", "file", "generate", "selfplay"), "sft": ("pool", "file", "generate")},
                           scripts=BOTH)
    data_file: str = opt("", "RookWorld-format text file, or a .jsonl of annotated positions like the pool, "
                         "with --data_source file; several, comma-separated, are one source", scripts=BOTH)
    policy_only_file: str = opt("", "files of --data_file (or train.py's --sft_data_file) whose P: positions serve P: "
                                "prompts and rows only, never as the start of an A: transition (mates in one: half the "
                                "A: transitions drawn on one are its mating move, where not one in a hundred of real "
                                "games' transitions ends in mate); comma-separated", scripts=BOTH)
    policy_pad: str = opt("90", "P: prompts' FEN padding: 90 (the generator code's), 89 (RookWorld's validation file's) "
                          "or both (each P: prompt drawn at either: a model robust to both)", choices=("90", "89", "both"),
                          scripts=BOTH)
    skip_bad_lines: bool = opt(True, "skip malformed data lines, reported as file:line, up to 100 (else stop at the "
                               "first one)", scripts=BOTH)
    stockfish_path: str = opt("", "Stockfish binary (empty: look on PATH and in /usr/games)", scripts=BOTH)
    stockfish_depth: int = opt(10, "Stockfish search depth for annotating positions (--data_source generate, selfplay)",
                               check=at_least(1), scripts=BOTH)
    selfplay_games: int = opt(16, "self-play games played at once, one batched call per half-move", check=at_least(1))
    selfplay_plies: int = opt(8, "half-moves each self-play game advances per refresh", check=at_least(1))
    selfplay_refresh: int = opt(10, "steps between self-play refreshes with the current weights", check=at_least(1))
    selfplay_mix: float = opt(0.5, "share of prompts from self-play; the rest from the shipped pool", check=between(0, 1))
    selfplay_temperature: float = opt(1.0, "sampling temperature of self-play moves", check=POSITIVE)
    selfplay_top_k: int = opt(0, "top-k of self-play moves (0: off)", check=at_least(0))
    annotate_workers: int = opt(2, "Stockfish processes labelling positions in the background (--data_source "
                                "generate, selfplay)", check=at_least(1), scripts=BOTH)
    reward_shaping: str = opt("continuous", "keep the raw reward, quantise it to 0.2 steps, or keep it but score a P: "
                              "answer whose best move is illegal as unparseable (-0.3)",
                              ["continuous", "graduated", "strict"])
    score_workers: int = opt(-1, "processes that score a rollout while the GPU computes reference log-probs (0: "
                             "inline; -1: on CUDA one per spare core, up to 4, else inline)", check=at_least(-1))
    p_reward: str = opt("labels", "best move of a P: completion: by its rank in the labels' top 5, or by its win "
                        "probability against the best with Stockfish judging moves outside the top 5", ["labels", "engine"])
    engine_depth: int = opt(10, "Stockfish depth of --p_reward engine (the labels' depth)", check=at_least(1))
    engine_nodes: int = opt(0, "Stockfish nodes of --p_reward engine instead of a depth (0: use the depth)", check=at_least(0))
    engine_cache: str = opt(ENGINE_CACHE, "JSONL cache of --p_reward engine evals, shared across runs ('' for none)")

    # GRPO objective
    steps: int = opt(100, "optimizer steps (one rollout batch each)", check=at_least(0), scripts=BOTH)
    batch_size: int = opt(8, "prompts per step (sft.py: sequences per step)", check=at_least(1), scripts=BOTH)
    k_samples: int = opt(8, "completions sampled per prompt (the group size; a group of 1 has no baseline)",
                         check=at_least(2))
    num_iterations: int = opt(1, "PPO epochs over one rollout batch", check=at_least(1))
    dynamic_sampling: bool = opt(False, "DAPO's dynamic sampling: drop groups whose rewards are all equal and sample "
                                 "more prompts until the step has --batch_size informative groups")
    dynamic_sampling_min_std: float = opt(0.0, "with --dynamic_sampling, also drop groups whose reward std is at or "
                                          "below this", check=at_least(0))
    dynamic_sampling_max_rounds: int = opt(4, "with --dynamic_sampling, rollouts of --batch_size prompts per step at "
                                           "most; then train on the informative groups found", check=at_least(1))
    micro_batch_size: int = opt(0, "completions per forward/backward pass (0: the whole batch)", check=at_least(0))
    clip_eps_low: float = opt(0.2, "PPO clip range below 1", check=between(0, 1))
    clip_eps_high: float = opt(0.2, "PPO clip range above 1 (larger: clip-higher)", check=at_least(0))
    loss_type: str = opt("grpo", "how token losses are averaged", ["grpo", "dr_grpo", "dapo"])
    scale_rewards: str = opt("group", "divide advantages by this std", ["group", "batch", "none"])
    baseline_type: str = opt("group_mean", "what is subtracted from rewards", ["group_mean", "ema", "adaptive"])
    ema_decay: float = opt(0.9, "decay of the per-task running mean reward (ema and adaptive baselines)",
                           check=between(0, 1))
    kl_type: str = opt("k3", "KL to the reference", ["forward", "reverse", "symmetric", "k3"])
    kl_coef: float = opt(0.02, "weight of the KL penalty", check=at_least(0))
    adaptive_kl: bool = opt(False, "steer kl_coef towards target_kl")
    target_kl: float = opt(0.02, "KL the adaptive controller aims at", check=POSITIVE)
    kl_horizon: int = opt(100, "steps over which the adaptive controller closes the gap", check=at_least(1))
    kl_warmup_steps: int = opt(0, "ramp kl_coef linearly from 0 over these steps", check=at_least(0))
    env_sft_coef: float = opt(0.0, "weight of a supervised loss beside GRPO's: the mean negative log-likelihood of "
                              "the true next state of --env_sft_batch A: transitions a step, which holds the arbiter "
                              "while P: updates move the shared weights (its groups mostly agree, so GRPO gives them "
                              "no advantage); 0: off", check=at_least(0))
    env_sft_batch: int = opt(16, "A: transitions a step for --env_sft_coef, drawn from the prompt source or "
                             "--sft_data_file", check=at_least(1))
    policy_sft_coef: float = opt(0.0, "weight of a supervised loss on P: prompts, as --env_sft_coef's on A:: the mean "
                                 "negative log-likelihood of Stockfish's analysis (M:, E:, B:) of --policy_sft_batch "
                                 "P: positions a step, which holds the labelled moves (legal ones, mates) while GRPO's "
                                 "updates drift; 0: off", check=at_least(0))
    policy_sft_batch: int = opt(16, "P: positions a step for --policy_sft_coef, drawn from the prompt source or "
                                "--sft_data_file", check=at_least(1))
    sft_data_file: str = opt("", "files (.jsonl like the pool, or RookWorld text; several comma-separated) that the "
                             "supervised terms (--env_sft_coef, --policy_sft_coef) draw from instead of the prompt "
                             "source; A: rows are half the files' transitions, half python-chess transitions on "
                             "their P: positions")
    entropy_coef: float = opt(0.0, "entropy bonus weight (entropy is logged either way)")
    entropy_every: int = opt(1, "with --entropy_coef 0, compute and log the entropy on every so many steps only (a "
                             "pass over the vocabulary at every completion token)", check=at_least(1))
    use_gae: bool = opt(False, "add a value head and use GAE advantages (off: GRPO proper, no critic)")
    gamma: float = opt(1.0, "GAE discount", check=between(0, 1))
    gae_lambda: float = opt(0.95, "GAE lambda", check=between(0, 1))
    value_coef: float = opt(0.1, "value loss weight", check=at_least(0))
    value_clip: float = opt(0.2, "value loss clip range", check=POSITIVE)

    # optimisation
    lr: float = opt(1e-5, "peak learning rate (GRPO wants it small: 2e-4 made an 8M model drift, see RESULTS.md)",
                    check=FRACTION, scripts=BOTH)  # above 1 is a slip; 1e39 overflowed AdamW's float32 step
    weight_decay: float = opt(0.01, "AdamW decay on matrices (never on biases, norms, embeddings)", check=at_least(0),
                              scripts=BOTH)
    adam_beta1: float = opt(0.9, "AdamW beta1", check=between(0, 0.9999), scripts=BOTH)
    adam_beta2: float = opt(0.95, "AdamW beta2", check=between(0, 0.9999), scripts=BOTH)
    grad_clip: float = opt(1.0, "clip the gradient norm to this (0: off)", check=at_least(0), scripts=BOTH)
    warmup_steps: int = opt(10, "linear warmup, applied from the first update", check=at_least(0), scripts=BOTH)
    decay_steps: int = opt(0, "final linear decay to zero over the last steps", check=at_least(0), scripts=BOTH)
    min_lr_ratio: float = opt(0.1, "cosine floor as a fraction of lr", check=between(0, 1), scripts=BOTH)
    bf16: bool = opt(True, "bf16 autocast on CUDA (master weights stay fp32)", scripts=BOTH)
    bf16_cpu: bool = opt(False, "bf16 autocast on CPU too: ~2x faster where the CPU has AVX512-BF16 or AMX", scripts=BOTH)
    compile: bool = opt(False, "torch.compile the training and reference forward on CUDA; the rollout's and "
                        "micro-batches' widths are then rounded up to multiples of 16, so that shapes repeat")
    compile_decode: bool = opt(False, "torch.compile the static-shape decode step (CUDA graphs on CUDA)")
    fused_logprobs: bool = opt(False, "the training log-probs and entropy straight from the hidden states and the "
                               "output weight, chunk by chunk, the logits recomputed in backward: the (N, T, vocab) "
                               "logits never whole in memory (peak 1.14 against 1.87 GB on the CPU bench), but one "
                               "more matmul (1.5x the output layer's CPU time); off: the logits materialised")
    shared_prefix_decode: bool | None = opt(None, "decode attention reads each group's prompt keys and values once, in "
                                            "one masked attention with its rows' completions, and the completion "
                                            "columns only as far as written (off: a copy of the prompt per row, every "
                                            "column read) (default: on on the CPU, off on CUDA, the faster on each)")
    grad_checkpointing: bool = opt(False, "recompute activations in the backward pass")
    auto_batch_size: bool = opt(False, "on CUDA, probe growing batch sizes and keep the largest that fits")
    memory_fraction: float = opt(0.85, "peak memory target of --auto_batch_size, as a fraction of the device",
                                 check=FRACTION)

    # evaluation, logging, checkpoints
    eval_every: int = opt(50, "held-out evaluation every so many steps (0: off)", check=at_least(0))
    eval_n: int = opt(100, "held-out prompts per task at each evaluation", check=at_least(1))
    eval_chess: bool = opt(False, "add chess skill to each evaluation: mate in one on 100 positions, 16 self-play games")
    log_samples: int = opt(4, "prompts, completions and rewards written to samples.jsonl per step", check=at_least(0))
    save_every: int = opt(50, "regular and recovery checkpoint every so many steps (0: off, and a non-finite "
                              "step then rolls back to where this run started or resumed)", check=at_least(0))
    keep_last: int = opt(3, "regular checkpoints kept (0: all)", check=at_least(0))
    resume_from_checkpoint: str = opt("", "checkpoint file to resume from, with the settings saved in it (flags given "
                                      "may change only those in runs.RESUMABLE); another run's checkpoint needs a "
                                      "--run_name that holds no run")
    auto_resume: bool = opt(False, "resume this run from its latest valid checkpoint with its saved config.json "
                            "(a new run when its directory does not exist yet)")
    recovery_mode: bool = opt(False, "resume this run from its recovery checkpoint (the last known-good state) with "
                              "its saved config.json")
    kl_threshold: float = opt(0.0, "stop the run cleanly when |KL| exceeds this (0: off)", check=at_least(0))
    time_limit_min: float = opt(0.0, "stop after this many minutes of training (0: only --steps counts)",
                                check=at_least(0), scripts=BOTH)

    # supervised warm start (mini/sft.py): --model_path scratch makes a new model of this shape
    n_layer: int = opt(4, "layers of a model made from scratch", check=at_least(1), scripts=SFT)
    n_head: int = opt(4, "attention heads of a model made from scratch", check=at_least(1), scripts=SFT)
    n_embd: int = opt(256, "width of a model made from scratch (a multiple of --n_head)", check=at_least(1), scripts=SFT)
    n_positions: int = opt(256, "context length of a model made from scratch (a P: line is ~150 tokens)",
                           check=at_least(160), scripts=SFT)
    grow_layers: int = opt(0, "deepen the --model_path snapshot to this many layers before training, computing the "
                           "same function at first (0: keep its depth)", check=at_least(0), scripts=SFT)
    data_workers: int = opt(0, "processes that draw and encode sft.py's batches ahead of the GPU, each from its own "
                            "seed (0: in the training process)", check=at_least(0), scripts=SFT)
    snapshot_every_min: float = opt(10.0, "write the snapshot in final/ every so many minutes of training, so that a "
                                    "crash or a kill loses no more (0: only at the end)", check=at_least(0), scripts=SFT)



FIELDS = {f.name: f for f in fields(Config)}
# how this process starts: always the given flags, never a saved config's (which says how an earlier process started)
START_FLAGS = ("auto_resume", "recovery_mode", "resume_from_checkpoint", "overwrite")
