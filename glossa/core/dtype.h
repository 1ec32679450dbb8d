// DType: the element types a Params value can name (`dtype : float32`), with TensorFlow's names so
// params text written by Lingvo reads here, and the mapping to ATen scalar types.
//
//   DType d = ParseDType("bfloat16");   // InvalidArgument for an unknown name
//   at::ScalarType s = ToScalarType(d); DTypeName(d) == "bfloat16"
#pragma once

#include <c10/core/ScalarType.h>

#include <optional>
#include <string_view>

namespace glossa {

enum class DType {
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kUInt8,
  kBool,
  kComplex64,
  kComplex128,
  kString,
};

// TensorFlow's name: "float32", "bfloat16", "int64", "bool", "string", ...
std::string_view DTypeName(DType dtype);
std::optional<DType> DTypeFromName(std::string_view name);
// Like DTypeFromName, but throws InvalidArgument listing the known names.
DType ParseDType(std::string_view name);

// InvalidArgument for kString, which has no tensor scalar type.
at::ScalarType ToScalarType(DType dtype);
DType FromScalarType(at::ScalarType type);

}  // namespace glossa
