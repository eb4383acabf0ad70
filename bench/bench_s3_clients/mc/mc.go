// Package mc is the minio-go side of the client comparison.
package mc

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/url"
	"os"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Client is a minio-go client set up as clipshard's formats/bucket sets
// it up (path style, no trailing checksum headers).
type Client struct{ c *minio.Client }

// New connects to AWS_ENDPOINT_URL with the environment's keys, sending
// requests through rt.
func New(rt http.RoundTripper) (*Client, error) {
	u, err := url.Parse(os.Getenv("AWS_ENDPOINT_URL"))
	if err != nil {
		return nil, err
	}
	c, err := minio.New(u.Host, &minio.Options{
		Creds:  credentials.NewStaticV4(os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY"), ""),
		Secure: u.Scheme == "https", Region: "us-east-1", BucketLookup: minio.BucketLookupPath,
		TrailingHeaders: false, Transport: rt,
	})
	return &Client{c: c}, err
}

// Upload sends r (size bytes) as bucket/key in parts of part bytes, threads at once.
func (m *Client) Upload(ctx context.Context, bucket, key string, r io.Reader, size, part int64, threads int) error {
	_, err := m.c.PutObject(ctx, bucket, key, r, size, minio.PutObjectOptions{
		PartSize: uint64(part), NumThreads: uint(threads), ConcurrentStreamParts: true, ContentType: "application/octet-stream"})
	return err
}

// Range reads bytes [off, off+n) of bucket/key to nothing.
func (m *Client) Range(ctx context.Context, bucket, key string, off, n int64) (int64, error) {
	var o minio.GetObjectOptions
	o.SetRange(off, off+n-1)
	obj, err := m.c.GetObject(ctx, bucket, key, o)
	if err != nil {
		return 0, err
	}
	defer obj.Close()
	return io.Copy(io.Discard, obj)
}

// CreateOnly writes a small object unless one is there (If-None-Match: *);
// it returns the HTTP status of the answer.
func (m *Client) CreateOnly(ctx context.Context, bucket, key string, b []byte) int {
	var o minio.PutObjectOptions
	o.SetMatchETagExcept("*")
	_, err := m.c.PutObject(ctx, bucket, key, bytes.NewReader(b), int64(len(b)), o)
	if err == nil {
		return 200
	}
	return minio.ToErrorResponse(err).StatusCode
}
