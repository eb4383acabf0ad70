// Block sums (BLOCKSUMS): the sha256 of every block of a folder's data
// files, written by push beside them in a bucket, so that a reader that
// fetches a byte range of a file checks each block it fetches (a file's
// SHA256SUMS line covers only the whole file).

package manifests

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io/fs"
	"maps"
	"math/bits"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/clipshard/clipshard/formats/regfile"
)

// BlockSumsFile is the name of a block sums file: a dataset's at its top
// (its blobs), an epochs folder's in each epoch folder (that epoch's
// shard files).
const BlockSumsFile = "BLOCKSUMS"

// BlockSumsFormat is the "format" of a block sums file.
const BlockSumsFormat = "clipshard.blocksums"

// Bounds of a block sums file.
const (
	MinBlock        = 64 << 10 // the smallest block
	MaxBlock        = 64 << 20 // the largest
	MaxBlockDigests = 32 << 20 // bytes of digests a block sums file may hold
	targetDigests   = 8 << 20  // what BlockSizeFor aims at
)

// BlockSums are the block sums of a group of data files.
type BlockSums struct {
	Block int64       // bytes of a block: a power of two in [MinBlock, MaxBlock]
	Files []BlockFile // sorted by name, names unique
}

// BlockFile is one data file's entry: its name relative to the folder
// (as SHA256SUMS names it), size and sha256, the sha256 of its head (its
// first HeadBytes, the .npy header of a file clipshard wrote: what a
// reader opening the file reads first), the ETag of the object whose
// bytes the push that wrote the file proved (version 2; "" in version 1),
// and the sha256 of each of its blocks, 32 bytes each: block i is bytes
// [i*Block, min((i+1)*Block, Size)).
type BlockFile struct {
	Name    string
	Size    int64
	SHA256  string
	Head    string
	ETag    string
	Digests []byte
}

// HeadBytes is the size of a file's head (fewer if the file is smaller).
const HeadBytes = 4096

// Blocks is the number of blocks of a file of size bytes.
func (s *BlockSums) Blocks(size int64) int64 { return (size + s.Block - 1) / s.Block }

// BlockSizeFor is the block size for data files of total bytes: the
// smallest power of two from MinBlock whose digests take about 8 MiB at
// most (64 KiB up to 16 GiB of data; 256 KiB for 64 GiB).
func BlockSizeFor(total int64) int64 {
	b := int64(MinBlock)
	for b < MaxBlock && total/b*sha256.Size > targetDigests {
		b *= 2
	}
	return b
}

type blockHeader struct {
	Format        string            `json:"format"`
	Version       int               `json:"version"`
	Block         int64             `json:"block"`
	DigestsSHA256 string            `json:"digests_sha256"`
	Files         []blockFileHeader `json:"files"`
}

type blockFileHeader struct {
	Name   string  `json:"name"`
	Size   int64   `json:"size"`
	SHA256 string  `json:"sha256"`
	Head   string  `json:"head"`
	ETag   *string `json:"etag,omitempty"` // version 2
}

// Marshal is the file's bytes: one line of JSON (format, version, block,
// the sha256 of the digests, and each file's name, size, sha256, head and
// etag), then every file's digests in the order of the files, nothing
// else. Version 2 (each file's ETag: what push writes), or version 1 if
// no file has one.
func (s *BlockSums) Marshal() ([]byte, error) {
	h := blockHeader{Format: BlockSumsFormat, Version: 2, Block: s.Block, Files: []blockFileHeader{}}
	if len(s.Files) > 0 && s.Files[0].ETag == "" {
		h.Version = 1
	}
	var digests bytes.Buffer
	for _, f := range s.Files {
		if (f.ETag == "") != (h.Version == 1) {
			return nil, fmt.Errorf("block sums: %s: files with an etag and files without", f.Name)
		}
		e := blockFileHeader{Name: f.Name, Size: f.Size, SHA256: f.SHA256, Head: f.Head}
		if h.Version == 2 {
			e.ETag = &f.ETag
		}
		h.Files = append(h.Files, e)
		digests.Write(f.Digests)
	}
	d := sha256.Sum256(digests.Bytes())
	h.DigestsSHA256 = hex.EncodeToString(d[:])
	js, err := json.Marshal(h)
	if err != nil {
		return nil, err
	}
	out := append(js, '\n')
	if _, err := ParseBlockSums(append(out, digests.Bytes()...), "BLOCKSUMS"); err != nil {
		return nil, fmt.Errorf("block sums: %w", err) // (what a reader would refuse is not written)
	}
	return append(out, digests.Bytes()...), nil
}

