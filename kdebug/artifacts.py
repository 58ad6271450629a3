"""What torch.compile made of a program, saved per compile as files: the
graphs, Inductor's IR and the generated kernels (docs/bringup.md,
"Compile artifacts").

    with kdebug.capture_artifacts("kdebug_artifacts") as cap:
        loss = torch.compile(model)(x).sum(); loss.backward()
    print(cap.run_dir)

Note [Compile artifacts]
~~~~~~~~~~~~~~~~~~~~~~~~
Torch already emits every stage of a compile as a structured-trace record
(the "torch.__trace" logger, which builds its payloads only while it has a
handler; kdebug/_upstream.py, structured_trace_logger), each tagged with
its compile id (frame id / frame compile id): ``dynamo_output_graph`` (the
graph dynamo captured, before AOTAutograd), ``aot_joint_graph``,
``aot_forward_graph`` / ``aot_backward_graph`` / ``aot_inference_graph``,
the ``fx_graph_runnable`` and ``inductor_post_grad_graph`` artifacts of
each graph Inductor lowers, and ``inductor_output_code`` (the generated
module).  Inductor's scheduler IR (nodes before and after fusion) comes
from its ir_pre_fusion / ir_post_fusion artifact loggers (_upstream,
inductor_ir_loggers).  A capture adds a handler to each for its time and
writes every record at once (a process that dies keeps what was written),
so nothing is re-derived: the files are torch's own text.

Inductor's records do not say which AOTAutograd graph they belong to:
kdebug asks Inductor (V.graph's is_backward / is_inference, _upstream,
lowering_stage) and, where no graph is being lowered yet, counts: AOTAutograd
lowers the forward graph before the backward one (which is compiled lazily,
at the first .backward(), under the same compile id), or one inference graph.

Caches: a hit in Inductor's FX graph cache or AOTAutograd's cache skips the
lowering, so no IR or post-grad graph would be written; a capture turns both
off for its time (caches=True keeps them, and meta.json then lists what a
compile lacks).  The program's results do not change.

Files: every name from the program (compile ids, kernel names) is reduced to
[A-Za-z0-9_.-]; every file is written through kdebug/_files.py (never
through a symbolic link, never half-written).  The run's manifest.json names
every compile directory before anything is written into it: `kdebug clean`
deletes only directories whose manifest says kdebug made them and that hold
nothing it does not name (kdebug/artifacts_cli.py).
"""
from __future__ import annotations

import contextlib
import datetime
import json
import logging
import os
import re
import secrets
import stat
import sys
import threading
import time
import warnings

from . import _files, _upstream, kernel_code

FORMAT = "kdebug-artifacts"
VERSION = 1
DEFAULT_DIR = "kdebug_artifacts"
MANIFEST = "manifest.json"
META = "meta.json"

# structured-trace event -> file (one per compile)
_GRAPHS = {"dynamo_output_graph": "dynamo_graph.py", "aot_joint_graph": "aot_joint.py",
           "aot_forward_graph": "forward.py", "aot_backward_graph": "backward.py",
           "aot_inference_graph": "inference.py"}
_KERNEL_EXT = {"triton": "py", "cpp": "cpp", "cpp_pybinding": "cpp", "cuda": "cu", "rocm": "cpp", "halide": "py"}
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def safe_name(text: str, limit: int = 120) -> str:
    """A file name made of ``text``: [A-Za-z0-9_.-] only, no leading dot, at
    most ``limit`` characters, never empty."""
    s = _UNSAFE.sub("_", str(text))[:limit].lstrip(".")
    return s or "_"


def compile_dir_name(compile_id: str) -> str:
    """The directory of compile id "F/C" (frame F's C-th compile): "F_C";
    compiled autograd's "!A/F/C": "ca_A_F_C"."""
    s = str(compile_id)
    if s.startswith("!"):
        s = "ca_" + s[1:]
    return safe_name(s.replace("/", "_"))


def _mkdir(path: str) -> None:
    """Creates directory ``path`` unless it is one already; a link or a file
    there is refused (Note [Safe writes])."""
    try:
        os.mkdir(path)
    except FileExistsError:
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            raise _files.LinkRefused(path) from None
        if not stat.S_ISDIR(st.st_mode):
            raise FileExistsError(f"{path} exists and is not a directory") from None


