// Channel: a point-to-point, in-order tensor channel between two pipeline stages (threads, or
// devices when there are several). Each use is one Send by the sender and one Recv by the
// receiver; every tensor sent must have the channel's dtype and shape. Close(error) makes pending
// and later Recv calls throw, so a failing stage never leaves its neighbours waiting.
//
//   Channel ch("stage0->stage1", at::kFloat, {4, 16, 8}, "stage0", "stage1");
//   ch.Send(y);                 // on stage 0's thread
//   at::Tensor x = ch.Recv();   // on stage 1's thread, in send order
#pragma once

#include <ATen/core/Tensor.h>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace glossa {

class Channel {
 public:
  // `device`: where Recv hands tensors over (the receiver's device); none keeps the sender's.
  Channel(std::string name, at::ScalarType dtype, std::vector<int64_t> shape, std::string sender,
          std::string receiver, std::optional<at::Device> device = std::nullopt);
  Channel(const Channel&) = delete;
  Channel& operator=(const Channel&) = delete;

  // InvalidArgument naming the channel on a dtype or shape mismatch; Aborted when closed.
  void Send(const at::Tensor& t);
  // Blocks until a tensor is available; Aborted (with the close reason) once closed.
  at::Tensor Recv();
  void Close(const std::string& reason);

  const std::string& name() const { return name_; }
  const std::string& sender() const { return sender_; }
  const std::string& receiver() const { return receiver_; }
  at::ScalarType dtype() const { return dtype_; }
  const std::vector<int64_t>& shape() const { return shape_; }

 private:
  std::string name_;
  at::ScalarType dtype_;
  std::vector<int64_t> shape_;
  std::string sender_, receiver_;
  std::optional<at::Device> device_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<at::Tensor> queue_;
  std::optional<std::string> closed_;
};

}  // namespace glossa
