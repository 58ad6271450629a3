"""Text for a terminal: strings from a trace (or a recorded program) made
unable to drive it.  Note [Terminal-safe text].  Imports nothing heavy (the
CLI installs it before torch is imported)."""
from __future__ import annotations

import contextlib
import contextvars
import sys

# Note [Terminal-safe text]
# A trace's strings are whatever the recorded program made them: a
# torch.library custom op's string argument is rendered into its op's text,
# a kernel or argument name can be anything in a crafted file, a provenance
# source line is the user's file.  Printed raw, a string holding
# "\x1b]0;pwned\x07\x1b[2K\r  [cpp] fake_kernel()\n\u202eevil" set the
# terminal's title, erased the line, and forged a line of kdebug's own
# report.  So the command line shows such text escaped, in two layers:
#
# - each line of text (escape, everything below included): where a trace's
#   strings become the lines of a report -- the debug string's entries
#   (kdebug show), compare.format_report's lines (kdebug diff, kdebug hunt),
#   the provenance lines -- each line is escaped by itself, so a newline or
#   carriage return inside a name shows as \n / \r and can never start a
#   line of its own.  These places escape only while the command line's
#   output is on (the `terminal` context variable, line()): the Python API
#   (Run.debug_string(), str(report), kernel_name, ...) and the HTML report,
#   which escapes for HTML itself, keep the exact strings.  Only text made
#   for display is escaped, never render(): a trace stores an op's rendered
#   text, and the comparison reads it.
# - at the output boundary (output()): kdebug's command line writes through
#   a stdout and stderr that escape every control character but newline and
#   tab, whatever printed it.  A print added later that forgets the first
#   layer can still not move the cursor, set a title, erase or reorder
#   text; only a newline inside a name depends on the first layer (which
#   kdebug show, diff and hunt have; repro, rerun, accuracy, nan and diff
#   --ranks have only this one).
#   The program kdebug runs in its own process (kdebug record, accuracy,
#   nan, ...: _runner.run_program) writes to the real streams
#   (program_output()): its output is its own, colours and progress bars
#   included; the progress bar's carriage return goes to the real stderr.
#
# What is escaped: C0 controls (\n, \r, \t by those names, the rest \xNN),
# DEL, C1 controls (\x80-\x9f), and the Unicode controls that reorder or
# break the text a terminal or viewer shows: the bidi embeddings, overrides
# and isolates (U+202A-202E, U+2066-2069), the marks U+200E, U+200F and
# U+061C, and the line and paragraph separators U+2028, U+2029 (as \uNNNN).
# A backslash is not escaped: names and source lines keep their own
# backslashes readable (a name holding the four characters \x1b reads like
# an escaped ESC; the escaped form is only ever text).

_UNICODE_CONTROLS = [0x061C, 0x200E, 0x200F, 0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _table(keep: str) -> dict[int, str]:
    t = {c: _NAMED.get(chr(c), f"\\x{c:02x}") for c in [*range(0x20), 0x7F, *range(0x80, 0xA0)]}
    t.update({c: f"\\u{c:04x}" for c in _UNICODE_CONTROLS})
    for ch in keep:
        del t[ord(ch)]
    return t


_LINE = _table("")            # one line's text: nothing passes
_STREAM = _table("\n\t")      # a whole output: its own line breaks and tabs pass

terminal = contextvars.ContextVar("kdebug_terminal", default=False)


def escape(text: str) -> str:
    """``text`` as one line a terminal shows as text: every control and bidi
    character escaped, newlines included."""
    return text.translate(_LINE)


def escape_output(text: str) -> str:
    """A whole output's text: as escape(), but its newlines and tabs kept."""
    return text.translate(_STREAM)


def line(text: str) -> str:
    """escape(text) while the command line's output is on (``terminal``),
    else text unchanged (the Python API's strings)."""
    return text.translate(_LINE) if terminal.get() else text


class SafeStream:
    """A text stream whose writes are escape_output()'d into ``raw``."""

    def __init__(self, raw):
        self.raw = raw

    def write(self, s: str) -> int:
        self.raw.write(s.translate(_STREAM))
        return len(s)

    def writelines(self, lines) -> None:
        for s in lines:
            self.write(s)

    def __getattr__(self, name: str):  # flush, isatty, fileno, encoding, buffer, ...
        return getattr(self.raw, name)


def raw(stream):
    """The real stream under a SafeStream (the stream itself otherwise)."""
    return stream.raw if isinstance(stream, SafeStream) else stream


@contextlib.contextmanager
def output():
    """The command line's output (Note [Terminal-safe text]): sys.stdout and
    sys.stderr escape control characters, and line() escapes each line."""
    saved = sys.stdout, sys.stderr
    token = terminal.set(True)
    sys.stdout, sys.stderr = SafeStream(sys.stdout), SafeStream(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
        terminal.reset(token)


@contextlib.contextmanager
def program_output():
    """While a program runs in this process: its writes go to the real
    streams, and kdebug's own rendering in it keeps the exact strings."""
    out, err = sys.stdout, sys.stderr
    if not (isinstance(out, SafeStream) or isinstance(err, SafeStream)):
        yield
        return
    sys.stdout, sys.stderr = raw(out), raw(err)
    token = terminal.set(False)
    try:
        yield
    finally:
        terminal.reset(token)
        # the program may have replaced them (and left its own): put ours back only over the real ones
        if sys.stdout is raw(out):
            sys.stdout = out
        if sys.stderr is raw(err):
            sys.stderr = err
