"""Kernel launches of Inductor's C++ wrapper and of AOTInductor models
(Note [C++ wrapper launches] in csrc/kd_cpp_launch.c): the codegen side.

While a kdebug recording is active when a graph is lowered with the C++
wrapper (cpp_wrapper=True, or AOTInductor), Inductor's intermediate-value
printer manager (V.graph.wrapper_code.debug_printer), which every C++ wrapper
enters around each kernel call, also emits calls of kdebug's C function
kd_cpp_launch before and after each C++ and Triton kernel call.  Such a
module is "hooked": its source carries HOOK_MARKER, its FX-graph cache key
carries hook_tag() (so a cached un-hooked module is never reused for a
recorded run, nor a hooked one built by another kdebug), and an AOTInductor
package carries hook_tag() in its metadata (METADATA_KEY).  A hooked module
run without a recording costs one C call per launch side and records nothing.

Runs at codegen time only (once per kernel call site), never per launch.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import threading
from typing import Any

import torch

from . import _C, _active, _upstream

HOOK_VERSION = 3  # 2: kd_cpp_launch_v2, with the C++ kernels' scalar arguments; 3: Triton scalars, grids, configs
METADATA_KEY = "kdebug_launch_hook"
HOOK_MARKER = "kdebug launch hook"
_IDENT = re.compile(r"^[A-Za-z_]\w*$")
# a view the C++ wrapper makes for a call (an owning RAIIAtenTensorHandle):
# evaluated once more for kdebug, inside the hook's block (Note [C++ wrapper launches])
_VIEW = re.compile(r"^(wrap_with_raii_handle_if_needed\()?reinterpret_tensor_wrapper\([A-Za-z_]\w*,[^()]*\)\)?$")
_UNRECORDED = 2  # kd_cpp_launch's phase KD_CPP_UNRECORDED
SCALAR_INT, SCALAR_FLOAT = 0x10, 0x20  # kd_cpp_launch_v2's role flags (KD_CPP_SCALAR_*)
_INT_TYPE = re.compile(r"\b(u?int(8|16|32|64)_t|int|long|short|bool|char|size_t|ssize_t)\b")
_FLOAT_TYPE = re.compile(r"\b(float|double)\b")
_tls = threading.local()
_installed = False
# hook sites emitted / refused while lowering, for tests and the report
stats = {"hooked_calls": 0, "unhookable_calls": 0}


def extension_path() -> str:
    """The absolute path of kdebug's extension, which the generated code dlopens."""
    return os.path.realpath(_C.__file__)


