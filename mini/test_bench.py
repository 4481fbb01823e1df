"""The benchmarks and the speedrun run end to end at toy sizes on a CPU (no timing is asserted: shared machines
make any speed threshold flaky): `speedrun.sh --cpu-smoke` runs every stage once for the module, and its
figures are checked here; bench.py's sampler and scoring modes and the missing-TRL message run in-process.

    python mini/test_bench.py
"""
import importlib.util
import json
import shutil
import os
import random
import re
import subprocess
import sys
import types

import pytest
import torch

from mini import bench
from mini.config import POOL_PATH, Config
from mini.formats import legal_ucis
from mini.loader import LoadError

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
    assert "--data_file is read by the data mode only; the scoring mode would ignore it" in capsys.readouterr().err
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


class Clock:
    """bench's `time` module in a test: perf_counter and process_time give these readings, in turn."""

    def __init__(self, perf=(), cpu=()):
        self.perf, self.cpu = iter(perf), iter(cpu)

    def perf_counter(self):
        return next(self.perf)

    def process_time(self):
        return next(self.cpu)


def args(**kw):
    """bench.py's parsed flags, as ours(), versus_*() and bench_step() read them."""
    return types.SimpleNamespace(**{**dict(prompts=2, k=2, new_tokens=8, steps=3, micro_batch_size=128, seed=0,
                                           auto_batch_size=False, peak_tflops=0.0, peak_gbps=0.0, compile=False,
                                           compile_decode=False, real_lengths=False, trl_steps=3, bf16=True,
                                           no_transformers=False, no_trl=False, model_path="", score_workers=-1,
                                           shared_prefix_decode=None, fused_logprobs=False, device="cpu", n_layer=1,
                                           n_head=1, n_embd=8), **kw})


def step_row(step, generate, update, prompt_tokens, completion_tokens, prompt_len_max, peak_mem_mb):
    return dict(time_step=step, time_generate=generate, time_ref_logprobs=0.25, time_score=0.125, time_update=update,
                prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, prompt_len_max=prompt_len_max,
                peak_mem_mb=peak_mem_mb)


class FakeTrainer:
    """Trainer's stand-in for ours(): 1M parameters of which 200k the tied embedding, 2 layers x 4 wide; train_step
    gives the warm-up row, then the timed ones."""
    rows = [step_row(0.1, 0.05, 0.05, 1, 1, 1, 9999.0),  # the warm-up: none of its figures count
            step_row(1.0, 7.0, 7.0, 4, 3, 2, 100.0),
            step_row(3.0, 0.5, 1e-3, 40, 30, 15, 200.0),  # the median step: of 4, the slower middle one
            step_row(4.0, 9.0, 9.0, 400, 320, 120, 300.0),
            step_row(2.0, 8.0, 8.0, 5, 5, 5, 150.0)]

    def __init__(self, cfg):
        self.cfg, self.steps, self.closed = cfg, iter(self.rows), False
        wte = types.SimpleNamespace(weight=torch.zeros(50_000, 4))
        self.model = types.SimpleNamespace(num_params=lambda: 1_000_000, transformer=types.SimpleNamespace(wte=wte),
                                           config=types.SimpleNamespace(n_layer=2, n_embd=4))
        self.scorer = types.SimpleNamespace(close=lambda: setattr(self, "closed", True))

    def train_step(self):
        return dict(next(self.steps))


def run_ours(monkeypatch, a, **cfg):
    monkeypatch.setattr(bench, "Trainer", FakeTrainer)
    monkeypatch.setattr(bench, "time", Clock(cpu=[0.0, 10.0, 20.0, 23.0, 30.0, 31.0, 40.0, 45.0]))  # 10, 3, 1, 5 s
    cfg = types.SimpleNamespace(**{**dict(num_iterations=2, fused_logprobs=False, bf16=True, bf16_cpu=False,
                                          shared_prefix_decode=None, batch_size=a.prompts), **cfg})
    return bench.ours(a, cfg, torch.device("cpu"))


