'use strict';
// Send rate of the ali-ons producer (used by `python -m bench remoting`): $ONS_COUNT messages of
// $ONS_BODY_BYTES to $ONS_TOPIC, one at a time (each send awaited). Prints {messages, seconds}.
const { Producer, Message } = require('ali-ons');

const httpclient = { request() { throw new Error('no NameServer lookup: nameSrv is given'); } };
const quiet = { info() {}, warn() {}, debug() {}, error: (...a) => process.stderr.write(a.join(' ') + '\n') };

async function main() {
  const producer = new Producer({ httpclient, nameSrv: process.env.NAMESRV_ADDR, producerGroup: 'bench-producer', logger: quiet });
  await producer.ready();
  const topic = process.env.ONS_TOPIC;
  const body = Buffer.alloc(Number(process.env.ONS_BODY_BYTES || 1024), 'x');
  const count = Number(process.env.ONS_COUNT || 2000);
  for (let i = 0; i < 100; i++) await producer.send(new Message(topic, 'TagA', body)); // warm-up: routes, connections
  const t0 = process.hrtime.bigint();
  for (let i = 0; i < count; i++) {
    const msg = new Message(topic, 'TagA', body);
    msg.keys = [`order-${i}`];
    const r = await producer.send(msg);
    if (r.sendStatus !== 'SEND_OK') throw new Error('send ' + i + ': ' + r.sendStatus);
  }
  const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
  await producer.close();
  process.stdout.write(JSON.stringify({ messages: count, seconds }) + '\n');
}

main().then(() => process.exit(0), err => { process.stderr.write(String(err && err.stack || err) + '\n'); process.exit(1); });
