// Receives and acks messages from Quarry with the official RocketMQ 5 Node.js SDK's
// SimpleConsumer and prints one JSON line per message.
// Usage: node receive.js <router host:port> <topic> <group> <count> [tag expression]
'use strict';
const { SimpleConsumer } = require('rocketmq-client-nodejs');

const quiet = { info() {}, debug() {}, warn: (...a) => console.error('WARN', ...a), error: (...a) => console.error('ERROR', ...a) };

async function main() {
  const [endpoints, topic, group, count = '1', expression = '*'] = process.argv.slice(2);
  const consumer = new SimpleConsumer({
    endpoints, namespace: '', consumerGroup: group, subscriptions: new Map([[ topic, expression ]]),
    awaitDuration: 2000, requestTimeout: 5000, logger: quiet,
  });
  await consumer.startup();
  const deadline = Date.now() + 60000;
  let got = 0;
  try {
    while (got < Number(count) && Date.now() < deadline) {
      for (const m of await consumer.receive(16, 30000)) {
        await consumer.ack(m);
        got++;
        console.log(JSON.stringify({ messageId: m.messageId, body: m.body.toString(), tag: m.tag || '', corrupted: Boolean(m.corrupted),
                                     deliveryAttempt: m.deliveryAttempt }));
      }
    }
  } finally {
    await consumer.shutdown();
  }
}

main().catch(err => {
  console.error(`receive failed: ${err && err.stack || err}`);
  process.exit(1);
});
