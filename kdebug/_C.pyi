"""Type stubs for kdebug's C extension (csrc/): every name the module has,
no other (tests/test_typed_boundary.py checks both ways, and the fields of every
struct sequence in order).  Records crossing between C and Python are named
types (Note [Typed boundaries] in csrc/kd_types.c)."""
from typing import Any, Callable, Sequence

KIND_TRITON: int
KIND_CPP: int
KIND_ATEN: int
OPS_EXTERN: int
OPS_ALL: int
ROLE_READ: int
ROLE_WRITE: int
SLOT_BYTES: int
STATE_RECORD_MAX: int  # tensors of one record_state record (hashed on the GPU: KD_GPU_BATCH_MAX)
NUM_SCALAR_TYPES: int
HASH_BITWISE: int
HASH_NORM: int
HASH_XOR: int
HASH_CUSTOM: int
HASH_STATS: int

# ---- struct sequences (C -> Python); fields in order ----

class HashValues(tuple[Any, ...]):
    """A tensor's hash values (Note [HashValues] in csrc/kd_hash_py.c): the
    kinds asked for hold values, the others 0."""
    bitwise: int
    l1: float
    nan: int
    posinf: int
    neginf: int
    xor64: int
    unsupported: int
    sum: float
    absmax: float

class TensorArg(tuple[Any, ...]):
    """A kernel's tensor argument as recorded (Launch.args)."""
    kind: str  # "tensor"
    name: str
    role: int  # ROLE_READ | ROLE_WRITE bits
    scalar_type: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    storage_offset: int
    data_ptr: int
    device: str

class ScalarArg(tuple[Any, ...]):
    """A kernel's non-tensor argument as recorded (Launch.args)."""
    kind: str  # "int", "float", "bool", "none" or "other"
    name: str
    role: int
    value: int | float | bool | str | None  # for "other": its type's name

class ArgHashes(tuple[Any, ...]):
    """One argument's hash record (Launch.hashes)."""
    kinds: int
    flags: int
    spec: int
    pre: HashValues | None
    post: HashValues | None

class PendingCall(tuple[Any, ...]):
    """An aten call whose hashes are still on the GPU (DebugMode._pending_calls)."""
    call: Any
    by_pytree: bool

class Extent(tuple[Any, ...]):
    """The bytes a tensor leaf covers (tree_extents)."""
    device_type: int
    device_index: int
    lo: int
    hi: int
    nbytes: int

class OpExtents(tuple[Any, ...]):
    """An aten call's extent trees (call._kd_extents, TraceOp.extents)."""
    inputs: Any
    outputs: Any

class TraceOp(tuple[Any, ...]):
    """A trace's op record (TraceReader.op)."""
    depth: int
    flags: int
    name: str
    text: str
    input_hashes: Any
    output_hashes: Any
    extents: OpExtents | None

class LastWrite(tuple[Any, ...]):
    """TraceReader.last_writer's answer."""
    index: int
    mask: int

class TraceTable(tuple[Any, ...]):
    """TraceReader.table's rows (Note [Trace tables])."""
    records: bytes
    args: bytes
    dims: bytes

class HashConfig(tuple[Any, ...]):
    """This thread's hash settings, as _set_hash_config returns the previous."""
    kinds: int
    hash_inputs: int
    check_readonly: int
    spec: int

class OutputConfig(tuple[Any, ...]):
    """This thread's record_outputs settings, as _set_record_outputs returns the previous."""
    on: bool
    budget: int
    filter: int

class RangeDigest(tuple[Any, ...]):
    """Recorder.digest's answer: one digest of a range of launch indices."""
    digest: int
    recorded: int  # launches of the range recorded (the others were lost)

class ProblemCounts(tuple[Any, ...]):
    """The recorder's counters a DebugMode warns about (Recorder.problem_counts)."""
    dropped: int
    errors: int
    outputs_skipped: int
    readonly_changed: int
    hash_unsupported: int

# ---- types ----

class TraceError(ValueError):
    """A trace file is corrupt, truncated inside its header, foreign or too new."""
    offset: int
    message: str

class KernelInfo:
    name: str
    arg_names: tuple[str, ...]
    roles: tuple[int, ...]
    launcher_args: int  # trailing launcher arguments not passed to the kernel, not recorded
    def __init__(self, kind: int, name: str, arg_names: Sequence[str], roles: Sequence[int],
                 device_type: int, device_index: int, launcher_args: int = 0) -> None: ...

