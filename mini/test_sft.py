"""The supervised warm start: its loss mask, a short run of a tiny model, and the held-out guard.

    python mini/test_sft.py
"""
import dataclasses
import gc
import glob
import json
import math
import multiprocessing
import os
import signal
import subprocess
import sys
import time
import types
import warnings

import chess
import pytest
import torch
import torch.nn.functional as F

import mini.sft as sft
from mini import runtime
from mini.flags import parse_args
from mini.config import EVAL_PATH, POOL_PATH, Config
from mini.dataset import load_jsonl
from mini.chess_eval import load_mates
from mini.formats import Sample, policy_sample, position_key, repad
from mini.positions import generate_positions, iter_positions
from mini.loader import load_model, save_model
from mini.model import GPT, GPTConfig
from mini.tokenizer import Tokenizer

EOS = 50256


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.gpt2()


def ctrl_c_at_call(fn, n):
    """fn, but its n-th call raises KeyboardInterrupt instead: a Ctrl-C at that point of a run."""
    calls = []

    def wrapped(*a, **kw):
        calls.append(1)
        if len(calls) == n:
            raise KeyboardInterrupt
        return fn(*a, **kw)
    return wrapped

def test_loss_mask_covers_completion_and_final_eos(tok):
    samples = [Sample("A", "", "A: a+", "b+1"),   # A | : | ' a' | + || b | + | 1 | EOS
               Sample("P", "", "P: k  ", " M: x"),  # P | : | ' k' | ' ' | ' ' || ' M' | : | ' x' | EOS
               Sample("A", "", "A:", " a")]         # A | : || ' a' | EOS
    x, mask, y, loss_mask = sft.encode_batch(samples, tok, "cpu")
    assert x.tolist() == [[32, 25, 257, 10, 65, 10, 16, EOS],
                          [47, 25, 479, 220, 220, 337, 25, 2124],
                          [32, 25, 257, EOS, EOS, EOS, EOS, EOS]]
    assert y.tolist() == [[25, 257, 10, 65, 10, 16, EOS, EOS],
                          [25, 479, 220, 220, 337, 25, 2124, EOS],
                          [25, 257, EOS, EOS, EOS, EOS, EOS, EOS]]
    assert loss_mask.int().tolist() == [[0, 0, 0, 1, 1, 1, 1, 0],
                                        [0, 0, 0, 0, 1, 1, 1, 1],
                                        [0, 1, 1, 0, 0, 0, 0, 0]]
    assert mask.int().tolist() == [[1] * 8, [1] * 8, [1, 1, 1, 1, 0, 0, 0, 0]]


def test_time_limited_schedule_warms_up_on_real_steps():
    """A run with a time limit: the warmup counts real steps even when the clock is far ahead (a slow first batch);
    after it, the schedule follows whichever budget runs out first, and never passes the last step."""
    cfg = Config(steps=1000, warmup_steps=100)
    assert sft.schedule_step(10, elapsed=50.0, limit_s=100.0, cfg=cfg) == 10  # half the time gone, still warming up
    assert sft.schedule_step(100, elapsed=50.0, limit_s=100.0, cfg=cfg) == 500  # then the clock rules
    assert sft.schedule_step(700, elapsed=50.0, limit_s=100.0, cfg=cfg) == 700  # or the steps, if they are ahead
    assert sft.schedule_step(200, elapsed=150.0, limit_s=100.0, cfg=cfg) == 999
    assert sft.schedule_step(200, elapsed=150.0, limit_s=0.0, cfg=cfg) == 200  # no time limit: steps alone


def test_loss_mask_on_real_lines(tok):
    """On real P: and A: lines, P: ones at both FEN paddings (--policy_pad both), the masked targets are exactly the
    completion's tokens and EOS, and tokenising prompt and completion apart gives the tokens of the whole line; each
    sample drawn walks its game on (the replay buffer gets the position after it), so A: positions keep changing."""
    cfg = parse_args(["--mix_env_ratio", "0.5", "--policy_pad", "both"], "sft")
    data = sft.SFTData(cfg)
    samples = data.batch(16)
    assert {s.task for s in samples} == {"P", "A"}
    assert {len(s.prompt) - len("P: ") + 1 for s in samples if s.task == "P"} == {89, 90}  # the FEN's padded widths
    _, _, y, loss_mask = sft.encode_batch(samples, tok, "cpu")
    for s, row, m in zip(samples, y, loss_mask):
        assert row[m].tolist() == tok.encode(s.completion) + [EOS]
        assert tok.encode(s.prompt) + tok.encode(s.completion) == tok.encode(s.prompt + s.completion)
    # each drawn sample walks its game on: the position after its A: move or its P: best move joins the buffer
    after = []
    for s in samples:
        if s.task == "A":
            after.append(s.next_fen)
        else:
            board = chess.Board(s.fen)
            board.push_uci(s.best)
            after.append(board.fen())
    assert sum(position_key(f) in data.buffer.items for f in after if f) >= len(samples) // 2
    assert position_key(next(iter_positions(cfg.seed))[0]) in data.buffer.items  # and each batch adds a fresh position


def full_vocab_loss(model, batch):
    """The exact loss, softmax over all 50257 tokens, which sft_loss estimates."""
    x, mask, y, loss_mask = batch
    with torch.no_grad():
        return F.cross_entropy(model(x, mask)[loss_mask], y[loss_mask]).item()


