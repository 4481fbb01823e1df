"""GPT-2 against transformers.GPT2LMHeadModel: logits, left padding; the shared-prefix forward against the plain one.

    python mini/test_model.py
"""
import tempfile

import pytest
import torch
import torch.nn.functional as F

from mini.loader import load_model
from mini.model import GPT, GPTConfig, causal_mask

transformers = pytest.importorskip("transformers", reason="transformers is the reference implementation")


def hf_and_ours(n_layer=12, n_head=12, n_embd=768, n_positions=1024, std=0.02, seed=0):
    """A random transformers GPT-2 and the same weights loaded into ours through its own save_pretrained."""
    torch.manual_seed(seed)
    cfg = transformers.GPT2Config(n_layer=n_layer, n_head=n_head, n_embd=n_embd, n_positions=n_positions,
                                  initializer_range=std, attn_implementation="eager")
    hf = transformers.GPT2LMHeadModel(cfg).eval()
    with tempfile.TemporaryDirectory() as d:
        hf.save_pretrained(d)
        ours, _ = load_model(d)
    return hf, ours


def left_padded(seed=1, lengths=(20, 13, 7)):
    g = torch.Generator().manual_seed(seed)
    T = max(lengths)
    ids = torch.randint(0, 50256, (len(lengths), T), generator=g)
    mask = torch.zeros(len(lengths), T, dtype=torch.long)
    for i, n in enumerate(lengths):
        mask[i, T - n:] = 1
        ids[i, :T - n] = 50256
    return ids, mask


@torch.no_grad()
def test_logits_match_transformers_at_124m():
    hf, ours = hf_and_ours()
    ids, mask = left_padded()
    assert (ours(ids[:1]) - hf(ids[:1]).logits).abs().max() <= 1e-4  # unpadded row
    pos = (mask.cumsum(-1) - 1).clamp(min=0)  # transformers needs explicit positions outside generate
    ref = hf(ids, attention_mask=mask, position_ids=pos).logits
    got = ours(ids, mask)
    real = mask.bool()
    assert (got - ref)[real].abs().max() <= 1e-4
    assert torch.isfinite(got).all()  # padding rows stay finite too


@torch.no_grad()
def test_logits_match_transformers_in_float64_with_any_padding():
    """A small GPT-2 with weights large enough that attention is far from uniform, in float64, against transformers
    to rounding: a row without a mask, and rows padded on the left, on the right and in the middle, with the
    positions that count real tokens only (transformers takes them explicitly)."""
    hf, ours = hf_and_ours(n_layer=2, n_head=4, n_embd=32, n_positions=32, std=0.3)
    hf, ours = hf.double(), ours.double()
    ids = torch.randint(0, 50256, (4, 12), generator=torch.Generator().manual_seed(0))
    assert (ours(ids[:1]) - hf(ids[:1]).logits).abs().max() <= 1e-10
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[1, :5], mask[2, 8:], mask[3, 3:6] = 0, 0, 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    ref = hf(ids, attention_mask=mask, position_ids=pos).logits
    assert (ours(ids, mask) - ref)[mask.bool()].abs().max() <= 1e-10


@torch.no_grad()
def test_padding_never_leaks_into_real_positions():
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=50)).eval()
    ids = torch.randint(0, 50, (1, 9))
    alone = m(ids)
    padded = torch.cat([torch.randint(0, 50, (1, 5)), ids], 1)  # arbitrary garbage as padding
    mask = torch.cat([torch.zeros(1, 5), torch.ones(1, 9)], 1)
    assert torch.allclose(m(padded, mask)[:, 5:], alone, atol=1e-5)


