#!/usr/bin/env python3
"""Writes python_repr.json: Python's own repr() of floats and strings, and hashlib-based seeds.

Glossa's params text format is Python's, so tests/base/strings_test.cc and
tests/core/step_seed_test.cc check our C++ reprs and GenerateSeedFromName against these values.
Regenerate with: /usr/bin/python3 tests/reference/python_repr.py > tests/reference/python_repr.json
"""
import hashlib
import json
import random
import struct

random.seed(20261130)
floats = [0.0, -0.0, 1.0, -1.0, 100.0, 0.1, 2.71, 1e-6, 1e-5, 1.5e-5, 0.0001, 0.00012345,
          1e15, 1e16, 123456789012345678.0, 1.7976931348623157e308, 5e-324, 2.2250738585072014e-308,
          1/3, 2/3, 0.5, 3.14159, 1e22, 1e23, 9007199254740993.0, 12345.678, -0.001,
          float('inf'), float('-inf')]
for _ in range(200):
  floats.append(struct.unpack('<d', struct.pack('<Q', random.getrandbits(64)))[0])
for _ in range(100):
  floats.append(random.uniform(-1000, 1000) * 10 ** random.randint(-12, 20))
floats = [f for f in floats if f == f]  # NaN has no stable bit pattern to compare

strings = ['', 'hello', "it's", 'say "hi"', 'both \' and "', 'back\\slash', 'new\nline',
           'tab\there', '\r', '\x01\x7f', 'unicode: \u00e9\u4e2d', '\'\'"', "a'b'c\"d"]

names = ['test', '', 'global_step', 'lm/emb/w', 'encoder/layer_0/w', 'a' * 100, 'unicode \u00e9']


def seed(name):
  return int(hashlib.md5(name.encode('utf-8')).hexdigest(), 16) % (2**31 - 1)


out = {
    'floats': [[struct.unpack('<Q', struct.pack('<d', f))[0].__format__('016x'), repr(f)]
               for f in floats],
    'strings': [[s, repr(s)] for s in strings],
    'seeds': [[n, seed(n)] for n in names],
}
print(json.dumps(out, indent=1, ensure_ascii=False))
