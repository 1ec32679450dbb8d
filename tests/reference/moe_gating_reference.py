#!/usr/bin/env python3
"""Reference cases for GShard's Top-2 Mixture-of-Experts gating, from PyTorch.

Ports Lingvo's `Top2GatingOnLogits` (lingvo/core/gshard_layers.py) to PyTorch, following
Lingvo's algorithm line by line (not the C++ code), in float64 on the CPU. XLA sharding,
expert_padding_idx and mask_dtype are left out. Besides aux_loss and the combine and dispatch
tensors, every case records the final expert capacity C and the two summaries Lingvo writes,
over_capacity_1_ratio and over_capacity_2_ratio.

Lingvo draws its random numbers inside the function; here they are inputs, drawn from seeded
torch generators and written into the JSON, so the C++ test can feed the same values:
  sampling_uniform  [G, S, E], in (0, 1): policy 'sampling', Gumbel noise -log(-log(U)).
  random_uniform    [G, S],    in [0, 1): policy 'random', keep expert 2 when U < gate_2 / threshold.
Logits and uniforms are drawn as float32 values (stored exactly as float64), so a float32 or a
float64 C++ implementation reads the same inputs. Every argmax and every 'random' comparison is
checked to be either an exact tie or separated by a clear margin, so float32 rounding cannot flip
a routing decision.

The script first checks the port against three cases worked out by hand, then writes
tests/reference/moe_gating_reference.json.

Regenerate with Debian's python3-torch, from the repository root:
  /usr/bin/python3 tests/reference/moe_gating_reference.py
"""
import json
import math
import os

import torch

DT = torch.float64
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'moe_gating_reference.json')

# Relative gap below which two float candidates count as a near tie (see _check_margins).
MARGIN = 1e-5


def first_argmax(x, decisions=None):
  """Index of the largest value along the last axis; ties go to the lowest index (tf.argmax)."""
  top = x.max(dim=-1, keepdim=True).values
  idx = torch.arange(x.shape[-1]).expand(x.shape)
  index = torch.where(x == top, idx, torch.full_like(idx, x.shape[-1])).min(dim=-1).values
  assert torch.equal(index, torch.argmax(x, dim=-1))  # torch also takes the first maximum
  if decisions is not None:
    decisions.append(('argmax', x))
  return index


def one_hot(index, depth):
  return torch.nn.functional.one_hot(index, depth).to(DT)


def exclusive_cumsum_over_s(mask):
  """tf.cumsum(mask, exclusive=True, axis=-2) for a [G, S, E] tensor of 0/1 values."""
  return torch.cumsum(mask, dim=-2) - mask


def over_capacity_ratio(mask, position_in_expert, capacity):
  """Lingvo's _CreateOverCapacityRatioSummary: entries at or past capacity / max(1, sum(mask))."""
  over_capacity = float(((mask * position_in_expert) >= capacity).sum())
  return over_capacity / max(1.0, float(mask.sum()))