// ParseBlockSums parses and checks a block sums file (name is for
// errors): the header's every field and type, names relative, sorted and
// unique, the digests exactly as many as the sizes say and their sha256
// the recorded one.
func ParseBlockSums(b []byte, name string) (*BlockSums, error) {
	bad := func(format string, a ...any) (*BlockSums, error) {
		return nil, fmt.Errorf("%w: %s: %s", ErrManifest, name, fmt.Sprintf(format, a...))
	}
	if len(b) > MaxManifest+MaxBlockDigests {
		return bad("%d bytes, more than a block sums file may have", len(b))
	}
	line, digests, ok := bytes.Cut(b, []byte("\n"))
	if !ok || len(line) > MaxManifest {
		return bad("no header line")
	}
	var h blockHeader
	dec := json.NewDecoder(bytes.NewReader(line))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&h); err != nil {
		return bad("header: %v", err)
	}
	if dec.More() {
		return bad("header: more than one JSON value")
	}
	if h.Format != BlockSumsFormat || (h.Version != 1 && h.Version != 2) {
		return bad("format %q version %d, want %q version 1 or 2 (a newer clipshard wrote it? upgrade)", h.Format, h.Version, BlockSumsFormat)
	}
	if h.Block < MinBlock || h.Block > MaxBlock || bits.OnesCount64(uint64(h.Block)) != 1 {
		return bad("block %d: want a power of two from %d to %d", h.Block, MinBlock, MaxBlock)
	}
	if h.Files == nil {
		return bad("no files list")
	}
	s := &BlockSums{Block: h.Block}
	var want int64
	for i, f := range h.Files {
		if err := CheckRelPath(f.Name); err != nil {
			return bad("file %d: %v", i, err)
		}
		if i > 0 && f.Name <= h.Files[i-1].Name {
			return bad("file %q: names not sorted and unique", f.Name)
		}
		if f.Size < 0 || f.Size > 1<<50 {
			return bad("file %q: size %d", f.Name, f.Size)
		}
		if !isHexSum(f.SHA256) || !isHexSum(f.Head) {
			return bad("file %q: sha256 %q or head %q is not 64 lowercase hex digits", f.Name, f.SHA256, f.Head)
		}
		etag := ""
		switch {
		case h.Version == 1 && f.ETag != nil:
			return bad("file %q: an etag in version 1", f.Name)
		case h.Version == 2 && (f.ETag == nil || !isETag(*f.ETag)):
			return bad("file %q: etag %v: want the object's ETag (hex digits, then -PARTS if multipart)", f.Name, f.ETag)
		case f.ETag != nil:
			etag = *f.ETag
		}
		n := s.Blocks(f.Size) * sha256.Size
		if want += n; want > MaxBlockDigests {
			return bad("more than %d bytes of digests", MaxBlockDigests)
		}
		s.Files = append(s.Files, BlockFile{Name: f.Name, Size: f.Size, SHA256: f.SHA256, Head: f.Head, ETag: etag})
	}
	if int64(len(digests)) != want {
		return bad("%d bytes of digests, the sizes make %d", len(digests), want)
	}
	if d := sha256.Sum256(digests); hex.EncodeToString(d[:]) != h.DigestsSHA256 {
		return bad("its digests' sha256 is not the recorded %q (damaged)", h.DigestsSHA256)
	}
	at := int64(0)
	for i := range s.Files {
		n := s.Blocks(s.Files[i].Size) * sha256.Size
		s.Files[i].Digests = digests[at : at+n : at+n]
		at += n
	}
	return s, nil
}

// isETag reports whether s is an ETag as S3 servers make them: 1 to 128
// characters of letters, digits and '-' (quotes stripped).
func isETag(s string) bool {
	if len(s) == 0 || len(s) > 128 {
		return false
	}
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c == '-') {
			return false
		}
	}
	return true
}

