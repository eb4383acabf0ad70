// Package bucket reads and writes clipshard's folders in an S3-compatible
// bucket (s3://BUCKET/PREFIX: the same files under the same names, so
// that "aws s3 sync" and verify's checks carry over), through minio-go.
//
// The client is configured the standard way: credentials from
// AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (/ AWS_SESSION_TOKEN), else
// the profile AWS_PROFILE (default "default") of ~/.aws/credentials
// (AWS_SHARED_CREDENTIALS_FILE), else an instance role; the endpoint from
// AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL (default AWS S3), the region
// from AWS_REGION or AWS_DEFAULT_REGION (default us-east-1). Credentials
// are never logged or put in an error.
//
// Checksums are pinned: no checksum headers or trailing CRC headers are
// ever sent (minio-go sends trailers only to a server it is told supports
// them, which a non-AWS server may reject); a payload goes as
// UNSIGNED-PAYLOAD over https and chunk-signed (streaming SigV4,
// aws-chunked) over plain http; and each object clipshard writes carries
// its sha256 as user metadata (x-amz-meta-sha256), the hash its folder's
// SHA256SUMS records. minio-go against aws-sdk-go-v2:
// docs/BENCHMARKS-HISTORY.md, "The Go S3 client".
package bucket

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Errors; test with errors.Is.
var (
	ErrNotFound     = errors.New("bucket: no such object")
	ErrPrecondition = errors.New("bucket: precondition failed (the object changed, or exists)")
	ErrURL          = errors.New("bucket: not an s3://BUCKET/PREFIX URL")
)

// URL is a folder in a bucket: s3://Bucket/Prefix (Prefix has no leading
// or trailing slash; "" is the bucket's top).
type URL struct {
	Bucket, Prefix string
}

// IsURL reports whether s is written as an s3:// URL.
func IsURL(s string) bool { return strings.HasPrefix(s, "s3://") }

// Parse parses s3://BUCKET[/PREFIX].
func Parse(s string) (URL, error) {
	rest, ok := strings.CutPrefix(s, "s3://")
	if !ok {
		return URL{}, fmt.Errorf("%w: %q", ErrURL, s)
	}
	b, p, _ := strings.Cut(rest, "/")
	p = strings.Trim(p, "/")
	if b == "" || strings.ContainsAny(b, " \\") || (p != "" && path.Clean(p) != p) || strings.HasPrefix(p, "../") || p == ".." {
		return URL{}, fmt.Errorf("%w: %q (want s3://BUCKET/PREFIX, a clean prefix)", ErrURL, s)
	}
	return URL{Bucket: b, Prefix: p}, nil
}

// String is s3://Bucket/Prefix.
func (u URL) String() string {
	if u.Prefix == "" {
		return "s3://" + u.Bucket
	}
	return "s3://" + u.Bucket + "/" + u.Prefix
}

// Key is the object key of rel (a slash-separated path inside the folder).
func (u URL) Key(rel string) string {
	if u.Prefix == "" {
		return rel
	}
	return u.Prefix + "/" + rel
}

// Name is what errors call object rel: s3://Bucket/Prefix/rel.
func (u URL) Name(rel string) string { return "s3://" + u.Bucket + "/" + u.Key(rel) }

// Client is a connection to one S3-compatible endpoint. Safe for
// concurrent use.
type Client struct {
	mc        *minio.Client
	Endpoint  string                   // for messages: scheme://host, no credentials
	defaulted bool                     // no AWS_ENDPOINT_URL: AWS's own S3
	creds     *credentials.Credentials // (for messages: whether any were found)
	meta      map[string]string        // user metadata every write adds (WithClaim)
}

// WithClaim is a client whose every write also records claim (the
// identity of the content a push writes, x-amz-meta-claim), so that an
// object tells which push's it is.
func (c *Client) WithClaim(claim string) *Client {
	d := *c
	d.meta = map[string]string{"claim": claim}
	return &d
}

// Object is what a HEAD (or a listing) says of an object.
type Object struct {
	Size   int64
	ETag   string // without quotes
	SHA256 string // x-amz-meta-sha256, "" if absent (or from a listing)
	// PartSize is x-amz-meta-part-size, the part size PutChecked wrote
	// the object in (0 if absent): the ETag its bytes should have is
	// then known (ETagHasher).
	PartSize int64
	// Claim is x-amz-meta-claim ("" if absent): see WithClaim.
	Claim string
}

