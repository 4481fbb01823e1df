"""torchrun on CPU (2 gloo processes, tiny model): one step on a fixed global batch equals the step of one
process on the same batch; a 2-process run killed with SIGKILL and resumed ends where an uninterrupted one
does (and Trainer.run frees its DDP wrapper before the process group goes); the collective helpers answer
by hand on two ranks, and in one process against a stand-in of torch.distributed; the device and the process
group each rank takes; a batch that does not divide among the ranks is one sentence.

    python mini/test_distributed.py
"""
import contextlib
import datetime
import json
import os
import signal
import subprocess
import sys
import types
import warnings

import pytest
import torch

import mini.train as train
from mini import distributed, runtime
from mini.config import POOL_PATH, Config
from mini.flags import parse_args
from mini.dataset import PoolSource, load_jsonl
from mini.loader import load_model
from mini.rollout import Rollout, merge_sampling
from mini.runs import load_checkpoint
from mini.runtime import resolve_device
from mini.test_train import (FULL_STATE, STEPS, args, assert_same_final_state, install_scripted_reward,
                             install_test_hooks, read_jsonl, scripted_score, tiny, without_timing)  # noqa: F401 (tiny: a fixture)

K, PROMPTS = 3, 4
STEP_SETTINGS = {  # the global normalisers and statistics each setting divides by
    "dapo_batch_std_adaptive": ("--loss_type", "dapo", "--scale_rewards", "batch", "--baseline_type", "adaptive",
                                "--micro_batch_size", "2", "--num_iterations", "2", "--kl_type", "k3"),
    "grpo_gae_adaptive_kl": ("--loss_type", "grpo", "--use_gae", "--adaptive_kl", "--kl_type", "forward"),
    # the supervised terms' means over every rank's true tokens; their passes leave the value head unused
    "both_sft_gae_micro2": ("--env_sft_coef", "0.5", "--env_sft_batch", "4", "--policy_sft_coef", "0.3",
                            "--policy_sft_batch", "2", "--micro_batch_size", "2", "--use_gae"),
    # the last half of the prompts score flat (fixed_step), so rank 1 keeps no group and rank 0 both of its own:
    # rank 1's rows must count nowhere, as the flat groups a single process drops
    "dynamic_sampling_one_rank_flat": ("--dynamic_sampling", "--dynamic_sampling_max_rounds", "1", "--kl_type", "k3"),
}
WORKER = "import sys; from mini.test_distributed import worker; sys.exit(worker(sys.argv[1], sys.argv[2:]))"


def torchrun(spawn, mode, argv, env=None, nproc=2):
    """`torchrun --standalone --nproc_per_node nproc` of worker(mode, argv), started by the `spawn` fixture: a Popen."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), "--no-python",
           sys.executable, "-c", WORKER, mode, *argv]
    return spawn(cmd, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, text=True)


def finish(proc, check=True):
    """The exit code of a torchrun started by torchrun(); with check, a failure shows its stderr."""
    _, err = proc.communicate(timeout=300)
    assert not check or proc.returncode == 0, err[-4000:]
    return proc.returncode


def worker(mode, argv):
    """A rank's work under torchrun (or the single process's in the test): `step` trains one step on the fixed
    batch and saves the result; `run` is train.main with the scripted reward, with $NAN_ON_RANK_1 a NaN loss
    on rank 1 only at its second loss call, and with $KILL_AFTER_STEP SIGKILL after that step."""
    if mode == "collectives":
        return collectives(*argv)
    with pytest.MonkeyPatch.context() as mp:
        if mode == "step":
            install_scripted_reward(mp)
            return fixed_step(parse_args(argv))
        nan_here = os.environ.get("NAN_ON_RANK_1") and os.environ.get("RANK") == "1"  # rolls every rank back
        install_test_hooks(mp, nan_call=2 if nan_here else None,
                           kill_after_step=int(os.environ.get("KILL_AFTER_STEP", "0")) or None)
        mp.setattr(train.Trainer, "run", run_then_check_ddp_freed)
        return train.main(argv)


def collectives(out_dir):
    """Each rank's answers from the collective helpers, with rank-dependent inputs, written to out_dir/rank<r>.json."""
    distributed.setup(torch.device("cpu"))
    r = distributed.rank()
    mine = torch.tensor([r, 2.0 * r], dtype=torch.float64)  # float64 on the CPU: the sum's own dtype and device
    summed = distributed.all_sum(mine)
    half = distributed.all_sum(torch.tensor([0.5 + r], dtype=torch.float16))
    got = [distributed.any_rank(r == 1), distributed.any_rank(False), distributed.all_max([3.0, float("inf")][r]),
           distributed.all_sum(r + 1.0), summed.tolist(), mine.tolist() == [r, 2.0 * r], str(half.dtype),
           distributed.gather(r), distributed.from_main(f"rank {r}")]
    with open(os.path.join(out_dir, f"rank{r}.json"), "w") as f:
        json.dump(got, f)
    distributed.cleanup()
    return 0