def top2_gating_on_logits(logits, paddings=None, importance=None, *, expert_capacity_dim,
                          capacity_factor=None, second_expert_policy='all',
                          second_expert_threshold=0.0, legacy_mtf_behavior=True,
                          sampling_uniform=None, random_uniform=None, decisions=None):
  """Lingvo's Top2GatingOnLogits. logits [G, S, E]; paddings, importance [G, S] or None.

  Returns a dict with aux_loss, C (final capacity), combine and dispatch [G, S, E, C] and the
  over-capacity ratios. `decisions`, if a list, collects the argmax inputs and 'random'
  comparisons so the caller can check their margins.
  """
  G, S, E = logits.shape
  raw_gates = torch.softmax(logits, dim=-1)

  # Expert capacity.
  if capacity_factor is not None and capacity_factor > 0:
    auto_expert_capacity = int((S * capacity_factor) / E)
    if auto_expert_capacity == 0:
      auto_expert_capacity = 4
    if expert_capacity_dim < auto_expert_capacity:
      expert_capacity_dim = auto_expert_capacity
      while expert_capacity_dim % 4:  # round up to a multiple of 4
        expert_capacity_dim += 1
  C = expert_capacity_dim
  capacity = float(C)

  # First expert.
  index_1 = first_argmax(raw_gates, decisions)
  mask_1 = one_hot(index_1, E)
  density_1_proxy = raw_gates
  if importance is not None:
    importance_is_one = (importance == 1.0).to(DT).unsqueeze(-1)
    mask_1 = mask_1 * importance_is_one
    density_1_proxy = density_1_proxy * importance_is_one
  else:
    importance = torch.ones(G, S, dtype=DT)
    if paddings is not None:
      nonpaddings = 1.0 - paddings
      mask_1 = mask_1 * nonpaddings.unsqueeze(-1)
      density_1_proxy = density_1_proxy * nonpaddings.unsqueeze(-1)
      importance = nonpaddings

  gate_1 = (raw_gates * mask_1).sum(dim=-1)
  # Uses the masked mask_1: a token whose mask_1 was zeroed keeps its top expert here.
  gates_without_top_1 = raw_gates * (1.0 - mask_1)

  # Second expert.
  if second_expert_policy == 'sampling':
    noise = -torch.log(-torch.log(sampling_uniform))
    very_negative = torch.finfo(logits.dtype).max * -0.7
    updated_logits = torch.where(mask_1 > 0.0, torch.full_like(logits, very_negative), logits)
    index_2 = first_argmax(updated_logits + noise, decisions)
  else:
    index_2 = first_argmax(gates_without_top_1, decisions)
  mask_2 = one_hot(index_2, E)
  if paddings is not None:  # only when paddings are given, even if importance is
    mask_2 = mask_2 * (importance > 0.0).to(DT).unsqueeze(-1)
  gate_2 = (gates_without_top_1 * mask_2).sum(dim=-1)

  if legacy_mtf_behavior:
    denom = gate_1 + gate_2 + 1e-9
    gate_1 = gate_1 / denom
    gate_2 = gate_2 / denom

  # Load-balancing loss, from mask_1 before the capacity cut.
  position_in_expert_1 = exclusive_cumsum_over_s(mask_1)
  if legacy_mtf_behavior:
    density_denom = 1.0
  else:
    density_denom = importance.mean(dim=1).unsqueeze(-1) + 1e-6  # [G, 1]
  density_1 = mask_1.mean(dim=-2) / density_denom
  density_1_proxy = density_1_proxy.mean(dim=-2) / density_denom
  aux_loss = (density_1_proxy * density_1).mean() * (E * E)

  over_capacity_1 = over_capacity_ratio(mask_1, position_in_expert_1, capacity)

  mask_1 = mask_1 * (position_in_expert_1 < capacity).to(DT)
  position_in_expert_1 = (position_in_expert_1 * mask_1).sum(dim=-1)
  mask_1_count = mask_1.sum(dim=-2)  # [G, E], after the cut
  mask_1_flat = mask_1.sum(dim=-1)  # [G, S]

  if second_expert_policy in ('all', 'sampling'):
    pass
  elif second_expert_policy == 'random':
    ratio = gate_2 / max(second_expert_threshold, 1e-9)
    if decisions is not None:
      decisions.append(('less', random_uniform, ratio))
    sampled_2 = (random_uniform < ratio).to(DT)
    gate_2 = gate_2 * sampled_2
    mask_2 = mask_2 * sampled_2.unsqueeze(-1)
  else:
    raise ValueError(second_expert_policy)

  # Second choices queue after every (kept) first choice of the same expert.
  position_in_expert_2 = exclusive_cumsum_over_s(mask_2) + mask_1_count.unsqueeze(-2)
  over_capacity_2 = over_capacity_ratio(mask_2, position_in_expert_2, capacity)

  mask_2 = mask_2 * (position_in_expert_2 < capacity).to(DT)
  position_in_expert_2 = (position_in_expert_2 * mask_2).sum(dim=-1)
  mask_2_flat = mask_2.sum(dim=-1)

  gate_1 = gate_1 * mask_1_flat
  gate_2 = gate_2 * mask_2_flat

  if not legacy_mtf_behavior:
    denom = gate_1 + gate_2
    denom = torch.where(denom > 0, denom, torch.ones_like(denom))
    gate_1 = gate_1 / denom
    gate_2 = gate_2 / denom

  b = one_hot(position_in_expert_1.long(), C)
  a = (gate_1 * mask_1_flat).unsqueeze(-1) * one_hot(index_1, E)
  combine = torch.einsum('gse,gsc->gsec', a, b)
  b = one_hot(position_in_expert_2.long(), C)
  a = (gate_2 * mask_2_flat).unsqueeze(-1) * one_hot(index_2, E)
  combine = combine + torch.einsum('gse,gsc->gsec', a, b)
  dispatch = (combine != 0).to(DT)

  return {'aux_loss': float(aux_loss), 'C': C, 'combine': combine, 'dispatch': dispatch,
          'over_capacity_1_ratio': over_capacity_1, 'over_capacity_2_ratio': over_capacity_2}


