#include "glossa/layers/rnn.h"

#include <ATen/ATen.h>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"

namespace glossa {

glossa::Params LSTMCellSimple::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<LSTMCellSimple>());
  p.Define("num_input_nodes", 0, "Number of input nodes.");
  p.Define("num_output_nodes", 0, "Number of output nodes (the LSTM state size).");
  p.Define("forget_gate_bias", 0.0, "Bias added to the forget gate.");
  p.Define("cell_value_cap", 10.0, "LSTM cell values are capped to this; None means no cap.");
  p.Define("output_nonlinearity", true,
           "Whether to apply tanh to the cell before the output gate.");
  return p;
}

LSTMCellSimple::LSTMCellSimple(const glossa::Params& p) : BaseLayer(p) {
  num_input_ = params().GetInt("num_input_nodes");
  num_output_ = params().GetInt("num_output_nodes");
  forget_gate_bias_ = params().GetFloat("forget_gate_bias");
  if (params().IsSet("cell_value_cap")) cell_value_cap_ = params().GetFloat("cell_value_cap");
  output_nonlinearity_ = params().GetBool("output_nonlinearity");
  if (num_input_ <= 0 || num_output_ <= 0) {
    throw InvalidArgumentError(
        StrCat("layer '", path(), "': num_input_nodes and num_output_nodes must be > 0"));
  }
  const DType dtype = params().Get("dtype").AsDType();
  CreateVariable("wm",
                 WeightParams({num_input_ + num_output_, 4 * num_output_},
                              WeightInit::FromParams(params().GetParams("params_init")), dtype));
  CreateVariable("b", WeightParams({4 * num_output_}, WeightInit::Constant(0.0), dtype));
}

NestedMap LSTMCellSimple::ZeroState(int64_t batch_size, at::ScalarType dtype) const {
  NestedMap s;
  s.Put("m", at::zeros({batch_size, num_output_}, at::TensorOptions().dtype(dtype)));
  s.Put("c", at::zeros({batch_size, num_output_}, at::TensorOptions().dtype(dtype)));
  return s;
}

NestedMap LSTMCellSimple::FProp(const NestedMap& theta, const NestedMap& state0,
                                const at::Tensor& inputs, const at::Tensor& padding) const {
  if (inputs.dim() != 2 || inputs.size(1) != num_input_) {
    throw InvalidArgumentError(
        StrCat("layer '", path(), "': inputs must be [B, ", num_input_, "], got ", inputs.sizes()));
  }
  at::Tensor m = state0.GetTensor("m"), c = state0.GetTensor("c");
  at::Tensor x = at::cat({CastToFPropDtype(inputs), m.to(fprop_dtype())}, 1);
  at::Tensor gates = at::matmul(x, theta.GetTensor("wm")) + theta.GetTensor("b");
  auto parts = gates.chunk(4, 1);
  const at::Tensor &i_i = parts[0], &i_g = parts[1], &f_g = parts[2], &o_g = parts[3];
  at::Tensor new_c =
      at::sigmoid(f_g + forget_gate_bias_) * c.to(gates.scalar_type()) +
      at::sigmoid(i_g) * at::tanh(i_i);
  if (cell_value_cap_) new_c = at::clamp(new_c, -*cell_value_cap_, *cell_value_cap_);
  at::Tensor new_m =
      at::sigmoid(o_g) * (output_nonlinearity_ ? at::tanh(new_c) : new_c);
  if (padding.defined()) {
    at::Tensor pad = padding.to(new_m.scalar_type());
    if (pad.dim() == 1) pad = pad.unsqueeze(1);
    new_c = c.to(new_c.scalar_type()) * pad + new_c * (1 - pad);
    new_m = m.to(new_m.scalar_type()) * pad + new_m * (1 - pad);
  }
  NestedMap s;
  s.Put("m", new_m);
  s.Put("c", new_c);
  return s;
}

glossa::Params RNNLayer::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<RNNLayer>());
  p.Define("cell", LSTMCellSimple::Params(), "The cell run at every step.");
  p.Define("reverse", false, "Whether to run the RNN backwards in time.");
  return p;
}

RNNLayer::RNNLayer(const glossa::Params& p) : BaseLayer(p) {
  cell_ = CreateChild<LSTMCellSimple>("cell", params().GetParams("cell"));
  reverse_ = params().GetBool("reverse");
}

