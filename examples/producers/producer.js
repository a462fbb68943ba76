const { Client } = require("pg");

// emit writes one event in client's open transaction.
async function emit(client, aggregateId, type, payload, headers = null) {
  const { rows } = await client.query(
    "SELECT events_outbox_emit($1, $2, $3, $4) AS id",
    [aggregateId, type, JSON.stringify(payload),
     headers === null ? null : JSON.stringify(headers)]);
  return rows[0].id; // a string: bigint does not fit a JS number
}

async function placeOrder(orderId, totalCents, currency = "EUR") {
  const client = new Client(); // PGHOST, PGDATABASE, ... from the environment
  await client.connect();
  try {
    await client.query("BEGIN");
    // ... the business writes, e.g. INSERT INTO orders ...
    // order.placed v2 (examples/contracts), version in event_version.
    const id = await emit(client, orderId, "order.placed",
      { order_id: orderId, total_cents: totalCents, currency },
      { event_version: "2" });
    await client.query("COMMIT");
    return id;
  } catch (err) {
    await client.query("ROLLBACK");
    throw err;
  } finally {
    await client.end();
  }
}

module.exports = { emit, placeOrder };
