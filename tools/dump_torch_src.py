"""Print the parts of the installed torch that kdebug's hooks depend on (run on the GPU box)."""
import inspect, sys, torch
import torch._inductor.runtime.triton_heuristics as th
import torch._inductor.async_compile as ac
import torch._inductor.codecache as cc
print("torch", torch.__version__, "python", sys.version)
try:
    import triton; print("triton", triton.__version__)
except Exception as e:
    print("no triton", e)
def show(obj, n=400):
    try:
        src = inspect.getsource(obj)
    except Exception as e:
        print("!! cannot get source of", obj, e); return
    lines = src.splitlines()
    print(f"===== {getattr(obj,'__qualname__',obj)} ({len(lines)} lines)")
    print("\n".join(lines[:n]))
show(th.CachingAutotuner.run, 200)
show(th.CompileResult._gen_launcher_code)
show(th.StaticTritonCompileResult.make_launcher, 80)
show(ac.AsyncCompile.wait); show(ac.AsyncCompile.cpp_pybinding); show(ac.AsyncCompile._wait_futures, 40)
print("PyCodeCache attrs", [a for a in vars(cc.PyCodeCache) if not a.startswith("__")])
import torch._dynamo.callback as cb
print("callback triggers", list(cb.CallbackTrigger))
show(cb.CompilationCallbackHandler.install_callbacks)
import torch.utils._debug_mode as dm
print("debug_mode is package:", hasattr(dm, "__path__"), [n for n in dir(dm) if not n.startswith("__")])
print(inspect.signature(dm.DebugMode.__init__))
print("has _ACTIVE_DEBUG_MODE_COUNT:", hasattr(sys.modules[dm.DebugMode.__module__], "_ACTIVE_DEBUG_MODE_COUNT"))
import torch._inductor.output_code as oc
show(oc.CompiledFxGraph.__call__, 60)
print([a for a in vars(th.CachingAutotuner) if 'launch' in a or 'cache' in a])
