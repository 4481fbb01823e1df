"""The sampler: cached decoding equals a full forward, the shared-prefix cache equals per-row attention,
greedy generate equals transformers', log-probs and groups, the sampling distribution and the old fp32
sampler's tokens, length checks, and the compiled decode step (CUDA graphs on CUDA) gives the tokens of
the eager one.

    python mini/test_sampler.py
"""
import copy

import pytest
import torch

from mini.model import GPT, GPTConfig
import torch.nn.functional as F

from mini.sampler import (KVCache, PromptTooLong, SharedPrefixCache, _caches, _compiled_steps, _matmul_copies, compiled,
                          decode_step, generate, pad_left, release_decode_caches, round_up, sample_next,
                          with_matmuls_in, shares_prefix)
from mini.rollout import Rollout
from mini.test_model import hf_and_ours, left_padded


@torch.no_grad()
def test_cached_decoding_equals_full_forward():
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=3, n_head=4, n_embd=64, n_positions=64, vocab_size=97)).eval()
    ids, mask = left_padded(lengths=(12, 9, 5))
    ids = ids % 97
    full = m(ids, mask)
    cache = KVCache(m.config, 3, 16, "cpu", torch.float32)  # 16: columns never written must stay hidden
    steps = [m.lm_head(m.hidden(ids[:, :6], mask[:, :6], cache=cache))]
    for t in range(6, 12):  # the shortest row's first decoded tokens are still padding
        steps.append(m.lm_head(m.hidden(ids[:, t:t + 1], mask[:, t:t + 1], cache=cache)))
    real = mask.bool()
    assert (torch.cat(steps, 1) - full)[real].abs().max() <= 1e-5


def test_a_rollouts_rows_are_left_padded_prompts_then_completions_trimmed_per_micro_batch():
    """By hand, widths in buckets of 2: prompts end at column Tp, completions (EOS kept where the row stopped) start
    there; a micro-batch of one row keeps its own columns, and its prompt width counts from its first column."""
    r = Rollout([None] * 2, [[4, 5, 6], [1, 2]], [[9], [7, 7, 7]], ["", ""])
    r.pad(eos=0, max_new_tokens=3, device="cpu", bucket=2)
    assert r.Tp == 4 and r.comp_lens == [2, 3]
    assert r.ids.tolist() == [[0, 4, 5, 6, 9, 0, 0, 0], [0, 0, 1, 2, 7, 7, 7, 0]]
    assert r.mask.long().tolist() == [[0, 1, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 1, 0]]
    longer, shorter = [(mb.rows.tolist(), *mb.inputs(r)) for mb in r.micro_batches(1, 1, "cpu")]  # longest first
    assert longer[0] == [1] and longer[1].tolist() == [[1, 2, 7, 7, 7, 0]] and longer[3] == 2
    assert shorter[0] == [0] and shorter[1].tolist() == [[0, 4, 5, 6, 9, 0]] and shorter[3] == 4


def fp64_model(vocab=97, std=0.3):
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=2, n_head=4, n_embd=32, n_positions=128, vocab_size=vocab)).double().eval()
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0, std)  # varied tokens, attention far from uniform
    return m


