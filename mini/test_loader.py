"""Snapshot round-trips (ours -> ours, ours -> transformers) and the errors a user can cause.

    python mini/test_loader.py
"""
import json
import os
import re
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from mini.config import CI_MODEL, SHIPPED_MODEL
from mini.loader import CONV1D, LoadError, average_snapshots, load_model, save_model
from mini.model import GPT, GPTConfig
from mini.tokenizer import Tokenizer


@pytest.fixture(scope="module")
def snapshot(tmp_path_factory):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, n_positions=48)).eval()  # real vocab, odd n_positions
    path = save_model(model, Tokenizer.gpt2(), str(tmp_path_factory.mktemp("snap") / "model"))
    return model, path


IDS = torch.tensor([[464, 2068, 7586, 21831, 18045, 625, 262, 16931, 3290, 13]])


@torch.no_grad()
def test_round_trip_through_load_model(snapshot):
    model, path = snapshot
    loaded, tok = load_model(path)
    assert loaded.config == model.config and loaded.config.n_positions == 48
    assert not loaded.training  # eval mode: no dropout in sampling or in the reference
    assert torch.equal(loaded(IDS), model(IDS))
    assert tok.encode("P: 8/8/8") == Tokenizer.gpt2().encode("P: 8/8/8")


def test_an_older_config_names_the_positions_n_ctx(snapshot, tmp_path):
    """The first GPT-2 config.json files give the context length as n_ctx, without n_positions."""
    _, path = snapshot
    copy = shutil.copytree(path, tmp_path / "old")
    cfg = json.loads((copy / "config.json").read_text())
    del cfg["n_positions"]
    (copy / "config.json").write_text(json.dumps({**cfg, "n_ctx": 48}))
    os.remove(copy / "config.json.sha256")
    assert load_model(str(copy))[0].config.n_positions == 48


@torch.no_grad()
def test_round_trip_through_transformers(snapshot):
    transformers = pytest.importorskip("transformers", reason="transformers is the reference implementation")
    model, path = snapshot
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)  # what transformers reads: tanh GELU is "gelu_new"
    assert (cfg["activation_function"], cfg["layer_norm_epsilon"], cfg["tie_word_embeddings"]) == ("gelu_new", 1e-5, True)
    assert cfg["eos_token_id"] == cfg["bos_token_id"] == 50256
    hf = transformers.GPT2LMHeadModel.from_pretrained(path).eval()
    theirs = hf.state_dict()
    for key, w in model.state_dict().items():  # the same numbers, bit for bit (HF keeps Conv1D as (in, out))
        assert torch.equal(theirs[key].t() if key.endswith(CONV1D) else theirs[key], w), key
    assert (hf(IDS).logits - model(IDS)).abs().max() <= 1e-5  # two implementations: equal up to fp32 rounding


def test_pytorch_bin_fallback(snapshot, tmp_path):
    model, path = snapshot
    for f in ("config.json", "vocab.json", "merges.txt"):
        os.link(os.path.join(path, f), tmp_path / f)
    torch.save(load_file(os.path.join(path, "model.safetensors")), tmp_path / "pytorch_model.bin")
    loaded, _ = load_model(str(tmp_path))
    with torch.no_grad():
        assert torch.equal(loaded(IDS), model(IDS))


class RunsCodeWhenUnpickled:
    """A pickled object whose loading opens (creates) a file: what a hostile pytorch_model.bin could do."""
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return open, (self.marker, "w")


def test_a_pytorch_bin_that_runs_code_is_refused_unrun(snapshot, tmp_path):
    """torch.load(weights_only=True): a pickle holding anything but tensors is a LoadError, its code never run."""
    _, path = snapshot
    for f in ("config.json", "vocab.json", "merges.txt"):
        os.link(os.path.join(path, f), tmp_path / f)
    marker = tmp_path / "ran"
    torch.save({"transformer.wte.weight": RunsCodeWhenUnpickled(str(marker))}, tmp_path / "pytorch_model.bin")
    with pytest.raises(LoadError, match="pytorch_model.bin cannot be read .*damaged"):
        load_model(str(tmp_path))
    assert not marker.exists()


