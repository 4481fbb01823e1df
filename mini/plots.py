"""
PNG plots of training runs and of before/after comparisons, drawn headless: figures on matplotlib's Agg
canvas, without pyplot, so no display and no global state are involved. matplotlib is an optional extra.

    pip install -e ".[plot]"
    python analyze_metrics.py logs/demo-grpo --plot                        # logs/demo-grpo/plots/*.png
    python analyze_metrics.py logs/a logs/b --plot --out logs/a-vs-b       # runs overlaid, one line per run
    python mini/evaluate.py --compare before.json after.json --plot compare.png
    python mini/test_plots.py

train.png   reward overall and per task (each step faint, a rolling mean bold), format validity per task,
            KL and its coefficient, entropy, clipped tokens and equal-reward groups, grad norm, LR, and the
            seconds per phase of a step stacked (one panel per run)
eval.png    every held-out eval_* metric against the step, one panel each
chess.png   every chess_* metric of --eval_chess, one panel each
A panel whose keys no run has is left out; a figure with no panel is not written. Our names label the
lines, with TRL's name beside them where TRL logs the same quantity (mini/report.py TRL_NAMES).
"""
import io
import math
import os

try:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from PIL import Image  # a dependency of matplotlib's own
except ImportError:
    raise ImportError('plotting needs matplotlib, an optional extra: pip install -e ".[plot]"') from None

from mini.report import TRL_NAMES
from mini.runs import is_number

# (title, metrics.jsonl keys, rolling mean) per panel of train.png
PANELS = [
    ("reward", ["reward_mean"], True),
    ("reward, P: task", ["reward_mean_P"], True),
    ("reward, A: task", ["reward_mean_A"], True),
    ("format validity", ["format_valid_P", "format_valid_A"], False),
    ("KL to the start model", ["kl"], False),
    ("KL coefficient", ["kl_coef"], False),
    ("entropy", ["entropy"], False),
    ("clipped tokens, equal-reward groups", ["clip_frac", "clip_low_frac", "clip_high_frac", "zero_var_share"], False),
    ("grad norm", ["grad_norm"], False),
    ("learning rate", ["lr"], False),
]
PHASES = ["time_generate", "time_ref_logprobs", "time_score", "time_update"]  # in step order; other time_* follow
HELD_OUT = {"eval.png": ("eval_", "held-out evaluation"), "chess.png": ("chess_", "chess skill (--eval_chess)")}
STYLES = ["-", "--", ":", "-."]
DPI = 80


def label(key):
    """Our key, with TRL's name beside it when TRL logs the same quantity under another name."""
    return f"{key} (TRL {TRL_NAMES[key]})" if TRL_NAMES.get(key, key) != key else key


PLOTTABLE = 1e300  # past it an axis overflows (1e308 in a hand-edited or diverged log: "arange: cannot compute length")


def series(rows, key):
    """(steps, values) of the rows that have a number under key; one past PLOTTABLE is left out, as a null is
    (inf and NaN stay: matplotlib leaves them out itself)."""
    pts = [(r["step"], v) for r in rows if is_number(v := r.get(key)) and not abs(v) > PLOTTABLE]
    return [s for s, _ in pts], [v for _, v in pts]


def rolling_mean(values, window):
    """Trailing mean over the last `window` values (fewer at the start)."""
    windows = [values[max(0, i - window + 1):i + 1] for i in range(len(values))]
    return [sum(w) / len(w) for w in windows]


def present(runs, keys):
    """The keys that some row of some run has."""
    return [k for k in keys if any(k in r for rows in runs.values() for r in rows)]


def time_phases(runs):
    """The time_* keys of the runs, without the whole step: the known phases in step order, then the rest."""
    found = {k for rows in runs.values() for r in rows for k in r if k.startswith("time_") and k != "time_step"}
    return [k for k in PHASES if k in found] + sorted(found - set(PHASES))


def grid(n, ncols, width, height):
    """A figure on the Agg canvas with n axes in rows of ncols."""
    ncols = min(ncols, n)
    nrows = math.ceil(n / ncols)
    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, [fig.add_subplot(nrows, ncols, i + 1) for i in range(n)]


def draw_lines(ax, runs, keys, window=0, marker=None):
    """One line per run and key: colour by run when several runs are overlaid (style by key), else by
    key. With a window, the values faint and their rolling mean bold."""
    for ri, (run, rows) in enumerate(runs.items()):
        for ki, key in enumerate(keys):
            steps, values = series(rows, key)
            if not steps:
                continue
            color, style = (f"C{ri}", STYLES[ki % len(STYLES)]) if len(runs) > 1 else (f"C{ki}", "-")
            name = (run if len(keys) == 1 else f"{run}: {key}") if len(runs) > 1 else label(key)
            if window > 1:
                ax.plot(steps, values, color=color, alpha=0.3, lw=0.8, label="_values")  # _: not in the legend
                values = rolling_mean(values, window)
            ax.plot(steps, values, color=color, ls=style, marker=marker, ms=3, label=name)
    ax.set_xlabel("step")
    steady_ylim(ax)
    if len(ax.get_legend_handles_labels()[1]) > 1:
        ax.legend(fontsize="x-small")


def steady_ylim(ax):
    """Values that differ only by float noise (-0.3 +- 1e-8: every completion invalid) get a readable span
    around their level, not an axis of noise below an offset."""
    lo, hi = ax.dataLim.intervaly
    level = max(abs(lo), abs(hi))
    if 0 < hi - lo < 1e-6 * level:
        ax.set_ylim(lo - 0.05 * level, hi + 0.05 * level)


