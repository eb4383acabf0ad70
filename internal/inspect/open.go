// Opening the data a report samples: a file, or a bucket's object by
// bounded ranged GETs; and the error of a usage mistake.

package inspect

import (
	"context"
	"io"
	"path/filepath"

	"github.com/clipshard/clipshard/formats/bucket"
	"github.com/clipshard/clipshard/formats/regfile"
	"github.com/clipshard/clipshard/manifests"
)

// Opener opens a blob or shard file to read its rows: a file, or (a
// bucket folder) its object by bounded ranged GETs.
type Opener func(path string) (ReaderAt, error)

type ReaderAt interface {
	io.ReaderAt
	io.Closer
}

func LocalOpen(p string) (ReaderAt, error) {
	f, _, err := regfile.Open(p)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// BucketOpen opens the data objects of a mirrored bucket folder by ranged
// GETs of the version mirrored (If-Match: a replaced object is an error),
// and its other files (the manifests, mirrored whole) as files.
func BucketOpen(c *bucket.Client, m *manifests.Mirror) Opener {
	return func(p string) (ReaderAt, error) {
		rel, err := filepath.Rel(m.Dir, p)
		rel = filepath.ToSlash(rel)
		if err != nil || !m.Data[rel] {
			return LocalOpen(p)
		}
		return &objectReader{c: c, u: m.URL, rel: rel, obj: m.Objects[rel]}, nil
	}
}

type objectReader struct {
	c   *bucket.Client
	u   bucket.URL
	rel string
	obj bucket.Object
}

func (o *objectReader) ReadAt(p []byte, off int64) (int, error) {
	if off >= o.obj.Size {
		return 0, io.EOF
	}
	n := min(int64(len(p)), o.obj.Size-off)
	b, err := o.c.Range(context.Background(), o.u, o.rel, off, n, o.obj.ETag)
	copy(p, b)
	if err == nil && n < int64(len(p)) {
		err = io.EOF
	}
	return len(b), err
}

func (o *objectReader) Close() error { return nil }

// UsageError is a mistake in what the command was asked (a --clip or
// --sample naming nothing): the command exits 2 with Msg.
type UsageError struct{ Msg string }

func (u UsageError) Error() string { return u.Msg }
