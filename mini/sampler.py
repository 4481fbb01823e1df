"""
Batched sampling for GRPO rollouts and evaluation: preallocated KV caches (one copy of the prompt per row,
or each group's prompt once with its rows' completions after it), the one left-padding helper, an exact
one-uniform-per-row sampler, a static-shape decode step, and `generate`.

    out = generate(model, [prompt_ids] * 8, max_new_tokens=96, temperature=1.0)  # [(ids, logprobs)] * 8
    out = generate(model, prompts, 96, compile_decode=True)  # the decode step compiled (CUDA graphs on CUDA)
"""
import copy
import weakref

import torch
import torch.nn.functional as F
from torch import nn

from mini.model import causal_mask


class KVCache:
    """Keys and values of every layer, preallocated to the full length: k[layer], v[layer] (N, nh, T_max, hs).
    A forward with the cache writes its tokens at columns col, col + 1, ... and attends over all T_max
    columns; key_mask (N, T_max) is True on the real tokens written so far, so padding and the columns
    not written yet are hidden. col and n_real (real tokens per row: the next position) are tensors
    updated in place, so a decode step has the same shapes and the same graph every token. One tensor
    per layer, not one (n_layer, ...) tensor: Inductor writes in place into a graph input, but not into
    a view of one, where it copied the whole cache every step."""

    def __init__(self, cfg, batch_size, max_len, device, dtype):
        self.k, self.v = _layers(cfg, batch_size, max_len, device, dtype)
        self.key_mask = torch.zeros(batch_size, max_len, dtype=torch.bool, device=device)  # (N, T_max)
        self.n_real = torch.zeros(batch_size, dtype=torch.long, device=device)  # (N,)
        self.col = torch.zeros((), dtype=torch.long, device=device)  # the next column written

    @property
    def rows(self):
        return self.n_real.shape[0]

    def load(self, src, rows):
        """Start from the prefilled cache src: row i is src's row rows[i] (rows that share a prompt)."""
        T = src.key_mask.shape[1]  # src is full: the prompts
        for dst, s in zip(self.k + self.v, src.k + src.v):
            dst[:, :, :T] = s[rows]  # stale columns past T stay: key_mask hides them
        self.key_mask.zero_()
        self.key_mask[:, :T] = src.key_mask[rows]
        self.n_real.copy_(src.n_real[rows])
        self.col.copy_(src.col)

    def keep(self, rows):
        """Drop every row but rows (n,) (eager decode drops finished rows)."""
        self.k, self.v = [x[rows] for x in self.k], [x[rows] for x in self.v]
        self.key_mask, self.n_real = self.key_mask[rows], self.n_real[rows]

    def advance(self, mask):
        """GPT.hidden's tokens (N, T), real where mask is True, go in at the next T columns: their positions
        (N, T), and each layer's attend(q, k, v), which writes k, v there and attends over every column."""
        T = mask.shape[1]
        pos = (self.n_real[:, None] + mask.long().cumsum(1) - 1).clamp(min=0)  # (N, T)
        cols = self.col + torch.arange(T, device=mask.device)  # (T,) columns of the tokens in the cache
        self.key_mask.index_copy_(1, cols, mask)
        self.n_real += mask.sum(1)
        self.col += T
        attn_mask = causal_mask(cols, self.key_mask)  # (N, 1, T, T_max)

        def attend_to(k_all, v_all):
            def attend(q, k, v):
                k_all.index_copy_(2, cols, k.to(k_all.dtype))  # in place, at tensor positions: no shape depends on the step
                v_all.index_copy_(2, cols, v.to(v_all.dtype))
                return F.scaled_dot_product_attention(q, k_all, v_all, attn_mask=attn_mask)
            return attend
        return pos, [attend_to(k, v) for k, v in zip(self.k, self.v)]


