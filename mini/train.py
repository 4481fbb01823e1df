"""
GRPO fine-tuning of RookWorld-LM on mixed P: (policy) and A: (environment) tasks.

    python mini/train.py --steps 100 --k_samples 8
    python mini/train.py --model_path logs/sft/final --run_name demo --steps 200
    python mini/train.py --run_name demo --auto_resume          # continue after a crash or kill

Each step: draw batch_size prompts, sample k_samples completions each, score them, turn rewards into
group-relative advantages, update the policy (PPO-clipped, KL to the frozen start model), log.
Everything lands in logs/<run_name>/: metrics.jsonl, samples.jsonl, train.log, config.json,
checkpoints/ and, at the end, final/ (a Hugging Face snapshot).
"""
import dataclasses
import glob
import json
import math
import os
import signal
import sys
import time

import torch

from mini import grpo
from mini.config import parse_args
from mini.dataset import ReplayBuffer, TaskSampler, load_samples
from mini.evaluate import evaluate, held_out_samples
from mini.loader import LoadError, load_model, save_model
from mini.reward_scorer import ScoringPool
from mini.runtime import (autocast, lr_factor, peak_memory_mb, resolve_device, rng_state, seed_everything,
                          set_rng_state)
from mini.sampler import generate

MAX_RECOVERIES = 3


class StopRun(Exception):
    """Ends the run cleanly with a message (the state is saved first)."""


# ----------------------------------------------------------------------------- checkpoints

def save_checkpoint(path, state):
    """Write to a temporary file, then rename: a crash mid-write never leaves a broken checkpoint."""
    tmp = path + ".tmp"
    torch.save(state, tmp)
    os.replace(tmp, path)


