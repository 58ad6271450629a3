"""kdebug's pytest plugin (registered through the ``pytest11`` entry point).

Two ways to write a determinism test:

    @pytest.mark.kdebug_deterministic(runs=2)
    def test_step_is_reproducible():
        step(x)                       # the whole test body runs `runs` times, recorded

    def test_step(kdebug_determinism):
        kdebug_determinism.check(step, x, runs=3)

Either fails with the first-divergence report; the report also appears in
the failed test's "kdebug first divergence" section.

And two ways to check that compiled code computes as well as eager
(Note [Accuracy check], kdebug/accuracy.py):

    @pytest.mark.kdebug_matches_eager(rtol=1e-4, atol=1e-5)
    def test_model_matches_eager():
        compiled_model(x)             # the body runs once, every graph call checked

    def test_model(kdebug_accuracy):
        kdebug_accuracy.check(model, x, rtol=1e-4, atol=1e-5)   # compiles model itself

Either fails with the culprit report when a kernel computes worse than eager
against float64 (by `factor`, default 4), and, when rtol or atol is given,
when a kernel's output leaves that tolerance of eager from inputs within it.
"""
from __future__ import annotations

import pytest

SECTION = "kdebug first divergence"
ACCURACY_SECTION = "kdebug accuracy"


def pytest_configure(config) -> None:
    config.addinivalue_line(
        "markers",
        "kdebug_deterministic(runs=2, hash_fn='bitwise', all_threads=False): run the test body `runs` times under "
        "a recording kdebug.DebugMode and fail with the first-divergence report if the runs' kernels differ, or "
        "with no verdict if they match but a recording is incomplete (all_threads=True records every thread)",
    )
    config.addinivalue_line(
        "markers",
        "kdebug_matches_eager(rtol=None, atol=None, factor=4.0, calls_per_graph=1): run the test body once "
        "under kdebug's accuracy check and fail with the culprit report if a compiled kernel computes worse "
        "than eager against float64, or (rtol/atol given) leaves that tolerance of eager",
    )


def _accuracy_failure(report, tolerances_given: bool) -> str | None:
    """Why an accuracy report fails a test, or None."""
    if report.graph_calls_checked == 0:
        return "kdebug: no compiled graph was called: nothing to check"
    if report.compared() == 0:
        return "kdebug: compiled graphs ran but no buffer they wrote could be compared with eager"
    if report.culprit is not None:
        return "kdebug: a compiled kernel computes worse than eager"
    if getattr(report, "no_verdict", False):
        return "kdebug: kernel outputs over every budget of the check were not recorded: no verdict"
    if tolerances_given and report.first_divergent is not None:
        return "kdebug: a compiled kernel's output is outside the given tolerance of eager"
    if tolerances_given and not report.outputs_within_tolerance():
        return "kdebug: the compiled output is outside the given tolerance of eager"
    return None


class Accuracy:
    """The ``kdebug_accuracy`` fixture."""

    def __init__(self, item) -> None:
        self._item = item
        self.reports: list = []

    def check(self, fn, *args, rtol=None, atol=None, factor: float = 4.0, **kwargs):
        """kdebug.compare_eager(fn, *args, ...); fails the test with the
        culprit report (see the module docstring for when)."""
        from kdebug.accuracy import compare_eager

        rep = compare_eager(fn, *args, rtol=rtol, atol=atol, factor=factor, **kwargs)
        self.reports.append(rep)
        why = _accuracy_failure(rep, rtol is not None or atol is not None)
        if why:
            _attach(self._item, rep.summary(), ACCURACY_SECTION)
            pytest.fail(why + "\n" + rep.summary(), pytrace=False)
        return rep


@pytest.fixture
def kdebug_accuracy(request) -> Accuracy:
    """Checks that a function's compiled kernels compute as well as eager."""
    return Accuracy(request.node)


