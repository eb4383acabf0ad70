package main_test

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/manifests"
)

// TestWeightBounds (round 4, points 4, 5 and 12): a weight's digits and
// exponent are bounded (60k-digit weights, 1e1000000 and a 1 MiB
// @FILE of digits are refused at once, naming the limit, not computed for
// minutes); --epoch-samples up to 2^63-1 is refused cleanly (it ended in
// "internal error: makeslice"); spaces around names and weights are
// allowed everywhere (before: "a=1 ,b=1" passed, "a= 1" did not).
func TestWeightBounds(t *testing.T) {
	d := mixDatasets(t)
	out := filepath.Join(t.TempDir(), "ep")
	two := []string{"--source", "a=" + d["a"], "--source", "b=" + d["b"], "--window", "3", "--out", out, "--epochs", "1"}
	digits := strings.Repeat("1", 60000) // two in one argument: within Linux's 128 KiB an argument
	file := filepath.Join(t.TempDir(), "w.txt")
	os.WriteFile(file, []byte("a="+strings.Repeat("7", 1<<20-8)+",b=1\n"), 0o644)
	for _, c := range []struct {
		args []string
		want string
	}{
		{append(two, "--weights", "a="+digits+",b="+digits), "60000 digits: a weight has at most 64"},
		{append(two, "--weights", "a=1e1000000,b=1"), "exponent 1000000: a weight's is within ±64"},
		{append(two, "--weights", "a=1e-65,b=1"), "exponent -65"},
		{append(two, "--weights", "a=0."+strings.Repeat("0", 64)+"1,b=1"), "66 digits"},
		{append(two, "--weights", "@"+file), "digits: a weight has at most 64"},
		{append(two, "--epoch-samples", "288230376151711744"), "--epoch-samples 288230376151711744: at most 1099511627776 (2^40)"},
		{append(two, "--epoch-samples", "9223372036854775807", "--mem", "4TiB"), "at most 1099511627776"},
		{append(two, "--epoch-samples", "1099511627776", "--mem", "4TiB"), "give --mem 232447.9GiB or more"}, // allowed, but its plan does not fit
	} {
		r := shuffleRun(t, nil, c.args...)
		if r.Code != 2 || !strings.Contains(r.Stderr, c.want) || strings.Count(r.Stderr, "\n") != 1 || len(r.Stderr) > 400 || r.Elapsed > 20*time.Second {
			t.Errorf("%.120q: exit %d in %v, %.300q; want 2 and %q on one short line", strings.Join(c.args[8:], " "), r.Code, r.Elapsed, r.Stderr, c.want)
		}
		if _, err := os.Stat(filepath.Join(out, "epochs.json")); err == nil {
			t.Fatalf("%v: wrote %s", c.args, out)
		}
	}
	// The largest bounded weights are taken, and cost nothing.
	big := strings.Repeat("9", 32) + "." + strings.Repeat("9", 32) + "e64"
	r := shuffleRun(t, nil, append(two, "--weights", " a = "+big+" , b= 1e-64 ")...)
	if r.Code != 0 || r.Elapsed > 20*time.Second {
		t.Fatalf("bounded weights: %d in %v %s", r.Code, r.Elapsed, r.Stderr)
	}
	verifyOK(t, out)
}

// TestWeightsByValue (round 4, points 10 and 7): array tasks giving the
// same schedule in other words (a=1 and a=1.0) agree: the second's
// epochs join the first's, and verify --deep passes (it was refused as
// "other options", exit 2). A weight recorded as a JSON string, and one
// past the bounds, make epochs.json unusable (verify exit 2, naming the
// weight), as does a recorded fingerprint that is not the dataset's.
func TestWeightsByValue(t *testing.T) {
	d := mixDatasets(t)
	out := filepath.Join(t.TempDir(), "ep")
	src := []string{"--source", "a=" + d["a"], "--source", "b=" + d["b"], "--window", "3", "--out", out, "--seed", "5"}
	if r := shuffleRun(t, nil, append(src, "--epoch-range", "0:1", "--weights", "0:@a=1,b=0.5")...); r.Code != 0 {
		t.Fatal(r.Stderr)
	}
	if r := shuffleRun(t, nil, append(src, "--epoch-range", "1:2", "--weights", "0:@a=1.0,b=5e-1")...); r.Code != 0 {
		t.Fatalf("the same weights in other words: %d %s", r.Code, r.Stderr)
	}
	verifyOK(t, out) // --deep
	// Other weights are still other options.
	if r := shuffleRun(t, nil, append(src, "--epoch-range", "2:3", "--weights", "0:@a=1,b=0.25")...); r.Code != 2 {
		t.Fatalf("other weights: %d %s", r.Code, r.Stderr)
	}
	edit := func(old, new string) string {
		t.Helper()
		e := filepath.Join(t.TempDir(), "ep")
		copyTree(t, out, e)
		p := filepath.Join(e, "epochs.json")
		b, _ := os.ReadFile(p)
		if !strings.Contains(string(b), old) {
			t.Fatalf("epochs.json has no %q", old)
		}
		os.WriteFile(p, []byte(strings.Replace(string(b), old, new, 1)), 0o644)
		clitest.Resum(t, e, "epochs.json")
		return e
	}
	for _, c := range []struct{ old, new, want string }{
		{`"a": 1,`, `"a": "1",`, `the weight of a is "1", not a JSON number`},
		{`"a": 1,`, `"a": 1e1000000,`, "exponent 1000000"},
		{`"b": 0.5`, `"b": 0.` + strings.Repeat("5", 100), "digits: a weight has at most 64"},
	} {
		began := time.Now()
		_, err := manifests.VerifyEpochs(edit(c.old, c.new), manifests.VerifyOptions{Deep: true})
		if err == nil || !strings.Contains(err.Error(), c.want) || time.Since(began) > 20*time.Second {
			t.Errorf("%s -> %s: verify in %v: %v; want the manifest refused naming %q", c.old, c.new, time.Since(began), err, c.want)
		}
	}
	// A fingerprint zeroed (sums updated): verify --deep names it.
	if r := verifyReport(t, edit(`"fingerprint": "`, `"fingerprint": "0`), true); r.OK() || !strings.Contains(fmt.Sprint(r.Problems), "fingerprint") {
		t.Fatalf("edited fingerprint: verify --deep %v", r.Problems)
	}
}
