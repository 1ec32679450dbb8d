#include "glossa/layers/step_states.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <functional>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/layers/attention.h"

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
  return NestedValue(MultiHeadedAttention::MakeStates(s.key, s.value, s.rows, s.length));
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

NestedMap RunningStates::View() const {
  NestedValue::List out;
  for (const Layer& l : layers_) {
    LayerState s;
    s.key = l.key.narrow(0, 0, rows_);
    s.value = l.value.narrow(0, 0, rows_);
    s.rows = l.rows.narrow(0, 0, rows_);
    s.length = at::full({rows_}, steps_, at::kLong);
    out.push_back(Write(s));
  }
  NestedMap m;
  m.Put("x_layers", std::move(out));
  return m;
}

void RunningStates::Adopt(const NestedMap& after_step) {
  const auto& layers = Layers(after_step);
  if (layers.size() != layers_.size() || StateRows(after_step) != rows_) {
    throw InvalidArgumentError(StrCat("decoding states: the step returned ", layers.size(),
                                      " layers of ", StateRows(after_step), " rows, not ",
                                      layers_.size(), " of ", rows_));
  }
  for (size_t i = 0; i < layers.size(); ++i) {
    const LayerState s = Read(layers[i]);
    Layer& l = layers_[i];
    if (s.key.data_ptr() != l.key.data_ptr()) {  // the step grew the caches: its own tensors
      l.key = s.key;
      l.value = s.value;
      l.rows = s.rows;
    }
  }
  steps_ = StateSteps(after_step);
}

void RunningStates::Join(const NestedMap& joining, int64_t* shift_running,
                         int64_t* shift_joining) {
  const int64_t k = StateRows(joining), m = StateSteps(joining);
  if (rows_ == 0 || m > steps_) {  // the running rows move too: rebuild
    const NestedMap joined = rows_ == 0 ? joining : JoinStateRows(View(), joining, shift_running,
                                                                  shift_joining);
    if (rows_ == 0) *shift_running = 0, *shift_joining = 0;
    layers_.clear();
    for (const NestedValue& v : Layers(joined)) {
      const LayerState s = Read(v);
      layers_.push_back({s.key, s.value, s.rows});
    }
    rows_ = StateRows(joined);
    steps_ = StateSteps(joined);
    return;
  }
  *shift_running = 0;
  *shift_joining = steps_ - m;
  const auto& incoming = Layers(joining);
  if (incoming.size() != layers_.size()) {
    throw InvalidArgumentError(StrCat("decoding states: joining states of ", layers_.size(),
                                      " and ", incoming.size(), " layers"));
  }
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& l = layers_[i];
    const LayerState s = Read(incoming[i]);
    if (l.key.size(0) < rows_ + k) {  // room for twice the rows
      const int64_t capacity = 2 * (rows_ + k);
      auto grown = [&](const at::Tensor& t) {
        std::vector<int64_t> shape = t.sizes().vec();
        shape[0] = capacity;
        at::Tensor g = at::zeros(shape, t.options());
        g.narrow(0, 0, rows_).copy_(t.narrow(0, 0, rows_));
        return g;
      };
      l.key = grown(l.key);
      l.value = grown(l.value);
      l.rows = IdentityRows(capacity, l.rows.size(1));
    }
    at::Tensor key = l.key.narrow(0, rows_, k), value = l.value.narrow(0, rows_, k);
    key.zero_();
    value.zero_();
    if (m > 0) {
      key.narrow(1, *shift_joining, m).copy_(s.key.narrow(1, 0, m));
      value.narrow(1, *shift_joining, m).copy_(s.value.narrow(1, 0, m));
    }
    l.rows.narrow(0, rows_, k).copy_(IdentityRows(rows_ + k, l.rows.size(1)).narrow(0, rows_, k));
  }
  rows_ += k;
}

int64_t RunningStates::RemoveRow(int64_t i) {
  if (i < 0 || i >= rows_) throw InvalidArgumentError(StrCat("decoding states: row ", i, " of ", rows_));
  const int64_t last = rows_ - 1;
  if (i != last) {
    for (Layer& l : layers_) {
      l.key.select(0, i).narrow(0, 0, steps_).copy_(l.key.select(0, last).narrow(0, 0, steps_));
      l.value.select(0, i).narrow(0, 0, steps_).copy_(l.value.select(0, last).narrow(0, 0, steps_));
    }
  }
  --rows_;
  return i != last ? last : -1;
}

void RunningStates::DropSteps(int64_t steps) {
  if (steps == 0) return;
  const NestedMap dropped = DropStateSteps(View(), steps);
  layers_.clear();
  for (const NestedValue& v : Layers(dropped)) {
    const LayerState s = Read(v);
    layers_.push_back({s.key, s.value, s.rows});
  }
  steps_ -= steps;
}

void RunningStates::Clear() {
  layers_.clear();
  rows_ = 0;
  steps_ = 0;
}

}  // namespace glossa
