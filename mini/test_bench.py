"""The benchmarks and the speedrun run end to end at toy sizes on a CPU (no timing is asserted: shared machines
make any speed threshold flaky): `speedrun.sh --cpu-smoke` runs every stage once for the module, and its
figures are checked here; bench.py's sampler and scoring modes and the missing-TRL message run in-process.

    python mini/test_bench.py
"""
import importlib.util
import json
import shutil
import os
import re
import subprocess
import sys

import pytest
import torch

from mini import bench
from mini.config import POOL_PATH

HERE = os.path.dirname(os.path.abspath(__file__))
HAS_TRL = all(importlib.util.find_spec(m) for m in ("trl", "datasets", "transformers"))


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """(completed process, output folder) of `bash mini/speedrun.sh --cpu-smoke`."""
    out = tmp_path_factory.mktemp("speedrun")
    proc = subprocess.run(["bash", os.path.join(HERE, "speedrun.sh"), "--cpu-smoke", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHON": sys.executable})
    return proc, out


@pytest.mark.long(190)  # its module fixture runs speedrun.sh
def test_speedrun_cpu_smoke_runs_every_stage_and_prints_the_table(smoke):
    proc, out = smoke
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for stage in ("test", "bench", "train", "eval", "ddp"):
        assert f"=== stage {stage}: ok" in proc.stdout
        assert (out / f"{stage}.log").exists()
    table = proc.stdout[proc.stdout.index("== speedrun summary"):]
    for row in ("completions/s ours", "rollout ours / transformers", "training phase", "decode bandwidth",
                "auto_batch_size", "shared-prefix decode cache", "GRPO peak memory, step 1 vs 2",
                "eval_reward, before -> after",
                "1-GPU torchrun vs plain", "completions/s plain vs DDP-wrapped"):
        assert row in table, row
    assert (out / "summary.txt").read_text().strip() == table.strip()
    # torchrun with one process (DDP-wrapped, gloo) takes the plain run's steps at the same seed
    plain, ddp = ([json.loads(line) for line in open(out / run / "metrics.jsonl")] for run in ("ddp_plain", "ddp_torchrun"))
    assert len(plain) == len(ddp) == 2
    for a, b in zip(plain, ddp):
        for k in ("reward_mean", "loss", "kl", "grad_norm"):
            assert a[k] == pytest.approx(b[k], rel=1e-6, abs=1e-9), k


def test_a_failed_stage_leaves_no_earlier_figures_for_the_summary(tmp_path):
    """The eval stage fails (no models here) in a folder that holds an earlier run's reports: they go, and the
    summary prints no before -> after of that run as if it were this one's."""
    for name, reward in (("eval_before.json", 0.1), ("eval_after.json", 0.9)):
        (tmp_path / name).write_text(json.dumps({"metrics": {"eval_reward": reward}}))
    proc = subprocess.run(["bash", os.path.join(HERE, "speedrun.sh"), "--cpu-smoke", "--out", str(tmp_path), "eval"],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHON": sys.executable})
    assert proc.returncode != 0 and "=== stage eval: FAILED" in proc.stdout
    assert "before -> after" not in proc.stdout and not (tmp_path / "eval_before.json").exists()


def test_step_bench_figures(smoke):
    _, out = smoke
    b = json.loads((out / "bench.json").read_text())
    assert (b["prompts"], b["k"], b["completions"], b["new_tokens"]) == (2, 2, 4, 8)
    assert set(b["seconds"]) == {"generate", "ref_logprobs", "score", "update"}
    for key in ("completions_s", "rollout_tok_s", "train_tflops", "decode_gbps", "peak_mem_mb", "hf_completions_s",
                "rollout_vs_hf"):
        assert b[key] > 0, key
    log = (out / "bench.log").read_text()
    for phase in b["seconds"]:
        assert re.search(rf"{phase}\s+\d+\.\d+ s", log), phase
    assert re.search(r"our rollout [\d.]+x its speed", log)
    auto = json.loads((out / "bench_auto.json").read_text())
    assert auto["auto_batch_size"] and auto["prompts"] == 2  # on a CPU the batch size stays


@pytest.mark.skipif(not HAS_TRL, reason='trl, datasets or transformers not installed (pip install -e ".[bench]")')
def test_trl_comparison_prints_a_positive_ratio(smoke):
    _, out = smoke
    b = json.loads((out / "bench.json").read_text())
    assert b["trl_completions_s"] > 0 and b["ours_vs_trl"] > 0
    assert b["trl_completion_tokens"] == b["new_tokens"]  # min_new_tokens reached TRL's generate
    assert re.search(r"TRL [\d.]+ GRPOTrainer: [\d.]+ completions/s .* ours/TRL = [\d.]+x",
                     (out / "bench.log").read_text())


def test_without_trl_one_sentence_says_how_to_get_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "trl", None)  # import trl now raises ModuleNotFoundError
    figures = {}
    bench.versus_trl(figures, "unused", None, None, None, "unused")
    assert figures == {}
    out = capsys.readouterr().out.strip()
    assert out.count("\n") == 0 and 'pip install -e ".[bench]"' in out


def test_sampler_and_scoring_modes(tmp_path, capsys):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a toy model on a shared machine: a second thread only contends
    try:
        assert bench.main(["sampler", "--n_layer", "1", "--n_head", "1", "--n_embd", "32", "--prompts", "2", "--k",
                           "2", "--new_tokens", "4", "--steps", "1", "--device", "cpu",
                           "--json", str(tmp_path / "s.json")]) == 0
    finally:
        torch.set_num_threads(threads)
    s = json.loads((tmp_path / "s.json").read_text())
    assert s["rows"] == 4 and s["ours_tok_s"] > 0 and s["recompute_tok_s"] > 0
    assert "full recompute per token" in capsys.readouterr().out
    assert bench.main(["scoring", "--prompts", "50", "--json", str(tmp_path / "sc.json")]) == 0
    sc = json.loads((tmp_path / "sc.json").read_text())
    assert sc["P_completions_s"] > 0 and sc["A_completions_s"] > 0
    if shutil.which("stockfish") or shutil.which("/usr/games/stockfish"):  # the engine reward, 2 positions x 2
        capsys.readouterr()
        assert bench.main(["scoring", "--engine", "--prompts", "2", "--k", "2", "--device", "cpu",
                           "--json", str(tmp_path / "e.json")]) == 0
        e = json.loads((tmp_path / "e.json").read_text())
        assert all(e[f"P_{n}_completions_s"] > 0 for n in ("labels", "engine_cold", "engine_warm"))
        assert capsys.readouterr().out.count("(4 completions, scored in-process)") == 3  # --score_workers -1 on a CPU


def test_data_mode_times_sfts_batches(tmp_path, capsys):
    """bench.py data makes sft.py's batches from the shipped pool or --data_file, and refuses --data_file elsewhere."""
    assert bench.main(["data", "--prompts", "16", "--steps", "2", "--json", str(tmp_path / "d.json")]) == 0
    assert json.loads((tmp_path / "d.json").read_text())["samples_s"] > 0
    assert "(2 batches of 16, A: share 0.4)" in capsys.readouterr().out
    assert bench.main(["data", "--prompts", "4", "--steps", "1", "--data_file", POOL_PATH]) == 0
    with pytest.raises(SystemExit):
        bench.main(["scoring", "--data_file", POOL_PATH])
    assert "--data_file feeds the data mode only" in capsys.readouterr().err
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(SystemExit) as stop:  # a data file it cannot use: its loader's sentence, no traceback
        bench.main(["data", "--prompts", "4", "--steps", "1", "--data_file", str(tmp_path / "empty.jsonl")])
    assert str(stop.value).startswith("bench.py: ") and "empty.jsonl" in str(stop.value)


def test_update_flops_and_decode_bytes_by_hand():
    # 8 rows in groups of 4: 40 prompt and 80 completion tokens in all, 2 passes; 100 body and 50 embedding weights
    assert bench.update_flops(100, 50, 40, 80, 4, 2, fused=False) == ((6 * 100 * (10 + 80) + 6 * 50 * 80) * 2,
                                                                       6 * (100 * 120 + 50 * 80) * 2)
    assert bench.update_flops(100, 50, 40, 80, 4, 2, fused=True) == (172_000, 192_000)
    # 8 rows of 2 prompts, 4 rows each, of 4 and 6 tokens (40 in all), left-padded to 6 columns.
    # 40 new tokens, 39 decode steps: widths 16 (16 steps), 32 (16), then 48 capped at 40 (7)
    ideal, shared = bench.decode_token_bytes(2000, 10, 8, 4, 40, 6, 40, shared=True)
    assert ideal == 2000 + 10 * (40 + 8 * 20)
    assert shared == pytest.approx(2000 + 10 * (2 * 6 + 8 * (16 * 16 + 16 * 32 + 7 * 40) / 39))
    assert bench.decode_token_bytes(2000, 10, 8, 4, 40, 6, 40, shared=False) == (4000, 2000 + 10 * 8 * (6 + 40))


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
