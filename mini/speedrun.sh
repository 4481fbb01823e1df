#!/usr/bin/env bash
# Every GPU figure of the project from one command, on a bare GPU machine (no network, no Stockfish).
#
#   bash mini/speedrun.sh [--wheels DIR] [--out DIR] [--export DIR] [--cpu-smoke] [STAGE...]
#
#   STAGE     test | bench | train | eval | ddp (default: all five, in that order); a summary table of every
#             figure found in the output folder is printed at the end, whichever stages ran
#   --wheels  install every wheel in DIR (pip --no-index --no-deps) into /tmp/speedrun-site, put on PYTHONPATH
#   --out     output folder for logs, JSON figures, runs and snapshots (default logs/speedrun)
#   --export  copy the small files of --out (JSON, JSONL, logs, text; no checkpoints or weights) to DIR
#   --cpu-smoke  every stage at a toy size on the CPU, in well under 2 minutes (CI runs it: mini/test_bench.py)
#
#   test   the CUDA tests (pytest -k cuda: names or @pytest.mark.cuda), then the fast suite without the slow
#          learning test and this script's own test (test files that need hypothesis are left out without it)
#   bench  mini/bench.py step at the 124M config, 64 prompts x 16, 64 tokens, micro-batch 128, bf16: ours vs
#          transformers' generate vs TRL's GRPOTrainer (bench.json); with the shared-prefix decode cache (the
#          CPU's default; CUDA's is a copy per row) (bench_shared_prefix.json); with --compile_decode --compile (bench_compiled.json); and
#          --auto_batch_size, the batch size it picks and its speed (bench_auto.json)
#   train  SFT of a 124M GPT-2 from scratch for SFT_MIN minutes (the hub is out of reach), then GRPO_STEPS GRPO
#          steps of GRPO_BATCH prompts x GRPO_K from it, peak memory per step in grpo/metrics.jsonl
#   eval   mini/evaluate.py on EVAL_N prompts per task before (SFT) and after (GRPO), and --compare
#   ddp    DDP_STEPS GRPO steps from the SFT model, plain and under `torchrun --nproc_per_node 1` (DDP-wrapped,
#          a process group of one) at the same seed: the metrics must agree, and the completions/s of the
#          two give what the wrapping costs
#
# Each stage stays well under 10 minutes on an H100; run them in separate calls where a call is limited
# to 10 minutes (the output folder carries the SFT and GRPO snapshots from train to eval):
#   bash mini/speedrun.sh --wheels .whl --export "$OUT" bench
#   bash mini/speedrun.sh --wheels .whl --export "$OUT" train eval ddp
#   bash mini/speedrun.sh --wheels .whl --export "$OUT" test
# Sizes can be changed through the environment: SFT_MIN (3), GRPO_STEPS (200), GRPO_BATCH (16), GRPO_K (8),
# GRPO_LR (1e-5), GRPO_ARGS (more train.py flags, e.g. --compile_decode), EVAL_N (200), DDP_STEPS (20), PYTHON (python3),
# STEP_TIMEOUT (seconds per command, 570).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
OUT=logs/speedrun
WHEELS=""
EXPORT=""
SMOKE=0
STAGES=()
while (($#)); do
  case $1 in
    --wheels) WHEELS=${2:?--wheels needs a directory}; shift 2 ;;
    --out) OUT=${2:?--out needs a directory}; shift 2 ;;
    --export) EXPORT=${2:?--export needs a directory}; shift 2 ;;
    --cpu-smoke) SMOKE=1; shift ;;
    test | bench | train | eval | ddp) STAGES+=("$1"); shift ;;
    -h | --help) awk 'NR > 1 && /^set -euo/ {exit} NR > 1' "$0"; exit 0 ;;  # the header comment
    *) echo "speedrun.sh: unknown argument '$1' (stages: test bench train eval ddp; see --help)" >&2; exit 2 ;;
  esac
