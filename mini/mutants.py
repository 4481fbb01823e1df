"""
Deliberate bugs that the fast test suite must catch: each is an exact (file, old text, new text)
replacement, described by the behaviour it breaks. The script copies mini/ into a scratch directory,
checks that the tests pass there unmutated, then applies one mutant at a time and runs its tests
(pytest -x), and prints which test caught it. The working tree is never written to.

    python mini/mutants.py                 # every mutant; exit 1 if one survives or its old text is gone
    python mini/mutants.py --list          # the list
    python mini/mutants.py adv_sign ...    # only these

Each mutant names the tests that guard it (a subset of the fast suite, to keep a run to minutes);
a mutant caught there makes the whole fast suite fail.
"""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = "mini/test_reference_step.py"
SAMPLER_AGREES = "mini/test_reference_step.py::test_sampler_logprobs_equal_the_trainers_old_logprobs"
RESUME = "mini/test_train.py::test_sigkill_then_auto_resume_equals_uninterrupted"
TWO_RANKS_STEP = "mini/test_distributed.py::test_two_ranks_take_the_step_of_one_process"
TWO_RANKS_RESUME = "mini/test_distributed.py::test_two_ranks_killed_and_resumed_end_like_an_uninterrupted_run"
ADVERSARIAL, METRICS, FLAGS = "mini/test_adversarial.py", "mini/test_metrics.py", "mini/test_flags.py"
GAMES, STATS, CACHES = "mini/test_games.py", "mini/test_stats.py", "mini/test_caches.py"


@dataclass
class Mutant:
    name: str
    breaks: str   # the behaviour that is lost
    file: str     # under mini/
    old: str      # exact text, found exactly once
    new: str
    tests: tuple  # pytest node ids or files, relative to the repository root


