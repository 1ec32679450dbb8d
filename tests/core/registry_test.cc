#include "glossa/core/registry.h"

#include <gtest/gtest.h>

#include "glossa/core/params.h"
#include "tests/test_util.h"

namespace glossa {
namespace {

class Animal {
 public:
  explicit Animal(const Params& p) : params_(p) {}
  virtual ~Animal() = default;
  virtual std::string Sound() const = 0;
  const Params& params() const { return params_; }

 private:
  Params params_;
};

class Mixin {
 public:
  virtual ~Mixin() = default;
  int mixin_field = 42;
};

// Multiple inheritance: Animal is not the first base, so the Animal* differs from the Dog*.
class Dog : public Mixin, public Animal {
 public:
  static glossa::Params Params() {
    auto p = InstantiableParams("glossa.testing.Dog");
    p.Define("name", "rex", "The dog's name.");
    return p;
  }
  explicit Dog(const glossa::Params& p) : Animal(p) {}
  std::string Sound() const override { return "woof from " + params().GetString("name"); }
};

class Rock {
 public:
  explicit Rock(const Params&) {}
  virtual ~Rock() = default;
};

GLOSSA_REGISTER_CLASS(Dog, "glossa.testing.Dog");
GLOSSA_REGISTER_CLASS(Rock, "glossa.testing.Rock");

TEST(ClassRegistry, InstantiateBuildsTheRegisteredClassFromACopy) {
  Params p = Dog::Params();
  p.Set("name", "fido");
  std::unique_ptr<Animal> a = p.Instantiate<Animal>();
  EXPECT_EQ(a->Sound(), "woof from fido");
  p.Set("name", "changed");
  EXPECT_EQ(a->Sound(), "woof from fido");  // the object holds its own copy
  std::unique_ptr<Mixin> m = p.Instantiate<Mixin>();
  EXPECT_EQ(m->mixin_field, 42);
}

TEST(ClassRegistry, InstantiateChecksTheBaseType) {
  Params p = InstantiableParams("glossa.testing.Rock");
  EXPECT_ERROR_MESSAGE(p.Instantiate<Animal>(), InvalidArgumentError,
                       "class 'glossa.testing.Rock' (glossa::(anonymous namespace)::Rock) does "
                       "not derive from glossa::(anonymous namespace)::Animal");
  EXPECT_NE(p.Instantiate<Rock>(), nullptr);
}

TEST(ClassRegistry, UnknownKeysListNearNames) {
  Params p = InstantiableParams("glossa.testing.Dgo");
  EXPECT_ERROR_CONTAINS(p.Instantiate<Animal>(), NotFoundError,
                        "unregistered class glossa.testing.Dgo");
  EXPECT_ERROR_CONTAINS(ClassRegistry::Get("glossa.testing.Dogg"), NotFoundError,
                        "did you mean: [glossa.testing.Dog]");
  EXPECT_ERROR_CONTAINS(ClassRegistry::Get("glossa.testing.Zebra"), NotFoundError, "(keys are [");
}

TEST(ClassRegistry, ParamsWithoutClsCannotBeInstantiated) {
  Params p;
  EXPECT_ERROR_CONTAINS(p.Instantiate<Animal>(), FailedPreconditionError, "has no 'cls'");
  p.Define("cls", nullptr, "");
  EXPECT_ERROR_CONTAINS(p.Instantiate<Animal>(), FailedPreconditionError, "NoneType");
}

TEST(ClassRegistry, KeysKeysOfAndKeyOf) {
  auto keys = ClassRegistry::Keys();
  EXPECT_TRUE(std::is_sorted(keys.begin(), keys.end()));
  EXPECT_TRUE(ClassRegistry::Contains("glossa.testing.Dog"));
  auto animals = ClassRegistry::KeysOf<Animal>();
  EXPECT_EQ(animals, (std::vector<std::string>{"glossa.testing.Dog"}));
  EXPECT_EQ(ClassRegistry::KeyOf<Rock>(), "glossa.testing.Rock");
  EXPECT_THROW(ClassRegistry::KeyOf<Mixin>(), NotFoundError);
  EXPECT_EQ(InstantiableParams<Rock>().ClsKey(), "glossa.testing.Rock");
  EXPECT_TRUE(ClassRegistry::Get("glossa.testing.Dog").default_params);
  EXPECT_FALSE(ClassRegistry::Get("glossa.testing.Rock").default_params);
  EXPECT_EQ(ClassRegistry::Get("glossa.testing.Dog").default_params().GetString("name"), "rex");
}

TEST(ClassRegistry, RejectsDuplicateAndMalformedKeys) {
  EXPECT_ERROR_CONTAINS(internal::RegisterClass<Rock>("glossa.testing.Dog"), InvalidArgumentError,
                        "already registered");
  EXPECT_ERROR_CONTAINS(internal::RegisterClass<Rock>("NoModule"), InvalidArgumentError,
                        "expected <module>.<Name>");
  EXPECT_THROW(internal::RegisterClass<Rock>("bad key.X"), InvalidArgumentError);
}

}  // namespace
}  // namespace glossa
