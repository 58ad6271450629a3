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

Note [Marker arguments]
Every marker of this plugin has its arguments checked, by one function
(_marker_arguments, from the table _MARKERS), in pytest_runtest_setup: before
the test's fixtures are made and before its body runs.  Keywords only, each
known by name, each of its type and in its range, nothing coerced (Note [Flag
validation] in kdebug/_flags.py: bool("False") is True, int("three") raises
deep inside the plugin, and a misspelt `run=5` would be a silent default).  A
bad one makes that test an error whose one line names the marker, the
argument, what it got and what is allowed; the other tests run.  An async def
test is refused the same way: the hook would only make its coroutine, which
nothing awaits, so no compiled code would run and the check would have
nothing to say.  Running it here (asyncio.run per run) would bypass
pytest-asyncio's or anyio's event loop and their async fixtures, so the error
says how to run the coroutine from a plain test instead.  The fixtures'
check() methods take the same arguments through the same table and raise the
TypeError / ValueError directly, at the caller's line.
"""
from __future__ import annotations

import difflib
import inspect
import math
import numbers
from typing import Any, Callable

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


def _what(value: Any) -> str:
    return f"{type(value).__name__} {value!r}"


def _count(lo: int, meaning: str) -> Callable[[str, str, Any], int]:
    def check(where: str, name: str, value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise TypeError(f"{where}: {name} must be an int >= {lo} ({meaning}), not the {_what(value)}")
        if value < lo:
            raise ValueError(f"{where}: {name} must be an int >= {lo} ({meaning}), not {value!r}")
        return int(value)
    return check


def _real(allowed: str, ok: Callable[[float], bool], none_ok: bool = False) -> Callable[[str, str, Any], Any]:
    def check(where: str, name: str, value: Any):
        if value is None and none_ok:
            return None
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise TypeError(f"{where}: {name} must be {allowed}, not the {_what(value)}")
        if not (math.isfinite(value) and ok(value)):
            raise ValueError(f"{where}: {name} must be {allowed}, not {value!r}")
        return value
    return check


def _boolean(where: str, name: str, value: Any) -> bool:
    from kdebug import _flags

    return _flags.boolean(where, name, value)


def _hash_fn(where: str, name: str, value: Any):
    from kdebug import hashing

    try:
        hashing.parse(value)
    except (TypeError, ValueError) as e:
        raise type(e)(f"{where}: {e}") from None
    return value


# Note [Marker arguments]: each marker's keyword arguments, their defaults and checks
_MARKERS: dict[str, dict[str, tuple[Any, Callable[[str, str, Any], Any]]]] = {
    "kdebug_deterministic": {
        "runs": (2, _count(2, "how many times the body runs, recorded")),
        "hash_fn": ("bitwise", _hash_fn),
        "all_threads": (False, _boolean),
    },
    "kdebug_matches_eager": {
        "rtol": (None, _real("None or a finite number >= 0", lambda v: v >= 0, none_ok=True)),
        "atol": (None, _real("None or a finite number >= 0", lambda v: v >= 0, none_ok=True)),
        "factor": (4.0, _real("a finite number > 1 (how many times eager's error a kernel's must exceed)",
                              lambda v: v > 1)),
        "calls_per_graph": (1, _count(1, "the calls of each compiled graph that are checked")),
    },
}


def _signature(name: str) -> str:
    return f"{name}({', '.join(f'{k}={d!r}' for k, (d, _) in _MARKERS[name].items())})"


def _checked_arguments(where: str, name: str, args: tuple, kwargs: dict) -> dict[str, Any]:
    """The arguments of marker or fixture `name`, checked and with the
    defaults filled in (Note [Marker arguments]); TypeError / ValueError
    naming `where`, the argument and what is allowed."""
    spec = _MARKERS[name]
    if args:
        hint = f" (write {name}({next(iter(spec))}={args[0]!r}))" if len(args) == 1 else ""
        raise TypeError(f"{where} takes keyword arguments only, not the positional {', '.join(map(repr, args))}"
                        f"{hint}; its arguments: {_signature(name)}")
    for k in kwargs:
        if k not in spec:
            close = difflib.get_close_matches(k, spec, n=1)
            raise TypeError(f"{where} has no argument {k!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
                            + f"; its arguments: {_signature(name)}")
    return {k: check(where, k, kwargs[k]) if k in kwargs else default for k, (default, check) in spec.items()}


def _is_async(fn: Any) -> bool:
    fn = inspect.unwrap(fn) if callable(fn) else fn
    return inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn)


def _marker_arguments(item, name: str) -> dict[str, Any] | None:
    """The checked arguments of item's marker `name`, or None when it has none
    of that name; fails the test (one line, no traceback) when they are bad."""
    marker = item.get_closest_marker(name)
    if marker is None:
        return None
    where = f"@pytest.mark.{name}"
    if _is_async(getattr(item, "obj", None)):
        pytest.fail(f"{where} does not support async def tests: the body would only make a coroutine that nothing "
                    "awaits, so no compiled code would run. Make the test a plain def that runs the coroutine, "
                    "e.g. asyncio.run(body()), inside its body", pytrace=False)
    try:
        return _checked_arguments(where, name, marker.args, marker.kwargs)
    except (TypeError, ValueError) as e:
        why = str(e)
    pytest.fail(why, pytrace=False)  # outside the except: no chained traceback under the one line


_ARGS_KEY = pytest.StashKey[dict]()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item) -> None:
    """Checks the kdebug markers' arguments before any fixture is made (Note [Marker arguments])."""
    checked = {name: _marker_arguments(item, name) for name in _MARKERS}
    item.stash[_ARGS_KEY] = {k: v for k, v in checked.items() if v is not None}


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

        _checked_arguments("kdebug_accuracy.check", "kdebug_matches_eager", (),
                           {"rtol": rtol, "atol": atol, "factor": factor})
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


def _run_matches_eager(pyfuncitem, kw: dict, given: dict) -> bool:
    """kw: the marker's checked arguments (Note [Marker arguments]); given: the ones it was given."""
    from kdebug.accuracy import check

    funcargs = {k: pyfuncitem.funcargs[k] for k in pyfuncitem._fixtureinfo.argnames}
    rep = check(lambda: pyfuncitem.obj(**funcargs), **kw)
    why = _accuracy_failure(rep, "rtol" in given or "atol" in given)
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

        _checked_arguments("kdebug_determinism.check", "kdebug_deterministic", (),
                           {"runs": runs, "hash_fn": hash_fn, "all_threads": all_threads})
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
    checked = pyfuncitem.stash.get(_ARGS_KEY, None)  # pytest_runtest_setup's (Note [Marker arguments])
    if checked is None:  # a caller that skipped the setup hook
        pytest_runtest_setup(pyfuncitem)
        checked = pyfuncitem.stash[_ARGS_KEY]
    accuracy = checked.get("kdebug_matches_eager")
    det = checked.get("kdebug_deterministic")
    if accuracy is not None:
        given = pyfuncitem.get_closest_marker("kdebug_matches_eager").kwargs
        _run_matches_eager(pyfuncitem, accuracy, given)  # fails the test, or returns: then the other check too
    if det is None:
        return True if accuracy is not None else None
    from kdebug.compare import _recorded_reports

    funcargs = {k: pyfuncitem.funcargs[k] for k in pyfuncitem._fixtureinfo.argnames}
    reports = _recorded_reports(pyfuncitem.obj, (), funcargs, det["runs"], det["hash_fn"], det["all_threads"])
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