def run_then_check_ddp_freed(self, changed=None, run=train.Trainer.run):
    """Trainer.run, then a check that it let go of its DDP wrapper: the reducer's gloo threads must end before
    distributed.cleanup destroys the process group, not whenever the garbage collector reaches the trainer."""
    run(self, changed)
    assert self.ddp is None, "Trainer.run kept its DistributedDataParallel wrapper past the run"


def assert_same_metrics(a, b):
    """Two metrics rows agree up to float reduction order, less the timings, memory and scorer counters."""
    volatile = ("time_", "peak_mem_mb", "score_")
    a, b = ({k: v for k, v in x.items() if not k.startswith(volatile)} for x in (a, b))
    assert a.keys() == b.keys()
    for k in a:
        assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), k


def fixed_step(cfg):
    """One train_step() on a fixed global batch of PROMPTS x K rows, of which this rank takes its share; rank 0
    saves the weights, value head and metrics row to <run>/result.pt."""
    t = train.Trainer(cfg)
    pool = load_jsonl(POOL_PATH)
    samples = [s for s in PoolSource(pool, env_ratio=0.5, seed=0).draw(PROMPTS) for _ in range(K)]
    if cfg.env_sft_coef or cfg.policy_sft_coef:  # the supervised rows: fixed ones of each task, this rank its share
        golds = {}
        for ratio, batch in ((1.0, cfg.env_sft_batch), (0.0, cfg.policy_sft_batch)):
            share = batch // t.world
            golds[ratio] = PoolSource(pool, seed=1).draw(batch, env_ratio=ratio)[t.rank * share:(t.rank + 1) * share]
        t.source.draw = lambda n, env_ratio=None: golds[env_ratio]  # not a closure over t, which is deleted below
    g = torch.Generator().manual_seed(0)
    completions = [torch.randint(0, 50000, (int(torch.randint(1, 9, (), generator=g)),), generator=g).tolist()
                   for _ in samples]
    texts = [t.tok.decode(c) for c in completions]
    n = len(samples) // t.world
    mine = slice(t.rank * n, (t.rank + 1) * n)
    r = Rollout(samples[mine], [t.tok.encode(s.prompt) for s in samples[mine]], completions[mine], texts[mine])
    t.rollout = lambda: r  # the step on this fixed, scripted batch
    flat = {s.prompt for s in samples[len(samples) // 2:]} if cfg.dynamic_sampling else set()
    score = lambda s, x: (0.5, scripted_score(s, x)[1]) if s.prompt in flat else scripted_score(s, x)
    t.scorer.submit = lambda samples, texts: lambda: [score(s, x) for s, x in zip(samples, texts)]
    m = t.train_step()
    if t.main:
        torch.save({"model": t.model.state_dict(), "value_head": t.value_head.state_dict() if t.value_head else None,
                    "metrics": m}, os.path.join(t.run_dir.path, "result.pt"))
        t.run_dir.release()  # rank 0 claimed the run
    del t  # its DDP wrapper goes before the process group, as at the end of Trainer.run
    train.distributed.cleanup()
    return 0


@pytest.mark.parametrize("setting", STEP_SETTINGS)
@pytest.mark.long(35)
def test_two_ranks_take_the_step_of_one_process(spawn, tiny, tmp_path, setting):
    argv = args(tiny, tmp_path, "two", 1, "--batch_size", str(PROMPTS), "--k_samples", str(K), *STEP_SETTINGS[setting])
    assert finish(torchrun(spawn, "step", argv)) == 0
    assert worker("step", argv[:argv.index("--run_name") + 1] + ["one"] + argv[argv.index("--run_name") + 2:]) == 0
    a, b = (torch.load(tmp_path / run / "result.pt", weights_only=True) for run in ("one", "two"))
    for part in ("model", "value_head"):
        for name, x in (a[part] or {}).items():
            assert torch.allclose(x, b[part][name], rtol=0, atol=1e-5), (part, name, (x - b[part][name]).abs().max())
    start = load_model(tiny)[0].state_dict()
    assert max((a["model"][k] - start[k]).abs().max() for k in start) > 1e-4  # the step did move the weights
    if "--dynamic_sampling" in argv:  # what was drawn differs by design (each rank draws for its own share)
        a["metrics"], b["metrics"] = ({k: v for k, v in x["metrics"].items() if not k.startswith("ds_")} for x in (a, b))
        assert a["metrics"]["completion_len_mean"] > 0 and len(a["metrics"]) > 20
    assert_same_metrics(a["metrics"], b["metrics"])


@pytest.mark.long(60)
def test_two_ranks_killed_and_resumed_end_like_an_uninterrupted_run(spawn, tiny, tmp_path):
    argv = lambda run: args(tiny, tmp_path, run, STEPS, *FULL_STATE, "--dynamic_sampling")  # each rank fills its share
    assert finish(torchrun(spawn, "run", argv("straight"), env={"NAN_ON_RANK_1": "1"})) == 0
    killed = torchrun(spawn, "run", argv("killed"), env={"NAN_ON_RANK_1": "1", "KILL_AFTER_STEP": "5"})
    assert finish(killed, check=False) != 0
    with contextlib.suppress(ProcessLookupError):
        os.killpg(killed.pid, signal.SIGKILL)  # whatever torchrun left behind, before the resumed run starts
    run = tmp_path / "killed"
    assert not (run / "final").exists() and len(read_jsonl(run / "metrics.jsonl")) >= 4
    assert finish(torchrun(spawn, "run", ["--log_dir", str(tmp_path), "--run_name", "killed", "--auto_resume"])) == 0
    rows = without_timing(read_jsonl(tmp_path / "straight" / "metrics.jsonl"))
    assert without_timing(read_jsonl(run / "metrics.jsonl")) == rows and len(rows) == STEPS
    assert all(row["ds_groups_kept"] == 2 for row in rows)  # dynamic sampling filled the global batch
    assert any("rolled back" in line for line in open(tmp_path / "straight" / "train.log"))  # rank 1's NaN
    assert_same_final_state(tmp_path / "straight", run)
    ranks = load_checkpoint(str(run / "checkpoints" / f"step_{STEPS:06d}.pt"))["ranks"]
    # each rank kept its own RNGs and draws through the rollback and the resume
    assert not torch.equal(ranks[0]["rng"]["torch"], ranks[1]["rng"]["torch"])
    assert ranks[0]["sampler"] != ranks[1]["sampler"]


def test_the_collectives_of_two_ranks(spawn, tmp_path):
    """any_rank is True on every rank when one rank says so (a stop signal, the time limit), all_max the larger
    (a rank out of memory reports inf to --auto_batch_size), all_sum the sum, gather every rank's in rank order,
    from_main rank 0's; without torchrun each returns its own input. A tensor's sum is a new tensor of its dtype:
    the rank's own is left as it was."""
    assert finish(torchrun(spawn, "collectives", [str(tmp_path)])) == 0
    want = [True, False, float("inf"), 3.0, [1.0, 2.0], True, "torch.float16", [0, 1], "rank 0"]
    assert [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)] == [want, want]
    assert (distributed.any_rank(True), distributed.any_rank(0), distributed.all_max(2.5), distributed.all_sum(4.0),
            distributed.gather("x"), distributed.from_main(7)) == (True, False, 2.5, 4.0, ["x"], 7)


def test_collectives_reduce_a_float64_copy_and_give_back_the_callers_type(monkeypatch):
    """all_sum and all_max against a stand-in of torch.distributed for rank 0 of two, the other rank holding
    2**24 + 1: the reduction runs on a float64 copy, so a count past float32's 2**24 keeps its units; a number
    comes back as a float, a tensor in its own dtype, the caller's tensor as it was."""
    reduced = []

    def all_reduce(t, op):
        reduced.append(t.dtype)
        other = torch.full_like(t, 2**24 + 1)
        t.copy_(t + other if op == torch.distributed.ReduceOp.SUM else torch.maximum(t, other))

    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed.dist, "all_reduce", all_reduce)
    mine = torch.tensor([2.0], dtype=torch.float64)
    assert distributed.all_sum(2.0) == 2**24 + 3 and distributed.all_max(2.0) == 2**24 + 1
    assert type(distributed.all_sum(2.0)) is float and type(distributed.all_max(2.0)) is float  # not a 0-d tensor
    assert distributed.all_sum(mine).tolist() == [2**24 + 3] and mine.tolist() == [2.0]
    counts = distributed.all_sum(torch.tensor([2]))
    assert counts.dtype == torch.int64 and counts.tolist() == [2**24 + 3] and reduced == [torch.float64] * 6


