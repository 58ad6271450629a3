"""Call records for kernel launches, shaped like upstream DebugMode's.

A ``_KernelCall`` is a thin Python face over one record in the C store: its
attributes are read from the record when asked for, so recording a launch
creates no Python object at all.  ``_TritonKernelCall`` subclasses upstream's
``torch.utils._debug_mode._TritonKernelCall`` so ``isinstance`` checks and
upstream helpers such as ``DebugMode.check_hash_mismatches`` accept it;
C++ kernels get ``_CppKernelCall``, which does not.
"""
from __future__ import annotations

import contextvars
from typing import Any

import torch

from . import _upstream

ROLE_NAMES = {0: "-", 1: "R", 2: "W", 3: "RW"}
ROLE_READ, ROLE_WRITE = 1, 2  # _C.ROLE_READ / ROLE_WRITE

# debug_string(verbose=True) renders kernel lines with roles, strides, pointers
_VERBOSE = contextvars.ContextVar("kdebug_verbose", default=False)

_DTYPES_BY_SCALAR_TYPE: dict[int, torch.dtype] = {}


def _dtype_of(scalar_type: int) -> torch.dtype | int:
    if not _DTYPES_BY_SCALAR_TYPE:
        from . import _C

        for d in vars(torch).values():
            if isinstance(d, torch.dtype):
                try:
                    _DTYPES_BY_SCALAR_TYPE.setdefault(_C.scalar_type(d), d)
                except TypeError:
                    pass
    return _DTYPES_BY_SCALAR_TYPE.get(scalar_type, scalar_type)


class TensorInfo:
    """What kdebug recorded about a tensor argument (the tensor itself is not kept
    unless ``store_original_args=True``)."""

    __slots__ = ("name", "role", "dtype", "shape", "stride", "storage_offset", "data_ptr", "device")

    def __init__(self, name, role, dtype, shape, stride, storage_offset, data_ptr, device):
        self.name = name
        self.role = role
        self.dtype = dtype
        self.shape = torch.Size(shape)
        self.stride = stride
        self.storage_offset = storage_offset
        self.data_ptr = data_ptr
        self.device = torch.device(device)

    @property
    def reads(self) -> bool:
        return bool(self.role & 1)

    @property
    def writes(self) -> bool:
        return bool(self.role & 2)

    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    def __repr__(self) -> str:
        abbr = _upstream.dtype_abbrs.get(self.dtype, str(self.dtype))
        return f"t: {abbr}[{', '.join(str(s) for s in self.shape)}]"

    def __eq__(self, other) -> bool:
        if not isinstance(other, TensorInfo):
            return NotImplemented
        return all(getattr(self, k) == getattr(other, k) for k in self.__slots__)

    __hash__ = None  # type: ignore[assignment]


# kd_record.h: hash kinds and hash-record flags
_HK_BITWISE, _HK_NORM, _HK_XOR, _HK_STATS = 1, 2, 4, 16
_HF_CHANGED, _HF_UNSUPPORTED, _HF_CHECKED = 4, 8, 16


def _side_kinds(kinds: int, flags: int, when: int) -> int:
    """The hash kinds one side (0 pre, 1 post) of a hash record holds.  A
    record's kinds are those of either side; only the post side of a
    read-only argument checked by check_inputs_unchanged differs: it holds
    just the bitwise hash the check compares (kd_launch.c, after_launch)."""
    if when and flags & _HF_CHECKED:
        return _HK_BITWISE
    return kinds


def _arg_value(t) -> Any:
    """A recorded argument (a _C.TensorArg or _C.ScalarArg) as kernel calls show it."""
    if t.kind == "tensor":
        return TensorInfo(t.name, t.role, _dtype_of(t.scalar_type), t.shape, t.stride, t.storage_offset,
                          t.data_ptr, t.device)
    if t.kind == "other":
        return f"<{t.value}>"
    return t.value


