package s3test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Fault is what the fault proxy does to the first requests of a GET of
// an object of an epoch folder (a key holding "/epoch-": its shard files
// and BLOCKSUMS), per object.
type Fault string

// The faults.
const (
	SlowDown      Fault = "503"            // 503 SlowDown, before anything is sent
	Reset         Fault = "reset"          // the connection reset in the middle of the body
	Truncate      Fault = "truncate"       // the body ends early (less than Content-Length)
	Stall         Fault = "stall"          // the body stops for StallFor in the middle
	Overwrite     Fault = "overwrite"      // a shard file replaced (same size, new bytes) after its first GET
	OverwriteSums Fault = "overwrite-sums" // an epoch's BLOCKSUMS replaced so
	// AbortFails answers every abort of a multipart upload (a DELETE with
	// uploadId) 500 InternalError, and every other request unchanged.
	AbortFails Fault = "abort-500"
	// PutSlowDown answers the first `times` PUTs of each part (or whole
	// object) of a .npy 503 SlowDown; PutReset reads half of each such
	// PUT's body, then drops the connection.
	PutSlowDown Fault = "put-503"
	PutReset    Fault = "put-reset"
)

// MaxFaulted is how many objects a proxy injects faults into (the first
// ones requested).
const MaxFaulted = 3

// StallFor is how long a Stall stops the body (the client's read timeout
// must be shorter for it to give up and read again).
const StallFor = 3 * time.Second

// Proxy is a fault-injecting proxy on 127.0.0.1 in front of s, for t:
// each shard object's first `times` GETs get fault f (Overwrite: once),
// every other request passes unchanged. Bounded: it only ever delays or
// cuts responses, and stops with t.
type Proxy struct {
	URL    string
	mu     sync.Mutex
	seen   map[string]int
	Faults int // faults injected
}

// StartProxy starts a fault proxy in front of server s (whose posix root
// the Overwrite fault writes into).
func StartProxy(t testing.TB, s *Server, f Fault, times int) *Proxy {
	t.Helper()
	target, _ := url.Parse(s.Endpoint)
	p := &Proxy{seen: map[string]int{}}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.SetURL(target)
			r.Out.Host = r.In.Host // signed with the host the client used
		},
		ErrorLog: log.New(io.Discard, "", 0), // the resets it makes
	}
	rp.ModifyResponse = func(resp *http.Response) error {
		if _, ok := resp.Request.Context().Value(faultKey{}).(string); !ok {
			return nil
		}
		switch f {
		case Reset:
			resp.Body = &cutBody{r: resp.Body, after: resp.ContentLength / 2, err: errors.New("reset")}
		case Truncate:
			resp.Body = &cutBody{r: resp.Body, after: resp.ContentLength / 2, err: io.EOF}
		case Stall:
			resp.Body = &cutBody{r: resp.Body, after: resp.ContentLength / 2, stall: StallFor}
		}
		return nil
	}
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := r.URL.Path
		if (f == PutSlowDown || f == PutReset) && r.Method == http.MethodPut && strings.HasSuffix(key, ".npy") {
			p.mu.Lock()
			part := key + "?" + r.URL.Query().Get("partNumber")
			p.seen[part]++
			hit := p.seen[part] <= times
			if hit {
				p.Faults++
			}
			p.mu.Unlock()
			if hit && f == PutSlowDown {
				io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/xml")
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message><Resource>%s</Resource></Error>`, key)
				return
			}
			if hit {
				if n := r.ContentLength / 2; n > 0 {
					io.CopyN(io.Discard, r.Body, n)
				}
				if hj, ok := w.(http.Hijacker); ok {
					if conn, _, err := hj.Hijack(); err == nil {
						conn.Close()
						return
					}
				}
				panic(http.ErrAbortHandler)
			}
			rp.ServeHTTP(w, r)
			return
		}
		if f == AbortFails {
			if r.Method == http.MethodDelete && r.URL.Query().Has("uploadId") {
				p.mu.Lock()
				p.Faults++
				p.mu.Unlock()
				w.Header().Set("Content-Type", "application/xml")
				w.WriteHeader(http.StatusInternalServerError)
				fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>InternalError</Code><Message>We encountered an internal error. Please try again.</Message><Resource>%s</Resource></Error>`, key)
				return
			}
			rp.ServeHTTP(w, r)
			return
		}
		sums := strings.HasSuffix(key, "/BLOCKSUMS")
		if r.Method == http.MethodGet && strings.Contains(key, "/epoch-") && r.Header.Get("Range") != "" &&
			(f != Overwrite || !sums) && (f != OverwriteSums || sums) {
			p.mu.Lock()
			if _, ok := p.seen[key]; !ok && len(p.seen) >= MaxFaulted {
				key = "" // the first MaxFaulted objects only: bounded in time
			}
			p.seen[key]++
			n := p.seen[key]
			limit := times
			if f == Overwrite || f == OverwriteSums {
				limit = 1
			}
			hit := key != "" && n <= limit
			if hit {
				p.Faults++
			}
			p.mu.Unlock()
			if hit && f == SlowDown {
				w.Header().Set("Content-Type", "application/xml")
				w.WriteHeader(http.StatusServiceUnavailable)
				fmt.Fprintf(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>SlowDown</Code><Message>Please reduce your request rate.</Message><Resource>%s</Resource></Error>`, key)
				return
			}
			if hit {
				r = r.WithContext(contextWith(r, key))
			}
			if hit && (f == Overwrite || f == OverwriteSums) {
				// Answered, then replaced behind the reader's back (new
				// bytes, same size) before its next ranged read.
				rp.ServeHTTP(w, r)
				path := filepath.Join(s.Root, filepath.FromSlash(strings.TrimPrefix(key, "/")))
				if fi, err := os.Stat(path); err == nil {
					b := make([]byte, fi.Size())
					for i := range b {
						b[i] = 0x5a
					}
					os.WriteFile(path, b, 0o644)
				}
				return
			}
		}
		rp.ServeHTTP(w, r)
	})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	p.URL = srv.URL
	return p
}

type faultKey struct{}

// cutBody passes after bytes of r, then fails with err (a reset, or a
// body ending early), or stops for stall and goes on.
type cutBody struct {
	r     io.ReadCloser
	after int64
	n     int64
	err   error
	stall time.Duration
}

func (c *cutBody) Read(p []byte) (int, error) {
	if c.n >= c.after {
		if c.stall > 0 {
			time.Sleep(c.stall)
			c.stall = 0
		} else if c.err != nil {
			return 0, c.err
		}
	}
	if c.n < c.after && int64(len(p)) > c.after-c.n {
		p = p[:c.after-c.n]
	}
	k, err := c.r.Read(p)
	c.n += int64(k)
	return k, err
}

func (c *cutBody) Close() error { return c.r.Close() }

func contextWith(r *http.Request, key string) context.Context {
	return context.WithValue(r.Context(), faultKey{}, key)
}
