package shuffle

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/clipshard/clipshard/manifests"
)

// TestPiles: the units are the shards, in order (epoch, shard); the
// piles cover every output position once, in order, hold at most pileCap
// samples and never straddle a shard boundary, each unit listing its piles
// in order.
func TestPiles(t *testing.T) {
	for _, tc := range []struct {
		shard   int
		samples []int
		pileCap int64
	}{
		{1024, []int{10600}, 530},
		{7, []int{60, 0, 39}, 16},
		{5, []int{22, 6}, 1},
		{500, []int{1200, 1200}, 64},
		{4, []int{9}, 1000},
	} {
		t.Run(fmt.Sprint(tc), func(t *testing.T) {
			j := &job{o: Options{ShardSize: tc.shard}}
			var base int64
			for e, n := range tc.samples {
				j.epochs = append(j.epochs, epochPlan{epoch: e, samples: make([]manifests.Sample, n), base: base})
				base += int64(n)
			}
			j.total = base
			// The shards, counted out independently: each epoch's samples
			// in runs of tc.shard.
			var shards []unit
			for e, ep := range j.epochs {
				n := len(ep.samples)
				for k, sh := 0, 0; k < n; k, sh = k+tc.shard, sh+1 {
					lo := ep.base + int64(k)
					shards = append(shards, unit{ep: e, shard: sh, idx: sh, seq: len(shards), lo: lo, hi: lo + int64(min(tc.shard, n-k))})
				}
			}
			units := j.shards()
			piles := piles(units, tc.pileCap)
			next := int64(0)
			for _, pl := range piles {
				if pl.lo != next || pl.hi <= pl.lo || pl.hi-pl.lo > tc.pileCap {
					t.Fatalf("pile %v after %d (cap %d)", pl, next, tc.pileCap)
				}
				next = pl.hi
			}
			if next != j.total {
				t.Fatalf("piles end at %d, want %d", next, j.total)
			}
			if len(units) != len(shards) {
				t.Fatalf("%d units for %d shards", len(units), len(shards))
			}
			nextPile := 0
			for i, u := range units {
				if want := shards[i]; u.ep != want.ep || u.shard != want.shard || u.idx != want.idx ||
					u.seq != want.seq || u.lo != want.lo || u.hi != want.hi {
					t.Fatalf("unit %d is %+v, want %+v", i, u, want)
				}
				if len(u.piles) == 0 || piles[u.piles[0]].lo != u.lo || piles[u.piles[len(u.piles)-1]].hi != u.hi {
					t.Fatalf("unit [%d, %d): piles %v", u.lo, u.hi, u.piles)
				}
				for _, p := range u.piles {
					if p != nextPile {
						t.Fatalf("unit [%d, %d): pile %d, want %d", u.lo, u.hi, p, nextPile)
					}
					nextPile++
				}
			}
			if nextPile != len(piles) {
				t.Fatalf("units list %d piles of %d", nextPile, len(piles))
			}
		})
	}
}

// TestPwritevAll: more pieces than one pwritev takes, and empty ones.
func TestPwritevAll(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "f"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var pieces [][]byte
	var want []byte
	for i := range 3000 {
		p := bytes.Repeat([]byte{byte(i)}, i%7)
		pieces = append(pieces, p)
		want = append(want, p...)
	}
	if _, err := f.Write([]byte("head")); err != nil {
		t.Fatal(err)
	}
	n, err := pwritevAll(f, pieces, 4)
	if err != nil || n != int64(len(want)) {
		t.Fatalf("pwritevAll: %d, %v; want %d", n, err, len(want))
	}
	got, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, append([]byte("head"), want...)) {
		t.Fatal("file differs from the pieces")
	}
}

// TestCheckSpace: a run that cannot fit is refused before anything is
// written.
func TestCheckSpace(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "not", "yet")
	if err := checkSpace(dir, 2<<20); err != nil {
		t.Fatalf("2 MiB: %v", err)
	}
	err := checkSpace(dir, 1<<61)
	if !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "needs 2147483648.0GiB (2305843009213693952 bytes) for the shards and manifests, the filesystem has") {
		t.Fatalf("shards: %v", err)
	}
}