@pytest.mark.parametrize("held, kind", [("list", "a list"), ("tensor", "a Tensor"), ("number", "a dict of other things"),
                                        ("nested", "a dict of other things")])
def test_a_pytorch_bin_of_anything_but_named_tensors_is_a_load_error(snapshot, tmp_path, held, kind):
    """torch.load(weights_only=True) also returns lists, bare tensors, numbers and nested dicts: each a LoadError
    naming the file, where `.items()` or `w.shape` was a traceback."""
    _, path = snapshot
    for f in ("config.json", "vocab.json", "merges.txt"):
        os.link(os.path.join(path, f), tmp_path / f)
    state = load_file(os.path.join(path, "model.safetensors"))
    obj = {"list": list(state.values()), "tensor": state["transformer.wte.weight"],
           "number": {**state, "transformer.wte.weight": 5}, "nested": {"state_dict": state}}[held]
    torch.save(obj, tmp_path / "pytorch_model.bin")
    with pytest.raises(LoadError, match=f"pytorch_model.bin holds {kind}, not weight tensors by name; it is not a GPT-2"):
        load_model(str(tmp_path))


@pytest.mark.parametrize("name", ["config.json", "vocab.json", "merges.txt"])
def test_a_snapshot_file_that_is_a_folder_is_a_load_error(snapshot, tmp_path, name):
    """A folder (or a file that cannot be read) where a snapshot file should be: one sentence naming it, where
    open() raised an IsADirectoryError past every script's handler."""
    _, path = snapshot
    copy = tmp_path / "model"
    shutil.copytree(path, copy)
    os.remove(copy / name)
    (copy / name).mkdir()
    with pytest.raises(LoadError, match=f"^{copy / name}: is a directory; check the path$"):
        load_model(str(copy))


def test_clear_errors(snapshot, tmp_path):
    _, path = snapshot
    with pytest.raises(LoadError, match="does not exist"):
        load_model(str(tmp_path / "nowhere"))
    with pytest.raises(LoadError, match="no config.json"):
        load_model(str(tmp_path))
    (tmp_path / "config.json").write_text(open(os.path.join(path, "config.json")).read())
    with pytest.raises(LoadError, match="no model.safetensors"):
        load_model(str(tmp_path))
    state = load_file(os.path.join(path, "model.safetensors"))
    save_file(state, str(tmp_path / "model.safetensors"))
    cfg = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**cfg, "n_embd": 64}))
    with pytest.raises(LoadError, match="do not match"):
        load_model(str(tmp_path))
    (tmp_path / "config.json").write_text('{"n_layer": 2,')  # cut off
    with pytest.raises(LoadError, match=rf"^{tmp_path / 'config.json'} is damaged \(not JSON\)"):
        load_model(str(tmp_path))
    (tmp_path / "config.json").write_text("[" * 100000)  # json's parser recurses
    with pytest.raises(LoadError, match=rf"^{tmp_path / 'config.json'} is damaged \(JSON nested too deeply\)"):
        load_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if k != "n_layer"}))
    with pytest.raises(LoadError, match=rf"^{tmp_path / 'config.json'} lacks 'n_layer'; it does not describe a GPT-2"):
        load_model(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "model.safetensors").write_bytes(open(os.path.join(path, "model.safetensors"), "rb").read()[:1000])
    with pytest.raises(LoadError, match=rf"^{tmp_path / 'model.safetensors'} cannot be read .*damaged"):
        load_model(str(tmp_path))


@pytest.mark.parametrize("name", ["config.json", "vocab.json", "merges.txt"])
def test_snapshot_files_saved_with_a_byte_order_mark_load(snapshot, tmp_path, name):
    """A config.json or tokenizer file re-saved by an editor that writes a byte-order mark loads as it was, where it
    was "damaged (not JSON)", "not a GPT-2 vocabulary" or "merge 0 (#version: 0.2) does not create token 256"."""
    model, path = snapshot
    snap = copy_snapshot(path, tmp_path, load_file(os.path.join(path, "model.safetensors")))
    text = (tmp_path / name).read_bytes()
    os.unlink(tmp_path / name)  # a link to the snapshot's
    (tmp_path / name).write_bytes(b"\xef\xbb\xbf" + text)
    assert load_model(snap)[0].config == model.config


