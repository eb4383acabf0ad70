// Command verify is the old name of "clipshard verify", kept as an alias: the
// same flags, output and exit status. Run "verify --help" for the flags.
package main

import (
	"os"

	verifycmd "github.com/clipshard/clipshard/internal/commands/verify"
	"github.com/clipshard/clipshard/internal/ui"
)

func main() { ui.Exit(verifycmd.Run("verify", os.Args[1:], os.Stdout, os.Stderr)) }