class Launch:
    kind: str
    kernel_name: str
    grid: tuple[int, int, int] | None
    config: str | None
    num_warps: int | None
    num_stages: int | None
    shared_mem: int | None
    device: str
    stream: int
    thread_id: int
    launch_index: int
    store_index: int  # RuntimeError once detached
    py_index: int
    call_depth: int
    t_start_ns: int
    t_end_ns: int
    nargs: int
    raised: bool
    cuda_graph: dict[str, Any] | None
    args: tuple[TensorArg | ScalarArg, ...]
    objects: tuple[Any, ...] | None
    hashes: tuple[ArgHashes | None, ...]
    outputs: dict[int, dict[str, Any]]  # the recorder's, as of this record's generation
    custom: dict[tuple[int, int, int], Any]
    detached: bool  # holds its own copy: its recorder was cleared since
    def render(self, verbose: bool = False) -> str: ...
    def render_args(self, verbose: bool = False) -> str: ...

class Recorder:
    def __init__(self, capacity: int = ..., overflow: str = "overwrite", store_objects: bool = False) -> None: ...
    def start(self, mode: Any = None, ops: list | None = None, all_threads: bool = False) -> None: ...
    def stop(self) -> None: ...
    def drain(self, *, wait: bool = True) -> int: ...
    def clear(self) -> None: ...
    def forget(self, n: int) -> None: ...  # drop the oldest n stored launches
    def settle(self, *, wait: bool = True) -> None: ...  # GPU hashes into the ring's records, nothing drained
    def digest(self, start: int, stop: int) -> RangeDigest | None: ...  # Note [Steps held in the ring]; None: hashes still on the GPU
    def discard(self, launch_index: int) -> int: ...  # drop stored and ring launches before launch_index, no drain
    def set_ops(self, ops: list) -> None: ...
    def splice(self, ops: list, items: list, merged: int) -> None: ...
    def launch(self, i: int) -> Launch: ...
    def position(self, launch_index: int) -> int: ...  # first stored launch with launch_index >= it (binary search)
    def stats(self) -> dict[str, Any]: ...  # "dropped" walks the unread ring once it went round (kd_ring_lost_fast)
    def problem_counts(self) -> ProblemCounts: ...  # stats()'s counters DebugMode warns about, no dict
    def problem_state(self) -> bytes: ...  # problem_counts()' counters packed: equal bytes, no counter moved
    seen: int        # launches seen so far, O(1)
    slots_used: int  # ring slots not yet drained, O(1)
    held_launches: int  # stored + still in the ring (a walk of the ring's headers)
    ticket: int  # the ring's next ticket: a hint for digest()
    held_from: int | None  # after the last drain: first launch left waiting for GPU hashes
    capacity: int    # ring capacity in slots
    def messages(self) -> list[str]: ...
    def is_recording(self) -> bool: ...
    def record(self, info: KernelInfo, args: tuple, stream: int = 0) -> bool: ...
    def hash_window(self, n: int, spec: int) -> int: ...  # Note [Hash windows]: hash every launch bitwise too while n > 0
    def prefault(self) -> int: ...  # Note [Ring prefault]: touch the ring's pages now (bytes); not while started
    def resident(self) -> int: ...  # bytes of the ring resident in memory now (mincore)
    outputs: dict[int, dict[str, Any]]
    custom: dict[tuple[int, int, int], Any]
    owner_thread: int  # threading.get_ident() of the thread that last started it
    def __len__(self) -> int: ...

class PendingHash: ...

class RunHook:
    __wrapped__: Callable[..., Any]
    def __init__(self, orig: Callable[..., Any], builder: Callable[[Any], KernelInfo],
                 finisher: Callable[[Any, tuple], Any]) -> None: ...  # finisher -> kdebug._boundary.TritonLaunch | None
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

class RunnerHook:
    __wrapped__: Callable[..., Any]
    def __init__(self, runner: Callable[..., Any], config_id: int, num_warps: int, num_stages: int,
                 shared: int) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...

class CppKernel:
    __wrapped__: Callable[..., Any]
    info: KernelInfo
    def __init__(self, fn: Callable[..., Any], info: KernelInfo) -> None: ...
    def __call__(self, *args: Any) -> Any: ...

