"""Faults a long run meets, injected: a stuck or dying engine, two processes taking over one stale lock, a
flipped byte in a checkpoint or a snapshot, a full disk under every writer, hostile input files, signals
during start-up. Each ends in its recovery or in one sentence (exit code 2 for bad input, 1 for a runtime
fault), never a hang, a traceback, a second owner or a silently wrong result.

    python mini/test_faults.py
"""
import contextlib
import errno
import glob
import json
import multiprocessing
import shutil
import signal
import os
import pty
import select
import subprocess
import sys
import threading
import time
import types

import chess.engine
import pytest
import torch

import mini.annotate as annotate
import mini.dataset as dataset
import mini.evaluate as evaluate
import mini.games as games
import mini.loader as loader
import mini.runs as runs
import mini.runtime as runtime
import mini.stockfish as stockfish
import mini.train as train
from mini.loader import LoadError, load_model
from mini.runs import RunDir, RunError
from mini.test_formats import P_LINES
from mini.test_runs import fails_with
from mini.test_train import args, tiny  # noqa: F401  (tiny is a fixture)

START = "rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1"
FAKE_ENGINE = """\
import os, signal, sys, time
mode = sys.argv[1]
for line in sys.stdin:
    cmd = line.split()[:1]
    if cmd == ["uci"]:
        if mode == "killed":  # killed while it answers its handshake
            os.kill(os.getpid(), signal.SIGKILL)
        print("id name FakeFish", "option name Threads type spin default 1 min 1 max 512",
              "option name MultiPV type spin default 1 min 1 max 500",
              "option name Skill Level type spin default 20 min 0 max 20", "uciok", sep="\\n", flush=True)
    elif cmd == ["isready"]:
        print("readyok", flush=True)
    elif cmd == ["go"]:
        if mode == "deaf":  # searches, but ignores quit
            print("info depth 1 score cp 10 pv e7e5", "bestmove e7e5", sep="\\n", flush=True)
            continue
        if mode == "hang":  # stuck: reads nothing more, not even quit
            time.sleep(3600)
        os._exit(3)  # dies
    elif cmd == ["quit"] and mode != "deaf":
        break
"""


def fake_engine(tmp_path, mode):
    """An executable that speaks enough UCI to pass the handshake and then hangs on `go` (hang), dies on `go`
    (die), searches but ignores `quit` (deaf), or is killed during the handshake (killed)."""
    script = tmp_path / "fake_engine.py"
    script.write_text(FAKE_ENGINE)
    path = tmp_path / mode
    path.write_text(f"#!/bin/sh\nexec {sys.executable} {script} {mode}\n")
    path.chmod(0o755)
    return str(path)


def children():
    """PIDs of this process's live child processes (threads and children may end while they are read)."""
    pids = []
    for f in glob.glob(f"/proc/{os.getpid()}/task/*/children"):
        with contextlib.suppress(FileNotFoundError):
            pids += open(f).read().split()
    live = []
    for p in pids:
        with contextlib.suppress(FileNotFoundError):
            if open(f"/proc/{p}/stat").read().split()[2] != "Z":
                live.append(p)
    return live


def engine_threads():
    return [t for t in threading.enumerate() if t.name.startswith("DeadlineEngine")]


def settles(check, seconds=10):
    """Whether check() becomes true within seconds."""
    end = time.time() + seconds
    while not check():
        if time.time() > end:
            return False
        time.sleep(0.05)
    return True


def within(seconds, call):
    """call()'s result (or its exception), or a failure if it is still running after `seconds`: a hang."""
    out = {}

    def run():
        try:
            out["value"] = call()
        except BaseException as e:
            out["error"] = e
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s: it hangs"
    if "error" in out:
        raise out["error"]
    return out["value"]


def one_line(text):
    lines = [line for line in text.splitlines() if line.strip()]
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


# ----------------------------------------------------------------------------- engines

