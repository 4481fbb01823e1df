"""
GRPO fine-tuning of RookWorld-LM on mixed P: (policy) and A: (environment) tasks.

    python mini/train.py --steps 100 --k_samples 8
    python mini/train.py --model_path logs/sft/final --run_name demo --steps 200
    python mini/train.py --run_name demo --auto_resume          # continue after a crash, kill or Ctrl-C

Trainer.train_step is the step, top to bottom: draw -> generate -> score -> reference log-probs -> advantages ->
update -> log. Trainer.run is the loop around it; checkpoints, resume and rollback are mini/runs.py's.
"""
import contextlib
import dataclasses
import math
import os
import signal
import sys
import time

if not __package__:  # run as `python mini/x.py`, not installed: import `mini` from this checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm.auto import tqdm

from mini import distributed, grpo, logprobs
from mini.autobatch import choose_batch_size
from mini.flags import echo, error_sentence, parse_args, run_command
from mini.dataset import ReplayBuffer, make_source, pad_widths
from mini.evaluate import evaluate, held_out_samples
from mini.games import quick_metrics
from mini.loader import LoadError, load_model
from mini.report import make_reporter
from mini.reward_scorer import ScoringPool, engine_reward
from mini.rollout import GlobalBatch, InformativeGroups, MicroBatch, Rollout
from mini.runs import (Resumable, RunDir, RunError, StopRun, StopSignals, caught_signals, disk_full, given_flags,
                       is_disk_full, resume_config, saved_settings, stop_signals)
from mini.runtime import (PhaseTimer, autocast, autocast_dtype, lr_factor, out_of_memory, peak_memory_mb,
                          resolve_device, score_workers, seed_everything)
from mini.sampler import WIDTH_BUCKET, PromptTooLong, compiled, generate
from mini.selfplay import SelfPlaySource
from mini.stockfish import EngineFailure


class PolicyHead(torch.nn.Module):
    """The trained modules as one forward, so that DistributedDataParallel syncs the value head's gradients
    with the model's: the completion positions' output layer input (logprobs.Head, n x Tc positions) and value
    estimates (n, Tc) or None."""

    def __init__(self, model, value_head, hidden, autocast, fused=False):
        super().__init__()
        self.model, self.value_head, self.hidden, self.autocast, self.fused = model, value_head, hidden, autocast, fused

    def forward(self, ids, mask, Tp, groups=None):
        with self.autocast():
            # (n, Tc, C): position t predicts token t + 1; the group's shared prompt is computed once
            h = self.hidden(ids[:, :-1], mask[:, :-1], Tp - 1, groups)
            # the output layer's input (logprobs.Head): the loss takes log-probs from it, fused or through the logits
            return logprobs.Head.of(h, self.model.lm_head.weight, self.fused), \
                self.value_head(h) if self.value_head is not None else None


@contextlib.contextmanager
def stop_on(*errors):
    """A start-up error the user can fix (a data file, a missing extra or Stockfish) ends the run in its one sentence."""
    try:
        yield
    except errors as e:
        raise StopRun(f"error: {e}") from None


