// Command bench_s3_clients compares the two Go S3 clients clipshard push
// could use, minio-go v7 and aws-sdk-go-v2 (its transfer manager), on the
// server at AWS_ENDPOINT_URL (just bench s3-clients: versitygw on
// loopback): a multipart upload (16 MiB parts, 4 at once) and ranged GETs
// (8 MiB, 2 at once) of the same file, the clients interleaved in rounds;
// which checksum headers each sends; create-only writes (If-None-Match:
// *) answered 412 the second time. A separate module, so that clipshard
// itself depends on one client only.
//
//	go run . FILE BUCKET ROUNDS
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/clipshard/clipshard/bench/bench_s3_clients/awsc"
	"github.com/clipshard/clipshard/bench/bench_s3_clients/mc"
)

// recorder counts requests and notes the checksum headers they carry.
type recorder struct {
	mu       sync.Mutex
	requests int
	headers  map[string]bool
}

func (r *recorder) RoundTrip(req *http.Request) (*http.Response, error) {
	r.mu.Lock()
	r.requests++
	for k, v := range req.Header {
		lk := strings.ToLower(k)
		if strings.HasPrefix(lk, "x-amz-checksum") || strings.HasPrefix(lk, "x-amz-trailer") || strings.HasPrefix(lk, "x-amz-sdk-checksum") ||
			(lk == "content-encoding" && strings.Contains(strings.Join(v, ","), "aws-chunked")) {
			r.headers[lk+": "+strings.Join(v, ",")] = true
		}
	}
	r.mu.Unlock()
	return http.DefaultTransport.RoundTrip(req)
}

type client interface {
	Upload(ctx context.Context, bucket, key string, r io.Reader, size, part int64, threads int) error
	Range(ctx context.Context, bucket, key string, off, n int64) (int64, error)
	CreateOnly(ctx context.Context, bucket, key string, b []byte) int
}

func main() {
	if len(os.Args) != 4 {
		fmt.Fprintln(os.Stderr, "usage: bench_s3_clients FILE BUCKET ROUNDS")
		os.Exit(2)
	}
	path, bucket := os.Args[1], os.Args[2]
	rounds, _ := strconv.Atoi(os.Args[3])
	fi, err := os.Stat(path)
	if err != nil {
		fail(err)
	}
	size := fi.Size()
	ctx := context.Background()
	recs := map[string]*recorder{}
	clients := map[string]client{}
	for _, name := range []string{"minio-go", "aws-sdk-go-v2 (checksums when required)", "aws-sdk-go-v2 (defaults)"} {
		rec := &recorder{headers: map[string]bool{}}
		recs[name] = rec
		switch {
		case name == "minio-go":
			c, err := mc.New(rec)
			if err != nil {
				fail(err)
			}
			clients[name] = c
		default:
			clients[name] = awsc.New(rec, !strings.Contains(name, "defaults"))
		}
	}
	names := []string{"minio-go", "aws-sdk-go-v2 (checksums when required)", "aws-sdk-go-v2 (defaults)"}
	up := map[string][]float64{}
	get := map[string][]float64{}
	for round := 1; round <= rounds; round++ {
		for _, name := range names {
			c := clients[name]
			key := fmt.Sprintf("clients/%d/%d", round, len(name))
			f, err := os.Open(path)
			if err != nil {
				fail(err)
			}
			t := time.Now()
			err = c.Upload(ctx, bucket, key, f, size, 16<<20, 4)
			f.Close()
			if err != nil {
				fmt.Printf("{\"client\": %q, \"round\": %d, \"upload_error\": %q}\n", name, round, err.Error())
				continue
			}
			up[name] = append(up[name], mib(size, time.Since(t)))
			t = time.Now()
			var wg sync.WaitGroup
			var mu sync.Mutex
			var got int64
			sem := make(chan struct{}, 2)
			for off := int64(0); off < size; off += 8 << 20 {
				wg.Add(1)
				sem <- struct{}{}
				go func(off int64) {
					defer wg.Done()
					defer func() { <-sem }()
					n, err := c.Range(ctx, bucket, key, off, min(8<<20, size-off))
					if err != nil {
						fail(err)
					}
					mu.Lock()
					got += n
					mu.Unlock()
				}(off)
			}
			wg.Wait()
			if got != size {
				fail(fmt.Errorf("%s: read %d bytes of %d", name, got, size))
			}
			get[name] = append(get[name], mib(size, time.Since(t)))
		}
	}
	for _, name := range names {
		c := clients[name]
		key := fmt.Sprintf("clients/create-only/%d", len(name))
		first, second := c.CreateOnly(ctx, bucket, key, []byte("a")), c.CreateOnly(ctx, bucket, key, []byte("b"))
		var hs []string
		for h := range recs[name].headers {
			hs = append(hs, h)
		}
		sort.Strings(hs)
		out, _ := json.Marshal(map[string]any{"client": name, "upload_MiB_s": up[name], "get_MiB_s": get[name],
			"create_only": []int{first, second}, "checksum_headers": hs, "requests": recs[name].requests})
		fmt.Println(string(out))
	}
}

func mib(n int64, d time.Duration) float64 { return float64(n) / (1 << 20) / d.Seconds() }

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bench_s3_clients:", err)
	os.Exit(1)
}
