"""
End-to-end GRPO step benchmark on random weights: rollout tokens/s, completions/s, seconds per phase,
training-phase MFU and peak memory, beside transformers' `generate` on the same weights and prompts.

    python mini/bench.py                                   # 124M config, 64 prompts x 16, on CUDA
    python mini/bench.py --n_layer 2 --n_head 2 --n_embd 64 --prompts 4 --k 4 --steps 1   # CPU smoke run

The completion length is forced: random weights almost never sample EOS, so every row runs to
--new_tokens (64, near the real ~58-66 of A:/P: completions). Prompts are real mixed P:/A: prompts
from the shipped pool. MFU counts 6 FLOPs per parameter per trained token (tied embeddings once;
the vocabulary projection only on completion tokens, where the loop applies it) against --peak_tflops.
"""
import argparse
import tempfile

import torch

from mini.bench_sampler import timed
from mini.config import Config
from mini.loader import save_model
from mini.model import GPT, GPTConfig
from mini.tokenizer import Tokenizer
from mini.train import Trainer

PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}  # dense bf16


def sync(cuda):
    if cuda:
        torch.cuda.synchronize()


def grpo_step(tr):
    """Trainer.train_step, by phases: (seconds per phase, completions, real tokens, completion tokens)."""
    m = tr.train_step()
    phases = {k: m[f"time_{k}"] for k in ("generate", "ref_logprobs", "score", "update")}
    tokens = m["prompt_tokens"] + m["completion_tokens"]
    return phases, tr.cfg.batch_size * tr.cfg.k_samples, tokens, m["completion_tokens"]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n_layer", type=int, default=12)
    p.add_argument("--n_head", type=int, default=12)
    p.add_argument("--n_embd", type=int, default=768)
    p.add_argument("--prompts", type=int, default=64)
    p.add_argument("--k", type=int, default=16)
    p.add_argument("--new_tokens", type=int, default=64)
    p.add_argument("--steps", type=int, default=3, help="timed steps after one warm-up step")
    p.add_argument("--score_workers", type=int, default=0)
    p.add_argument("--peak_tflops", type=float, default=0.0, help="device peak for MFU (default: known GPUs)")
    p.add_argument("--no_transformers", action="store_true", help="skip the transformers comparison")
    a = p.parse_args()
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=a.n_layer, n_head=a.n_head, n_embd=a.n_embd, n_positions=256))
    with tempfile.TemporaryDirectory() as d:
        path = save_model(model, Tokenizer.gpt2(), f"{d}/model")
        cfg = Config(model_path=path, log_dir=f"{d}/logs", run_name="bench", batch_size=a.prompts, k_samples=a.k,
                     max_new_tokens=a.new_tokens, eval_every=0, save_every=0, score_workers=a.score_workers)
        tr = Trainer(cfg)
        cuda = tr.cuda
        grpo_step(tr)  # warm-up
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        runs = [grpo_step(tr) for _ in range(a.steps)]
    phases = {k: sum(r[0][k] for r in runs) / a.steps for k in runs[0][0]}
    n, tokens, comp_tokens = runs[0][1], runs[0][2], runs[0][3]
    step_s = sum(phases.values())

    wte = tr.model.transformer.wte.weight.numel()
    body = tr.model.num_params() - wte  # the tied embedding is counted once, as the output projection
    flops = 6 * (body * tokens + wte * comp_tokens)
    peak = a.peak_tflops or next((v for k, v in PEAK_TFLOPS.items()
                                  if cuda and k in torch.cuda.get_device_name()), 0.0)
    device = torch.cuda.get_device_name() if cuda else f"CPU, {torch.get_num_threads()} threads"
    print(f"{device}: {tr.model.num_params() / 1e6:.1f}M params, {a.prompts} prompts x {a.k} = {n} completions "
          f"of {a.new_tokens} tokens, mean of {a.steps} steps")
    for k, v in phases.items():
        print(f"  {k:14s} {v:8.3f} s  ({100 * v / step_s:4.1f}%)")
    print(f"  rollout        {comp_tokens / phases['generate']:10.0f} tokens/s")
    print(f"  end to end     {n / step_s:10.1f} completions/s ({step_s:.2f} s per step)")
    print(f"  training phase {flops / phases['update'] / 1e12:10.2f} TFLOP/s"
          + (f", MFU {flops / phases['update'] / 1e12 / peak:.1%} of {peak:.0f}" if peak else " (MFU: pass --peak_tflops)"))
    if cuda:
        print(f"  peak memory    {torch.cuda.max_memory_allocated() / 2**30:10.2f} GiB")

    if a.no_transformers:
        return
    try:
        import transformers
    except ImportError:
        print("transformers not installed: no comparison")
        return
    with tempfile.TemporaryDirectory() as d:
        hf = transformers.GPT2LMHeadModel.from_pretrained(save_model(tr.model, tr.tok, d)).to(tr.device).eval()
    rows = tr.sampler.draw(a.prompts)
    enc = [tr.tok.encode(s.prompt) for s in rows for _ in range(a.k)]
    T = max(map(len, enc))
    ids = torch.tensor([[50256] * (T - len(e)) + e for e in enc], device=tr.device)
    mask = (torch.arange(T, device=tr.device)[None] >= torch.tensor([T - len(e) for e in enc], device=tr.device)[:, None])
    kwargs = dict(attention_mask=mask.long(), max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens,
                  do_sample=True, top_k=0, pad_token_id=50256)
    if cuda:
        kwargs["cache_implementation"] = "static"
    with tr.autocast(), torch.no_grad():
        hf.generate(ids, **kwargs)
        hf_s = timed(lambda: (hf.generate(ids, **kwargs), sync(cuda)), a.steps)
    print(f"transformers {transformers.__version__} generate alone: {n / hf_s:.1f} completions/s; "
          f"our whole GRPO step is {(n / step_s) / (n / hf_s):.2f}x its generation alone, "
          f"our rollout {hf_s / phases['generate']:.2f}x faster")


if __name__ == "__main__":
    main()
