// ParamValue: one value in a Params tree. The kinds are Lingvo's: none, bool, int64, double,
// string, dtype, enum (a registered enum type and one of its names), class reference (a
// class-registry key), list, string-keyed dict, and nested Params. Values copy deeply (a copied
// list of Params owns its own Params).
//
//   ParamValue v = 3;                       // kInt
//   ParamValue l = ParamValue::List{1, 2.0, "3"};
//   int64_t n = v.AsInt();  v.KindName() == "int"
#pragma once

#include <compare>
#include <concepts>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "glossa/base/box.h"
#include "glossa/core/dtype.h"

namespace glossa {

class Params;

// A value of a registered enum type. `type` is the registered dotted name
// ("glossa.layers.ProjectionType"); text shows the last component: "ProjectionType.DENSE".
struct EnumValue {
  std::string type;
  std::string name;
  // The type's short name (after the last '.').
  std::string ShortType() const;
  // The module part (before the last '.'), "" when there is none.
  std::string Module() const;
  bool operator==(const EnumValue&) const = default;
};

// Registers an enum type (dotted name) with its value names. Registering the same type twice with
// the same names is a no-op; with different names it is InvalidArgument.
void RegisterEnum(std::string_view type, std::vector<std::string> names);
// The names of a registered enum type; NotFound (with near names) when it is not registered.
const std::vector<std::string>& EnumNames(std::string_view type);
// A validated enum value: NotFound for an unknown type or an unknown name.
EnumValue MakeEnum(std::string_view type, std::string_view name);

// A reference to a registered class by its registry key, "<module>.<Name>" (e.g.
// "glossa.layers.FeedForward"). Text and proto write it as "type/<module>/<Name>" like Lingvo.
struct ClassRef {
  std::string key;
  std::string Module() const;
  std::string Name() const;
  // "glossa.layers/FeedForward" (Lingvo's `module/Name`, the proto's type_val).
  std::string ModuleSlashName() const;
  bool operator==(const ClassRef&) const = default;
};

class ParamValue {
 public:
  enum class Kind {
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kDType,
    kEnum,
    kClass,
    kList,
    kDict,
    kParams
  };
  using List = std::vector<ParamValue>;
  using Dict = std::map<std::string, ParamValue>;

  ParamValue() = default;
  ParamValue(std::nullptr_t) {}  // NOLINT: `nullptr` means None, as Python's None
  ParamValue(bool v) : v_(v) {}  // NOLINT
  template <std::integral T>
  requires(!std::same_as<T, bool>) ParamValue(T v) : v_(static_cast<int64_t>(v)) {}  // NOLINT
  ParamValue(double v) : v_(v) {}                                                    // NOLINT
  ParamValue(float v) : v_(static_cast<double>(v)) {}                                // NOLINT
  ParamValue(const char* v) : v_(std::string(v)) {}                                  // NOLINT
  ParamValue(std::string v) : v_(std::move(v)) {}                                    // NOLINT
  ParamValue(std::string_view v) : v_(std::string(v)) {}                             // NOLINT
  ParamValue(DType v) : v_(v) {}                                                     // NOLINT
  ParamValue(EnumValue v) : v_(std::move(v)) {}                                      // NOLINT
  ParamValue(ClassRef v) : v_(std::move(v)) {}                                       // NOLINT
  ParamValue(List v) : v_(std::move(v)) {}                                           // NOLINT
  ParamValue(Dict v) : v_(Box<Dict>(std::move(v))) {}                                // NOLINT
  ParamValue(const Params& v);                                                       // NOLINT
  ParamValue(Params&& v);                                                            // NOLINT

  ParamValue(const ParamValue&);
  ParamValue(ParamValue&&) noexcept;
  ParamValue& operator=(const ParamValue&);
  ParamValue& operator=(ParamValue&&) noexcept;
  ~ParamValue();

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  // "NoneType", "bool", "int", "float", "str", "DType", "enum", "type", "list", "dict", "Params":
  // Python's type names, which error messages and ToTextWithTypes-style tools show.
  std::string_view KindName() const;
  static std::string_view KindName(Kind kind);

  bool is_none() const { return kind() == Kind::kNone; }
  bool is_params() const { return kind() == Kind::kParams; }
  bool is_list() const { return kind() == Kind::kList; }
  bool is_dict() const { return kind() == Kind::kDict; }

  // Typed access; InvalidArgument naming the actual kind on a mismatch. AsFloat accepts ints.
  bool AsBool() const;
  int64_t AsInt() const;
  double AsFloat() const;
  const std::string& AsString() const;
  DType AsDType() const;
  const EnumValue& AsEnum() const;
  const ClassRef& AsClass() const;
  const List& AsList() const;
  List& MutableList();
  const Dict& AsDict() const;
  Dict& MutableDict();
  const Params& AsParams() const;
  Params& MutableParams();

  bool operator==(const ParamValue& other) const;

 private:
  using Variant = std::variant<std::monostate, bool, int64_t, double, std::string, DType, EnumValue,
                               ClassRef, List, Box<Dict>, Box<Params>>;
  [[noreturn]] void KindError(Kind wanted) const;
  Variant v_;
};

}  // namespace glossa
