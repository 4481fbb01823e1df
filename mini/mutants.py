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
           "train.py", "old_logp.append(grpo.token_logprobs(logits, comp_ids, cfg.temperature))",
           "old_logp.append(grpo.token_logprobs(logits, comp_ids))", (SAMPLER_AGREES, REFERENCE)),
    Mutant("logits_one_late", "completion logits are taken one position late: each token predicts itself",
           "train.py", "h = self.hidden(ids[:, :-1], mask[:, :-1], Tp - 1)", "h = self.hidden(ids[:, 1:], mask[:, 1:], Tp - 1)", (SAMPLER_AGREES, REFERENCE)),
    Mutant("eos_not_an_action", "a completion that stopped does not get its EOS as the last action",
           "rollout.py", "comps = [c + [eos] if len(c) < max_new_tokens else c for c in self.completions]",
           "comps = [list(c) for c in self.completions]", (SAMPLER_AGREES, REFERENCE)),
    Mutant("groups_interleaved", "the K samples of a prompt are interleaved with other prompts' instead of contiguous",
           "train.py", "samples = [s for s in drawn for _ in range(K)]", "samples = [s for _ in range(K) for s in drawn]",
           (REFERENCE,)),
    Mutant("micro_batch_normaliser", "each micro-batch is normalised by itself instead of by the whole rollout",
           "train.py", "logits, r.comp_ids[sl], r.comp_mask[sl], adv[sl], settings, norm,",
           "logits, r.comp_ids[sl], r.comp_mask[sl], adv[sl], settings, grpo.normalisers(r.comp_mask[sl], cfg.max_new_tokens),",
           (REFERENCE,)),
    Mutant("ref_logp_first_rows", "every micro-batch gets the reference log-probs of the first micro-batch's rows",
           "train.py", "ref_logp=r.ref_logp[sl] if", "ref_logp=r.ref_logp[:sl.stop - sl.start] if", (REFERENCE,)),
    Mutant("dr_grpo_padded_width", "Dr. GRPO divides by the batch's padded width instead of the generation budget",
           "train.py", "norm = grpo.normalisers(r.comp_mask, budget=cfg.max_new_tokens)",
           "norm = grpo.normalisers(r.comp_mask)", (REFERENCE,)),
    Mutant("k3_against_policy", "k3's reference log-probs come from the policy itself: the KL is always 0",
           "train.py", "logits = self.ref_head(ids, mask, r.Tp)[0]", "logits = self.policy(ids, mask, r.Tp)[0]",
           (REFERENCE,)),
    Mutant("exact_kl_against_policy", "the exact KL's reference logits come from the policy itself",
           "train.py", "ref_logits = self.ref_head(r.ids[sl]", "ref_logits = self.policy(r.ids[sl]", (REFERENCE,)),
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
           "grpo.py", "exact_kl(logits, ref_logits, s.kl_type, s.temperature)", "exact_kl(logits, ref_logits, s.kl_type)",
           (REFERENCE,)),
    Mutant("entropy_penalised", "the entropy bonus becomes a penalty",
           "grpo.py", "loss = loss - s.entropy_coef * agg(ent_t)", "loss = loss + s.entropy_coef * agg(ent_t)",
           ("mini/test_grpo.py", REFERENCE)),
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
           "dataset.py", "self.rng.random() >= self.env_ratio", "self.rng.random() >= 0.8 * self.env_ratio",
           ("mini/test_dataset.py::test_pool_source_mix",)),
    # torchrun (mini/test_distributed.py: 2 gloo processes against 1)
    Mutant("local_token_count", "under torchrun each rank divides its loss by its own token count, not the global one",
           "train.py", "norm.update(n_seqs=int(n_seqs), n_tokens=max(int(n_tokens), 1))", "pass", (TWO_RANKS_STEP,)),
    Mutant("ddp_mean_not_undone", "each rank's loss is not scaled by the world size: DDP's mean halves the gradient",
           "train.py", "(loss * self.world if ddp is not None else loss).backward()", "loss.backward()", (TWO_RANKS_STEP,)),
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
    Mutant("candidates_over_5", "the candidates component divides by 5, not by the number of labelled moves",
           "reward_scorer.py", "/ max(len(ranked), 1)", "/ 5", ("mini/test_reward_scorer.py",)),
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
