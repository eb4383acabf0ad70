package push_test

import (
	"testing"

	"github.com/clipshard/clipshard/internal/clitest"

	// Imported so the test cache is keyed on the command's sources.
	_ "github.com/clipshard/clipshard/internal/commands/push"
)

// bin is the clipshard command, built from cmd/clipshard for these tests
// (push end to end against versitygw, and trainers reading what it
// pushed): with version control information, as the README's build
// command does.
var bin string

func TestMain(m *testing.M) {
	clitest.MainOf(m, "clipshard", "../../cmd/clipshard", &bin, "-buildvcs=true")
}

func clip(t *testing.T, args ...string) clitest.Result {
	t.Helper()
	return clitest.Run(t, bin, nil, args...)
}

func oneLine(t *testing.T, r clitest.Result, code int, prefix string) {
	t.Helper()
	clitest.OneLine(t, r, code, prefix)
}

func demo(t *testing.T) (ds, ep string) { t.Helper(); return clitest.Demo(t, bin) }
