"""
GPT-2 in plain PyTorch, with the math of Hugging Face's GPT2LMHeadModel (pre-LN, tanh GELU, tied
lm_head) and left-padding-aware positions. Decoding with a KV cache lives in mini/sampler.py.

Module names follow the Hugging Face checkpoint (transformer.h.0.attn.c_attn, ...), so loading is a
key-for-key copy with the Conv1D weights transposed (see mini/loader.py).
"""
import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


@dataclass
class GPTConfig:
    n_layer: int = 12
    n_head: int = 12
    n_embd: int = 768
    n_positions: int = 1024
    vocab_size: int = 50257
    dropout: float = 0.0  # the published config.json says 0.1; in train mode it makes policy and reference log-probs differ


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head, self.dropout = cfg.n_head, cfg.dropout
        self.c_attn = nn.Linear(cfg.n_embd, 3 * cfg.n_embd)
        self.c_proj = nn.Linear(cfg.n_embd, cfg.n_embd)
        self.resid_dropout = nn.Dropout(cfg.dropout)

    def qkv(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        return (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)

    def forward(self, x, attn_mask, cache=None, prefix=None):
        B, T, C = x.shape
        q, k, v = self.qkv(x)
        if cache is not None:  # this layer's attend(q, k, v) of a decode cache: it stores k, v and attends (eval only)
            y = cache(q, k, v)
        else:
            if prefix is not None:  # keys and values (B, nh, S, hs) of the columns before x (GPT.completion_hidden)
                k, v = torch.cat([prefix[0], k], 2), torch.cat([prefix[1], v], 2)  # (B, nh, S + T, hs)
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                               dropout_p=self.dropout if self.training else 0.0)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