def test_a_path_is_never_taken_for_a_hub_id(tmp_path, monkeypatch):
    (tmp_path / "logs").mkdir()
    monkeypatch.chdir(tmp_path)
    for path in ("logs/nope", "./nope", "nope", "a/b/c", "~/nope"):  # logs exists here: logs/nope is a path
        with pytest.raises(LoadError, match=f"^model directory {path} does not exist"):
            load_model(path)


def test_hub_offline_without_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    import huggingface_hub.constants as c
    monkeypatch.setattr(c, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(c, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.chdir(os.path.dirname(os.path.dirname(SHIPPED_MODEL)) + "/..")  # the repository root
    with pytest.raises(LoadError, match="Hugging Face hub or its local cache") as e:
        load_model("jrahn/RookWorld-LM-124M")
    assert str(e.value).endswith("offline: --model_path mini/data/rookworld-10m")  # the way out, runnable as shown


def test_bf16_snapshot(snapshot, tmp_path):
    model, _ = snapshot
    path = save_model(model, Tokenizer.gpt2(), str(tmp_path / "bf16"), dtype=torch.bfloat16)
    assert all(w.dtype == torch.bfloat16 for w in load_file(os.path.join(path, "model.safetensors")).values())
    loaded, _ = load_model(path)
    for key, w in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[key], w.bfloat16().float()), key


class Killed(BaseException):
    """A kill -9 at that system call, as far as the files are concerned."""


@pytest.mark.parametrize("killed_at", ["moving the old aside", "moving the new in", "removing the old"])
@torch.no_grad()
def test_a_save_killed_at_any_moment_leaves_one_complete_snapshot(snapshot, tmp_path, monkeypatch, killed_at):
    """sft.py overwrites final/ every few minutes: a kill between removing the old snapshot and renaming the new
    one in used to leave none. Now the old is renamed aside and removed last; the next load or save puts back
    whichever is complete."""
    old, _ = snapshot
    out = str(tmp_path / "final")
    save_model(old, Tokenizer.gpt2(), out)
    new = GPT(old.config).eval()
    rename, rmtree = os.rename, shutil.rmtree
    calls = {"rename": 0}

    def kill_rename(src, dst):
        calls["rename"] += 1
        if (killed_at, calls["rename"]) in (("moving the old aside", 1), ("moving the new in", 2)):
            raise Killed
        rename(src, dst)

    def kill_rmtree(path, *a, **k):
        if os.path.basename(path) == ".old-final":
            raise Killed
        rmtree(path, *a, **k)

    monkeypatch.setattr(os, "rename", kill_rename)
    monkeypatch.setattr(shutil, "rmtree", kill_rmtree if killed_at == "removing the old" else rmtree)
    with pytest.raises(Killed):
        save_model(new, Tokenizer.gpt2(), out)
    monkeypatch.undo()
    survivor = new if killed_at == "removing the old" else old
    loaded, _ = load_model(out)
    assert torch.equal(loaded(IDS), survivor(IDS))
    assert not os.path.exists(tmp_path / ".old-final")
    save_model(new, Tokenizer.gpt2(), out)  # and the next save goes through
    assert torch.equal(load_model(out)[0](IDS), new(IDS))
    assert [f for f in os.listdir(tmp_path) if not f.startswith(".tmp-")] == ["final"]  # .tmp-*: RunDir.claim's


def test_a_snapshot_reaches_the_disk_before_its_rename_and_the_rename_after(snapshot, tmp_path, monkeypatch):
    """The final snapshot is what a run leaves: its files and its folder are synced before the rename makes them
    the snapshot, and the parent folder (which holds the rename) after it, as a checkpoint's are."""
    events, fsync = [], os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}"),
                                                                     os.fstat(fd).st_size)) or fsync(fd))
    monkeypatch.setattr(os, "rename", lambda a, b, rename=os.rename: events.append(("rename", a, b)) or rename(a, b))
    out = str(tmp_path / "final")
    save_model(snapshot[0], Tokenizer.gpt2(), out)
    move_in = next(i for i, e in enumerate(events) if e[0] == "rename" and e[2] == out)
    tmp = events[move_in][1]
    synced = {os.path.relpath(e[1], tmp).removesuffix(".tmp"): e[2]  # write_checksum syncs its .tmp, then renames
              for e in events[:move_in] if e[0] == "fsync" and e[1].startswith(tmp)}
    assert set(synced) == {".", *os.listdir(out)}  # every file, and the folder that lists them
    assert synced["model.safetensors"] == os.path.getsize(os.path.join(out, "model.safetensors"))  # whole
    assert ("fsync", str(tmp_path)) in [e[:2] for e in events[move_in:]]


