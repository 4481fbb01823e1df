"""
Supervised warm start: teach a GPT-2 (from scratch or a snapshot) the RookWorld formats, offline.

    # the learning demonstration's warm start: <= 10 min on a 2-core CPU (the schedule fits the time limit)
    python mini/sft.py --model_path scratch --n_layer 8 --n_head 4 --n_embd 128 --batch_size 16 --lr 2e-3 \
        --warmup_steps 50 --mix_env_ratio 0.7 --steps 1500 --time_limit_min 10 --run_name sft
    # CI-sized, ~2 min: P: format mostly valid, A: not yet
    python mini/sft.py --model_path scratch --n_layer 4 --n_head 4 --n_embd 64 --batch_size 8 --lr 3e-3 \
        --warmup_steps 30 --mix_env_ratio 0.3 --steps 800 --time_limit_min 2 --run_name sft-ci
    python mini/sft.py --model_path logs/sft/final --lr 5e-4 --steps 1000 --run_name sft2   # continue from a snapshot
    python mini/sft.py --model_path scratch --data_source file --data_file rookworld.txt --run_name sft

On a 2-core machine that other jobs share, OMP_NUM_THREADS=1 is faster than torch's default of 2 threads.

Data: P: samples from the shipped pool (Stockfish labels), a RookWorld text file, or (--data_source generate)
fresh positions labelled by Stockfish in the background as training goes on; A: samples made by
python-chess on the fly (a random move on a pool position, a freshly generated position, or a position
one ply on from an earlier sample), so A: data never runs out. mix_env_ratio is the A: share. Nothing
from the held-out eval set (mini/data/eval.jsonl) or the mate-in-one set (mini/data/mate_in_one.jsonl) is ever
trained on: samples on their positions are dropped.

Each sequence is encode(prompt) + encode(completion) + [EOS], with no leading EOS because train.py and
evaluate.py generate from encode(prompt) alone; the loss covers the completion tokens and the final
EOS (the model must learn to stop), never the prompt. Rows are right-padded with an attention mask.
The LR follows runtime.lr_factor over --steps, or over --time_limit_min when that budget is the tighter
one, so a time-limited run still ends on a decayed LR (the warmup counts real steps either way).
logs/<run_name>/sft.log gets the log lines; logs/<run_name>/final the snapshot (also after the time limit
or Ctrl-C, and every --snapshot_every_min minutes on the way, so that a crash or a kill -9 keeps the last one:
continue from it with --model_path logs/<run_name>/final, the optimizer and the LR schedule starting afresh).
"""
import dataclasses
import json
import math
import os
import random
import sys
import time

if not __package__:  # run as `python mini/x.py`, not installed: import `mini` from this checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from tqdm.auto import tqdm

from mini.flags import echo, parse_args, run_command
from mini.dataset import PoolSource, ReplayBuffer, make_source
from mini.formats import position_key
from mini.positions import iter_positions
from mini.loader import LoadError, load_model
from mini.model import GPT, GPTConfig
from mini.report import make_reporter
from mini.runs import RunDir, RunError, StopSignals, signal_exit_code
from mini.runtime import autocast, free_memory_bytes, lr_factor, out_of_memory, resolve_device
from mini.stockfish import EngineFailure
from mini.tokenizer import Tokenizer

LOG_EVERY = 10
FULL_SOFTMAX_SHARE = 1 / 8  # positions per batch whose loss gets the full-vocabulary correction (see sft_loss)


class SFTData:
    """Endless training samples of the configured mix, none on a held-out position (the source draws
    none, the replay buffer takes none)."""

    def __init__(self, cfg):
        self.buffer = ReplayBuffer(seed=cfg.seed)  # A: positions beyond the pool
        self.source = make_source(cfg, self.buffer)  # leaves held-out positions out
        self.positions = iter_positions(cfg.seed)

    def batch(self, n):
        fen, history, _ = next(self.positions)  # one fresh generated position per batch (~10 ms)
        self.buffer.add(fen, history)
        out = self.source.draw(n)
        for s in out:
            self.buffer.add_next(s)  # walks games on, so A: positions keep changing
        return out


class SFTBatches(torch.utils.data.IterableDataset):
    """Endless encoded batches (CPU tensors, see encode_batch) for a DataLoader: in the training process with
    no workers, else one SFTData per worker process seeded cfg.seed + 1000 * (worker + 1), so that the workers
    draw different samples. The samples are loaded once, before the workers fork."""

    def __init__(self, cfg, tok):
        self.cfg, self.tok, self.data = cfg, tok, SFTData(cfg)

    def __iter__(self):
        worker = torch.utils.data.get_worker_info()
        if worker is not None:
            seed = self.cfg.seed + 1000 * (worker.id + 1)
            self.data.source.rng, self.data.buffer.rng = random.Random(seed), random.Random(seed + 1)
            self.data.positions = iter_positions(seed)
        while True:
            yield encode_batch(self.data.batch(self.cfg.batch_size), self.tok, "cpu")


