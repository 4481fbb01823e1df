"""
Log-probabilities and entropy of the tempered policy, from logits or from the output layer's input.

Every value is of softmax(logits / temperature), the distribution the sampler draws from, computed in fp32
(fp64 stays fp64). Logits are (N, T, V), aligned with ids (N, T): logits[:, t] predicts ids[:, t]. Nothing
here materialises an (N, T, V) log_softmax: the work runs in chunks of positions, and with a fused Head the
logits themselves exist for one chunk at a time (forward and backward).
"""
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint


def _tempered(logits, temperature):
    x = logits.to(torch.promote_types(logits.dtype, torch.float32))  # fp32 log-probs (fp64 stays fp64): a bf16
    return x if temperature == 1.0 else x / temperature                # log_softmax gives KL != 0 at step 1


def _per_position(fn, *xs, chunk_size):
    """fn over (M, ·) rows, chunk by chunk, for inputs shaped (N, T, ·). Each chunk is recomputed in
    the backward pass (activation checkpointing), so V-sized temporaries exist for one chunk only."""
    lead = xs[0].shape[:-1]
    chunks = zip(*(x.reshape(lead.numel(), x.shape[-1]).split(chunk_size) for x in xs))
    return torch.cat([checkpoint(fn, *c, use_reentrant=False) for c in chunks]).view(lead)


class _TokenLogprobs(torch.autograd.Function):
    """log softmax(x / T)[ids] = x[ids] / T - logsumexp(x / T), row chunk by row chunk, with a hand-written
    backward: d/dx = (onehot(ids) - softmax(x / T)) * g / T. Autograd of the same expression keeps (M, V)
    temporaries alive and makes ~10 passes over them (a zero-filled scatter for the gather, an exp and a
    product for the logsumexp, a concatenation of the chunks); here each chunk is read once and written
    once while it sits in cache, which made the update of a CPU step ~2x faster (see mini/bench.py).
    with_entropy: also the entropy H = lse - Σ p x of each position, from the same chunk's exponentials and
    without a gradient (a metric): a separate entropy() pass over the logits cost ~7x the log-probs on a CPU."""

    @staticmethod
    def forward(ctx, logits, ids, temperature, chunk_rows, with_entropy):
        x, i = logits.reshape(-1, logits.shape[-1]), ids.reshape(-1, 1)  # (M, V), (M, 1)
        lse, ent = [], []
        for c in x.split(chunk_rows):
            c = _tempered(c, temperature)  # (m, V)
            if with_entropy:
                m = c.amax(-1, keepdim=True)
                e = (c - m).exp_()
                z = e.sum(-1)
                lse.append(m[:, 0] + z.log())
                ent.append(lse[-1] - (e.mul_(c)).sum(-1) / z)  # E_p[x] = Σ e x / Σ e
            else:
                lse.append(torch.logsumexp(c, -1))
        lse = torch.cat(lse)  # (M,)
        ctx.save_for_backward(logits, ids, lse)
        ctx.temperature, ctx.chunk_rows = temperature, chunk_rows
        logp = (_tempered(x.gather(1, i)[:, 0], temperature) - lse).view(ids.shape)
        if not with_entropy:
            return logp, None
        ent = torch.cat(ent).view(ids.shape)
        ctx.mark_non_differentiable(ent)
        return logp, ent

    @staticmethod
    def backward(ctx, grad, _):
        logits, ids, lse = ctx.saved_tensors
        T, rows = ctx.temperature, ctx.chunk_rows
        x, i = logits.reshape(-1, logits.shape[-1]), ids.reshape(-1, 1)
        g = grad.reshape(-1, 1).to(lse.dtype) / T  # (M, 1)
        out = torch.empty_like(x)
        for s in range(0, x.shape[0], rows):
            c = slice(s, s + rows)
            p = (_tempered(x[c], T) - lse[c, None]).exp_().mul_(-g[c])  # -softmax * g / T
            out[c] = p.scatter_add_(1, i[c], g[c])  # + onehot * g / T
        return out.view(logits.shape), None, None, None, None


def token_logprobs(logits, ids, temperature=1.0, chunk_size=None, with_entropy=False):
    """log π(o_t | q, o_<t) of the given (sampled) ids: (N, T, V), (N, T) -> (N, T) fp32, and with_entropy
    (else None) each position's entropy, detached. Computed as gathered logit - logsumexp over chunks of
    chunk_size positions, so the (N, T, V) log_softmax is never materialised. Default chunks: 8 positions on a
    CPU (~1.6 MB of fp32 logits, cache-sized), 1024 on a GPU (few kernel launches)."""
    chunk_size = chunk_size or (1024 if logits.is_cuda else 8)
    logp, ent = _TokenLogprobs.apply(logits, ids, temperature, chunk_size, with_entropy)
    return (logp, ent) if with_entropy else logp


class Head(NamedTuple):
    """The output layer's input: final hidden states h (N, T, C) and the tied output weight (V, C), logits
    h @ weight.T computed in `dtype` (autocast's where h was computed; None: h's). With fused, log-probs and
    entropy come from _FusedHead and the (N, T, V) logits never exist; without, they are materialised."""
    h: torch.Tensor
    weight: torch.Tensor
    fused: bool = True
    dtype: torch.dtype = None

    @classmethod
    def of(cls, h, weight, fused=True):
        """The Head of h, with the matmul dtype of the autocast region this is called in."""
        on = torch.is_autocast_enabled(h.device.type)
        return cls(h, weight, fused, torch.get_autocast_dtype(h.device.type) if on else None)

    def logits(self):
        return F.linear(_cast(self.h, self.dtype), _cast(self.weight, self.dtype))  # (N, T, V)