def test_step_figures_of_the_median_step_by_hand(monkeypatch, capsys):
    """2 prompts x 2 completions of 8 tokens; the median of 4 timed steps (3 s; the warm-up left out): 40 prompt
    and 30 completion tokens (a row ended early), prompts left-padded to 15, generate 0.5 s, update 1 ms, 2 PPO
    passes; fp32 on a CPU (4 bytes a weight), 64 bytes a cached column (2 x 2 layers x 4 wide x 4), the shared
    prefix (a CPU's default): a width of 8 at every one of the 7 decode steps."""
    out, tr = run_ours(monkeypatch, args(steps=4, peak_tflops=2.0, peak_gbps=0.1))
    assert tr.closed and (out["prompts"], out["k"], out["completions"], out["dtype"]) == (2, 2, 4, "fp32")
    assert out["seconds"] == {"generate": 0.5, "ref_logprobs": 0.25, "score": 0.125, "update": 1e-3}
    assert (out["step_s"], out["cpu_step_s"], out["completions_s"], out["rollout_tok_s"]) == (3.0, 3.0, 4 / 3, 60.0)
    assert out["peak_mem_mb"] == 300.0  # the largest of the timed steps
    executed = (6 * 800_000 * (40 / 2 + 30) + 6 * 200_000 * 30) * 2  # each group's prompt once
    nominal = 6 * (800_000 * (40 + 30) + 200_000 * 30) * 2  # every row's
    assert out["train_tflops"] == pytest.approx(executed / 1e-3 / 1e12)
    assert out["nominal_tflops"] == pytest.approx(nominal / 1e-3 / 1e12)
    assert out["mfu"] == pytest.approx(out["train_tflops"] / 2.0) and out["peak_tflops"] == 2.0
    assert out["nominal_mfu"] == pytest.approx(out["nominal_tflops"] / 2.0)
    token_s = 0.5 / 8
    ideal, read = 4_000_000 + 64 * (40 + 4 * 8 / 2), 4_000_000 + 64 * (4 / 2 * 15 + 4 * 8)
    assert out["decode_gbps"] == pytest.approx(ideal / token_s / 1e9)
    assert out["decode_read_gbps"] == pytest.approx(read / token_s / 1e9)
    assert out["roofline_share"] == pytest.approx(out["decode_gbps"] / 0.1)
    assert out["read_roofline_share"] == pytest.approx(out["decode_read_gbps"] / 0.1) and out["peak_gbps"] == 0.1
    printed = capsys.readouterr().out
    assert "2 prompts x 2 = 4 completions of 8 tokens, micro-batch 128, fp32, median of 4 steps" in printed
    assert re.search(r"generate +0\.500 s +\(16\.7%\)", printed) and re.search(r"update +0\.001 s +\( 0\.0%\)", printed)
    assert re.search(r"rollout +60 tokens/s", printed) and "1.3 completions/s (3.00 s per step)" in printed
    assert f"MFU {out['mfu']:.1%} of 2" in printed and f"{out['read_roofline_share']:.1%} of the 0 GB/s" in printed
    assert re.search(r"peak memory +0\.29 GiB", printed)


def test_step_figures_without_a_known_peak_or_with_real_lengths(monkeypatch, capsys):
    """No peak of a CPU: no MFU nor roofline share, and a sentence says how to get one; --real_lengths: no decode
    bandwidth (the decode ran as long as the longest row); bf16 on a CPU under --bf16_cpu; the batch size
    --auto_batch_size picks is the one counted."""
    out, _ = run_ours(monkeypatch, args(steps=4), bf16_cpu=True, shared_prefix_decode=False)
    assert (out["mfu"], out["nominal_mfu"], out["peak_tflops"], out["roofline_share"], out["peak_gbps"]) == (None,) * 5
    assert out["dtype"] == "bf16" and "(MFU: pass --peak_tflops)" in capsys.readouterr().out
    ideal, read = 2_000_000 + 32 * (40 + 4 * 8 / 2), 2_000_000 + 32 * 4 * (15 + 8)  # a copy of each prompt per row
    assert (out["decode_gbps"], out["decode_read_gbps"]) == (pytest.approx(ideal / (0.5 / 8) / 1e9),
                                                             pytest.approx(read / (0.5 / 8) / 1e9))
    monkeypatch.setattr(bench, "choose_batch_size", lambda tr: setattr(tr.cfg, "batch_size", 3))
    a = args(steps=4, real_lengths=True, auto_batch_size=True)
    out, _ = run_ours(monkeypatch, a)
    assert a.prompts == 3 and (out["prompts"], out["completions"], out["completions_s"]) == (3, 6, 2.0)
    decode = ("decode_gbps", "decode_read_gbps", "roofline_share", "read_roofline_share")
    assert [out[k] for k in decode] == [None] * 4
    assert "GB/s" not in capsys.readouterr().out