@pytest.mark.parametrize("groups", [(16, 16, 1), (1, 1, 1, 1)])  # K = 16 beside K = 1; K = 1 alone (evaluation)
@torch.no_grad()
def test_shared_prefix_cache_equals_per_row_attention(groups):
    """Decode logits through SharedPrefixCache (each prompt's keys once, its rows' completions interleaved after
    them, one masked attention per prompt, completion columns read in width buckets) equal those of per-row
    KVCache copies, in fp64, over enough tokens to cross width buckets; prompts of mixed lengths, so left
    padding; rows of a group in any order."""
    m = fp64_model()
    g = torch.Generator().manual_seed(0)
    lengths = (9, 3, 6, 1)[:len(groups)]
    distinct = [torch.randint(0, 97, (n,), generator=g).tolist() for n in lengths]
    prompt_of = [u for u, k in enumerate(groups) for _ in range(k)]
    prompt_of = [prompt_of[i] for i in torch.randperm(len(prompt_of), generator=g)]  # groups interleaved
    ids, mask = pad_left(distinct, 96, "cpu")
    prefill = KVCache(m.config, len(distinct), ids.shape[1], "cpu", torch.float64)
    first = m.lm_head(m.hidden(ids, mask, cache=prefill)[:, -1])
    steps, N = 40, len(prompt_of)
    per_row = KVCache(m.config, N, ids.shape[1] + steps, "cpu", torch.float64)
    per_row.load(prefill, torch.tensor(prompt_of))
    shared = SharedPrefixCache(m.config, len(distinct), ids.shape[1], max(groups), N, steps, "cpu", torch.float64)
    shared.start(prefill, prompt_of)
    tok = first[prompt_of].argmax(-1)
    for t in range(steps):
        shared.width = min(-(-(t + 1) // 16) * 16, steps)
        want, got = decode_step(m, per_row, tok), decode_step(m, shared, tok)
        assert (got - want).abs().max() <= 1e-12, t
        tok = torch.randint(0, 97, (N,), generator=g)  # arbitrary continuations: every row differs


@pytest.mark.parametrize("shared", [True, False])
@torch.no_grad()
def test_a_reused_decode_cache_forgets_the_last_calls_prompts_and_tokens(shared):
    """The compiled decode keeps one cache per shape bucket across calls: loaded again with shorter prompts, it
    decodes as a new cache does (the last call's prompt columns, completion columns and counters hidden or reset)."""
    m = fp64_model()
    g = torch.Generator().manual_seed(0)
    prompt_of = [0, 0, 1]

    def start(cache, lengths):
        ids, mask = pad_left([torch.randint(0, 97, (n,), generator=g).tolist() for n in lengths], 96, "cpu")
        prefill = KVCache(m.config, 2, ids.shape[1], "cpu", torch.float64)
        m.hidden(ids, mask, cache=prefill)
        if shared:
            cache.start(prefill, prompt_of)
        else:
            cache.load(prefill, torch.tensor(prompt_of))

    reused, fresh = ((SharedPrefixCache(m.config, 2, 9, 2, 3, 8, "cpu", torch.float64) if shared else
                      KVCache(m.config, 3, 9 + 8, "cpu", torch.float64)) for _ in range(2))
    start(reused, (9, 7))
    for _ in range(6):
        decode_step(m, reused, torch.randint(0, 97, (3,), generator=g))
    state = g.get_state()
    start(reused, (3, 2))
    g.set_state(state)
    start(fresh, (3, 2))
    for t in range(6):
        tok = torch.randint(0, 97, (3,), generator=g)
        assert (decode_step(m, reused, tok) - decode_step(m, fresh, tok)).abs().max() <= 1e-12, t


@pytest.mark.parametrize("temperature", [0, 0.8])
@torch.no_grad()
def test_generate_with_shared_prefix_gives_the_per_row_tokens(temperature):
    m = fp64_model(std=0.1)
    prompts = [[1, 2, 3, 4, 5, 6]] * 16 + [[7, 8]] * 16 + [[9, 10, 11]]
    run = lambda shared: generate(m, prompts, 30, temperature, eos_id=96, shared_prefix=shared,
                                  generator=torch.Generator().manual_seed(3))
    per_row, shared = run(False), run(True)
    assert [t for t, _ in shared] == [t for t, _ in per_row]
    for (_, a), (_, b) in zip(per_row, shared):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)  # fp32 log-probs
    assert len({x for t, _ in per_row for x in t}) > 5 and sum(len(t) for t, _ in per_row) > 500  # not degenerate


@pytest.mark.parametrize("shared_prefix", [True, False])
@torch.no_grad()
def test_dropping_finished_rows_keeps_every_rows_tokens(shared_prefix, monkeypatch):
    """Eager decode drops finished rows from its cache as they come (several times a call here): in fp64, every
    row's tokens and log-probs equal those of a decode that keeps all rows to the end; groups of K = 8 and 1,
    prompts of mixed lengths."""
    m = fp64_model(std=0.1)
    m.transformer.ln_f.weight[0], m.transformer.ln_f.bias[0] = 0.0, 1.0  # dimension 0 of h is 1: wte[:, 0] a bias
    m.transformer.wte.weight[96, 0] = 2.5  # EOS ~11% a token: rows stop at varied lengths
    prompts = [[1, 2, 3, 4, 5, 6]] * 8 + [[7, 8]] * 8 + [[9, 10, 11]]
    cache = SharedPrefixCache if shared_prefix else KVCache
    kept, keep = [], cache.keep
    monkeypatch.setattr(cache, "keep", lambda self, rows, *a: (kept.append(len(rows)), keep(self, rows, *a))[1])
    run = lambda drop: generate(m, prompts, 40, 0.9, eos_id=96, shared_prefix=shared_prefix, drop_finished=drop,
                                generator=torch.Generator().manual_seed(5))
    dropped = run(True)
    assert len(kept) >= 2 and kept == sorted(kept, reverse=True) and kept[-1] < len(prompts) // 2
    full = run(False)
    assert len(kept) == len(set(kept))  # no drop without drop_finished
    assert [t for t, _ in dropped] == [t for t, _ in full]
    for (_, a), (_, b) in zip(dropped, full):
        assert torch.allclose(a, b, atol=1e-6, rtol=0)  # fp32 log-probs
    assert len({len(t) for t, _ in full}) > 5 and max(len(t) for t, _ in full) > 16  # stops spread over the call


def test_the_decode_cache_left_to_the_device_is_shared_on_the_cpu_and_per_row_on_cuda(monkeypatch):
    """shared_prefix=None (the Config's default): a shared prefix on the CPU, a copy per row on CUDA (the faster on
    each, README "Speed"); True and False are kept on both. generate on the CPU builds the cache so chosen."""
    for device in ("cpu", torch.device("cpu"), "cuda", "cuda:1", torch.device("cuda", 0)):
        on_cuda = torch.device(device).type == "cuda"
        assert shares_prefix(None, device) is (not on_cuda)
        assert shares_prefix(True, device) is True and shares_prefix(False, device) is False
    built = []
    for cache in (SharedPrefixCache, KVCache):
        init = cache.__init__
        monkeypatch.setattr(cache, "__init__", lambda self, *a, _c=cache, _i=init: (built.append(_c), _i(self, *a))[1])
    for setting, decode in ((None, SharedPrefixCache), (True, SharedPrefixCache), (False, KVCache)):
        built.clear()
        generate(fp64_model(std=0.1), [[1, 2, 3]] * 4, 3, 0.9, eos_id=96, shared_prefix=setting)
        assert built == [KVCache, decode]  # the prefill's cache, then the decode's


def test_sample_next_gives_the_tokens_of_the_fp32_copy_sampler():
    """In fp64, the sampler without a vocabulary-wide fp32 copy (softmax of the given dtype, no divide at
    temperature 1) draws the tokens of the earlier one: log_softmax(logits.float() / T), exp, cumsum."""
    g = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(512, 1000, generator=g, dtype=torch.float64)
    u = torch.rand(512, generator=g, dtype=torch.float64)
    for temperature, top_k in ((1.0, 0), (0.7, 0), (1.0, 50)):
        x = logits / temperature
        if top_k:
            x = x.masked_fill(x < x.topk(top_k, -1).values[:, -1:], float("-inf"))
        logp = F.log_softmax(x, -1)
        cdf = logp.exp().cumsum(-1)
        want = torch.searchsorted(cdf, u[:, None] * cdf[:, -1:], right=True)[:, 0]
        nxt, lp = sample_next(logits, temperature, top_k, u=u)
        assert torch.equal(nxt, want)
        assert torch.allclose(lp, logp.gather(1, want[:, None])[:, 0], atol=1e-12, rtol=0)


def test_sample_next_of_bf16_logits_computes_in_fp32():
    """Under bf16 autocast the logits come in bf16: the softmax, its running sum and the log-probs must be fp32
    (a bf16 cdf over 50,257 tokens has long runs of equal values, and only their last token can be drawn), so
    the tokens and log-probs are those of the logits copied to fp32, sampled and greedy."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(256, 50257, generator=g).bfloat16()
    u = torch.rand(256, generator=g)
    for temperature, top_k in ((1.0, 0), (1.0, 15), (0, 0)):
        nxt, lp = sample_next(logits, temperature, top_k, u=u)
        want, want_lp = sample_next(logits.float(), temperature, top_k, u=u)
        assert lp.dtype == torch.float32 and torch.equal(nxt, want) and torch.equal(lp, want_lp), (temperature, top_k)


@torch.no_grad()
def test_greedy_generate_equals_transformers():
    hf, ours = hf_and_ours(n_layer=4, n_head=4, n_embd=128, n_positions=256, std=0.3)  # large std: varied tokens
    ids, mask = left_padded(seed=3, lengths=(15, 9, 4))
    ref = hf.generate(ids, attention_mask=mask, max_new_tokens=24, do_sample=False, pad_token_id=50256,
                      eos_token_id=50256)[:, ids.shape[1]:].tolist()
    prompts = [row[m.bool()].tolist() for row, m in zip(ids, mask)]
    got = generate(ours, prompts, max_new_tokens=24, temperature=0)
    for (toks, _), want in zip(got, ref):
        want = want[:want.index(50256)] if 50256 in want else want
        assert toks == want
    assert len({tuple(t) for t, _ in got}) == 3 and all(len(t) > 5 for t, _ in got)  # not a degenerate case


@torch.no_grad()
def test_generate_logprobs_and_groups():
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=50)).eval()
    for p in m.parameters():
        p.mul_(20)  # peaked distributions so EOS (id 49) and top-k matter
    prompts = [[1, 2, 3]] * 4 + [[7, 8]] * 4
    g = torch.Generator().manual_seed(0)
    out = generate(m, prompts, max_new_tokens=16, temperature=0.7, top_k=5, eos_id=49, generator=g)
    for prompt, (toks, logp) in zip(prompts, out):
        assert 49 not in toks and len(toks) == len(logp) <= 16
        seq = torch.tensor([prompt + toks])
        logits = m(seq)[0, len(prompt) - 1:-1] / 0.7  # logits that predicted each sampled token
        kth = logits.topk(5, dim=-1).values[:, -1:]
        ref = torch.log_softmax(logits.masked_fill(logits < kth, float("-inf")), -1)
        assert torch.allclose(logp, ref.gather(1, torch.tensor(toks)[:, None])[:, 0], atol=1e-4)
    again = generate(m, prompts, max_new_tokens=16, temperature=0.7, top_k=5, eos_id=49,
                     generator=torch.Generator().manual_seed(0))
    assert [t for t, _ in again] == [t for t, _ in out]  # seeded sampling is reproducible


def test_sample_next_follows_the_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -30.0]]).repeat(40000, 1)
    g = torch.Generator().manual_seed(0)
    for temperature, top_k in ((1.0, 0), (0.5, 0), (1.0, 2)):
        nxt, logp = sample_next(logits, temperature, top_k, g)
        scaled = logits[0] / temperature
        if top_k:
            scaled[top_k:] = float("-inf")
        p = torch.softmax(scaled, -1)
        freq = torch.bincount(nxt, minlength=5).float() / len(nxt)
        assert (freq - p).abs().max() < 0.01  # 40,000 draws: standard error < 0.0025
        assert torch.allclose(logp, p.log()[nxt])
    assert torch.equal(sample_next(logits[:3], 0)[0], torch.zeros(3, dtype=torch.long))  # greedy


def test_sample_next_draws_the_inverse_cdf_of_the_generators_uniforms():
    """Without u, sample_next draws one uniform per row from the generator it is given, not from the global RNG (a
    caller's seed decides the tokens): by hand, the token where the running sum of softmax first exceeds u."""
    logits = torch.tensor([[0.0, 1.0, 2.0]]).repeat(64, 1)
    u = torch.rand(64, generator=torch.Generator().manual_seed(7))
    torch.manual_seed(0)  # the global RNG holds other numbers
    nxt, logp = sample_next(logits, 1.0, 0, torch.Generator().manual_seed(7))
    p = torch.softmax(logits[0], -1)
    want = (p.cumsum(-1)[None, :] <= u[:, None]).sum(1)
    assert torch.equal(nxt, want) and set(want.tolist()) == {0, 1, 2}
    assert torch.allclose(logp, p.log()[want])


def test_sample_next_never_draws_a_token_of_probability_0():
    """torch.rand's draws run from exactly 0 to 1 - 2^-24: at either end a token that top_k gave p = 0 (before
    the first token of positive p, after the last) must not be drawn; the log-prob stays finite."""
    logits = torch.tensor([[-1.0, -30.0, 3.0, 2.0, -40.0]])
    for u in (0.0, 1 - 2 ** -24):
        nxt, logp = sample_next(logits, 1.0, 2, u=torch.tensor([u]))
        assert nxt.item() in (2, 3) and torch.isfinite(logp).all(), (u, nxt)
    # seven kept probabilities whose fp32 running sum ends at 1 - 2^-23, below the largest u: u is scaled to
    # the sum, so the draw still lands on a kept token, not past them on the last one, which top_k dropped
    logits = torch.tensor([[0.7649482, 5.4127455, -1.3507125, -1.4490962, 1.9731227, 2.8159699, 3.3951921, -50.0]])
    assert torch.softmax(logits[:, :7], -1).cumsum(-1)[0, -1] < 1 - 2 ** -24
    nxt, logp = sample_next(logits, 1.0, 7, u=torch.tensor([1 - 2 ** -24]))
    assert nxt.item() == 6 and torch.isfinite(logp).all()


def test_generate_rejects_too_long_requests_and_empty_prompts():
    m = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, n_positions=16, vocab_size=20)).eval()
    with pytest.raises(PromptTooLong, match="positions"):  # train.py turns PromptTooLong into one sentence
        generate(m, [[1] * 10], max_new_tokens=10, eos_id=19)
    with pytest.raises(PromptTooLong, match="needs 17 positions but the model has 16"):
        generate(m, [[1] * 7, [2]], max_new_tokens=10, eos_id=19)
    (toks, _), = generate(m, [[1] * 6], max_new_tokens=10, eos_id=19)  # exactly n_positions: allowed
    assert len(toks) <= 10
    with pytest.raises(ValueError, match="generate got an empty prompt; every prompt needs at least one token"):
        generate(m, [[1, 2], []], max_new_tokens=2, eos_id=19)  # else its row would start from a padding column


