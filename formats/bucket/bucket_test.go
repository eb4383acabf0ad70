package bucket_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/clipshard/clipshard/formats/bucket"
	"github.com/clipshard/clipshard/internal/s3test"
)

// TestAgainstVersitygw: the client's calls on a real S3 server: create-only
// and compare-and-swap writes refused with ErrPrecondition (412), bounded
// ranges, a stale ETag on a ranged read refused, multipart uploads in
// parallel parts with their sha256 as metadata, listing; and the requests
// carry no checksum headers (a non-AWS server must not get surprise CRC
// headers), seen by a proxy between the client and the server.
func TestAgainstVersitygw(t *testing.T) {
	s := s3test.Start(t, "bkt")
	target, _ := url.Parse(s.Endpoint)
	var mu sync.Mutex
	var seen []string
	var signed int
	proxy := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			mu.Lock()
			if r.In.Header.Get("Authorization") != "" {
				signed++ // the proxy sees the requests
			}
			for k := range r.In.Header {
				if lk := strings.ToLower(k); strings.HasPrefix(lk, "x-amz-checksum") || lk == "x-amz-sdk-checksum-algorithm" || lk == "x-amz-trailer" || lk == "content-md5" {
					seen = append(seen, r.In.Method+" "+k)
				}
			}
			mu.Unlock()
			r.SetURL(target)
			r.Out.Host = r.In.Host // signed with the host the client used
		},
	})
	defer proxy.Close()
	s.Setenv(t)
	t.Setenv("AWS_ENDPOINT_URL", proxy.URL)
	c, err := bucket.New()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	u, err := bucket.Parse("s3://bkt/some/prefix/")
	if err != nil || u.Prefix != "some/prefix" || u.Name("x.npy") != "s3://bkt/some/prefix/x.npy" {
		t.Fatalf("%+v %v", u, err)
	}
	for _, bad := range []string{"b/x", "s3://", "s3:///x", "s3://b/../x", "s3://b/a/../x"} {
		if _, err := bucket.Parse(bad); !errors.Is(err, bucket.ErrURL) {
			t.Errorf("Parse(%q): %v", bad, err)
		}
	}
	e1, err := c.PutBytes(ctx, u, "m.json", []byte("one"), "sha-one", bucket.CreateOnly)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PutBytes(ctx, u, "m.json", []byte("two"), "", bucket.CreateOnly); !errors.Is(err, bucket.ErrPrecondition) {
		t.Fatalf("second create-only write: %v", err)
	}
	e2, err := c.PutBytes(ctx, u, "m.json", []byte("three"), "", bucket.Cond(e1))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.PutBytes(ctx, u, "m.json", []byte("four"), "", bucket.Cond(e1)); !errors.Is(err, bucket.ErrPrecondition) {
		t.Fatalf("a stale If-Match: %v", err)
	}
	if b, etag, err := c.ReadAll(ctx, u, "m.json", 100); err != nil || string(b) != "three" || etag != e2 {
		t.Fatalf("ReadAll: %q %s %v", b, etag, err)
	}
	if _, err := c.Stat(ctx, u, "nope"); !errors.Is(err, bucket.ErrNotFound) {
		t.Fatalf("Stat of nothing: %v", err)
	}
	big := make([]byte, 12<<20+123)
	rand.Read(big)
	// A check that fails: no object is made, one PUT or multipart (its
	// upload aborted: none left).
	for _, n := range []int{1000, len(big)} {
		bad := errors.New("the bytes are not the recorded ones")
		_, err := c.PutChecked(ctx, u, "refused.npy", bytes.NewReader(big[:n]), int64(n), "abc123", 5<<20, 2, func() error { return bad })
		if !errors.Is(err, bad) {
			t.Fatalf("%d bytes: a failed check: %v", n, err)
		}
		if _, err := c.Stat(ctx, u, "refused.npy"); !errors.Is(err, bucket.ErrNotFound) {
			t.Fatalf("%d bytes: an object was made although its check failed: %v", n, err)
		}
	}
	checked := false
	etag, err := c.PutChecked(ctx, u, "big.npy", bytes.NewReader(big), int64(len(big)), "abc123", 5<<20, 2, func() error { checked = true; return nil })
	if err != nil || !checked {
		t.Fatal(err, checked)
	}
	st, err := c.Stat(ctx, u, "big.npy")
	if err != nil || st.Size != int64(len(big)) || st.SHA256 != "abc123" || !strings.HasSuffix(st.ETag, "-3") || st.ETag != etag || st.PartSize != 5<<20 {
		t.Fatalf("multipart: %+v %v (PutChecked said %s)", st, err, etag)
	}
	// The ETag an upload of these bytes gets, computed here, in writes of
	// any size (and of one PUT).
	eh := bucket.NewETagHasher(int64(len(big)), 5<<20)
	for at := 0; at < len(big); at += 777777 {
		eh.Write(big[at:min(at+777777, len(big))])
	}
	if eh.Sum() != st.ETag {
		t.Fatalf("ETagHasher: %s, the server's %s", eh.Sum(), st.ETag)
	}
	small, err := c.PutChecked(ctx, u, "small.npy", bytes.NewReader(big[:1000]), 1000, "", 5<<20, 2, func() error { return nil })
	eh = bucket.NewETagHasher(1000, 5<<20)
	eh.Write(big[:1000])
	if err != nil || eh.Sum() != small {
		t.Fatalf("one PUT: %s, the server's %s (%v)", eh.Sum(), small, err)
	}
	c.Remove(ctx, u, "small.npy")
	got, err := c.Range(ctx, u, "big.npy", 5<<20-7, 1000, st.ETag)
	if err != nil || !bytes.Equal(got, big[5<<20-7:5<<20-7+1000]) {
		t.Fatalf("Range: %v", err)
	}
	if _, err := c.Range(ctx, u, "big.npy", 0, 10, e1); !errors.Is(err, bucket.ErrPrecondition) {
		t.Fatalf("a range of another version: %v", err)
	}
	l, err := c.List(ctx, u)
	if err != nil || len(l) != 2 || l["big.npy"].Size != int64(len(big)) {
		t.Fatalf("List: %v %v", l, err)
	}
	if err := c.Remove(ctx, u, "m.json"); err != nil {
		t.Fatal(err)
	}
	if err := c.Remove(ctx, u, "m.json"); err != nil {
		t.Fatalf("removing what is gone: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) > 0 || signed < 10 {
		t.Fatalf("checksum headers sent: %v (of %d signed requests)", seen, signed)
	}
}

