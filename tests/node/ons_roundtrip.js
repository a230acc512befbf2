'use strict';
// ali-ons (RocketMQ 4 client, pure JavaScript) against Quarry's router as its NameServer:
// a producer sends the messages described in $ONS_MESSAGES (JSON [{body, tags, keys, uniqueKey}])
// to $ONS_TOPIC; a push consumer of $ONS_GROUP receives until it has seen every body, or
// $ONS_TIMEOUT_MS passes. One JSON line is printed: {sent: [...], received: [...]}.
const { Producer, Consumer, Message } = require('ali-ons');

const nameSrv = process.env.NAMESRV_ADDR;
const topic = process.env.ONS_TOPIC;
const group = process.env.ONS_GROUP;
const wanted = JSON.parse(process.env.ONS_MESSAGES);
const timeoutMs = Number(process.env.ONS_TIMEOUT_MS || 60000);
const credentials = process.env.ONS_ACCESS_KEY ? { accessKeyId: process.env.ONS_ACCESS_KEY, accessKeySecret: process.env.ONS_SECRET_KEY } : {};
// ali-ons asks for an HTTP client to look the NameServer up; with nameSrv given it is never used.
const httpclient = { request() { throw new Error('no NameServer lookup: nameSrv is given'); } };
const quiet = { info() {}, warn() {}, debug() {}, error: (...a) => process.stderr.write(a.join(' ') + '\n') };

async function main() {
  const errors = [];
  const producer = new Producer({ httpclient, nameSrv, producerGroup: group + '-producer', logger: quiet, ...credentials });
  producer.on('error', err => errors.push('producer: ' + err.message));
  await producer.ready();
  const sent = [];
  for (const m of wanted) {
    const msg = new Message(topic, m.tags, Buffer.from(m.body));
    msg.keys = m.keys;
    if (m.uniqueKey) msg.properties.UNIQ_KEY = m.uniqueKey;
    const r = await producer.send(msg);
    sent.push({ body: m.body, msgId: r.msgId, status: r.sendStatus, queueId: r.messageQueue.queueId, brokerName: r.messageQueue.brokerName, queueOffset: r.queueOffset });
  }

  const received = [];
  const seen = new Set();
  const consumer = new Consumer({
    httpclient, nameSrv, consumerGroup: group, logger: quiet, consumeFromWhere: 'CONSUME_FROM_FIRST_OFFSET',
    persistConsumerOffsetInterval: 1000, rebalanceInterval: 2000, ...credentials,
  });
  consumer.on('error', err => errors.push('consumer: ' + err.message));
  let done;
  const all = new Promise(resolve => { done = resolve; });
  consumer.subscribe(topic, '*', async msg => {
    const body = msg.body.toString();
    received.push({ body, msgId: msg.msgId, tags: msg.tags, keys: msg.keys, queueId: msg.queueId, queueOffset: msg.queueOffset });
    seen.add(body);
    // setImmediate: after this handler's promise settles the consumer records the offset (microtasks first).
    if (wanted.every(m => seen.has(m.body))) setImmediate(done);
  });
  await consumer.ready();
  const timer = setTimeout(done, timeoutMs);
  await all;
  clearTimeout(timer);
  // close() commits what was consumed and unregisters.
  await consumer.close();
  await producer.close();
  process.stdout.write(JSON.stringify({ sent, received, errors }) + '\n');
}

main().then(() => process.exit(0), err => { process.stderr.write(String(err && err.stack || err) + '\n'); process.exit(1); });
