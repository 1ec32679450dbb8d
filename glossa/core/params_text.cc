// Lingvo's params text format: ToText and FromText (values in lists and dicts are Python literals:
// python_literal.h).
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <regex>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/params_text.h"
#include "glossa/core/params.h"
#include "glossa/core/params_repr.h"
#include "glossa/core/python_literal.h"

namespace glossa {
namespace internal {

std::string QuoteString(std::string_view s) {
  const auto singles = std::count(s.begin(), s.end(), '\'');
  const auto doubles = std::count(s.begin(), s.end(), '"');
  const char quote = singles <= doubles ? '\'' : '"';
  std::string out(1, quote);
  for (char c : s) {
    if (c == quote || c == '\\') out += '\\';
    out += c;
  }
  out += quote;
  return out;
}

std::string UnquoteString(std::string_view quoted) {
  if (quoted.empty() || (quoted[0] != '"' && quoted[0] != '\'')) return std::string(quoted);
  // Lingvo strips every leading and trailing quote character (str.strip), which also eats an
  // escaped quote at the end ('\'' would read as \); we strip exactly the enclosing pair.
  const char q = quoted[0];
  std::string_view contents = quoted.substr(1);
  if (!contents.empty() && contents.back() == q) contents.remove_suffix(1);
  std::string out;
  for (size_t i = 0; i < contents.size(); ++i) {
    if (contents[i] == '\\' && i + 1 < contents.size() &&
        (contents[i + 1] == '\\' || contents[i + 1] == '\'' || contents[i + 1] == '"')) {
      ++i;
    }
    out += contents[i];
  }
  return out;
}

namespace {

std::string EnumText(const EnumValue& e) { return e.ShortType() + "." + e.name; }
std::string ClassText(const ClassRef& c) { return "type/" + c.ModuleSlashName(); }

// Values that Lingvo's GetRepr turns into Python strings inside containers.
bool ReprsAsString(const ParamValue& v, std::string* s) {
  switch (v.kind()) {
    case ParamValue::Kind::kString: *s = v.AsString(); return true;
    case ParamValue::Kind::kNone: *s = "NoneType"; return true;
    case ParamValue::Kind::kDType: *s = std::string(DTypeName(v.AsDType())); return true;
    case ParamValue::Kind::kEnum: *s = EnumText(v.AsEnum()); return true;
    case ParamValue::Kind::kClass: *s = ClassText(v.AsClass()); return true;
    default: return false;
  }
}

// Lingvo's _SortedDict repr: keys sorted, string values with QuoteString.
template <typename Items>
std::string SortedDictRepr(const Items& items) {
  std::vector<std::pair<std::string, const ParamValue*>> sorted;
  for (const auto& [k, v] : items) sorted.emplace_back(k, v);
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string out = "{";
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (i) out += ", ";
    std::string s;
    out +=
        PyStrRepr(sorted[i].first) + ": " +
        (ReprsAsString(*sorted[i].second, &s) ? QuoteString(s) : ContainerRepr(*sorted[i].second));
  }
  return out + "}";
}

std::vector<std::pair<std::string, const ParamValue*>> ItemsOf(const ParamValue& v) {
  std::vector<std::pair<std::string, const ParamValue*>> items;
  if (v.is_params()) {
    for (const auto& e : v.AsParams()) items.emplace_back(e.name, &e.value);
  } else {
    for (const auto& [k, x] : v.AsDict()) items.emplace_back(k, &x);
  }
  return items;
}

}  // namespace

std::string ContainerRepr(const ParamValue& v) {
  std::string s;
  if (ReprsAsString(v, &s)) return PyStrRepr(s);
  switch (v.kind()) {
    case ParamValue::Kind::kBool: return v.AsBool() ? "True" : "False";
    case ParamValue::Kind::kInt: return std::to_string(v.AsInt());
    case ParamValue::Kind::kFloat: return PyFloatRepr(v.AsFloat());
    case ParamValue::Kind::kList: {
      std::string out = "[";
      const auto& list = v.AsList();
      for (size_t i = 0; i < list.size(); ++i) out += (i ? ", " : "") + ContainerRepr(list[i]);
      return out + "]";
    }
    case ParamValue::Kind::kDict:
    case ParamValue::Kind::kParams: return SortedDictRepr(ItemsOf(v));
    default: throw InternalError("unhandled param kind in ContainerRepr");
  }
}

std::string TextValue(const ParamValue& v) {
  switch (v.kind()) {
    case ParamValue::Kind::kString: return QuoteString(v.AsString());
    case ParamValue::Kind::kNone: return "NoneType";
    case ParamValue::Kind::kDType: return std::string(DTypeName(v.AsDType()));
    case ParamValue::Kind::kEnum: return EnumText(v.AsEnum());
    case ParamValue::Kind::kClass: return ClassText(v.AsClass());
    default: return ContainerRepr(v);
  }
}

std::string PyStr(const ParamValue& v) {
  switch (v.kind()) {
    case ParamValue::Kind::kString: return v.AsString();
    case ParamValue::Kind::kNone: return "None";
    case ParamValue::Kind::kDType: return std::string(DTypeName(v.AsDType()));
    case ParamValue::Kind::kEnum: return EnumText(v.AsEnum());
    case ParamValue::Kind::kClass: return ClassText(v.AsClass());
    case ParamValue::Kind::kParams: return ParamsToString(v.AsParams(), 0);
    case ParamValue::Kind::kDict: {
      std::string out = "{";
      bool first = true;
      for (const auto& [k, x] : v.AsDict()) {
        out += (first ? "" : ", ") + PyStrRepr(k) + ": " + ContainerRepr(x);
        first = false;
      }
      return out + "}";
    }
    default: return ContainerRepr(v);
  }
}

std::string ParamsToString(const Params& p, int depth) {
  std::vector<const Params::Entry*> sorted;
  for (const auto& e : p) sorted.push_back(&e);
  std::sort(sorted.begin(), sorted.end(),
            [](const auto* a, const auto* b) { return a->name < b->name; });
  const std::string indent(2 * (depth + 1), ' ');
  std::vector<std::string> lines;
  for (const auto* e : sorted) {
    if (e->value.is_params()) {
      lines.push_back(indent + e->name + ": " + ParamsToString(e->value.AsParams(), depth + 1));
    } else if (e->value.kind() == ParamValue::Kind::kString) {
      lines.push_back(indent + e->name + ": \"" + e->value.AsString() + "\"");
    } else if (e->value.is_none()) {
      lines.push_back(indent + e->name + ": None");
    } else {
      lines.push_back(indent + e->name + ": " + TextValue(e->value));
    }
  }
  return "{\n" + Join(lines, "\n") + "\n" + std::string(2 * depth, ' ') + "}";
}

}  // namespace internal

