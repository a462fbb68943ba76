// Parses the AsyncAPI documents named on the command line with the
// AsyncAPI parser and prints, per document, its diagnostics and what the
// parsed document holds: [{diagnostics, channels, messages, operations}].
const fs = require("fs");
const { Parser } = require("@asyncapi/parser");

(async () => {
  const parser = new Parser();
  const out = [];
  for (const file of process.argv.slice(2)) {
    const { document, diagnostics } = await parser.parse(fs.readFileSync(file, "utf8"));
    const res = {
      diagnostics: diagnostics.map((d) => ({ code: d.code, message: d.message, path: d.path, severity: d.severity })),
    };
    if (document) {
      res.channels = document.channels().all().map((c) => c.address());
      res.messages = document.messages().all().map((m) => ({
        name: m.name(),
        payload: m.payload() ? m.payload().json() : null,
        headers: m.headers() ? Object.keys(m.headers().properties()) : [],
      }));
      res.operations = document.operations().all().map((o) => o.action() + " " + o.channels().all().map((c) => c.address()).join(","));
    }
    out.push(res);
  }
  process.stdout.write(JSON.stringify(out));
})().catch((e) => {
  console.error(e);
  process.exit(1);
});