def _check_margins(name, decisions):
  """Each decision must be an exact tie (kept by any precision) or clearly separated."""
  for decision in decisions:
    if decision[0] == 'argmax':
      x = decision[1]
      top2 = x.topk(2, dim=-1).values
      gap = top2[..., 0] - top2[..., 1]
      scale = torch.clamp(top2[..., 0].abs(), min=1.0)
      ok = (gap == 0) | (gap > MARGIN * scale)
    else:
      u, ratio = decision[1], decision[2]
      gap = (u - ratio).abs()
      ok = (gap == 0) | (gap > MARGIN * torch.clamp(ratio.abs(), min=1.0))
    assert bool(ok.all()), f'{name}: near tie in a routing decision'


# ---------------------------------------------------------------------------------------------
# Hand-worked cases. G=1, S=3, E=2. softmax([log 3, 0]) = [0.75, 0.25].
# ---------------------------------------------------------------------------------------------
L3 = math.log(3.0)


def _hand(logits, **kwargs):
  return top2_gating_on_logits(torch.tensor([logits], dtype=DT), **kwargs)


def _assert_close(got, want, what):
  assert abs(got - want) <= 1e-12, f'{what}: got {got!r}, want {want!r}'


def _assert_combine(combine, want, what):
  """want: {(s, e, c): value}; every other entry must be exactly 0."""
  expected = torch.zeros_like(combine)
  for (s, e, c), value in want.items():
    expected[0, s, e, c] = value
  assert torch.allclose(combine, expected, rtol=0, atol=1e-12), f'{what}: {combine}'