def test_versus_transformers_by_hand(monkeypatch, capsys):
    """transformers' generate of the same 2 prompts x 2 rows of 8 tokens in a median 4 s: 8 tokens/s and 1
    completion/s, against our rollout's 60 tokens/s and our whole step's 4/3 completions/s."""
    out, tr = run_ours(monkeypatch, args(steps=4))
    tr.tok, asked = types.SimpleNamespace(encode=lambda p: [int(p[1:])]), []
    monkeypatch.setattr(bench, "pool_prompts", lambda n, seed: asked.append((n, seed)) or [f"p{i}" for i in range(n)])
    monkeypatch.setattr(bench, "hf_generate", lambda *a: asked.append(a[2:4]) or ("run", "4.0", "dynamic"))
    monkeypatch.setattr(bench, "timed", lambda fns, repeats: {"hf": 4.0} if (fns, repeats) == ({"hf": "run"}, 3)
                        else {})
    bench.versus_transformers(out, tr, args(seed=5), None, torch.device("cpu"))
    assert asked == [(2, 6), ([[0], [0], [1], [1]], 8)]  # each prompt k times, of another draw than ours
    assert (out["hf_version"], out["hf_cache"], out["hf_generate_s"]) == ("4.0", "dynamic", 4.0)
    assert (out["hf_rollout_tok_s"], out["hf_completions_s"], out["rollout_vs_hf"]) == (8.0, 1.0, 7.5)
    assert ("transformers 4.0 generate alone (dynamic cache): 1.0 completions/s; our whole GRPO step is 1.33x its "
            "generation alone, our rollout 7.50x its speed") in capsys.readouterr().out
    monkeypatch.setattr(bench, "hf_generate", lambda *a: None)
    figures = {}
    bench.versus_transformers(figures, tr, args(), None, torch.device("cpu"))
    assert figures == {} and "transformers is not installed" in capsys.readouterr().out


def fake_trl(monkeypatch, made):
    """trl, datasets and transformers as versus_trl uses them: GRPOConfig's settings and the trainer's arguments go
    to `made`; train() runs its max_steps, each of 8 completion tokens, calling the callbacks at each step's end."""
    class GRPOTrainer:
        def __init__(self, model, reward_funcs, args, callbacks, train_dataset, processing_class):
            made.update(model=model, args=args, dataset=train_dataset, tokenizer=processing_class,
                        rewards=reward_funcs(["a1", "", "12"]))
            self.callbacks, self.args, self._metrics = callbacks, args, {"train": {"completions/mean_length": []}}

        def remove_callback(self, callback):
            made["removed"] = callback

        def train(self):
            for _ in range(self.args["max_steps"]):
                self._metrics["train"]["completions/mean_length"].append(8)
                for callback in self.callbacks:
                    callback.on_step_end(self.args, None, None)

    transformers = types.SimpleNamespace(TrainerCallback=object, PrinterCallback="printer", utils=types.SimpleNamespace(
        logging=types.SimpleNamespace(disable_progress_bar=lambda: None)), AutoTokenizer=types.SimpleNamespace(
        from_pretrained=lambda path: f"tokenizer of {path}"))
    monkeypatch.setitem(sys.modules, "transformers", transformers)
    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(Dataset=types.SimpleNamespace(from_dict=dict)))
    monkeypatch.setitem(sys.modules, "trl", types.SimpleNamespace(__version__="0.99", GRPOTrainer=GRPOTrainer,
                                                                  GRPOConfig=lambda **kw: kw))


