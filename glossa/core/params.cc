#include "glossa/core/params.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <set>
#include <variant>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/params_proto.h"
#include "glossa/core/params_repr.h"
#include "glossa/core/params_text.h"

namespace glossa {

// Parses and resolves paths such as `a.b[1]['k'].c`.
class ParamsPath {
 public:
  using Index = std::variant<int64_t, std::string>;
  struct Segment {
    std::string name;
    std::vector<Index> indices;
  };

  static std::vector<Segment> Parse(std::string_view path) {
    std::vector<Segment> segments;
    size_t i = 0;
    auto fail = [&](std::string_view why) {
      throw InvalidArgumentError(StrCat("malformed param path '", path, "': ", why));
    };
    if (path.empty()) fail("empty");
    while (true) {
      Segment seg;
      size_t start = i;
      while (i < path.size() && path[i] != '.' && path[i] != '[') ++i;
      seg.name = std::string(path.substr(start, i - start));
      if (seg.name.empty()) fail("empty name");
      while (i < path.size() && path[i] == '[') {
        ++i;
        if (i < path.size() && (path[i] == '\'' || path[i] == '"')) {
          char quote = path[i++];
          std::string key;
          while (i < path.size() && path[i] != quote) {
            if (path[i] == '\\' && i + 1 < path.size()) ++i;
            key += path[i++];
          }
          if (i >= path.size()) fail("unterminated quoted key");
          ++i;
          seg.indices.emplace_back(std::move(key));
        } else {
          size_t close = path.find(']', i);
          if (close == std::string_view::npos) fail("missing ']'");
          std::string_view num = Strip(path.substr(i, close - i));
          int64_t index = 0;
          auto res = std::from_chars(num.data(), num.data() + num.size(), index);
          if (num.empty() || res.ec != std::errc() || res.ptr != num.data() + num.size()) {
            fail(StrCat("index '", num, "' is neither an integer nor a quoted key"));
          }
          seg.indices.emplace_back(index);
          i = close;
        }
        if (i >= path.size() || path[i] != ']') fail("missing ']'");
        ++i;
      }
      segments.push_back(std::move(seg));
      if (i == path.size()) break;
      if (path[i] != '.') fail(StrCat("unexpected '", path[i], "'"));
      ++i;
    }
    return segments;
  }

  struct Resolved {
    Params* owner;         // the Params holding the last segment's entry
    Params::Entry* entry;  // that entry
    ParamValue* value;     // the addressed value (entry->value or an element inside it)
    const Segment* last;
  };