@pytest.mark.parametrize("mode, what", [("hang", "stopped answering"), ("die", "died")])
def test_a_stuck_or_dying_engine_stops_in_one_sentence_and_leaves_no_process(tmp_path, monkeypatch, mode, what):
    monkeypatch.setattr(stockfish, "ENGINE_GRACE_S", 0.3)
    before, threads = set(children()), set(engine_threads())  # an earlier test's engines are not this one's
    with stockfish.Annotator(fake_engine(tmp_path, mode), depth=1, workers=2, cache_path="") as ann:
        with pytest.raises(stockfish.EngineFailure) as e:
            within(30, lambda: ann.annotate([START, "8/8/8/4k3/8/8/8/4K2R w K - 0 1"]))
        with pytest.raises(stockfish.EngineFailure):  # the engine reward's path; a broken engine fails at once
            within(5, lambda: ann.evals_after([(START, "e2e4")]))
    assert f"FakeFish ({tmp_path / mode}) {what} {stockfish.ENGINE_TRIES} times on " in str(e.value)
    assert settles(lambda: set(children()) <= before and set(engine_threads()) <= threads), (children(), engine_threads())


def test_an_engine_that_ignores_quit_is_killed_at_close(tmp_path, monkeypatch):
    monkeypatch.setattr(stockfish, "ENGINE_GRACE_S", 0.3)
    before, threads = set(children()), set(engine_threads())  # an earlier test's engines are not this one's
    ann = stockfish.Annotator(fake_engine(tmp_path, "deaf"), depth=1, workers=1, cache_path="")
    assert within(30, lambda: ann.evals_after([(START, "e2e4")])) == {(START, "e2e4"): -10}
    within(30, ann.close)
    assert settles(lambda: set(children()) <= before and set(engine_threads()) <= threads), (children(), engine_threads())


def test_a_stuck_engine_in_a_game_against_the_model(tmp_path, monkeypatch):
    from mini.chess_eval import stockfish_games
    monkeypatch.setattr(stockfish, "ENGINE_GRACE_S", 0.3)
    before, threads = set(children()), set(engine_threads())  # an earlier test's engines are not this one's
    with pytest.raises(stockfish.EngineFailure, match=r"^FakeFish .* stopped answering in a game against the model, at rnbq"):
        within(30, lambda: stockfish_games(lambda prompts: [""] * len(prompts), 2, fake_engine(tmp_path, "hang"), nodes=1))
    assert settles(lambda: set(children()) <= before and set(engine_threads()) <= threads), (children(), engine_threads())


def test_an_engine_failure_during_evaluation_is_one_sentence(tiny, tmp_path, monkeypatch):
    from mini import evaluate

    def engine_fails(*a, **kw):  # --engine_quality's engine stopped answering
        raise stockfish.EngineFailure(f"FakeFish (hang) stopped answering 3 times on {START}")
    monkeypatch.setattr(evaluate, "per_sample_values", engine_fails)
    exits_with(evaluate.main, ["--model_path", tiny, "--n", "1", "--max_new_tokens", "2", "--out", str(tmp_path / "e.json")],
               "evaluate.py: FakeFish (hang) stopped answering 3 times on")


