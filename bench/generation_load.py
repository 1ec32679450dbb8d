"""Concurrent generation clients against `glossa serve` (bench/continuous_batching.sh).

--clients threads each send --requests generate:run requests in turn: a prompt of the first 6
words of an Austen Dev line, max_new_tokens from 8 to 64 (varying per request), its own seed.
Prints requests/s, generated tokens/s and the p50 / p99 latency in ms.
"""
import argparse
import http.client
import json
import threading
import time


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--dev", default="data/austen/dev.txt")
    a = ap.parse_args()
    prompts = []
    with open(a.dev, encoding="utf-8") as f:
        for line in f:
            words = line.split()
            if words:
                prompts.append(" ".join(words[:6]))
            if len(prompts) >= 400:
                break
    latencies, tokens = [], [0]
    lock = threading.Lock()

    def client(c):
        conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=600)
        for r in range(a.requests):
            i = c * a.requests + r
            body = {"feeds": {"prompt": [prompts[i % len(prompts)]],
                              "max_new_tokens": 8 + (i * 7) % 57, "seed": i,
                              "temperature": 1.0}}
            t0 = time.perf_counter()
            conn.request("POST", "/v1/subgraphs/generate:run", json.dumps(body),
                         {"Content-Type": "application/json"})
            resp = conn.getresponse()
            answer = json.loads(resp.read())
            if resp.status != 200:
                raise SystemExit("HTTP %d: %s" % (resp.status, answer))
            with lock:
                latencies.append(time.perf_counter() - t0)
                tokens[0] += answer["fetches"]["lengths"][0]

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(a.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    latencies.sort()
    n = len(latencies)
    print("requests_per_sec %.1f tokens_per_sec %.0f p50_ms %.1f p99_ms %.1f"
          % (n / seconds, tokens[0] / seconds, latencies[n // 2] * 1e3,
             latencies[min(n - 1, int(n * 0.99))] * 1e3))


if __name__ == "__main__":
    main()