def _run_matches_eager(pyfuncitem, marker) -> bool:
    from kdebug.accuracy import check

    kw = dict(marker.kwargs)
    unknown = set(kw) - {"rtol", "atol", "factor", "calls_per_graph"}
    if unknown or marker.args:
        raise pytest.UsageError("kdebug_matches_eager takes only the keywords rtol, atol, factor, calls_per_graph "
                                f"(got {sorted(unknown) or list(marker.args)})")
    funcargs = {k: pyfuncitem.funcargs[k] for k in pyfuncitem._fixtureinfo.argnames}
    try:
        rep = check(lambda: pyfuncitem.obj(**funcargs), **kw)
    except ValueError as e:
        raise pytest.UsageError(f"kdebug_matches_eager: {e}") from e
    why = _accuracy_failure(rep, "rtol" in kw or "atol" in kw)
    if why:
        _attach(pyfuncitem, rep.summary(), ACCURACY_SECTION)
        pytest.fail(why + "\n" + rep.summary(), pytrace=False)
    return True


class Determinism:
    """The ``kdebug_determinism`` fixture."""

    def __init__(self, item) -> None:
        self._item = item
        self.reports: list = []

    def check(self, fn, *args, runs: int = 2, hash_fn="bitwise", all_threads: bool = False, **kwargs):
        """Runs fn(*args, **kwargs) ``runs`` times and asserts the runs' kernels
        and ops match launch by launch (kdebug.assert_deterministic;
        ``all_threads=True`` records compiled launches on every thread)."""
        from kdebug.compare import _recorded_reports

        if runs < 2:
            raise ValueError("kdebug_determinism.check needs runs >= 2")
        reports = _recorded_reports(fn, args, kwargs, runs, hash_fn, all_threads)
        self.reports.extend(reports)
        _fail_on(self._item, reports, "kdebug: runs differ\n",
                 "kdebug: nothing was hashed: does fn run compiled code on this thread?\n")
        return self.reports


def _fail_on(item, reports: list, differ: str, nothing: str) -> None:
    """Fails the test for the reports' first failure (kdebug.compare._failure)."""
    from kdebug.compare import NO_VERDICT, _failure

    failed = _failure(reports)
    if failed is None:
        return
    what, rep = failed
    if what != "nothing hashed":
        _attach(item, str(rep))
    head = {"differ": differ, "nothing hashed": nothing, "no verdict": NO_VERDICT}[what]
    pytest.fail(head + str(rep), pytrace=False)


def _attach(item, text: str, section: str = SECTION) -> None:
    item.stash.setdefault(_KEY, []).append((section, text))


_KEY = pytest.StashKey[list]()


@pytest.fixture
def kdebug_determinism(request) -> Determinism:
    """Checks that a function's compiled kernels are bitwise reproducible."""
    return Determinism(request.node)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    accuracy = pyfuncitem.get_closest_marker("kdebug_matches_eager")
    marker = pyfuncitem.get_closest_marker("kdebug_deterministic")
    if accuracy is not None:
        _run_matches_eager(pyfuncitem, accuracy)  # fails the test, or returns: then the other check too
    if marker is None:
        return True if accuracy is not None else None
    runs = int(marker.kwargs.get("runs", marker.args[0] if marker.args else 2))
    hash_fn = marker.kwargs.get("hash_fn", "bitwise")
    if runs < 2:
        raise pytest.UsageError("kdebug_deterministic(runs=...) needs runs >= 2")
    from kdebug.compare import _recorded_reports

    funcargs = {k: pyfuncitem.funcargs[k] for k in pyfuncitem._fixtureinfo.argnames}
    all_threads = bool(marker.kwargs.get("all_threads", False))
    reports = _recorded_reports(pyfuncitem.obj, (), funcargs, runs, hash_fn, all_threads)
    _fail_on(pyfuncitem, reports, "kdebug: the test body is not deterministic\n",
             "kdebug: nothing was hashed in the test body: does it run compiled code on this thread?\n")
    return True  # the body ran (runs times): pytest's own call must not run it again


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    texts = item.stash.get(_KEY, None)
    if texts and rep.when == "call":
        for section, t in texts:
            rep.sections.append((section, t))