def dir_problem(root: str) -> str | None:
    """Why ``root`` cannot hold artifact runs, or None (checked before any
    compile, so a bad directory fails at once)."""
    root = os.fspath(root)
    if os.path.islink(root):
        return str(_files.LinkRefused(root))
    if os.path.exists(root) and not os.path.isdir(root):
        return f"{root} exists and is not a directory; give a directory for the artifacts"
    return None


class _Compile:
    def __init__(self, compile_id: str, dirname: str):
        self.compile_id, self.dirname = compile_id, dirname
        self.files: dict[str, int] = {}  # relative path -> bytes
        self.kernels: dict[str, dict[str, dict]] = {}  # stage -> name -> {kind, file, sha256}
        self.stages: list[str] = []
        self.lowered = 0  # Inductor graphs begun (post-grad graphs seen)
        self.inference = False

    def stage_of(self, index: int) -> str:
        if self.inference:
            return "inference" if index == 0 else f"graph{index}"
        return ("forward", "backward")[index] if index < 2 else f"graph{index}"

    def meta(self, run_id: str) -> dict:
        return {"format": FORMAT, "version": VERSION, "run_id": run_id, "compile_id": self.compile_id,
                "stages": self.stages, "files": dict(sorted(self.files.items())), "kernels": self.kernels,
                "missing": self.missing()}

    def missing(self) -> list[str]:
        """Artifacts a complete Inductor compile of these stages has and this one lacks."""
        have = set(self.files)
        out = [f for f in ("dynamo_graph.py",) if f not in have]
        for s in self.stages:
            if s in ("forward", "backward", "inference") and f"{s}.py" not in have:
                out.append(f"{s}.py")
        return out


