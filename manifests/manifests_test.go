package manifests_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/clipshard/clipshard/manifests"
)

func sampleRows() []manifests.ClipRow {
	return []manifests.ClipRow{
		// motion has its audit (source dtype, stats), w2v not (as written
		// before those columns existed).
		{Clip: "a", Start: 0, Length: 10, Sources: []manifests.ClipSource{{XXH64: 0xffffffffffffffff, Path: "/d/a.pkl", Size: 5, MtimeNS: 1700000000123456789,
			Audited: true, Descr: "<f4", Stats: manifests.Stats{NaN: 1, InfIn: 2, Overflow: 3, Underflow: 4, MaxAbs: 65504.5}}, {XXH64: 1, Path: "/d/a.npy", Size: 7, MtimeNS: 2}}},
		{Clip: "b é", Start: 10, Length: 3, Trimmed: 2, Sources: []manifests.ClipSource{{XXH64: 0x8000000000000000, Path: "/d/b.pkl", Size: 6, MtimeNS: 3,
			Audited: true, Descr: ">f8,<f2", Stats: manifests.Stats{MaxAbs: 0.1}}, {XXH64: 42, Path: "/d/b.npy", Size: 8, MtimeNS: 4}}},
	}
}

func TestClipsRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "clips.parquet")
	rows := sampleRows()
	if err := manifests.WriteClips(path, []string{"motion", "w2v"}, rows); err != nil {
		t.Fatal(err)
	}
	got, err := manifests.ReadClips(path, []string{"motion", "w2v"})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, rows) {
		t.Fatalf("got %+v", got)
	}
	if _, err := manifests.ReadClips(path, []string{"motion", "other"}); !errors.Is(err, manifests.ErrManifest) {
		t.Fatalf("missing modality: %v", err)
	}
}