@pytest.mark.parametrize("holds", ["notes", "a run"])
def test_a_save_onto_a_folder_that_holds_no_snapshot_is_refused(snapshot, tmp_path, holds):
    """save_model replaces the folder at out_dir whole: a folder of other files, or a run directory (a config.json of
    settings, no weights), is refused untouched; an empty folder or a snapshot is replaced."""
    folder = tmp_path / "out"
    folder.mkdir()
    (folder / ("notes.txt" if holds == "notes" else "config.json")).write_text("mine")
    with pytest.raises(LoadError, match=rf"^cannot save a model to {folder}: it is a folder that holds no model "
                                        "snapshot, and the save would replace all it holds; pick a new path$"):
        save_model(snapshot[0], Tokenizer.gpt2(), str(folder))
    assert os.listdir(folder) == ["notes.txt" if holds == "notes" else "config.json"]
    (tmp_path / "empty").mkdir()
    for out in (tmp_path / "empty", tmp_path / "empty"):  # empty, then a snapshot
        assert load_model(save_model(snapshot[0], Tokenizer.gpt2(), str(out)))[0].config == snapshot[0].config


def test_an_empty_model_path_says_no_model_was_given():
    with pytest.raises(LoadError, match=r"^no model given \(an empty --model_path\); pass a snapshot directory or a hub id"):
        load_model("")


def test_a_save_onto_a_file_is_refused(snapshot, tmp_path):
    (tmp_path / "final").write_text("notes")
    with pytest.raises(LoadError, match="it is a file"):
        save_model(snapshot[0], Tokenizer.gpt2(), str(tmp_path / "final"))
    assert (tmp_path / "final").read_text() == "notes"


def test_a_snapshot_with_non_finite_weights_is_a_load_error(snapshot, tmp_path):
    """A diverged run's weights would answer garbage with a normal-looking report: refused, naming the weight."""
    model, _ = snapshot
    bad = GPT(model.config)
    with torch.no_grad():
        bad.transformer.h[1].mlp.c_fc.bias[3] = float("inf")
    path = save_model(bad, Tokenizer.gpt2(), str(tmp_path / "diverged"))
    with pytest.raises(LoadError, match=r"weight transformer\.h\.1\.mlp\.c_fc\.bias holds NaN or infinite values"):
        load_model(path)


def copy_snapshot(path, to, state):
    """config.json and the tokenizer files of path (no checksums: a hand-edited snapshot) with these weights."""
    for f in ("config.json", "vocab.json", "merges.txt"):
        os.link(os.path.join(path, f), to / f)
    save_file(state, str(to / "model.safetensors"))
    return str(to)


@torch.no_grad()
def test_an_old_checkpoint_without_prefixes_and_with_attention_buffers_loads(snapshot, tmp_path):
    """Checkpoints of older transformers (openai-community/gpt2's own) name the weights without 'transformer.'
    and also store each layer's attn.bias and attn.masked_bias buffers: the same model loads from them."""
    model, path = snapshot
    state = {k.removeprefix("transformer."): w for k, w in load_file(os.path.join(path, "model.safetensors")).items()}
    P = model.config.n_positions
    for i in range(model.config.n_layer):
        state[f"h.{i}.attn.bias"] = torch.tril(torch.ones(P, P)).view(1, 1, P, P)
        state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    loaded, _ = load_model(copy_snapshot(path, tmp_path, state))
    assert torch.equal(loaded(IDS), model(IDS))


