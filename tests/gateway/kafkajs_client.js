// kafkajs 2.2 through kcoord, for tests/gateway/test_kafkajs_kcat.py.
//   node kafkajs_client.js fetch-offsets BOOTSTRAP GROUP TOPIC   -> JSON of admin.fetchOffsets
//   node kafkajs_client.js consume BOOTSTRAP GROUP TOPIC COUNT    -> one JSON line per message, then exits
const { Kafka, logLevel } = require('kafkajs');

const [mode, bootstrap, groupId, topic, count] = process.argv.slice(2);
const kafka = new Kafka({ clientId: 'kafkajs-test', brokers: [bootstrap], logLevel: logLevel.ERROR,
                          retry: { retries: 10 } });

async function fetchOffsets() {
  const admin = kafka.admin();
  await admin.connect();
  const offsets = await admin.fetchOffsets({ groupId, topics: [topic] });
  console.log(JSON.stringify(offsets));
  await admin.disconnect();
}

async function consume() {
  const want = parseInt(count, 10);
  const consumer = kafka.consumer({ groupId, sessionTimeout: 10000, heartbeatInterval: 1000 });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  let seen = 0;
  await new Promise((resolve) => {
    consumer.run({
      eachMessage: async ({ partition, message }) => {
        console.log(JSON.stringify({ partition, offset: message.offset, value: message.value.toString() }));
        seen += 1;
        if (seen >= want) resolve();
      },
    });
  });
  await consumer.commitOffsets([]).catch(() => {});
  await consumer.disconnect();  // commits what was consumed, then LeaveGroup
}

(mode === 'fetch-offsets' ? fetchOffsets() : consume()).then(
  () => process.exit(0),
  (err) => { console.error(err); process.exit(1); });
