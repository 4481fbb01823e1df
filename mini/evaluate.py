"""
Held-out evaluation: greedy, batched completions scored with the RookWorld metric definitions
(mini/formats.py) and the training reward; train.py calls evaluate() every eval_every steps. Each metric is
a mean over its task's samples (eval_<task>_<name>); an invalid completion is wrong in every accuracy and left
out of the MAEs. --compare pairs two reports on the same prompts with bootstrap intervals. Every metric is
defined in the README.

    python mini/evaluate.py --model_path logs/run/final                    # shipped eval set, Config().eval_n per task
    python mini/evaluate.py --model_path logs/run/final --n 500 --out logs/run/eval-500.json
    python mini/evaluate.py --model_path logs/run/final --data rookworld_val.txt --n 500   # P: and A: text lines
    python mini/evaluate.py --compare before.json after.json
    python mini/evaluate.py --compare before.json after.json --by_game     # a set of real games: intervals by game
"""
import contextlib
import itertools
import json
import os
import random
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import replace

if not __package__:  # run as `python mini/x.py`, not installed: import `mini` from this checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import chess
import numpy as np
import torch
from tqdm.auto import tqdm

from mini.config import DATA_DIR, EVAL_PATH, FIELDS, Config, at_least
from mini.flags import Parser, Switch, error_sentence, not_a_device, run_command, unwritable_outputs
from mini.dataset import load_jsonl, load_text
from mini.formats import ILLEGAL_KINDS, PAD_WIDTHS, illegal_kind, legal_ucis, parse_env, parse_policy, repad
from mini.loader import SNAPSHOT_FILES, LoadError, load_model
from mini.positions import history_bucket, king_constraint, phase, random_env_sample
from mini.reward_scorer import EngineReward, clip, judge_moves, score_batch
from mini.runtime import autocast, out_of_memory, resolve_device
from mini.sampler import generate
from mini.stockfish import BLUNDER_CP, EngineFailure, find_stockfish

BATCH_SIZE = 64


def first_of_each_bucket(samples, n):
    """n of the A: samples, in their order, taken in turn from each history-length bucket: the realistic set
    stores its transitions bucket by bucket, so its first n alone would all have histories of 1-2."""
    buckets = {}
    for i, s in enumerate(samples):
        buckets.setdefault(history_bucket(len(s.history)), []).append(i)
    in_turn = (i for turn in itertools.zip_longest(*buckets.values()) for i in turn if i is not None)
    return [samples[i] for i in sorted(itertools.islice(in_turn, n))]


def held_out_samples(n_per_task, seed=1234, path=EVAL_PATH, pad=90):
    """The first n P: positions of the eval set (FEN padded to pad), and n of its A: transitions when it holds
    some (the realistic games' set; first_of_each_bucket), else n A: transitions on the same positions (fixed
    seed), each of its position's game."""
    samples = load_jsonl(path)
    policy = [repad(s, pad) for s in samples if s.task == "P"][:n_per_task]
    env = first_of_each_bucket([s for s in samples if s.task == "A"], n_per_task)
    rng = random.Random(seed)
    return policy + (env or [replace(random_env_sample(s.fen, s.history, rng), game=s.game) for s in policy])


def load_eval_set(path, n_per_task, pad=90):
    """Shipped eval set when path is empty, held_out_samples of a .jsonl, else the first n P: and A: lines."""
    if not path or path.endswith(".jsonl"):
        return held_out_samples(n_per_task, path=path or EVAL_PATH, pad=pad)
    samples = [repad(s, pad) for s in load_text(path)[0]]
    samples = [s for s in samples if s.task == "P"][:n_per_task] + [s for s in samples if s.task == "A"][:n_per_task]
    if not samples:
        raise ValueError(f"{path} holds no valid RookWorld P: or A: line")
    return samples