def causal_mask(cols, key_mask):
    """Attention mask (B, 1, T, S) of queries at key columns cols (T,) over keys (B, S) that are real where
    key_mask is True: a query sees the real keys up to itself, and always itself, so padding rows stay finite."""
    q_abs, k_abs = cols[:, None], torch.arange(key_mask.shape[1], device=cols.device)[None, :]
    return (((k_abs <= q_abs)[None] & key_mask[:, None, :]) | (k_abs == q_abs)[None])[:, None]


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.c_fc = nn.Linear(cfg.n_embd, 4 * cfg.n_embd)
        self.c_proj = nn.Linear(4 * cfg.n_embd, cfg.n_embd)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x):
        return self.dropout(self.c_proj(F.gelu(self.c_fc(x), approximate="tanh")))


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln_1 = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.attn = CausalSelfAttention(cfg)
        self.ln_2 = nn.LayerNorm(cfg.n_embd, eps=1e-5)
        self.mlp = MLP(cfg)

    def forward(self, x, attn_mask, cache=None, prefix=None):
        x = x + self.attn(self.ln_1(x), attn_mask, cache, prefix)
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.config = cfg
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(cfg.vocab_size, cfg.n_embd),
            wpe=nn.Embedding(cfg.n_positions, cfg.n_embd),
            drop=nn.Dropout(cfg.dropout),
            h=nn.ModuleList([Block(cfg) for _ in range(cfg.n_layer)]),
            ln_f=nn.LayerNorm(cfg.n_embd, eps=1e-5),
        ))
        self.lm_head = nn.Linear(cfg.n_embd, cfg.vocab_size, bias=False)
        self.lm_head.weight = self.transformer.wte.weight  # tied
        self.grad_checkpointing = False
        self.apply(self._init_weights)
        for name, p in self.named_parameters():  # GPT-2's scaled init of residual projections
            if name.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * cfg.n_layer))

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)

    def num_params(self):
        return sum(p.numel() for p in self.parameters())  # tied weights are one parameter, counted once

    def cast_matmuls(self, dtype):
        """A frozen copy's weights (the reference) in the matmul dtype of autocast: every Linear's weight and bias,
        the output layer untied from the embedding, whose lookup, like LayerNorm, stays fp32. Under autocast
        the outputs are bitwise those of the fp32 weights, cast once here instead of at every forward, in half
        the memory; so the KL to it at step 0 stays exactly 0. Returns self."""
        self.lm_head.weight = nn.Parameter(self.lm_head.weight.detach().to(dtype), requires_grad=False)
        for m in self.modules():
            if isinstance(m, nn.Linear) and m is not self.lm_head:
                m.to(dtype)
        return self

    def configure_optimizers(self, weight_decay, lr, betas, device_type, extra=()):
        """AdamW (fused on CUDA); decay on weight matrices only, never on biases, norms or embeddings.
        extra: (name, parameter) pairs of other modules trained with the model (the value head)."""
        params = list(self.named_parameters()) + list(extra)
        decay = lambda n, p: p.dim() == 2 and "wte" not in n and "wpe" not in n
        groups = [{"params": [p for n, p in params if decay(n, p)], "weight_decay": weight_decay},
                  {"params": [p for n, p in params if not decay(n, p)], "weight_decay": 0.0}]
        return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=device_type == "cuda" or None)

    def hidden(self, idx, attention_mask=None, cache=None):
        """Final hidden states (B, T, C) after ln_f.

        attention_mask (B, T): 1 on real tokens, 0 on padding (any pattern: left, right or both).
        Positions count real tokens only, so a left-padded row starts at position 0. With a cache (a
        mini.sampler.KVCache or SharedPrefixCache), idx is written at the cache's next columns, attends over
        every cached column, and its positions continue from the real tokens already there.
        """
        B, T = idx.shape
        mask = torch.ones(B, T, dtype=torch.bool, device=idx.device) if attention_mask is None \
            else attention_mask.bool()  # (B, T)
        if cache is None:
            pos = (mask.long().cumsum(1) - 1).clamp(min=0)  # (B, T)
            self._check_positions(pos)  # generate checks lengths up front
            attn_mask, layers = causal_mask(torch.arange(T, device=idx.device), mask), None
        else:  # the cache writes idx's columns and gives its positions and each layer's attend(q, k, v)
            pos, layers = cache.advance(mask)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))  # (B, T, C)
        for i, block in enumerate(self.transformer.h):
            x = self._block(block, x, attn_mask) if cache is None else block(x, None, layers[i])
        return self.transformer.ln_f(x)

    def _check_positions(self, pos):
        """One sentence rather than an index error deep inside wpe; not under torch.compile, where the branch on a
        tensor's value broke the graph and synced with the host at every forward (the rows come from rollouts
        that the sampler, uncompiled here, already checked)."""
        if not torch.compiler.is_compiling() and pos.numel() and pos.max() >= self.config.n_positions:
            raise ValueError(f"sequence needs position {int(pos.max())} but the model has {self.config.n_positions}: "
                             "give shorter text, or a model with more positions (sft.py from scratch: --n_positions)")

    def _block(self, block, x, attn_mask, prefix=None):
        """One block of a forward without a KV cache, recomputed in the backward pass (gradient
        checkpointing) when that is on and the model is training."""
        if self.grad_checkpointing and self.training:
            return checkpoint(block, x, attn_mask, None, prefix, use_reentrant=False)
        return block(x, attn_mask, prefix=prefix)

    def completion_hidden(self, idx, attention_mask, start, groups=None):
        """hidden(idx, attention_mask)[:, start:], computing each distinct prefix (columns < start) once.

        A GRPO rollout repeats every prompt K times, and the prompt is most of a row (~80 of ~145 tokens):
        the prefixes go through the model once each, and every row's columns from `start` on attend to
        its prefix's keys and values. Each layer's prefix keys and values are recomputed from that layer's
        input (one extra c_attn over the few distinct prefixes), so the blocks stay plain functions of
        their inputs, which gradient checkpointing needs.

        groups: (rows (B,), firsts (U,)), each row's prefix and a row of each prefix, where the caller knows
        which rows share one (a Rollout's groups); else the distinct prefixes are found with torch.unique.
        """
        B, T = idx.shape
        mask = attention_mask.bool()  # (B, T)
        if start <= 0:
            return self.hidden(idx, mask)
        start = min(start, T)  # no suffix: (B, 0, C), as hidden(...)[:, start:]
        if groups is None:
            uniq, rows = torch.unique(torch.cat([idx[:, :start], mask[:, :start].long()], 1), dim=0, return_inverse=True)
            p_idx, p_mask = uniq[:, :start], uniq[:, start:].bool()  # (U, S): the distinct prefixes
        else:
            rows, firsts = groups
            p_idx, p_mask = idx[firsts, :start], mask[firsts, :start]  # (U, S)
        s_idx, s_mask = idx[:, start:], mask[:, start:]  # (B, Ts)
        S = start
        p_pos = (p_mask.long().cumsum(1) - 1).clamp(min=0)  # (U, S)
        s_pos = (p_mask.sum(1)[rows, None] + s_mask.long().cumsum(1) - 1).clamp(min=0)  # (B, Ts)
        self._check_positions(s_pos if s_pos.shape[1] else p_pos)  # each row's suffix continues its prefix
        # the masks of hidden(): the suffix's queries sit at columns S.. over the keys [prefix, suffix]
        p_attn = causal_mask(torch.arange(S, device=idx.device), p_mask)  # (U, 1, S, S)
        s_attn = causal_mask(torch.arange(S, T, device=idx.device), torch.cat([p_mask[rows], s_mask], 1))  # (B, 1, Ts, T)
        wte, wpe = self.transformer.wte, self.transformer.wpe
        xp = self.transformer.drop(wte(p_idx) + wpe(p_pos))  # (U, S, C)
        xs = self.transformer.drop(wte(s_idx) + wpe(s_pos))  # (B, Ts, C)
        blocks = self.transformer.h
        for i, block in enumerate(blocks):
            _, k, v = block.attn.qkv(block.ln_1(xp))  # (U, nh, S, hs)
            prefix = (k[rows], v[rows])  # (B, nh, S, hs)
            xs = self._block(block, xs, s_attn, prefix)
            if i < len(blocks) - 1:  # the last layer's prefix output is never needed
                xp = self._block(block, xp, p_attn)
        return self.transformer.ln_f(xs)

    def forward(self, idx, attention_mask=None):
        return self.lm_head(self.hidden(idx, attention_mask))  # (B, T, vocab)