MUTANTS = [
    # the training step (mini/test_reference_step.py: Trainer's update against a naive reference)
    Mutant("adv_sign", "the advantage's sign is flipped: the policy moves away from what is rewarded",
           "train.py", "return adv[offset:offset + len(r.prompts)].to(self.device), None, stats",
           "return (-adv[offset:offset + len(r.prompts)]).to(self.device), None, stats",
           (REFERENCE, "mini/test_train.py::test_a_rewarded_token_becomes_more_likely")),
    Mutant("loss_temperature_1", "the loss uses temperature 1 while the sampler draws at --temperature",
           "train.py", "grpo.LossSettings(cfg.temperature,", "grpo.LossSettings(1.0,", (REFERENCE,)),
    Mutant("old_logp_temperature_1", "old log-probs (several epochs) are taken at temperature 1",
           "train.py", "old_logp.append(logprobs.head_logprobs(logits, comp_ids, cfg.temperature, False)[0])",
           "old_logp.append(logprobs.head_logprobs(logits, comp_ids, 1.0, False)[0])", (SAMPLER_AGREES, REFERENCE)),
    Mutant("logits_one_late", "completion logits are taken one position late: each token predicts itself",
           "train.py", "h = self.hidden(ids[:, :-1], mask[:, :-1], Tp - 1, groups)", "h = self.hidden(ids[:, 1:], mask[:, 1:], Tp - 1, groups)", (SAMPLER_AGREES, REFERENCE)),
    Mutant("eos_not_an_action", "a completion that stopped does not get its EOS as the last action",
           "rollout.py", "comps = [c + [eos] if len(c) < max_new_tokens else c for c in self.completions]",
           "comps = [list(c) for c in self.completions]", (SAMPLER_AGREES, REFERENCE)),
    Mutant("groups_interleaved", "the K samples of a prompt are interleaved with other prompts' instead of contiguous",
           "train.py", "[x for x in xs for _ in range(K)]", "[x for _ in range(K) for x in xs]",
           (REFERENCE,)),
    Mutant("micro_batch_normaliser", "each micro-batch is normalised by itself instead of by the whole rollout",
           "train.py", "mb.take(adv), settings, norm,",
           "mb.take(adv), settings, grpo.normalisers(mb.take(r.comp_mask), cfg.max_new_tokens),",
           (REFERENCE,)),
    Mutant("ref_logp_first_rows", "every micro-batch gets the reference log-probs of the first micro-batch's rows",
           "train.py", "ref_logp=mb.take(r.ref_logp) if", "ref_logp=r.ref_logp[:len(mb.rows), :mb.Tc] if", (REFERENCE,)),
    Mutant("dr_grpo_padded_width", "Dr. GRPO divides by the batch's padded width instead of the generation budget",
           "train.py", "norm = grpo.normalisers(r.comp_mask, budget=cfg.max_new_tokens)",
           "norm = grpo.normalisers(r.comp_mask)", (REFERENCE,)),
    Mutant("k3_against_policy", "k3's reference log-probs come from the policy itself: the KL is always 0",
           "train.py", "logits = self.ref_head(*inputs)[0]\n                    ref_logp", "logits = self.policy(*inputs)[0]\n                    ref_logp",
           (REFERENCE,)),
    Mutant("exact_kl_against_policy", "the exact KL's reference logits come from the policy itself",
           "train.py", "ref_logits = self.ref_head(*inputs)", "ref_logits = self.policy(*inputs)", (REFERENCE,)),
    Mutant("gae_gamma_lambda_swapped", "GAE gets lambda as the discount and gamma as lambda",
           "train.py", "cfg.gamma, cfg.gae_lambda)", "cfg.gae_lambda, cfg.gamma)", (REFERENCE,)),
    Mutant("clip_high_is_low", "clip-higher is lost: the upper clip bound uses clip_eps_low",
           "train.py", "cfg.clip_eps_low, cfg.clip_eps_high, cfg.loss_type", "cfg.clip_eps_low, cfg.clip_eps_low, cfg.loss_type",
           (REFERENCE,)),
    # the objective (mini/grpo.py)
    Mutant("k3_sign", "k3 takes log pi - log ref where it needs log ref - log pi",
           "grpo.py", "d = ref_logp.detach() - logp", "d = logp - ref_logp.detach()", ("mini/test_grpo.py", REFERENCE)),
    Mutant("clip_unbounded_above", "the PPO ratio is not clipped above",
           "grpo.py", "ratio.clamp(1 - clip_eps_low, 1 + clip_eps_high)", "ratio.clamp(min=1 - clip_eps_low)",
           ("mini/test_grpo.py", REFERENCE)),
    Mutant("exact_kl_untempered", "the exact KL is taken between the untempered distributions",
           "grpo.py", "exact_kl(logits_of(logits), logits_of(ref_logits), s.kl_type, s.temperature)",
           "exact_kl(logits_of(logits), logits_of(ref_logits), s.kl_type)",
           (REFERENCE,)),
    Mutant("entropy_penalised", "the entropy bonus becomes a penalty",
           "grpo.py", "loss = loss - s.entropy_coef * agg(ent_t)", "loss = loss + s.entropy_coef * agg(ent_t)",
           ("mini/test_grpo.py", REFERENCE)),
    # log-probs and entropy (mini/logprobs.py)
    Mutant("logprob_grad_without_onehot", "the hand-written log-prob backward drops the sampled token's onehot",
           "logprobs.py", "out[c] = p.scatter_add_(1, i[c], g[c])", "out[c] = p", ("mini/test_grpo.py",)),
    Mutant("fused_entropy_sign", "the fused head's entropy has its sign flipped",
           "logprobs.py", "ent[c] = lse - (torch.softmax(x, -1) * x).sum(-1)",
           "ent[c] = (torch.softmax(x, -1) * x).sum(-1) - lse", ("mini/test_grpo.py",)),
    Mutant("logprob_pass_entropy_unnormalised", "the entropy metric of the log-prob pass skips dividing by Σ e",
           "logprobs.py", "ent.append(lse[-1] - (e.mul_(c)).sum(-1) / z)", "ent.append(lse[-1] - (e.mul_(c)).sum(-1))",
           ("mini/test_grpo.py", METRICS)),
    Mutant("micro_batch_drops_last_column", "a trimmed micro-batch loses its longest completion's last column (its EOS)",
           "rollout.py", "round_up(max(comp[j] for j in rows), self.bucket),", "round_up(max(comp[j] for j in rows), self.bucket) - 1,",
           (REFERENCE,)),
    Mutant("env_sft_at_sampling_temperature", "the supervised A: term takes its log-probs at --temperature, not 1",
           "train.py", "logp = logprobs.head_logprobs(head, mb.take(gold.comp_ids), 1.0, False)[0]",
           "logp = logprobs.head_logprobs(head, mb.take(gold.comp_ids), cfg.temperature, False)[0]", (REFERENCE,)),
    Mutant("env_sft_without_eos", "the supervised A: rows lose the EOS after the true next state",
           "train.py", "max(map(len, gold.completions)) + 1, self.device,", "max(map(len, gold.completions)), self.device,",
           (REFERENCE,)),
    Mutant("env_sft_local_token_count", "under torchrun the supervised A: term divides by this rank's tokens only",
           "train.py", "n_gold = [int(n) for n in all_gold]", "n_gold = [int(n) for n in n_gold]",
           (TWO_RANKS_STEP,)),
    Mutant("env_sft_mean_per_micro_batch", "the supervised term averages each micro-batch, not the step's true tokens",
           "train.py", "nll = grpo.supervised_nll(logp, mb.take(gold.comp_mask), n_gold[term])",
           "nll = grpo.supervised_nll(logp, mb.take(gold.comp_mask), int(mb.take(gold.comp_mask).sum()))", (REFERENCE,)),
    Mutant("policy_sft_weighed_by_env_coef", "the supervised P: term is weighed by --env_sft_coef",
           "train.py", '("policy_sft", cfg.policy_sft_coef, r.policy_sft)', '("policy_sft", cfg.env_sft_coef, r.policy_sft)',
           (REFERENCE,)),
    Mutant("policy_sft_counts_env_tokens", "the supervised P: term divides by the A: rows' token count",
           "train.py", "n_gold = [sum(gold.comp_lens) for _, _, gold in supervised]",
           "n_gold = [sum(supervised[0][2].comp_lens) for _ in supervised]", (REFERENCE,)),
    Mutant("dropped_rows_lose_their_prompts", "after finished rows are dropped, the rows left read other prompts",
           "sampler.py", "self.slot_of_row = self.slot_of_row[rows]", "self.slot_of_row = self.slot_of_row[:len(rows)]",
           ("mini/test_sampler.py",)),
    Mutant("dummy_rows_share_row_0s_slot", "a compiled bucket's dummy rows write their keys into row 0's columns",
           "sampler.py", "slot.update(zip(range(len(prompt_of), n_rows), empty))",
           "slot.update((i, slot[0]) for i in range(len(prompt_of), n_rows))", ("mini/test_sampler.py",)),
    Mutant("decode_sees_its_next_column", "a shared-prefix decode token also attends to its slot's unwritten next column",
           "sampler.py", "& (span // G < self.col)", "& (span // G <= self.col)", ("mini/test_sampler.py",)),
    Mutant("reference_embedding_in_bf16", "the bf16 reference keeps its output layer tied: its embedding lookup is bf16",
           "model.py", "self.lm_head.weight = nn.Parameter(self.lm_head.weight.detach().to(dtype), requires_grad=False)",
           "self.transformer.wte.to(dtype)", ("mini/test_train.py::test_the_reference_in_bf16_gives_a_kl_of_exactly_0_at_step_1",)),
    Mutant("width_bucket_cuts_prompts", "--compile's width buckets cut the longest prompt of a micro-batch",
           "rollout.py", "start = self.Tp - round_up(max(len(self.prompts[j]) for j in rows), self.bucket)",
           "start = self.Tp - round_up(max(len(self.prompts[j]) for j in rows), self.bucket) + self.bucket - 1",
           (REFERENCE,)),
    # the command line (mini/flags.py)
    Mutant("micro_batch_unchecked", "a micro-batch larger than the rollout batch is accepted",
           "flags.py", 'if v("micro_batch_size") and v("batch_size") and v("k_samples") and v("micro_batch_size") > v(',
           'if False and v("micro_batch_size") and v("batch_size") and v("k_samples") and v("micro_batch_size") > v(',
           ("mini/test_config.py",)),
    # the run: resume, recovery, stopping (mini/test_train.py)
    Mutant("kl_coef_not_restored", "the adaptive KL coefficient restarts from --kl_coef on resume",
           "runs.py", 'self.kl_ctl.load_state_dict(s["kl_ctl"])', "pass", (RESUME,)),
    Mutant("baseline_not_restored", "the EMA/adaptive reward baseline restarts empty on resume",
           "runs.py", 'self.baseline.load_state_dict(s["baseline"])', "pass", (RESUME,)),
    Mutant("value_head_not_restored", "the value head restarts from zero on resume",
           "runs.py", 'self.value_head.load_state_dict(s["value_head"])', "pass", (RESUME,)),
    Mutant("lr_scale_not_restored", "the LR scale halved by a rollback is back to 1 after a resume",
           "runs.py", 'self.lr_scale = s["scheduler"]["lr_scale"]', "self.lr_scale = 1.0", (RESUME,)),
    Mutant("lr_scale_ignored", "the LR scale halved by a rollback is not applied",
           "train.py", "lr = cfg.lr * lr_factor(self.step, cfg) * self.lr_scale", "lr = cfg.lr * lr_factor(self.step, cfg)",
           ("mini/test_train.py::test_injected_nan_is_rolled_back",)),
    Mutant("samples_not_truncated", "samples.jsonl keeps the rows of steps that are redone after a resume",
           "runs.py", 'STEP_LOGS = ("metrics.jsonl", "samples.jsonl")', 'STEP_LOGS = ("metrics.jsonl",)', (RESUME,)),
    Mutant("damaged_checkpoint_fatal", "auto-resume stops at a damaged checkpoint instead of taking the one before",
           "runs.py", 'print(f"skipping {e}", file=sys.stderr)', "raise", (RESUME,)),
    Mutant("kl_stop_late", "the --kl_threshold stop fires a step late",
           "train.py", 'abs(m.get("kl", 0.0)) > cfg.kl_threshold:', 'abs(m.get("kl", 0.0)) > cfg.kl_threshold and self.step > 2:',
           ("mini/test_train.py::test_kl_threshold_stops_cleanly",)),
    Mutant("env_ratio_off", "A: tasks are drawn at 0.8 x --mix_env_ratio",
           "dataset.py", "if self.policy and self.rng.random() >= env_ratio:",
           "if self.policy and self.rng.random() >= 0.8 * env_ratio:",
           ("mini/test_dataset.py::test_pool_source_mix",)),
    # torchrun (mini/test_distributed.py: 2 gloo processes against 1)
    Mutant("local_token_count", "under torchrun each rank divides its loss by its own token count, not the global one",
           "train.py", "norm.update(n_seqs=int(n_seqs), n_tokens=max(int(n_tokens), 1))", "pass", (TWO_RANKS_STEP,)),
    Mutant("ddp_mean_not_undone", "each rank's loss is not scaled by the world size: DDP's mean halves the gradient",
           "train.py", "(loss * rank_share).backward()", "loss.backward()", (TWO_RANKS_STEP,)),
    Mutant("rank_state_shared", "on resume or rollback every rank takes rank 0's RNG and sampler state",
           "runs.py", 'self.load_rank_state(s["ranks"][self.rank] if self.world > 1 else s)', "self.load_rank_state(s)",
           (TWO_RANKS_RESUME,)),
    # rewards (mini/reward_scorer.py)
    Mutant("pool_reorders_chunks", "the scoring pool returns its workers' chunks in reverse order",
           "reward_scorer.py", "collect = lambda: [f.result() for f in futures]", "collect = lambda: [f.result() for f in futures[::-1]]",
           ("mini/test_train.py::test_scoring_in_worker_processes_changes_nothing",)),
    Mutant("repeated_move_counted", "a move named several times in M: counts once per repeat",
           "reward_scorer.py", "hits = [m for m in named if m in true_evals]", "hits = [m for m in moves if m in true_evals]",
           ("mini/test_reward_scorer.py",)),
    Mutant("label_ranked_first", "the B: label ranks first whatever its eval: Black's text lines reward the weakest move",
           "reward_scorer.py", "key=lambda p: (-p[1], p[0] != sample.best)", "key=lambda p: (p[0] != sample.best, -p[1])",
           ("mini/test_reward_scorer.py",)),
    Mutant("candidates_over_5", "the candidates component divides by 5, not by the number of labelled moves",
           "reward_scorer.py", "/ max(len(ranked), 1)", "/ 5", ("mini/test_reward_scorer.py",)),
    # ------------------------------------------------------------------------------------------------------
    # away from the centre (issue 42): parsers, reward components, metrics, flags, games, statistics, caches,
    # the run lock, self-play. Guarded by the tests of mini/test_{adversarial,metrics,flags,games,stats,caches}.py
    Mutant("bare_board_is_a_fen", "an A: answer with a bare board for the next FEN parses (and earns the flags' share)",
           "formats.py", "if len(fen.split()) != 6:", "if len(fen.split()) > 6:", (ADVERSARIAL,)),
    Mutant("text_before_m_accepted", "a P: answer after other text parses",
           "formats.py", "if not 0 <= m < e < b or text[:m].strip():", "if not 0 <= m < e < b:", (ADVERSARIAL,)),
    Mutant("text_after_best_accepted", "words after the B: move are ignored",
           "formats.py", "if len(best) != 1 or not UCI.match(best[0]):", "if not best or not UCI.match(best[0]):",
           (ADVERSARIAL,)),
    Mutant("env_fields_beyond_four_ignored", "an A: answer followed by more '+' fields parses on its first four",
           "formats.py", 'parts = [p.strip() for p in text.strip().split("+")]',
           'parts = [p.strip() for p in text.strip().split("+")][:4]', (ADVERSARIAL,)),
    Mutant("illegal_candidates_unpenalised", "an illegal move among the M: candidates costs nothing",
           "reward_scorer.py", "(len(hits) - ILLEGAL_PENALTY * illegal)", "len(hits)", (ADVERSARIAL,)),
    Mutant("evals_over_named_moves", "the evals component divides by every named move, not by those in the top 5",
           "reward_scorer.py", "sum(1 / (1 + e) for e in errors) / len(errors)",
           "sum(1 / (1 + e) for e in errors) / len(named)", (ADVERSARIAL,)),
    Mutant("policy_move_first_b", "chess_eval reads the move after the first 'B:', not the last",
           "games.py", 'b = text.rfind("B:")', 'b = text.find("B:")', (ADVERSARIAL,)),
    Mutant("task_metrics_over_batch", "per-task reward components are divided by the whole batch",
           "rollout.py", 'm[f"{name}_{task}"] = sum(scores[i][1][name] for i in idx) / len(idx)',
           'm[f"{name}_{task}"] = sum(scores[i][1][name] for i in idx) / len(tasks)', (METRICS,)),
    Mutant("task_std_of_batch", "each task's reward std is the whole batch's",
           "rollout.py", "x.std().item() if len(idx) > 1", "rewards.std().item() if len(idx) > 1", (METRICS,)),
    Mutant("clip_frac_over_padding", "the clip fractions divide by every position, padding included",
           "grpo.py", 'stats = {"clip_frac": (low | high).sum() / norm["n_tokens"],',
           'stats = {"clip_frac": (low | high).sum() / m.numel(),', (METRICS,)),
    Mutant("kl_metric_by_loss_type", "the logged KL is averaged like the loss, not per completion token",
           "grpo.py", 'per_token = lambda x: aggregate(x.detach(), mask, "dapo", norm)',
           "per_token = lambda x: aggregate(x.detach(), mask, s.loss_type, norm)", (METRICS,)),
    Mutant("ranks_sampling_unweighted", "torchrun's dynamic-sampling shares are a plain mean of the ranks'",
           "rollout.py", 'per_group = lambda key: sum(p[key] * p["ds_groups_drawn"] for p in parts) / drawn',
           "per_group = lambda key: sum(p[key] for p in parts) / len(parts)", (METRICS,)),
    Mutant("zero_var_share_over_kept", "dynamic sampling's zero-variance share divides by the kept groups",
           "rollout.py", '"ds_zero_var_share_drawn": self.zero_var / self.drawn,',
           '"ds_zero_var_share_drawn": self.zero_var / max(len(self.kept), 1),',
           (f"{FLAGS}::test_dynamic_sampling_flags",)),
    Mutant("adaptive_kl_not_in_loss", "the loss never sees the adaptive KL coefficient",
           "train.py", "self.kl_ctl.coef if cfg.adaptive_kl else cfg.kl_coef", "cfg.kl_coef",
           (f"{FLAGS}::test_adaptive_kl_coefficient_reaches_the_loss",)),
    Mutant("kl_controller_fed_the_target", "the adaptive controller is fed --target_kl instead of the step's KL",
           "train.py", 'self.kl_ctl.update(stats["kl"])', "self.kl_ctl.update(cfg.target_kl)",
           (f"{FLAGS}::test_target_kl_and_horizon_steer_the_coefficient_after_each_step",)),
    Mutant("kl_horizon_not_passed", "--kl_horizon never reaches the controller (100 steps always)",
           "train.py", "grpo.AdaptiveKLController(cfg.kl_coef, cfg.target_kl, cfg.kl_horizon)",
           "grpo.AdaptiveKLController(cfg.kl_coef, cfg.target_kl, 100)",
           (f"{FLAGS}::test_target_kl_and_horizon_steer_the_coefficient_after_each_step",)),
    Mutant("min_std_not_passed", "--dynamic_sampling_min_std is never passed to the filter",
           "train.py", "InformativeGroups(self.cfg.k_samples, self.cfg.dynamic_sampling_min_std)",
           "InformativeGroups(self.cfg.k_samples, 0.0)", (f"{FLAGS}::test_dynamic_sampling_flags",)),
    Mutant("rollout_top_k_off", "rollouts sample from the whole vocabulary whatever --top_k",
           "train.py", "generate(self.model, prompts, cfg.max_new_tokens, cfg.temperature, cfg.top_k,",
           "generate(self.model, prompts, cfg.max_new_tokens, cfg.temperature, 0,",
           (f"{FLAGS}::test_sampling_flags_reach_generate",)),
    Mutant("adam_betas_default", "--adam_beta1/2 never reach AdamW",
           "train.py", "(cfg.adam_beta1, cfg.adam_beta2)", "(0.9, 0.95)", (f"{FLAGS}::test_optimizer_flags_reach_adamw",)),
    Mutant("selfplay_top_k_is_rollouts", "self-play samples with the rollouts' --top_k, not --selfplay_top_k",
           "train.py", "top_k=cfg.selfplay_top_k", "top_k=cfg.top_k", (f"{FLAGS}::test_selfplay_flags_reach_the_source",)),
    Mutant("selfplay_refreshed_once", "self-play games are refreshed at step 0 only",
           "train.py", "self.step % cfg.selfplay_refresh == 0", "self.step == 0",
           (f"{FLAGS}::test_selfplay_flags_reach_the_source",)),
    Mutant("engine_nodes_dropped", "--engine_nodes never reaches the engine reward",
           "reward_scorer.py", "EngineReward(path, cfg.engine_depth, cfg.engine_nodes, cfg.engine_cache)",
           "EngineReward(path, cfg.engine_depth, 0, cfg.engine_cache)",
           (f"{FLAGS}::test_engine_flags_reach_the_engine_reward",)),
    Mutant("eval_shaping_continuous", "the periodic evaluation scores with continuous rewards whatever --reward_shaping",
           "train.py", "shaping=self.cfg.reward_shaping,", 'shaping="continuous",', (f"{FLAGS}::test_evaluation_flags",)),
    Mutant("log_samples_rows_not_groups", "samples.jsonl takes the first --log_samples rows, not one row per group",
           "rollout.py", "for i in range(0, min(n_groups * K, len(self.samples)), K)]",
           "for i in range(min(n_groups, len(self.samples)))]",
           (f"{FLAGS}::test_log_samples_writes_the_first_row_of_that_many_groups",)),
    Mutant("result_from_whites_view", "a game against Stockfish is scored from White's side whatever the player's colour",
           "chess_eval.py", 'float(outcome.winner == game["white"])', "float(outcome.winner)", (GAMES,)),
    Mutant("half_move_cap_late", "the --max_plies cap adjudicates a half-move late",
           "chess_eval.py", "elif len(board.move_stack) >= max_plies:", "elif len(board.move_stack) > max_plies:", (GAMES,)),
    Mutant("repetition_not_claimed", "self-play games go on through a threefold repetition",
           "games.py", 'outcome = board.outcome(claim_draw=True)\n    if outcome:\n        game["end"] = '
           'outcome.termination.name.lower()\n    elif game["plies"]',
           'outcome = board.outcome()\n    if outcome:\n        game["end"] = outcome.termination.name.lower()\n'
           '    elif game["plies"]', (GAMES,)),
    Mutant("arbiter_history_eleven", "an A: history holds the last 10 half-moves before the move, 11 with it",
           "games.py", "[m.uci() for m in board.move_stack[-9:]] + [move]",
           "[m.uci() for m in board.move_stack[-10:]] + [move]", (GAMES,)),
    Mutant("selfplay_seed_fixed", "every self-play refresh samples with the same seed",
           "selfplay.py", "self.seed * 1_000_003 + self.refreshes", "self.seed * 1_000_003", (GAMES,)),
    Mutant("selfplay_history_short", "self-play P: positions keep the last 8 moves that led there, not 9",
           "selfplay.py", "new += [(b.fen(), [m.uci() for m in b.move_stack[-9:]])",
           "new += [(b.fen(), [m.uci() for m in b.move_stack[-8:]])", (GAMES,)),
    Mutant("interval_90", "--compare's intervals are 90% ones, labelled 95%",
           "evaluate.py", "float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5))",
           "float(np.percentile(boot, 5)), float(np.percentile(boot, 95))", (STATS,)),
    Mutant("label_cache_any_multipv", "labels cached at MultiPV 1 are reused at MultiPV 5",
           "stockfish.py", 'r.get("multipv") == multipv and r.get("engine") == self.engine', 'r.get("engine") == self.engine',
           (CACHES,)),
    Mutant("label_cache_any_engine", "labels of another Stockfish version are reused",
           "stockfish.py", 'r.get("multipv") == multipv and r.get("engine") == self.engine', 'r.get("multipv") == multipv',
           (CACHES,)),
    Mutant("move_cache_any_limit", "evals after a move are reused across depths and node counts",
           "stockfish.py", 'if r.get("limit") == self.tag and r.get("engine") == self.engine and "cp" in r:',
           'if r.get("engine") == self.engine and "cp" in r:', (CACHES,)),
    Mutant("nodes_tagged_as_depth", "a node-limited Annotator caches under its depth's key",
           "stockfish.py", 'f"nodes={nodes}" if nodes else f"depth={depth}"', 'f"depth={depth}"', (CACHES,)),
    Mutant("engine_reward_nodes_ignored", "the engine reward's annotator searches to a depth whatever --engine_nodes",
           "reward_scorer.py", "nodes=self.nodes or None,", "nodes=None,", (CACHES,)),
    Mutant("unsignallable_is_dead", "a live process that may not be signalled is taken for a dead one: its run is taken over",
           "runs.py", "except PermissionError:  # someone else's live process\n        return True",
           "except PermissionError:  # someone else's live process\n        return False", (CACHES,)),
    Mutant("fen_similarity_over_label", "fen_similarity divides by the label's length, not the longer FEN's",
           "reward_scorer.py", "longest = max(len(fen), len(sample.next_fen), 1)", "longest = max(len(sample.next_fen), 1)",
           (ADVERSARIAL,)),
    Mutant("env_flags_swapped", "the terminated flag is judged against the label's truncated one and vice versa",
           "reward_scorer.py", '"terminated_exact": float(terminated == sample.terminated),\n        '
           '"truncated_exact": float(truncated == sample.truncated),',
           '"terminated_exact": float(terminated == sample.truncated),\n        '
           '"truncated_exact": float(truncated == sample.terminated),', (ADVERSARIAL,)),
    Mutant("reward_exact_loose", "an A: reward within 0.01 of the label counts as exact",
           "reward_scorer.py", "abs_tol=1e-9", "abs_tol=1e-2", (ADVERSARIAL,)),
    Mutant("graduated_rounds", "graduated shaping rounds raw to the nearest quarter instead of flooring it",
           "reward_scorer.py", "GRADUATED[int(raw * 4 + 1e-9)]", "GRADUATED[round(raw * 4)]", (ADVERSARIAL,)),
    Mutant("strict_keeps_illegal_best", "strict shaping scores an answer with an illegal best move like any other",
           "reward_scorer.py", 'shaping == "strict" and policy and not comps["best_legal"]',
           'shaping == "strict" and policy and comps["best"] < 0', ("mini/test_reward_scorer.py",)),
    Mutant("scoring_workers_rerun_script", "spawned scoring workers run an unguarded caller script again",
           "reward_scorer.py", "with caller_script_hidden():  # submit spawns", "if True:  # submit spawns",
           ("mini/test_reward_scorer.py",)),
    Mutant("scoring_workers_in_callers_group", "a SIGTERM to the trainer's process group (`timeout`) kills the "
           "scoring workers its last step needs", "reward_scorer.py", ', initializer=os.setpgrp)', ')',
           ("mini/test_reward_scorer.py::test_scoring_pool_equals_score_batch",)),
    Mutant("engine_in_callers_group", "a SIGTERM to the caller's process group kills its Stockfish engines",
           "stockfish.py", ", setpgrp=True)", ")", ("mini/test_engine_reward.py::test_dead_engine_is_restarted",)),
    Mutant("in_check_by_phase", "the in-check breakdown splits on the phase instead of on check",
           "evaluate.py", 'if board.is_check() else "best_legal_not_in_check"',
           'if phase(board) == "endgame" else "best_legal_not_in_check"', ("mini/test_evaluate.py",)),
    Mutant("env_history_nine", "an A: prompt on a position keeps 9 half-moves with its own move, not 10",
           "positions.py", "(list(history) + [move])[-10:]", "(list(history) + [move])[-9:]", (GAMES,)),
    Mutant("replay_history_ten", "the replay buffer keeps 10 moves that led to a position, not 9",
           "dataset.py", "self.items[key] = (fen, list(history)[-9:])", "self.items[key] = (fen, list(history)[-10:])",
           (GAMES,)),
    Mutant("model_player_unseeded", "every player samples with seed 0 whatever it is given",
           "games.py", ".manual_seed(seed)", ".manual_seed(0)", (GAMES,)),
    Mutant("selfplay_untempered", "self-play samples at temperature 1 whatever --selfplay_temperature",
           "selfplay.py", "model, tok, temperature, top_k, seed, max_new_tokens, autocast=autocast))",
           "model, tok, 1.0, top_k, seed, max_new_tokens, autocast=autocast))", (GAMES,)),
    Mutant("sf_draw_is_a_win", "a draw against Stockfish counts as a win",
           "chess_eval.py", '"chess_sf_win": [float(g["score"] == 1) for g in games],',
           '"chess_sf_win": [float(g["score"] >= 0.5) for g in games],', (GAMES,)),
    Mutant("policy_pad_not_passed", "--policy_pad never reaches a data file's source: its P: prompts stay 90 wide",
           "dataset.py", "return PoolSource(samples, cfg.mix_env_ratio, seed=cfg.seed + rank, buffer=buffer, pads=pad_widths(cfg.policy_pad))",
           "return PoolSource(samples, cfg.mix_env_ratio, seed=cfg.seed + rank, buffer=buffer)",
           (f"{FLAGS}::test_policy_pad_reaches_the_source",)),
    Mutant("held_out_next_state_unchecked", "an A: transition onto a held-out position is kept (its next state unkeyed)",
           "dataset.py", 'if sample.task == "A" and not sample.truncated:', 'if sample.task == "A" and sample.truncated:',
           ("mini/test_dataset.py::test_no_training_prompt_shows_a_held_out_position",)),
    Mutant("mate_is_a_draw", "a checkmating move's A: reward is the draw's 0.5",
           "formats.py", "outcome.termination == chess.Termination.CHECKMATE", "outcome.termination == chess.Termination.STALEMATE",
           ("mini/test_formats.py",)),
    Mutant("mate_pool_keeps_held_out", "annotate --mates keeps mate positions that a held-out set holds",
           "annotate.py", "records = build_mates(a.pool, a.seed, exclude=held_out_keys())",
           "records = build_mates(a.pool, a.seed)",
           ("mini/test_annotate.py::test_mate_pool_is_labelled_mates_and_held_out_free",)),
    Mutant("parallel_parse_unordered", "a large data file parsed by worker processes comes back in another order",
           "dataset.py", "pool.map(partial(parse_lines, parse), chunks)", "pool.map(partial(parse_lines, parse), chunks[::-1])",
           ("mini/test_dataset.py::test_a_large_file_parsed_in_parallel_gives_what_one_process_gives",)),
    Mutant("parse_workers_forked", "a large data file's parse workers are forked from the caller, with its threads' locks",
           "dataset.py", 'get_context("forkserver" if', 'get_context("fork" if',
           ("mini/test_dataset.py::test_parse_workers_are_not_forked_from_a_caller_whose_threads_hold_locks",)),
    Mutant("parse_workers_rerun_script", "worker processes run the caller's __main__ script again",
           "runtime.py", '    main.__dict__.pop("__file__", None)\n    try:', "    try:",
           ("mini/test_dataset.py::test_a_script_without_a_main_guard_loads_a_large_file_once",
            "mini/test_reward_scorer.py::test_a_script_without_a_main_guard_scores_in_workers_once")),
    Mutant("warmup_on_the_clock", "a time-limited sft.py run's warmup follows the clock, so a slow start skips it",
           "sft.py", "if limit_s <= 0 or step < cfg.warmup_steps:", "if limit_s <= 0:",
           ("mini/test_sft.py::test_time_limited_schedule_warms_up_on_real_steps",)),
    Mutant("clone_eval_set_missed", "--compare cannot read reports that another checkout made on a shipped eval set",
           "evaluate.py", "path = os.path.join(DATA_DIR, name)", "pass",
           ("mini/test_evaluate.py::test_compare_finds_a_shipped_set_recorded_by_another_checkout",)),
    # the model, its loader, tokenizer and sampler (mini/test_{model,loader,tokenizer,sampler}.py)
    Mutant("mask_no_self", "a padding query sees no key: its row is NaN",
           "model.py", "& key_mask[:, None, :]) | (k_abs == q_abs)[None])[:, None]",
           "& key_mask[:, None, :]))[:, None]",
           ("mini/test_model.py::test_causal_mask_by_hand",)),
    Mutant("scaled_init_lost", "c_proj weights not scaled by 1/sqrt(2 n_layer) at init",
           "model.py", "std=0.02 / math.sqrt(2 * cfg.n_layer))",
           "std=0.02)",
           ("mini/test_model.py::test_init_scales_the_residual_projections_by_depth",)),
    Mutant("num_params_counts_tied_twice", "num_params counts the tied output layer twice",
           "model.py", "return sum(p.numel() for p in self.parameters())",
           "return sum(p.numel() for p in self.state_dict().values())",
           ("mini/test_model.py::test_num_params_counts_the_tied_embedding_once",)),
    Mutant("attn_dropout_in_eval", "attention dropout applied in eval mode",
           "model.py", "dropout_p=self.dropout if self.training else 0.0",
           "dropout_p=self.dropout",
           ("mini/test_model.py::test_dropout_acts_in_train_mode_only",)),
    Mutant("prefixless_keys_rejected", "old checkpoints without the 'transformer.' prefix no longer load",
           "loader.py", 'key = key if key.startswith(("transformer.", "lm_head.")) else "transformer." + key',
           "pass",
           ("mini/test_loader.py::test_an_old_checkpoint_without_prefixes_and_with_attention_buffers_loads",)),
    Mutant("masked_bias_not_skipped", "HF's attn.masked_bias buffer is taken for a weight",
           "loader.py", 'if key.endswith((".attn.bias", ".attn.masked_bias")):',
           'if key.endswith(".attn.bias"):',
           ("mini/test_loader.py::test_an_old_checkpoint_without_prefixes_and_with_attention_buffers_loads",)),
    Mutant("missing_weights_unchecked", "a checkpoint missing weights loads with random ones",
           "loader.py", "    if missing:\n",
           "    if False:\n",
           ("mini/test_loader.py::test_missing_unexpected_and_too_many_tokens_are_load_errors",)),
    Mutant("unexpected_key_keyerror", "an unexpected weight is a KeyError, not a LoadError",
           "loader.py", "        if key not in own:\n",
           "        if False:\n",
           ("mini/test_loader.py::test_missing_unexpected_and_too_many_tokens_are_load_errors",)),
    Mutant("vocab_check_dropped", "a tokenizer larger than the model's vocabulary is accepted",
           "loader.py", "if tokenizer.vocab_size > cfg.vocab_size:",
           "if False:",
           ("mini/test_loader.py::test_missing_unexpected_and_too_many_tokens_are_load_errors",)),
    Mutant("not_eval", "load_model returns a model in train mode",
           "loader.py", "return model.to(device).eval(), tokenizer",
           "return model.to(device), tokenizer",
           ("mini/test_loader.py::test_round_trip_through_load_model",)),
    Mutant("saved_gelu_exact", "saved config.json says exact gelu",
           "loader.py", 'activation_function="gelu_new"',
           'activation_function="gelu"',
           ("mini/test_loader.py::test_round_trip_through_transformers",)),
    Mutant("saved_eos_wrong", "saved config.json eos_token_id 0",
           "loader.py", "eos_token_id=tokenizer.eos_token_id,",
           "eos_token_id=0,",
           ("mini/test_loader.py::test_round_trip_through_transformers",)),
    Mutant("pattern_no_re", "the contraction 're is not split off",
           "tokenizer.py", "'(?:[sdmt]|ll|ve|re)",
           "'(?:[sdmt]|ll|ve)",
           ("mini/test_tokenizer.py::test_known_ids",)),
    Mutant("pattern_no_ll", "the contraction 'll is not split off",
           "tokenizer.py", "'(?:[sdmt]|ll|ve|re)",
           "'(?:[sdmt]|ve|re)",
           ("mini/test_tokenizer.py::test_known_ids",)),
    Mutant("save_without_eos", "vocab.json is written without <|endoftext|>",
           "tokenizer.py", "        vocab[EOS] = self.eos_token_id\n",
           "",
           ("mini/test_tokenizer.py::test_written_files_work_in_tokenizers_library",)),
    Mutant("tokenizer_json_ignored", "a snapshot with only tokenizer.json cannot be read",
           "tokenizer.py", "source = vocab_file if os.path.exists(vocab_file) else tok_file",
           "source = vocab_file",
           ("mini/test_tokenizer.py::test_a_snapshot_with_only_tokenizer_json",)),
    Mutant("u_index_lag", "token t+1 reuses uniform t",
           "sampler.py", "u=None if u is None else u[t + 1])",
           "u=None if u is None else u[t])",
           ("mini/test_sampler.py::test_generate_draws_each_token_independently",)),
    Mutant("u_shared_across_rows", "every row samples with the same uniform numbers",
           "sampler.py", "torch.rand(max_new_tokens, N, device=device, generator=generator)",
           "torch.rand(max_new_tokens, 1, device=device, generator=generator).expand(max_new_tokens, N)",
           ("mini/test_sampler.py::test_generate_draws_each_token_independently",)),
    Mutant("top_k_unclamped", "top_k larger than the vocabulary errors",
           "sampler.py", "torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1)",
           "torch.topk(logits, top_k, dim=-1)",
           ("mini/test_sampler.py::test_sample_next_top_k_beyond_the_vocabulary_is_no_restriction",)),
    Mutant("length_check_ge", "a prompt plus max_new_tokens exactly filling n_positions is refused",
           "sampler.py", "if longest > model.config.n_positions:",
           "if longest >= model.config.n_positions:",
           ("mini/test_sampler.py::test_generate_rejects_too_long_requests",)),
    Mutant("greedy_logp_zero", "greedy decoding returns log-probs of 0",
           "sampler.py", "return nxt, F.log_softmax(logits, dim=-1, dtype=acc).gather(1, nxt[:, None])[:, 0]",
           "return nxt, torch.zeros(nxt.shape, dtype=acc)",
           ("mini/test_sampler.py::test_greedy_generate_logprobs_are_those_of_the_untempered_distribution",)),
    Mutant("default_eos_wrong", "generate's default EOS id is 50255",
           "sampler.py", "top_k=0, eos_id=50256, generator=None,",
           "top_k=0, eos_id=50255, generator=None,",
           ("mini/test_sampler.py::test_generate_stops_at_gpt2s_eos_by_default",)),
    # the data: files, pools and sources, the realistic games, their A: transitions, the labelling (mini/test_{dataset,positions,annotate,games}.py)
    Mutant("bad_lines_limit_off_by_one", "exactly MAX_BAD_LINES malformed lines already stop the load",
           "dataset.py", "if bad > MAX_BAD_LINES:",
           "if bad >= MAX_BAD_LINES:",
           ("mini/test_dataset.py::test_exactly_max_bad_lines_load_and_impossible_positions_never_count_towards_them",)),
    Mutant("impossible_counted_as_malformed", "impossible positions count towards the malformed-line limit",
           "dataset.py", "impossible += isinstance(e, ImpossiblePosition)\n        bad += not isinstance(e, ImpossiblePosition)",
           "impossible += 0\n        bad += 1",
           ("mini/test_dataset.py::test_exactly_max_bad_lines_load_and_impossible_positions_never_count_towards_them",)),
    Mutant("skipped_count_drops_impossible", "load_text's skipped count leaves out impossible positions",
           "dataset.py", "return records, bad + impossible",
           "return records, bad",
           ("mini/test_dataset.py::test_exactly_max_bad_lines_load_and_impossible_positions_never_count_towards_them",)),
    Mutant("jsonl_a_record_unchecked", "an A: record of an impossible position in a JSONL file is kept",
           "dataset.py", '        checked_board(r["fen"])  # as an A: text line is\n',
           "",
           ("mini/test_dataset.py::test_exactly_max_bad_lines_load_and_impossible_positions_never_count_towards_them",)),
    Mutant("record_keys_no_next", "a held-out A: transition's next position is not held out",
           "dataset.py", "        keys.add(board_key(board))\n    return keys",
           "    return keys",
           ("mini/test_dataset.py::test_held_out_keys_are_every_eval_set_position_and_where_its_a_transitions_lead",)),
    Mutant("held_out_without_real_eval", "the realistic-games eval set is not held out",
           "dataset.py", "shipped_keys((EVAL_PATH, REAL_EVAL_PATH, MATE_PATH))",
           "shipped_keys((EVAL_PATH, MATE_PATH))",
           ("mini/test_dataset.py::test_held_out_keys_are_every_eval_set_position_and_where_its_a_transitions_lead",)),
    Mutant("buffer_keeps_invalid", "the replay buffer keeps positions python-chess calls invalid",
           "dataset.py", "key in self.held_out or not board.is_valid() or",
           "key in self.held_out or",
           ("mini/test_dataset.py::test_replay_buffer_refuses_impossible_positions",)),
    Mutant("pool_a_only_draws_p", "a source of A: samples alone falls through to the P: transition branch",
           "dataset.py", "elif self.env and (not self.policy or self.rng.random() < 0.5):",
           "elif self.env and self.rng.random() < 0.5:",
           ("mini/test_dataset.py::test_pool_source_of_a_records_alone_and_half_the_a_share_from_them_with_p_positions",)),
    Mutant("pool_a_records_never_drawn", "a source with P: and A: samples never draws its labelled A: samples",
           "dataset.py", "elif self.env and (not self.policy or self.rng.random() < 0.5):",
           "elif self.env and not self.policy:",
           ("mini/test_dataset.py::test_pool_source_of_a_records_alone_and_half_the_a_share_from_them_with_p_positions",)),
    Mutant("rank_seed_ignored", "every torchrun rank draws the same prompts",
           "dataset.py", "return PoolSource(samples, cfg.mix_env_ratio, seed=cfg.seed + rank, buffer=buffer, pads=pad_widths(cfg.policy_pad))",
           "return PoolSource(samples, cfg.mix_env_ratio, seed=cfg.seed, buffer=buffer, pads=pad_widths(cfg.policy_pad))",
           ("mini/test_dataset.py::test_several_data_files_are_one_source_and_each_rank_draws_with_its_own_seed",)),
    Mutant("data_files_first_only", "of several comma-separated data files only the first is read",
           "dataset.py", 'for path in cfg.data_file.split(","):',
           'for path in cfg.data_file.split(",")[:1]:',
           ("mini/test_dataset.py::test_several_data_files_are_one_source_and_each_rank_draws_with_its_own_seed",)),
    Mutant("stream_pad_dropped", "--data_source generate's P: prompts stay 90 wide whatever --policy_pad",
           "dataset.py", "return pad_policy(policy_sample(fen, *future.result()[fen], history=history), self.pads, self.rng)",
           "return policy_sample(fen, *future.result()[fen], history=history)",
           ("mini/test_dataset.py::test_stream_source_pads_its_p_prompts_at_the_configured_width",)),
    Mutant("opening_15_plies", "openings are 6-15 plies, not 6-16",
           "positions.py", 'rng.randint(6, 16) if phase == "opening"',
           'rng.randint(6, 15) if phase == "opening"',
           ("mini/test_dataset.py::test_generator_reproducible_legal_and_mixed",)),
    Mutant("iter_history_reversed", "the generator's P: history is newest first",
           "positions.py", "yield board.fen(), [m.uci() for m in board.move_stack[-9:]], phase",
           "yield board.fen(), [m.uci() for m in board.move_stack[-9:]][::-1], phase",
           ("mini/test_positions.py::test_generated_positions_carry_the_last_nine_moves_that_led_there_in_order",)),
    Mutant("iter_history_first_nine", "the generator's P: history is the first 9 moves of the game",
           "positions.py", "yield board.fen(), [m.uci() for m in board.move_stack[-9:]], phase",
           "yield board.fen(), [m.uci() for m in board.move_stack[:9]], phase",
           ("mini/test_positions.py::test_generated_positions_carry_the_last_nine_moves_that_led_there_in_order",)),
    Mutant("illegal_move_may_be_legal", "the random 'illegal' move may be a legal one",
           "positions.py", "while m is None or m.from_square == m.to_square or m in board.legal_moves:",
           "while m is None or m.from_square == m.to_square:",
           ("mini/test_positions.py::test_env_sample_kinds_by_their_rate_bands",)),
    Mutant("played_move_ignored", "a game's A: transition gets a generated move instead of the move played",
           "positions.py", "    elif move is None:\n        ending",
           "    else:\n        ending",
           ("mini/test_positions.py::test_env_sample_kinds_by_their_rate_bands",)),
    Mutant("ending_moves_not_favoured", "game-ending moves are not favoured in A: samples",
           "positions.py", "move = (rng.choice(ending) if ending and rng.random() < 0.5",
           "move = (rng.choice(ending) if ending and rng.random() < 0.05",
           ("mini/test_positions.py::test_env_samples_favour_game_ending_moves",)),
    Mutant("resign_one_ply_late", "a side resigns after 5 lost plies, not 4",
           "positions.py", "if resigns and lost >= RESIGN_PLIES:",
           "if resigns and lost > RESIGN_PLIES:",
           ("mini/test_positions.py::test_resignation_after_four_lost_plies_in_about_half_the_games",)),
    Mutant("always_resign", "every game resigns, none plays on to the end",
           "positions.py", "resigns, lost, level = rng.random() < 0.5, 0, 0",
           "resigns, lost, level = rng.random() < 2, 0, 0",
           ("mini/test_positions.py::test_resignation_after_four_lost_plies_in_about_half_the_games",)),
    Mutant("lost_not_reset", "a side's run of lost plies is not reset by a playable one",
           "positions.py", "lost = lost + 1 if abs(best_cp) >= RESIGN_CP else 0",
           "lost = lost + 1 if abs(best_cp) >= RESIGN_CP else lost",
           ("mini/test_positions.py::test_resignation_after_four_lost_plies_in_about_half_the_games",)),
    Mutant("max_plies_late", "realistic games run one ply past MAX_PLIES",
           "positions.py", "if board.ply() >= MAX_PLIES:",
           "if board.ply() > MAX_PLIES:",
           ("mini/test_positions.py::test_a_game_stops_at_max_plies",)),
    Mutant("draw_from_ignored", "an agreed draw may come before ply DRAW_FROM",
           "positions.py", "level = level + 1 if abs(best_cp) <= DRAW_CP and board.ply() >= DRAW_FROM else 0",
           "level = level + 1 if abs(best_cp) <= DRAW_CP else 0",
           ("mini/test_positions.py::test_agreed_draw_after_draw_plies_level_plies_from_draw_from",)),
    Mutant("temperature_range_wide", "game styles draw temperatures up to 1500 cp",
           "positions.py", "math.exp(rng.uniform(math.log(10), math.log(150)))",
           "math.exp(rng.uniform(math.log(10), math.log(1500)))",
           ("mini/test_positions.py::test_game_styles_span_their_documented_ranges",)),
    Mutant("game_fens_without_start", "game_fens leaves out the initial position",
           "positions.py", "    board = chess.Board()\n    yield board.fen()\n",
           "    board = chess.Board()\n",
           ("mini/test_positions.py::test_game_fens_are_every_position_of_the_game_first_and_last_included",)),
    Mutant("phase_opening_15", "the opening is the first 15 plies, not 16",
           "positions.py", 'return "opening" if board.ply() <= 16 else',
           'return "opening" if board.ply() < 16 else',
           ("mini/test_positions.py::test_phase_boundaries",)),
    Mutant("cut_keeps_oldest", "a cut history keeps its oldest moves, not the ones right before the position",
           "annotate.py", "history = history[rng.randint(1, len(history)):]",
           "history = history[:-rng.randint(1, len(history))]",
           ("mini/test_positions.py::test_game_transitions_are_the_moves_played_after_the_moves_that_led_there",)),
    Mutant("cut_may_keep_all", "a cut history may keep its full length",
           "annotate.py", "history = history[rng.randint(1, len(history)):]",
           "history = history[rng.randint(0, len(history)):]",
           ("mini/test_positions.py::test_game_transitions_are_the_moves_played_after_the_moves_that_led_there",)),
    Mutant("game_positions_unshuffled", "game positions are the first plies of the first games, not drawn uniformly",
           "annotate.py", "    rng.shuffle(candidates)\n",
           "",
           ("mini/test_positions.py::test_game_positions_are_drawn_over_every_ply",)),
    Mutant("screen_signed", "the screen keeps every position lost for the side to move (no abs)",
           "annotate.py", "kept = [p for p in batch if abs(quick[p[0]][1][0]) <= a.max_eval or rng.random() < 0.25]",
           "kept = [p for p in batch if quick[p[0]][1][0] <= a.max_eval or rng.random() < 0.25]",
           ("mini/test_annotate.py::test_the_screen_keeps_level_positions_and_a_quarter_of_lopsided_ones_for_either_side",)),
    Mutant("screen_bound_strict", "a position exactly at --max_eval counts as lopsided",
           "annotate.py", "if abs(quick[p[0]][1][0]) <= a.max_eval or",
           "if abs(quick[p[0]][1][0]) < a.max_eval or",
           ("mini/test_annotate.py::test_the_screen_keeps_level_positions_and_a_quarter_of_lopsided_ones_for_either_side",)),
    Mutant("write_jsonl_no_history", "annotate writes P: positions without the moves that led there",
           "annotate.py", 'record = {"fen": fen, "moves": moves, "evals": evals, "history": history, "phase": phase_name}',
           'record = {"fen": fen, "moves": moves, "evals": evals, "history": [], "phase": phase_name}',
           ("mini/test_annotate.py::test_the_screen_keeps_level_positions_and_a_quarter_of_lopsided_ones_for_either_side",)),
    Mutant("submit_futures_wrong_chunk", "a submitted FEN's future is the last chunk's",
           "stockfish.py", "return [chunks[i // n] for i in range(len(fens))]",
           "return [chunks[-1] for i in range(len(fens))]",
           ("mini/test_annotate.py::test_each_submitted_fen_gets_its_own_chunks_labels",)),
    Mutant("deadline_ignores_multipv", "an engine call's deadline ignores the MultiPV lines",
           "stockfish.py", "return ENGINE_GRACE_S + 20 * guess * multipv",
           "return ENGINE_GRACE_S + 20 * guess",
           ("mini/test_annotate.py::test_engine_deadline_by_hand",)),
    Mutant("summary_mean_not_median", "the self-play summary reports the mean plies as the median",
           "games.py", 'statistics.median(g["plies"] for g in games)',
           'statistics.mean(g["plies"] for g in games)',
           ("mini/test_games.py::test_selfplay_summary_and_means_by_hand",)),
]


