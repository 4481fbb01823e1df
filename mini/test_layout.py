"""The layout: modules are layered so that data flows one way (prompt -> rollout -> reward -> loss ->
update), with no import cycle, and the entry-point scripts are imported by no module.

    python mini/test_layout.py
"""
import ast
import glob
import os

import pytest

# bottom to top: a module may import only modules listed before it
LAYERS = [
    "config", "runtime", "distributed",    # settings; device, autocast, LR schedule, seeding; torchrun
    "tokenizer", "model", "sampler", "loader",  # GPT-2, its decoding, its snapshots
    "formats", "positions", "annotate", "dataset",  # RookWorld text, positions, Stockfish labels, prompt sources
    "reward_scorer", "grpo",               # rewards; the objective as tensor functions
    "runs", "report", "plots",             # run directories; their dashboards (TRL's names) and PNGs
    "evaluate", "chess_eval", "selfplay",  # held-out metrics; chess skill; on-policy training positions
    "train",                               # the GRPO loop
    "sft", "bench", "mutants",             # scripts
]
SCRIPTS = {"sft", "bench", "mutants"}  # entry points only (train, evaluate and annotate have a CLI and are imported too)
HERE = os.path.dirname(os.path.abspath(__file__))


def mini_imports(path):
    """Names of the mini modules that a file imports."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "mini":
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("mini."):
            out.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("mini.")}
    return out


def modules():
    return sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(HERE, "*.py"))
                  if not os.path.basename(p).startswith(("test_", "__")))


def test_every_module_has_a_layer():
    assert set(modules()) == set(LAYERS), "place a new module in LAYERS (or remove a deleted one from it)"


@pytest.mark.parametrize("name", LAYERS)
def test_imports_go_down_only(name):
    below = set(LAYERS[:LAYERS.index(name)])
    up = mini_imports(os.path.join(HERE, name + ".py")) - below
    assert not up, f"{name}.py imports {sorted(up)}, which are not below it"


def test_no_module_imports_a_script():
    for name in modules():
        assert not mini_imports(os.path.join(HERE, name + ".py")) & SCRIPTS, name


if __name__ == "__main__":
    import sys
    sys.exit(pytest.main([__file__, "-q"]))