func isHexSum(s string) bool {
	if len(s) != 64 {
		return false
	}
	for _, c := range s {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// File is the entry of name (nil if none).
func (s *BlockSums) File(name string) *BlockFile {
	i, ok := slices.BinarySearchFunc(s.Files, name, func(f BlockFile, n string) int {
		switch {
		case f.Name < n:
			return -1
		case f.Name > n:
			return 1
		}
		return 0
	})
	if !ok {
		return nil
	}
	return &s.Files[i]
}

// BlockHasher is an io.Writer that computes the sha256 of every block of
// what is written to it, and of its head.
type BlockHasher struct {
	block, n int64 // block size; bytes of the current block written
	h, head  hash.Hash
	headN    int
	digests  []byte
}

// NewBlockHasher is a BlockHasher of blocks of block bytes.
func NewBlockHasher(block int64) *BlockHasher {
	return &BlockHasher{block: block, h: sha256.New(), head: sha256.New()}
}

// Write hashes p; it never fails.
func (b *BlockHasher) Write(p []byte) (int, error) {
	total := len(p)
	if b.headN < HeadBytes {
		k := min(len(p), HeadBytes-b.headN)
		b.head.Write(p[:k])
		b.headN += k
	}
	for len(p) > 0 {
		k := min(int64(len(p)), b.block-b.n)
		b.h.Write(p[:k])
		b.n += k
		p = p[k:]
		if b.n == b.block {
			b.digests = b.h.Sum(b.digests)
			b.h.Reset()
			b.n = 0
		}
	}
	return total, nil
}

// Head is the hex sha256 of the head (the first HeadBytes written).
func (b *BlockHasher) Head() string { return hex.EncodeToString(b.head.Sum(nil)) }

// Digests finishes the last (short) block and returns every block's
// sha256; nothing may be written after.
func (b *BlockHasher) Digests() []byte {
	if b.n > 0 {
		b.digests = b.h.Sum(b.digests)
		b.h.Reset()
		b.n = 0
	}
	return b.digests
}

// blockWant is what a data file's blocks must hash to: its BLOCKSUMS
// entry and block size.
type blockWant struct {
	block   int64
	head    string
	digests []byte
	from    string // the BLOCKSUMS file
}

// checkBlockSums checks the optional block sums file rel of dir (absent:
// nothing to check) against the data files of its group (names relative
// to dir): an entry for each of them and no other, with the file's size
// and the sha256 SHA256SUMS records. Problems go to r; the result, what
// each file's blocks must hash to, is checked as the files are hashed
// (CheckSums, hashObjects).
func checkBlockSums(dir, rel string, group []string, sums map[string]string, r *Report) {
	p := filepath.Join(dir, filepath.FromSlash(rel))
	if _, err := os.Lstat(p); errors.Is(err, fs.ErrNotExist) {
		return
	}
	b, err := regfile.ReadFile(p, MaxManifest+MaxBlockDigests)
	if err != nil {
		r.add(Problem{File: rel, What: oneLine(err)})
		return
	}
	s, err := ParseBlockSums(b, rel)
	if err != nil {
		r.add(Problem{File: rel, What: strings.TrimPrefix(oneLine(err), ErrManifest.Error()+": "+rel+": ")})
		return
	}
	in := map[string]bool{}
	for _, f := range group {
		in[f] = true
	}
	ok := true
	for _, f := range s.Files {
		switch {
		case !in[f.Name]:
			r.add(Problem{File: rel, What: fmt.Sprintf("lists %s, which is not one of its folder's data files", f.Name)})
			ok = false
		case sums != nil && sums[f.Name] != f.SHA256:
			r.add(Problem{File: rel, What: fmt.Sprintf("records sha256 %s for %s, SHA256SUMS %s (another version of it: push again)", f.SHA256, f.Name, sums[f.Name])})
			ok = false
		default:
			if st, err := os.Stat(filepath.Join(dir, filepath.FromSlash(f.Name))); err == nil && st.Size() != f.Size {
				r.add(Problem{File: rel, What: fmt.Sprintf("records %d bytes for %s, which has %d", f.Size, f.Name, st.Size())})
				ok = false
			}
		}
		delete(in, f.Name)
	}
	for _, f := range slices.Sorted(maps.Keys(in)) {
		r.add(Problem{File: rel, What: "does not list " + f})
		ok = false
	}
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.blocks == nil {
		r.blocks = map[string]blockWant{}
	}
	for _, f := range s.Files {
		r.blocks[f.Name] = blockWant{block: s.Block, head: f.Head, digests: f.Digests, from: rel}
	}
}

// problem compares the digests of a file's head and blocks (what bh
// hashed) with those its block sums record ("" if they agree).
func (w blockWant) problem(bh *BlockHasher) string {
	got := bh.Digests()
	if head := bh.Head(); head != w.head {
		return fmt.Sprintf("its head (bytes 0..%d): sha256 differs from %s", HeadBytes, w.from)
	}
	if bytes.Equal(got, w.digests) {
		return ""
	}
	for i := 0; i < len(got) && i < len(w.digests); i += sha256.Size {
		if !bytes.Equal(got[i:i+sha256.Size], w.digests[i:i+sha256.Size]) {
			k := int64(i / sha256.Size)
			return fmt.Sprintf("block %d (bytes %d..%d): sha256 differs from %s", k, k*w.block, (k+1)*w.block, w.from)
		}
	}
	return fmt.Sprintf("%d blocks, %s records %d", len(got)/sha256.Size, w.from, len(w.digests)/sha256.Size)
}
