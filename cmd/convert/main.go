// Command convert is the old name of "clipshard convert", kept as an alias: the
// same flags, output and exit status. Run "convert --help" for the flags.
package main

import (
	"os"

	convertcmd "github.com/clipshard/clipshard/internal/commands/convert"
	"github.com/clipshard/clipshard/internal/ui"
)

func main() { ui.Exit(convertcmd.Run("convert", os.Args[1:], os.Stdout, os.Stderr)) }
