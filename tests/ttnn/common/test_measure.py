# SPDX-License-Identifier: Apache-2.0
"""models.common.measure: a child's reported peak RSS is its own, never its parent's.

Real processes throughout: a parent that holds 1 GiB starts a measured child, and the child's
``VmHWM`` must be the small figure of a bare interpreter while its ``ru_maxrss`` (the measure the
project used before) shows the parent's gigabyte.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from models.common.measure import MIB, MeasureError, peak_rss_bytes, peak_rss_mib, rss_bytes, run_measured
from models.testing import REPO_ROOT

PARENT_HOLDS = 1 << 30

# A parent that touches PARENT_HOLDS bytes, then runs a measured child (which reports its own
# VmHWM and, for contrast, its ru_maxrss) and prints what it got and its own peak.
PARENT = r"""
import json, sys
from models.common.measure import peak_rss_mib, run_measured
held = bytearray(b"\x01") * int(sys.argv[1])  # written, so every page is resident
child = ("import resource; from models.common.measure import report; "
         "report({'ru_maxrss_mib': resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024})")
result = run_measured([sys.executable, "-c", child])
print(json.dumps({"parent_peak_mib": peak_rss_mib(), "child": result}))
"""


def _python(code: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.run([sys.executable, "-c", code, *args], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, check=True)


def test_child_peak_does_not_include_the_parents() -> None:
    done = _python(PARENT, str(PARENT_HOLDS))
    measured = json.loads(done.stdout.strip().splitlines()[-1])
    parent, child = measured["parent_peak_mib"], measured["child"]
    assert parent >= PARENT_HOLDS / MIB
    assert child["peak_rss_mib"] < 200, child  # a bare interpreter and this module: tens of MiB
    assert child["peak_rss_mib"] < parent - PARENT_HOLDS / MIB / 2
    # The trap this module exists for: the kernel's ru_maxrss of the same child carries the parent's peak.
    assert child["ru_maxrss_mib"] >= PARENT_HOLDS / MIB, child
    assert child["process_s"] > 0


def test_peak_counts_what_the_process_touched_after_it_freed_it() -> None:
    code = (
        "import json\n"
        "from models.common.measure import peak_rss_bytes, rss_bytes\n"
        "before = peak_rss_bytes()\n"
        "held = bytearray(b'\\x01') * (300 << 20)\n"
        "during = rss_bytes()\n"
        "del held\n"
        "print(json.dumps({'before': before, 'during': during, 'peak': peak_rss_bytes(), 'after': rss_bytes()}))\n"
    )
    figures = json.loads(_python(code).stdout.strip().splitlines()[-1])
    assert figures["during"] >= figures["before"] + (300 << 20)
    assert figures["peak"] >= figures["during"] - (4 << 20)  # the kernel's RSS counters lag by a few pages
    assert figures["after"] < figures["peak"] - (200 << 20)  # freed, yet the peak remembers it


def test_this_process_and_another_by_pid() -> None:
    assert peak_rss_bytes() >= rss_bytes() - (4 << 20) > 0
    assert peak_rss_mib() == pytest.approx(peak_rss_bytes() / MIB, rel=0.05)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert 0 < peak_rss_bytes(sleeper.pid) < peak_rss_bytes()
    finally:
        sleeper.kill()
        sleeper.wait()


def test_no_such_process_is_a_clear_error() -> None:
    with pytest.raises(MeasureError, match="no such process"):
        peak_rss_bytes(2**22 + 12345)  # above the default pid_max


def test_failed_or_silent_child_is_a_clear_error() -> None:
    with pytest.raises(MeasureError, match=r"exited with 3:\n.*boom"):
        run_measured([sys.executable, "-c", "import sys; sys.stderr.write('boom'); sys.exit(3)"])
    with pytest.raises(MeasureError, match="printed no report line"):
        run_measured([sys.executable, "-c", "print('hello')"])


def test_shown_log_is_not_captured_and_failure_points_to_it() -> None:
    code = ("import sys\n"
            "from models.common.measure import MeasureError, run_measured\n"
            "child = [sys.executable, '-c', 'import sys; sys.stderr.write(\"child-\" + \"log-line\\\\n\"); sys.exit(4)']\n"
            "try:\n"
            "    run_measured(child, show_log=True)\n"
            "except MeasureError as error:\n"
            "    print('ERROR', str(error).replace(chr(10), ' '))\n")
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert "child-log-line" in done.stderr  # went straight to the parent's stderr
    assert "exited with 4" in done.stdout and "its log is above" in done.stdout
    assert "child-log-line" not in done.stdout
