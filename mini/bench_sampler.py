"""
Sampler throughput on this machine: our batched KV-cached `generate` against decoding that recomputes
the full sequence each token, and against transformers' `generate`, on the same weights and prompts.

    python mini/bench_sampler.py                       # small model, CPU
    python mini/bench_sampler.py --n_layer 12 --n_head 12 --n_embd 768 --prompts 8 --k 8
"""
import argparse
import statistics
import tempfile
import time

import torch

from mini.loader import save_model
from mini.model import GPT, GPTConfig
from mini.sampler import generate, pad_left
from mini.tokenizer import Tokenizer


@torch.no_grad()
def generate_full_recompute(model, prompts, max_new_tokens):
    """The naive baseline: every new token runs the whole sequence again (no cache), sampling at T=1."""
    ids, mask = pad_left(prompts, 50256, "cpu")
    for _ in range(max_new_tokens):
        probs = torch.softmax(model(ids, mask)[:, -1].float(), -1)
        ids = torch.cat([ids, torch.multinomial(probs, 1)], 1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
    return ids


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n_layer", type=int, default=4)
    p.add_argument("--n_head", type=int, default=4)
    p.add_argument("--n_embd", type=int, default=256)
    p.add_argument("--prompts", type=int, default=4, help="distinct prompts")
    p.add_argument("--k", type=int, default=4, help="samples per prompt")
    p.add_argument("--prompt_len", type=int, default=40)
    p.add_argument("--new_tokens", type=int, default=64)
    p.add_argument("--repeats", type=int, default=3)
    a = p.parse_args()
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=a.n_layer, n_head=a.n_head, n_embd=a.n_embd, n_positions=256)).eval()
    prompts = [torch.randint(0, 50000, (a.prompt_len - i,)).tolist() for i in range(a.prompts)] * a.k
    tokens = len(prompts) * a.new_tokens  # random weights almost never sample EOS: every row runs to the end

    rows = [("ours: generate (KV cache, shared prefill)", lambda: generate(model, prompts, a.new_tokens)),
            ("full recompute per token", lambda: generate_full_recompute(model, prompts, a.new_tokens))]
    try:
        import transformers
        with tempfile.TemporaryDirectory() as d:
            hf = transformers.GPT2LMHeadModel.from_pretrained(save_model(model, Tokenizer.gpt2(), d)).eval()
        ids, mask = pad_left(prompts, 50256, "cpu")
        hf_kwargs = dict(attention_mask=mask.long(), max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens,
                         do_sample=True, top_k=0, pad_token_id=50256)
        rows.append((f"transformers {transformers.__version__} generate", lambda: hf.generate(ids, **hf_kwargs)))
    except ImportError:
        print("transformers not installed: its row is skipped")

    print(f"model {model.num_params() / 1e6:.1f}M params, {len(prompts)} rows ({a.prompts} prompts x {a.k}), "
          f"prompt ~{a.prompt_len} tokens, {a.new_tokens} new tokens, {torch.get_num_threads()} threads")
    base = None
    for name, fn in rows:
        fn()  # warm-up
        s = timed(fn, a.repeats)
        base = base or tokens / s
        print(f"{name:45s} {tokens / s:9.0f} tok/s   ours is {base / (tokens / s):5.2f}x this")


if __name__ == "__main__":
    main()
