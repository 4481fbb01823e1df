"""mini/report.py: TRL's names, the scalars a dashboard gets, TensorBoard read back from its event file,
the one-sentence error of a missing package, W&B offline where wandb is installed.

    python mini/test_report.py
"""
import glob
import math
import os
import pathlib
import sys
import threading
import types

import numpy as np
import pytest

from mini.report import TRL_NAMES, dashboard_scalars, make_reporter, markdown_table, trl_name

ROWS = [{"step": 1, "reward_mean": 0.25, "kl": 0.01, "best_P": 0.5, "eval_reward": 0.3, "note": "text", "x": None},
        {"step": 2, "reward_mean": 0.5, "kl": 0.02, "best_P": 0.75, "entropy": float("nan")}]
SAMPLES = [{"step": 2, "task": "P", "prompt": "P: 8/8/8/8/8/8/8/K1k5 w - - 0 1", "completion": "M: a1a2 | b\nB: a1a2",
            "reward": 0.6}, {"step": 2, "task": "A", "prompt": "A: x", "completion": "y+0+0+0", "reward": -0.3}]


def test_trl_names():
    assert trl_name("reward_mean") == "reward" and trl_name("zero_var_share") == "frac_reward_zero_std"
    assert trl_name("clip_low_frac") == "clip_ratio/low_mean" and trl_name("clip_frac") == "clip_ratio/region_mean"
    assert trl_name("completion_len_mean") == "completions/mean_length"
    assert trl_name("best_P") == "rewards/best_P/mean" and trl_name("fen_exact_A") == "rewards/fen_exact_A/mean"
    for ours in ("reward_mean_P", "reward_std_A", "eval_reward_P", "chess_mate_acc", "time_update", "peak_mem_mb"):
        assert trl_name(ours) is None, ours
    assert len(set(TRL_NAMES.values())) == len(TRL_NAMES)  # one TRL name per quantity


def test_trl_names_are_the_ones_trl_logs():
    """Every shared concept under the exact name TRL's GRPOTrainer (or Hugging Face's Trainer) logs it, written out
    here by hand, so that a renamed or dropped entry shows: a TRL user's chart would find nothing under it."""
    assert TRL_NAMES == {
        "reward_mean": "reward", "reward_std": "reward_std", "zero_var_share": "frac_reward_zero_std", "kl": "kl",
        "entropy": "entropy", "clip_low_frac": "clip_ratio/low_mean", "clip_high_frac": "clip_ratio/high_mean",
        "clip_frac": "clip_ratio/region_mean", "completion_len_mean": "completions/mean_length",
        "completion_clipped_ratio": "completions/clipped_ratio", "loss": "loss", "grad_norm": "grad_norm",
        "lr": "learning_rate"}


def test_dashboard_scalars_group_and_skip():
    got = dashboard_scalars(ROWS[0])
    assert got == {"mini/reward_mean": 0.25, "train/reward": 0.25, "mini/kl": 0.01, "train/kl": 0.01,
                   "mini/best_P": 0.5, "train/rewards/best_P/mean": 0.5, "eval/eval_reward": 0.3}
    assert math.isnan(dashboard_scalars(ROWS[1])["train/entropy"])  # NaN is logged: the chart shows the break
    # numpy scalars (a value computed with numpy and not converted) are numbers too; a numpy bool is no scalar
    assert dashboard_scalars({"step": 3, "kl": np.float32(0.5), "n": np.int64(2), "ok": np.bool_(True)}) == {
        "mini/kl": 0.5, "train/kl": 0.5, "mini/n": 2.0}


def test_markdown_table_keeps_a_completion_in_its_cell():
    lines = markdown_table(SAMPLES).splitlines()
    assert len(lines) == 4 and lines[0] == "| step | task | prompt | completion | reward |"
    assert lines[1] == "|---|---|---|---|---|"  # a separator cell per column, or markdown shows no table
    assert "M: a1a2 \\| b B: a1a2" in lines[2] and lines[2].endswith("| 0.600 |")
    assert markdown_table([{"step": 3, "task": "A"}]).splitlines()[2] == "| 3 | A |  |  |  |"  # a missing cell is empty


