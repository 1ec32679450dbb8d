#include "glossa/core/nested_map.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "tests/test_util.h"

namespace glossa {
namespace {

NestedMap Sample() {
  // {'foo': 1, 'bar': {'x': 2.5, 'y': [3, {'z': 'zz'}, 4]}, 'empty': {}, 'nil': []}
  NestedMap m;
  m.Set("foo", 1);
  m.Set("bar.x", 2.5);
  m.Set("bar.y[0]", 3);
  m.Set("bar.y[1].z", "zz");
  m.Set("bar.y[2]", 4);
  m.Put("empty", NestedMap());
  m.Put("nil", NestedValue::List{});
  return m;
}

TEST(NestedMap, KeysAreCheckedAndReservedNamesRaise) {
  NestedMap m;
  m.Put("_ok1", 1);
  EXPECT_ERROR_CONTAINS(m.Put("1bad", 1), InvalidArgumentError, "invalid NestedMap key '1bad'");
  EXPECT_THROW(m.Put("a-b", 1), InvalidArgumentError);
  EXPECT_THROW(m.Put("", 1), InvalidArgumentError);
  EXPECT_ERROR_MESSAGE(m.Put("keys", 1), InvalidArgumentError,
                       "'keys' is a reserved NestedMap key");
  EXPECT_THROW(m.Set("a.items", 1), InvalidArgumentError);
  EXPECT_THROW(m.Set("__class__", 1), InvalidArgumentError);
  EXPECT_THROW((NestedMap{{"update", 1}}), InvalidArgumentError);
}

TEST(NestedMap, FlattenItemsUsesSortedKeysAndListIndexes) {
  auto items = Sample().FlattenItems();
  std::vector<std::string> keys;
  for (const auto& [k, v] : items) keys.push_back(k);
  EXPECT_EQ(keys, (std::vector<std::string>{"bar.x", "bar.y[0]", "bar.y[1].z", "bar.y[2]", "foo"}));
  auto flat = Sample().Flatten();
  ASSERT_EQ(flat.size(), 5u);
  EXPECT_EQ(flat[0].AsFloat(), 2.5);
  EXPECT_EQ(flat[2].AsString(), "zz");
  EXPECT_EQ(flat[4].AsInt(), 1);
  EXPECT_EQ(Sample().Keys(), keys);
}

TEST(NestedMap, GetItemGetHasAndErrors) {
  NestedMap m = Sample();
  EXPECT_EQ(m.GetItem("bar.y[1].z").AsString(), "zz");
  EXPECT_EQ(m.GetItem("bar.y[2]").AsInt(), 4);
  EXPECT_TRUE(m.Has("bar.y[1].z"));
  EXPECT_FALSE(m.Has("bar.y[3]"));
  EXPECT_FALSE(m.Has("bar.q"));
  EXPECT_EQ(m.Get("bar.q", 7).AsInt(), 7);
  EXPECT_TRUE(m.Get("bar.y[9]").is_none());
  EXPECT_ERROR_MESSAGE(m.GetItem("bar.q"), NotFoundError,
                       "'bar.q' (key 'bar.q'); available attributes: ['x', 'y']");
  EXPECT_ERROR_CONTAINS(m.GetItem("bar.y[5]"), InvalidArgumentError, "index 5 out of range");
  EXPECT_ERROR_CONTAINS(m.GetItem("foo[0]"), InvalidArgumentError, "cannot index 'foo'");
  EXPECT_ERROR_CONTAINS(m.GetItem("foo.x"), InvalidArgumentError, "it is a int");
  EXPECT_ERROR_CONTAINS(m.at("zzz"), NotFoundError, "available attributes");
  // Indexes too large for size_t are errors, not escaping std exceptions.
  EXPECT_THROW(m.GetItem("bar.y[99999999999999999999999]"), InvalidArgumentError);
  EXPECT_FALSE(m.Has("bar.y[99999999999999999999999]"));
  EXPECT_EQ(m.Get("bar.y[99999999999999999999999]", 3).AsInt(), 3);
}

TEST(NestedMap, SetCreatesMapsAndListsButNotGaps) {
  NestedMap m;
  m.Set("a.b[0].c", 1);
  m.Set("a.b[1]", 2);
  EXPECT_EQ(m.GetItem("a.b[0].c").AsInt(), 1);
  EXPECT_EQ(m.GetItem("a.b[1]").AsInt(), 2);
  m.Set("a.b[0].c", 5);  // overwrite
  EXPECT_EQ(m.GetItem("a.b[0].c").AsInt(), 5);
  EXPECT_ERROR_CONTAINS(m.Set("a.b[3]", 1), InvalidArgumentError,
                        "the index 3 is greater than the length 2");
  EXPECT_ERROR_CONTAINS(m.Set("a.b[1].x", 1), InvalidArgumentError, "not a NestedMap");
  EXPECT_ERROR_CONTAINS(m.Set("a[0]", 1), InvalidArgumentError, "not a list");
  EXPECT_ERROR_CONTAINS(m.Set("a.b[x]", 1), InvalidArgumentError, "invalid NestedMap key");
}

TEST(NestedMap, PackRebuildsTheStructureAndChecksLength) {
  NestedMap m = Sample();
  std::vector<NestedValue> values = {10, 20, 30, 40, 50};
  NestedMap packed = m.Pack(values);
  EXPECT_EQ(packed.GetItem("bar.x").AsInt(), 10);
  EXPECT_EQ(packed.GetItem("bar.y[1].z").AsInt(), 30);
  EXPECT_EQ(packed.GetItem("foo").AsInt(), 50);
  EXPECT_TRUE(packed.GetItem("empty").is_map());  // empty containers are kept
  EXPECT_TRUE(packed.GetItem("nil").is_list());
  EXPECT_TRUE(packed.IsCompatible(m));
  EXPECT_ERROR_CONTAINS(m.Pack(std::vector<NestedValue>{1, 2}), InvalidArgumentError,
                        "the template has 5 leaves");
}

TEST(NestedMap, TransformAndTransformWithKey) {
  NestedMap m;
  m.Set("a", 1);
  m.Set("b.c[0]", 2);
  NestedMap doubled = m.Transform([](const NestedValue& v) { return NestedValue(v.AsInt() * 2); });
  EXPECT_EQ(doubled.GetItem("b.c[0]").AsInt(), 4);
  NestedMap keyed =
      m.TransformWithKey([](const std::string& k, const NestedValue&) { return NestedValue(k); });
  EXPECT_EQ(keyed.GetItem("b.c[0]").AsString(), "b.c[0]");
  EXPECT_EQ(m.GetItem("a").AsInt(), 1);  // the original is unchanged
}

TEST(NestedMap, FilterCompactsListsAndRemovesEmptiedContainers) {
  NestedMap m = Sample();
  m.Set("odd.only[0]", "s");
  NestedMap ints =
      m.Filter([](const NestedValue& v) { return v.kind() == NestedValue::Kind::kInt; });
  std::vector<std::string> keys = ints.Keys();
  EXPECT_EQ(keys, (std::vector<std::string>{"bar.y[0]", "bar.y[1]", "foo"}));
  EXPECT_EQ(ints.GetItem("bar.y[1]").AsInt(), 4);  // list compacted
  EXPECT_FALSE(ints.contains("odd"));              // emptied by the filter: removed
  EXPECT_TRUE(ints.contains("empty"));             // already empty: kept
  EXPECT_TRUE(ints.contains("nil"));
  EXPECT_FALSE(ints.GetItem("bar").AsMap().contains("x"));
  NestedMap by_key = m.FilterKeyVal(
      [](const std::string& k, const NestedValue&) { return k.rfind("bar.y", 0) == 0; });
  EXPECT_EQ(by_key.Keys(), (std::vector<std::string>{"bar.y[0]", "bar.y[1].z", "bar.y[2]"}));
  NestedMap none = m.Filter([](const NestedValue&) { return false; });
  EXPECT_EQ(none.Keys().size(), 0u);
}

TEST(NestedMap, IsCompatibleComparesFlattenedKeys) {
  NestedMap a, b, c;
  a.Set("x.y", 1);
  a.Set("z[0]", 2);
  b.Set("x.y", "other");
  b.Set("z[0]", 3.0);
  c.Set("x.y", 1);
  c.Set("z[0]", 2);
  EXPECT_TRUE(a.IsCompatible(b));
  EXPECT_TRUE(a.IsCompatible(c));
  c.Set("z[1]", 0);
  EXPECT_FALSE(a.IsCompatible(c));
  EXPECT_FALSE(c.IsCompatible(a));
}

TEST(NestedMap, DeepCopyCopiesStructureAndSharesTensors) {
  NestedMap m;
  m.Set("w", at::zeros({2}));
  m.Set("inner.v", at::ones({3}));
  NestedMap copy = m.DeepCopy();
  copy.Set("inner.extra", 1);
  EXPECT_FALSE(m.Has("inner.extra"));
  copy.GetItem("w").AsTensor().add_(5);  // same storage
  EXPECT_EQ(m.GetTensor("w")[0].item<float>(), 5.0f);
  auto tensors = m.FlattenTensors();
  ASSERT_EQ(tensors.size(), 2u);
  EXPECT_EQ(tensors[0].numel(), 3);  // inner.v sorts before w
  NestedMap repacked = m.Pack(tensors);
  EXPECT_TRUE(repacked.GetTensor("w").is_same(m.GetTensor("w")));
  m.Set("s", "not a tensor");
  EXPECT_ERROR_CONTAINS(m.FlattenTensors(), InvalidArgumentError, "leaf 's' is a str");
}

TEST(NestedMap, UnionAndUpdate) {
  NestedMap a, b;
  a.Set("x", 1);
  a.Set("n.y", 2);
  b.Set("n.y", 20);
  b.Set("n.z", 30);
  NestedMap u = a.Union(b);
  EXPECT_EQ(u.GetItem("x").AsInt(), 1);
  EXPECT_EQ(u.GetItem("n.y").AsInt(), 20);
  EXPECT_EQ(u.GetItem("n.z").AsInt(), 30);
  EXPECT_EQ(a.GetItem("n.y").AsInt(), 2);
  a.Update(b);
  EXPECT_EQ(a.GetItem("n.y").AsInt(), 20);
}

TEST(NestedMap, DebugStringPadsKeysAndSortsLines) {
  NestedMap m;
  m.Set("foo", 1);
  m.Set("bar.y[0]", 2.5);
  m.Set("bar.y[1]", "s");
  m.Set("t", at::zeros({2, 3}));
  m.Set("flag", true);
  m.Set("nothing", nullptr);
  EXPECT_EQ(m.DebugString(),
            "bar.y[0]    2.5\n"
            "bar.y[1]    s\n"
            "flag        True\n"
            "foo         1\n"
            "nothing     None\n"
            "t           Tensor(shape=[2, 3], dtype=float32)");
  EXPECT_EQ(NestedMap().DebugString(), "");
}

TEST(NestedMap, EraseAndFlatAccess) {
  NestedMap m{{"a", 1}, {"b", "two"}};
  EXPECT_EQ(m.size(), 2u);
  EXPECT_TRUE(m.contains("a"));
  m.erase("a");
  EXPECT_FALSE(m.contains("a"));
  EXPECT_THROW(m.erase("a"), NotFoundError);
  EXPECT_ERROR_MESSAGE(m.at("b").AsInt(), InvalidArgumentError,
                       "NestedMap value is a str, not a int");
}

}  // namespace
}  // namespace glossa
