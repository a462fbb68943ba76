package cli

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/stretchr/testify/require"
)

// fakeEnv is an environment of env alone, for config files' references.
func fakeEnv(env map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := env[name]
		return v, ok
	}
}

// runEnv runs `outbox args...` in-process with env as the environment
// config files reference, and returns the exit code and output.
func runEnv(t *testing.T, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	var out, errOut syncBuffer
	code := execute(newRoot(&globals{stdout: &out, stderr: &errOut, lookupEnv: fakeEnv(env)}), args, &errOut)
	return code, out.String(), errOut.String()
}

// writeConfig writes a config file into the test's directory.
func writeConfig(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "relay.yaml")
	require.NoError(t, os.WriteFile(path, []byte(yaml), 0o600))
	return path
}

// relayCmd is `outbox relay` of a fresh command tree.
func relayCmd(t *testing.T) *cobra.Command {
	t.Helper()
	root := newRoot(&globals{stdout: &bytes.Buffer{}, stderr: &bytes.Buffer{}})
	c, _, err := root.Find([]string{"relay"})
	require.NoError(t, err)
	c.InitDefaultHelpFlag()
	// Cobra merges the inherited flags in at parse time.
	require.NoError(t, c.ParseFlags(nil))
	return c
}

// Every flag of `outbox relay`, its own and those it inherits, is a key
// of the config file where it belongs: an outbox's setting at the top
// level and in an entry, a process-wide one at the top level only; the
// few that are actions or deprecated are refused, saying why. And every
// key the file takes is a flag, or name or outboxes.
func TestConfigKeysAreTheRelayFlags(t *testing.T) {
	t.Parallel()
	c := relayCmd(t)
	keys := relayFileKeys(c)
	read := func(yaml string) error {
		_, err := readRelayFile(writeConfig(t, yaml), keys, fakeEnv(nil))
		return err
	}
	seen := 0
	for _, set := range []*pflag.FlagSet{c.Flags(), c.InheritedFlags()} {
		set.VisitAll(func(f *pflag.Flag) {
			seen++
			line := fmt.Sprintf("%s: %q\n", f.Name, f.DefValue)
			if f.Value.Type() == "bool" || f.Value.Type() == "int" || f.Value.Type() == "int64" {
				line = fmt.Sprintf("%s: %s\n", f.Name, f.DefValue)
			}
			top, entry := read(line), read("outboxes:\n  - "+line)
			switch {
			case f.Deprecated != "":
				require.ErrorContains(t, top, "is deprecated", f.Name)
			case fileKeyScopes[f.Name].scope == scopeNone:
				require.ErrorContains(t, top, "is not a key of the file", f.Name)
			case fileKeyScopes[f.Name].scope == scopeProcess:
				require.NoError(t, top, f.Name)
				require.ErrorContains(t, entry, "applies to the whole process", f.Name)
			default:
				require.NoError(t, top, f.Name)
				require.NoError(t, entry, f.Name)
			}
		})
	}
	require.Greater(t, seen, 50, "the relay's flags were not all visited")
	for _, name := range keys.names() {
		if name != keyName && name != keyOutboxes {
			require.NotNil(t, keys.lookup(name), "key %s is no flag", name)
		}
	}
	for name := range fileKeyScopes {
		require.NotNil(t, keys.lookup(name), "fileKeyScopes names %s, which is no flag of outbox relay", name)
	}
}

