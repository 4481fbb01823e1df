"""--auto_batch_size: the largest batch whose whole step fits the GPU, measured by running steps of growing
size on the trainer (train.Trainer) without changing its state, each rank its share."""
import copy
import math

import torch

from mini import distributed
from mini.runs import StopRun


def probe_peak_memory(trainer, local_batch):
    """Peak CUDA bytes of one full step of this rank at this many prompts, without changing any state and
    without a collective (None: out of memory)."""
    saved, baseline = copy.deepcopy(trainer.rank_state()), trainer.baseline.state_dict()
    trainer.local_batch = local_batch
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    try:
        r = trainer.rollout()
        trainer.prepare(r)
        r.rewards = torch.rand(len(r.samples))  # any rewards with variance: the update's memory is the same
        adv, returns, _ = trainer.advantages(r)
        trainer.update(r, adv, returns, apply=False)
        peak = torch.cuda.max_memory_allocated()
    except torch.cuda.OutOfMemoryError:
        peak = None
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer.load_rank_state(saved)
    trainer.baseline.load_state_dict(baseline)
    return peak


def choose_batch_size(trainer):
    """Set trainer's batch size to the largest that fits --memory_fraction of the GPU (CPU: left as it is)."""
    if not trainer.cuda:
        trainer.log(f"--auto_batch_size measures CUDA memory; on CPU the batch size stays {trainer.cfg.batch_size}")
        return
    capacity = torch.cuda.get_device_properties(trainer.device).total_memory

    def probe(local_batch):  # each rank measures its share; all go on with the worst, so they stay in step
        peak = distributed.all_max(float(probe_peak_memory(trainer, local_batch) or math.inf))
        return None if peak == math.inf else peak

    start, W = trainer.local_batch, trainer.world
    best, measured = find_batch_size(probe, start, capacity, trainer.cfg.memory_fraction)
    for b, peak in measured:
        trainer.log(f"auto_batch_size: {b * W} prompts x {trainer.cfg.k_samples} -> "
                    + ("out of memory" if peak is None else f"peak {peak / 2**30:.1f} GiB of {capacity / 2**30:.1f}")
                    + (f" (the most of {W} ranks)" if W > 1 else ""))
    if best is None:
        raise StopRun(f"--auto_batch_size: even {start * W} prompts x {trainer.cfg.k_samples} exceed "
                      f"{trainer.cfg.memory_fraction:.0%} of the GPU; lower --batch_size or --k_samples")
    trainer.local_batch, trainer.cfg.batch_size = best, best * W
    trainer.log(f"auto_batch_size: using --batch_size {best * W}")


def find_batch_size(probe, start, capacity, fraction, max_batch=4096):
    """Double the batch size from `start` while probe(b), the peak memory of a step (None when it ran
    out of memory), stays under fraction * capacity. Returns the largest that did (None if not even
    `start`) and every (batch size, peak) measured."""
    best, measured, b = None, [], start
    while b <= max_batch:
        peak = probe(b)
        measured.append((b, peak))
        if peak is None or peak > fraction * capacity:
            break
        best, b = b, 2 * b
    return best, measured