@pytest.mark.parametrize("kwargs, match", [({"temperature": -0.5}, "temperature >= 0"),
                                           ({"max_new_tokens": -1}, "max_new_tokens >= 0"),
                                           ({"stop_check_every": 0}, "stop_check_every >= 1"),
                                           ({"prompts": [[1, 20]]}, "outside the model's vocabulary of 20"),
                                           ({"prompts": [[-1]]}, "outside the model's vocabulary of 20"),
                                           ({"eos_id": 20}, "eos_id 20, outside the model's vocabulary of 20"),
                                           ({"eos_id": -1}, "eos_id -1, outside the model's vocabulary of 20")])
def test_generate_rejects_bad_settings_and_tokens_in_one_sentence(kwargs, match):
    """A negative temperature was silently greedy, stop_check_every 0 a ZeroDivisionError, a token past the
    vocabulary an IndexError deep in the embedding; so was an eos_id past it, which pads the prompts."""
    m = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, n_positions=16, vocab_size=20)).eval()
    with pytest.raises(ValueError, match=match):
        generate(m, **{"prompts": [[1, 2]], "max_new_tokens": 3, "eos_id": 19, **kwargs})


@pytest.mark.parametrize("temperature", [0, 0.9])
def test_generate_of_no_prompts_or_no_new_tokens_is_empty(temperature):
    """No prompts: no completions; a budget of 0 tokens: an empty completion per prompt (sampling raised an
    IndexError on the uniforms of its first token)."""
    m = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, n_positions=16, vocab_size=20)).eval()
    assert generate(m, [], 3, temperature, eos_id=19) == []
    out = generate(m, [[1, 2], [3]], 0, temperature, eos_id=19)
    assert [(toks, lp.shape, lp.dtype) for toks, lp in out] == [([], (0,), torch.float32)] * 2