NOT_STORED_TEXT: str  # an op's text when the trace's string table was full

class TraceWriter:
    def __init__(self) -> None: ...
    def launches(self, recorder: Recorder, start: int, stop: int) -> None: ...
    def op(self, depth: int, flags: int, name: str, text: str, input_hashes: Any, output_hashes: Any,
           extents: OpExtents | None = None) -> None: ...  # a TraceOp's fields, by keyword
    def meta(self, json: str) -> None: ...
    def seal(self) -> None: ...
    def end(self) -> None: ...
    def take(self) -> bytes: ...
    def stats(self) -> dict[str, int]: ...

class TraceReader:
    def __init__(self, data: Any) -> None: ...  # any buffer; raises TraceError
    def info(self) -> dict[str, Any]: ...
    def types(self) -> bytes: ...
    def digests(self) -> memoryview: ...
    def op(self, i: int, make_norm: Callable[..., Any]) -> TraceOp: ...
    def table(self, start: int, stop: int) -> TraceTable: ...
    def strings(self) -> list[str]: ...
    def last_writer(self, before: int, dev_type: int, dev_index: int, lo: int, hi: int,
                    leaf: int) -> LastWrite | None: ...

# ---- functions ----

def intern(s: str) -> int: ...
def string(id: int) -> str: ...
def scalar_type(dtype: Any) -> int: ...
def tensor_meta(t: Any) -> dict[str, Any] | None: ...
def now_ns() -> int: ...
def hash(t: Any, kinds: int = 7) -> HashValues: ...
def hash_async(t: Any, kinds: int, stream: int) -> Any: ...  # HashValues | PendingHash | NotImplemented
def hash_fetch(pending: PendingHash) -> HashValues | None: ...  # None: no value (asked during a CUDA graph capture; queuing failed)
def hash_collect() -> int: ...
def gpu_info() -> dict[str, Any]: ...
# Note [CUDA graph replays] (kdebug/cudagraphs.py)
def graph_capture_begin(device: int, stream: int) -> int: ...  # 0: not recording, nothing kept
def graph_capture_started(handle: int, stream: int) -> None: ...
def graph_capture_end(handle: int) -> dict[str, Any]: ...
def graph_replay(handle: int, stream: int) -> int: ...  # the replay index, -1 when not recorded
def graph_replay_queued(ok: bool) -> None: ...  # Note [Results in flight]
def graph_unknown_replay() -> None: ...
def graph_release(handle: int) -> None: ...
def graph_stats() -> dict[str, Any]: ...
def graph_activity() -> int: ...  # graphs registered + replays + unknown replays so far (0: none)
def unfollowed_launches() -> int: ...  # compiled launches on threads no started recorder followed (Note [Launches no recording follows])
def collect_ready(at_least: int = 0) -> int: ...  # 0, or -1 on a CUDA error; never waits for the device
def defer_flush() -> int: ...  # 0, or -1 when some of it failed (counted)
def defer_stats() -> dict[str, Any]: ...
def defer_failures() -> int: ...  # defer_stats()'s hash_failures + copy_failures
def op_hash_inputs(mode: Any, func: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict] | None: ...  # Note [Hashes of one op on every path]
def op_hash_outputs(mode: Any, func: Any, args: tuple, kwargs: dict, result: Any, add_fresh: bool) -> Any: ...  # None: no hash
def op_track_fresh(mode: Any, func: Any, args: tuple, kwargs: dict, result: Any) -> None: ...  # Note [Fresh buffers]
def _fresh_storages() -> dict[int, Any]: ...  # a DebugMode's table of fresh storages (Note [Fresh buffers])
def tree_resolve(obj: Any, value_fn: Callable[[HashValues, int], Any]) -> Any: ...
def tree_extents(obj: Any) -> Any: ...  # obj with Extent leaves, or NotImplemented
def tree_leaf_digest(value: Any) -> int: ...
def format_args(args: tuple) -> str: ...
def format_kwargs(kwargs: dict) -> str: ...
def format_output(result: Any) -> str | None: ...
def dispatch(mode: Any, func: Any, types: tuple, args: tuple, kwargs: dict | None) -> Any: ...
def _set_hash_config(kinds: int, hash_inputs: int, check_readonly: int, spec: int) -> HashConfig: ...
def _set_record_outputs(on: bool, budget: int, filter: int = 0) -> OutputConfig: ...
def _set_output_filter(fn: Callable[[int, Any, str, int], bool] | None) -> None: ...
def _set_hashers(slow: Callable | None, custom: Callable | None, stats_type: type | None = None) -> None: ...
def _set_defer(mode: int) -> int: ...  # 0 off, 1 dispatch mode guards, 2 C++ write guard
def _write_guard_probe(on: bool) -> bool: ...
def _write_guard_log() -> dict[str, Any]: ...
def _phase_timers(reset: bool = False, /) -> list[dict[str, Any]]: ...  # Note [Phase timers]: diagnostic builds only
def write_guard_stats() -> dict[str, int]: ...
def _empty_like(t: Any) -> Any: ...
def _register_types(*, op_info: type, hash_hook: type, record_hook: Any, triton_launch: type) -> None: ...
def _dispatch_method(cls: type, get_eval_frame_callback: Callable[[], Any],
                     set_eval_frame: Callable[[Any], Any]) -> Any: ...
