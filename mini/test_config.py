"""Flags: every bad value is one line and exit code 2 at parse time, the same checks in train.py, sft.py,
evaluate.py and bench.py, --help with every default and only the script's own flags, and a fuzz test
over random flag combinations (each one starts, or exits with one line).

    python mini/test_config.py
"""
import dataclasses
import json
import os
import random
import re
import subprocess
import sys

import pytest

import mini.bench as bench
import mini.evaluate as evaluate
import mini.sft as sft
import mini.train as train
from mini.config import POOL_PATH, Config
import mini.flags as flags
from mini.flags import device_problem, parse_args, wrong_types
from mini.test_formats import P_LINES
from mini.test_train import tiny  # noqa: F401  (a fixture)

BAD = [
    (["--lr", "-1e-5"], "--lr -1e-05 must be in (0, 1]"),  # a negative number is a value, not a flag
    (["--model_path", "/nonexistent/model"], "model directory /nonexistent/model does not exist"),  # before loading
    (["--model_path", POOL_PATH], f"--model_path {POOL_PATH} is a file; a model is a snapshot directory"),  # a .pt
    (["--data_source", "file", "--data_file", "/nonexistent.txt"], "--data_file /nonexistent.txt: no such file"),
    (["--data_source", "file", "--data_file", f"{POOL_PATH},/none.jsonl"], "--data_file /none.jsonl: no such file"),
    (["--data_source", "file", "--data_file", f"{POOL_PATH},"], "has an empty name between its commas"),
    (["--data_source", "file", "--data_file", "/dev/zero"], "--data_file /dev/zero is not a regular file (a device"),
    (["--engine_cache", "/dev/zero"], "--engine_cache /dev/zero is not a regular file (a device or a pipe); name a "
     "file, or '' for no cache"),  # read forever, as the cache is read back
    (["--data_source", "file", "--data_file", os.path.dirname(POOL_PATH)], "/data is a folder; name its JSONL files"),
    (["--sft_data_file", f",{POOL_PATH}", "--env_sft_coef", "1"], "--sft_data_file ',"),
    (["--k_samples", "1"], "--k_samples 1 must be at least 2"),
    (["--k_samples", "0"], "--k_samples 0 must be at least 2"),
    (["--batch_size", "0"], "--batch_size 0 must be at least 1"),
    (["--max_new_tokens", "0"], "--max_new_tokens 0 must be at least 1"),
    (["--steps", "-5"], "--steps -5 must be at least 0"),
    (["--temperature", "0"], "--temperature 0.0 must be above 0"),
    (["--top_k", "-1"], "--top_k -1 must be at least 0"),
    (["--lr", "nan"], "--lr nan is not a finite number"),
    (["--mix_env_ratio", "1.5"], "--mix_env_ratio 1.5 must be between 0 and 1"),
    (["--micro_batch_size", "100"], "--micro_batch_size 100 is larger than the batch of --batch_size x --k_samples = 64"),
    (["--device", "cuda"], "sees no CUDA device; use --device cpu"),
    (["--device", "gpu"], "--device 'gpu' must be auto, cpu, cuda or cuda:N"),
    (["--device", ""], "--device '' must be auto, cpu, cuda or cuda:N"),  # else torch.device("") at start: a traceback
    (["--data_file", "x.txt"], "--data_file is read only with --data_source file (not pool)"),
    (["--data_source", "selfplay", "--data_file", "x.txt"], "--data_file is read only with --data_source file (not selfplay)"),
    (["--data_source", "file"], "--data_source file needs --data_file PATH"),
    (["--auto_resume"], "--auto_resume needs --run_name"),
    (["--auto_resume", "--overwrite", "--run_name", "r"], "--auto_resume and --overwrite say different things"),
    (["--run_name", "a/b"], "must be a plain name"),
    (["--baseline_type", "ema"], "--baseline_type ema with --scale_rewards group divides"),
    (["--steps", "1.5"], "argument --steps: invalid int value: '1.5'"),
    (["--loss_type", "ppo"], "argument --loss_type: invalid choice: 'ppo'"),
    (["--k_sample", "4"], "unrecognized arguments: --k_sample 4"),  # no abbreviations
    (["--lr", "inf"], "--lr inf is not a finite number"),
    (["--temperature", "-inf"], "--temperature -inf is not a finite number"),
    (["--seed", str(2**32)], "--seed 4294967296 must be between 0 and 2**32 - 1"),
    (["--memory_fraction", "0"], "--memory_fraction 0.0 must be in (0, 1]"),
    (["--lr", "-nan"], "--lr nan is not a finite number"),  # a value too, not "expected one argument"
    (["--temperature", "-Infinity"], "--temperature -inf is not a finite number"),
    (["--batch_size", "2", "--k_samples", "2", "--micro_batch_size", "5"], "--micro_batch_size 5 is larger than"),
    (["--recovery_mode"], "--recovery_mode needs --run_name"),
    (["--recovery_mode", "--resume_from_checkpoint", "x.pt", "--run_name", "r"],
     "--recovery_mode and --resume_from_checkpoint say different things"),
    (["--run_name", " "], "--run_name ' ' must be a name one can type: printable, not blank"),
    (["--run_name", "a\nb"], "--run_name 'a\\nb' must be a name one can type"),
    (["--run_name", "\udcff"], "--run_name '\\udcff' must be a name one can type"),  # argv's byte 0xff: no UTF-8
    (["--run_name", ".."], "must be a plain name"),
    (["--run_name", "."], "must be a plain name"),
    (["--run_name", "x" * 256], "is 256 bytes long, more than the 255"),
    (["--run_name", "\u00e9" * 128], "is 256 bytes long, more than the 255"),  # bytes, not characters
    (["--model_path", "./no/such/model"], "does not exist"),
    (["--model_path", "a/b/c"], "does not exist"),  # deeper than owner/name: a path
    (["--model_path", "no_such_model"], "does not exist"),  # no owner/: a local name, not a hub id
    (["--steps", "100", "--warmup_steps", "10", "--decay_steps", "95"],
     "--warmup_steps 10 and --decay_steps 95 leave no step of --steps 100"),  # a jump from 1 to 0.095 at step 10
    (["--steps", "20", "--warmup_steps", "10", "--decay_steps", "10"],
     "--warmup_steps 10 and --decay_steps 10 leave no step of --steps 20"),  # 1.0 at step 9, min_lr_ratio at 10
]