def uniform_model(vocab, eos_id, eos_logit=-1e4, n_positions=16):
    """A model whose every next-token distribution is uniform over the tokens but EOS, whose logit is eos_logit:
    zero weights, and ln_f's output 1 in dimension 0, where only EOS's (tied) embedding is non-zero."""
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=8, n_positions=n_positions, vocab_size=vocab)).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.zero_()
        m.transformer.ln_f.bias[0] = 1.0
        m.transformer.wte.weight[eos_id, 0] = eos_logit
    return m


@torch.no_grad()
def test_generate_draws_each_token_independently():
    """Uniform over 3 tokens, 3000 rows of one prompt: every token and every pair of consecutive tokens of a row is
    uniform (1/3, 1/9), so no uniform number is reused across steps or rows; each log-prob is log(1/3)."""
    m = uniform_model(vocab=4, eos_id=3)
    out = generate(m, [[0, 1, 2]] * 3000, max_new_tokens=4, temperature=0.9, eos_id=3, shared_prefix=False,
                   generator=torch.Generator().manual_seed(0))  # per-row cache: 3000 slots of one prompt are slow
    toks = torch.tensor([t for t, _ in out])  # (3000, 4): EOS is never drawn
    logp = torch.stack([lp for _, lp in out])
    assert toks.shape == (3000, 4) and torch.allclose(logp, torch.full_like(logp, -1.0986123), atol=1e-5)
    for t in range(4):
        assert (torch.bincount(toks[:, t], minlength=3) / 3000 - 1 / 3).abs().max() < 0.03, t
    pairs = torch.bincount((3 * toks[:, :-1] + toks[:, 1:]).flatten(), minlength=9) / 9000
    assert (pairs - 1 / 9).abs().max() < 0.02, pairs