def pv1_of(s):
    """Stockfish's PV1 among the labelled moves, or None when a tie at the top hides it (see docstring)."""
    top = [m for m, e in zip(s.moves, s.evals) if e == max(s.evals)]
    return s.best if s.best in top else top[0] if len(top) == 1 else None


def policy_values(s, completion):
    """(name, value) pairs of one P: completion."""
    try:
        moves, evals, best = parse_policy(completion)
    except ValueError:  # invalid: wrong on every accuracy, nothing for the MAE
        moves, evals, best = [], [], None
    legal, label, pv1 = legal_ucis(s.fen), dict(zip(s.moves, s.evals)), pv1_of(s)
    named = dict(zip(moves, evals))  # a repeated move counts once (its last eval), as in the reward
    matched = [m for m in named if m in label]  # list, not set: a fixed order keeps the float sums reproducible
    out = [("best_legal", best in legal), ("top5_acc", len(matched) / len(label)),
           ("top5_legal", sum(m in legal for m in named) / len(named) if named else 0.0)]
    kind = illegal_kind(s.fen, best) if best is not None and best not in legal else None  # a legal move has none
    out += [(f"illegal_{k}", kind == k) for k in ILLEGAL_KINDS]
    board = chess.Board(s.fen)
    out.append((f"best_legal_{phase(board)}", best in legal))
    constraint = king_constraint(board)
    out.append(("best_legal_in_check" if constraint == "check" else "best_legal_not_in_check", best in legal))
    if constraint != "check":  # out of check, by what the king's safety forbids there
        out.append((f"best_legal_{constraint}", best in legal))
    if pv1:  # accuracy among legal answers, what the model knows when it writes a move at all (None where this
        # answer is illegal, left out of the mean, so that --compare pairs the prompts where both answers are legal)
        out.append(("best_acc_pv1_legal", best == pv1 if best in legal else None))
    for suffix in ("", "_white" if s.fen.split()[1] == "w" else "_black"):
        out.append(("best_acc_label" + suffix, best == s.best))
        if pv1:
            out.append(("best_acc_pv1" + suffix, best == pv1))
    return out + [("eval_mae", abs(clip(named[m]) - clip(label[m]))) for m in matched]


def env_values(s, completion, comps):
    """(name, value) pairs of one A: completion; the reward's components are the accuracies (0 when invalid)."""
    out = [("next_state_exact", comps["fen_exact"]), ("levenshtein", comps["fen_similarity"]),
           ("reward_exact", comps["reward_exact"]), ("terminated_acc", comps["terminated_exact"]),
           ("truncated_acc", comps["truncated_exact"])]
    if comps["format_valid"]:
        out.append(("reward_mae", abs(clip(parse_env(completion)[1], 1.0) - s.reward)))
    return out + [(f"next_state_exact_h{history_bucket(len(s.history))}", comps["fen_exact"])]


def quality_values(samples, completions, engine):
    """(name, value) pairs of move quality per sample (see the docstring), from an EngineReward's engine;
    a P: move the engine could not judge gets None values, so that the lists stay aligned with the P: samples."""
    out = []
    for s, (move, q) in zip(samples, judge_moves(engine, samples, completions)):
        if s.task != "P":
            out.append([])
        elif q is None:
            out.append([(k, None) for k in ("cpl", "winprob_loss", "blunder", "move_score", "cpl_legal")])
        else:
            out.append([("cpl", q["cpl"]), ("winprob_loss", q["winprob_loss"]), ("blunder", q["cpl"] >= BLUNDER_CP),
                        ("move_score", q["score"])]
                       # over legal moves only (None otherwise, left out of the mean): how good a legal answer is
                       + [("cpl_legal", q["cpl"] if move in legal_ucis(s.fen) else None)])
    return out


