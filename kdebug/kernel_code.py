"""The code Inductor generated for each kernel (Note [Kernel code]).

    kdebug.kernel_code.text(sha256)          # the source of a kernel seen in this process
    run.kernel_code(sha256)                  # the same, read from a trace
    run.provenance(name)[0].code_sha256      # which source a kernel of that name has

Note [Kernel code]
~~~~~~~~~~~~~~~~~~
Every kernel Inductor generates is defined in its graph's generated module
(the wrapper) as ``name = async_compile.triton('name', '''<source>''', ...)``
or ``name = async_compile.cpp_pybinding([argtypes], r'''<source>''')``: the
module's text holds each kernel's whole source as a string constant.  The
provenance hooks (Note [Kernel provenance]) see that text when the graph is
lowered (GraphLowering.codegen's result), and read it from the loaded module
for graphs from the FX graph cache, so the source comes from the same place
as the FX nodes and user lines: of_module() parses the module once and
returns, per kernel name, the string constant (the longest one of its
async_compile call: the source; the others are its name or device).

A source is identified by the sha256 of its UTF-8 text.  Kernel names are
unique within one graph only: two graphs may each define a cpp_fused_add_0
with different code.  Their provenance entries then differ in code_sha256 and
are kept apart, never merged; a trace keeps each distinct text once, in the
META key "kernel_code" ({sha256: text}), and each provenance entry names its
text by code_sha256 and its module by path.  Launch records carry only the
kernel's name, so a launch of a name with several entries is shown with all
of them, each labelled by its hash.

The texts live in this process in a bounded registry (_TEXTS_MAX texts,
_BYTES_MAX characters); a trace's META keeps at most _BYTES_MAX characters of them,
and what does not fit is left out and counted in META "kernel_code_dropped"
(the entries still name the hash).  On reading, every text is checked: the
key must be the sha256 of its text, or the file is refused.
"""
from __future__ import annotations

import ast
import hashlib
import re
import threading

from . import _termtext

_lock = threading.Lock()
_texts: dict[str, str] = {}  # sha256 -> source text
_TEXTS_MAX = 100_000
_BYTES_MAX = 32 << 20  # characters of text kept in this process, and in one trace's META
_bytes = 0
dropped = 0  # texts not kept in this process (limits above)


def digest(text: str) -> str:
    """The content hash naming a kernel source: sha256 of its UTF-8 bytes, hex."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _remember(text: str) -> str:
    global _bytes, dropped
    d = digest(text)
    with _lock:
        if d not in _texts:
            if len(_texts) >= _TEXTS_MAX or _bytes + len(text) > _BYTES_MAX:
                dropped += 1
            else:
                _texts[d] = text
                _bytes += len(text)
    return d


def text(sha256: str) -> str | None:
    """The kernel source with this hash, when this process saw it."""
    with _lock:
        return _texts.get(sha256)


def _async_compile_call(value) -> bool:
    f = value.func if isinstance(value, ast.Call) else None
    return (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
            and f.value.id == "async_compile")


def sources_by_kind(module_source: str | None) -> dict[str, tuple[str, str]]:
    """{kernel name: (the async_compile method that builds it, e.g. 'triton'
    or 'cpp_pybinding', its source text)} for every kernel a generated
    module defines with async_compile: the longest string argument."""
    if not module_source:
        return {}
    try:
        tree = ast.parse(module_source)
    except (SyntaxError, ValueError, RecursionError):
        return {}
    out = {}
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name) and _async_compile_call(node.value)):
            continue
        consts = [a.value for a in node.value.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if consts:
            out[node.targets[0].id] = (node.value.func.attr, max(consts, key=len))
    return out


def _sources(module_source: str | None) -> dict[str, str]:
    """{kernel name: its source text} for every kernel a generated module
    defines with async_compile (Triton, C++): the longest string argument."""
    return {name: src for name, (_, src) in sources_by_kind(module_source).items()}


def of_module(module_source: str | None) -> dict[str, str]:
    """{kernel name: sha256 of its source} for every kernel a generated
    module defines with async_compile (Triton, C++), the texts remembered
    (text() answers them)."""
    return {name: _remember(src) for name, src in _sources(module_source).items()}


def source_of(module_source: str | None, kernel: str) -> str | None:
    """The source Inductor generated for `kernel`, read from its graph's
    generated module (`kernel = async_compile.<backend>(..., <source text>)`),
    without its leading and trailing newlines; None when it defines no such kernel."""
    src = _sources(module_source).get(kernel)
    return None if src is None else src.strip("\n")


# ---------------------------------------------------------------- traces

def meta_for(hashes) -> tuple[dict[str, str], int]:
    """The META key "kernel_code" for these source hashes ({sha256: text}),
    at most _BYTES_MAX characters of text, and how many were left out (too large,
    or not seen in this process)."""
    out: dict[str, str] = {}
    left, size = 0, 0
    for h in sorted(set(hashes)):
        t = text(h)
        if t is None or size + len(t) > _BYTES_MAX:
            left += 1
            continue
        out[h] = t
        size += len(t)
    return out, left


_HEX64 = re.compile(r"[0-9a-f]{64}")


def is_hash(v) -> bool:
    return isinstance(v, str) and _HEX64.fullmatch(v) is not None


def check_meta(v, key: str, bad) -> dict[str, str]:
    """Checks a "kernel_code" value: an object of sha256 -> text in which
    each key is the sha256 of its text; ``bad(msg)`` makes the exception to
    raise (Note [META schema] in trace.py)."""
    if not isinstance(v, dict) or len(v) > _TEXTS_MAX:
        raise bad(f"META key {key!r} must be an object of at most {_TEXTS_MAX} kernel sources")
    size = 0
    for h, t in v.items():
        if not is_hash(h):
            raise bad(f"META key {key!r}: each key is a sha256 in lowercase hex, not {h[:80]!r}")
        if not isinstance(t, str):
            raise bad(f"META key {key + '.' + h[:12]!r} must be a string")
        size += len(t)
        if size > _BYTES_MAX:
            raise bad(f"META key {key!r} holds more than {_BYTES_MAX} characters of source")
        if digest(t) != h:
            raise bad(f"META key {key + '.' + h[:12]!r}: the text's sha256 is not its key (altered source)")
    return v


# ---------------------------------------------------------------- text

def describe(entries) -> list[str]:
    """Lines naming the kernels of one name: per provenance entry its module,
    source hash, fused nodes and user lines (KernelProvenance.describe)."""
    out = []
    for k, e in enumerate(entries):
        if len(entries) > 1:
            out.append(f"kernel {k + 1} of {len(entries)} of this name")
        out += e.describe()
    return out


def section(names, entries_of) -> str:
    """The part of debug_string(verbose=True) naming each kernel launched,
    once per name in first-launch order: module, source hash, fused FX nodes
    and user source lines (entries_of(name): its provenance entries)."""
    seen: dict[str, None] = dict.fromkeys(names)
    if not seen:
        return ""
    out = ["# kernels: generated module, source sha256, fused FX nodes, user source lines"]
    for name in seen:
        entries = entries_of(name)
        out.append(f"# {name}" + ("" if entries else ": (no provenance recorded)"))
        out += ["#   " + line for line in describe(entries)]
    return "\n".join(map(_termtext.line, out))  # Note [Terminal-safe text]: names and source lines