class ArtifactRun:
    """One run directory, ``<root>/<run-id>/``, with its manifest; writes
    the artifacts of each compile into ``<run-id>/<compile>/``.  Thread-safe.
    Writes never raise into the program: a failure is counted
    (``dropped``), its message kept (``errors``) and warned about once."""

    def __init__(self, root: str = DEFAULT_DIR, run_id: str | None = None, source: str = "capture_artifacts"):
        root = os.fspath(root)
        problem = dir_problem(root)
        if problem:
            raise (_files.LinkRefused(root) if os.path.islink(root) else NotADirectoryError(problem))
        os.makedirs(root, exist_ok=True)
        _files.refuse_link(root)
        if not os.path.isdir(root):
            raise NotADirectoryError(f"{root} is not a directory; give a directory for the artifacts")
        self.run_id = safe_name(run_id) if run_id else (
            f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}-{secrets.token_hex(3)}")
        self.root = root
        self.run_dir = os.path.join(root, self.run_id)
        os.mkdir(self.run_dir)  # a new directory: an existing one (or a link) is an error
        self.source = source
        self.created = time.time()
        self.lock = threading.RLock()
        self.compiles: dict[str, _Compile] = {}
        self.dropped = 0
        self.errors: list[str] = []
        self.complete = False
        self._warned = False
        self._local = threading.local()
        self._write_manifest()

    # ------------------------------------------------------------ files

    def _compile(self, compile_id: str) -> _Compile:
        c = self.compiles.get(compile_id)
        if c is None:
            name = compile_dir_name(compile_id)
            taken = {x.dirname for x in self.compiles.values()} | {MANIFEST}
            base, n = name, 1
            while name in taken:
                n += 1
                name = f"{base}-{n}"
            c = self.compiles[compile_id] = _Compile(compile_id, name)
            self._write_manifest()  # named before anything is written into it
            _mkdir(os.path.join(self.run_dir, name))
        return c

    def _write(self, c: _Compile, rel: str, text: str) -> None:
        parts = rel.split("/")
        d = os.path.join(self.run_dir, c.dirname)
        for p in parts[:-1]:
            d = os.path.join(d, p)
            _mkdir(d)
        data = text.encode("utf-8", "surrogateescape")
        with _files.replaced_atomically(os.path.join(d, parts[-1]), "wb") as f:
            f.write(data)
        c.files[rel] = len(data)

    def _finish(self, c: _Compile) -> None:
        with _files.replaced_atomically(os.path.join(self.run_dir, c.dirname, META)) as f:
            json.dump(c.meta(self.run_id), f, indent=1)
        self._write_manifest()

    def _write_manifest(self) -> None:
        m = {"format": FORMAT, "version": VERSION, "run_id": self.run_id, "created": self.created,
             "created_utc": datetime.datetime.fromtimestamp(self.created, datetime.timezone.utc)
             .isoformat(timespec="seconds"), "pid": os.getpid(), "argv": list(sys.argv),
             "torch": _torch_version(), "source": self.source, "complete": self.complete,
             "compiles": {c.dirname: {"compile_id": c.compile_id, "stages": c.stages, "files": len(c.files) + 1,
                                      "bytes": sum(c.files.values())} for c in self.compiles.values()},
             "dropped": self.dropped, "errors": self.errors[:20]}
        with _files.replaced_atomically(os.path.join(self.run_dir, MANIFEST)) as f:
            json.dump(m, f, indent=1)

    def _failed(self, what: str, e: BaseException) -> None:
        with self.lock:
            self.dropped += 1
            self.errors.append(f"{what}: {type(e).__name__}: {e}")
            first, self._warned = not self._warned, True
        if first:
            from .inductor import KdebugWarning

            warnings.warn(f"kdebug: an artifact could not be written to {self.run_dir} ({what}: {e}); the "
                          "program goes on, the manifest counts what was dropped", KdebugWarning, stacklevel=2)
        with contextlib.suppress(Exception):
            self._write_manifest()

    # ------------------------------------------------------------ what torch emits

    def _stage_hint(self) -> str | None:
        return getattr(self._local, "stage", None)

    def add_graph(self, compile_id: str, event: str, text: str | None) -> None:
        """A graph record (dynamo_output_graph, aot_*_graph) of compile ``compile_id``."""
        if not text:
            return
        with self.lock:
            try:
                c = self._compile(compile_id)
                if event == "dynamo_output_graph":
                    c.lowered, c.inference = 0, False  # a restarted attempt starts over
                stage = {"aot_forward_graph": "forward", "aot_backward_graph": "backward",
                         "aot_inference_graph": "inference"}.get(event)
                if stage == "inference":
                    c.inference = True
                if stage and stage not in c.stages:
                    c.stages.append(stage)
                self._write(c, _GRAPHS[event], text)
                self._finish(c)
            except Exception as e:
                self._failed(f"{event} of {compile_id}", e)

    def add_inductor(self, compile_id: str, kind: str, text: str | None) -> None:
        """One of Inductor's records for the graph it lowers: kind is
        fx_graph_runnable, post_grad, output_code, ir_pre_fusion or
        ir_post_fusion."""
        if not text:
            return
        with self.lock:
            try:
                c = self._compile(compile_id)
                stage = self._stage_hint() or (_upstream.lowering_stage() if kind in (
                    "output_code", "ir_pre_fusion", "ir_post_fusion") else None)
                if stage is None:  # Note [Compile artifacts]: forward before backward
                    stage = c.stage_of(c.lowered if kind in ("fx_graph_runnable", "post_grad")
                                       else max(c.lowered - 1, 0))
                if kind == "post_grad":
                    c.lowered += 1
                if stage not in c.stages:
                    c.stages.append(stage)
                if kind == "output_code":
                    self._write(c, f"output_code_{stage}.py", text)
                    kernels = c.kernels.setdefault(stage, {})
                    for name, (method, src) in kernel_code.sources_by_kind(text).items():
                        rel = f"kernels/{stage}/{safe_name(name)}.{_KERNEL_EXT.get(method, 'txt')}"
                        self._write(c, rel, src.strip("\n") + "\n")
                        kernels[name] = {"kind": method, "file": rel, "sha256": kernel_code.digest(src)}
                elif kind == "post_grad":
                    self._write(c, f"ir_post_grad_{stage}.txt", text)
                else:
                    self._write(c, f"{kind}_{stage}.{'py' if kind == 'fx_graph_runnable' else 'txt'}", text)
                self._finish(c)
            except Exception as e:
                self._failed(f"{kind} of {compile_id}", e)

    def close(self) -> None:
        with self.lock:
            self.complete = True
            try:
                self._write_manifest()
            except Exception as e:
                self._failed("manifest", e)

    # ------------------------------------------------------------ watching

    @contextlib.contextmanager
    def scope(self, stage: str | None = None, caches: bool = False):
        """Writes what torch emits on this thread's compiles inside the
        block (nested scopes add nothing but their stage hint)."""
        depth = getattr(self._local, "depth", 0)
        saved = self._stage_hint()
        self._local.depth = depth + 1
        if stage is not None:
            self._local.stage = stage
        try:
            if depth:
                yield self
                return
            with _Watch(self), contextlib.ExitStack() as stack:
                if not caches:
                    for mod, key in _upstream.compile_cache_switches():
                        stack.enter_context(mod.patch(key, False))
                yield self
        finally:
            self._local.depth = depth
            self._local.stage = saved


