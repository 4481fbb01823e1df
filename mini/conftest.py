"""Ctrl-C and SIGTERM stop the test suite, also when they land in a run under test: a run takes the signal
over to finish its step and save (mini/runs.py), so after that test the signal is given its usual effect."""
import os
import signal

import pytest

from mini import runs


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