def test_an_engine_killed_during_its_handshake_is_not_called_a_non_uci_binary(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        stockfish.find_stockfish(fake_engine(tmp_path, "killed"))
    assert "killed by signal 9 during its `uci` handshake" in str(e.value) and "not a UCI" not in str(e.value)


def test_the_deadline_follows_the_limit():
    deadline = lambda **kw: stockfish.engine_deadline(chess.engine.Limit(**kw))
    assert stockfish.ENGINE_GRACE_S < deadline(depth=10) < deadline(depth=20) < deadline(depth=30)
    assert deadline(time=5) == stockfish.ENGINE_GRACE_S + 100 and deadline(nodes=10**6) > deadline(nodes=1000)


def test_a_run_on_a_stuck_engine_ends_with_one_sentence_and_no_engine_left(tiny, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(stockfish, "ENGINE_GRACE_S", 0.3)
    before, threads = set(children()), set(engine_threads())  # an earlier test's engines are not this one's
    argv = args(tiny, tmp_path, "stuck", 2, "--data_source", "generate", "--stockfish_depth", "1",
                "--stockfish_path", fake_engine(tmp_path, "hang"))
    fails_with(capsys, argv, "stopped answering 3 times on")  # train.main takes signals: the main thread only
    # no engine process, and no engine thread, which the interpreter would wait for at exit (a hang after "Done")
    assert settles(lambda: set(children()) <= before and set(engine_threads()) <= threads), (children(), engine_threads())


# ----------------------------------------------------------------------------- the run lock

def take_over_together(log_dir, barrier, rounds, outcomes):
    """In a child process: each round, take the run's stale lock at the same moment as the other child,
    report, then give it back once both have tried."""
    for _ in range(rounds):
        run = RunDir(log_dir, "race")
        barrier.wait(timeout=60)
        try:
            run.take_lock()
            outcomes.put("owner")
        except RunError as e:
            outcomes.put(str(e))
        barrier.wait(timeout=60)
        run.release()
        barrier.wait(timeout=60)


def test_two_processes_taking_over_one_stale_lock_never_both_own_it(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    lock, rounds = tmp_path / "race" / "run.lock", 30
    lock.parent.mkdir()
    ctx = multiprocessing.get_context("spawn")
    barrier, outcomes = ctx.Barrier(3), ctx.Queue()
    children_ = [ctx.Process(target=take_over_together, args=(str(tmp_path), barrier, rounds, outcomes), daemon=True)
                 for _ in range(2)]
    try:
        for child in children_:
            child.start()
        for _ in range(rounds):
            lock.write_text(f"{dead.pid} {os.uname().nodename}\n")  # its process is gone: stale
            barrier.wait(timeout=120)
            barrier.wait(timeout=60)
            got = [outcomes.get(timeout=60) for _ in children_]
            assert got.count("owner") == 1 and any("in use by a running process" in g for g in got), got
            barrier.wait(timeout=60)
    finally:
        for child in children_:
            child.kill()


def test_a_process_that_cannot_be_signalled_is_alive(tmp_path, monkeypatch):
    run = RunDir(str(tmp_path), "r")
    os.makedirs(run.path)
    open(run.lock, "w").write(f"1 {os.uname().nodename}\n")

    def kill(pid, sig):
        raise PermissionError(errno.EPERM, "Operation not permitted")
    monkeypatch.setattr(os, "kill", kill)
    with pytest.raises(RunError, match="in use by a running process, PID 1"):
        run.take_lock()


# ----------------------------------------------------------------------------- checksums

def flip_byte_inside(path, data):
    """Flip one byte in the middle of `data` (a tensor's bytes) where it lies in the file."""
    blob = bytearray(open(path, "rb").read())
    at = blob.find(data) + len(data) // 2
    assert at > len(data) // 2
    blob[at] ^= 0x01
    open(path, "wb").write(bytes(blob))


def test_a_flipped_byte_in_a_checkpoint_falls_back_to_the_previous_one(tmp_path, capsys):
    run = RunDir(str(tmp_path), "r")
    weight = torch.arange(1000, dtype=torch.float32)
    for step in (1, 2):
        run.save_regular({"model": {"w": weight + step}, "optimizer": {}, "step": step, "config": {}, "run_name": "r",
                          "rng": {}}, keep_last=0)
    path = run.checkpoint("step_000002.pt")
    flip_byte_inside(path, (weight + 2).numpy().tobytes())
    assert not torch.equal(torch.load(path, weights_only=True)["model"]["w"], weight + 2)  # torch alone: silent
    assert run.latest_valid_checkpoint()[1]["step"] == 1
    assert one_line(capsys.readouterr().err) == f"skipping {path} does not match its checksum (step_000002.pt.sha256): it is damaged"


def test_a_flipped_byte_in_a_snapshot_is_one_sentence(tiny, tmp_path, capsys):
    snapshot = tmp_path / "snap"
    model, tok = load_model(tiny)
    loader.save_model(model, tok, str(snapshot))
    flip_byte_inside(snapshot / "model.safetensors", model.transformer.wpe.weight.detach().numpy().tobytes())
    with pytest.raises(LoadError, match="model.safetensors does not match its checksum"):
        load_model(str(snapshot))
    assert train.main(args(str(snapshot), tmp_path, "r", 1)) == 1
    assert "does not match its checksum (model.safetensors.sha256): it is damaged" in one_line(capsys.readouterr().err)


# ----------------------------------------------------------------------------- a full disk, from every writer

TORCH_FULL = RuntimeError("[enforce fail at inline_container.cc:626] . unexpected pos 1728 vs 1622")


def safetensors_full():
    from safetensors import SafetensorError
    return SafetensorError('Error while serializing: IoError(Os { code: 28, kind: StorageFull, '
                           'message: "No space left on device" })')


def assert_disk_full(message, path):
    assert message.startswith(f"disk full writing {path}: it needs about ") and "MiB are free there" in message, message


def test_torch_save_on_a_full_disk(tmp_path, monkeypatch):
    def save(obj, f, *a, **kw):
        open(f, "wb").write(b"partial")
        raise TORCH_FULL
    monkeypatch.setattr(torch, "save", save)
    run = RunDir(str(tmp_path), "r")
    with pytest.raises(RunError) as e:
        run.save("recovery.pt", {"model": {"w": torch.zeros(1000)}})
    assert_disk_full(str(e.value), run.checkpoint("recovery.pt"))
    assert os.listdir(run.ckpt_dir) == []


def test_the_final_snapshot_on_a_full_disk(tiny, tmp_path, monkeypatch):
    def save_file(*a, **kw):
        raise safetensors_full()
    monkeypatch.setattr(loader, "save_file", save_file)
    model, tok = load_model(tiny)
    run = RunDir(str(tmp_path), "r")
    with pytest.raises(RunError) as e:
        run.save_final(model, tok)
    assert_disk_full(str(e.value), run.file("final"))
    assert not glob.glob(str(tmp_path / "r" / ".tmp-*"))


class FullFile:
    def __init__(self, *a, **kw):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def write(self, text):
        raise OSError(errno.ENOSPC, "No space left on device")


def test_the_logs_on_a_full_disk(tmp_path, monkeypatch):
    run = RunDir(str(tmp_path), "r")
    os.makedirs(run.path)
    monkeypatch.setattr(runs, "open", FullFile, raising=False)
    for write, name in ((lambda: run.log("Step 1"), "train.log"),
                        (lambda: run.append_jsonl("metrics.jsonl", [{"step": 1}]), "metrics.jsonl")):
        with pytest.raises(RunError) as e:
            write()
        assert_disk_full(str(e.value), run.file(name))


def test_the_lock_on_a_full_disk(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "fdopen", FullFile)
    run = RunDir(str(tmp_path), "r")
    with pytest.raises(RunError) as e:
        run.take_lock()
    assert_disk_full(str(e.value), run.lock)
    assert not os.path.exists(run.lock)


# ----------------------------------------------------------------------------- out of memory

CUDA_OOM = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of 79 GiB")


def loss_out_of_memory(*args, **kwargs):
    raise CUDA_OOM


def test_out_of_memory_in_a_step_says_what_to_lower_and_how_to_resume(tiny, tmp_path, capsys, monkeypatch):
    """A --k_samples too large for the GPU was torch's traceback from deep in the step. It is one sentence naming the
    step's size and what to lower: in the first step (no run left behind) the micro-batch or a new run's sizes, and
    once checkpoints exist, how to resume with a micro-batch below the rows that did not fit."""
    monkeypatch.setattr(train, "grpo_loss", loss_out_of_memory)
    assert train.main(args(tiny, tmp_path, "r", 2)) == 1
    advice = ("or start afresh with a smaller --batch_size or --k_samples (on CUDA, --auto_batch_size finds the largest "
              "that fits)")
    assert one_line(capsys.readouterr().err) == ("error: out of memory with 2 prompts x 3 completions a step; set a "
                                                 f"smaller --micro_batch_size, {advice}")
    assert not (tmp_path / "r").exists()
    monkeypatch.undo()
    assert train.main(args(tiny, tmp_path, "r", 2)) == 0  # checkpoint at step 2
    monkeypatch.setattr(train, "grpo_loss", loss_out_of_memory)
    assert train.main(args(tiny, tmp_path, "r", 4, "--auto_resume")) == 1
    assert capsys.readouterr().err.splitlines()[-1] == (
        "error: out of memory with 2 prompts x 3 completions a step; the checkpoints on disk are intact: resume with "
        f"--auto_resume and a --micro_batch_size below 6 (fewer rows a forward and backward pass, the same update), {advice}")


def test_out_of_memory_is_told_from_other_errors():
    """CUDA's error, a cuBLAS or CUDA-graph error saying so in any case, the CPU allocator's refusal of one large
    tensor and Python's MemoryError are out of memory; a shape error is a bug, raised as it is."""
    try:
        torch.empty(2**62, dtype=torch.uint8)
    except RuntimeError as e:
        cpu = e
    for e in (CUDA_OOM, RuntimeError("CUBLAS_STATUS_ALLOC_FAILED: Out Of Memory"), cpu, MemoryError()):
        assert runtime.out_of_memory(e), e
    for e in (RuntimeError("mat1 and mat2 shapes cannot be multiplied"), ValueError("out of memory"), OSError()):
        assert not runtime.out_of_memory(e), e



# ----------------------------------------------------------------------------- hostile files: one sentence each

def exits_with(main, argv, message):
    """main(argv) exits (sys.exit) with one sentence that says `message`: exit code 1, no traceback."""
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert isinstance(e.value.code, str) and message in one_line(e.value.code), e.value.code


def snapshot_copy(tiny, tmp_path, file, text):
    """The tiny snapshot with `file` replaced by `text`, as a hand-edited or hub snapshot (no checksums)."""
    copy = tmp_path / "snap"
    shutil.copytree(tiny, copy)
    for f in glob.glob(str(copy / "*.sha256")):
        os.remove(f)
    (copy / file).write_text(text)
    return str(copy)


@pytest.mark.parametrize("change, message", [
    ({"n_layer": "8"}, 'n_layer is "8", not a whole number from 1 to 1000000'),
    ({"n_head": 0}, "n_head is 0, not a whole number"),
    ({"n_head": 3}, "n_embd 32 is not a multiple of n_head 3"),
    ({"n_positions": None}, "n_positions is null, not a whole number"),
    ({"n_embd": True}, "n_embd is true, not a whole number"),
    ({"n_positions": 2 * 10**6}, "n_positions is 2000000, not a whole number from 1 to 1000000"),  # 10**7 layers: no memory
    (None, "holds a JSON list, not an object"),
])
def test_a_snapshot_config_of_wrong_types_or_values(tiny, tmp_path, capsys, change, message):
    config = json.load(open(os.path.join(tiny, "config.json")))
    snap = snapshot_copy(tiny, tmp_path, "config.json", json.dumps({**config, **change} if change else [config]))
    fails_with(capsys, args(snap, tmp_path, "r", 1), message)
    assert not os.path.exists(tmp_path / "r")


def test_a_run_directory_given_as_the_model_says_where_the_model_is(tiny, tmp_path):
    """Pointing evaluate.py or train.py at a run (logs/<run>, train.py's or sft.py's) is a natural mistake: the
    answer names the run's final/ snapshot, not a missing 'vocab_size' or config.json (a checkpoint file:
    test_config's BAD)."""
    run = tmp_path / "runs" / "r"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"lr": 1e-4, "k_samples": 8}))
    with pytest.raises(LoadError, match="r is a training run's directory, not a model; it has no final/ model yet"):
        load_model(str(run))
    shutil.copytree(tiny, run / "final")
    with pytest.raises(LoadError, match=f"r is a training run's directory, not a model; its model is {run}/final"):
        load_model(str(run))
    sft_run = tmp_path / "runs" / "s"  # sft.py's: no config.json, the snapshot in final/
    shutil.copytree(tiny, sft_run / "final")
    with pytest.raises(LoadError, match=f"s is a training run's directory, not a model; its model is {sft_run}/final"):
        load_model(str(sft_run))