@pytest.mark.parametrize("shared_prefix", [True, False])
@torch.no_grad()
def test_generate_draws_the_inverse_cdf_of_a_full_forward(shared_prefix):
    """Each row's tokens and log-probs are those of a naive loop: a full forward of prompt + tokens so far (no
    cache), logits / T cut to the top k, and the token where the running sum of its softmax first exceeds
    u[t, row] times the total, u = torch.rand(max_new_tokens, rows) of the seeded generator; stops at EOS.
    fp64; groups of 3 and 2 and a single prompt, a group's rows apart, rows that stop early and are dropped."""
    m = fp64_model(std=0.1)
    m.transformer.ln_f.weight[0], m.transformer.ln_f.bias[0] = 0.0, 1.0  # dimension 0 of h is 1: wte[:, 0] a bias
    m.transformer.wte.weight[96, 0] = 1.0  # EOS now and then: rows stop after 0 to 11 tokens
    prompts = [[1, 2, 3, 4, 5, 6]] * 3 + [[7, 8]] * 2 + [[9, 10, 11], [1, 2, 3, 4, 5, 6]]
    T, k, n = 0.7, 20, 25
    u = torch.rand(n, len(prompts), generator=torch.Generator().manual_seed(4))
    got = generate(m, prompts, n, T, top_k=k, eos_id=96, shared_prefix=shared_prefix, stop_check_every=1,
                   generator=torch.Generator().manual_seed(4))
    for i, (prompt, (toks, logp)) in enumerate(zip(prompts, got)):
        seq, want = list(prompt), []
        for t in range(n):
            x = m(torch.tensor([seq]))[0, -1] / T
            p = torch.softmax(x.masked_fill(x < x.topk(k).values[-1], float("-inf")), -1)
            cdf = p.cumsum(-1)
            tok = int((cdf <= u[t, i] * cdf[-1]).sum())
            if tok == 96:
                break
            seq.append(tok)
            want.append(p[tok].log().item())
        assert toks == seq[len(prompt):], i
        assert torch.allclose(logp.double(), torch.tensor(want, dtype=torch.float64), atol=1e-6, rtol=0), i
    lens = [len(t) for t, _ in got]
    assert min(lens) < 3 and max(lens) > 7 and len(set(map(tuple, (t for t, _ in got)))) == len(prompts)


