"""
Data parallelism under torchrun: one process per GPU (or CPU, with gloo), each with its share of the prompts.

    torchrun --nproc_per_node 8 mini/train.py --batch_size 64 ...      # 8 prompts per rank and step

`python mini/train.py` (no torchrun environment) has no process group: every function here is then a no-op
that returns its input, so the single-process path has no collective in it. Under torchrun, even with one
process (the way to measure what the DDP wrapping costs), the process group is initialised from the
environment torchrun sets (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT): nccl on CUDA (each rank on
cuda:LOCAL_RANK), gloo on CPU.
"""
import datetime
import gc
import os

import torch
import torch.distributed as dist


_device = torch.device("cpu")  # where collectives put their tensors: nccl needs them on this rank's GPU


def setup(device):
    """Join the process group if torchrun started this process; returns the device of this rank
    (cuda:LOCAL_RANK on CUDA)."""
    global _device
    if "RANK" not in os.environ or dist.is_initialized():  # not started by torchrun
        return device
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    # a generous timeout: the other ranks wait in a broadcast while rank 0 evaluates or writes a checkpoint
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", timeout=datetime.timedelta(minutes=30))
    _device = device
    return device


def cleanup():
    """Leave the process group, at the end of a run on every rank."""
    if dist.is_initialized():
        # DistributedDataParallel (in the trainer's reference cycles) holds the group's backend: freed after
        # the group is gone, or at interpreter exit, gloo's threads abort the process ("terminate called")
        gc.collect()
        dist.destroy_process_group()


def active():
    """True under torchrun (a process group, maybe of one), False for plain python."""
    return dist.is_initialized()


def world_size():
    return dist.get_world_size() if dist.is_initialized() else 1


def rank():
    return dist.get_rank() if dist.is_initialized() else 0


def is_main():
    return rank() == 0


def _reduce(x, op):
    if not dist.is_initialized():
        return x
    t = torch.as_tensor(x, dtype=torch.float64).to(_device, copy=True)
    dist.all_reduce(t, op=op)
    return t.to(x.device, x.dtype) if torch.is_tensor(x) else t.item()


def all_sum(x):
    """Sum over the ranks of a number or a tensor (a number comes back as a float)."""
    return _reduce(x, dist.ReduceOp.SUM)


def all_max(x):
    return _reduce(x, dist.ReduceOp.MAX)


def any_rank(flag):
    """True on every rank when it is True on one of them (a stop signal, a time limit)."""
    return all_sum(float(bool(flag))) > 0


def gather(obj):
    """[obj of rank 0, obj of rank 1, ...] on every rank (picklable objects)."""
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def from_main(obj):
    """Rank 0's obj, on every rank."""
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=0)
    return box[0]
