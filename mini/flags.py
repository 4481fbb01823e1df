"""
The command line of Config: flags generated from its fields (grouped by topic in --help, booleans as
--name / --no_name, also those that default to None: set by the device unless given), and every check that
runs on them before a model loads: values, combinations, the device, the files they name. A bad flag exits
with code 2 and one sentence. Also each script's entry point and its lines on the terminal, which outlive a
reader that stops reading (`| head`, a terminal that hung up).
"""
import argparse
import json
import math
import os
import re
import select
import signal
import stat
import sys

from tqdm.auto import tqdm

from mini.config import EVAL_PATH, FIELDS, MATE_PATH, START_FLAGS, Config, choices_of

# --help's topics: each opens at its field and runs to the next one's, in the order of Config
SECTIONS = {"model_path": "model and run", "temperature": "sampling", "mix_env_ratio": "tasks and data",
            "steps": "the GRPO objective", "lr": "optimisation", "eval_every": "evaluation, logs and checkpoints",
            "n_layer": "a model made from scratch"}


def device_problem(name):
    """Why --device `name` cannot be used here, or None."""
    if name in ("auto", "cpu"):
        return None
    m = re.fullmatch(r"cuda(?::(0|[1-9][0-9]*))?", name)  # as torch.device reads it: no "01", no other digits
    if not m:
        return f"--device {name!r} must be auto, cpu, cuda or cuda:N"
    import torch  # only here: the flags themselves need no torch
    if not torch.cuda.is_available():
        return (f"--device {name} but this torch ({torch.__version__}) sees no CUDA device; use --device cpu, "
                "or install a CUDA build of torch")
    if m.group(1) and int(m.group(1)) >= torch.cuda.device_count():
        return f"--device {name} but there are {torch.cuda.device_count()} CUDA devices (cuda:0 ...)"
    return None


def wrong_types(values):
    """One sentence per value that its Config field cannot hold, or outside its choices: argparse checks
    these on the command line, nothing on a settings file (a run's config.json, edited by hand or damaged)."""
    out = []
    for name, value in values.items():
        field = FIELDS.get(name)
        if field is None:
            continue
        default, choices = field.default, choices_of(field)  # a settings file is train.py's
        if default is None or isinstance(default, bool):  # None: a switch left to the device
            fits, kind = isinstance(value, bool) or (default is None and value is None), "true or false"
        elif isinstance(default, float):
            fits, kind = isinstance(value, (int, float)) and not isinstance(value, bool), "a number"
        else:
            fits, kind = type(value) is type(default), {int: "a whole number", str: "text"}[type(default)]
        shown = json.dumps(value)[:40]  # as the settings file has it
        if not fits:
            out.append(f"--{name} {shown} must be {kind}")
        elif choices and value not in choices:
            out.append(f"--{name} {shown} must be one of {', '.join(map(str, choices))}")
    return out


