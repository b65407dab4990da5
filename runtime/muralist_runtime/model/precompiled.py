"""A transformer compiled ahead of its calls, one function per call signature, that a new process loads instead of
compiling: torch's precompile (`torch.compile(...).aot_compile`, `torch.compiler.load_compiled_function`).

Why not only torch.compile with its caches loaded: a warm start there still traces the forward's bytecode again
with dynamo and runs AOTAutograd's post-compile, 3.5 s a rank for the trained tiny Flux on this CPU (measured:
half each), which eats a compiled run's lead on any job shorter than a minute. A precompiled function carries
its graph, its guards and its inductor code: loading one is unpickling it and importing its kernels (0.04 s
a call on top, measured).

A call signature is what the graph was specialised on: every tensor's shape, dtype and device, every other
argument's value (`guidance=None`, `return_dict=False`, ...) and the grad mode. Compiled with `fullgraph=True`
and static shapes, a function serves exactly that signature; the forward here looks each call's signature up
and compiles one it has not met (`compiled` counts them). The guards kept in a saved function are the portable
ones (tensors' metadata and the global state: torch's `keep_portable_guards_unsafe`), since what they would
otherwise check (the module's identity, its parameters' objects) is what the signature and the compile cache's
key stand for; the weights stay inputs of the graph, read from the live module at each call.

The guards are checked at a call key's first call only: the key holds what they check of the inputs (shapes,
strides, dtypes, devices, grad and inference flags) and the modes, and the rest of the global state they check
(default dtype, threads, deterministic algorithms) does not change while a job renders. Checked at every call
they cost 6.5 % of a compiled tiny-Flux item on a CPU (9 calls an item, py-spy).
"""

from __future__ import annotations

import hashlib
import io
import logging
from typing import Any

log = logging.getLogger("muralist.compile")
GUARD_FAILED = "GuardManager check failed"  # how a precompiled function refuses a call (torch's aot_compile.py)


def call_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    """What a compiled function is specialised on (see the module's docstring), as a hashable key: built at every
    call, so plain tuples (a few microseconds), not a pytree."""
    import torch

    return (tuple(_leaf(a) for a in args), tuple((k, _leaf(v)) for k, v in kwargs.items()),
            torch.is_grad_enabled(), torch.is_inference_mode_enabled())


def _leaf(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        # Whether it was made under inference_mode changes its dispatch keys, which a kept guard checks.
        return (tuple(value.shape), value.stride(), value.dtype, value.device, value.requires_grad,
                value.is_inference())
    if isinstance(value, dict):
        return ("dict", tuple((k, _leaf(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(_leaf(v) for v in value))
    return (type(value).__name__, repr(value))


def signature(key: tuple[Any, ...]) -> str:
    """A call key's name in the compile cache: a digest of its text."""
    return hashlib.sha256(repr(key).encode()).hexdigest()[:24]


class PrecompiledForward:
    """Installed as a module's `forward`: each call served by the function compiled for its signature."""

    def __init__(self, module: Any, compile_if_not: bool = True, cpp_wrapper: bool = False):
        self.module, self.compile_if_not = module, compile_if_not
        self.options = {"cpp_wrapper": True} if cpp_wrapper else {}  # inductor's wrapper code in C++
        forward = module.forward
        # Compiled again (a second pipeline setup on the same model): from its own forward, not the first one's.
        self.original: Any = forward.original if isinstance(forward, PrecompiledForward) else forward
        self.functions: dict[str, Any] = {}  # by signature
        self.by_key: dict[tuple[Any, ...], Any] = {}  # the same, by call key, as calls met them
        self.fresh: dict[str, Any] = {}  # compiled in this process, not yet taken for the compile cache
        self.compiled = 0
        self.fallback: Any = None  # torch.compile of the forward, once precompiling failed (see _precompile)

    def install(self) -> None:
        self.module.forward = self

    def load(self, functions: dict[str, bytes]) -> None:
        """Functions a compile cache entry holds, by signature."""
        import torch

        for sig, data in functions.items():
            if sig not in self.functions:
                self.functions[sig] = torch.compiler.load_compiled_function(io.BytesIO(data))

    def take_fresh(self) -> dict[str, bytes]:
        """The functions compiled since the last take, serialized for the compile cache."""
        from torch._dynamo.aot_compile import AOTCompiledFunction

        fresh, self.fresh = self.fresh, {}
        return {sig: AOTCompiledFunction.serialize(fn).serialized_data for sig, fn in fresh.items()}

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        key = call_key(args, kwargs)
        function = self.by_key.get(key)
        if function is None:
            sig = signature(key)
            function = self.functions.get(sig)
            if function is None and self.fallback is None:
                function = self._precompile(args, kwargs)
                if function is not None:
                    self.functions[sig] = self.fresh[sig] = function
            if function is None:
                return self.fallback(*args, **kwargs)
            self.by_key[key] = function
            return self._first_call(key, function, args, kwargs)
        return function(self.module, *args, **kwargs)

    def _first_call(self, key: tuple[Any, ...], function: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """A call key's first call: its function's guards checked, then no more for this key (the module's
        docstring says why)."""
        try:
            output = function(self.module, *args, **kwargs)
        except RuntimeError as e:
            if not str(e).startswith(GUARD_FAILED):
                raise
            reason = str(e).splitlines()[0]
        else:
            if hasattr(function, "disable_guard_check"):
                function.disable_guard_check()
            return output
        # A kept guard refused what the call key did not tell apart (checked before the graph runs: nothing
        # happened yet). This key runs as it is from now on; said once, since it is a gap in call_key.
        log.warning("%s: a precompiled function's guard refused a call (%s); this call signature runs uncompiled",
                    type(self.module).__name__, reason)
        self.by_key[key] = self._uncompiled
        return self.original(*args, **kwargs)

    def _uncompiled(self, _module: Any, *args: Any, **kwargs: Any) -> Any:
        return self.original(*args, **kwargs)

    def _precompile(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The function for a new signature; None when torch cannot precompile this forward (a guard it cannot
        keep, a value it cannot pickle: the API is young), which from here on is compiled the ordinary way
        (`compile_if_not`: slower to start from the compile cache, its artifacts, not wrong) or left as it is,
        warned about once."""
        import torch

        log.info("precompiling %s for a new call signature", type(self.module).__name__)
        compiler = torch.compile(self.original, fullgraph=True, dynamic=False,
                                 options={"guard_filter_fn": torch.compiler.keep_portable_guards_unsafe,
                                          **self.options})
        # Traced with the module's own forward in place: torch pickles the module's attributes with the function,
        # and this object's compiled functions cannot be pickled (a second signature of a process failed so:
        # "cannot pickle RootGuardManager").
        installed = self.module.__dict__.pop("forward", None)
        try:
            function = compiler.aot_compile((args, kwargs))
        except Exception as e:  # whatever torch raises, the forward still runs: see the docstring
            log.warning("cannot precompile %s (%s: %s); %s", type(self.module).__name__, type(e).__name__, e,
                        "compiling it the ordinary way" if self.compile_if_not else "left uncompiled")
            self.fallback = (torch.compile(self.original, fullgraph=True, dynamic=False) if self.compile_if_not
                             else self.original)
            return None
        finally:
            if installed is not None:
                self.module.forward = installed
        self.compiled += 1
        return function
