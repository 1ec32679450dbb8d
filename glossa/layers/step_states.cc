#include "glossa/layers/step_states.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <functional>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"

namespace glossa {
namespace {

struct LayerState {
  at::Tensor key, value, rows, length;  // key, value [n, C, heads, dim]; rows [n, C]; length [n]
};

LayerState Read(const NestedValue& v) {
  const NestedMap& m = v.AsMap();
  if (!m.contains("unordered") || !m.contains("rows") || !m.contains("length")) {
    throw InvalidArgumentError("decoding states: a layer's states must be MultiHeadedAttention's "
                               "({unordered: {key, value}, rows, length})");
  }
  const NestedMap& kv = m.GetItem("unordered").AsMap();
  return {kv.GetTensor("key"), kv.GetTensor("value"), m.GetTensor("rows"), m.GetTensor("length")};
}

NestedValue Write(const LayerState& s) {
  NestedMap kv;
  kv.Put("key", s.key);
  kv.Put("value", s.value);
  NestedMap m;
  m.Put("unordered", kv);
  m.Put("rows", s.rows);
  m.Put("length", s.length);
  return NestedValue(std::move(m));
}

const NestedValue::List& Layers(const NestedMap& states) {
  if (!states.contains("x_layers")) {
    throw InvalidArgumentError("decoding states: expected a TransformerStack's ({x_layers: [...]})");
  }
  return states.at("x_layers").AsList();
}

NestedMap Map(const NestedMap& states, const std::function<LayerState(const LayerState&)>& f) {
  NestedValue::List out;
  for (const NestedValue& v : Layers(states)) out.push_back(Write(f(Read(v))));
  NestedMap m;
  m.Put("x_layers", std::move(out));
  return m;
}

// Row i's every column names slot i (no row is ever reordered).
at::Tensor IdentityRows(int64_t n, int64_t capacity) {
  return at::arange(n, at::kLong).unsqueeze(1).expand({n, capacity}).contiguous();
}

int64_t Steps(const LayerState& s) { return s.length.numel() > 0 ? s.length[0].item<int64_t>() : 0; }

// [n, capacity, ...] zeros with t's first `steps` columns at columns [shift, shift + steps).
at::Tensor Placed(const at::Tensor& t, int64_t capacity, int64_t shift, int64_t steps) {
  std::vector<int64_t> shape = t.sizes().vec();
  shape[1] = capacity;
  at::Tensor out = at::zeros(shape, t.options());
  if (steps > 0 && t.size(0) > 0) out.narrow(1, shift, steps).copy_(t.narrow(1, 0, steps));
  return out;
}

}  // namespace

int64_t StateSteps(const NestedMap& states) {
  const auto& layers = Layers(states);
  return layers.empty() ? 0 : Steps(Read(layers[0]));
}

int64_t StateRows(const NestedMap& states) {
  const auto& layers = Layers(states);
  return layers.empty() ? 0 : Read(layers[0]).key.size(0);
}

NestedMap KeepStateRows(const NestedMap& states, const std::vector<int64_t>& keep) {
  const at::Tensor idx = at::tensor(keep, at::kLong);
  return Map(states, [&](const LayerState& s) {
    const int64_t n = s.key.size(0);
    for (int64_t i : keep) {
      if (i < 0 || i >= n) {
        throw InvalidArgumentError(StrCat("decoding states: row ", i, " of ", n));
      }
    }
    LayerState o;
    o.key = s.key.index_select(0, idx);
    o.value = s.value.index_select(0, idx);
    o.rows = IdentityRows(static_cast<int64_t>(keep.size()), s.rows.size(1));
    o.length = s.length.index_select(0, idx);
    return o;
  });
}

NestedMap JoinStateRows(const NestedMap& a, const NestedMap& b, int64_t* shift_a,
                        int64_t* shift_b) {
  const auto& la = Layers(a);
  const auto& lb = Layers(b);
  if (la.size() != lb.size()) {
    throw InvalidArgumentError(StrCat("decoding states: joining states of ", la.size(), " and ",
                                      lb.size(), " layers"));
  }
  const int64_t steps = std::max(StateSteps(a), StateSteps(b));
  *shift_a = steps - StateSteps(a);
  *shift_b = steps - StateSteps(b);
  NestedValue::List out;
  for (size_t l = 0; l < la.size(); ++l) {
    const LayerState sa = Read(la[l]), sb = Read(lb[l]);
    if (sa.key.sizes().slice(2) != sb.key.sizes().slice(2) ||
        sa.key.scalar_type() != sb.key.scalar_type()) {
      throw InvalidArgumentError(StrCat("decoding states: layer ", l, "'s caches differ (",
                                        sa.key.sizes(), " against ", sb.key.sizes(), ")"));
    }
    const int64_t n = sa.key.size(0) + sb.key.size(0);
    // Room for the steps to come (ExtendStep doubles it when full).
    const int64_t capacity = std::max<int64_t>({2 * steps, 16, sa.key.size(1), sb.key.size(1)});
    LayerState o;
    o.key = at::cat({Placed(sa.key, capacity, *shift_a, steps - *shift_a),
                     Placed(sb.key, capacity, *shift_b, steps - *shift_b)});
    o.value = at::cat({Placed(sa.value, capacity, *shift_a, steps - *shift_a),
                       Placed(sb.value, capacity, *shift_b, steps - *shift_b)});
    o.rows = IdentityRows(n, capacity);
    o.length = at::full({n}, steps, at::kLong);
    out.push_back(Write(o));
  }
  NestedMap m;
  m.Put("x_layers", std::move(out));
  return m;
}

NestedMap DropStateSteps(const NestedMap& states, int64_t drop) {
  const int64_t steps = StateSteps(states);
  if (drop < 0 || drop > steps) {
    throw InvalidArgumentError(StrCat("decoding states: dropping ", drop, " of ", steps, " steps"));
  }
  if (drop == 0) return states;
  return Map(states, [&](const LayerState& s) {
    LayerState o;
    const int64_t capacity = s.key.size(1);
    o.key = at::zeros_like(s.key);
    o.value = at::zeros_like(s.value);
    if (steps > drop) {
      o.key.narrow(1, 0, steps - drop).copy_(s.key.narrow(1, drop, steps - drop));
      o.value.narrow(1, 0, steps - drop).copy_(s.value.narrow(1, drop, steps - drop));
    }
    o.rows = IdentityRows(s.key.size(0), capacity);
    o.length = s.length - drop;
    return o;
  });
}

}  // namespace glossa