@pytest.mark.parametrize("name,value", [("tie_word_embeddings", False), ("layer_norm_epsilon", 1e-6),
                                        ("activation_function", "relu"), ("activation_function", "gelu"),
                                        ("scale_attn_weights", False), ("scale_attn_by_inverse_layer_idx", True)])
def test_an_architecture_the_model_does_not_compute_is_a_load_error(snapshot, tmp_path, name, value):
    """A config.json with an untied output layer (or another epsilon, activation, attention scale) would load
    every weight and compute another model: refused, naming the field."""
    _, path = snapshot
    snap = copy_snapshot(path, tmp_path, load_file(os.path.join(path, "model.safetensors")))
    cfg = json.loads((tmp_path / "config.json").read_text())
    os.unlink(tmp_path / "config.json")  # a link to the snapshot's
    (tmp_path / "config.json").write_text(json.dumps({**cfg, name: value}))
    with pytest.raises(LoadError, match=f"config.json: {name} is {json.dumps(value)}, but mini/model.py computes"):
        load_model(snap)


@torch.no_grad()
def test_a_stored_output_layer_is_the_embedding(snapshot, tmp_path):
    """GPT-2 ties its output layer to the embedding: an lm_head.weight stored beside it is left as transformers
    leaves it, even last in the file (a pytorch_model.bin keeps the order), where it overwrote the embedding."""
    model, path = snapshot
    state = load_file(os.path.join(path, "model.safetensors"))
    state["lm_head.weight"] = torch.randn_like(state["transformer.wte.weight"])
    for f in ("config.json", "vocab.json", "merges.txt"):
        os.link(os.path.join(path, f), tmp_path / f)
    torch.save(state, tmp_path / "pytorch_model.bin")
    loaded, _ = load_model(str(tmp_path))
    assert torch.equal(loaded(IDS), model(IDS))


def test_missing_unexpected_and_too_many_tokens_are_load_errors(snapshot, tmp_path):
    """A checkpoint without a weight, with a foreign one, or with fewer logits than its tokenizer has tokens is a
    LoadError that says so, not random weights, a KeyError, or token ids past the output layer."""
    model, path = snapshot
    state = load_file(os.path.join(path, "model.safetensors"))
    n = 1 + max(int(k.split(".")[2]) for k in state if k.startswith("transformer.h."))
    last = {k: w for k, w in state.items() if k.startswith(f"transformer.h.{n - 1}.")}
    cases = [({k: w for k, w in state.items() if k != "transformer.h.1.mlp.c_fc.bias"}, "weights missing for"),
             ({**state, "transformer.h.0.attn.rotary": torch.zeros(3)}, "unexpected weight 'transformer.h.0.attn.rotary'"),
             ({k: w for k, w in state.items() if k not in last},  # config.json says one layer more
              f"the weights hold {n - 1} layers but config.json says n_layer {n}; config.json and the weights do not"),
             ({**state, **{k.replace(f".h.{n - 1}.", f".h.{n}."): w.clone() for k, w in last.items()}},  # one more
              f"the weights hold a layer {n} \\(from 0\\), past config.json's n_layer {n}")]
    for i, (weights, message) in enumerate(cases):
        (tmp_path / str(i)).mkdir()
        with pytest.raises(LoadError, match=message):
            load_model(copy_snapshot(path, tmp_path / str(i), weights))
    (tmp_path / "small").mkdir()  # weights and config.json of 1000 tokens beside GPT-2's tokenizer of 50257
    small = copy_snapshot(path, tmp_path / "small", {**state, "transformer.wte.weight": state["transformer.wte.weight"][:1000]})
    cfg = json.loads((tmp_path / "small" / "config.json").read_text())
    os.unlink(tmp_path / "small" / "config.json")  # a link to the snapshot's
    (tmp_path / "small" / "config.json").write_text(json.dumps({**cfg, "vocab_size": 1000}))
    with pytest.raises(LoadError, match="tokenizer has 50257 tokens but the model only 1000"):
        load_model(small)


