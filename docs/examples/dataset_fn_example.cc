// A dataset function and its input generator, runnable as a test.
// Compiled into the test binary (tests/CMakeLists.txt); docs/input.md shows this file verbatim.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include "glossa/base/errors.h"
#include "glossa/input/input_generator.h"

namespace example {

using glossa::NestedMap;

// Batches of `batch_size` (x, y) pairs on the line y = slope·x + noise, `num_batches` of them
// (0: forever).
class LineDataset : public glossa::Dataset {
 public:
  LineDataset(int64_t batch_size, double slope, int64_t num_batches, int64_t seed)
      : batch_size_(batch_size), slope_(slope), num_batches_(num_batches) {
    gen_ = at::make_generator<at::CPUGeneratorImpl>(seed);
  }
  NestedMap Next() override {
    if (num_batches_ > 0 && produced_ == num_batches_) {
      throw glossa::OutOfRangeError("end of input: LineDataset produced every batch");
    }
    ++produced_;
    at::Tensor x = at::empty({batch_size_, 1}).uniform_(-1, 1, gen_);
    at::Tensor y = slope_ * x + 0.01 * at::normal(0, 1, {batch_size_, 1}, gen_);
    return NestedMap{{"x", x}, {"y", y}};
  }

 private:
  int64_t batch_size_;
  double slope_;
  int64_t num_batches_, produced_ = 0;
  at::Generator gen_;
};

// Registration declares the arguments; each becomes an entry of p.args (no default: None, must be
// set). The function may capture state; only the declared arguments are exposed.
[[maybe_unused]] const bool kRegistered = [] {
  glossa::RegisterDatasetFn(
      "example.Line",
      {{"batch_size", std::nullopt, "Examples per batch."},
       {"slope", glossa::ParamValue(2.0), "Slope of the line."},
       {"num_batches", glossa::ParamValue(0), "Batches before end of data; 0 repeats forever."},
       {"seed", glossa::ParamValue(1), "Random seed."}},
      [](const glossa::Params& args) {
        return std::make_unique<LineDataset>(args.GetInt("batch_size"), args.GetFloat("slope"),
                                             args.GetInt("num_batches"), args.GetInt("seed"));
      },
      "Noisy points on a line.",
      // The generator's batch_size feeds the function's batch_size (so it is not in p.args).
      {.map_args = {{"batch_size", "batch_size"}}});
  return true;
}();

TEST(DocsExample, LineDatasetAsAnInputGenerator) {
  glossa::Params p = glossa::DatasetInput::ParamsFor("example.Line");
  p.Set("name", "line").Set("batch_size", 32);  // also the function's batch_size (map_args)
  p.FromText("args.slope : -3.0\nargs.num_batches : 5\n");  // overrides, as from a params file
  auto input = glossa::InstantiateLayer<glossa::BaseInputGenerator>(p);
  int batches = 0;
  try {
    while (true) {
      NestedMap batch = input->GetPreprocessedInputBatch();
      EXPECT_EQ(batch.GetTensor("x").sizes(), (std::vector<int64_t>{32, 1}));
      at::Tensor slope = (batch.GetTensor("y") / batch.GetTensor("x")).median();
      EXPECT_NEAR(slope.item<double>(), -3.0, 0.1);
      ++batches;
    }
  } catch (const glossa::OutOfRangeError&) {
  }
  EXPECT_EQ(batches, 5);
}

}  // namespace example
