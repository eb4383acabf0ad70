// Package checks runs the Python reader's checks (testdata/check_*.py and
// the bench scripts' smoke runs) from go test, against the epochs and
// datasets that this module's shuffle and convert write: its tests are
// the python/clipshard package's.
package checks
