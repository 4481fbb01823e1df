"""The step benchmark runs end to end on a CPU-sized model (CI exercises the script; no timing is asserted).

    python mini/test_bench.py
"""
import re
import subprocess
import sys

import pytest


def test_bench_runs_on_cpu():
    out = subprocess.run([sys.executable, "-m", "mini.bench", "--n_layer", "1", "--n_head", "1", "--n_embd", "32",
                          "--prompts", "2", "--k", "3", "--new_tokens", "8", "--steps", "1", "--score_workers", "1"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "2 prompts x 3 = 6 completions" in out.stdout
    for phase in ("generate", "ref_logprobs", "score", "update"):
        assert re.search(rf"{phase}\s+\d+\.\d+ s", out.stdout), phase
    assert float(re.search(r"end to end\s+([\d.]+) completions/s", out.stdout).group(1)) > 0
    assert "transformers" in out.stdout and "x faster" in out.stdout


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