def test_each_rank_takes_its_local_gpu_and_joins_once(monkeypatch):
    """Under torchrun on CUDA, global rank 5 with LOCAL_RANK 1 (the second node) takes cuda:1, joins with nccl with
    30 minutes' patience (the ranks wait while rank 0 evaluates), and the collectives put their tensors there; a
    second setup joins no more; on a CPU gloo. Without torchrun (no RANK) the device comes back as given."""
    joined, current = [], []
    monkeypatch.setattr(distributed, "_device", torch.device("cpu"))
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: bool(joined))
    monkeypatch.setattr(distributed.dist, "init_process_group", lambda backend, timeout: joined.append((backend, timeout)))
    monkeypatch.setattr(torch.cuda, "set_device", current.append)
    monkeypatch.delenv("RANK", raising=False)
    assert distributed.setup(torch.device("cuda")) == torch.device("cuda") and joined == []
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert distributed.setup(torch.device("cuda")) == torch.device("cuda", 1) == distributed._device
    assert joined == [("nccl", datetime.timedelta(minutes=30))] and current == [torch.device("cuda", 1)]
    distributed.setup(torch.device("cuda"))
    assert len(joined) == 1
    joined.clear()
    assert distributed.setup(torch.device("cpu")) == torch.device("cpu") == distributed._device
    assert joined == [("gloo", datetime.timedelta(minutes=30))]


