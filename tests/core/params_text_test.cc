// The params text format: ToText, FromText, TextDiff and str(), against Lingvo's own expectations
// (lingvo/core/hyperparams_test.py), restricted to the value kinds Glossa has.
#include <gtest/gtest.h>

#include <cmath>

#include "glossa/core/params.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

struct TextClass1 {
  explicit TextClass1(const Params&) {}
  virtual ~TextClass1() = default;
};
struct TextClass2 : TextClass1 {
  using TextClass1::TextClass1;
};
GLOSSA_REGISTER_CLASS(TextClass1, "glossa.testing.TextClass1");
GLOSSA_REGISTER_CLASS(TextClass2, "glossa.testing.TextClass2");

Params Inner() {
  Params p;
  p.Define("bar", 2.71, "").Define("baz", "hello", "");
  return p;
}

Params Outer() {
  RegisterEnum("glossa.testing.TestEnum", {"A", "B"});
  Params outer;
  outer.Define("foo", 1, "");
  outer.Define("inner", Inner(), "");
  outer.Define("tau", false, "");
  outer.Define("dtype", DType::kFloat32, "");
  outer.Define("dtype2", DType::kInt32, "");
  outer.Define("seqlen", ParamValue::List{10, Inner(), 30}, "");
  outer.Define("list_of_params", ParamValue::List{Inner()}, "");
  outer.Define("class", ClassRef{"glossa.testing.TextClass1"}, "");
  outer.Define("plain_dict", ParamValue::Dict{{"a", 10}}, "");
  outer.Define("complex_dict", ParamValue::Dict{{"a", 10}, {"b", Inner()}}, "");
  outer.Define("complex_dict_escape", ParamValue::Dict{{"a", "abc\"'\ndef"}}, "");
  outer.Define("complex_dict_with_params", ParamValue::Dict{{"a", Inner()}, {"b", Inner()}}, "");
  outer.Define("optional_bool", nullptr, "");
  outer.Define("enum", MakeEnum("glossa.testing.TestEnum", "B"), "");
  return outer;
}

