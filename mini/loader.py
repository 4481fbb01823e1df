"""
Load and save GPT-2 snapshots in the Hugging Face format (config.json, model.safetensors, vocab.json,
merges.txt), from a local directory or the hub:

    model, tok = load_model("jrahn/RookWorld-LM-124M", device="cuda")
    save_model(model, tok, "logs/run/final")  # also loads with transformers.GPT2LMHeadModel
"""
import hashlib
import json
import os
import re
import shutil
import tempfile
from dataclasses import replace

import torch
from safetensors.torch import load_file, save_file

from mini.config import SHIPPED_MODEL
from mini.flags import error_sentence, looks_like_path
from mini.model import GPT, GPTConfig
from mini.tokenizer import Tokenizer

CONV1D = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")  # (in, out) in HF
SNAPSHOT_FILES = ["config.json", "model.safetensors", "pytorch_model.bin", "vocab.json", "merges.txt", "tokenizer.json"]


class LoadError(Exception):
    """A problem the user can fix; the message says how."""


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_checksum(path):
    """path.sha256 beside path: its SHA-256, written to .tmp and renamed (check_checksum verifies it)."""
    with open(path + ".sha256.tmp", "w") as f:
        f.write(sha256_of(path) + "\n")
        f.flush()
        os.fsync(f.fileno())  # else a power loss may leave an empty checksum beside a good file: "damaged"
    os.replace(path + ".sha256.tmp", path + ".sha256")


def check_checksum(path):
    """ValueError in one sentence when path's bytes no longer match the path.sha256 beside it (a flipped bit,
    a torn copy); a file without one (a hub snapshot, an older run's checkpoint) is not checked."""
    try:
        with open(path + ".sha256") as f:
            want = f.read().strip()
    except FileNotFoundError:
        return
    if sha256_of(path) != want:
        raise ValueError(f"{path} does not match its checksum ({os.path.basename(path)}.sha256): it is damaged")


def replaced_aside(out_dir):
    """Where save_model keeps the snapshot it replaces until the new one is in place."""
    return os.path.join(os.path.dirname(os.path.abspath(out_dir)), ".old-" + os.path.basename(os.path.abspath(out_dir)))


def finish_interrupted_save(out_dir):
    """A save killed between its two renames left the earlier snapshot aside and none in out_dir: put it back.
    Killed after them, the aside copy is the superseded one: remove it."""
    aside = replaced_aside(out_dir)
    if os.path.isdir(aside):
        if os.path.exists(out_dir):
            shutil.rmtree(aside, ignore_errors=True)
        else:
            os.rename(aside, out_dir)


def resolve_snapshot(name_or_path):
    """A local directory as it is; anything else is a hub id fetched (or found in the cache) by huggingface_hub."""
    if not name_or_path:
        raise LoadError("no model given (an empty --model_path); pass a snapshot directory or a hub id like "
                        "jrahn/RookWorld-LM-124M")
    finish_interrupted_save(name_or_path)
    if os.path.isdir(name_or_path):
        return name_or_path
    if looks_like_path(name_or_path):
        raise LoadError(f"model directory {name_or_path} does not exist; pass an existing snapshot directory "
                        "or a hub id like jrahn/RookWorld-LM-124M")
    from huggingface_hub import snapshot_download
    try:
        return snapshot_download(name_or_path, allow_patterns=SNAPSHOT_FILES)
    except Exception as e:  # offline without cache, unknown repo, network errors: all end the same way
        raise LoadError(f"could not get {name_or_path!r} from the Hugging Face hub or its local cache "
                        f"({type(e).__name__}); connect to the network once, point HF_HOME at a cache that has it, "
                        f"or train the small model shipped with this project offline: --model_path "
                        f"{os.path.relpath(SHIPPED_MODEL)}") from None


def not_a_run(path):
    """A LoadError if `path` is a training run's directory (train.py's or sft.py's), which holds its model in
    final/: given as a model, the natural mistake."""
    final = os.path.join(path, "final")
    if os.path.isdir(final) or os.path.isdir(os.path.join(path, "checkpoints")):
        raise LoadError(f"{path} is a training run's directory, not a model; "
                        + (f"its model is {final}" if os.path.isdir(final) else "it has no final/ model yet"))