class Trainer(Resumable):
    """GRPO on one process, or on every torchrun rank (each samples, scores and differentiates batch_size /
    world_size prompts; advantages, loss normalisers and metrics are the global batch's; rank 0 writes)."""

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
        self.local_batch = cfg.batch_size // self.world  # flags.problems checked that it divides
        self.run_dir = RunDir(cfg.log_dir, distributed.from_main(cfg.run_name or time.strftime("run-%Y%m%d-%H%M%S")))
        self.log = self.run_dir.log if self.main else (lambda line: None)
        # another run's checkpoint starts this directory afresh: a run already here is refused, never cut back to
        # the checkpoint's step and continued with another run's steps
        own_checkpoint = bool(cfg.resume_from_checkpoint) and self.run_dir.contains(cfg.resume_from_checkpoint)

        def claim():
            if cfg.resume_from_checkpoint and not own_checkpoint and self.run_dir.holds_run():
                raise RunError(f"{self.run_dir.path} already holds a run, and --resume_from_checkpoint names another "
                               "run's checkpoint: pick another --run_name (the checkpoint's run continues there)")
            self.run_dir.claim(resume=cfg.auto_resume or cfg.recovery_mode or own_checkpoint, overwrite=cfg.overwrite)
        try:
            self.on_main(claim)
            self.setup()
        except BaseException:
            if self.main:
                self.run_dir.release(failed=True)  # a failed start leaves no empty run directory behind
            raise

    def setup(self):
        cfg = self.cfg
        with stop_on(ValueError):  # the sentence says which extra to install
            self.reporter = make_reporter(cfg.report_to if self.main else "none", self.run_dir.path,
                                          dataclasses.asdict(cfg))
        self.model, self.tok = load_model(cfg.model_path, self.device)
        self.ref, _ = load_model(cfg.model_path, self.device)  # frozen start model: the KL anchor
        self.ref.requires_grad_(False)
        dtype = autocast_dtype(self.device, cfg)
        if dtype:  # cast once, not at every forward: autocast caches no frozen weight
            self.ref.cast_matmuls(dtype)
        self.model.grad_checkpointing = cfg.grad_checkpointing
        self.value_head = grpo.ValueHead(self.model.config.n_embd).to(self.device) if cfg.use_gae else None
        # the training and reference forwards may be compiled; generation has its own static-shape step (--compile_decode)
        maybe_compiled = lambda forward: compiled(forward) if cfg.compile and self.cuda else forward
        self.policy = PolicyHead(self.model, self.value_head, maybe_compiled(self.model.completion_hidden), self.autocast,
                                 cfg.fused_logprobs)
        self.ref_head = PolicyHead(self.ref, None, maybe_compiled(self.ref.completion_hidden), self.autocast,
                                   cfg.fused_logprobs)
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
        with stop_on(ValueError, OSError):  # a missing or malformed data file, no Stockfish for --data_source generate
            self.source = make_source(cfg, self.buffer, self.rank)
            # each term draws its own task (supervised_rows); the ratio says only whether A: rows are wanted
            sft_cfg = dataclasses.replace(cfg, data_source="file", data_file=cfg.sft_data_file, sft_data_file="",
                                          mix_env_ratio=float(cfg.env_sft_coef > 0))
            self.sft_source = make_source(sft_cfg, rank=self.rank) if cfg.sft_data_file else None  # the terms' own
        self.eval_samples = held_out_samples(cfg.eval_n) if cfg.eval_every > 0 and self.main else []
        self.selfplay = None  # --data_source selfplay: positions from the policy's own games
        with stop_on(FileNotFoundError):  # no Stockfish for selfplay or --p_reward engine: says how to install it
            if cfg.data_source == "selfplay":  # before the scorer's workers, which a failure here would leave behind
                self.selfplay = SelfPlaySource(
                    self.tok, self.source, games=cfg.selfplay_games, plies=cfg.selfplay_plies,
                    temperature=cfg.selfplay_temperature, top_k=cfg.selfplay_top_k, max_new_tokens=cfg.max_new_tokens,
                    mix=cfg.selfplay_mix, env_ratio=cfg.mix_env_ratio, depth=cfg.stockfish_depth,
                    workers=cfg.annotate_workers, stockfish_path=cfg.stockfish_path, seed=cfg.seed + self.rank,
                    pads=pad_widths(cfg.policy_pad))
            self.scorer = ScoringPool(score_workers(cfg, self.device, self.world), cfg.reward_shaping, engine_reward(cfg))
        self.step, self.best_eval, self.best_reward, self.recoveries = 0, -math.inf, -math.inf, 0
        self.started = time.time(), 0  # (time, step) when this process began training: the ETA's pace

    def autocast(self):
        return autocast(self.device, self.cfg)

    # ------------------------------------------------------------------------- one GRPO step

    def train_step(self):
        """One GRPO step, top to bottom; returns its metrics row (None when a bad step was rolled back)."""
        cfg, timer = self.cfg, PhaseTimer(self.cuda)
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()  # peak_mem_mb is this step's
        if self.selfplay is not None and self.step % cfg.selfplay_refresh == 0:
            with timer("selfplay"):
                self.selfplay.refresh(self.model, self.autocast())  # the games go on with the current weights
        # draw -> generate -> score; the scorer's workers run while the reference log-probs are computed
        if cfg.dynamic_sampling:
            r, sampling = self.informative_rollout(timer)  # DAPO: groups whose rewards differ, scored already
            scoring = lambda: r.scores
        else:
            with timer("generate"):
                r, sampling = self.rollout(), {}
            scoring = self.scorer.submit(r.samples, r.texts)
        with timer("ref_logprobs"):
            self.prepare(r)  # reference log-probs (k3), old log-probs and values (several epochs, GAE)
        with timer("score"):  # only the wait for scores that prepare() did not hide
            r.scores = scoring()
        batch = GlobalBatch.gather(r, sampling, self.rank)  # under torchrun, every rank's rewards
        with timer("update"):
            adv, returns, adv_stats = self.advantages(r, batch.rewards, batch.tasks, batch.offset, distributed.all_sum)
            stats = self.update(r, adv, returns)
        if stats is None:
            self.recover("non-finite loss or gradient")
            return None
        if cfg.adaptive_kl and "kl" in stats:
            self.kl_ctl.update(stats["kl"])
        self.step += 1
        m = {"step": self.step, **stats, **adv_stats, **batch.metrics(cfg.max_new_tokens),
             **(self.selfplay.metrics if self.selfplay else {}),
             **self.scorer.take_metrics(), **timer.seconds(),  # the scorer's and the timings are this rank's
             "peak_mem_mb": peak_memory_mb(self.device)}
        self.finish_step(m, r, batch.tasks)  # evaluation, logs, checkpoints
        return m

    def rollout(self):
        """Sample K completions for each of batch_size prompts."""
        cfg, K = self.cfg, self.cfg.k_samples
        drawn = (self.selfplay or self.source).draw(self.local_batch)
        samples, prompts = ([x for x in xs for _ in range(K)]  # groups contiguous, each prompt encoded once
                            for xs in (drawn, [self.tok.encode(s.prompt) for s in drawn]))
        self.model.eval()
        with self.autocast():
            out = generate(self.model, prompts, cfg.max_new_tokens, cfg.temperature, cfg.top_k,
                           self.tok.eos_token_id, compile_decode=cfg.compile_decode, shared_prefix=cfg.shared_prefix_decode)
        completions = [ids for ids, _ in out]
        for s in drawn:
            self.buffer.add_next(s)  # the position one move on: new positions for A: prompts
        return Rollout(samples, prompts, completions, [self.tok.decode(c) for c in completions])

    def informative_rollout(self, timer):
        """DAPO's dynamic sampling: scored rollouts of batch_size prompts until batch_size groups whose rewards
        differ are kept or max_rounds were drawn; returns them as one rollout, and the sampling metrics."""
        groups = InformativeGroups(self.cfg.k_samples, self.cfg.dynamic_sampling_min_std)
        while len(groups.kept) < self.local_batch and groups.rounds < self.cfg.dynamic_sampling_max_rounds:
            with timer("generate"):
                r = self.rollout()
            with timer("score"):
                r.scores = self.scorer.submit(r.samples, r.texts)()
            groups.add(r)
        anyone_kept = distributed.any_rank(bool(groups.kept))  # every rank asks once a step
        return groups.rollout(self.local_batch, others_kept=anyone_kept), groups.metrics(self.local_batch)

    def prepare(self, r):
        """The rollout's tensors and its per-rollout constants: reference log-probs (k3), old log-probs
        (several epochs or GAE), values (GAE) and the supervised rows (--env_sft_coef, --policy_sft_coef). Needs no
        reward, so it runs while the scorer works."""
        cfg = self.cfg
        r.pad(self.tok.eos_token_id, cfg.max_new_tokens, self.device, WIDTH_BUCKET if cfg.compile else 1)
        ref_logp, old_logp, old_values = [], [], []
        r.batches = batches = r.micro_batches(cfg.micro_batch_size, cfg.k_samples, self.device)
        with torch.no_grad():
            for mb in batches:
                inputs, comp_ids = (*mb.inputs(r), mb.groups), mb.take(r.comp_ids)
                if cfg.kl_type == "k3":
                    logits = self.ref_head(*inputs)[0]
                    ref_logp.append(logprobs.head_logprobs(logits, comp_ids, cfg.temperature, False)[0])
                if cfg.num_iterations > 1 or cfg.use_gae:
                    logits, values = self.policy(*inputs)
                    old_logp.append(logprobs.head_logprobs(logits, comp_ids, cfg.temperature, False)[0])
                    if cfg.use_gae:
                        old_values.append(values)
        r.ref_logp, r.old_logp, r.old_values = (MicroBatch.join(batches, x, r.comp_ids.shape) if x else None
                                                for x in (ref_logp, old_logp, old_values))
        r.env_sft = self.supervised_rows("A", cfg.env_sft_batch) if cfg.env_sft_coef > 0 else None
        r.policy_sft = self.supervised_rows("P", cfg.policy_sft_batch) if cfg.policy_sft_coef > 0 else None

    def supervised_rows(self, task, batch):
        """--env_sft_coef (task "A") or --policy_sft_coef ("P"): this rank's share of `batch` prompts of the task
        from --sft_data_file's source, or else the prompt source, each with its true completion (A: python-chess's
        next state; P: Stockfish's analysis) and EOS after it, as a padded rollout of groups of 1."""
        cfg = self.cfg
        n, drawn = batch // self.world, []  # flags.problems checked that it divides
        while len(drawn) < n:  # a stream source draws a P: position first when it has none to move from
            drawn += [s for s in (self.sft_source or self.source).draw(n - len(drawn), env_ratio=float(task == "A"))
                      if s.task == task]
        gold = Rollout(drawn, [self.tok.encode(s.prompt) for s in drawn],
                       [self.tok.encode(s.completion) for s in drawn], [s.completion for s in drawn])
        gold.pad(self.tok.eos_token_id, max(map(len, gold.completions)) + 1, self.device,  # every row ends in EOS
                 WIDTH_BUCKET if cfg.compile else 1)
        return gold

    def advantages(self, r, rewards=None, tasks=None, offset=0, reduce=lambda x: x):
        """The rollout's per-row advantages (n,) from the group statistics of the global batch's `rewards`
        (N,) and `tasks` (this rank's rows from `offset`; default: the rollout's own), or per-token (n, Tc)
        GAE advantages and returns with --use_gae; and the statistics (`reduce`: distributed.all_sum in a step,
        the identity in autobatch's probe, which makes no collective)."""
        cfg = self.cfg
        rewards, tasks = (r.rewards, r.tasks) if rewards is None else (rewards, tasks)
        baseline = self.baseline(rewards, tasks, cfg.k_samples)
        adv, stats = grpo.group_advantages(rewards, cfg.k_samples, cfg.scale_rewards, baseline)
        if cfg.use_gae:
            adv, returns = grpo.gae(r.rewards.to(self.device), r.old_values, r.comp_mask, cfg.gamma, cfg.gae_lambda)
            # the loss gets GAE's per-token advantages: their mean |A| over the completion tokens (every rank's when
            # `reduce` sums over the ranks), not the group ones above, which only say which groups are flat
            total, tokens = reduce(torch.stack([adv.abs().sum().double(), r.comp_mask.sum().double()])).tolist()
            stats["adv_abs_mean"] = total / max(tokens, 1.0)
            return adv, returns, stats
        if r.weightless:  # its rows are in no rank's rewards
            return torch.zeros(len(r.prompts), device=self.device), None, stats
        return adv[offset:offset + len(r.prompts)].to(self.device), None, stats

    def update(self, r, adv, returns, apply=True):
        """num_iterations optimizer updates over the rollout (apply=False: forward and backward only, on this
        rank alone: a memory probe); the metrics, or None when the loss or gradient is not finite. Under
        torchrun the normalisers and metrics are the global batch's and each rank's loss is its share of the
        global loss, so N ranks x B/N prompts give the update of 1 process x B prompts."""
        cfg = self.cfg
        norm = grpo.normalisers(r.comp_mask, budget=cfg.max_new_tokens)  # over the whole rollout
        ddp = self.ddp if apply else None
        # the supervised terms: each the mean NLL over its true tokens (EOS included) ...
        supervised = [(name, coef, gold) for name, coef, gold in (("env_sft", cfg.env_sft_coef, r.env_sft),
                                                                  ("policy_sft", cfg.policy_sft_coef, r.policy_sft))
                      if gold is not None]
        n_gold = [sum(gold.comp_lens) for _, _, gold in supervised]
        if ddp is not None:  # ... of every rank, like the normalisers, in one collective
            n_seqs, n_tokens, *all_gold = distributed.all_sum(
                torch.tensor([norm["n_seqs"], int(r.comp_mask.sum()), *n_gold])).tolist()
            norm.update(n_seqs=int(n_seqs), n_tokens=max(int(n_tokens), 1))
            n_gold = [int(n) for n in all_gold]
        rank_share = self.world if ddp is not None else 1  # DDP averages the ranks' gradients: undo its mean
        kl_coef = grpo.kl_coef_at(self.step, self.kl_ctl.coef if cfg.adaptive_kl else cfg.kl_coef, cfg.kl_warmup_steps)
        settings = grpo.LossSettings(cfg.temperature, cfg.clip_eps_low, cfg.clip_eps_high, cfg.loss_type,
                                     cfg.kl_type, kl_coef, cfg.entropy_coef, cfg.value_coef, cfg.value_clip)
        lr = cfg.lr * lr_factor(self.step, cfg) * self.lr_scale
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        self.model.train()
        totals = {}
        # the supervised rows go first: the last backward, which DDP syncs, is a GRPO one
        passes = [(mb, term) for term, (_, _, gold) in enumerate(supervised)
                  for mb in gold.micro_batches(cfg.micro_batch_size, 1, self.device)] + [(mb, None) for mb in r.batches]
        for it in range(cfg.num_iterations):
            self.optimizer.zero_grad(set_to_none=True)
            for j, (mb, term) in enumerate(passes):
                # DDP averages the gradients at the backward of the last micro-batch only
                with ddp.no_sync() if ddp is not None and j < len(passes) - 1 else contextlib.nullcontext():
                    if term is not None:  # teacher-forced at temperature 1: the model's own distribution, not the sampler's
                        name, coef, gold = supervised[term]
                        head = (ddp or self.policy)(*mb.inputs(gold), mb.groups)[0]
                        logp = logprobs.head_logprobs(head, mb.take(gold.comp_ids), 1.0, False)[0]
                        nll = grpo.supervised_nll(logp, mb.take(gold.comp_mask), n_gold[term])
                        (coef * nll * rank_share).backward()
                        totals[name + "_nll"] = totals.get(name + "_nll", 0.0) + nll.detach() / cfg.num_iterations
                        continue
                    inputs = (*mb.inputs(r), mb.groups)
                    logits, values = (ddp or self.policy)(*inputs)
                    ref_logits = None
                    if cfg.kl_type != "k3":
                        with torch.no_grad():
                            ref_logits = self.ref_head(*inputs)[0]
                    critic = dict(values=values, old_values=mb.take(r.old_values), returns=mb.take(returns)) \
                        if cfg.use_gae else {}
                    loss, metrics = grpo_loss(
                        logits, mb.take(r.comp_ids), mb.take(r.comp_mask), mb.take(adv), settings, norm,
                        old_logp=mb.take(r.old_logp) if it > 0 else None,  # epoch 0 is on-policy: ratio 1
                        ref_logits=ref_logits, ref_logp=mb.take(r.ref_logp) if r.ref_logp is not None else None,
                        **critic, with_entropy=self.step % cfg.entropy_every == 0)
                    (loss * rank_share).backward()
                for k, v in metrics.items():  # each micro-batch's share: they sum to the batch value
                    totals[k] = totals.get(k, 0.0) + v / cfg.num_iterations
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.grad_clip if cfg.grad_clip > 0 else float("inf"))
            # one host sync per epoch; under torchrun the ranks' shares summed, the norm already every rank's
            seen = grpo.read_metrics(totals, distributed.all_sum if ddp is not None else None, grad_norm=grad_norm)
            if not (math.isfinite(seen["loss"]) and math.isfinite(seen["grad_norm"])):  # the same verdict on every rank
                return None  # not this epoch's update (an earlier epoch's, --num_iterations > 1, did); the caller rolls back
            if apply:
                self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {**seen, "kl_coef": kl_coef, "lr": lr}

    # ------------------------------------------------------------------------- around the step

    def finish_step(self, m, r, tasks):
        """Evaluation, logs and checkpoints after a step (`tasks`: the global batch's); stops the run when the
        KL runs away. Rank 0 evaluates and writes; every rank takes part in the checkpoints."""
        cfg = self.cfg
        self.best_reward = max(self.best_reward, m["reward_mean"])
        improved = False
        if cfg.eval_every > 0 and self.step % cfg.eval_every == 0:
            m.update(distributed.from_main(self.held_out_metrics() if self.main else None))
            improved = m["eval_reward"] > self.best_eval
            self.best_eval = max(self.best_eval, m["eval_reward"])
        if self.main:
            self.write_step(m, r, tasks)
        if improved:  # after the step's row: a checkpoint past a row never written would resume past the step
            self.save("stable.pt")
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
        self.run_dir.append_jsonl("metrics.jsonl", [m])
        samples = r.logged(self.step, self.cfg.log_samples, self.cfg.k_samples)
        self.run_dir.append_jsonl("samples.jsonl", samples)
        self.reporter.log(self.step, m)  # a view of the row just written: metrics.jsonl stays the record
        self.reporter.log_samples(self.step, samples)
        self.log(log_line(m, tasks, self.cfg.k_samples, self.best_reward, eta(*self.started, self.step, self.cfg.steps)))

    def run(self, changed=None):
        """Resume if asked to (`changed`: the flags a resumed run changed, logged), train until --steps, the time
        limit or a signal, save the final model."""
        cfg, finished = self.cfg, False
        try:
            self.resume()
            for name, (old, new) in (changed or {}).items():
                self.log(f"resume: --{name} {old!r} -> {new!r}")
            if cfg.auto_batch_size and self.step == 0:  # a resumed run keeps the batch size it chose
                choose_batch_size(self)
            self.on_main(lambda: self.run_dir.save_config(cfg))
            # the known-good start, also after a resume: a recovery.pt left by the earlier process may be damaged
            # (skipped by the resume) or older than the resumed step, and a rollback must go back exactly here
            self.save("recovery.pt")
            self.log(f"Run {self.run_dir.name}: {self.model.num_params() / 1e6:.1f}M params on {self.device}, "
                     f"{cfg.steps} steps of {cfg.batch_size} prompts x {cfg.k_samples}"
                     + (f", DistributedDataParallel over {self.world} rank(s)" if self.ddp else ""))
            deadline = time.time() + 60 * cfg.time_limit_min if cfg.time_limit_min > 0 else math.inf
            self.started = time.time(), self.step
            with StopSignals(self.announce_stop) as stop, tqdm(
                    total=cfg.steps, initial=self.step, unit="step", dynamic_ncols=True,
                    disable=not sys.stderr.isatty()) as bar:  # a progress bar where the output is a terminal
                while self.step < cfg.steps:
                    if distributed.any_rank(time.time() > deadline):  # every rank stops at the same step
                        self.log(f"Time limit of {cfg.time_limit_min} min reached at step {self.step}")
                        break
                    m = self.train_step()
                    if m is not None:
                        bar.update(1)
                        bar.set_postfix(reward=f"{m['reward_mean']:.3f}", kl=f"{m.get('kl', 0.0):.3g}")
                    if distributed.any_rank(stop.name) and self.step < cfg.steps:  # else save as usual
                        self.stop_for_signal(stop.name)
                # still under StopSignals: a first signal now lets the last checkpoint and the snapshot be written
                self.finishing = True
                self.save_regular()
                self.on_main(lambda: self.log(f"Done: final model in {self.run_dir.save_final(self.model, self.tok)}"))
            finished = True
        finally:
            for part in (self.scorer, self.reporter, self.source, self.sft_source, self.selfplay):
                if part is not None:
                    part.close()
            if self.main:  # a refused resume leaves no empty run directory behind, a fresh run failed at once none
                # (but a rollback's debug state, which the message points to, stays)
                self.run_dir.release(failed=not finished, trained=self.step > 0 or self.recoveries > 0)
            # DDP's reducer holds gloo threads: free it now, before distributed.cleanup destroys the process
            # group, rather than whenever the garbage collector reaches this trainer
            self.ddp = None


