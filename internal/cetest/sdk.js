// Reads [{binding, headers, body, key}] on stdin, parses each message with
// the CloudEvents SDK's binding (HTTP.toEvent or Kafka.toEvent), validates
// the event against the spec, and prints [{event} | {error}].
const { HTTP, Kafka } = require("cloudevents");

let input = "";
process.stdin.on("data", (c) => (input += c));
process.stdin.on("end", () => {
  const out = JSON.parse(input).map((m) => {
    try {
      const ev =
        m.binding === "kafka"
          ? Kafka.toEvent({ headers: m.headers, key: m.key, value: m.body, body: m.body })
          : HTTP.toEvent({ headers: m.headers, body: m.body });
      ev.validate();
      return { event: ev.toJSON() };
    } catch (e) {
      const detail = e && e.errors ? " " + JSON.stringify(e.errors) : "";
      return { error: String((e && e.message) || e) + detail };
    }
  });
  process.stdout.write(JSON.stringify(out));
});
