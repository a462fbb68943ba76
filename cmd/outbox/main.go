// Command outbox runs the transactional outbox's daemons and tools:
// migrate, relay, dev-kafka, stats and more. See `outbox --help`.
package main

import (
	"os"

	"github.com/pgoutbox/outbox/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
