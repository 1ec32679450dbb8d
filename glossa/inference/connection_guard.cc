#include "glossa/inference/connection_guard.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>
#include <glog/logging.h>

#include <cstdlib>
#include <cstring>
#include <vector>

#include "glossa/base/strings.h"
#include "glossa/base/thread_state.h"

namespace glossa {
namespace {

using Clock = std::chrono::steady_clock;

std::string PeerKey(const std::string& addr, int port) { return StrCat(addr, ":", port); }

// The numeric host and port of a socket's peer (as cpp-httplib's req.remote_addr/remote_port).
bool PeerOf(int fd, std::string* addr, int* port) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return false;
  char host[NI_MAXHOST], serv[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof(host), serv, sizeof(serv),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return false;
  }
  *addr = host;
  *port = std::atoi(serv);
  return true;
}

int LocalPort(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return -1;
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return -1;
}

uint64_t InodeOf(int fd) {
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return 0;
  return static_cast<uint64_t>(st.st_ino);
}

// Writes a whole small answer without blocking for long (the socket may belong to a slow client).
void SendAll(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

}  // namespace

ConnectionTable::ConnectionTable(ConnectionLimits limits) : limits_(limits) {
  watcher_ = StartThread(ThreadState::Fresh(), [this] { Watch(); });
}

ConnectionTable::~ConnectionTable() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  watcher_.join();
}

bool ConnectionTable::Add(int fd, uint64_t inode, const std::string& addr, std::string* why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (static_cast<int64_t>(conns_.size()) >= limits_.max_connections) {
    *why = StrCat("the server holds ", conns_.size(), " connections (--max_connections)");
    return false;
  }
  int64_t& mine = per_addr_[addr];
  if (mine >= limits_.max_connections_per_client) {
    *why = StrCat("client ", addr, " holds ", mine,
                  " connections (--max_connections_per_client)");
    if (mine == 0) per_addr_.erase(addr);
    return false;
  }
  ++mine;
  Conn c{fd, inode, addr, false, false, false, Clock::now()};
  conns_.emplace(inode, c);
  int port = 0;
  std::string peer;
  if (PeerOf(fd, &peer, &port)) by_peer_[PeerKey(peer, port)] = inode;
  return true;
}

bool ConnectionTable::Lingers(uint64_t inode) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = conns_.find(inode);
  return it != conns_.end() && it->second.linger;
}

void ConnectionTable::Remove(uint64_t inode) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = conns_.find(inode);
  if (it == conns_.end()) return;
  for (auto p = by_peer_.begin(); p != by_peer_.end(); ++p) {
    if (p->second == inode) {
      by_peer_.erase(p);
      break;
    }
  }
  if (--per_addr_[it->second.addr] <= 0) per_addr_.erase(it->second.addr);
  conns_.erase(it);
}

ConnectionTable::Conn* ConnectionTable::Find(const std::string& addr, int port) {
  auto p = by_peer_.find(PeerKey(addr, port));
  if (p == by_peer_.end()) return nullptr;
  auto c = conns_.find(p->second);
  return c == conns_.end() ? nullptr : &c->second;
}

void ConnectionTable::HeaderDone(const std::string& addr, int port) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Conn* c = Find(addr, port)) {
    c->in_request = true;
    c->body_done = false;
    c->since = Clock::now();
  }
}

void ConnectionTable::BodyDone(const std::string& addr, int port) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Conn* c = Find(addr, port)) c->body_done = true;
}

void ConnectionTable::Answered(const std::string& addr, int port) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Conn* c = Find(addr, port)) {
    c->in_request = false;
    c->since = Clock::now();
    // The answer is out: a stopped connection reads end-of-stream next, and closes.
    if (c->linger && InodeOf(c->fd) == c->inode) ::shutdown(c->fd, SHUT_RD);
  }
}