def _configure_dispatch(op_info: Callable[[Any], Any], upstream_dispatch: Callable, stream_tick: Callable,
                        tree_hash_py: Callable, tree_clone_py: Callable, thread_hooks: Any, utils_module: Any,
                        op_call: type, template: dict | None, len_dispatch_stack: Callable[[], int]) -> None: ...
def _set_dtype_names(names: dict) -> int: ...
def _configure(*, benchmark_globals: dict, count_globals: dict, get_active_debug_mode: Callable[[], Any],
               mode_class: type) -> None: ...
def _configure_fmt(tensor: type, parameter: type, leaves: tuple, leaf_text: Callable[[Any, bool], Any] | None = None) -> None: ...
def _inductor_get_active_debug_mode() -> Any: ...
def _modes_pushed(delta: int) -> int: ...
def _set_compiling(on: bool) -> int: ...
def _op_observer(recorder: Recorder, mode: int, all_threads: bool) -> int: ...
def _op_observer_remove(recorder: Recorder, handle: int) -> None: ...
def _op_observer_starts() -> int: ...
def _graph_call(entering: bool) -> int: ...
def _recording_here() -> bool: ...  # a started recorder records this thread's launches (own, carried, global)
def _mode_here() -> Any: ...  # the DebugMode of that recorder, or None
def _cpp_launch_stats() -> dict[str, int]: ...
def _cpp_launch_fault_hook(fn: Callable[[str, dict[str, Any]], object] | None, /) -> None: ...
def _inject_hook_faults(n: int) -> None: ...
def _prefetch_grads(on: bool) -> bool: ...
def _one_pass_records(on: bool) -> bool: ...
def _inject_detach_faults(n: int) -> None: ...
# the launch table (Note [Launch table] in csrc/core/kd_launch_table.h)
class LaunchTable:
    def __init__(self) -> None: ...
    def __len__(self) -> int: ...
    def launch(self, i: int) -> Launch: ...
def launch_digests(table: Recorder | LaunchTable) -> bytes: ...
def record_state(name: str, arg_names: list[str] | bytes, tensors: list[Any]) -> bool: ...  # Note [Replica state records]; bytes: intern_names(...)
def intern_names(names: list[str]) -> bytes: ...  # Note [Replica names interned once]
def replica_devices(tensors: list[Any], plain_types: tuple[type, ...]) -> list[int | None] | None: ...  # Note [Plain replica tensors]
def record_grads(*, what: str, groups: list, sizes: list[int], params: list, devices: list[int | None],
                 ids: list[bytes], indices: list[bytes], plain_types: tuple[type, ...]) -> int | None: ...  # Note [Replica checks in C]
def state_unchanged(groups: list, state: dict, check: Any, tensor_type: type) -> bool: ...  # Note [Replica checks in C]
def range_digest(table: Recorder | LaunchTable, start: int, stop: int) -> int: ...
def op_digests(depth: int, flags: int, name: str, text: str, in_tree: Any, out_tree: Any) -> bytes: ...
def key_digest(kind: int, name: str) -> int: ...
def table_fill(table: LaunchTable, reader: Any, spec_map: dict[int, int], start: int, stop: int) -> list[int]: ...
