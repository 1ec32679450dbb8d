#include "glossa/layers/channel.h"

#include <ATen/ATen.h>

#include "glossa/base/errors.h"
#include "glossa/base/strings.h"
#include "glossa/layers/weight_init.h"

namespace glossa {
Channel::Channel(std::string name, at::ScalarType dtype, std::vector<int64_t> shape,
                 std::string sender, std::string receiver, std::optional<at::Device> device)
    : name_(std::move(name)),
      dtype_(dtype),
      shape_(std::move(shape)),
      sender_(std::move(sender)),
      receiver_(std::move(receiver)),
      device_(device) {}

void Channel::Send(const at::Tensor& t) {
  if (!t.defined() || t.scalar_type() != dtype_ || !t.sizes().equals(shape_)) {
    throw InvalidArgumentError(
        StrCat("channel '", name_, "' (", sender_, " -> ", receiver_, ") carries ",
               c10::toString(dtype_), ShapeString(shape_), ", got ",
               t.defined() ? StrCat(c10::toString(t.scalar_type()), ShapeString(t.sizes().vec()))
                           : "an undefined tensor"));
  }
  at::Tensor value = device_ ? t.to(*device_, /*non_blocking=*/false) : t;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) throw AbortedError(StrCat("channel '", name_, "' is closed: ", *closed_));
    queue_.push_back(std::move(value));
  }
  cv_.notify_all();
}

at::Tensor Channel::Recv() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !queue_.empty() || closed_; });
  if (queue_.empty()) throw AbortedError(StrCat("channel '", name_, "' is closed: ", *closed_));
  at::Tensor t = std::move(queue_.front());
  queue_.pop_front();
  return t;
}

void Channel::Close(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!closed_) closed_ = reason;
  }
  cv_.notify_all();
}

}  // namespace glossa