def sample_values(samples, completions, shaping="continuous", engine=None):
    """(index of the sample, metric name, value) of every value per_sample_values holds, sample by sample: a value
    per sample the metric applies to (per matched move for eval_P_eval_mae), a float or None. engine: an
    EngineReward, for the move quality metrics (None where the engine could not judge the move)."""
    quality = quality_values(samples, completions, engine) if engine else [[]] * len(samples)
    scored = zip(samples, completions, score_batch(samples, completions, shaping), quality, strict=True)
    for i, (s, c, (reward, comps), q) in enumerate(scored):
        t = s.task
        valid = comps["format_valid"]
        pairs = [("eval_reward", reward), (f"eval_reward_{t}", reward), (f"eval_format_valid_{t}", valid),
                 (f"eval_{t}_invalid", 1.0 - valid)]
        pairs += [(f"eval_{t}_{k}", v) for k, v in (policy_values(s, c) if t == "P" else env_values(s, c, comps))]
        pairs += [(f"eval_{t}_{k}", v) for k, v in q]
        for name, v in pairs:
            yield i, name, None if v is None else float(v)


def by_metric(triples):
    """{metric name: its values in order} of (index, name, value) triples, the names sorted."""
    vals = defaultdict(list)
    for _, name, v in triples:
        vals[name].append(v)
    return dict(sorted(vals.items()))


def per_sample_values(samples, completions, shaping="continuous", engine=None):
    """{metric name: values} of sample_values."""
    return by_metric(sample_values(samples, completions, shaping, engine))


def known(v):
    """The measured values of a per_sample_values list (None: the engine could not judge that move)."""
    return [x for x in v if x is not None]


def means(values):
    """{metric name: mean} of per_sample_values over the measured values, and the median centipawn loss when
    it was measured; a metric with no measured value is left out."""
    values = {k: known(v) for k, v in values.items()}
    out = {k: sum(v) / len(v) for k, v in values.items() if v}
    if values.get("eval_P_cpl"):
        out["eval_P_cpl_median"] = float(np.median(values["eval_P_cpl"]))
    return dict(sorted(out.items()))


def engine_or_reason(a):
    """(EngineReward, None) for --engine_quality, (None, one sentence) when Stockfish is missing."""
    try:
        return EngineReward(find_stockfish(a.stockfish_path), a.engine_depth, a.engine_nodes, a.engine_cache), None
    except FileNotFoundError as e:
        return None, f"move quality skipped: {e}"


@torch.no_grad()
def complete_texts(model, tokenizer, prompts, max_new_tokens=96, batch_size=BATCH_SIZE, autocast=None, progress=False,
                   compile_decode=False, temperature=0.0, top_k=0, generator=None):
    """Completions of prompt texts (text after the prompt, without EOS), in batches, in eval mode;
    greedy unless a temperature is given."""
    was_training = model.training
    model.eval()
    completions = []
    try:
        for i in tqdm(range(0, len(prompts), batch_size), desc="eval", unit="batch",
                      disable=not progress or len(prompts) <= batch_size):
            with autocast or contextlib.nullcontext():
                out = generate(model, [tokenizer.encode(p) for p in prompts[i:i + batch_size]], max_new_tokens,
                               temperature=temperature, top_k=top_k, eos_id=tokenizer.eos_token_id, generator=generator,
                               compile_decode=compile_decode)
            completions += [tokenizer.decode(ids) for ids, _ in out]
    finally:
        model.train(was_training)
    return completions


def complete(model, tokenizer, samples, max_new_tokens=96, batch_size=BATCH_SIZE, autocast=None, progress=False,
             compile_decode=False):
    """Greedy completions of the samples' prompts."""
    return complete_texts(model, tokenizer, [s.prompt for s in samples], max_new_tokens, batch_size, autocast,
                          progress, compile_decode)


def evaluate(model, tokenizer, samples, max_new_tokens=96, batch_size=BATCH_SIZE, autocast=None,
             shaping="continuous", progress=False, engine=None, compile_decode=False):
    """(metrics, completions): the RookWorld metrics and mean rewards of greedy completions; with an
    EngineReward (ScoringPool.engine in train.py) the move quality metrics too."""
    completions = complete(model, tokenizer, samples, max_new_tokens, batch_size, autocast, progress, compile_decode)
    return means(per_sample_values(samples, completions, shaping, engine)), completions


