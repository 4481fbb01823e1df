"""analyze_metrics.py (at the repository root): window means, warnings and the CLI on a written run;
--plot on two runs (valid PNGs of the figures mini/plots.py built) and without matplotlib.

    python mini/test_analyze_metrics.py
"""
import builtins
import importlib.util
import json
import os
import sys

import pytest

spec = importlib.util.spec_from_file_location(
    "analyze_metrics", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "analyze_metrics.py"))
am = importlib.util.module_from_spec(spec)
spec.loader.exec_module(am)


def write_run(tmp_path, rows):
    tmp_path.mkdir(parents=True, exist_ok=True)
    with open(tmp_path / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(tmp_path)


def png_size(path):
    """(width, height) from a PNG's IHDR chunk, after checking the 8-byte signature."""
    head = open(path, "rb").read(24)
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", path
    return int.from_bytes(head[16:20], "big"), int.from_bytes(head[20:24], "big")


def test_window_means_by_hand():
    rows = [{"step": 1, "kl": 1.0}, {"step": 2, "kl": 3.0, "entropy": 2.0}, {"step": 3, "kl": 5.0}]
    assert am.window_means(rows, ["kl", "entropy"], 2) == [(1, 2, {"kl": 2.0, "entropy": 2.0}), (3, 3, {"kl": 5.0})]
    assert [w[:2] for w in am.window_means(rows, ["kl"], 10)] == [(1, 1), (2, 2), (3, 3)]  # one row each
    edited = [{"step": 1, "kl": None}, {"step": 2, "kl": 4.0}, {"step": 3, "kl": "n/a"}, {"step": 4, "kl": True}]
    assert am.window_means(edited, ["kl"], 1) == [(1, 4, {"kl": 4.0})]  # a hand-edited file: a true is no number
    eleven = [{"step": i} for i in range(1, 12)]
    assert len(am.window_means(eleven, [], 10)) == 10  # as many windows as asked, sizes 1 or 2


def test_warnings_name_the_failure_modes():
    healthy = [{"step": i, "reward_mean": 0.1 * i, "kl": 0.01, "zero_var_share": 0.1, "clip_frac": 0.0}
               for i in range(1, 11)]
    assert am.warnings(healthy) == []
    assert am.warnings(healthy[:1]) == []  # one step: nothing to compare
    flat = [{"step": i, "reward_mean": 0.5} for i in range(1, 11)]
    assert am.warnings(flat[:9]) == [] and am.warnings(flat) == [  # the reward is judged from 10 steps on
        "the training reward did not rise from the first fifth of the run to the last"]
    assert am.warnings(healthy[:-1] + [dict(healthy[-1], grad_norm=float("inf"))]) == [
        "some logged values are NaN or infinite"]
    stuck = [{"step": i, "reward_mean": 0.5, "kl": 0.3, "zero_var_share": 0.8, "clip_frac": 0.3} for i in range(1, 11)]
    stuck[-1].update(eval_reward=0.1)
    stuck[0].update(eval_reward=0.4, loss=float("nan"))
    found = " ".join(am.warnings(stuck))
    for phrase in ("equal rewards", "KL to the start model", "clipped", "did not rise", "held-out reward fell", "NaN"):
        assert phrase in found


def test_cli_prints_trend_and_evals(tmp_path, capsys):
    rows = [{"step": i, "reward_mean": 0.1 * i, "kl": 0.01, "time_step": 6.0} for i in range(1, 11)]
    rows[4].update(eval_reward=0.3, eval_reward_P=0.2)
    rows[-1].update(eval_reward=0.5)  # a later evaluation without every key
    am.main([write_run(tmp_path, rows), "--windows", "2"])
    out = capsys.readouterr().out
    assert "10 steps, 1.0 min" in out and "1-5" in out and "6-10" in out and "held-out evaluation" in out


def test_hand_edited_values_and_a_bom_are_read_as_no_value(tmp_path, capsys):
    """A string or a null where a number was (a hand-edited file) is shown as '-' and left out of sums and
    warnings; a BOM an editor wrote first is no damage."""
    rows = [{"step": i, "reward_mean": 0.1 * i, "time_step": 6.0} for i in range(1, 11)]
    rows[1].update(time_step="x", eval_reward="x")
    rows[4].update(eval_reward=None, eval_reward_P=0.2)
    rows[-1].update(eval_reward=0.5)
    run = write_run(tmp_path, rows)
    path = os.path.join(run, "metrics.jsonl")
    with open(path, "rb") as f:
        text = f.read()
    with open(path, "wb") as f:
        f.write(b"\xef\xbb\xbf" + text)
    am.main([run, "--windows", "2"])
    out = capsys.readouterr().out
    assert "10 steps, 0.9 min" in out and "warning: held-out reward fell" not in out
    evals = out.split("held-out evaluation")[1].splitlines()
    assert evals[2].split() == ["2", "-", "-"] and evals[3].split() == ["5", "-", "0.200"]


def test_cli_explains_bad_input(tmp_path, capsys):
    with pytest.raises(SystemExit, match="does not exist"):
        am.main([str(tmp_path / "nope")])
    run = write_run(tmp_path, [{"step": 1}, {"step": 2}])
    with pytest.raises(SystemExit):
        am.main([run, "--windows", "0"])
    with pytest.raises(SystemExit):
        am.main([run, "--out", str(tmp_path / "plots")])  # --out without --plot
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "lo')  # a run killed mid-write: the cut-off last line is skipped
    assert [r["step"] for r in am.load_metrics(run)] == [1, 2]
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('\n{"step": 4}\n')
    with pytest.raises(SystemExit, match="metrics.jsonl:3: not a JSON row"):
        am.main([run])
    for step in (None, "2", True, -1, 1.5):  # a hand-edited step: no sort of mixed types, no "True-True" window
        write_run(tmp_path, [{"step": 1}, {"step": step}])
        with pytest.raises(SystemExit, match=f"holds a step of {step!r}, not a whole number"):
            am.main([run])
    write_run(tmp_path, [])
    with pytest.raises(SystemExit, match="metrics.jsonl is empty: the run logged no step yet"):
        am.main([run])
    (tmp_path / "folder" / "metrics.jsonl").mkdir(parents=True)  # unreadable: a folder where the file should be
    with pytest.raises(SystemExit, match=f"cannot read {tmp_path / 'folder' / 'metrics.jsonl'}: Is a directory$"):
        am.main([str(tmp_path / "folder")])
    (tmp_path / "report.json").write_text("{}")
    with pytest.raises(SystemExit, match="is a report, not a run's metrics.jsonl"):
        am.main([str(tmp_path / "report.json")])
    write_run(tmp_path, [{"step": 1}, {"step": 2}])
    with pytest.raises(SystemExit):
        am.main([run, "--plot", "--out", str(tmp_path / "report.json")])
    assert f"error: --out {tmp_path / 'report.json'} is a file; name a folder" in capsys.readouterr().err
    under_a_file = tmp_path / "report.json" / "plots"  # a file on the way: one sentence after the summary
    with pytest.raises(SystemExit, match=f"cannot write the plots to {under_a_file}: Not a directory; pick another"):
        am.main([run, "--plot", "--out", str(under_a_file)])


def test_cli_several_runs_print_each_summary(tmp_path, capsys):
    a = write_run(tmp_path / "a", [{"step": i, "reward_mean": 0.1 * i} for i in range(1, 5)])
    b = write_run(tmp_path / "b", [{"step": i, "kl": 0.5} for i in range(1, 3)])
    am.main([a, b + "/metrics.jsonl", "--windows", "2"])
    out = capsys.readouterr().out
    assert out.index("== a ==") < out.index("4 steps\n") < out.index("== b ==") < out.index("2 steps\n")  # no time_step: no minutes
    assert "KL to the start model is 0.50" in out  # each run gets its own warnings
    twins = [write_run(tmp_path / side / "run", [{"step": 1, "kl": 0.0}]) for side in ("left", "right")]
    am.main(twins)  # two runs named alike in different folders: each headed by its path
    out = capsys.readouterr().out
    assert f"== {os.path.normpath(twins[0])} ==" in out and f"== {os.path.normpath(twins[1])} ==" in out


def test_cli_plot_two_runs(tmp_path, monkeypatch, capsys):
    pytest.importorskip("matplotlib", reason='matplotlib is an optional extra: pip install -e ".[plot]"')
    from mini import plots
    from mini.test_plots import line_labels, synthetic_rows
    written, write_run_plots = {}, plots.write_run_plots

    def spy(runs, out):  # keeps the figures main() saved, to read their axes
        written.update(write_run_plots(runs, out))
        return written

    monkeypatch.setattr(plots, "write_run_plots", spy)
    runs = [write_run(tmp_path / name, synthetic_rows(shift=shift)) for name, shift in (("base", 0.0), ("lr-up", 0.1))]
    am.main(runs + ["--plot", "--out", str(tmp_path / "plots")])
    names = ["train.png", "eval.png", "chess.png"]
    assert sorted(written) == sorted(str(tmp_path / "plots" / n) for n in names)
    out = capsys.readouterr().out
    assert "== base ==" in out and all(f"wrote {tmp_path / 'plots' / n}" in out for n in names)
    for path, fig in written.items():
        w, h = fig.get_size_inches() * plots.DPI
        assert png_size(path) == (round(w), round(h)) and w > 400 and h > 150
    train = written[str(tmp_path / "plots" / "train.png")]
    assert [ax.get_title() for ax in train.axes[:2]] == ["reward, rolling mean of 2", "reward, P: task, rolling mean of 2"]
    assert all(line_labels(ax) == ["base", "lr-up"] for ax in train.axes[:3] + train.axes[4:7])
    assert train.axes[-1].get_title() == "seconds per phase: lr-up"
    held_out = written[str(tmp_path / "plots" / "eval.png")]
    assert [ax.get_title() for ax in held_out.axes] == ["eval_reward", "eval_P_invalid"]
    assert line_labels(held_out.axes[0]) == ["base", "lr-up"]
    small = write_run(tmp_path / "small", [{"step": 1, "kl": 0.1}])
    am.main([small + "/metrics.jsonl", "--plot"])  # default folder: plots/ in the (first) run directory
    assert os.listdir(tmp_path / "small" / "plots") == ["train.png"]


def test_cli_plot_without_matplotlib_says_how_to_install(tmp_path, monkeypatch, capsys):
    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.split(".")[0] == "matplotlib":
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    monkeypatch.delitem(sys.modules, "mini.plots", raising=False)  # import it afresh, as in a new process
    if "mini" in sys.modules:
        monkeypatch.delattr(sys.modules["mini"], "plots", raising=False)
    run = write_run(tmp_path, [{"step": 1, "reward_mean": 0.1}])
    with pytest.raises(SystemExit) as e:
        am.main([run, "--plot"])
    assert e.value.code == 'analyze_metrics.py: plotting needs matplotlib, an optional extra: pip install -e ".[plot]"'
    assert "1 steps" in capsys.readouterr().out and not os.path.exists(tmp_path / "plots")


def test_warnings_read_the_last_fifth_and_their_thresholds_are_strict():
    """The late-run warnings average the last fifth of the rows (not the whole run, not the last row), fire only
    strictly above their thresholds, and the reward check compares the first fifth's mean with the last fifth's."""
    base = lambda i: {"step": i, "reward_mean": 0.1 * i, "kl": 0.0, "zero_var_share": 0.0, "clip_frac": 0.0}
    rows = [base(i) for i in range(1, 21)]  # fifths of 4 rows
    for r in rows[:16]:
        r.update(kl=1.0, zero_var_share=1.0, clip_frac=1.0)  # bad early, fine late: no warning
    assert am.warnings(rows) == []
    rows = [base(i) for i in range(1, 21)]
    for r, kl, zv, clip in zip(rows[16:], (0.9, 0.0, 0.0, 0.0), (1.0, 1.0, 0.2, 0.0), (0.8, 0.0, 0.0, 0.0)):
        r.update(kl=kl, zero_var_share=zv, clip_frac=clip)  # late means: KL 0.225, equal-reward 0.55, clip 0.2
    found = am.warnings(rows)
    assert len(found) == 2 and "KL to the start model is 0.23" in found[1] and found[0].startswith("55% of groups")
    at = [dict(base(i), kl=0.2, zero_var_share=0.5, clip_frac=0.2) for i in range(1, 11)]
    assert am.warnings(at) == []  # exactly at each threshold: no warning
    rewards = [0.4, 0.4, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.7, 0.2]  # fifths of 2: first 0.4, last 0.45 (last row 0.2)
    assert am.warnings([{"step": i, "reward_mean": r} for i, r in enumerate(rewards, 1)]) == []
    rewards[-1] = 0.1  # last fifth 0.4: not above the first
    assert am.warnings([{"step": i, "reward_mean": r} for i, r in enumerate(rewards, 1)]) == [
        "the training reward did not rise from the first fifth of the run to the last"]


def test_the_reward_warning_needs_a_reward_in_both_fifths():
    """A run that logged no reward, or none in its first fifth (nulls of a hand-edited file), is not said to have
    a flat reward: there is nothing to compare."""
    assert am.warnings([{"step": i, "kl": 0.01} for i in range(1, 11)]) == []
    assert am.warnings([{"step": i, "reward_mean": None if i <= 2 else -0.2} for i in range(1, 11)]) == []
    assert am.warnings([{"step": i, "reward_mean": 0.0} for i in range(1, 11)]) == [  # a logged 0.0 is a reward
        "the training reward did not rise from the first fifth of the run to the last"]


def test_the_run_in_the_current_folder_is_named_by_that_folder(tmp_path, monkeypatch):
    """`analyze_metrics.py .` or `analyze_metrics.py metrics.jsonl` inside a run directory heads and labels the
    run by the directory's name, not "." or an empty name."""
    run = write_run(tmp_path / "demo", [{"step": 1}])
    monkeypatch.chdir(run)
    assert [am.run_name(p) for p in (".", "metrics.jsonl", "./", run, run + "/metrics.jsonl")] == ["demo"] * 5


def test_the_held_out_warning_compares_the_first_evaluation_with_the_last():
    """Not the last two, not the best: 0.4, 0.1, 0.3 fell over the run; 0.3, 0.5, 0.4 and 0.3, 0.5, 0.3 did not."""
    def warned(evals):
        return [w for w in am.warnings([{"step": i, "eval_reward": e} for i, e in enumerate(evals, 1)])
                if w.startswith("held-out")]
    assert warned([0.4, 0.1, 0.3]) == ["held-out reward fell from 0.400 (step 1) to 0.300 (step 3)"]
    assert warned([0.3, 0.5, 0.4]) == [] and warned([0.3]) == [] and warned([0.3, 0.5, 0.3]) == []  # back: no fall


def test_rows_come_back_in_step_order_and_windows_split_by_hand(tmp_path):
    """A metrics.jsonl written out of order (a resumed run appends, a merge) is read in step order, so the trend
    windows and the first/last fifths are the run's; 5 rows in 2 windows split 2 + 3 (bounds round(i * 5 / 2))."""
    run = write_run(tmp_path, [{"step": s, "kl": float(s)} for s in (3, 1, 5, 2, 4)])
    rows = am.load_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert am.window_means(rows, ["kl"], 2) == [(1, 2, {"kl": 1.5}), (3, 5, {"kl": 4.0})]
    assert am.window_means(rows, ["kl"], 3) == [(1, 2, {"kl": 1.5}), (3, 3, {"kl": 3.0}), (4, 5, {"kl": 4.5})]


def test_a_whole_number_past_a_floats_range_is_no_value(tmp_path, capsys):
    """10**400 in a hand-edited metrics.jsonl (JSON reads it as an int) is shown as '-' and left out of the means
    and the minutes, where dividing it raised OverflowError."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(f'{{"step": 1, "reward_mean": 1{"0" * 400}, "time_step": 1{"0" * 400}}}\n'
                                       '{"step": 2, "reward_mean": 0.5, "time_step": 60.0}\n')
    am.main([str(run)])
    out = capsys.readouterr().out
    assert "2 steps, 1.0 min" in out and out.splitlines()[3].split() == ["1-1", "-", "-"]
    assert out.splitlines()[4].split() == ["2-2", "0.500", "60.000"]



def test_a_step_logged_twice_counts_once_with_its_later_row(tmp_path, capsys):
    """A resume that did not cut metrics.jsonl back (an older version, a copied log) leaves steps logged twice: the
    later row (the resumed run's) is the step's, so the step count, the windows and the warnings are the run's."""
    run = write_run(tmp_path, [{"step": 1, "kl": 1.0}, {"step": 2, "kl": 9.0}, {"step": 3, "kl": 9.0},
                               {"step": 2, "kl": 2.0}, {"step": 3, "kl": 3.0}])
    assert [(r["step"], r["kl"]) for r in am.load_metrics(run)] == [(1, 1.0), (2, 2.0), (3, 3.0)]
    am.main([run, "--windows", "1"])
    out, err = capsys.readouterr()
    assert out.startswith("3 steps\n") and out.splitlines()[3].split() == ["1-3", "2.000"]
    assert "2 rows repeat an earlier step (a resumed run); the later row of each step is used" in err


def test_a_plot_of_a_run_with_no_plotted_value_says_none_was_written(tmp_path, capsys):
    """--plot of a run whose rows hold only their steps draws no figure: a sentence says so, where it ended as if done."""
    pytest.importorskip("matplotlib")
    run = write_run(tmp_path / "run", [{"step": 1}, {"step": 2}])
    am.main([run, "--plot", "--out", str(tmp_path / "plots")])
    err = capsys.readouterr().err
    assert "no plot written: the run logs no value any plot shows" in err and not os.listdir(tmp_path / "plots")


def test_a_runs_samples_jsonl_is_named_not_summarised(tmp_path):
    """samples.jsonl (rows with a step too, several a step) given for metrics.jsonl: one sentence, not a summary of
    steps with no metric (nor a warning of repeated steps)."""
    path = tmp_path / "samples.jsonl"
    path.write_text("".join(json.dumps({"step": 1, "task": "P", "prompt": "P: x", "completion": "y", "reward": 0.5})
                            + "\n" for _ in range(3)))
    with pytest.raises(SystemExit, match="samples.jsonl holds completions, not metrics: it is a run's samples.jsonl"):
        am.main([str(path)])

if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