@pytest.mark.parametrize("dtype", [torch.int8, torch.bool])
def test_weights_stored_as_integers_are_a_load_error(snapshot, tmp_path, dtype):
    """A weight stored as integers (a quantized checkpoint's int8) or booleans loaded as their numbers, a garbage model
    with no word said: refused, naming the weight and its type."""
    _, path = snapshot
    state = load_file(os.path.join(path, "model.safetensors"))
    state["transformer.h.0.mlp.c_fc.weight"] = (100 * state["transformer.h.0.mlp.c_fc.weight"]).to(dtype)
    with pytest.raises(LoadError, match=rf"weight transformer\.h\.0\.mlp\.c_fc\.weight is stored as "
                                        rf"{str(dtype).removeprefix('torch.')}, not as floating point numbers"):
        load_model(copy_snapshot(path, tmp_path, state))


@pytest.mark.parametrize("sizes, message", [
    ({"n_layer": 10**6}, "the weights hold 2 layers but config.json says n_layer 1000000; config.json and the weights"),
    ({"n_embd": 10**6, "n_head": 1}, r"has shape \(\d+,\) but config.json implies \(3000000,\); config.json and the")],
    ids=["n_layer", "n_embd"])
@pytest.mark.timeout(60)  # a million layers built, even on the meta device, take minutes
def test_a_config_of_sizes_its_weights_lack_is_refused_before_any_memory_is_taken(snapshot, tmp_path, sizes, message):
    """config.json's sizes are checked against the weights on the meta device: a million layers hung building them,
    a width of a million failed allocating 200 GB (a RuntimeError past every script's handler)."""
    _, path = snapshot
    snap = copy_snapshot(path, tmp_path, load_file(os.path.join(path, "model.safetensors")))
    cfg = json.loads((tmp_path / "config.json").read_text())
    os.unlink(tmp_path / "config.json")  # a link to the snapshot's
    (tmp_path / "config.json").write_text(json.dumps({**cfg, **sizes}))
    with pytest.raises(LoadError, match=message):
        load_model(snap)


@torch.no_grad()
def test_an_output_padded_past_the_tokenizer_is_cut_to_its_tokens(tmp_path):
    """nanoGPT pads GPT-2's 50257 outputs to 50304: the rows past the tokenizer are no token, so they are cut at load
    (the logits of the real tokens unchanged, none an id that no text decodes to), and the model saves as 50257."""
    torch.manual_seed(0)
    padded = GPT(GPTConfig(n_layer=1, n_head=2, n_embd=32, n_positions=48, vocab_size=50304)).eval()
    padded.transformer.wte.weight[50257:] = 5.0  # padding rows that would win every draw
    model, tok = load_model(save_model(padded, Tokenizer.gpt2(), str(tmp_path / "padded")))
    assert model.config.vocab_size == tok.vocab_size == 50257
    assert torch.equal(model(IDS), padded(IDS)[..., :50257])
    assert load_model(save_model(model, tok, str(tmp_path / "cut")))[0].config.vocab_size == 50257


@torch.no_grad()
@pytest.mark.parametrize("shipped", [SHIPPED_MODEL, CI_MODEL])
def test_shipped_model_loads_here_and_in_transformers(shipped):
    reports = {"eval.json", "chess.json"}  # evaluate.py's and chess_eval.py's default --out here, git-ignored
    files = {f: os.path.getsize(os.path.join(shipped, f)) for f in os.listdir(shipped) if f not in reports}
    assert set(files) == {"config.json", "model.safetensors", "vocab.json", "merges.txt"}
    assert sum(files.values()) <= 25 * 2**20
    assert {w.dtype for w in load_file(os.path.join(shipped, "model.safetensors")).values()} == {torch.bfloat16}
    ours, tok = load_model(shipped)
    ids = torch.tensor([tok.encode("P: rnbqkbnr/pppppppp/8/8/8/8/PPPPPPPP/RNBQKBNR w KQkq - 0 1 ")])
    transformers = pytest.importorskip("transformers", reason="transformers is the reference implementation")
    hf = transformers.GPT2LMHeadModel.from_pretrained(shipped, torch_dtype=torch.float32).eval()
    # 16 fp32 layers with logits up to ~20: each implementation lies ~1e-4 from the float64 result (transformers
    # 5.24's SDPA 5e-5, ours 1.2e-4), so they may differ by that much; a fault in loading moves logits by O(1)
    assert (hf(ids).logits - ours(ids)).abs().max() <= 1e-3


