// kafkajs 2.2's admin client against a kcoord cluster, for tests/integration/test_cluster_kafkajs_kcat.py.
//   node kafkajs_cluster.js admin BOOTSTRAP GROUP...   -> one JSON object: describeCluster, listGroups,
//                                                        fetchOffsets of each group, describeGroups
//   node kafkajs_cluster.js fetch BOOTSTRAP GROUP...   -> JSON: fetchOffsets of each group
//   node kafkajs_cluster.js delete BOOTSTRAP GROUP...  -> JSON of admin.deleteGroups
const { Kafka, logLevel } = require('kafkajs');

const [mode, bootstrap, ...groups] = process.argv.slice(2);
const kafka = new Kafka({ clientId: 'kafkajs-cluster-test', brokers: [bootstrap], logLevel: logLevel.ERROR,
                          retry: { retries: 10 } });

async function offsetsOf(client) {
  const out = {};
  for (const groupId of groups) out[groupId] = await client.fetchOffsets({ groupId });
  return out;
}

async function admin() {
  const client = kafka.admin();
  await client.connect();
  const out = { cluster: await client.describeCluster(), listed: (await client.listGroups()).groups };
  out.offsets = await offsetsOf(client);
  out.described = (await client.describeGroups(groups)).groups;
  console.log(JSON.stringify(out));
  await client.disconnect();
}

async function fetchOffsets() {
  const client = kafka.admin();
  await client.connect();
  console.log(JSON.stringify(await offsetsOf(client)));
  await client.disconnect();
}

async function deleteGroups() {
  const client = kafka.admin();
  await client.connect();
  console.log(JSON.stringify(await client.deleteGroups(groups)));
  await client.disconnect();
}

({ admin, fetch: fetchOffsets, delete: deleteGroups })[mode]().then(
  () => process.exit(0),
  (err) => { console.error(err); process.exit(1); });
