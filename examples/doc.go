// Package examples holds the tests of the examples in this folder (Python
// scripts a trainer copies), run by go test on what this module's
// shuffle writes.
package examples
