// Sends messages into Quarry with the official RocketMQ 5 Node.js SDK and prints one JSON
// line per receipt. Usage: node send.js <router host:port> <topic> <count> [tag] [key-prefix]
// Env: RMQ_ACCESS_KEY / RMQ_SECRET_KEY sign the calls (ACL); RMQ_TLS=1 connects with TLS.
'use strict';
const { Producer } = require('rocketmq-client-nodejs');

// The SDK's default logger writes files under the home directory; the test reads stderr.
const quiet = { info() {}, debug() {}, warn: (...a) => console.error('WARN', ...a), error: (...a) => console.error('ERROR', ...a) };

async function main() {
  const [endpoints, topic, count = '1', tag = '', keyPrefix = 'node-key'] = process.argv.slice(2);
  const options = { endpoints, namespace: '', topics: [ topic ], requestTimeout: 5000, logger: quiet };
  if (process.env.RMQ_TLS) {
    options.sslEnabled = true;
  }
  if (process.env.RMQ_ACCESS_KEY) {
    options.sessionCredentials = { accessKey: process.env.RMQ_ACCESS_KEY, accessSecret: process.env.RMQ_SECRET_KEY };
  }
  const producer = new Producer(options);
  await producer.startup();
  try {
    for (let i = 0; i < Number(count); i++) {
      const keys = [ `${keyPrefix}-${i}` ];
      const receipt = await producer.send({
        topic, tag: tag || undefined, keys,
        body: Buffer.from(`hello from node ${i}`),
        properties: new Map([[ 'lang', 'nodejs' ]]),
      });
      console.log(JSON.stringify({ messageId: receipt.messageId, offset: Number(receipt.offset), keys, body: `hello from node ${i}` }));
    }
  } finally {
    await producer.shutdown();
  }
}

main().catch(err => {
  console.error(`send failed: ${err && err.stack || err}`);
  process.exit(1);
});
