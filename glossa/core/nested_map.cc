#include "glossa/core/nested_map.h"

#include <algorithm>
#include <charconv>
#include <optional>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/dtype.h"

namespace glossa {

// ---- NestedValue ----

NestedValue::NestedValue() = default;
NestedValue::NestedValue(std::nullptr_t) {}
NestedValue::NestedValue(at::Tensor t) : v_(std::move(t)) {}
NestedValue::NestedValue(int64_t v, Int) : v_(v) {}
NestedValue::NestedValue(double v) : v_(v) {}
NestedValue::NestedValue(bool v) : v_(v) {}
NestedValue::NestedValue(const char* v) : v_(std::string(v)) {}
NestedValue::NestedValue(std::string v) : v_(std::move(v)) {}
NestedValue::NestedValue(const NestedMap& m) : v_(Box<NestedMap>(m)) {}
NestedValue::NestedValue(NestedMap&& m) : v_(Box<NestedMap>(std::move(m))) {}
NestedValue::NestedValue(List l) : v_(std::move(l)) {}
NestedValue::NestedValue(const NestedValue&) = default;
NestedValue::NestedValue(NestedValue&&) noexcept = default;
NestedValue& NestedValue::operator=(const NestedValue&) = default;
NestedValue& NestedValue::operator=(NestedValue&&) noexcept = default;
NestedValue::~NestedValue() = default;

std::string_view NestedValue::KindName() const {
  switch (kind()) {
    case Kind::kNone: return "None";
    case Kind::kTensor: return "Tensor";
    case Kind::kInt: return "int";
    case Kind::kFloat: return "float";
    case Kind::kBool: return "bool";
    case Kind::kString: return "str";
    case Kind::kMap: return "NestedMap";
    case Kind::kList: return "list";
  }
  return "unknown";
}

void NestedValue::KindError(Kind wanted) const {
  static const char* kNames[] = {"None", "Tensor", "int",       "float",
                                 "bool", "str",    "NestedMap", "list"};
  throw InvalidArgumentError(
      StrCat("NestedMap value is a ", KindName(), ", not a ", kNames[static_cast<int>(wanted)]));
}

const at::Tensor& NestedValue::AsTensor() const {
  if (kind() != Kind::kTensor) KindError(Kind::kTensor);
  return std::get<at::Tensor>(v_);
}
int64_t NestedValue::AsInt() const {
  if (kind() != Kind::kInt) KindError(Kind::kInt);
  return std::get<int64_t>(v_);
}
double NestedValue::AsFloat() const {
  if (kind() == Kind::kInt) return static_cast<double>(std::get<int64_t>(v_));
  if (kind() != Kind::kFloat) KindError(Kind::kFloat);
  return std::get<double>(v_);
}
bool NestedValue::AsBool() const {
  if (kind() != Kind::kBool) KindError(Kind::kBool);
  return std::get<bool>(v_);
}
const std::string& NestedValue::AsString() const {
  if (kind() != Kind::kString) KindError(Kind::kString);
  return std::get<std::string>(v_);
}
const NestedMap& NestedValue::AsMap() const {
  if (kind() != Kind::kMap) KindError(Kind::kMap);
  return *std::get<Box<NestedMap>>(v_);
}
NestedMap& NestedValue::MutableMap() {
  if (kind() != Kind::kMap) KindError(Kind::kMap);
  return *std::get<Box<NestedMap>>(v_);
}
const NestedValue::List& NestedValue::AsList() const {
  if (kind() != Kind::kList) KindError(Kind::kList);
  return std::get<List>(v_);
}
NestedValue::List& NestedValue::MutableList() {
  if (kind() != Kind::kList) KindError(Kind::kList);
  return std::get<List>(v_);
}

std::string NestedValue::DebugValueString() const {
  switch (kind()) {
    case Kind::kNone: return "None";
    case Kind::kTensor: {
      const at::Tensor& t = AsTensor();
      if (!t.defined()) return "Tensor(undefined)";
      std::vector<std::string> dims;
      for (int64_t d : t.sizes()) dims.push_back(std::to_string(d));
      return StrCat("Tensor(shape=[", Join(dims, ", "),
                    "], dtype=", DTypeName(FromScalarType(t.scalar_type())), ")");
    }
    case Kind::kInt: return std::to_string(AsInt());
    case Kind::kFloat: return PyFloatRepr(AsFloat());
    case Kind::kBool: return AsBool() ? "True" : "False";
    case Kind::kString: return AsString();
    case Kind::kMap: return "NestedMap";
    case Kind::kList: return "list";
  }
  return "";
}

// ---- NestedMap ----

namespace {

struct KeyPart {
  std::string name;
  std::optional<size_t> index;
};

// `name` or `name[index]`, parsed by hand (keys and indexes come from user paths).
KeyPart ParsePart(std::string_view part, std::string_view full_key) {
  auto fail = [&]() -> KeyPart {
    throw InvalidArgumentError(StrCat("invalid NestedMap key '", part, "' in '", full_key,
                                      "': expected name or name[index]"));
  };
  auto alpha = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  size_t i = 0;
  if (part.empty() || !alpha(part[0])) return fail();
  while (i < part.size() && (alpha(part[i]) || digit(part[i]))) ++i;
  KeyPart out{std::string(part.substr(0, i)), std::nullopt};
  if (i == part.size()) return out;
  if (part[i] != '[' || part.back() != ']' || i + 2 >= part.size()) return fail();
  std::string_view num = part.substr(i + 1, part.size() - i - 2);
  size_t index = 0;
  auto res = std::from_chars(num.data(), num.data() + num.size(), index);
  if (res.ec != std::errc() || res.ptr != num.data() + num.size() || !digit(num[0])) return fail();
  out.index = index;
  return out;
}

bool IsReserved(std::string_view key) {
  static const char* kReserved[] = {"clear", "copy",    "fromkeys",   "get",    "items", "keys",
                                    "pop",   "popitem", "setdefault", "update", "values"};
  for (const char* r : kReserved) {
    if (key == r) return true;
  }
  return key.size() >= 4 && key.substr(0, 2) == "__" && key.substr(key.size() - 2) == "__";
}

std::string AvailableKeys(const NestedMap& m) {
  std::vector<std::string> keys;
  for (const auto& [k, v] : m) keys.push_back(PyStrRepr(k));
  return "[" + Join(keys, ", ") + "]";
}

// Lingvo's _RecursiveMap. `fn` returns nullopt to delete a leaf.
using LeafFn = std::function<std::optional<NestedValue>(const std::string&, const NestedValue&)>;

std::optional<NestedValue> RecursiveMap(const NestedValue& v, const std::string& key,
                                        const LeafFn& fn) {
  if (v.is_map()) {
    NestedMap out;
    bool deleted = false;
    for (const auto& [k, child] : v.AsMap()) {
      auto res = RecursiveMap(child, key.empty() ? k : key + "." + k, fn);
      if (!res) {
        deleted = true;
        continue;
      }
      out.Put(k, std::move(*res));
    }
    if (out.empty() && deleted) return std::nullopt;
    return NestedValue(std::move(out));
  }
  if (v.is_list()) {
    NestedValue::List out;
    bool deleted = false;
    const auto& list = v.AsList();
    for (size_t i = 0; i < list.size(); ++i) {
      auto res = RecursiveMap(list[i], StrCat(key, "[", i, "]"), fn);
      if (!res) {
        deleted = true;
        continue;
      }
      out.push_back(std::move(*res));
    }
    if (out.empty() && deleted) return std::nullopt;
    return NestedValue(std::move(out));
  }
  return fn(key, v);
}

void Walk(const NestedValue& v, const std::string& key,
          const std::function<void(const std::string&, const NestedValue&)>& fn) {
  if (v.is_map()) {
    for (const auto& [k, child] : v.AsMap()) Walk(child, key.empty() ? k : key + "." + k, fn);
  } else if (v.is_list()) {
    const auto& list = v.AsList();
    for (size_t i = 0; i < list.size(); ++i) Walk(list[i], StrCat(key, "[", i, "]"), fn);
  } else {
    fn(key, v);
  }
}

void WalkMap(const NestedMap& m,
             const std::function<void(const std::string&, const NestedValue&)>& fn) {
  for (const auto& [k, child] : m) Walk(child, k, fn);
}

}  // namespace

NestedMap::NestedMap(std::initializer_list<KeyValue> items) {
  for (const auto& [k, v] : items) Put(k, v);
}

void NestedMap::CheckKey(std::string_view key) {
  auto alpha = [](char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; };
  bool ok = !key.empty() && alpha(key[0]);
  for (char c : key) ok = ok && (alpha(c) || (c >= '0' && c <= '9'));
  if (!ok) {
    throw InvalidArgumentError(
        StrCat("invalid NestedMap key '", key, "': expected [A-Za-z_][A-Za-z0-9_]*"));
  }
  if (IsReserved(key))
    throw InvalidArgumentError(StrCat("'", key, "' is a reserved NestedMap key"));
}

void NestedMap::Put(std::string_view key, NestedValue value) {
  CheckKey(key);
  items_[std::string(key)] = std::move(value);
}

const NestedValue& NestedMap::at(std::string_view key) const {
  auto it = items_.find(std::string(key));
  if (it == items_.end()) {
    throw NotFoundError(StrCat("'", key, "'; available attributes: ", AvailableKeys(*this)));
  }
  return it->second;
}

NestedValue& NestedMap::at(std::string_view key) {
  return const_cast<NestedValue&>(static_cast<const NestedMap*>(this)->at(key));
}

void NestedMap::erase(std::string_view key) {
  at(key);
  items_.erase(std::string(key));
}

const NestedValue& NestedMap::GetItem(std::string_view key) const {
  const NestedValue* current = nullptr;
  const NestedMap* map = this;
  std::string where;
  for (const std::string& part_text : Split(key, '.')) {
    KeyPart part = ParsePart(part_text, key);
    if (current != nullptr) {
      if (!current->is_map()) {
        throw InvalidArgumentError(StrCat("cannot look up '", part.name, "' in '", where,
                                          "' (key '", key, "'): it is a ", current->KindName()));
      }
      map = &current->AsMap();
    }
    auto it = map->items_.find(part.name);
    if (it == map->items_.end()) {
      throw NotFoundError(StrCat("'", where.empty() ? "" : where + ".", part.name, "' (key '", key,
                                 "'); available attributes: ", AvailableKeys(*map)));
    }
    current = &it->second;
    where += (where.empty() ? "" : ".") + part.name;
    if (part.index) {
      if (!current->is_list()) {
        throw InvalidArgumentError(StrCat("cannot index '", where, "' with [", *part.index,
                                          "]: it is a ", current->KindName()));
      }
      const auto& list = current->AsList();
      if (*part.index >= list.size()) {
        throw InvalidArgumentError(StrCat("index ", *part.index, " out of range for '", where,
                                          "' of length ", list.size(), " (key '", key, "')"));
      }
      current = &list[*part.index];
      where += StrCat("[", *part.index, "]");
    }
  }
  return *current;
}

NestedValue& NestedMap::GetItem(std::string_view key) {
  return const_cast<NestedValue&>(static_cast<const NestedMap*>(this)->GetItem(key));
}

NestedValue NestedMap::Get(std::string_view key, NestedValue default_value) const {
  try {
    return GetItem(key);
  } catch (const NotFoundError&) {
    return default_value;
  } catch (const InvalidArgumentError&) {
    return default_value;
  }
}

bool NestedMap::Has(std::string_view key) const {
  try {
    GetItem(key);
    return true;
  } catch (const NotFoundError&) {
    return false;
  } catch (const InvalidArgumentError&) {
    return false;
  }
}

void NestedMap::Set(std::string_view key, NestedValue value) {
  std::vector<std::string> parts = Split(key, '.');
  NestedMap* current = this;
  for (size_t i = 0; i < parts.size(); ++i) {
    KeyPart part = ParsePart(parts[i], key);
    CheckKey(part.name);
    const bool last = i + 1 == parts.size();
    NestedValue* slot = nullptr;
    if (part.index) {
      auto it = current->items_.find(part.name);
      if (it == current->items_.end()) {
        it = current->items_.emplace(part.name, NestedValue(NestedValue::List{})).first;
      }
      if (!it->second.is_list()) {
        throw InvalidArgumentError(StrCat("error while setting '", key, "': '", part.name,
                                          "' is a ", it->second.KindName(), ", not a list"));
      }
      auto& list = it->second.MutableList();
      if (*part.index > list.size()) {
        throw InvalidArgumentError(StrCat("error while setting '", key, "': the index ",
                                          *part.index, " is greater than the length ", list.size(),
                                          " of list '", part.name, "'"));
      }
      if (*part.index == list.size()) list.emplace_back();
      slot = &list[*part.index];
    } else {
      if (last) {
        current->items_[part.name] = std::move(value);
        return;
      }
      auto it = current->items_.find(part.name);
      if (it == current->items_.end()) {
        it = current->items_.emplace(part.name, NestedValue(NestedMap())).first;
      }
      slot = &it->second;
    }
    if (last) {
      *slot = std::move(value);
      return;
    }
    if (slot->is_none()) *slot = NestedValue(NestedMap());
    if (!slot->is_map()) {
      throw InvalidArgumentError(StrCat("error while setting '", key, "': sub key '", parts[i],
                                        "' is a ", slot->KindName(), ", not a NestedMap"));
    }
    current = &slot->MutableMap();
  }
}

std::vector<NestedValue> NestedMap::Flatten() const {
  std::vector<NestedValue> out;
  WalkMap(*this, [&](const std::string&, const NestedValue& v) { out.push_back(v); });
  return out;
}

std::vector<at::Tensor> NestedMap::FlattenTensors() const {
  std::vector<at::Tensor> out;
  WalkMap(*this, [&](const std::string& k, const NestedValue& v) {
    if (!v.is_tensor()) {
      throw InvalidArgumentError(
          StrCat("NestedMap leaf '", k, "' is a ", v.KindName(), ", not a Tensor"));
    }
    out.push_back(v.AsTensor());
  });
  return out;
}

std::vector<NestedMap::KeyValue> NestedMap::FlattenItems() const {
  std::vector<KeyValue> out;
  WalkMap(*this, [&](const std::string& k, const NestedValue& v) { out.emplace_back(k, v); });
  return out;
}

std::vector<std::string> NestedMap::Keys() const {
  std::vector<std::string> out;
  WalkMap(*this, [&](const std::string& k, const NestedValue&) { out.push_back(k); });
  return out;
}

NestedMap NestedMap::Pack(const std::vector<NestedValue>& values) const {
  const auto keys = Keys();
  if (keys.size() != values.size()) {
    throw InvalidArgumentError(StrCat("Pack: the template has ", keys.size(), " leaves [",
                                      Join(keys, ", "), "] but ", values.size(),
                                      " values were given"));
  }
  size_t next = 0;
  return TransformWithKey([&](const std::string&, const NestedValue&) { return values[next++]; });
}

NestedMap NestedMap::Pack(const std::vector<at::Tensor>& values) const {
  return Pack(std::vector<NestedValue>(values.begin(), values.end()));
}

NestedMap NestedMap::Transform(const std::function<NestedValue(const NestedValue&)>& fn) const {
  return TransformWithKey([&](const std::string&, const NestedValue& v) { return fn(v); });
}

NestedMap NestedMap::TransformWithKey(
    const std::function<NestedValue(const std::string&, const NestedValue&)>& fn) const {
  auto res =
      RecursiveMap(NestedValue(*this), "",
                   [&](const std::string& k, const NestedValue& v) -> std::optional<NestedValue> {
                     return fn(k, v);
                   });
  return res ? res->AsMap() : NestedMap();
}

NestedMap NestedMap::Filter(const std::function<bool(const NestedValue&)>& fn) const {
  return FilterKeyVal([&](const std::string&, const NestedValue& v) { return fn(v); });
}

NestedMap NestedMap::FilterKeyVal(
    const std::function<bool(const std::string&, const NestedValue&)>& fn) const {
  auto res =
      RecursiveMap(NestedValue(*this), "",
                   [&](const std::string& k, const NestedValue& v) -> std::optional<NestedValue> {
                     if (fn(k, v)) return v;
                     return std::nullopt;
                   });
  return res ? res->AsMap() : NestedMap();
}

bool NestedMap::IsCompatible(const NestedMap& other) const { return Keys() == other.Keys(); }

NestedMap& NestedMap::Update(const NestedMap& other) {
  for (auto& [k, v] : other.FlattenItems()) Set(k, v);
  return *this;
}

NestedMap NestedMap::Union(const NestedMap& other) const {
  NestedMap out;
  out.Update(*this);
  out.Update(other);
  return out;
}

std::string NestedMap::DebugString() const {
  auto items = FlattenItems();
  size_t maxlen = 0;
  for (const auto& [k, v] : items) maxlen = std::max(maxlen, k.size());
  std::vector<std::string> lines;
  for (const auto& [k, v] : items) {
    lines.push_back(k + std::string(4 + maxlen - k.size(), ' ') + v.DebugValueString());
  }
  std::sort(lines.begin(), lines.end());
  return Join(lines, "\n");
}

}  // namespace glossa
