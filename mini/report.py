"""
Live dashboards of a run: TensorBoard or Weights & Biases views of the rows that train.py writes to
metrics.jsonl (the one source of truth; a dashboard only shows it), and the metric names that TRL's
GRPOTrainer logs, for the concepts the two share.

    python mini/train.py --run_name demo --report_to tensorboard    # then: tensorboard --logdir logs/demo
    WANDB_MODE=offline python mini/train.py --run_name demo --report_to wandb   # later: wandb sync logs/demo/wandb
    python mini/test_report.py

    reporter = make_reporter("tensorboard", "logs/demo", config_dict)   # "none", "tensorboard" or "wandb"
    reporter.log(step, metrics_row)          # every numeric scalar of the row
    reporter.log_samples(step, rows)         # rows of samples.jsonl: step, task, prompt, completion, reward
    reporter.rewind(step)                    # a rollback to `step`: the steps after it will be logged again
    reporter.close()

Names on a dashboard, grouped by prefix (a shared concept appears under both of its names):
  train/<TRL name>   the shared concepts under the names TRL's GRPOTrainer logs (TRL_NAMES, and
                     rewards/<component>/mean for the reward components), in the train/ section where
                     Hugging Face's Trainer puts them, so a TRL user's charts read the same;
  mini/<our name>    every numeric scalar of the row under its metrics.jsonl key, so a key found in the
                     file is found on the dashboard;
  eval/<our name>    the held-out ones (eval_*, chess_*), in their own section.
Strings and None are skipped; NaN and inf are logged as they are (a dashboard shows the break).
Sampled completions go to a table named "completions", as in TRL (TensorBoard: a markdown table under
TEXT; W&B: a wandb.Table).

TensorBoard writes to <run dir>/tensorboard from the first step logged on; a resumed run's steps replace
what the interrupted process had logged from there on (purge_step). W&B writes to <run dir>/wandb; it
honours WANDB_MODE (offline: nothing leaves the machine until `wandb sync`), WANDB_PROJECT (default
rookworld-grpo-mini) and the rest of its environment; each start of the script is one W&B run, grouped by
the run name, so a resumed run is a second W&B run in the same group. A rollback inside a run (a non-finite
loss) does the same: TensorBoard drops the abandoned steps as the redone ones arrive, and W&B, which keeps
a run's steps increasing, goes on in a new run of the group, named <run>-from-<step>.
"""
import importlib
import json
import numbers
import os

# our metrics.jsonl key -> TRL GRPOTrainer's name for the same quantity (the ones Hugging Face's Trainer
# adds itself: loss, grad_norm, learning_rate). The README's table and the plots' labels read this one.
TRL_NAMES = {
    "reward_mean": "reward",
    "reward_std": "reward_std",
    "zero_var_share": "frac_reward_zero_std",
    "kl": "kl",
    "entropy": "entropy",
    "clip_low_frac": "clip_ratio/low_mean",
    "clip_high_frac": "clip_ratio/high_mean",
    "clip_frac": "clip_ratio/region_mean",
    "completion_len_mean": "completions/mean_length",
    "completion_clipped_ratio": "completions/clipped_ratio",
    "loss": "loss",
    "grad_norm": "grad_norm",
    "lr": "learning_rate",
}
TASKS = ("P", "A")
NOT_COMPONENTS = ("reward_mean_", "reward_std_", "eval_", "chess_")  # per-task keys that are no reward component
HELD_OUT = ("eval_", "chess_")
KINDS = ("none", "tensorboard", "wandb")
WANDB_PROJECT = "rookworld-grpo-mini"
SAMPLE_COLUMNS = ("step", "task", "prompt", "completion", "reward")  # the rows of samples.jsonl


def is_component(key):
    """A reward component's per-task mean, <component>_P or <component>_A (rollout.reward_metrics)."""
    return key.endswith(tuple("_" + t for t in TASKS)) and not key.startswith(NOT_COMPONENTS)


def trl_name(key):
    """TRL's name for our metrics.jsonl key, or None when TRL has no such metric."""
    return TRL_NAMES.get(key) or (f"rewards/{key}/mean" if is_component(key) else None)


def scalars(row):
    """The numeric scalars of a metrics row (not its step), NaN and inf included."""
    return {k: float(v) for k, v in row.items()
            if k != "step" and isinstance(v, numbers.Real) and not isinstance(v, bool)}


