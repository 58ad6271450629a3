"""Build kdebug's C extension against the torch that is already installed.

kdebug never asks for torch in an isolated build environment (that would pull
the newest CUDA build of torch, several GB): install torch first, then

    pip install --no-build-isolation -e .

Environment switches:
    KDEBUG_DEBUG=1        -O0 -g, assertions on
    KDEBUG_SANITIZE=...   e.g. "address,undefined": build the extension with
                          these sanitizers (run python with LD_PRELOAD of the
                          sanitizer runtime)
"""
import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

MIN_TORCH = (2, 11)


def torch_build_info():
    try:
        import torch
        from torch.utils import cpp_extension
    except ImportError:
        sys.exit(
            "kdebug builds against the torch that is already installed, and none is.\n"
            "Install torch first (for example `pip install torch==2.13.0`), then run\n"
            "`pip install --no-build-isolation -e .` so pip does not fetch another torch."
        )
    version = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2])
    if version < MIN_TORCH:
        sys.exit(
            f"kdebug needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} (found {torch.__version__}): "
            "it hooks Inductor's CachingAutotuner.run and mirrors torch.utils._debug_mode, "
            "whose Triton-kernel records first appear in that form there."
        )
    lib_dir = os.path.join(os.path.dirname(torch.__file__), "lib")
    abi = int(torch.compiled_with_cxx11_abi())
    # Use the C++ standard torch's own extension builder uses: its headers'
    # class layouts depend on it (torch 2.13 needs C++20).
    with open(cpp_extension.__file__) as f:
        std = "c++20" if "-std=c++20" in f.read() else "c++17"
    return cpp_extension.include_paths(), lib_dir, (abi, std)


C_SOURCES = [
    # csrc/core/: the Python-free core, also built and tested alone (make -C csrc test)
    "csrc/core/kd_ring.c",
    "csrc/core/kd_clock.c",
    "csrc/core/kd_strtab.c",
    "csrc/core/kd_store.c",
    "csrc/core/kd_launch_table.c",
    "csrc/core/kd_render.c",
    "csrc/core/kd_hash.c",
    "csrc/core/kd_runs.c",
    "csrc/core/kd_results.c",
    "csrc/core/kd_inflight.c",
    "csrc/core/kd_crc32.c",
    "csrc/core/kd_trace_write.c",
    "csrc/core/kd_trace_read.c",
    "csrc/core/kd_trace_tree.c",
    "csrc/core/kd_trace_extents.c",
    "csrc/core/kd_trace_digest.c",
    "csrc/core/kd_trace_search.c",
    "csrc/core/kd_trace_table.c",
    # the Python-facing C
    "csrc/kd_recorder.c",
    "csrc/kd_launch.c",
        "csrc/kd_launch_ctx.c",
    "csrc/kd_launch_hash.c",
    "csrc/kd_cuda_describe.c",
    "csrc/kd_kernel_info.c",
    "csrc/kd_hook.c",
    "csrc/kd_view.c",
    "csrc/kd_fmt.c",
    "csrc/kd_dispatch.c",
    "csrc/kd_hash_args.c",
    "csrc/kd_fresh.c",
    "csrc/kd_dispatch_method.c",
    "csrc/kd_op_observer.c",
    "csrc/kd_cpp_launch.c",
    "csrc/kd_state_record.c",
    "csrc/kd_op_writes.c",
    "csrc/kd_module.c",
    "csrc/kd_hash_py.c",
    "csrc/kd_tree.c",
    "csrc/kd_defer.c",
    "csrc/kd_write_guard.c",
    "csrc/kd_phase_timers.c",
    "csrc/kd_trace_py.c",
    "csrc/kd_launch_table_py.c",
    "csrc/kd_hash_tree.c",
    "csrc/kd_types.c",
    "csrc/kd_graph.c",
]
CXX_SOURCES = ["csrc/kd_torch.cpp"]  # the only file that includes libtorch headers
CUDA_SOURCES = ["csrc/kd_cuda_hash.cu", "csrc/kd_cuda_copy.cu", "csrc/kd_cuda_graph.cu"]  # CUDA runtime only, no libtorch headers
CUDA_STUB = "csrc/kd_cuda_stub.c"     # the same C API where torch has no CUDA