# Note [Kernel tensor attributes]: record_tensor_attributes on kernel lines.
# Upstream renders each requested attribute a tensor has (getattr).  A kernel
# record keeps the tensors only with store_original_args=True (then upstream's
# own rendering is used); otherwise it holds these attributes' values as they
# were at the launch, and DebugMode.debug_string warns about the others.
RECORDED_ATTRIBUTES = {
    "dtype": lambda i: i.dtype,
    "shape": lambda i: i.shape,
    "device": lambda i: i.device,
    "ndim": lambda i: len(i.shape),
}


def _recorded_attributes(info: TensorInfo, attributes) -> str:
    pairs = [f"{a}={RECORDED_ATTRIBUTES[a](info)}" for a in attributes if a in RECORDED_ATTRIBUTES]
    return "{" + ", ".join(pairs) + "}" if pairs else ""


class _LaunchCopy:
    """What ``copy.deepcopy`` of a kernel record holds instead of its view
    into the recorder (Note [Copied records]): every field of the launch,
    read once, and its lines as the C core rendered them."""

    _FIELDS = ("kind", "kernel_name", "grid", "config", "num_warps", "num_stages", "shared_mem", "device",
               "stream", "thread_id", "launch_index", "py_index", "call_depth", "t_start_ns", "t_end_ns",
               "nargs", "raised", "cuda_graph", "args", "hashes")

    def __init__(self, launch, memo: dict) -> None:
        import copy

        for name in self._FIELDS:
            setattr(self, name, getattr(launch, name))
        self.objects = copy.deepcopy(launch.objects, memo)
        i = launch.launch_index
        outs = launch.outputs.get(i)  # only this launch's: the recorder's dict holds every launch's
        self.outputs = {i: copy.deepcopy(outs, memo)} if outs is not None else {}
        self.custom = {k: copy.deepcopy(v, memo) for k, v in launch.custom.items() if k[0] == i}
        self.detached = True
        self._lines = {v: launch.render(verbose=v) for v in (False, True)}
        self._arg_lines = {v: launch.render_args(verbose=v) for v in (False, True)}

    def render(self, verbose: bool = False) -> str:
        return self._lines[bool(verbose)]

    def render_args(self, verbose: bool = False) -> str:
        return self._arg_lines[bool(verbose)]


