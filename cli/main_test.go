package cli

import (
	"os"
	"strings"
	"testing"
)

// mainEnv, when set, makes the test binary run Main with its words as the
// arguments instead of the tests: a test that must see everything the
// process writes to its real stdout and stderr (a library's own logger
// included) runs the binary again with it (runMainProcess).
const mainEnv = "OUTBOX_CLI_TEST_MAIN"

func TestMain(m *testing.M) {
	if args, ok := os.LookupEnv(mainEnv); ok {
		os.Exit(Main(strings.Fields(args), os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}