def test_versus_trl_settings_and_figures_by_hand(monkeypatch, capsys):
    """2 prompts x 3 = 6 completions at --micro_batch_size 4: TRL's micro-batch is 3 (it must divide the batch),
    2 accumulated; 1 warm-up and 3 timed steps of 1, 5 and 3 s (5, 1 and 3 CPU seconds): the median step 3 s
    (3 CPU s), 2 completions/s, against our 2 s (1 CPU s) a step."""
    made, asked = {}, []
    fake_trl(monkeypatch, made)
    monkeypatch.setattr(bench, "pool_prompts", lambda n, seed: asked.append((n, seed)) or ["p"] * n)
    monkeypatch.setattr(bench, "time", Clock(perf=[10.0, 11.0, 16.0, 19.0], cpu=[0.0, 5.0, 6.0, 9.0]))
    cfg = Config(micro_batch_size=4, kl_coef=0.03, clip_eps_low=0.1, clip_eps_high=0.3, lr=2e-5, weight_decay=0.05,
                 adam_beta1=0.8, adam_beta2=0.9, grad_clip=0.5, temperature=0.7, top_k=5, num_iterations=2, seed=7,
                 loss_type="dr_grpo", scale_rewards="batch")
    out = {"step_s": 2.0, "cpu_step_s": 1.0, "completions_s": 3.0}
    bench.versus_trl(out, "snap", args(prompts=2, k=3, seed=1), cfg, torch.device("cpu"), "/work")
    settings = {k: made["args"][k] for k in (
        "per_device_train_batch_size", "gradient_accumulation_steps", "num_generations", "max_completion_length",
        "generation_kwargs", "max_steps", "use_cpu", "bf16", "seed", "temperature", "top_k", "beta", "loss_type",
        "epsilon", "epsilon_high", "num_iterations", "scale_rewards", "learning_rate", "weight_decay", "adam_beta1",
        "adam_beta2", "max_grad_norm", "output_dir")}
    assert settings == dict(per_device_train_batch_size=3, gradient_accumulation_steps=2, num_generations=3,
                            max_completion_length=8, generation_kwargs={"min_new_tokens": 8}, max_steps=4, use_cpu=True,
                            bf16=False, seed=7, temperature=0.7, top_k=5, beta=0.03, loss_type="dr_grpo", epsilon=0.1,
                            epsilon_high=0.3, num_iterations=2, scale_rewards="batch", learning_rate=2e-5,
                            weight_decay=0.05, adam_beta1=0.8, adam_beta2=0.9, max_grad_norm=0.5,
                            output_dir=os.path.join("/work", "trl"))
    assert asked == [(8, 3)] and made["dataset"] == {"prompt": ["p"] * 8}  # a step's prompts, 4 steps, another draw
    assert (made["model"], made["tokenizer"], made["removed"]) == ("snap", "tokenizer of snap", "printer")
    assert made["rewards"] == [0.5, 0.0, 1.0]  # the share of digits
    assert (out["trl_step_s"], out["trl_cpu_step_s"], out["trl_completions_s"], out["trl_micro_batch_size"]) == \
        (3, 3, 2.0, 3)
    assert (out["ours_vs_trl"], out["ours_vs_trl_cpu_time"], out["trl_completion_tokens"]) == (1.5, 3.0, 8)
    assert (out["trl_version"], out["trl_peak_mem_mb"]) == ("0.99", None)
    assert ("TRL 0.99 GRPOTrainer: 2.0 completions/s (3.00 s per step); ours 3.0: ours/TRL = 1.50x (by CPU seconds per "
            "step, 3.00x)") in capsys.readouterr().out
    monkeypatch.setattr(bench, "time", Clock(perf=[0.0, 1.0, 2.0, 3.0], cpu=[0.0] * 4))
    bench.versus_trl({**out}, "snap", args(prompts=2, k=3, real_lengths=True), Config(), torch.device("cpu"),
                     "/w")
    assert made["args"]["generation_kwargs"] == {} and made["args"]["per_device_train_batch_size"] == 6  # 0: all


