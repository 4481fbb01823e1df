"""mini/plots.py: the panels of a run's figures (read from the matplotlib objects, not the pixels), runs
overlaid, absent keys skipped, the rolling mean, compare_bars on evaluate.compare's rows, and PNGs saved in a
palette.

    python mini/test_plots.py
"""
import json
import os
import sys

import numpy as np
import pytest

import mini.evaluate as ev
from mini.config import EVAL_PATH

pytest.importorskip("matplotlib", reason='matplotlib is an optional extra: pip install -e ".[plot]"')
from mini import plots  # noqa: E402  (after the skip: it needs matplotlib)
from matplotlib.colors import to_rgba  # noqa: E402
from matplotlib.layout_engine import ConstrainedLayoutEngine  # noqa: E402
from PIL import Image  # noqa: E402  (matplotlib's own dependency)


def synthetic_rows(n=20, shift=0.0, evals=True):
    """A run's metrics rows with every key the plots know, held-out ones every 5 steps."""
    rows = []
    for s in range(1, n + 1):
        r = {"step": s, "reward_mean": 0.1 + 0.02 * s + shift, "reward_mean_P": 0.05 * s, "reward_mean_A": 0.2,
             "format_valid_P": 0.9, "format_valid_A": 0.5, "kl": 0.001 * s, "kl_coef": 0.02, "entropy": 1.0,
             "clip_frac": 0.01, "clip_low_frac": 0.004, "clip_high_frac": 0.006, "zero_var_share": 0.3,
             "grad_norm": 0.5, "lr": 1e-5, "time_generate": 3.0, "time_ref_logprobs": 2.0, "time_score": 0.1,
             "time_update": 8.0, "time_step": 13.2, "peak_mem_mb": 0.0}
        if evals and s % 5 == 0:
            r.update(eval_reward=0.3 + shift, eval_P_invalid=0.1, chess_mate_acc=0.02, chess_selfplay_plies=12.0)
        rows.append(r)
    return rows


def titles(fig):
    return [ax.get_title() for ax in fig.axes]


def line_labels(ax):
    return [line.get_label() for line in ax.get_lines() if not line.get_label().startswith("_")]


def png_size(path):
    """(width, height) in pixels, from a PNG's IHDR chunk."""
    data = path.read_bytes()
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


def test_rolling_mean():
    assert plots.rolling_mean([1.0, 3.0, 5.0, 7.0], 2) == [1.0, 2.0, 4.0, 6.0]
    assert plots.rolling_mean([2.0, 4.0], 1) == [2.0, 4.0]
    assert plots.rolling_mean([], 3) == []


def test_training_figure_panels_and_overlaid_runs():
    runs = {"run-a": synthetic_rows(), "run-b": synthetic_rows(shift=0.1)}
    fig = plots.training_figure(runs)
    assert titles(fig) == ["reward, rolling mean of 2", "reward, P: task, rolling mean of 2",
                           "reward, A: task, rolling mean of 2", "format validity", "KL to the start model",
                           "KL coefficient", "entropy", "clipped tokens, equal-reward groups", "grad norm",
                           "learning rate", "seconds per phase: run-a", "seconds per phase: run-b"]
    assert [ax.get_ylabel() for ax in fig.axes[:10]] == [
        "reward_mean (TRL reward)", "reward_mean_P", "reward_mean_A", "", "kl", "kl_coef", "entropy", "", "grad_norm",
        "lr (TRL learning_rate)"]
    for ax in fig.axes[:10]:  # a one-key panel draws that key's values (run-a's first line)
        if ax.get_ylabel():
            key = ax.get_ylabel().split()[0]
            assert list(ax.get_lines()[0].get_ydata()) == plots.series(runs["run-a"], key)[1], key
    reward = fig.axes[0]
    assert line_labels(reward) == ["run-a", "run-b"] and reward.get_ylabel() == "reward_mean (TRL reward)"
    assert reward.get_xlabel() == "step" and len(reward.get_lines()) == 4  # each run: values faint, rolling mean
    bold = [line for line in reward.get_lines() if line.get_label() == "run-b"][0]
    assert list(bold.get_xdata()) == list(range(1, 21))
    assert bold.get_ydata()[1] == pytest.approx((0.22 + 0.24) / 2)  # the mean of steps 1 and 2 (0.1 + 0.02 s + 0.1)
    assert len(fig.axes[4].get_lines()) == 2  # KL: a line per run, no rolling mean beside it
    assert line_labels(fig.axes[7]) == [f"run-{r}: {k}" for r in "ab"
                                        for k in ("clip_frac", "clip_low_frac", "clip_high_frac", "zero_var_share")]
    time_a = fig.axes[10]
    assert [t.get_text() for t in time_a.get_legend().get_texts()] == plots.PHASES  # time_step is not stacked
    assert len(time_a.collections) == 4
    assert fig.get_suptitle() == "training: run-a, run-b"
    assert tuple(fig.get_size_inches()) == pytest.approx((4 * 4.2, 3 * 2.9))  # 12 panels in rows of four


