"""Ctrl-C and SIGTERM stop the test suite, also when they land in a run under test: a run takes the signal
over to finish its step and save (mini/runs.py), so after that test the signal is given its usual effect.

Under `pytest -n N` (pytest-xdist, the README's command) each worker, and every process a test starts, gets its
share of the cores: N workers of torch's default thread count each would fight over the same cores. And the
files are handed out longest first (a file's length: the seconds its tests' `long(seconds)` marks declare),
so that the workers share out the short files at the end instead of one finishing a long one alone.

A test that starts a run in the background takes it from `spawn`, which ends the run and whatever it started when
the test ends: a test that fails (a timeout, an assertion) while its run is still going leaves nothing behind to
take the cores from the tests after it."""
import collections
import contextlib
import os
import signal
import subprocess

import pytest
import torch

from mini import runs

if "PYTEST_XDIST_WORKER_COUNT" in os.environ and "OMP_NUM_THREADS" not in os.environ:
    threads = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ["OMP_NUM_THREADS"] = str(threads)  # for the processes the tests start
    torch.set_num_threads(threads)


def pytest_collection_modifyitems(items):
    seconds = collections.Counter()
    for item in items:
        if mark := item.get_closest_marker("long"):
            if not mark.args:
                raise pytest.UsageError(f"{item.nodeid}: give @pytest.mark.long the test's seconds, as @pytest.mark.long(60)")
            seconds[item.path] += mark.args[0]
    items.sort(key=lambda item: -seconds[item.path])  # stable, and a file's tests stay together


@pytest.fixture(autouse=True)
def signals_stop_the_suite(request):
    runs.caught_signals.clear()
    yield
    caught = list(runs.caught_signals)
    runs.caught_signals.clear()
    if not caught or request.node.get_closest_marker("sends_signals"):
        return
    if caught[0] == signal.SIGINT:
        raise KeyboardInterrupt  # pytest stops the session and reports what ran
    signal.signal(caught[0], signal.SIG_DFL)  # SIGTERM: the process ends as it would have without the run
    os.kill(os.getpid(), caught[0])


@pytest.fixture
def spawn():
    """subprocess.Popen(cmd, **kwargs) in a process group of its own; the group is killed when the test ends."""
    started = []

    def start(cmd, **kwargs):
        started.append(subprocess.Popen(cmd, start_new_session=True, **kwargs))
        return started[-1]
    yield start
    for proc in started:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()  # reaps it and closes its pipes