def kept(snapshot_step):
    """What a run stopped without its final save leaves, for its last log line."""
    return f"; final/ holds the snapshot of step {snapshot_step}" if snapshot_step else ""


def passes_over_positions(source, samples, env_ratio):
    """(distinct P: positions, times each came round on average) after `samples` draws from a pool or file
    source, whose draws are P: prompts with probability 1 - env_ratio; None for a stream of fresh positions.
    A position seen many times teaches its own labels more than the rules: two H200 continuations of 1.2M
    sequences over 27,000 and 51,000 positions (27 and 14 passes) learned their training positions' best
    moves twice as often and made no more legal moves on held-out ones (mini/LOG.md, "Continuations of
    rookworld-10m")."""
    if not isinstance(source, PoolSource) or not source.policy:
        return None
    distinct = len({position_key(s.fen) for s in source.policy})
    return distinct, samples * (1 - env_ratio) / distinct


def schedule_step(step, elapsed, limit_s, cfg):
    """The step the LR schedule is at: after the warmup, whichever budget (--steps, or the time limit of limit_s
    seconds) runs out first; the warmup itself counts real steps, so a slow start (data workers, compilation)
    does not skip it and the first updates of a fast machine are not taken at the peak LR."""
    if limit_s <= 0 or step < cfg.warmup_steps:
        return step
    return min(max(step, int(cfg.steps * elapsed / limit_s)), cfg.steps - 1)


def detach_worker(_):
    """A worker leaves the training process's group, so that a Ctrl-C or a SIGTERM sent to the group (a terminal,
    `timeout`) reaches the training process alone: it finishes its step, saves and stops the workers. A signal
    sent to the worker itself still ends it, as DataLoader's shutdown needs."""
    os.setpgrp()


def encode_batch(samples, tok, device):
    """(inputs, attention mask, targets, loss mask on targets): right-padded rows of
    encode(prompt) + encode(completion) + [EOS]; the loss mask is True where the target is a completion token or that EOS."""
    rows = [(tok.encode(s.prompt), tok.encode(s.completion) + [tok.eos_token_id]) for s in samples]
    T = max(len(p) + len(c) for p, c in rows)
    ids = torch.full((len(rows), T), tok.eos_token_id, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.bool)
    loss_mask = torch.zeros(len(rows), T, dtype=torch.bool)
    for i, (p, c) in enumerate(rows):
        ids[i, :len(p) + len(c)] = torch.tensor(p + c)
        mask[i, :len(p) + len(c)] = True
        loss_mask[i, len(p):len(p) + len(c)] = True
    ids, mask, loss_mask = ids.to(device), mask.to(device), loss_mask.to(device)
    return ids[:, :-1], mask[:, :-1], ids[:, 1:], loss_mask[:, 1:]


def sft_loss(model, x, mask, y, loss_mask):
    """Mean cross-entropy over the loss-mask tokens, estimated without the full 50257-wide lm_head.

    RookWorld text uses ~300 GPT-2 tokens, and the full-width lm_head + softmax cost ~60% of a CPU step.
    So the softmax runs over the batch's own token ids, plus an unbiased correction: on a random
    FULL_SOFTMAX_SHARE of the positions, full logsumexp minus restricted logsumexp. The restricted loss
    alone is shift-invariant and would leave ~40% of the probability on tokens that never occur."""
    vocab = torch.unique(torch.cat([x[mask], y[loss_mask]]))  # sorted ids
    h, y = model.hidden(x, mask)[loss_mask], y[loss_mask]  # completion positions only
    logits = (h @ model.lm_head.weight[vocab].t()).float()
    lse = torch.logsumexp(logits, -1)
    loss = lse - logits.gather(1, torch.searchsorted(vocab, y)[:, None])[:, 0]
    sub = torch.randperm(len(h), device=h.device)[:max(1, round(FULL_SOFTMAX_SHARE * len(h)))]
    correction = torch.logsumexp(model.lm_head(h[sub]).float(), -1) - lse[sub]  # log(1 / mass on vocab) >= 0
    return loss.mean() + correction.mean()


TRAIN_BYTES_PER_PARAM = 16  # fp32 weights, their gradients and AdamW's two moments, before any activation


