// ClassRegistry: registry key -> factory, for classes configured by Params (Lingvo's `cls`). A key
// is a dotted "<module>.<Name>", e.g. "glossa.layers.FeedForward". Any class constructible from
// `const Params&` can be registered; lookups can be restricted to the classes deriving from a base.
//
//   GLOSSA_REGISTER_CLASS(MyLayer, "my.layers.MyLayer");
//   Params p = InstantiableParams<MyLayer>();          // p.cls = type/my.layers/MyLayer
//   std::unique_ptr<BaseLayer> l = p.Instantiate<BaseLayer>();
#pragma once

#include <concepts>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeindex>
#include <typeinfo>
#include <vector>

namespace glossa {

class Params;

class ClassRegistry {
 public:
  struct Entry {
    std::string key;
    std::type_index type = typeid(void);
    std::string type_name;                     // demangled C++ name, for messages
    std::function<void*(const Params&)> make;  // returns `new T(params)`
    void (*destroy)(void*) = nullptr;          // deletes a T made by `make`
    void (*throw_pointer)(void*) = nullptr;    // throws static_cast<T*>(ptr): converts to bases
    std::function<Params()> default_params;    // T::Params() when T declares one
  };

  // InvalidArgument for a malformed key or a key registered twice.
  static void Register(Entry entry);
  // NotFound listing near names for an unknown key.
  static const Entry& Get(std::string_view key);
  static bool Contains(std::string_view key);
  // All keys, sorted.
  static std::vector<std::string> Keys();
  // Keys of the registered classes that derive from Base, sorted.
  template <typename Base>
  static std::vector<std::string> KeysOf() {
    std::vector<std::string> out;
    for (const auto& key : Keys()) {
      if (DerivesFrom<Base>(Get(key))) out.push_back(key);
    }
    return out;
  }
  // The key T was registered under; NotFound when T is not registered.
  template <typename T>
  static std::string KeyOf() {
    return KeyOfType(typeid(T));
  }
  static std::string KeyOfType(const std::type_index& type);

  template <typename Base>
  static bool DerivesFrom(const Entry& entry) {
    try {
      entry.throw_pointer(nullptr);
    } catch (Base*) {
      return true;
    } catch (...) {
      return false;
    }
    return false;
  }

  template <typename Base>
  static std::unique_ptr<Base> Create(std::string_view key, const Params& params) {
    static_assert(std::has_virtual_destructor_v<Base>, "Base must have a virtual destructor");
    const Entry& entry = Get(key);
    if (!DerivesFrom<Base>(entry)) NotDerivedError(entry, typeid(Base));
    void* raw = entry.make(params);
    // Converting through a thrown pointer applies the (possibly non-trivial) derived-to-base
    // adjustment without this code knowing the derived type.
    try {
      entry.throw_pointer(raw);
    } catch (Base* base) {
      return std::unique_ptr<Base>(base);
    } catch (...) {
      entry.destroy(raw);
      throw;
    }
    entry.destroy(raw);
    NotDerivedError(entry, typeid(Base));
  }

 private:
  [[noreturn]] static void NotDerivedError(const Entry& entry, const std::type_info& base);
};

std::string Demangle(const char* mangled_name);

namespace internal {

template <typename T>
bool RegisterClass(std::string_view key) {
  static_assert(std::is_constructible_v<T, const Params&>,
                "registered classes must be constructible from const Params&");
  ClassRegistry::Entry entry;
  entry.key = std::string(key);
  entry.type = typeid(T);
  entry.type_name = Demangle(typeid(T).name());
  entry.make = [](const Params& p) -> void* {
    T* object = new T(p);
    // Lets a class close its construction phase (BaseLayer stops accepting new variables).
    if constexpr (requires(T & t) { t.FinishConstruction(); }) object->FinishConstruction();
    return object;
  };
  entry.destroy = [](void* ptr) { delete static_cast<T*>(ptr); };
  entry.throw_pointer = [](void* ptr) { throw static_cast<T*>(ptr); };
  if constexpr (requires { T::Params(); }) {
    entry.default_params = [] { return T::Params(); };
  }
  ClassRegistry::Register(std::move(entry));
  return true;
}

}  // namespace internal
}  // namespace glossa

#define GLOSSA_REGISTRY_CONCAT_INNER(a, b) a##b
#define GLOSSA_REGISTRY_CONCAT(a, b) GLOSSA_REGISTRY_CONCAT_INNER(a, b)
// Registers `Class` under the registry key `key` at static-initialization time.
#define GLOSSA_REGISTER_CLASS(Class, key)                                                      \
  [[maybe_unused]] static const bool GLOSSA_REGISTRY_CONCAT(glossa_registered_, __COUNTER__) = \
      ::glossa::internal::RegisterClass<Class>(key)
