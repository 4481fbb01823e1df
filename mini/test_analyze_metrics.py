"""analyze_metrics.py (at the repository root): window means, warnings and the CLI on a written run.

    python mini/test_analyze_metrics.py
"""
import importlib.util
import json
import os

import pytest

spec = importlib.util.spec_from_file_location(
    "analyze_metrics", os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "analyze_metrics.py"))
am = importlib.util.module_from_spec(spec)
spec.loader.exec_module(am)


def write_run(tmp_path, rows):
    with open(tmp_path / "metrics.jsonl", "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    return str(tmp_path)


def test_window_means_by_hand():
    rows = [{"step": 1, "kl": 1.0}, {"step": 2, "kl": 3.0, "entropy": 2.0}, {"step": 3, "kl": 5.0}]
    assert am.window_means(rows, ["kl", "entropy"], 2) == [(1, 2, {"kl": 2.0, "entropy": 2.0}), (3, 3, {"kl": 5.0})]
    assert [w[:2] for w in am.window_means(rows, ["kl"], 10)] == [(1, 1), (2, 2), (3, 3)]  # one row each
    eleven = [{"step": i} for i in range(1, 12)]
    assert len(am.window_means(eleven, [], 10)) == 10  # as many windows as asked, sizes 1 or 2


def test_warnings_name_the_failure_modes():
    healthy = [{"step": i, "reward_mean": 0.1 * i, "kl": 0.01, "zero_var_share": 0.1, "clip_frac": 0.0}
               for i in range(1, 11)]
    assert am.warnings(healthy) == []
    assert am.warnings(healthy[:1]) == []  # one step: nothing to compare
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


def test_cli_explains_bad_input(tmp_path):
    with pytest.raises(SystemExit, match="does not exist"):
        am.main([str(tmp_path / "nope")])
    run = write_run(tmp_path, [{"step": 1}, {"step": 2}])
    with pytest.raises(SystemExit):
        am.main([run, "--windows", "0"])
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 3, "lo')  # a run killed mid-write: the cut-off last line is skipped
    assert [r["step"] for r in am.load_metrics(run)] == [1, 2]
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('\n{"step": 4}\n')
    with pytest.raises(SystemExit, match="metrics.jsonl:3: not a step record"):
        am.main([run])


if __name__ == "__main__":
    import sys
    sys.exit(pytest.main([__file__, "-q"]))
