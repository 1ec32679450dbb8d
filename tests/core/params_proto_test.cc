// Params <-> Lingvo's hyperparams.proto. Golden bytes are written out by hand from Lingvo's field
// numbers, so a wrong field number or wire type in our schema fails here.
#include <gtest/gtest.h>

#include "glossa/core/hyperparams.pb.h"
#include "glossa/core/params.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

struct ProtoClass {
  explicit ProtoClass(const Params&) {}
  virtual ~ProtoClass() = default;
};
GLOSSA_REGISTER_CLASS(ProtoClass, "glossa.testing.ProtoClass");

// Serialized Hyperparam{items{"a": <value>}}: map entry (field 1) holding key (1) and value (2).
std::string SingleItem(const std::string& value_bytes) {
  std::string entry = std::string(
                          "\x0a\x01"
                          "a",
                          3) +
                      "\x12" + std::string(1, static_cast<char>(value_bytes.size())) + value_bytes;
  return "\x0a" + std::string(1, static_cast<char>(entry.size())) + entry;
}

std::string Bytes(std::initializer_list<int> bytes) {
  std::string s;
  for (int b : bytes) s += static_cast<char>(b);
  return s;
}

std::string OneValue(const ParamValue& v) {
  Params p;
  p.Define("a", v, "");
  return p.ToProtoBytes();
}

TEST(ParamsProto, FieldNumbersAndWireTypesAreLingvos) {
  RegisterEnum("glossa.testing.ProtoEnum", {"X", "Y"});
  EXPECT_EQ(OneValue(nullptr), SingleItem(""));                        // none: no field
  EXPECT_EQ(OneValue(5), SingleItem(Bytes({0x48, 0x05})));             // int_val = 9
  EXPECT_EQ(OneValue(true), SingleItem(Bytes({0x40, 0x01})));          // bool_val = 8
  EXPECT_EQ(OneValue(0.5), SingleItem(Bytes({0x55, 0, 0, 0, 0x3f})));  // float_val = 10
  EXPECT_EQ(OneValue("hi"), SingleItem(Bytes({0x3a, 2, 'h', 'i'})));   // string_val = 7
  EXPECT_EQ(OneValue(DType::kInt8), SingleItem(Bytes({0x32, 4, 'i', 'n', 't', '8'})));  // 6
  EXPECT_EQ(OneValue(ClassRef{"m.C"}), SingleItem(Bytes({0x2a, 3, 'm', '/', 'C'})));    // 5
  EXPECT_EQ(OneValue(ParamValue::List{1}),  // list_val = 2
            SingleItem(Bytes({0x12, 4, 0x0a, 2, 0x48, 1})));
  Params inner;
  inner.Define("b", 1, "");
  EXPECT_EQ(OneValue(inner),  // param_val = 1
            SingleItem(Bytes({0x0a, 9, 0x0a, 7, 0x0a, 1, 'b', 0x12, 2, 0x48, 1})));
  EXPECT_EQ(OneValue(ParamValue::Dict{{"b", 1}}),  // dict_val = 4
            SingleItem(Bytes({0x22, 9, 0x0a, 7, 0x0a, 1, 'b', 0x12, 2, 0x48, 1})));
  // enum_val = 12 holding EnumVal{type = 1: "module/Name", name = 2}.
  std::string enum_bytes =
      Bytes({0x62, 27, 0x0a, 22}) + "glossa.testing/ProtoEnum" + Bytes({0x12, 1, 'Y'});
  enum_bytes[1] = static_cast<char>(enum_bytes.size() - 2);
  enum_bytes[3] = static_cast<char>(24);
  EXPECT_EQ(OneValue(MakeEnum("glossa.testing.ProtoEnum", "Y")), SingleItem(enum_bytes));
}

TEST(ParamsProto, RoundTripsEveryKind) {
  RegisterEnum("glossa.testing.ProtoEnum", {"X", "Y"});
  Params inner;
  inner.Define("s", "x", "").Define("l", ParamValue::List{1, 2}, "");
  Params p = InstantiableParams("glossa.testing.ProtoClass");
  p.Define("none", nullptr, "").Define("b", false, "").Define("i", int64_t{-1} << 50, "");
  p.Define("f", 0.25, "").Define("s", "str\nwith 'quotes'", "").Define("d", DType::kFloat16, "");
  p.Define("e", MakeEnum("glossa.testing.ProtoEnum", "X"), "");
  p.Define("c", ClassRef{"glossa.testing.ProtoClass"}, "");
  p.Define("l", ParamValue::List{1, "two", ParamValue::List{}, nullptr, inner}, "");
  p.Define("dict", ParamValue::Dict{{"k", inner}, {"n", 3}}, "");
  p.Define("empty_dict", ParamValue::Dict{}, "").Define("inner", inner, "");
  Params q = Params::FromProtoBytes(p.ToProtoBytes());
  EXPECT_EQ(q, p) << p.TextDiff(q);
  EXPECT_EQ(q.ClsKey(), "glossa.testing.ProtoClass");
  EXPECT_EQ(q.ToProtoBytes(), p.ToProtoBytes());  // deterministic serialization
}

