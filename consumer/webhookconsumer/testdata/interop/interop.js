// Reads {secret, verify: [{id, timestamp, signature, body}], sign: [{id,
// timestamp, body}]} on stdin; writes {verified: [true|"error"], signed:
// ["v1,..."]}: what the standardwebhooks library says of the Go side's
// signatures, and the signatures it makes for the Go side to check.
const { Webhook } = require("standardwebhooks");

let input = "";
process.stdin.on("data", (d) => (input += d));
process.stdin.on("end", () => {
  const req = JSON.parse(input);
  const wh = new Webhook(req.secret);
  const verified = (req.verify || []).map((c) => {
    try {
      wh.verify(c.body, {
        "webhook-id": c.id,
        "webhook-timestamp": String(c.timestamp),
        "webhook-signature": c.signature,
      });
      return true;
    } catch (e) {
      return String(e.message);
    }
  });
  const signed = (req.sign || []).map((c) => wh.sign(c.id, new Date(c.timestamp * 1000), c.body));
  process.stdout.write(JSON.stringify({ verified, signed }));
});