def test_loss_is_the_full_vocabulary_cross_entropy(tok, monkeypatch):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, n_positions=256))
    batch = sft.encode_batch(load_jsonl(POOL_PATH)[:3], tok, "cpu")
    full = full_vocab_loss(model, batch)
    monkeypatch.setattr(sft, "FULL_SOFTMAX_SHARE", 1.0)  # the correction on every position: exact
    assert sft.sft_loss(model, *batch).item() == pytest.approx(full, abs=1e-4)
    one = sft.encode_batch(load_jsonl(POOL_PATH)[:1], tok, "cpu")  # rows of one length: the last EOS is in no input
    assert sft.sft_loss(model, *one).item() == pytest.approx(full_vocab_loss(model, one), abs=1e-4)
    monkeypatch.setattr(sft, "FULL_SOFTMAX_SHARE", 1 / 8)  # on a random eighth: exact on average
    with torch.no_grad():
        estimates = torch.tensor([sft.sft_loss(model, *batch).item() for _ in range(200)])
    assert estimates.mean().item() == pytest.approx(full, abs=3 * estimates.std().item() / 200 ** 0.5 + 1e-4)
    eos_only = sft.encode_batch([Sample("A", "", "A: x", "")], tok, "cpu")  # one loss token: an eighth of it is 1
    assert sft.sft_loss(model, *eos_only).item() == pytest.approx(full_vocab_loss(model, eos_only), abs=1e-4)