def problems(values, checks=None):
    """One sentence per bad value among parsed flags (a dict name -> value), whichever script parsed them:
    each number against its field's check (or `checks`, for flags that are not Config fields), then the
    combinations."""
    checks = {**{n: f.metadata["check"] for n, f in FIELDS.items() if f.metadata["check"]}, **(checks or {})}
    out = []
    for name, value in values.items():
        if isinstance(value, float) and not math.isfinite(value):
            out.append(f"--{name} {value} is not a finite number")
        elif type(value) is int and abs(value) > sys.maxsize:  # a C integer's range: islice, Pool(), range() take no more
            digits = str(value)
            out.append(f"--{name} {digits if len(digits) <= 30 else digits[:10] + '...'} is too large a number "
                       f"(at most {sys.maxsize})")
        elif name in checks and value is not None and not checks[name][0](value):
            out.append(f"--{name} {value} must be {checks[name][1]}")
    v = values.get
    if v("device") is not None:  # "" too: torch.device("") would fail later with a traceback
        out.append(device_problem(v("device")))
    if v("data_file") and v("data_source") in ("pool", "generate", "selfplay"):
        out.append(f"--data_file is read only with --data_source file (not {v('data_source')}); add that or drop --data_file")
    if v("data_source") == "file" and not v("data_file"):
        out.append("--data_source file needs --data_file PATH")
    if v("eval_chess") and v("eval_every") == 0:
        out.append("--eval_chess adds chess to the periodic evaluation, which --eval_every 0 turns off; set --eval_every "
                   "or drop --eval_chess")
    listed = {os.path.realpath(path) for flag in ("data_file", "sft_data_file") for path in (v(flag) or "").split(",")
              if path}
    strays = [path for path in (v("policy_only_file") or "").split(",") if path and os.path.realpath(path) not in listed]
    if strays:  # it marks files of those two flags; on its own it would be read by nothing
        out.append(f"--policy_only_file {', '.join(strays)} is not among the files of --data_file (or train.py's "
                   "--sft_data_file); list it there too, or drop it here")
    if v("sft_data_file") and not (v("env_sft_coef") or v("policy_sft_coef")):
        out.append("--sft_data_file feeds the supervised terms: set --env_sft_coef or --policy_sft_coef, or drop it")
    if v("micro_batch_size") and v("batch_size") and v("k_samples") and v("micro_batch_size") > v("batch_size") * v("k_samples"):
        out.append(f"--micro_batch_size {v('micro_batch_size')} is larger than the batch of --batch_size x --k_samples = "
                   f"{v('batch_size') * v('k_samples')} completions; lower it or use 0 (the whole batch)")
    world = os.environ.get("WORLD_SIZE", "1")  # set by torchrun; by hand it may be anything
    if not (world.isascii() and world.isdigit() and int(world) > 0):
        out.append(f"WORLD_SIZE={world!r} in the environment is not a number of processes; unset it, or start the "
                   "run with torchrun, which sets it")
    world = int(world) if world.isascii() and world.isdigit() else 1
    if world > 1 and v("batch_size") and v("batch_size") % world:
        out.append(f"--batch_size {v('batch_size')} does not divide among the {world} processes torchrun started "
                   f"(it is the global number of prompts per step); use a multiple of {world}")
    for term in ("env_sft", "policy_sft"):  # each rank draws its share of the supervised rows
        if world > 1 and v(f"{term}_coef") and v(f"{term}_batch") and v(f"{term}_batch") % world:
            out.append(f"--{term}_batch {v(f'{term}_batch')} does not divide among the {world} processes torchrun "
                       f"started (it is the global number of rows per step); use a multiple of {world}")
    if v("decay_steps") and v("steps") and v("warmup_steps", 0) + v("decay_steps") >= v("steps"):
        out.append(f"--warmup_steps {v('warmup_steps', 0)} and --decay_steps {v('decay_steps')} leave no step of "
                   f"--steps {v('steps')} for the cosine between them, so the LR would fall from its peak at once "
                   "when the warmup ends; lower one of them")
    if v("n_embd") and v("n_head") and v("n_embd") % v("n_head"):
        out.append(f"--n_embd {v('n_embd')} must be a multiple of --n_head {v('n_head')}")
    if v("baseline_type") == "ema" and v("scale_rewards", "group") == "group":
        out.append("--baseline_type ema with --scale_rewards group divides a group's distance from the running mean by "
                   "the group's own spread, so near-equal rewards far from that mean get huge advantages; "
                   "add --scale_rewards batch or none")
    starts = [f"--{n}" for n in START_FLAGS if v(n)]
    if len(starts) > 1:
        out.append(f"{' and '.join(starts)} say different things; use one of them")
    if (v("auto_resume") or v("recovery_mode")) and not v("run_name"):
        out.append(f"{starts[0]} needs --run_name: the run to continue")
    if v("run_name") and (os.sep in v("run_name") or v("run_name") in (".", "..")):
        out.append(f"--run_name {v('run_name')!r} must be a plain name (no {os.sep!r}); --log_dir says where runs go")
    if v("run_name") and not v("run_name").isprintable() or v("run_name") and not v("run_name").strip():
        out.append(f"--run_name {v('run_name')!r} must be a name one can type: printable, not blank")
    model, run = v("model_path"), v("log_dir") and v("run_name") and os.path.join(v("log_dir"), v("run_name"))
    if v("overwrite") and run and os.path.isdir(run):
        # in the run directory, or the directory itself (a --run_name that is the model's snapshot)
        inside = lambda path: (os.path.realpath(path) + os.sep).startswith(os.path.realpath(run) + os.sep)
        if model and inside(model):
            out.append(f"--overwrite would move the run {run} aside, and with it --model_path {model}: copy the "
                       "model out first, or pick another --run_name")
        for flag in ("data_file", "sft_data_file"):
            for path in (v(flag) or "").split(","):
                if path and inside(path):
                    out.append(f"--overwrite would move the run {run} aside, and with it --{flag} {path}: copy the "
                               "file out first, or pick another --run_name")
    # NAME_MAX of Linux file systems; an unprintable name (undecodable bytes: surrogates, no UTF-8) is refused above
    if v("run_name") and v("run_name").isprintable() and len(v("run_name").encode()) > 255:
        out.append(f"--run_name {v('run_name')[:20]!r}... is {len(v('run_name').encode())} bytes long, more than the 255 "
                   "a file name may have; pick a shorter one")
    shaped = [f"--{k} {v(k)}" for k in ("n_layer", "n_head", "n_embd", "n_positions")
              if v(k) not in (None, FIELDS[k].default)]
    if shaped and v("model_path") not in (None, "", "scratch"):  # else the flags would be ignored
        out.append(f"{', '.join(shaped)}: the shape of a model built from scratch (--model_path scratch); the "
                   f"snapshot {v('model_path')} keeps its own (sft.py deepens one with --grow_layers)")
    out += unwritable_outputs(values) + missing_files(values)
    return [p for p in out if p]


