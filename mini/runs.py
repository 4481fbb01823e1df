"""
A run directory, and everything that makes a run survive interruption and misuse: one process per run (a
lock file), no run started over another by accident, checkpoints written atomically and loaded without
running code, and resume: the saved settings taken back (saved_settings, resume_config), the trainer's state
saved and loaded (Resumable), logs cut back to the resumed step, and the rollback of a non-finite step.

    logs/<run_name>/config.json    the settings of the run
                    train.log      the log lines
                    metrics.jsonl  one row per step (samples.jsonl: a few completions per step)
                    run.lock       PID and host of the process that owns the run
                    checkpoints/   step_*.pt (the last keep_last), recovery.pt, stable.pt, debug_step_*.pt,
                                   abandoned/stable_step_*.pt (a best model of steps a resume went back from)
                    final/         a Hugging Face snapshot, at the end
"""
import contextlib
import dataclasses
import errno
import fcntl
import glob
import json
import math
import os
import pickle
import re
import shlex
import shutil
import signal
import socket
import sys
import time
import zipfile

import torch

from mini import distributed
from mini.config import FIELDS, START_FLAGS, Config
from mini.flags import echo, not_a_device, problems, wrong_types
from mini.loader import check_checksum, fsync_path, save_model, write_checksum
from mini.runtime import rng_state, set_rng_state

STEP_LOGS = ("metrics.jsonl", "samples.jsonl")  # JSONL logs with a "step" per row, cut back on resume
# flags a resumed run may change (applied and logged); every other flag defines the run and must match its config.json
RESUMABLE = frozenset({
    "steps", "time_limit_min", "eval_every", "eval_n", "eval_chess", "log_samples", "save_every", "keep_last",
    "kl_threshold", "device", "score_workers", "micro_batch_size", "grad_checkpointing", "compile", "compile_decode",
    "shared_prefix_decode", "fused_logprobs", "entropy_every",
    "stockfish_path", "engine_cache", "report_to", "annotate_workers", "memory_fraction", "log_dir", "run_name"})
MAX_RECOVERIES = 3  # rollbacks of non-finite steps in a row before the run stops


class RunError(Exception):
    """A run cannot start or go on; the message says why and what to do."""


class StopRun(Exception):
    """Ends the run cleanly with a message (the state is saved first); `exit_code` is what the script returns."""

    def __init__(self, message, exit_code=1):
        super().__init__(message)
        self.exit_code = exit_code


def signal_exit_code(name):
    """The exit code of a run stopped by the signal `name` (None: one another rank took) after saving: 128 + its
    number, as a shell reports a process the signal ended (130 for SIGINT, 143 for SIGTERM). Not 0, so that a
    script chaining runs does not go on from an unfinished one; not 1, which is an error."""
    return 128 + (signal.Signals[name] if name else signal.SIGTERM)


def disk_full(path, need_bytes):
    free = shutil.disk_usage(os.path.dirname(os.path.abspath(path))).free
    return (f"disk full writing {path}: it needs about {need_bytes / 2**20:.1f} MiB and {free / 2**20:.1f} MiB are "
            "free there; free some space, then continue with --auto_resume (the last good checkpoint is kept)")


def is_disk_full(e):
    """Whether a writer's exception means the disk is full: OSError ENOSPC or EDQUOT (open, write, the lock),
    torch.save's RuntimeError ("... unexpected pos ..."), safetensors' SafetensorError ("... os error 28")."""
    if isinstance(e, OSError):
        return e.errno in (errno.ENOSPC, errno.EDQUOT)
    return any(s in str(e) for s in ("unexpected pos", "os error 28", "No space left on device"))


@contextlib.contextmanager
def disk_guard(path, need_bytes=0):
    """A full disk met by the writes inside as one RunError sentence (disk_full); other errors pass."""
    try:
        yield
    except Exception as e:
        if is_disk_full(e):
            raise RunError(disk_full(path, need_bytes)) from None
        raise


def write_atomic(path, write, need_bytes=0):
    """write(tmp_path), then rename over `path`: a crash, a power loss or a full disk never leaves a half-written
    file (the .tmp is synced to the disk before the rename, and the directory after it; the .tmp is removed on
    failure; leftovers of a kill are removed when a run starts). A full disk is a RunError."""
    tmp = path + ".tmp"
    try:
        with disk_guard(path, need_bytes):
            write(tmp)
            fsync_path(tmp)
            os.replace(tmp, path)
            fsync_path(os.path.dirname(os.path.abspath(path)))
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_text(path, text):
    def write(tmp):
        with open(tmp, "w") as f:
            f.write(text)
    write_atomic(path, write, len(text))