def test_the_loss_under_bf16_autocast_is_taken_in_fp32(tok):
    """Under --bf16_cpu's autocast the logits are bf16, but both logsumexps (restricted and full) run in fp32, so the
    loss is the fp32 one's on the same positions to within bf16's rounding of the logits: in bf16 each position's
    loss near 10.7 is a multiple of 1/16, and their mean 0.004 off here."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, n_positions=256))
    batch = sft.encode_batch(load_jsonl(POOL_PATH)[:3], tok, "cpu")
    with torch.no_grad():
        torch.manual_seed(1)  # the same corrected positions in both
        fp32 = sft.sft_loss(model, *batch).item()
        torch.manual_seed(1)
        with runtime.autocast(torch.device("cpu"), Config(bf16_cpu=True)):
            loss = sft.sft_loss(model, *batch)
    assert loss.dtype == torch.float32 and loss.item() == pytest.approx(fp32, abs=1e-3)


def test_short_run_learns_and_writes_a_snapshot(tok, tmp_path):
    torch.manual_seed(0)
    start = save_model(GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, n_positions=256)), tok, str(tmp_path / "start"))
    batch = sft.encode_batch(load_jsonl(POOL_PATH)[:4] + sft.SFTData(parse_args(["--mix_env_ratio", "1"])).batch(4),
                             tok, "cpu")
    assert sft.main(["--model_path", start, "--log_dir", str(tmp_path), "--run_name", "r", "--steps", "20",
                     "--batch_size", "4", "--lr", "3e-3", "--warmup_steps", "2", "--mix_env_ratio", "0.5"]) == 0
    model, _ = load_model(str(tmp_path / "r" / "final"))
    before, after = full_vocab_loss(load_model(start)[0], batch), full_vocab_loss(model, batch)
    assert after < before - 1.0, (before, after)
    with open(tmp_path / "r" / "sft.log") as f:
        log = f.read()
    assert "step    20 | loss" in log and "done: 20 steps" in log
    distinct = len({position_key(s.fen) for s in load_jsonl(POOL_PATH) if s.task == "P"})
    assert f"P: positions: {distinct:,} distinct, each drawn about {20 * 4 * 0.5 / distinct:.3g} times" in log


def test_passes_over_positions_by_hand_and_against_the_draws():
    """Each distinct P: position comes round samples * (1 - env_ratio) / distinct times: by hand on 3 samples of 2
    positions (one given twice, at both paddings), and against 20,000 real draws of a PoolSource."""
    from mini.dataset import PoolSource, StreamSource
    pool = load_jsonl(POOL_PATH)[:2]
    twice = [pool[0], pool[1], repad(pool[0], 89)]
    source = PoolSource(twice, env_ratio=0.4, seed=0)
    assert sft.passes_over_positions(source, 100, 0.4) == (2, 30.0)  # 100 draws, 60 of them P:, over 2 positions
    draws = source.draw(20_000)
    assert sum(s.task == "P" for s in draws) == pytest.approx(0.6 * 20_000, rel=0.03)
    env_only = PoolSource([s for s in draws if s.task == "A"][:5], env_ratio=0.4)
    assert sft.passes_over_positions(env_only, 100, 0.4) is None  # no P: positions to come round
    stream = StreamSource.__new__(StreamSource)  # fresh positions: none comes round twice
    assert sft.passes_over_positions(stream, 100, 0.4) is None


def test_time_limit_stops_and_saves(tmp_path):
    t0 = time.time()
    assert sft.main(["--model_path", "scratch", "--n_layer", "1", "--n_head", "2", "--n_embd", "32", "--log_dir",
                     str(tmp_path), "--run_name", "t", "--steps", "100000", "--batch_size", "2",
                     "--time_limit_min", "0.05"]) == 0  # 3 s
    assert time.time() - t0 < 30  # the limit, one step, building the model and saving it
    with open(tmp_path / "t" / "sft.log") as f:
        log = f.read()
    steps = int(log.split("time limit of 0.05 min reached at step ")[1].split()[0])
    assert steps < 100000 and f"done: {steps} steps" in log
    # the P: positions line counts the steps taken (of 2 sequences, 80% P:), not the 100000 planned
    assert f"each drawn about {steps * 2 * 0.8 / 5000:.3g} times" in log
    model, _ = load_model(str(tmp_path / "t" / "final"))
    assert model.config.n_layer == 1 and model.config.n_embd == 32


def test_data_workers_draw_their_own_batches_and_train(tmp_path, tok, spawn, monkeypatch):
    """--data_workers 2: batches come from two processes with their own seeds (no worker repeats another's
    samples), each batch encoded as encode_batch would; a run with them writes its snapshot."""
    cfg = parse_args(["--batch_size", "4", "--mix_env_ratio", "0.5", "--data_workers", "2"], "sft")
    loader = torch.utils.data.DataLoader(sft.SFTBatches(cfg, tok), batch_size=None, num_workers=2)
    batches = iter(loader)
    first = [next(batches) for _ in range(4)]  # workers take turns: batches 0, 2 from one, 1, 3 from the other
    del batches  # stops its workers
    assert all(x.shape == y.shape and x.dtype == torch.long for x, _, y, _ in first)
    assert not torch.equal(first[0][0], first[1][0]) and not torch.equal(first[2][0], first[3][0])
    in_process = next(iter(sft.SFTBatches(cfg, tok)))  # the training process's own stream, seeded cfg.seed
    assert not any(torch.equal(in_process[0], b[0]) for b in first)
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: types.SimpleNamespace(id=1))  # worker 1's stream
    worker = sft.SFTBatches(cfg, tok)
    next(iter(worker))
    fresh = lambda seed: position_key(next(iter_positions(seed))[0])  # the first fresh position of a seed
    assert fresh(cfg.seed + 2000) in worker.data.buffer.items and fresh(cfg.seed) not in worker.data.buffer.items
    monkeypatch.undo()
    argv = ["--model_path", "scratch", "--n_layer", "1", "--n_head", "1", "--n_embd", "16", "--log_dir", str(tmp_path),
            "--run_name", "w", "--steps", "3", "--batch_size", "2", "--data_workers", "2"]
    assert sft.main(argv) == 0
    assert "done: 3 steps" in (tmp_path / "w" / "sft.log").read_text()
    for worker in multiprocessing.active_children():  # the run stopped its workers: none is left to hang the exit
        worker.join(10)
    assert not multiprocessing.active_children()
    # a SIGTERM to the whole process group (a terminal's Ctrl-C, `timeout`): the run saves, the workers stay quiet
    proc = spawn([sys.executable, "-m", "mini.sft", *argv[:-6], "--run_name", "k", "--steps", "100000",
                  "--data_workers", "2"], stderr=subprocess.PIPE, text=True)
    log = tmp_path / "k" / "sft.log"
    while proc.poll() is None and "step    10" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM and "Traceback" not in err, err  # saved, but not finished
    assert "SIGTERM: saving the snapshot" in log.read_text() and (tmp_path / "k" / "final" / "model.safetensors").exists()


def test_a_model_too_big_to_train_is_refused_before_any_memory_is_taken(monkeypatch, tmp_path, capsys):
    d, L, V, P = 64, 2, 50257, 256  # GPT-2's count: embeddings, 12 d^2 + 13 d a block, the last LayerNorm (tied head)
    n = V * d + P * d + L * (12 * d * d + 13 * d) + 2 * d
    shape, cpu = GPTConfig(L, 4, d, P), torch.device("cpu")
    monkeypatch.setattr(sft, "free_memory_bytes", lambda device: 16 * n)
    sft.check_fits(shape, cpu)  # weights, gradients and two AdamW moments in fp32: 16 bytes a parameter
    monkeypatch.setattr(sft, "free_memory_bytes", lambda device: 16 * n - 1)
    with pytest.raises(ValueError, match=rf"a model of 2 layers of width 64 has 3M parameters, which take about 0.05 GiB to "
                                         rf"train and cpu has 0.05 GiB free; choose a smaller --n_embd or --n_layer"):
        sft.check_fits(shape, cpu)
    monkeypatch.undo()  # the machine's own memory: no CI machine trains 55 billion parameters
    argv = ["--model_path", "scratch", "--n_layer", "1", "--n_head", "1", "--n_embd", "65536", "--device", "cpu",
            "--log_dir", str(tmp_path), "--run_name", "big", "--steps", "1"]
    assert sft.main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "a model of 1 layer of width 65536 has 54,851M parameters" in err and not (tmp_path / "big").exists()
    monkeypatch.setattr(sft, "free_memory_bytes", lambda device: None)  # a device that does not say: no check
    sft.check_fits(shape, cpu)
    d = 16
    one_layer = V * d + P * d + (12 * d * d + 13 * d) + 2 * d
    monkeypatch.setattr(sft, "free_memory_bytes", lambda device: 16 * one_layer)  # room for 1 layer, not for 4
    grown = TINY + ["--log_dir", str(tmp_path), "--run_name", "grown", "--steps", "1", "--grow_layers", "4"]
    assert sft.main(grown) == 1
    assert "a model of 4 layers of width 16" in capsys.readouterr().err and not (tmp_path / "grown").exists()


@pytest.mark.timeout(60)  # a million blocks built, even on the meta device, take minutes
def test_a_million_layers_are_counted_not_built(monkeypatch):
    """check_fits counts a model of one block and of two and scales by the depth: --n_layer 1000000 (or --grow_layers)
    is refused in seconds, where building a million blocks on the meta device hung for minutes."""
    d, V, P = 16, 50257, 256
    n = V * d + P * d + 10**6 * (12 * d * d + 13 * d) + 2 * d  # as above, exact
    monkeypatch.setattr(sft, "free_memory_bytes", lambda device: 16 * n - 1)
    # 16 bytes each of 3,280,808,240 parameters: 48.89 GiB (52.49 GB)
    with pytest.raises(ValueError, match=r"a model of 1000000 layers of width 16 has 3,281M parameters, which take "
                                         r"about 48.89 GiB to train and cpu has 48.89 GiB free"):
        sft.check_fits(GPTConfig(10**6, 1, d, P), torch.device("cpu"))
    monkeypatch.setattr(sft, "free_memory_bytes", lambda device: 16 * n)
    sft.check_fits(GPTConfig(10**6, 1, d, P), torch.device("cpu"))


@pytest.mark.parametrize("n_layer", [3, 8, 11])
def test_grown_model_computes_the_same_function(n_layer, tmp_path):
    """--grow_layers: a 3-layer model deepened to 3, 8 or 11 layers gives the same logits (fp64), with every
    parameter of the new blocks trainable; sft.py --grow_layers writes the deeper snapshot; shallower is refused."""
    torch.manual_seed(0)
    small = GPT(GPTConfig(n_layer=3, n_head=2, n_embd=16, n_positions=256)).double()
    for p in small.parameters():  # random everywhere, so a wrongly copied or zeroed block shows
        torch.nn.init.normal_(p, std=0.3)
    deep = sft.grow_layers(small, n_layer).double()
    x = torch.randint(0, 50257, (2, 7))
    mask = torch.ones_like(x, dtype=torch.bool)
    assert deep.config.n_layer == n_layer
    torch.testing.assert_close(deep(x, mask), small(x, mask), rtol=0, atol=1e-12)
    if n_layer > 3:  # the new blocks are not all zero: each copies a trained block
        assert all(p.abs().sum() > 0 for n, p in deep.named_parameters() if ".c_attn." in n)
    # blocks 0, 1, 2 are first copied to 0, 3, 6 (of 8) and 0, 4, 8 (of 11); every later copy adds nothing yet
    silent = [i for i, block in enumerate(deep.transformer.h)
              if all(p.abs().sum() == 0 for n, p in block.named_parameters() if ".c_proj." in f".{n}")]
    assert silent == {3: [], 8: [1, 2, 4, 5, 7], 11: [1, 2, 3, 5, 6, 7, 9, 10]}[n_layer]
    save_model(small.float(), Tokenizer.gpt2(), str(tmp_path / "small"))
    argv = ["--model_path", str(tmp_path / "small"), "--log_dir", str(tmp_path), "--steps", "1", "--batch_size", "2"]
    assert sft.main(argv + ["--run_name", "g", "--grow_layers", str(n_layer)]) == 0
    assert load_model(str(tmp_path / "g" / "final"))[0].config.n_layer == n_layer
    if n_layer == 3:
        with pytest.raises(ValueError, match="can only deepen"):
            sft.grow_layers(small, 2)


def test_a_run_directory_is_never_reused_by_accident(tmp_path, capsys):
    argv = ["--model_path", "scratch", "--n_layer", "1", "--n_head", "1", "--n_embd", "16", "--log_dir", str(tmp_path),
            "--run_name", "t", "--steps", "1", "--batch_size", "2"]
    assert sft.main(argv) == 0
    assert not (tmp_path / "t" / "run.lock").exists()  # a finished run lets go of its directory
    log = (tmp_path / "t" / "sft.log").read_text()
    assert sft.main(argv) == 1
    assert capsys.readouterr().err.strip().endswith("already holds a run; start afresh with --overwrite (the old run is "
                                                    "moved aside, not deleted), or pick another --run_name")  # no resume
    assert (tmp_path / "t" / "sft.log").read_text() == log
    assert sft.main(argv + ["--overwrite"]) == 0
    assert [open(p).read() for p in glob.glob(str(tmp_path / "t.old-*" / "sft.log"))] == [log]
    with pytest.raises(SystemExit) as stop:  # a missing snapshot is found before anything starts
        sft.main(argv[:-4] + ["--run_name", "u", "--model_path", str(tmp_path / "none")])
    assert stop.value.code == 2 and not (tmp_path / "u").exists()  # a failed start leaves nothing behind


def test_ctrl_c_while_loading_is_one_sentence_and_leaves_no_run(tmp_path, capsys, monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(sft, "SFTBatches", interrupted)
    assert sft.main(TINY + ["--log_dir", str(tmp_path), "--run_name", "q"]) == 130
    assert capsys.readouterr().err.strip() == "quit at once; nothing of the run was saved"
    assert not (tmp_path / "q").exists()


def test_sft_data_never_holds_an_eval_position(tmp_path):
    held_out = load_jsonl(EVAL_PATH)
    keys = {position_key(s.fen) for s in held_out}
    # seed 0 is the generator stream the eval set was drawn from: without the guard its positions would be trained on
    assert sum(position_key(fen) in keys for fen, _, _ in generate_positions(20, 0)) >= 5
    data = sft.SFTData(parse_args(["--seed", "0", "--mix_env_ratio", "1"]))
    samples = [s for _ in range(40) for s in data.batch(16)]
    assert len(data.buffer) >= 40  # A: samples did come from generated positions, not only the pool
    assert not any(position_key(s.fen) in keys or position_key(s.next_fen or s.fen) in keys for s in samples)

    # a RookWorld text file that holds an eval position: that line is never drawn
    pool = load_jsonl(POOL_PATH)
    path = os.path.join(tmp_path, "lines.txt")
    with open(path, "w") as f:
        f.write("\n".join(s.prompt + s.completion for s in (held_out[0], pool[0])) + "\n")
    data = sft.SFTData(parse_args(["--data_source", "file", "--data_file", path, "--mix_env_ratio", "0"]))
    assert {s.fen for s in data.batch(32)} == {pool[0].fen}


def test_sft_data_never_holds_a_mate_in_one_position(tmp_path):
    mates = load_mates()
    pool = load_jsonl(POOL_PATH)
    path = os.path.join(tmp_path, "lines.txt")
    mate = policy_sample(mates[0]["fen"], mates[0]["mates"][:1], [999.99])
    with open(path, "w") as f:
        f.write("\n".join(s.prompt + s.completion for s in (mate, pool[0])) + "\n")
    data = sft.SFTData(parse_args(["--data_source", "file", "--data_file", path, "--mix_env_ratio", "0"]))
    assert {position_key(r["fen"]) for r in mates} <= data.buffer.held_out == data.source.held_out
    assert {s.fen for s in data.batch(32)} == {pool[0].fen}


def hand_lr_factor(s, steps, warmup, min_ratio=0.1):
    """lr_factor written out for decay_steps 0: linear warmup from the first update, then cosine to min_ratio."""
    if s < warmup:
        return (s + 1) / warmup
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * (s - warmup) / (steps - warmup)))


class LoopSpy:
    """Watches sft.train_sft's loop from outside: a fake clock (dt seconds a call), the loss of each step with its
    exact gradient, and at each optimizer.step the LR of every param group and the gradient it is given."""

    def __init__(self, monkeypatch, dt, grad_clip):
        self.now, self.losses, self.expected, self.tokens, self.lrs, self.grad_err, self.rows = -dt, [], [], [], [], [], []
        self.closed, self.reporters_closed = 0, 0  # data sources and reporters closed
        real_loss, real_conf = sft.sft_loss, GPT.configure_optimizers

        def clock():
            self.now += dt
            return self.now

        def loss_fn(model, x, mask, y, loss_mask):
            params = [p for p in model.parameters() if p.requires_grad]
            self.expected.append(torch.autograd.grad(real_loss(model, x, mask, y, loss_mask), params))
            loss = real_loss(model, x, mask, y, loss_mask)
            self.losses.append(loss.item())
            self.tokens.append(int(mask.sum()))
            return loss

        def configure(model, *a, **k):
            opt = real_conf(model, *a, **k)
            step = opt.step

            def watched_step(*args, **kw):
                self.lrs.append({g["lr"] for g in opt.param_groups})
                g = self.expected[-1]
                norm = torch.sqrt(sum((e.double() ** 2).sum() for e in g)).item()
                scale = min(1.0, grad_clip / (norm + 1e-6)) if grad_clip > 0 else 1.0
                params = [p for p in model.parameters() if p.requires_grad]
                self.grad_err.append(max(((p.grad - e * scale).abs().max() / (e * scale).abs().max()).item()
                                         for p, e in zip(params, g)))
                return step(*args, **kw)

            opt.step = watched_step
            self.optimizer = opt
            return opt

        class Reporter:
            def log(_, step, row):
                self.rows.append((step, row))

            def close(_):
                self.reporters_closed += 1

        class Data:  # a few fixed samples in turn: the loop is under test here, not the data (~5 s to load)
            def __init__(_, cfg):
                _.source, _.i = types.SimpleNamespace(close=lambda: setattr(self, "closed", self.closed + 1)), 0

            def batch(_, n):
                _.i += n
                return [LOOP_SAMPLES[(_.i + j) % len(LOOP_SAMPLES)] for j in range(n)]

        monkeypatch.setattr(sft, "SFTData", Data)
        monkeypatch.setattr(sft, "FULL_SOFTMAX_SHARE", 1.0)  # the loss is exact, so its gradient can be recomputed
        monkeypatch.setattr(sft, "time", types.SimpleNamespace(time=clock, strftime=time.strftime))
        monkeypatch.setattr(sft, "sft_loss", loss_fn)
        monkeypatch.setattr(GPT, "configure_optimizers", configure)
        monkeypatch.setattr(sft, "make_reporter", lambda *a: Reporter())


LOOP_SAMPLES = [Sample("A", "", "A: a+", "b+1"), Sample("P", "", "P: k  ", " M: x"), Sample("A", "", "A:", " a")]
TINY = ["--model_path", "scratch", "--n_layer", "1", "--n_head", "1", "--n_embd", "16", "--batch_size", "2"]


def test_training_loop_by_hand_lr_schedule_clipping_fresh_gradients_and_logged_means(tmp_path, monkeypatch):
    """13 steps, warmup 3, cosine to min_lr_ratio 0.1: each update gets exactly lr * the hand-computed factor in every
    param group, the gradient of this step's loss alone (zeroed in between) clipped to --grad_clip, and the rows
    logged at step 10 and at the last step 13 hold the mean loss of their own steps, that LR and tokens/s."""
    spy = LoopSpy(monkeypatch, dt=1.0, grad_clip=0.01)
    assert sft.main(TINY + ["--log_dir", str(tmp_path), "--run_name", "h", "--steps", "13", "--lr", "1e-3",
                            "--warmup_steps", "3", "--grad_clip", "0.01", "--weight_decay", "0.0"]) == 0
    want = [1e-3 * hand_lr_factor(k, 13, 3) for k in range(13)]
    assert len(spy.lrs) == 13 and all(len(lrs) == 1 for lrs in spy.lrs)
    assert [lrs.pop() for lrs in spy.lrs] == pytest.approx(want, rel=1e-9)
    assert max(spy.grad_err) < 1e-3, spy.grad_err  # clipped to 0.01 (the raw norm is far larger), never accumulated
    assert [s for s, _ in spy.rows] == [10, 13] and all(set(r) == {"loss", "lr", "tokens_per_s"} for _, r in spy.rows)
    (_, r10), (_, r13) = spy.rows
    assert r10["loss"] == pytest.approx(sum(spy.losses[:10]) / 10, rel=1e-6)
    assert r13["loss"] == pytest.approx(sum(spy.losses[10:]) / 3, rel=1e-6)
    assert r10["lr"] == pytest.approx(want[9]) and r13["lr"] == pytest.approx(want[12])
    # the fake clock ticks once a step and once a log line: 11 s for the first window, 4 s for the second
    assert r10["tokens_per_s"] == pytest.approx(sum(spy.tokens[:10]) / 11)
    assert r13["tokens_per_s"] == pytest.approx(sum(spy.tokens[10:]) / 4)
    log = (tmp_path / "h" / "sft.log").read_text()
    assert f"step    13 | loss {r13['loss']:.4f} | lr {want[12]:.2e}" in log and "done: 13 steps" in log
    assert spy.reporters_closed == 1  # W&B/TensorBoard write their last rows on close


def test_the_optimizer_takes_the_runs_betas_and_weight_decay(tmp_path, monkeypatch):
    """--adam_beta1 0.8 --adam_beta2 0.9 --weight_decay 0.05 reach sft.py's AdamW in that order: the decayed group
    gets 0.05, the other (biases, norms, embeddings) none."""
    spy = LoopSpy(monkeypatch, dt=1.0, grad_clip=1.0)
    assert sft.main(TINY + ["--log_dir", str(tmp_path), "--run_name", "o", "--steps", "1", "--adam_beta1", "0.8",
                            "--adam_beta2", "0.9", "--weight_decay", "0.05"]) == 0
    groups = spy.optimizer.param_groups
    assert {g["betas"] for g in groups} == {(0.8, 0.9)} and sorted(g["weight_decay"] for g in groups) == [0.0, 0.05]


def test_time_limit_schedule_and_stop_by_hand(tmp_path, monkeypatch):
    """--time_limit_min 0.25 (15 s) on a clock that moves 2 s a step: the warmup's 2 steps count real steps, then
    the schedule is at int(100 * elapsed / 15) of --steps 100 (40, 53, 66, 80, 93), and the run stops at step 7,
    the first whose clock is past 15 s. --grad_clip 0: each update gets its gradient unclipped."""
    spy = LoopSpy(monkeypatch, dt=2.0, grad_clip=0.0)
    assert sft.main(TINY + ["--log_dir", str(tmp_path), "--run_name", "t", "--steps", "100", "--lr", "1e-3",
                            "--warmup_steps", "2", "--time_limit_min", "0.25", "--grad_clip", "0"]) == 0
    want = [1e-3 * hand_lr_factor(s, 100, 2) for s in (0, 1, 40, 53, 66, 80, 93)]
    assert [lrs.pop() for lrs in spy.lrs] == pytest.approx(want, rel=1e-9)
    assert max(spy.grad_err) < 1e-3, spy.grad_err
    assert "time limit of 0.25 min reached at step 7" in (tmp_path / "t" / "sft.log").read_text()


def test_a_run_is_its_seed_and_a_second_ctrl_c_quits_without_saving(tmp_path, monkeypatch):
    """Two runs of one seed end on the same weights, whatever ran before them in the process (the model's
    initialisation and the loss's draws come from --seed); sft.log opens with the run's settings. A KeyboardInterrupt
    in a step (a second Ctrl-C) quits at once with 130 and saves nothing; every run closes its data source and
    gives the caller its signal handlers back."""
    spy = LoopSpy(monkeypatch, dt=1.0, grad_clip=1.0)
    argv = TINY + ["--log_dir", str(tmp_path), "--steps", "3"]
    handlers = lambda: {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    before = handlers()
    assert sft.main(argv + ["--run_name", "a"]) == 0
    assert handlers() == before
    torch.rand(5)  # moves the process's RNG
    assert sft.main(argv + ["--run_name", "b"]) == 0
    a, b = (load_model(str(tmp_path / run / "final"))[0].state_dict() for run in "ab")
    assert all(torch.equal(a[k], b[k]) for k in a)
    settings = json.loads((tmp_path / "a" / "sft.log").read_text().splitlines()[0].removeprefix("config "))
    assert settings == json.loads(json.dumps(dataclasses.asdict(parse_args(argv + ["--run_name", "a"], "sft"))))
    monkeypatch.setattr(sft, "sft_loss", ctrl_c_at_call(sft.sft_loss, 3))
    assert sft.main(argv + ["--run_name", "c"]) == 130
    assert "quit at step 2 without saving" in (tmp_path / "c" / "sft.log").read_text()
    assert not (tmp_path / "c" / "final").exists() and spy.closed == 3 and handlers() == before


@pytest.mark.sends_signals
def test_a_signal_in_the_last_step_finishes_the_run(tmp_path, monkeypatch, capsys):
    """A SIGTERM during the last of --steps 3 saves the finished run and exits 0; the same signal in step 2 saves a
    run stopped short, which exits 128 + 15 so that a scheduler knows it is not done."""
    LoopSpy(monkeypatch, dt=1.0, grad_clip=1.0)
    loss = sft.sft_loss

    def signalled_in_step(n):
        calls = []

        def step_loss(*batch):
            calls.append(1)
            if len(calls) == n:
                signal.raise_signal(signal.SIGTERM)
            return loss(*batch)
        return step_loss
    for run, at, code in (("l", 3, 0), ("m", 2, 128 + signal.SIGTERM)):
        monkeypatch.setattr(sft, "sft_loss", signalled_in_step(at))
        assert sft.main(TINY + ["--log_dir", str(tmp_path), "--steps", "3", "--run_name", run]) == code
        log = (tmp_path / run / "sft.log").read_text()
        assert f"SIGTERM: saving the snapshot at step {at}" in log and f"done: {at} steps" in log
        # the signal came in step `at` (counted from 1), which the run finishes before it saves
        assert f"SIGTERM: finishing step {at}, then saving the snapshot" in capsys.readouterr().err


def test_snapshots_on_the_way_outlive_a_crash(tmp_path, monkeypatch):
    """--snapshot_every_min 0.05 (3 s) on a clock that moves 1 s a step: snapshots of steps 2, 5 and 8 in final/
    (each taken before the next step, its interval counted from the last one); an error in step 10 stops the run
    with its type in sft.log, final/ holding step 8's snapshot. --snapshot_every_min 0: none on the way, so the
    same crash leaves no final/."""
    LoopSpy(monkeypatch, dt=1.0, grad_clip=1.0)
    loss, calls = sft.sft_loss, []

    def fails_in_the_tenth_step(*batch):
        calls.append(1)
        if len(calls) % 10 == 0:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return loss(*batch)
    monkeypatch.setattr(sft, "sft_loss", fails_in_the_tenth_step)
    argv = TINY + ["--log_dir", str(tmp_path), "--steps", "20"]
    with pytest.raises(RuntimeError):
        sft.main(argv + ["--run_name", "s", "--snapshot_every_min", "0.05"])
    log = (tmp_path / "s" / "sft.log").read_text()
    assert [int(line.split()[3]) for line in log.splitlines() if line.startswith("snapshot of step")] == [2, 5, 8]
    assert "stopped by RuntimeError at step 9; final/ holds the snapshot of step 8" in log
    assert load_model(str(tmp_path / "s" / "final"))[0].config.n_layer == 1
    with pytest.raises(RuntimeError):
        sft.main(argv + ["--run_name", "n", "--snapshot_every_min", "0"])
    log = (tmp_path / "n" / "sft.log").read_text()
    assert "snapshot of step" not in log and log.rstrip().endswith("stopped by RuntimeError at step 9")
    assert not (tmp_path / "n" / "final").exists()


def test_a_slow_first_batch_snapshots_no_untrained_model(tmp_path, monkeypatch):
    """--snapshot_every_min 0.05 (3 s) on a clock that moves 5 s a step: the interval has passed before the first
    step, but final/ gets its first snapshot after step 1, never the untrained start model of step 0."""
    LoopSpy(monkeypatch, dt=5.0, grad_clip=1.0)
    assert sft.main(TINY + ["--log_dir", str(tmp_path), "--run_name", "s", "--steps", "3",
                            "--snapshot_every_min", "0.05"]) == 0
    log = (tmp_path / "s" / "sft.log").read_text()
    assert [int(line.split()[3]) for line in log.splitlines() if line.startswith("snapshot of step")] == [1, 2]


def test_a_diverged_run_saves_nothing_after_it(tmp_path, monkeypatch):
    """A NaN loss (step 7 here) stops the run before its update, final/ keeping the last snapshot of a finite loss
    (step 5); weights that the last update made NaN, which no loss has seen, are not saved either."""
    LoopSpy(monkeypatch, dt=1.0, grad_clip=1.0)
    loss, calls = sft.sft_loss, []

    def nan_at_the_seventh_step(model, *batch):
        calls.append(1)
        out = loss(model, *batch)
        if len(calls) == 7:
            return out * float("nan")
        if len(calls) == 23:  # the last step of the second run: a NaN gradient, so its update poisons the weights
            model.transformer.ln_f.weight.register_hook(lambda grad: grad * float("nan"))
        return out
    monkeypatch.setattr(sft, "sft_loss", nan_at_the_seventh_step)
    argv = TINY + ["--log_dir", str(tmp_path), "--steps", "16", "--snapshot_every_min", "0.05"]
    assert sft.main(argv + ["--run_name", "nan"]) == 1
    log = (tmp_path / "nan" / "sft.log").read_text()
    assert log.rstrip().endswith("loss nan at step 7: the run diverged (lower --lr, or raise --warmup_steps); "
                                 "nothing saved after it; final/ holds the snapshot of step 5")
    assert torch.isfinite(load_model(str(tmp_path / "nan" / "final"))[0].transformer.ln_f.weight).all()
    assert sft.main(argv[:-4] + ["--steps", "16", "--run_name", "poisoned"]) == 1  # calls 8 to 23: 16 steps
    assert "the weights after step 16 are not finite" in (tmp_path / "poisoned" / "sft.log").read_text()
    assert not (tmp_path / "poisoned" / "final").exists()
    monkeypatch.setattr(sft, "sft_loss", lambda *batch: loss(*batch) * float("inf"))  # an overflow: inf, not NaN
    assert sft.main(argv[:-4] + ["--steps", "3", "--run_name", "inf"]) == 1
    assert "loss inf at step 1: the run diverged" in (tmp_path / "inf" / "sft.log").read_text()
    assert not (tmp_path / "inf" / "final").exists()


def test_a_second_ctrl_c_names_the_snapshot_kept(tmp_path, monkeypatch, capsys):
    """A second Ctrl-C in step 3, after a snapshot of step 1 on the way (taken before step 2's update), quits with 130
    and sft.log says final/ holds step 1's; one during the final save, after snapshots of steps 1 and 2, likewise
    quits at once with 130 and says that final/ holds the last snapshot, which it does, not that nothing was saved."""
    from mini.runs import RunDir
    LoopSpy(monkeypatch, dt=5.0, grad_clip=1.0)
    loss = sft.sft_loss
    monkeypatch.setattr(sft, "sft_loss", ctrl_c_at_call(loss, 3))
    argv = TINY + ["--log_dir", str(tmp_path), "--steps", "3", "--snapshot_every_min", "0.05"]
    assert sft.main(argv + ["--run_name", "q"]) == 130
    assert (tmp_path / "q" / "sft.log").read_text().rstrip().endswith(
        "quit at step 2 without saving; final/ holds the snapshot of step 1")
    monkeypatch.setattr(sft, "sft_loss", loss)
    monkeypatch.setattr(RunDir, "save_final", ctrl_c_at_call(RunDir.save_final, 3))
    capsys.readouterr()
    assert sft.main(argv + ["--run_name", "s"]) == 130
    final = tmp_path / "s" / "final"
    assert capsys.readouterr().err.strip().endswith(f"quit at once; {final} holds the last snapshot")
    assert load_model(str(final))[0].config.n_layer == 1


def test_a_dead_engine_or_a_damaged_snapshot_is_one_sentence(tmp_path, monkeypatch, capsys):
    """A Stockfish engine that died during a step (EngineFailure, --data_source generate's labels) and a snapshot whose
    config.json is not JSON each end sft.py with exit 1 and one sentence on stderr, not a traceback."""
    from mini.stockfish import EngineFailure
    LoopSpy(monkeypatch, dt=1.0, grad_clip=1.0)

    def engine_died(*batch):
        raise EngineFailure("Stockfish died 3 times on one position")
    monkeypatch.setattr(sft, "sft_loss", engine_died)
    assert sft.main(TINY + ["--log_dir", str(tmp_path), "--run_name", "e", "--steps", "3"]) == 1
    assert capsys.readouterr().err == "error: Stockfish died 3 times on one position\n"
    (tmp_path / "snap").mkdir()
    (tmp_path / "snap" / "config.json").write_text("not json")
    argv = ["--model_path", str(tmp_path / "snap"), "--log_dir", str(tmp_path), "--run_name", "d", "--steps", "1"]
    assert sft.main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "is damaged (not JSON)" in err
    assert not (tmp_path / "d").exists()


def test_sft_log_is_closed_however_the_run_ends(tmp_path, monkeypatch):
    """A diverged run (return 1), a second Ctrl-C (130) and an error in a step (raised) leave no sft.log open behind
    them: a caller in the same process (a notebook, a sweep) would collect one open file per run."""
    LoopSpy(monkeypatch, dt=1.0, grad_clip=1.0)
    loss = sft.sft_loss

    def fails_with(error):
        def step_loss(*batch):
            if isinstance(error, BaseException):
                raise error
            return loss(*batch) * error
        return step_loss
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for run, error, code in (("nan", float("nan"), 1), ("int", KeyboardInterrupt(), 130), ("err", OSError("x"), 1)):
            monkeypatch.setattr(sft, "sft_loss", fails_with(error))
            assert sft.main(TINY + ["--log_dir", str(tmp_path), "--steps", "3", "--run_name", run]) == code
            assert (tmp_path / run / "sft.log").exists()
        gc.collect()
    assert not [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]


def test_what_sft_cannot_do_is_one_sentence_and_leaves_no_run(tmp_path, capsys, monkeypatch):
    """--grow_layers below the model's depth, and --data_workers with --data_source generate (whose Stockfish engines
    cannot be shared with worker processes), stop before the first step with one sentence, and the run directory
    that start made is removed, so that the name stays free. --data_source selfplay (games of the policy being
    trained: train.py's) is refused by the parser, exit 2, before any run starts, and sft's --help does not offer it."""
    argv = TINY + ["--log_dir", str(tmp_path), "--steps", "1"]
    monkeypatch.setattr(sft, "make_reporter", lambda *a: pytest.fail("a refused run opened a W&B/TensorBoard run"))
    assert sft.main(argv + ["--run_name", "g", "--n_layer", "2", "--grow_layers", "1"]) == 1
    assert "--grow_layers 1 is fewer than the snapshot's 2 layers" in capsys.readouterr().err
    assert sft.main(argv + ["--run_name", "w", "--data_source", "generate", "--data_workers", "1"]) == 1
    assert "--data_workers needs --data_source pool or file" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        sft.main(argv + ["--run_name", "s", "--data_source", "selfplay"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "--data_source: invalid choice: 'selfplay'" in err and "generate" in err and "selfplay'," not in err
    assert not any((tmp_path / run).exists() for run in "gws")
    assert parse_args(["--data_source", "selfplay"], "train").data_source == "selfplay"


def test_out_of_memory_in_a_step_is_one_sentence(tmp_path, capsys, monkeypatch):
    """A --batch_size too large for the GPU was torch's traceback from the step; it says what to lower."""
    def loss_out_of_memory(*batch):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    monkeypatch.setattr(sft, "sft_loss", loss_out_of_memory)
    assert sft.main(TINY + ["--log_dir", str(tmp_path), "--steps", "2", "--run_name", "r"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == "error: out of memory with 2 sequences a step; lower --batch_size"
    assert "Traceback" not in err


if __name__ == "__main__":
    import sys
    sys.exit(pytest.main([__file__, "-q"]))