def load_checkpoint(path):
    """The checkpoint's state if it is complete and its weights finite; else a ValueError saying why."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:
        raise ValueError(f"{path} cannot be read ({type(e).__name__}); it is damaged") from None
    missing = {"model", "optimizer", "step", "config", "run_name", "rng"} - set(state)
    if missing:
        raise ValueError(f"{path} lacks {sorted(missing)}; it is not a checkpoint of mini/train.py")
    if not all(torch.isfinite(t).all() for t in state["model"].values()):
        raise ValueError(f"{path} holds non-finite weights")
    return state


def latest_valid_checkpoint(ckpt_dir):
    """The valid checkpoint with the highest step among regular, stable and recovery ones (None if none)."""
    best = None
    for path in glob.glob(os.path.join(ckpt_dir, "*.pt")):
        if os.path.basename(path).startswith("debug"):
            continue
        try:
            state = load_checkpoint(path)
        except ValueError as e:
            print(f"skipping {e}", file=sys.stderr)
            continue
        if best is None or state["step"] > best[1]["step"]:
            best = (path, state)
    return best


# ----------------------------------------------------------------------------- the trainer

class Trainer:
    def __init__(self, cfg):
        self.cfg = cfg
        self.device = resolve_device(cfg.device)
        self.cuda = self.device.type == "cuda"
        if self.cuda:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        seed_everything(cfg.seed)
        self.run_name = cfg.run_name or time.strftime("run-%Y%m%d-%H%M%S")
        self.run_dir = os.path.join(cfg.log_dir, self.run_name)
        self.ckpt_dir = os.path.join(self.run_dir, "checkpoints")
        os.makedirs(self.ckpt_dir, exist_ok=True)

        self.model, self.tok = load_model(cfg.model_path, self.device)
        self.ref, _ = load_model(cfg.model_path, self.device)  # frozen start model: the KL anchor
        self.ref.requires_grad_(False)
        self.model.grad_checkpointing = cfg.grad_checkpointing
        self.value_head = grpo.ValueHead(self.model.config.n_embd).to(self.device) if cfg.use_gae else None
        # the training forward may be compiled; generation keeps the eager model (its shapes change every token)
        self.train_hidden = torch.compile(self.model.hidden) if cfg.compile and self.cuda else self.model.hidden
        self.optimizer = self.model.configure_optimizers(
            cfg.weight_decay, cfg.lr, (cfg.adam_beta1, cfg.adam_beta2), self.device.type,
            extra=self.value_head.named_parameters(prefix="value_head") if cfg.use_gae else ())
        self.lr_scale = 1.0  # the schedule's state is the step and this scale, halved by each recovery
        self.kl_ctl = grpo.AdaptiveKLController(cfg.kl_coef, cfg.target_kl, cfg.kl_horizon)
        self.baseline = grpo.RewardBaseline(cfg.baseline_type, cfg.ema_decay)
        self.buffer = ReplayBuffer(seed=cfg.seed)
        try:
            samples = load_samples(cfg)
        except (ValueError, OSError) as e:  # a missing or malformed data file, no Stockfish for --data_source generate
            raise StopRun(f"error: {e}") from None
        self.sampler = TaskSampler(samples, cfg.mix_env_ratio, seed=cfg.seed, buffer=self.buffer)
        self.eval_samples = held_out_samples(cfg.eval_n) if cfg.eval_every > 0 else []
        self.scorer = ScoringPool(cfg.score_workers, cfg.reward_shaping)
        self.step, self.best_eval, self.best_reward, self.recoveries = 0, -math.inf, -math.inf, 0
        self.stop_signal = None

    # --- state
    def autocast(self):
        return autocast(self.device, self.cfg)

    def state(self):
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": {"lr_scale": self.lr_scale},
                "value_head": self.value_head.state_dict() if self.value_head is not None else None,
                "kl_ctl": self.kl_ctl.state_dict(), "baseline": self.baseline.state_dict(),
                "sampler_rng": self.sampler.rng.getstate(), "buffer": (self.buffer.items, self.buffer.rng.getstate()),
                "rng": rng_state(), "step": self.step, "best_eval": self.best_eval, "best_reward": self.best_reward,
                "run_name": self.run_name, "config": dataclasses.asdict(self.cfg)}

    def load_state(self, s):
        self.model.load_state_dict(s["model"])
        self.optimizer.load_state_dict(s["optimizer"])
        self.lr_scale = s["scheduler"]["lr_scale"]
        if self.value_head is not None:
            self.value_head.load_state_dict(s["value_head"])
        self.kl_ctl.load_state_dict(s["kl_ctl"])
        self.baseline.load_state_dict(s["baseline"])
        self.sampler.rng.setstate(s["sampler_rng"])
        self.buffer.items, buffer_rng = s["buffer"]
        self.buffer.rng.setstate(buffer_rng)
        set_rng_state(s["rng"])
        self.step, self.best_eval, self.best_reward = s["step"], s["best_eval"], s["best_reward"]

    def save(self, name):
        save_checkpoint(os.path.join(self.ckpt_dir, name), self.state())

    def save_regular(self):
        self.save(f"step_{self.step:06d}.pt")
        regular = sorted(glob.glob(os.path.join(self.ckpt_dir, "step_*.pt")))
        for old in regular[:-self.cfg.keep_last] if self.cfg.keep_last > 0 else []:
            os.remove(old)

    def resume(self):
        """Pick up a checkpoint if asked to; the run's log files are cut back to its step."""
        cfg, path = self.cfg, None
        if cfg.resume_from_checkpoint:
            try:
                path, state = cfg.resume_from_checkpoint, load_checkpoint(cfg.resume_from_checkpoint)
            except (ValueError, FileNotFoundError) as e:
                raise StopRun(f"error: --resume_from_checkpoint: {e}") from None
        elif cfg.recovery_mode:
            path = os.path.join(self.ckpt_dir, "recovery.pt")
            if not os.path.exists(path):
                raise StopRun(f"--recovery_mode: {path} does not exist; run without it or with --auto_resume")
            state = load_checkpoint(path)
        elif cfg.auto_resume:
            found = latest_valid_checkpoint(self.ckpt_dir)
            if found:
                path, state = found
        if path is None:
            return
        self.load_state(state)
        for name in ("metrics.jsonl", "samples.jsonl"):
            self.truncate_log(os.path.join(self.run_dir, name), self.step)
        self.log(f"Resumed from {path} at step {self.step}")

    @staticmethod
    def truncate_log(path, step):
        if os.path.exists(path):
            with open(path) as f:
                keep = [line for line in f if json.loads(line)["step"] <= step]
            with open(path, "w") as f:
                f.writelines(keep)

    # --- logging
    def log(self, line):
        print(line, flush=True)
        with open(os.path.join(self.run_dir, "train.log"), "a") as f:
            f.write(line + "\n")

    def append_jsonl(self, name, rows):
        with open(os.path.join(self.run_dir, name), "a") as f:
            for row in rows:
                f.write(json.dumps(row) + "\n")

    # --- one step
    def rollout(self):
        """Sample K completions for each of batch_size prompts."""
        cfg, K = self.cfg, self.cfg.k_samples
        samples = self.sampler.draw(cfg.batch_size)
        rows = [s for s in samples for _ in range(K)]  # groups contiguous
        prompts = [self.tok.encode(s.prompt) for s in rows]
        self.model.eval()
        with self.autocast():
            out = generate(self.model, prompts, cfg.max_new_tokens, cfg.temperature, cfg.top_k,
                           self.tok.eos_token_id)
        completions = [ids for ids, _ in out]
        for s in samples:
            self.buffer.add_next(s)  # the position one move on: new positions for A: prompts
        return rows, prompts, completions

    def batch_tensors(self, prompts, completions):
        """Left-padded prompts then right-padded completions: ids (N, Tp + Tc), mask, and the completion
        part: comp_ids (N, Tc), comp_mask. A row that stopped keeps its EOS: stopping is an action."""
        eos = self.tok.eos_token_id
        comps = [c + [eos] if len(c) < self.cfg.max_new_tokens else c for c in completions]
        Tp, Tc = max(map(len, prompts)), max(map(len, comps))
        N = len(prompts)
        ids = torch.full((N, Tp + Tc), eos, dtype=torch.long)
        mask = torch.zeros(N, Tp + Tc, dtype=torch.bool)
        for i, (p, c) in enumerate(zip(prompts, comps)):
            ids[i, Tp - len(p):Tp + len(c)] = torch.tensor(p + c)
            mask[i, Tp - len(p):Tp + len(c)] = True
        return ids.to(self.device), mask.to(self.device), Tp

    def completion_logits(self, model, ids, mask, Tp):
        """Logits that predict the completion tokens (n, Tc, V), and the hidden states they come from."""
        hidden = self.train_hidden if model is self.model else model.hidden
        with self.autocast():
            h = hidden(ids, mask)[:, Tp - 1:-1]  # (n, Tc, C): position t predicts token t + 1
            return model.lm_head(h), h

    def prepare(self, prompts, completions):
        """Tensors of the rollout and its per-rollout constants: reference log-probs (k3), old log-probs
        (several epochs or GAE) and values (GAE). Needs no reward, so it runs while the scorer works."""
        cfg = self.cfg
        ids, mask, Tp = self.batch_tensors(prompts, completions)
        N, mb = ids.shape[0], cfg.micro_batch_size or ids.shape[0]
        comp_ids = ids[:, Tp:]
        ref_logp, old_logp, old_values = [], [], []
        with torch.no_grad():
            for i in range(0, N, mb):
                sl = slice(i, i + mb)
                if cfg.kl_type == "k3":
                    ref_logp.append(grpo.token_logprobs(self.completion_logits(self.ref, ids[sl], mask[sl], Tp)[0],
                                                        comp_ids[sl], cfg.temperature))
                if cfg.num_iterations > 1 or cfg.use_gae:
                    logits, h = self.completion_logits(self.model, ids[sl], mask[sl], Tp)
                    old_logp.append(grpo.token_logprobs(logits, comp_ids[sl], cfg.temperature))
                    if cfg.use_gae:
                        old_values.append(self.value_head(h))
        return dict(ids=ids, mask=mask, Tp=Tp, ref_logp=ref_logp, old_logp=old_logp,
                    old_values=torch.cat(old_values) if old_values else None)

    def update(self, batch, tasks, rewards, apply=True):
        """Advantages from the rewards, then num_iterations optimizer updates over the rollout
        (apply=False: forward and backward only, as a memory probe)."""
        cfg = self.cfg
        ids, mask, Tp, ref_logp, old_logp, old_values = (batch[k] for k in
                                                         ("ids", "mask", "Tp", "ref_logp", "old_logp", "old_values"))
        comp_ids, comp_mask = ids[:, Tp:], mask[:, Tp:]
        N, mb = ids.shape[0], cfg.micro_batch_size or ids.shape[0]
        baseline = self.baseline(rewards, tasks, cfg.k_samples)
        adv, adv_stats = grpo.group_advantages(rewards, cfg.k_samples, cfg.scale_rewards, baseline)
        adv = adv.to(self.device)
        norm = grpo.normalisers(comp_mask)
        kl_coef = grpo.kl_coef_at(self.step, self.kl_ctl.coef if cfg.adaptive_kl else cfg.kl_coef, cfg.kl_warmup_steps)
        returns = None
        if cfg.use_gae:
            adv, returns = grpo.gae(rewards.to(self.device), old_values, comp_mask, cfg.gamma, cfg.gae_lambda)

        lr = cfg.lr * lr_factor(self.step, cfg) * self.lr_scale
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        self.model.train()
        totals = {}
        for it in range(cfg.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            for j, i in enumerate(range(0, N, mb)):
                sl = slice(i, i + mb)
                logits, h = self.completion_logits(self.model, ids[sl], mask[sl], Tp)
                ref_logits = None
                if cfg.kl_type != "k3":
                    with torch.no_grad():
                        ref_logits = self.completion_logits(self.ref, ids[sl], mask[sl], Tp)[0]
                gae_terms = {}
                if cfg.use_gae:
                    gae_terms = dict(values=self.value_head(h), old_values=old_values[sl], returns=returns[sl])
                loss, metrics = grpo_loss(
                    logits, comp_ids[sl], comp_mask[sl], adv[sl], old_logp[j] if old_logp and it > 0 else None,
                    ref_logits=ref_logits, ref_logp=ref_logp[j] if ref_logp else None, norm=norm,
                    temperature=cfg.temperature, clip_eps_low=cfg.clip_eps_low, clip_eps_high=cfg.clip_eps_high,
                    loss_type=cfg.loss_type, kl_type=cfg.kl_type, kl_coef=kl_coef, entropy_coef=cfg.entropy_coef,
                    value_coef=cfg.value_coef, value_clip=cfg.value_clip, **gae_terms)
                loss.backward()
                for k, v in metrics.items():  # each micro-batch's share: they sum to the batch value
                    totals[k] = totals.get(k, 0.0) + v / cfg.num_iterations
            params = [p for g in self.optimizer.param_groups for p in g["params"]]
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
            if not (math.isfinite(totals["loss"]) and torch.isfinite(grad_norm)):
                return None  # nothing reaches the weights; the caller rolls back
            if apply:
                self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        totals.update(grad_norm=grad_norm.item(), kl_coef=kl_coef, lr=lr, **adv_stats)
        return totals

    def probe_peak_memory(self, batch_size):
        """Peak CUDA bytes of one full step at this batch size without changing any state (None: OOM)."""
        saved = (rng_state(), self.sampler.rng.getstate(), dict(self.buffer.items), self.baseline.state_dict())
        self.cfg.batch_size = batch_size
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        try:
            rows, prompts, completions = self.rollout()
            rewards = torch.rand(len(rows))  # any rewards with variance: the update's memory is the same
            self.update(self.prepare(prompts, completions), [s.task for s in rows], rewards, apply=False)
            peak = torch.cuda.max_memory_allocated()
        except torch.cuda.OutOfMemoryError:
            peak = None
        self.optimizer.zero_grad(set_to_none=True)
        set_rng_state(saved[0])
        self.sampler.rng.setstate(saved[1])
        self.buffer.items = saved[2]
        self.baseline.load_state_dict(saved[3])
        return peak

    def choose_batch_size(self):
        if not self.cuda:
            self.log("--auto_batch_size measures CUDA memory; on CPU the batch size stays "
                     f"{self.cfg.batch_size}")
            return
        capacity = torch.cuda.get_device_properties(self.device).total_memory
        start = self.cfg.batch_size
        best, measured = find_batch_size(self.probe_peak_memory, start, capacity, self.cfg.memory_fraction)
        for b, peak in measured:
            self.log(f"auto_batch_size: {b} prompts x {self.cfg.k_samples} -> "
                     + ("out of memory" if peak is None else f"peak {peak / 2**30:.1f} GiB of {capacity / 2**30:.1f}"))
        if best is None:
            raise StopRun(f"--auto_batch_size: even {start} prompts x {self.cfg.k_samples} exceed "
                          f"{self.cfg.memory_fraction:.0%} of the GPU; lower --batch_size or --k_samples")
        self.cfg.batch_size = best
        self.log(f"auto_batch_size: using --batch_size {best}")

    def recover(self, reason):
        """Roll back to the recovery checkpoint with the LR halved; keep the bad state for debugging."""
        self.recoveries += 1
        self.save(f"debug_step_{self.step:06d}.pt")
        if self.recoveries > MAX_RECOVERIES:
            raise StopRun(f"{reason} at step {self.step} again after {MAX_RECOVERIES} recoveries; stopping. "
                          f"The bad state is in {self.ckpt_dir}/debug_step_{self.step:06d}.pt; try a lower --lr")
        state = load_checkpoint(os.path.join(self.ckpt_dir, "recovery.pt"))
        lr_scale = self.lr_scale * 0.5
        self.load_state(state)
        self.lr_scale = lr_scale
        for name in ("metrics.jsonl", "samples.jsonl"):
            self.truncate_log(os.path.join(self.run_dir, name), self.step)
        self.log(f"{reason}: rolled back to step {self.step}, lr scale now {self.lr_scale} "
                 f"(recovery {self.recoveries}/{MAX_RECOVERIES})")

    def train_step(self):
        """One GRPO step; returns its metrics row (None when a bad step was rolled back)."""
        cfg, t0 = self.cfg, time.perf_counter()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        rows, prompts, completions = self.rollout()
        t_gen = time.perf_counter()
        texts = [self.tok.decode(ids) for ids in completions]  # decoded for the scorer only, never re-encoded
        scoring = self.scorer.submit(rows, texts)  # in worker processes when score_workers > 0
        batch = self.prepare(prompts, completions)
        if self.cuda:
            torch.cuda.synchronize()
        t_prep = time.perf_counter()
        scored = scoring()
        rewards = torch.tensor([r for r, _ in scored], dtype=torch.float32)
        t_score = time.perf_counter()  # only the wait for scores that prepare() did not hide
        stats = self.update(batch, [s.task for s in rows], rewards)
        del batch
        if stats is None:
            self.recover("non-finite loss or gradient")
            return None
        if cfg.adaptive_kl and "kl" in stats:
            self.kl_ctl.update(stats["kl"])
        self.step += 1
        if self.cuda:
            torch.cuda.synchronize()
        t_end = time.perf_counter()
        m = {"step": self.step, **stats, "prompt_tokens": sum(map(len, prompts)),
             "completion_tokens": sum(map(len, completions)),
             "time_generate": t_gen - t0, "time_ref_logprobs": t_prep - t_gen, "time_score": t_score - t_prep,
             "time_update": t_end - t_score,
             "time_step": t_end - t0, "peak_mem_mb": peak_memory_mb(self.device)}
        m.update(reward_metrics(rows, rewards, scored))
        self.best_reward = max(self.best_reward, m["reward_mean"])
        if cfg.eval_every > 0 and self.step % cfg.eval_every == 0:
            ev, _ = evaluate(self.model, self.tok, self.eval_samples, cfg.max_new_tokens, autocast=self.autocast(),
                             shaping=cfg.reward_shaping)
            m.update(ev)
            if ev["eval_reward"] > self.best_eval:
                self.best_eval = ev["eval_reward"]
                self.save("stable.pt")
        self.append_jsonl("metrics.jsonl", [m])
        self.append_jsonl("samples.jsonl", [{"step": self.step, "task": s.task, "prompt": s.prompt, "completion": t,
                                             "reward": r} for s, t, (r, _) in
                                            list(zip(rows, texts, scored))[:cfg.log_samples * cfg.k_samples:cfg.k_samples]])
        n_env = sum(s.task == "A" for s in rows) // cfg.k_samples
        self.log(f"Step {self.step} | Loss {m['loss']:.4f} | Reward {m['reward_mean']:.3f} (best {self.best_reward:.3f}) "
                 f"| P/E {cfg.batch_size - n_env}/{n_env} | KL {m.get('kl', 0.0):.4f} | {m['time_step']:.1f}s"
                 + (f" | eval {m['eval_reward']:.3f}" if "eval_reward" in m else ""))
        if cfg.kl_threshold > 0 and abs(m.get("kl", 0.0)) > cfg.kl_threshold:
            self.save_regular()
            raise StopRun(f"KL {m['kl']:.4f} exceeds --kl_threshold {cfg.kl_threshold} at step {self.step}; "
                          "stopping (checkpoint saved). Lower --lr or raise --kl_coef")
        if cfg.save_every > 0 and self.step % cfg.save_every == 0:
            self.save_regular()
            self.save("recovery.pt")
            self.recoveries = 0
        return m

    def run(self):
        self.resume()
        if self.cfg.auto_batch_size:
            self.choose_batch_size()
        with open(os.path.join(self.run_dir, "config.json"), "w") as f:
            json.dump(dataclasses.asdict(self.cfg), f, indent=2)
        if not os.path.exists(os.path.join(self.ckpt_dir, "recovery.pt")):
            self.save("recovery.pt")  # the known-good start
        self.log(f"Run {self.run_name}: {self.model.num_params() / 1e6:.1f}M params on {self.device}, "
                 f"{self.cfg.steps} steps of {self.cfg.batch_size} prompts x {self.cfg.k_samples}")
        handlers = {sig: signal.signal(sig, self.on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        deadline = time.time() + 60 * self.cfg.time_limit_min if self.cfg.time_limit_min > 0 else math.inf
        try:
            while self.step < self.cfg.steps:
                if time.time() > deadline:
                    self.log(f"Time limit of {self.cfg.time_limit_min} min reached at step {self.step}")
                    break
                self.train_step()
                if self.stop_signal:
                    self.save_regular()
                    raise StopRun(f"{self.stop_signal} received: checkpoint saved at step {self.step}; "
                                  f"continue with --run_name {self.run_name} --auto_resume")
        finally:
            self.scorer.close()
            for sig, h in handlers.items():
                signal.signal(sig, h)
        self.save_regular()
        final = save_model(self.model, self.tok, os.path.join(self.run_dir, "final"))
        self.log(f"Done: final model in {final}")

    def on_signal(self, signum, frame):
        self.stop_signal = signal.Signals(signum).name  # acted on at the end of the current step


# ----------------------------------------------------------------------------- helpers

grpo_loss = grpo.grpo_loss  # a module-level name, so tests can inject a failing loss


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


def reward_metrics(rows, rewards, scored):
    """Reward mean/std overall and per task, each component's mean and format validity per task."""
    m = {"reward_mean": rewards.mean().item(), "reward_std": rewards.std().item() if len(rewards) > 1 else 0.0}
    for task in ("P", "A"):
        idx = [i for i, s in enumerate(rows) if s.task == task]
        if not idx:
            continue
        r = rewards[idx]
        m[f"reward_mean_{task}"], m[f"reward_std_{task}"] = r.mean().item(), r.std().item() if len(idx) > 1 else 0.0
        for name in scored[idx[0]][1]:
            m[f"{name}_{task}"] = sum(scored[i][1][name] for i in idx) / len(idx)
    return m


def main(argv=None):
    cfg = parse_args(argv)
    try:
        Trainer(cfg).run()
    except LoadError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except StopRun as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
