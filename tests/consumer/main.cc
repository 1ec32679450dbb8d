// Uses the installed headers and library: registers a class, builds its Params, round-trips them
// through text and proto, instantiates it, and uses a NestedMap of tensors.
#include <ATen/ATen.h>

#include <iostream>

#include "glossa/base/errors.h"
#include "glossa/core/hyperparams.pb.h"
#include "glossa/core/nested_map.h"
#include "glossa/core/params.h"
#include "glossa/core/step_seed.h"

namespace {

class Greeter {
 public:
  static glossa::Params Params() {
    auto p = glossa::InstantiableParams("consumer.app.Greeter");
    p.Define("greeting", "hello", "What to say.");
    p.Define("times", 1, "How many times.");
    return p;
  }
  explicit Greeter(const glossa::Params& p) : p_(p) {}
  virtual ~Greeter() = default;
  std::string Say() const {
    std::string out;
    for (int64_t i = 0; i < p_.GetInt("times"); ++i) out += p_.GetString("greeting");
    return out;
  }

 private:
  glossa::Params p_;
};

GLOSSA_REGISTER_CLASS(Greeter, "consumer.app.Greeter");

}  // namespace

int main() {
  glossa::Params p = Greeter::Params();
  p.FromText("greeting : 'hi'\ntimes : 3\n");
  glossa::Params back = glossa::Params::FromProtoBytes(p.ToProtoBytes());
  if (!(back == p)) {
    std::cerr << "proto round trip changed the params\n";
    return 1;
  }
  std::string said = back.Instantiate<Greeter>()->Say();
  glossa::NestedMap m;
  m.Set("x.y[0]", at::ones({2, 2}));
  double total = m.GetTensor("x.y[0]").sum().item<double>();
  std::cout << said << " " << total << " " << glossa::GenerateSeedFromName("test") << "\n";
  return said == "hihihi" && total == 4.0 && glossa::GenerateSeedFromName("test") == 552009270 ? 0
                                                                                               : 1;
}