def check_hand_worked_cases():
  # Case A: policy 'all', legacy, C=1, no paddings.
  #   tokens: t0 [log3, 0] -> gates [.75, .25]; t1 the same; t2 [0, log3] -> [.25, .75].
  #   index_1 = [0, 0, 1], index_2 = [1, 1, 0], gate_1 = .75, gate_2 = .25 for every token.
  #   legacy: gate_1 = .75 / (1 + 1e-9), gate_2 = .25 / (1 + 1e-9).
  #   density_1 = mean_S(mask_1) = [2/3, 1/3];
  #   density_1_proxy = mean_S(gates) = [1.75/3, 1.25/3];
  #   aux_loss = mean([2/3 * 1.75/3, 1/3 * 1.25/3]) * 2^2 = (3.5/9 + 1.25/9) * 2 = 9.5/9.
  #   position_in_expert_1: e0 [0, 1, -], e1 [-, -, 0] -> t1 (position 1 >= 1) overflows:
  #     over_capacity_1 = 1 / 3.
  #   mask_1_count = [1, 1] after the cut. Second choices: t0 -> e1 at 0 + 1 = 1,
  #     t1 -> e1 at 1 + 1 = 2, t2 -> e0 at 0 + 1 = 1: all >= 1, over_capacity_2 = 3 / 3.
  #   combine: t0 e0 c0 = .75/(1+1e-9), t2 e1 c0 = .75/(1+1e-9); t1 gets nothing.
  r = _hand([[L3, 0.0], [L3, 0.0], [0.0, L3]], expert_capacity_dim=1)
  _assert_close(r['aux_loss'], 9.5 / 9.0, 'A aux_loss')
  _assert_close(r['over_capacity_1_ratio'], 1.0 / 3.0, 'A over_capacity_1')
  _assert_close(r['over_capacity_2_ratio'], 1.0, 'A over_capacity_2')
  g = 0.75 / (1.0 + 1e-9)
  _assert_combine(r['combine'], {(0, 0, 0): g, (2, 1, 0): g}, 'A combine')
  assert r['C'] == 1 and torch.equal(r['dispatch'], (r['combine'] != 0).to(DT))

  # Case B: same logits, C=2, legacy_mtf_behavior=False.
  #   density_denom = mean_S(ones) + 1e-6, so aux_loss = (9.5/9) / (1 + 1e-6)^2.
  #   position_in_expert_1: t0 e0 0, t1 e0 1, t2 e1 0: all kept, over_capacity_1 = 0.
  #   mask_1_count = [2, 1]. Second choices: t0 -> e1 at 0 + 1 = 1 (kept), t1 -> e1 at
  #     1 + 1 = 2 (over), t2 -> e0 at 0 + 2 = 2 (over): over_capacity_2 = 2 / 3.
  #   Renormalized after capacity: t0 .75/(.75+.25) = .75 and .25; t1, t2 .75/.75 = 1.
  #   combine: t0 e0 c0 = .75, t0 e1 c1 = .25, t1 e0 c1 = 1, t2 e1 c0 = 1.
  r = _hand([[L3, 0.0], [L3, 0.0], [0.0, L3]], expert_capacity_dim=2, legacy_mtf_behavior=False)
  _assert_close(r['aux_loss'], (9.5 / 9.0) / (1.0 + 1e-6) ** 2, 'B aux_loss')
  _assert_close(r['over_capacity_1_ratio'], 0.0, 'B over_capacity_1')
  _assert_close(r['over_capacity_2_ratio'], 2.0 / 3.0, 'B over_capacity_2')
  _assert_combine(r['combine'], {(0, 0, 0): 0.75, (0, 1, 1): 0.25, (1, 0, 1): 1.0,
                                 (2, 1, 0): 1.0}, 'B combine')

  # Case C: policy 'random', threshold 0.5, legacy, C=2, paddings [0, 0, 1],
  #   random_uniform [0.4, 0.6, 0.0].
  #   tokens: t0 [log3, 0] -> [.75, .25]; t1 [0, log3] -> [.25, .75]; t2 [log3, 0], padded.
  #   mask_1: t0 e0, t1 e1, t2 zeroed (padding). importance = [1, 1, 0].
  #   gates_without_top_1: t0 [0, .25], t1 [.25, 0], t2 [.75, .25] (mask_1 was zeroed)
  #     -> index_2 = [1, 0, 0]; mask_2 *= importance > 0 drops t2. gate_2 = [.25, .25, 0].
  #   legacy: gate_1 = [.75, .75, 0] / (1 + 1e-9), gate_2 = [.25, .25, 0] / (1 + 1e-9).
  #   density_1 = [1/3, 1/3], density_1_proxy = [(.75+.25)/3, (.25+.75)/3] = [1/3, 1/3]:
  #     aux_loss = mean([1/9, 1/9]) * 4 = 4/9.
  #   First choices at position 0 of their experts: over_capacity_1 = 0.
  #   random: gate_2 / 0.5 = [.5/(1+1e-9), same, 0]; t0 0.4 < .4999... keeps, t1 0.6 drops,
  #     t2 0.0 < 0 does not. Only t0's second choice (e1, at 0 + 1 = 1) remains: ratio 0.
  #   combine: t0 e0 c0 = .75/(1+1e-9), t0 e1 c1 = .25/(1+1e-9), t1 e1 c0 = .75/(1+1e-9).
  r = _hand([[L3, 0.0], [0.0, L3], [L3, 0.0]], paddings=torch.tensor([[0.0, 0.0, 1.0]], dtype=DT),
            expert_capacity_dim=2, second_expert_policy='random', second_expert_threshold=0.5,
            random_uniform=torch.tensor([[0.4, 0.6, 0.0]], dtype=DT))
  _assert_close(r['aux_loss'], 4.0 / 9.0, 'C aux_loss')
  _assert_close(r['over_capacity_1_ratio'], 0.0, 'C over_capacity_1')
  _assert_close(r['over_capacity_2_ratio'], 0.0, 'C over_capacity_2')
  d = 1.0 + 1e-9
  _assert_combine(r['combine'], {(0, 0, 0): 0.75 / d, (0, 1, 1): 0.25 / d, (1, 1, 0): 0.75 / d},
                  'C combine')


