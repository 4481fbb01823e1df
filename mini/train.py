"""
GRPO fine-tuning of RookWorld-LM on mixed P: (policy) and A: (environment) tasks.

    python mini/train.py --steps 100 --k_samples 8
    python mini/train.py --model_path logs/sft/final --run_name demo --steps 200
    python mini/train.py --run_name demo --auto_resume          # continue after a crash, kill or Ctrl-C

Each step: draw batch_size prompts, sample k_samples completions each (rollout), score them, turn the
rewards into group-relative advantages, update the policy (PPO-clipped, KL to the frozen start model).
Logging, evaluation and checkpoints happen around the step, in finish_step(). Everything lands in
logs/<run_name>/ (see mini/runs.py), which belongs to one process at a time and to one run: a directory
that holds a run is continued with --auto_resume (under its saved config) or moved aside with --overwrite.
"""
import contextlib
import copy
import dataclasses
import math
import os
import signal
import sys
import time
from dataclasses import dataclass

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from mini import distributed, grpo
from mini.annotate import EngineFailure
from mini.chess_eval import quick_metrics
from mini.config import FIELDS, given_flags, parse_args
from mini.dataset import ReplayBuffer, make_sampler
from mini.evaluate import evaluate, held_out_samples
from mini.loader import LoadError, load_model, save_model
from mini.report import make_reporter
from mini.reward_scorer import ScoringPool, engine_reward
from mini.runs import (RunDir, RunError, checkpoint_settings, disk_full, disk_guard, is_disk_full, load_checkpoint,
                       resume_config)
from mini.runtime import (autocast, lr_factor, peak_memory_mb, resolve_device, rng_state, seed_everything,
                          set_rng_state)
from mini.sampler import generate
from mini.selfplay import SelfPlaySource

MAX_RECOVERIES = 3


class StopRun(Exception):
    """Ends the run cleanly with a message (the state is saved first)."""


@dataclass
class Rollout:
    """One step's batch from sampling to the update. N = batch_size * K rows, groups contiguous
    (rows g*K .. g*K+K-1 share a prompt). The tensors are on the training device."""
    samples: list                 # N Samples: prompt and labels
    prompts: list                 # N token-id lists
    completions: list             # N token-id lists as sampled, without the EOS
    texts: list                   # N decoded completions, for the scorer only (never re-encoded)
    ids: torch.Tensor = None      # (N, Tp + Tc) left-padded prompt, right-padded completion (+ EOS if it stopped)
    mask: torch.Tensor = None     # (N, Tp + Tc) True on real tokens
    Tp: int = 0                   # prompt width: completion token t sits at column Tp + t
    ref_logp: torch.Tensor = None    # (N, Tc) reference log-probs (k3 KL)
    old_logp: torch.Tensor = None    # (N, Tc) behaviour log-probs (several PPO epochs, GAE)
    old_values: torch.Tensor = None  # (N, Tc) value estimates (GAE)
    scores: list = None           # N (reward, components) from the scorer
    rewards: torch.Tensor = None  # (N,)

    @property
    def comp_ids(self):
        return self.ids[:, self.Tp:]  # (N, Tc)

    @property
    def comp_mask(self):
        return self.mask[:, self.Tp:]  # (N, Tc)

    @property
    def tasks(self):
        return [s.task for s in self.samples]


class PolicyHead(torch.nn.Module):
    """The trained modules as one forward, so that DistributedDataParallel syncs the value head's gradients
    with the model's: completion logits (n, Tc, V) and value estimates (n, Tc) or None."""

    def __init__(self, model, value_head, hidden, autocast):
        super().__init__()
        self.model, self.value_head, self.hidden, self.autocast = model, value_head, hidden, autocast

    def forward(self, ids, mask, Tp):
        with self.autocast():
            # (n, Tc, C): position t predicts token t + 1; the group's shared prompt is computed once
            h = self.hidden(ids[:, :-1], mask[:, :-1], Tp - 1)
            return self.model.lm_head(h), self.value_head(h) if self.value_head is not None else None