class _KernelCall(_upstream._DebugCall):
    """One recorded kernel launch (Triton or C++)."""

    kind = "kernel"

    def __init__(self, launch, recorder=None) -> None:
        # upstream's _DebugCall fields, without its stack capture
        self._launch = launch
        self._recorder = recorder
        self.call_depth = launch.call_depth
        self.log = None
        self.output_str = None
        self._args = None
        self._set: dict[str, Any] = {}

    def __deepcopy__(self, memo: dict) -> _KernelCall:
        """Note [Copied records]: a deep copy holds its record's data itself
        (values, hashes, recorded outputs, rendered lines), so it outlives
        the recorder and is unchanged by anything done to the original run."""
        import copy

        new = object.__new__(type(self))
        memo[id(self)] = new
        for k, v in vars(self).items():
            if k == "_launch":
                v = _LaunchCopy(v, memo)
            elif k == "_recorder":
                v = None
            else:
                v = copy.deepcopy(v, memo)
            setattr(new, k, v)
        return new

    # -- hashes and recorded outputs (DebugMode.log_tensor_hashes / record_outputs) --
    def _hashes(self, when: int) -> dict[str, Any] | None:
        from . import hashing

        out = {}
        custom = self._launch.custom
        for i, (name, h) in enumerate(zip(self.arg_names, self._launch.hashes)):
            if h is None:
                continue
            spec = hashing.spec(h.spec)
            side = h.post if when else h.pre
            if spec.fn is not None:
                key = (self.launch_index, i, when)
                if key in custom:
                    out[name] = custom[key]
                continue
            have = _side_kinds(h.kinds, h.flags, when)
            # only what this side computed: a kind it never hashed is absent, not 0
            if side is not None and spec.names and (have & spec.kinds) == spec.kinds:
                # the recorder counts and warns about these (hash_unsupported)
                unhashed = have & (_HK_NORM | _HK_XOR | _HK_STATS) if h.flags & _HF_UNSUPPORTED else 0
                out[name] = spec.value(side, unhashed=unhashed)
        return out or None

    @property
    def pre_hashes(self) -> dict[str, Any] | None:
        """Argument name -> hash before the launch, for what the kernel reads
        (with log_tensor_hashes(hash_inputs=True))."""
        return self._set["pre_hashes"] if "pre_hashes" in self._set else self._hashes(0)

    @pre_hashes.setter
    def pre_hashes(self, value) -> None:
        self._set["pre_hashes"] = value

    @property
    def post_hashes(self) -> dict[str, Any] | None:
        """Argument name -> hash after the launch, for what the kernel writes."""
        return self._set["post_hashes"] if "post_hashes" in self._set else self._hashes(1)

    @post_hashes.setter
    def post_hashes(self, value) -> None:
        self._set["post_hashes"] = value

    @property
    def record(self) -> dict[str, Any] | None:
        """{"output": {name: clone}} of what the kernel wrote, with record_outputs()."""
        if "record" in self._set:
            return self._set["record"]
        outs = self._launch.outputs.get(self.launch_index)
        return {"output": outs} if outs else None

    @record.setter
    def record(self, value) -> None:
        self._set["record"] = value

    @property
    def readonly_violations(self) -> list[str]:
        """Arguments the kernel only reads whose bytes changed during the launch
        (log_tensor_hashes(check_inputs_unchanged=True))."""
        return [n for n, h in zip(self.arg_names, self._launch.hashes) if h is not None and h.flags & _HF_CHANGED]

    # -- identity and launch configuration --
    @property
    def kernel_name(self) -> str:
        return self._launch.kernel_name

    @property
    def provenance(self) -> list:
        """What kernels of this name compute, as this process knows it
        (kdebug.provenance.KernelProvenance, one per distinct kernel of the
        name: Note [Kernel provenance]).  A run read from a trace answers
        with Run.provenance(kernel_name) instead."""
        from . import provenance

        return provenance.provenances(self.kernel_name)

    @property
    def grid(self) -> tuple[int, int, int] | None:
        """(x, y, z) exactly as the launcher launched it (Triton only)."""
        return self._launch.grid

    @property
    def config(self) -> str | None:
        """Block sizes of the config the autotuner chose, e.g. 'XBLOCK=1024'."""
        return self._launch.config

    @property
    def num_warps(self) -> int | None:
        return self._launch.num_warps

    @property
    def num_stages(self) -> int | None:
        return self._launch.num_stages

    @property
    def shared_mem(self) -> int | None:
        return self._launch.shared_mem

    @property
    def device(self) -> torch.device:
        return torch.device(self._launch.device)

    @property
    def stream(self) -> int:
        return self._launch.stream

    @property
    def thread_id(self) -> int:
        return self._launch.thread_id

    @property
    def launch_index(self) -> int:
        return self._launch.launch_index

    @property
    def raised(self) -> bool:
        return self._launch.raised

    @property
    def cuda_graph(self) -> dict | None:
        """Note [CUDA graph replays]: None for an ordinary launch, else
        {"graph": id, "replay": n} for replay n of a captured launch, or
        {"graph": id, "replay": None} for the launch recorded at capture (it
        did not run: no values)."""
        return self._launch.cuda_graph

    @property
    def t_start_ns(self) -> int:
        return self._launch.t_start_ns

    @property
    def t_end_ns(self) -> int:
        return self._launch.t_end_ns

    # -- arguments --
    def _arg_records(self) -> tuple:
        if self._args is None:
            self._args = self._launch.args
        return self._args

    @property
    def arg_names(self) -> tuple[str, ...]:
        return tuple(t.name or f"arg{i}" for i, t in enumerate(self._arg_records()))

    @property
    def roles(self) -> dict[str, str]:
        """Argument name -> 'R' (read), 'W' (written) or 'RW'."""
        return {n: ROLE_NAMES[t.role] for n, t in zip(self.arg_names, self._arg_records())}

    @property
    def written(self) -> list[str]:
        return [n for n, t in zip(self.arg_names, self._arg_records()) if t.role & ROLE_WRITE]

    @property
    def read(self) -> list[str]:
        return [n for n, t in zip(self.arg_names, self._arg_records()) if t.role & ROLE_READ]

    @property
    def tensor_info(self) -> dict[str, TensorInfo]:
        """Argument name -> TensorInfo, for every tensor argument."""
        out = {}
        for n, t in zip(self.arg_names, self._arg_records()):
            if t.kind == "tensor":
                out[n] = _arg_value(t)
        return out

    @property
    def args(self) -> tuple:
        """The arguments in call order: the tensors themselves with
        ``store_original_args=True``, else ``TensorInfo`` objects; scalars as values."""
        objs = self._launch.objects
        if objs is not None:
            return objs
        return tuple(_arg_value(t) for t in self._arg_records())

    @property
    def kwargs(self) -> dict[str, Any]:
        return dict(zip(self.arg_names, self.args))

    @property
    def kwargs_str(self) -> str:
        """Arguments rendered as upstream renders them (in C)."""
        return self._launch.render_args()

    # -- upstream _DebugCall protocol --
    def stringify_args(self, attributes, tensor_memo=None) -> None:
        pass  # already plain data

    def _with_attributes(self, line: str, attributes) -> str:
        """The line with each tensor argument's requested attributes after
        its shape, as upstream renders them (Note [Kernel tensor attributes])."""
        objs = self._launch.objects
        for i, (name, t) in enumerate(zip(self.arg_names, self._arg_records())):
            if t.kind != "tensor":
                continue
            obj = objs[i] if objs is not None and i < len(objs) else None
            if isinstance(obj, torch.Tensor):
                extra = _upstream.stringify_attributes(obj, attributes)
            else:
                extra = _recorded_attributes(_arg_value(t), attributes)
            if not extra:
                continue
            text = f"{name}={_arg_value(t)!r}"
            for lead in ("(", ", "):
                at = line.find(lead + text)
                if at >= 0:
                    end = at + len(lead) + len(text)
                    line = line[:end] + extra + line[end:]
                    break
        return line

    def render(self, attributes) -> str:
        return ("\n  " + "  " * self.call_depth).join(self.render_lines(attributes)) + "\n"

    def render_lines(self, attributes) -> list[str]:
        """render()'s lines, without their indentation: the launch, then its
        pre- and post-kernel hashes (Note [Terminal-safe text] escapes each
        by itself)."""
        line = self._launch.render(verbose=_VERBOSE.get())
        if attributes:
            line = self._with_attributes(line, attributes)
        lines = [line]
        if self.pre_hashes:
            lines.append("# pre-kernel hashes: {" + ", ".join(f"{k}: {v}" for k, v in self.pre_hashes.items()) + "}")
        if self.post_hashes:
            lines.append("# post-kernel hashes: {" + ", ".join(f"{k}: {v}" for k, v in self.post_hashes.items()) + "}")
        return lines

    def __iter__(self):
        yield from [self.kernel_name, (), self.kwargs_str, self.call_depth]

    def __repr__(self) -> str:
        return self._launch.render()


class _TritonKernelCall(_KernelCall, _upstream._TritonKernelCall):
    """A Triton kernel launch from Inductor-generated code."""

    kind = "triton"


class _CppKernelCall(_KernelCall):
    """An Inductor C++ kernel launch (``cpp_fused_*``)."""

    kind = "cpp"


class _AtenOpCall(_KernelCall):
    """An aten op recorded by the C++ op observer (Note [C++ op observer] in
    csrc/kd_op_observer.c): ``[aten] aten::mm.out(self=..., mat2=..., out=...)``,
    its arguments and outputs named by the op's schema, hashes as a kernel's."""

    kind = "aten"


_BY_KIND = {"cpp": _CppKernelCall, "aten": _AtenOpCall}


def make_call(launch, recorder=None) -> _KernelCall:
    return _BY_KIND.get(launch.kind, _TritonKernelCall)(launch, recorder)
