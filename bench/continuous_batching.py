"""A short generation sent while a long one runs on `glossa serve` (bench/continuous_batching.sh).

One client streams a long generation (generate:stream, max_new_tokens 512 for each of --rows
prompts); once it has drawn --after tokens, a second client sends a short one (max_new_tokens 8)
and times its first token: with continuous batching through generate:stream (the first token
event), without it (the server's --no_continuous_batching) through generate:run (the answer is its
first token). Prints the short one's first-token time in ms and in steps of the long one (its
measured time per step), the steps the short one waited to join, and the long one's steps.
"""
import argparse
import http.client
import json
import threading
import time


def events(port, path, body):
    """Yields (name, data) of each server-sent event as it arrives."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise SystemExit("%s: HTTP %d %s" % (path, resp.status, resp.read()[:300]))
    name = None
    for raw in resp:
        line = raw.decode("utf-8", "replace").rstrip("\n")
        if line.startswith("event: "):
            name = line[7:]
        elif line.startswith("data: "):
            yield name, json.loads(line[6:])
            if name in ("done", "error"):
                break
    conn.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--continuous", type=int, default=1)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--after", type=int, default=40)
    a = ap.parse_args()
    long_body = {"feeds": {"prompt": ["Elizabeth"] * a.rows, "max_new_tokens": 512, "seed": 3,
                           "temperature": 1.0}}
    short_body = {"feeds": {"prompt": ["It is a truth universally acknowledged"],
                            "max_new_tokens": 8, "seed": 1, "temperature": 1.0}}
    started = threading.Event()
    long_steps = {}  # step -> time it was received
    long_run = {}
    def run_long():
        if not a.continuous:  # no streams: the long one runs as one :run
            t0 = time.perf_counter()
            conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=600)
            conn.request("POST", "/v1/subgraphs/generate:run", json.dumps(long_body),
                         {"Content-Type": "application/json"})
            answer = json.loads(conn.getresponse().read())
            long_run["seconds"] = time.perf_counter() - t0
            long_run["steps"] = max(answer["fetches"]["lengths"]) + 1
            return
        n = 0
        for name, data in events(a.port, "/v1/subgraphs/generate:stream", long_body):
            if name == "token":
                long_steps.setdefault(data["step"], time.perf_counter())
                n += 1
                if n == a.after * a.rows:
                    started.set()
            elif name == "error":
                started.set()
                raise SystemExit("long: %s" % data)
        started.set()
    t = threading.Thread(target=run_long)
    t.start()
    if a.continuous:
        started.wait()
    else:  # the long one is running: in flight, nothing queued
        while True:
            m = http.client.HTTPConnection("127.0.0.1", a.port, timeout=60)
            m.request("GET", "/metrics")
            text = m.getresponse().read().decode()
            if ("glossa_serve_in_flight_requests 1\n" in text and
                    "glossa_serve_queue_depth 0\n" in text):
                break
    sent = time.perf_counter()
    queued = -1
    joined = -1
    if a.continuous:
        for name, data in events(a.port, "/v1/subgraphs/generate:stream", short_body):
            if name == "joined":
                queued = data["queued_steps"]
                joined = data["step"]
            if name == "token":
                first = time.perf_counter() - sent
                break
        # (the connection closes: the server drops the short one's rows at its next step)
    else:
        conn = http.client.HTTPConnection("127.0.0.1", a.port, timeout=600)
        conn.request("POST", "/v1/subgraphs/generate:run", json.dumps(short_body),
                     {"Content-Type": "application/json"})
        conn.getresponse().read()
        first = time.perf_counter() - sent
    t.join()
    if a.continuous:
        steps = sorted(long_steps)
        # The long one's time per step, over its steps (received times, first to last).
        n_steps = len(steps)
        per_step = ((long_steps[steps[-1]] - long_steps[steps[0]]) / max(1, steps[-1] - steps[0])
                    if n_steps > 1 else float("nan"))
        # The step the short one joined at, as the long one's stream saw it.
        join_step = (long_steps[joined] - long_steps[joined - 1]
                     if joined in long_steps and joined - 1 in long_steps else float("nan"))
    else:
        n_steps = long_run["steps"]
        per_step = long_run["seconds"] / n_steps
        join_step = float("nan")
    print("first_token_ms %.2f first_token_steps %.1f queued_steps %d long_steps %d step_ms %.3f "
          "join_step_ms %.3f" % (first * 1e3, first / per_step, queued, n_steps, per_step * 1e3,
                                 join_step * 1e3))


if __name__ == "__main__":
    main()