// TestClipsDuckDB reads clips.parquet with DuckDB (npm @duckdb/node-api),
// an independent Parquet reader, and checks columns, types and values.
func TestClipsDuckDB(t *testing.T) {
	dir := filepath.Join("..", "testdata", "duckdb")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@duckdb", "node-api")); err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("DuckDB is not installed: .ci/run must run npm install --prefix testdata/duckdb")
		}
		t.Skip("needs DuckDB for node: npm install --prefix testdata/duckdb")
	}
	path := filepath.Join(t.TempDir(), "clips.parquet")
	rows := sampleRows()
	if err := manifests.WriteClips(path, []string{"motion", "w2v"}, rows); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("node", filepath.Join(dir, "query.mjs"), path).CombinedOutput()
	if err != nil {
		t.Fatalf("duckdb: %v\n%s", err, out)
	}
	var res struct {
		Columns []string         `json:"columns"`
		Rows    []map[string]any `json:"rows"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	want := []string{"clip:VARCHAR", "start:BIGINT", "length:BIGINT", "trimmed:BIGINT",
		"motion_xxh64:UBIGINT", "motion_source:VARCHAR", "motion_source_size:BIGINT", "motion_source_mtime_ns:BIGINT",
		"motion_source_dtype:VARCHAR", "motion_nan:BIGINT", "motion_inf_in:BIGINT", "motion_overflow:BIGINT", "motion_underflow:BIGINT", "motion_max_abs:DOUBLE",
		"w2v_xxh64:UBIGINT", "w2v_source:VARCHAR", "w2v_source_size:BIGINT", "w2v_source_mtime_ns:BIGINT"}
	if !reflect.DeepEqual(res.Columns, want) {
		t.Fatalf("columns %v", res.Columns)
	}
	if len(res.Rows) != len(rows) {
		t.Fatalf("%d rows", len(res.Rows))
	}
	for i, r := range rows {
		d := res.Rows[i]
		if d["clip"] != r.Clip || d["start"] != strconv.FormatInt(r.Start, 10) || d["trimmed"] != strconv.FormatInt(r.Trimmed, 10) ||
			d["motion_xxh64"] != strconv.FormatUint(r.Sources[0].XXH64, 10) || d["w2v_source"] != r.Sources[1].Path ||
			d["motion_source_mtime_ns"] != strconv.FormatInt(r.Sources[0].MtimeNS, 10) ||
			d["motion_source_dtype"] != r.Sources[0].Descr || d["motion_max_abs"] != r.Sources[0].Stats.MaxAbs ||
			d["motion_nan"] != strconv.FormatInt(r.Sources[0].Stats.NaN, 10) {
			t.Errorf("row %d: duckdb %v, wrote %+v", i, d, r)
		}
	}
}

func TestIndexAndSums(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "index.npy")
	if err := manifests.WriteIndex(p, []int64{0, 10, 13}, []int64{10, 3, 7}); err != nil {
		t.Fatal(err)
	}
	s, l, err := manifests.ReadIndex(p)
	if err != nil || !reflect.DeepEqual(s, []int64{0, 10, 13}) || !reflect.DeepEqual(l, []int64{10, 3, 7}) {
		t.Fatalf("%v %v %v", s, l, err)
	}
	h, err := manifests.HashFile(p)
	if err != nil {
		t.Fatal(err)
	}
	sp := filepath.Join(dir, "SHA256SUMS")
	if err := manifests.WriteSums(sp, map[string]string{"index.npy": h}); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sha256sum", "--strict", "-c", "SHA256SUMS")
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sha256sum: %v %s", err, out)
	}
	got, err := manifests.ReadSums(sp)
	if err != nil || got["index.npy"] != h {
		t.Fatalf("%v %v", got, err)
	}
}

func TestCheckRelPath(t *testing.T) {
	for _, p := range []string{"a.npy", "sub/a.npy", "epoch-0001/rank-00/shard-00000.motion.npy"} {
		if err := manifests.CheckRelPath(p); err != nil {
			t.Errorf("%q: %v", p, err)
		}
	}
	for _, p := range []string{"", ".", "/etc/passwd", "../x.npy", "a/../../x", "a/./b", "..", "a\\b", "a//b"} {
		if err := manifests.CheckRelPath(p); !errors.Is(err, manifests.ErrPath) {
			t.Errorf("%q accepted", p)
		}
	}
}

func TestLoadDatasetRefusesEscapes(t *testing.T) {
	dir := t.TempDir()
	d := manifests.Dataset{Format: manifests.DatasetFormat, Version: 1,
		Files:      manifests.Files{Clips: "clips.parquet", Index: "index.npy", Sums: "SHA256SUMS"},
		Modalities: []manifests.Modality{{Name: "m", File: "../../etc/passwd"}}}
	if err := d.Write(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := manifests.LoadDataset(dir); !errors.Is(err, manifests.ErrPath) {
		t.Fatalf("got %v", err)
	}
	os.WriteFile(filepath.Join(dir, "dataset.json"), []byte("{not json"), 0o644)
	if _, err := manifests.LoadDataset(dir); !errors.Is(err, manifests.ErrManifest) {
		t.Fatalf("got %v", err)
	}
}

func TestClipList(t *testing.T) {
	dir := t.TempDir()
	txt := filepath.Join(dir, "c.txt")
	os.WriteFile(txt, []byte("# comment\n a \n\nb\n"), 0o644)
	csvp := filepath.Join(dir, "c.csv")
	os.WriteFile(csvp, []byte("id,clip\n1,a\n2,b\n"), 0o644)
	pq := filepath.Join(dir, "c.parquet")
	if err := manifests.WriteClips(pq, nil, []manifests.ClipRow{{Clip: "a"}, {Clip: "b"}}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{txt, csvp, pq} {
		ids, err := manifests.ReadClipList(p)
		if err != nil || !reflect.DeepEqual(ids, []string{"a", "b"}) {
			t.Errorf("%s: %v %v", p, ids, err)
		}
	}
	bad := filepath.Join(dir, "bad.csv")
	os.WriteFile(bad, []byte("name\nx\n"), 0o644)
	if _, err := manifests.ReadClipList(bad); !errors.Is(err, manifests.ErrClipList) {
		t.Errorf("no clip column: %v", err)
	}
}

// TestBlockSums: BlockHasher's digests are the sha256 of each block (and
// of the head) computed one block at a time, whatever the sizes of the
// writes; a marshalled BLOCKSUMS parses back to the same entries, and one
// byte changed anywhere in it is refused; BlockSizeFor keeps the digests
// near 8 MiB.
func TestBlockSums(t *testing.T) {
	data := make([]byte, 3*manifests.MinBlock+777)
	for i := range data {
		data[i] = byte(i * 7 / 3)
	}
	var want []byte
	for at := 0; at < len(data); at += manifests.MinBlock {
		d := sha256.Sum256(data[at:min(at+manifests.MinBlock, len(data))])
		want = append(want, d[:]...)
	}
	head := sha256.Sum256(data[:manifests.HeadBytes])
	for _, step := range []int{1, 1000, 4096, manifests.MinBlock, len(data)} {
		bh := manifests.NewBlockHasher(manifests.MinBlock)
		for at := 0; at < len(data); at += step {
			bh.Write(data[at:min(at+step, len(data))])
		}
		if got := bh.Digests(); !bytes.Equal(got, want) || bh.Head() != hex.EncodeToString(head[:]) {
			t.Fatalf("writes of %d bytes: %d digest bytes, head %s", step, len(got), bh.Head())
		}
	}
	s := &manifests.BlockSums{Block: manifests.MinBlock, Files: []manifests.BlockFile{
		{Name: "a/x.npy", Size: int64(len(data)), SHA256: strings.Repeat("1", 64), Head: hex.EncodeToString(head[:]), ETag: "0123abcdef-3", Digests: want},
		{Name: "a/y.npy", Size: 10, SHA256: strings.Repeat("2", 64), Head: strings.Repeat("3", 64), ETag: "a1b2", Digests: want[:32]},
	}}
	b, err := s.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	back, err := manifests.ParseBlockSums(b, "BLOCKSUMS")
	if err != nil || back.Block != s.Block || len(back.Files) != 2 || back.File("a/x.npy") == nil || !bytes.Equal(back.File("a/x.npy").Digests, want) || back.File("a/z.npy") != nil ||
		back.File("a/x.npy").ETag != "0123abcdef-3" || !bytes.Contains(b, []byte(`"version":2`)) {
		t.Fatalf("%v %+v", err, back)
	}
	// Version 1 (no etags, as a push before them wrote) is read and
	// written; an etag in version 1, none (or not an ETag) in version 2,
	// or files of both: refused.
	v1 := &manifests.BlockSums{Block: s.Block, Files: slices.Clone(s.Files)}
	for i := range v1.Files {
		v1.Files[i].ETag = ""
	}
	b1, err := v1.Marshal()
	if err != nil || !bytes.Contains(b1, []byte(`"version":1`)) || bytes.Contains(b1, []byte("etag")) {
		t.Fatalf("version 1: %v %s", err, b1)
	}
	if back, err := manifests.ParseBlockSums(b1, "BLOCKSUMS"); err != nil || back.File("a/x.npy").ETag != "" {
		t.Fatalf("version 1: %v", err)
	}
	for what, c := range map[string][]byte{
		"an etag in version 1":   bytes.Replace(b, []byte(`"version":2`), []byte(`"version":1`), 1),
		"no etag in version 2":   bytes.Replace(b1, []byte(`"version":1`), []byte(`"version":2`), 1),
		"an etag with a quote":   bytes.Replace(b, []byte(`"a1b2"`), []byte(`"a1\"b2"`), 1),
		"an etag that is a list": bytes.Replace(b, []byte(`"a1b2"`), []byte(`["a1b2"]`), 1),
		"version 3":              bytes.Replace(b, []byte(`"version":2`), []byte(`"version":3`), 1),
	} {
		if _, err := manifests.ParseBlockSums(c, "BLOCKSUMS"); err == nil {
			t.Fatalf("%s: taken", what)
		}
	}
	mixed := &manifests.BlockSums{Block: s.Block, Files: []manifests.BlockFile{s.Files[0], v1.Files[1]}}
	if _, err := mixed.Marshal(); err == nil {
		t.Fatal("files with and without etags written")
	}
	// Any digest byte changed: refused (the digests' own sha256).
	nl := bytes.IndexByte(b, '\n')
	for i := nl + 1; i < len(b); i += 13 {
		c := bytes.Clone(b)
		c[i] ^= 1
		if _, err := manifests.ParseBlockSums(c, "BLOCKSUMS"); err == nil {
			t.Fatalf("digest byte %d changed, still taken", i-nl-1)
		}
	}
	for _, bad := range []string{"format", "digests_sha256", "block"} {
		c := bytes.Replace(b, []byte(`"`+bad+`":`), []byte(`"`+bad+`x":`), 1)
		if _, err := manifests.ParseBlockSums(c, "BLOCKSUMS"); err == nil {
			t.Fatalf("key %q renamed, still taken", bad)
		}
	}
	for _, c := range []struct{ total, block int64 }{{0, 64 << 10}, {16 << 30, 64 << 10}, {17 << 30, 128 << 10}, {64 << 30, 256 << 10}, {1 << 50, 64 << 20}} {
		if got := manifests.BlockSizeFor(c.total); got != c.block {
			t.Errorf("BlockSizeFor(%d) = %d, want %d", c.total, got, c.block)
		}
	}
}

// TestShardsTableInMemory: the shards.parquet push uploads is made in
// memory, byte for byte the file WriteEpochs writes; nothing goes to the
// temporary folder (a push killed there left a clipshard-shards-* folder
// in /tmp for each run): with TMPDIR a folder that cannot be made, it
// still works.
func TestShardsTableInMemory(t *testing.T) {
	man := &manifests.Epochs{
		Modalities: []manifests.EpochModality{{Name: "motion", DType: "<f2", Rate: 1, FrameShape: []int{3}, WindowRows: 4}},
		Epochs: []manifests.EpochEntry{{Epoch: 0, Dir: "epoch-0000", Samples: 5, Shards: []manifests.ShardEntry{
			{Shard: 0, First: 0, Samples: 3, Files: map[string]string{"samples": "epoch-0000/samples-00000.npy", "motion": "epoch-0000/motion-00000.npy"}},
			{Shard: 1, First: 3, Samples: 2, Files: map[string]string{"samples": "epoch-0000/samples-00001.npy", "motion": "epoch-0000/motion-00001.npy"}},
		}}},
	}
	dir := t.TempDir()
	if err := manifests.WriteEpochs(dir, man, map[string]string{}); err != nil {
		t.Fatal(err)
	}
	want, err := os.ReadFile(filepath.Join(dir, manifests.ShardsFile))
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("TMPDIR", filepath.Join(dir, "no", "such", "folder"))
	got, err := manifests.ShardsTable(man)
	if err != nil {
		t.Fatalf("ShardsTable with no temporary folder: %v", err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("ShardsTable: %d bytes, not the %d of the written shards.parquet", len(got), len(want))
	}
}