namespace {


std::optional<ClassRef> ParseClassText(std::string_view text) {
  // type/<module>/<Name>
  if (text.substr(0, 5) != "type/") return std::nullopt;
  std::string_view rest = text.substr(5);
  size_t slash = rest.find('/');
  if (slash == std::string_view::npos || slash == 0 || slash + 1 == rest.size()) {
    return std::nullopt;
  }
  return ClassRef{StrCat(rest.substr(0, slash), ".", rest.substr(slash + 1))};
}

ClassRef ParseRegisteredClass(std::string_view text) {
  auto ref = ParseClassText(text);
  if (!ref) {
    throw InvalidArgumentError(
        StrCat("expected a class reference 'type/<module>/<Name>' or NoneType, got '", text, "'"));
  }
  ClassRegistry::Get(ref->key);  // NotFound with near names when unregistered
  return *ref;
}

EnumValue ParseEnumText(const EnumValue& old, std::string_view text) {
  size_t dot = text.rfind('.');
  std::string_view cls = dot == std::string_view::npos ? std::string_view() : text.substr(0, dot);
  std::string_view name = dot == std::string_view::npos ? text : text.substr(dot + 1);
  if (cls != old.ShortType()) {
    throw InvalidArgumentError(
        StrCat("expected enum of class ", old.ShortType(), " but got '", text, "'"));
  }
  return MakeEnum(old.type, name);
}

// Converts a value parsed from a list or dict literal back to the kinds the old value held at the
// same place: ToText writes None, dtypes, enums and class references inside containers as strings,
// and Params as dicts.
ParamValue Reconcile(ParamValue parsed, const ParamValue* old) {
  switch (parsed.kind()) {
    case ParamValue::Kind::kString: {
      const std::string& s = parsed.AsString();
      if (s == "NoneType") return ParamValue();
      if (old == nullptr) return parsed;
      if (old->kind() == ParamValue::Kind::kDType) {
        if (auto d = DTypeFromName(s)) return ParamValue(*d);
      } else if (old->kind() == ParamValue::Kind::kEnum) {
        return ParamValue(ParseEnumText(old->AsEnum(), s));
      } else if (old->kind() == ParamValue::Kind::kClass) {
        return ParamValue(ParseRegisteredClass(s));
      }
      return parsed;
    }
    case ParamValue::Kind::kList: {
      const ParamValue::List* old_list = old && old->is_list() ? &old->AsList() : nullptr;
      ParamValue::List out;
      auto& items = parsed.MutableList();
      for (size_t i = 0; i < items.size(); ++i) {
        const ParamValue* o = old_list && i < old_list->size() ? &(*old_list)[i] : nullptr;
        out.push_back(Reconcile(std::move(items[i]), o));
      }
      return ParamValue(std::move(out));
    }
    case ParamValue::Kind::kDict: {
      if (old && old->is_params()) {
        // A dict literal in place of a Params sets its direct keys (no paths).
        const Params& old_params = old->AsParams();
        auto& dict = parsed.MutableDict();
        for (const auto& [k, v] : dict) {
          if (!old_params.Contains(k)) {
            throw NotFoundError(KeyErrorString(k, old_params.Keys()));
          }
        }
        Params p;
        for (const auto& e : old_params) {
          auto it = dict.find(e.name);
          p.Define(e.name, it == dict.end() ? e.value : Reconcile(std::move(it->second), &e.value),
                   e.doc);
        }
        if (old_params.IsFrozen()) p.Freeze();
        return ParamValue(std::move(p));
      }
      const ParamValue::Dict* old_dict = old && old->is_dict() ? &old->AsDict() : nullptr;
      ParamValue::Dict out;
      for (auto& [k, v] : parsed.MutableDict()) {
        const ParamValue* o = nullptr;
        if (old_dict) {
          auto it = old_dict->find(k);
          if (it != old_dict->end()) o = &it->second;
        }
        out[k] = Reconcile(std::move(v), o);
      }
      return ParamValue(std::move(out));
    }
    default: return parsed;
  }
}

ParamValue ParseLiteral(std::string_view text, const ParamValue* old) {
  return Reconcile(internal::ParsePythonLiteral(text), old);
}

// Lingvo's _ValueFromText: the new value from its text, directed by the kind of the old value.
ParamValue ValueFromText(const ParamValue& old, std::string_view text) {
  // ToText writes None as NoneType; Lingvo reads that back only where the old value is None or a
  // class. We read it for every kind but strings (where it stays the literal text, as in Lingvo),
  // so a value set to None round-trips.
  if (text == "NoneType" && old.kind() != ParamValue::Kind::kString) return ParamValue();
  switch (old.kind()) {
    case ParamValue::Kind::kBool:
      return ParamValue(!text.empty() && text != "False" && text != "false");
    case ParamValue::Kind::kInt: {
      auto v = internal::ParsePythonLiteral(text);
      if (v.kind() != ParamValue::Kind::kInt) {
        throw InvalidArgumentError(StrCat("expected an int, got '", text, "'"));
      }
      return v;
    }
    case ParamValue::Kind::kFloat: {
      auto v = internal::ParsePythonLiteral(text);
      if (v.kind() != ParamValue::Kind::kFloat && v.kind() != ParamValue::Kind::kInt) {
        throw InvalidArgumentError(StrCat("expected a float, got '", text, "'"));
      }
      return ParamValue(v.AsFloat());
    }
    case ParamValue::Kind::kDType: return ParamValue(ParseDType(text));
    case ParamValue::Kind::kList: return ParseLiteral(text, &old);
    case ParamValue::Kind::kDict:
      if (text == "dict") return ParamValue(ParamValue::Dict{});
      return ParseLiteral(text, &old);
    case ParamValue::Kind::kParams: {
      // Lingvo cannot read this; we accept the dict form ToText uses inside lists.
      auto v = ParseLiteral(text, &old);
      if (!v.is_params()) {
        throw InvalidArgumentError(StrCat("expected a dict of param values, got '", text, "'"));
      }
      return v;
    }
    case ParamValue::Kind::kString: {
      std::string s = internal::UnquoteString(text);
      if (s.size() >= 2 && s.front() == '[' && s.back() == ']') {
        // A list stored as a string reads back as a list, as in Lingvo.
        try {
          return ParseLiteral(s, nullptr);
        } catch (const InvalidArgumentError&) {
        }
      }
      return ParamValue(std::move(s));
    }
    case ParamValue::Kind::kEnum: return ParamValue(ParseEnumText(old.AsEnum(), text));
    case ParamValue::Kind::kClass:
    case ParamValue::Kind::kNone: {
      if (text == "NoneType") return ParamValue();
      if (old.is_none()) {
        if (text == "False" || text == "false") return ParamValue(false);
        if (text == "True" || text == "true") return ParamValue(true);
        if (ParseClassText(text)) return ParamValue(ParseRegisteredClass(text));
        // A dtype name, as ToText writes a dtype (`fprop_dtype : bfloat16` in a params.txt).
        if (auto dtype = DTypeFromName(text)) return ParamValue(*dtype);
        // Lingvo needs ToTextWithTypes for a None-valued param; we read any plain literal.
        try {
          return ParseLiteral(text, nullptr);
        } catch (const InvalidArgumentError&) {
          throw InvalidArgumentError(
              StrCat("cannot infer a value for a param that is None from '", text,
                     "': expected NoneType, True/False, type/<module>/<Name>, a dtype name, a "
                     "number, a quoted string, or a list/dict literal"));
        }
      }
      return ParamValue(ParseRegisteredClass(text));
    }
  }
  throw InternalError("unhandled param kind in ValueFromText");
}

// True while `text` (a list, tuple or dict literal, possibly spanning lines) has an open bracket
// or quote.
bool IsUnclosedLiteral(std::string_view text) {
  int depth = 0;
  char quote = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    char c = text[i];
    if (quote) {
      if (c == '\\') {
        ++i;
      } else if (c == quote) {
        quote = 0;
      }
    } else if (c == '\'' || c == '"') {
      quote = c;
    } else if (c == '[' || c == '(' || c == '{') {
      ++depth;
    } else if (c == ']' || c == ')' || c == '}') {
      --depth;
    }
  }
  return quote != 0 || depth > 0;
}