# ---------------------------------------------------------------------------------------------
# Generated cases.
# ---------------------------------------------------------------------------------------------
def _f32(t):
  """Round to float32 values, kept as float64, so both precisions read identical inputs."""
  return t.to(torch.float32).to(DT)


def random_logits(gen, G, S, E, scale=2.0, bias=None):
  logits = torch.randn(G, S, E, generator=gen, dtype=DT) * scale
  if bias is not None:
    logits = logits + torch.tensor(bias, dtype=DT)
  return _f32(logits)


def uniform_open(gen, shape):
  """Uniform in (0, 1) on the float32 grid k / 2^24."""
  return torch.randint(1, 2 ** 24, shape, generator=gen).to(DT) / 2 ** 24


def uniform_half_open(gen, shape):
  """Uniform in [0, 1) on the float32 grid k / 2^24."""
  return torch.randint(0, 2 ** 24, shape, generator=gen).to(DT) / 2 ** 24


def padding_rows(S, lengths):
  """[G, S] paddings: group g has lengths[g] real tokens followed by padding."""
  p = torch.zeros(len(lengths), S, dtype=DT)
  for g, n in enumerate(lengths):
    p[g, n:] = 1.0
  return p


def make_case(name, seed, G, S, E, expert_capacity_dim, policy='all', threshold=0.0, legacy=True,
              capacity_factor=None, logits=None, scale=2.0, bias=None, paddings=None,
              importance=None, covers=None):
  gen = torch.Generator().manual_seed(seed)
  if logits is None:
    logits = random_logits(gen, G, S, E, scale, bias)
  else:
    logits = _f32(torch.tensor(logits, dtype=DT).reshape(G, S, E))
  if paddings is not None:
    paddings = torch.as_tensor(paddings, dtype=DT).reshape(G, S)
  if importance is not None:
    importance = torch.tensor(importance, dtype=DT).reshape(G, S)
  sampling_uniform = uniform_open(gen, (G, S, E)) if policy == 'sampling' else None
  random_uniform = uniform_half_open(gen, (G, S)) if policy == 'random' else None

  decisions = []
  r = top2_gating_on_logits(
      logits, paddings, importance, expert_capacity_dim=expert_capacity_dim,
      capacity_factor=capacity_factor, second_expert_policy=policy,
      second_expert_threshold=threshold, legacy_mtf_behavior=legacy,
      sampling_uniform=sampling_uniform, random_uniform=random_uniform, decisions=decisions)
  _check_margins(name, decisions)
  if covers is not None:
    assert covers(r), f'{name}: does not cover the branch it is meant to'

  def flat(t):
    return None if t is None else t.reshape(-1).tolist()

  return {
      'name': name, 'G': G, 'S': S, 'E': E,
      'logits': flat(logits), 'paddings': flat(paddings), 'importance': flat(importance),
      'expert_capacity_dim': expert_capacity_dim, 'capacity_factor': capacity_factor,
      'second_expert_policy': policy, 'second_expert_threshold': threshold,
      'legacy_mtf_behavior': legacy,
      'sampling_uniform': flat(sampling_uniform), 'random_uniform': flat(random_uniform),
      'expected': {
          'aux_loss': r['aux_loss'], 'C': r['C'],
          'combine': flat(r['combine']), 'dispatch': flat(r['dispatch']),
          'over_capacity_1_ratio': r['over_capacity_1_ratio'],
          'over_capacity_2_ratio': r['over_capacity_2_ratio'],
      },
  }