def test_markdown_table_keeps_a_carriage_return_in_its_cell():
    """Markdown (and TensorBoard's renderer) ends a row at a lone \\r as at a \\n: a completion holding one would
    spill its tail into a new row of the table."""
    table = markdown_table([{"step": 1, "task": "P", "prompt": "a", "completion": "x\ry\r\nz", "reward": 0.5}])
    assert table.splitlines()[2] == "| 1 | P | a | x y  z | 0.500 |"  # splitlines splits at \\r as markdown does


def test_markdown_table_escapes_a_backslash_before_a_bar():
    """a\\|b escaped as a\\\\|b read as an escaped backslash and then a bar that ends the cell; the backslash is
    escaped first."""
    row = markdown_table([{"step": 1, "task": "P", "prompt": "a\\|b", "completion": "c\\", "reward": 0.5}]).splitlines()[2]
    assert row == "| 1 | P | a\\\\\\|b | c\\\\ | 0.500 |"


def test_tensorboard_event_file(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is an optional extra: pip install -e \".[tensorboard]\"")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    r = make_reporter("tensorboard", str(tmp_path), {"lr": 2e-5, "run_name": "t"})
    assert list(tmp_path.iterdir()) == []  # nothing is written before the first step
    for row in ROWS:
        r.log(row["step"], row)
    r.log_samples(2, SAMPLES)
    r.close()
    ea = EventAccumulator(str(tmp_path / "tensorboard"))
    ea.Reload()
    read = lambda tag: [(e.step, pytest.approx(e.value)) for e in ea.Scalars(tag)]
    assert read("train/reward") == read("mini/reward_mean") == [(1, 0.25), (2, 0.5)]
    assert read("train/kl") == [(1, 0.01), (2, 0.02)]
    assert read("eval/eval_reward") == [(1, 0.3)]
    assert not any("note" in t or t.endswith("/x") for t in ea.Tags()["scalars"])
    text = ea.Tensors("completions/text_summary")[0]
    assert text.step == 2 and "a1a2 \\| b" in text.tensor_proto.string_val[0].decode()


def test_tensorboard_resume_drops_the_interrupted_steps(tmp_path):
    pytest.importorskip("tensorboard", reason="tensorboard is an optional extra: pip install -e \".[tensorboard]\"")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    r = make_reporter("tensorboard", str(tmp_path), {})
    for step in (1, 2, 3):
        r.log(step, {"kl": float(step)})
    r.close()
    r = make_reporter("tensorboard", str(tmp_path), {})  # a run resumed from its step-1 checkpoint
    for step in (2, 3):
        r.log(step, {"kl": 10.0 * step})
    r.close()
    ea = EventAccumulator(str(tmp_path / "tensorboard"))
    ea.Reload()
    assert [(e.step, e.value) for e in ea.Scalars("train/kl")] == [(1, 1.0), (2, 20.0), (3, 30.0)]


def test_tensorboard_rewind_drops_the_abandoned_steps(tmp_path):
    """A rollback inside a run (to step 1): the steps logged again replace the abandoned ones."""
    pytest.importorskip("tensorboard", reason="tensorboard is an optional extra: pip install -e \".[tensorboard]\"")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    r = make_reporter("tensorboard", str(tmp_path), {})
    for step in (1, 2, 3):
        r.log(step, {"kl": float(step)})
    r.rewind(1)
    for step in (2, 3, 4):
        r.log(step, {"kl": 10.0 * step})
    r.close()
    ea = EventAccumulator(str(tmp_path / "tensorboard"))
    ea.Reload()
    assert [(e.step, e.value) for e in ea.Scalars("train/kl")] == [(1, 1.0), (2, 20.0), (3, 30.0), (4, 40.0)]


def test_tensorboard_closes_before_its_first_step_and_after_a_rewind(tmp_path):
    """A run stopped before it logs anything, or right after a rollback, closes its reporter without an error
    (the writer is made at the first step logged); the first leaves no event file behind."""
    pytest.importorskip("tensorboard", reason="tensorboard is an optional extra: pip install -e \".[tensorboard]\"")
    make_reporter("tensorboard", str(tmp_path / "a"), {}).close()
    r = make_reporter("tensorboard", str(tmp_path / "b"), {})
    r.log(1, {"kl": 1.0})
    r.rewind(1)
    r.close()
    assert not os.path.exists(tmp_path / "a" / "tensorboard")


