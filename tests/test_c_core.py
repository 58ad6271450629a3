"""The Python-free C core (ring, string table, store, renderer) has its own C
tests; they run here, freshly built under AddressSanitizer and UBSan, and the
ring's concurrent writers and reader under ThreadSanitizer."""
import os
import re
import shutil
import subprocess

import pytest

CSRC = os.path.join(os.path.dirname(__file__), "..", "csrc")


def _make(target: str, build) -> tuple[int, str]:
    """`make -C csrc TARGET` into a fresh build folder: (exit status, output)."""
    if shutil.which("make") is None or shutil.which(os.environ.get("CC", "cc")) is None:
        pytest.fail("the C core tests need make and a C compiler (apt-get install build-essential)")
    r = subprocess.run(["make", "-C", CSRC, target, f"BUILD={build}"], capture_output=True, text=True, timeout=600)
    return r.returncode, r.stdout + r.stderr


def test_c_core_under_asan_and_ubsan(tmp_path):
    rc, out = _make("test", tmp_path)
    assert rc == 0, out
    assert "-fsanitize=address,undefined" in out  # really built sanitized, not stale
    m = re.search(r"(\d+) checks, (\d+) failed", out)
    assert m is not None, out
    assert int(m.group(1)) > 1000 and int(m.group(2)) == 0, out


def test_ring_under_threadsanitizer(tmp_path):
    # Several writer threads and a reader draining at the same time
    # (Note [Ring concurrency]); about a second on CI.
    rc, out = _make("tsan", tmp_path)
    assert "-fsanitize=thread" in out  # really built under TSan, not stale
    assert "ThreadSanitizer" not in out, out  # no race (or TSan failing to start)
    assert rc == 0, out
    m = re.search(r"(\d+) checks, (\d+) failed", out)
    assert m is not None, out
    assert int(m.group(1)) > 20 and int(m.group(2)) == 0, out
