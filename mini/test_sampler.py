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

from mini.sampler import (KVCache, SharedPrefixCache, _caches, _matmul_copies, compiled, decode_step, generate, pad_left,
                          sample_next, with_matmuls_in,
                          shares_prefix)
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
    with pytest.raises(ValueError, match="positions"):
        generate(m, [[1] * 10], max_new_tokens=10)
    with pytest.raises(ValueError, match="needs 17 positions but the model has 16"):
        generate(m, [[1] * 7, [2]], max_new_tokens=10)
    (toks, _), = generate(m, [[1] * 6], max_new_tokens=10, eos_id=19)  # exactly n_positions: allowed
    assert len(toks) <= 10
    with pytest.raises(ValueError, match="generate got an empty prompt; every prompt needs at least one token"):
        generate(m, [[1, 2], []], max_new_tokens=2)  # else its row would start from a padding column


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