// The ':' that ends the key: the first one outside brackets and quotes (dict keys in paths such as
// `a['x:y'].b` may hold colons).
size_t FindKeySeparator(std::string_view line) {
  int depth = 0;
  char quote = 0;
  for (size_t i = 0; i < line.size(); ++i) {
    char c = line[i];
    if (quote) {
      if (c == '\\') {
        ++i;
      } else if (c == quote) {
        quote = 0;
      }
    } else if (depth > 0 && (c == '\'' || c == '"')) {
      quote = c;
    } else if (c == '[') {
      ++depth;
    } else if (c == ']') {
      --depth;
    } else if (c == ':' && depth == 0) {
      return i;
    }
  }
  return std::string_view::npos;
}

bool EndsWithTerminalQuote(std::string_view s, char quote) {
  if (s.empty() || s.back() != quote) return false;
  size_t backslashes = 0;
  for (size_t i = s.size() - 1; i > 0 && s[i - 1] == '\\'; --i) ++backslashes;
  return backslashes % 2 == 0;
}

}  // namespace

namespace {

bool EnterForText(const std::string&, const ParamValue& v) {
  if (v.is_params()) return true;
  if (v.is_list()) {
    const auto& l = v.AsList();
    return !l.empty() &&
           std::all_of(l.begin(), l.end(), [](const ParamValue& x) { return x.is_params(); });
  }
  if (v.is_dict()) {
    const auto& d = v.AsDict();
    return !d.empty() &&
           std::all_of(d.begin(), d.end(), [](const auto& kv) { return kv.second.is_params(); });
  }
  return false;
}

// Leaf key -> text value, sorted by key.
std::map<std::string, std::string> TextLines(const Params& p) {
  std::map<std::string, std::string> kv;
  p.Visit([&](const std::string& key, const ParamValue& v) { kv[key] = internal::TextValue(v); },
          EnterForText);
  return kv;
}

}  // namespace

