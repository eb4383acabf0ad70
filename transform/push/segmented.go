// A dataset in segments and versions (format 2) pushed as it grows: every
// file of its kept versions under its own name (a segment and a version
// never change once written, so a push of version N+1 over N sends only
// what N lacks), each folder's BLOCKSUMS, then dataset.json by
// compare-and-swap on the version it replaces, which must be one this
// folder keeps (a fast-forward), unless --force.

package push

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/clipshard/clipshard/formats/bucket"
	"github.com/clipshard/clipshard/manifests"
)

func pushSegmented(ctx context.Context, o Options, d *manifests.Dataset) (*Result, error) {
	k, err := manifests.KeptFiles(o.Dir)
	if err != nil {
		return nil, err
	}
	local, err := readChecked(o.Dir, manifests.DatasetFile, k.Sums[manifests.VersionFile(d.Number())])
	if err != nil {
		return nil, err
	}
	res := &Result{Kind: "dataset"}
	// What the bucket holds there: this version (resume, or up to date),
	// one this folder keeps (a fast-forward), another dataset (refused,
	// or --force), or none.
	remote, etag, err := o.Client.ReadAll(ctx, o.Dest, manifests.DatasetFile, manifests.MaxManifest)
	if err != nil && !errors.Is(err, bucket.ErrNotFound) {
		return nil, err
	}
	there := err == nil
	committed := there && bytes.Equal(remote, local)
	base, forward := 0, false
	if there && !committed {
		base, forward = k.Versions[hashOf(remote)]
		if !forward {
			base, forward = k.Parents[hashOf(remote)] // (a version this folder dropped, which a kept one was made from)
		}
		forward = forward && base < d.Number() // (never back: KeptFiles keeps none above the current one)
		if !forward && !o.Force {
			if err := later(ctx, o, remote, local, d.Number()); err != nil {
				return nil, err
			}
			return nil, fmt.Errorf("%w: %s holds %s: not a version %s keeps (%s is version %d, keeping %s): use --force to replace it, or another prefix",
				ErrUsage, o.Dest, describeRemote(remote), o.Dir, o.Dir, d.Number(), keptList(k))
		}
	}
	replace := there && !committed && !forward
	if forward {
		o.takeover = manifests.DatasetClaim(remote).Identity
	}

	// The names this push writes, and what else the prefix may hold: a
	// pushed dataset's earlier versions (a fast-forward, or this one
	// resumed) stay, whatever this folder still keeps of them.
	own := map[string]bool{manifests.DatasetFile: true, manifests.ClaimFile: true}
	folders := map[string][]string{}
	for rel := range k.Sums {
		own[rel] = true
		if k.Blobs[rel] {
			f := manifests.BlockFolder(rel)
			folders[f] = append(folders[f], rel)
			own[manifests.BlockSumsOf(f)] = true
		}
	}
	var small []string
	for rel := range k.Sums {
		if !k.Blobs[rel] {
			small = append(small, rel)
		}
	}
	slices.Sort(small)
	claimETag, err := takePrefix(ctx, &o, small, func(rel string) bool {
		return own[rel] || ((forward || committed) && manifests.SegmentedLayout(rel))
	}, local, replace, res)
	if err != nil {
		return nil, err
	}

	// The blobs, folder by folder (each with its BLOCKSUMS), then the
	// versions' manifests, then the commit.
	var objs []object
	var groups []*blockGroup
	for _, f := range slices.Sorted(maps.Keys(folders)) {
		rels := folders[f]
		slices.Sort(rels)
		part, err := files(o.Dir, rels, k.Sums)
		if err != nil {
			return nil, err
		}
		groups = append(groups, groupKeeping(ctx, o, manifests.BlockSumsOf(f), part, !replace))
		objs = append(objs, part...)
	}
	res.Objects = len(k.Sums) + len(groups) + 2 // (and dataset.json, CLAIM)
	proofs, err := sendData(ctx, o, objs, groups, res)
	if err != nil {
		return res, err
	}
	err = putManifests(ctx, o, small, func(rel string) string { return k.Sums[rel] }, proofs, res)
	if err != nil || committed {
		res.UpToDate = err == nil && res.Sent == 0
		return res, err
	}
	cond := bucket.CreateOnly
	if forward {
		cond = bucket.Cond(etag) // (the version read: a push that committed another meanwhile fails this one)
	}
	return res, commitDataset(ctx, o, local, cond, proofs, claimETag, res, func(now []byte) error {
		return fmt.Errorf("%w: another push committed %s at %s meanwhile (this push found %s there): not committed; push again (refused unless the bucket's version is one %s keeps)",
			ErrUsage, describeRemote(now), o.Dest, describeRemote(remote), o.Dir)
	})
}

// later refuses a push of version n (its dataset.json local) into a
// prefix holding a later version of the same dataset (remote: the bucket
// keeps version n's dataset.json, byte for byte, under versions/): a push
// never takes a bucket back to an earlier version. nil if it is not one.
func later(ctx context.Context, o Options, remote, local []byte, n int) error {
	d, err := manifests.ParseDataset(manifests.DatasetFile, remote)
	if err != nil || !d.Segmented() || d.Number() <= n {
		return nil
	}
	if b, _, err := o.Client.ReadAll(ctx, o.Dest, manifests.VersionFile(n), manifests.MaxManifest); err != nil || !bytes.Equal(b, local) {
		return nil
	}
	return fmt.Errorf("%w: %s holds version %d of this dataset, later than %s's (version %d, which the bucket keeps): a push never takes a prefix back to an earlier version: push the folder where the dataset grew (readers pin a version with version=N), or --force to replace it",
		ErrUsage, o.Dest, d.Number(), o.Dir, n)
}

// describeRemote words a dataset.json read from the bucket for a message.
func describeRemote(b []byte) string {
	if b == nil {
		return "no dataset.json"
	}
	h := sha256.Sum256(b)
	d, err := manifests.ParseDataset(manifests.DatasetFile, b)
	if err != nil {
		return "a dataset.json that is not a clipshard dataset's (sha256 " + hex.EncodeToString(h[:8]) + "...)"
	}
	return fmt.Sprintf("version %d of a dataset (its dataset.json has sha256 %s...)", d.Number(), hex.EncodeToString(h[:8]))
}

// keptList names the kept versions of k.
func keptList(k *Kept) string {
	ns := slices.Sorted(maps.Values(k.Versions))
	s := ""
	for i, n := range ns {
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprint(n)
	}
	if len(ns) == 1 {
		return "version " + s
	}
	return "versions " + s
}

// Kept is manifests.Kept (a shorter name here).
type Kept = manifests.Kept