done
((${#STAGES[@]})) || STAGES=(test bench train eval ddp)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

if [[ -n $WHEELS ]]; then
  compgen -G "$WHEELS/*.whl" >/dev/null || { echo "speedrun.sh: no .whl files in $WHEELS" >&2; exit 2; }
  if "$PY" -m pip --version >/dev/null 2>&1; then
    "$PY" -m pip install -q --no-index --no-deps --upgrade --target /tmp/speedrun-site "$WHEELS"/*.whl
  else  # a pure-Python wheel is a zip of what pip would install
    for w in "$WHEELS"/*.whl; do "$PY" -m zipfile -e "$w" /tmp/speedrun-site; done
  fi
  echo "installed into /tmp/speedrun-site: $(cd "$WHEELS" && ls -- *.whl | tr '\n' ' ')"
  export PYTHONPATH=/tmp/speedrun-site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # the mini package, without an install
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false

SFT_MIN=${SFT_MIN:-3}
GRPO_STEPS=${GRPO_STEPS:-200}
GRPO_BATCH=${GRPO_BATCH:-16}
GRPO_K=${GRPO_K:-8}
GRPO_LR=${GRPO_LR:-1e-5}
EVAL_N=${EVAL_N:-200}
DDP_STEPS=${DDP_STEPS:-20}
if ((SMOKE)); then  # toy sizes, on the CPU even where a GPU is present
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # a toy model gains nothing from a second thread
  DEV=(--device cpu)
  SHAPE=(--n_layer 1 --n_head 1 --n_embd 32)
  SFT_ARGS=(--steps 2 --batch_size 2 --lr 1e-3 --warmup_steps 1)
  GRPO_STEPS=2 GRPO_BATCH=2 GRPO_K=2 EVAL_N=2 DDP_STEPS=2
  GEN=(--max_new_tokens 8)
else
  DEV=()
  SHAPE=(--n_layer 12 --n_head 12 --n_embd 768)
  # the LR schedule runs over --steps or the time limit, whichever ends first: 4000 steps is about what an H100
  # does in 3 minutes, so the warmup is ~100 real steps and the cosine ends with the time
  SFT_ARGS=(--steps 4000 --time_limit_min "$SFT_MIN" --batch_size 64 --lr 5e-4 --warmup_steps 100)
  GEN=()
fi

py() { timeout "${STEP_TIMEOUT:-570}" "$PY" "$@"; }

stage_test() {
  local skip=() rc=0
  if ! "$PY" -c "import hypothesis" 2>/dev/null; then
    for f in $(grep -lE '^(from|import) hypothesis' mini/test_*.py); do skip+=(--ignore="$f"); done
    echo "hypothesis is not installed: leaving out ${skip[*]#--ignore=}"
  fi
  echo "== the CUDA tests (pytest -k cuda)"
  py -m pytest -q -ra mini -k cuda "${skip[@]}" -p no:cacheprovider || rc=$?
  if ((rc == 5)); then echo "no CUDA tests were collected"; rc=0; fi
  ((rc == 0)) || return "$rc"
  if ((SMOKE)); then
    echo "== the fast suite: left out of --cpu-smoke (CI runs it on its own)"
  else
    echo "== the fast suite, without the learning test and this script's test"
    py -m pytest -q -ra mini -k "not cuda" --deselect mini/test_learning.py --deselect mini/test_bench.py \
      "${skip[@]}" -p no:cacheprovider
  fi
}

stage_bench() {
  local fail=0 size=()
  rm -f "$OUT"/bench*.json  # a stage that fails must not leave an earlier run's figures for the summary
  if ((SMOKE)); then
    size=("${DEV[@]}" "${SHAPE[@]}" --prompts 2 --k 2 --new_tokens 8 --steps 1 --trl_steps 1)
  else
    size=(--bf16 --micro_batch_size 128 --steps 3 --trl_steps 2)
  fi
  echo "== bench: ours vs transformers vs TRL"
  py -m mini.bench step "${size[@]}" --json "$OUT/bench.json" || fail=1
  export_figures
  echo "== bench --shared_prefix_decode: each group's prompt once (fewer bytes, more kernels a token; the CPU's default)"
  py -m mini.bench step "${size[@]}" --shared_prefix_decode --no_transformers --no_trl \
    --json "$OUT/bench_shared_prefix.json" || fail=1
  export_figures
  if ((SMOKE)); then
    echo "== bench --compile_decode: left out of --cpu-smoke (compilation takes minutes on a CPU)"
  else
    echo "== bench --compile_decode --compile"
    py -m mini.bench step "${size[@]}" --compile_decode --compile --steps 5 --no_transformers --no_trl \
      --json "$OUT/bench_compiled.json" || fail=1
    export_figures
  fi
  echo "== bench --auto_batch_size"
  py -m mini.bench step "${size[@]}" --auto_batch_size --steps 1 --no_transformers --no_trl \
    --json "$OUT/bench_auto.json" || fail=1
  return "$fail"
}

stage_train() {
  rm -rf "$OUT/sft" "$OUT/grpo"
  echo "== SFT warm start"
  py -m mini.sft --model_path scratch "${SHAPE[@]}" "${DEV[@]}" "${SFT_ARGS[@]}" --mix_env_ratio 0.5 \
    --log_dir "$OUT" --run_name sft
  export_figures
  echo "== GRPO: $GRPO_STEPS steps of $GRPO_BATCH prompts x $GRPO_K"
  py -m mini.train --model_path "$OUT/sft/final" "${DEV[@]}" "${GEN[@]}" --steps "$GRPO_STEPS" \
    --batch_size "$GRPO_BATCH" --k_samples "$GRPO_K" --lr "$GRPO_LR" --eval_every 0 --save_every 0 \
    --log_dir "$OUT" --run_name grpo ${GRPO_ARGS:-}
}

stage_eval() {
  local model
  rm -f "$OUT/eval_before.json" "$OUT/eval_after.json" "$OUT/eval_compare.txt"  # no earlier run's figures
  for model in sft grpo; do
    [[ -d $OUT/$model/final ]] || { echo "eval: $OUT/$model/final does not exist; run the train stage first" >&2; return 1; }
  done
  echo "== eval before (SFT) and after (GRPO)"
  py -m mini.evaluate --model_path "$OUT/sft/final" "${DEV[@]}" "${GEN[@]}" --n "$EVAL_N" --out "$OUT/eval_before.json"
  py -m mini.evaluate --model_path "$OUT/grpo/final" "${DEV[@]}" "${GEN[@]}" --n "$EVAL_N" --out "$OUT/eval_after.json"
  py -m mini.evaluate --compare "$OUT/eval_before.json" "$OUT/eval_after.json" | tee "$OUT/eval_compare.txt"
}

stage_ddp() {
  [[ -d $OUT/sft/final ]] || { echo "ddp: $OUT/sft/final does not exist; run the train stage first" >&2; return 1; }
  rm -rf "$OUT/ddp_plain" "$OUT/ddp_torchrun"
  local run=(--model_path "$OUT/sft/final" "${DEV[@]}" "${GEN[@]}" --steps "$DDP_STEPS" --batch_size "$GRPO_BATCH"
             --k_samples "$GRPO_K" --lr "$GRPO_LR" --eval_every 0 --save_every 0 --log_dir "$OUT")
  echo "== GRPO, plain python: $DDP_STEPS steps"
  py -m mini.train "${run[@]}" --run_name ddp_plain
  echo "== the same under torchrun --nproc_per_node 1 (DDP-wrapped)"
  py -m torch.distributed.run --standalone --nproc_per_node 1 -m mini.train "${run[@]}" --run_name ddp_torchrun
}

summary() {
  "$PY" - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]


def load(name):
    try:
        with open(os.path.join(out, name)) as f:
            return [json.loads(line) for line in f if line.strip()] if name.endswith("l") else json.load(f)
    except (OSError, ValueError):
        return None


def num(x, fmt="{:.1f}"):
    return "n/a" if x is None else fmt.format(x)


def pct(x):
    return num(None if x is None else 100 * x, "{:.1f}%")


def mean(xs):
    return sum(xs) / len(xs)


def failed(name):
    return f" (failed: {b[name + '_error']})" if b.get(name + "_error") else ""


rows = []
b, c, auto, shared = (load(f"bench{x}.json") for x in ("", "_compiled", "_auto", "_shared_prefix"))
if b:
    trl, hf = b.get("trl_completions_s"), b.get("hf_rollout_tok_s")
    compiled = lambda text: f" ({text} compiled decode)" if c and text else ""
    rows += [
        ("device", b["device"]),
        ("bench config", f"{b['params_m']:.1f}M params, {b['prompts']} prompts x {b['k']} = {b['completions']} "
                         f"completions of {b['new_tokens']} tokens, micro-batch {b['micro_batch_size'] or b['completions']}, "
                         f"{b['dtype']}"),
        ("completions/s ours", num(b["completions_s"]) + compiled(c and num(c["completions_s"]))),
        ("completions/s transformers", f"{num(b.get('hf_completions_s'))} (its generate alone, "
                                       f"{b.get('hf_cache', 'n/a')} cache)" + failed("transformers")),
        ("completions/s TRL", num(trl, "{:.2f}") + failed("trl")),
        ("ours / TRL", num(b.get("ours_vs_trl"), "{:.2f}x") + compiled(c and trl and f"{c['completions_s'] / trl:.2f}x")
                       + (f" (by CPU seconds: {b['ours_vs_trl_cpu_time']:.2f}x)" if "CPU" in b["device"] and trl else "")),
        ("rollout tokens/s ours", num(b["rollout_tok_s"], "{:.0f}") + compiled(c and num(c["rollout_tok_s"], "{:.0f}"))),
        ("rollout ours / transformers",
         num(b.get("rollout_vs_hf"), "{:.2f}x") + compiled(c and hf and f"{c['rollout_tok_s'] / hf:.2f}x")),
        ("seconds per phase", ", ".join(f"{k} {v:.2f}" for k, v in b["seconds"].items())),
        ("training phase", f"{b['train_tflops']:.2f} TFLOP/s executed, MFU {pct(b['mfu'])} "
                           f"(nominal {b['nominal_tflops']:.2f}, MFU {pct(b['nominal_mfu'])})"),
        ("decode bandwidth", f"{b['decode_read_gbps']:.1f} GB/s read, roofline {pct(b['read_roofline_share'])} "
                             f"(ideal {b['decode_gbps']:.1f} GB/s, {pct(b['roofline_share'])})"
                             + compiled(c and f"{c['decode_read_gbps']:.1f} GB/s, {pct(c['read_roofline_share'])}")),
        ("peak memory", f"ours {b['peak_mem_mb'] / 1024:.2f} GiB"
                        + (f", TRL {b['trl_peak_mem_mb'] / 1024:.2f} GiB" if b.get("trl_peak_mem_mb") else "")),
    ]
if b and shared:
    rows.append(("shared-prefix decode cache", f"{num(shared['completions_s'])} completions/s, "
                 f"rollout {num(shared['rollout_tok_s'], '{:.0f}')} tokens/s, generate {shared['seconds']['generate']:.2f} s "
                 f"(the device's default: {b['seconds']['generate']:.2f} s)"))
if auto:
    rows.append(("auto_batch_size", f"{auto['prompts']} prompts x {auto['k']}: {auto['completions_s']:.1f} "
                                    f"completions/s, peak {auto['peak_mem_mb'] / 1024:.2f} GiB"))
steps = load(os.path.join("grpo", "metrics.jsonl"))
if steps:
    tenth = max(1, len(steps) // 10)
    early, last = steps[tenth - 1], steps[-1]  # step 20 of 200
    rows += [
        (f"GRPO peak memory, step {early['step']} vs {last['step']}",
         f"{early['peak_mem_mb']:.0f} vs {last['peak_mem_mb']:.0f} MiB "
         f"({100 * (last['peak_mem_mb'] / early['peak_mem_mb'] - 1):+.2f}%)"),
        ("GRPO seconds per step", f"{mean([m['time_step'] for m in steps]):.2f} (mean of {len(steps)})"),
        ("GRPO reward, first / last tenth", f"{mean([m['reward_mean'] for m in steps[:tenth]]):.3f} / "
                                            f"{mean([m['reward_mean'] for m in steps[-tenth:]]):.3f}"),
    ]
plain, ddp = load(os.path.join("ddp_plain", "metrics.jsonl")), load(os.path.join("ddp_torchrun", "metrics.jsonl"))
if plain and ddp and len(plain) == len(ddp):
    warm = min(2, len(plain) - 1)  # the first steps pay for allocation and the DDP buckets
    cfg = load(os.path.join("ddp_plain", "config.json"))
    rate = lambda rows: cfg["batch_size"] * cfg["k_samples"] / mean([m["time_step"] for m in rows[warm:]])
    rows += [
        ("1-GPU torchrun vs plain, max |diff|", ", ".join(
            f"{k} {max(abs(a[k] - b[k]) for a, b in zip(plain, ddp)):.2e}" for k in ("reward_mean", "loss", "kl"))),
        ("completions/s plain vs DDP-wrapped", f"{rate(plain):.1f} vs {rate(ddp):.1f} "
                                               f"(overhead {100 * (1 - rate(ddp) / rate(plain)):+.1f}%)"),
    ]
before, after = load("eval_before.json"), load("eval_after.json")
if before and after:
    for k in ("eval_reward", "eval_P_invalid", "eval_P_best_legal", "eval_P_best_acc_label", "eval_P_top5_legal",
              "eval_A_invalid", "eval_A_levenshtein", "eval_A_terminated_acc"):
        if k in before["metrics"] and k in after["metrics"]:
            x, y = before["metrics"][k], after["metrics"][k]
            rows.append((f"{k}, before -> after", f"{x:.3f} -> {y:.3f} ({y - x:+.3f})"))
print(f"\n== speedrun summary ({out}; eval intervals in eval_compare.txt)")
for k, v in rows or [("no figures yet", "run a stage")]:
    print(f"{k:40s} {v}")
EOF
}

export_figures() {  # after every stage, so a call cut off by a time limit still hands back what it measured
  [[ -n $EXPORT ]] || return 0
  mkdir -p "$EXPORT"
  (cd "$OUT" && find . -type f \( -name '*.json' -o -name '*.jsonl' -o -name '*.log' -o -name '*.txt' \) \
    -size -20M -exec cp --parents {} "$EXPORT" \;)
}

FAILED=()
for s in "${STAGES[@]}"; do
  echo "=== stage $s ($(date +%T)), log in $OUT/$s.log"
  t0=$SECONDS
  set +e
  (set -e; "stage_$s") 2>&1 | tee "$OUT/$s.log"
  rc=${PIPESTATUS[0]}
  set -e
  echo "=== stage $s: $( ((rc == 0)) && echo ok || echo "FAILED (exit $rc)") in $((SECONDS - t0)) s"
  ((rc == 0)) || FAILED+=("$s")
  export_figures
done
summary | tee "$OUT/summary.txt"
export_figures
[[ -z $EXPORT ]] || echo "copied the figures and logs of $OUT to $EXPORT"
if ((${#FAILED[@]})); then
  echo "speedrun.sh: stage(s) failed: ${FAILED[*]}; see $OUT/<stage>.log" >&2
  exit 1
fi