def test_the_rolling_window_is_a_tenth_of_the_longest_run():
    runs = {"long": synthetic_rows(40), "short": synthetic_rows(10)}
    assert plots.training_figure(runs).axes[0].get_title() == "reward, rolling mean of 4"


def test_a_short_run_is_not_smoothed_and_says_so():
    """Under 15 steps the rolling window is 1: the reward panel draws the values alone and its title claims no
    rolling mean."""
    fig = plots.training_figure({"solo": [{"step": s, "reward_mean": 0.1 * s} for s in range(1, 15)]})
    assert titles(fig) == ["reward"] and len(fig.axes[0].get_lines()) == 1
    assert fig.axes[0].get_legend() is None  # one line: its name is the axis label, no legend box over the data
    fifteen = plots.training_figure({"solo": [{"step": s, "reward_mean": 0.1 * s} for s in range(1, 16)]})
    assert titles(fifteen) == ["reward, rolling mean of 2"]  # a tenth of 15, rounded


def test_absent_keys_are_skipped_and_one_run_labels_by_key():
    fig = plots.training_figure({"solo": [{"step": s, "kl": 0.1, "clip_frac": 0.0, "zero_var_share": 0.5}
                                          for s in (1, 2)]})
    assert titles(fig) == ["KL to the start model", "clipped tokens, equal-reward groups"]
    assert line_labels(fig.axes[1]) == ["clip_frac (TRL clip_ratio/region_mean)",
                                        "zero_var_share (TRL frac_reward_zero_std)"]
    assert [(line.get_color(), line.get_linestyle()) for line in fig.axes[1].get_lines()] == [("C0", "-"), ("C1", "-")]
    assert plots.training_figure({"solo": [{"step": 1, "peak_mem_mb": 1.0}]}) is None
    assert plots.held_out_figure({"solo": synthetic_rows(evals=False)}, "eval_", "held-out") is None


def test_float_noise_is_not_drawn_as_a_trend():
    flat = [{"step": s, "reward_mean_A": -0.3 + 1e-8 * (s % 2), "kl": 0.001 * s} for s in range(1, 11)]
    noise, trend = plots.training_figure({"solo": flat}).axes
    assert noise.get_ylim() == pytest.approx((-0.315, -0.285))  # every completion invalid: a flat line at -0.3
    assert trend.get_ylim()[1] - trend.get_ylim()[0] < 0.02     # a real change keeps matplotlib's own limits
    (zero,) = plots.training_figure({"solo": [{"step": s, "clip_frac": 0.0} for s in range(1, 5)]}).axes
    lo, hi = zero.get_ylim()
    assert lo < 0 < hi  # a line at exactly 0 (nothing clipped) keeps an axis around it, not one of zero height