def _cast(x, dtype):
    return x if dtype is None else x.to(dtype)


def logits_of(x):
    """The (N, T, V) logits of a Head, or logits as they are."""
    return x.logits() if isinstance(x, Head) else x


class _FusedHead(torch.autograd.Function):
    """The output layer, log softmax(h W^T / T)[ids] and, when asked, the entropy H of softmax(h W^T / T), chunk
    by chunk of positions from the hidden states h (M, C) and the weight W (V, C): the (M, V) logits exist for
    one chunk at a time, and the backward recomputes each chunk's logits (Cut Cross-Entropy, Wijmans et al.
    2024; Liger Kernel's fused linear cross-entropy). With x = h W^T / T and p = softmax(x), per position:
        d logp / dx = onehot(ids) - p,   dH / dx = -p (log p + H),   dx / dh = W / T,   dx / dW = h^T / T."""

    @staticmethod
    def forward(ctx, h, weight, ids, temperature, chunk_rows, with_entropy, dtype):
        ctx.set_materialize_grads(False)  # an output the loss does not use (the entropy at coefficient 0) costs nothing
        M = h.shape[0]
        w = _cast(weight, dtype)
        logp = h.new_empty(M, dtype=torch.promote_types(h.dtype, torch.float32))
        ent = torch.empty_like(logp) if with_entropy else None
        for s in range(0, M, chunk_rows):
            c = slice(s, s + chunk_rows)
            x = _tempered(_cast(h[c], dtype) @ w.T, temperature)  # (m, V)
            lse = torch.logsumexp(x, -1)
            logp[c] = x.gather(1, ids[c, None])[:, 0] - lse
            if with_entropy:
                ent[c] = lse - (torch.softmax(x, -1) * x).sum(-1)  # -sum p log p = lse - sum p x
        ctx.save_for_backward(h, weight, ids)
        ctx.temperature, ctx.chunk_rows, ctx.dtype = temperature, chunk_rows, dtype
        return logp, ent

    @staticmethod
    def backward(ctx, g_logp, g_ent):
        h, weight, ids = ctx.saved_tensors
        T, rows, dtype = ctx.temperature, ctx.chunk_rows, ctx.dtype
        w = _cast(weight, dtype)
        grad_h = torch.empty_like(h) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(weight) if ctx.needs_input_grad[1] else None
        for s in range(0, h.shape[0], rows):
            c = slice(s, s + rows)
            hc = _cast(h[c], dtype)
            lp = F.log_softmax(_tempered(hc @ w.T, T), -1)  # (m, V)
            p = lp.exp()
            gx = torch.zeros_like(p)
            if g_logp is not None:
                gx = p * -g_logp[c, None]
                gx.scatter_add_(1, ids[c, None], g_logp[c, None])
            if g_ent is not None:
                gx -= g_ent[c, None] * p * (lp + (p * lp).sum(-1, keepdim=True).neg_())
            gx = _cast(gx / T, dtype)
            if grad_h is not None:
                grad_h[c] = gx @ w
            if grad_w is not None:
                grad_w += (gx.T @ hc).to(grad_w.dtype)
        return grad_h, grad_w, None, None, None, None, None


def head_logprobs(head, ids, temperature=1.0, with_entropy=True, chunk_size=None, entropy_grad=True):
    """log π(o_t | q, o_<t) of the ids (N, T) and, with_entropy, the entropy of each position's tempered
    distribution (else None), from `head`: a Head (fused or not) or logits (N, T, V). (N, T) each, fp32.
    entropy_grad False: the entropy is a metric only, computed in the log-probs' pass over the logits.
    Fused chunks: 256 positions on a CPU (64 re-read the weight too often), 1024 on a GPU."""
    if isinstance(head, Head) and head.fused:
        chunk_size = chunk_size or (1024 if head.h.is_cuda else 256)
        C = head.h.shape[-1]
        logp, ent = _FusedHead.apply(head.h.reshape(-1, C), head.weight, ids.reshape(-1), temperature, chunk_size,
                                     with_entropy, head.dtype)
        return logp.view(ids.shape), ent.view(ids.shape) if with_entropy else None
    logits = head.logits() if isinstance(head, Head) else head
    if with_entropy and not entropy_grad:
        return token_logprobs(logits, ids, temperature, with_entropy=True)
    return token_logprobs(logits, ids, temperature), entropy(logits, temperature) if with_entropy else None


def exact_kl(logits, ref_logits, kl_type="forward", temperature=1.0, chunk_size=1024):
    """Exact KL per position over the vocabulary, between the tempered distributions:
    forward KL(πθ‖πref) = Σ_v πθ (log πθ − log πref), reverse KL(πref‖πθ), symmetric their mean.
    (N, T, V), (N, T, V) -> (N, T); no gradient flows into the reference."""
    def kl(x, y):
        lp, lq = F.log_softmax(_tempered(x, temperature), -1), F.log_softmax(_tempered(y, temperature), -1)
        fwd = lambda: (lp.exp() * (lp - lq)).sum(-1)
        rev = lambda: (lq.exp() * (lq - lp)).sum(-1)
        return {"forward": fwd, "reverse": rev, "symmetric": lambda: (fwd() + rev()) / 2}[kl_type]()
    return _per_position(kl, logits, ref_logits.detach(), chunk_size=chunk_size)


def entropy(logits, temperature=1.0, chunk_size=1024):
    """Entropy H = −Σ_v π log π of the tempered next-token distribution. (N, T, V) -> (N, T)."""
    def h(x):
        lp = F.log_softmax(_tempered(x, temperature), -1)
        return -(lp.exp() * lp).sum(-1)
    return _per_position(h, logits, chunk_size=chunk_size)
