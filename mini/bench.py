"""
Benchmarks, in four modes (random weights; real RookWorld prompts from the shipped pool):

    python mini/bench.py [step]    # one GRPO step (Trainer.train_step) by phases, beside transformers' generate
                                   # and TRL's GRPOTrainer on the same weights and prompts
    python mini/bench.py sampler   # our generate against full recompute per token and transformers' generate
    python mini/bench.py scoring   # reward scoring, completions/s on one core
    python mini/bench.py scoring --engine   # and the --p_reward engine reward, cold and warm cache (Stockfish)
    python mini/bench.py data [--data_file F1,F2]   # sft.py's training batches, samples/s on one core
    OMP_NUM_THREADS=1 python mini/bench.py --n_layer 4 --n_head 4 --n_embd 256 --prompts 4 --k 8 --new_tokens 64 \
        --steps 3 --trl_steps 3                                # CPU-sized, with the TRL comparison (~6 min)

step reports the median of --steps timed steps after a warm-up (--json PATH writes it): seconds per phase,
rollout tokens/s, completions/s, TFLOP/s and MFU of the update, peak memory, decode bandwidth. What each figure
counts, and how transformers and TRL are set up to match, is in the README.
"""
import gc
import os
import random
import statistics
import sys
import tempfile
import time
import traceback

if not __package__:  # run as `python mini/x.py`, not installed: import `mini` from this checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # every model here is a local snapshot; never wait on the hub

import torch

from mini.autobatch import choose_batch_size
from mini.config import EVAL_PATH, FIELDS, POOL_PATH, Config, at_least
from mini.flags import Parser, Switch, error_sentence, parse_args, run_command
from mini.dataset import PoolSource, load_jsonl
from mini.formats import legal_ucis, policy_completion
from mini.evaluate import in_data_dir, save_report
from mini.loader import SNAPSHOT_FILES, LoadError, save_model
from mini.model import GPT, GPTConfig
from mini.positions import random_env_sample
from mini.reward_scorer import EngineReward, ScoringPool, score_batch
from mini.runtime import autocast, peak_memory_mb, resolve_device, score_workers
from mini.sampler import WIDTH_BUCKET, generate, pad_left, round_up, shares_prefix
from mini.sft import SFTData, encode_batch
from mini.stockfish import find_stockfish
from mini.tokenizer import Tokenizer
from mini.train import Trainer

# device peaks, matched in order against torch.cuda.get_device_name()
PEAK_TFLOPS = [("H100 PCIe", 756.0), ("H100", 989.0), ("H200", 989.0), ("A100", 312.0)]  # dense bf16
PEAK_GBPS = [("H100 PCIe", 2000.0), ("H100", 3350.0), ("H200", 4800.0), ("A100", 2039.0)]  # HBM
MODE_DEFAULTS = {"step": dict(n_layer=12, n_head=12, n_embd=768, prompts=64, k=16),
                 "sampler": dict(n_layer=4, n_head=4, n_embd=256, prompts=4, k=4),
                 "scoring": dict(prompts=500),
                 "data": dict(prompts=512)}
SHAPE, STEP = ("step", "sampler"), ("step",)
FLAG_MODES = {  # the modes that read a flag (one not named here: every mode); given to another, it is refused
    "n_layer": SHAPE, "n_head": SHAPE, "n_embd": SHAPE, "new_tokens": SHAPE, "bf16": SHAPE, "compile_decode": SHAPE,
    "k": ("step", "sampler", "scoring"), "steps": ("step", "sampler", "data"), "device": ("step", "sampler", "scoring"),
    "micro_batch_size": STEP, "compile": STEP, "auto_batch_size": STEP, "model_path": STEP, "real_lengths": STEP,
    "shared_prefix_decode": STEP, "fused_logprobs": STEP, "peak_tflops": STEP, "peak_gbps": STEP,
    "no_transformers": STEP, "no_trl": STEP, "trl_steps": STEP, "score_workers": ("step", "scoring"),
    "engine": ("scoring",), "data_file": ("data",), "mix_env_ratio": ("data",)}
GET_TRL = 'pip install -e ".[bench]"'


# ----------------------------------------------------------------------------- shared helpers

def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fns, repeats):
    """{name: median seconds of fn()} over `repeats` rounds that call every fn in turn: on a shared machine,
    interleaving exposes them all to the same load."""
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: statistics.median(ts) for name, ts in times.items()}