def _row_empty(r, g, s):
  return bool((r['combine'][g, s] == 0).all())


def build_cases():
  over1 = lambda r: r['over_capacity_1_ratio'] > 0
  over2 = lambda r: r['over_capacity_2_ratio'] > 0
  cases = [
      # Many first choices on expert 0: first choices overflow.
      make_case('first_choice_overflow_all_legacy', 101, G=2, S=8, E=3, expert_capacity_dim=2,
                bias=[2.0, 0.0, 0.0], covers=over1),
      # First choices mostly on expert 0, second choices mostly on expert 1, which also takes
      # some first choices: the second choices queue after them and overflow.
      make_case('second_choice_overflow_all_legacy', 102, G=1, S=10, E=4, expert_capacity_dim=3,
                bias=[3.0, 2.0, 0.0, 0.0], scale=1.5,
                covers=lambda r: over1(r) and over2(r)),
      make_case('all_nonlegacy', 103, G=2, S=6, E=3, expert_capacity_dim=2, legacy=False,
                covers=over2),
      make_case('paddings_all_legacy', 104, G=2, S=8, E=4, expert_capacity_dim=2,
                paddings=padding_rows(8, [6, 3]),
                covers=lambda r: _row_empty(r, 1, 5) and over2(r)),
      # Non-legacy with paddings: density_denom = mean_S(1 - paddings) + 1e-6 per group.
      make_case('paddings_all_nonlegacy_density_denom', 105, G=2, S=8, E=3, expert_capacity_dim=2,
                legacy=False, paddings=padding_rows(8, [8, 4]), covers=over1),
      # Importance without paddings: tokens with importance != 1 lose their first choice but,
      # with paddings None, keep a second choice, which is their top expert again.
      # Here token 1 (importance 0) is dispatched to its top expert with weight ~1.
      make_case('importance_no_paddings_legacy', 106, G=1, S=8, E=3, expert_capacity_dim=3,
                importance=[1.0, 0.0, 1.0, 0.5, 1.0, 1.0, 0.5, 1.0],
                covers=lambda r: not _row_empty(r, 0, 1)),
      # Importance with paddings: mask_2 *= (importance > 0); the paddings values themselves
      # are not used (group 1, token 5 is padded but has importance 1 and is routed), and
      # density_denom is mean_S(importance) + 1e-6.
      make_case('importance_with_paddings_nonlegacy', 107, G=2, S=6, E=3, expert_capacity_dim=2,
                legacy=False, paddings=padding_rows(6, [5, 4]),
                importance=[1.0, 0.5, 1.0, 0.0, 1.0, 0.0, 0.5, 1.0, 1.0, 1.0, 0.0, 1.0],
                covers=lambda r: (_row_empty(r, 0, 3) and not _row_empty(r, 0, 1)
                                  and not _row_empty(r, 1, 5))),
      make_case('sampling_legacy', 108, G=2, S=8, E=4, expert_capacity_dim=3, policy='sampling'),
      make_case('sampling_nonlegacy_paddings', 109, G=1, S=10, E=5, expert_capacity_dim=2,
                policy='sampling', legacy=False, paddings=padding_rows(10, [7]), covers=over2),
      make_case('random_threshold_0_legacy', 110, G=2, S=6, E=3, expert_capacity_dim=3,
                policy='random', threshold=0.0),
      make_case('random_threshold_0.2_nonlegacy', 111, G=2, S=8, E=4, expert_capacity_dim=3,
                policy='random', threshold=0.2, legacy=False),
      make_case('random_threshold_0.7_legacy_paddings', 112, G=2, S=8, E=3, expert_capacity_dim=3,
                policy='random', threshold=0.7, paddings=padding_rows(8, [7, 5])),
      # Tokens 1.. all prefer expert 0 then expert 1, C=1: token 1 loses both experts, so the
      # non-legacy renormalization divides by 1 (denom == 0 branch).
      make_case('both_experts_dropped_nonlegacy', 113, G=1, S=6, E=2, expert_capacity_dim=1,
                legacy=False, bias=[4.0, 0.0], scale=1.0,
                covers=lambda r: _row_empty(r, 0, 1)),
      # int(10 * 2.0 / 3) = 6 > 2, rounded up to 8.
      make_case('capacity_factor_round_up', 114, G=2, S=10, E=3, expert_capacity_dim=2,
                capacity_factor=2.0, bias=[3.0, 0.0, 0.0], covers=lambda r: r['C'] == 8),
      # int(4 * 1.0 / 5) = 0 -> 4 > 1.
      make_case('capacity_factor_auto_zero', 115, G=1, S=4, E=5, expert_capacity_dim=1,
                capacity_factor=1.0, legacy=False, covers=lambda r: r['C'] == 4),
      # int(8 * 1.0 / 4) = 2 < 3: expert_capacity_dim stays 3 (not rounded to 4).
      make_case('capacity_factor_keeps_dim', 116, G=1, S=8, E=4, expert_capacity_dim=3,
                capacity_factor=1.0, bias=[2.0, 1.0, 0.0, 0.0],
                covers=lambda r: r['C'] == 3 and over1(r)),
      # capacity_factor 0 counts as unset.
      make_case('capacity_factor_zero_ignored', 117, G=1, S=6, E=3, expert_capacity_dim=1,
                capacity_factor=0.0, covers=lambda r: r['C'] == 1 and over1(r)),
      # Exact ties, first index wins for both experts (a full tie gives experts 0 and 1).
      make_case('exact_ties_first_index', 118, G=1, S=6, E=4, expert_capacity_dim=3,
                logits=[[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0], [2.0, 0.5, 2.0, 0.5],
                        [0.0, 1.5, 0.5, 1.5], [-1.0, 0.25, 0.25, 0.25], [0.5, 0.5, 0.5, 3.0]]),
      # Logits far enough apart that softmax underflows to exact 0 for the other experts
      # (tokens 0-2): gates_without_top_1 is all zero, so index_2 = 0 (the first expert again
      # for tokens 0 and 2) with gate_2 = 0. Those zero-weight second choices still take
      # places in expert 0's queue, so token 3's real second choice (expert 0) is over capacity.
      make_case('second_gate_underflow_all_legacy', 119, G=1, S=4, E=3, expert_capacity_dim=3,
                logits=[[0.0, -1000.0, -1000.0], [-1000.0, 0.0, -1000.0],
                        [0.0, -1000.0, -1000.0], [0.5, 1.0, -1.0]],
                covers=lambda r: r['dispatch'][0, 3].sum() == 1 and r['dispatch'][0, 0].sum() == 1),
  ]
  return cases


def main():
  check_hand_worked_cases()
  cases = build_cases()
  with open(OUT, 'w') as f:
    f.write('{"generator": "tests/reference/moe_gating_reference.py", "cases": [\n')
    f.write(',\n'.join(json.dumps(case) for case in cases))
    f.write('\n]}\n')
  for case in cases:
    e = case['expected']
    print(f"{case['name']:40s} C={e['C']} aux_loss={e['aux_loss']:.6f} "
          f"over1={e['over_capacity_1_ratio']:.4f} over2={e['over_capacity_2_ratio']:.4f}")
  print(f'wrote {len(cases)} cases to {OUT}')


if __name__ == '__main__':
  main()