def scratch_copy(root):
    """mini/ copied to root/mini, without caches (this script's own copy is left out: nothing imports it)."""
    shutil.copytree(HERE, os.path.join(root, "mini"),
                    ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache", ".hypothesis", "mutants.py"))


def apply(root, m):
    path = os.path.join(root, "mini", m.file)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    n = text.count(m.old)
    if n != 1:
        return f"old text found {n} times in mini/{m.file}"
    with open(path, "w", encoding="utf-8") as f:
        f.write(text.replace(m.old, m.new))
    return None


def run_tests(root, tests, timeout=1800):
    """(return code, first failing test or None, seconds) of pytest -x over tests, run in root."""
    env = {**os.environ, "PYTHONPATH": root, "PYTHONDONTWRITEBYTECODE": "1"}
    t0 = time.time()
    try:
        p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-rfE", "-p", "no:cacheprovider", *tests],
                           cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timeout", time.time() - t0
    failed = re.search(r"^(?:FAILED|ERROR) (\S+)", p.stdout, re.M)
    return p.returncode, failed.group(1) if failed else None, time.time() - t0


def check_scratch_is_imported(root):
    """The scratch copy, not the working tree (mini/ is a namespace package, installed editable), is what runs."""
    env = {**os.environ, "PYTHONPATH": root}
    out = subprocess.run([sys.executable, "-c", "import mini.train; print(mini.train.__file__)"], cwd=root, env=env,
                         capture_output=True, text=True).stdout.strip()
    if not out.startswith(root):
        sys.exit(f"the scratch copy is not what gets imported (mini.train is {out!r}); nothing was run")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.strip().splitlines()[0])
    p.add_argument("names", nargs="*", help="mutants to run (default: all)")
    p.add_argument("--list", action="store_true", help="print the list and exit")
    a = p.parse_args(argv)
    by_name = {m.name: m for m in MUTANTS}
    if a.list:
        for m in MUTANTS:
            print(f"{m.name:26s} mini/{m.file:17s} {m.breaks}")
        return 0
    unknown = [n for n in a.names if n not in by_name]
    if unknown:
        p.error(f"unknown mutants {unknown}; see --list")
    chosen = [by_name[n] for n in a.names] or MUTANTS
    tests = list(dict.fromkeys(t for m in chosen for t in m.tests))

    with tempfile.TemporaryDirectory(prefix="mutants-") as tmp:
        base = os.path.join(tmp, "base")
        scratch_copy(base)
        check_scratch_is_imported(base)
        rc, failed, secs = run_tests(base, tests)
        print(f"unmutated: {len(tests)} test selections {'pass' if rc == 0 else 'FAIL'} ({secs:.0f} s)", flush=True)
        if rc != 0:
            print(f"the tests fail without a mutant ({failed}); fix that first", file=sys.stderr)
            return 1
        rows = []
        for i, m in enumerate(chosen):
            root = os.path.join(tmp, f"m{i}")
            scratch_copy(root)
            problem = apply(root, m)
            if problem:
                rows.append((m.name, "STALE", problem, 0.0))
            else:
                rc, failed, secs = run_tests(root, m.tests)
                caught = rc not in (0, None) and failed is not None
                rows.append((m.name, "yes" if caught else "NO", failed or ("timeout" if rc is None else f"rc {rc}"), secs))
            shutil.rmtree(root)
            print(f"{rows[-1][0]:26s} {rows[-1][1]:5s} {rows[-1][3]:5.0f} s  {rows[-1][2]}", flush=True)

    print("\n| mutant | caught | by | seconds |\n|---|---|---|---|")
    for name, caught, by, secs in rows:
        print(f"| {name} | {caught} | {by} | {secs:.0f} |")
    bad = [r[0] for r in rows if r[1] != "yes"]
    print(f"\n{len(rows) - len(bad)}/{len(rows)} caught" + (f"; not caught or stale: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
