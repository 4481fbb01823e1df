"""Chess skill of a RookWorld policy, after the RookWorld paper's own: mate in one, the centipawn loss of its
moves, self-play length, the arbiter (A:) on the moves of its games, and games against Stockfish. Per-item
values let --compare pair two reports with bootstrap intervals; the README defines each section and metric.

    python mini/chess_eval.py --model_path logs/run/final [--out chess.json]            # the whole suite
    python mini/chess_eval.py --model_path logs/run/final --n_mates 100 --games 16 --sf_games 0   # a subset
    python mini/chess_eval.py --compare before.json after.json               # paired 95% intervals
    python mini/chess_eval.py --build_mates --n 1000 --seed 0                # regenerate mini/data/mate_in_one.jsonl
"""
import json
import math
import os
import statistics
import sys
import time
from collections import Counter

if not __package__:  # run as `python mini/x.py`, not installed: import `mini` from this checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import chess
import chess.engine

from mini.config import EVAL_PATH, MATE_PATH, Config, at_least, between
from mini.flags import Parser, Switch, error_sentence, run_command, unwritable_outputs
from mini.dataset import shipped_keys
from mini.evaluate import (dict_of, finite, list_of, load_report, number, paired_bootstrap, report_path, save_or_spare,
                           save_report)
from mini.formats import env_label, env_prompt, legal_ucis, parse_env, policy_prompt
from mini.games import (OPENINGS, eval_mates, game_outcome, game_starts, in_batches, load_mates, mean, model_player,
                        opening_board, policy_move, policy_turn, self_play, selfplay_summary, selfplay_values)
from mini.loader import LoadError, load_model
from mini.positions import build_mates
from mini.runtime import autocast, resolve_device
from mini.stockfish import (BLUNDER_CP, ENGINE_NAMES, Annotator, EngineFailure, close_engine, engine_deadline,
                            find_stockfish, open_engine)


# ----------------------------------------------------------------------------- 1. mate in one

def write_mates(path, records, meta):
    """The mate file, or a spare file that one sentence names when the write fails (save_or_spare): the file
    there stays as it was, and the positions (minutes of play) are kept."""
    def write(target):
        with open(target, "w", encoding="utf-8") as f:
            f.write(json.dumps({"meta": meta}) + "\n")
            for r in records:
                f.write(json.dumps(r, separators=(",", ":")) + "\n")
    save_or_spare(path, write, "chess_eval.py", kept="the positions are")


# ----------------------------------------------------------------------------- 2. move quality

def quality_values(losses, legal):
    """Per position: chess_cpl (clipped centipawn loss, an illegal or missing move costing the cap), chess_cpl_legal
    (the same where the move was legal, else None: not measured) and chess_blunder (loss >= BLUNDER_CP)."""
    return {"chess_cpl": [float(r["loss"]) for r in losses],
            "chess_cpl_legal": [float(r["loss"]) if ok else None for r, ok in zip(losses, legal)],
            "chess_blunder": [float(r["loss"] >= BLUNDER_CP) for r in losses]}


def eval_quality(player, fens, annotator):
    completions = in_batches(player, [policy_prompt(f) for f in fens], desc="move quality")
    moves = [policy_move(c) for c in completions]
    losses = annotator.move_losses(list(zip(fens, moves)))
    legal = [m in legal_ucis(f) for f, m in zip(fens, moves)]
    return quality_values(losses, legal), [dict(r, fen=f, completion=c) for f, c, r in zip(fens, completions, losses)]


# ----------------------------------------------------------------------------- 3. self-play and 5. arbiter