def dashboard_scalars(row):
    """{tag: value} as logged: train/<TRL name>, mini/<our name>, eval/<our held-out name>."""
    out = {}
    for k, v in scalars(row).items():
        out[("eval/" if k.startswith(HELD_OUT) else "mini/") + k] = v
        if trl_name(k):
            out["train/" + trl_name(k)] = v
    return out


def markdown_table(rows, columns=SAMPLE_COLUMNS):
    """A markdown table of sample rows; \\ and | escaped (a\\|b would end the cell at |) and line breaks (\\n, \\r:
    markdown ends a row at either) made spaces, so that a completion stays in its cell."""
    cell = lambda v: (f"{v:.3f}" if isinstance(v, float) else str(v)).replace("\\", "\\\\").replace("|", "\\|").replace(
        "\r", " ").replace("\n", " ")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    return "\n".join(lines + ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows])


def require(module, extra):
    """The module, or a ValueError saying which extra installs it."""
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ValueError(f'--report_to {extra} needs the {extra} package: pip install -e ".[{extra}]"') from None


class NoReporter:
    def log(self, step, row):
        pass

    def log_samples(self, step, rows):
        pass

    def rewind(self, step):
        pass

    def close(self):
        pass


class TensorBoardReporter:
    def __init__(self, run_dir, config):
        self.tb = require("torch.utils.tensorboard", "tensorboard")
        self.log_dir, self.config, self.writer = os.path.join(run_dir, "tensorboard"), config, None

    def writer_at(self, step):
        """The writer, made at the first step logged: purge_step drops what an interrupted process logged
        from that step on, so a resumed run's re-logged steps replace the old ones."""
        if self.writer is None:
            self.writer = self.tb.SummaryWriter(self.log_dir, purge_step=step)
            self.writer.add_text("config", "```\n" + json.dumps(self.config, indent=1, default=str) + "\n```", step)
        return self.writer

    def log(self, step, row):
        for tag, v in dashboard_scalars(row).items():
            self.writer_at(step).add_scalar(tag, v, step)

    def log_samples(self, step, rows):
        self.writer_at(step).add_text("completions", markdown_table(rows), step)

    def rewind(self, step):
        """Back to `step`: the next writer purges the abandoned steps from the first one logged again."""
        self.close()
        self.writer = None

    def close(self):
        if self.writer is not None:
            self.writer.close()


class WandbReporter:
    def __init__(self, run_dir, config):
        self.wandb = require("wandb", "wandb")
        self.run_dir, self.config, self.group = run_dir, config, os.path.basename(os.path.normpath(run_dir))
        self.start(self.group)

    def start(self, name):
        try:
            self.run = self.wandb.init(project=os.environ.get("WANDB_PROJECT", WANDB_PROJECT), dir=self.run_dir,
                                       name=name, group=self.group, config=self.config)
        except Exception as e:  # wandb raises its own errors (no API key, no network); say what to do
            raise ValueError(f"--report_to wandb could not start ({str(e).strip().rstrip('.')}); run `wandb login` "
                             "or set WANDB_MODE=offline") from None

    def log(self, step, row):
        self.run.log(dashboard_scalars(row), step=step)

    def log_samples(self, step, rows):
        table = self.wandb.Table(columns=list(SAMPLE_COLUMNS), data=[[r.get(c) for c in SAMPLE_COLUMNS] for r in rows])
        self.run.log({"completions": table}, step=step)

    def rewind(self, step):
        """Back to `step`: a W&B run's steps only increase, so the redone steps go to a new run of the group."""
        self.run.finish()
        self.start(f"{self.group}-from-{step}")

    def close(self):
        self.run.finish()


def make_reporter(kind, run_dir, config):
    """The dashboard of --report_to `kind` for the run in run_dir, with the run's config (a dict). A
    missing package (or W&B without a login or WANDB_MODE=offline) is a ValueError at once, so that the
    run fails at its start and not at its first step."""
    if kind not in KINDS:
        raise ValueError(f"--report_to must be one of {', '.join(KINDS)}, not {kind!r}")
    if kind == "none":
        return NoReporter()
    return (TensorBoardReporter if kind == "tensorboard" else WandbReporter)(run_dir, config)
