// The official RocketMQ 5 Node.js SDK's producers, driven by `bench rmq5` as bench/sdk_driver.py
// drives the Python SDK's: same JSON lines, one producer per target (`quarry`: the router's
// access point; `echo`: bench/rmq5_echo.py), a process of their own.
//   argv: <quarry host:port> <echo host:port>; run with cwd tests/e2e/node (`make node-sdk`).
//   stdin  {"op": "window", "target": T, "n": N, "c": C}  ->  stdout {"rate": sends/s, "lat_ms": [...]}
'use strict';
const { createRequire } = require('module');
const path = require('path');
const readline = require('readline');

const { Producer } = createRequire(path.join(process.cwd(), 'package.json'))('rocketmq-client-nodejs');
const TOPIC = 'BenchRmq5'; // bench/sdk_driver.py's topic, body, tag and keys
const BODY = Buffer.alloc(1024, 'x');
const WARMUP = 2000; // sends per producer before "ready": V8 compiles the send path hot only after a few thousand
// The SDK's default logger writes files under the home directory.
const logger = { info() {}, debug() {}, warn() {}, error: (...a) => console.error('ERROR', ...a) };

function message(i) {
  return { topic: TOPIC, tag: 'bench', keys: [ `order-${i}` ], body: BODY };
}

// {rate: sends/s, lat_ms: [each send's latency]} of n sends with `c` in flight: each answer
// starts the next send.
function window(producer, n, c) {
  if (!(n >= 1 && c >= 1)) return Promise.reject(new Error(`n and c: must be >= 1, got ${n} and ${c}`));
  let next = 0;
  let done = 0;
  let failed = false;
  const lat = [];
  const t0 = process.hrtime.bigint();
  return new Promise((resolve, reject) => {
    const fail = err => {
      failed = true; // no new sends: the driver is ending
      reject(err);
    };
    const one = () => {
      const i = next++;
      const started = process.hrtime.bigint();
      producer.send(message(i)).then(() => {
        lat.push(Number(process.hrtime.bigint() - started) / 1e6);
        if (++done === n) {
          resolve({ rate: n / (Number(process.hrtime.bigint() - t0) / 1e9), lat_ms: lat });
        } else if (next < n && !failed) {
          one();
        }
      }, fail);
    };
    for (let k = 0; k < Math.min(c, n); k++) one();
  });
}

async function main() {
  const [ quarry, echo ] = process.argv.slice(2);
  const producers = {};
  for (const [ name, endpoints ] of [[ 'quarry', quarry ], [ 'echo', echo ]]) {
    producers[name] = new Producer({ endpoints, namespace: '', topics: [ TOPIC ], requestTimeout: 10000, logger });
    await producers[name].startup();
  }
  try {
    for (const p of Object.values(producers)) {
      await window(p, WARMUP, 16);
    }
    console.log(JSON.stringify({ ready: true }));
    for await (const line of readline.createInterface({ input: process.stdin })) {
      const cmd = JSON.parse(line);
      if (cmd.op !== 'window') throw new Error(`op: only "window" is supported, got ${cmd.op}`);
      console.log(JSON.stringify(await window(producers[cmd.target], cmd.n, cmd.c)));
    }
  } finally {
    for (const p of Object.values(producers)) await p.shutdown();
  }
}

main().then(() => process.exit(0), err => {
  console.error(`node SDK driver failed: ${err && err.stack || err}`);
  process.exit(1);
});