def plies_histogram(plies, width=10):
    """{'0-9': count, '10-19': ...} over the bins that occur."""
    counts = Counter(p // width for p in plies)
    return {f"{k * width}-{k * width + width - 1}": counts[k] for k in sorted(counts)}


ARBITER_FIELDS = ("next_fen", "reward", "terminated", "truncated")


def arbiter_values(transitions, completions):
    """Per transition: each field of the A: answer equal to python-chess's, and all four at once."""
    vals = {f"chess_arbiter_{k}": [] for k in ("all",) + ARBITER_FIELDS}
    for (fen, move, _), text in zip(transitions, completions, strict=True):
        truth = env_label(fen, move)
        try:
            got = parse_env(text)
        except ValueError:  # an answer that does not parse is wrong in every field
            got = (None,) * 4
        right = [a == b for a, b in zip(got, truth)]
        for k, ok in zip(ARBITER_FIELDS, right):
            vals[f"chess_arbiter_{k}"].append(float(ok))
        vals["chess_arbiter_all"].append(float(all(right)))
    return vals


def eval_arbiter(arbiter, games, max_transitions=512):
    transitions = [t for g in games for t in g["transitions"]][:max_transitions]
    completions = in_batches(arbiter, [env_prompt(*t) for t in transitions], desc="arbiter")
    return arbiter_values(transitions, completions), transitions


# ----------------------------------------------------------------------------- 4. games against Stockfish

SF_STARTS = 2 * (len(OPENINGS) + 1)  # games against Stockfish, one per start (initial, OPENINGS) and colour


def stockfish_start(i):
    """Game i's start against Stockfish: pairs of games (the player White, then Black) from the initial
    position, then from OPENINGS in turn."""
    return ["initial", *OPENINGS][i % SF_STARTS // 2]


def stockfish_move(engine, path, board, nodes):
    """Stockfish's move in a game (engine.play within the engine's deadline); an EngineFailure naming the engine
    and the position when it stops answering or dies. Every search starts a new game (a cold hash): a game kept
    warm from its own last move, as the last game left running would be, plays other moves at a node limit, so a
    game's moves would depend on when the others ended and --compare would pair different games."""
    try:
        return engine.play(board, chess.engine.Limit(nodes=nodes), game=object()).move
    except (chess.engine.EngineError, TimeoutError) as e:
        what = "stopped answering" if isinstance(e, TimeoutError) else f"failed ({e})"
        raise EngineFailure(f"{ENGINE_NAMES[path]} ({path}) {what} in a game against the model, at {board.fen()}; "
                            "point --stockfish_path at a working Stockfish") from None


def stockfish_games(player, n_games, stockfish_path="", skill=20, nodes=1000, max_plies=200):
    """n_games of the player against Stockfish (one thread, Skill Level skill, nodes per move) from
    stockfish_start(i), the player White in even-numbered games; the player's moves of all games waiting
    for it go in one call. Returns one dict per game: start, white (the player's colour), score (1/0.5/0
    for the player), plies (half-moves from the start), end, moves (from the start)."""
    path = find_stockfish(stockfish_path)
    engine = open_engine(path, engine_deadline(chess.engine.Limit(nodes=nodes)))
    try:
        engine.configure({"Threads": 1, "Skill Level": skill})
        starts = [stockfish_start(i) for i in range(n_games)]
        boards = [opening_board(s) for s in starts]
        book = [len(b.move_stack) for b in boards]  # the opening's half-moves, not counted against max_plies
        games = [{"start": s, "white": i % 2 == 0, "score": None, "end": None, "plies": 0, "transitions": []}
                 for i, s in enumerate(starts)]
        live = list(range(n_games))
        while live:
            for i in live:  # Stockfish moves wherever it is its turn
                if boards[i].turn != games[i]["white"]:
                    boards[i].push(stockfish_move(engine, path, boards[i], nodes))
                    end_if_over(boards[i], games[i], book[i] + max_plies)
            mine = [i for i in live if games[i]["end"] is None]
            for i, text in zip(mine, player([policy_prompt(boards[i].fen()) for i in mine]), strict=True):
                policy_turn(boards[i], text, games[i], 10 ** 9)
                if games[i]["end"] in ("illegal", "unparseable"):
                    games[i]["score"] = 0.0
                else:
                    end_if_over(boards[i], games[i], book[i] + max_plies)
            live = [i for i in live if games[i]["end"] is None]
    except BaseException:
        close_engine(engine, kill=True)
        raise
    close_engine(engine)
    for g, b, n in zip(games, boards, book):
        g["plies"], g["moves"] = len(b.move_stack) - n, [m.uci() for m in b.move_stack[n:]]
        del g["transitions"]
    return games


def end_if_over(board, game, max_plies):
    """Score a game that the last move ended: by the rules, or a draw once the board holds max_plies half-moves."""
    outcome = game_outcome(board)
    if outcome:
        game["end"] = outcome.termination.name.lower()
        game["score"] = 0.5 if outcome.winner is None else float(outcome.winner == game["white"])
    elif len(board.move_stack) >= max_plies:
        game["end"], game["score"] = "max_plies", 0.5


def stockfish_values(games):
    return {"chess_sf_score": [g["score"] for g in games], "chess_sf_plies": [float(g["plies"]) for g in games],
            "chess_sf_win": [float(g["score"] == 1) for g in games],
            "chess_sf_draw": [float(g["score"] == 0.5) for g in games],
            "chess_sf_loss": [float(g["score"] == 0) for g in games]}


# ----------------------------------------------------------------------------- the suite

def stockfish_or_reason(path):
    """(binary, None) or (None, one sentence why the engine sections are skipped)."""
    try:
        return find_stockfish(path), None
    except FileNotFoundError as e:
        return None, f"skipped: {e}"


def run_suite(greedy, sampler, a):
    """The report of every section that a's settings ask for. greedy answers P: and A: prompts greedily,
    sampler answers P: prompts by sampling (self-play); both are players."""
    values, metrics, report, seconds = {}, {}, {"skipped": {}}, {}
    t = time.perf_counter()
    if a.n_mates:
        mates = load_mates(a.mates_path, a.n_mates)
        vals, completions = eval_mates(greedy, mates)
        values.update(vals)
        report["mate_in_one"] = [dict(r, completion=c) for r, c in zip(mates, completions)]
        seconds["mate_in_one"], t = time.perf_counter() - t, time.perf_counter()
    if a.n_quality:
        binary, reason = stockfish_or_reason(a.stockfish_path)
        if binary:
            with open(EVAL_PATH, encoding="utf-8") as f:
                fens = [r["fen"] for r in map(json.loads, f) if "fen" in r][:a.n_quality]
            with Annotator(binary, depth=a.sf_depth, workers=a.workers, cache_path="", multipv=1) as ann:
                vals, report["move_quality"] = eval_quality(greedy, fens, ann)
            report["engine"] = ENGINE_NAMES[binary]
            values.update(vals)
            metrics["chess_cpl_median"] = float(statistics.median(vals["chess_cpl"]))
        else:
            report["skipped"]["move_quality"] = reason
        seconds["move_quality"], t = time.perf_counter() - t, time.perf_counter()
    if a.games:
        games = self_play(sampler, game_starts(a.games), a.max_plies)
        values.update(selfplay_values(games))
        metrics.update(selfplay_summary(games))
        report["selfplay_plies_histogram"] = plies_histogram([g["plies"] for g in games])
        seconds["selfplay"], t = time.perf_counter() - t, time.perf_counter()
        if a.arbiter_max:
            vals, transitions = eval_arbiter(greedy, games, a.arbiter_max)
            metrics.update({k: mean(v) for k, v in vals.items() if v})
            metrics["chess_arbiter_n"] = len(transitions)
            report["arbiter_values"] = vals  # per transition of this model's games: not paired across models
            seconds["arbiter"], t = time.perf_counter() - t, time.perf_counter()
        for g in games:
            g["transitions"] = len(g["transitions"])
        report["selfplay"] = games
    if a.sf_games:
        binary, reason = stockfish_or_reason(a.stockfish_path)
        if binary:
            report["stockfish_games"] = stockfish_games(greedy, a.sf_games, binary, a.sf_skill, a.sf_nodes, a.max_plies)
            values.update(stockfish_values(report["stockfish_games"]))
            report["engine"] = ENGINE_NAMES[binary]
        else:
            report["skipped"]["stockfish_games"] = reason
        seconds["stockfish_games"] = time.perf_counter() - t
    metrics.update({k: mean(v) for k, v in values.items()})
    report.update(metrics=dict(sorted(metrics.items())), values=values, seconds=seconds,
                  items=items_of(report))
    return report


def items_of(report):
    """What each per-item value is about, so that --compare pairs only reports on the same items."""
    return {"mate_in_one": [r["fen"] for r in report.get("mate_in_one", [])],
            "move_quality": [r["fen"] for r in report.get("move_quality", [])],
            "selfplay": [g["start"] for g in report.get("selfplay", [])],
            "stockfish_games": [[g["start"], g["white"]] for g in report.get("stockfish_games", [])]}


# the settings each section's per-item values depend on, beside its items: --compare pairs only equal ones.
# "engine" is Stockfish's `id name`: another version judges moves and plays games otherwise
SECTION_SETTINGS = {"mate_in_one": ("max_new_tokens",), "move_quality": ("max_new_tokens", "sf_depth", "engine"),
                    "selfplay": ("max_new_tokens", "max_plies", "temperature", "top_k"),
                    "stockfish_games": ("max_new_tokens", "max_plies", "sf_skill", "sf_nodes", "engine")}


def compare(before_json, after_json, n_boot=2000, seed=0):
    """(paired rows of evaluate.paired_bootstrap, unpaired rows (before, after, delta)) of two reports. A
    section that both reports ran must have the same items and the same SECTION_SETTINGS (those that both
    reports record: older reports lack some), else ValueError; a metric without values is left out."""
    # finite: a NaN, an infinity or an int beyond a float would come out as a nan row or a traceback; an older
    # report's metrics may hold NaN for an empty section
    fields = {"suite": lambda v: isinstance(v, str), "values": dict_of(list_of(lambda x: x is None or finite(x))),
              "items": dict_of(lambda v: isinstance(v, list)), "metrics": dict_of(lambda v: finite(v) or number(v) and v != v)}
    reports = [load_report(p, fields, "chess_eval.py") for p in (before_json, after_json)]
    for path, r in zip((before_json, after_json), reports):
        if not isinstance(r.get("settings", {}), dict):  # older reports have none
            raise ValueError(f"{path}: its 'settings' is not an object, which no chess_eval.py report holds")
        skill = r.get("settings", {}).get("sf_skill", 0)
        if not number(skill):  # compared as a number below; the others only for equality
            raise ValueError(f"{path}: its setting sf_skill is {skill!r}, not a number as chess_eval.py writes it; "
                             "restore the report or make it again")
    values = [r["values"] for r in reports]
    settings = [r.get("settings", {}) for r in reports]
    random_games = any(s.get("sf_skill", 0) < 20 for s in settings)
    if random_games:  # below Skill Level 20 the same index is not the same game
        values = [{k: v for k, v in vals.items() if not k.startswith("chess_sf_")} for vals in values]
    for name, items in reports[0]["items"].items():
        if not (items and reports[1]["items"].get(name)):
            continue  # not run by both
        unpaired_games = name == "stockfish_games" and random_games  # compared as means: the settings still count
        if items != reports[1]["items"][name] and not unpaired_games:
            raise ValueError(f"the two reports' {name} items differ; run both with the same counts and data")
        differ = [f"{'the engine' if k == 'engine' else '--' + k} {settings[0][k]} and {settings[1][k]}"
                  for k in SECTION_SETTINGS.get(name, ())
                  if k in settings[0] and k in settings[1] and settings[0][k] != settings[1][k]]
        if differ:
            raise ValueError(f"the two reports' {name} sections ran with other settings ({', '.join(differ)}); "
                             "run both with the same ones")
    paired = paired_bootstrap(*values, n_boot, seed)
    m0, m1 = (r["metrics"] for r in reports)  # an older report may hold NaN for a section with nothing in it
    if all("chess_selfplay_plies_median" in m for m in (m0, m1)):  # both played self-play: a way of ending that
        ends = {k for m in (m0, m1) for k in m if k.startswith("chess_selfplay_end_")}  # one lacks ended none there
        m0, m1 = ({k: 0.0 for k in ends} | m for m in (m0, m1))
    unpaired = {k: (v, m1[k], m1[k] - v) for k, v in m0.items()
                if k not in paired and k in m1 and not math.isnan(m1[k] - v)}
    return paired, unpaired


def print_table(report):
    print(f"{'metric':34s} {'value':>10s} {'n':>6s}")
    for k, v in report["metrics"].items():
        n = sum(x is not None for x in report["values"].get(k, report.get("arbiter_values", {}).get(k, ())))
        print(f"{k:34s} {v:10.4f} {n or '':>6}")
    if "selfplay_plies_histogram" in report:
        print("self-play legal half-moves: " + ", ".join(f"{k}: {v}" for k, v in report["selfplay_plies_histogram"].items()))
    for name, reason in report["skipped"].items():
        print(f"{name}: {reason}")
    print("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in report["seconds"].items()))


def parse_args(argv):
    cfg = Config()
    count = at_least(0)  # 0: skip that part
    p = Parser("Chess-skill evaluation of a RookWorld snapshot (each section and metric: the README).", checks={
        "n": at_least(1), "n_mates": count, "n_quality": count, "games": count, "arbiter_max": count, "sf_games": count,
        "max_plies": at_least(1), "sf_skill": between(0, 20), "sf_nodes": at_least(1), "sf_depth": at_least(1),
        "workers": at_least(1)})
    p.add_argument("--model_path", help="snapshot directory or hub id")
    p.add_argument("--out", default="", help="JSON report (default: chess.json in the model directory)")
    p.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), help="two chess JSON reports: deltas with paired CIs")
    p.add_argument("--build_mates", action=Switch, default=False, help="regenerate the mate-in-one file and exit")
    p.add_argument("--n", type=int, default=1000, help="with --build_mates: positions")
    p.add_argument("--seed", type=int, default=0, help="seed of --build_mates, and of self-play sampling")
    p.add_argument("--mates_path", default=MATE_PATH, help="the mate-in-one file")
    p.add_argument("--n_mates", type=int, default=1000, help="mate-in-one positions (0: skip)")
    p.add_argument("--n_quality", type=int, default=200, help="eval-set positions for the centipawn loss (0: skip)")
    p.add_argument("--games", type=int, default=32, help="self-play games (0: skip, with the arbiter)")
    p.add_argument("--max_plies", type=int, default=200, help="half-move cap of a game")
    p.add_argument("--temperature", type=float, default=0.6, help="self-play sampling temperature")
    p.add_argument("--top_k", type=int, default=5, help="self-play top-k")
    p.add_argument("--arbiter_max", type=int, default=512, help="A: prompts on self-play transitions (0: skip)")
    p.add_argument("--sf_games", type=int, default=SF_STARTS,
                   help="games against Stockfish; the default plays every start as each colour (0: skip)")
    p.add_argument("--sf_skill", type=int, default=20, help="Stockfish Skill Level (0-20; below 20 random, unpaired)")
    p.add_argument("--sf_nodes", type=int, default=1000, help="Stockfish nodes per move")
    p.add_argument("--sf_depth", type=int, default=8, help="Stockfish depth of the centipawn loss")
    p.add_argument("--workers", type=int, default=os.cpu_count(), help="Stockfish processes for the centipawn loss")
    p.add_argument("--stockfish_path", default=cfg.stockfish_path)
    p.add_argument("--max_new_tokens", type=int, default=cfg.max_new_tokens)
    p.add_argument("--batch_size", type=int, default=64, help="prompts per generate call")
    p.add_argument("--device", default=cfg.device, help="cuda, cpu or auto")
    return p, p.parse_args(argv)


def main(argv=None):
    p, a = parse_args(argv)
    if a.build_mates:
        for problem in unwritable_outputs({"mates_path": a.mates_path}, ("mates_path",))[:1]:
            p.error(problem)  # before minutes of games
        return build_command(a, argv)
    if a.compare:
        try:
            paired, unpaired = compare(*a.compare)
        except (OSError, ValueError, KeyError) as e:
            sys.exit(f"chess_eval.py: {error_sentence(e)}")
        if not paired and not unpaired:
            sys.exit("chess_eval.py: the two reports share no figure (each skipped what the other ran); make them "
                     "with the same sections")
        print(f"{'metric':34s} {'before':>9s} {'after':>9s} {'delta':>9s} {'95% CI of delta':>22s} {'n':>5s}")
        for k, (b0, a0, d, lo, hi, n) in paired.items():
            print(f"{k:34s} {b0:9.4f} {a0:9.4f} {d:+9.4f} {f'[{lo:+.4f}, {hi:+.4f}]':>22s} {n:5d}")
        for k, (b0, a0, d) in unpaired.items():
            print(f"{k:34s} {b0:9.4f} {a0:9.4f} {d:+9.4f} {'(not paired)':>22s}")
        return
    if not a.model_path:
        p.error("--model_path is required (or --compare BEFORE AFTER, or --build_mates)")
    if a.n != p.get_default("n"):  # the positions of --build_mates; the suite's own sizes are --n_mates, --n_quality
        p.error(f"--n {a.n} is the number of positions --build_mates makes; for the suite use --n_mates or --n_quality")
    if not (a.n_mates or a.n_quality or a.games or a.sf_games):  # else an empty report, taken for a measurement
        p.error("--n_mates, --n_quality, --games and --sf_games are all 0: nothing to evaluate; leave one on")
    out = report_path(p, a.out, a.model_path, "chess.json", inputs=[a.mates_path])
    if a.sf_skill == 20 and a.sf_games > SF_STARTS:  # a deterministic game of the greedy player repeats move for move
        p.error(f"--sf_games {a.sf_games} would replay games: at Skill Level 20 each of the {SF_STARTS} starts and "
                f"colours gives one game, so ask for at most {SF_STARTS} (or a --sf_skill below 20, whose games are "
                "random)")
    if a.stockfish_path:  # a binary the user named must be there; without one, the engine's sections are skipped
        try:
            find_stockfish(a.stockfish_path)
        except FileNotFoundError as e:
            p.error(str(e))
    device = resolve_device(a.device)
    try:
        model, tok = load_model(a.model_path, device)
        ctx = autocast(device, Config())
        greedy = model_player(model, tok, 0.0, 0, a.seed, a.max_new_tokens, a.batch_size, ctx)
        sampler = model_player(model, tok, a.temperature, a.top_k, a.seed, a.max_new_tokens, a.batch_size, ctx)
        t0 = time.perf_counter()
        report = run_suite(greedy, sampler, a)
    except (LoadError, OSError, ValueError, EngineFailure) as e:
        sys.exit(f"chess_eval.py: {error_sentence(e)}")
    except KeyboardInterrupt:  # minutes of games: one sentence, not a traceback
        sys.exit(f"chess_eval.py: interrupted (Ctrl-C) before the suite ended; no report was written to {out}")
    settings = dict(vars(a), engine=report.pop("engine", None))  # the Stockfish that judged or played, if one did
    report = {"suite": "chess", "model_path": a.model_path, "settings": settings,
              "total_seconds": time.perf_counter() - t0, **report}
    print_table(report)
    save_report(report, out, "chess_eval.py")
    print(f"wrote {out} ({report['total_seconds']:.0f} s)")


def build_command(a, argv):
    t0 = time.time()
    try:
        records = build_mates(a.n, a.seed, exclude=shipped_keys())
    except KeyboardInterrupt:  # minutes of games played
        sys.exit(f"chess_eval.py: interrupted (Ctrl-C) before the positions were found; {a.mates_path} is unchanged")
    phases = Counter(r["phase"] for r in records)
    meta = {"n": len(records), "seed": a.seed, "generator": "mini.positions.build_mates (positions.play games, "
            "up to 2 mate-in-one positions a game, none in pool.jsonl or eval.jsonl)",
            "phases": dict(sorted(phases.items())),
            "white_to_move": sum(r["fen"].split()[1] == "w" for r in records),
            "command": "python mini/chess_eval.py " + " ".join(sys.argv[1:] if argv is None else argv)}
    write_mates(a.mates_path, records, meta)
    print(f"wrote {len(records)} mate-in-one positions to {a.mates_path} in {time.time() - t0:.0f} s")


if __name__ == "__main__":
    run_command(main)
