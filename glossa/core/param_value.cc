#include "glossa/core/param_value.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/params.h"

namespace glossa {
namespace {

std::pair<std::string, std::string> SplitAtLastDot(const std::string& s) {
  size_t pos = s.rfind('.');
  if (pos == std::string::npos) return {"", s};
  return {s.substr(0, pos), s.substr(pos + 1)};
}

struct EnumRegistry {
  std::mutex mu;
  std::unordered_map<std::string, std::vector<std::string>> types;
};

EnumRegistry& Enums() {
  static EnumRegistry* registry = new EnumRegistry;
  return *registry;
}

}  // namespace

std::string EnumValue::ShortType() const { return SplitAtLastDot(type).second; }
std::string EnumValue::Module() const { return SplitAtLastDot(type).first; }

void RegisterEnum(std::string_view type, std::vector<std::string> names) {
  if (type.find('.') == std::string_view::npos || type.front() == '.' || type.back() == '.') {
    throw InvalidArgumentError(StrCat(
        "enum type '", type, "' must be a dotted <module>.<Name>, e.g. 'glossa.layers.Mode'"));
  }
  auto& reg = Enums();
  std::lock_guard<std::mutex> lock(reg.mu);
  auto it = reg.types.find(std::string(type));
  if (it != reg.types.end()) {
    if (it->second != names) {
      throw InvalidArgumentError(StrCat("enum type '", type,
                                        "' is already registered with different names: [",
                                        Join(it->second, ", "), "]"));
    }
    return;
  }
  reg.types.emplace(std::string(type), std::move(names));
}

const std::vector<std::string>& EnumNames(std::string_view type) {
  auto& reg = Enums();
  std::lock_guard<std::mutex> lock(reg.mu);
  auto it = reg.types.find(std::string(type));
  if (it == reg.types.end()) {
    std::vector<std::string> keys;
    for (const auto& [k, v] : reg.types) keys.push_back(k);
    throw NotFoundError(StrCat("enum type ", KeyErrorString(type, keys)));
  }
  return it->second;
}

EnumValue MakeEnum(std::string_view type, std::string_view name) {
  const auto& names = EnumNames(type);
  if (std::find(names.begin(), names.end(), name) == names.end()) {
    throw NotFoundError(StrCat("enum ", type, " has no value ", KeyErrorString(name, names)));
  }
  return EnumValue{std::string(type), std::string(name)};
}

std::string ClassRef::Module() const { return SplitAtLastDot(key).first; }
std::string ClassRef::Name() const { return SplitAtLastDot(key).second; }
std::string ClassRef::ModuleSlashName() const { return Module() + "/" + Name(); }

ParamValue::ParamValue(const Params& v) : v_(Box<Params>(v)) {}
ParamValue::ParamValue(Params&& v) : v_(Box<Params>(std::move(v))) {}
ParamValue::ParamValue(const ParamValue&) = default;
ParamValue::ParamValue(ParamValue&&) noexcept = default;
ParamValue& ParamValue::operator=(const ParamValue&) = default;
ParamValue& ParamValue::operator=(ParamValue&&) noexcept = default;
ParamValue::~ParamValue() = default;

std::string_view ParamValue::KindName(Kind kind) {
  switch (kind) {
    case Kind::kNone: return "NoneType";
    case Kind::kBool: return "bool";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kString: return "str";
    case Kind::kDType: return "DType";
    case Kind::kEnum: return "enum";
    case Kind::kClass: return "type";
    case Kind::kList: return "list";
    case Kind::kDict: return "dict";
    case Kind::kParams: return "Params";
  }
  return "unknown";
}

std::string_view ParamValue::KindName() const { return KindName(kind()); }

void ParamValue::KindError(Kind wanted) const {
  throw InvalidArgumentError(StrCat("param value is a ", KindName(), ", not a ", KindName(wanted)));
}

bool ParamValue::AsBool() const {
  if (kind() != Kind::kBool) KindError(Kind::kBool);
  return std::get<bool>(v_);
}
int64_t ParamValue::AsInt() const {
  if (kind() != Kind::kInt) KindError(Kind::kInt);
  return std::get<int64_t>(v_);
}
double ParamValue::AsFloat() const {
  if (kind() == Kind::kInt) return static_cast<double>(std::get<int64_t>(v_));
  if (kind() != Kind::kFloat) KindError(Kind::kFloat);
  return std::get<double>(v_);
}
const std::string& ParamValue::AsString() const {
  if (kind() != Kind::kString) KindError(Kind::kString);
  return std::get<std::string>(v_);
}
DType ParamValue::AsDType() const {
  if (kind() != Kind::kDType) KindError(Kind::kDType);
  return std::get<DType>(v_);
}
const EnumValue& ParamValue::AsEnum() const {
  if (kind() != Kind::kEnum) KindError(Kind::kEnum);
  return std::get<EnumValue>(v_);
}
const ClassRef& ParamValue::AsClass() const {
  if (kind() != Kind::kClass) KindError(Kind::kClass);
  return std::get<ClassRef>(v_);
}
const ParamValue::List& ParamValue::AsList() const {
  if (kind() != Kind::kList) KindError(Kind::kList);
  return std::get<List>(v_);
}
ParamValue::List& ParamValue::MutableList() {
  if (kind() != Kind::kList) KindError(Kind::kList);
  return std::get<List>(v_);
}
const ParamValue::Dict& ParamValue::AsDict() const {
  if (kind() != Kind::kDict) KindError(Kind::kDict);
  return *std::get<Box<Dict>>(v_);
}
ParamValue::Dict& ParamValue::MutableDict() {
  if (kind() != Kind::kDict) KindError(Kind::kDict);
  return *std::get<Box<Dict>>(v_);
}
const Params& ParamValue::AsParams() const {
  if (kind() != Kind::kParams) KindError(Kind::kParams);
  return *std::get<Box<Params>>(v_);
}
Params& ParamValue::MutableParams() {
  if (kind() != Kind::kParams) KindError(Kind::kParams);
  return *std::get<Box<Params>>(v_);
}

bool ParamValue::operator==(const ParamValue& other) const { return v_ == other.v_; }

}  // namespace glossa
