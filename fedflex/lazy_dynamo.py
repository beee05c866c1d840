"""Train with a torch optimiser without importing ``torch._dynamo`` (about 1 s a process).

torch marks a few methods of :class:`torch.optim.Optimizer` (``add_param_group``, which
every optimiser's ``__init__`` calls, ``zero_grad``, ``state_dict``,
``load_state_dict``) with ``torch._disable_dynamo``: a wrapper that imports
``torch._dynamo`` on its first call and then runs the method under
``torch._dynamo.disable``, so that ``torch.compile`` does not trace into it. So the
first optimiser of a process costs that import: 1.05 s here against 1.38 s for
``import torch`` itself (``benchmarks/startup.py``), paid again by every Ray worker and
every ClientApp process, though nothing in fedflex's training is compiled.

:func:`defer_dynamo_import` fills the wrapper's cache (``fn.__dynamo_disable``, which
the wrapper reads first) with a function that calls the method itself while
``torch._dynamo`` was never imported (nothing can be compiling then: ``torch.compile``
imports it), and once it was, builds and keeps torch's own disabled method, as the
wrapper would have. So behaviour is torch's in both cases; only the import waits until
something needs it. On a torch whose wrapper is not this one it changes nothing.

``Optimizer.step`` is the other importer: torch wraps every optimiser's ``step`` in a
function that imports ``torch._dynamo`` at each call, to put a graph break around the
step under ``torch.compile``, and runs the step with autograd off. :func:`step` runs
the optimiser's own step under ``torch.no_grad()`` instead, with the profiler range
torch gives it, when that is all the wrapper would do: no step hook registered (global
or the optimiser's), not a ``differentiable`` optimiser, ``torch._dynamo`` never
imported, and the wrapping exactly torch's; otherwise it calls ``optimizer.step()``.
The arithmetic is the same function on the same tensors: bit-identical (the tests check
SGD with momentum and weight decay, and Adam, against ``optimizer.step()``).

Measured (this 2-core CPU, ``benchmarks/overhead.py``): 1.05 s for the first
optimiser of a process alone; on the Ray backend and under ``flwr run`` each worker
spent 2.4 s of its CPU in that import (py-spy), both workers at once.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Optional

import torch
from torch.optim import optimizer as optim_module

_CACHE = "__dynamo_disable"  # the attribute torch._compile._disable_dynamo's wrapper caches in
_done = False


def _deferred(fn: Callable[..., Any], recursive: bool) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        if "torch._dynamo" not in sys.modules:  # never imported: nothing is compiling
            return fn(*args, **kwargs)
        import torch._dynamo

        disabled = torch._dynamo.disable(fn, recursive, wrapping=False)
        setattr(fn, _CACHE, disabled)  # from now on torch's wrapper finds its own
        return disabled(*args, **kwargs)

    return call


def defer_dynamo_import() -> int:
    """Defer ``torch._dynamo``'s import in :class:`torch.optim.Optimizer`'s wrapped methods
    (once a process); returns how many methods it deferred (0: none, or already done).
    """
    global _done
    if _done or "torch._dynamo" in sys.modules:
        _done = True
        return 0
    _done = True
    try:
        from torch._compile import _disable_dynamo
    except ImportError:
        return 0
    wrapper_code = _disable_dynamo(lambda: None).__code__  # every wrapped method shares it
    count = 0
    for cls in torch.optim.Optimizer.__mro__:
        for method in vars(cls).values():
            if getattr(method, "__code__", None) is not wrapper_code or not method.__closure__:
                continue
            cells = dict(zip(method.__code__.co_freevars, (c.cell_contents for c in method.__closure__)))
            fn, recursive = cells.get("fn"), cells.get("recursive", True)
            if fn is None or getattr(fn, _CACHE, None) is not None:
                continue
            setattr(fn, _CACHE, _deferred(fn, recursive))
            count += 1
    return count


_raw_steps: dict[type, Optional[Callable[..., Any]]] = {}


def _raw_step(cls: type) -> Optional[Callable[..., Any]]:
    """Return the step function ``cls`` defines, under exactly torch's two wrappers (the
    hooks and profiler range of ``Optimizer.profile_hook_step``, then the no-grad and
    graph breaks of ``_use_grad_for_differentiable``); None if its wrapping is any other.
    """
    if cls in _raw_steps:
        return _raw_steps[cls]
    raw = None
    try:
        from torch.optim.optimizer import _use_grad_for_differentiable

        hooks_code = torch.optim.Optimizer.profile_hook_step(lambda *a: None).__code__
        grad_code = _use_grad_for_differentiable(lambda *a: None).__code__
        outer = getattr(cls, "step", None)
        inner = getattr(outer, "__wrapped__", None)
        if getattr(outer, "__code__", None) is hooks_code and getattr(inner, "__code__", None) is grad_code:
            candidate = getattr(inner, "__wrapped__", None)
            if callable(candidate) and getattr(candidate, "__code__", None) not in (hooks_code, grad_code):
                raw = candidate
    except (ImportError, AttributeError):
        raw = None
    _raw_steps[cls] = raw
    return raw


def step(optimizer: Any) -> None:
    """Run ``optimizer.step()``, without the ``torch._dynamo`` import when nothing needs it
    (see the module docstring; a hook, a differentiable optimiser, a loaded
    ``torch._dynamo`` or another wrapping: ``optimizer.step()`` itself).
    """
    raw = _raw_step(type(optimizer))
    if (
        raw is None
        or "torch._dynamo" in sys.modules
        or optimizer.defaults.get("differentiable", False)
        or getattr(optim_module, "_global_optimizer_pre_hooks", True)
        or getattr(optim_module, "_global_optimizer_post_hooks", True)
        or getattr(optimizer, "_optimizer_step_pre_hooks", True)
        or getattr(optimizer, "_optimizer_step_post_hooks", True)
    ):
        optimizer.step()
        return
    with torch.autograd.profiler.record_function(f"Optimizer.step#{type(optimizer).__name__}.step"):
        with torch.no_grad():
            raw(optimizer)
        profiler_entry = getattr(optimizer, "_optimizer_step_code", None)  # torch's hook for its profiler
        if profiler_entry is not None:
            profiler_entry()