@pytest.mark.parametrize("key,weight", [("transformer.h.0.attn.c_attn.weight", torch.zeros(1, 32, 96)),
                                        ("transformer.h.0.mlp.c_proj.weight", torch.zeros(128)),
                                        ("transformer.wte.weight", torch.tensor(1.0))], ids=["3-D", "1-D", "0-D"])
def test_a_weight_of_the_wrong_rank_is_a_shape_error(snapshot, tmp_path, key, weight):
    """A Conv1D weight of three dimensions failed transposing (a RuntimeError), an embedding of none taking its
    row count (an IndexError): each is the shape mismatch it is."""
    _, path = snapshot
    state = {**load_file(os.path.join(path, "model.safetensors")), key: weight}
    with pytest.raises(LoadError, match=rf"weight {key} has shape {re.escape(str(tuple(weight.shape)))} but "
                                        "config.json implies"):
        load_model(copy_snapshot(path, tmp_path, state))


def test_a_snapshot_file_whose_bytes_changed_is_a_load_error(snapshot, tmp_path):
    """A flipped bit in the weights still loads as numbers: the checksum save_model wrote beside each file tells."""
    _, path = snapshot
    copy = shutil.copytree(path, tmp_path / "copy")
    assert sorted(f for f in os.listdir(copy) if f.endswith(".sha256")) == [
        "config.json.sha256", "merges.txt.sha256", "model.safetensors.sha256", "vocab.json.sha256"]
    with open(copy / "model.safetensors", "r+b") as f:
        f.seek(-3, os.SEEK_END)
        byte = f.read(1)
        f.seek(-3, os.SEEK_END)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(LoadError, match=rf"^{copy / 'model.safetensors'} does not match its checksum "
                                        r"\(model.safetensors.sha256\): it is damaged; download or save the snapshot"):
        load_model(str(copy))


@pytest.mark.parametrize("config_json", [None, '{"steps": 3}'], ids=["without", "with-its-settings"])
def test_a_run_directory_given_as_a_model_says_whether_it_has_one_yet(tmp_path, config_json):
    """With or without its config.json (train.py's settings, no model's sizes), a run directory is named as one."""
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    if config_json:
        (tmp_path / "run" / "config.json").write_text(config_json)
    with pytest.raises(LoadError, match=rf"^{tmp_path / 'run'} is a training run's directory, not a model; it has no "
                                        "final/ model yet$"):
        load_model(str(tmp_path / "run"))
    (tmp_path / "run" / "final").mkdir()
    with pytest.raises(LoadError, match=rf"not a model; its model is {tmp_path / 'run' / 'final'}$"):
        load_model(str(tmp_path / "run"))


@torch.no_grad()
def test_model_safetensors_is_read_before_pytorch_model_bin(snapshot, tmp_path):
    """A hub snapshot may hold both: the safetensors file, which cannot run code, is the one read."""
    model, path = snapshot
    state = load_file(os.path.join(path, "model.safetensors"))
    copy_snapshot(path, tmp_path, state)
    torch.save({k: w + 1 for k, w in state.items()}, tmp_path / "pytorch_model.bin")
    assert torch.equal(load_model(str(tmp_path))[0](IDS), model(IDS))


def test_a_snapshots_own_tokenizer_json_is_read_not_gpt2s(snapshot, tmp_path):
    """A snapshot with tokenizer.json and no vocab.json has its own tokenizer: a damaged one is a LoadError naming
    it, never GPT-2's tokenizer silently in its place."""
    _, path = snapshot
    save_file(load_file(os.path.join(path, "model.safetensors")), str(tmp_path / "model.safetensors"))
    shutil.copy(os.path.join(path, "config.json"), tmp_path / "config.json")
    (tmp_path / "tokenizer.json").write_text("{}")
    with pytest.raises(LoadError, match="tokenizer.json"):
        load_model(str(tmp_path))


