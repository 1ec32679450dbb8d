#include "glossa/core/params.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/test_util.h"

namespace glossa {
namespace {

Params Inner() {
  Params p;
  p.Define("bar", 2.71, "A float.").Define("baz", "hello", "A string.");
  return p;
}

TEST(Params, DefineValidatesNames) {
  Params p;
  p.Define("a_1", 1, "ok").Define("_x", 2, "ok");
  EXPECT_ERROR_MESSAGE(p.Define("Bad", 1, ""), InvalidArgumentError,
                       "invalid param name \"Bad\": must match regex \"^[a-z_][a-z0-9_]*$\"");
  EXPECT_THROW(p.Define("1a", 1, ""), InvalidArgumentError);
  EXPECT_THROW(p.Define("a-b", 1, ""), InvalidArgumentError);
  EXPECT_THROW(p.Define("", 1, ""), InvalidArgumentError);
  EXPECT_ERROR_MESSAGE(p.Define("a_1", 5, ""), InvalidArgumentError,
                       "param 'a_1' is already defined");
  EXPECT_EQ(p.GetInt("a_1"), 1);
}

TEST(Params, DocIsKeptAndNotPartOfEquality) {
  Params a, b;
  a.Define("x", 1, "Doc A.");
  b.Define("x", 1, "Doc B.");
  EXPECT_EQ(a.Doc("x"), "Doc A.");
  EXPECT_EQ(a, b);
  b.Set("x", 2);
  EXPECT_FALSE(a == b);
}

TEST(Params, EqualityIgnoresDefinitionOrderButNotNamesOrKinds) {
  Params a, b;
  a.Define("x", 1, "").Define("y", "s", "");
  b.Define("y", "s", "").Define("x", 1, "");
  EXPECT_EQ(a, b);
  Params c;
  c.Define("x", 1, "").Define("z", "s", "");
  EXPECT_FALSE(a == c);
  Params d;
  d.Define("x", 1.0, "").Define("y", "s", "");
  EXPECT_FALSE(a == d);  // int 1 and float 1.0 are different kinds
}

TEST(Params, SetGetDottedPathsAndIndexes) {
  Params p;
  p.Define("encoder", Inner(), "Encoder.");
  p.Define("layers", ParamValue::List{Inner(), Inner()}, "Layers.");
  p.Define("sizes", ParamValue::List{1, 2, 3}, "Sizes.");
  p.Define("table", ParamValue::Dict{{"k", Inner()}}, "Dict of params.");
  p.Set("encoder.bar", 3.5);
  p.Set("layers[1].baz", "world");
  p.Set("sizes[0]", 10);
  p.Set("sizes[-1]", 30);
  p.Set("table['k'].bar", 1.0);
  EXPECT_EQ(p.GetFloat("encoder.bar"), 3.5);
  EXPECT_EQ(p.GetString("layers[0].baz"), "hello");
  EXPECT_EQ(p.GetString("layers[1].baz"), "world");
  EXPECT_EQ(p.Get("sizes"), ParamValue(ParamValue::List{10, 2, 30}));
  EXPECT_EQ(p.GetInt("sizes[1]"), 2);
  EXPECT_EQ(p.GetFloat("table[\"k\"].bar"), 1.0);
  EXPECT_EQ(p.Doc("encoder.bar"), "A float.");
}

TEST(Params, AFloatFieldHoldingNanOrInfIsAnErrorNamingIt) {
  // NaN passes every range check after it and Inf passes one-sided ones: GetFloat refuses both,
  // whoever set them (the text format reads `nan` and `inf`).
  Params p;
  p.Define("lr", 0.1, "").Define("n", 3, "");
  Params inner;
  inner.Define("clip", 1.0, "");
  p.Define("learner", inner, "");
  EXPECT_DOUBLE_EQ(p.GetFloat("n"), 3.0);
  p.Set("lr", std::nan(""));
  EXPECT_ERROR_CONTAINS(p.GetFloat("lr"), InvalidArgumentError,
                        "param 'lr' must be a finite number, got nan");
  p.Set("learner.clip", -HUGE_VAL);
  EXPECT_ERROR_CONTAINS(p.GetFloat("learner.clip"), InvalidArgumentError,
                        "param 'learner.clip' must be a finite number, got -inf");
  p.Set("lr", 1e308);
  EXPECT_DOUBLE_EQ(p.GetFloat("lr"), 1e308);
}

TEST(Params, UnknownKeyListsSimilarKeysLikeLingvo) {
  Params p;
  p.Define("activation", "RELU", "Can be a string or a list of strings.");
  p.Define("activations", "RELU", "Many activations.");
  p.Define("cheesecake", nullptr, "dessert");
  p.Define("tofu", nullptr, "not dessert");
  EXPECT_ERROR_MESSAGE(p.Set("actuvation", 1), NotFoundError,
                       "actuvation (did you mean: [activation,activations])");
  EXPECT_ERROR_MESSAGE(p.Get("actuvation"), NotFoundError,
                       "actuvation (did you mean: [activation,activations])");
  EXPECT_ERROR_MESSAGE(p.Get("zzzzzz"), NotFoundError,
                       "zzzzzz (keys are ['activation', 'activations', 'cheesecake', 'tofu'])");
  EXPECT_ERROR_MESSAGE(p.Delete("actuvation"), NotFoundError,
                       "actuvation (did you mean: [activation,activations])");
}

TEST(Params, UnknownNestedKeyNamesThePath) {
  Params p;
  Params enc;
  enc.Define("num_layers", 2, "");
  p.Define("encoder", enc, "");
  EXPECT_ERROR_MESSAGE(p.Set("encoder.num_layrs", 3), NotFoundError,
                       "encoder.num_layrs (did you mean: [num_layers])");
  EXPECT_ERROR_CONTAINS(p.Set("encodr.num_layers", 3), NotFoundError, "encodr");
}

TEST(Params, BadPathsAreInvalidArgument) {
  Params p;
  p.Define("x", 1, "").Define("l", ParamValue::List{1}, "");
  EXPECT_ERROR_CONTAINS(p.Get("x.y"), InvalidArgumentError, "cannot descend into 'x'");
  EXPECT_ERROR_CONTAINS(p.Get("x[0]"), InvalidArgumentError, "cannot index 'x'");
  EXPECT_ERROR_CONTAINS(p.Get("l[3]"), InvalidArgumentError, "out of range");
  EXPECT_ERROR_CONTAINS(p.Get("l[a]"), InvalidArgumentError, "malformed param path");
  EXPECT_ERROR_CONTAINS(p.Get("x."), InvalidArgumentError, "malformed param path");
  EXPECT_ERROR_CONTAINS(p.Get(""), InvalidArgumentError, "malformed param path");
}

TEST(Params, TypedGettersNameThePathOnKindMismatch) {
  Params p;
  p.Define("s", "str", "").Define("i", 3, "");
  EXPECT_ERROR_MESSAGE(p.GetInt("s"), InvalidArgumentError,
                       "param 's': param value is a str, not a int");
  EXPECT_EQ(p.GetFloat("i"), 3.0);  // ints widen
  EXPECT_THROW(p.GetBool("i"), InvalidArgumentError);
  EXPECT_THROW(p.GetParams("i"), InvalidArgumentError);
}

TEST(Params, DeleteRemovesNestedKeys) {
  Params p;
  p.Define("encoder", Inner(), "").Define("x", 1, "");
  p.Delete("encoder.bar").Delete("x");
  EXPECT_FALSE(p.Contains("x"));
  EXPECT_FALSE(p.GetParams("encoder").Contains("bar"));
  EXPECT_TRUE(p.GetParams("encoder").Contains("baz"));
  EXPECT_THROW(p.Delete("x"), NotFoundError);
}

TEST(Params, CopyIsDeep) {
  Params p;
  p.Define("encoder", Inner(), "").Define("list", ParamValue::List{Inner()}, "");
  Params q = p.Copy();
  q.Set("encoder.bar", 9.0);
  q.Set("list[0].baz", "changed");
  EXPECT_EQ(p.GetFloat("encoder.bar"), 2.71);
  EXPECT_EQ(p.GetString("list[0].baz"), "hello");
  EXPECT_EQ(q.GetFloat("encoder.bar"), 9.0);
}

// A param that is None (fprop_dtype) reads a dtype name as the dtype, as ToText writes it: a
// params.txt of a bf16 run reads back, and `task.fprop_dtype : bfloat16` makes a bf16 run.
TEST(Params, ANoneParamReadsADtypeName) {
  Params p;
  p.Define("fprop_dtype", ParamValue(), "").Define("other", ParamValue(), "");
  p.FromText("fprop_dtype : bfloat16");
  EXPECT_EQ(p.Get("fprop_dtype").AsDType(), DType::kBFloat16);
  Params q;
  q.Define("fprop_dtype", ParamValue(), "").Define("other", ParamValue(), "");
  q.FromText(p.ToText());
  EXPECT_EQ(q.Get("fprop_dtype").AsDType(), DType::kBFloat16);
  EXPECT_ERROR_CONTAINS(p.FromText("other : bfloat17"), InvalidArgumentError,
                        "a dtype name, a number");
}

TEST(Params, FreezeIsTopLevelOnlyAndCopiesStayFrozen) {
  Params p;
  p.Define("x", 1, "").Define("encoder", Inner(), "");
  p.Freeze();
  EXPECT_TRUE(p.IsFrozen());
  EXPECT_ERROR_CONTAINS(p.Set("x", 2), FailedPreconditionError, "frozen");
  EXPECT_THROW(p.Define("y", 2, ""), FailedPreconditionError);
  EXPECT_THROW(p.Delete("x"), FailedPreconditionError);
  EXPECT_THROW(p.FromText("x : 3"), FailedPreconditionError);
  EXPECT_THROW(p.Set("encoder.bar", 1.0), FailedPreconditionError);  // Set goes through the top
  // The nested Params itself is not frozen.
  p.GetParams("encoder").Set("bar", 1.0);
  EXPECT_EQ(p.GetFloat("encoder.bar"), 1.0);
  Params q = p.Copy();
  EXPECT_TRUE(q.IsFrozen());
  EXPECT_THROW(q.Set("x", 2), FailedPreconditionError);
  EXPECT_EQ(p.GetInt("x"), 1);
}

TEST(Params, ContainsIsFlatAndIterationIsInDefinitionOrder) {
  Params p;
  p.Define("zeta", 1, "").Define("alpha", Inner(), "").Define("mid", 2, "");
  EXPECT_TRUE(p.Contains("alpha"));
  EXPECT_FALSE(p.Contains("alpha.bar"));
  EXPECT_FALSE(p.Contains("bar"));
  std::vector<std::string> names;
  for (const auto& e : p) names.push_back(e.name);
  EXPECT_EQ(names, (std::vector<std::string>{"zeta", "alpha", "mid"}));
  EXPECT_EQ(p.Keys(), names);
  EXPECT_EQ(p.size(), 3u);
}

TEST(Params, IsSet) {
  Params p;
  p.Define("a", nullptr, "").Define("b", 0, "");
  EXPECT_FALSE(p.IsSet("a"));
  EXPECT_TRUE(p.IsSet("b"));
  EXPECT_THROW(p.IsSet("c"), NotFoundError);
}

TEST(Params, VisitCallsEnterVisitExitWithLingvoKeys) {
  Params p;
  p.Define("a", 1, "").Define("inner", Inner(), "");
  p.Define("l", ParamValue::List{5, Inner()}, "");
  p.Define("d", ParamValue::Dict{{"k", 7}}, "");
  std::vector<std::string> events;
  p.Visit([&](const std::string& k, const ParamValue&) { events.push_back("visit " + k); },
          [&](const std::string& k, const ParamValue&) {
            events.push_back("enter " + k);
            return true;
          },
          [&](const std::string& k, const ParamValue&) { events.push_back("exit " + k); });
  EXPECT_EQ(events,
            (std::vector<std::string>{"enter ", "visit a", "enter inner", "visit inner.bar",
                                      "visit inner.baz", "exit inner", "enter l", "visit l[0]",
                                      "enter l[1]", "visit l[1].bar", "visit l[1].baz", "exit l[1]",
                                      "exit l", "enter d", "visit d['k']", "exit d", "exit "}));
}

TEST(Params, VisitTreatsRejectedContainersAsLeaves) {
  Params p;
  p.Define("inner", Inner(), "").Define("l", ParamValue::List{1, 2}, "");
  std::vector<std::string> visited;
  p.Visit([&](const std::string& k, const ParamValue&) { visited.push_back(k); },
          [](const std::string& k, const ParamValue& v) { return k.empty() || v.is_params(); });
  EXPECT_EQ(visited, (std::vector<std::string>{"inner.bar", "inner.baz", "l"}));
}

TEST(Params, MergeCommonKeysFromCopiesOnlySharedKeys) {
  Params a, b;
  a.Define("x", 1, "").Define("y", 2, "").Define("inner", Inner(), "");
  Params other_inner = Inner();
  other_inner.Set("bar", 0.5);
  b.Define("x", 10, "").Define("z", 30, "").Define("inner", other_inner, "");
  a.MergeCommonKeysFrom(b);
  EXPECT_EQ(a.GetInt("x"), 10);
  EXPECT_EQ(a.GetInt("y"), 2);
  EXPECT_FALSE(a.Contains("z"));
  EXPECT_EQ(a.GetFloat("inner.bar"), 0.5);
  // The merged nested Params is a copy.
  b.Set("inner.bar", 0.25);
  EXPECT_EQ(a.GetFloat("inner.bar"), 0.5);
}

TEST(Params, CopyFieldsToSkipsClsAndNamedFieldsAndRejectsUnknown) {
  Params from = InstantiableParams("glossa.testing.Anything");
  from.Define("x", 1, "").Define("y", 2, "").Define("w", 4, "");
  Params to = InstantiableParams("glossa.testing.Other");
  to.Define("x", 0, "").Define("y", 0, "");
  EXPECT_ERROR_CONTAINS(CopyFieldsTo(from, to), NotFoundError, "w");
  Params to2 = InstantiableParams("glossa.testing.Other");
  to2.Define("x", 0, "").Define("y", 0, "").Define("w", 0, "");
  CopyFieldsTo(from, to2, {"y"});
  EXPECT_EQ(to2.GetInt("x"), 1);
  EXPECT_EQ(to2.GetInt("y"), 0);
  EXPECT_EQ(to2.GetInt("w"), 4);
  EXPECT_EQ(to2.ClsKey(), "glossa.testing.Other");
}

TEST(ParamValue, KindsAndAccessors) {
  EXPECT_EQ(ParamValue().kind(), ParamValue::Kind::kNone);
  EXPECT_EQ(ParamValue(nullptr).KindName(), "NoneType");
  EXPECT_EQ(ParamValue(true).kind(), ParamValue::Kind::kBool);
  EXPECT_EQ(ParamValue(3).kind(), ParamValue::Kind::kInt);
  EXPECT_EQ(ParamValue(int64_t{1} << 40).AsInt(), int64_t{1} << 40);
  EXPECT_EQ(ParamValue(2.5f).kind(), ParamValue::Kind::kFloat);
  EXPECT_EQ(ParamValue("s").kind(), ParamValue::Kind::kString);
  EXPECT_EQ(ParamValue(DType::kBFloat16).AsDType(), DType::kBFloat16);
  EXPECT_EQ(ParamValue(ClassRef{"a.b.C"}).AsClass().ModuleSlashName(), "a.b/C");
  EXPECT_EQ(ParamValue(ParamValue::List{1}).kind(), ParamValue::Kind::kList);
  EXPECT_EQ(ParamValue(ParamValue::Dict{}).kind(), ParamValue::Kind::kDict);
  EXPECT_EQ(ParamValue(Params()).kind(), ParamValue::Kind::kParams);
  EXPECT_ERROR_MESSAGE(ParamValue("s").AsInt(), InvalidArgumentError,
                       "param value is a str, not a int");
}

TEST(DType, NamesRoundTripAndMapToScalarTypes) {
  for (DType d : {DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64, DType::kInt8,
                  DType::kInt16, DType::kInt32, DType::kInt64, DType::kUInt8, DType::kBool,
                  DType::kComplex64, DType::kComplex128}) {
    EXPECT_EQ(ParseDType(DTypeName(d)), d);
    EXPECT_EQ(FromScalarType(ToScalarType(d)), d);
  }
  EXPECT_EQ(ToScalarType(DType::kFloat32), at::ScalarType::Float);
  EXPECT_EQ(DTypeName(DType::kFloat32), "float32");
  EXPECT_ERROR_CONTAINS(ParseDType("float33"), InvalidArgumentError, "unknown dtype 'float33'");
  EXPECT_THROW(ToScalarType(DType::kString), InvalidArgumentError);
}

TEST(Enums, RegisteredTypesValidateNames) {
  RegisterEnum("glossa.testing.Color", {"RED", "GREEN"});
  RegisterEnum("glossa.testing.Color", {"RED", "GREEN"});  // idempotent
  EXPECT_THROW(RegisterEnum("glossa.testing.Color", {"BLUE"}), InvalidArgumentError);
  EnumValue e = MakeEnum("glossa.testing.Color", "GREEN");
  EXPECT_EQ(e.ShortType(), "Color");
  EXPECT_EQ(e.Module(), "glossa.testing");
  EXPECT_ERROR_CONTAINS(MakeEnum("glossa.testing.Color", "GREN"), NotFoundError,
                        "GREN (did you mean: [GREEN])");
  EXPECT_THROW(MakeEnum("glossa.testing.Colour", "RED"), NotFoundError);
  EXPECT_ERROR_CONTAINS(RegisterEnum("Color", {"RED"}), InvalidArgumentError, "dotted");
}

}  // namespace
}  // namespace glossa