def paired_bootstrap(before, after, n_boot=2000, seed=0, clusters=None):
    """Per metric of two per_sample_values dicts on the same prompts: (before, after, after - before,
    2.5th and 97.5th percentile of the delta's bootstrap over prompts, n), over the n prompts where both
    sides have a value (None: not measured). Metrics pooled over matched moves or valid completions only
    (the MAEs) are not paired prompt by prompt and are left out, and so is a metric with no pair (an empty
    section), which has no mean.
    clusters: {metric: the cluster of each of its values} (compare --by_game: the game of each value's
    prompt); such a metric's interval resamples whole clusters, since the prompts of one are not
    independent: a draw takes C clusters with replacement, C the number of clusters among its n pairs, and
    its delta is the sum of their pairs' deltas over the number of their pairs (the ratio estimator).
    Without clusters each prompt is a cluster of its own. Every metric of C clusters is resampled with the
    same draws, seeded by seed and C (default_rng([seed, C])), so that an interval does not depend on which
    other metrics come with it, and clusters of one prompt each give the interval over prompts exactly."""
    draws, rows = {}, {}
    for k in before:
        if k.endswith("_mae") or len(before[k]) != len(after.get(k, ())):
            continue
        ids = (clusters or {}).get(k, range(len(before[k])))  # none given: a cluster per prompt
        kept = [(b, a, c) for b, a, c in zip(before[k], after[k], ids, strict=True) if b is not None and a is not None]
        n = len(kept)
        if n == 0:
            continue
        b, a = np.array([(x, y) for x, y, _ in kept], dtype=float).T
        d = a - b
        index = {}  # the clusters numbered in the order of their first pair: a cluster per prompt is the prompt
        of = np.array([index.setdefault(c, len(index)) for _, _, c in kept])
        n_clusters = len(index)
        if n_clusters not in draws:
            draws[n_clusters] = np.random.default_rng([seed, n_clusters]).integers(0, n_clusters, (n_boot, n_clusters))
        drawn = draws[n_clusters]
        sums, sizes = np.bincount(of, weights=d, minlength=n_clusters), np.bincount(of, minlength=n_clusters)
        boot = sums[drawn].sum(1) / sizes[drawn].sum(1)
        rows[k] = (float(b.mean()), float(a.mean()), float(d.mean()),
                   float(np.percentile(boot, 2.5)), float(np.percentile(boot, 97.5)), n)
    return rows


def number(v):
    return type(v) in (int, float)


def finite(v):
    """A number that a float holds, not NaN or infinite: JSON also reads NaN, 1e999 (inf) and 400-digit ints."""
    return number(v) and abs(v) <= sys.float_info.max


def list_of(ok):
    return lambda v: isinstance(v, list) and all(map(ok, v))


def dict_of(ok):
    return lambda v: isinstance(v, dict) and all(map(ok, v.values()))


def report_sample(x):
    """A sample of an evaluate.py report: its prompt, completion and (if any) label are strings."""
    return isinstance(x, dict) and {"prompt", "completion"} <= set(x) and all(
        isinstance(x[k], str) for k in ("prompt", "completion", "label") if k in x)


def in_data_dir(path):
    """Whether path lies under mini/data/, among the files the project ships."""
    return os.path.realpath(path).startswith(os.path.realpath(DATA_DIR) + os.sep)


