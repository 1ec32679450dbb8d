// Params <-> Lingvo's Hyperparam proto.
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include <algorithm>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/core/hyperparams.pb.h"
#include "glossa/core/params.h"
#include "glossa/core/params_proto.h"

namespace glossa {
namespace {

void ToValueProto(const ParamValue& v, proto::HyperparamValue* out);

void ToParamsProto(const Params& p, proto::Hyperparam* out) {
  for (const auto& e : p) ToValueProto(e.value, &(*out->mutable_items())[e.name]);
}

std::string SlashForm(const std::string& dotted) {
  size_t pos = dotted.rfind('.');
  if (pos == std::string::npos) return "/" + dotted;
  return dotted.substr(0, pos) + "/" + dotted.substr(pos + 1);
}

void ToValueProto(const ParamValue& v, proto::HyperparamValue* out) {
  switch (v.kind()) {
    case ParamValue::Kind::kNone: return;  // no field set
    case ParamValue::Kind::kBool: out->set_bool_val(v.AsBool()); return;
    case ParamValue::Kind::kInt: out->set_int_val(v.AsInt()); return;
    case ParamValue::Kind::kFloat: out->set_float_val(static_cast<float>(v.AsFloat())); return;
    case ParamValue::Kind::kString: out->set_string_val(v.AsString()); return;
    case ParamValue::Kind::kDType: out->set_dtype_val(std::string(DTypeName(v.AsDType()))); return;
    case ParamValue::Kind::kEnum:
      out->mutable_enum_val()->set_type(SlashForm(v.AsEnum().type));
      out->mutable_enum_val()->set_name(v.AsEnum().name);
      return;
    case ParamValue::Kind::kClass: out->set_type_val(v.AsClass().ModuleSlashName()); return;
    case ParamValue::Kind::kList:
      out->mutable_list_val();
      for (const auto& x : v.AsList()) ToValueProto(x, out->mutable_list_val()->add_items());
      return;
    case ParamValue::Kind::kDict:
      out->mutable_dict_val();
      for (const auto& [k, x] : v.AsDict()) {
        ToValueProto(x, &(*out->mutable_dict_val()->mutable_items())[k]);
      }
      return;
    case ParamValue::Kind::kParams: ToParamsProto(v.AsParams(), out->mutable_param_val()); return;
  }
}

std::string DottedForm(const std::string& slashed, const std::string& where) {
  size_t pos = slashed.find('/');
  if (pos == std::string::npos || slashed.find('/', pos + 1) != std::string::npos) {
    throw InvalidArgumentError(
        StrCat("hyperparam proto '", where, "': expected '<module>/<Name>', got '", slashed, "'"));
  }
  return slashed.substr(0, pos) + "." + slashed.substr(pos + 1);
}

Params FromParamsProto(const proto::Hyperparam& pb, const std::string& where);

ParamValue FromValueProto(const proto::HyperparamValue& pb, const std::string& where) {
  using PB = proto::HyperparamValue;
  switch (pb.kind_case()) {
    case PB::KIND_NOT_SET: return ParamValue();
    case PB::kParamVal: return ParamValue(FromParamsProto(pb.param_val(), where));
    case PB::kListVal:
    case PB::kTupleVal: {
      const auto& rep = pb.has_list_val() ? pb.list_val() : pb.tuple_val();
      ParamValue::List list;
      for (int i = 0; i < rep.items_size(); ++i) {
        list.push_back(FromValueProto(rep.items(i), StrCat(where, "[", i, "]")));
      }
      return ParamValue(std::move(list));
    }
    case PB::kDictVal: {
      ParamValue::Dict dict;
      for (const auto& [k, x] : pb.dict_val().items()) {
        dict[k] = FromValueProto(x, StrCat(where, "['", k, "']"));
      }
      return ParamValue(std::move(dict));
    }
    case PB::kTypeVal: {
      ClassRef ref{DottedForm(pb.type_val(), where)};
      try {
        ClassRegistry::Get(ref.key);  // as Lingvo fails to import an unknown class
      } catch (const NotFoundError& e) {
        throw NotFoundError(StrCat("hyperparam proto '", where, "': ", e.message()));
      }
      return ParamValue(std::move(ref));
    }
    case PB::kDtypeVal: try { return ParamValue(ParseDType(pb.dtype_val()));
      } catch (const InvalidArgumentError& e) {
        throw InvalidArgumentError(StrCat("hyperparam proto '", where, "': ", e.message()));
      }
    case PB::kStringVal: return ParamValue(pb.string_val());
    case PB::kBoolVal: return ParamValue(pb.bool_val());
    case PB::kIntVal: return ParamValue(pb.int_val());
    case PB::kFloatVal: return ParamValue(static_cast<double>(pb.float_val()));
    case PB::kEnumVal:
      try {
        return ParamValue(MakeEnum(DottedForm(pb.enum_val().type(), where), pb.enum_val().name()));
      } catch (const NotFoundError& e) {
        throw NotFoundError(StrCat("hyperparam proto '", where, "': ", e.message()));
      }
    case PB::kProtoVal:
    case PB::kNamedTupleVal:
    case PB::kSymbolicVal:
      throw UnimplementedError(StrCat("hyperparam proto '", where,
                                      "': proto, namedtuple and symbolic values are Python-only "
                                      "Lingvo kinds that Glossa does not represent"));
    case PB::kStringReprVal:
      throw InvalidArgumentError(
          StrCat("hyperparam proto '", where,
                 "': cannot deserialize string_repr_val instance: ", pb.string_repr_val()));
  }
  throw InvalidArgumentError(StrCat("hyperparam proto '", where, "': unknown value kind"));
}

Params FromParamsProto(const proto::Hyperparam& pb, const std::string& where) {
  // Map order on the wire is unspecified; define keys sorted so results are deterministic.
  std::vector<std::string> keys;
  for (const auto& [k, v] : pb.items()) keys.push_back(k);
  std::sort(keys.begin(), keys.end());
  Params p;
  if (pb.items().count("cls")) {
    p.Define("cls", FromValueProto(pb.items().at("cls"), where.empty() ? "cls" : where + ".cls"),
             "Cls that this param object is associated with.");
  }
  for (const auto& k : keys) {
    if (k == "cls") continue;
    const std::string sub = where.empty() ? k : where + "." + k;
    ParamValue value = FromValueProto(pb.items().at(k), sub);  // errors name `sub` already
    try {
      p.Define(k, std::move(value), "");
    } catch (const InvalidArgumentError& e) {
      throw InvalidArgumentError(StrCat("hyperparam proto '", sub, "': ", e.message()));
    }
  }
  return p;
}

}  // namespace

namespace internal {

void WriteParamsProto(const Params& p, proto::Hyperparam* out) {
  out->Clear();
  ToParamsProto(p, out);
}

std::string ParamsProtoBytes(const Params& p) {
  proto::Hyperparam pb;
  WriteParamsProto(p, &pb);
  std::string bytes;
  {
    // Deterministic serialization writes map entries sorted by key, so equal Params give equal
    // bytes.
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    pb.SerializeToCodedStream(&coded);
  }
  return bytes;
}

Params ParamsFromProto(const proto::Hyperparam& pb) { return FromParamsProto(pb, ""); }

Params ParamsFromProtoBytes(std::string_view bytes) {
  proto::Hyperparam pb;
  if (!pb.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
    throw DataLossError(StrCat("cannot parse ", bytes.size(), " bytes as a Hyperparam proto"));
  }
  return ParamsFromProto(pb);
}

}  // namespace internal

}  // namespace glossa
