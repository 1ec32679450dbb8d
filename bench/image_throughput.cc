// Training throughput of the image classifiers (glossa/tasks/image/image.h) on random 28x28 images:
// images/s, the median over runs, for image.fmnist.LeNet5 or image.fmnist.ResNetSmall (the
// registered models' tasks, without reading the data). Run by image_throughput.sh beside the same
// models in PyTorch eager (image_throughput.py).
//   bench_image_throughput --model=lenet5 --batch=128 --steps=20 --runs=3
#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "glossa/core/step_seed.h"
#include "glossa/model/base_task.h"
#include "glossa/model/model_registry.h"
#include "glossa/tasks/image/image.h"
#include "glossa/optim/learner.h"
#include "glossa/runtime/cpu_runtime.h"
#include "glossa/runtime/blas_kernels.h"
#include "bench/bench_util.h"

int main(int argc, char** argv) {
  using glossa::bench::Now;
  glossa::UseBestBlasKernels(argv);
  using namespace glossa;
  // --model=lenet5|resnet
  auto f = bench::ParseFlags(
      argc, argv,
      {{"model", "lenet5"}, {"batch", "128"}, {"steps", "20"}, {"runs", "3"}, {"threads", "0"}});
  ConfigureCpuRuntime(std::stoi(f["threads"]), false);
  const std::string key = f["model"] == "lenet5"   ? "image.fmnist.LeNet5"
                          : f["model"] == "resnet" ? "image.fmnist.ResNetSmall"
                                                   : "";
  if (key.empty()) {
    std::fprintf(stderr, "--model must be lenet5 or resnet\n");
    return 2;
  }
  Params p = GetModelParams(key, "Train").GetParams("task").Copy();
  p.Set("random_seed", 1);
  p.Set("train.learner.lr_schedule", ConstantSchedule::Params());
  p.Set("input", nullptr);  // no data files: random images below
  auto task = p.Instantiate<ClassifierTask>();
  const int64_t b = std::stoll(f["batch"]);
  NestedMap batch;
  batch.Set("data", at::randn({b, 28, 28, 1}));
  batch.Set("label", at::randint(0, 10, {b}, at::kLong));
  batch.Set("weight", at::ones({b}));
  const auto vars = LearnerVariables(*task);
  auto step = [&](int64_t s) {
    SetGlobalStep(s);
    auto r = task->FPropDefaultTheta(batch);
    task->learner().Apply(r.metrics, vars, s);
  };
  for (int i = 0; i < 3; ++i) step(i);  // warm up
  std::vector<double> rates;
  const int steps = std::stoi(f["steps"]);
  for (int r = 0; r < std::stoi(f["runs"]); ++r) {
    const double t0 = Now();
    for (int i = 0; i < steps; ++i) step(i);
    rates.push_back(steps * b / (Now() - t0));
  }
  std::sort(rates.begin(), rates.end());
  std::printf("glossa_images_per_sec %.1f\n", rates[rates.size() / 2]);
  return 0;
}