def _torch_version() -> str | None:
    mod = sys.modules.get("torch")
    return getattr(mod, "__version__", None)


class _TraceHandler(logging.Handler):
    def __init__(self, run: ArtifactRun):
        super().__init__(logging.DEBUG)
        self.run = run

    def emit(self, record: logging.LogRecord) -> None:
        try:
            meta = getattr(record, "metadata", None)
            if not isinstance(meta, dict) or meta.get("frame_id") is None:
                return
            cid = f"{meta['frame_id']}/{meta.get('frame_compile_id')}"
            if meta.get("compiled_autograd_id") is not None:
                cid = f"!{meta['compiled_autograd_id']}/{cid}"
            payload = getattr(record, "payload", None)
            for event in _GRAPHS:
                if event in meta:
                    self.run.add_graph(cid, event, payload)
                    return
            if "inductor_output_code" in meta:
                self.run.add_inductor(cid, "output_code", payload)
                return
            art = meta.get("artifact")
            if isinstance(art, dict):
                name = art.get("name")
                if name == "inductor_post_grad_graph":
                    self.run.add_inductor(cid, "post_grad", payload)
                elif name == "fx_graph_runnable":
                    self.run.add_inductor(cid, "fx_graph_runnable", payload)
        except Exception as e:  # never into the compile
            self.run._failed("structured trace record", e)


class _IRHandler(logging.Handler):
    def __init__(self, run: ArtifactRun, kind: str):
        super().__init__(logging.DEBUG)
        self.run, self.kind = run, kind

    def emit(self, record: logging.LogRecord) -> None:
        try:
            cid = _upstream.current_compile_id()
            if cid is None:  # not attributable to a compile: counted, not written
                with self.run.lock:
                    self.run.dropped += 1
                return
            self.run.add_inductor(str(cid), self.kind, record.getMessage())
        except Exception as e:
            self.run._failed(self.kind, e)


class _Watch:
    """The handlers of one scope, on the structured trace and the IR loggers."""

    def __init__(self, run: ArtifactRun):
        self.loggers = [(_upstream.structured_trace_logger(), _TraceHandler(run), logging.DEBUG)]
        self.loggers += [(lg, _IRHandler(run, name), logging.INFO) for name, lg in _upstream.inductor_ir_loggers()]
        self.saved: list[int] = []

    def __enter__(self):
        for lg, h, level in self.loggers:
            self.saved.append(lg.level)
            if not lg.isEnabledFor(level):
                lg.setLevel(level)
            lg.addHandler(h)
        return self

    def __exit__(self, *exc) -> None:
        for (lg, h, _), level in zip(self.loggers, self.saved):
            lg.removeHandler(h)
            lg.setLevel(level)


class ArtifactCapture:
    """``with capture_artifacts(dir) as cap:`` -- see capture_artifacts."""

    def __init__(self, dir: str = DEFAULT_DIR, run_id: str | None = None, caches: bool = False):
        self.dir, self._run_id, self.caches = dir, run_id, caches
        self.run: ArtifactRun | None = None
        self._scope = None

    @property
    def run_dir(self) -> str | None:
        return self.run.run_dir if self.run else None

    def compiles(self) -> dict[str, dict]:
        """{compile directory: its meta.json content} of this capture so far."""
        if self.run is None:
            return {}
        with self.run.lock:
            return {c.dirname: c.meta(self.run.run_id) for c in self.run.compiles.values()}

    def __enter__(self) -> ArtifactCapture:
        self.run = ArtifactRun(self.dir, self._run_id)
        self._scope = self.run.scope(caches=self.caches)
        self._scope.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._scope.__exit__(*exc)
        self.run.close()


def capture_artifacts(dir: str = DEFAULT_DIR, *, run_id: str | None = None, caches: bool = False) -> ArtifactCapture:
    """``with kdebug.capture_artifacts(dir): ...`` saves, for every compile
    inside the block, the dynamo graph, AOTAutograd's graphs,
    Inductor's post-grad graph and scheduler IR, the generated module and
    each kernel's source under ``dir/<run-id>/<compile>/`` (Note [Compile
    artifacts]; the layout: docs/bringup.md).  caches=False (the default)
    turns Inductor's and AOTAutograd's caches off inside the block, so that
    every compile is lowered and written."""
    return ArtifactCapture(dir, run_id, caches)