@pytest.mark.parametrize("checkpointing", [False, True])
def test_completion_hidden_equals_hidden_with_shared_prefixes(checkpointing):
    """Rows sharing a prompt (a GRPO group), prompts of other lengths, right-padded completions: the
    values and every parameter's gradient equal the plain forward's, in float64 to rounding."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=3, n_head=2, n_embd=32, n_positions=64, vocab_size=100)).double().train()
    m.grad_checkpointing = checkpointing
    ids = torch.randint(0, 100, (7, 20))
    mask = torch.ones(7, 20, dtype=torch.bool)
    ids[1:4] = ids[0]  # a group of 4
    ids[5] = ids[4]  # a group of 2, shorter prompt
    mask[4:6, :4] = False
    mask[6, :7] = False  # a prompt alone
    mask[1, 15:], mask[2, 12:], mask[4, 18:] = False, False, False  # completions that stopped early
    start = 9
    want = m.hidden(ids, mask)[:, start:]
    params = list(m.parameters())
    w = torch.randn_like(want)
    g_want = torch.autograd.grad((want * w).sum(), params, retain_graph=True)
    groups = (torch.tensor([0, 0, 0, 0, 1, 1, 2]), torch.tensor([0, 4, 6]))  # the caller's groups, or torch.unique's
    for got in (m.completion_hidden(ids, mask, start), m.completion_hidden(ids, mask, start, groups)):
        assert got.shape == want.shape and (got - want).abs().max() < 1e-12
        g_got = torch.autograd.grad((got * w).sum(), params)
        assert max((a - b).abs().max().item() for a, b in zip(g_got, g_want)) < 1e-11
    assert torch.equal(m.completion_hidden(ids, mask, 0), m.hidden(ids, mask))  # no prefix: the plain forward


def saved_bytes(loss_of):
    """Bytes of the tensors autograd keeps for the backward pass while loss_of() runs (what --grad_checkpointing
    and the chunked KL save: equal values and gradients, but not equal memory)."""
    total = 0

    def pack(t):
        nonlocal total
        total += t.numel() * t.element_size()
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss_of()
    return total


def test_grad_checkpointing_keeps_a_fraction_of_the_activations_in_training():
    """--grad_checkpointing recomputes each block in the backward pass when training: autograd keeps the blocks'
    inputs only (a thirteenth here, 4 layers), for the plain forward and the shared-prefix one; never in eval."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=4, n_head=2, n_embd=32, n_positions=64, vocab_size=100)).train()
    ids, mask = torch.randint(0, 100, (6, 30)), torch.ones(6, 30, dtype=torch.bool)
    forwards = (lambda: m.hidden(ids, mask).sum(), lambda: m.completion_hidden(ids, mask, 10).sum())
    full = [saved_bytes(f) for f in forwards]
    m.grad_checkpointing = True
    assert all(saved_bytes(f) < kept / 4 for f, kept in zip(forwards, full))
    with torch.no_grad():
        assert saved_bytes(forwards[0]) == 0 and saved_bytes(lambda: m.eval().hidden(ids, mask).sum()) == 0


def test_a_sequence_past_the_last_position_is_one_sentence():
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, n_positions=8, vocab_size=50))
    fits, mask = torch.zeros(2, 10, dtype=torch.long), torch.ones(2, 10)
    mask[:, :2] = 0  # left padding takes no position: 8 real tokens fit
    assert m.hidden(fits, mask).shape == (2, 10, 16) and m.completion_hidden(fits, mask, 4).shape == (2, 6, 16)
    one_over = fits[:, 1:]  # 9 real tokens: positions 0..8
    for run in (lambda: m.hidden(one_over), lambda: m.completion_hidden(one_over, torch.ones(2, 9), 4),
                lambda: m.completion_hidden(one_over, torch.ones(2, 9), 9)):  # no suffix: the prefix is too long
        with pytest.raises(ValueError, match="sequence needs position 8 but the model has 8"):
            run()


@torch.no_grad()
def test_no_columns_or_no_suffix_give_empty_hidden_states():
    """The edge shapes give what slicing the plain forward gives, not a reduction error in the position check:
    a batch of no columns, and a shared-prefix forward whose start is at or past the last column."""
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, n_positions=8, vocab_size=50)).eval()
    ids, mask = torch.randint(0, 50, (2, 5)), torch.ones(2, 5)
    assert m.hidden(ids[:, :0], mask[:, :0]).shape == (2, 0, 16)
    for start in (5, 7):
        assert m.completion_hidden(ids, mask, start).shape == m.hidden(ids, mask)[:, start:].shape == (2, 0, 16)


def test_causal_mask_by_hand():
    """Row 0 left-padded by 2, row 1 with a hole: a query sees the real keys up to its own column, and always
    itself (so a padding query has one key and its row stays finite on every attention backend)."""
    key_mask = torch.tensor([[False, False, True, True], [True, False, True, True]])
    got = causal_mask(torch.arange(4), key_mask)
    want = torch.tensor([[[1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 1, 1]],
                         [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]]], dtype=torch.bool)
    assert got.shape == (2, 1, 4, 4) and torch.equal(got[:, 0], want)
    # queries at columns 2, 3 over 4 keys (a decode step or a completion after its prefix): the same rows
    assert torch.equal(causal_mask(torch.arange(2, 4), key_mask)[:, 0], want[:, 2:])