void ConnectionTable::StopReading(const std::string& addr, int port) {
  std::lock_guard<std::mutex> lock(mu_);
  // Not yet: cpp-httplib writes an answer only to a socket it can still read from.
  if (Conn* c = Find(addr, port)) c->linger = true;
}

int64_t ConnectionTable::open() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(conns_.size());
}

void ConnectionTable::Watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(200));
    const auto now = Clock::now();
    for (auto& [inode, c] : conns_) {
      const double secs = std::chrono::duration<double>(now - c.since).count();
      const bool late = c.in_request ? (!c.body_done && secs > limits_.body_timeout_secs)
                                     : secs > limits_.header_timeout_secs;
      // The inode check: the descriptor still is this connection's socket.
      if (late && InodeOf(c.fd) == inode) {
        ::shutdown(c.fd, SHUT_RDWR);
        c.since = now + std::chrono::hours(24);  // once
        ++timed_out_;
      }
    }
  }
}

bool WidenListenBacklog(int port) {
  bool found = false;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(dir)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      const int fd = std::atoi(e->d_name);
      int listening = 0;
      socklen_t len = sizeof(listening);
      if (InodeOf(fd) == 0 || LocalPort(fd) != port ||
          getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) {
        continue;
      }
      found = ::listen(fd, SOMAXCONN) == 0 || found;
    }
    closedir(dir);
  }
  return found;
}

ConnectionQueue::ConnectionQueue(std::shared_ptr<ConnectionTable> table, int port)
    : table_(std::move(table)), port_(port) {}

ConnectionQueue::~ConnectionQueue() { shutdown(); }

void ConnectionQueue::enqueue(std::function<void()> fn) {
  // cpp-httplib calls this right after accept(): the new connection is the connected socket on
  // the server's port that no connection of the table holds yet, and of those the newest (sockets'
  // inode numbers increase as they are created).
  int fd = -1;
  uint64_t inode = 0;
  std::string addr;
  if (DIR* dir = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(dir)) {
      if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
      const int candidate = std::atoi(e->d_name);
      const uint64_t ino = InodeOf(candidate);
      if (ino == 0 || ino <= inode || LocalPort(candidate) != port_) continue;
      int peer_port = 0;
      std::string peer;
      if (!PeerOf(candidate, &peer, &peer_port)) continue;  // the listening socket
      {
        std::lock_guard<std::mutex> lock(table_->mu_);
        if (table_->conns_.count(ino)) continue;
      }
      fd = candidate;
      inode = ino;
      addr = peer;
    }
    closedir(dir);
  }
  if (fd < 0) LOG(WARNING) << "serve: a new connection was not found among this process's sockets";
  std::string why;
  if (fd >= 0 && !table_->Add(fd, inode, addr, &why)) {
    ++table_->refused_;
    const std::string body = StrCat("{\"error\":{\"code\":\"UNAVAILABLE\",\"message\":\"", why,
                                    "; retry later\"}}");
    SendAll(fd, StrCat("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                       "Connection: close\r\nContent-Length: ", body.size(), "\r\n\r\n", body));
    ::shutdown(fd, SHUT_RDWR);
    fn();  // sees the closed stream at once, and closes the socket
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++running_;
  }
  // A second descriptor of the socket, so that a connection whose reading was stopped (its unread
  // bytes would make the close a reset that can destroy the answer in flight) closes a moment
  // after cpp-httplib is done with it, as web servers' lingering close does.
  const int keep = fd >= 0 ? ::dup(fd) : -1;
  StartThread(ThreadState::Fresh(), [this, fn = std::move(fn), inode, keep]() {
    fn();
    if (inode != 0 && table_->Lingers(inode)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1000));
    }
    // Closed before it leaves the table: enqueue must never take this socket for a new one.
    if (keep >= 0) ::close(keep);
    if (inode != 0) table_->Remove(inode);
    std::lock_guard<std::mutex> lock(mu_);
    --running_;
    cv_.notify_all();
  }).detach();
}

void ConnectionQueue::shutdown() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return running_ == 0; });
}

}  // namespace glossa
