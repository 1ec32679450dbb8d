// Params: a tree of named, documented hyperparameters with Lingvo's semantics — the configuration
// of every layer, input generator, task and program. Values are ParamValues (see param_value.h).
//
//   Params p;
//   p.Define("num_layers", 2, "Number of layers.").Define("encoder", Params(), "Encoder params.");
//   p.Set("encoder.dim", 512);  // dotted paths into nested Params, [i] into lists
//   std::string text = p.ToText();  // Lingvo's text format; Params::FromText reads it back
//
// Paths: `a.b` descends into nested Params, `a[1]` indexes a list, `a['k']` a string-keyed dict.
// Unknown keys raise NotFoundError whose message is Lingvo's: `actuvation (did you mean:
// [activation,activations])`, or `... (keys are [...])` without similar keys.
// Freeze() freezes the top level only: nested Params stay mutable through GetParams(); copies of a
// frozen Params stay frozen.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "glossa/core/param_value.h"
#include "glossa/core/registry.h"

namespace glossa {

namespace proto {
class Hyperparam;
}  // namespace proto

class Params {
 public:
  struct Entry {
    std::string name;
    ParamValue value;
    std::string doc;
  };

  Params() = default;
  Params(const Params&) = default;
  Params(Params&&) noexcept = default;
  Params& operator=(const Params&) = default;
  Params& operator=(Params&&) noexcept = default;

  // Defines a new param. `name` must match ^[a-z_][a-z0-9_]*$ (InvalidArgument otherwise);
  // defining an existing name is InvalidArgument; FailedPrecondition when frozen.
  Params& Define(std::string_view name, ParamValue default_value, std::string_view doc);

  // Sets the value at `path`. NotFound for an unknown key; FailedPrecondition when frozen.
  Params& Set(std::string_view path, ParamValue value);
  // The value at `path`; NotFound for an unknown key.
  const ParamValue& Get(std::string_view path) const;
  // Typed shortcuts: InvalidArgument naming the path when the value has another kind.
  bool GetBool(std::string_view path) const;
  int64_t GetInt(std::string_view path) const;
  double GetFloat(std::string_view path) const;  // ints widen
  const std::string& GetString(std::string_view path) const;
  const Params& GetParams(std::string_view path) const;
  // Mutable access to a nested Params; allowed on a frozen Params (only its top level is frozen).
  Params& GetParams(std::string_view path);
  // True when the value at `path` is not None (Lingvo's ParamIsSet); NotFound for unknown keys.
  bool IsSet(std::string_view path) const;
  // The doc string of the param at `path`.
  const std::string& Doc(std::string_view path) const;
  // Removes the param at `path`.
  Params& Delete(std::string_view path);

  // Flat membership: true when this Params itself defines `name` (no dotted paths).
  bool Contains(std::string_view name) const;
  size_t size() const { return entries_.size(); }
  bool empty() const { return entries_.empty(); }
  // Entries in definition order.
  const std::vector<Entry>& entries() const { return entries_; }
  std::vector<Entry>::const_iterator begin() const { return entries_.begin(); }
  std::vector<Entry>::const_iterator end() const { return entries_.end(); }
  std::vector<std::string> Keys() const;

  // A deep copy (nested Params, lists and dicts are copied); a frozen Params copies frozen.
  Params Copy() const { return *this; }
  void Freeze() { frozen_ = true; }
  bool IsFrozen() const { return frozen_; }

  // Equal when both define the same names with equal values (docs and frozenness ignored).
  bool operator==(const Params& other) const;

  // Recursively visits values. Keys: `a.b` into Params, `a[1]` into lists, `a['k']` into dicts.
  // `enter(key, value)` is called on Params, lists and dicts (the root included, with key "");
  // returning false treats the value as a leaf and passes it to `visit`. `exit` follows a
  // traversed container. Default `enter` enters everything.
  using VisitFn = std::function<void(const std::string& key, const ParamValue& value)>;
  using EnterFn = std::function<bool(const std::string& key, const ParamValue& value)>;
  void Visit(const VisitFn& visit, const EnterFn& enter = {}, const VisitFn& exit = {}) const;

  // Sets every key of `other` that this Params also defines (nested Params are copied).
  Params& MergeCommonKeysFrom(const Params& other);

  // Lingvo's text format; see docs/params_text_format.md.
  std::string ToText() const;
  // Merges `text` into this Params; values are parsed by the kind of the current value. On error
  // (InvalidArgument naming the line, NotFound for unknown keys) this Params is left unchanged.
  Params& FromText(std::string_view text);
  // ToText with each param's doc string above its line as `# ` comments (multi-line docs become
  // several comment lines), so the result still reads back with FromText.
  std::string ToTextWithDocs() const;
  // Lingvo's TextDiff: '>' lines for this, '<' for other, '?' for nested Params/dicts that differ.
  std::string TextDiff(const Params& other) const;
  // Lingvo's str(params): nested braces, sorted keys.
  std::string ToString() const;

  // Lingvo's hyperparams.proto (same field numbers; bytes interchange with Lingvo). Doubles are
  // stored as 32-bit floats, as Lingvo does.
  void ToProto(proto::Hyperparam* out) const;
  std::string ToProtoBytes() const;
  static Params FromProto(const proto::Hyperparam& proto);
  static Params FromProtoBytes(std::string_view bytes);

  // InstantiableParams support: the registry key held by `cls`; FailedPrecondition without one.
  std::string ClsKey() const;
  // Constructs the class named by `cls` from a copy of this Params; InvalidArgument when that class
  // does not derive from Base; NotFound (with near names) for an unregistered key.
  template <typename Base>
  std::unique_ptr<Base> Instantiate() const {
    return ClassRegistry::Create<Base>(ClsKey(), Copy());
  }

 private:
  friend class ParamsPath;
  Entry* FindEntry(std::string_view name);
  const Entry* FindEntry(std::string_view name) const;
  void CheckMutable(std::string_view what) const;

  std::vector<Entry> entries_;
  bool frozen_ = false;
};

// A Params with `cls` defined as a reference to the registered class `cls_key`.
Params InstantiableParams(std::string_view cls_key);
template <typename T>
Params InstantiableParams() {
  return InstantiableParams(ClassRegistry::KeyOf<T>());
}
// The class reference of registered class T, for `p.Set("cls", ClsOf<T>())`.
template <typename T>
ClassRef ClsOf() {
  return ClassRef{ClassRegistry::KeyOf<T>()};
}

// Copies every field of `from` into `to` (except `cls` and names in `skip`); nested Params are
// copied. Unless `ignore_unknown_keys`, a field `to` lacks is NotFound.
Params& CopyFieldsTo(const Params& from, Params& to, const std::vector<std::string>& skip = {},
                     bool ignore_unknown_keys = false);

}  // namespace glossa
