package main

import (
	"bufio"
	"strings"
	"testing"
)

// TestSummarize: go test -json's events become go test's lines (a
// package's ok line; a failing test's and package's output) and the
// skipped tests, grouped by their reason without the file:line prefix.
func TestSummarize(t *testing.T) {
	in := `{"Action":"start","Package":"m/a"}
{"Action":"run","Package":"m/a","Test":"TestX"}
{"Action":"output","Package":"m/a","Test":"TestX","Output":"=== RUN   TestX\n"}
{"Action":"output","Package":"m/a","Test":"TestX","Output":"    a_test.go:9: needs boto3: apt-get install python3-boto3\n"}
{"Action":"output","Package":"m/a","Test":"TestX","Output":"--- SKIP: TestX (0.00s)\n"}
{"Action":"skip","Package":"m/a","Test":"TestX"}
{"Action":"run","Package":"m/a","Test":"TestY"}
{"Action":"output","Package":"m/a","Test":"TestY","Output":"    a_test.go:12: needs boto3: apt-get install python3-boto3\n"}
{"Action":"skip","Package":"m/a","Test":"TestY"}
{"Action":"output","Package":"m/a","Test":"TestZ","Output":"this test's own chatter\n"}
{"Action":"pass","Package":"m/a","Test":"TestZ"}
{"Action":"output","Package":"m/a","Output":"PASS\n"}
{"Action":"output","Package":"m/a","Output":"ok  \tm/a\t0.1s\n"}
{"Action":"pass","Package":"m/a"}
{"Action":"output","Package":"m/b","Test":"TestF","Output":"--- FAIL: TestF (0.00s)\n"}
{"Action":"output","Package":"m/b","Test":"TestF","Output":"    b_test.go:3: boom\n"}
{"Action":"fail","Package":"m/b","Test":"TestF"}
{"Action":"output","Package":"m/b","Output":"FAIL\n"}
{"Action":"output","Package":"m/b","Output":"FAIL\tm/b\t0.2s\n"}
{"Action":"fail","Package":"m/b"}
{"Action":"output","Package":"m/c","Output":"?   \tm/c\t[no test files]\n"}
{"Action":"skip","Package":"m/c"}
`
	var b strings.Builder
	w := bufio.NewWriter(&b)
	skips := summarize(strings.NewReader(in), w)
	w.Flush()
	want := "ok  \tm/a\t0.1s\n--- FAIL: TestF (0.00s)\n    b_test.go:3: boom\nFAIL\nFAIL\tm/b\t0.2s\n?   \tm/c\t[no test files]\n"
	if b.String() != want {
		t.Fatalf("printed\n%q\nwant\n%q", b.String(), want)
	}
	if len(skips) != 1 || skips[0].reason != "needs boto3: apt-get install python3-boto3" || strings.Join(skips[0].tests, ",") != "m/a TestX,m/a TestY" {
		t.Fatalf("skips %+v", skips)
	}
	var r strings.Builder
	report(&r, skips)
	if !strings.HasPrefix(r.String(), "skipped 2 tests, for 1 reasons") || !strings.Contains(r.String(), "(2: m/a TestX, m/a TestY)") {
		t.Fatalf("report: %s", r.String())
	}
}