// TestReadAllAnotherVersion: a server that checks If-Match on one version
// of an object and sends the next (versitygw 1.8's posix backend when a
// PUT replaces the file between its ETag lookup and its open; seen as a
// push array task's "read 30635 bytes, the object has 23016"), simulated
// by a proxy that, on a GET, writes the next version to the server and
// sends its bytes: ReadAll reads again and returns bytes with the ETag of
// their own version (a version of another size caught by its size, one of
// the same size by the sha256 the writer recorded); a server that always
// does so is an error naming the object. An object whose bytes and
// recorded sha256 disagree for good (damaged where it is stored) is
// returned, for the caller's checks to judge.
func TestReadAllAnotherVersion(t *testing.T) {
	s := s3test.Start(t, "bkt")
	target, _ := url.Parse(s.Endpoint)
	s.Setenv(t)
	direct, err := bucket.New()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	u, _ := bucket.Parse("s3://bkt/p")
	put := func(b []byte) string {
		sum := sha256.Sum256(b)
		etag, err := direct.PutBytes(ctx, u, "m.json", b, hex.EncodeToString(sum[:]), "")
		if err != nil {
			t.Error(err)
		}
		return etag
	}
	var mu sync.Mutex
	var next []string // versions a GET of m.json writes and sends, one a GET
	proxy := httptest.NewServer(&httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Host = r.In.Host
		},
		ModifyResponse: func(r *http.Response) error {
			mu.Lock()
			defer mu.Unlock()
			if r.Request.Method != http.MethodGet || !strings.HasSuffix(r.Request.URL.Path, "/m.json") || len(next) == 0 || r.StatusCode != 200 {
				return nil
			}
			v := []byte(next[0])
			next = next[1:]
			put(v)
			r.Body.Close()
			r.Body = io.NopCloser(bytes.NewReader(v))
			r.ContentLength = int64(len(v))
			r.Header.Set("Content-Length", strconv.Itoa(len(v)))
			return nil
		},
	})
	defer proxy.Close()
	t.Setenv("AWS_ENDPOINT_URL", proxy.URL)
	c, err := bucket.New()
	if err != nil {
		t.Fatal(err)
	}
	version := func(k int) string { return fmt.Sprintf(`{"version": 1, "epochs": [0, %d]}`, k) }
	put([]byte(version(1)))
	consistent := func(name string, b []byte, etag string) {
		t.Helper()
		now, err := c.Stat(ctx, u, "m.json")
		sum := sha256.Sum256(b)
		if err != nil || etag != now.ETag || hex.EncodeToString(sum[:]) != now.SHA256 {
			t.Fatalf("%s: ReadAll gave %q with ETag %s; the object is now %+v (%v)", name, b, etag, now, err)
		}
	}
	for _, c1 := range []struct {
		name     string
		versions []string
		want     string
	}{
		{"a longer version", []string{`{"version": 1, "epochs": [0, 1, 2, 3]}`}, `{"version": 1, "epochs": [0, 1, 2, 3]}`},
		{"versions of the same size, twice", []string{version(2), version(3)}, version(3)},
	} {
		mu.Lock()
		next = c1.versions
		mu.Unlock()
		b, e, err := c.ReadAll(ctx, u, "m.json", 1000)
		if err != nil || string(b) != c1.want {
			t.Fatalf("%s: ReadAll: %q %v, want %q", c1.name, b, err, c1.want)
		}
		consistent(c1.name, b, e)
		mu.Lock()
		left := len(next)
		mu.Unlock()
		if left != 0 {
			t.Fatalf("%s: %d versions not sent (the proxy saw no GET?)", c1.name, left)
		}
	}
	mu.Lock()
	next = nil
	for k := range 100 {
		next = append(next, version(k%10))
	}
	mu.Unlock()
	_, _, err = c.ReadAll(ctx, u, "m.json", 1000)
	if !errors.Is(err, bucket.ErrPrecondition) || !strings.Contains(err.Error(), "s3://bkt/p/m.json") || !strings.Contains(err.Error(), "replaced while read") {
		t.Fatalf("a server always sending another version: %v", err)
	}
	mu.Lock()
	next = nil
	mu.Unlock()
	damaged := []byte(version(4))
	etag, err := direct.PutBytes(ctx, u, "m.json", damaged, strings.Repeat("ab", 32), "")
	if err != nil {
		t.Fatal(err)
	}
	if b, e, err := c.ReadAll(ctx, u, "m.json", 1000); err != nil || !bytes.Equal(b, damaged) || e != etag {
		t.Fatalf("bytes and recorded sha256 disagreeing for good: %q %s %v, want its bytes, ETag %s and no error", b, e, err, etag)
	}
}
