"""A step's batch as data: the rollout from sampling to the update (Rollout), every rank's rows of it
(GlobalBatch), the groups dynamic sampling keeps (InformativeGroups), and the metrics they give a step's row.
N = batch_size * K rows, groups contiguous: rows g*K .. g*K+K-1 share a prompt.
"""
from dataclasses import dataclass

import torch

from mini import distributed, grpo
from mini.sampler import place_rows, round_up


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
    comp_lens: list = None        # N completion lengths in ids, the EOS included where kept
    bucket: int = 1               # ids' widths are multiples of this (pad)
    ref_logp: torch.Tensor = None    # (N, Tc) reference log-probs (k3 KL)
    old_logp: torch.Tensor = None    # (N, Tc) behaviour log-probs (several PPO epochs, GAE)
    old_values: torch.Tensor = None  # (N, Tc) value estimates (GAE)
    scores: list = None           # N (reward, components) from the scorer
    rewards: torch.Tensor = None  # (N,)
    env_sft: "Rollout" = None     # --env_sft_coef: A: transitions with their true next states as completions
    policy_sft: "Rollout" = None  # --policy_sft_coef: P: positions with Stockfish's analysis as completions
    batches: list = None          # the MicroBatches of the passes over it, made once by Trainer.prepare
    weightless: bool = False      # a rank's placeholder under torchrun: its rows count nowhere (InformativeGroups)

    @classmethod
    def of_rows(cls, rows):
        """The scored rollout of some (rollout, row index) pairs, in their order."""
        return cls(*([getattr(r, f)[i] for r, i in rows] for f in ("samples", "prompts", "completions", "texts")),
                   scores=[r.scores[i] for r, i in rows])

    def pad(self, eos, max_new_tokens, device, bucket=1):
        """ids, mask and Tp: left-padded prompts then right-padded completions. A row that stopped keeps its
        EOS: stopping is an action. bucket: both widths rounded up to a multiple of it (and the micro-batches'
        columns, see micro_batches), so that a compiled forward sees a few shapes again and again."""
        self.bucket = bucket
        comps = [c + [eos] if len(c) < max_new_tokens else c for c in self.completions]
        Tp, Tc = (round_up(max(map(len, x)), bucket) for x in (self.prompts, comps))
        self.ids, self.mask = place_rows([p + c for p, c in zip(self.prompts, comps)],
                                         [Tp - len(p) for p in self.prompts], Tp + Tc, eos, device)
        self.Tp, self.comp_lens = Tp, list(map(len, comps))
        if self.weightless:  # its completions become padding: no loss term, normaliser or metric counts them
            self.mask[:, Tp:] = False

    def micro_batches(self, size, K, device):
        """The rows `size` at a time (0: all at once) as MicroBatches. With several, the groups go in order of
        their longest completion, then prompt, each group's rows together, so that a micro-batch holds rows of
        like lengths and its columns trimmed to theirs cost less than the whole batch's width."""
        n = len(self.prompts)
        size = min(size or n, n)
        comp = self.comp_lens
        if size < n:
            key = lambda g: (max(comp[g * K:g * K + K]), max(map(len, self.prompts[g * K:g * K + K])))
            order = [i for g in sorted(range(-(-n // K)), key=key, reverse=True) for i in range(g * K, min(g * K + K, n))]
        else:
            order = list(range(n))
        out = []
        for i in range(0, n, size):
            rows = order[i:i + size]
            start = self.Tp - round_up(max(len(self.prompts[j]) for j in rows), self.bucket)
            Tc = min(round_up(max(comp[j] for j in rows), self.bucket), self.ids.shape[1] - self.Tp)
            out.append(MicroBatch(torch.tensor(rows, device=device), grpo.group_rows(rows, K, device), start, Tc))
        return out

    def logged(self, step, n_groups, K):
        """samples.jsonl's rows: the first row of each of the first n_groups groups."""
        return [{"step": step, "task": self.samples[i].task, "prompt": self.samples[i].prompt,
                 "completion": self.texts[i], "reward": self.scores[i][0]}
                for i in range(0, min(n_groups * K, len(self.samples)), K) if not self.weightless]

    @property
    def comp_ids(self):
        return self.ids[:, self.Tp:]  # (N, Tc)

    @property
    def comp_mask(self):
        return self.mask[:, self.Tp:]  # (N, Tc)

    @property
    def tasks(self):
        return [s.task for s in self.samples]


@dataclass
class MicroBatch:
    """Some rows of a rollout for one forward pass, and the columns they use: their prompts start at column
    `start` or later, their completions (EOS included) fill Tc columns or fewer."""
    rows: torch.Tensor  # (n,) rollout rows
    groups: tuple       # each row's group (n,) and the first row of each group (U,): GPT.completion_hidden's
    start: int
    Tc: int

    def inputs(self, r):
        """ids (n, T'), mask (n, T') and the prompt width of these rows, trimmed to their columns."""
        cols = slice(self.start, r.Tp + self.Tc)
        return r.ids[self.rows, cols], r.mask[self.rows, cols], r.Tp - self.start

    def take(self, x):
        """These rows of a per-row (N,) or per-completion-token (N, Tc) tensor, trimmed to their columns."""
        return x[self.rows] if x.dim() == 1 else x[self.rows, :self.Tc]

    @staticmethod
    def join(batches, xs, shape):
        """The (N, Tc) tensor of the micro-batches' (n, Tc') parts, zero in their trimmed columns."""
        full = xs[0].new_zeros(shape)
        for mb, x in zip(batches, xs):
            full[mb.rows, :x.shape[1]] = x
        return full


@dataclass
class GlobalBatch:
    """A step's rows of every torchrun rank, in rank order (a plain process is its own world), so that the
    advantages, the baseline and the metrics are the global batch's; this rank's rows start at `offset`."""
    scores: list           # N (reward, components)
    tasks: list            # N "P" or "A"
    lens: list             # N completion lengths
    prompt_tokens: int
    prompt_len_max: int    # the longest prompt: the columns every row's left-padded prompt takes in decode
    sampling: dict         # dynamic sampling's metrics (empty without it)
    rewards: torch.Tensor  # (N,)
    offset: int

    @classmethod
    def gather(cls, r, sampling, rank):
        """Every rank's rows of the scored rollout r (none of a weightless one); sets r.rewards, this rank's."""
        mine = ([], [], [], 0, 0) if r.weightless else (r.scores, r.tasks, [len(c) for c in r.completions],
                                                        sum(map(len, r.prompts)), max(map(len, r.prompts)))
        ranks = distributed.gather((*mine, sampling))
        scores, tasks, lens = ([x for part in ranks for x in part[i]] for i in range(3))
        offset = sum(len(part[0]) for part in ranks[:rank])
        rewards = torch.tensor([reward for reward, _ in scores], dtype=torch.float32)  # (N,)
        r.rewards = torch.zeros(len(r.scores)) if r.weightless else rewards[offset:offset + len(r.scores)]
        return cls(scores, tasks, lens, sum(part[3] for part in ranks), max(part[4] for part in ranks),
                   merge_sampling([part[5] for part in ranks]), rewards, offset)

    def metrics(self, max_new_tokens):
        return {**self.sampling, **reward_metrics(self.rewards, self.tasks, self.scores),
                "prompt_tokens": self.prompt_tokens, "prompt_len_max": self.prompt_len_max,
                "completion_tokens": sum(self.lens),
                "completion_len_mean": sum(self.lens) / len(self.lens),
                "completion_clipped_ratio": sum(n >= max_new_tokens for n in self.lens) / len(self.lens)}


class InformativeGroups:
    """The groups of scored rollouts whose rewards differ (grpo.informative_groups), in draw order, and what
    dynamic sampling drew."""

    def __init__(self, K, min_std):
        self.K, self.min_std = K, min_std
        self.kept, self.rounds, self.drawn, self.zero_var, self.reward_sum, self.last = [], 0, 0, 0, 0.0, None

    def add(self, r):
        rewards = torch.tensor([reward for reward, _ in r.scores])
        informative = grpo.informative_groups(rewards, self.K, self.min_std).tolist()
        self.kept += [(r, g) for g, keep in enumerate(informative) if keep]
        self.rounds, self.drawn, self.last = self.rounds + 1, self.drawn + len(informative), r
        self.zero_var += int((~grpo.informative_groups(rewards, self.K)).sum())
        self.reward_sum += rewards.sum().item()

    def rollout(self, n, others_kept=False):
        """The first n kept groups as one rollout. None kept: the last rollout whole, so the KL term still acts;
        but under torchrun, when another rank kept some (others_kept), its first group as a weightless
        placeholder: this rank must still take part in the update, and its flat groups would otherwise dilute
        the others' (N ranks x B/N prompts are to give the update of one process x B)."""
        if not self.kept and others_kept:
            placeholder = Rollout.of_rows([(self.last, i) for i in range(self.K)])
            placeholder.weightless = True
            return placeholder
        kept = self.kept[:n] or [(self.last, g) for g in range(n)]
        return Rollout.of_rows([(r, i) for r, g in kept for i in range(g * self.K, (g + 1) * self.K)])

    def metrics(self, n):
        return {"ds_rounds": self.rounds, "ds_groups_drawn": self.drawn, "ds_groups_kept": min(len(self.kept), n),
                "ds_zero_var_share_drawn": self.zero_var / self.drawn,
                "ds_reward_mean_drawn": self.reward_sum / (self.drawn * self.K)}


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
