"""GPT-2 against transformers.GPT2LMHeadModel: logits, left padding; the shared-prefix forward against the plain one.

    python mini/test_model.py
"""
import tempfile

import pytest
import torch

from mini.loader import load_model
from mini.model import GPT, GPTConfig

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


def test_a_sequence_past_the_last_position_is_one_sentence():
    m = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=16, n_positions=8, vocab_size=50))
    fits, mask = torch.zeros(2, 10, dtype=torch.long), torch.ones(2, 10)
    mask[:, :2] = 0  # left padding takes no position: 8 real tokens fit
    assert m.hidden(fits, mask).shape == (2, 10, 16) and m.completion_hidden(fits, mask, 4).shape == (2, 6, 16)
    one_over = fits[:, 1:]  # 9 real tokens: positions 0..8
    for run in (lambda: m.hidden(one_over), lambda: m.completion_hidden(one_over, torch.ones(2, 9), 4)):
        with pytest.raises(ValueError, match="sequence needs position 8 but the model has 8"):
            run()


if __name__ == "__main__":
    import sys
    sys.exit(pytest.main([__file__, "-q"]))