@pytest.mark.parametrize("file, text, message", [
    ("vocab.json", "{", "vocab.json is damaged: not a GPT-2 vocabulary"),
    ("vocab.json", '["a", "b"]', "vocab.json is damaged: not a GPT-2 vocabulary"),
    ("vocab.json", '{"a": "0"}', "vocab.json is damaged: not a GPT-2 vocabulary"),
    ("vocab.json", '{"a": 0, "b": 2}', "vocab.json is damaged: not a GPT-2 vocabulary"),  # an id missing
    ("merges.txt", "#version: 0.2\nĠ t x\n", "merges.txt: merge 0 (Ġ t x) does not create token 256; the file is damaged"),
])
def test_damaged_tokenizer_files(tiny, tmp_path, capsys, file, text, message):
    fails_with(capsys, args(snapshot_copy(tiny, tmp_path, file, text), tmp_path, "r", 1), message)


def test_damaged_merges_that_are_not_text(tiny, tmp_path):
    snap = snapshot_copy(tiny, tmp_path, "merges.txt", "")
    open(os.path.join(snap, "merges.txt"), "wb").write(b"\xff\xfe\x00")
    with pytest.raises(LoadError, match="merges.txt is damaged .not UTF-8 text."):
        load_model(snap)


@pytest.mark.parametrize("lines, message, skipped", [
    (['{"fen": 1}'] * 3, ":1: the FEN is int 1, not a string", "3 malformed lines"),
    (["[" * 100_000 + "]" * 100_000], ":1: JSON nested too deeply", "1 malformed line"),
    (["{}"] * 3, ":1: the record holds no position", "3 malformed lines"),
    (['{"fen": "KK6/8/8/8/8/8/8/7k w - - 0 1", "moves": ["a8b8"], "evals": [1.0]}'],
     ":1: impossible position 'KK6/8/8/8/8/8/8/7k w - - 0 1' (too many kings)", "1 impossible position"),
])
def test_bad_data_lines(tiny, tmp_path, capsys, lines, message, skipped):
    data = tmp_path / "bad.jsonl"
    data.write_text("\n".join(lines) + "\n")
    err = fails_with(capsys, args(tiny, tmp_path, "r", 1, "--data_source", "file", "--data_file", str(data)),
                     f"error: {data} holds no sample ({skipped})")
    assert f"{data}{message}" in err and "held-out" not in err


