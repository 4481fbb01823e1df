"""--auto_batch_size: the largest batch whose whole step fits the GPU, measured by running steps of growing
size on the trainer (train.Trainer) without changing its state, each rank its share."""
import copy
import math

import torch

from mini import distributed
from mini.runs import StopRun
from mini.runtime import out_of_memory
from mini.sampler import release_decode_caches


def run_to_the_limit(r, max_new_tokens, filler):
    """The rollout with every completion lengthened to max_new_tokens (with `filler` ids): the update's
    tensors are as wide as the longest completion, and a later step may have one that runs to the limit."""
    r.completions = [c + [filler] * (max_new_tokens - len(c)) for c in r.completions]
    return r


def optimizer_state_bytes(optimizer):
    """The bytes AdamW's two moments will take at its first step when it holds none yet (a probe at step 0
    never steps), else 0: a peak measured after a step already counts them."""
    if optimizer.state:
        return 0
    return sum(2 * p.numel() * p.element_size() for group in optimizer.param_groups for p in group["params"]
               if p.requires_grad)


def probe_peak_memory(trainer, local_batch):
    """Peak CUDA bytes of one full step of this rank at this many prompts, every completion run to
    --max_new_tokens, AdamW's state counted; without changing any state and without a collective (None: out
    of memory). The compiled decode's caches of this size are dropped after it, as the run may not use it."""
    saved, baseline = copy.deepcopy(trainer.rank_state()), trainer.baseline.state_dict()
    trainer.local_batch = local_batch
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    try:
        r = run_to_the_limit(trainer.rollout(), trainer.cfg.max_new_tokens, trainer.tok.eos_token_id)
        trainer.prepare(r)
        r.rewards = torch.rand(len(r.samples))  # any rewards with variance: the update's memory is the same
        adv, returns, _ = trainer.advantages(r)
        trainer.update(r, adv, returns, apply=False)
        peak = torch.cuda.max_memory_allocated() + optimizer_state_bytes(trainer.optimizer)
    except (RuntimeError, MemoryError) as e:  # torch.cuda.OutOfMemoryError is a RuntimeError
        if not out_of_memory(e):
            raise
        peak = None
    release_decode_caches(trainer.model)
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
    """The largest batch size whose probe(b), the peak memory of a step (None when it ran out of memory),
    stays under fraction * capacity, to within an eighth: doubled from `start` (up to max_batch) while it
    fits, then halved between the last that fit and the first that did not (each probe is a whole step).
    Returns it (None if not even `start` fits; `start` is measured even above max_batch) and every
    (batch size, peak) measured."""
    measured = []

    def fits(b):
        peak = probe(b)
        measured.append((b, peak))
        return peak is not None and peak <= fraction * capacity

    if not fits(start):
        return None, measured
    best, too_big = start, None
    while best < max_batch:
        b = min(2 * best, max_batch)
        if not fits(b):
            too_big = b
            break
        best = b
    while too_big is not None and too_big - best > max(1, best // 8):
        b = (best + too_big) // 2
        if fits(b):
            best = b
        else:
            too_big = b
    return best, measured
