// Package awsc is the aws-sdk-go-v2 side of the client comparison.
package awsc

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"strconv"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/feature/s3/transfermanager"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// Client is an aws-sdk-go-v2 S3 client (path style); with pinned, request
// and response checksums only where required, else the SDK's defaults.
type Client struct {
	c      *s3.Client
	pinned bool
}

// New connects to AWS_ENDPOINT_URL with the environment's keys, sending
// requests through rt.
func New(rt http.RoundTripper, pinned bool) *Client {
	cfg := aws.Config{
		Region:      "us-east-1",
		Credentials: credentials.NewStaticCredentialsProvider(os.Getenv("AWS_ACCESS_KEY_ID"), os.Getenv("AWS_SECRET_ACCESS_KEY"), ""),
		HTTPClient:  &http.Client{Transport: rt},
	}
	if pinned {
		cfg.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		cfg.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	}
	c := s3.NewFromConfig(cfg, func(o *s3.Options) {
		o.BaseEndpoint = aws.String(os.Getenv("AWS_ENDPOINT_URL"))
		o.UsePathStyle = true
	})
	return &Client{c: c, pinned: pinned}
}

// Upload sends r (size bytes) as bucket/key with the SDK's transfer
// manager, in parts of part bytes, threads at once.
func (a *Client) Upload(ctx context.Context, bucket, key string, r io.Reader, size, part int64, threads int) error {
	tm := transfermanager.New(a.c, func(o *transfermanager.Options) {
		o.PartSizeBytes, o.Concurrency = part, threads
		if a.pinned {
			o.RequestChecksumCalculation = aws.RequestChecksumCalculationWhenRequired
		}
	})
	_, err := tm.UploadObject(ctx, &transfermanager.UploadObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), Body: r})
	return err
}

// Range reads bytes [off, off+n) of bucket/key to nothing.
func (a *Client) Range(ctx context.Context, bucket, key string, off, n int64) (int64, error) {
	out, err := a.c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key),
		Range: aws.String("bytes=" + strconv.FormatInt(off, 10) + "-" + strconv.FormatInt(off+n-1, 10))})
	if err != nil {
		return 0, err
	}
	defer out.Body.Close()
	return io.Copy(io.Discard, out.Body)
}

// CreateOnly writes a small object unless one is there (If-None-Match: *);
// it returns the HTTP status of the answer.
func (a *Client) CreateOnly(ctx context.Context, bucket, key string, b []byte) int {
	_, err := a.c.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(bucket), Key: aws.String(key), Body: bytes.NewReader(b), IfNoneMatch: aws.String("*")})
	if err == nil {
		return 200
	}
	var re *smithyhttp.ResponseError
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return -1
	}
	return -2
}