// New makes a client from the environment (see the package doc).
func New() (*Client, error) {
	ep := os.Getenv("AWS_ENDPOINT_URL_S3")
	if ep == "" {
		ep = os.Getenv("AWS_ENDPOINT_URL")
	}
	host, secure := "s3.amazonaws.com", true
	if ep != "" {
		u, err := url.Parse(ep)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil {
			return nil, fmt.Errorf("bucket: AWS_ENDPOINT_URL %q: want http(s)://HOST[:PORT] (no credentials in it)", redact(ep))
		}
		host, secure = u.Host, u.Scheme == "https"
	}
	region := os.Getenv("AWS_REGION")
	if region == "" {
		region = os.Getenv("AWS_DEFAULT_REGION")
	}
	if region == "" {
		region = "us-east-1"
	}
	creds := credentials.NewChainCredentials([]credentials.Provider{
		&credentials.EnvAWS{},
		&credentials.FileAWSCredentials{Filename: os.Getenv("AWS_SHARED_CREDENTIALS_FILE")},
		&credentials.IAM{},
	})
	lookup := minio.BucketLookupAuto
	if ep != "" {
		lookup = minio.BucketLookupPath // S3-compatible servers: path style
	}
	mc, err := minio.New(host, &minio.Options{
		Creds: creds, Secure: secure, Region: region, BucketLookup: lookup,
		TrailingHeaders: false, // pinned: no trailing checksum headers (see the package doc)
		MaxRetries:      10,    // minio-go retries 5xx/SlowDown/resets with jittered backoff
	})
	if err != nil {
		return nil, fmt.Errorf("bucket: %s: %v", host, err)
	}
	scheme := "https"
	if !secure {
		scheme = "http"
	}
	return &Client{mc: mc, Endpoint: scheme + "://" + host, defaulted: ep == "", creds: creds}, nil
}

// redact hides what could be a secret in an endpoint string.
func redact(s string) string {
	if u, err := url.Parse(s); err == nil && u.User != nil {
		u.User = url.User("REDACTED")
		return u.String()
	}
	return s
}

// wrap turns a minio error into one naming the object, with ErrNotFound
// or ErrPrecondition where it is one.
func (c *Client) wrap(err error, u URL, rel string) error {
	if err == nil {
		return nil
	}
	r := minio.ToErrorResponse(err)
	switch {
	case r.StatusCode == http.StatusNotFound || r.Code == "NoSuchKey" || r.Code == "NotFound":
		return fmt.Errorf("%s: %w", u.Name(rel), ErrNotFound)
	case r.StatusCode == http.StatusPreconditionFailed || r.Code == "PreconditionFailed":
		return fmt.Errorf("%s: %w", u.Name(rel), ErrPrecondition)
	case r.Code == "NoSuchBucket":
		return fmt.Errorf("%s: no bucket %q at %s%s", u.Name(rel), u.Bucket, c.Endpoint, c.endpointHint())
	case r.StatusCode == http.StatusForbidden || r.Code == "AccessDenied" || r.Code == "InvalidAccessKeyId" || r.Code == "SignatureDoesNotMatch":
		return fmt.Errorf("%s: %v (%s at %s): %s", u.Name(rel), err, r.Code, c.Endpoint, c.credentialsHint())
	}
	var ne net.Error
	if errors.As(err, &ne) || isDNS(err) {
		return fmt.Errorf("%s: cannot reach %s: %v%s", u.Name(rel), c.Endpoint, err, c.endpointHint())
	}
	return fmt.Errorf("%s: %v", u.Name(rel), err)
}

// endpointHint says where the endpoint came from, and how to give another.
func (c *Client) endpointHint() string {
	if c.defaulted {
		return " (AWS's own S3: no AWS_ENDPOINT_URL is set; for another S3 server, e.g. MinIO or Ceph, set AWS_ENDPOINT_URL=http(s)://HOST:PORT)"
	}
	return " (AWS_ENDPOINT_URL: is the server up, and is this its address?)"
}

// credentialsHint says which credentials the request went with, and where
// others are given.
func (c *Client) credentialsHint() string {
	v, err := c.creds.GetWithContext(nil)
	if err != nil || v.AccessKeyID == "" {
		return "no credentials were found: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE (a profile of ~/.aws/credentials, or AWS_SHARED_CREDENTIALS_FILE)"
	}
	return fmt.Sprintf("the credentials used (access key %s…, from %s) are refused for this bucket or object: check AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or AWS_PROFILE, and the key's rights", short(v.AccessKeyID), c.credsFrom())
}