def check_fits(shape, device):
    """A ValueError in one sentence when a model of `shape` (a GPTConfig) cannot be trained in the memory `device`
    has free: counted on the meta device, so that nothing is allocated (an oversized --n_embd failed allocating)."""
    with torch.device("meta"):  # one block and two: the count is linear in the depth (a million blocks took minutes)
        one, two = (GPT(dataclasses.replace(shape, n_layer=k)).num_params() for k in (1, 2))
    n = one + (shape.n_layer - 1) * (two - one)
    need, free = TRAIN_BYTES_PER_PARAM * n, free_memory_bytes(device)
    if free is not None and need > free:
        raise ValueError(f"a model of {shape.n_layer} layer{'s' * (shape.n_layer != 1)} of width {shape.n_embd} has "
                         f"{n / 1e6:,.0f}M parameters, which take about {need / 2**30:,.2f} GiB to train and {device} "
                         f"has {free / 2**30:,.2f} GiB free; choose a smaller --n_embd or --n_layer (or --grow_layers)")


def grow_layers(model, n_layer):
    """A copy of `model` n_layer deep that computes the same function: block i copies block i * L // n_layer of
    the L, and every copy after a block's first has its output projections (attention and MLP) zeroed, so it adds
    nothing to the residual stream until trained."""
    L = model.config.n_layer
    if n_layer < L:
        raise ValueError(f"--grow_layers {n_layer} is fewer than the snapshot's {L} layers: it can only deepen a model")
    like = next(model.parameters())
    deep = GPT(dataclasses.replace(model.config, n_layer=n_layer)).to(like.device, like.dtype)
    old, new = model.state_dict(), deep.state_dict()
    for key in new:
        if not key.startswith("transformer.h."):
            new[key] = old[key].clone()
            continue
        i = int(key.split(".")[2])
        src = i * L // n_layer
        new[key] = old[key.replace(f".h.{i}.", f".h.{src}.", 1)].clone()
        if i > 0 and (i - 1) * L // n_layer == src and ".c_proj." in key:  # not the first copy of block src
            new[key].zero_()
    deep.load_state_dict(new)
    return deep


def main(argv=None):
    cfg = parse_args(argv, "sft", "Supervised warm start: teach a GPT-2 the RookWorld formats (see mini/sft.py).")
    run = RunDir(cfg.log_dir, cfg.run_name or time.strftime("sft-%Y%m%d-%H%M%S"))
    try:
        run.claim(resume=False, overwrite=cfg.overwrite, resumable=False)
    except RunError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    try:
        return train_sft(cfg, run)
    except (LoadError, ValueError, OSError, RunError, EngineFailure) as e:  # no snapshot, a bad data file, a full disk
        run.release(failed=True)
        print(f"error: {e}", file=sys.stderr)
        return 1
    except (RuntimeError, MemoryError) as e:  # torch's out of memory is a RuntimeError
        if not out_of_memory(e):
            raise
        run.release(failed=True)
        print(f"error: out of memory with {cfg.batch_size} sequences a step; lower --batch_size", file=sys.stderr)
        return 1
    except KeyboardInterrupt:  # the loop handles its own; this one came while loading, or during the final save
        run.release(failed=True)
        print("\nquit at once; " + (f"{run.file('final')} holds the last snapshot" if os.path.isdir(run.file("final"))
                                     else "nothing of the run was saved"), file=sys.stderr)
        return 130
    finally:
        run.release()