def read_config(path):
    cfg_file = os.path.join(path, "config.json")
    if not os.path.exists(cfg_file):
        not_a_run(path)
        raise LoadError(f"{path} has no config.json; is it a GPT-2 snapshot directory?")
    try:
        with open(cfg_file, encoding="utf-8-sig") as f:  # an editor's byte-order mark is not damage
            hf = json.load(f)
    except (ValueError, UnicodeDecodeError):
        raise LoadError(f"{cfg_file} is damaged (not JSON); download or save the snapshot again") from None
    except RecursionError:
        raise LoadError(f"{cfg_file} is damaged (JSON nested too deeply); download or save the snapshot again") from None
    if not isinstance(hf, dict):
        raise LoadError(f"{cfg_file} holds a JSON {type(hf).__name__}, not an object; it does not describe a GPT-2 model")
    if "vocab_size" not in hf:  # a run's config.json (train.py's settings) is not a model's
        not_a_run(path)
    sizes = {"n_layer": hf.get("n_layer"), "n_head": hf.get("n_head"), "n_embd": hf.get("n_embd"),
             "n_positions": hf.get("n_positions", hf.get("n_ctx")), "vocab_size": hf.get("vocab_size")}
    for name, value in sizes.items():
        if name not in hf and not (name == "n_positions" and "n_ctx" in hf):
            raise LoadError(f"{cfg_file} lacks {name!r}; it does not describe a GPT-2 model")
        if type(value) is not int or not 1 <= value <= 10**6:
            raise LoadError(f"{cfg_file}: {name} is {json.dumps(value):.40}, not a whole number from 1 to 1000000; "
                            "fix it or download or save the snapshot again")
    if sizes["n_embd"] % sizes["n_head"]:
        raise LoadError(f"{cfg_file}: n_embd {sizes['n_embd']} is not a multiple of n_head {sizes['n_head']}; fix it "
                        "or download or save the snapshot again")
    for name, allowed in FIXED_ARCHITECTURE.items():
        if name in hf and hf[name] not in allowed:
            raise LoadError(f"{cfg_file}: {name} is {json.dumps(hf[name]):.40}, but mini/model.py computes GPT-2 with "
                            f"{' or '.join(map(json.dumps, allowed))} only; it would load as another model")
    return GPTConfig(**sizes)


# what mini/model.py computes and GPT-2's config.json may say otherwise (its defaults first): a snapshot that
# asks for another would load without a missing weight and compute something else
FIXED_ARCHITECTURE = {"tie_word_embeddings": (True,), "layer_norm_epsilon": (1e-5,),
                      "activation_function": ("gelu_new", "gelu_pytorch_tanh"), "scale_attn_weights": (True,),
                      "scale_attn_by_inverse_layer_idx": (False,)}


def read_state_dict(path):
    st, pt = os.path.join(path, "model.safetensors"), os.path.join(path, "pytorch_model.bin")
    for file, load in ((st, load_file), (pt, lambda f: torch.load(f, map_location="cpu", weights_only=True))):
        if os.path.exists(file):
            try:
                state = load(file)
            except Exception as e:  # truncated, corrupt, or pickled objects: never run code from it
                raise LoadError(f"{file} cannot be read ({type(e).__name__}); it is damaged, download or save the "
                                "snapshot again") from None
            if not (isinstance(state, dict) and all(isinstance(k, str) and isinstance(w, torch.Tensor)
                                                    for k, w in state.items())):  # a .bin may pickle a list, a number
                kind = "a dict of other things" if isinstance(state, dict) else f"a {type(state).__name__}"
                raise LoadError(f"{file} holds {kind}, not weight tensors by name; it is not a GPT-2 checkpoint, "
                                "download or save the snapshot again")
            return state
    raise LoadError(f"{path} has no model.safetensors or pytorch_model.bin; the snapshot is incomplete, download it again")


def load_model(name_or_path, device="cpu"):
    """(GPT in eval mode with fp32 weights, Tokenizer) from a hub id or a snapshot directory."""
    try:
        return read_snapshot(name_or_path, device)
    except OSError as e:  # a folder, or a file that cannot be read, where a snapshot file should be
        raise LoadError(error_sentence(e)) from None