def device_peak(table, device):
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else ""
    return next((v for k, v in table if k in name), 0.0)


def device_name(device):
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"


def pool_prompts(n, seed=0):
    """n real mixed P:/A: prompts (text) from the shipped pool, A: share as in training."""
    return [s.prompt for s in PoolSource(load_jsonl(POOL_PATH), Config.mix_env_ratio, seed=seed).draw(n)]


def hf_generate(model, tok, prompts, new_tokens, device, cfg):
    """(run, version, cache): run() is transformers' generate of exactly new_tokens tokens for each prompt
    (token-id lists) on a copy of `model`'s weights, already warmed up; None when transformers is absent."""
    try:
        import transformers
    except ImportError:
        return None
    transformers.utils.logging.disable_progress_bar()
    with tempfile.TemporaryDirectory() as d:
        hf = transformers.GPT2LMHeadModel.from_pretrained(save_model(model, tok, d)).to(device).eval()
    ids, mask = pad_left(prompts, tok.eos_token_id, device)
    kwargs = dict(attention_mask=mask.long(), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                  do_sample=True, top_k=0, pad_token_id=tok.eos_token_id)
    if device.type == "cuda":
        kwargs["cache_implementation"] = "static"  # its fastest decoding: a static cache, compiled

    def run():
        with autocast(device, cfg), torch.no_grad():
            hf.generate(ids, **kwargs)
        sync(device)

    try:
        run()  # warm-up (and compilation)
    except Exception as e:  # noqa: BLE001
        if "cache_implementation" not in kwargs:
            raise
        print(f"transformers generate with a static cache failed ({type(e).__name__}: {str(e)[:200]}); "
              "timing its default dynamic cache")
        del kwargs["cache_implementation"]
        run()
    return run, transformers.__version__, kwargs.get("cache_implementation", "dynamic")


# ----------------------------------------------------------------------------- step: ours, transformers, TRL