def report_path(parser, out, model_path, name, inputs=()):
    """Where a report goes: out (--out), else `name` in the model's folder; a path that could not be written,
    or that names an input (a data file, a file of the snapshot), is refused at once (parser.error), not after
    the minutes of the evaluation."""
    out = out or os.path.join(model_path if os.path.isdir(model_path) else ".", name)
    for problem in unwritable_outputs({"out": out})[:1]:
        parser.error(problem)
    real = os.path.realpath(out)
    snapshot = [os.path.join(model_path, f + ext) for f in SNAPSHOT_FILES for ext in ("", ".sha256")]
    if any(real == os.path.realpath(path) for path in [*inputs, *snapshot] if path):
        parser.error(f"--out {out} would write the report over an input of this evaluation; give the report a "
                     "file of its own")
    if os.path.isfile(real) and in_data_dir(real):
        parser.error(f"--out {out} would write the report over a file the project ships (mini/data/); give the "
                     "report a file of its own")
    return out


def save_or_spare(out, write, script, kept="the report is"):
    """write(path) to out.tmp, then renamed over out: a write cut off (a full disk, Ctrl-C) leaves a file already
    at out whole. When that fails (a full disk), write(spare) to a temporary file instead, and the script exits
    with one sentence that names both, so that the work (an evaluation, minutes of play) is not lost."""
    tmp = out + ".tmp"
    try:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        try:
            write(tmp)
            os.replace(tmp, out)
        finally:
            with contextlib.suppress(OSError):
                os.remove(tmp)
    except OSError as e:
        name, ext = os.path.splitext(os.path.basename(out))
        fd, spare = tempfile.mkstemp(prefix=name + "-", suffix=ext)
        os.close(fd)
        write(spare)
        sys.exit(f"{script}: could not write {out} ({e.strerror or e}); {kept} in {spare}")


def save_report(report, out, script):
    """The report as JSON to out, or to a spare file that the script's last sentence names (save_or_spare)."""
    def write(path):
        with open(path, "w") as f:
            json.dump(report, f, indent=1)
    save_or_spare(out, write, script)


def load_report(path, fields, script):
    """The JSON report in path as script (evaluate.py, chess_eval.py) writes it: a dict holding each key of
    fields, whose value fields[key] accepts; ValueError in one sentence naming the file when it is not one."""
    how = f"run python mini/{script} --model_path MODEL --out {path} to make one"
    not_a_device(path)  # its own sentence, not "is not JSON"
    try:
        with open(path, encoding="utf-8-sig") as f:  # -sig: a report edited by hand may start with a BOM
            report = json.load(f)
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, or nested too deeply
        raise ValueError(f"{path} is not JSON ({str(e)[:80]}); {how}") from None
    if not isinstance(report, dict) or not all(k in report for k in fields):
        raise ValueError(f"{path} is not {'an' if script[0] in 'aeiou' else 'a'} {script} report ({how})")
    for key, ok in fields.items():
        if not ok(report[key]):
            raise ValueError(f"{path}: its {key!r} is {json.dumps(report[key])[:40]}, which no {script} report holds "
                             f"({how})")
    return report


def recorded_eval_set(path):
    """The eval set a report names, here: its path, or, for a shipped set that another checkout recorded (a clone or
    a worktree: .../mini/data/NAME, missing here), this checkout's file of that name (compare then checks that it
    holds the reports' prompts and labels). ValueError when neither exists."""
    if not path:  # the shipped eval set
        return EVAL_PATH
    head, name = os.path.split(path)
    if not os.path.exists(path) and os.path.basename(head) == "data" and os.path.basename(os.path.dirname(head)) == "mini":
        path = os.path.join(DATA_DIR, name)
    if not os.path.exists(path):
        raise ValueError(f"{path}, the eval set the reports were made on, does not exist here; restore it, or "
                         "evaluate both models again")
    return path


