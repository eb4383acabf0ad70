// What the epochs will take: the sizes of shard and sample files, and the
// free-space check before writing.

package shuffle

import (
	"fmt"
	"math"
	"math/bits"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/clipshard/clipshard/formats/npy"
	"github.com/clipshard/clipshard/internal/units"
)

// MaxEpochSamples bounds an epoch's samples (2^40: its plan alone would
// take 32 TiB): a count past it is refused before anything is sized.
const MaxEpochSamples = 1 << 40

// satMul and satAdd are a*b and a+b of counts and sizes >= 0, saturated
// at the largest int64 instead of wrapping: a size check of a huge
// count refuses it rather than passing a wrapped, small figure.
func satMul(a, b int64) int64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(lo)
}

func satAdd(a, b int64) int64 {
	if s := a + b; s >= a && s >= b {
		return s
	}
	return math.MaxInt64
}

// metaSlack is how far one epoch's plan may go past a quarter of --mem.
const metaSlack = 16 << 20

// shardMeta is about what a shard's entries take in the plan and the
// manifest, besides 64 bytes per modality file.
const shardMeta = 512

// sampleMeta is the memory a planned sample takes: its Sample in the
// epoch's list and, on the external path, its position in the per-clip
// index.
const sampleMeta = 32

// epochFiles is the number of shard files (modalities and samples) of an
// epoch of n samples.
func (j *job) epochFiles(n int64) int64 {
	if n == 0 {
		return 0
	}
	return satMul(n/int64(j.o.ShardSize)+min(1, n%int64(j.o.ShardSize)), int64(len(j.mods)+1))
}

// diskBlock bounds the filesystem's allocation unit that the space check
// allows for at the end of each file.
const diskBlock = 4096

// epochBytes is what the shards of an epoch of n samples take on disk.
func (j *job) epochBytes(n int64) int64 {
	return satAdd(satMul(n, satAdd(j.rec, j.sampleRec())), satMul(j.epochFiles(n), npy.DataAlign))
}

// checkSpace refuses to start when the filesystem of out lacks the room
// for need bytes: the shards and manifests (the external path's piles lie
// in the shards' files).
func checkSpace(out string, need int64) error {
	dir := out
	for {
		if _, err := os.Stat(dir); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return nil // cannot tell; go ahead
	}
	free := int64(st.Bavail) * int64(st.Bsize)
	if free < need {
		return fmt.Errorf("%w: %s needs %s (%d bytes) for the shards and manifests, the filesystem has %s (%d bytes) free", ErrUsage, out, units.Bytes(need), need, units.Bytes(free), free)
	}
	return nil
}