std::pair<at::Tensor, NestedMap> RNNLayer::FProp(const NestedMap& theta, const at::Tensor& inputs,
                                                 const at::Tensor& paddings,
                                                 const NestedMap& state0) const {
  if (inputs.dim() != 3) {
    throw InvalidArgumentError(
        StrCat("layer '", path(), "': inputs must be [T, B, D], got ", inputs.sizes()));
  }
  const LSTMCellSimple& cell = *cell_;
  const NestedMap& cell_theta = cell_.Theta(theta);
  const int64_t t_len = inputs.size(0), batch = inputs.size(1);
  if (paddings.defined() && (paddings.size(0) != t_len || paddings.size(1) != batch)) {
    throw InvalidArgumentError(StrCat("layer '", path(), "': paddings must be [T, B, 1] = [", t_len,
                                      ", ", batch, ", 1], got ", paddings.sizes()));
  }
  NestedMap state = state0.empty() ? cell.ZeroState(batch, fprop_dtype()) : state0;
  std::vector<at::Tensor> outputs(t_len);
  for (int64_t step = 0; step < t_len; ++step) {
    const int64_t t = reverse_ ? t_len - 1 - step : step;
    at::Tensor pad = paddings.defined() ? paddings[t] : at::Tensor();
    state = cell.FProp(cell_theta, state, inputs[t], pad);
    outputs[t] = state.GetTensor("m");
  }
  at::Tensor out = t_len > 0 ? at::stack(outputs)
                             : at::zeros({0, batch, cell.num_output_nodes()}, inputs.options());
  return {out, state};
}

glossa::Params StackedRNN::Params() {
  glossa::Params p = BaseLayer::Params();
  p.Set("cls", ClsOf<StackedRNN>());
  p.Define("num_layers", 1, "Number of RNN layers.");
  p.Define("num_input_nodes", 0, "Input dimension of the first layer.");
  p.Define("num_output_nodes", 0, "Output dimension of every layer.");
  p.Define("cell_tpl", LSTMCellSimple::Params(), "Cell template for every layer.");
  p.Define("skip_start", nullptr,
           "Layers from this index on add their input to their output (residual); None: none.");
  return p;
}

StackedRNN::StackedRNN(const glossa::Params& p) : BaseLayer(p) {
  const int64_t n = params().GetInt("num_layers");
  if (n <= 0) throw InvalidArgumentError(StrCat("layer '", path(), "': num_layers must be > 0"));
  ParamValue::List rnns;
  for (int64_t i = 0; i < n; ++i) {
    glossa::Params cell = params().GetParams("cell_tpl").Copy();
    cell.Set("num_input_nodes",
             i == 0 ? params().GetInt("num_input_nodes") : params().GetInt("num_output_nodes"));
    cell.Set("num_output_nodes", params().GetInt("num_output_nodes"));
    rnns.push_back(RNNLayer::Params().Set("cell", cell));
  }
  rnns_ = CreateChildren<RNNLayer>("rnn", rnns);
  skip_start_ = params().IsSet("skip_start") ? params().GetInt("skip_start") : n;
}

std::pair<at::Tensor, std::vector<NestedMap>> StackedRNN::FProp(const NestedMap& theta,
                                                                const at::Tensor& inputs,
                                                                const at::Tensor& paddings) const {
  at::Tensor x = CastToFPropDtype(inputs);
  std::vector<NestedMap> finals;
  for (size_t i = 0; i < rnns_.size(); ++i) {
    auto [y, state] = rnns_[i]->FProp(rnns_[i].Theta(theta), x, paddings);
    if (static_cast<int64_t>(i) >= skip_start_ && y.sizes() == x.sizes()) y = y + x;
    x = y;
    finals.push_back(state);
  }
  return {x, finals};
}

GLOSSA_REGISTER_CLASS(LSTMCellSimple, "glossa.layers.LSTMCellSimple");
GLOSSA_REGISTER_CLASS(RNNLayer, "glossa.layers.RNNLayer");
GLOSSA_REGISTER_CLASS(StackedRNN, "glossa.layers.StackedRNN");

// ---- The uniform call (BaseLayer::FPropMap) ----

BaseLayer::FPropMapSignature LSTMCellSimple::FPropMapSpec() const {
  return {{"state0", "inputs", "padding"}, 2, {}, false, "dict (m, c)"};
}

NestedMap LSTMCellSimple::FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const {
  return FProp(theta, inputs.at("state0").AsMap(), inputs.GetTensor("inputs"), OptionalInput(inputs, "padding"));
}

BaseLayer::FPropMapSignature RNNLayer::FPropMapSpec() const {
  return {{"inputs", "paddings", "state0"}, 1, {"outputs", "final_state"}, true, "(outputs, final_state)"};
}

NestedMap RNNLayer::FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const {
  NestedMap state0;
  if (inputs.contains("state0") && !inputs.at("state0").is_none()) {
    state0 = inputs.at("state0").AsMap();
  }
  auto [y, s] = FProp(theta, inputs.GetTensor("inputs"), OptionalInput(inputs, "paddings"), state0);
  NestedMap out;
  out.Put("outputs", y);
  out.Put("final_state", std::move(s));
  return out;
}

BaseLayer::FPropMapSignature StackedRNN::FPropMapSpec() const {
  return {{"inputs", "paddings"}, 1, {"outputs", "final_states"}, true, "(outputs, [final_state, ...])"};
}

NestedMap StackedRNN::FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const {
  auto [y, states] = FProp(theta, inputs.GetTensor("inputs"), OptionalInput(inputs, "paddings"));
  NestedValue::List s;
  for (auto& m : states) s.emplace_back(std::move(m));
  NestedMap out;
  out.Put("outputs", y);
  out.Put("final_states", NestedValue(std::move(s)));
  return out;
}

}  // namespace glossa