def nbytes(x):
    """Bytes of the tensors in a nested state."""
    if isinstance(x, torch.Tensor):
        return x.nbytes
    if isinstance(x, dict):
        return sum(map(nbytes, x.values()))
    return sum(map(nbytes, x)) if isinstance(x, (list, tuple)) else 0


def save_checkpoint(path, state):
    """Plain tensors, numbers, strings, lists and dicts (loadable with weights_only), written atomically, with
    its SHA-256 beside it (path.sha256), which load_checkpoint verifies. The old checksum goes first: a kill
    between the two renames leaves a file without one (read unverified), never a good file that mismatches."""
    remove_checkpoint(path, keep=True)
    write_atomic(path, lambda tmp: torch.save(state, tmp), nbytes(state))
    with disk_guard(path + ".sha256", 65):
        write_checksum(path)


def remove_checkpoint(path, keep=False):
    """Remove a checkpoint and its checksum (keep: the checksum only)."""
    for f in ([] if keep else [path]) + [path + ".sha256"]:
        with contextlib.suppress(FileNotFoundError):
            os.remove(f)


def load_checkpoint(path):
    """The checkpoint's state if it is complete and its weights finite; else a ValueError saying why.
    weights_only: a checkpoint from elsewhere cannot run code."""
    if os.path.isfile(path):
        check_checksum(path)
    elif os.path.isdir(path):
        raise ValueError(f"{path} is a folder; give a checkpoint file, such as <log_dir>/<run_name>/checkpoints/"
                         "step_000100.pt (or continue a run with --auto_resume)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ValueError(f"{path} does not exist; check the path (a run's checkpoints are in "
                         "<log_dir>/<run_name>/checkpoints)") from None
    except pickle.UnpicklingError as e:
        if zipfile.is_zipfile(path) and "Weights only load failed" in str(e):  # complete, but pickles objects
            raise ValueError(f"{path} was written by an older mini/train.py in a format that may run code when "
                             "loaded, so it is refused; start a new run, or resume it with the version that wrote it") from None
        raise ValueError(f"{path} cannot be read ({type(e).__name__}); it is damaged") from None
    except Exception as e:
        raise ValueError(f"{path} cannot be read ({type(e).__name__}); it is damaged") from None
    if not isinstance(state, dict):  # a torch file of a tensor, a list, a number
        raise ValueError(f"{path} is not a checkpoint of mini/train.py (it holds a {type(state).__name__}, not a dict)")
    missing = {"model", "optimizer", "step", "config", "run_name", "rng"} - set(state)
    if missing:
        raise ValueError(f"{path} lacks {sorted(missing)}; it is not a checkpoint of mini/train.py")
    if not (isinstance(state["model"], dict) and all(isinstance(t, torch.Tensor) for t in state["model"].values())):
        raise ValueError(f"{path} is not a checkpoint of mini/train.py (its model is not weight tensors by name)")
    if not all(torch.isfinite(t).all() for t in state["model"].values()):
        raise ValueError(f"{path} holds non-finite weights")
    return state


def checkpoint_settings(path):
    """The settings (config dict) saved in a checkpoint, read without loading its tensors (mmap): a resumed run
    takes its settings from them before the trainer loads the whole checkpoint. A ValueError saying why, as
    load_checkpoint's, when the file is not a readable checkpoint."""
    try:
        return peek_checkpoint(path)["config"]
    except Exception:  # missing, damaged, another format: load_checkpoint says which
        return load_checkpoint(path)["config"]


def peek_checkpoint(path):
    """A checkpoint's dict read without loading its tensors (mmap): cheap for its settings or its step."""
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


def saved_step(path):
    """The step saved in a checkpoint; None when it cannot be read (latest_valid_checkpoint skips such a file
    with a message)."""
    try:
        return int(peek_checkpoint(path)["step"])
    except Exception:
        return None


def is_number(value):
    """A logged value that counts: a null, a string or a true, as in a hand-edited file, is no value (left out of
    means, tables, sums and plots), and so is a whole number past a float's range (10**400: float() overflows)."""
    if isinstance(value, int) and abs(value) > sys.float_info.max:
        return False
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_rows(path):
    """The JSON rows of a JSONL log; a last line cut off by a kill mid-write is skipped, any other bad line is
    a ValueError naming it (file:line)."""
    with open(not_a_device(path), encoding="utf-8-sig", errors="replace") as f:  # -sig: a BOM an editor put first
        lines = [(i, line) for i, line in enumerate(f, 1) if line.strip()]
    rows = []
    for i, line in lines:
        try:
            rows.append(json.loads(line))
        except (ValueError, RecursionError):  # RecursionError: arrays nested past Python's stack
            if i < lines[-1][0]:
                raise ValueError(f"{path}:{i}: not a JSON row; the log is damaged") from None
            print(f"{path}:{i}: skipping the last line, cut off", file=sys.stderr)
    return rows


def given_flags(argv):
    """Names of the Config fields set on the command line (--name, --no_name, --name=value)."""
    names = {a[2:].split("=")[0] for a in argv if a.startswith("--")}
    return {n[3:] if n.startswith("no_") and n[3:] in FIELDS else n for n in names} & set(FIELDS)


def saved_settings(cfg):
    """(the settings a resume continues with, where they come from), or (None, None) for a new run: the
    checkpoint's for --resume_from_checkpoint, the run's config.json for --auto_resume and --recovery_mode."""
    if cfg.resume_from_checkpoint:
        try:
            saved = checkpoint_settings(cfg.resume_from_checkpoint)
        except ValueError as e:
            raise RunError(f"--resume_from_checkpoint: {e}") from None
        return saved, "--resume_from_checkpoint continues the run with the checkpoint's settings"
    if cfg.auto_resume or cfg.recovery_mode:
        mode = "--auto_resume" if cfg.auto_resume else "--recovery_mode"
        run = RunDir(cfg.log_dir, cfg.run_name)
        saved = run.saved_config()
        if saved is None:  # config.json deleted: the checkpoint the run continues from holds the settings too
            path, recovery = None, run.checkpoint("recovery.pt")
            if cfg.auto_resume:  # every checkpoint of the run holds its settings: the latest readable one's,
                for _, candidate in run.resumable_checkpoints():  # read cheaply; Resumable.resume loads it
                    try:
                        path, saved = candidate, peek_checkpoint(candidate)["config"]
                        break
                    except Exception:
                        continue  # damaged: latest_valid_checkpoint says so
            elif os.path.exists(recovery):
                try:
                    path, saved = recovery, checkpoint_settings(recovery)
                except ValueError:
                    pass  # damaged: Resumable.resume says so
            if path:
                return saved, f"{mode} continues the run with the settings of {path} (its config.json is missing)"
        return saved, f"{mode} continues the run with its own config.json"
    return None, None


def resume_config(cfg, given, saved, source):
    """The config of a resumed run: its saved one (`saved`, a dict from config.json or a checkpoint), with the
    flags given on the command line (`given`, names) applied where they may change (RESUMABLE) and the start
    flags (START_FLAGS) always cfg's. Returns (config, what changed); a given flag that would change the run
    itself is a RunError listing every such flag, opened by `source`, which says what the flags are held to. So
    is a saved value the config cannot hold or the flags would refuse (a config.json edited by hand)."""
    if not isinstance(saved, dict):
        raise RunError(f"{source}, but it holds a {type(saved).__name__}, not the run's settings; restore it, or "
                       "start afresh with --overwrite")
    bad = wrong_types({k: v for k, v in saved.items() if k not in START_FLAGS})
    if bad:
        raise RunError(f"{source}, but it holds a setting no flag could give: {bad[0]}")
    if cfg.auto_resume or cfg.recovery_mode:  # the run goes on where it was found, not where its config.json says it
        given = set(given) | {"log_dir", "run_name"}  # was (a run directory moved or copied: the other one's)
    base = Config(**{k: v for k, v in saved.items() if k in FIELDS and k not in START_FLAGS},  # fields added since
                  **{k: getattr(cfg, k) for k in START_FLAGS})                                 # keep their defaults
    changed, refused = {}, []
    for name in sorted(given):
        new, old = getattr(cfg, name), getattr(base, name)
        if new == old:
            continue
        if name in RESUMABLE:
            changed[name] = (old, new)
        else:
            refused.append(f"--{name} {new!r} (the run has {old!r})")
    if refused:
        raise RunError(f"{source}, and these flags would change it: {', '.join(refused)}; drop them or give the "
                       "run's values, or start a new run with another --run_name")
    resumed = dataclasses.replace(base, **{k: new for k, (_, new) in changed.items()})
    bad = problems({k: v for k, v in dataclasses.asdict(resumed).items() if k not in START_FLAGS})  # those: cfg's
    if bad:  # each sentence says what to do
        raise RunError(f"{source}, but {bad[0]}")
    return resumed, changed


def checkpoint_step(path):
    """The step in the name of a regular checkpoint, step_<step>.pt (past 999999 it has more digits)."""
    return int(os.path.basename(path)[len("step_"):-len(".pt")])


def regular_checkpoints(paths):
    """The regular checkpoints among paths: step_<digits>.pt, not a copy a user made beside them
    (step_000100 copy.pt), whose name holds no step."""
    return [p for p in paths if re.fullmatch(r"step_\d+\.pt", os.path.basename(p))]


def aside_name(path, stamp):
    """Where --overwrite moves a run: path.old-<stamp>, the run's name shortened to fit the file system's
    255-byte names."""
    head, name = os.path.split(path)
    suffix = f".old-{stamp}"
    return os.path.join(head, name.encode()[:255 - len(suffix)].decode(errors="ignore") + suffix)


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return True


class RunDir:
    """logs/<run_name>: paths, logs, checkpoints, and the claim on it (claim() before writing anything)."""

    def __init__(self, log_dir, run_name):
        self.name, self.path = run_name, os.path.join(log_dir, run_name)
        self.ckpt_dir = os.path.join(self.path, "checkpoints")
        self.lock = os.path.join(self.path, "run.lock")
        self.created = False

    def file(self, name):
        """The path of `name` here; a name with a * is a pattern for glob.glob, the run's own path taken literally
        (a --run_name or --log_dir such as exp[1])."""
        return os.path.join(glob.escape(self.path) if "*" in name else self.path, name)

    def checkpoint(self, name):
        return os.path.join(glob.escape(self.ckpt_dir) if "*" in name else self.ckpt_dir, name)

    # --- owning the directory
    def contains(self, path):
        """Whether path lies in this run directory (links resolved)."""
        root = os.path.realpath(self.path)
        return os.path.commonpath([root, os.path.realpath(path)]) == root

    def holds_run(self):
        """Whether an earlier run left anything here (logs, checkpoints, a snapshot)."""
        return any(f != "run.lock" for _, _, files in os.walk(self.path) for f in files)

    def claim(self, resume, overwrite=False, resumable=True):
        """Make the directory this process's: refuse one that holds a run unless resuming (or move it aside
        with overwrite), take the lock, remove the .tmp leftovers of a killed write. resumable: whether the
        script can continue a run (train.py's --auto_resume; sft.py cannot)."""
        if self.holds_run() and not resume:
            if not overwrite:
                raise RunError(f"{self.path} already holds a run; " + ("continue it with --auto_resume, or " if resumable
                               else "") + "start afresh with --overwrite (the old run is moved aside, not deleted), "
                               "or pick another --run_name")
            with self.directory_locked():  # no other process takes the run between the check and the move
                self.take_lock_unserialised()  # not while another process trains there
                stamp = time.strftime("%Y%m%d-%H%M%S")
                aside, n = aside_name(self.path, stamp), 1
                while os.path.lexists(aside):  # a run moved aside within the same second
                    aside, n = aside_name(self.path, f"{stamp}-{n}"), n + 1
                os.remove(self.lock)
                os.rename(self.path, aside)
            print(f"moved the earlier run to {aside}", file=sys.stderr)
        self.created = not os.path.isdir(self.path)
        self.take_lock()
        for tmp in glob.glob(self.file("*.tmp")) + glob.glob(self.checkpoint("*.tmp")):
            os.remove(tmp)
        for tmp in glob.glob(self.file(".tmp-*")):  # loader.save_model's unfinished snapshots
            shutil.rmtree(tmp, ignore_errors=True)

    @contextlib.contextmanager
    def directory_locked(self):
        """The run directory, made if needed, flock-ed for the body: one process at a time checks, takes over
        or moves the run (a rename of the directory between open and flock is noticed, and it starts over)."""
        while True:
            try:
                os.makedirs(self.path, exist_ok=True)
                fd = os.open(self.path, os.O_RDONLY | os.O_DIRECTORY)
            except OSError as e:
                raise RunError(self.cannot_write(e)) from None
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                if os.path.exists(self.path) and os.path.samestat(os.stat(self.path), os.fstat(fd)):
                    yield
                    return
            finally:
                os.close(fd)

    def cannot_write(self, e):
        """What an OSError of making the run directory or its lock means, in one sentence."""
        if e.errno == errno.ENAMETOOLONG:
            return (f"--run_name {self.name[:20]}... ({len(self.name)} characters) makes a path longer than the file "
                    "system allows; pick a shorter --run_name")
        return (f"cannot write the run directory {self.path} ({e.strerror}); point --log_dir at a directory you can "
                "write to")

    def take_lock(self):
        """run.lock with "pid host", so that of two processes starting at once only one gets it; one held by a
        live process is refused, a stale one (its process is gone) is replaced. Checking and replacing happen
        under a flock of the run directory, so two processes taking over one stale lock never both get it.
        The same process may take it again."""
        with self.directory_locked():
            self.take_lock_unserialised()

    def take_lock_unserialised(self):
        host = socket.gethostname()
        if self.create_lock(host):
            return
        pid, lock_host = self.lock_owner()
        if (pid, lock_host) == (os.getpid(), host):
            return
        if pid is None:
            if self.create_lock(host):  # its owner released it a moment ago
                return
            raise RunError(f"{self.lock} names no process: the file is damaged; if no run is using {self.path}, "
                           "delete the lock file, else pick another --run_name")
        if lock_host != host:
            raise RunError(f"{self.path} is in use by PID {pid} on host {lock_host} ({self.lock}); if that run "
                           "is over, delete the lock file, else pick another --run_name")
        if pid_alive(pid):
            raise RunError(f"{self.path} is in use by a running process, PID {pid} ({self.lock}); wait for it "
                           "to end, or pick another --run_name")
        print(f"taking over {self.lock} of PID {pid}, which is gone", file=sys.stderr)
        os.remove(self.lock)
        if not self.create_lock(host):  # only where flock does not reach: another host on a network file system
            raise RunError(f"{self.path} was taken by another process just now ({self.lock}); wait for it to end, "
                           "or pick another --run_name")

    def create_lock(self, host):
        """Create run.lock holding this process's "pid host" if there is none (O_EXCL: atomic); whether it did."""
        try:
            fd = os.open(self.lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return False
        except OSError as e:  # a read-only directory or file system
            raise RunError(disk_full(self.lock, 64) if is_disk_full(e) else self.cannot_write(e)) from None
        try:
            with disk_guard(self.lock, 64), os.fdopen(fd, "w") as f:
                f.write(f"{os.getpid()} {host}\n")
        except BaseException:  # a full disk: an empty lock would refuse every later start
            os.remove(self.lock)
            raise
        return True

    def lock_owner(self):
        """(pid, host) written in run.lock; (None, None) if it is gone or names no process (it is being written,
        or damaged)."""
        try:
            with open(self.lock) as f:
                pid, host = f.read().split()
            if not 0 < int(pid) < 2**31:  # no process has it (0 and -1 would signal a group, a larger one overflow)
                raise ValueError(pid)
            return int(pid), host
        except (OSError, ValueError):
            return None, None

    def release(self, failed=False, trained=True):
        """Drop the lock if this process holds it (another rank's or run's lock stays); after a failed start,
        remove the directory if this start made it and left nothing, or nothing trained (a run that failed in
        its first step, a prompt too long for the model say, would block its --run_name with a copy of its
        start model)."""
        if self.lock_owner() == (os.getpid(), socket.gethostname()):
            os.remove(self.lock)
        if failed and self.created and os.path.isdir(self.path) and (
                not trained or not any(files for _, _, files in os.walk(self.path))):
            shutil.rmtree(self.path)

    def saved_config(self):
        """config.json of the run as a dict, None if there is none."""
        path = self.file("config.json")
        if not os.path.exists(path):
            return None
        try:
            with open(path, encoding="utf-8-sig") as f:  # -sig: a BOM an editor put first
                return json.load(f)
        except (ValueError, RecursionError):
            raise RunError(f"{path} is damaged (not JSON); restore it, or start afresh with --overwrite") from None

    # --- logs
    def log(self, line, name="train.log"):
        """line on stdout and at the end of the log `name`, opened for each line: no way out of a run leaves it open."""
        echo(line)
        with disk_guard(self.file(name), len(line) + 1), open(self.file(name), "a") as f:
            f.write(line + "\n")

    def append_jsonl(self, name, rows):
        text = "".join(json.dumps(row) + "\n" for row in rows)
        with disk_guard(self.file(name), len(text)), open(self.file(name), "a") as f:
            f.write(text)

    def cut_back(self, step):
        """The run goes on from `step` (a resume, a rollback): drop what it did after that step, which it will
        redo. The rows of later steps (and a cut-off last line) leave the JSONL logs, and the regular
        checkpoints of later steps are removed: --auto_resume would continue from them, and pruning would
        keep them over the ones written next. A recovery.pt of a later step goes too, and a stable.pt of a later
        step (the abandoned branch's best held-out model, which --auto_resume would take as the newest state)
        moves to abandoned/stable_step_<step>.pt, where --auto_resume does not look. A damaged log stops it before
        anything is removed or moved."""
        logs = {}
        for name in STEP_LOGS:
            path = self.file(name)
            if os.path.exists(path):
                try:
                    rows = read_rows(path)
                    if not all(isinstance(r, dict) and type(r.get("step")) is int for r in rows):
                        raise ValueError(f"{path}: a row without its step; the log is damaged")
                except ValueError as e:
                    raise RunError(f"{e}: restore it, or move the run aside with --overwrite") from None
                logs[path] = rows
        for path in regular_checkpoints(glob.glob(self.checkpoint("step_*.pt"))):
            if checkpoint_step(path) > step:
                remove_checkpoint(path)
        recovery, stable = self.checkpoint("recovery.pt"), self.checkpoint("stable.pt")
        if (saved_step(recovery) or 0) > step:
            remove_checkpoint(recovery)
        stable_step = saved_step(stable) or 0
        if stable_step > step:
            aside = self.checkpoint(os.path.join("abandoned", f"stable_step_{stable_step:06d}.pt"))
            os.makedirs(os.path.dirname(aside), exist_ok=True)
            for suffix in ("", ".sha256"):
                with contextlib.suppress(FileNotFoundError):
                    os.replace(stable + suffix, aside + suffix)
            print(f"{stable} holds a step after {step}, of the run before it went back: moved to {aside}",
                  file=sys.stderr)
        for path, rows in logs.items():
            write_text(path, "".join(json.dumps(r) + "\n" for r in rows if r["step"] <= step))

    def save_config(self, cfg):
        write_text(self.file("config.json"), json.dumps(dataclasses.asdict(cfg), indent=2))

    def save_final(self, model, tok):
        """The model's snapshot in final/ (loadable with transformers); its path."""
        with disk_guard(self.file("final"), 4 * model.num_params()):  # fp32 weights
            return save_model(model, tok, self.file("final"))

    # --- checkpoints
    def save(self, name, state):
        os.makedirs(self.ckpt_dir, exist_ok=True)
        save_checkpoint(self.checkpoint(name), state)

    def save_regular(self, state, keep_last):
        """step_<step>.pt, keeping the last keep_last of them by step (0: all), and always the one just written."""
        name = f"step_{state['step']:06d}.pt"
        self.save(name, state)
        regular = sorted(regular_checkpoints(glob.glob(self.checkpoint("step_*.pt"))), key=checkpoint_step)
        regular.remove(self.checkpoint(name))
        for old in (regular + [self.checkpoint(name)])[:-keep_last] if keep_last > 0 else []:
            remove_checkpoint(old)

    def resumable_checkpoints(self):
        """[(step, path)] of the regular, stable and recovery checkpoints, the highest step first, each step read
        cheaply (mmap); one whose step cannot be read comes first, its step None: only a full load tells."""
        paths = [p for p in glob.glob(self.checkpoint("*.pt")) if not os.path.basename(p).startswith("debug")]
        steps = [(saved_step(p), p) for p in paths]
        return sorted(steps, key=lambda sp: -math.inf if sp[0] is None else -sp[0])

    def latest_valid_checkpoint(self):
        """(path, state) of the valid checkpoint with the highest step among regular, stable and
        recovery ones; None if there is none. Loaded fully (checksum, every tensor) from the highest step
        down until one is valid, not all of them. Damaged ones are skipped with a message; if every one is
        damaged, a RunError: the run never restarts from step 0 on top of its old logs."""
        best, damaged = None, []
        for step, path in self.resumable_checkpoints():
            if best is not None and step is not None and step <= best[1]["step"]:
                break
            try:
                state = load_checkpoint(path)
            except ValueError as e:
                print(f"skipping {e}", file=sys.stderr)
                damaged.append(os.path.basename(path))
                continue
            if best is None or state["step"] > best[1]["step"]:
                best = (path, state)
        if best is None and damaged:
            raise RunError(f"every checkpoint of {self.path} is damaged ({', '.join(sorted(damaged))}); nothing to "
                           "resume from. Start afresh with --overwrite (the old run is moved aside)")
        return best


SIGTERM_ECHO_S = 2.0  # a second SIGTERM sooner than this after the first is the same request delivered twice
caught_signals = []  # each stop signal a run took over in this process, in order (mini/conftest.py reads it)


def stop_signals():
    """The signals that stop a run after its step, with a checkpoint: Ctrl-C, SIGTERM (`kill`, `timeout`, a
    scheduler) and SIGHUP (the terminal hung up: ssh dropped, the window closed), unless SIGHUP is ignored, as
    under `nohup`, whose runs are meant to outlive their terminal."""
    hangup = [signal.SIGHUP] if signal.getsignal(signal.SIGHUP) != signal.SIG_IGN else []
    return [signal.SIGINT, signal.SIGTERM, *hangup]


class StopSignals:
    """Within `with`: the first of stop_signals() is noted in `name` (the run stops after its step, with a
    checkpoint) and announced; a second one quits at once (KeyboardInterrupt), which never damages a checkpoint
    (they are written to .tmp and renamed); a SIGTERM repeated within SIGTERM_ECHO_S is the same request. The handlers in
    place before come back on exit, also in a test process."""

    def __init__(self, announce):
        self.name, self.announce, self.before = None, announce, {}

    def __enter__(self):
        self.before = {sig: signal.signal(sig, self.handle) for sig in stop_signals()}
        return self

    def __exit__(self, *exc):
        for sig, handler in self.before.items():
            signal.signal(sig, handler)

    def handle(self, signum, frame):
        caught_signals.append(signum)
        if self.name:
            if signum == signal.SIGTERM and time.monotonic() - self.first_at < SIGTERM_ECHO_S:
                return  # `timeout` sends its SIGTERM to the process and again to its group: one request, not two
            raise KeyboardInterrupt
        self.name, self.first_at = signal.Signals(signum).name, time.monotonic()
        self.announce(self.name)


class Resumable:
    """The trainer's side of its run directory (a mixin of train.Trainer, whose state it reads): rank 0's writes
    that the other ranks wait for, checkpoints of the whole state, resume, the rollback of a bad step, and the
    stop on a signal."""

    def on_main(self, work):
        """work() on rank 0 (the whole of it on a single process); the other ranks wait, and stop if it fails."""
        failed = None
        if self.main:
            try:
                work()
            except BaseException as e:
                failed = e
        if self.world > 1:
            why = distributed.from_main(None if failed is None else f"{type(failed).__name__}: {failed}")
            if why is not None and not self.main:
                raise StopRun(f"stopped with rank 0 ({why})")
        if failed is not None:
            raise failed

    def rank_state(self):
        """What differs between torchrun ranks: the RNGs, the prompt source, the replay buffer, the games."""
        return {"sampler": self.source.state_dict(), "sft_sampler": self.sft_source and self.sft_source.state_dict(),
                "buffer": (self.buffer.items, self.buffer.rng.getstate()),
                "selfplay": self.selfplay.state_dict() if self.selfplay is not None else None, "rng": rng_state()}

    def load_rank_state(self, s):
        self.source.load_state_dict(s.get("sampler") or {"rng": s["sampler_rng"]})  # sampler_rng: before generate streamed
        if self.sft_source is not None and s.get("sft_sampler"):  # --sft_data_file, which a resume cannot change
            self.sft_source.load_state_dict(s["sft_sampler"])
        self.buffer.items, buffer_rng = s["buffer"]
        self.buffer.rng.setstate(buffer_rng)
        if self.selfplay is not None:
            self.selfplay.load_state_dict(s["selfplay"])
        set_rng_state(s["rng"])

    def state(self):
        """The checkpoint: the shared state and rank 0's own at the top level (a single process's checkpoint),
        and under torchrun every rank's own in "ranks". Every rank must call it (it gathers)."""
        ranks = distributed.gather(self.rank_state())
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "scheduler": {"lr_scale": self.lr_scale},
                "value_head": self.value_head.state_dict() if self.value_head is not None else None,
                "kl_ctl": self.kl_ctl.state_dict(), "baseline": self.baseline.state_dict(),
                **ranks[0], **({"ranks": ranks} if self.world > 1 else {}),
                "step": self.step, "best_eval": self.best_eval, "best_reward": self.best_reward,
                "run_name": self.run_dir.name, "config": dataclasses.asdict(self.cfg)}

    def load_state(self, s):
        world = len(s.get("ranks", [s]))
        if world != self.world:
            raise StopRun(f"error: the checkpoint was written by {world} process(es) and this run has {self.world}; "
                          f"resume it with the same number (torchrun --nproc_per_node {world}, or plain python for 1)")
        self.model.load_state_dict(s["model"])
        self.optimizer.load_state_dict(s["optimizer"])
        self.lr_scale = s["scheduler"]["lr_scale"]
        if self.value_head is not None:
            self.value_head.load_state_dict(s["value_head"])
        self.kl_ctl.load_state_dict(s["kl_ctl"])
        self.baseline.load_state_dict(s["baseline"])
        self.load_rank_state(s["ranks"][self.rank] if self.world > 1 else s)
        self.step, self.best_eval, self.best_reward = s["step"], s["best_eval"], s["best_reward"]

    def save(self, name):
        state = self.state()
        self.on_main(lambda: self.run_dir.save(name, state))

    def save_regular(self):
        state = self.state()
        self.on_main(lambda: self.run_dir.save_regular(state, self.cfg.keep_last))

    def resume(self):
        """Pick up a checkpoint if asked to (one written under other settings is refused); what the run did after
        its step is cut back."""
        cfg, path = self.cfg, None
        if cfg.resume_from_checkpoint:
            try:
                path, state = cfg.resume_from_checkpoint, load_checkpoint(cfg.resume_from_checkpoint)
            except (ValueError, FileNotFoundError) as e:
                raise StopRun(f"error: --resume_from_checkpoint: {e}") from None
        elif cfg.recovery_mode:
            path = self.run_dir.checkpoint("recovery.pt")
            if not os.path.exists(path):
                raise StopRun(f"--recovery_mode: {path} does not exist; run without it or with --auto_resume")
            try:
                state = load_checkpoint(path)
            except ValueError as e:
                raise StopRun(f"error: --recovery_mode: {e}; continue from the last good checkpoint with "
                              "--auto_resume") from None
        elif cfg.auto_resume:  # rank 0 picks the checkpoint, the others load the same file
            found = self.run_dir.latest_valid_checkpoint() if self.main else None
            path = distributed.from_main(found[0] if found else None)
            if path is not None:
                state = found[1] if self.main else load_checkpoint(path)
        if path is None:
            return
        resume_config(cfg, FIELDS, state["config"], f"{path} was written by a run with other settings")
        self.load_state(state)
        if self.step > cfg.steps:  # else config.json would say --steps, final/ hold a later step
            raise StopRun(f"error: {path} is at step {self.step}, past --steps {cfg.steps}; give --steps above "
                          f"{self.step} to train on (a finished run's model is in its final/)")
        self.on_main(lambda: self.run_dir.cut_back(self.step))
        self.log(f"Resumed from {path} at step {self.step}")

    def recover(self, reason):
        """Roll back to the recovery checkpoint with the LR halved; keep the bad state for debugging."""
        self.recoveries += 1
        debug = f"debug_step_{self.step:06d}.pt"
        self.save(debug)
        if self.recoveries > MAX_RECOVERIES:
            raise StopRun(f"{reason} at step {self.step} again after {MAX_RECOVERIES} recoveries; stopping. "
                          f"The bad state is in {self.run_dir.checkpoint(debug)}; try a lower --lr")
        lr_scale = self.lr_scale * 0.5
        try:
            state = load_checkpoint(self.run_dir.checkpoint("recovery.pt"))
        except ValueError as e:
            raise StopRun(f"error: {reason} at step {self.step}, and the rollback failed: {e}; continue from the last "
                          "good checkpoint with --auto_resume") from None
        self.load_state(state)
        self.lr_scale = lr_scale
        self.on_main(lambda: self.run_dir.cut_back(self.step))
        self.reporter.rewind(self.step)  # the dashboard drops the abandoned steps too (no-op off rank 0)
        self.log(f"{reason}: rolled back to step {self.step}, lr scale now {self.lr_scale} "
                 f"(recovery {self.recoveries}/{MAX_RECOVERIES})")

    def announce_stop(self, name):
        if self.main:
            then = ("writing the last checkpoint and the final model" if getattr(self, "finishing", False) else
                    f"finishing step {self.step + 1}, then saving a checkpoint" if self.step + 1 < self.cfg.steps else
                    "finishing the last step and writing the final model")  # the run ends anyway
            echo(f"\n{name}: {then} (again to quit at once)", sys.stderr)

    def stop_for_signal(self, name):
        """After the step a signal interrupted (`name`; None when it reached another rank): a checkpoint, then StopRun."""
        self.log(f"{name or 'a signal to another rank'}: saving checkpoint at step {self.step}...")
        self.save_regular()
        launch = f"torchrun --nproc_per_node {self.world}" if self.world > 1 else "python"
        raise StopRun(f"saved; resume with: {launch} mini/train.py --log_dir {shlex.quote(self.cfg.log_dir)} "
                      f"--run_name {shlex.quote(self.run_dir.name)} --auto_resume", signal_exit_code(name))
