// A load generator for `glossa serve`: --clients threads, each with its own keep-alive HTTP
// connection (cpp-httplib), send --requests scoring requests in all (one sentence each, cycling
// through --sentences_file) to 127.0.0.1:--port as fast as answers come back. Prints requests/s,
// p50 and p99 latency, and exits 1 when any answer is not 200. Run by serve_throughput.sh.
//   bench_serve_load --port=8080 --clients=16 --requests=800 --sentences_file=s.txt
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

int main(int argc, char** argv) {
  std::map<std::string, std::string> f = {
      {"port", "0"}, {"clients", "1"}, {"requests", "200"}, {"sentences_file", ""}};
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto eq = a.find('=');
    const std::string k = a.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    if (a.rfind("--", 0) != 0 || !f.count(k) || eq == std::string::npos) {
      std::fprintf(stderr, "bad flag %s (flags: --port --clients --requests --sentences_file)\n",
                   a.c_str());
      return 2;
    }
    f[k] = a.substr(eq + 1);
  }
  const int port = std::stoi(f["port"]), clients = std::stoi(f["clients"]);
  const int requests = std::stoi(f["requests"]);
  std::vector<std::string> bodies;
  std::ifstream in(f["sentences_file"]);
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) bodies.push_back(nlohmann::json({{"feeds", {{"text", {line}}}}}).dump());
  }
  if (bodies.empty()) {
    std::fprintf(stderr, "no sentences in '%s'\n", f["sentences_file"].c_str());
    return 2;
  }
  std::atomic<int> next{0}, failures{0};
  std::vector<double> latencies(requests);
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&] {
      httplib::Client cli("127.0.0.1", port);
      cli.set_keep_alive(true);
      cli.set_tcp_nodelay(true);
      cli.set_read_timeout(300);
      for (int i = next++; i < requests; i = next++) {
        const auto t0 = std::chrono::steady_clock::now();
        auto res = cli.Post("/v1/subgraphs/default:run", bodies[i % bodies.size()],
                            "application/json");
        latencies[i] =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (!res || res->status != 200) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::sort(latencies.begin(), latencies.end());
  auto pct = [&](double p) {
    return latencies[std::min<size_t>(latencies.size() - 1,
                                      static_cast<size_t>(p * static_cast<double>(requests)))];
  };
  std::printf("requests_per_sec %.1f p50_ms %.2f p99_ms %.2f failures %d\n", requests / seconds,
              1e3 * pct(0.5), 1e3 * pct(0.99), failures.load());
  return failures.load() == 0 ? 0 : 1;
}