class SharedPrefixCache:
    """The decode cache of rows that share prompts (a GRPO group: K rows of one prompt): one block of keys and
    values per prompt, k[layer], v[layer] (U, nh, Tp + T_new * G, hs), the prompt's columns first, then the
    completion columns of its G row slots interleaved: slot g's token t at column Tp + t * G + g. A decode
    token attends in one masked attention per prompt, its G slots' queries at once over the block: a slot
    sees the prompt's real columns and its own completion so far. So each prompt's keys are read once per
    group instead of once per row (Hydragen, Juravsky et al. 2024, without its two partial softmaxes and
    their merge, a few operations a layer instead of forty), and the completion columns only as far as
    `width` tokens, a prefix of the block thanks to the interleaving (generate sets it to the written tokens
    rounded up to WIDTH_BUCKET: one compiled graph per bucket). The price: a query also scores the other
    slots' columns, masked, G times the completion's scores (small beside the model's matmuls at G <= 16).
    Storage and queries scale with U x G, G the largest group: equal groups (GRPO) fill every slot, while a
    batch of distinct prompts with one repeated (G = 2) doubles them against the per-row cache.
    slots (U, G) holds the row in each slot (an empty slot: row 0, its output unused), slot_of_row (N,) the
    slot of each row (so slot_of_row // G its prompt). Decode only: one real token per row."""

    def __init__(self, cfg, prompts, prompt_len, group, batch_size, max_new, device, dtype):
        self.k, self.v = _layers(cfg, prompts, prompt_len + max_new * group, device, dtype)
        self.key_mask = torch.zeros(prompts, prompt_len, dtype=torch.bool, device=device)  # (U, Tp): real prompt columns
        self.n_real = torch.zeros(prompts, dtype=torch.long, device=device)  # (U,): the prompts' real tokens
        self.slots = torch.zeros(prompts, group, dtype=torch.long, device=device)  # (U, G)
        self.slot_of_row = torch.zeros(batch_size, dtype=torch.long, device=device)  # (N,); its prompt: // G
        self.col = torch.zeros((), dtype=torch.long, device=device)  # the next completion token's index
        self.max_new = self.width = max_new  # completion tokens stored, read

    @property
    def rows(self):
        return self.slot_of_row.shape[0]

    def start(self, prefill, prompt_of):
        """Start from the prefilled prompts (a KVCache): row i continues prompt prompt_of[i]; the rows past
        len(prompt_of) (the dummies of a compiled bucket) take empty slots, and the prompts past prefill's read
        prompt 0's."""
        U, G = self.slots.shape
        T = prefill.key_mask.shape[1]
        src = torch.arange(U, device=self.col.device) % prefill.n_real.shape[0]
        for dst, s in zip(self.k + self.v, prefill.k + prefill.v):
            dst[:, :, :T] = s[src]  # stale completion columns stay: the mask hides them
        self.key_mask.zero_()
        self.key_mask[:, :T] = prefill.key_mask[src]
        self.n_real.copy_(prefill.n_real[src])
        for mine, table in zip((self.slots, self.slot_of_row), _slot_tables(list(prompt_of), U, G, self.rows)):
            mine.copy_(table)  # in place: a compiled step's tensors keep their addresses
        self.col.zero_()

    def keep(self, rows):
        """Drop every row but rows (n,) (eager decode drops finished rows); the kept rows keep their slots."""
        self.slot_of_row = self.slot_of_row[rows]
        self.slots = _slots(self.slot_of_row, *self.slots.shape)

    def advance(self, mask):
        """GPT.hidden's decode tokens (N, 1) go in at the next completion column of their slots: their positions
        (N, 1) and each layer's attend(q, k, v)."""
        (U, G), Tp = self.slots.shape, self.key_mask.shape[1]
        prompt_of_row = self.slot_of_row // G  # (N,)
        pos = (self.n_real[prompt_of_row] + self.col)[:, None]  # (N, 1): after the prompt's real tokens
        write = Tp + self.col * G + self.slot_of_row % G  # (N,): each row's column for this token
        self.col += 1
        span = torch.arange(self.width * G, device=mask.device)  # the completion columns read
        own = (span % G == torch.arange(G, device=mask.device)[:, None]) & (span // G < self.col)  # (G, width * G)
        seen = torch.cat([self.key_mask[:, None, :].expand(U, G, Tp), own.expand(U, G, -1)], 2)[:, None]  # (U, 1, G, S)
        S = seen.shape[-1]

        def attend_to(k_all, v_all):
            def attend(q, k, v):  # (N, nh, 1, hs)
                k_all[prompt_of_row, :, write] = k[:, :, 0].to(k_all.dtype)
                v_all[prompt_of_row, :, write] = v[:, :, 0].to(v_all.dtype)
                N, nh, _, hs = q.shape
                qg = q[self.slots.view(-1), :, 0].view(U, G, nh, hs).transpose(1, 2)  # (U, nh, G, hs): a prompt's slots
                y = F.scaled_dot_product_attention(qg, k_all[:, :, :S], v_all[:, :, :S], attn_mask=seen)  # (U, nh, G, hs)
                return y.transpose(1, 2).reshape(U * G, nh, hs)[self.slot_of_row, :, None]  # (N, nh, 1, hs)
            return attend
        return pos, [attend_to(k, v) for k, v in zip(self.k, self.v)]


WIDTH_BUCKET = 16  # SharedPrefixCache reads completion tokens in multiples of this
RECOMPILE_LIMIT = 64  # graphs dynamo keeps for one compiled function (its own default: 8)


def compiled(fn, **kwargs):
    """torch.compile(fn) with room for a graph per shape bucket a run meets (the decode step's rows, columns,
    prefix widths and temperatures; the forwards' micro-batch shapes): at dynamo's default of 8 a run reached
    the limit, after which the function ran eagerly with only a warning in the log."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
    return torch.compile(fn, **kwargs)


def _slot_tables(prompt_of, U, G, n_rows):
    """SharedPrefixCache's slots (U, G): each prompt's rows, then empty slots (row 0); slot_of_row (n_rows,):
    where each row sits in slots.view(-1). The rows past len(prompt_of) (the dummies of a compiled bucket)
    take empty slots of their own, so that no two rows write the same column."""
    members = [[] for _ in range(U)]
    for i, u in enumerate(prompt_of):
        members[u].append(i)
    slot = {i: u * G + g for u, rows in enumerate(members) for g, i in enumerate(rows)}
    empty = [u * G + g for u, rows in enumerate(members) for g in range(len(rows), G)]
    if n_rows - len(prompt_of) > len(empty):
        raise ValueError(f"{n_rows} rows do not fit {U} prompts x {G} slots")
    slot.update(zip(range(len(prompt_of), n_rows), empty))
    slot_of_row = torch.tensor([slot[i] for i in range(n_rows)])
    return _slots(slot_of_row, U, G), slot_of_row


def _slots(slot_of_row, U, G):
    """The slots table (U, G) of slot_of_row (n,): row i in slot slot_of_row[i], row 0 in the empty ones."""
    slots = torch.zeros(U * G, dtype=torch.long, device=slot_of_row.device)
    slots[slot_of_row] = torch.arange(len(slot_of_row), device=slot_of_row.device)
    return slots.view(U, G)


def _layers(cfg, batch_size, max_len, device, dtype):
    """Zeroed keys and values, one (N, nh, T, hs) tensor per layer each."""
    shape = (batch_size, cfg.n_head, max_len, cfg.n_embd // cfg.n_head)
    return ([torch.zeros(shape, device=device, dtype=dtype) for _ in range(cfg.n_layer)] for _ in "kv")


def place_rows(seqs, starts, width, pad_id, device):
    """Token-id lists -> ids (N, width), row i's tokens from column starts[i] on and pad_id elsewhere, and mask
    (N, width) True on them; built from one flat tensor, not a tensor per row, and copied to the device once."""
    lens = torch.tensor([len(s) for s in seqs])  # (N,)
    rows = torch.repeat_interleave(torch.arange(len(seqs)), lens)  # (L,): the row of each token
    first = torch.cumsum(lens, 0) - lens  # (N,): where each row's tokens start in the flat list
    cols = torch.tensor(starts)[rows] + torch.arange(len(rows)) - first[rows]  # (L,)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), width, dtype=torch.bool)
    ids[rows, cols] = torch.tensor([t for s in seqs for t in s], dtype=torch.long)
    mask[rows, cols] = True
    return ids.to(device), mask.to(device)


def pad_left(seqs, pad_id, device):
    """Token-id lists -> ids (N, T) left-padded with pad_id, and mask (N, T) True on real tokens."""
    T = max(len(s) for s in seqs)
    return place_rows(seqs, [T - len(s) for s in seqs], T, pad_id, device)


class PromptTooLong(ValueError):
    """A prompt plus max_new_tokens past the model's positions: the caller's settings, told in one sentence."""


def sample_next(logits, temperature=1.0, top_k=0, generator=None, u=None):
    """One token per row from softmax(logits / temperature), restricted to the top_k most likely
    tokens when top_k > 0, and to any tied with the k-th, as transformers' TopKLogitsWarper does (bf16
    logits tie often) (temperature 0: argmax), and its log-prob under that distribution.
    Sampling inverts the CDF with one uniform number per row: exact, no host sync, and ~10x cheaper
    on CPU than drawing a Gumbel or exponential variate for each of the 50257 logits. u (N,): those
    uniforms, drawn by the caller (compiled code cannot take a generator); else drawn here.
    logits (N, V) in any dtype (bf16 from autocast): they are not copied to fp32; the softmax reads them
    and computes in fp32 (fp64 stays fp64), and its probabilities and their running sum are the only
    vocabulary-wide fp32 tensors. At temperature 1 nothing is divided (generate folds the temperature
    into the hidden state, see decode_logits, and passes 1)."""
    acc = torch.promote_types(logits.dtype, torch.float32)
    if temperature == 0:
        nxt = logits.argmax(dim=-1)
        return nxt, F.log_softmax(logits, dim=-1, dtype=acc).gather(1, nxt[:, None])[:, 0]
    if temperature != 1:
        logits = logits / temperature
    if top_k > 0:
        kth = torch.topk(logits, min(top_k, logits.shape[-1]), dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    p = torch.softmax(logits, dim=-1, dtype=acc)  # (N, V)
    cdf = p.cumsum(dim=-1)  # (N, V)
    if u is None:
        u = torch.rand(cdf.shape[0], device=cdf.device, generator=generator)
    nxt = torch.searchsorted(cdf, u[:, None] * cdf[:, -1:], right=True)[:, 0]  # right: skips p = 0 tokens
    nxt = nxt.clamp(max=cdf.shape[-1] - 1)
    return nxt, p.gather(1, nxt[:, None])[:, 0].log()


def decode_logits(model, h, scale=1.0):
    """The next-token logits (N, vocab), in the autocast dtype, of the last hidden states h (N, C), divided by
    the temperature (scale = 1 / temperature) through h: a multiply of N x C numbers, not of N x vocab."""
    return model.lm_head(h if scale == 1.0 else h * scale)


def decode_step(model, cache, tok, scale=1.0):
    """The one decode step, eager or compiled: tok (N,) goes in at the cache's next column, the cache is
    updated in place, and decode_logits come out. No shape depends on the step (a SharedPrefixCache's
    width excepted: one graph per width bucket). Sampling stays outside (eager): Inductor 2.11 failed to
    generate the fused softmax + cumsum kernel for some batch sizes on an H100, and sampling is a handful of
    kernels beside the model's hundreds."""
    return decode_logits(model, model.hidden(tok[:, None], cache=cache)[:, -1], scale)  # (N, vocab)