class Trainer:
    """GRPO on one process, or on every rank of torchrun (mini/distributed.py): each rank samples, scores and
    differentiates its batch_size / world_size prompts; the advantages, the loss normalisers and the metrics
    are those of the global batch; rank 0 writes the logs and checkpoints (which hold every rank's RNG and
    sampler state) while the others wait for it."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.device = distributed.setup(resolve_device(cfg.device))
        self.rank, self.world = distributed.rank(), distributed.world_size()
        self.main = self.rank == 0
        self.cuda = self.device.type == "cuda"
        if self.cuda:
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        seed_everything(cfg.seed + self.rank)  # ranks sample different completions; rank 0 is a plain run's
        self.local_batch = cfg.batch_size // self.world  # config.problems checked that it divides
        self.run_dir = RunDir(cfg.log_dir, distributed.from_main(cfg.run_name or time.strftime("run-%Y%m%d-%H%M%S")))
        self.log = self.run_dir.log if self.main else (lambda line: None)
        try:
            self.on_main(lambda: self.run_dir.claim(
                resume=cfg.auto_resume or cfg.recovery_mode or bool(cfg.resume_from_checkpoint), overwrite=cfg.overwrite))
            self.setup()
        except BaseException:
            if self.main:
                self.run_dir.release(failed=True)  # a failed start leaves no empty run directory behind
            raise

    def on_main(self, work):
        """work() on rank 0 (the whole of it on a single process); the other ranks wait, and stop if it fails."""
        failed = None
        if self.main:
            try:
                work()
            except BaseException as e:
                failed = e
        if self.world > 1:
            why = distributed.from_main(None if failed is None else f"{type(failed).__name__}: {failed}")
            if why is not None and not self.main:
                raise StopRun(f"stopped with rank 0 ({why})")
        if failed is not None:
            raise failed

    def setup(self):
        cfg = self.cfg
        try:
            self.reporter = make_reporter(cfg.report_to if self.main else "none", self.run_dir.path,
                                          dataclasses.asdict(cfg))
        except ValueError as e:  # the sentence says which extra to install
            raise StopRun(f"error: {e}") from None
        self.model, self.tok = load_model(cfg.model_path, self.device)
        self.ref, _ = load_model(cfg.model_path, self.device)  # frozen start model: the KL anchor
        self.ref.requires_grad_(False)
        self.model.grad_checkpointing = cfg.grad_checkpointing
        self.value_head = grpo.ValueHead(self.model.config.n_embd).to(self.device) if cfg.use_gae else None
        # the training forward may be compiled; generation has its own static-shape step (--compile_decode)
        hidden = self.model.completion_hidden
        hidden = torch.compile(hidden) if cfg.compile and self.cuda else hidden
        self.policy = PolicyHead(self.model, self.value_head, hidden, self.autocast)
        self.ref_head = PolicyHead(self.ref, None, self.ref.completion_hidden, self.autocast)
        # under torchrun: the same weights on every rank (broadcast from rank 0 here), gradients averaged
        self.ddp = DistributedDataParallel(self.policy, device_ids=[self.device.index] if self.cuda else None) \
            if distributed.active() else None
        self.optimizer = self.model.configure_optimizers(
            cfg.weight_decay, cfg.lr, (cfg.adam_beta1, cfg.adam_beta2), self.device.type,
            extra=self.value_head.named_parameters(prefix="value_head") if cfg.use_gae else ())
        self.lr_scale = 1.0  # the schedule's state is the step and this scale, halved by each recovery
        self.kl_ctl = grpo.AdaptiveKLController(cfg.kl_coef, cfg.target_kl, cfg.kl_horizon)
        self.baseline = grpo.RewardBaseline(cfg.baseline_type, cfg.ema_decay)
        self.buffer = ReplayBuffer(seed=cfg.seed + self.rank)
        try:
            self.sampler = make_sampler(cfg, self.buffer, self.rank)
        except (ValueError, OSError) as e:  # a missing or malformed data file, no Stockfish for --data_source generate
            raise StopRun(f"error: {e}") from None
        self.eval_samples = held_out_samples(cfg.eval_n) if cfg.eval_every > 0 and self.main else []
        try:
            self.scorer = ScoringPool(cfg.score_workers, cfg.reward_shaping, engine_reward(cfg))
        except FileNotFoundError as e:  # --p_reward engine without Stockfish: says how to install it
            raise StopRun(f"error: {e}") from None
        self.source = None  # --data_source selfplay: positions from the policy's own games
        if cfg.data_source == "selfplay":
            try:
                self.source = SelfPlaySource(
                    self.tok, self.sampler, games=cfg.selfplay_games, plies=cfg.selfplay_plies,
                    temperature=cfg.selfplay_temperature, top_k=cfg.selfplay_top_k, max_new_tokens=cfg.max_new_tokens,
                    mix=cfg.selfplay_mix, env_ratio=cfg.mix_env_ratio, depth=cfg.stockfish_depth,
                    workers=cfg.annotate_workers, stockfish_path=cfg.stockfish_path, seed=cfg.seed + self.rank)
            except FileNotFoundError as e:  # no Stockfish: says how to install it
                self.scorer.close()
                raise StopRun(f"error: {e}") from None
        self.step, self.best_eval, self.best_reward, self.recoveries = 0, -math.inf, -math.inf, 0
        self.stop_signal, self.bar = None, None

    def autocast(self):
        return autocast(self.device, self.cfg)

    # ------------------------------------------------------------------------- one GRPO step

    def train_step(self):
        """One GRPO step; returns its metrics row (None when a bad step was rolled back)."""
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()  # peak_mem_mb is this step's
        timer, sampling = PhaseTimer(self.cuda), {}
        if self.source is not None and self.step % self.cfg.selfplay_refresh == 0:
            with timer("selfplay"):
                self.source.refresh(self.model, self.autocast())
        if self.cfg.dynamic_sampling:
            r, sampling = self.informative_rollout(timer)
            with timer("ref_logprobs"):
                self.prepare(r)
        else:
            with timer("generate"):
                r = self.rollout()
            scoring = self.scorer.submit(r.samples, r.texts)  # in worker processes when score_workers > 0 ...
            with timer("ref_logprobs"):
                self.prepare(r)  # ... while the reference log-probs are computed here
            with timer("score"):  # only the wait for scores that prepare() did not hide
                r.scores = scoring()
        return self.learn(r, timer, sampling)

    def learn(self, r, timer, sampling=None):
        """Advantages, update and metrics row of a scored rollout (r.scores set, this rank's rows); None when
        the step was rolled back. Every rank sees every rank's rewards, so the advantages, the baseline and
        the metrics are those of the global batch."""
        cfg = self.cfg
        ranks = distributed.gather((r.scores, r.tasks, [len(c) for c in r.completions], sum(map(len, r.prompts)),
                                    sampling or {}))
        scores, tasks, lens = ([x for part in ranks for x in part[i]] for i in range(3))  # global, in rank order
        offset = sum(len(part[0]) for part in ranks[:self.rank])
        rewards = torch.tensor([reward for reward, _ in scores], dtype=torch.float32)  # (N_global,)
        r.rewards = rewards[offset:offset + len(r.scores)]
        with timer("update"):
            adv, returns, adv_stats = self.advantages(r, rewards, tasks, offset)
            stats = self.update(r, adv, returns)
        if stats is None:
            self.recover("non-finite loss or gradient")
            return None
        if cfg.adaptive_kl and "kl" in stats:
            self.kl_ctl.update(stats["kl"])
        self.step += 1
        m = {"step": self.step, **stats, **adv_stats, **merge_sampling([part[4] for part in ranks]),
             **(self.source.metrics if self.source else {}), **reward_metrics(rewards, tasks, scores),
             "prompt_tokens": sum(part[3] for part in ranks), "completion_tokens": sum(lens),
             "completion_len_mean": sum(lens) / len(lens),
             "completion_clipped_ratio": sum(n >= cfg.max_new_tokens for n in lens) / len(lens),
             **self.scorer.metrics, **timer.seconds(),  # the scorer's and the timings are this rank's
             "peak_mem_mb": peak_memory_mb(self.device)}
        self.finish_step(m, r, tasks)
        return m

    def rollout(self):
        """Sample K completions for each of batch_size prompts."""
        cfg, K = self.cfg, self.cfg.k_samples
        drawn = (self.source or self.sampler).draw(self.local_batch)
        samples = [s for s in drawn for _ in range(K)]  # groups contiguous
        prompts = [self.tok.encode(s.prompt) for s in samples]
        self.model.eval()
        with self.autocast():
            out = generate(self.model, prompts, cfg.max_new_tokens, cfg.temperature, cfg.top_k,
                           self.tok.eos_token_id, compile_decode=cfg.compile_decode)
        completions = [ids for ids, _ in out]
        for s in drawn:
            self.buffer.add_next(s)  # the position one move on: new positions for A: prompts
        return Rollout(samples, prompts, completions, [self.tok.decode(c) for c in completions])

    def informative_rollout(self, timer):
        """DAPO's dynamic sampling: rollouts of batch_size prompts, scored at once, keeping the groups whose
        rewards differ (grpo.informative_groups), until batch_size groups are kept or max_rounds rollouts
        were drawn. Returns the kept groups as one rollout (the first batch_size of them, in draw order; the
        last rollout whole if none was kept, so the KL term still acts) and the sampling metrics."""
        cfg, K = self.cfg, self.cfg.k_samples
        kept, rounds, drawn, zero_var, reward_sum, last = [], 0, 0, 0, 0.0, None
        while len(kept) < self.local_batch and rounds < cfg.dynamic_sampling_max_rounds:
            with timer("generate"):
                last = self.rollout()
            with timer("score"):
                last.scores = self.scorer.submit(last.samples, last.texts)()
            rewards = torch.tensor([reward for reward, _ in last.scores])
            informative = grpo.informative_groups(rewards, K, cfg.dynamic_sampling_min_std).tolist()
            kept += [(last, g) for g, keep in enumerate(informative) if keep]
            rounds, drawn = rounds + 1, drawn + len(informative)
            zero_var += int((~grpo.informative_groups(rewards, K)).sum())
            reward_sum += rewards.sum().item()
        n_kept = min(len(kept), self.local_batch)
        kept = kept[:self.local_batch] or [(last, g) for g in range(self.local_batch)]
        rows = [(r, i) for r, g in kept for i in range(g * K, (g + 1) * K)]
        r = Rollout(*([getattr(r, f)[i] for r, i in rows] for f in ("samples", "prompts", "completions", "texts")),
                    scores=[r.scores[i] for r, i in rows])
        return r, {"ds_rounds": rounds, "ds_groups_drawn": drawn, "ds_groups_kept": n_kept,
                   "ds_zero_var_share_drawn": zero_var / drawn, "ds_reward_mean_drawn": reward_sum / (drawn * K)}

    def prepare(self, r):
        """The rollout's tensors and its per-rollout constants: reference log-probs (k3), old log-probs
        (several epochs or GAE) and values (GAE). Needs no reward, so it runs while the scorer works."""
        cfg = self.cfg
        r.ids, r.mask, r.Tp = self.batch_tensors(r.prompts, r.completions)
        ref_logp, old_logp, old_values = [], [], []
        with torch.no_grad():
            for sl in self.micro_batches(len(r.prompts)):
                ids, mask, comp_ids = r.ids[sl], r.mask[sl], r.comp_ids[sl]
                if cfg.kl_type == "k3":
                    logits = self.ref_head(ids, mask, r.Tp)[0]
                    ref_logp.append(grpo.token_logprobs(logits, comp_ids, cfg.temperature))
                if cfg.num_iterations > 1 or cfg.use_gae:
                    logits, values = self.policy(ids, mask, r.Tp)
                    old_logp.append(grpo.token_logprobs(logits, comp_ids, cfg.temperature))
                    if cfg.use_gae:
                        old_values.append(values)
        r.ref_logp, r.old_logp, r.old_values = (torch.cat(x) if x else None for x in (ref_logp, old_logp, old_values))

    def advantages(self, r, rewards=None, tasks=None, offset=0):
        """The rollout's per-row advantages (n,) from the group statistics of the global batch's `rewards`
        (N,) and `tasks` (every rank's rows, this rank's from `offset`; default: the rollout's own), or
        per-token (n, Tc) GAE advantages and returns with --use_gae; and the statistics."""
        cfg = self.cfg
        rewards, tasks = (r.rewards, r.tasks) if rewards is None else (rewards, tasks)
        baseline = self.baseline(rewards, tasks, cfg.k_samples)
        adv, stats = grpo.group_advantages(rewards, cfg.k_samples, cfg.scale_rewards, baseline)
        if cfg.use_gae:
            adv, returns = grpo.gae(r.rewards.to(self.device), r.old_values, r.comp_mask, cfg.gamma, cfg.gae_lambda)
            return adv, returns, stats
        return adv[offset:offset + len(r.prompts)].to(self.device), None, stats

    def update(self, r, adv, returns, apply=True):
        """num_iterations optimizer updates over the rollout (apply=False: forward and backward only, on this
        rank alone, as a memory probe). Returns the metrics, or None when the loss or gradient is not finite.
        Under torchrun the normalisers are the global batch's, each rank's loss is its share of the global
        loss (so DDP's mean of the gradients, times world size, is the global gradient) and the metrics are
        summed over the ranks: N ranks x B/N prompts give the update of 1 process x B prompts."""
        cfg = self.cfg
        norm = grpo.normalisers(r.comp_mask, budget=cfg.max_new_tokens)  # over the whole rollout
        ddp = self.ddp if apply else None
        if ddp is not None:  # ... of every rank
            n_seqs, n_tokens = distributed.all_sum(torch.tensor([norm["n_seqs"], int(r.comp_mask.sum())])).tolist()
            norm.update(n_seqs=int(n_seqs), n_tokens=max(int(n_tokens), 1))
        kl_coef = grpo.kl_coef_at(self.step, self.kl_ctl.coef if cfg.adaptive_kl else cfg.kl_coef, cfg.kl_warmup_steps)
        settings = grpo.LossSettings(cfg.temperature, cfg.clip_eps_low, cfg.clip_eps_high, cfg.loss_type,
                                     cfg.kl_type, kl_coef, cfg.entropy_coef, cfg.value_coef, cfg.value_clip)
        lr = cfg.lr * lr_factor(self.step, cfg) * self.lr_scale
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        self.model.train()
        totals = {}
        batches = self.micro_batches(len(r.prompts))
        for it in range(cfg.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            for j, sl in enumerate(batches):
                # DDP averages the gradients at the backward of the last micro-batch only
                with ddp.no_sync() if ddp is not None and j < len(batches) - 1 else contextlib.nullcontext():
                    logits, values = (ddp or self.policy)(r.ids[sl], r.mask[sl], r.Tp)
                    ref_logits = None
                    if cfg.kl_type != "k3":
                        with torch.no_grad():
                            ref_logits = self.ref_head(r.ids[sl], r.mask[sl], r.Tp)[0]
                    critic = dict(values=values, old_values=r.old_values[sl], returns=returns[sl]) if cfg.use_gae else {}
                    loss, metrics = grpo_loss(
                        logits, r.comp_ids[sl], r.comp_mask[sl], adv[sl], settings, norm,
                        old_logp=r.old_logp[sl] if it > 0 else None,  # epoch 0 is on-policy: ratio 1
                        ref_logits=ref_logits, ref_logp=r.ref_logp[sl] if r.ref_logp is not None else None, **critic)
                    (loss * self.world if ddp is not None else loss).backward()
                for k, v in metrics.items():  # each micro-batch's share: they sum to the batch value
                    totals[k] = totals.get(k, 0.0) + v / cfg.num_iterations
            seen = totals if ddp is None else dict(zip(totals, distributed.all_sum(  # the ranks' shares sum up too
                torch.tensor(list(totals.values()), dtype=torch.float64)).tolist()))
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
            if not (math.isfinite(seen["loss"]) and torch.isfinite(grad_norm)):  # the same verdict on every rank
                return None  # nothing reaches the weights; the caller rolls back
            if apply:
                self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {**seen, "grad_norm": grad_norm.item(), "kl_coef": kl_coef, "lr": lr}

    # ------------------------------------------------------------------------- tensors of a rollout

    def micro_batches(self, n):
        mb = self.cfg.micro_batch_size or n
        return [slice(i, i + mb) for i in range(0, n, mb)]

    def batch_tensors(self, prompts, completions):
        """Left-padded prompts then right-padded completions: ids (N, Tp + Tc), mask, Tp. A row that
        stopped keeps its EOS: stopping is an action."""
        eos = self.tok.eos_token_id
        comps = [c + [eos] if len(c) < self.cfg.max_new_tokens else c for c in completions]
        Tp, Tc = max(map(len, prompts)), max(map(len, comps))
        ids = torch.full((len(prompts), Tp + Tc), eos, dtype=torch.long)
        mask = torch.zeros(len(prompts), Tp + Tc, dtype=torch.bool)
        for i, (p, c) in enumerate(zip(prompts, comps)):
            ids[i, Tp - len(p):Tp + len(c)] = torch.tensor(p + c)
            mask[i, Tp - len(p):Tp + len(c)] = True
        return ids.to(self.device), mask.to(self.device), Tp

    # ------------------------------------------------------------------------- around the step

    def finish_step(self, m, r, tasks):
        """Evaluation, logs and checkpoints after a step (`tasks`: the global batch's); stops the run when the
        KL runs away. Rank 0 evaluates and writes; every rank takes part in the checkpoints."""
        cfg = self.cfg
        self.best_reward = max(self.best_reward, m["reward_mean"])
        if cfg.eval_every > 0 and self.step % cfg.eval_every == 0:
            m.update(distributed.from_main(self.held_out_metrics() if self.main else None))
            if m["eval_reward"] > self.best_eval:
                self.best_eval = m["eval_reward"]
                self.save("stable.pt")
        if self.main:
            self.write_step(m, r, tasks)
        if cfg.kl_threshold > 0 and abs(m.get("kl", 0.0)) > cfg.kl_threshold:
            self.save_regular()
            raise StopRun(f"KL {m['kl']:.4f} exceeds --kl_threshold {cfg.kl_threshold} at step {self.step}; "
                          "stopping (checkpoint saved). Lower --lr or raise --kl_coef")
        if cfg.save_every > 0 and self.step % cfg.save_every == 0:
            self.save_regular()
            self.save("recovery.pt")
            self.recoveries = 0

    def held_out_metrics(self):
        ev, _ = evaluate(self.model, self.tok, self.eval_samples, self.cfg.max_new_tokens, autocast=self.autocast(),
                         shaping=self.cfg.reward_shaping, engine=self.scorer.engine, compile_decode=self.cfg.compile_decode)
        if self.cfg.eval_chess:
            ev.update(quick_metrics(self.model, self.tok, max_new_tokens=self.cfg.max_new_tokens, autocast=self.autocast()))
        return ev

    def write_step(self, m, r, tasks):
        """metrics.jsonl, samples.jsonl (rank 0's first groups), the dashboards and the log line."""
        cfg, K = self.cfg, self.cfg.k_samples
        self.run_dir.append_jsonl("metrics.jsonl", [m])
        samples = [{"step": self.step, "task": r.samples[i].task, "prompt": r.samples[i].prompt,
                    "completion": r.texts[i], "reward": r.scores[i][0]}
                   for i in range(0, min(cfg.log_samples * K, len(r.samples)), K)]  # the first row of each group
        self.run_dir.append_jsonl("samples.jsonl", samples)
        self.reporter.log(self.step, m)  # a view of the row just written: metrics.jsonl stays the record
        self.reporter.log_samples(self.step, samples)
        n_env = tasks.count("A") // K
        self.log(f"Step {self.step} | Loss {m['loss']:.4f} | Reward {m['reward_mean']:.3f} (best {self.best_reward:.3f}) "
                 f"| P/E {len(tasks) // K - n_env}/{n_env} | KL {m.get('kl', 0.0):.4f} | {m['time_step']:.1f}s"
                 + (f" | eval {m['eval_reward']:.3f}" if "eval_reward" in m else ""))

    def run(self, changed=None):
        """Resume if asked to (`changed`: the flags a resumed run changed, logged), train, save the final model."""
        finished = False
        try:
            self.resume()
            for name, (old, new) in (changed or {}).items():
                self.log(f"resume: --{name} {old!r} -> {new!r}")
            if self.cfg.auto_batch_size and self.step == 0:  # a resumed run keeps the batch size it chose
                self.choose_batch_size()
            self.on_main(lambda: self.run_dir.save_config(self.cfg))
            # the known-good start, also after a resume: a recovery.pt left by the earlier process may be damaged
            # (skipped by the resume) or older than the resumed step, and a rollback must go back exactly here
            self.save("recovery.pt")
            self.log(f"Run {self.run_dir.name}: {self.model.num_params() / 1e6:.1f}M params on {self.device}, "
                     f"{self.cfg.steps} steps of {self.cfg.batch_size} prompts x {self.cfg.k_samples}"
                     + (f", DistributedDataParallel over {self.world} rank(s)" if self.ddp else ""))
            self.loop()
            self.save_regular()
            self.on_main(self.save_final)
            finished = True
        finally:
            self.scorer.close()
            self.reporter.close()
            self.sampler.close()
            if self.source is not None:
                self.source.close()
            if self.main:
                self.run_dir.release(failed=not finished)  # a refused resume leaves no empty run directory behind
            # DDP's reducer holds gloo threads: free it now, before distributed.cleanup destroys the process
            # group, rather than whenever the garbage collector reaches this trainer
            self.ddp = None

    def save_final(self):
        final = self.run_dir.file("final")
        with disk_guard(final, 4 * self.model.num_params()):  # fp32 weights
            self.log(f"Done: final model in {save_model(self.model, self.tok, final)}")

    def loop(self):
        """Steps until --steps, the time limit or a signal; a progress bar where the output is a terminal."""
        handlers = {sig: signal.signal(sig, self.on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        deadline = time.time() + 60 * self.cfg.time_limit_min if self.cfg.time_limit_min > 0 else math.inf
        self.bar = tqdm(total=self.cfg.steps, initial=self.step, unit="step", dynamic_ncols=True,
                        disable=not sys.stderr.isatty())
        try:
            while self.step < self.cfg.steps:
                if distributed.any_rank(time.time() > deadline):  # every rank stops at the same step
                    self.log(f"Time limit of {self.cfg.time_limit_min} min reached at step {self.step}")
                    break
                m = self.train_step()
                if m is not None:
                    self.bar.update(1)
                    self.bar.set_postfix(reward=f"{m['reward_mean']:.3f}", kl=f"{m.get('kl', 0.0):.4f}")
                if distributed.any_rank(self.stop_signal) and self.step < self.cfg.steps:  # else save as usual
                    self.log(f"{self.stop_signal or 'a signal to another rank'}: saving checkpoint at step {self.step}...")
                    self.save_regular()
                    launch = f"torchrun --nproc_per_node {self.world}" if self.world > 1 else "python"
                    raise StopRun(f"saved; resume with: {launch} mini/train.py --log_dir {self.cfg.log_dir} "
                                  f"--run_name {self.run_dir.name} --auto_resume")
        finally:
            self.bar.close()
            for sig, h in handlers.items():
                signal.signal(sig, h)

    def on_signal(self, signum, frame):
        """The first Ctrl-C (or SIGTERM) stops after the current step with a checkpoint; a second one quits at
        once, which never damages a checkpoint (they are written to .tmp and renamed)."""
        name = signal.Signals(signum).name
        if self.stop_signal:
            raise KeyboardInterrupt
        self.stop_signal = name
        if self.main:
            then = (f"finishing step {self.step + 1}, then saving a checkpoint" if self.step + 1 < self.cfg.steps else
                    "finishing the last step and writing the final model")  # the run ends anyway
            print(f"\n{name}: {then} (again to quit at once)", file=sys.stderr, flush=True)

    # ------------------------------------------------------------------------- state, resume, recovery

    def rank_state(self):
        """What differs between torchrun ranks: the RNGs, the prompt sampler, the replay buffer, the games."""
        return {"sampler": self.sampler.state_dict(), "buffer": (self.buffer.items, self.buffer.rng.getstate()),
                "selfplay": self.source.state_dict() if self.source is not None else None, "rng": rng_state()}

    def load_rank_state(self, s):
        self.sampler.load_state_dict(s.get("sampler") or {"rng": s["sampler_rng"]})  # sampler_rng: before generate streamed
        self.buffer.items, buffer_rng = s["buffer"]
        self.buffer.rng.setstate(buffer_rng)
        if self.source is not None:
            self.source.load_state_dict(s["selfplay"])
        set_rng_state(s["rng"])

    def state(self):
        """The checkpoint: the shared state and rank 0's own at the top level (a single process's checkpoint),
        and under torchrun every rank's own in "ranks". Every rank must call it (it gathers)."""
        ranks = distributed.gather(self.rank_state())
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": {"lr_scale": self.lr_scale},
                "value_head": self.value_head.state_dict() if self.value_head is not None else None,
                "kl_ctl": self.kl_ctl.state_dict(), "baseline": self.baseline.state_dict(),
                **ranks[0], **({"ranks": ranks} if self.world > 1 else {}),
                "step": self.step, "best_eval": self.best_eval, "best_reward": self.best_reward,
                "run_name": self.run_dir.name, "config": dataclasses.asdict(self.cfg)}

    def load_state(self, s):
        world = len(s.get("ranks", [s]))
        if world != self.world:
            raise StopRun(f"error: the checkpoint was written by {world} process(es) and this run has {self.world}; "
                          f"resume it with the same number (torchrun --nproc_per_node {world}, or plain python for 1)")
        self.model.load_state_dict(s["model"])
        self.optimizer.load_state_dict(s["optimizer"])
        self.lr_scale = s["scheduler"]["lr_scale"]
        if self.value_head is not None:
            self.value_head.load_state_dict(s["value_head"])
        self.kl_ctl.load_state_dict(s["kl_ctl"])
        self.baseline.load_state_dict(s["baseline"])
        self.load_rank_state(s["ranks"][self.rank] if self.world > 1 else s)
        self.step, self.best_eval, self.best_reward = s["step"], s["best_eval"], s["best_reward"]

    def save(self, name):
        state = self.state()
        self.on_main(lambda: self.run_dir.save(name, state))

    def save_regular(self):
        state = self.state()
        self.on_main(lambda: self.run_dir.save_regular(state, self.cfg.keep_last))

    def resume(self):
        """Pick up a checkpoint if asked to (one written under other settings is refused); what the run did after
        its step is cut back."""
        cfg, path = self.cfg, None
        if cfg.resume_from_checkpoint:
            try:
                path, state = cfg.resume_from_checkpoint, load_checkpoint(cfg.resume_from_checkpoint)
            except (ValueError, FileNotFoundError) as e:
                raise StopRun(f"error: --resume_from_checkpoint: {e}") from None
        elif cfg.recovery_mode:
            path = self.run_dir.checkpoint("recovery.pt")
            if not os.path.exists(path):
                raise StopRun(f"--recovery_mode: {path} does not exist; run without it or with --auto_resume")
            try:
                state = load_checkpoint(path)
            except ValueError as e:
                raise StopRun(f"error: --recovery_mode: {e}; continue from the last good checkpoint with "
                              "--auto_resume") from None
        elif cfg.auto_resume:  # rank 0 picks the checkpoint, the others load the same file
            found = self.run_dir.latest_valid_checkpoint() if self.main else None
            path = distributed.from_main(found[0] if found else None)
            if path is not None:
                state = found[1] if self.main else load_checkpoint(path)
        if path is None:
            return
        resume_config(cfg, FIELDS, state["config"], f"{path} was written by a run with other settings")
        self.load_state(state)
        self.on_main(lambda: self.run_dir.cut_back(self.step))
        self.log(f"Resumed from {path} at step {self.step}")

    def recover(self, reason):
        """Roll back to the recovery checkpoint with the LR halved; keep the bad state for debugging."""
        self.recoveries += 1
        debug = f"debug_step_{self.step:06d}.pt"
        self.save(debug)
        if self.recoveries > MAX_RECOVERIES:
            raise StopRun(f"{reason} at step {self.step} again after {MAX_RECOVERIES} recoveries; stopping. "
                          f"The bad state is in {self.run_dir.checkpoint(debug)}; try a lower --lr")
        lr_scale = self.lr_scale * 0.5
        try:
            state = load_checkpoint(self.run_dir.checkpoint("recovery.pt"))
        except ValueError as e:
            raise StopRun(f"error: {reason} at step {self.step}, and the rollback failed: {e}; continue from the last "
                          "good checkpoint with --auto_resume") from None
        self.load_state(state)
        self.lr_scale = lr_scale
        self.on_main(lambda: self.run_dir.cut_back(self.step))
        self.log(f"{reason}: rolled back to step {self.step}, lr scale now {self.lr_scale} "
                 f"(recovery {self.recoveries}/{MAX_RECOVERIES})")

    # ------------------------------------------------------------------------- --auto_batch_size

    def probe_peak_memory(self, local_batch):
        """Peak CUDA bytes of one full step of this rank at this many prompts, without changing any state and
        without a collective (None: out of memory)."""
        saved, baseline = copy.deepcopy(self.rank_state()), self.baseline.state_dict()
        self.local_batch = local_batch
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        try:
            r = self.rollout()
            self.prepare(r)
            r.rewards = torch.rand(len(r.samples))  # any rewards with variance: the update's memory is the same
            adv, returns, _ = self.advantages(r)
            self.update(r, adv, returns, apply=False)
            peak = torch.cuda.max_memory_allocated()
        except torch.cuda.OutOfMemoryError:
            peak = None
        self.optimizer.zero_grad(set_to_none=True)
        self.load_rank_state(saved)
        self.baseline.load_state_dict(baseline)
        return peak

    def choose_batch_size(self):
        if not self.cuda:
            self.log("--auto_batch_size measures CUDA memory; on CPU the batch size stays "
                     f"{self.cfg.batch_size}")
            return
        capacity = torch.cuda.get_device_properties(self.device).total_memory

        def probe(local_batch):  # each rank measures its share; all go on with the worst, so they stay in step
            peak = distributed.all_max(float(self.probe_peak_memory(local_batch) or math.inf))
            return None if peak == math.inf else peak

        start, W = self.local_batch, self.world
        best, measured = find_batch_size(probe, start, capacity, self.cfg.memory_fraction)
        for b, peak in measured:
            self.log(f"auto_batch_size: {b * W} prompts x {self.cfg.k_samples} -> "
                     + ("out of memory" if peak is None else f"peak {peak / 2**30:.1f} GiB of {capacity / 2**30:.1f}")
                     + (f" (the most of {W} ranks)" if W > 1 else ""))
        if best is None:
            raise StopRun(f"--auto_batch_size: even {start * W} prompts x {self.cfg.k_samples} exceed "
                          f"{self.cfg.memory_fraction:.0%} of the GPU; lower --batch_size or --k_samples")
        self.local_batch, self.cfg.batch_size = best, best * W
        self.log(f"auto_batch_size: using --batch_size {best * W}")


# ----------------------------------------------------------------------------- helpers

grpo_loss = grpo.grpo_loss  # a module-level name, so tests can inject a failing loss


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


def reward_metrics(rewards, tasks, scores):
    """Reward mean/std overall and per task, each component's mean and format validity per task, of rewards
    (N,), their tasks and the scorer's (reward, components)."""
    m = {"reward_mean": rewards.mean().item(), "reward_std": rewards.std().item() if len(rewards) > 1 else 0.0}
    for task in ("P", "A"):
        idx = [i for i, t in enumerate(tasks) if t == task]
        if not idx:
            continue
        x = rewards[idx]
        m[f"reward_mean_{task}"], m[f"reward_std_{task}"] = x.mean().item(), x.std().item() if len(idx) > 1 else 0.0
        for name in scores[idx[0]][1]:
            m[f"{name}_{task}"] = sum(scores[i][1][name] for i in idx) / len(idx)
    return m


def merge_sampling(parts):
    """The dynamic-sampling metrics of the global step from each rank's (empty without it)."""
    if len(parts) == 1 or not parts[0]:
        return parts[0]
    drawn = sum(p["ds_groups_drawn"] for p in parts)
    per_group = lambda key: sum(p[key] * p["ds_groups_drawn"] for p in parts) / drawn  # a mean over drawn groups
    return {"ds_rounds": max(p["ds_rounds"] for p in parts), "ds_groups_drawn": drawn,
            "ds_groups_kept": sum(p["ds_groups_kept"] for p in parts),
            "ds_zero_var_share_drawn": per_group("ds_zero_var_share_drawn"),
            "ds_reward_mean_drawn": per_group("ds_reward_mean_drawn")}


def saved_settings(cfg):
    """(the settings a resume continues with, where they come from), or (None, None) for a new run: the
    checkpoint's for --resume_from_checkpoint, the run's config.json for --auto_resume and --recovery_mode."""
    if cfg.resume_from_checkpoint:
        try:
            saved = checkpoint_settings(cfg.resume_from_checkpoint)
        except ValueError as e:
            raise RunError(f"--resume_from_checkpoint: {e}") from None
        return saved, "--resume_from_checkpoint continues the run with the checkpoint's settings"
    if cfg.auto_resume or cfg.recovery_mode:
        mode = "--auto_resume" if cfg.auto_resume else "--recovery_mode"
        return RunDir(cfg.log_dir, cfg.run_name).saved_config(), f"{mode} continues the run with its own config.json"
    return None, None


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    cfg, changed = parse_args(argv), {}

    def say(line):  # under torchrun every rank stops with the same message: rank 0 prints it
        if distributed.is_main():
            print(line, file=sys.stderr)
    # until the loop takes SIGTERM over, it stops the start-up as Ctrl-C does: no run directory is left half-made
    sigterm = signal.signal(signal.SIGTERM, lambda signum, frame: signal.default_int_handler(signum, frame))
    try:
        saved, source = saved_settings(cfg)
        if saved is not None:
            cfg, changed = resume_config(cfg, given_flags(argv), saved, source)
        Trainer(cfg).run(changed)
    except (LoadError, RunError, EngineFailure) as e:
        say(f"error: {e}")
        return 1
    except StopRun as e:
        say(str(e))
        return 1
    except KeyboardInterrupt:
        if not (cfg.run_name and os.path.exists(RunDir(cfg.log_dir, cfg.run_name).file("config.json"))):
            say("\nquit while the run was starting; nothing of it was saved: start it again")
        else:
            say("\nquit at once; the checkpoints on disk are intact: resume with --auto_resume")
        return 130
    except Exception as e:  # a write outside disk_guard
        if not is_disk_full(e):
            raise
        say(f"error: {disk_full(getattr(e, 'filename', None) or cfg.log_dir, 0)}")
        return 1
    finally:
        signal.signal(signal.SIGTERM, sigterm)
        distributed.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