TEST(ParamsText, ToTextMatchesLingvo) {
  EXPECT_EQ("\n" + Outer().ToText(), R"(
class : type/glossa.testing/TextClass1
complex_dict : {'a': 10, 'b': {'bar': 2.71, 'baz': 'hello'}}
complex_dict_escape : {'a': 'abc"\'
def'}
complex_dict_with_params['a'].bar : 2.71
complex_dict_with_params['a'].baz : 'hello'
complex_dict_with_params['b'].bar : 2.71
complex_dict_with_params['b'].baz : 'hello'
dtype : float32
dtype2 : int32
enum : TestEnum.B
foo : 1
inner.bar : 2.71
inner.baz : 'hello'
list_of_params[0].bar : 2.71
list_of_params[0].baz : 'hello'
optional_bool : NoneType
plain_dict : {'a': 10}
seqlen : [10, {'bar': 2.71, 'baz': 'hello'}, 30]
tau : False
)");
}

TEST(ParamsText, FromTextMatchesLingvo) {
  Params outer = Outer();
  outer.FromText(R"(
        dtype2 : float32
        inner.baz : 'world'
        # foo : 123
        complex_dict_with_params['a'].bar : 2.71
        complex_dict_with_params['a'].baz : 'world'
        complex_dict_with_params['b'].bar : 2.71
        complex_dict_with_params['b'].baz : 'hello'
        optional_bool : true
        list_of_params[0].bar : 2.72
        seqlen : [1, 2.0, '3', [4]]
        plain_dict : {'x': 0.3}
        class : type/glossa.testing/TextClass2
        tau : true
        enum : TestEnum.A
        )");
  EXPECT_EQ("\n" + outer.ToText(), R"(
class : type/glossa.testing/TextClass2
complex_dict : {'a': 10, 'b': {'bar': 2.71, 'baz': 'hello'}}
complex_dict_escape : {'a': 'abc"\'
def'}
complex_dict_with_params['a'].bar : 2.71
complex_dict_with_params['a'].baz : 'world'
complex_dict_with_params['b'].bar : 2.71
complex_dict_with_params['b'].baz : 'hello'
dtype : float32
dtype2 : float32
enum : TestEnum.A
foo : 1
inner.bar : 2.71
inner.baz : 'world'
list_of_params[0].bar : 2.72
list_of_params[0].baz : 'hello'
optional_bool : True
plain_dict : {'x': 0.3}
seqlen : [1, 2.0, '3', [4]]
tau : True
)");
}

TEST(ParamsText, StringEscapingMatchesLingvo) {
  Params p;
  p.Define("bs_end_quote", "Single\\", "");
  p.Define("embedded_newlines", "Split\nAcross\nLines", "");
  p.Define("empty", "", "");
  p.Define("empty_first_line", "\nNext", "");
  p.Define("end_escape_quote", "\"\"Split'\nLine", "");
  p.Define("escaping_single", "In \"quotes\"", "");
  p.Define("escaping_double", "In \\'quotes'", "");
  const std::string text = p.ToText();
  EXPECT_EQ("\n" + text, R"(
bs_end_quote : 'Single\\'
embedded_newlines : 'Split
Across
Lines'
empty : ''
empty_first_line : '
Next'
end_escape_quote : '""Split\'
Line'
escaping_double : "In \\'quotes'"
escaping_single : 'In "quotes"'
)");
  Params q = p.Copy();
  for (const auto& e : p) q.Set(e.name, "");
  q.FromText(text);
  EXPECT_EQ(q, p);
  EXPECT_EQ(q.GetString("end_escape_quote"), "\"\"Split'\nLine");
  EXPECT_EQ(q.GetString("escaping_double"), "In \\'quotes'");
}

TEST(ParamsText, FloatsPrintLikePythonRepr) {
  Params p;
  p.Define("a", 100.0, "").Define("b", 1e-6, "").Define("c", 0.1, "").Define("d", 1e16, "");
  p.Define("e", ParamValue::List{1.5e-5, 2.0, -0.0}, "");
  EXPECT_EQ(p.ToText(), "a : 100.0\nb : 1e-06\nc : 0.1\nd : 1e+16\ne : [1.5e-05, 2.0, -0.0]\n");
}

TEST(ParamsText, FromTextParsesByTheKindOfTheCurrentValue) {
  Params p;
  p.Define("b", true, "").Define("b2", false, "").Define("b3", false, "");
  p.Define("i", 0, "").Define("f", 0.0, "").Define("s", "", "").Define("sl", "x", "");
  p.Define("d", DType::kFloat32, "").Define("n", nullptr, "").Define("n2", nullptr, "");
  p.Define("n3", nullptr, "").Define("dict", ParamValue::Dict{{"a", 1}}, "");
  p.FromText(
      "b : 0\n"  // only False/false are false
      "b2 : yes\n"
      "b3 : True\n"
      "i : -42\n"
      "f : 3\n"           // an int text for a float param
      "s : plain text\n"  // unquoted strings are taken literally
      "sl : '[1, 2]'\n"   // a string that reads as a list becomes a list, as in Lingvo
      "d : bfloat16\n"
      "n : 7\n"
      "n2 : 'text'\n"
      "n3 : False\n"
      "dict : dict\n");
  EXPECT_TRUE(p.GetBool("b"));
  EXPECT_TRUE(p.GetBool("b2"));
  EXPECT_TRUE(p.GetBool("b3"));
  EXPECT_EQ(p.GetInt("i"), -42);
  EXPECT_EQ(p.Get("f"), ParamValue(3.0));
  EXPECT_EQ(p.GetString("s"), "plain text");
  EXPECT_EQ(p.Get("sl"), ParamValue(ParamValue::List{1, 2}));
  EXPECT_EQ(p.Get("d").AsDType(), DType::kBFloat16);
  EXPECT_EQ(p.GetInt("n"), 7);
  EXPECT_EQ(p.GetString("n2"), "text");
  EXPECT_FALSE(p.GetBool("n3"));
  EXPECT_TRUE(p.Get("dict").AsDict().empty());
  p.FromText("b : False\nb2 : false\nn : NoneType");
  EXPECT_FALSE(p.GetBool("b"));
  EXPECT_FALSE(p.GetBool("b2"));
  EXPECT_TRUE(p.Get("n").is_none());
}

TEST(ParamsText, FromTextMultiLineStringsAndLaterLinesWin) {
  Params p;
  p.Define("s", "", "").Define("x", 0, "");
  p.FromText("x : 1\ns : 'line one\n  line two: with colon\nline three'\nx : 2\n");
  EXPECT_EQ(p.GetString("s"), "line one\n  line two: with colon\nline three");
  EXPECT_EQ(p.GetInt("x"), 2);
}

TEST(ParamsText, FromTextErrorsNameTheLineAndLeaveParamsUnchanged) {
  Params p;
  p.Define("activation", "RELU", "").Define("activations", "RELU", "").Define("x", 1, "");
  Params before = p.Copy();
  EXPECT_ERROR_MESSAGE(p.FromText("x : 2\n\n# comment\nno colon here\n"), InvalidArgumentError,
                       "params text line 4: 'no colon here' is not in <key> : <value> format");
  EXPECT_ERROR_MESSAGE(p.FromText("x : 2\nactuvation : 'GELU'\n"), NotFoundError,
                       "params text line 2: actuvation (did you mean: [activation,activations])");
  EXPECT_ERROR_CONTAINS(p.FromText("x : 2\nx : two\n"), InvalidArgumentError,
                        "params text line 2: ");
  EXPECT_ERROR_CONTAINS(p.FromText("x : 99999999999999999999\n"), InvalidArgumentError,
                        "int64 range");
  EXPECT_ERROR_MESSAGE(p.FromText("x : 2\nactivation : 'unterminated\nmore\n"),
                       InvalidArgumentError,
                       "params text line 2: string value of 'activation' has no closing '");
  EXPECT_EQ(p, before);  // nothing was applied
}

TEST(ParamsText, FromTextRejectsBadKindsWithClearErrors) {
  RegisterEnum("glossa.testing.TestEnum", {"A", "B"});
  Params p;
  p.Define("d", DType::kFloat32, "").Define("e", MakeEnum("glossa.testing.TestEnum", "A"), "");
  p.Define("c", ClassRef{"glossa.testing.TextClass1"}, "").Define("l", ParamValue::List{}, "");
  EXPECT_ERROR_CONTAINS(p.FromText("d : float99"), InvalidArgumentError, "unknown dtype 'float99'");
  EXPECT_ERROR_CONTAINS(p.FromText("e : Other.A"), InvalidArgumentError,
                        "expected enum of class TestEnum but got 'Other.A'");
  EXPECT_ERROR_CONTAINS(p.FromText("e : TestEnum.C"), NotFoundError, "has no value C");
  EXPECT_ERROR_CONTAINS(p.FromText("c : type/glossa.testing/TextClass3"), NotFoundError,
                        "did you mean");
  EXPECT_ERROR_CONTAINS(p.FromText("c : 12"), InvalidArgumentError, "class reference");
  EXPECT_ERROR_CONTAINS(p.FromText("l : [1, 2"), InvalidArgumentError, "unclosed bracket");
  EXPECT_ERROR_CONTAINS(p.FromText("l : [1 2]"), InvalidArgumentError,
                        "cannot parse Python literal at offset 3: expected ',' or ']'");
  p.FromText("c : NoneType");
  EXPECT_TRUE(p.Get("c").is_none());
}

TEST(ParamsText, EveryKindRoundTrips) {
  RegisterEnum("glossa.testing.TestEnum", {"A", "B"});
  Params p;
  p.Define("none", nullptr, "").Define("t", true, "").Define("f", false, "");
  p.Define("i", int64_t{-9007199254740993}, "").Define("x", 0.1 + 0.2, "");
  p.Define("big", 1.7976931348623157e308, "").Define("tiny", 5e-324, "");
  p.Define("inf", HUGE_VAL, "").Define("s", "it's \"quoted\" \\ and\nmulti-line: yes", "");
  p.Define("d", DType::kBFloat16, "").Define("e", MakeEnum("glossa.testing.TestEnum", "B"), "");
  p.Define("c", ClassRef{"glossa.testing.TextClass2"}, "");
  p.Define("l",
           ParamValue::List{1, 2.5, "x'y", ParamValue::List{}, nullptr, true,
                            ParamValue::Dict{{"k", "v"}}, DType::kInt8,
                            MakeEnum("glossa.testing.TestEnum", "A"),
                            ClassRef{"glossa.testing.TextClass1"}},
           "");
  p.Define("empty_list", ParamValue::List{}, "").Define("empty_dict", ParamValue::Dict{}, "");
  p.Define("dict", ParamValue::Dict{{"a", 1}, {"b", ParamValue::List{1.5, "two"}}, {"n", nullptr}},
           "");
  p.Define("nested", Inner(), "");
  p.Define("params_list", ParamValue::List{Inner(), Inner()}, "");
  p.Define("params_dict", ParamValue::Dict{{"p", Inner()}}, "");
  p.Define("mixed", ParamValue::List{1, Inner()}, "");
  p.Set("params_list[1].bar", -1.25);
  p.Set("mixed[1].baz", "changed");

  // Read the text into a copy whose values were all reset to other values of the same shape.
  Params q = p.Copy();
  q.FromText(
      "none : 5\nt : False\nf : True\ni : 0\nx : 0.0\nbig : 0.0\ntiny : 1.0\ninf : 0.0\ns : ''\n"
      "d : float32\ne : TestEnum.A\nc : type/glossa.testing/TextClass1\n"
      "l : [2, 3.5, 'z', [], 1, False, {'k': 'w'}, 'float32', 'TestEnum.B', "
      "'type/glossa.testing/TextClass2']\n"
      "empty_list : [1]\nempty_dict : {'z': 1}\ndict : {}\nnested.bar : 0.0\n"
      "params_list[1].bar : 0.0\nparams_dict['p'].baz : 'no'\nmixed[1].baz : 'no'\n");
  ASSERT_FALSE(q == p);
  // Inside lists, dtypes, enums and class references are read back by the kind of the current
  // element at the same position (ToText writes them as strings there, as Lingvo does).
  EXPECT_EQ(q.Get("l[7]").AsDType(), DType::kFloat32);
  EXPECT_EQ(q.Get("l[8]").AsEnum().name, "B");
  EXPECT_EQ(q.Get("l[9]").AsClass().key, "glossa.testing.TextClass2");
  q.FromText(p.ToText());
  EXPECT_EQ(q, p) << p.TextDiff(q);
  EXPECT_EQ(q.ToText(), p.ToText());
}

TEST(ParamsText, TextDiffMatchesLingvo) {
  Params a;
  Params d_inner;
  d_inner.Define("hey", "hi", "");
  a.Define("a", 42, "").Define("c", "C", "").Define("d", d_inner, "");
  Params b = a.Copy();
  EXPECT_EQ(a.TextDiff(b), "");
  a.Set("a", 43);
  EXPECT_EQ(a.TextDiff(b), "> a: 43\n< a: 42\n");
  b.Set("d.hey", "hello");
  EXPECT_EQ(a.TextDiff(b),
            "> a: 43\n"
            "< a: 42\n"
            "? d:\n"
            ">   hey: hi\n"
            "<   hey: hello\n");
}

TEST(ParamsText, TextDiffSequencesAndMissingKeys) {
  Params a;
  a.Define("a", 42, "").Define("b", ParamValue::List{}, "");
  Params b = a.Copy();
  a.Set("b", ParamValue::List{1, 2, 3});
  b.Set("b", ParamValue::List{1, 3, 3, 4});
  EXPECT_EQ(a.TextDiff(b), "> b[1]: 2\n< b[1]: 3\n< b[3]: 4\n");
  Params c;
  c.Define("a", 42, "").Define("only_c", "x", "");
  Params d;
  d.Define("a", 42, "").Define("only_d", ParamValue::List{1, "s"}, "");
  EXPECT_EQ(c.TextDiff(d), "> only_c: x\n< only_d: [1, 's']\n");
}

TEST(ParamsText, ToStringMatchesLingvosStr) {
  Params p;
  p.Define("b", 1, "").Define("a", "x", "").Define("inner", Inner(), "");
  p.Define("n", nullptr, "");
  EXPECT_EQ(p.ToString(),
            "{\n"
            "  a: \"x\"\n"
            "  b: 1\n"
            "  inner: {\n"
            "    bar: 2.71\n"
            "    baz: \"hello\"\n"
            "  }\n"
            "  n: None\n"
            "}");
}

TEST(ParamsText, ToTextOfTheLingvoFixtureReadsBack) {
  // complex_dict_escape's string holds a newline, so its dict literal spans two lines.
  Params outer = Outer();
  Params q = Outer();
  q.Set("complex_dict_escape", ParamValue::Dict{{"a", "x"}});
  q.Set("foo", 5);
  q.FromText(outer.ToText());
  EXPECT_EQ(q, outer) << outer.TextDiff(q);
}

TEST(ParamsText, EdgeValuesRoundTrip) {
  Params p;
  p.Define("quotes1", "\"'", "").Define("quotes2", "''\"", "").Define("bs", "\\'", "");
  p.Define("imin", INT64_MIN, "").Define("imax", INT64_MAX, "");
  p.Define("odd_keys", ParamValue::Dict{{"it's", Inner()}, {"a:b", Inner()}, {"back\\", Inner()}},
           "");
  p.Define("odd_plain_keys", ParamValue::Dict{{"it's", 1}, {"x:y", "v:w"}}, "");
  p.Define("list_nl", ParamValue::List{"a\nb", ParamValue::Dict{{"k", "c\nd"}}}, "");
  p.Set("odd_keys['it\\'s'].bar", 1.5);
  p.Set("odd_keys['a:b'].baz", "colon");
  Params q = p.Copy();
  for (const char* k : {"quotes1", "quotes2", "bs"}) q.Set(k, "");
  q.Set("imin", 0).Set("imax", 0).Set("odd_keys['it\\'s'].bar", 0.0).Set("odd_keys['a:b'].baz", "");
  q.Set("odd_plain_keys", ParamValue::Dict{}).Set("list_nl", ParamValue::List{});
  q.FromText(p.ToText());
  EXPECT_EQ(q, p) << p.ToText() << "\n" << p.TextDiff(q);
}

TEST(ParamsText, LiteralsFollowPython) {
  Params p;
  p.Define("l", ParamValue::List{}, "");
  p.FromText("l : [(5), (5,), (), (1, 2), - 3, '\\101\\x41\\u00e9', 1_000, .5, 2e3]");
  EXPECT_EQ(p.Get("l"), ParamValue(ParamValue::List{5, ParamValue::List{5}, ParamValue::List{},
                                                    ParamValue::List{1, 2}, -3, "AA\xc3\xa9", 1000,
                                                    0.5, 2000.0}));
  EXPECT_ERROR_CONTAINS(p.FromText("l : [_1]"), InvalidArgumentError, "expected a value");
  EXPECT_ERROR_CONTAINS(p.FromText("l : ['\\UFFFFFFFF']"), InvalidArgumentError,
                        "not a valid Unicode scalar value");
  EXPECT_ERROR_CONTAINS(p.FromText("l : ['\\ud800']"), InvalidArgumentError,
                        "not a valid Unicode scalar value");
  EXPECT_ERROR_CONTAINS(p.FromText("l : {1: 2}"), InvalidArgumentError,
                        "dict keys must be strings");
}

TEST(ParamsText, HostileInputIsAnErrorNotACrash) {
  Params p;
  p.Define("l", ParamValue::List{}, "").Define("i", 0, "");
  EXPECT_ERROR_CONTAINS(p.FromText("l : " + std::string(100000, '[') + std::string(100000, ']')),
                        InvalidArgumentError, "nesting deeper than 100");
  EXPECT_ERROR_CONTAINS(p.FromText("l : [1,\n2,\n"), InvalidArgumentError,
                        "params text line 1: the value of 'l' has an unclosed bracket or quote");
  EXPECT_ERROR_CONTAINS(p.FromText("i : " + std::string(5000, '9')), InvalidArgumentError,
                        "int64 range");
  EXPECT_ERROR_CONTAINS(p.FromText(std::string(100000, 'a') + " : 1"), NotFoundError, "keys are");
  EXPECT_THROW(p.FromText("l[" + std::string(1000, '9') + "] : 1"), InvalidArgumentError);
}

TEST(ParamsText, ParamsGivenAsADictLiteralTakeDirectKeysOnly) {
  Params p;
  p.Define("inner", Inner(), "");
  p.FromText("inner : {'bar': 1.0, 'baz': 'x'}");
  EXPECT_EQ(p.GetFloat("inner.bar"), 1.0);
  EXPECT_EQ(p.GetString("inner.baz"), "x");
  EXPECT_ERROR_CONTAINS(p.FromText("inner : {'bar.x': 1.0}"), NotFoundError, "bar.x");
  EXPECT_ERROR_CONTAINS(p.FromText("inner : {'bax': 1.0}"), NotFoundError,
                        "bax (keys are ['bar', 'baz'])");
}

TEST(ParamsText, ToTextWithDocsCommentsEveryDocLine) {
  Params p;
  p.Define("b", 1, "Line one.\nLine two.").Define("a", "x", "").Define("inner", Inner(), "Inner.");
  p.GetParams("inner").Define("doc", 0, "Nested doc.");
  const std::string text = p.ToTextWithDocs();
  EXPECT_EQ(text,
            "a : 'x'\n"
            "# Line one.\n# Line two.\n"
            "b : 1\n"
            "inner.bar : 2.71\n"
            "inner.baz : 'hello'\n"
            "# Nested doc.\n"
            "inner.doc : 0\n");
  Params q = p.Copy();
  q.Set("b", 5);
  q.FromText(text);
  EXPECT_EQ(q, p);
}

}  // namespace
}  // namespace glossa