def read_snapshot(name_or_path, device):
    path = resolve_snapshot(name_or_path)
    for name in SNAPSHOT_FILES:
        if os.path.exists(os.path.join(path, name)):
            try:
                check_checksum(os.path.join(path, name))
            except ValueError as e:
                raise LoadError(f"{e}; download or save the snapshot again") from None
    cfg = read_config(path)
    has_vocab = any(os.path.exists(os.path.join(path, f)) for f in ("vocab.json", "tokenizer.json"))
    try:
        tokenizer = Tokenizer.from_dir(path) if has_vocab else Tokenizer.gpt2()
    except ValueError as e:  # damaged tokenizer files: the sentence names the file
        raise LoadError(f"{e}; download or save the snapshot again") from None
    if tokenizer.vocab_size > cfg.vocab_size:
        raise LoadError(f"{path}: tokenizer has {tokenizer.vocab_size} tokens but the model only {cfg.vocab_size}")
    # an output padded past the tokenizer (nanoGPT's 50304 for GPT-2's 50257) has rows that no token is: cut, so
    # that sampling never draws an id no text decodes to, and the loss's softmax runs over the same tokens
    n_tokens = tokenizer.vocab_size
    state = read_state_dict(path)
    held = [int(m[1]) for m in map(re.compile(r"(?:transformer\.)?h\.(\d+)\.").match, state) if m]
    # the weights are checked against a model on the meta device, one block deeper than they hold (a config.json
    # deeper than its weights then misses a whole block), before any memory is taken: a config.json that asks for
    # sizes its weights lack (n_layer 1000000, n_embd 1000000) hung or failed allocating
    with torch.device("meta"):
        own = GPT(replace(cfg, vocab_size=n_tokens, n_layer=min(cfg.n_layer, max(held, default=-1) + 2))).state_dict()
    loaded = {}
    for key, w in state.items():
        key = key if key.startswith(("transformer.", "lm_head.")) else "transformer." + key
        if key.endswith((".attn.bias", ".attn.masked_bias")) or key == "lm_head.weight":  # HF's causal-mask
            continue  # buffers, and the output layer, which is the embedding (tied), read from wte as transformers does
        if key not in own:
            layer = re.match(r"transformer\.h\.(\d+)\.", key)
            if layer and key.replace(layer[0], "transformer.h.0.") in own:  # a block past config.json's n_layer
                raise LoadError(f"{path}: the weights hold a layer {layer[1]} (from 0), past config.json's n_layer "
                                f"{cfg.n_layer}; config.json and the weights do not match")
            raise LoadError(f"{path}: unexpected weight {key!r}; this is not a GPT-2 checkpoint")
        if key.endswith(CONV1D) and w.dim() == 2:  # any other is refused by its shape
            w = w.t()
        if key == "transformer.wte.weight" and w.shape[:1] == (cfg.vocab_size,):
            w = w[:n_tokens]
        if w.shape != own[key].shape:
            raise LoadError(f"{path}: weight {key} has shape {tuple(w.shape)} but config.json implies "
                            f"{tuple(own[key].shape)}; config.json and the weights do not match")
        if not w.is_floating_point():  # int8 of a quantized checkpoint, or bool: loaded as numbers, a garbage model
            raise LoadError(f"{path}: weight {key} is stored as {str(w.dtype).removeprefix('torch.')}, not as floating "
                            "point numbers (a quantized checkpoint?); load_model reads floating point weights only "
                            "(float32, float16, bfloat16)")
        if not torch.isfinite(w).all():  # a diverged run's: every answer would be garbage
            raise LoadError(f"{path}: weight {key} holds NaN or infinite values (a run that diverged); take an "
                            "earlier snapshot or checkpoint")
        loaded[key] = w
    missing = set(own) - set(loaded) - {"lm_head.weight"}
    layers = {int(k.split(".")[2]) for k in loaded if k.startswith("transformer.h.")}
    if missing and layers and all(k.startswith("transformer.h.") and int(k.split(".")[2]) > max(layers)
                                  for k in missing):  # whole blocks past the last one the weights hold
        raise LoadError(f"{path}: the weights hold {max(layers) + 1} layers but config.json says n_layer "
                        f"{cfg.n_layer}; config.json and the weights do not match")
    if missing:
        raise LoadError(f"{path}: weights missing for {sorted(missing)[:3]}...; the checkpoint is incomplete")
    model = GPT(replace(cfg, vocab_size=n_tokens))
    own = model.state_dict()
    for key, w in loaded.items():
        own[key].copy_(w.float())
    return model.to(device).eval(), tokenizer