def test_a_saved_snapshot_says_its_sizes_and_dtype_as_transformers_reads_them(snapshot, tmp_path):
    """n_ctx (older readers' context length) is n_positions; torch_dtype is the name without "torch."; the tied
    output layer is stored once, as the embedding; a parent folder not there yet is made."""
    model, _ = snapshot
    path = save_model(model, Tokenizer.gpt2(), str(tmp_path / "a" / "b" / "final"), dtype=torch.bfloat16)
    cfg = json.loads(open(os.path.join(path, "config.json")).read())
    assert (cfg["n_ctx"], cfg["n_positions"], cfg["torch_dtype"]) == (48, 48, "bfloat16")
    assert "lm_head.weight" not in load_file(os.path.join(path, "model.safetensors"))
    assert load_file(os.path.join(path, "model.safetensors"))["transformer.h.0.mlp.c_fc.weight"].shape == (32, 128)


def test_a_failed_save_leaves_nothing_half_written(snapshot, tmp_path, monkeypatch):
    def full(self, path):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(Tokenizer, "save", full)
    with pytest.raises(OSError):
        save_model(snapshot[0], Tokenizer.gpt2(), str(tmp_path / "final"))
    assert os.listdir(tmp_path) == []


def test_load_model_puts_the_model_on_the_device_asked(snapshot):
    model, _ = load_model(snapshot[1], device="meta")
    assert {p.device.type for p in model.parameters()} == {"meta"}


def test_average_snapshots_is_the_mean_of_their_weights(snapshot, tmp_path):
    model, path = snapshot
    torch.manual_seed(1)
    other = GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, n_positions=48)).eval()
    other_path = save_model(other, Tokenizer.gpt2(), str(tmp_path / "other"))
    mean, _ = load_model(average_snapshots([path, other_path], str(tmp_path / "mean"), dtype=torch.float32))
    w, v, m = (x.state_dict()["transformer.h.1.mlp.c_fc.weight"] for x in (model, other, mean))
    assert torch.allclose(m, (w + v) / 2, atol=1e-7)
    bf16, _ = load_model(average_snapshots([path, path], str(tmp_path / "same")))  # the shipped dtype by default
    assert torch.equal(bf16.state_dict()["transformer.wte.weight"],
                       model.state_dict()["transformer.wte.weight"].bfloat16().float())


def test_average_snapshots_of_two_architectures_or_none_is_a_load_error(snapshot, tmp_path):
    """Other shapes, or the same shapes split otherwise (n_head 4 against 2: the mean would be saved under the
    first one's config, a model nobody trained), or no snapshot at all."""
    _, path = snapshot
    wider = save_model(GPT(GPTConfig(n_layer=2, n_head=2, n_embd=64, n_positions=48)), Tokenizer.gpt2(),
                       str(tmp_path / "wider"))
    more_heads = save_model(GPT(GPTConfig(n_layer=2, n_head=4, n_embd=32, n_positions=48)), Tokenizer.gpt2(),
                            str(tmp_path / "more_heads"))
    for other in (wider, more_heads):
        with pytest.raises(LoadError, match="another architecture"):
            average_snapshots([path, other], str(tmp_path / "mean"))
    with pytest.raises(LoadError, match="no snapshots to average"):
        average_snapshots([], str(tmp_path / "mean"))
    assert not os.path.exists(tmp_path / "mean")


def test_average_snapshots_never_writes_over_one_of_its_inputs(snapshot, tmp_path):
    """save_model replaces a folder that holds a snapshot: the mean written to an input's own folder would
    destroy that run's weights, with no way back."""
    model, path = snapshot
    other = save_model(GPT(GPTConfig(n_layer=2, n_head=2, n_embd=32, n_positions=48)), Tokenizer.gpt2(),
                       str(tmp_path / "other"))
    for out in (path, os.path.join(other, ".")):
        with pytest.raises(LoadError, match="is one of the snapshots to average"):
            average_snapshots([path, other], out)
    assert torch.equal(load_model(path)[0].state_dict()["transformer.wte.weight"],
                       model.state_dict()["transformer.wte.weight"])


if __name__ == "__main__":
    import sys
    sys.exit(pytest.main([__file__, "-q"]))
