// RevNet memory: peak tensor memory and time of one training step (forward + backward) of a
// StackedRevNetLayer with 4, 8, 16 and 32 layers, with the memory-saving custom backward
// (custom_gradient true) and with plain autograd (false) — the peer — in the same run.
// Tensor memory is counted by wrapping ATen's CPU allocator: the peak during the step minus what
// was live before it (weights, inputs), split into the weight gradients (which grow with depth in
// both modes) and the rest, the activations.
//   bench_revnet_memory [--dim=256] [--hidden=1024] [--batch=8] [--seq=128] [--runs=3]
#include <ATen/ATen.h>
#include <c10/core/CPUAllocator.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "glossa/core/step_seed.h"
#include "glossa/layers/block.h"
#include "glossa/layers/linear.h"
#include "glossa/layers/normalization.h"
#include "glossa/layers/revnet.h"
#include "glossa/runtime/cpu_runtime.h"

namespace {

// Delegates to ATen's default CPU allocator, counting live and peak bytes.
class CountingAllocator final : public c10::Allocator {
 public:
  explicit CountingAllocator(c10::Allocator* base) : base_(base) {}
  c10::DataPtr allocate(size_t n) const override {
    c10::DataPtr inner = base_->allocate(n);
    void* data = inner.get();
    auto* ctx = new Ctx{std::move(inner), n, this};
    const int64_t now = live_ += static_cast<int64_t>(n);
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
    return {data, ctx, &Delete, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return nullptr; }
  int64_t live() const { return live_.load(); }
  int64_t peak() const { return peak_.load(); }
  void ResetPeak() { peak_ = live_.load(); }

 private:
  struct Ctx {
    c10::DataPtr inner;
    size_t n;
    const CountingAllocator* owner;
  };
  static void Delete(void* p) {
    auto* ctx = static_cast<Ctx*>(p);
    ctx->owner->live_ -= static_cast<int64_t>(ctx->n);
    delete ctx;
  }
  c10::Allocator* base_;
  mutable std::atomic<int64_t> live_{0}, peak_{0};
};

std::map<std::string, int64_t> ParseFlags(int argc, char** argv) {
  std::map<std::string, int64_t> f = {
      {"dim", 256}, {"hidden", 1024}, {"batch", 8}, {"seq", 128}, {"runs", 3}};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto eq = a.find('=');
    const std::string k = a.rfind("--", 0) == 0 ? a.substr(2, eq - 2) : "";
    if (eq == std::string::npos || !f.count(k)) {
      std::fprintf(stderr,
                   "usage: bench_revnet_memory [--dim=N] [--hidden=N] [--batch=N] "
                   "[--seq=N] [--runs=N]\n");
      std::exit(2);
    }
    f[k] = std::stoll(a.substr(eq + 1));
  }
  return f;
}

glossa::Params FfnBlock(int64_t d, int64_t h) {
  using namespace glossa;
  ParamValue::List sub;
  sub.push_back(LayerNorm::Params().Set("input_dim", d));
  sub.push_back(FCLayer::Params().Set("input_dim", d).Set("output_dim", h));
  sub.push_back(
      FCLayer::Params().Set("input_dim", h).Set("output_dim", d).Set("activation", "NONE"));
  return SequentialLayer::Params().Set("sub", sub);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace glossa;
  auto f = ParseFlags(argc, argv);
  ConfigureCpuRuntime(0, /*bf16=*/false);
  static CountingAllocator counter(c10::GetCPUAllocator());
  c10::SetCPUAllocator(&counter, /*priority=*/100);
  const int64_t d = f["dim"], h = f["hidden"], b = f["batch"], t = f["seq"];
  std::printf(
      "RevNet stack, f and g = LN -> FC(%ld->%ld, relu) -> FC(%ld->%ld); inputs 2 x [%ld, "
      "%ld, %ld] fp32; one training step (forward + backward)\n",
      static_cast<long>(d), static_cast<long>(h), static_cast<long>(h), static_cast<long>(d),
      static_cast<long>(b), static_cast<long>(t), static_cast<long>(d));
  std::printf("%-7s %-7s %14s %14s %14s %10s\n", "layers", "mode", "peak_MiB", "grads_MiB",
              "activ_MiB", "step_ms");
  const double mib = 1024.0 * 1024.0;
  for (int layers : {4, 8, 16, 32}) {
    double ms[2] = {0, 0};
    for (bool custom : {true, false}) {
      ParamValue::List sub;
      for (int i = 0; i < layers; ++i) {
        sub.push_back(
            RevNetLayer::Params().Set("f_params", FfnBlock(d, h)).Set("g_params", FfnBlock(d, h)));
      }
      Params p = StackedRevNetLayer::Params();
      p.Set("name", "rev").Set("random_seed", 1).Set("sub_layer_params", sub);
      p.Set("custom_gradient", custom);
      auto stack = InstantiateLayer<StackedRevNetLayer>(p);
      at::Tensor x1 = at::randn({b, t, d}), x2 = at::randn({b, t, d});
      NestedMap theta = stack->theta();
      const std::vector<at::Tensor> weights = theta.FlattenTensors();
      int64_t grad_bytes = 0;
      for (const auto& w : weights)
        grad_bytes += w.numel() * static_cast<int64_t>(w.element_size());
      auto step = [&] {
        GlobalStepContext gs(1);
        ResetStepSeed(0);
        auto [y1, y2] = stack->FProp(theta, x1, x2);
        at::Tensor loss = (y1 * y1).sum() + (y2 * y2).sum();
        auto grads = torch::autograd::grad({loss}, weights);
      };
      step();  // warm-up
      std::vector<double> times;
      int64_t peak = 0;
      for (int64_t r = 0; r < f["runs"]; ++r) {
        counter.ResetPeak();
        const int64_t before = counter.live();
        const auto t0 = std::chrono::steady_clock::now();
        step();
        times.push_back(
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                .count());
        peak = std::max(peak, counter.peak() - before);
      }
      std::sort(times.begin(), times.end());
      ms[custom ? 0 : 1] = times[times.size() / 2];
      std::printf("%-7d %-7s %14.1f %14.1f %14.1f %10.1f\n", layers, custom ? "custom" : "plain",
                  peak / mib, grad_bytes / mib, (peak - grad_bytes) / mib, ms[custom ? 0 : 1]);
    }
    std::printf("%-7d time custom/plain: %.2f\n", layers, ms[0] / ms[1]);
  }
  std::printf(
      "reproduce: build/bin/bench_revnet_memory --dim=%ld --hidden=%ld --batch=%ld "
      "--seq=%ld --runs=%ld\n",
      static_cast<long>(d), static_cast<long>(h), static_cast<long>(b), static_cast<long>(t),
      static_cast<long>(f["runs"]));
  return 0;
}
