// Box<T>: a heap-allocated value with value semantics (copying a Box copies the T). Lets recursive
// value types (a Params holding Params, a NestedMap holding NestedMaps) live inside std::variant.
//
//   Box<Params> b(p);  Box<Params> c = b;  // c holds its own deep copy
//   c->Set("x", 1);                         // b is unchanged
#pragma once

#include <memory>
#include <utility>

namespace glossa {

template <typename T>
class Box {
 public:
  Box() : ptr_(std::make_unique<T>()) {}
  Box(const T& value) : ptr_(std::make_unique<T>(value)) {}        // NOLINT: implicit by design
  Box(T&& value) : ptr_(std::make_unique<T>(std::move(value))) {}  // NOLINT
  Box(const Box& other) : ptr_(other.ptr_ ? std::make_unique<T>(*other) : nullptr) {}
  Box(Box&& other) noexcept = default;
  Box& operator=(const Box& other) {
    if (this != &other) ptr_ = other.ptr_ ? std::make_unique<T>(*other) : nullptr;
    return *this;
  }
  Box& operator=(Box&& other) noexcept = default;
  ~Box() = default;

  T& operator*() { return *ptr_; }
  const T& operator*() const { return *ptr_; }
  T* operator->() { return ptr_.get(); }
  const T* operator->() const { return ptr_.get(); }

  bool operator==(const Box& other) const { return *ptr_ == *other.ptr_; }

 private:
  std::unique_ptr<T> ptr_;
};

}  // namespace glossa