def test_the_batch_probe_counts_moments_in_the_parameters_dtype():
    """AdamW keeps its two moments in each parameter's own dtype: 2 x 2 bytes a bf16 parameter, 2 x 4 an fp32 one,
    so a bf16 model's state is not counted twice over."""
    from mini.autobatch import optimizer_state_bytes
    half, full = torch.nn.Parameter(torch.zeros(10, dtype=torch.bfloat16)), torch.nn.Parameter(torch.zeros(3))
    assert optimizer_state_bytes(torch.optim.AdamW([half, full])) == 2 * 2 * 10 + 2 * 4 * 3


class ProbedTrainer:
    """What probe_peak_memory uses of train.Trainer, on a fake CUDA memory counter: a step of b prompts with
    completions w wide allocates 100 * b * w bytes; the peak counter holds the most since its last reset."""

    def __init__(self, monkeypatch):
        self.mem = {"peak": 0}
        monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda: self.mem.update(peak=0))
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: self.mem["peak"])
        frozen = torch.nn.Parameter(torch.zeros(1), requires_grad=False)  # no moments to count
        self.optimizer, self.model, self.local_batch = torch.optim.AdamW([frozen]), object(), 1
        self.cfg, self.tok = Config(max_new_tokens=3), types.SimpleNamespace(eos_token_id=0)
        self.baseline = types.SimpleNamespace(state_dict=dict, load_state_dict=lambda state: None)
        self.rollouts, self.rewards = [], []

    def rank_state(self):
        return {}

    def load_rank_state(self, state):
        pass

    def rollout(self):
        self.rollouts.append(self.local_batch)
        return Rollout([None] * self.local_batch, [[1]] * self.local_batch, [[5]] * self.local_batch,
                       [""] * self.local_batch)

    def prepare(self, r):
        pass

    def advantages(self, r):
        return r.rewards - r.rewards.mean(), None, None

    def update(self, r, adv, returns, apply):
        self.rewards.append(r.rewards)
        step = 100 * len(r.samples) * max(map(len, r.completions))
        self.mem["peak"] = max(self.mem["peak"], step)


def test_each_batch_probe_measures_its_own_size_and_peak(monkeypatch):
    """Probes of 4 then 2 prompts (completions run to --max_new_tokens 3): each samples its own size, gives the
    update rewards that differ (no group is flat, so none is dropped from the measured step), reports its own
    peak (1200, then 600: the counter reset, not the larger probe's), and drops the decode caches it compiled."""
    import mini.autobatch as autobatch
    released = []
    monkeypatch.setattr(autobatch, "release_decode_caches", released.append)
    trainer = ProbedTrainer(monkeypatch)
    assert [autobatch.probe_peak_memory(trainer, b) for b in (4, 2)] == [1200, 600]
    assert trainer.rollouts == [4, 2] and released == [trainer.model] * 2
    assert all(len(set(r.tolist())) == len(r) for r in trainer.rewards)