def paired_reports(before_json, after_json):
    """(the eval set's samples, the two reports) of two JSON reports of main(), which must come from the same eval
    set, still as it was, and the same --shaping and --max_new_tokens; ValueError in one sentence if not."""
    fields = {"data": lambda v: isinstance(v, str), "n_per_task": lambda v: type(v) is int and 0 < v <= sys.maxsize,
              "shaping": lambda v: v in FIELDS["reward_shaping"].metadata["choices"], "samples": list_of(report_sample)}
    reports = [load_report(p, fields, "evaluate.py") for p in (before_json, after_json)]
    optional = {"pad": lambda v: type(v) is int and v in PAD_WIDTHS,  # older reports have neither: 90, not recorded
                "max_new_tokens": lambda v: type(v) is int and v > 0}
    for path, r in zip((before_json, after_json), reports):
        for key in (k for k, ok in optional.items() if k in r and not ok(r[k])):
            raise ValueError(f"{path}: its {key!r} is {json.dumps(r[key])[:40]}, which no evaluate.py report holds")
    if [s["prompt"] for s in reports[0]["samples"]] != [s["prompt"] for s in reports[1]["samples"]]:
        raise ValueError("the two reports were not made on the same prompts; evaluate both with the same --data and --n")
    if reports[0]["shaping"] != reports[1]["shaping"]:  # eval_reward is another function under another shaping
        raise ValueError(f"the two reports were scored with --shaping {reports[0]['shaping']} and "
                         f"{reports[1]['shaping']}; evaluate both with the same --shaping")
    cut_at = [r.get("max_new_tokens") for r in reports]  # older reports have none
    if None not in cut_at and cut_at[0] != cut_at[1]:  # a completion cut shorter is scored as another answer
        raise ValueError(f"the two reports' completions were cut at --max_new_tokens {cut_at[0]} and {cut_at[1]}; "
                         "evaluate both with the same --max_new_tokens")
    data = recorded_eval_set(reports[0]["data"])
    samples = load_eval_set(data, reports[0]["n_per_task"], reports[0].get("pad", 90))
    stale = [s.prompt for s in samples] != [x["prompt"] for x in reports[0]["samples"]] or any(
        x.get("label", s.completion) != s.completion for r in reports for s, x in zip(samples, r["samples"]))
    if stale:  # the completions would be scored against other positions or labels
        raise ValueError(f"{data} no longer holds the prompts and labels the reports were made on; restore it, "
                         "or evaluate both models again")
    return samples, reports


def compare(before_json, after_json, n_boot=2000, seed=0, engine=None, by_game=False):
    """paired_bootstrap of two JSON reports of main() (paired_reports); with an EngineReward (--compare A B
    --engine_quality) the move quality too, from the cached evals; by_game: intervals that resample whole games,
    each value's cluster the game of its sample (a set built by annotate.py --pgn records them)."""
    return compare_paired(*paired_reports(before_json, after_json), n_boot, seed, engine, by_game)


def compare_paired(samples, reports, n_boot=2000, seed=0, engine=None, by_game=False):
    """compare() on what paired_reports gave."""
    missing = sum(s.game is None for s in samples) if by_game else 0
    if missing:  # said before the scoring, which --engine_quality makes minutes long
        raise ValueError(f"{reports[0]['data'] or EVAL_PATH} records no games ({missing} of the {len(samples)} "
                         "prompts compared have none); sets built by annotate.py --pgn do; leave out --by_game")
    scored = [list(sample_values(samples, [s["completion"] for s in r["samples"]], r["shaping"], engine))
              for r in reports]
    before, after = map(by_metric, scored)
    clusters = by_metric((i, name, samples[i].game) for i, name, _ in scored[0]) if by_game else None
    return paired_bootstrap(before, after, n_boot, seed, clusters)


