#include "glossa/layers/torchscript.h"

#include <sstream>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/layers/base_layer.h"

namespace glossa {

std::string TorchScriptWriter::Param(const std::string& name, const at::Tensor& t) {
  params_.emplace_back(name, t.detach().to(at::kFloat).clone().contiguous());
  return "self." + name;
}

void TorchScriptWriter::Line(const std::string& code) { code_ += "    " + code + "\n"; }

std::string TorchScriptWriter::Num(double v) {
  std::ostringstream s;
  s.precision(17);
  s << v;
  std::string out = s.str();
  if (out.find_first_of(".en") == std::string::npos) out += ".0";
  return out;
}

void TorchScriptWriter::Unsupported(const BaseLayer& layer, const std::string& what) {
  throw UnimplementedError(StrCat("--torchscript: layer '", layer.path(), "': ", what,
                                  " is not covered by the TorchScript export"));
}

}  // namespace glossa