def fsync_path(path):
    """Flush a file's (or a directory's) data to the disk: without it a power loss shortly after a rename may
    leave the new name pointing at an empty file (ext4's delayed allocation), the old one already gone."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_snapshot_dir(path):
    """A folder save_model may replace: a snapshot's config.json beside its weights (a run directory has a
    config.json of its settings, and no weights)."""
    return os.path.isfile(os.path.join(path, "config.json")) and any(
        os.path.isfile(os.path.join(path, w)) for w in ("model.safetensors", "pytorch_model.bin"))


def save_model(model, tokenizer, out_dir, dtype=torch.float32):
    """Write a Hugging Face GPT-2 snapshot with weights in dtype (bf16 halves the file; load_model reads
    either as fp32); a temporary directory is renamed into place when complete. A snapshot already in
    out_dir is renamed aside first and removed last, so that a kill at any moment leaves one complete
    snapshot (finish_interrupted_save, run by the next save or load, puts it back where it belongs)."""
    cfg = model.config
    hf_config = dict(model_type="gpt2", architectures=["GPT2LMHeadModel"], n_layer=cfg.n_layer, n_head=cfg.n_head,
                     n_embd=cfg.n_embd, n_positions=cfg.n_positions, n_ctx=cfg.n_positions, vocab_size=cfg.vocab_size,
                     activation_function="gelu_new", layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0, bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                     tie_word_embeddings=True, torch_dtype=str(dtype).removeprefix("torch."))
    state = {k: (v.t() if k.endswith(CONV1D) else v).detach().to("cpu", dtype).contiguous()
             for k, v in model.state_dict().items() if k != "lm_head.weight"}  # tied: stored once, as wte
    out_dir = os.path.abspath(out_dir)
    if os.path.exists(out_dir) and not os.path.isdir(out_dir):
        raise LoadError(f"cannot save a model to {out_dir}: it is a file; pick a directory's path")
    if os.path.isdir(out_dir) and os.listdir(out_dir) and not is_snapshot_dir(out_dir):  # the save replaces it whole
        raise LoadError(f"cannot save a model to {out_dir}: it is a folder that holds no model snapshot, and the save "
                        "would replace all it holds; pick a new path")
    os.makedirs(os.path.dirname(out_dir), exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=os.path.dirname(out_dir))
    try:
        save_file(state, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
        with open(os.path.join(tmp, "config.json"), "w") as f:
            json.dump(hf_config, f, indent=2)
        tokenizer.save(tmp)
        # each file on the disk before the rename makes it the snapshot, and its .sha256 (which load_model
        # verifies) beside it: write_checksum syncs that one itself
        for name in os.listdir(tmp):
            fsync_path(os.path.join(tmp, name))
            write_checksum(os.path.join(tmp, name))
        fsync_path(tmp)
    except BaseException:  # a full disk: no half-written snapshot left behind
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finish_interrupted_save(out_dir)
    aside = replaced_aside(out_dir)
    if os.path.exists(out_dir):
        os.rename(out_dir, aside)
    os.rename(tmp, out_dir)
    fsync_path(os.path.dirname(out_dir))  # the renames
    shutil.rmtree(aside, ignore_errors=True)
    return out_dir


@torch.no_grad()
def average_snapshots(paths, out_dir, dtype=torch.bfloat16):
    """Save the mean of the weights of snapshots fine-tuned from one start (a model soup: Wortsman et al. 2022)
    to out_dir, cast to dtype; the tokenizer is the first snapshot's. Averaging runs that moved little from
    their start keeps what they share and damps what each drew by chance (how `rookworld-10m` was made)."""
    if not paths:
        raise LoadError("no snapshots to average; give the paths of two or more fine-tuned snapshots")
    if os.path.realpath(out_dir) in {os.path.realpath(p) for p in paths}:  # save_model would replace that input
        raise LoadError(f"{out_dir} is one of the snapshots to average; write the mean to another folder")
    first, tokenizer = load_model(paths[0])
    total = {k: w.clone() for k, w in first.state_dict().items()}
    for path in paths[1:]:
        model = load_model(path)[0]
        if model.config != first.config:  # same shapes are not enough: n_head splits the same weights otherwise
            raise LoadError(f"{path} is another architecture than {paths[0]} ({model.config} against "
                            f"{first.config}); average only snapshots of one architecture, fine-tuned from one start")
        for k, w in model.state_dict().items():
            total[k] += w
    first.load_state_dict({k: w / len(paths) for k, w in total.items()})
    return save_model(first, tokenizer, out_dir, dtype=dtype)
