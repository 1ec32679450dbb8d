#!/usr/bin/env node
// Runs an ONNX model with ONNX Runtime's CPU build (onnxruntime-node) on feeds from a JSON file and
// prints the outputs and the run times as JSON: the peer of Glossa's inference benchmarks and the
// check of `glossa export --onnx` (tests/inference/bundle_test.cc).
//
//   node bench/onnx/ort_run.js --model bundle/onnx/lm_score.onnx --feeds feeds.json \
//       --threads 1 --repeat 20 --warmup 3 [--no_outputs]
//
// feeds.json: {"<input>": {"type": "int64" | "float32", "dims": [..], "data": [..]}, ...}; a
// .jsonl file holds one such object per line (a benchmark's batches): a timed run is then one
// pass over all of them, in order.
// Prints {"outputs": {"<name>": {"dims": [..], "data": [..]}} (of the last feed set),
// "ms": [each timed run], "median_ms": m, "ort_version": v}. Errors go to stderr with exit status
// 1 or 2 (usage).
'use strict';
const fs = require('fs');

function usage(msg) {
  process.stderr.write(`ort_run.js: ${msg}\nusage: node ort_run.js --model M.onnx --feeds F.json ` +
                       `[--threads N] [--repeat R] [--warmup W] [--no_outputs]\n`);
  process.exit(2);
}

function parseArgs(argv) {
  const a = {threads: 1, repeat: 1, warmup: 0, outputs: true};
  for (let i = 0; i < argv.length; ++i) {
    const k = argv[i];
    const next = () => {
      if (i + 1 >= argv.length) usage(`${k} needs a value`);
      return argv[++i];
    };
    const int = (v) => {
      if (!/^[0-9]+$/.test(v)) usage(`${k} must be a non-negative integer, got '${v}'`);
      return parseInt(v, 10);
    };
    if (k === '--model') a.model = next();
    else if (k === '--feeds') a.feeds = next();
    else if (k === '--threads') a.threads = int(next());
    else if (k === '--repeat') a.repeat = int(next());
    else if (k === '--warmup') a.warmup = int(next());
    else if (k === '--no_outputs') a.outputs = false;
    else usage(`unknown argument '${k}'`);
  }
  if (!a.model || !a.feeds) usage('--model and --feeds are required');
  if (a.threads < 1 || a.repeat < 1) usage('--threads and --repeat must be at least 1');
  return a;
}

function tensorOf(ort, name, f) {
  const n = f.dims.reduce((x, y) => x * y, 1);
  if (!Array.isArray(f.data) || f.data.length !== n) {
    throw new Error(`feed '${name}': ${f.data && f.data.length} values for dims [${f.dims}]`);
  }
  if (f.type === 'int64') return new ort.Tensor('int64', BigInt64Array.from(f.data.map(BigInt)), f.dims);
  if (f.type === 'float32') return new ort.Tensor('float32', Float32Array.from(f.data), f.dims);
  throw new Error(`feed '${name}': type '${f.type}' (int64 or float32)`);
}

// A reader that stops early (`| head`) is not an error of this script.
process.stdout.on('error', (e) => process.exit(e.code === 'EPIPE' ? 0 : 1));

async function main() {
  const a = parseArgs(process.argv.slice(2));
  let ort;
  try {
    ort = require('onnxruntime-node');
  } catch (e) {
    throw new Error(`onnxruntime-node is not installed next to ${__filename} (run scripts/setup.sh): ${e.message}`);
  }
  const text = fs.readFileSync(a.feeds, 'utf8');
  const specs = a.feeds.endsWith('.jsonl')
    ? text.split('\n').filter((l) => l.trim() !== '').map((l, i) => {
      try {
        return JSON.parse(l);
      } catch (e) {
        throw new Error(`${a.feeds}:${i + 1}: ${e.message}`);
      }
    })
    : [(() => {
      try {
        return JSON.parse(text);
      } catch (e) {
        throw new Error(`${a.feeds}: ${e.message}`);
      }
    })()];
  if (specs.length === 0) throw new Error(`${a.feeds}: no feeds`);
  const feedSets = specs.map((spec) => {
    const feeds = {};
    for (const [name, f] of Object.entries(spec)) feeds[name] = tensorOf(ort, name, f);
    return feeds;
  });
  const session = await ort.InferenceSession.create(a.model, {
    intraOpNumThreads: a.threads, interOpNumThreads: 1, executionMode: 'sequential',
    graphOptimizationLevel: 'all'});
  let out;
  for (let i = 0; i < a.warmup; ++i) {
    for (const feeds of feedSets) out = await session.run(feeds);
  }
  const ms = [];
  for (let i = 0; i < a.repeat; ++i) {
    const t0 = process.hrtime.bigint();
    for (const feeds of feedSets) out = await session.run(feeds);
    ms.push(Number(process.hrtime.bigint() - t0) / 1e6);
  }
  const sorted = [...ms].sort((x, y) => x - y);
  const result = {ms, median_ms: sorted[Math.floor(sorted.length / 2)],
                  ort_version: require('onnxruntime-node/package.json').version, outputs: {}};
  if (a.outputs) {
    for (const [name, t] of Object.entries(out)) {
      result.outputs[name] = {dims: t.dims.map(Number),
                              data: Array.from(t.data, (v) => (typeof v === 'bigint' ? Number(v) : v))};
    }
  }
  process.stdout.write(JSON.stringify(result) + '\n');
}

main().catch((e) => {
  process.stderr.write(`ort_run.js: ${e.message || e}\n`);
  process.exit(1);
});
