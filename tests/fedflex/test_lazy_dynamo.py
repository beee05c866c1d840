"""fedflex.lazy_dynamo: training without the ``torch._dynamo`` import (about 1 s a process).

The checks run in a fresh Python: in this one another test may have imported
``torch._dynamo`` already, and :func:`fedflex.lazy_dynamo.step` then calls
``optimizer.step()`` itself, which would make a comparison with it pass trivially.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]

SCRIPT = r"""
import json, sys
import torch
from fedflex.lazy_dynamo import defer_dynamo_import, step

deferred = defer_dynamo_import()
make = {
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9, weight_decay=0.01),
    "sgd-nesterov": lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.5, nesterov=True),
    "adam": lambda p: torch.optim.Adam(p, lr=0.01, weight_decay=0.001),
}[sys.argv[1]]

def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))

def train(stepper):
    m = model(); opt = make(m.parameters())
    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        x = torch.randn(5, 4, generator=g)
        opt.zero_grad(set_to_none=True)
        m(x).pow(2).mean().backward()
        stepper(opt)
    return m, opt

fn = torch.optim.Optimizer.zero_grad.__wrapped__
ours, ours_opt = train(step)
while_deferred = getattr(fn, "__dynamo_disable").__qualname__
imported_by_ours = "torch._dynamo" in sys.modules
state = ours_opt.state_dict()  # deferred methods: still no import
ours_opt.load_state_dict(state)
imported_after_state = "torch._dynamo" in sys.modules

hooked = []
m = model(); opt = make(m.parameters())
opt.register_step_pre_hook(lambda o, a, k: hooked.append(1))
m(torch.ones(2, 4)).sum().backward(); step(opt)

ref, ref_opt = train(lambda o: o.step())  # torch's own: imports torch._dynamo
same_params = all(torch.equal(a, b) for a, b in zip(ours.parameters(), ref.parameters()))
s1, s2 = ours_opt.state_dict()["state"], ref_opt.state_dict()["state"]
def equal(a, b):
    return torch.equal(torch.as_tensor(a), torch.as_tensor(b))
same_state = s1.keys() == s2.keys() and all(
    s1[k].keys() == s2[k].keys() and all(equal(s1[k][n], s2[k][n]) for n in s1[k]) for k in s1
)
moved = max(float((a - b).detach().abs().max()) for a, b in zip(ours.parameters(), model().parameters()))

# once torch._dynamo is loaded (torch's own step above), a deferred method gets torch's own
# disabled function
opt.zero_grad()
after = getattr(fn, "__dynamo_disable").__qualname__
print(json.dumps({
    "deferred": deferred,
    "imported_by_ours": imported_by_ours,
    "imported_after_state": imported_after_state,
    "hook_calls": len(hooked),
    "same_params": same_params,
    "same_state": same_state,
    "moved": moved,
    "while_deferred": while_deferred,
    "after": after,
}))
"""


@pytest.mark.parametrize("optimizer", ["sgd", "sgd-nesterov", "adam"])
def test_a_step_without_dynamo_is_bit_identical_to_torchs_step_and_keeps_hooks(optimizer):
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, optimizer], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    # torch 2.x wraps four Optimizer methods (add_param_group, zero_grad, state_dict, load_state_dict)
    assert got["deferred"] == 4
    assert got["imported_by_ours"] is False and got["imported_after_state"] is False
    assert got["hook_calls"] == 1  # a step hook: torch's own step, hook included
    assert got["moved"] > 1e-3  # the steps did train
    assert got["same_params"] and got["same_state"]
    assert got["while_deferred"] == "_deferred.<locals>.call"
    assert got["after"] != got["while_deferred"]
