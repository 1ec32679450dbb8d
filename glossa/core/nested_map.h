// NestedMap: a string-keyed tree of values — tensors first, also numbers, strings, nested maps and
// lists — with Lingvo's semantics. Batches, theta, metrics and decoder outputs are NestedMaps.
// Traversal order is Lingvo's: map keys sorted, lists in order. Copying a NestedMap copies its
// structure and shares tensor storage (Lingvo's DeepCopy).
//
//   NestedMap batch;
//   batch.Set("src.ids", ids);  batch.Set("tgt.labels[0]", labels);  // creates maps and lists
//   std::vector<at::Tensor> flat = batch.FlattenTensors();
//   NestedMap same_shape = batch.Pack(batch.Flatten());
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "glossa/base/box.h"

namespace glossa {

class NestedMap;

class NestedValue {
 public:
  enum class Kind { kNone, kTensor, kInt, kFloat, kBool, kString, kMap, kList };
  using List = std::vector<NestedValue>;

  NestedValue();
  NestedValue(std::nullptr_t);  // NOLINT: None
  NestedValue(at::Tensor t);    // NOLINT
  template <std::integral T>
  requires(!std::same_as<T, bool>) NestedValue(T v)
      : NestedValue(static_cast<int64_t>(v), Int{}) {}  // NOLINT
  NestedValue(double v);                                // NOLINT
  NestedValue(bool v);                                  // NOLINT
  NestedValue(const char* v);                           // NOLINT
  NestedValue(std::string v);                           // NOLINT
  NestedValue(const NestedMap& m);                      // NOLINT
  NestedValue(NestedMap&& m);                           // NOLINT
  NestedValue(List l);                                  // NOLINT
  NestedValue(const NestedValue&);
  NestedValue(NestedValue&&) noexcept;
  NestedValue& operator=(const NestedValue&);
  NestedValue& operator=(NestedValue&&) noexcept;
  ~NestedValue();

  Kind kind() const { return static_cast<Kind>(v_.index()); }
  std::string_view KindName() const;
  bool is_none() const { return kind() == Kind::kNone; }
  bool is_tensor() const { return kind() == Kind::kTensor; }
  bool is_map() const { return kind() == Kind::kMap; }
  bool is_list() const { return kind() == Kind::kList; }

  // Typed access; InvalidArgument naming the actual kind on a mismatch.
  const at::Tensor& AsTensor() const;
  int64_t AsInt() const;
  double AsFloat() const;  // ints widen
  bool AsBool() const;
  const std::string& AsString() const;
  const NestedMap& AsMap() const;
  NestedMap& MutableMap();
  const List& AsList() const;
  List& MutableList();

  // Python-style str() of a leaf, as DebugString shows it.
  std::string DebugValueString() const;

 private:
  struct Int {};
  NestedValue(int64_t v, Int);
  [[noreturn]] void KindError(Kind wanted) const;
  std::variant<std::monostate, at::Tensor, int64_t, double, bool, std::string, Box<NestedMap>, List>
      v_;
};

class NestedMap {
 public:
  using Items = std::map<std::string, NestedValue>;
  using KeyValue = std::pair<std::string, NestedValue>;

  NestedMap() = default;
  // NestedMap{{"x", tensor}, {"n", 3}}; each key is checked.
  NestedMap(std::initializer_list<KeyValue> items);

  // Keys must match [A-Za-z_][A-Za-z0-9_]* and not be reserved (Python dict's attribute names,
  // e.g. `keys`, `items`, `get`, and dunder names): InvalidArgument otherwise.
  static void CheckKey(std::string_view key);

  // Flat (one-level) access.
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  bool contains(std::string_view key) const { return items_.count(std::string(key)) > 0; }
  // Sets a top-level key (no path parsing); the key is checked.
  void Put(std::string_view key, NestedValue value);
  const NestedValue& at(std::string_view key) const;  // NotFound listing available keys
  NestedValue& at(std::string_view key);
  void erase(std::string_view key);  // NotFound when absent
  Items::const_iterator begin() const { return items_.begin(); }
  Items::const_iterator end() const { return items_.end(); }

  // Nested access with keys like "a.b[1].c". NotFound for a missing key, InvalidArgument for an
  // index out of range or indexing into a non-list.
  const NestedValue& GetItem(std::string_view key) const;
  NestedValue& GetItem(std::string_view key);
  const at::Tensor& GetTensor(std::string_view key) const { return GetItem(key).AsTensor(); }
  // GetItem, or `default_value` when the key is missing or unreachable.
  NestedValue Get(std::string_view key, NestedValue default_value = {}) const;
  bool Has(std::string_view key) const;
  // Sets a nested key, creating intermediate maps and lists; `a[i]` may append at i == len(a).
  void Set(std::string_view key, NestedValue value);

  // Leaves in traversal order (keys sorted, lists in order); empty containers contribute nothing.
  std::vector<NestedValue> Flatten() const;
  // Flatten(), requiring every leaf to be a tensor (InvalidArgument naming the key otherwise).
  std::vector<at::Tensor> FlattenTensors() const;
  std::vector<KeyValue> FlattenItems() const;
  // The flattened keys, e.g. "bar.y[1].z".
  std::vector<std::string> Keys() const;
  // A copy of this structure with leaves replaced by `values` in order (InvalidArgument when the
  // count differs from the number of leaves).
  NestedMap Pack(const std::vector<NestedValue>& values) const;
  NestedMap Pack(const std::vector<at::Tensor>& values) const;
  NestedMap Transform(const std::function<NestedValue(const NestedValue&)>& fn) const;
  NestedMap TransformWithKey(
      const std::function<NestedValue(const std::string&, const NestedValue&)>& fn) const;
  // Keeps the leaves for which `fn` is true; lists are compacted and containers emptied by the
  // filter are removed, while containers that were already empty are kept.
  NestedMap Filter(const std::function<bool(const NestedValue&)>& fn) const;
  NestedMap FilterKeyVal(
      const std::function<bool(const std::string&, const NestedValue&)>& fn) const;
  // True when both have the same flattened keys (so x.Pack(y.Flatten()) has y's structure).
  bool IsCompatible(const NestedMap& other) const;
  // Copies the structure and shares the leaves (tensors alias).
  NestedMap DeepCopy() const { return *this; }
  // Sets every flattened item of `other` into this map.
  NestedMap& Update(const NestedMap& other);
  // A new map with this map's items, then `other`'s.
  NestedMap Union(const NestedMap& other) const;
  // One line per leaf, "key" padded to the longest key + 4, then the value; lines sorted.
  std::string DebugString() const;

 private:
  Items items_;
};

}  // namespace glossa