def test_held_out_figure_has_a_panel_per_metric():
    runs = {"run-a": synthetic_rows(), "run-b": synthetic_rows(shift=0.1)}
    fig = plots.held_out_figure(runs, "eval_", "held-out evaluation")
    assert titles(fig) == ["eval_reward", "eval_P_invalid"]
    assert line_labels(fig.axes[0]) == ["run-a", "run-b"]
    assert list(fig.axes[0].get_lines()[1].get_ydata()) == pytest.approx([0.4] * 4)  # steps 5, 10, 15, 20
    assert titles(plots.held_out_figure(runs, "chess_", "chess")) == ["chess_mate_acc", "chess_selfplay_plies"]
    assert {line.get_marker() for ax in fig.axes for line in ax.get_lines()} == {"o"}  # a single eval is a visible dot
    assert fig.get_suptitle() == "held-out evaluation: run-a, run-b"


def test_a_figure_is_as_wide_as_its_panels_and_has_a_row_for_the_last_few():
    """Two panels make a figure two panels wide, not four; six held-out metrics in rows of five take two rows
    (the sixth alone on the second)."""
    two = plots.training_figure({"solo": [{"step": 1, "kl": 0.1, "entropy": 1.0}]})
    assert tuple(two.get_size_inches()) == pytest.approx((2 * 4.2, 2.9))
    six = plots.held_out_figure({"solo": [{"step": 5, **{f"eval_m{i}": 0.1 * i for i in range(6)}}]}, "eval_", "x")
    assert len(six.axes) == 6 and tuple(six.get_size_inches()) == pytest.approx((5 * 3.2, 2 * 2.4))
    assert [ax.get_subplotspec().rowspan.start for ax in six.axes] == [0, 0, 0, 0, 0, 1]


def test_other_timed_phases_are_stacked_after_the_steps_phases():
    """A timed phase train.py adds (time_eval) goes on top of the step's phases, which keep their step order."""
    rows = [{"step": 1, "time_eval": 5.0, "time_update": 1.0, "time_generate": 2.0, "time_score": 0.5}]
    (ax,) = plots.training_figure({"solo": rows}).axes
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["time_generate", "time_score", "time_update", "time_eval"]
    assert ax.get_title() == "seconds per phase"  # one run: no run name after it