class FakeWandb:
    """wandb's init, log, finish and Table, recorded: which run got which settings, steps and rows (a Table as
    its rows of {column: value}); with `error`, init raises it, as wandb does without a login."""

    def __init__(self, error=None):
        self.runs, self.error = [], error

    def init(self, name, group, **kw):
        if self.error:
            raise self.error
        run = types.SimpleNamespace(name=name, group=group, settings=kw, steps=[], rows=[], finished=False)
        run.log = lambda row, step: (run.steps.append(step), run.rows.append(row))
        run.finish = lambda: setattr(run, "finished", True)
        self.runs.append(run)
        return run

    @staticmethod
    def Table(columns, data):
        return [dict(zip(columns, values)) for values in data]


def test_wandb_rewind_goes_on_in_a_new_run_of_the_group(tmp_path, monkeypatch):
    """A W&B run's steps only increase, so after a rollback to step 1 the redone steps go to a second run."""
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    r = make_reporter("wandb", str(tmp_path / "demo"), {})
    for step in (1, 2, 3):
        r.log(step, {"kl": 1.0})
    r.rewind(1)
    for step in (2, 3):
        r.log(step, {"kl": 1.0})
    r.close()
    assert [(run.name, run.group, run.steps, run.finished) for run in fake.runs] == [
        ("demo", "demo", [1, 2, 3], True), ("demo-from-1", "demo", [2, 3], True)]
    make_reporter("wandb", str(tmp_path / "slash") + "/", {}).close()  # a run directory typed with a trailing /
    assert (fake.runs[-1].name, fake.runs[-1].group) == ("slash", "slash")


def test_wandb_run_takes_the_project_its_folder_the_config_and_the_samples(tmp_path, monkeypatch):
    """WANDB_PROJECT names the project (rookworld-grpo-mini without it); a W&B run writes under its run directory
    with the run's config; the completions table holds each sample's values under their own columns."""
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    monkeypatch.delenv("WANDB_PROJECT", raising=False)
    make_reporter("wandb", str(tmp_path / "a"), {"lr": 2e-5}).close()
    monkeypatch.setenv("WANDB_PROJECT", "mine")
    make_reporter("wandb", str(tmp_path / "b"), {}).log_samples(2, SAMPLES)
    assert [run.settings for run in fake.runs] == [
        {"project": "rookworld-grpo-mini", "dir": str(tmp_path / "a"), "config": {"lr": 2e-5}},
        {"project": "mine", "dir": str(tmp_path / "b"), "config": {}}]
    assert fake.runs[1].rows == [{"completions": SAMPLES}] and fake.runs[1].steps == [2]


def test_wandb_that_cannot_start_is_one_sentence(tmp_path, monkeypatch):
    """wandb.init's own error (no API key, no network) becomes one sentence saying what to do, at construction."""
    monkeypatch.setitem(sys.modules, "wandb", FakeWandb(error=RuntimeError("api_key not configured (no-tty).\n")))
    with pytest.raises(ValueError) as e:
        make_reporter("wandb", str(tmp_path), {})
    assert str(e.value) == ("--report_to wandb could not start (api_key not configured (no-tty)); run `wandb login` "
                            "or set WANDB_MODE=offline")


@pytest.mark.parametrize("kind,module", [("tensorboard", "torch.utils.tensorboard"), ("wandb", "wandb")])
def test_missing_package_is_one_sentence_at_construction(tmp_path, monkeypatch, kind, module):
    monkeypatch.setitem(sys.modules, module, None)  # import now raises ModuleNotFoundError
    with pytest.raises(ValueError) as e:
        make_reporter(kind, str(tmp_path), {})
    assert str(e.value) == f'--report_to {kind} needs the {kind} package: pip install -e ".[{kind}]"'


def test_none_and_unknown_kind(tmp_path):
    r = make_reporter("none", str(tmp_path), {})
    r.log(1, ROWS[0])
    r.log_samples(1, SAMPLES)
    r.close()
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(ValueError, match="--report_to must be one of none, tensorboard, wandb, not 'mlflow'"):
        make_reporter("mlflow", str(tmp_path), {})