@torch.no_grad()
def test_generate_stops_at_gpt2s_eos_by_default():
    """Without eos_id, generation stops at GPT-2's <|endoftext|>, id 50256."""
    m = uniform_model(vocab=50257, eos_id=50256, eos_logit=100.0)  # EOS certain
    assert [(t, lp.tolist()) for t, lp in generate(m, [[1, 2, 3], [4]], max_new_tokens=5)] == [([], []), ([], [])]


@torch.no_grad()
def test_greedy_generate_logprobs_are_those_of_the_untempered_distribution():
    """temperature 0: the argmax tokens, each with its log-prob under softmax(logits) (generate's docstring)."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=50)).eval()
    for p in m.parameters():
        p.mul_(20)
    prompts = [[1, 2, 3], [7, 8]]
    for prompt, (toks, logp) in zip(prompts, generate(m, prompts, max_new_tokens=12, temperature=0, eos_id=40)):
        logits = m(torch.tensor([prompt + toks]))[0, len(prompt) - 1:-1]
        assert toks == logits.argmax(-1).tolist() and len(toks) > 3
        assert torch.allclose(logp, torch.log_softmax(logits, -1).gather(1, torch.tensor(toks)[:, None])[:, 0], atol=1e-4)
        assert (logp < -1e-3).any()  # not a degenerate case: log-probs of 0


def test_sample_next_top_k_keeps_the_tokens_tied_with_the_kth():
    """top_k 2 of [3, 2, 2, 2, 0]: the three tied at the second logit all stay, as transformers'
    TopKLogitsWarper keeps them (a mask by the k-th value), and each log-prob is of that distribution."""
    logits = torch.tensor([[3.0, 2.0, 2.0, 2.0, 0.0]]).repeat(40000, 1)
    nxt, logp = sample_next(logits, 1.0, 2, torch.Generator().manual_seed(0))
    p = torch.softmax(torch.tensor([3.0, 2.0, 2.0, 2.0, float("-inf")]), -1)
    freq = torch.bincount(nxt, minlength=5).float() / len(nxt)
    assert (freq - p).abs().max() < 0.01 and freq[4] == 0
    assert torch.allclose(logp, p.log()[nxt])


def test_sample_next_at_top_k_1_or_temperature_0_takes_the_argmax():
    """top_k 1 leaves one token, drawn with log-prob 0, whatever the uniform; temperature 0 is greedy whatever
    top_k, with the log-prob of the untempered softmax."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 30, generator=g, dtype=torch.float64)
    best = logits.argmax(-1)
    nxt, logp = sample_next(logits, 0.8, top_k=1, u=torch.rand(64, generator=g))
    assert torch.equal(nxt, best) and torch.equal(logp, torch.zeros(64, dtype=torch.float64))
    nxt, logp = sample_next(logits, 0, top_k=5)
    assert torch.equal(nxt, best) and torch.allclose(logp, logits.log_softmax(-1).max(-1).values, atol=1e-12, rtol=0)


def test_sample_next_at_a_uniform_of_exactly_1_draws_the_last_token():
    """A caller's uniforms may reach 1 (torch.rand's do not): u * total is then the cdf's last value, which
    searchsorted(right=True) puts past the vocabulary; the draw is the last token, with its log-prob."""
    logits = torch.tensor([[0.5, -1.0, 2.0, 0.0], [1.0, 1.0, 1.0, 1.0]], dtype=torch.float64)
    nxt, logp = sample_next(logits, 1.0, u=torch.ones(2, dtype=torch.float64))
    assert nxt.tolist() == [3, 3] and torch.allclose(logp, logits.log_softmax(-1)[:, 3], atol=1e-12, rtol=0)


def test_sample_next_top_k_beyond_the_vocabulary_is_no_restriction():
    """top_k larger than the vocabulary keeps every token (no error from topk)."""
    g = torch.Generator().manual_seed(0)
    logits, u = torch.randn(6, 5, generator=g), torch.rand(6, generator=g)
    for got, want in zip(sample_next(logits, 0.8, top_k=10, u=u), sample_next(logits, 0.8, top_k=0, u=u)):
        assert torch.equal(got, want)