def test_impossible_positions_are_named_in_every_source(tmp_path):
    from mini.games import OPENINGS, load_mates, opening_board
    from mini.dataset import load_text
    from mini.formats import check_policy
    from mini.test_formats import A_LINES, KINGLESS_A_LINE
    for fen, why in [("4k2P/8/8/8/8/8/8/4K3 w - - 0 1", "pawns on backrank"), ("8/8/8/8/8/8/8/4K3 w - - 0 1", "no black king"),
                     ("4k3/8/8/8/8/8/8/4K2r b - - 0 1", "opposite check")]:  # White, not to move, is in check
        with pytest.raises(ValueError, match=f"^impossible position '{fen}' .{why}.$"):
            check_policy(fen, ["e1d1"], [0.0])
    text = tmp_path / "a.txt"
    text.write_text(f"{KINGLESS_A_LINE}\n{A_LINES[0]}\n")
    samples, skipped = load_text(str(text))
    assert len(samples) == 1 and skipped == 1
    mates = tmp_path / "mates.jsonl"
    mates.write_text('{"fen": "8/8/8/8/8/8/8/4K3 w - - 0 1", "mates": ["e1e2"]}\n')
    with pytest.raises(ValueError, match=rf"^{mates}:1: impossible position '8/8/8/8/8/8/8/4K3 w - - 0 1' .no black king."):
        load_mates(str(mates))
    assert all(opening_board(name).is_valid() for name in ["initial", *OPENINGS])  # the self-play starts