namespace internal {

std::string ParamsText(const Params& p, bool with_docs) {
  const auto kv = TextLines(p);
  std::string out;
  for (const auto& [k, v] : kv) {
    const std::string& doc = with_docs ? p.Doc(k) : std::string();
    if (!doc.empty()) {
      for (const std::string& line : Split(doc, '\n')) out += "# " + line + "\n";
    }
    out += k + " : " + v + "\n";
  }
  return out;
}

}  // namespace internal

namespace {

// One `key : value` of params text, with the line it starts on.
struct TextItem {
  std::string key;
  std::string value;
  int line = 0;
};

// The items of a params text in the order their keys first appear; a later line of a key
// overrides the earlier one's value and line, as in a Python dict.
class TextItems {
 public:
  void Add(std::string key, std::string value, int line) {
    auto it = index_.find(key);
    if (it != index_.end()) {
      items_[it->second].value = std::move(value);
      items_[it->second].line = line;
    } else {
      index_[key] = items_.size();
      items_.push_back(TextItem{std::move(key), std::move(value), line});
    }
  }
  std::vector<TextItem> Take() { return std::move(items_); }

 private:
  std::vector<TextItem> items_;
  std::map<std::string, size_t> index_;
};

// A value that continues over several lines: a quoted string (until a line ending in the closing
// quote, as in Lingvo) or a list/dict literal (until its brackets close; ToText writes strings
// with newlines inside dicts over several lines).
struct PendingValue {
  enum class Kind { kNone, kString, kLiteral };
  Kind kind = Kind::kNone;
  TextItem item;
  char quote = 0;
};

// Feeds the next `line` to the open multi-line value `p`; when it completes the value, adds that
// to `items` and closes `p`.
void ContinuePending(PendingValue& p, std::string_view line, TextItems& items) {
  if (p.kind == PendingValue::Kind::kString) {
    std::string_view rstripped = line;
    while (!rstripped.empty() && std::isspace(static_cast<unsigned char>(rstripped.back()))) {
      rstripped.remove_suffix(1);
    }
    if (!EndsWithTerminalQuote(rstripped, p.quote)) {
      p.item.value += "\n" + std::string(line);
      return;
    }
    items.Add(p.item.key, p.item.value + "\n" + std::string(rstripped), p.item.line);
    p.kind = PendingValue::Kind::kNone;
    return;
  }
  p.item.value += "\n" + std::string(line);
  if (!IsUnclosedLiteral(p.item.value)) {
    items.Add(p.item.key, std::string(Strip(p.item.value)), p.item.line);
    p.kind = PendingValue::Kind::kNone;
  }
}

// The items of params `text`. InvalidArgumentError (with the line) for a line not in
// `<key> : <value>` format, an empty key, or a multi-line value still open at the end.
std::vector<TextItem> ParseTextItems(std::string_view text) {
  TextItems items;
  PendingValue pending;
  int line_no = 0;
  for (const std::string& raw : Split(text, '\n')) {
    ++line_no;
    std::string_view line = raw;
    if (pending.kind != PendingValue::Kind::kNone) {
      ContinuePending(pending, line, items);
      continue;
    }
    line = Strip(line);
    if (line.empty() || line[0] == '#') continue;
    size_t colon = FindKeySeparator(line);
    if (colon == std::string_view::npos) {
      throw InvalidArgumentError(
          StrCat("params text line ", line_no, ": '", line, "' is not in <key> : <value> format"));
    }
    std::string key(Strip(line.substr(0, colon)));
    std::string_view value = line.substr(colon + 1);
    while (!value.empty() && std::isspace(static_cast<unsigned char>(value.front()))) {
      value.remove_prefix(1);
    }
    if (key.empty()) {
      throw InvalidArgumentError(StrCat("params text line ", line_no, ": empty key"));
    }
    if (!value.empty() && (value[0] == '"' || value[0] == '\'') &&
        !EndsWithTerminalQuote(value.substr(1), value[0])) {
      pending.kind = PendingValue::Kind::kString;
      pending.item = TextItem{key, std::string(value), line_no};
      pending.quote = value[0];
      continue;
    }
    if (!value.empty() && (value[0] == '[' || value[0] == '{' || value[0] == '(') &&
        IsUnclosedLiteral(value)) {
      pending.kind = PendingValue::Kind::kLiteral;
      pending.item = TextItem{key, std::string(value), line_no};
      continue;
    }
    items.Add(key, std::string(Strip(value)), line_no);
  }
  if (pending.kind == PendingValue::Kind::kString) {
    throw InvalidArgumentError(StrCat("params text line ", pending.item.line, ": string value of '",
                                      pending.item.key, "' has no closing ", pending.quote));
  }
  if (pending.kind == PendingValue::Kind::kLiteral) {
    throw InvalidArgumentError(StrCat("params text line ", pending.item.line, ": the value of '",
                                      pending.item.key, "' has an unclosed bracket or quote"));
  }
  return items.Take();
}

}  // namespace

namespace internal {

Params ParamsWithText(const Params& base, std::string_view text) {
  const std::vector<TextItem> items = ParseTextItems(text);
  Params updated = base;
  for (const TextItem& item : items) {
    try {
      const ParamValue& old = updated.Get(item.key);
      updated.Set(item.key, ValueFromText(old, item.value));
    } catch (const Error& e) {
      ThrowError(e.code(), StrCat("params text line ", item.line, ": ", e.message()));
    }
  }
  return updated;
}

}  // namespace internal

}  // namespace glossa