def test_auto_batch_size_of_one_process_logs_its_own_peaks(monkeypatch):
    """--auto_batch_size without torchrun: each size's log line gives the peak of this process alone, with no
    '(the most of 1 ranks)'; at 100 bytes a prompt and half of 1000 bytes, 5 prompts is the batch. A probe out of
    memory (from 4 prompts on) is a size that does not fit, logged as such: 3 is the batch. On the CPU nothing is
    probed and the batch stays."""
    import mini.autobatch as autobatch
    logs = []
    trainer = types.SimpleNamespace(cuda=True, device=torch.device("cuda", 0), local_batch=1, world=1, log=logs.append,
                                    cfg=types.SimpleNamespace(batch_size=1, k_samples=2, memory_fraction=0.5))
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: types.SimpleNamespace(total_memory=1000))
    monkeypatch.setattr(autobatch, "probe_peak_memory", lambda t, b: 100.0 * b)
    autobatch.choose_batch_size(trainer)
    assert logs[0] == "auto_batch_size: 1 prompts x 2 -> peak 0.0 GiB of 0.0" and not any("most of" in l for l in logs)
    assert (trainer.local_batch, trainer.cfg.batch_size, logs[-1]) == (5, 5, "auto_batch_size: using --batch_size 5")
    logs.clear()
    trainer.local_batch = 1
    monkeypatch.setattr(autobatch, "probe_peak_memory", lambda t, b: None if b >= 4 else 100.0 * b)
    autobatch.choose_batch_size(trainer)
    assert trainer.local_batch == 3 and "auto_batch_size: 4 prompts x 2 -> out of memory" in logs
    trainer.cuda = False  # nothing to measure: the batch stays as given
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: pytest.fail("a CPU run probed CUDA"))
    autobatch.choose_batch_size(trainer)
    assert trainer.local_batch == 3 and logs[-1].endswith("on CPU the batch size stays 3")


def test_auto_device_is_cuda_where_torch_sees_it(monkeypatch):
    """--device auto: CUDA where it is available, else the CPU; a device named is taken as named."""
    for available, want in ((True, "cuda"), (False, "cpu")):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: available)
        assert resolve_device("auto") == torch.device(want) and resolve_device("cpu") == torch.device("cpu")


def test_autocast_computes_in_bf16_on_either_device():
    """bf16, not torch.autocast's own default (fp16 on CUDA, whose range overflows in attention logits)."""
    for device, cfg in ((torch.device("cuda"), Config(bf16=True)), (torch.device("cpu"), Config(bf16_cpu=True))):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # CUDA's autocast warns where CUDA is not available
            ctx = runtime.autocast(device, cfg)
        assert (ctx.device, ctx.fast_dtype) == (device.type, torch.bfloat16)


def test_without_torchrun_the_process_is_a_world_of_one_and_cleanup_leaves_nothing(monkeypatch):
    """Plain python: rank 0 of 1, the main process, no group; cleanup destroys none. In a group, cleanup collects
    the garbage (a DDP wrapper's reducer) first, then destroys the group."""
    alone = (distributed.world_size(), distributed.rank(), distributed.is_main(), distributed.active())
    assert alone == (1, 0, True, False)
    # a stop's signal name or None, as a rank passes them: any truthy value is a yes
    flags = ("SIGTERM", None, "")
    assert [distributed.any_rank(flag) for flag in flags] == [True, False, False]
    calls = []
    monkeypatch.setattr(distributed.gc, "collect", lambda: calls.append("collect"))
    monkeypatch.setattr(distributed.dist, "destroy_process_group", lambda: calls.append("destroy"))
    distributed.cleanup()
    assert calls == []
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)
    distributed.cleanup()
    assert calls == ["collect", "destroy"]


def test_a_restored_rng_state_sets_the_cuda_generators_where_there_are_some(monkeypatch):
    """A checkpoint's CUDA generator states go back where CUDA is available; a CPU run's checkpoint (None) or a
    machine without CUDA leaves them alone."""
    restored = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_rng_state_all", lambda: ["gpu0 state", "gpu1 state"])
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", restored.append)
    state = runtime.rng_state()
    assert state["cuda"] == ["gpu0 state", "gpu1 state"]
    runtime.set_rng_state(state)
    assert restored == [["gpu0 state", "gpu1 state"]]
    runtime.set_rng_state({**state, "cuda": None})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    runtime.set_rng_state(state)
    assert len(restored) == 1