def train_sft(cfg, run):
    if cfg.data_source == "generate" and cfg.data_workers:
        raise ValueError("--data_workers needs --data_source pool or file: generate's Stockfish engines cannot be "
                         "shared with worker processes (drop --data_workers)")
    device = resolve_device(cfg.device)
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    if cfg.model_path == "scratch":
        shape = GPTConfig(cfg.n_layer, cfg.n_head, cfg.n_embd, cfg.n_positions)
        check_fits(shape, device)
        model, tok = GPT(shape).to(device), Tokenizer.gpt2()
    else:
        model, tok = load_model(cfg.model_path, device)
    if cfg.grow_layers and cfg.grow_layers != model.config.n_layer:
        check_fits(dataclasses.replace(model.config, n_layer=cfg.grow_layers), device)
        model = grow_layers(model, cfg.grow_layers)
    batches = SFTBatches(cfg, tok)
    workers = cfg.data_workers
    loader = iter(torch.utils.data.DataLoader(batches, batch_size=None, num_workers=workers,
                                              pin_memory=device.type == "cuda", prefetch_factor=4 if workers else None,
                                              persistent_workers=workers > 0, worker_init_fn=detach_worker))
    model.train()
    optimizer = model.configure_optimizers(cfg.weight_decay, cfg.lr, (cfg.adam_beta1, cfg.adam_beta2), device.type)

    def log(line):
        run.log(line, "sft.log")

    with open(run.file("sft.log"), "a") as log_file:
        log_file.write(f"config {json.dumps(dataclasses.asdict(cfg))}\n")  # the full settings, for the record
    log(f"SFT of {model.num_params() / 1e6:.1f}M params on {device}: {cfg.steps} steps of {cfg.batch_size}, "
        f"A: share {cfg.mix_env_ratio}" + (f", time limit {cfg.time_limit_min} min" if cfg.time_limit_min > 0 else ""))

    def announce(name):  # finish the step, save the snapshot, exit; a second Ctrl-C quits at once
        echo(f"\n{name}: finishing step {step + 1}, then saving the snapshot (again to quit at once)", sys.stderr)

    limit_s = 60 * cfg.time_limit_min
    t0 = t_log = time.time()
    step, loss_sum, tokens = 0, 0.0, 0
    snapshot_step, snapshot_at = 0, 0.0  # the last snapshot on the way: its step, its seconds into the run
    # made once setup has passed, so that a run refused at start leaves no empty run on W&B or TensorBoard
    reporter = make_reporter(cfg.report_to, run.path, dataclasses.asdict(cfg))
    bar = tqdm(total=cfg.steps, unit="step", dynamic_ncols=True, disable=not sys.stderr.isatty())
    with StopSignals(announce) as stop:
        try:
            while step < cfg.steps and not stop.name:
                elapsed = time.time() - t0
                if limit_s > 0 and elapsed > limit_s:
                    log(f"time limit of {cfg.time_limit_min} min reached at step {step}")
                    break
                lr = cfg.lr * lr_factor(schedule_step(step, elapsed, limit_s, cfg), cfg)
                for group in optimizer.param_groups:
                    group["lr"] = lr
                x, mask, y, loss_mask = (t.to(device, non_blocking=True) for t in next(loader))
                with autocast(device, cfg):
                    loss = sft_loss(model, x, mask, y, loss_mask)
                loss_value = loss.item()  # the step's one host sync; before the update, so NaN never reaches a save
                if not math.isfinite(loss_value):
                    log(f"loss {loss_value} at step {step + 1}: the run diverged (lower --lr, or raise --warmup_steps); "
                        "nothing saved after it" + kept(snapshot_step))
                    return 1
                if 0 < 60 * cfg.snapshot_every_min <= elapsed - snapshot_at and step > snapshot_step:
                    log(f"snapshot of step {step} in {run.save_final(model, tok)}")  # the weights of a finite loss
                    snapshot_step, snapshot_at = step, elapsed
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                if cfg.grad_clip > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
                optimizer.step()
                step += 1
                loss_sum, tokens = loss_sum + loss_value, tokens + int(mask.sum())
                bar.update(1)
                bar.set_postfix(loss=f"{loss_value:.3f}")
                if step % LOG_EVERY == 0 or step == cfg.steps:
                    now, mean_loss = time.time(), loss_sum / ((step - 1) % LOG_EVERY + 1)
                    log(f"step {step:5d} | loss {mean_loss:.4f} | lr {lr:.2e} | "
                        f"{tokens / (now - t_log):.0f} tok/s | {now - t0:.0f} s")
                    reporter.log(step, {"loss": mean_loss, "lr": lr, "tokens_per_s": tokens / (now - t_log)})
                    t_log, loss_sum, tokens = now, 0.0, 0
        except KeyboardInterrupt:
            log(f"quit at step {step} without saving" + kept(snapshot_step))
            return 130
        except Exception as e:
            log(f"stopped by {type(e).__name__} at step {step}" + kept(snapshot_step))
            raise
        finally:
            bar.close()
            reporter.close()
            batches.data.source.close()
            del loader  # stops the worker processes
    if not all(torch.isfinite(w).all() for w in model.parameters()):  # the last update's, which no loss has seen
        log(f"the weights after step {step} are not finite: the run diverged (lower --lr); nothing saved after it"
            + kept(snapshot_step))
        return 1
    if stop.name:
        log(f"{stop.name}: saving the snapshot at step {step}...")
    passes = passes_over_positions(batches.data.source, step * cfg.batch_size, cfg.mix_env_ratio)
    if passes:
        log(f"P: positions: {passes[0]:,} distinct, each drawn about {passes[1]:.3g} times")
    log(f"done: {step} steps in {time.time() - t0:.0f} s, snapshot in {run.save_final(model, tok)}")
    return signal_exit_code(stop.name) if stop.name and step < cfg.steps else 0  # stopped short: not finished


if __name__ == "__main__":
    run_command(main)
