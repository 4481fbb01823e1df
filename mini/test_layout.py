"""The layout: two floors in one flat folder. The library is what `python mini/train.py` imports, layered so
that data flows one way (prompt -> rollout -> reward -> loss -> update) with no import cycle; the tools are
commands built on it. A library module imports only library modules below it, never a tool.

    python mini/test_layout.py
"""
import ast
import glob
import os
import subprocess
import sys

import pytest

# bottom to top: a library module may import only the library modules listed before it
LIBRARY = [
    "config", "flags", "runtime", "distributed",  # settings; their command line; device, autocast, LR schedule; torchrun
    "tokenizer", "model", "sampler", "loader",  # GPT-2, its decoding, its snapshots
    "formats", "stockfish", "positions", "dataset",  # RookWorld text, Stockfish, positions, prompt sources
    "reward_scorer", "logprobs", "grpo", "rollout",  # rewards; log-probs, the objective as tensor functions; a step's batch
    "runs", "report", "plots",             # run directories, checkpoints and resume; dashboards (TRL's names); PNGs
    "evaluate", "games", "selfplay",       # held-out metrics; games between players; on-policy training positions
    "autobatch",                           # --auto_batch_size: the largest batch that fits
    "train",                               # the GRPO loop
]
# commands built on the library, which none of it imports; a tool may import the library and the tools before it
TOOLS = ["annotate", "chess_eval", "sft", "bench", "mutants"]
HERE = os.path.dirname(os.path.abspath(__file__))


def mini_modules(node):
    """Names of the mini modules that one AST node imports (none for a node that is no import)."""
    if isinstance(node, ast.ImportFrom) and node.module == "mini":
        return {a.name for a in node.names}
    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mini."):
        return {node.module.split(".")[1]}
    if isinstance(node, ast.Import):
        return {a.name.split(".")[1] for a in node.names if a.name.startswith("mini.")}
    return set()


def mini_imports(path):
    """Names of the mini modules that a file imports."""
    return set().union(*map(mini_modules, ast.walk(ast.parse(open(path, encoding="utf-8").read()))))


def modules():
    return sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(HERE, "*.py"))
                  if not os.path.basename(p).startswith(("test_", "__", "conftest")))


def test_every_module_is_on_a_floor():
    assert set(modules()) == set(LIBRARY) | set(TOOLS), \
        "place a new module in LIBRARY or TOOLS (or remove a deleted one from it)"
    assert not set(LIBRARY) & set(TOOLS)


@pytest.mark.parametrize("name", LIBRARY + TOOLS)
def test_imports_go_down_only(name):
    order = LIBRARY + TOOLS
    up = mini_imports(os.path.join(HERE, name + ".py")) - set(order[:order.index(name)])
    assert not up, f"{name}.py imports {sorted(up)}, which are not below it"


@pytest.mark.parametrize("name", LIBRARY)
def test_the_library_imports_no_tool(name):
    tools = mini_imports(os.path.join(HERE, name + ".py")) & set(TOOLS)
    assert not tools, f"library module {name}.py imports the tool(s) {sorted(tools)}: move what it needs into the library"


@pytest.mark.parametrize("path", sorted(glob.glob(os.path.join(HERE, "test_*.py"))), ids=os.path.basename)
def test_a_test_file_runs_on_its_own_and_ends_with_that(path):
    """`python mini/test_X.py` runs the file's tests through its `if __name__ == "__main__"` block, the file's
    last statement: a test is never appended below the entry point, where a reader stops."""
    body = ast.parse(open(path, encoding="utf-8").read()).body
    guards = [i for i, node in enumerate(body) if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)]
    assert guards == [len(body) - 1], f"{os.path.basename(path)}: end the file with one __main__ block, after every test"


def test_every_mutant_still_applies():
    """mutants.py's names are unique, its old texts each occur exactly once in their files, and the tests named to
    catch each exist: a change that moves one or renames a test makes it stale, and a stale mutant tests nothing
    (python mini/mutants.py NAME then runs it)."""
    from mini.mutants import MUTANTS
    sources = {}  # file under the repository root -> its text ("" when it does not exist), each read once

    def source(path):
        if path not in sources:
            full = os.path.join(HERE, "..", path)
            sources[path] = open(full, encoding="utf-8").read() if os.path.exists(full) else ""
        return sources[path]
    stale, unknown_tests = [], []
    for m in MUTANTS:
        if source(os.path.join("mini", m.file)).count(m.old) != 1:
            stale.append(m.name)
        for test in m.tests:
            path, _, function = test.partition("::")
            if not source(path) or (function and f"def {function.split('[')[0]}(" not in source(path)):
                unknown_tests.append(f"{m.name}: {test}")
    names = [m.name for m in MUTANTS]
    assert len(set(names)) == len(names), f"mutants named twice: {sorted({n for n in names if names.count(n) > 1})}"
    assert not stale, f"stale mutants (their old text is gone or not unique): {stale}"
    assert not unknown_tests, f"mutants naming tests that do not exist: {unknown_tests}"


def test_the_mutant_list_read_through_head_ends_without_a_traceback():
    """`python mini/mutants.py --list | head` is how the list gets read: a reader that closes the pipe early (the
    list is longer than a pipe holds) was a BrokenPipeError traceback; it ends quietly, as the scripts do."""
    p = subprocess.Popen([sys.executable, os.path.join(HERE, "mutants.py"), "--list"], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().startswith("adv_sign ")
    p.stdout.close()
    err = p.stderr.read()
    assert p.wait(timeout=60) == 141 and err == ""


def scripts():
    """The modules a user runs as `python mini/NAME.py`: those with a `__main__` block."""
    def runs(name):
        body = ast.parse(open(os.path.join(HERE, name + ".py"), encoding="utf-8").read()).body
        return any(isinstance(node, ast.If) and "__main__" in ast.unparse(node.test) for node in body)
    return [name for name in modules() if runs(name)]


@pytest.mark.parametrize("name", scripts())
def test_a_script_imports_mini_from_its_checkout_before_anything_of_mini(name):
    """`python mini/train.py` puts mini/, not the repository root, on sys.path: without `pip install -e .` every
    script stopped at its first import of the package. Each puts its checkout first, before that import."""
    body = ast.parse(open(os.path.join(HERE, name + ".py"), encoding="utf-8").read()).body
    guard = [i for i, node in enumerate(body) if isinstance(node, ast.If) and ast.unparse(node.test) == "not __package__"
             and "sys.path.insert(0" in ast.unparse(node)]
    first_mini = min(i for i, node in enumerate(body) if mini_modules(node))
    assert guard and guard[0] < first_mini, f"{name}.py: put the checkout on sys.path before importing mini"


def test_a_script_runs_from_a_checkout_that_is_not_installed(tmp_path):
    """This interpreter's path without .pth files (python -S) and without the checkout itself: the editable install
    of `mini` is gone, torch and python-chess stay (a venv's, the user's or the system's site-packages); run from
    another folder, evaluate.py still finds its package and prints its help."""
    root = os.path.realpath(os.path.join(HERE, ".."))
    kept = [p for p in sys.path if p and os.path.isdir(p) and os.path.realpath(p) != root]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(kept))
    p = subprocess.run([sys.executable, "-S", os.path.join(HERE, "evaluate.py"), "--help"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.startswith("usage: evaluate.py"), p.stderr[-500:]


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
