// Checked uploads: an object is made only once its bytes were all read and
// the caller's check of them passed; the ETag an upload of given bytes gets.

package bucket

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"

	"github.com/clipshard/clipshard/internal/faults"
)

// PutChecked writes object rel of size bytes read in order from r, with
// its sha256 and partSize as metadata, and returns its ETag: one PUT of
// up to partSize bytes, else a multipart upload of parts of partSize, up
// to threads in flight (memory: partSize x (threads + 1)). check is
// called once every byte was read and sent, before the object is made:
// if it fails, the upload is aborted and no object is made (the error
// returned is check's, and says so if the abort failed too: the parts
// then stay until AbortUploads, or the bucket's own rule, removes them).
func (c *Client) PutChecked(ctx context.Context, u URL, rel string, r io.Reader, size int64, sha string, partSize int64, threads int, check func() error) (string, error) {
	o := c.putOptions(sha)
	o.UserMetadata["part-size"] = strconv.FormatInt(partSize, 10)
	core := minio.Core{Client: c.mc}
	if size <= partSize {
		buf := make([]byte, size)
		if _, err := io.ReadFull(r, buf); err != nil {
			return "", err
		}
		if err := check(); err != nil {
			return "", fmt.Errorf("%w (nothing was written to %s)", err, u.Name(rel))
		}
		faults.Point("push.complete")
		info, err := core.PutObject(ctx, u.Bucket, u.Key(rel), bytes.NewReader(buf), size, "", "", o)
		if err != nil {
			return "", c.wrap(err, u, rel)
		}
		return strings.Trim(info.ETag, `"`), nil
	}
	id, err := core.NewMultipartUpload(ctx, u.Bucket, u.Key(rel), o)
	if err != nil {
		return "", c.wrap(err, u, rel)
	}
	abort := func(cause error) error {
		faults.Point("push.abort")
		actx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := core.AbortMultipartUpload(actx, u.Bucket, u.Key(rel), id); err != nil && !errors.Is(c.wrap(err, u, rel), ErrNotFound) {
			return fmt.Errorf("%w (no object was made; aborting its multipart upload failed too: %v: its parts stay until a push of %s runs again, which aborts them)",
				cause, c.wrap(err, u, rel), u.Name(rel))
		}
		return fmt.Errorf("%w (no object was made: its upload was aborted)", cause)
	}
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		mu    sync.Mutex
		parts []minio.CompletePart
		first error
		wg    sync.WaitGroup
	)
	free := make(chan []byte, threads+1)
	for range threads + 1 {
		free <- nil
	}
	failed := func() error {
		mu.Lock()
		defer mu.Unlock()
		return first
	}
	for n, at := 1, int64(0); at < size; n, at = n+1, at+partSize {
		k := min(partSize, size-at)
		var buf []byte
		select {
		case buf = <-free:
		case <-pctx.Done():
		}
		if err := failed(); err != nil {
			break
		}
		if buf == nil {
			buf = make([]byte, partSize)
		}
		if _, err := io.ReadFull(r, buf[:k]); err != nil {
			mu.Lock()
			first = cmpErr(first, err)
			mu.Unlock()
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			p, err := core.PutObjectPart(pctx, u.Bucket, u.Key(rel), id, n, bytes.NewReader(buf[:k]), k, minio.PutObjectPartOptions{})
			mu.Lock()
			if err != nil {
				first = cmpErr(first, c.wrap(err, u, rel))
				cancel()
			} else {
				parts = append(parts, minio.CompletePart{PartNumber: n, ETag: p.ETag})
			}
			mu.Unlock()
			free <- buf
		}()
	}
	wg.Wait()
	if first == nil {
		first = ctx.Err()
	}
	if first == nil {
		first = check()
	}
	if first != nil {
		return "", abort(first)
	}
	sort.Slice(parts, func(a, b int) bool { return parts[a].PartNumber < parts[b].PartNumber })
	faults.Point("push.complete")
	info, err := core.CompleteMultipartUpload(ctx, u.Bucket, u.Key(rel), id, parts, o)
	if err != nil {
		// (made or not: the bytes were checked; a push again finds out)
		return "", abort(c.wrap(err, u, rel))
	}
	return strings.Trim(info.ETag, `"`), nil
}

func cmpErr(first, err error) error {
	if first != nil {
		return first
	}
	return err
}

// ETagHasher computes, from an object's bytes written to it in order, the
// ETag an S3 server gives the object PutChecked makes of them with
// partSize: the MD5 of its bytes (one PUT), or of its parts' MD5s and
// "-N" (N parts). (A server that encrypts with KMS, or computes ETags
// another way, gives others: they do not match, and what they would
// prove is sent again.)
type ETagHasher struct {
	size, part, n int64
	h             hash.Hash
	parts         []byte
}

// NewETagHasher is an ETagHasher of an object of size bytes uploaded in
// parts of partSize.
func NewETagHasher(size, partSize int64) *ETagHasher {
	return &ETagHasher{size: size, part: partSize, h: md5.New()}
}

func (e *ETagHasher) Write(p []byte) (int, error) {
	total := len(p)
	for len(p) > 0 {
		k := int64(len(p))
		if e.size > e.part {
			k = min(k, e.part-e.n%e.part)
		}
		e.h.Write(p[:k])
		e.n += k
		p = p[k:]
		if e.size > e.part && (e.n%e.part == 0 || e.n == e.size) {
			e.parts = e.h.Sum(e.parts)
			e.h.Reset()
		}
	}
	return total, nil
}

// Sum is the ETag (without quotes).
func (e *ETagHasher) Sum() string {
	if e.size <= e.part {
		return hex.EncodeToString(e.h.Sum(nil))
	}
	s := md5.Sum(e.parts)
	return hex.EncodeToString(s[:]) + "-" + strconv.Itoa(len(e.parts)/md5.Size)
}
