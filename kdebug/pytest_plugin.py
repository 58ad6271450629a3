"""kdebug's pytest plugin (registered through the ``pytest11`` entry point).

Two ways to write a determinism test:

    @pytest.mark.kdebug_deterministic(runs=2)
    def test_step_is_reproducible():
        step(x)                       # the whole test body runs `runs` times, recorded

    def test_step(kdebug_determinism):
        kdebug_determinism.check(step, x, runs=3)

Either fails with the first-divergence report; the report also appears in
the failed test's "kdebug first divergence" section.
"""
from __future__ import annotations

import pytest

SECTION = "kdebug first divergence"


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "kdebug_deterministic(runs=2, hash_fn='bitwise'): run the test body `runs` times under a recording "
        "kdebug.DebugMode and fail with the first-divergence report if the runs' kernels differ",
    )


class Determinism:
    """The ``kdebug_determinism`` fixture."""

    def __init__(self, item) -> None:
        self._item = item
        self.reports: list = []

    def check(self, fn, *args, runs: int = 2, hash_fn="bitwise", **kwargs):
        """Runs fn(*args, **kwargs) ``runs`` times and asserts the runs' kernels
        and ops match launch by launch (kdebug.assert_deterministic)."""
        from kdebug.compare import _recorded_reports

        if runs < 2:
            raise ValueError("kdebug_determinism.check needs runs >= 2")
        reports = _recorded_reports(fn, args, kwargs, runs, hash_fn)
        self.reports.extend(reports)
        rep = reports[-1]
        if not rep.ok:
            _attach(self._item, str(rep))
            pytest.fail("kdebug: runs differ\n" + str(rep), pytrace=False)
        if rep.hashed == 0:
            pytest.fail("kdebug: nothing was hashed: does fn run compiled code on this thread?\n" + str(rep),
                        pytrace=False)
        return self.reports


def _attach(item, text: str) -> None:
    item.stash.setdefault(_KEY, []).append(text)


_KEY = pytest.StashKey[list]()


@pytest.fixture
def kdebug_determinism(request) -> Determinism:
    """Checks that a function's compiled kernels are bitwise reproducible."""
    return Determinism(request.node)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    marker = pyfuncitem.get_closest_marker("kdebug_deterministic")
    if marker is None:
        return None
    runs = int(marker.kwargs.get("runs", marker.args[0] if marker.args else 2))
    hash_fn = marker.kwargs.get("hash_fn", "bitwise")
    if runs < 2:
        raise pytest.UsageError("kdebug_deterministic(runs=...) needs runs >= 2")
    from kdebug.compare import _recorded_reports

    funcargs = {k: pyfuncitem.funcargs[k] for k in pyfuncitem._fixtureinfo.argnames}
    rep = _recorded_reports(pyfuncitem.obj, (), funcargs, runs, hash_fn)[-1]
    if not rep.ok:
        _attach(pyfuncitem, str(rep))
        pytest.fail("kdebug: the test body is not deterministic\n" + str(rep), pytrace=False)
    if rep.hashed == 0:
        pytest.fail("kdebug: nothing was hashed in the test body: does it run compiled code on this thread?",
                    pytrace=False)
    return True  # the body ran (runs times): pytest's own call must not run it again


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    texts = item.stash.get(_KEY, None)
    if texts and rep.when == "call":
        for t in texts:
            rep.sections.append((SECTION, t))