def test_write_run_plots_writes_only_the_figures_with_a_panel(tmp_path):
    """A run with training keys and no held-out one: train.png alone, in the folder made for it (two levels new);
    a run with no known key at all: nothing written, an empty result."""
    out = tmp_path / "new" / "plots"
    written = plots.write_run_plots({"solo": synthetic_rows(evals=False)}, str(out))
    assert list(written) == [str(out / "train.png")] and sorted(p.name for p in out.iterdir()) == ["train.png"]
    assert (out / "train.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plots.write_run_plots({"solo": [{"step": 1, "peak_mem_mb": 1.0}]}, str(tmp_path / "none")) == {}
    assert list((tmp_path / "none").iterdir()) == []


def test_a_png_is_written_in_a_palette_that_keeps_the_picture(tmp_path):
    """save_figure: a PNG (or a name without an extension) in 256 colours, as large in pixels as matplotlib's own
    rendering and within a few levels of it on average; another format as matplotlib writes it."""
    fig = plots.training_figure({"a": synthetic_rows(), "b": synthetic_rows(shift=0.1)})
    for name in ("train.png", "train"):
        plots.save_figure(fig, str(tmp_path / name))
        saved = Image.open(tmp_path / name)
        assert saved.format == "PNG" and saved.mode == "P" and len(saved.getcolors(256)) <= 256
    direct = tmp_path / "direct.png"
    fig.savefig(direct, dpi=plots.DPI)  # matplotlib's RGBA, the reference
    want, got = (np.asarray(Image.open(p).convert("RGB"), dtype=float) for p in (direct, tmp_path / "train.png"))
    assert got.shape == want.shape and np.abs(got - want).mean() < 2.0
    assert os.path.getsize(tmp_path / "train.png") < os.path.getsize(direct)
    plots.save_figure(fig, str(tmp_path / "train.svg"))
    assert (tmp_path / "train.svg").read_text().lstrip().startswith("<?xml")


def test_compare_bars_writes_a_bare_file_name_to_the_current_folder(tmp_path, monkeypatch):
    """`evaluate.py --compare a.json b.json --plot compare.png`: a path without a folder is written where it runs."""
    monkeypatch.chdir(tmp_path)
    plots.compare_bars({"eval_reward": (0.1, 0.2, 0.1, 0.05, 0.15, 10)}, "compare.png")
    assert (tmp_path / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_file_name_matplotlib_cannot_write_is_named_and_the_others_pass():
    assert plots.unsupported_format("out/compare.txt") == ("--plot out/compare.txt: matplotlib writes no .txt file; "
                                                           "end the name with .png (or .svg, .pdf)")
    assert [plots.unsupported_format(p) for p in ("c.png", "c.PNG", "c.svg", "c.pdf", "compare")] == [None] * 5
    assert plots.unsupported_format("c.PGF") == ("--plot c.PGF: matplotlib writes .pgf through LaTeX; end the name "
                                                 "with .png (or .svg, .pdf)")  # a traceback without xelatex


def test_compare_bars(tmp_path):
    # evaluate.compare's rows: (before, after, delta, low, high, n)
    rows = {"eval_reward": (0.074, 0.278, 0.204, 0.164, 0.244, 400),
            "eval_P_invalid": (0.16, 0.035, -0.125, -0.175, -0.08, 200),
            "eval_P_best_acc_pv1": (0.005, 0.005, 0.0, 0.0, 0.0, 200)}
    fig = plots.compare_bars(rows, str(tmp_path / "sub" / "compare.png"), title="before.json -> after.json")
    assert (tmp_path / "sub" / "compare.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert titles(fig) == list(rows)
    for ax, (before, after, delta, lo, hi, n) in zip(fig.axes, rows.values()):
        bars, errorbar = ax.containers
        assert [b.get_height() for b in bars] == pytest.approx([before, after])
        assert [t.get_text() for t in ax.get_xticklabels()] == ["before", "after"]
        (segment,) = errorbar.lines[2][0].get_segments()  # the vertical bar on "after": before + [low, high]
        assert segment[:, 0] == pytest.approx([1, 1]) and segment[:, 1] == pytest.approx([before + lo, before + hi])
        assert ax.get_xlabel().endswith(f", n={n}") and ("*" in ax.get_xlabel()) == (lo > 0 or hi < 0)
    with pytest.raises(ValueError, match="nothing to plot"):
        plots.compare_bars({}, str(tmp_path / "empty.png"))


def test_compare_bars_takes_evaluate_compare_rows(tmp_path):
    samples = ev.held_out_samples(3)
    reports = []
    for name, completions in (("before", ["garbage"] * len(samples)), ("after", [s.completion for s in samples])):
        rows = [{"task": s.task, "prompt": s.prompt, "completion": c} for s, c in zip(samples, completions)]
        (tmp_path / name).write_text(json.dumps({"data": EVAL_PATH, "n_per_task": 3, "shaping": "continuous",
                                                 "samples": rows}))
        reports.append(str(tmp_path / name))
    rows = ev.compare(*reports, n_boot=200)
    fig = plots.compare_bars(rows, str(tmp_path / "compare.png"))
    assert titles(fig) == list(rows) and "eval_reward" in rows
    assert [b.get_height() for b in fig.axes[titles(fig).index("eval_reward")].containers[0]] == pytest.approx([-0.3, 1.0])


def test_held_out_points_sit_at_their_steps_and_overlaid_runs_differ_in_colour():
    """Held-out metrics logged every 5 steps are drawn at steps 5, 10, 15, 20 (not at their index); the time
    panel stacks each phase at its step; overlaid runs get a colour each (C0, C1), the same in every panel."""
    runs = {"run-a": synthetic_rows(), "run-b": synthetic_rows(shift=0.1)}
    fig = plots.held_out_figure(runs, "eval_", "held-out evaluation")
    for ax in fig.axes:
        assert [list(line.get_xdata()) for line in ax.get_lines()] == [[5, 10, 15, 20]] * 2
        assert [line.get_color() for line in ax.get_lines()] == ["C0", "C1"]
    train = plots.training_figure(runs)
    reward = {line.get_label(): line for line in train.axes[0].get_lines() if not line.get_label().startswith("_")}
    assert reward["run-a"].get_color() == "C0" and reward["run-b"].get_color() == "C1"
    rows = [{"step": 2, "time_generate": 1.0}, {"step": 3, "kl": 0.1}, {"step": 7, "time_generate": 2.0, "time_update": 4.0}]
    time_ax = plots.training_figure({"solo": rows}).axes[-1]
    top = time_ax.collections[-1].get_paths()[0].vertices  # the upper band's outline: x at steps 2 and 7 only
    assert sorted(set(top[:, 0].round(6))) == [2.0, 7.0] and top[:, 1].max() == pytest.approx(6.0)


def test_a_null_a_string_or_a_true_is_no_value_in_any_panel():
    """A hand-edited metrics.jsonl: a true is not drawn as 1, and a null or a string among the seconds of a phase
    counts as no seconds in the stack, not a traceback (analyze_metrics.py reads such files)."""
    rows = [{"step": 1, "kl": True, "time_generate": 1.0, "time_update": None},
            {"step": 2, "kl": 0.5, "time_generate": "x", "time_update": 2.0},
            {"step": 3, "kl": None, "time_generate": 3.0, "time_update": 4.0}]
    assert plots.series(rows, "kl") == ([2], [0.5])
    kl, time_ax = plots.training_figure({"solo": rows}).axes
    assert list(kl.get_lines()[0].get_xdata()) == [2]
    top = time_ax.collections[-1].get_paths()[0].vertices  # the upper band: from generate's 1, 0, 3 to totals 1, 2, 7
    assert {tuple(v) for v in top.tolist()} == {(1.0, 1.0), (2.0, 0.0), (3.0, 3.0), (3.0, 7.0), (2.0, 2.0)}


def test_values_past_any_axis_are_left_out_as_no_value(tmp_path):
    """A KL of 1e308 (a hand-edited or diverged log) is a number, but an axis spanning it overflows in matplotlib
    ("arange: cannot compute length", a traceback after analyze_metrics.py's summary): left out of the plot."""
    rows = [{"step": 1, "kl": 1e308}, {"step": 2, "kl": 0.5}, {"step": 3, "kl": -1e308}, {"step": 4, "kl": 1e300}]
    assert plots.series(rows, "kl") == ([2, 4], [0.5, 1e300])
    written = plots.write_run_plots({"solo": [{"step": s, "kl": (-1) ** s * 1e308} for s in range(3)]}, str(tmp_path))
    assert list(written) == [str(tmp_path / "train.png")]


def test_an_overlaid_run_without_a_key_has_no_line_and_no_time_panel():
    """Runs overlaid where one logged no KL and no time_*: the KL panel draws the other run alone (no empty line,
    no legend entry), and the time panels are the timed run's only."""
    bare = [{"step": s, "reward_mean": 0.1} for s in (1, 2)]
    fig = plots.training_figure({"run-a": synthetic_rows(), "run-b": bare})
    kl = fig.axes[titles(fig).index("KL to the start model")]
    assert line_labels(kl) == ["run-a"] and len(kl.get_lines()) == 1
    assert [t for t in titles(fig) if t.startswith("seconds")] == ["seconds per phase: run-a"]
    time_ax = fig.axes[-1]
    assert time_ax.get_ylabel() == "seconds"
    assert [to_rgba(band.get_facecolor()[0]) for band in time_ax.collections] == [to_rgba(f"C{i}") for i in range(4)]


def test_the_values_under_a_rolling_mean_are_faint():
    (ax,) = plots.training_figure({"solo": [{"step": s, "reward_mean": 0.01 * s} for s in range(1, 21)]}).axes
    faint, bold = ax.get_lines()
    assert faint.get_alpha() == pytest.approx(0.3) and bold.get_alpha() is None
    assert list(faint.get_ydata()) == pytest.approx([0.01 * s for s in range(1, 21)])


def test_a_flat_line_at_a_large_level_gets_a_readable_span():
    """Float noise is relative to the level: grad norm 1000 +- 1e-4 is flat, drawn within 5% of its level."""
    flat = [{"step": s, "grad_norm": 1000 + 1e-4 * (s % 2)} for s in range(1, 11)]
    (ax,) = plots.training_figure({"solo": flat}).axes
    assert ax.get_ylim() == pytest.approx((950.0, 1050.0001))


def test_write_run_plots_puts_each_prefix_in_its_png_at_80_dpi(tmp_path):
    """eval.png holds the eval_* panels and chess.png the chess_* ones; every PNG is drawn at DPI (80) dots per inch
    of its figure, so its pixels follow the panel count."""
    rows = [{"step": s, "kl": 0.1 * s, "eval_reward": 0.3, "eval_P_invalid": 0.1, "chess_mate_acc": 0.02} for s in (1, 2)]
    written = plots.write_run_plots({"solo": rows}, str(tmp_path))
    assert sorted(os.path.basename(p) for p in written) == ["chess.png", "eval.png", "train.png"]
    assert titles(written[str(tmp_path / "eval.png")]) == ["eval_reward", "eval_P_invalid"]
    assert titles(written[str(tmp_path / "chess.png")]) == ["chess_mate_acc"]
    assert png_size(tmp_path / "train.png") == (round(4.2 * 80), round(2.9 * 80))
    assert png_size(tmp_path / "eval.png") == (round(2 * 3.2 * 80), round(2.4 * 80))


def test_compare_bars_labels_title_layout_and_size(tmp_path):
    """Each panel's label: the signed change, its interval and n; the figure's title: the reports compared, then
    what the bars mean; six metrics in rows of five; the before bar grey (C7), the after bar C0; 80 dpi."""
    rows = {f"m{i}": (0.16, 0.035, -0.125, -0.175, -0.08, 200) for i in range(5)}
    rows["m5"] = (0.074, 0.278, 0.204, 0.164, 0.244, 400)
    fig = plots.compare_bars(rows, str(tmp_path / "c.png"), title="before.json -> after.json")
    assert fig.axes[0].get_xlabel() == "-0.125 [-0.175, -0.080] *, n=200"
    assert fig.axes[5].get_xlabel() == "+0.204 [+0.164, +0.244] *, n=400"
    assert fig.get_suptitle() == ("before.json -> after.json\n"
                                  "change with its 95% paired bootstrap interval (* excludes 0)")
    assert tuple(fig.get_size_inches()) == pytest.approx((5 * 2.8, 2 * 2.5))
    assert [ax.get_subplotspec().rowspan.start for ax in fig.axes] == [0, 0, 0, 0, 0, 1]
    bars = fig.axes[0].containers[0]
    assert [to_rgba(b.get_facecolor()) for b in bars] == [to_rgba("C7"), to_rgba("C0")]
    assert png_size(tmp_path / "c.png") == (round(5 * 2.8 * 80), round(2 * 2.5 * 80))
    assert isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine)  # titles and labels kept apart
    untitled = plots.compare_bars({"m": rows["m5"]}, str(tmp_path / "u.png"))
    assert untitled.get_suptitle() == "change with its 95% paired bootstrap interval (* excludes 0)"


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