INPUT_READERS = {
    "load_jsonl": dataset.load_jsonl, "load_text": dataset.load_text, "read_rows": runs.read_rows,
    "load_report": lambda path: evaluate.load_report(path, {}, "evaluate.py"), "load_mates": games.load_mates,
    "stockfish.read_jsonl": lambda path: list(stockfish.read_jsonl(path)), "read_pgn": lambda path: annotate.read_pgn([path])}


@pytest.mark.parametrize("reader", INPUT_READERS)
def test_a_device_as_an_input_file_is_one_sentence(reader, monkeypatch):
    """Every reader of a file a flag names (evaluate.py --data and --compare, analyze_metrics.py, annotate.py
    --describe, --pgn and --cache, --mates_path): /dev/zero was read for ever, into memory. /dev/null stands for
    the device here (read, it would be an empty file), except as a cache, where it is one that keeps nothing."""
    if reader == "stockfish.read_jsonl":
        assert list(stockfish.read_jsonl("/dev/null")) == []
        monkeypatch.setattr(os, "devnull", "/dev/another-null")  # /dev/null as any other device
    with pytest.raises(ValueError, match="/dev/null is a device, not a file; name a file"):
        INPUT_READERS[reader]("/dev/null")


PIPED = {"load_text": (lambda path: [s.task for s in dataset.load_text(path)[0]], P_LINES[0] + "\n", ["P"]),
         "read_rows": (runs.read_rows, '{"step": 1}\n{"step": 2}\n', [{"step": 1}, {"step": 2}]),
         "read_pgn": (lambda path: annotate.read_pgn([path]), "1. f3 e5 2. g4 Qh4# 0-1\n",
                      ([("f2f3 e7e5 g2g4 d8h4".split(), "0-1")], {}))}