def test_step_mode_runs_its_comparisons_as_its_flags_say(monkeypatch, capsys):
    """bench_step builds the Trainer's settings from the flags and runs transformers, then TRL, each guarded: one
    that fails is recorded and the other still runs; --no_transformers, --no_trl and --real_lengths leave theirs."""
    calls = []

    def ours(a, cfg, device):
        calls.append(cfg)
        return {"step_s": 1.0}, "trainer"
    monkeypatch.setattr(bench, "ours", ours)
    monkeypatch.setattr(bench, "save_model", lambda model, tok, path: calls.append(model.config.n_embd) or path)
    monkeypatch.setattr(bench, "versus_transformers", lambda *a: calls.append("hf") or 1 / 0)
    monkeypatch.setattr(bench, "versus_trl", lambda out, snap, *a: calls.append(("trl", os.path.basename(snap))))
    a = args(prompts=3, k=5, new_tokens=6, micro_batch_size=10, seed=4, score_workers=2, bf16=False,
             shared_prefix_decode=False, fused_logprobs=True)
    out = bench.bench_step(a)
    assert out == {"mode": "step", "step_s": 1.0, "transformers_error": "ZeroDivisionError: division by zero"}
    width, cfg, *rest = calls
    assert width == 8 and rest == ["hf", ("trl", "model")]
    assert (cfg.batch_size, cfg.k_samples, cfg.max_new_tokens, cfg.micro_batch_size, cfg.seed, cfg.score_workers,
            cfg.bf16, cfg.shared_prefix_decode, cfg.fused_logprobs, cfg.eval_every, cfg.save_every) == \
        (3, 5, 6, 10, 4, 2, False, False, True, 0, 0)
    for flags, ran in ((dict(no_transformers=True), [("trl", "model")]), (dict(no_trl=True), ["hf"]),
                       (dict(real_lengths=True, model_path="/m/trained"), [("trl", "trained")])):
        calls.clear()
        bench.bench_step(args(**flags))
        assert [c for c in calls if c == "hf" or isinstance(c, tuple)] == ran
    assert calls[0].model_path == "/m/trained"  # a trained model is timed as it is, no random snapshot written
    assert "transformers comparison skipped under --real_lengths" in capsys.readouterr().out


def test_sampler_rates_and_ratios_by_hand(monkeypatch, capsys):
    """2 prompts x 2 rows of 4 new tokens, 16 tokens a round: ours 2 s, full recompute 8 s, transformers 4 s a median
    round give 8, 2 and 4 tokens/s, ours 4x and 2x theirs; each decoder warmed up once first."""
    ran = []
    monkeypatch.setattr(bench, "pool_prompts", lambda n, seed: ["P: a", "P: b"][:n])
    monkeypatch.setattr(bench, "generate", lambda model, prompts, n, **kw: ran.append(("ours", len(prompts), n, kw)))
    monkeypatch.setattr(bench, "generate_full_recompute", lambda model, prompts, n: ran.append(("recompute", n)))
    monkeypatch.setattr(bench, "hf_generate", lambda model, tok, prompts, n, device, cfg: ("hf", "4.0", "dynamic"))
    monkeypatch.setattr(bench, "timed", lambda fns, repeats: {"ours": 2.0, "recompute": 8.0, "hf": 4.0}
                        if (list(fns), repeats) == (["ours", "recompute", "hf"], 3) else {})
    a = args(n_layer=1, n_head=1, n_embd=8, new_tokens=4, compile_decode=True)
    out = bench.bench_sampler(a)
    assert ran == [("ours", 4, 4, {"compile_decode": True}), ("recompute", 4)]
    assert {k: out[k] for k in ("rows", "new_tokens", "ours_tok_s", "recompute_tok_s", "hf_tok_s", "hf_cache")} == \
        dict(rows=4, new_tokens=4, ours_tok_s=8.0, recompute_tok_s=2.0, hf_tok_s=4.0, hf_cache="dynamic")
    printed = capsys.readouterr().out
    assert "4 rows (2 prompts x 2)" in printed and "4 new tokens, median of 3 interleaved rounds" in printed
    assert re.search(r"full recompute per token +2 tok/s   ours is  4\.00x this", printed)
    assert re.search(r"transformers 4\.0 generate \(dynamic cache\) +4 tok/s   ours is  2\.00x this", printed)
    assert re.search(r"ours: generate \(KV cache, shared prefill\) +8 tok/s   ours is  1\.00x this", printed)