  // Resolves `path` from `root`. NotFound for unknown keys with Lingvo's did-you-mean message.
  static Resolved Resolve(Params& root, std::string_view path,
                          std::vector<Segment>& segments_storage) {
    segments_storage = Parse(path);
    Params* current = &root;
    std::string prefix;
    for (size_t s = 0; s < segments_storage.size(); ++s) {
      const Segment& seg = segments_storage[s];
      Params::Entry* entry = current->FindEntry(seg.name);
      if (entry == nullptr) {
        throw NotFoundError(prefix + KeyErrorString(seg.name, current->Keys()));
      }
      ParamValue* value = &entry->value;
      std::string where = prefix + seg.name;
      for (const Index& index : seg.indices) {
        if (std::holds_alternative<int64_t>(index)) {
          int64_t i = std::get<int64_t>(index);
          if (!value->is_list()) {
            throw InvalidArgumentError(
                StrCat("cannot index '", where, "' with [", i, "]: it is a ", value->KindName()));
          }
          auto& list = value->MutableList();
          const int64_t n = static_cast<int64_t>(list.size());
          if (i < -n || i >= n) {
            throw InvalidArgumentError(StrCat("index ", i, " is out of range for '", where,
                                              "' of length ", n, " (path '", path, "')"));
          }
          value = &list[i < 0 ? i + n : i];
          where += StrCat("[", i, "]");
        } else {
          const std::string& key = std::get<std::string>(index);
          if (value->is_dict()) {
            auto& dict = value->MutableDict();
            auto it = dict.find(key);
            if (it == dict.end()) {
              std::vector<std::string> keys;
              for (const auto& [k, v] : dict) keys.push_back(k);
              throw NotFoundError(StrCat(where, "[", KeyErrorString(key, keys), "]"));
            }
            value = &it->second;
          } else {
            throw InvalidArgumentError(StrCat("cannot index '", where, "' with ['", key,
                                              "']: it is a ", value->KindName()));
          }
          where += StrCat("['", key, "']");
        }
      }
      if (s + 1 == segments_storage.size()) return Resolved{current, entry, value, &seg};
      if (!value->is_params()) {
        throw InvalidArgumentError(StrCat("cannot descend into '", where, "' (path '", path,
                                          "'): it is a ", value->KindName(), ", not Params"));
      }
      current = &value->MutableParams();
      prefix = where + ".";
    }
    throw InternalError("unreachable");
  }
};

namespace {

// ^[a-z_][a-z0-9_]*$, checked by hand: std::regex recurses per character and untrusted input
// (proto keys) may be long.
bool IsValidParamName(std::string_view name) {
  if (name.empty() || !((name[0] >= 'a' && name[0] <= 'z') || name[0] == '_')) return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

}  // namespace

Params::Entry* Params::FindEntry(std::string_view name) {
  for (auto& e : entries_) {
    if (e.name == name) return &e;
  }
  return nullptr;
}

const Params::Entry* Params::FindEntry(std::string_view name) const {
  return const_cast<Params*>(this)->FindEntry(name);
}

void Params::CheckMutable(std::string_view what) const {
  if (frozen_) {
    throw FailedPreconditionError(StrCat("this Params is frozen (immutable); cannot ", what));
  }
}

Params& Params::Define(std::string_view name, ParamValue default_value, std::string_view doc) {
  CheckMutable(StrCat("define '", name, "'"));
  if (!IsValidParamName(name)) {
    throw InvalidArgumentError(
        StrCat("invalid param name \"", name, "\": must match regex \"^[a-z_][a-z0-9_]*$\""));
  }
  if (FindEntry(name) != nullptr) {
    throw InvalidArgumentError(StrCat("param '", name, "' is already defined"));
  }
  entries_.push_back(Entry{std::string(name), std::move(default_value), std::string(doc)});
  return *this;
}

Params& Params::Set(std::string_view path, ParamValue value) {
  CheckMutable(StrCat("set '", path, "'"));
  std::vector<ParamsPath::Segment> segs;
  *ParamsPath::Resolve(*this, path, segs).value = std::move(value);
  return *this;
}

const ParamValue& Params::Get(std::string_view path) const {
  std::vector<ParamsPath::Segment> segs;
  return *ParamsPath::Resolve(const_cast<Params&>(*this), path, segs).value;
}

namespace {
template <typename F>
auto TypedGet(const Params& p, std::string_view path, F f) -> decltype(f(p.Get(path))) {
  const ParamValue& v = p.Get(path);
  try {
    return f(v);
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(StrCat("param '", path, "': ", e.message()));
  }
}
}  // namespace

bool Params::GetBool(std::string_view path) const {
  return TypedGet(*this, path, [](const ParamValue& v) { return v.AsBool(); });
}
int64_t Params::GetInt(std::string_view path) const {
  return TypedGet(*this, path, [](const ParamValue& v) { return v.AsInt(); });
}
double Params::GetFloat(std::string_view path) const {
  const double v = TypedGet(*this, path, [](const ParamValue& v) { return v.AsFloat(); });
  // NaN passes every range check after it (each comparison is false) and Inf passes one-sided
  // ones: a float field holds finite numbers, whoever set it (params text, proto, Python, code).
  if (!std::isfinite(v)) {
    throw InvalidArgumentError(
        StrCat("param '", path, "' must be a finite number, got ", internal::TextValue(ParamValue(v))));
  }
  return v;
}
const std::string& Params::GetString(std::string_view path) const {
  return TypedGet(*this, path,
                  [](const ParamValue& v) -> const std::string& { return v.AsString(); });
}
const Params& Params::GetParams(std::string_view path) const {
  return TypedGet(*this, path, [](const ParamValue& v) -> const Params& { return v.AsParams(); });
}
Params& Params::GetParams(std::string_view path) {
  std::vector<ParamsPath::Segment> segs;
  ParamValue* v = ParamsPath::Resolve(*this, path, segs).value;
  try {
    return v->MutableParams();
  } catch (const InvalidArgumentError& e) {
    throw InvalidArgumentError(StrCat("param '", path, "': ", e.message()));
  }
}

bool Params::IsSet(std::string_view path) const { return !Get(path).is_none(); }

const std::string& Params::Doc(std::string_view path) const {
  std::vector<ParamsPath::Segment> segs;
  auto r = ParamsPath::Resolve(const_cast<Params&>(*this), path, segs);
  return r.entry->doc;
}

Params& Params::Delete(std::string_view path) {
  CheckMutable(StrCat("delete '", path, "'"));
  std::vector<ParamsPath::Segment> segs;
  auto r = ParamsPath::Resolve(*this, path, segs);
  if (!r.last->indices.empty()) {
    throw InvalidArgumentError(
        StrCat("Delete('", path, "'): only params can be deleted, not list or dict elements"));
  }
  auto& entries = r.owner->entries_;
  entries.erase(
      std::find_if(entries.begin(), entries.end(), [&](const Entry& e) { return &e == r.entry; }));
  return *this;
}

bool Params::Contains(std::string_view name) const { return FindEntry(name) != nullptr; }

std::vector<std::string> Params::Keys() const {
  std::vector<std::string> keys;
  for (const auto& e : entries_) keys.push_back(e.name);
  return keys;
}

bool Params::operator==(const Params& other) const {
  if (entries_.size() != other.entries_.size()) return false;
  for (const auto& e : entries_) {
    const Entry* o = other.FindEntry(e.name);
    if (o == nullptr || !(o->value == e.value)) return false;
  }
  return true;
}

namespace {

// Dict keys in paths are single-quoted; escape what the path parser would otherwise misread.
std::string EscapeDictKey(const std::string& k) {
  std::string out;
  for (char c : k) {
    if (c == '\\' || c == '\'') out += '\\';
    out += c;
  }
  return out;
}

void VisitValue(const std::string& key, const ParamValue& value, const Params::VisitFn& visit,
                const Params::EnterFn& enter, const Params::VisitFn& exit) {
  auto sub = [&](const std::string& name) { return key.empty() ? name : key + "." + name; };
  switch (value.kind()) {
    case ParamValue::Kind::kParams:
      if (enter(key, value)) {
        for (const auto& e : value.AsParams()) VisitValue(sub(e.name), e.value, visit, enter, exit);
        exit(key, value);
      } else {
        visit(key, value);
      }
      return;
    case ParamValue::Kind::kDict:
      if (enter(key, value)) {
        for (const auto& [k, v] : value.AsDict()) {
          VisitValue(key + "['" + EscapeDictKey(k) + "']", v, visit, enter, exit);
        }
        exit(key, value);
      } else {
        visit(key, value);
      }
      return;
    case ParamValue::Kind::kList:
      if (enter(key, value)) {
        const auto& list = value.AsList();
        for (size_t i = 0; i < list.size(); ++i) {
          VisitValue(StrCat(key, "[", i, "]"), list[i], visit, enter, exit);
        }
        exit(key, value);
      } else {
        visit(key, value);
      }
      return;
    default: visit(key, value);
  }
}

}  // namespace

void Params::Visit(const VisitFn& visit, const EnterFn& enter, const VisitFn& exit) const {
  EnterFn enter_fn = enter ? enter : [](const std::string&, const ParamValue&) { return true; };
  VisitFn exit_fn = exit ? exit : [](const std::string&, const ParamValue&) {};
  VisitValue("", ParamValue(*this), visit, enter_fn, exit_fn);
}

Params& Params::MergeCommonKeysFrom(const Params& other) {
  return CopyFieldsTo(other, *this, {}, /*ignore_unknown_keys=*/true);
}

Params& CopyFieldsTo(const Params& from, Params& to, const std::vector<std::string>& skip,
                     bool ignore_unknown_keys) {
  for (const auto& e : from) {
    if (e.name == "cls" || std::find(skip.begin(), skip.end(), e.name) != skip.end()) continue;
    if (ignore_unknown_keys && !to.Contains(e.name)) continue;
    to.Set(e.name, e.value);  // ParamValue copies are deep
  }
  return to;
}

std::string Params::ClsKey() const {
  const Entry* cls = FindEntry("cls");
  if (cls == nullptr) {
    throw FailedPreconditionError(
        "Params has no 'cls': only InstantiableParams can be instantiated");
  }
  if (cls->value.kind() != ParamValue::Kind::kClass) {
    throw FailedPreconditionError(
        StrCat("Params 'cls' is ", cls->value.KindName(), ", not a registered class reference"));
  }
  return cls->value.AsClass().key;
}

Params InstantiableParams(std::string_view cls_key) {
  Params p;
  p.Define("cls", ClassRef{std::string(cls_key)}, "Cls that this param object is associated with.");
  return p;
}

// ---- ToString and TextDiff (Lingvo's str() and TextDiff formats) ----

std::string Params::ToString() const { return internal::ParamsToString(*this, 0); }

namespace {

bool IsMapLike(const ParamValue& v) { return v.is_params() || v.is_dict(); }

std::vector<std::string> MapKeys(const ParamValue& v) {
  std::vector<std::string> keys;
  if (v.is_params()) return v.AsParams().Keys();
  for (const auto& [k, x] : v.AsDict()) keys.push_back(k);
  return keys;
}

const ParamValue* MapGet(const ParamValue& v, const std::string& key) {
  if (v.is_params()) {
    for (const auto& e : v.AsParams()) {
      if (e.name == key) return &e.value;
    }
    return nullptr;
  }
  auto it = v.AsDict().find(key);
  return it == v.AsDict().end() ? nullptr : &it->second;
}

std::string DiffMaps(const ParamValue& a, const ParamValue& b, const std::string& spaces);

std::string DiffValues(const ParamValue& a, const ParamValue& b, const std::string& key,
                       const std::string& spaces) {
  if (a == b) return "";
  if (IsMapLike(a) && IsMapLike(b)) {
    return "?" + spaces + key + ":\n" + DiffMaps(a, b, spaces + "  ");
  }
  if (a.is_list() && b.is_list()) {
    const auto& la = a.AsList();
    const auto& lb = b.AsList();
    std::string diff;
    for (size_t i = 0; i < std::max(la.size(), lb.size()); ++i) {
      std::string key_i = StrCat(key, "[", i, "]");
      if (i < la.size() && i < lb.size()) {
        diff += DiffValues(la[i], lb[i], key_i, spaces);
      } else if (i < la.size()) {
        diff += ">" + spaces + key_i + ": " + internal::PyStr(la[i]) + "\n";
      } else {
        diff += "<" + spaces + key_i + ": " + internal::PyStr(lb[i]) + "\n";
      }
    }
    return diff;
  }
  return ">" + spaces + key + ": " + internal::PyStr(a) + "\n" + "<" + spaces + key + ": " +
         internal::PyStr(b) + "\n";
}

std::string DiffMaps(const ParamValue& a, const ParamValue& b, const std::string& spaces) {
  std::set<std::string> keys;
  for (const auto& k : MapKeys(a)) keys.insert(k);
  for (const auto& k : MapKeys(b)) keys.insert(k);
  std::string diff;
  for (const auto& key : keys) {
    const ParamValue* va = MapGet(a, key);
    const ParamValue* vb = MapGet(b, key);
    if (va && !vb) {
      diff += ">" + spaces + key + ": " + internal::PyStr(*va) + "\n";
    } else if (vb && !va) {
      diff += "<" + spaces + key + ": " + internal::PyStr(*vb) + "\n";
    } else if (!(*va == *vb)) {
      diff += DiffValues(*va, *vb, key, spaces);
    }
  }
  return diff;
}

}  // namespace

std::string Params::TextDiff(const Params& other) const {
  return DiffMaps(ParamValue(*this), ParamValue(other), " ");
}

// ---- The formats (params_text.h, params_proto.h) ----

std::string Params::ToText() const { return internal::ParamsText(*this, /*with_docs=*/false); }
std::string Params::ToTextWithDocs() const {
  return internal::ParamsText(*this, /*with_docs=*/true);
}

Params& Params::FromText(std::string_view text) {
  CheckMutable("FromText");
  *this = internal::ParamsWithText(*this, text);  // all or nothing
  return *this;
}

void Params::ToProto(proto::Hyperparam* out) const { internal::WriteParamsProto(*this, out); }
std::string Params::ToProtoBytes() const { return internal::ParamsProtoBytes(*this); }
Params Params::FromProto(const proto::Hyperparam& pb) { return internal::ParamsFromProto(pb); }
Params Params::FromProtoBytes(std::string_view bytes) {
  return internal::ParamsFromProtoBytes(bytes);
}

}  // namespace glossa