@pytest.mark.parametrize("reader", PIPED)
def test_a_pipe_is_read_whole(reader, tmp_path):
    """A pipe is not a device: `evaluate.py --data <(head -100 x.txt)`, `analyze_metrics.py <(ssh host cat ...)`
    are read to their end, once (the PGN's encoding is peeked, not read ahead and lost)."""
    read, text, expected = PIPED[reader]
    path = str(tmp_path / "fifo")
    os.mkfifo(path)

    def write():
        with open(path, "w") as f:  # opens once the reader does
            f.write(text)
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        assert read(path) == expected
    finally:
        if writer.is_alive():  # the reader failed before it opened the pipe: let the writer go
            os.close(os.open(path, os.O_RDONLY | os.O_NONBLOCK))


def test_compare_reports_with_fields_of_the_wrong_type(tmp_path):
    from mini import chess_eval, evaluate
    report = {"data": "", "n_per_task": 1, "shaping": "continuous", "samples": []}
    for samples in ("abc", [{}], [{"prompt": 1, "completion": ""}]):
        path = tmp_path / "e.json"
        path.write_text(json.dumps({**report, "samples": samples}))
        exits_with(evaluate.main, ["--compare", str(path), str(path)], f"{path}: its 'samples' is ")
    chess = {"suite": "chess", "values": {}, "items": {}, "metrics": {}}
    for change in ({"items": "zz"}, {"values": None}, {"values": {"a": ["x"]}}, {"metrics": {"a": "1"}}):
        path = tmp_path / "c.json"
        path.write_text(json.dumps({**chess, **change}))
        exits_with(chess_eval.main, ["--compare", str(path), str(path)], f"{path}: its '{next(iter(change))}' is ")
    path.write_text("[" * 100_000)
    exits_with(chess_eval.main, ["--compare", str(path), str(path)], f"{path} is not JSON")


# ----------------------------------------------------------------------------- log directories and run names

def test_a_log_dir_that_is_a_file_or_read_only(tiny, tmp_path, capsys, monkeypatch):
    (tmp_path / "file").write_text("")
    fails_with(capsys, args(tiny, tmp_path / "file", "r", 1), f"cannot write the run directory {tmp_path / 'file' / 'r'}")
    (tmp_path / "ro" / "old").mkdir(parents=True)  # root writes anywhere: the file system refuses instead
    makedirs, open_ = os.makedirs, os.open

    def read_only(call):
        def refuse(path, *a, **kw):
            if str(path).startswith(str(tmp_path / "ro")) and (call is makedirs or str(path).endswith(".lock")):
                raise OSError(errno.EROFS, "Read-only file system", path)
            return call(path, *a, **kw)
        return refuse
    monkeypatch.setattr(os, "makedirs", read_only(makedirs))
    monkeypatch.setattr(os, "open", read_only(open_))
    for run in ("new", "old"):  # the run directory cannot be made; it exists, but its lock cannot be written
        fails_with(capsys, args(tiny, tmp_path / "ro", run, 1), f"cannot write the run directory {tmp_path / 'ro' / run} "
                   "(Read-only file system); point --log_dir at a directory you can write to")


