#!/usr/bin/env python3
"""Trajectories of PyTorch's optimizers for tests/optim/optimizer_test.cc.

For the optimizers whose update is the same math as TensorFlow's (SGD, momentum, Nesterov momentum,
Adagrad without epsilon, Adadelta), runs torch.optim for several steps on fixed random gradients and
records the weights and slots after every step. (Adam and RMSProp in TensorFlow's form, and
Adafactor, differ from torch.optim's and are checked against formula implementations in the test.)

Regenerate with Debian's python3-torch:
  /usr/bin/python3 tests/reference/optimizer_reference.py > tests/reference/optimizer_reference.json
"""
import json

import torch

torch.manual_seed(7)
STEPS = 5
W0 = torch.randn(4, 3, dtype=torch.float64)
GRADS = [torch.randn(4, 3, dtype=torch.float64) for _ in range(STEPS)]
LR = 0.1


def run(name, make, slot_names):
  w = W0.clone().requires_grad_(True)
  opt = make([w])
  steps = []
  for g in GRADS:
    w.grad = g.clone()
    opt.step()
    state = opt.state[w]
    steps.append({'w': w.detach().reshape(-1).tolist(),
                  'slots': {ours: state[theirs].reshape(-1).tolist()
                            for ours, theirs in slot_names.items()}})
  return {'name': name, 'steps': steps}


cases = [
    run('sgd', lambda p: torch.optim.SGD(p, lr=LR), {}),
    run('momentum', lambda p: torch.optim.SGD(p, lr=LR, momentum=0.9),
        {'momentum': 'momentum_buffer'}),
    run('nesterov', lambda p: torch.optim.SGD(p, lr=LR, momentum=0.9, nesterov=True),
        {'momentum': 'momentum_buffer'}),
    run('adagrad', lambda p: torch.optim.Adagrad(p, lr=LR, initial_accumulator_value=1.0, eps=0.0),
        {'accumulator': 'sum'}),
    run('adadelta', lambda p: torch.optim.Adadelta(p, lr=LR, rho=0.95, eps=1e-8),
        {'accum': 'square_avg', 'accum_update': 'acc_delta'}),
]
print(json.dumps({'generator': 'tests/reference/optimizer_reference.py', 'lr': LR,
                  'w0': W0.reshape(-1).tolist(), 'shape': [4, 3],
                  'grads': [g.reshape(-1).tolist() for g in GRADS], 'cases': cases}))
