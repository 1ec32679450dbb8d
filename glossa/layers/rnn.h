// LSTM cell and RNNs over time with paddings (Lingvo's LSTMCellSimple, FRNN and
// StackedFRNNLayerByLayer). Time-major: inputs [T, B, D], paddings [T, B, 1] (1 = padded; a padded
// step carries the previous state through unchanged).
//
//   auto [outputs, final_state] = rnn->FProp(rnn->theta(), inputs, paddings);
#pragma once

#include <optional>

#include <utility>
#include <vector>

#include "glossa/layers/base_layer.h"

namespace glossa {

// Gates from [x, m]·wm + b split as (i_i, i_g, f_g, o_g):
//   c' = sigmoid(f_g + forget_gate_bias)·c + sigmoid(i_g)·tanh(i_i), clipped to ±cell_value_cap
//   m' = sigmoid(o_g)·tanh(c')   (or sigmoid(o_g)·c' without output_nonlinearity)
class LSTMCellSimple : public BaseLayer {
 public:
  // The uniform call (BaseLayer::FPropMap): FProp(theta, state0, inputs, padding=None) -> dict (m, c).
  FPropMapSignature FPropMapSpec() const override;
  NestedMap FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const override;
  // + num_input_nodes, num_output_nodes, forget_gate_bias (0), cell_value_cap (10; None: no cap),
  // output_nonlinearity (True).
  static glossa::Params Params();
  explicit LSTMCellSimple(const glossa::Params& p);
  // State {m [B, H], c [B, H]} of zeros.
  NestedMap ZeroState(int64_t batch_size, at::ScalarType dtype) const;
  // One step: inputs [B, D], padding [B, 1] (optional).
  NestedMap FProp(const NestedMap& theta, const NestedMap& state0, const at::Tensor& inputs,
                  const at::Tensor& padding = {}) const;
  int64_t num_output_nodes() const { return num_output_; }

 private:
  int64_t num_input_, num_output_;
  double forget_gate_bias_;
  std::optional<double> cell_value_cap_;
  bool output_nonlinearity_;
};

// Runs a cell over time.
class RNNLayer : public BaseLayer {
 public:
  // The uniform call (BaseLayer::FPropMap): FProp(theta, inputs, paddings=None, state0=None) -> (outputs, final_state).
  FPropMapSignature FPropMapSpec() const override;
  NestedMap FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const override;
  // + cell (LSTMCellSimple params), reverse (False: run backwards in time).
  static glossa::Params Params();
  explicit RNNLayer(const glossa::Params& p);
  // inputs [T, B, D], paddings [T, B, 1] (optional), state0 (optional: zeros).
  // Returns (outputs [T, B, H], final state).
  std::pair<at::Tensor, NestedMap> FProp(const NestedMap& theta, const at::Tensor& inputs,
                                         const at::Tensor& paddings = {},
                                         const NestedMap& state0 = {}) const;

 private:
  Child<LSTMCellSimple> cell_;
  bool reverse_;
};

// num_layers RNNs, each fed the previous one's outputs; from layer skip_start on, each layer's
// input is added to its output (residual).
class StackedRNN : public BaseLayer {
 public:
  // The uniform call (BaseLayer::FPropMap): FProp(theta, inputs, paddings=None) -> (outputs, [final_state, ...]).
  FPropMapSignature FPropMapSpec() const override;
  NestedMap FPropMapImpl(const NestedMap& theta, const NestedMap& inputs) const override;
  // + num_layers, num_input_nodes, num_output_nodes, cell_tpl, skip_start (None: no residuals).
  static glossa::Params Params();
  explicit StackedRNN(const glossa::Params& p);
  // Returns (outputs [T, B, H], final states, one per layer).
  std::pair<at::Tensor, std::vector<NestedMap>> FProp(const NestedMap& theta,
                                                      const at::Tensor& inputs,
                                                      const at::Tensor& paddings = {}) const;

 private:
  std::vector<Child<RNNLayer>> rnns_;
  int64_t skip_start_;
};

}  // namespace glossa
