package bucket_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
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
	if err := c.PutStream(ctx, u, "big.npy", bytes.NewReader(big), int64(len(big)), "abc123", 5<<20, 2); err != nil {
		t.Fatal(err)
	}
	st, err := c.Stat(ctx, u, "big.npy")
	if err != nil || st.Size != int64(len(big)) || st.SHA256 != "abc123" || !strings.HasSuffix(st.ETag, "-3") {
		t.Fatalf("multipart: %+v %v", st, err)
	}
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