// A mistake in the file is an error at its line and column, saying what
// is wrong and what to write.
func TestConfigFileErrorsSayWhereAndWhat(t *testing.T) {
	t.Parallel()
	keys := relayFileKeys(relayCmd(t))
	env := fakeEnv(map[string]string{"SET": "x"})
	for _, tc := range []struct{ name, yaml, want string }{
		{"unknown key", "brokers: a:9092\nbatchsize: 10\n", "relay.yaml:2:1: unknown key batchsize; did you mean batch-size?"},
		{"snake case", "outboxes:\n  - batch_size: 10\n", "relay.yaml:2:5: unknown key batch_size; write batch-size (the keys are the flags' names)"},
		{"not a number", "batch-size: many\n", `relay.yaml:1:13: batch-size: "many" is not a whole number`},
		{"not a bool", "poll-only: yes\n", `relay.yaml:1:12: poll-only: "yes" is not true or false`},
		{"not a duration", "outboxes:\n  - poll-interval: 5\n", `relay.yaml:2:20: poll-interval: "5" is not a duration: use e.g. 30s, 5m, 2h, 7d or 1d12h`},
		{"a list", "brokers: [a, b]\n", "relay.yaml:1:10: brokers takes one value (a string), not a list or a mapping"},
		{"no value", "table:\n", "relay.yaml:1:7: table has no value"},
		{"unset variable", "outboxes:\n  - database-url: postgres://app:${PGPASSWORD}@db/app\n", "relay.yaml:2:19: database-url: environment variable PGPASSWORD is not set; export it"},
		{"unclosed reference", "topic-prefix: ${SET\n", "relay.yaml:1:15: topic-prefix: ${ without its closing }"},
		{"bad reference", "topic-prefix: ${1X}\n", "relay.yaml:1:15: topic-prefix: ${1X} is not an environment variable's name"},
		{"twice", "table: a\ntable: b\n", "relay.yaml:2:1: table is given twice in this mapping (first on line 1); keep one"},
		{"process key in an outbox", "outboxes:\n  - http: :9090\n", "relay.yaml:2:5: http applies to the whole process"},
		{"action", "teardown: true\n", "relay.yaml:1:1: teardown is not a key of the file: it is an action on one outbox"},
		{"deprecated", "cleanup-batch: 10\n", "relay.yaml:1:1: cleanup-batch is deprecated: use cleanup-batch-size"},
		{"outboxes not a list", "outboxes:\n  table: a\n", "relay.yaml:2:3: outboxes must be a list of outboxes"},
		{"entry not a mapping", "outboxes:\n  - orders\n", "relay.yaml:2:5: each entry of outboxes must be a mapping"},
		{"nested outboxes", "outboxes:\n  - outboxes: []\n", "relay.yaml:2:5: outboxes goes at the top level"},
		{"name at the top", "name: a\noutboxes:\n  - table: a\n", "relay.yaml:1:1: name names one outbox: move it into its entry"},
		{"bad name", "outboxes:\n  - name: 'a b'\n", `relay.yaml:2:11: name "a b": use 1 to 120 letters`},
		{"not a mapping", "- a\n", "relay.yaml:1:1: the file must be a mapping of keys to values"},
		{"syntax", "table: a\n  b: c\n", "relay.yaml: line 2: mapping values are not allowed in this context; fix the YAML syntax there"},
		{"empty", "", "relay.yaml: the file is empty"},
		{"two documents", "table: a\n---\ntable: b\n", "relay.yaml: the file holds more than one YAML document"},
		{"bad log level", "log-level: loud\n", `relay.yaml:1:12: log-level: --log-level "loud": use debug, info, warn or error`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := writeConfig(t, tc.yaml)
			_, err := readRelayFile(path, keys, env)
			require.Error(t, err)
			require.Equal(t, filepath.Dir(path)+"/", err.Error()[:len(filepath.Dir(path))+1])
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

// Mistakes found once the outboxes are resolved are errors at the line
// and column of the value, or of the entry, that made them, in the file's
// words; `--check` exits 1 with them.
func TestConfigResolutionErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct{ name, yaml, want string }{
		{"zero", "brokers: a:9092\noutboxes:\n  - database-url: postgres://h/db\n    batch-size: 0\n",
			"relay.yaml:4:17: outbox: batch-size 0: use a positive number"},
		{"duplicate outbox", "brokers: a:9092\noutboxes:\n  - database-url: postgres://h/db\n    table: t\n  - database-url: postgres://h:5432/db?sslmode=disable\n    table: t\n",
			`relay.yaml:5:5: outbox public.t@db: the name public.t@db is taken by public.t@db (line 3); give each outbox its own name`},
		{"duplicate table", "brokers: a:9092\noutboxes:\n  - database-url: postgres://h/db\n    name: one\n  - database-url: postgres://h/db\n    name: two\n",
			`relay.yaml:5:5: outbox two: duplicate outbox: one (line 3) relays "public"."events_outbox" of database db on h:5432 already`},
		{"duplicate slot", "brokers: a:9092\nmode: wal\nslot: s\noutboxes:\n  - database-url: postgres://h/db1\n  - database-url: postgres://h/db2\n",
			"relay.yaml:3:7: outbox public.events_outbox@db2: slot s is taken by public.events_outbox@db1 (line 5) on the same server"},
		{"mode", "brokers: a:9092\noutboxes:\n  - database-url: postgres://h/db\n    mode: stream\n",
			`relay.yaml:4:11: outbox: mode "stream": use poll (the default) or wal`},
		{"wal flag without wal", "brokers: a:9092\nslot: s\noutboxes:\n  - database-url: postgres://h/db\n",
			"relay.yaml:2:7: outbox: slot, publication, teardown and setup-only belong to mode wal; add mode wal, or drop them"},
		{"no brokers", "outboxes:\n  - database-url: postgres://h/db\n",
			"relay.yaml:2:5: outbox: no Kafka brokers: pass brokers host:port or set KAFKA_BROKERS"},
		{"kafka flag beside another sink", "brokers: a:9092\noutboxes:\n  - database-url: postgres://h/db\n    sink: nats://n:4222\n    tls: true\n",
			"relay.yaml:5:10: outbox: tls is a Kafka flag, and sink names a nats sink"},
		{"bad sink", "outboxes:\n  - database-url: postgres://h/db\n    sink: carrier-pigeon://loft\n",
			`relay.yaml:3:11: outbox: sink: unknown scheme "carrier-pigeon"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, _, stderr := runEnv(t, nil, "relay", "--config", writeConfig(t, tc.yaml), "--check")
			require.Equal(t, 1, code, stderr)
			require.Contains(t, stderr, tc.want)
		})
	}
}

// --check prints each outbox as resolved: an entry's values over the
// command line's flags over the file's top level. Environment references
// show as written, never their values; a password written in a URL and
// the SASL password are hidden. It connects to nothing.
func TestConfigCheckPrintsResolvedOutboxesSecretsHidden(t *testing.T) {
	t.Parallel()
	path := writeConfig(t, `# defaults of every outbox
brokers: ${BROKERS}
sasl-mechanism: SCRAM-SHA-512
sasl-user: relay
sasl-password: ${KAFKA_PASSWORD}
tls: true
batch-size: 100
http: 127.0.0.1:0
outboxes:
  - name: orders
    database-url: postgres://relay:${PGPASSWORD}@db1.internal:5432/shop
    schema: orders
  - database-url: postgres://relay:written-in-the-file@db2.internal/billing
    batch-size: 50
    mode: wal
    sink: nats://nats.internal:4222
`)
	env := map[string]string{"BROKERS": "k1:9093,k2:9093", "KAFKA_PASSWORD": "kafka-secret-value", "PGPASSWORD": "pg-secret-value"}
	code, out, stderr := runEnv(t, env, "relay", "--config", path, "--check", "--batch-size", "7")
	require.Equal(t, 0, code, stderr)
	for _, secret := range []string{"kafka-secret-value", "pg-secret-value", "written-in-the-file"} {
		require.NotContains(t, out+stderr, secret)
	}
	require.Contains(t, out, "2 outbox(es); 2 database pool(s)")
	orders, billing, _ := strings.Cut(out[strings.Index(out, "outbox orders"):], "outbox public.events_outbox@billing")
	require.Contains(t, orders, "outbox orders ("+path+":10)")
	require.Contains(t, orders, "database-url: postgres://relay:${PGPASSWORD}@db1.internal:5432/shop")
	require.Contains(t, orders, "brokers: ${BROKERS}")
	require.Contains(t, orders, "sasl-password: ${KAFKA_PASSWORD}")
	require.Contains(t, orders, "batch-size: 7", "the command line overrides the top level")
	require.Contains(t, orders, "schema: orders")
	require.Contains(t, billing, "database-url: postgres://relay:xxxxx@db2.internal/billing")
	require.Contains(t, billing, "batch-size: 50", "an entry overrides the command line")
	require.Contains(t, billing, "mode: wal")
	require.Contains(t, billing, "sink: nats://nats.internal:4222")
	require.Contains(t, out, "up to 4 connections for orders")
}

// A secret read from the environment is never printed, in an error or a
// log line: the relay replaces its value by its reference.
func TestConfigSecretsNeverPrinted(t *testing.T) {
	t.Parallel()
	// An error that quotes a value.
	path := writeConfig(t, "brokers: a:9092\nmode: ${MODE}\ndatabase-url: postgres://h/db\n")
	code, _, stderr := runEnv(t, map[string]string{"MODE": "secret-mode-value"}, "relay", "--config", path)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, `mode "${MODE}": use poll (the default) or wal`)
	require.NotContains(t, stderr, "secret-mode-value")

	// A log line that quotes one (the SASL user, in the warning about
	// PLAIN without TLS), and the error that ends the run (the user of
	// the database connection).
	path = writeConfig(t, `brokers: 127.0.0.1:1
sasl-mechanism: PLAIN
sasl-user: ${KAFKA_USER}
sasl-password: ${KAFKA_PASSWORD}
database-url: postgres://${PGUSER_SECRET}@127.0.0.1:1/db?connect_timeout=2
log-format: json
`)
	env := map[string]string{"PGUSER_SECRET": "user-secret-value", "KAFKA_USER": "kafka-user-value", "KAFKA_PASSWORD": "kafka-password-value"}
	code, _, stderr = runEnv(t, env, "relay", "--config", path)
	require.Equal(t, 1, code)
	require.Contains(t, stderr, `"sasl_user":"${KAFKA_USER}"`)
	require.Contains(t, stderr, "as ${PGUSER_SECRET}: connection refused")
	for _, v := range env {
		require.NotContains(t, stderr, v)
	}
}

// The deploy kit's example config file checks, with its secrets in the
// environment, and resolves as its comments say: one Kafka client for
// the four Kafka outboxes, a pool per database.
func TestDeployKitConfigChecks(t *testing.T) {
	t.Parallel()
	env := map[string]string{"KAFKA_BROKERS": "kafka-1.internal:9092", "KAFKA_SASL_PASSWORD": "kafka-secret",
		"PG_PASSWORD_EU": "eu-secret", "PG_PASSWORD_US": "us-secret", "PG_PASSWORD_BILLING": "billing-secret"}
	code, out, stderr := runEnv(t, env, "relay", "--config", "../deploy/relay.yaml", "--check")
	require.Equal(t, 0, code, stderr)
	for _, v := range env {
		if strings.Contains(v, "secret") {
			require.NotContains(t, out, v)
		}
	}
	require.Contains(t, out, "5 outbox(es); 3 database pool(s), 1 shared sink client(s); --http 127.0.0.1:9464")
	require.Contains(t, out, "sink client kafka on ${KAFKA_BROKERS}: shared by shop-eu, shop-us, billing-invoices, billing-payments")
	require.Contains(t, out, "up to 5 connections for billing-invoices, billing-payments, notifications")
}

// docs/configuration.md lists every key of the file: a flag added to
// `outbox relay` is documented there too.
func TestConfigurationDocListsEveryKey(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../docs/configuration.md")
	require.NoError(t, err)
	table := string(doc)[strings.Index(string(doc), "## Every key"):]
	table = table[:strings.Index(table, "\n## ")]
	for _, name := range relayFileKeys(relayCmd(t)).names() {
		require.Contains(t, table, "`"+name+"`", "docs/configuration.md's key table lacks %s", name)
	}
}
