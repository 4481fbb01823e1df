"""
Summarise a training run from its metrics.jsonl: the trend of the main signals over windows of steps,
the held-out evaluations, and warnings for the failure modes of GRPO runs (KL drift, equal-reward groups, clipping,
flat reward, NaN). With --plot, PNGs of the run too (mini/plots.py; needs pip install -e ".[plot]").

    python analyze_metrics.py logs/demo-grpo                 # a run directory or its metrics.jsonl
    python analyze_metrics.py logs/demo-grpo --windows 5
    python analyze_metrics.py logs/demo-grpo --plot          # logs/demo-grpo/plots/train.png (eval.png, chess.png)
    python analyze_metrics.py logs/a logs/b --plot --out logs/a-vs-b   # runs overlaid, one line per run
"""
import argparse
import json
import math
import os
import sys

from mini.flags import run_command
from mini.runs import is_number, read_rows

TREND = ["reward_mean", "reward_mean_P", "reward_mean_A", "format_valid_P", "format_valid_A", "kl", "entropy",
         "env_sft_nll", "policy_sft_nll", "zero_var_share", "ds_zero_var_share_drawn", "ds_reward_mean_drawn", "ds_rounds",
         "clip_frac", "grad_norm", "time_step"]
KL_DRIFT = 0.2  # healthy runs in RESULTS.md stay under 0.05; the --lr 2e-4 run that degraded reached 0.3-0.4
EVAL = ["eval_reward", "eval_reward_P", "eval_reward_A", "eval_P_invalid", "eval_P_best_legal", "eval_P_best_acc_pv1",
        "eval_P_top5_acc", "eval_A_invalid", "eval_A_next_state_exact", "eval_A_levenshtein"]


def load_metrics(path):
    """The rows of a run's metrics.jsonl (path: the file or the run directory), in step order, one per step. A last
    line cut off by a killed run is skipped; any other bad line is an error naming it."""
    if os.path.isdir(path):
        path = os.path.join(path, "metrics.jsonl")
    if not os.path.exists(path):
        raise ValueError(f"{path} does not exist; pass a run directory of mini/train.py or its metrics.jsonl")
    if path.endswith(".json"):  # evaluate.py's and chess_eval.py's reports: one JSON object, not rows
        raise ValueError(f"{path} is a report, not a run's metrics.jsonl; compare reports with evaluate.py --compare")
    rows = read_rows(path)
    if not all(isinstance(r, dict) and "step" in r for r in rows):
        raise ValueError(f"{path} holds rows without a step: it is not the metrics.jsonl of mini/train.py")
    bad = [r["step"] for r in rows if type(r["step"]) is not int or r["step"] < 0]  # type(): True is no step
    if bad:
        raise ValueError(f"{path} holds a step of {bad[0]!r}, not a whole number: the file was edited or damaged; "
                         "mend or remove that row")
    if not rows:
        raise ValueError(f"{path} is empty: the run logged no step yet")
    if any("prompt" in r for r in rows):  # samples.jsonl: several completions a step, no metric
        raise ValueError(f"{path} holds completions, not metrics: it is a run's samples.jsonl; pass the run directory "
                         "or its metrics.jsonl")
    latest = {r["step"]: r for r in rows}  # a step logged twice (a resume that did not cut the log back): its later row
    if len(latest) < len(rows):
        n = len(rows) - len(latest)
        print(f"{path}: {n} row{'s' * (n > 1)} repeat{'s' * (n == 1)} an earlier step (a resumed run); the later row "
              "of each step is used", file=sys.stderr)
    return sorted(latest.values(), key=lambda r: r["step"])


def mean_of(rows, key):
    """Mean of key over the rows that hold a number for it (None if none does)."""
    vals = [v for r in rows if is_number(v := r.get(key))]
    return sum(vals) / len(vals) if vals else None


def window_means(rows, keys, n_windows):
    """[(first step, last step, {key: mean over the window's rows that have it})] over n_windows
    windows of (nearly) equal size; fewer when there are fewer rows."""
    n = min(n_windows, len(rows))
    bounds = [round(i * len(rows) / n) for i in range(n + 1)]
    out = []
    for a, b in zip(bounds, bounds[1:]):
        w = rows[a:b]
        means = {k: m for k in keys if (m := mean_of(w, k)) is not None}
        out.append((w[0]["step"], w[-1]["step"], means))
    return out