@pytest.fixture(scope="module")
def peaked():
    """A tiny model with peaked distributions (clear argmax, varied tokens); one layer: Inductor on CPU
    compiles slowly (the eager tests cover several layers)."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, n_positions=64, vocab_size=97)).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(4)
    return m


PROMPTS = [[1, 2, 3, 4, 5]] * 2 + [[7, 8], [9, 10, 11], [40]]  # a group, ragged lengths; 5 rows: 3 dummies


def assert_same_decoding(eager, compiled, atol=1e-5):
    assert [t for t, _ in compiled] == [t for t, _ in eager]
    for (_, a), (_, b) in zip(eager, compiled):
        assert torch.allclose(a, b, atol=atol, rtol=0)
    assert len({tuple(t) for t, _ in eager}) >= 3 and sum(len(t) for t, _ in eager) > 30  # not degenerate


@torch.no_grad()
def test_compiled_decode_equals_eager_greedy(peaked):
    eager = generate(peaked, PROMPTS, 20, temperature=0, eos_id=78)  # eos_id 78: two rows stop early
    assert_same_decoding(eager, generate(peaked, PROMPTS, 20, temperature=0, eos_id=78, compile_decode=True))
    # other prompts, fewer rows and tokens: the same buckets, so the compiled step is reused as it is
    with torch._dynamo.config.patch(error_on_recompile=True):
        prompts = [[3, 1, 4, 1, 5, 9, 2], [6, 5]] * 2 + [[8]]  # 3 prompts of <= 2 rows: the buckets of PROMPTS
        assert_same_decoding(generate(peaked, prompts, 12, temperature=0, eos_id=78),
                             generate(peaked, prompts, 12, temperature=0, eos_id=78, compile_decode=True))


@pytest.mark.parametrize("shared_prefix", [True, False])
@torch.no_grad()
def test_compiled_decode_equals_eager_sampled(peaked, shared_prefix):
    run = lambda **kw: generate(peaked, PROMPTS, 20, temperature=0.8, top_k=10, eos_id=72, shared_prefix=shared_prefix,
                                generator=torch.Generator().manual_seed(1), **kw)  # 72: stops after 10 to 20 tokens
    assert_same_decoding(run(), run(compile_decode=True))


def test_the_compiled_decodes_model_casts_its_matmuls_once_and_follows_the_weights():
    """Under bf16 autocast the compiled step runs a copy whose Linear weights are bf16 (a graph would cast the
    fp32 ones at every token), sharing the embeddings and LayerNorms: bitwise the model's outputs, before
    and after an optimizer step, which the copy follows in place (the addresses a CUDA graph holds)."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=97))
    assert with_matmuls_in(m, torch.float32) is m
    d = with_matmuls_in(m, torch.bfloat16)
    assert d is not m and with_matmuls_in(m, torch.bfloat16) is d
    assert d.transformer.wte.weight is m.transformer.wte.weight and d.transformer.h[1].ln_2.bias is m.transformer.h[1].ln_2.bias
    linears = [x for x in d.modules() if isinstance(x, torch.nn.Linear)]
    assert len(linears) == 9 and all(p.dtype == torch.bfloat16 for x in linears for p in x.parameters())
    ids = torch.tensor([[5, 9, 2, 7, 1, 3]])
    outputs = lambda model: model(ids)
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        before = outputs(m)
        assert torch.equal(outputs(d), before)
    addresses = [p.data_ptr() for p in d.parameters()]
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    m(ids).logsumexp(-1).mean().backward()
    opt.step()
    assert with_matmuls_in(m, torch.bfloat16) is d and [p.data_ptr() for p in d.parameters()] == addresses
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        after = outputs(m)
        assert not torch.equal(after, before) and torch.equal(outputs(d), after)
    m.load_state_dict(GPT(m.config).state_dict())  # a rollback, a resume
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        assert torch.equal(outputs(with_matmuls_in(m, torch.bfloat16)), outputs(m))