func short(k string) string {
	if len(k) > 4 {
		return k[:4]
	}
	return k
}

// credsFrom names where the credentials came from.
func (c *Client) credsFrom() string {
	if os.Getenv("AWS_ACCESS_KEY_ID") != "" {
		return "AWS_ACCESS_KEY_ID"
	}
	if p := os.Getenv("AWS_PROFILE"); p != "" {
		return "AWS_PROFILE " + p
	}
	return "~/.aws/credentials' default profile, or an instance role"
}

// isDNS reports a name that did not resolve.
func isDNS(err error) bool {
	var de *net.DNSError
	return errors.As(err, &de)
}

// Stat HEADs object rel.
func (c *Client) Stat(ctx context.Context, u URL, rel string) (Object, error) {
	st, err := c.mc.StatObject(ctx, u.Bucket, u.Key(rel), minio.StatObjectOptions{})
	if err != nil {
		return Object{}, c.wrap(err, u, rel)
	}
	return objectOf(st), nil
}

func objectOf(st minio.ObjectInfo) Object {
	p, _ := strconv.ParseInt(st.UserMetadata["Part-Size"], 10, 64)
	return Object{Size: st.Size, ETag: strings.Trim(st.ETag, `"`), SHA256: st.UserMetadata["Sha256"], PartSize: max(p, 0), Claim: st.UserMetadata["Claim"]}
}

// List lists the objects under the folder, by their path relative to it.
func (c *Client) List(ctx context.Context, u URL) (map[string]Object, error) {
	return c.ListUnder(ctx, u, "")
}

// ListUnder lists the objects under the folder's subfolder dir ("" the
// folder itself), by their path relative to the folder.
func (c *Client) ListUnder(ctx context.Context, u URL, dir string) (map[string]Object, error) {
	prefix := ""
	if u.Prefix != "" {
		prefix = u.Prefix + "/"
	}
	under := prefix
	if dir != "" {
		under += strings.Trim(dir, "/") + "/"
	}
	out := map[string]Object{}
	for o := range c.mc.ListObjects(ctx, u.Bucket, minio.ListObjectsOptions{Prefix: under, Recursive: true}) {
		if o.Err != nil {
			return nil, c.wrap(o.Err, u, dir)
		}
		out[strings.TrimPrefix(o.Key, prefix)] = Object{Size: o.Size, ETag: strings.Trim(o.ETag, `"`)}
	}
	return out, nil
}

// Range returns bytes [off, off+n) of object rel (a bounded range, never
// an open-ended one), checked to be n long. With etag, the object must
// still be that version (If-Match): a replaced object is ErrPrecondition.
func (c *Client) Range(ctx context.Context, u URL, rel string, off, n int64, etag string) ([]byte, error) {
	if n <= 0 {
		return nil, nil
	}
	var o minio.GetObjectOptions
	if err := o.SetRange(off, off+n-1); err != nil {
		return nil, err
	}
	if etag != "" {
		o.SetMatchETag(etag)
	}
	r, err := c.mc.GetObject(ctx, u.Bucket, u.Key(rel), o)
	if err != nil {
		return nil, c.wrap(err, u, rel)
	}
	defer r.Close()
	b := make([]byte, n)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("%s: bytes %d..%d: %w", u.Name(rel), off, off+n, c.wrap(err, u, rel))
	}
	return b, nil
}

// Stream returns the whole object rel as a stream (for hashing it
// without storing it), with its version and size; Close it.
func (c *Client) Stream(ctx context.Context, u URL, rel string) (io.ReadCloser, Object, error) {
	r, err := c.mc.GetObject(ctx, u.Bucket, u.Key(rel), minio.GetObjectOptions{})
	if err != nil {
		return nil, Object{}, c.wrap(err, u, rel)
	}
	st, err := r.Stat()
	if err != nil {
		r.Close()
		return nil, Object{}, c.wrap(err, u, rel)
	}
	return r, objectOf(st), nil
}

// ReadAll reads a small object whole (a manifest): at most limit bytes,
// with its ETag.
func (c *Client) ReadAll(ctx context.Context, u URL, rel string, limit int64) ([]byte, string, error) {
	for try := 0; ; try++ {
		b, etag, err := c.readAll(ctx, u, rel, limit)
		// Replaced between the response's first bytes and the rest (the
		// client reads on with If-Match), or bytes of another version than
		// the head described (see readAll): read the new version.
		if errors.Is(err, ErrPrecondition) && try < 8 {
			time.Sleep(time.Duration(10*(try+1)) * time.Millisecond)
			continue
		}
		return b, etag, err
	}
}