def free_memory(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def guarded(out, name, fn, *args):
    """fn(*args), a comparison: one that fails (a library version, memory) leaves our figures and says why."""
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001 (reported, and recorded in the figures)
        traceback.print_exc()
        out[f"{name}_error"] = f"{type(e).__name__}: {e}"[:300]
        print(f"{name} comparison failed: {out[f'{name}_error']}")


def update_flops(body, wte, prompt_tokens, comp_tokens, k, iterations, fused):
    """(executed, nominal) FLOPs of a step's update, at 6 per parameter and token (forward and backward): body
    the parameters but the tied embedding wte, which counts once, as the output layer of the completion tokens;
    prompt_tokens and comp_tokens summed over the rows, k rows a prompt, `iterations` passes over them. Nominal:
    every row's prompt through the body. Executed: each group's prompt once (completion_hidden), and with a
    fused head 8 per output-layer weight and token (its logits computed again in the backward)."""
    nominal = 6 * (body * (prompt_tokens + comp_tokens) + wte * comp_tokens) * iterations
    executed = (6 * body * (prompt_tokens / k + comp_tokens) + (8 if fused else 6) * wte * comp_tokens) * iterations
    return executed, nominal


def decode_token_bytes(weight_bytes, kv, rows, k, prompt_tokens, prompt_width, new_tokens, shared):
    """(ideal, as read) bytes one decode token moves, on average over the new_tokens - 1 decode steps: the
    weights, and kv bytes per cached column of a row. The ideal decoder reads every row's prompt (prompt_tokens
    summed over the rows) and half its completion on average. As read, each prompt is left-padded to the
    longest (prompt_width columns): with the shared prefix (SharedPrefixCache) each group's prompt once and
    each row's completion columns up to the step's width bucket; without it every row's copy of its prompt
    and every preallocated column. Eager decode's shapes: a compiled decode's buckets read a few more."""
    ideal = weight_bytes + kv * (prompt_tokens + rows * new_tokens / 2)
    if shared:
        width = statistics.mean(min(round_up(t + 1, WIDTH_BUCKET), new_tokens) for t in range(new_tokens - 1))
        return ideal, weight_bytes + kv * (rows / k * prompt_width + rows * width)
    return ideal, weight_bytes + kv * rows * (prompt_width + new_tokens)


def ours(a, cfg, device):
    """Our figures (the dict step prints and writes), and the Trainer, from --steps timed Trainer.train_step
    calls after one warm-up step."""
    tr = Trainer(cfg)
    if a.auto_batch_size:
        choose_batch_size(tr)
        a.prompts = cfg.batch_size
    tr.train_step()  # warm-up (and compilation)
    rows = []
    for _ in range(a.steps):
        c0 = time.process_time()  # this process's CPU seconds: steadier than wall time on a shared CPU
        rows.append(tr.train_step())
        rows[-1]["cpu_step_s"] = time.process_time() - c0
    tr.scorer.close()
    med = sorted(rows, key=lambda r: r["time_step"])[len(rows) // 2]  # the median step
    phases = {k: med[f"time_{k}"] for k in ("generate", "ref_logprobs", "score", "update")}
    n, step_s, cpu_step_s = a.prompts * a.k, med["time_step"], med["cpu_step_s"]
    prompt_tokens, comp_tokens = med["prompt_tokens"], med["completion_tokens"]
    model, c = tr.model, tr.model.config
    wte = model.transformer.wte.weight.numel()
    body = model.num_params() - wte  # the tied embedding counted once, as the output projection
    flops, nominal = update_flops(body, wte, prompt_tokens, comp_tokens, a.k, cfg.num_iterations, cfg.fused_logprobs)
    tflops, nominal_tflops = flops / phases["update"] / 1e12, nominal / phases["update"] / 1e12
    peak_tflops = a.peak_tflops or device_peak(PEAK_TFLOPS, device)
    b = 2 if (cfg.bf16 if device.type == "cuda" else cfg.bf16_cpu) else 4  # bytes per weight and cached value
    kv = 2 * c.n_layer * c.n_embd * b  # bytes of one cached column of one row
    decode_bytes, read_bytes = decode_token_bytes(b * model.num_params(), kv, n, a.k, prompt_tokens, med["prompt_len_max"],
                                                  a.new_tokens, shares_prefix(cfg.shared_prefix_decode, device))
    token_s = phases["generate"] / a.new_tokens
    gbps, read_gbps = decode_bytes / token_s / 1e9, read_bytes / token_s / 1e9
    peak_gbps = a.peak_gbps or device_peak(PEAK_GBPS, device)
    out = dict(device=device_name(device), params_m=model.num_params() / 1e6, prompts=a.prompts, k=a.k, completions=n,
               new_tokens=a.new_tokens, steps=a.steps, micro_batch_size=a.micro_batch_size,
               dtype="bf16" if b == 2 else "fp32", compile=a.compile, compile_decode=a.compile_decode,
               auto_batch_size=a.auto_batch_size,
               seconds=phases, step_s=step_s, cpu_step_s=cpu_step_s, rollout_tok_s=comp_tokens / phases["generate"],
               completions_s=n / step_s,
               train_tflops=tflops, mfu=tflops / peak_tflops if peak_tflops else None, peak_tflops=peak_tflops or None,
               nominal_tflops=nominal_tflops, nominal_mfu=nominal_tflops / peak_tflops if peak_tflops else None,
               peak_mem_mb=max(r["peak_mem_mb"] for r in rows), decode_gbps=gbps,
               roofline_share=gbps / peak_gbps if peak_gbps else None, peak_gbps=peak_gbps or None,
               decode_read_gbps=read_gbps, read_roofline_share=read_gbps / peak_gbps if peak_gbps else None)
    print(f"{out['device']}: {out['params_m']:.1f}M params, {a.prompts} prompts x {a.k} = {n} completions of "
          f"{a.new_tokens} tokens, micro-batch {a.micro_batch_size or n}, {out['dtype']}"
          f"{', compiled decode' if a.compile_decode else ''}{', compiled forwards' if a.compile else ''}, median of "
          f"{a.steps} steps")
    for k, v in phases.items():
        print(f"  {k:14s} {v:8.3f} s  ({100 * v / step_s:4.1f}%)")
    print(f"  rollout        {out['rollout_tok_s']:10.0f} tokens/s")
    print(f"  end to end     {out['completions_s']:10.1f} completions/s ({step_s:.2f} s per step)")
    print(f"  training phase {tflops:10.2f} TFLOP/s executed"
          + (f", MFU {out['mfu']:.1%} of {peak_tflops:.0f}" if peak_tflops else " (MFU: pass --peak_tflops)")
          + f"; nominal (every row's prompt) {nominal_tflops:.2f}"
          + (f", MFU {out['nominal_mfu']:.1%}" if peak_tflops else ""))
    if a.real_lengths:  # the decode ran as many steps as the longest row, not --new_tokens: no bandwidth figure
        out.update(decode_gbps=None, roofline_share=None, decode_read_gbps=None, read_roofline_share=None)
    else:
        print(f"  decode         {read_gbps:10.1f} GB/s of weight and KV-cache bytes read"
              + (f", {out['read_roofline_share']:.1%} of the {peak_gbps:.0f} GB/s roofline" if peak_gbps else "")
              + f"; an ideal decoder's bytes {gbps:.1f} GB/s"
              + (f", {out['roofline_share']:.1%}" if peak_gbps else ""))
    print(f"  peak memory    {out['peak_mem_mb'] / 1024:10.2f} GiB")
    return out, tr


def versus_transformers(out, tr, a, cfg, device):
    """transformers' generate alone on the same weights, prompts of the same pool, the same shape."""
    n = a.prompts * a.k
    prompts = [tr.tok.encode(p) for p in pool_prompts(a.prompts, a.seed + 1) for _ in range(a.k)]
    hf = hf_generate(tr.model, tr.tok, prompts, a.new_tokens, device, cfg)
    if hf is None:
        print("transformers comparison skipped: transformers is not installed (pip install transformers)")
        return
    run, version, cache = hf
    hf_s = timed({"hf": run}, a.steps)["hf"]
    out.update(hf_version=version, hf_cache=cache, hf_generate_s=hf_s, hf_rollout_tok_s=n * a.new_tokens / hf_s,
               hf_completions_s=n / hf_s)
    out["rollout_vs_hf"] = out["rollout_tok_s"] / out["hf_rollout_tok_s"]
    print(f"transformers {version} generate alone ({cache} cache): {n / hf_s:.1f} completions/s; our whole GRPO "
          f"step is {out['completions_s'] / out['hf_completions_s']:.2f}x its generation alone, our rollout "
          f"{out['rollout_vs_hf']:.2f}x its speed")


def versus_trl(out, snapshot, a, cfg, device, workdir):
    """trl.GRPOTrainer on the same snapshot and pool, K, forced length, KL coefficient, loss, micro-batch and
    dtype: --trl_steps optimizer steps timed after one warm-up step."""
    try:
        import datasets
        import transformers
        import trl
    except ImportError as e:
        print(f"TRL comparison skipped: {e.name or e} is not installed ({GET_TRL} installs trl and transformers)")
        return
    transformers.utils.logging.disable_progress_bar()
    n = a.prompts * a.k
    mb = min(cfg.micro_batch_size or n, n)
    mb = max(d for d in range(1, mb + 1) if n % d == 0)  # TRL's micro-batches must make up the batch exactly
    cuda = device.type == "cuda"
    args = trl.GRPOConfig(
        output_dir=os.path.join(workdir, "trl"), report_to="none", save_strategy="no", logging_strategy="no",
        disable_tqdm=True, use_cpu=not cuda, seed=cfg.seed, max_steps=1 + a.trl_steps, shuffle_dataset=False,
        per_device_train_batch_size=mb, gradient_accumulation_steps=n // mb, num_generations=a.k,
        max_completion_length=a.new_tokens, generation_kwargs={} if a.real_lengths else {"min_new_tokens": a.new_tokens},
        temperature=cfg.temperature, top_k=cfg.top_k, beta=cfg.kl_coef, loss_type=cfg.loss_type,
        epsilon=cfg.clip_eps_low, epsilon_high=cfg.clip_eps_high, num_iterations=cfg.num_iterations,
        scale_rewards=cfg.scale_rewards, learning_rate=cfg.lr, weight_decay=cfg.weight_decay,
        adam_beta1=cfg.adam_beta1, adam_beta2=cfg.adam_beta2, max_grad_norm=cfg.grad_clip,
        bf16=cuda and cfg.bf16, gradient_checkpointing=cfg.grad_checkpointing, disable_dropout=True)

    def digit_share(completions, **kwargs):  # cheap, and it varies within a group
        return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]

    stamps, lengths = [], []

    class Clock(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            sync(device)
            stamps.append((time.perf_counter(), time.process_time()))
            if cuda and len(stamps) == 1:
                torch.cuda.reset_peak_memory_stats()
            try:  # TRL's own count of completion tokens (a private attribute: skipped if it moves)
                lengths.append(trainer._metrics["train"]["completions/mean_length"][-1])
            except (AttributeError, KeyError, IndexError):
                pass

    prompts = pool_prompts(a.prompts * (a.trl_steps + 1), a.seed + 2)
    trainer = trl.GRPOTrainer(
        model=snapshot, reward_funcs=digit_share, args=args, callbacks=[Clock()],
        train_dataset=datasets.Dataset.from_dict({"prompt": prompts}),
        processing_class=transformers.AutoTokenizer.from_pretrained(snapshot))  # vocab.json + merges.txt, offline
    trainer.remove_callback(transformers.PrinterCallback)  # its end-of-training dict of metrics
    trainer.train()
    out["trl_completion_tokens"] = statistics.mean(lengths) if lengths else None  # forced: new_tokens
    steps = sorted((t1 - t0, c1 - c0) for (t0, c0), (t1, c1) in zip(stamps, stamps[1:]))
    step_s, cpu_step_s = steps[len(steps) // 2]  # the median step, as ours
    out.update(trl_version=trl.__version__, trl_micro_batch_size=mb, trl_step_s=step_s, trl_cpu_step_s=cpu_step_s,
               trl_completions_s=n / step_s, ours_vs_trl=step_s / out["step_s"],
               ours_vs_trl_cpu_time=cpu_step_s / out["cpu_step_s"],
               trl_peak_mem_mb=peak_memory_mb(device) if cuda else None)  # a CPU's is the whole process's
    print(f"TRL {trl.__version__} GRPOTrainer: {out['trl_completions_s']:.1f} completions/s ({step_s:.2f} s per step"
          + (f", peak {out['trl_peak_mem_mb'] / 1024:.2f} GiB" if cuda else "")
          + f"); ours {out['completions_s']:.1f}: "
          f"ours/TRL = {out['ours_vs_trl']:.2f}x"
          + ("" if cuda else f" (by CPU seconds per step, {out['ours_vs_trl_cpu_time']:.2f}x)"))


def bench_step(a):
    device = resolve_device(a.device)
    with tempfile.TemporaryDirectory() as d:
        snapshot = a.model_path
        if not snapshot:
            torch.manual_seed(a.seed)
            snapshot = save_model(GPT(GPTConfig(n_layer=a.n_layer, n_head=a.n_head, n_embd=a.n_embd, n_positions=256)),
                                  Tokenizer.gpt2(), f"{d}/model")
        cfg = Config(model_path=snapshot, device=a.device, log_dir=f"{d}/logs", run_name="bench", seed=a.seed,
                     batch_size=a.prompts, k_samples=a.k, max_new_tokens=a.new_tokens, eval_every=0, save_every=0,
                     score_workers=a.score_workers, micro_batch_size=a.micro_batch_size, bf16=a.bf16,
                     compile=a.compile, compile_decode=a.compile_decode, auto_batch_size=a.auto_batch_size,
                     shared_prefix_decode=a.shared_prefix_decode, fused_logprobs=a.fused_logprobs)
        out, tr = ours(a, cfg, device)
        if a.real_lengths and not a.no_transformers:  # its tokens/s would need its lengths: not comparable
            print("transformers comparison skipped under --real_lengths (its rows stop at other lengths than ours)")
        elif not a.no_transformers:
            guarded(out, "transformers", versus_transformers, out, tr, a, cfg, device)
        del tr
        free_memory(device)
        if not a.no_trl:
            guarded(out, "trl", versus_trl, out, snapshot, a, cfg, device, d)
            free_memory(device)
    return {"mode": "step", **out}


# ----------------------------------------------------------------------------- sampler

@torch.no_grad()
def generate_full_recompute(model, prompts, max_new_tokens):
    """The naive baseline: every new token runs the whole sequence again (no cache; the vocabulary projection on
    the last position only), sampling at T=1."""
    ids, mask = pad_left(prompts, 50256, next(model.parameters()).device)
    for _ in range(max_new_tokens):
        probs = torch.softmax(model.lm_head(model.hidden(ids, mask)[:, -1]).float(), -1)
        ids = torch.cat([ids, torch.multinomial(probs, 1)], 1)
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
    return ids


def bench_sampler(a):
    device = resolve_device(a.device)
    cfg = Config(bf16=a.bf16)
    tok = Tokenizer.gpt2()
    torch.manual_seed(a.seed)
    model = GPT(GPTConfig(n_layer=a.n_layer, n_head=a.n_head, n_embd=a.n_embd, n_positions=256)).to(device).eval()
    prompts = [tok.encode(p) for p in pool_prompts(a.prompts, a.seed) for _ in range(a.k)]
    tokens = len(prompts) * a.new_tokens  # random weights almost never sample EOS: every row runs to the end
    extra = {"compile_decode": True} if a.compile_decode else {}

    def ours():
        with autocast(device, cfg):
            generate(model, prompts, a.new_tokens, **extra)
        sync(device)

    def recompute():
        with autocast(device, cfg):
            generate_full_recompute(model, prompts, a.new_tokens)
        sync(device)

    print(f"{device_name(device)}: {model.num_params() / 1e6:.1f}M params, {len(prompts)} rows ({a.prompts} prompts "
          f"x {a.k}), prompts ~{sum(map(len, prompts)) // len(prompts)} tokens, {a.new_tokens} new tokens, "
          f"median of {a.steps} interleaved rounds")
    out = {"mode": "sampler", "device": device_name(device), "rows": len(prompts), "new_tokens": a.new_tokens}
    ours()  # warm-up (and compilation)
    recompute()
    fns = {"ours": ours, "recompute": recompute}
    names = {"ours": "ours: generate (KV cache, shared prefill)", "recompute": "full recompute per token"}
    hf = hf_generate(model, tok, prompts, a.new_tokens, device, cfg)
    if hf is None:
        print("transformers not installed: its row is skipped")
    else:
        fns["hf"], out["hf_version"], out["hf_cache"] = hf
        names["hf"] = f"transformers {hf[1]} generate ({hf[2]} cache)"
    for key, seconds in timed(fns, a.steps).items():
        out[f"{key}_tok_s"] = tokens / seconds
    for key, name in names.items():
        rate = out[f"{key}_tok_s"]
        print(f"{name:50s} {rate:9.0f} tok/s   ours is {out['ours_tok_s'] / rate:5.2f}x this")
    return out


# ----------------------------------------------------------------------------- scoring

def policy_variants(s, rng):
    ref = s.completion
    other = rng.choice(sorted(legal_ucis(s.fen)))
    return [ref,
            ref.replace("B: " + s.best, "B: " + other),
            ref.replace(s.moves[-1], "a1a1", 1),
            " M: " + " ".join(s.moves) + " E: " + " ".join(str(e + 0.3) for e in s.evals) + " B: " + s.best,
            ref[:rng.randrange(1, len(ref))],
            "".join(rng.choice("abcdefgh12345678 MEB:.-") for _ in range(60))]


def env_variants(s, rng):
    ref = s.completion
    i = rng.randrange(len(s.next_fen))
    return [ref,
            ref[:i] + ("x" if ref[i] != "x" else "y") + ref[i + 1:],
            ref[:-3] + ("0" if s.terminated else "1") + ref[-2:],
            f"{s.fen}+0.001+0+0",  # the position not updated
            ref.replace(f"+{s.reward}+", "+0.5+"),
            ref[:rng.randrange(1, len(ref))],
            "".join(rng.choice("rnbqkpRNBQKP12345678/ w-+.") for _ in range(60))]


def bench_scoring(a):
    """Completions/s on one core on the first --prompts shipped eval positions: the reference, mutated
    completions (other best move, illegal candidate, shifted evals, wrong FEN character, FEN not updated, wrong
    flags, cut short) and garbage, in equal shares. Legal moves are computed once per position, as for a group
    of completions."""
    rng = random.Random(a.seed)
    policy = load_jsonl(EVAL_PATH)[:a.prompts]
    env = [random_env_sample(s.fen, s.history, rng) for s in policy]
    out = {"mode": "scoring"}
    for task, samples, variants in (("P", policy, policy_variants), ("A", env, env_variants)):
        pairs = [(s, c) for s in samples for c in variants(s, rng)]
        ss, cs = [s for s, _ in pairs], [c for _, c in pairs]
        best = float("inf")
        for _ in range(3):
            legal_ucis.cache_clear()
            t = time.perf_counter()
            score_batch(ss, cs)
            best = min(best, time.perf_counter() - t)
        out[f"{task}_completions_s"] = len(pairs) / best
        print(f"{task}: {len(pairs) / best:,.0f} completions/s per core ({len(pairs)} completions: reference, "
              "mutated, garbage)")
    if a.engine:
        workers = score_workers(Config(score_workers=a.score_workers), resolve_device(a.device))  # as train.py's
        out.update(bench_engine_reward(rng, policy[:32], a.k or 8, workers))
    return out


def bench_engine_reward(rng, positions, k, workers):
    """P: completions scored per second by ScoringPool(workers) with the labels and with --p_reward engine
    (depth 10) from a cold cache (a new file) and a warm one (the same batch again): K completions per
    position with the labels' M:/E: and a random legal B: move, mostly outside the top 5, the engine's
    worst case."""
    samples = [s for s in positions for _ in range(k)]
    texts = [policy_completion(s.moves, s.evals, rng.choice(sorted(legal_ucis(s.fen)))) for s in samples]
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        engine = EngineReward(find_stockfish(), cache_path=os.path.join(tmp, "moves.jsonl"))
        for name, spec in (("labels", None), ("engine_cold", engine), ("engine_warm", engine)):
            pool = ScoringPool(workers, engine=spec)
            if name == "engine_warm":
                pool.submit(samples, texts)()  # the cold pass of this pool's processes fills the cache
            t0 = time.perf_counter()
            pool.submit(samples, texts)()
            out[f"P_{name}_completions_s"] = len(samples) / (time.perf_counter() - t0)
            pool.close()
            print(f"P: {name:12s} {out[f'P_{name}_completions_s']:9,.1f} completions/s ({len(samples)} completions, "
                  + (f"{workers} scoring workers)" if workers else "scored in-process)"))
    return out


def bench_data(a):
    """sft.py's batch making on one core, what a data worker does (SFTData.batch, then encode_batch): samples/s
    over --steps batches of --prompts after one warm-up, both paddings, at the GPU runs' A: share of 0.4
    (--mix_env_ratio) on the shipped pool or --data_file. Set beside a GPU run's samples/s (steps/s x batch) over
    its --data_workers, it says whether those workers can be what holds the run back."""
    argv = ["--seed", str(a.seed), "--mix_env_ratio", str(a.mix_env_ratio), "--policy_pad", "both"]
    if a.data_file:
        argv += ["--data_source", "file", "--data_file", a.data_file]
    data, tok = SFTData(parse_args(argv, "sft")), Tokenizer.gpt2()
    encode_batch(data.batch(a.prompts), tok, "cpu")
    t0 = time.perf_counter()
    for _ in range(a.steps):
        encode_batch(data.batch(a.prompts), tok, "cpu")
    rate = a.steps * a.prompts / (time.perf_counter() - t0)
    print(f"data: {rate:,.0f} samples/s on one core ({a.steps} batches of {a.prompts}, A: share {a.mix_env_ratio})")
    return {"mode": "data", "samples_s": rate}


# ----------------------------------------------------------------------------- command line

def main(argv=None):
    p = Parser(__doc__, usage="%(prog)s [step|sampler|scoring|data] [options]",
               checks={"prompts": at_least(1), "k": at_least(1), "new_tokens": at_least(2), "steps": at_least(1),
                       "peak_tflops": at_least(0), "peak_gbps": at_least(0), "trl_steps": at_least(1)})
    p.add_argument("mode", nargs="?", default="step", choices=list(MODE_DEFAULTS))
    p.add_argument("--n_layer", type=int, help="model shape (default: step 12 x 12 heads x 768, sampler 4 x 4 x 256)")
    p.add_argument("--n_head", type=int, help="attention heads (default: by mode, see --n_layer)")
    p.add_argument("--n_embd", type=int, help="width (default: by mode, see --n_layer)")
    p.add_argument("--prompts", type=int, help="distinct prompts per step (default: step 64, sampler 4; scoring: "
                   "eval positions, 500)")
    p.add_argument("--k", type=int, help="completions per prompt (default: step 16, sampler 4)")
    p.add_argument("--new_tokens", type=int, default=64, help="completion length")
    p.add_argument("--steps", type=int, default=3, help="timed steps (sampler: repeats) after one warm-up")
    p.add_argument("--micro_batch_size", type=int, default=128, help="completions per forward/backward (0: all)")
    p.add_argument("--bf16", "--no_bf16", action=Switch, default=True, help="bf16 autocast on CUDA")
    p.add_argument("--compile_decode", action="store_true", help="the compiled static-shape decode step")
    p.add_argument("--compile", action="store_true", help="step: the training and reference forwards compiled (CUDA)")
    p.add_argument("--auto_batch_size", action="store_true", help="step: let the Trainer pick the batch size first")
    p.add_argument("--model_path", default="", help="step: a snapshot to time (a trained model: completions of real "
                   "lengths, scored for what they are) instead of random weights of the --n_layer shape")
    p.add_argument("--real_lengths", action="store_true", help="step: TRL samples until EOS too (not forced to "
                   "--new_tokens, now a budget), as ours always does; with a trained --model_path")
    for name in ("shared_prefix_decode", "fused_logprobs"):  # the Trainer's switches, for before/after figures
        p.add_argument(f"--{name}", f"--no_{name}", action=Switch, default=FIELDS[name].default,
                       help=FIELDS[name].metadata["help"])
    p.add_argument("--score_workers", type=int, default=-1, help="step, scoring --engine: as train.py's (-1: on "
                   "CUDA one per spare core, up to 4; on a CPU none, scored in-process)")
    p.add_argument("--device", default="auto", help="cuda, cpu or auto")
    p.add_argument("--seed", type=int, default=0, help="seed of the prompts and the model's random weights")
    p.add_argument("--peak_tflops", type=float, default=0.0, help="device peak for MFU (default: known GPUs)")
    p.add_argument("--peak_gbps", type=float, default=0.0, help="memory bandwidth peak (default: known GPUs)")
    p.add_argument("--no_transformers", action="store_true", help="step: skip the transformers comparison")
    p.add_argument("--engine", action="store_true", help="scoring: also the --p_reward engine reward, cold and warm cache")
    p.add_argument("--no_trl", action="store_true", help="step: skip the TRL comparison")
    p.add_argument("--trl_steps", type=int, default=2, help="timed TRL steps after one warm-up")
    p.add_argument("--data_file", default="", help="data: comma-separated pools or text files (default: the shipped pool)")
    p.add_argument("--mix_env_ratio", type=float, default=0.4, help="data: the A: share of the batches")
    p.add_argument("--json", default="", metavar="PATH", help="write the figures to this JSON file")
    a = p.parse_args(argv)
    words = sys.argv[1:] if argv is None else argv
    given = {act.dest for act in p._actions for o in act.option_strings for w in words if w.split("=")[0] == o}
    for name, modes in FLAG_MODES.items():  # a flag given where it does nothing: refused
        if a.mode not in modes and name in given:
            names = " and ".join([", ".join(modes[:-1]), modes[-1]] if len(modes) > 1 else modes)
            p.error(f"--{name} is read by the {names} mode{'s' * (len(modes) > 1)} only; the {a.mode} mode would "
                    "ignore it")
    if a.mode == "step" and a.model_path and not a.real_lengths:
        p.error("--model_path goes with --real_lengths: a trained model's rows stop at EOS, so the comparisons and "
                "the decode bandwidth would count --new_tokens tokens that never ran")
    if a.json:  # refused now, not over an input once the benchmark has run
        inputs = [f for f in a.data_file.split(",") if f] + [os.path.join(a.model_path, f) for f in SNAPSHOT_FILES
                                                              if a.model_path]
        real = os.path.realpath(a.json)
        if any(real == os.path.realpath(f) for f in inputs) or in_data_dir(real):
            p.error(f"--json {a.json} would write the figures over an input or a file the project ships; give them "
                    "a file of their own")
    for k, v in MODE_DEFAULTS[a.mode].items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    try:
        out = {"step": bench_step, "sampler": bench_sampler, "scoring": bench_scoring, "data": bench_data}[a.mode](a)
    except (OSError, ValueError, LoadError) as e:  # a bad --data_file or --model_path: its loader's sentence
        sys.exit(f"bench.py: {error_sentence(e)}")
    if a.json:
        # on a full disk to a temporary file, named in the one sentence it exits with
        save_report({"argv": sys.argv[1:] if argv is None else argv, **out}, a.json, "bench.py")
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    run_command(main)