def test_the_compiled_decodes_copy_follows_a_change_of_dtype():
    """with_matmuls_in keeps one copy per model: asked for fp16 after bf16, its Linear weights are fp16, not the bf16
    copy's (an autocast dtype changed between calls)."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, n_positions=16, vocab_size=20))
    for dtype in (torch.bfloat16, torch.float16):
        linears = [x for x in with_matmuls_in(m, dtype).modules() if isinstance(x, torch.nn.Linear)]
        assert len(linears) == 5 and all(p.dtype == dtype for x in linears for p in x.parameters()), dtype


def test_round_up_keeps_exact_multiples_and_rounds_the_others_up():
    """round_up sizes the width buckets and the compiled caches: an exact multiple stays, one past goes up."""
    assert [round_up(n, 16) for n in (1, 15, 16, 17, 32, 33)] == [16, 16, 16, 32, 32, 48]


@pytest.mark.parametrize("shared_prefix", [True, False])
@torch.no_grad()
def test_the_compiled_decode_keeps_one_cache_per_shape_bucket_across_calls(shared_prefix, monkeypatch):
    """compile_decode's caches, one per bucket, live across calls: rows, prompts and group sizes rounded up to a power
    of two (5 rows -> 8, 4 -> 4; 3 prompts -> 4; groups of 3 -> 4, of 2 -> 2), columns to a multiple of 64 but never
    past n_positions (prompts of 65 to 70 tokens: 100), keys in the autocast dtype. A call drops no row from them (a
    CUDA graph holds their addresses), other prompts of a bucket reuse its cache, and every call's tokens and
    log-probs are the eager decode's (the dummy rows draw no uniforms). release_decode_caches drops them. The step
    runs eagerly here: the buckets are under test, not Inductor."""
    monkeypatch.setitem(_compiled_steps, None, decode_step)
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, n_positions=100, vocab_size=50)).double().eval()
    for p in m.parameters():
        p.normal_(0, 0.3)
    run = lambda prompts, **kw: generate(m, prompts, 12, 0.9, eos_id=49, shared_prefix=shared_prefix,
                                         generator=torch.Generator().manual_seed(0), **kw)
    seq = lambda first, n: [(first + i) % 48 for i in range(n)]
    five, four = [seq(0, 70)] * 3 + [seq(5, 66), seq(9, 65)], [seq(0, 70)] * 2 + [seq(5, 66), seq(9, 65)]
    for prompts in (five, four, [seq(20, 68)] * 3 + [seq(3, 67), seq(30, 69)]):  # the last in five's buckets
        eager, got = run(prompts), run(prompts, compile_decode=True)
        assert [t for t, _ in got] == [t for t, _ in eager] and len({tuple(t) for t, _ in eager}) == len(prompts)
        for (_, a), (_, b) in zip(eager, got):
            assert torch.allclose(a, b, atol=1e-6, rtol=0)
    # (rows, the keys' rows, prompt columns, all columns): 8 or 4 rows; shared, 4 prompts of 100 + G x 64 columns
    want = [(8, 4, 100, 100 + 4 * 64), (4, 4, 100, 100 + 2 * 64)] if shared_prefix \
        else [(8, 8, 100, 100), (4, 4, 100, 100)]
    assert [(c.rows, c.k[0].shape[0], c.key_mask.shape[1], c.k[0].shape[2]) for c in _caches[m].values()] == want
    assert all(c.k[0].dtype == torch.float64 for c in _caches[m].values())
    release_decode_caches(m)
    assert m not in _caches
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, n_positions=100, vocab_size=50)).eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        generate(m, five, 3, 0.9, eos_id=49, shared_prefix=shared_prefix, compile_decode=True)
    assert [c.k[0].dtype for c in _caches[m].values()] == [torch.bfloat16]


@torch.no_grad()
def test_compiled_decode_under_bf16_autocast_equals_eager(peaked):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager = generate(peaked, PROMPTS, 20, temperature=0, eos_id=78)
        assert_same_decoding(eager, generate(peaked, PROMPTS, 20, temperature=0, eos_id=78, compile_decode=True), atol=0.02)
    assert _matmul_copies[peaked][2] == torch.bfloat16  # the step ran on the copy


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: CUDA graphs via mode=reduce-overhead")
@torch.no_grad()
def test_cuda_graph_decode_equals_eager_in_bf16(peaked):
    m = copy.deepcopy(peaked).cuda()
    with torch.autocast("cuda", dtype=torch.bfloat16), torch._inductor.config.patch("triton.cudagraph_or_error", True):
        eager = generate(m, PROMPTS, 20, temperature=0, eos_id=96)
        for _ in range(3):  # warm-up, recording, replay
            compiled = generate(m, PROMPTS, 20, temperature=0, eos_id=96, compile_decode=True)
            assert [t for t, _ in compiled] == [t for t, _ in eager]
    assert all(k.dtype == torch.bfloat16 for c in _caches[m].values() for k in c.k)  # the autocast dtype


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: CUDA graphs via mode=reduce-overhead")
@torch.no_grad()
def test_cuda_graph_sampled_decode_at_the_real_vocabulary():
    """Sampling at GPT-2's 50257 tokens and a batch of 64: the shape where Inductor once failed to build a
    fused softmax + cumsum kernel (sampling now stays outside the compiled step)."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=64, n_positions=64)).cuda().eval()
    prompts = [[1, 2, 3]] * 32 + [[4, 5]] * 32
    with torch.autocast("cuda", dtype=torch.bfloat16):
        run = lambda **kw: generate(m, prompts, 8, temperature=1.0, generator=torch.Generator("cuda").manual_seed(0), **kw)
        eager, compiled = run(), run(compile_decode=True)
    assert [t for t, _ in compiled] == [t for t, _ in eager]


def test_a_compiled_function_keeps_a_graph_for_each_of_many_shapes(monkeypatch):
    """compiled() makes room for more graphs than dynamo's default of 8 a function: 12 shapes, 12 graphs, none
    run eagerly past the limit (dynamo's eager backend: no C compiler needed)."""
    from torch._dynamo.utils import counters
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 8)  # the default, whatever ran before
    f = compiled(lambda x: x * 2, backend="eager", dynamic=False)
    before = counters["stats"]["unique_graphs"]
    for n in range(1, 13):
        assert torch.equal(f(torch.ones(n)), torch.full((n,), 2.0))
    assert counters["stats"]["unique_graphs"] - before == 12


if __name__ == "__main__":
    import sys
    sys.exit(pytest.main([__file__, "-q"]))