def round_up(n, multiple):
    return -(-n // multiple) * multiple


def _compiled_cache(model, N, U, G, Tp, T_new, shared_prefix, device, dtype):
    """The compiled step and a cache for N >= rows, U >= prompts of G >= rows each, Tp >= prompt columns and
    T_new >= new tokens that persists across calls.

    CUDA graphs replay fixed shapes at fixed addresses, so the compiled path rounds shapes up to a few
    buckets and reuses one cache per (model, bucket): row counts to the next power of two up to 64, then to a
    multiple of 64 (a GRPO batch of 8 x 16 keeps its 128 rows; evaluation's short last batch shares the
    full batch's shape), columns to a multiple of 64 capped at n_positions (prompt lengths vary by a
    few tokens between batches). The extra rows are dummies dropped at the end; the extra columns stay
    masked. The cache tensors are marked static (the step mutates them, which CUDA graphs allow only
    for static inputs); a new bucket or a new model compiles or records once more. The caches live as
    long as the model: ~2 * n_layer * n_embd elements of the autocast dtype per cached column (per bucket,
    U x (Tp + G x T_new) with shared_prefix, N x (Tp + T_new) without)."""
    rows = lambda n: 1 << (n - 1).bit_length() if n <= 64 else round_up(n, 64)
    cols = lambda n: min(round_up(n, 64), model.config.n_positions)
    caches = _caches.setdefault(model, {})
    key = (rows(N), rows(U), rows(G), cols(Tp), cols(T_new), shared_prefix, device, dtype) if shared_prefix \
        else (rows(N), cols(Tp + T_new), shared_prefix, device, dtype)
    if key not in caches:
        cfg = model.config
        if shared_prefix:
            cache = SharedPrefixCache(cfg, key[1], key[3], key[2], key[0], key[4], device, dtype)
            tensors = [cache.key_mask, cache.n_real, cache.slots, cache.slot_of_row]
        else:
            cache = KVCache(cfg, key[0], key[1], device, dtype)
            tensors = [cache.key_mask, cache.n_real]
        for t in cache.k + cache.v + tensors + [cache.col]:
            torch._dynamo.mark_static_address(t)
        caches[key] = cache
    mode = "reduce-overhead" if device.type == "cuda" else None  # reduce-overhead: CUDA graphs
    if mode not in _compiled_steps:
        _compiled_steps[mode] = compiled(decode_step, mode=mode, dynamic=False)
    return _compiled_steps[mode], caches[key]


def shares_prefix(setting, device):
    """Whether decode keeps each group's prompt once (SharedPrefixCache) or a copy per row (KVCache): the
    setting, or when it is None the faster of the two on this kind of device. Measured at real sizes
    (README, "Speed"): on the CPU the shared prefix generated 1.07x faster (fewer bytes); on an H200 the copy
    per row 1.97x faster (eager decode there waits on kernel launches, and it launches fewer)."""
    return setting if setting is not None else torch.device(device).type != "cuda"


_caches = weakref.WeakKeyDictionary()  # model -> {bucket: KVCache or SharedPrefixCache}, for the compiled step
_compiled_steps = {}  # torch.compile mode -> compiled decode_step


_matmul_copies = weakref.WeakKeyDictionary()  # model -> (copy, [(copy's weight, model's)], dtype, weights' versions)


def with_matmuls_in(model, dtype):
    """The model the compiled decode step runs: model itself, or, under autocast to a narrower dtype, a copy
    whose Linear weights are in that dtype (GPT.cast_matmuls) and which shares model's embeddings and
    LayerNorms. Eager autocast casts each fp32 weight once per autocast region (it caches the casts of
    weights that require grad); a compiled graph casts them all again at every token, reading and writing
    the model's matmul weights per token. Under autocast the copy's outputs are bitwise model's. It is kept
    per model and refreshed in place (fixed addresses, as CUDA graphs need) whenever model's weights changed
    since: an optimizer step or load_state_dict bumps their version counters."""
    if next(model.parameters()).dtype == dtype:
        return model
    versions = [(p._version, p.data_ptr()) for p in model.parameters()]
    held = _matmul_copies.get(model)
    if held is None or held[2] != dtype:
        owner = lambda name: model.get_submodule(name.rpartition(".")[0])
        shared = {id(p): p for n, p in model.named_parameters() if not isinstance(owner(n), nn.Linear)}
        decoder = copy.deepcopy(model, memo=shared).cast_matmuls(dtype)  # embeddings and norms: model's own
        pairs = [(getattr(decoder.get_submodule(name), w), getattr(m, w)) for name, m in model.named_modules()
                 if isinstance(m, nn.Linear) for w in ("weight", "bias") if getattr(m, w) is not None]
        held = _matmul_copies[model] = [decoder, pairs, dtype, versions]
    elif held[3] != versions:
        with torch.no_grad():
            for mine, theirs in held[1]:
                mine.copy_(theirs)
        held[3] = versions
    return held[0]


def release_decode_caches(model):
    """Drop the compiled decode's caches of model (autobatch's probes: the sizes the run will not use)."""
    _caches.pop(model, None)


@torch.no_grad()
def generate(model, prompts, max_new_tokens, temperature=1.0, top_k=0, eos_id=50256, generator=None,
             stop_check_every=4, compile_decode=False, shared_prefix=None, drop_finished=True):
    """Sample a completion for each prompt (a list of token-id lists) in one batch.

    Returns a list of (completion_ids, logprobs): ids without the final EOS, and the fp32 log-prob of
    each sampled id under the distribution it was drawn from (logits / temperature, restricted to the
    top_k most likely tokens when top_k > 0). temperature 0 is greedy; its log-probs are those of the
    untempered distribution. Identical prompts (a GRPO group) are prefilled once, and with shared_prefix
    their keys and values stay stored once (SharedPrefixCache); without, every row gets its own copy (KVCache);
    None: whichever is faster on the model's device (shares_prefix).
    No prompts: []; max_new_tokens 0: an empty completion per prompt.
    Rows stop at EOS or after max_new_tokens; the host checks for "all rows done" every `stop_check_every`
    tokens only. With drop_finished, eager decode then stops computing the finished rows once they are a
    quarter of those left (a compiled step keeps its shapes); a row's tokens do not depend on the others.

    Every token after the first comes from `decode_step`, run eagerly or, with compile_decode, through
    torch.compile (CUDA graphs on CUDA; see _compiled_cache for the shape buckets). The uniforms of
    sampling are drawn up front, (max_new_tokens, N), from `generator`, so both give the same tokens.
    """
    device = next(model.parameters()).device
    shared_prefix = shares_prefix(shared_prefix, device)
    # keys and values in the dtype autocast computes them in: an fp32 cache under bf16 autocast would
    # convert the whole cache every token
    dtype = torch.get_autocast_dtype(device.type) if torch.is_autocast_enabled(device.type) \
        else next(model.parameters()).dtype
    if temperature < 0 or max_new_tokens < 0 or stop_check_every < 1:
        raise ValueError(f"generate needs temperature >= 0, max_new_tokens >= 0 and stop_check_every >= 1; got "
                         f"{temperature}, {max_new_tokens} and {stop_check_every}")
    unique = {tuple(p): i for i, p in enumerate(dict.fromkeys(tuple(p) for p in prompts))}
    if any(len(p) == 0 for p in unique):
        raise ValueError("generate got an empty prompt; every prompt needs at least one token")
    vocab = model.config.vocab_size
    if any(not 0 <= t < vocab for p in unique for t in p):
        raise ValueError(f"generate got a prompt token outside the model's vocabulary of {vocab}; "
                         "encode the prompts with the model's tokenizer")
    if not 0 <= eos_id < vocab:  # it also pads the prompts: an embedding lookup past the table
        raise ValueError(f"generate got eos_id {eos_id}, outside the model's vocabulary of {vocab}; pass the "
                         "tokenizer's eos_token_id")
    if not prompts:
        return []
    ids, mask = pad_left([list(p) for p in unique], eos_id, device)  # (U, Tp)
    U, Tp = ids.shape
    N = len(prompts)
    prompt_of = [unique[tuple(p)] for p in prompts]  # (N,)
    G = max(prompt_of.count(u) for u in range(U))  # the largest group
    longest = max(len(p) for p in unique) + max_new_tokens
    if longest > model.config.n_positions:
        raise PromptTooLong(f"a prompt plus max_new_tokens needs {longest} positions but the model has "
                            f"{model.config.n_positions}; shorten the prompt or lower max_new_tokens")
    if max_new_tokens == 0:
        return [([], torch.zeros(0)) for _ in prompts]
    scale = 1.0 / temperature if temperature > 0 else 1.0
    temperature = 1.0 if temperature > 0 else 0.0  # greedy, or sampling from logits that come divided already

    # every decode step has the same shapes, so attention's default backend (cuDNN on an H100) plans once
    # per call: at 124M and 1024 rows, 7.9 ms a token eagerly, against 10.7 with efficient attention
    # prefill each distinct prompt once
    prefill = KVCache(model.config, U, Tp, device, dtype)
    logits = decode_logits(model, model.hidden(ids, mask, cache=prefill)[:, -1], scale)  # (U, vocab)
    decoder = model
    if compile_decode:
        step, cache = _compiled_cache(model, N, U, G, Tp, max_new_tokens, shared_prefix, device, dtype)
        decoder = with_matmuls_in(model, dtype)
    elif shared_prefix:
        step, cache = decode_step, SharedPrefixCache(model.config, U, Tp, G, N, max_new_tokens, device, dtype)
    else:
        step, cache = decode_step, KVCache(model.config, N, Tp + max_new_tokens, device, dtype)
    Nb = cache.rows  # rows N.. of a compiled bucket are dummies, finished from the start
    row_of = torch.tensor(prompt_of + [0] * (Nb - N), device=device)  # (Nb,)
    if shared_prefix:
        cache.start(prefill, prompt_of)
    else:
        cache.load(prefill, row_of)  # a copy of its prompt's keys and values for every row
    u = None if temperature == 0 else F.pad(
        torch.rand(max_new_tokens, N, device=device, generator=generator), (0, Nb - N))  # (max_new_tokens, Nb)
    nxt, logp = sample_next(logits[row_of], temperature, top_k, u=None if u is None else u[0])  # (Nb,)
    del prefill, logits

    tokens = torch.full((Nb, max_new_tokens), eos_id, dtype=torch.long, device=device)
    logprobs = torch.zeros(Nb, max_new_tokens, dtype=torch.float32, device=device)
    finished = torch.arange(Nb, device=device) >= N  # (n,): the rows still in the cache
    alive = torch.arange(Nb, device=device)  # (n,): their rows of tokens
    for t in range(max_new_tokens):
        nxt = torch.where(finished, eos_id, nxt)  # (n,)
        tokens[alive, t] = nxt
        logprobs[alive, t] = logp.float()  # a finished row's are cut off below, with its tokens after EOS
        finished |= nxt == eos_id
        if t == max_new_tokens - 1:
            break
        if (t + 1) % stop_check_every == 0:
            done = int(finished.sum())  # the one host sync of these tokens
            if done == len(finished):
                break
            if drop_finished and not compile_decode and 4 * done >= len(finished):  # a quarter or more: drop them
                keep = (~finished).nonzero()[:, 0]  # (n',)
                alive, nxt, finished = alive[keep], nxt[keep], finished[keep]
                u = None if u is None else u[:, keep]
                cache.keep(keep)
        if compile_decode:
            torch.compiler.cudagraph_mark_step_begin()  # the last step's outputs are consumed: reuse them
        if shared_prefix:  # token t goes in at completion column t: read the columns up to it, in buckets
            cache.width = min(round_up(t + 1, WIDTH_BUCKET), cache.max_new)
        logits = step(decoder, cache, nxt, scale)  # (Nb, vocab)
        nxt, logp = sample_next(logits, temperature, top_k, u=None if u is None else u[t + 1])

    tokens, logprobs = tokens[:N].cpu().tolist(), logprobs[:N].cpu()
    out = []
    for i, row in enumerate(tokens):
        n = row.index(eos_id) if eos_id in row else len(row)
        out.append((row[:n], logprobs[i, :n]))
    return out
