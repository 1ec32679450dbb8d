#include "glossa/core/dtype.h"

#include <array>
#include <string>
#include <utility>
#include <vector>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"

namespace glossa {
namespace {

struct DTypeInfo {
  DType dtype;
  std::string_view name;
  std::optional<at::ScalarType> scalar_type;
};

constexpr std::array<DTypeInfo, 13> kDTypes = {{
    {DType::kFloat16, "float16", at::ScalarType::Half},
    {DType::kBFloat16, "bfloat16", at::ScalarType::BFloat16},
    {DType::kFloat32, "float32", at::ScalarType::Float},
    {DType::kFloat64, "float64", at::ScalarType::Double},
    {DType::kInt8, "int8", at::ScalarType::Char},
    {DType::kInt16, "int16", at::ScalarType::Short},
    {DType::kInt32, "int32", at::ScalarType::Int},
    {DType::kInt64, "int64", at::ScalarType::Long},
    {DType::kUInt8, "uint8", at::ScalarType::Byte},
    {DType::kBool, "bool", at::ScalarType::Bool},
    {DType::kComplex64, "complex64", at::ScalarType::ComplexFloat},
    {DType::kComplex128, "complex128", at::ScalarType::ComplexDouble},
    {DType::kString, "string", std::nullopt},
}};

}  // namespace

std::string_view DTypeName(DType dtype) {
  for (const auto& info : kDTypes) {
    if (info.dtype == dtype) return info.name;
  }
  throw InternalError(StrCat("unknown DType enumerator ", static_cast<int>(dtype)));
}

std::optional<DType> DTypeFromName(std::string_view name) {
  for (const auto& info : kDTypes) {
    if (info.name == name) return info.dtype;
  }
  return std::nullopt;
}

DType ParseDType(std::string_view name) {
  if (auto d = DTypeFromName(name)) return *d;
  std::vector<std::string> names;
  for (const auto& info : kDTypes) names.emplace_back(info.name);
  throw InvalidArgumentError(
      StrCat("unknown dtype '", name, "'; expected one of: ", Join(names, ", ")));
}

at::ScalarType ToScalarType(DType dtype) {
  for (const auto& info : kDTypes) {
    if (info.dtype == dtype) {
      if (!info.scalar_type) {
        throw InvalidArgumentError(StrCat("dtype ", info.name, " has no tensor scalar type"));
      }
      return *info.scalar_type;
    }
  }
  throw InternalError(StrCat("unknown DType enumerator ", static_cast<int>(dtype)));
}

DType FromScalarType(at::ScalarType type) {
  for (const auto& info : kDTypes) {
    if (info.scalar_type == type) return info.dtype;
  }
  throw InvalidArgumentError(StrCat("scalar type ", c10::toString(type), " has no Glossa dtype"));
}

}  // namespace glossa