def one_line_exit(capsys, fn, argv):
    """fn(argv) exits with code 2 and one line on stderr, no traceback; returns the line."""
    with pytest.raises(SystemExit) as e:
        fn(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("argv,message", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_a_bad_flag_is_one_line(capsys, monkeypatch, argv, message):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # "--device cuda" is refused on a GPU machine too
    err = one_line_exit(capsys, train.main, argv)
    assert ": error: " in err and message in err, err


def test_the_same_checks_serve_every_script(capsys, monkeypatch):
    monkeypatch.setattr("torch.cuda.is_available", lambda: False)  # as on the CPU machines, whatever this one has
    assert "--batch_size 0 must be at least 1" in one_line_exit(capsys, sft.main, ["--batch_size", "0"])
    assert "--n_embd 100 must be a multiple of --n_head 3" in one_line_exit(capsys, sft.main, ["--n_embd", "100", "--n_head", "3"])
    assert "leave no step of --steps 10" in one_line_exit(capsys, sft.main, ["--steps", "10", "--decay_steps", "5"])
    assert "--k_samples" in one_line_exit(capsys, sft.main, ["--k_samples", "4"])  # not an sft flag
    for n in ("0", "-3"):
        assert f"--n {n} must be at least 1" in one_line_exit(capsys, evaluate.main, ["--n", n, "--model_path", "x"])
    assert "--max_new_tokens 0 must be at least 1" in one_line_exit(capsys, evaluate.main, ["--max_new_tokens", "0"])
    assert "--steps 0 must be at least 1" in one_line_exit(capsys, bench.main, ["scoring", "--steps", "0"])
    assert "--sft_data_file feeds the supervised terms" in one_line_exit(capsys, train.main, ["--sft_data_file", "x"])
    assert "which --eval_every 0 turns off" in one_line_exit(capsys, train.main, ["--eval_chess", "--eval_every", "0"])
    assert parse_args(["--eval_chess", "--eval_every", "5"]).eval_chess
    assert "--sft_data_file nowhere.jsonl: no such file" in one_line_exit(
        capsys, train.main, ["--sft_data_file", "nowhere.jsonl", "--env_sft_coef", "1"])
    assert parse_args(["--sft_data_file", POOL_PATH, "--policy_sft_coef", "1"]).sft_data_file == POOL_PATH  # either term
    trained = ["step", "--model_path", "mini/data/rookworld-10m", "--prompts", "1", "--k", "2", "--new_tokens", "2",
               "--steps", "1", "--no_transformers", "--no_trl"]  # its rows stop at EOS: only at real lengths
    assert "--model_path goes with --real_lengths" in one_line_exit(capsys, bench.main, trained)
    assert "sees no CUDA device" in one_line_exit(capsys, bench.main, ["--device", "cuda"])
    assert "--new_tokens 1 must be at least 2" in one_line_exit(capsys, bench.main, ["sampler", "--new_tokens", "1"])
    assert "--n_layer 2: the shape of a model built from scratch" in one_line_exit(  # else ignored
        capsys, sft.main, ["--model_path", "mini/data/rookworld-10m", "--n_layer", "2"])
    assert "--n_positions 512: the shape of a model built from scratch" in one_line_exit(  # else ignored too
        capsys, lambda a: parse_args(a, script="sft"), ["--model_path", "mini/data/rookworld-10m", "--n_positions", "512"])
    assert "the sampler mode would ignore it" in one_line_exit(
        capsys, bench.main, ["sampler", "--model_path", "mini/data/rookworld-10m"])


def test_an_output_path_that_cannot_be_written_stops_before_the_work(capsys, tmp_path, monkeypatch):
    """A report or pool path that is a folder, lies under a file, or in a folder nobody may write: one line at
    parse time, before the model loads (the model path here does not exist, so a check that came later would
    say that instead)."""
    import mini.annotate as annotate
    import mini.chess_eval as chess_eval
    (tmp_path / "a_file").write_text("")
    cases = [(evaluate.main, "--out", str(tmp_path), "is a folder; name a file"),
             (chess_eval.main, "--out", str(tmp_path / "a_file" / "r.json"), "is a file, not a folder"),
             (evaluate.main, "--plot", str(tmp_path / "a_file" / "deeper" / "p.png"), "is a file, not a folder"),
             (annotate.main, "--pool_path", str(tmp_path), "is a folder"),
             (annotate.main, "--eval_path", str(tmp_path / "a_file" / "e.jsonl"), "is a file, not a folder"),
             (chess_eval.main, "--out", str(tmp_path / "new") + os.sep, "is a folder; name a file"),  # one to be made
             (bench.main, "--json", str(tmp_path), "is a folder; name a file"),
             (evaluate.main, "--engine_cache", str(tmp_path), "is a folder; name a file"),  # appended to as it goes
             (train.main, "--engine_cache", str(tmp_path), "is a folder; name a file"),
             (annotate.main, "--cache", str(tmp_path), "is a folder; name a file"),
             (annotate.main, "--cache", str(tmp_path / "a_file" / "c.jsonl"), "is a file, not a folder"),
             (chess_eval.main, "--mates_path", str(tmp_path), "is a folder; name a file")]  # with --build_mates
    for fn, flag, path, says in cases:
        if flag == "--mates_path":  # what --build_mates writes
            argv = [flag, path, "--build_mates"]
        else:
            argv = [flag, path] + (["--model_path", "/nonexistent/model"] if fn in (evaluate.main, chess_eval.main) else [])
        err = one_line_exit(capsys, fn, argv)
        assert f"{flag} {path}" in err and says in err and "does not exist" not in err, err
    for fn, argv in ((evaluate.main, ["--out", str(tmp_path / "new" / "deeper" / "r.json")]),  # folders made later
                     (chess_eval.main, ["--out", str(tmp_path / "a_file")])):  # an existing file is overwritten
        assert "does not exist" in one_line_exit(capsys, fn, argv + ["--model_path", "/nonexistent/model"])
    locked = str(tmp_path / "locked")  # a read-only folder, as root sees none: os.access says no for it alone
    os.mkdir(locked)
    access = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: path != locked and access(path, mode))
    err = one_line_exit(capsys, evaluate.main, ["--out", os.path.join(locked, "new", "r.json"),
                                                "--model_path", "/nonexistent/model"])
    assert f"{locked} cannot be written to" in err, err

    model = tmp_path / "model"  # no --out: the report's default path in the model's folder is checked too
    (model / "eval.json").mkdir(parents=True)
    err = one_line_exit(capsys, evaluate.main, ["--model_path", str(model)])
    assert f"--out {model / 'eval.json'} is a folder" in err, err


def test_an_output_path_that_is_a_device_is_refused(capsys):
    """--out /dev/null: the report is written to /dev/null.tmp and renamed over it, which (as root) replaced the
    device with a regular file; refused at parse time. A cache, appended to and read back, may be /dev/null (no
    cache), and no other device: /dev/zero would be read forever."""
    assert flags.unwritable_outputs({"out": "/dev/null", "engine_cache": "/dev/null", "cache": "/dev/zero"}) == [
        "--out /dev/null is not a regular file (a device or a pipe); name a file",
        "--cache /dev/zero is not a regular file (a device or a pipe); name a file, or '' for no cache"]
    err = one_line_exit(capsys, evaluate.main, ["--out", "/dev/null", "--model_path", "/nonexistent/model"])
    assert "--out /dev/null is not a regular file" in err, err


def test_a_report_that_cannot_be_written_at_the_end_is_kept(capsys, tmp_path):
    """The write fails after the work (a full disk here): the report goes to a temporary file that the one
    sentence names."""
    blocked = tmp_path / "a_file"
    blocked.write_text("")
    with pytest.raises(SystemExit) as e:
        evaluate.save_report({"metrics": {"x": 1.0}}, str(blocked / "r.json"), "evaluate.py")
    message = str(e.value)
    assert message.startswith(f"evaluate.py: could not write {blocked / 'r.json'} (") and "; the report is in " in message
    spare = message.rsplit(" ", 1)[1]
    with open(spare) as f:
        assert json.load(f) == {"metrics": {"x": 1.0}}
    os.remove(spare)


def test_the_command_line_prints_no_traceback():
    run = subprocess.run([sys.executable, "mini/train.py", "--k_samples", "1"], capture_output=True, text=True)
    assert run.returncode == 2 and run.stderr == "train.py: error: --k_samples 1 must be at least 2\n"


def help_text(capsys, fn, argv=()):
    with pytest.raises(SystemExit):
        fn([*argv, "--help"])
    return capsys.readouterr().out


def test_help_is_grouped_by_topic(capsys):
    text = help_text(capsys, train.main)
    topics = ["model and run:", "sampling:", "tasks and data:", "the GRPO objective:", "optimisation:",
              "evaluation, logs and checkpoints:"]
    assert sorted(topics, key=text.index) == topics and "a model made from scratch:" not in text  # sft.py's only
    assert text.index("--lr ") > text.index("optimisation:") > text.index("--clip_eps_low")


def test_help_shows_every_default_and_only_the_script_flags(capsys):
    for fn, argv in ((train.main, ()), (sft.main, ()), (evaluate.main, ()), (bench.main, ("scoring",))):
        text = help_text(capsys, fn, argv)
        flags = re.split(r"\n(?=  -)", text.split("\noptions:\n")[1])  # one block per flag
        no_default = [f.split()[0] for f in flags if "(default:" not in " ".join(f.split())]
        assert len(flags) > 5 and set(no_default) <= {"-h,", "--model_path", "--compare"}, no_default
    text = help_text(capsys, sft.main)
    assert "Supervised warm start" in text and "--n_layer" in text and "--time_limit_min" in text
    assert not any(f in text for f in ("--k_samples", "--clip_eps_low", "--kl_coef", "--kl_type"))
    assert "\n  --n_layer" not in help_text(capsys, train.main)
    assert "--bf16, --no_bf16" in text
    text = " ".join(help_text(capsys, evaluate.main).split())  # a Config flag without its own help borrows the field's
    assert "--max_new_tokens MAX_NEW_TOKENS longest completion; P: needs ~66 tokens, A: ~58 (default: 96)" in text


def help_sections(text):
    """--help's groups: {title: [its flags, in order]}."""
    return {block.split("\n")[0][:-1]: re.findall(r"^  (--\w+)", block, re.M) for block in text.split("\n\n")[2:]}


SFT_HELP = {  # read off mini/config.py: the fields whose scripts hold "sft", under their topics
    "options": [],
    "model and run": ["--model_path", "--device", "--run_name", "--log_dir", "--overwrite", "--seed", "--report_to"],
    "tasks and data": ["--mix_env_ratio", "--data_source", "--data_file", "--policy_only_file", "--policy_pad",
                       "--skip_bad_lines", "--stockfish_path", "--stockfish_depth", "--annotate_workers"],
    "the GRPO objective": ["--steps", "--batch_size"],
    "optimisation": ["--lr", "--weight_decay", "--adam_beta1", "--adam_beta2", "--grad_clip", "--warmup_steps",
                     "--decay_steps", "--min_lr_ratio", "--bf16", "--bf16_cpu"],
    "evaluation, logs and checkpoints": ["--time_limit_min"],
    "a model made from scratch": ["--n_layer", "--n_head", "--n_embd", "--n_positions", "--grow_layers",
                                  "--data_workers", "--snapshot_every_min"],
}


def test_help_lists_every_field_of_the_script_once_under_its_topic(capsys):
    """train.py: every field but sft.py's own, once each, in Config's order, each topic opening at its first field;
    sft.py: exactly the fields it uses (a field's `scripts` gone wrong drops or adds a flag)."""
    assert help_sections(help_text(capsys, sft.main)) == SFT_HELP
    sections = help_sections(help_text(capsys, train.main))
    listed = [flag for group in sections.values() for flag in group]
    assert listed == [f"--{f.name}" for f in dataclasses.fields(Config) if "train" in f.metadata["scripts"]]
    assert len(listed) == len(set(listed)) == len(dataclasses.fields(Config)) - 7  # sft.py's seven its own
    assert {title: group[0] for title, group in sections.items() if group} == {
        "model and run": "--model_path", "sampling": "--temperature", "tasks and data": "--mix_env_ratio",
        "the GRPO objective": "--steps", "optimisation": "--lr", "evaluation, logs and checkpoints": "--eval_every"}
    text = " ".join(help_text(capsys, train.main).split())
    assert "(default: None)" not in text and "--shared_prefix_decode, --no_shared_prefix_decode decode" in text


def test_defaults_are_the_documented_ones():
    """The defaults that README.md and the fields' help texts state (a default is set in one place, Config: a
    slip there changes every run)."""
    want = dict(model_path="jrahn/RookWorld-LM-124M", device="auto", run_name="", log_dir="logs", seed=42,
                report_to="none", temperature=1.0, top_k=0, data_source="pool", policy_pad="90", skip_bad_lines=True,
                reward_shaping="continuous", score_workers=-1, p_reward="labels", engine_nodes=0, steps=100,
                batch_size=8, k_samples=8, num_iterations=1, micro_batch_size=0, clip_eps_low=0.2, clip_eps_high=0.2,
                loss_type="grpo", scale_rewards="group", baseline_type="group_mean", kl_type="k3", kl_coef=0.02,
                adaptive_kl=False, env_sft_coef=0.0, policy_sft_coef=0.0, entropy_coef=0.0, use_gae=False, lr=1e-5,
                grad_clip=1.0, decay_steps=0, bf16=True, bf16_cpu=False, compile=False, shared_prefix_decode=None,
                eval_chess=False, kl_threshold=0.0, time_limit_min=0.0, grow_layers=0, data_workers=0,
                overwrite=False, auto_resume=False, recovery_mode=False, resume_from_checkpoint="")
    assert {name: getattr(Config(), name) for name in want} == want
    assert Config().engine_cache == os.path.join(os.path.expanduser("~"), ".cache", "rookworld-mini",
                                                 "stockfish-moves.jsonl")


def test_choices_are_the_documented_ones():
    """Each choice field's values, as its help text and README.md list them (sft.py: no selfplay)."""
    got = {f.name: flags.choices_of(f, script) for f in dataclasses.fields(Config) for script in ("train", "sft")
           if f.metadata["choices"] and script in f.metadata["scripts"]}
    assert {name: list(values) for name, values in got.items()} == {
        "report_to": ["none", "tensorboard", "wandb"], "data_source": ["pool", "file", "generate"],
        "policy_pad": ["90", "89", "both"], "reward_shaping": ["continuous", "graduated", "strict"],
        "p_reward": ["labels", "engine"], "loss_type": ["grpo", "dr_grpo", "dapo"],
        "scale_rewards": ["group", "batch", "none"], "baseline_type": ["group_mean", "ema", "adaptive"],
        "kl_type": ["forward", "reverse", "symmetric", "k3"]}  # data_source: sft.py's, the later one
    assert list(flags.choices_of(flags.FIELDS["data_source"])) == ["pool", "file", "generate", "selfplay"]


def test_a_switch_takes_no_value(capsys):
    """--bf16 false would be read as --bf16 if a switch took an optional value: a silent opposite."""
    assert "unrecognized arguments: false" in one_line_exit(capsys, parse_args, ["--bf16", "false"])
    assert "ignored explicit argument 'true'" in one_line_exit(capsys, parse_args, ["--no_bf16=true"])
    assert parse_args(["--steps", "5", "--steps", "7"]).steps == 7  # given twice: the last one, checked
    assert "--steps -1 must be at least 0" in one_line_exit(capsys, parse_args, ["--steps", "5", "--steps", "-1"])


def test_the_shipped_data_lies_in_mini_data():
    """Every shipped file and model the paths name is there (a renamed path is a missing file at the first run)."""
    here = os.path.dirname(os.path.abspath(__file__))
    names = ("pool.jsonl", "eval.jsonl", "mate_in_one.jsonl", "eval_games.jsonl", "eval_games2.jsonl")
    for name in names:
        assert os.path.isfile(os.path.join(here, "data", name)), name
    import mini.config as config
    assert [config.POOL_PATH, config.EVAL_PATH, config.MATE_PATH, config.REAL_EVAL_PATH, config.REAL_EVAL2_PATH] == [
        os.path.join(here, "data", name) for name in names]
    assert [config.SHIPPED_MODEL, config.CI_MODEL] == [os.path.join(here, "data", m) for m in ("rookworld-10m",
                                                                                                "rookworld-8m")]
    assert all(os.path.isfile(os.path.join(m, "config.json")) for m in (config.SHIPPED_MODEL, config.CI_MODEL))


# ----------------------------------------------------------------------------- boundaries, by hand

# (script, flag, values at the edge of what its check allows, values just beyond it): read off each field's
# documented range in mini/config.py
EDGES = [
    ("train", "--seed", ["0", str(2**32 - 1)], ["-1", str(2**32)]),
    ("train", "--k_samples", ["2"], ["1"]),
    ("train", "--temperature", ["1e-6"], ["0", "-0.5"]),
    ("train", "--top_k", ["0"], ["-1"]),
    ("train", "--mix_env_ratio", ["0", "1"], ["-0.01", "1.01"]),
    ("train", "--selfplay_mix", ["0", "1"], ["-0.01", "1.01"]),
    ("train", "--clip_eps_low", ["0", "1"], ["-0.01", "1.01"]),
    ("train", "--clip_eps_high", ["0", "5"], ["-0.01"]),
    ("train", "--ema_decay", ["0", "1"], ["-0.01", "1.01"]),
    ("train", "--gamma", ["0", "1"], ["-0.01", "1.01"]),
    ("train", "--gae_lambda", ["0", "1"], ["-0.01", "1.01"]),
    ("train", "--min_lr_ratio", ["0", "1"], ["-0.01", "1.01"]),
    ("train", "--adam_beta1", ["0", "0.9999"], ["1", "-0.1"]),
    ("train", "--adam_beta2", ["0", "0.9999"], ["1", "-0.1"]),
    ("train", "--memory_fraction", ["1e-6", "1"], ["0", "1.01"]),
    ("train", "--score_workers", ["-1", "0"], ["-2"]),
    ("train", "--steps", ["0"], ["-1"]),
    ("train", "--keep_last", ["0"], ["-1"]),
    ("train", "--save_every", ["0"], ["-1"]),
    ("train", "--stockfish_depth", ["1"], ["0"]),
    ("train", "--target_kl", ["1e-6"], ["0"]),
    ("train", "--value_clip", ["1e-6"], ["0"]),
    ("train", "--kl_coef", ["0"], ["-0.01"]),
    ("train", "--dynamic_sampling_min_std", ["0"], ["-0.01"]),
    ("train", "--num_iterations", ["1"], ["0"]),
    ("train", "--eval_n", ["1"], ["0"]),
    ("train", "--kl_horizon", ["1"], ["0"]),
    ("train", "--entropy_every", ["1"], ["0"]),
    ("train", "--env_sft_batch", ["1"], ["0"]),
    ("train", "--selfplay_games", ["1"], ["0"]),
    ("train", "--selfplay_temperature", ["1e-6"], ["0"]),
    ("train", "--weight_decay", ["0"], ["-0.01"]),
    ("train", "--time_limit_min", ["0"], ["-0.5"]),
    ("train", "--policy_sft_batch", ["1"], ["0"]),
    ("train", "--dynamic_sampling_max_rounds", ["1"], ["0"]),
    ("train", "--selfplay_refresh", ["1"], ["0"]),
    ("train", "--engine_nodes", ["0"], ["-1"]),
    ("train", "--grad_clip", ["0"], ["-0.01"]),
    ("train", "--warmup_steps", ["0"], ["-1"]),
    ("train", "--eval_every", ["0"], ["-1"]),
    ("train", "--lr", ["1"], ["1.01", "1e39"]),  # 1e39: AdamW's step overflowed float32, a traceback
    ("sft", "--lr", ["1"], ["1e39"]),
    ("sft", "--n_positions", ["160"], ["159"]),
    ("sft", "--n_layer", ["1"], ["0"]),
    ("sft", "--n_head", ["1"], ["0"]),
    ("sft", "--grow_layers", ["0"], ["-1"]),
    ("train", "--max_new_tokens", ["1"], ["0"]),
    ("train", "--batch_size", ["1"], ["0"]),
    ("sft", "--batch_size", ["1"], ["0"]),
    ("train", "--micro_batch_size", ["0"], ["-1"]),
    ("train", "--selfplay_plies", ["1"], ["0"]),
    ("train", "--selfplay_top_k", ["0"], ["-1"]),
    ("train", "--annotate_workers", ["1"], ["0"]),
    ("train", "--engine_depth", ["1"], ["0"]),
    ("train", "--kl_warmup_steps", ["0"], ["-1"]),
    ("train", "--log_samples", ["0"], ["-1"]),
    ("train", "--value_coef", ["0"], ["-0.01"]),
    ("train", "--kl_threshold", ["0"], ["-0.01"]),
    ("train", "--env_sft_coef", ["0"], ["-0.01"]),
    ("train", "--policy_sft_coef", ["0"], ["-0.01"]),
    ("train", "--decay_steps", ["0"], ["-1"]),
    ("sft", "--data_workers", ["0"], ["-1"]),
    ("sft", "--snapshot_every_min", ["0"], ["-0.01"]),
    ("sft", "--n_embd", ["256"], ["0"]),  # 1, the bound, is no multiple of the 4 heads
]


@pytest.mark.parametrize("script,flag,good,bad", EDGES, ids=[e[1] for e in EDGES])
def test_every_range_holds_its_edges_and_refuses_one_step_beyond(capsys, script, flag, good, bad):
    """Off-by-one bounds (< for <=, an open interval for a closed one): the edge value parses to itself, the
    value just outside is one line naming the flag."""
    shaped = flag in ("--n_layer", "--n_head", "--n_embd", "--n_positions")  # a snapshot's shape is its own
    shape = ["--model_path", "scratch"] if shaped else []  # else refused
    for value in good:
        parsed = parse_args([flag, value] + shape, script=script)
        assert getattr(parsed, flag[2:]) == type(getattr(Config(), flag[2:]))(value)
    for value in bad:
        err = one_line_exit(capsys, lambda a: parse_args(a, script=script), [flag, value] + shape)
        assert f"error: {flag} " in err and "must be" in err, err


def test_no_flags_is_the_dataclass_and_switches_and_numbers_keep_their_types():
    """The CLI's defaults are Config's (one place); --name/--no_name set booleans, and a switch that defaults to
    None (--shared_prefix_decode: generate picks by the device) stays None unless given; float flags are floats."""
    for script in ("train", "sft"):
        assert parse_args([], script=script) == Config()
    cfg = parse_args(["--no_bf16", "--bf16_cpu", "--no_skip_bad_lines", "--adaptive_kl", "--lr", "1", "--steps", "7"])
    assert (cfg.bf16, cfg.bf16_cpu, cfg.skip_bad_lines, cfg.adaptive_kl) == (False, True, False, True)
    assert type(cfg.lr) is float and cfg.lr == 1.0 and type(cfg.steps) is int and cfg.steps == 7
    assert parse_args(["--no_adaptive_kl", "--adaptive_kl"]).adaptive_kl is True  # the last one given wins
    assert Config().shared_prefix_decode is None
    for argv, want in (([], None), (["--shared_prefix_decode"], True), (["--no_shared_prefix_decode"], False)):
        assert parse_args(argv).shared_prefix_decode is want


def test_edges_of_the_combination_checks_pass(monkeypatch):
    """A micro-batch of exactly the whole batch, a 255-byte run name, a name with dots, a hub id: all fine."""
    assert parse_args(["--batch_size", "2", "--k_samples", "2", "--micro_batch_size", "4"]).micro_batch_size == 4
    assert parse_args(["--run_name", "x" * 255]).run_name == "x" * 255
    assert parse_args(["--run_name", "a.b", "--recovery_mode"]).recovery_mode
    assert parse_args(["--model_path", "owner/no-such-model"]).model_path == "owner/no-such-model"
    assert [parse_args(["--device", d]).device for d in ("cpu", "auto")] == ["cpu", "auto"]


def test_a_saved_setting_is_checked_as_its_flag():
    """A run's config.json is checked as its flags are: JSON's true is no step count (Python counts it as 1), and
    every default, null for the switch the device decides (--shared_prefix_decode) included, is a value a flag gives."""
    assert wrong_types({"steps": True, "seed": False}) == ["--steps true must be a whole number",
                                                           "--seed false must be a whole number"]
    assert wrong_types(dataclasses.asdict(Config())) == []
    assert wrong_types({"shared_prefix_decode": True}) == wrong_types({"bf16": False}) == []


def test_a_missing_held_out_file_stops_at_parse_time(capsys, monkeypatch, tmp_path):
    """mini/data/eval.jsonl (read by --eval_every) and mate_in_one.jsonl (by --eval_chess) deleted: one line before
    the model loads, not an error at the first evaluation; needed only by the flags that read them."""
    monkeypatch.setattr(flags, "EVAL_PATH", str(tmp_path / "eval.jsonl"))
    monkeypatch.setattr(flags, "MATE_PATH", str(tmp_path / "mate_in_one.jsonl"))
    err = one_line_exit(capsys, parse_args, [])
    assert f"{tmp_path / 'eval.jsonl'} is missing (a shipped held-out file, read by --eval_every)" in err, err
    assert parse_args(["--eval_every", "0"]).eval_every == 0
    (tmp_path / "eval.jsonl").write_text("")
    err = one_line_exit(capsys, parse_args, ["--eval_chess"])
    assert f"{tmp_path / 'mate_in_one.jsonl'} is missing (a shipped held-out file, read by --eval_chess)" in err, err


def test_batch_size_must_divide_among_torchrun_processes(capsys, monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert parse_args(["--batch_size", "4"]).batch_size == 4
    err = one_line_exit(capsys, parse_args, ["--batch_size", "3"])
    assert "--batch_size 3 does not divide among the 2 processes" in err


def test_cuda_device_index_against_the_device_count(capsys, monkeypatch):
    """cuda:N is refused from N = device_count on (cuda:0 ... cuda:count-1 exist)."""
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert device_problem("cuda") is None and device_problem("cuda:0") is None and device_problem("cuda:1") is None
    assert "there are 2 CUDA devices" in device_problem("cuda:2")
    assert "must be auto, cpu, cuda or cuda:N" in device_problem("cuda:x")
    for name in ("cuda:01", "cuda:\u0661", "cuda:+1", "cuda:", "cudax", "cuda:1x"):  # torch.device("cuda:01") fails
        assert device_problem(name) == f"--device {name!r} must be auto, cpu, cuda or cuda:N"


# ----------------------------------------------------------------------------- fuzz

def fuzz_argv(rng, data_file):
    """A random command line: flags with good, edge and bad values."""
    values = {
        "--k_samples": ["0", "1", "2", "3", "-1", "x"], "--batch_size": ["0", "1", "2", "-2", "1.5"],
        "--max_new_tokens": ["0", "1", "8", "-1"], "--temperature": ["0", "0.7", "-1", "inf", "1"],
        "--top_k": ["-1", "0", "5"], "--micro_batch_size": ["0", "1", "3", "1000"], "--lr": ["0", "1e-5", "nan", "-1"],
        "--mix_env_ratio": ["0", "0.5", "1", "1.01", "-0.1"], "--data_source": ["pool", "file", "generate", "web"],
        "--data_file": [data_file, ""], "--device": ["cpu", "auto", "cuda", "cuda:3", "tpu"],
        "--num_iterations": ["0", "1", "2"], "--clip_eps_low": ["0.2", "1.5", "-0.1"], "--kl_coef": ["0", "0.1", "-1"],
        "--loss_type": ["grpo", "dapo", "dr_grpo", "ppo"], "--kl_type": ["k3", "forward", "js"],
        "--eval_every": ["0", "-1"], "--eval_n": ["0", "1"], "--keep_last": ["-1", "0", "2"],
        "--memory_fraction": ["0", "0.5", "2"], "--seed": ["0", "-1", "7", "99999999999"], "--gamma": ["0.9", "1.1"],
        "--baseline_type": ["group_mean", "ema", "adaptive"], "--scale_rewards": ["group", "batch", "none", "all"],
        "--warmup_steps": ["0", "-3", "2"], "--time_limit_min": ["0", "-1", "0.5"], "--score_workers": ["0", "-1"],
        "--adam_beta1": ["0.9", "1", "2"], "--reward_shaping": ["continuous", "graduated"],
    }
    switches = ["--adaptive_kl", "--no_bf16", "--use_gae", "--grad_checkpointing", "--compile", "--auto_resume",
                "--overwrite", "--recovery_mode"]
    argv = []
    for flag in rng.sample(sorted(values), rng.randint(0, 6)):
        argv += [flag, rng.choice(values[flag])]
    argv += rng.sample(switches, rng.randint(0, 2))
    return argv


@pytest.mark.long(70)
def test_fuzz_every_command_line_starts_or_is_one_line(tiny, tmp_path, capsys):
    data = tmp_path / "data.txt"
    data.write_text("\n".join(P_LINES) + "\n")
    rng, started, refused = random.Random(0), 0, 0
    for case in range(300):
        argv = fuzz_argv(rng, str(data))
        try:
            cfg = parse_args(argv)
        except SystemExit as e:
            err = capsys.readouterr().err
            assert e.code == 2 and err.count("\n") == 1 and "Traceback" not in err, (argv, err)
            refused += 1
            continue
        assert isinstance(cfg, Config)
        if started < 12 and cfg.data_source != "generate" and not cfg.auto_resume and not cfg.recovery_mode:
            # it starts: --steps 0 loads everything, saves the start and the final model
            run = argv + ["--model_path", tiny, "--log_dir", str(tmp_path), "--run_name", f"f{case}", "--steps", "0",
                          "--eval_every", "0"]
            code = train.main(run)
            assert code == 0, (run, capsys.readouterr().err)
            started += 1
    assert started == 12 and refused > 100


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
