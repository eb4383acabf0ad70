// Command shuffle is the old name of "clipshard shuffle", kept as an alias: the
// same flags, output and exit status. Run "shuffle --help" for the flags.
package main

import (
	"os"

	shufflecmd "github.com/clipshard/clipshard/internal/commands/shuffle"
	"github.com/clipshard/clipshard/internal/ui"
)

func main() { ui.Exit(shufflecmd.Run("shuffle", os.Args[1:], os.Stdout, os.Stderr)) }