TEST(ParamsProto, FloatsAreStoredAs32BitLikeLingvo) {
  Params p;
  p.Define("f", 0.1, "");
  Params q = Params::FromProtoBytes(p.ToProtoBytes());
  EXPECT_EQ(q.GetFloat("f"), static_cast<double>(0.1f));
}

TEST(ParamsProto, ReadsLingvoTuplesAsLists) {
  // items{"a": tuple_val{items[int 1, int 2]}} as Lingvo writes a Python tuple.
  Params q =
      Params::FromProtoBytes(SingleItem(Bytes({0x1a, 8, 0x0a, 2, 0x48, 1, 0x0a, 2, 0x48, 2})));
  EXPECT_EQ(q.Get("a"), ParamValue(ParamValue::List{1, 2}));
}

TEST(ParamsProto, RejectsWhatCannotBeRepresented) {
  // string_repr_val = 14.
  EXPECT_ERROR_CONTAINS(Params::FromProtoBytes(SingleItem(Bytes({0x72, 1, 'x'}))),
                        InvalidArgumentError, "cannot deserialize string_repr_val");
  // symbolic_val = 15.
  EXPECT_ERROR_CONTAINS(Params::FromProtoBytes(SingleItem(Bytes({0x7a, 1, 'x'}))),
                        UnimplementedError, "hyperparam proto 'a'");
  // A truncated message.
  EXPECT_ERROR_CONTAINS(Params::FromProtoBytes(SingleItem(Bytes({0x48, 5})).substr(0, 5)),
                        DataLossError, "Hyperparam proto");
  // A key that is not a valid param name.
  proto::Hyperparam pb;
  (*pb.mutable_items())["Bad-Key"].set_int_val(1);
  EXPECT_ERROR_CONTAINS(Params::FromProto(pb), InvalidArgumentError, "Bad-Key");
  // An unknown dtype name.
  EXPECT_ERROR_CONTAINS(Params::FromProtoBytes(SingleItem(Bytes({0x32, 3, 'f', '9', '9'}))),
                        InvalidArgumentError, "unknown dtype 'f99'");
}

TEST(ParamsProto, RejectsUnregisteredClassesAndEnumsWithOnePrefix) {
  Params p;
  p.Define("inner", Params().Define("c", ClassRef{"glossa.testing.ProtoClas"}, ""), "");
  EXPECT_ERROR_MESSAGE(
      Params::FromProtoBytes(p.ToProtoBytes()), NotFoundError,
      "hyperparam proto 'inner.c': unregistered class glossa.testing.ProtoClas (did you mean: "
      "[glossa.testing.ProtoClass])");
  Params e;
  e.Define("e", EnumValue{"glossa.testing.NoEnum", "A"}, "");
  EXPECT_ERROR_CONTAINS(Params::FromProtoBytes(e.ToProtoBytes()), NotFoundError,
                        "hyperparam proto 'e': enum type glossa.testing.NoEnum");
  RegisterEnum("glossa.testing.ProtoEnum", {"X", "Y"});
  Params e2;
  e2.Define("e", EnumValue{"glossa.testing.ProtoEnum", "Z"}, "");
  EXPECT_ERROR_CONTAINS(Params::FromProtoBytes(e2.ToProtoBytes()), NotFoundError, "has no value Z");
  proto::Hyperparam pb;
  (*(*pb.mutable_items())["a"].mutable_param_val()->mutable_items())["Bad-Key"].set_int_val(1);
  EXPECT_ERROR_MESSAGE(Params::FromProto(pb), InvalidArgumentError,
                       "hyperparam proto 'a.Bad-Key': invalid param name \"Bad-Key\": must match "
                       "regex \"^[a-z_][a-z0-9_]*$\"");
}

TEST(ParamsProto, LongKeysAreAnErrorNotACrash) {
  proto::Hyperparam pb;
  (*pb.mutable_items())[std::string(200000, 'a') + "-"].set_int_val(1);
  EXPECT_THROW(Params::FromProto(pb), InvalidArgumentError);
}

}  // namespace
}  // namespace glossa