def warnings(rows):
    """Plain sentences about what looks wrong in the run."""
    fifth = max(1, len(rows) // 5)
    first, last = rows[:fifth], rows[-fifth:]
    late = lambda k: mean_of(last, k) or 0.0
    out = []
    if any(not math.isfinite(v) for r in rows for v in r.values() if isinstance(v, float)):
        out.append("some logged values are NaN or infinite")
    if late("zero_var_share") > 0.5:
        out.append(f"{late('zero_var_share'):.0%} of groups had equal rewards late in the run: they give no "
                   "gradient; raise --temperature or --k_samples, or the tasks are too easy or too hard")
    if late("kl") > KL_DRIFT:
        out.append(f"KL to the start model is {late('kl'):.2f} late in the run: the policy drifts far; "
                   "lower --lr or raise --kl_coef (or --adaptive_kl)")
    if late("clip_frac") > 0.2:
        out.append(f"{late('clip_frac'):.0%} of tokens clipped late in the run: updates are too large")
    early, recent = mean_of(first, "reward_mean"), mean_of(last, "reward_mean")  # None: no reward logged there
    if len(rows) >= 10 and None not in (early, recent) and recent <= early:
        out.append("the training reward did not rise from the first fifth of the run to the last")
    evals = [r for r in rows if is_number(r.get("eval_reward"))]
    if len(evals) >= 2 and evals[-1]["eval_reward"] < evals[0]["eval_reward"]:
        out.append(f"held-out reward fell from {evals[0]['eval_reward']:.3f} (step {evals[0]['step']}) to "
                   f"{evals[-1]['eval_reward']:.3f} (step {evals[-1]['step']})")
    return out


def table(header, lines):
    widths = [max(len(str(x)) for x in col) for col in zip(header, *lines)]
    return "\n".join(" ".join(str(x).rjust(w) for x, w in zip(row, widths)) for row in [header, *lines])


def run_name(path):
    """The run directory's name of a run directory or its metrics.jsonl."""
    path = os.path.abspath(path)  # "." or a bare metrics.jsonl: the current folder's name, not "." or ""
    return os.path.basename(os.path.dirname(path) if path.endswith(".jsonl") else path)


def summary(rows, n_windows):
    """Print the step count and time, the trend table, the held-out evaluations and the warnings."""
    keys = [k for k in TREND if any(k in r for r in rows)]
    minutes = sum(v for r in rows if is_number(v := r.get("time_step"))) / 60
    print(f"{len(rows)} steps" + (f", {minutes:.1f} min" if minutes else "") + "\n")
    print(table(["steps"] + keys, [[f"{a}-{b}"] + [f"{m[k]:.3f}" if k in m else "-" for k in keys]
                                   for a, b, m in window_means(rows, keys, n_windows)]))
    evals = [r for r in rows if "eval_reward" in r]
    if evals:
        keys = [k for k in EVAL if any(k in r for r in evals)]
        print("\nheld-out evaluation\n" + table(["step"] + keys, [[r["step"]] + [
            f"{r[k]:.3f}" if is_number(r.get(k)) else "-" for k in keys] for r in evals]))
    for w in warnings(rows):
        print(f"warning: {w}")


def main(argv=None):
    p = argparse.ArgumentParser(description="Summarise mini/train.py runs from their metrics.jsonl; plot them.")
    p.add_argument("runs", nargs="+", help="run directories (logs/<run_name>) or their metrics.jsonl")
    p.add_argument("--windows", type=int, default=10, help="number of step windows in the trend table")
    p.add_argument("--plot", action="store_true", help="write PNGs; several runs are overlaid (needs matplotlib)")
    p.add_argument("--out", default="", help="folder for the PNGs (default: plots/ in the first run's directory)")
    args = p.parse_args(argv)
    if args.windows < 1:
        p.error("--windows must be at least 1")
    if args.out and not args.plot:
        p.error("--out is the folder of --plot's PNGs; add --plot")
    if args.out and os.path.exists(args.out) and not os.path.isdir(args.out):
        p.error(f"--out {args.out} is a file; name a folder for the PNGs")
    names = [run_name(r) for r in args.runs]
    if len(set(names)) < len(names):  # two runs of the same name from different folders: label them by path
        names = [os.path.normpath(r) for r in args.runs]
    try:
        runs = {name: load_metrics(path) for name, path in zip(names, args.runs)}
    except (ValueError, json.JSONDecodeError) as e:
        sys.exit(f"analyze_metrics.py: {e}")
    except OSError as e:  # a folder where the file should be, a file this user may not read
        sys.exit(f"analyze_metrics.py: cannot read {e.filename}: {e.strerror or e}")
    for name, rows in runs.items():
        if len(runs) > 1:
            print(f"\n== {name} ==")
        summary(rows, args.windows)
    if args.plot:
        try:
            from mini import plots  # matplotlib is an optional extra: only --plot needs it
        except ImportError as e:
            sys.exit(f"analyze_metrics.py: {e}")
        first = os.path.normpath(args.runs[0])
        out = args.out or os.path.join(os.path.dirname(first) if first.endswith(".jsonl") else first, "plots")
        try:
            written = plots.write_run_plots(runs, out)
        except OSError as e:  # a file where a folder should be, a read-only folder, a full disk
            sys.exit(f"analyze_metrics.py: cannot write the plots to {out}: {e.strerror or e}; pick another --out")
        if not written:  # --plot asked for, and no PNG: say so rather than end as if it were done
            print(f"analyze_metrics.py: no plot written: {'no run logs' if len(runs) > 1 else 'the run logs no'} "
                  "value any plot shows", file=sys.stderr)
        for path in written:
            print(f"wrote {path}")


if __name__ == "__main__":
    run_command(main)
