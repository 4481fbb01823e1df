"""
Batched sampling for GRPO rollouts and evaluation: a preallocated KV cache, the one left-padding
helper, an exact one-uniform-per-row sampler, and `generate`.

    out = generate(model, [prompt_ids] * 8, max_new_tokens=96, temperature=1.0)  # [(ids, logprobs)] * 8
"""
import torch
import torch.nn.functional as F


class KVCache:
    """Preallocated keys and values of every layer; `length` positions are filled."""

    def __init__(self, cfg, batch_size, max_len, device, dtype):
        shape = (cfg.n_layer, batch_size, cfg.n_head, max_len, cfg.n_embd // cfg.n_head)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.length, self.layer = 0, 0

    def append(self, k, v):  # called once per layer, in order, for each forward
        T, i = k.shape[2], self.layer
        self.k[i, :, :, self.length:self.length + T] = k
        self.v[i, :, :, self.length:self.length + T] = v
        self.layer = (i + 1) % self.k.shape[0]
        end = self.length + T
        if self.layer == 0:
            self.length = end
        return self.k[i, :, :, :end], self.v[i, :, :, :end]


def pad_left(seqs, pad_id, device):
    """Token-id lists -> ids (N, T) left-padded with pad_id, and mask (N, T) True on real tokens."""
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), T, dtype=torch.bool)
    for i, s in enumerate(seqs):
        ids[i, T - len(s):] = torch.tensor(s, dtype=torch.long)
        mask[i, T - len(s):] = True
    return ids.to(device), mask.to(device)


def sample_next(logits, temperature=1.0, top_k=0, generator=None):
    """One token per row from softmax(logits / temperature), restricted to the top_k most likely
    tokens when top_k > 0 (temperature 0: argmax), and its fp32 log-prob under that distribution.
    Sampling inverts the CDF with one uniform number per row: exact, no host sync, and ~10x cheaper
    on CPU than drawing a Gumbel or exponential variate for each of the 50257 logits."""
    logits = logits.float()  # (N, V)
    if temperature == 0:
        nxt = logits.argmax(dim=-1)
        return nxt, F.log_softmax(logits, dim=-1).gather(1, nxt[:, None])[:, 0]
    logits = logits / temperature
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    logp = F.log_softmax(logits, dim=-1)
    cdf = logp.exp().cumsum(dim=-1)  # (N, V)
    u = torch.rand(cdf.shape[0], 1, device=cdf.device, generator=generator) * cdf[:, -1:]
    nxt = torch.searchsorted(cdf, u, right=True)[:, 0].clamp(max=cdf.shape[-1] - 1)  # right: skips p = 0 tokens
    return nxt, logp.gather(1, nxt[:, None])[:, 0]


@torch.no_grad()
def generate(model, prompts, max_new_tokens, temperature=1.0, top_k=0, eos_id=50256, generator=None,
             stop_check_every=4):
    """Sample a completion for each prompt (a list of token-id lists) in one batch.

    Returns a list of (completion_ids, logprobs): ids without the final EOS, and the fp32 log-prob of
    each sampled id under the distribution it was drawn from (logits / temperature, restricted to the
    top_k most likely tokens when top_k > 0). temperature 0 is greedy; its log-probs are those of the
    untempered distribution. Identical prompts (a GRPO group) are prefilled once. Rows stop at EOS or
    after max_new_tokens; the host checks for "all rows done" every `stop_check_every` tokens only.
    """
    device = next(model.parameters()).device
    dtype = next(model.parameters()).dtype
    unique = {tuple(p): i for i, p in enumerate(dict.fromkeys(tuple(p) for p in prompts))}
    if any(len(p) == 0 for p in unique):
        raise ValueError("generate got an empty prompt; every prompt needs at least one token")
    row_of = torch.tensor([unique[tuple(p)] for p in prompts], device=device)  # (N,)
    ids, mask = pad_left([list(p) for p in unique], eos_id, device)  # (U, Tp)
    U, Tp = ids.shape
    N = len(prompts)
    longest = max(len(p) for p in unique) + max_new_tokens
    if longest > model.config.n_positions:
        raise ValueError(f"a prompt plus max_new_tokens needs {longest} positions but the model has "
                         f"{model.config.n_positions}; shorten the prompt or lower max_new_tokens")

    # prefill each distinct prompt once, then copy its keys and values to the rows that share it
    prefill = KVCache(model.config, U, Tp, device, dtype)
    logits = model.lm_head(model.hidden(ids, key_mask=mask, cache=prefill)[:, -1])  # (U, vocab)
    cache = KVCache(model.config, N, Tp + max_new_tokens, device, dtype)
    cache.k[:, :, :, :Tp] = prefill.k[:, row_of]
    cache.v[:, :, :, :Tp] = prefill.v[:, row_of]
    cache.length = Tp
    del prefill
    logits, key_mask = logits[row_of], mask[row_of]  # (N, vocab), (N, Tp)

    tokens = torch.full((N, max_new_tokens), eos_id, dtype=torch.long, device=device)
    logprobs = torch.zeros(N, max_new_tokens, dtype=torch.float32, device=device)
    finished = torch.zeros(N, dtype=torch.bool, device=device)
    ones = torch.ones(N, 1, dtype=torch.bool, device=device)
    for t in range(max_new_tokens):
        nxt, logp = sample_next(logits, temperature, top_k, generator)
        nxt = torch.where(finished, eos_id, nxt)  # (N,)
        tokens[:, t] = nxt
        logprobs[:, t] = logp.masked_fill(finished, 0.0)
        finished |= nxt == eos_id
        if t == max_new_tokens - 1 or ((t + 1) % stop_check_every == 0 and bool(finished.all())):
            break
        key_mask = torch.cat([key_mask, ones], dim=1)
        logits = model.lm_head(model.hidden(nxt[:, None], key_mask=key_mask, cache=cache)[:, -1])

    tokens, logprobs = tokens.cpu().tolist(), logprobs.cpu()
    out = []
    for i, row in enumerate(tokens):
        n = row.index(eos_id) if eos_id in row else len(row)
        out.append((row[:n], logprobs[i, :n]))
    return out
