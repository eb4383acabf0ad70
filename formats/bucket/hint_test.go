package bucket

import (
	"errors"
	"net"
	"strings"
	"testing"
)

// TestErrorsNameTheFix (#64.3): a name that does not resolve, with no
// AWS_ENDPOINT_URL set, says that AWS's own S3 was asked and how to name
// another server; with one set, asks whether it is up. (The refused and
// missing credentials are checked against a server: transform/push's
// TestBucketCredentialsNamed.)
func TestErrorsNameTheFix(t *testing.T) {
	dns := &net.DNSError{Err: "no such host", Name: "bkt.s3.dualstack.us-east-1.amazonaws.com"}
	u := URL{Bucket: "bkt", Prefix: "ds"}
	for _, c := range []struct {
		client *Client
		want   []string
	}{
		{&Client{Endpoint: "https://s3.amazonaws.com", defaulted: true}, []string{"cannot reach https://s3.amazonaws.com", "no AWS_ENDPOINT_URL is set", "set AWS_ENDPOINT_URL=http(s)://HOST:PORT"}},
		{&Client{Endpoint: "http://minio:9000"}, []string{"cannot reach http://minio:9000", "AWS_ENDPOINT_URL: is the server up"}},
	} {
		err := c.client.wrap(dns, u, "dataset.json")
		if err == nil || errors.Is(err, ErrNotFound) {
			t.Fatalf("wrap: %v", err)
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Fatalf("%q does not say %q", err, w)
			}
		}
	}
}
