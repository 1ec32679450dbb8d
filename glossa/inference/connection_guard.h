// Connection limits for `glossa serve`. cpp-httplib gives a connection one thread from its first
// byte to its close, so slow or numerous clients could hold every thread ("slowloris": a header
// line every few seconds) while complete requests wait. The guard is the server's task queue:
//
// - every connection gets a thread of its own, up to `max_connections` in total and
//   `max_connections_per_client` per peer address; a connection beyond either is answered 503 and
//   closed at once;
// - a request's header must arrive within `header_timeout_secs` of the connection opening (or of
//   its previous answer), in total however slowly it drips, and its body within
//   `body_timeout_secs` of the header; a connection past either is closed;
// - `StopReading` ends a connection's request after its answer (an oversized chunked body is not
//   read to its end).
//
//   auto table = std::make_shared<ConnectionTable>(limits);
//   http.new_task_queue = [table, port] { return new ConnectionQueue(table, port); };
//   http.set_pre_routing_handler(... table->HeaderDone(req.remote_addr, req.remote_port) ...);
//   http.set_logger(... table->Answered(req.remote_addr, req.remote_port) ...);
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "glossa/inference/server.h"  // ConnectionLimits

namespace glossa {

class ConnectionTable {
 public:
  explicit ConnectionTable(ConnectionLimits limits);
  ~ConnectionTable();
  ConnectionTable(const ConnectionTable&) = delete;
  ConnectionTable& operator=(const ConnectionTable&) = delete;

  const ConnectionLimits& limits() const { return limits_; }
  // A request's header has arrived (cpp-httplib's pre-routing handler), its body has been read,
  // its answer written (the logger).
  void HeaderDone(const std::string& addr, int port);
  void BodyDone(const std::string& addr, int port);
  void Answered(const std::string& addr, int port);
  // Ends the connection after the answer to its current request: nothing more is read, and its
  // close lingers a moment so that the answer reaches the client before a reset.
  void StopReading(const std::string& addr, int port);

  int64_t open() const;
  int64_t refused_total() const { return refused_.load(); }
  int64_t timed_out_total() const { return timed_out_.load(); }

 private:
  friend class ConnectionQueue;
  struct Conn {
    int fd;
    uint64_t inode;
    std::string addr;
    bool in_request = false, body_done = false;
    bool linger = false;  // StopReading: close only after the answer had time to arrive
    std::chrono::steady_clock::time_point since;  // idle (waiting for a header) or in a request
  };
  // Registers the socket `fd`; false when a limit is reached (the caller refuses it).
  bool Add(int fd, uint64_t inode, const std::string& addr, std::string* why);
  // Whether the connection should linger before its last descriptor closes; then its removal.
  bool Lingers(uint64_t inode) const;
  void Remove(uint64_t inode);
  Conn* Find(const std::string& addr, int port);  // mu_ held
  void Watch();

  ConnectionLimits limits_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Conn> conns_;                 // by the socket's inode
  std::map<std::string, uint64_t> by_peer_;        // "addr:port" -> inode
  std::map<std::string, int64_t> per_addr_;
  std::atomic<int64_t> refused_{0}, timed_out_{0};
  bool stop_ = false;
  std::thread watcher_;
};

// Raises the listen backlog of this process's listening socket on `port` to SOMAXCONN. Debian's
// cpp-httplib listens with a backlog of 5: a burst of more clients connecting at once overflows
// it, and the kernel drops their handshakes, to be retried seconds (or, under load, a minute)
// later. Returns whether the socket was found.
bool WidenListenBacklog(int port);

// cpp-httplib's task queue over a ConnectionTable: a thread per admitted connection.
class ConnectionQueue : public httplib::TaskQueue {
 public:
  // `port`: the server's port (how the new connection's socket is recognized).
  ConnectionQueue(std::shared_ptr<ConnectionTable> table, int port);
  ~ConnectionQueue() override;
  void enqueue(std::function<void()> fn) override;
  void shutdown() override;

 private:
  std::shared_ptr<ConnectionTable> table_;
  int port_;
  std::mutex mu_;
  std::condition_variable cv_;
  int64_t running_ = 0;
};

}  // namespace glossa