def test_wandb_offline(tmp_path, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is an optional extra, not in .[test]: pip install -e \".[wandb]\"")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    r = make_reporter("wandb", str(tmp_path), {"lr": 2e-5})
    for row in ROWS:
        r.log(row["step"], row)
    r.log_samples(2, SAMPLES)
    r.close()
    assert glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))


def test_chess_keys_are_held_out_and_flags_are_not_scalars():
    """chess_* (--eval_chess) goes to the eval/ section like eval_*, with no TRL name even per task; a bool (a flag
    in a row) is no scalar to chart; an int is."""
    assert dashboard_scalars({"step": 3, "chess_mate_acc": 0.25, "chess_score_P": 0.5, "stopped": True, "n": 2}) == {
        "eval/chess_mate_acc": 0.25, "eval/chess_score_P": 0.5, "mini/n": 2.0}
    assert trl_name("chess_score_P") is None and trl_name("reward_std_P") is None and trl_name("format_valid_A") == \
        "rewards/format_valid_A/mean"


def test_tensorboard_gets_the_config_once(tmp_path):
    """The run's config is written as text at the first step logged (the dashboard's record of the settings), a
    value JSON has no type for (a path) as its text, not a TypeError at the first step."""
    pytest.importorskip("tensorboard", reason="tensorboard is an optional extra: pip install -e \".[tensorboard]\"")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    r = make_reporter("tensorboard", str(tmp_path), {"lr": 2e-5, "run_name": "cfg-run", "log_dir": pathlib.Path("x")})
    r.log(4, {"kl": 0.5})
    r.log(5, {"kl": 0.25})
    r.close()
    ea = EventAccumulator(str(tmp_path / "tensorboard"))
    ea.Reload()
    (text,) = ea.Tensors("config/text_summary")
    assert text.step == 4 and '"run_name": "cfg-run"' in text.tensor_proto.string_val[0].decode()
    assert '"log_dir": "x"' in text.tensor_proto.string_val[0].decode()  # a value JSON has no type for, as its text
    assert [(e.step, e.value) for e in ea.Scalars("mini/kl")] == [(4, 0.5), (5, 0.25)]

def test_wandb_gets_the_dashboard_names_and_a_missing_cell_is_null(tmp_path, monkeypatch):
    """W&B charts the same tags as TensorBoard (train/<TRL name>, mini/, eval/); a sample without a column gets a null
    cell, not '' (text in the numeric reward column, which a wandb.Table refuses)."""
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    r = make_reporter("wandb", str(tmp_path / "demo"), {})
    r.log(1, ROWS[0])
    r.log_samples(1, [{"step": 1, "task": "P", "prompt": "p", "completion": "c"}])
    r.close()
    assert fake.runs[0].rows == [dashboard_scalars(ROWS[0]), {"completions": [
        {"step": 1, "task": "P", "prompt": "p", "completion": "c", "reward": None}]}]
    assert fake.runs[0].rows[0]["train/reward"] == 0.25 and fake.runs[0].rows[0]["eval/eval_reward"] == 0.3


def test_a_package_that_fails_to_import_is_one_sentence(tmp_path, monkeypatch):
    """An installed package whose import fails (a plain ImportError: a missing shared library) is the same one
    sentence as a missing one, not a traceback."""
    (tmp_path / "wandb.py").write_text('raise ImportError("libfoo.so: cannot open shared object file")\n')
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "wandb", raising=False)
    with pytest.raises(ValueError) as e:
        make_reporter("wandb", str(tmp_path / "run"), {})
    assert str(e.value) == '--report_to wandb needs the wandb package: pip install -e ".[wandb]"'


def test_tensorboard_close_stops_its_writer_thread(tmp_path):
    """A closed reporter leaves no writer thread running, nor does the writer a rollback replaces: a long process (a
    sweep of runs, a rollback each) would otherwise pile up one per writer made."""
    pytest.importorskip("tensorboard", reason="tensorboard is an optional extra: pip install -e \".[tensorboard]\"")
    before = set(threading.enumerate())
    r = make_reporter("tensorboard", str(tmp_path), {})
    r.log(1, {"kl": 1.0})
    assert set(threading.enumerate()) - before  # the check sees the writer's thread while it is open
    r.rewind(0)
    r.log(1, {"kl": 2.0})
    r.close()
    assert [t for t in set(threading.enumerate()) - before if t.is_alive()] == []


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