# ----------------------------------------------------------------------------- helpers

grpo_loss = grpo.grpo_loss  # a module-level name, so tests can inject a failing loss


def log_line(m, tasks, K, best_reward, eta):
    """A step's line in train.log: enough digits for a loss of 1e-6, and the time left (`eta` seconds)."""
    n_env = tasks.count("A") // K
    return (f"Step {m['step']} | Loss {m['loss']:.3g} | Reward {m['reward_mean']:.3f} (best {best_reward:.3f}) "
            f"| P/E {len(tasks) // K - n_env}/{n_env} | KL {m.get('kl', 0.0):.3g} | {m['time_step']:.1f}s"
            + (f" | eval {m['eval_reward']:.3f}" if "eval_reward" in m else "")
            + (f" | ETA {duration(eta)}" if eta is not None else ""))


def eta(t0, step0, step, steps):
    """Seconds left at the pace since (time t0, step step0); None before a step was taken."""
    return None if step == step0 else (time.time() - t0) / (step - step0) * (steps - step)


def duration(seconds):
    m, s = divmod(round(seconds), 60)
    return f"{m // 60}h{m % 60:02d}m" if m >= 60 else f"{m}m{s:02d}s" if m else f"{s}s"


def run_started(cfg):
    """Whether the run got as far as saving its settings: its checkpoints, if any, are there to resume from."""
    return bool(cfg.run_name) and os.path.exists(RunDir(cfg.log_dir, cfg.run_name).file("config.json"))


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    cfg, changed = parse_args(argv), {}

    def say(line):  # under torchrun every rank stops with the same message: rank 0 prints it
        if distributed.is_main():
            echo(line, sys.stderr)
    # until the loop takes the signals over, both stop the start-up as Ctrl-C does, whatever handler the caller had
    # installed: no run directory is left half-made
    def stop_startup(signum, frame):
        caught_signals.append(signum)
        raise KeyboardInterrupt
    startup = {sig: signal.signal(sig, stop_startup) for sig in stop_signals()}
    try:
        saved, source = saved_settings(cfg)
        if saved is not None:
            cfg, changed = resume_config(cfg, given_flags(argv), saved, source)
        Trainer(cfg).run(changed)
    except (LoadError, RunError, EngineFailure, PromptTooLong) as e:  # PromptTooLong: --max_new_tokens too large
        say(f"error: {e}")
        return 1
    except StopRun as e:
        say(str(e))
        return e.exit_code
    except KeyboardInterrupt:
        if not run_started(cfg):
            say("\nquit while the run was starting; nothing of it was saved: start it again")
        else:
            say("\nquit at once; the checkpoints on disk are intact: resume with --auto_resume")
        return 130
    except Exception as e:  # a write outside disk_guard
        if out_of_memory(e):
            say(f"error: out of memory with {cfg.batch_size} prompts x {cfg.k_samples} completions a step; "
                + ("the checkpoints on disk are intact: resume with --auto_resume and a --micro_batch_size below "
                   f"{cfg.micro_batch_size or cfg.batch_size * cfg.k_samples} (fewer rows a forward and backward pass, "
                   "the same update)" if run_started(cfg) else "set a smaller --micro_batch_size")
                + ", or start afresh with a smaller --batch_size or --k_samples (on CUDA, --auto_batch_size finds the "
                "largest that fits)")
            return 1
        if is_disk_full(e):
            say(f"error: {disk_full(getattr(e, 'filename', None) or cfg.log_dir, 0)}")
            return 1
        if isinstance(e, OSError) and e.filename:  # a folder where the run keeps a file, or the reverse
            say(f"error: {error_sentence(e)}")
            return 1
        raise
    finally:
        for sig, handler in startup.items():
            signal.signal(sig, handler)
        distributed.cleanup()
    return 0


if __name__ == "__main__":
    run_command(main)