def not_a_device(path):
    """path, unless it names a device: ValueError in one sentence, as /dev/zero would be read for ever and a
    terminal waits for typing. A pipe is read (`<(zcat x.gz)`, a FIFO: it ends when its writer does); a folder or
    a missing file is left to open()'s own error."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return path
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        raise ValueError(f"{path} is a device, not a file; name a file")
    return path


def looks_like_path(name):
    """A hub id is owner/name; a path is absolute, relative (./, ../, ~), deeper, or starts at a local directory
    (logs/nope: logs exists here)."""
    return (os.path.isabs(name) or name.startswith((".", "~")) or name.count("/") != 1
            or os.path.isdir(name.split("/")[0]))


def missing_files(values):
    """The files the flags name that are not there, one sentence each: looked for at parse time, before any
    model loads."""
    v, out = values.get, []
    model = v("model_path")
    if model and model != "scratch" and looks_like_path(model):
        if os.path.isfile(model):
            out.append(f"--model_path {model} is a file; a model is a snapshot directory (a run writes its model to "
                       "logs/<run_name>/final; a checkpoint .pt is the trainer's state, which --auto_resume continues)")
        elif not os.path.isdir(model):
            out.append(f"--model_path: model directory {model} does not exist; pass an existing snapshot directory "
                       "or a hub id like jrahn/RookWorld-LM-124M")
    for flag in ("data_file", "sft_data_file", "policy_only_file"):
        if v(flag) and "" in v(flag).split(","):  # "a.jsonl," would name the file "" and fail later, unclearly
            out.append(f"--{flag} {v(flag)!r} has an empty name between its commas; list the files as a.jsonl,b.jsonl")
    for flag in ("data_file", "sft_data_file"):  # --policy_only_file's files are theirs (problems says when not)
        names = (v(flag) or "").split(",")
        folders = [path for path in names if path and os.path.isdir(path)]
        devices = [path for path in names if path and os.path.exists(path) and not os.path.isfile(path)
                   and path not in folders]  # /dev/zero, a pipe: no end, or read once
        missing = [path for path in names if path and not os.path.exists(path)]
        if folders:
            out.append(f"--{flag} {', '.join(folders)} is a folder; name its JSONL files, comma-separated")
        if devices:
            out.append(f"--{flag} {', '.join(devices)} is not a regular file (a device or a pipe); name JSONL files")
        if missing:
            out.append(f"--{flag} {', '.join(missing)}: no such file")
    for path, needed_by in ((EVAL_PATH, "eval_every"), (MATE_PATH, "eval_chess")):
        if v(needed_by) and not os.path.isfile(path):
            out.append(f"{path} is missing (a shipped held-out file, read by --{needed_by}); restore it with "
                       "git checkout mini/data")
    return out


def reader_gone(stream):
    """True when no one reads `stream` any more: a pipe whose reader closed it (`| head` has its lines) or a
    terminal that hung up (ssh dropped). Its descriptor then polls POLLERR; a broken pipe elsewhere (a dying
    Stockfish's stdin) leaves it as it was."""
    try:
        poll = select.poll()
        poll.register(stream.fileno(), 0)  # no event asked for: POLLERR is always reported
        return any(event & select.POLLERR for _, event in poll.poll(0))
    except (AttributeError, OSError, ValueError):  # closed, or replaced by an object without a descriptor
        return False


def drop(stream):
    """What is left for `stream` goes to /dev/null: its reader has gone, and a failed flush keeps the text in the
    buffer, so that every later write and exit's own flush would fail again ('Exception ignored', exit code 120)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())


def echo(line, stream=None):
    """A line on stdout (or `stream`), above any progress bar. Once no one reads it (`train.py | head`, a terminal
    that hung up), a run goes on with its lines in its log file alone, rather than dying of a BrokenPipeError or an
    EIO at its next line."""
    stream = stream or sys.stdout
    try:
        tqdm.write(line, file=stream)
    except OSError:
        if not reader_gone(stream):
            raise
        drop(stream)


def run_command(main):
    """sys.exit(main()) for a script. When the reader of its stdout stops reading (`analyze_metrics.py run | head`),
    it ends as Unix tools do, quietly with 141 (128 + SIGPIPE), not in a BrokenPipeError traceback. A path whose
    name is not UTF-8 is printed escaped, as on stderr, not a UnicodeEncodeError under a strict UTF-8 locale."""
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")
    try:
        code = main()
        sys.stdout.flush()  # here, where a closed pipe is caught, not first in exit's own flush
    except BrokenPipeError:
        if not reader_gone(sys.stdout):
            raise
        drop(sys.stdout)
        code = 128 + signal.SIGPIPE
    sys.exit(code)


OUTPUT_FLAGS = ("out", "plot", "pool_path", "eval_path", "json")  # files a script writes when its work is done
CACHE_FLAGS = ("engine_cache", "cache")  # Stockfish's caches, read and appended to; looked at only when used


def error_sentence(e):
    """An exception as the one sentence a script exits with: an OSError names its file and says what to do
    (str() gives "[Errno 21] Is a directory: 'x'")."""
    if isinstance(e, OSError) and e.strerror and e.filename:
        return f"{e.filename}: {e.strerror[0].lower()}{e.strerror[1:]}; check the path"
    return str(e)


def unwritable_outputs(values, names=OUTPUT_FLAGS):
    """The output files the flags name that could not be written, one sentence each: looked for at parse time,
    so that minutes of evaluation or labelling are not lost to a path that was a folder or read-only."""
    out = []
    for name in names:
        path = values.get(name)
        if not path:
            continue
        if os.path.isdir(path) or path.endswith(os.sep):  # a folder, or one to be made
            out.append(f"--{name} {path} is a folder; name a file, such as {os.path.join(path, 'report.json')}")
            continue
        if os.path.exists(path) and not os.path.isfile(path):  # written beside and renamed over: /dev/null replaced
            out.append(f"--{name} {path} is not a regular file (a device or a pipe); name a file")
            continue
        folder = nearest_folder(path)
        if not os.path.isdir(folder):
            out.append(f"--{name} {path}: {folder} is a file, not a folder; pick another path")
        elif not os.access(folder, os.W_OK | os.X_OK):
            out.append(f"--{name} {path}: {folder} cannot be written to; pick a folder you can write to")
    for name in CACHE_FLAGS:  # written when used: a folder, a device (/dev/null, no cache, is one) or a file above it
        path = values.get(name)
        if path and os.path.isdir(path):
            out.append(f"--{name} {path} is a folder; name a file, such as "
                       f"{os.path.join(path, 'stockfish.jsonl')}, or '' for no cache")
        elif path and path != os.devnull and os.path.exists(path) and not os.path.isfile(path):  # /dev/zero: read
            out.append(f"--{name} {path} is not a regular file (a device or a pipe); name a file, or '' for no cache")
        elif path and not os.path.isdir(nearest_folder(path)):
            out.append(f"--{name} {path}: {nearest_folder(path)} is a file, not a folder; pick another path")
    return out


def nearest_folder(path):
    """The nearest ancestor of path that exists (the rest is made on writing): a file if path cannot be made."""
    folder = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(folder):
        folder = os.path.dirname(folder)
    return folder


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Every flag's help ends with its default."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.option_strings and action.default is not None and action.default is not argparse.SUPPRESS:
            text += f" (default: {action.default!r})".replace("%", "%%")
        return text


class Switch(argparse.Action):
    """--name sets a boolean, --no_name clears it: one line in --help."""

    def __init__(self, option_strings, dest, **kw):
        super().__init__(option_strings, dest, nargs=0, **kw)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, not option_string.startswith("--no_"))


class Parser(argparse.ArgumentParser):
    """argparse with exact flag names (no abbreviations), every default in --help, the checks of problems()
    on the parsed values, and errors of one line."""

    def __init__(self, description, checks=None, **kw):
        kw.setdefault("usage", "%(prog)s [options]")  # the options are listed below, with their defaults
        super().__init__(description=description, allow_abbrev=False, formatter_class=HelpFormatter, **kw)
        self.checks = checks  # {flag: (predicate, what it must be)} beyond the Config fields
        # "-1e-5", "-inf" and "-nan" are values, where argparse would take them for flags ("expected one argument")
        self._negative_number_matcher = re.compile(r"^-(inf|infinity|nan)$|^-(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$",
                                                   re.IGNORECASE)

    def add_argument(self, *args, **kw):
        """A flag named like a Config field gets that field's help unless it brings its own."""
        action = super().add_argument(*args, **kw)
        if action.help is None and action.dest in FIELDS:
            action.help = FIELDS[action.dest].metadata["help"]
        return action

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message}\n")

    def parse_args(self, args=None, namespace=None):
        parsed = super().parse_args(args, namespace)
        for problem in problems(vars(parsed), self.checks)[:1]:
            self.error(problem)
        return parsed


def add_config_flags(parser, script):
    """Flags for the Config fields that `script` uses, booleans as --name / --no_name, grouped by SECTIONS."""
    group = None
    for name, f in FIELDS.items():
        group = parser.add_argument_group(SECTIONS[name]) if name in SECTIONS else group
        if script not in f.metadata["scripts"]:
            continue
        if isinstance(f.default, bool) or f.default is None:  # None: on or off by the device, decided later
            group.add_argument(f"--{name}", f"--no_{name}", dest=name, action=Switch, default=f.default,
                                help=f.metadata["help"])
        else:
            group.add_argument(f"--{name}", type=type(f.default), default=f.default, choices=choices_of(f, script),
                                help=f.metadata["help"])


def parse_args(argv=None, script="train", description="Fine-tune RookWorld-LM with GRPO."):
    """The Config of `script`'s flags (the other fields keep their defaults), checked: a bad value exits
    with code 2 and one line."""
    p = Parser(description)
    add_config_flags(p, script)
    return Config(**vars(p.parse_args(argv)))