def test_cuda_phases_wait_for_the_device_and_peaks_are_in_mib(monkeypatch):
    """On CUDA a phase's seconds are taken after its queued work finishes (synchronize), not when it was queued;
    the peak memory is max_memory_allocated in MiB."""
    events, clock = [], iter([0.0, 1.0, 3.0])
    monkeypatch.setattr(runtime.time, "perf_counter", lambda: events.append("clock") or next(clock))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: events.append("sync"))
    timer = runtime.PhaseTimer(cuda=True)
    with timer("generate"):
        pass
    assert events == ["clock", "clock", "sync", "clock"] and timer.times == {"generate": 2.0}
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda: 3 * 2**20)
    assert runtime.peak_memory_mb(torch.device("cuda")) == 3.0


def test_the_callers_script_is_hidden_from_workers_then_given_back(monkeypatch):
    """Inside caller_script_hidden, __main__ has no __file__ and a None __spec__ (multiprocessing does not run
    it again); after it, both are the caller's again, even when the body raised."""
    main = sys.modules["__main__"]
    monkeypatch.setattr(main, "__file__", "/somewhere/script.py", raising=False)
    monkeypatch.setattr(main, "__spec__", "the spec", raising=False)
    with pytest.raises(KeyError), runtime.caller_script_hidden():
        assert not hasattr(main, "__file__") and main.__spec__ is None
        raise KeyError("the body failed")
    assert (main.__file__, main.__spec__) == ("/somewhere/script.py", "the spec")


def test_torchrun_with_one_process_is_the_plain_run(spawn, tiny, tmp_path):
    """One process under torchrun is DDP-wrapped in a process group of one (what speedrun.sh times against
    the plain run): the same steps at the same seed."""
    argv = lambda run: args(tiny, tmp_path, run, 3, *FULL_STATE)
    assert finish(torchrun(spawn, "run", argv("torchrun"), nproc=1)) == 0
    assert worker("run", argv("plain")) == 0
    assert "DistributedDataParallel" in open(tmp_path / "torchrun" / "train.log").read()
    plain, ddp = (read_jsonl(tmp_path / run / "metrics.jsonl") for run in ("plain", "torchrun"))
    assert len(plain) == len(ddp) == 3
    for a, b in zip(plain, ddp):  # this process may have other threads than torchrun's: float reduction order
        assert_same_metrics(a, b)


def test_dynamic_sampling_metrics_of_the_ranks_merge_into_the_global_steps():
    parts = [{"ds_rounds": 1, "ds_groups_drawn": 4, "ds_groups_kept": 2, "ds_zero_var_share_drawn": 0.5,
              "ds_reward_mean_drawn": 0.5},
             {"ds_rounds": 3, "ds_groups_drawn": 12, "ds_groups_kept": 2, "ds_zero_var_share_drawn": 0.25,
              "ds_reward_mean_drawn": 0.1}]
    # the slowest rank's rounds; groups summed; 2 + 3 of 16 groups drawn had equal rewards
    assert merge_sampling(parts) == {"ds_rounds": 3, "ds_groups_drawn": 16, "ds_groups_kept": 4,
                                           "ds_zero_var_share_drawn": 5 / 16,
                                           "ds_reward_mean_drawn": pytest.approx((4 * 0.5 + 12 * 0.1) / 16)}
    assert merge_sampling([{}, {}]) == {} and merge_sampling([parts[0]]) == parts[0]


def test_a_batch_that_does_not_divide_among_the_ranks_is_one_sentence(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "4")
    with pytest.raises(SystemExit) as e:
        parse_args(["--batch_size", "6"])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "--batch_size 6 does not divide among the 4 processes" in err[0]
    assert parse_args(["--batch_size", "8"]).batch_size == 8
    for term in ("env_sft", "policy_sft"):  # the supervised rows likewise, when their term is on
        with pytest.raises(SystemExit):
            parse_args(["--batch_size", "8", f"--{term}_coef", "1", f"--{term}_batch", "6"])
        assert f"--{term}_batch 6 does not divide among the 4 processes" in capsys.readouterr().err
        assert parse_args(["--batch_size", "8", f"--{term}_batch", "6"]).batch_size == 8  # the term off: unused


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
