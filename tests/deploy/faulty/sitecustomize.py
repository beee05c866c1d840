"""Fault injection for the loopback tests: a SuperNode whose ClientApp sends NaN weights
(``FEDFLEX_FAULT=nan``) or says it trained on NaN examples (``FEDFLEX_FAULT=nan-examples``).

In a Flower deployment every SuperNode runs the same app (the FAB of the run), so a
"broken client" cannot be a different ClientApp. Instead the test starts one SuperNode
with this directory on ``PYTHONPATH`` and ``FEDFLEX_FAULT=nan``: Python imports this
``sitecustomize`` in every process of that node (SuperNode, SuperExec, and each
``flwr-clientapp`` process, which inherit the environment), and once
``clients.rules`` is imported there, every local rule in ``LOCAL_RULES`` is wrapped so
that the model it returns is all NaN (or its ``num-examples`` is NaN). ``clients/client_app.py`` is unchanged; the other
SuperNodes are unaffected. Without ``FEDFLEX_FAULT`` this module does nothing.
"""

import os
import sys

_TARGET = "fedflex.clients.rules"


def _poison(module) -> None:
    import dataclasses

    import torch

    fault = os.environ.get("FEDFLEX_FAULT")

    def wrap(rule):
        def broken(inp):
            out = rule(inp)
            if fault == "nan-examples":
                out.result = dataclasses.replace(out.result, num_examples=float("nan"))
                return out
            tensors = list(inp.model.state_dict().values())
            if getattr(out, "arrays", None) is not None:
                tensors += list(out.arrays.values())
            with torch.no_grad():
                for t in tensors:
                    if t.is_floating_point():
                        t.fill_(float("nan"))
            return out

        return broken

    for name, rule in list(module.LOCAL_RULES.items()):
        module.LOCAL_RULES[name] = wrap(rule)
    print(f"sitecustomize: FEDFLEX_FAULT={fault}: {len(module.LOCAL_RULES)} local rules return NaN", file=sys.stderr)


class _PoisonAfterImport:
    """Meta path finder: let the other finders find ``clients.rules``, then poison the
    module right after it executed."""

    def find_spec(self, name, path=None, target=None):
        if name != _TARGET:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        execute = loader.exec_module

        def exec_module(module):
            execute(module)
            _poison(module)

        loader.exec_module = exec_module
        return spec


if os.environ.get("FEDFLEX_FAULT") in ("nan", "nan-examples"):
    sys.meta_path.insert(0, _PoisonAfterImport())