def main(argv=None):
    cfg = Config()
    p = Parser("Greedy evaluation of a RookWorld snapshot on held-out P: and A: prompts.", checks={"n": at_least(1)})
    p.add_argument("--model_path", help="snapshot directory or hub id")
    p.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="two JSON reports: deltas with bootstrap CIs")
    p.add_argument("--data", default="", help="RookWorld text file or annotated .jsonl (default: the shipped eval set)")
    p.add_argument("--n", type=int, default=cfg.eval_n, help="prompts per task")
    p.add_argument("--pad", type=int, default=90, choices=PAD_WIDTHS, help="P: prompts' FEN padding (formats.PAD_WIDTHS)")
    p.add_argument("--out", default="", help="JSON report (default: eval.json in the model directory)")
    p.add_argument("--max_new_tokens", type=int, default=cfg.max_new_tokens)
    p.add_argument("--batch_size", type=int, default=BATCH_SIZE)
    p.add_argument("--device", default=cfg.device, help="cuda, cpu or auto")
    p.add_argument("--shaping", default=cfg.reward_shaping, choices=FIELDS["reward_shaping"].metadata["choices"],
                   help=FIELDS["reward_shaping"].metadata["help"])
    p.add_argument("--compile_decode", action=Switch, default=False, help="compiled static-shape decode (CUDA graphs on CUDA)")
    p.add_argument("--engine_quality", action=Switch, default=False, help="P: move quality by Stockfish (see the docstring)")
    p.add_argument("--engine_depth", type=int, default=cfg.engine_depth)
    p.add_argument("--engine_nodes", type=int, default=cfg.engine_nodes, help="nodes instead of a depth (0: off)")
    p.add_argument("--engine_cache", default=cfg.engine_cache, help="JSONL cache of evals after a move ('' for none)")
    p.add_argument("--stockfish_path", default=cfg.stockfish_path)
    p.add_argument("--plot", default="", metavar="PNG",
                   help="with --compare: before/after bars with the 95%% intervals to this PNG (pip install -e '.[plot]')")
    p.add_argument("--by_game", action=Switch, default=False,
                   help="with --compare on a set of real games (annotate.py --pgn): intervals that resample whole "
                   "games, as the positions of one game are not independent")
    args = p.parse_args(argv)
    if args.plot and not args.compare:
        p.error("--plot goes with --compare BEFORE AFTER")
    if args.by_game and not args.compare:  # else a switch that changes nothing
        p.error("--by_game goes with --compare BEFORE AFTER: it resamples whole games in the comparison's intervals")
    if args.out and args.compare:  # else no file at all where one was asked for
        p.error("--out names an evaluation's report; --compare writes none (it prints its table; --plot PNG draws it)")
    unread = [f"--{k}" for k in ("model_path", "data", "n", "pad", "max_new_tokens", "batch_size", "device", "shaping",
                                 "compile_decode") if getattr(args, k) != p.get_default(k)]
    if unread and args.compare:  # else a comparison taken for one on other data, padding or shaping
        p.error(f"{', '.join(unread)} set{'s' * (len(unread) == 1)} an evaluation; --compare reads its settings from "
                "the two reports: evaluate both models with them, then compare")
    if args.compare:
        if args.plot and any(os.path.realpath(args.plot) == os.path.realpath(r) for r in args.compare):
            p.error(f"--plot {args.plot} would draw over a report it compares; give the plot a file of its own")
        if args.plot:
            try:
                from mini.plots import compare_bars, unsupported_format  # an optional extra: only --plot needs it
            except ImportError as e:
                sys.exit(f"evaluate.py: {error_sentence(e)}")
            if unsupported_format(args.plot):  # else matplotlib's ValueError after the comparison
                p.error(unsupported_format(args.plot))
        engine, reason = engine_or_reason(args) if args.engine_quality else (None, None)
        if reason:
            print(reason, file=sys.stderr)
        try:
            samples, reports = paired_reports(*args.compare)
            rows = compare_paired(samples, reports, engine=engine, by_game=args.by_game)
        except (OSError, ValueError, KeyError, EngineFailure) as e:
            sys.exit(f"evaluate.py: {error_sentence(e)}")
        except KeyboardInterrupt:  # --engine_quality searches each move: minutes
            sys.exit("evaluate.py: interrupted (Ctrl-C) before the comparison ended")
        if args.by_game:
            print(f"95% CI of delta: resampling whole games ({len({s.game for s in samples})} games), not prompts")
        w = max(map(len, rows), default=6)  # the names' column as wide as the longest
        print(f"{'metric':{w}s} {'before':>8s} {'after':>8s} {'delta':>8s} {'95% CI of delta':>20s} {'n':>5s}")
        for k, (b0, a0, d, lo, hi, n) in rows.items():
            print(f"{k:{w}s} {b0:8.4f} {a0:8.4f} {d:+8.4f} {f'[{lo:+.4f}, {hi:+.4f}]':>20s} {n:5d}")
        if args.plot:
            try:  # a full disk, a folder that cannot be made
                compare_bars(rows, args.plot, title=f"{args.compare[0]} -> {args.compare[1]}")
            except OSError as e:
                sys.exit(f"evaluate.py: could not write --plot {args.plot} ({error_sentence(e)}); the table above "
                         "is the comparison")
            print(f"wrote {args.plot}")
        return
    if not args.model_path:
        p.error("--model_path is required (or --compare BEFORE AFTER)")
    out = report_path(p, args.out, args.model_path, "eval.json", inputs=[args.data or EVAL_PATH])  # "": the shipped set
    if args.engine_quality and args.stockfish_path:  # a binary named and wrong: said now, not skipped at the end
        try:
            find_stockfish(args.stockfish_path)
        except FileNotFoundError as e:
            p.error(str(e))
    device = resolve_device(args.device)
    try:  # a bad path, file or length ends with its one-sentence message
        samples = load_eval_set(args.data, args.n, args.pad)
        held = {t: sum(s.task == t for s in samples) for t in ("P", "A")}
        if min(held.values()) < args.n:  # a larger --n than the set: say what is evaluated instead
            print(f"evaluate.py: --n {args.n} is more than {args.data or EVAL_PATH} holds; evaluating its "
                  f"{held['P']} P: and {held['A']} A: prompts", file=sys.stderr)
        model, tok = load_model(args.model_path, device)
        t0 = time.perf_counter()
        completions = complete(model, tok, samples, args.max_new_tokens, args.batch_size, autocast(device, cfg),
                               progress=True, compile_decode=args.compile_decode)
        seconds = time.perf_counter() - t0
        engine, reason = engine_or_reason(args) if args.engine_quality else (None, None)
        if reason:
            print(reason)
        values = per_sample_values(samples, completions, args.shaping, engine)
    except (LoadError, OSError, ValueError, EngineFailure) as e:  # EngineFailure: an engine that keeps failing
        sys.exit(f"evaluate.py: {error_sentence(e)}")
    except (RuntimeError, MemoryError) as e:
        if not out_of_memory(e):
            raise
        sys.exit(f"evaluate.py: out of memory generating {args.batch_size} prompts at once; lower --batch_size")
    except KeyboardInterrupt:  # Ctrl-C in the minutes of generation or scoring: one sentence, not a traceback
        sys.exit(f"evaluate.py: interrupted (Ctrl-C) before the evaluation ended; no report was written to {out}")
    metrics = means(values)
    print(f"{'metric':28s} {'value':>9s} {'count':>6s}")
    for k, v in metrics.items():
        print(f"{k:28s} {v:9.4f} {len(known(values.get(k, values.get(k.removesuffix('_median'), [])))):6d}")
    print(f"{len(samples)} prompts in {seconds:.1f}s")
    report = {"model_path": args.model_path, "data": args.data or EVAL_PATH, "n_per_task": args.n, "pad": args.pad,
              "max_new_tokens": args.max_new_tokens, "shaping": args.shaping, "seconds": seconds,
              "metrics": metrics, "counts": {k: len(known(v)) for k, v in values.items()},
              "engine": engine and {"limit": engine.annotator().tag, "stockfish": engine.stockfish_path,
                                    "name": engine.annotator().engine},
              "samples": [{"task": s.task, "prompt": s.prompt, "completion": c, "label": s.completion}
                          for s, c in zip(samples, completions)]}
    save_report(report, out, "evaluate.py")
    print(f"wrote {out}")


if __name__ == "__main__":
    run_command(main)