def draw_time(ax, title, rows, phases):
    """Seconds per phase of each step, stacked; a phase with no number at a step (a null, a string) counts 0."""
    rows = [r for r in rows if any(p in r for p in phases)]
    ax.stackplot([r["step"] for r in rows], *[[r[p] if is_number(r.get(p)) else 0.0 for r in rows] for p in phases], labels=phases,
                 colors=[f"C{i}" for i in range(len(phases))])
    ax.set(title=title, xlabel="step", ylabel="seconds")
    ax.legend(fontsize="x-small", loc="upper left")


def training_figure(runs):
    """train.png of {run name: metrics rows}, or None when the runs have none of its keys."""
    panels = [(title, found, smooth) for title, keys, smooth in PANELS if (found := present(runs, keys))]
    phases = time_phases(runs)
    timed = [(name, rows) for name, rows in runs.items() if present({name: rows}, phases)]
    if not panels and not timed:
        return None
    fig, axes = grid(len(panels) + len(timed), 4, 4.2, 2.9)
    window = max(1, round(max(len(rows) for rows in runs.values()) / 10))  # ~a tenth of the longest run
    for ax, (title, keys, smooth) in zip(axes, panels):
        draw_lines(ax, runs, keys, window if smooth else 0)
        ax.set_title(title + (f", rolling mean of {window}" if smooth and window > 1 else ""))
        if len(keys) == 1:
            ax.set_ylabel(label(keys[0]))
    for ax, (name, rows) in zip(axes[len(panels):], timed):
        draw_time(ax, "seconds per phase" + (f": {name}" if len(runs) > 1 else ""), rows, phases)
    fig.suptitle("training: " + ", ".join(runs))
    return fig


def held_out_figure(runs, prefix, title):
    """One panel per metric whose key starts with prefix (eval_, chess_), or None when there is none."""
    keys = list(dict.fromkeys(k for rows in runs.values() for r in rows for k in r if k.startswith(prefix)))
    if not keys:
        return None
    fig, axes = grid(len(keys), 5, 3.2, 2.4)
    for ax, key in zip(axes, keys):
        draw_lines(ax, runs, [key], marker="o")
        ax.set_title(key, fontsize="small")
    fig.suptitle(f"{title}: " + ", ".join(runs))
    return fig


def write_run_plots(runs, out_dir):
    """Write train.png, eval.png and chess.png of {run name: metrics rows} (those with a panel) to
    out_dir; returns {path: figure}."""
    figs = {"train.png": training_figure(runs)}
    figs.update({name: held_out_figure(runs, prefix, title) for name, (prefix, title) in HELD_OUT.items()})
    os.makedirs(out_dir, exist_ok=True)
    out = {}
    for name, fig in figs.items():
        if fig is not None:
            save_figure(fig, os.path.join(out_dir, name))
            out[os.path.join(out_dir, name)] = fig
    return out


def save_figure(fig, path):
    """Write fig to path; a PNG (also a name without an extension, matplotlib's default) in a palette of 256
    colours: flat colours and anti-aliased lines lose nothing visible, and the file is about 2.5 times smaller
    than matplotlib's RGBA, which counts for the curves kept in the repository (mini/data/plots)."""
    if os.path.splitext(path)[1].lower() not in ("", ".png"):
        fig.savefig(path, dpi=DPI)
        return
    rgba = io.BytesIO()
    fig.savefig(rgba, dpi=DPI, format="png")
    Image.open(rgba).convert("RGB").quantize(colors=256).save(path, format="PNG", optimize=True)


def unsupported_format(path):
    """One sentence when path's extension names no format that matplotlib writes (none: a PNG), else None."""
    ext = os.path.splitext(path)[1][1:].lower()
    if ext and ext not in FigureCanvasAgg.get_supported_filetypes():
        return f"--plot {path}: matplotlib writes no .{ext} file; end the name with .png (or .svg, .pdf)"
    if ext == "pgf":  # listed, but written through a LaTeX install, after the comparison has run
        return f"--plot {path}: matplotlib writes .pgf through LaTeX; end the name with .png (or .svg, .pdf)"
    return None


def compare_bars(rows, path, title=""):
    """Before/after bars per metric of evaluate.compare (or chess_eval.compare's paired rows):
    rows = {metric: (before, after, after - before, low, high, n)}, low/high the 95% paired bootstrap
    interval of the change. One panel per metric (their scales differ); the error bar on the after bar
    spans before + [low, high], so it excludes the before bar's top exactly when the interval excludes
    0 (marked *). Writes the PNG to path; returns the figure."""
    if not rows:
        raise ValueError("nothing to plot: the comparison has no paired metric")
    fig, axes = grid(len(rows), 5, 2.8, 2.5)
    for ax, (key, (before, after, delta, lo, hi, n)) in zip(axes, rows.items()):
        ax.bar(["before", "after"], [before, after], color=["C7", "C0"])
        ax.errorbar([1], [before + (lo + hi) / 2], yerr=[(hi - lo) / 2], fmt="none", ecolor="black", capsize=5)
        ax.set_title(key, fontsize="small")
        ax.set_xlabel(f"{delta:+.3f} [{lo:+.3f}, {hi:+.3f}]" + (" *" if lo > 0 or hi < 0 else "") + f", n={n}",
                      fontsize="small")
    fig.suptitle((title + "\n" if title else "") + "change with its 95% paired bootstrap interval (* excludes 0)")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    save_figure(fig, path)
    return fig
