"""Which DebugMode is active: the one place that knows.

Note [Active mode]
Two questions, both answered here and nowhere else:

 - ``debug_mode()``: the DebugMode that is active on this thread, what
   ``kdebug.get_active_debug_mode`` and (once kdebug is installed)
   upstream's ``torch.utils._debug_mode.get_active_debug_mode`` return.  It
   is upstream's answer, the outermost DebugMode (upstream's or kdebug's) on
   this thread's dispatch-mode stack; where that stack holds none, a kdebug
   mode recording without a dispatch mode (kernels_only, or
   record_all_threads entered on another thread), outermost first.  One
   function, installed under both names, so the two always agree.
 - ``recording()``: the kdebug mode whose recorder takes this thread's
   kernel launches (the innermost one entered on this thread, else the
   innermost record_all_threads one): where bypassed graph calls and
   Unhashed warnings are reported, and what a nested mode shadows (Note
   [Nested DebugModes]).

``enter_dispatch`` / ``exit_dispatch`` and ``start_recording`` /
``stop_recording`` are the only writers.  Two caches in C follow them and
are changed only through them: the count of kdebug modes on dispatch
stacks (``_C._modes_pushed``, which lets the Triton-launch filter in
csrc/kd_hook.c hide kdebug modes from upstream's own recording without a
stack walk), and the recorder's per-thread / process-wide slot (started and
stopped by mode.py together with ``start_recording`` / ``stop_recording``).
"""
from __future__ import annotations

import threading

from . import _upstream  # noqa: I001 (torch before the extension that links to it)
from . import _C

_local = threading.local()  # .stack: kdebug recording modes entered on this thread, innermost last
_global: list = []          # record_all_threads modes, innermost last


def _stack() -> list:
    stack = getattr(_local, "stack", None)
    if stack is None:
        stack = _local.stack = []
    return stack


def enter_dispatch() -> None:
    """A kdebug mode was pushed on this thread's dispatch-mode stack."""
    _C._modes_pushed(1)


def exit_dispatch() -> None:
    """A kdebug mode was popped from this thread's dispatch-mode stack."""
    _C._modes_pushed(-1)


def start_recording(mode, all_threads: bool) -> None:
    """``mode``'s recorder started: it takes this thread's launches (all
    threads' with ``all_threads``) until ``stop_recording``."""
    (_global if all_threads else _stack()).append(mode)


def stop_recording(mode, all_threads: bool) -> None:
    stack = _global if all_threads else getattr(_local, "stack", [])
    if mode in stack:
        stack.remove(mode)


def recording():
    """The kdebug mode whose recorder takes this thread's launches, or None."""
    stack = getattr(_local, "stack", None)
    if stack:
        return stack[-1]
    return _global[-1] if _global else None


def recording_here():
    """recording(), or on a thread torch started whose Python-side state is
    empty (autograd's device thread running a compiled backward on CUDA) the
    mode whose recorder torch carried to it (_C._mode_here), or None."""
    mode = recording()
    return mode if mode is not None else _C._mode_here()


def records_here() -> bool:
    """any_recording(), or a recorder torch carried to this thread records
    its launches (_C._recording_here: autograd's device thread)."""
    return any_recording() or _C._recording_here()


def any_recording() -> bool:
    """Whether any kdebug mode records kernels (on any thread)."""
    return bool(_global) or bool(getattr(_local, "stack", None))


def debug_mode():
    """The active DebugMode on this thread (Note [Active mode]), or None."""
    mode = _upstream.upstream_get_active_debug_mode()
    if mode is not None:
        return mode
    for m in getattr(_local, "stack", ()):
        if m.kernels_only:
            return m
    for m in _global:
        return m
    return None