@functools.lru_cache(maxsize=None)
def hook_tag() -> str:
    """What identifies a hooked module: the hook's version, a digest of the
    code that emits it (this file: a changed hook never reuses a module
    cached with the old one) and the extension it calls."""
    with open(__file__, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()[:16]
    return f"{HOOK_VERSION}.{digest} {extension_path()}"


def wanted() -> bool:
    """Whether graphs lowered now get the hook: a kdebug recording is active.
    C++-wrapper graphs and AOTInductor packages, CPU and CUDA, compiled
    inside a recording are hooked (Note [C++ wrapper launches]); CUDA AOTI
    was checked on the lent H200 (torch 2.11, 2026-11-27): the same kernels
    and hashes as the Python wrapper, a planted fault named.  A backward
    compiled lazily on autograd's device thread is wanted when the recorder
    torch carried there records it (_active.records_here)."""
    return _active.records_here()


def _header() -> str:
    path = json.dumps(extension_path())  # a C string literal (ASCII-escaped)
    return f"""
// {HOOK_MARKER} {hook_tag()}
// Note [C++ wrapper launches] (kdebug, csrc/kd_cpp_launch.c): kernel launches reported to kdebug
#include <dlfcn.h>
#include <atomic>
#include <type_traits>
// a tensor argument's AtenTensorHandle; nullptr (kdebug counts the launch as
// unrecorded) for a variable that is no tensor handle
template <typename T>
static inline void* kdebug_handle(const T& v) {{
    if constexpr (std::is_convertible_v<const T&, AtenTensorHandle>)
        return static_cast<void*>(static_cast<AtenTensorHandle>(v));
    else
        return nullptr;
}}
typedef int (*kdebug_launch_fn_t)(int, int, const char*, int, const char* const*, void* const*,
                                  const unsigned char*, const long long*, const double*);
// n arguments in call order: a tensor's handle, or a scalar (a role flag,
// its value in ivals / fvals, nullptr when the launch has no scalar)
static inline void kdebug_launch(int phase, int kind, const char* name, int n, const char* const* names,
                                 void* const* handles, const unsigned char* roles, const long long* ivals,
                                 const double* fvals) {{
    static std::atomic<kdebug_launch_fn_t> fn{{nullptr}};
    kdebug_launch_fn_t f = fn.load(std::memory_order_relaxed);
    if (f == nullptr) {{  // kdebug's extension, if this process has loaded it
        void* lib = dlopen({path}, RTLD_NOW | RTLD_NOLOAD);
        if (lib == nullptr) return;
        f = reinterpret_cast<kdebug_launch_fn_t>(dlsym(lib, "kd_cpp_launch_v2"));
        if (f == nullptr) return;
        fn.store(f, std::memory_order_relaxed);
    }}
    f(phase, kind, name, n, names, handles, roles, ivals, fvals);
}}
typedef void (*kdebug_grid_fn_t)(unsigned, unsigned, unsigned, int, int, int, const char*);
// a Triton launch's grid and config, from inside the function that launches
// it, between the two phases of kdebug_launch
static inline void kdebug_grid(unsigned gx, unsigned gy, unsigned gz, int warps, int stages, int shared,
                               const char* config) {{
    static std::atomic<kdebug_grid_fn_t> fn{{nullptr}};
    kdebug_grid_fn_t f = fn.load(std::memory_order_relaxed);
    if (f == nullptr) {{
        void* lib = dlopen({path}, RTLD_NOW | RTLD_NOLOAD);
        if (lib == nullptr) return;
        f = reinterpret_cast<kdebug_grid_fn_t>(dlsym(lib, "kd_cpp_grid"));
        if (f == nullptr) return;
        fn.store(f, std::memory_order_relaxed);
    }}
    f(gx, gy, gz, warps, stages, shared, config);
}}
"""


# ---------------------------------------------------------------- fresh buffers

# Note [Fresh buffers in C++ wrappers]
# The Python wrapper's fresh buffers (Note [Fresh buffers] in inductor.py) are
# found in its call() source; a C++ wrapper's are found the same way in the
# C++ it has generated so far, read line by line while it is generated (the
# lines before a kernel call are final when the call is generated): a buffer
# is fresh from its `aoti_torch_empty_strided(..., &bufN_handle)` until a line
# uses it; `auto bufM = std::move(bufN)` and `auto bufM =
# ...reinterpret_tensor_wrapper(bufN, ...)` (the wrapper's buffer reuse) make
# bufM the same memory; its RAII wrapping, `.reset()` and kdebug's own lines
# are no use.  Any other line that names a buffer uses it.  What is not
# recognized counts as a use, so a buffer is fresh only when it certainly is.
_ALLOC = re.compile(r"^AOTI_TORCH_ERROR_CODE_CHECK\(aoti_torch_empty_strided\(.*&([A-Za-z_]\w*)_handle\)\);$")
_RAII = re.compile(r"^RAIIAtenTensorHandle ([A-Za-z_]\w*)\(\1_handle\);$")
_SAME = re.compile(r"^auto ([A-Za-z_]\w*) = (?:std::move\(|(?:wrap_with_raii_handle_if_needed\()?"
                   r"reinterpret_tensor_wrapper\()([A-Za-z_]\w*)[,)]")
_NO_USE = re.compile(r"^(?:[A-Za-z_]\w*\.reset\(\);|AtenTensorHandle [A-Za-z_]\w*_handle;|static constexpr .*|//.*|)$")
_WORD = re.compile(r"[A-Za-z_]\w*")
_VIEW_BASE = re.compile(r"reinterpret_tensor_wrapper\(([A-Za-z_]\w*),")


class _FreshBuffers:
    """Note [Fresh buffers in C++ wrappers] for one buffer of generated code."""

    def __init__(self, out) -> None:
        self.out, self.seen = out, 0
        self.fresh: set[str] = set()
        self.alias: dict[str, str] = {}

    def _base(self, name: str) -> str:
        return self.alias.get(name, name)

    def _feed(self, line: str) -> None:
        line = line.strip()
        if "kdebug_launch" in line or _NO_USE.match(line) or _RAII.match(line):
            return
        m = _ALLOC.match(line)
        if m:
            self.alias.pop(m.group(1), None)
            self.fresh.add(m.group(1))
            return
        m = _SAME.match(line)
        if m:
            rest = line[line.index(";") + 1:].strip() if ";" in line else ""
            if not rest or _NO_USE.match(rest) or re.fullmatch(r"[A-Za-z_]\w*\.reset\(\);\s*//.*", rest):
                self.alias[m.group(1)] = self._base(m.group(2))
                return
        for w in _WORD.findall(line):
            self.fresh.discard(self._base(w[:-7] if w.endswith("_handle") else w))

    def update(self) -> bool:
        """Reads the lines written since the last call; False when the buffer
        cannot be read (then no buffer counts as fresh)."""
        lines = getattr(self.out, "_lines", None)
        if not isinstance(lines, list):
            return False
        for line in lines[self.seen:]:
            text = line if isinstance(line, str) else getattr(line, "line", None)
            if isinstance(text, str):
                self._feed(text)
            elif type(line).__name__ != "LineContext":  # (a context names an op: no code)
                self.fresh.clear()  # a line kdebug cannot read: nothing stays fresh
        self.seen = len(lines)
        return True

    def is_fresh(self, expr: str) -> bool:
        m = _VIEW_BASE.search(expr)
        name = m.group(1) if m else expr
        return _IDENT.match(name) is not None and self._base(name) in self.fresh


def _fresh_positions(wrapper, exprs: list[str]) -> frozenset[int]:
    """Positions of ``exprs`` (a kernel call's arguments) whose buffers are
    fresh where the call is generated (Note [Fresh buffers in C++ wrappers])."""
    out = _upstream.wrapper_output(wrapper)
    if out is None:
        return frozenset()
    states = wrapper.__dict__.setdefault("_kdebug_fresh", {})
    st = states.get(id(out))
    if st is None or st.out is not out:
        st = states[id(out)] = _FreshBuffers(out)
    if not st.update():
        return frozenset()
    return frozenset(i for i, e in enumerate(exprs) if st.is_fresh(str(e)))


# ---------------------------------------------------------------- what a call site launches

def _cpp_param_names(wrapper, kernel_name: str, n: int) -> list[str]:
    """Parameter names of a C++ kernel from its definition in the wrapper's
    header (`extern "C" void NAME(const float* in_ptr0, ...)`)."""
    cache = wrapper.__dict__.setdefault("_kdebug_param_names", {})
    if kernel_name not in cache:
        sig = re.compile(r'extern\s+"C"\s+void\s+' + re.escape(kernel_name) + r"\s*\(([^)]*)\)", re.S)
        names = None
        for buf in ("header", "kernel_declarations"):
            b = getattr(wrapper, buf, None)
            m = sig.search(b.getvalue()) if b is not None else None
            if m is not None:
                params = [p.strip() for p in m.group(1).split(",") if p.strip()]
                names = [re.findall(r"[A-Za-z_]\w*", p)[-1] for p in params]
                break
        cache[kernel_name] = names
    names = cache[kernel_name]
    return names if names is not None and len(names) == n else [f"arg{i}" for i in range(n)]


def _launch_site(call: dict) -> tuple[int, list[str], list[str], list[int]] | None:
    """(kind, tensor argument expressions, their names, their roles) of the
    kernel call being generated, or None when it is not a hookable kernel
    launch (an extern call) -- raises ValueError when it is one kdebug cannot
    hook (an argument that is no plain variable)."""
    from . import inductor

    if call.get("extern"):
        return _extern_site(call)
    args, types = list(call["call_args"]), list(call["arg_types"] or [])
    fresh = _fresh_positions(call["wrapper"], [str(a) for a in args])  # Note [Fresh buffers]
    if call["triton"]:
        meta = call.get("triton_meta") or {}
        constants = meta.get("constants") or {}
        signature = meta.get("signature") or {}
        imeta = call.get("inductor_meta") or {}
        keys = call.get("raw_keys")
        extra = len(imeta.get("extra_launcher_args") or ())
        if extra and len(args) > extra:
            # a user kernel's grid, computed by the wrapper and passed to the launcher after the
            # kernel's arguments (Inductor's extra_launcher_args, torch >= 2.7; its raw_keys are ""):
            # not the kernel's
            if isinstance(keys, (list, tuple)) and len(keys) == len(args):
                keys = list(keys)[:-extra]
            args, types = args[:-extra], types[:len(args) - extra]
        if (isinstance(keys, (list, tuple)) and len(keys) == len(args)
                and all(isinstance(k, str) and k in signature for k in keys)):
            # a user-defined kernel's call names what it passes (its tl.constexpr arguments are not passed)
            sig = [(k, signature[k]) for k in keys]
        else:
            # as the Python wrapper's run() gets them; a user kernel's tl.constexpr parameters are not
            # passed (inductor_meta["declared_constexpr_names"], torch 2.13)
            sig = inductor.triton_call_params(meta, frozenset(imeta.get("declared_constexpr_names") or ()))
        sig += [(f"arg{i}", None) for i in range(len(sig), len(args))]
        names = [n for n, _ in sig]
        roles_all = inductor.triton_roles(names, frozenset(imeta.get("mutated_arg_names") or ()), fresh)
        # the scalars as the wrapper writes them into the call (C++ expressions)
        written = _upstream.triton_wrapper_args(call["wrapper"], args, types)
        exprs, out_names, roles = [], [], []
        for i, (a, t) in enumerate(zip(args, types)):
            if isinstance(t, torch.dtype):
                if written is not None and type(written[1][i]).__name__ == "UnwrapUnspecArg":
                    continue  # a Python scalar passed as a 0-d CPU tensor, read inside the call: not seen
                exprs.append(str(a))
                out_names.append(names[i])
                roles.append(roles_all[i])
                continue
            if sig[i][1] == "constexpr" and names[i] in constants and constants[names[i]] is None:
                continue  # a user kernel's argument given as None: passed as -1, compiled out
            r = _triton_scalar_role(sig[i][1], constants.get(names[i]))
            if r is None or written is None:
                raise ValueError(f"argument {names[i]} = {a!r} is a scalar of a type kdebug does not "
                                 f"record ({sig[i][1]!r})")
            exprs.append(str(written[0][i]))
            out_names.append(names[i])
            roles.append(r)
        kind = _C.KIND_TRITON
    else:
        # tensors (pointer parameters) and scalars (sizes of a dynamic-shape
        # graph: `const int64_t ks0`), in call order, as the Python wrapper's
        # pybinding call passes them
        names = _cpp_param_names(call["wrapper"], call["kernel_name"], len(args))
        roles_all = inductor.cpp_roles(names, [str(t) for t in types], fresh)
        exprs, out_names, roles = [], [], []
        for a, t, n, r in zip(args, types, names, roles_all):
            t = str(t)
            if "*" in t:
                pass  # a tensor: its role from cpp_roles
            elif _FLOAT_TYPE.search(t):
                r = SCALAR_FLOAT | 1  # read, as the Python path's scalars
            elif _INT_TYPE.search(t):
                r = SCALAR_INT | 1
            else:
                raise ValueError(f"argument {a!r} has a type kdebug does not record ({t!r})")
            exprs.append(str(a))
            out_names.append(n)
            roles.append(r)
        kind = _C.KIND_CPP
    for e, r in zip(exprs, roles):
        if not (r & (SCALAR_INT | SCALAR_FLOAT) or _IDENT.match(e) or _VIEW.match(e)):
            raise ValueError(f"argument {e!r} is no plain variable or view of one")
    return kind, exprs, out_names, roles


_TRITON_INT = re.compile(r"^u?i(1|8|16|32|64)$")
_TRITON_FLOAT = re.compile(r"^(fp8\w*|fp16|bf16|fp32|fp64)$")


def _triton_scalar_role(sig: str | None, constant=None) -> int | None:
    """The role flags of a Triton kernel's scalar parameter (read, an int or a
    float value, as the Python wrapper passes Python ints and floats), from
    its signature type ("i32", "fp32", ...), or for a parameter specialized to
    a constant ("constexpr") from that constant's type; None for a type
    kdebug does not record (or no signature type)."""
    if sig == "constexpr":
        if isinstance(constant, (bool, int)):
            return SCALAR_INT | 1
        if isinstance(constant, float):
            return SCALAR_FLOAT | 1
        return None
    if isinstance(sig, str):
        if _TRITON_INT.match(sig):
            return SCALAR_INT | 1
        if _TRITON_FLOAT.match(sig):
            return SCALAR_FLOAT | 1
    return None


def _extern_site(call: dict) -> tuple[int, list[str], list[str], list[int]]:
    """An extern out= call (ExternKernelOut: extern_kernels.mm(..., out=buf)
    of the Python wrapper, aoti_torch_<device>_mm_out(buf, ...) here): the
    out buffer is written, every other argument that names a graph buffer or
    input is read, named after the op's schema."""
    graph = _upstream.current_graph()
    op = call.get("op")
    schema_names = []
    if op is not None and hasattr(op, "_schema"):
        schema_names = [a.name for a in op._schema.arguments if not getattr(a, "is_out", False)]
    exprs, names, roles = [call["out"]], ["out"], [2]
    for i, a in enumerate(call["args"]):
        a = str(a)
        if (_IDENT.match(a) and _upstream.graph_has_tensor(graph, a)) or _VIEW.match(a):
            exprs.append(a)
            names.append(schema_names[i] if i < len(schema_names) else f"arg{i}")
            roles.append(1)
        elif not _IDENT.match(a) and ("buf" in a or "arg" in a or "reinterpret" in a):
            raise ValueError(f"argument {a!r} is no plain variable or view of one")
    if not _IDENT.match(call["out"]):
        raise ValueError(f"output {call['out']!r} is no plain variable")
    return _C.KIND_ATEN, exprs, names, roles


def _emit(call: dict, phase: int, printer=None) -> None:
    site = call.get("site")
    if site is None:
        return
    wrapper = _upstream.current_graph().wrapper_code
    # where the printer writes: its own writeline where it has one (set by
    # set_printer_args in older torch), else the wrapper's
    writeline = getattr(printer, "writeline", None) or wrapper.writeline
    if not wrapper.__dict__.get("_kdebug_header"):
        wrapper.header.splice(_header())
        wrapper._kdebug_header = True
    kind, exprs, names, roles = site
    name = json.dumps(call.get("record_name") or call["kernel_name"])
    if exprs and phase == 0:  # the after-phase uses what the before-phase kept
        scalar = [bool(r & (SCALAR_INT | SCALAR_FLOAT)) for r in roles]
        n_lit = ", ".join(json.dumps(n) for n in names)
        # a view: its own owning handle in the block (the Python tensor kdebug
        # makes of it keeps the view alive until the after-phase)
        views = "".join((f"auto kd_v{i} = {e}; " if e.startswith("wrap_with_raii_handle_if_needed(")
                         else f"RAIIAtenTensorHandle kd_v{i}({e}); ")
                        for i, e in enumerate(exprs) if not scalar[i] and not _IDENT.match(e))
        h_lit = ", ".join("nullptr" if scalar[i] else f"kdebug_handle({e if _IDENT.match(e) else f'kd_v{i}'})"
                          for i, e in enumerate(exprs))
        r_lit = ", ".join(str(r) for r in roles)
        values = "nullptr, nullptr"
        if any(scalar):  # a scalar's value, converted as the call converts it
            i_lit = ", ".join(f"static_cast<long long>({e})" if r & SCALAR_INT else "0"
                              for e, r in zip(exprs, roles))
            f_lit = ", ".join(f"static_cast<double>({e})" if r & SCALAR_FLOAT else "0.0"
                              for e, r in zip(exprs, roles))
            views += f"const long long kd_i[] = {{{i_lit}}}; const double kd_f[] = {{{f_lit}}}; "
            values = "kd_i, kd_f"
        writeline(
            f"{{ {views}static const char* const kd_n[] = {{{n_lit}}}; static const unsigned char kd_r[] = {{{r_lit}}}; "
            f"void* const kd_h[] = {{{h_lit}}}; "
            f"kdebug_launch({phase}, {kind}, {name}, {len(exprs)}, kd_n, kd_h, kd_r, {values}); }}")
    else:
        writeline(f"kdebug_launch({phase}, {kind}, {name}, 0, nullptr, nullptr, nullptr, nullptr, nullptr);")


# ---------------------------------------------------------------- the patches

def _patched_call_helper(orig):
    def _generate_kernel_call_helper(self, kernel_name, call_args, *args, **kwargs):
        prev = getattr(_tls, "call", None)
        _tls.call = None
        graph = _upstream.current_graph()
        if (wanted() and kwargs.get("triton", True) and kernel_name in getattr(self, "_cpu_triton_kernel_names", ())
                and getattr(graph, "cpp_wrapper", False)):
            # a CPU Triton kernel: called outside the printer manager, not described
            _emit({"kernel_name": str(kernel_name), "site": (_C.KIND_TRITON, [], [], [])}, _UNRECORDED)
        elif wanted() and kwargs.get("arg_types") is not None:
            _tls.call = {"wrapper": self, "kernel_name": kernel_name, "call_args": list(call_args),
                         "arg_types": list(kwargs.get("arg_types")), "triton": kwargs.get("triton", True),
                         "triton_meta": kwargs.get("triton_meta"), "inductor_meta": kwargs.get("inductor_meta"),
                         "raw_keys": kwargs.get("raw_keys")}
        try:
            return orig(self, kernel_name, call_args, *args, **kwargs)
        finally:
            _tls.call = prev

    _generate_kernel_call_helper.__wrapped__ = orig
    return _generate_kernel_call_helper


_NOT_KWARGS = frozenset({"num_warps", "num_stages", "num_consumer_groups", "num_buffers_warp_spec"})


def _patched_launch_kernel(orig):
    """DeferredTritonCallWrapper.generate_launch_kernel: in a hooked module,
    the function each Triton kernel is called through reports its grid and
    config (kdebug_grid) right before it launches, between the two phases the
    call site reports (Note [C++ wrapper launches])."""
    def generate_launch_kernel(self, prefix, wrapper, kernel_var_name, params):
        if getattr(wrapper, "_kdebug_header", False):
            cfg = dict(params.get("config") or {})
            text = ", ".join(f"{k}={v}" for k, v in cfg.items() if k not in _NOT_KWARGS)
            warps, stages = int(params.get("num_warps") or 0), int(cfg.get("num_stages") or 0)
            shared = int(params.get("shared_mem") or 0)
            prefix.writeline(f"kdebug_grid(grid_0, grid_1, grid_2, {warps}, {stages}, {shared}, {json.dumps(text)});")
        return orig(self, prefix, wrapper, kernel_var_name, params)

    generate_launch_kernel.__wrapped__ = orig
    return generate_launch_kernel


def _unrecorded_extern(printer) -> None:
    """An extern call kdebug does not describe (a C-shim call with an output
    it allocates, or several): emits a call that counts it as unrecorded on
    the recording it runs in, so that recording is not complete."""
    graph = _upstream.current_graph()
    if graph is None or not getattr(graph, "cpp_wrapper", False) or not wanted():
        return
    stats["unrecorded_externs"] = stats.get("unrecorded_externs", 0) + 1
    _emit({"kernel_name": str(printer.kernel_name), "site": (_C.KIND_ATEN, [], [], [])}, _UNRECORDED, printer)


def _enter_site(printer) -> dict | None:
    """The call being generated, with its launch site ("site": None when it is
    no hookable kernel launch), when this printer context is its kernel call."""
    kernel_name = getattr(printer, "kernel_name", None)
    call = getattr(_tls, "call", None)
    if call is None or call["kernel_name"] != kernel_name:
        if getattr(printer, "kernel_type", None) == "extern":
            _unrecorded_extern(printer)
        return None
    call["site"] = None
    graph = _upstream.current_graph()
    if graph is None or not getattr(graph, "cpp_wrapper", False) or getattr(call["wrapper"], "_kdebug_array_ref", False):
        return call
    try:
        call["site"] = _launch_site(call)
        stats["hooked_calls"] += 1
        graph._kdebug_hooked = True
    except ValueError as e:
        stats["unhookable_calls"] += 1
        from . import inductor

        inductor.warn(f"a launch of {kernel_name} in C++-wrapper code cannot be recorded ({e}); "
                      "each of its launches is counted as unrecorded (the recording is not complete); "
                      "compile with cpp_wrapper=False (the Python wrapper) to record it")
        kind = _C.KIND_TRITON if call.get("triton", True) else _C.KIND_CPP
        _emit({"kernel_name": str(kernel_name), "site": (kind, [], [], [])}, _UNRECORDED)
    return call


def _patched_enter(orig):
    def __enter__(self):
        out = orig(self)
        call = _enter_site(self)
        if call is not None:
            _emit(call, 0, self)
        return out

    __enter__.__wrapped__ = orig
    return __enter__


def _patched_exit(orig):
    def __exit__(self, *exc):
        out = orig(self, *exc)
        call = getattr(_tls, "call", None)
        if call is not None and "site" in call and call["kernel_name"] == getattr(self, "kernel_name", None):
            _emit(call, 1, self)
            del call["site"]
        return out

    __exit__.__wrapped__ = orig
    return __exit__


def _patched_extern_line(orig):
    def codegen(self, code):
        prev = getattr(_tls, "extern_op", None)
        _tls.extern_op = getattr(self.node, "op_overload", None)
        try:
            return orig(self, code)
        finally:
            _tls.extern_op = prev

    codegen.__wrapped__ = orig
    return codegen


def _op_record_name(op) -> str | None:
    """"aten::mm.out" for aten.mm.out: the name the C++ op observer gives an
    op's records (Note [C++ op observer])."""
    schema = getattr(op, "_schema", None)
    if schema is None:
        return None
    return f"{schema.name}.{schema.overload_name}" if schema.overload_name else schema.name


def _patched_extern_out(orig):
    def _generate_extern_kernel_out_helper(self, kernel, out, out_view, args, *rest, **kwargs):
        prev = getattr(_tls, "call", None)
        _tls.call = None
        if wanted():
            op = getattr(_tls, "extern_op", None)
            _tls.call = {"wrapper": self, "kernel_name": kernel, "extern": True, "args": list(args),
                         "out": f"{out}_as_strided" if out_view else out, "op": op,
                         "record_name": _op_record_name(op)}
        try:
            return orig(self, kernel, out, out_view, args, *rest, **kwargs)
        finally:
            _tls.call = prev

    _generate_extern_kernel_out_helper.__wrapped__ = orig
    return _generate_extern_kernel_out_helper


def _patched_hash_details(orig):
    def __init__(self, gm, example_inputs, fx_kwargs, inputs_to_check, *args, **kwargs):
        orig(self, gm, example_inputs, fx_kwargs, inputs_to_check, *args, **kwargs)
        cfg = _upstream.inductor_config()
        if wanted() and (fx_kwargs.get("cpp_wrapper") or fx_kwargs.get("aot_mode") or cfg.cpp_wrapper):
            self.kdebug_launch_hook = hook_tag()  # part of the pickled details: the key differs

    __init__.__wrapped__ = orig
    return __init__


def _patched_aot_compile(orig):
    def compile(cls, graph, *args, **kwargs):
        if getattr(graph, "_kdebug_hooked", False):
            cfg = _upstream.inductor_config()
            meta = dict(cfg.aot_inductor.metadata or {})
            meta[METADATA_KEY] = hook_tag()
            with cfg.patch({"aot_inductor.metadata": meta}):
                return orig(cls, graph, *args, **kwargs)
        return orig(cls, graph, *args, **kwargs)

    compile.__wrapped__ = orig
    return classmethod(compile)


def install() -> None:
    """Installs the codegen patches (once; kdebug/inductor.py's install)."""
    global _installed
    if _installed:
        return
    for cls in _upstream.cpp_wrapper_codegen_classes():
        if "_generate_kernel_call_helper" in cls.__dict__:
            cls._generate_kernel_call_helper = _patched_call_helper(cls.__dict__["_generate_kernel_call_helper"])
        if "_generate_extern_kernel_out_helper" in cls.__dict__:
            cls._generate_extern_kernel_out_helper = _patched_extern_out(
                cls.__dict__["_generate_extern_kernel_out_helper"])
        if "ArrayRef" in cls.__name__:
            orig_init = cls.__init__

            def init(self, *a, _orig=orig_init, **k):
                _orig(self, *a, **k)
                self._kdebug_array_ref = True

            cls.__init__ = init
    Deferred = _upstream.deferred_triton_call_wrapper()
    if Deferred is not None and "generate_launch_kernel" in Deferred.__dict__:
        Deferred.generate_launch_kernel = _patched_launch_kernel(Deferred.__dict__["generate_launch_kernel"])
    Line = _upstream.extern_kernel_out_line()
    Line.codegen = _patched_extern_line(Line.codegen)
    DPM = _upstream.debug_printer_manager_class()
    DPM.__enter__ = _patched_enter(DPM.__enter__)
    DPM.__exit__ = _patched_exit(DPM.__exit__)
    Details = _upstream.fx_graph_hash_details()
    Details.__init__ = _patched_hash_details(Details.__init__)
    AOT = _upstream.aot_code_compiler()
    AOT.compile = _patched_aot_compile(AOT.compile.__func__)
    _installed = True


# ---------------------------------------------------------------- run time: is a module hooked?

def graph_hooked(graph: Any) -> bool:
    """Whether a CompiledFxGraph was lowered with this kdebug's hook (its
    source carries the marker with this extension's path)."""
    v = graph.__dict__.get("_kdebug_hooked_rt") if hasattr(graph, "__dict__") else None
    if v is None:
        src = getattr(graph, "source_code", None) or ""
        v = f"{HOOK_MARKER} {hook_tag()}" in src
        try:
            graph._kdebug_hooked_rt = v
        except AttributeError:
            pass
    return v


def aoti_hooked(model: Any) -> bool:
    """Whether an AOTICompiledModel was compiled with this kdebug's hook."""
    v = getattr(model, "_kdebug_hooked_rt", None)
    if v is None:
        try:
            v = (model.get_metadata() or {}).get(METADATA_KEY) == hook_tag()
        except Exception:
            v = False
        try:
            model._kdebug_hooked_rt = v
        except AttributeError:
            pass
    return v