def test_full_recompute_appends_one_token_per_step_to_left_padded_prompts():
    torch.manual_seed(0)
    model = bench.GPT(bench.GPTConfig(n_layer=1, n_head=1, n_embd=8, n_positions=32)).eval()
    ids = bench.generate_full_recompute(model, [[1, 2, 3], [4]], 5)
    assert ids.shape == (2, 3 + 5) and ids[:, :3].tolist() == [[1, 2, 3], [50256, 50256, 4]]


def test_scoring_rates_take_the_best_of_three_rounds(monkeypatch, capsys):
    """2 eval positions: 6 P: completions each (the reference first) and 7 A: ones, scored in rounds of 3, 1, 2 s
    (P) and 4, 2, 8 s (A), each from a cold legal-move cache: 12 and 7 completions/s from the fastest round."""
    batches, events = [], []

    class Legal:  # formats.legal_ucis, and when its cache is cleared
        def __call__(self, fen):
            return legal_ucis(fen)

        def cache_clear(self):
            events.append("clear")
    monkeypatch.setattr(bench, "legal_ucis", Legal())
    monkeypatch.setattr(bench, "score_batch", lambda ss, cs: batches.append((ss, cs)) or events.append(len(cs)))
    monkeypatch.setattr(bench, "time", Clock(perf=[0, 3, 10, 11, 20, 22, 30, 34, 40, 42, 50, 58]))
    out = bench.bench_scoring(args(prompts=2, engine=False))
    assert out == {"mode": "scoring", "P_completions_s": 12.0, "A_completions_s": 7.0}
    assert events == ["clear", 12] * 3 + ["clear", 14] * 3  # every round computes its legal moves again
    for ss, cs in (batches[0], batches[3]):
        assert [cs[i] for i in (0, len(cs) // 2)] == [ss[0].completion, ss[-1].completion]  # the references
        assert ss[0] is not ss[-1] and all(s is ss[0] for s in ss[:len(ss) // 2])
    assert "P: 12 completions/s per core (12 completions" in capsys.readouterr().out


def test_engine_reward_rates_by_hand(monkeypatch, capsys):
    """2 positions x 3 completions, each a random legal B: move: labels 2 s, the engine on a new cache 4 s, then warm
    (a pass first fills the cache, untimed) 1 s: 3, 1.5 and 6 completions/s; each pool closed."""
    pools = []

    class Pool:
        def __init__(self, workers, engine=None):
            self.workers, self.engine, self.submitted, self.closed = workers, engine, [], False
            pools.append(self)

        def submit(self, samples, texts):
            self.submitted.append((samples, texts))
            return lambda: None

        def close(self):
            self.closed = True
    monkeypatch.setattr(bench, "ScoringPool", Pool)
    monkeypatch.setattr(bench, "find_stockfish", lambda: "sf")
    monkeypatch.setattr(bench, "EngineReward", lambda path, cache_path: ("engine", path, os.path.basename(cache_path)))
    monkeypatch.setattr(bench, "time", Clock(perf=[0, 2, 10, 14, 20, 21]))
    positions = bench.load_jsonl(bench.EVAL_PATH)[:2]
    out = bench.bench_engine_reward(random.Random(0), positions, 3, 2)
    assert out == {"P_labels_completions_s": 3.0, "P_engine_cold_completions_s": 1.5,
                   "P_engine_warm_completions_s": 6.0}
    spec = ("engine", "sf", "moves.jsonl")
    assert [(p.workers, p.engine, len(p.submitted), p.closed) for p in pools] == [
        (2, None, 1, True), (2, spec, 1, True), (2, spec, 2, True)]
    samples, texts = pools[0].submitted[0]
    assert samples == [positions[0]] * 3 + [positions[1]] * 3
    assert all(p.submitted[-1] == (samples, texts) for p in pools)
    for s, t in zip(samples, texts):
        assert t.startswith(" M: " + " ".join(s.moves)) and t.split("B: ")[1] in legal_ucis(s.fen)
    assert capsys.readouterr().out.count("(6 completions, 2 scoring workers)") == 3


def test_data_rate_and_settings_by_hand(monkeypatch, capsys):
    """--steps 3 batches of --prompts 5 in 5 s after one warm-up batch: 3 samples/s; the seed, A: share and
    --data_file reach sft.py's settings."""
    made, batches = [], []

    class Data:
        def __init__(self, cfg):
            made.append(cfg)

        def batch(self, n):
            batches.append(n)
            return n
    monkeypatch.setattr(bench, "SFTData", Data)
    monkeypatch.setattr(bench, "encode_batch", lambda batch, tok, device: batches.append(device))
    monkeypatch.setattr(bench, "time", Clock(perf=[10.0, 15.0]))
    out = bench.bench_data(args(prompts=5, steps=3, seed=9, mix_env_ratio=0.25, data_file=POOL_PATH))
    assert out == {"mode": "data", "samples_s": 3.0} and batches == [5, "cpu"] * 4
    cfg, = made
    assert (cfg.seed, cfg.mix_env_ratio, cfg.data_source, cfg.data_file, cfg.policy_pad) == (9, 0.25, "file", POOL_PATH,
                                                                                               "both")
    assert "data: 3 samples/s on one core (3 batches of 5, A: share 0.25)" in capsys.readouterr().out
    monkeypatch.setattr(bench, "time", Clock(perf=[0.0, 1.0]))
    bench.bench_data(args(prompts=5, steps=3, mix_env_ratio=0.4, data_file=""))
    assert made[-1].data_source != "file"


@pytest.mark.parametrize("mode, shape", [([], (12, 12, 768, 64, 16)), (["sampler"], (4, 4, 256, 4, 4)),
                                         (["scoring"], (None, None, None, 500, None)),
                                         (["data"], (None, None, None, 512, None)),
                                         (["sampler", "--n_layer", "2", "--k", "3"], (2, 4, 256, 4, 3))])
def test_each_mode_takes_its_own_defaults_and_a_flag_given_stays(monkeypatch, tmp_path, mode, shape):
    seen = []
    for name in ("step", "sampler", "scoring", "data"):
        monkeypatch.setattr(bench, f"bench_{name}", lambda a: seen.append(a) or {"mode": a.mode, "figure": 1.5})
    path = tmp_path / "new" / "figures.json"
    assert bench.main(mode + ["--json", str(path)]) == 0
    a, = seen
    assert (a.n_layer, a.n_head, a.n_embd, a.prompts, a.k) == shape
    assert (a.new_tokens, a.steps, a.micro_batch_size, a.trl_steps, a.score_workers, a.seed) == (64, 3, 128, 2, -1, 0)
    assert json.loads(path.read_text()) == {"argv": mode + ["--json", str(path)], "mode": a.mode, "figure": 1.5}


@pytest.mark.parametrize("argv, says", [
    (["sampler", "--model_path", "{d}"], "--model_path is read by the step mode only; the sampler mode would ignore"),
    (["sampler", "--no_fused_logprobs"], "--fused_logprobs is read by the step mode only; the sampler mode"),
    (["scoring", "--compile_decode"], "--compile_decode is read by the step and sampler modes only; the scoring mode"),
    (["data", "--engine"], "--engine is read by the scoring mode only; the data mode would ignore it"),
    (["sampler", "--mix_env_ratio", "0.5"], "--mix_env_ratio is read by the data mode only"),
    (["data", "--k", "3"], "--k is read by the step, sampler and scoring modes only"),
    (["--model_path", "{d}"], "--model_path goes with --real_lengths: a trained model's rows stop at EOS")])
def test_a_flag_only_other_modes_read_is_refused_and_a_trained_model_needs_real_lengths(monkeypatch, tmp_path, capsys, argv, says):
    for name in ("step", "sampler"):
        monkeypatch.setattr(bench, f"bench_{name}", lambda a: pytest.fail("refused flags ran a benchmark"))
    with pytest.raises(SystemExit) as stop:
        bench.main([arg.format(d=tmp_path) for arg in argv])
    assert stop.value.code == 2 and says in capsys.readouterr().err


@pytest.mark.parametrize("target", ["{pool}", "{mini}/data/bench.json", "{model}/model.safetensors"])
def test_figures_over_an_input_or_a_shipped_file_are_refused_before_the_benchmark(monkeypatch, tmp_path, capsys,
                                                                                    target):
    for name in ("step", "data"):
        monkeypatch.setattr(bench, f"bench_{name}", lambda a: pytest.fail("a refused --json ran the benchmark"))
    pool = tmp_path / "pool.jsonl"
    pool.write_text("")
    where = dict(pool=pool, mini=os.path.dirname(bench.__file__), model=tmp_path)
    argv = ["--model_path", str(tmp_path), "--real_lengths"] if "model" in target else ["data", "--data_file", str(pool)]
    with pytest.raises(SystemExit) as stop:
        bench.main(argv + ["--json", target.format(**where)])
    assert stop.value.code == 2 and "would write the figures over an input" in capsys.readouterr().err
    assert pool.read_text() == ""


@pytest.mark.parametrize("error", [ValueError("pool.jsonl, line 3: not JSON"),
                                   FileNotFoundError(2, "No such file or directory", "gone.jsonl"),
                                   LoadError("logs/r is a training run's directory, not a model")])
def test_a_mode_that_fails_on_its_input_exits_in_one_sentence(monkeypatch, tmp_path, error):
    """A malformed or missing --data_file, or a --model_path that is no snapshot (a run's directory, the natural
    mistake): the loader's sentence, no traceback, no figures."""
    def fail(a):
        raise error
    monkeypatch.setattr(bench, "bench_data", fail)
    with pytest.raises(SystemExit) as stop:
        bench.main(["data", "--json", str(tmp_path / "f.json")])
    assert str(stop.value) in ("bench.py: pool.jsonl, line 3: not JSON",
                               "bench.py: gone.jsonl: no such file or directory; check the path",
                               "bench.py: logs/r is a training run's directory, not a model")
    assert not (tmp_path / "f.json").exists()


@pytest.mark.parametrize("name, tflops, gbps", [
    ("NVIDIA H100 PCIe", 756.0, 2000.0), ("NVIDIA H100 80GB HBM3", 989.0, 3350.0), ("NVIDIA H200", 989.0, 4800.0),
    ("NVIDIA A100-SXM4-80GB", 312.0, 2039.0), ("Tesla T4", 0.0, 0.0)])
def test_device_peaks_by_gpu_name(monkeypatch, name, tflops, gbps):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    cuda = torch.device("cuda")
    assert (bench.device_peak(bench.PEAK_TFLOPS, cuda), bench.device_peak(bench.PEAK_GBPS, cuda)) == (tflops, gbps)
    assert bench.device_peak(bench.PEAK_TFLOPS, torch.device("cpu")) == 0.0 and bench.device_name(cuda) == name


def test_timed_interleaves_its_functions_and_takes_each_ones_median(monkeypatch):
    calls = []
    monkeypatch.setattr(bench, "time", Clock(perf=[0, 5, 5, 6, 10, 11, 11, 14, 20, 22, 22, 30]))
    fns = {"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}
    assert bench.timed(fns, 3) == {"a": 2, "b": 3}  # a: 5, 1, 2 s; b: 1, 3, 8 s
    assert calls == ["a", "b"] * 3


def test_a_failed_comparison_is_recorded_and_printed_not_raised(capsys):
    out = {}
    bench.guarded(out, "trl", lambda x: None, 1)
    assert out == {}

    def fail(x):
        raise RuntimeError("x" * 400)
    bench.guarded(out, "trl", fail, 1)
    assert out == {"trl_error": ("RuntimeError: " + "x" * 400)[:300]}
    assert f"trl comparison failed: {out['trl_error']}" in capsys.readouterr().out


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