def test_init_scales_the_residual_projections_by_depth():
    """GPT-2's init: weights N(0, 0.02), the residual projections (attn and mlp c_proj) N(0, 0.02 / sqrt(2 n_layer)),
    biases 0, LayerNorm 1 and 0: what a model made from scratch starts from."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=8, n_head=2, n_embd=64, n_positions=64, vocab_size=500))
    for name, p in m.named_parameters():
        if name.endswith("c_proj.weight"):
            assert abs(p.std().item() / (0.02 / 4) - 1) < 0.1, name  # 2 * 8 layers: 0.005
        elif "ln" in name:
            assert torch.equal(p, torch.ones_like(p) if name.endswith("weight") else torch.zeros_like(p)), name
        elif name.endswith("bias"):
            assert not p.any(), name
        else:
            assert abs(p.std().item() / 0.02 - 1) < 0.1, name


def test_adamw_is_fused_on_cuda_only():
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, n_positions=8, vocab_size=10))
    assert model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cuda").defaults["fused"] is True
    assert model.configure_optimizers(0.1, 1e-3, (0.9, 0.95), "cpu").defaults["fused"] is None


def test_configure_optimizers_takes_the_settings_and_the_extra_parameters():
    """AdamW gets the lr and betas it is given (--lr, --adam_beta1/2), and the extra (name, parameter) pairs, the value
    head, are trained with the model: its weight matrix decayed, its bias not."""
    model = GPT(GPTConfig(n_layer=1, n_head=1, n_embd=8, n_positions=8, vocab_size=10))
    head = torch.nn.Linear(8, 1)
    opt = model.configure_optimizers(0.1, 3e-4, (0.8, 0.9), "cpu", extra=head.named_parameters(prefix="value_head"))
    decay, no_decay = opt.param_groups
    assert all(g["lr"] == 3e-4 and g["betas"] == (0.8, 0.9) for g in opt.param_groups)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert any(p is head.weight for p in decay["params"]) and any(p is head.bias for p in no_decay["params"])


def test_the_default_config_is_gpt2_small():
    """GPTConfig() is GPT-2 124M with dropout off: in train mode dropout would make the policy's log-probs differ from
    the reference's and the sampler's, and a padded vocabulary (nanoGPT's 50304) samples tokens that decode to
    nothing."""
    assert GPTConfig() == GPTConfig(n_layer=12, n_head=12, n_embd=768, n_positions=1024, vocab_size=50257, dropout=0.0)


def test_cast_matmuls_casts_every_linear_and_unties_the_output_layer():
    """The reference's cast: every Linear's weight and bias in the matmul dtype, the output layer a frozen bf16 copy
    of the embedding, which (like the position embedding and the LayerNorms) stays fp32 and is not cast with it."""
    torch.manual_seed(0)
    m = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=16, n_positions=8, vocab_size=50))
    wte = m.transformer.wte.weight.detach().clone()
    assert m.cast_matmuls(torch.bfloat16) is m
    linears = [x for x in m.modules() if isinstance(x, torch.nn.Linear) and x is not m.lm_head]
    assert len(linears) == 2 * 4 and all(x.weight.dtype == x.bias.dtype == torch.bfloat16 for x in linears)
    assert m.lm_head.weight.dtype == torch.bfloat16 and not m.lm_head.weight.requires_grad
    assert torch.equal(m.lm_head.weight, wte.to(torch.bfloat16)) and torch.equal(m.transformer.wte.weight, wte)
    others = [p for n, p in m.named_parameters() if "ln" in n or "wte" in n or "wpe" in n]
    assert len(others) == 2 + 2 * 2 * 2 + 2 and all(p.dtype == torch.float32 for p in others)


def test_num_params_counts_the_tied_embedding_once():
    """V*C + P*C embeddings, 12 C^2 + 13 C a block, 2 C for ln_f; the output layer is the embedding."""
    V, P, C, L = 50, 16, 8, 3
    m = GPT(GPTConfig(n_layer=L, n_head=2, n_embd=C, n_positions=P, vocab_size=V))
    assert m.num_params() == V * C + P * C + L * (12 * C * C + 13 * C) + 2 * C == 3160


@torch.no_grad()
def test_dropout_acts_in_train_mode_only():
    """With GPTConfig.dropout > 0 an eval-mode forward (sampling, evaluation, the reference) is the dropout-free one."""
    torch.manual_seed(0)
    cfg = dict(n_layer=2, n_head=2, n_embd=32, n_positions=64, vocab_size=50)
    noisy, plain = GPT(GPTConfig(**cfg, dropout=0.5)), GPT(GPTConfig(**cfg))
    plain.load_state_dict(noisy.state_dict())
    ids, mask = torch.randint(0, 50, (2, 9)), torch.ones(2, 9)
    mask[1, :3] = 0
    assert torch.equal(noisy.eval()(ids, mask), plain.eval()(ids, mask))
    assert not torch.equal(noisy.train()(ids, mask), plain(ids, mask))  # the dropout is there


def test_dropout_sites_are_gpt2s(monkeypatch):
    """A train-mode forward drops where GPT-2 does: the embeddings' sum, then in every block the attention
    weights (at the config's rate), the attention's output projection and the MLP's: 1 + 2 * n_layer drops."""
    drops, attn_rates = [], []
    dropout, sdpa = F.dropout, F.scaled_dot_product_attention
    monkeypatch.setattr(F, "dropout", lambda x, p=0.5, *a, **kw: drops.append((p, x.detach().clone())) or
                        dropout(x, p, *a, **kw))
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda *a, dropout_p=0.0, **kw: attn_rates.append(dropout_p) or sdpa(*a, dropout_p=dropout_p, **kw))
    model = GPT(GPTConfig(n_layer=3, n_head=2, n_embd=32, n_positions=64, vocab_size=50, dropout=0.25)).train()
    ids = torch.randint(0, 50, (2, 9))
    model(ids, torch.ones(2, 9))
    assert [p for p, _ in drops] == [0.25] * (1 + 2 * 3) and attn_rates == [0.25] * 3
    wt = model.transformer
    assert torch.equal(drops[0][1], wt.wte(ids) + wt.wpe(torch.arange(9)))  # the first drop is of the sum


if __name__ == "__main__":
    import sys
    sys.exit(pytest.main([__file__, "-q"]))