def cuda_build_info():
    """(nvcc, cuda_home, gencode flags) when torch has CUDA and nvcc is there, else None.
    KDEBUG_NO_CUDA=1 forces a CPU-only build."""
    if os.environ.get("KDEBUG_NO_CUDA") == "1":
        return None
    import shutil

    import torch
    from torch.utils import cpp_extension

    if torch.version.cuda is None:
        return None
    home = cpp_extension.CUDA_HOME
    nvcc = os.path.join(home, "bin", "nvcc") if home else shutil.which("nvcc")
    if not nvcc or not os.path.exists(nvcc):
        print("kdebug: torch has CUDA but nvcc was not found: building without GPU hashing", file=sys.stderr)
        return None
    archs = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if archs:
        caps = [a.replace("+PTX", "") for a in archs.replace(",", ";").split(";") if a.strip()]
    elif torch.cuda.is_available():
        caps = sorted({"%d.%d" % torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    else:
        caps = ["8.0", "9.0"]
    flags = []
    for c in caps:
        n = c.replace(".", "")
        flags += ["-gencode", f"arch=compute_{n},code=sm_{n}"]
    n = caps[-1].replace(".", "")
    flags += ["-gencode", f"arch=compute_{n},code=compute_{n}"]  # PTX for newer GPUs
    return nvcc, home or os.path.dirname(os.path.dirname(nvcc)), flags


class BuildExt(build_ext):
    """Compiles .c files as C11 and the one .cpp file as C++17 with torch's ABI."""

    def build_extensions(self):
        _, _, (abi, std) = torch_build_info()
        debug = os.environ.get("KDEBUG_DEBUG") == "1"
        sanitize = os.environ.get("KDEBUG_SANITIZE", "")
        common = ["-O0", "-g"] if debug else ["-O2", "-DNDEBUG"]
        if os.environ.get("KDEBUG_PHASE_TIMERS") == "1":  # Note [Phase timers]: a diagnostic build
            common.append("-DKD_PHASE_TIMERS=1")
        if sanitize:
            common += [f"-fsanitize={sanitize}", "-fno-omit-frame-pointer"]
            for ext in self.extensions:
                ext.extra_link_args.append(f"-fsanitize={sanitize}")
        c_flags = ["-std=c11", "-D_GNU_SOURCE=1", "-Wall", "-Wextra", "-Wno-unused-parameter",
                   "-Wno-cast-function-type", "-Wno-missing-field-initializers"]
        cxx_flags = [f"-std={std}", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", "-fvisibility=hidden",
                     "-Wno-unused-parameter"]
        original = self.compiler._compile

        def _compile(obj, src, ext, cc_args, extra_postargs, pp_opts):
            flags = cxx_flags if src.endswith(".cpp") else c_flags
            # drop the distutils defaults that fight ours (-O3 / -DNDEBUG come first)
            return original(obj, src, ext, cc_args, [*extra_postargs, *common, *flags], pp_opts)

        self.compiler._compile = _compile
        cuda = cuda_build_info()
        for ext in self.extensions:
            if cuda is None:
                ext.sources.append(CUDA_STUB)
                continue
            nvcc, home, gencode = cuda
            os.makedirs(self.build_temp, exist_ok=True)
            cap = os.environ.get("KDEBUG_CUDA_LAUNCH_CAP", "")  # Note [One hash kernel per batch]: tests of the split
            defines = [f"-DKD_CUDA_LAUNCH_CAP={int(cap)}"] if cap else []
            for src in CUDA_SOURCES:
                obj = os.path.join(self.build_temp, os.path.basename(src)[:-3] + ".o")
                self.spawn([nvcc, "-O3", "-std=c++17", "-Xcompiler", "-fPIC", "-Icsrc", "-Icsrc/core", *gencode, *defines,
                            "-c", src, "-o", obj])
                ext.extra_objects.append(obj)
            lib = os.path.join(home, "lib64")
            ext.library_dirs.append(lib)
            ext.libraries.append("cudart")
            ext.extra_link_args.append(f"-Wl,-rpath,{lib}")
        super().build_extensions()


def extension():
    include_dirs, lib_dir, _ = torch_build_info()
    return Extension(
        "kdebug._C",
        sources=C_SOURCES + CXX_SOURCES,
        include_dirs=["csrc", "csrc/core", *include_dirs],
        library_dirs=[lib_dir],
        libraries=["c10", "torch", "torch_cpu", "torch_python"],
        extra_link_args=[f"-Wl,-rpath,{lib_dir}"],
        language="c++",
    )


setup(ext_modules=[extension()], cmdclass={"build_ext": BuildExt})