func (c *Client) readAll(ctx context.Context, u URL, rel string, limit int64) ([]byte, string, error) {
	r, obj, err := c.Stream(ctx, u, rel)
	if err != nil {
		return nil, "", err
	}
	defer r.Close()
	if obj.Size > limit {
		return nil, "", fmt.Errorf("%s: %d bytes, more than a manifest may have (%d)", u.Name(rel), obj.Size, limit)
	}
	b, err := io.ReadAll(io.LimitReader(r, limit+1))
	if err != nil {
		return nil, "", c.wrap(err, u, rel)
	}
	// The bytes must be the version the response's head described (its
	// size, and its sha256 where the writer recorded one), the version
	// whose ETag is returned for a compare-and-swap: a server may check
	// If-Match on one version and send the next (versitygw 1.8's posix
	// backend looks up the ETag, then opens the file a concurrent PUT has
	// replaced meanwhile). Not so: replaced while read, read again.
	if int64(len(b)) != obj.Size {
		return nil, "", fmt.Errorf("%s: read %d bytes, the object had %d as the read began (%w)", u.Name(rel), len(b), obj.Size, ErrPrecondition)
	}
	if obj.SHA256 != "" {
		if h := sha256.Sum256(b); hex.EncodeToString(h[:]) != obj.SHA256 {
			// Another version, or this one's bytes and metadata disagree
			// (damaged where it is stored: the caller's checks of the
			// bytes say so, as verify does): the ETag now tells which.
			if now, err := c.Stat(ctx, u, rel); err != nil || now.ETag != obj.ETag || now.Size != obj.Size {
				return nil, "", fmt.Errorf("%s: its bytes' sha256 is %x, not the %s its head recorded, and it is now another "+
					"version (replaced while read: %w)", u.Name(rel), h, obj.SHA256, ErrPrecondition)
			}
		}
	}
	return b, obj.ETag, nil
}

// Cond is a conditional write: "" unconditional, "*" create only
// (If-None-Match: *), or an ETag the object must have (If-Match).
type Cond string

// CreateOnly is the Cond of a write that must not replace an object.
const CreateOnly Cond = "*"

// PutBytes writes a small object (a manifest) in one PUT under cond,
// with its sha256 as metadata, and returns its new ETag.
func (c *Client) PutBytes(ctx context.Context, u URL, rel string, data []byte, sha string, cond Cond) (string, error) {
	o := c.putOptions(sha)
	switch cond {
	case "":
	case CreateOnly:
		o.SetMatchETagExcept("*")
	default:
		o.SetMatchETag(string(cond))
	}
	info, err := c.mc.PutObject(ctx, u.Bucket, u.Key(rel), bytes.NewReader(data), int64(len(data)), o)
	if err != nil {
		return "", c.wrap(err, u, rel)
	}
	return strings.Trim(info.ETag, `"`), nil
}

func (c *Client) putOptions(sha string) minio.PutObjectOptions {
	o := minio.PutObjectOptions{ContentType: "application/octet-stream", SendContentMd5: false, DisableContentSha256: false}
	o.UserMetadata = map[string]string{}
	for k, v := range c.meta {
		o.UserMetadata[k] = v
	}
	if sha != "" {
		o.UserMetadata["sha256"] = sha
	}
	return o
}

// Remove deletes object rel (no error if it is not there).
func (c *Client) Remove(ctx context.Context, u URL, rel string) error {
	err := c.mc.RemoveObject(ctx, u.Bucket, u.Key(rel), minio.RemoveObjectOptions{})
	if err != nil && errors.Is(c.wrap(err, u, rel), ErrNotFound) {
		return nil
	}
	return c.wrap(err, u, rel)
}

// AbortUploads aborts the incomplete multipart uploads of object rel (a
// killed push's parts).
func (c *Client) AbortUploads(ctx context.Context, u URL, rel string) error {
	err := c.mc.RemoveIncompleteUpload(ctx, u.Bucket, u.Key(rel))
	if err != nil && errors.Is(c.wrap(err, u, rel), ErrNotFound) {
		return nil
	}
	return c.wrap(err, u, rel)
}