def test_run_names_longer_than_the_file_system_allows(tiny, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        train.main(args(tiny, tmp_path, "x" * 300, 1))
    assert e.value.code == 2 and "is 300 bytes long, more than the 255 a file name may have" in one_line(capsys.readouterr().err)
    name = "y" * 250
    (tmp_path / name).mkdir()
    (tmp_path / name / "train.log").write_text("the old run\n")
    RunDir(str(tmp_path), name).claim(resume=False, overwrite=True)
    aside = [p for p in os.listdir(tmp_path) if ".old-" in p]
    assert len(aside) == 1 and len(aside[0]) == 255 and (tmp_path / aside[0] / "train.log").read_text() == "the old run\n"
    assert "moved the earlier run to" in capsys.readouterr().err


# ----------------------------------------------------------------------------- signals during start-up

@pytest.mark.sends_signals
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_while_the_model_loads(tiny, tmp_path, capsys, monkeypatch, signum):
    load = train.load_model

    def load_then_signal(*a, **kw):
        os.kill(os.getpid(), signum)
        time.sleep(1)  # the handler runs here
        return load(*a, **kw)
    monkeypatch.setattr(train, "load_model", load_then_signal)
    ignored = signal.signal(signum, signal.SIG_IGN)  # whatever the caller had installed (an earlier test, a shell)
    try:
        assert train.main(args(tiny, tmp_path, "r", 2)) == 130
        assert signal.getsignal(signum) == signal.SIG_IGN  # and given back
    finally:
        signal.signal(signum, ignored)
    err = capsys.readouterr().err
    assert one_line(err) == "quit while the run was starting; nothing of it was saved: start it again"
    assert not os.path.exists(tmp_path / "r")


def test_a_signal_in_the_last_step_says_the_run_finishes(capsys):
    # mini/test_train.py: a signal in the last step lets the run finish; here what it says, in the last step
    # of 6 and after it (step 6 counted, the final model being written)
    for step in (5, 6):
        trainer = types.SimpleNamespace(step=step, cfg=types.SimpleNamespace(steps=6), main=True)
        runs.Resumable.announce_stop(trainer, "SIGTERM")
        assert one_line(capsys.readouterr().err) == ("SIGTERM: finishing the last step and writing the final model "
                                                     "(again to quit at once)")


@pytest.mark.sends_signals
def test_a_terminal_that_hangs_up_stops_the_run_with_a_checkpoint(tiny, tmp_path):
    """ssh dropped, or the terminal window closed: the run gets SIGHUP, and every later write to the terminal fails
    (EIO). SIGHUP killed it at once, losing the steps since its last checkpoint; it finishes its step, saves a
    checkpoint of it, writes its lines to train.log alone, and exits with 129 (128 + SIGHUP), as after SIGTERM."""
    try:
        for fd in os.openpty():  # a container without /dev/ptmx has no pseudo-terminal to hang up
            os.close(fd)
    except OSError as e:
        pytest.skip(f"no pseudo-terminal here ({e.strerror})")
    argv = [sys.executable, os.path.join(os.path.dirname(train.__file__), "train.py"),
            *args(tiny, tmp_path, "r", 1000, "--save_every", "0")]
    pid, terminal = pty.fork()  # the run in a session of its own, with this pseudo-terminal as its terminal
    if pid == 0:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as a login shell's; under nohup the suite's is ignored
        os.execv(sys.executable, argv)
    seen, deadline = b"", time.monotonic() + 120
    try:
        while b"Step 3 " not in seen and time.monotonic() < deadline:
            if select.select([terminal], [], [], 1)[0]:
                seen += os.read(terminal, 65536)
    finally:
        os.close(terminal)  # the hang-up: SIGHUP to the run, EIO on its writes
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline + 60:
        time.sleep(0.1)
    if done[0] == 0:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert b"Step 3 " in seen and done[0] == pid and os.waitstatus_to_exitcode(done[1]) == 129
    run = RunDir(str(tmp_path), "r")
    saved = run.latest_valid_checkpoint()[1]["step"]
    log = open(run.file("train.log")).read()
    assert saved >= 3 and f"SIGHUP: saving checkpoint at step {saved}..." in log


def test_a_run_under_nohup_does_not_take_sighup_over(monkeypatch):
    """`nohup` ignores SIGHUP so that a run outlives its terminal: a run must not put a handler in its place."""
    monkeypatch.setattr(signal, "getsignal", lambda signum: signal.SIG_IGN if signum == signal.SIGHUP else None)
    assert runs.stop_signals() == [signal.SIGINT, signal.SIGTERM]
    monkeypatch.setattr(signal, "getsignal", lambda signum: signal.SIG_DFL)
    assert runs.stop_signals() == [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
