"""
The run-time plumbing that every script shares: device, bf16 autocast, the LR schedule, seeding, the
random-number state that checkpoints carry, the seconds of a step's phases, and worker processes started
without the caller's script.
"""
import contextlib
import math
import os
import random
import resource
import sys
import time

import numpy as np
import torch


def resolve_device(name):
    """cuda, cpu or auto (cuda when available)."""
    return torch.device(("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else name)


def score_workers(cfg, device, world=1):
    """--score_workers, with -1 resolved: on CUDA one process per core the training processes leave, up to 4
    (scoring then hides behind the reference pass); on a CPU none, as the cores are the trainer's."""
    if cfg.score_workers >= 0:
        return cfg.score_workers
    return max(0, min(4, (os.cpu_count() or 1) // world - 1)) if device.type == "cuda" else 0


@contextlib.contextmanager
def caller_script_hidden():
    """Hide the __main__ script from multiprocessing, which runs it again in every worker it does not fork: a
    script without an `if __name__ == "__main__":` guard would load its data again there, and so on. The
    workers (dataset.parsed_lines', ScoringPool's) need only functions that live in mini's modules."""
    main = sys.modules["__main__"]
    saved = {k: getattr(main, k) for k in ("__file__", "__spec__") if hasattr(main, k)}
    main.__spec__ = None  # multiprocessing reads __spec__.name, then __file__
    main.__dict__.pop("__file__", None)
    try:
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


def autocast_dtype(device, cfg):
    """bf16 where the config asks for autocast on this device, else None."""
    return torch.bfloat16 if (cfg.bf16 if device.type == "cuda" else cfg.bf16_cpu) else None


def autocast(device, cfg):
    """bf16 autocast where the config asks for it on this device; weights and log-probs stay fp32."""
    dtype = autocast_dtype(device, cfg)
    return torch.autocast(device.type, dtype=dtype) if dtype else contextlib.nullcontext()


def lr_factor(step, cfg):
    """Multiplier of lr for the update of step `step` (0-based): linear warmup that already applies to
    the first update, cosine down to min_lr_ratio, then a linear decay to 0 over the last decay_steps."""
    if step < cfg.warmup_steps:
        return (step + 1) / cfg.warmup_steps
    cosine_end = cfg.steps - cfg.decay_steps
    if step >= cosine_end:
        return cfg.min_lr_ratio * (cfg.steps - step) / max(cfg.decay_steps, 1)
    progress = (step - cfg.warmup_steps) / max(cosine_end - cfg.warmup_steps, 1)
    return cfg.min_lr_ratio + (1 - cfg.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def seed_everything(seed):
    """Seed python, numpy and torch; numpy takes the seed modulo 2**32, so that --seed 2**32 - 1 plus a
    torchrun rank still seeds it."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def rng_state():
    """Every generator's state as tensors, numbers and tuples: checkpoints load with weights_only."""
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"python": random.getstate(), "numpy": (name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, gauss),
            "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None}


def set_rng_state(s):
    random.setstate(s["python"])
    name, keys, pos, has_gauss, gauss = s["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(s["torch"])
    if s["cuda"] is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(s["cuda"])


def peak_memory_mb(device):
    """Peak CUDA memory allocated since the last reset, or the process's high-water mark on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def out_of_memory(e):
    """Whether e is running out of memory: CUDA's OutOfMemoryError, a cuBLAS or CUDA graph error that says so, the
    CPU allocator refusing a tensor, or Python's MemoryError (the kernel's OOM killer sends a SIGKILL: no error)."""
    text = str(e).lower()
    return isinstance(e, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(e, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text))


def free_memory_bytes(device):
    """Bytes free on `device`: CUDA's free memory, or MemAvailable of /proc/meminfo on CPU; None where unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            kib = next(int(line.split()[1]) for line in f if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):  # not Linux
        return None
    return kib * 1024


class PhaseTimer:
    """Seconds per named phase of a step, summed over its repeats (CUDA work is waited for at the end of each phase)."""

    def __init__(self, cuda):
        self.cuda, self.times, self.t0 = cuda, {}, time.perf_counter()

    @contextlib.contextmanager
    def __call__(self, name):
        t = time.perf_counter()
        yield
        if self.cuda:
            torch.cuda.synchronize()
        self.times[name] = self.times.get(name, 0.0) + time.perf_counter() - t  # phases may repeat (dynamic sampling)

    def seconds(self):
        return {**{f"time_{k}": v for k, v in self.times.items()}, "time_step": time.perf_counter() - self.t0}
