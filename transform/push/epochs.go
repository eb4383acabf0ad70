// Pushing an epochs folder: epochs.json merged into the bucket's by
// compare-and-swap, SHA256SUMS extended, shards.parquet rewritten after.

package push

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"sort"

	"github.com/clipshard/clipshard/formats/bucket"
	"github.com/clipshard/clipshard/internal/faults"
	"github.com/clipshard/clipshard/manifests"
	"github.com/clipshard/clipshard/transform/shuffle"
)

// -- epochs -----------------------------------------------------------------

// casTries bounds the compare-and-swap loops (each retry re-reads what
// another pusher wrote: many tasks pushing at once all get through).
const casTries = 64

func pushEpochs(ctx context.Context, o Options) (*Result, error) {
	man, err := manifests.VouchEpochs(o.Dir)
	if err != nil {
		return nil, err
	}
	sums, err := manifests.ReadSums(filepath.Join(o.Dir, man.Files.Sums))
	if err != nil {
		return nil, err
	}
	res := &Result{Kind: "epochs"}
	if err := oursAll(ctx, o, manifests.EpochsFile, man.Files.Sums, man.Files.Shards, manifests.ClaimFile); err != nil {
		return nil, err
	}
	key := shuffle.OptionsKey(man)
	remote, _, err := readEpochs(ctx, o)
	switch {
	case err == nil && shuffle.OptionsKey(remote) != key && !o.Force:
		return nil, fmt.Errorf("%w: %s holds epochs cut with other options (or from another dataset): use --force to replace them, or another prefix", ErrUsage, o.Dest)
	case err != nil && !errors.Is(err, bucket.ErrNotFound):
		return nil, err
	}
	other := err == nil && shuffle.OptionsKey(remote) != key
	var objs []object
	var groups []*blockGroup
	mine := map[string]bool{}
	var dirs []string
	for _, e := range man.Epochs {
		var data []string
		for _, s := range e.Shards {
			for _, f := range s.Files {
				data = append(data, f)
				mine[f] = true
			}
		}
		sort.Strings(data)
		eobjs, err := files(o.Dir, data, sums)
		if err != nil {
			return nil, err
		}
		groups = append(groups, groupOf(ctx, o, e.Dir+"/"+manifests.BlockSumsFile, eobjs))
		mine[e.Dir+"/"+manifests.BlockSumsFile] = true
		objs = append(objs, eobjs...)
		dirs = append(dirs, e.Dir)
	}
	// What the prefix holds besides: the epochs committed (of these
	// options: left; of others: another content's), and objects in
	// epoch folders that no epochs.json lists yet, another push's: of
	// these options (x-amz-meta-claim: an array task's, running, or to
	// be run again), left; of others, or by a push of before claims when
	// the prefix holds other options' epochs, another content's.
	listedThere := map[string]bool{}
	if remote != nil {
		for _, e := range remote.Epochs {
			listedThere[e.Dir+"/"+manifests.BlockSumsFile] = true
			for _, s := range e.Shards {
				for _, f := range s.Files {
					listedThere[f] = true
				}
			}
		}
	}
	c := manifests.EpochsClaim(man)
	manifestNames := map[string]bool{manifests.EpochsFile: true, man.Files.Sums: true, man.Files.Shards: true, manifests.ClaimFile: true}
	stale, err := survey(ctx, o, "epochs", func(rel string) bool {
		return manifestNames[rel] || mine[rel] || (listedThere[rel] && !other)
	}, func(rel string, st bucket.Object) bool {
		return epochLayout.MatchString(rel) && !listedThere[rel] && (st.Claim == c.Identity || (st.Claim == "" && !other))
	})
	if err != nil {
		return nil, err
	}
	claimETag, replaced, err := claim(ctx, &o, c, res)
	if err != nil {
		return nil, err
	}
	if replaced && !other {
		// The claim was another content's: the epochs committed may have
		// had their objects overwritten by that push; they are uncommitted
		// below and removed.
		for rel := range listedThere {
			if _, ok := stale[rel]; !ok && !mine[rel] {
				stale[rel] = "" // (its version unknown: removed if a push wrote it)
			}
		}
	}
	if other || replaced {
		// Another content's epochs committed: uncommitted first.
		faults.Point("push.uncommit")
		if err := o.Client.Remove(ctx, o.Dest, manifests.EpochsFile); err != nil {
			return nil, err
		}
		if err := o.Client.Remove(ctx, o.Dest, man.Files.Sums); err != nil {
			return nil, err
		}
	}
	if err := removeStale(ctx, o, stale); err != nil {
		return nil, err
	}
	res.Objects = len(objs) + len(groups) + 4
	proofs, err := sendData(ctx, o, objs, groups, res)
	if err != nil {
		return res, err
	}
	if err := stillOurs(ctx, o, dirs, proofs, claimETag); err != nil {
		return res, err
	}
	ours := map[string]string{}
	for _, x := range objs {
		ours[x.rel] = x.sha
	}
	// SHA256SUMS gains our files' lines (compare-and-swap: none lost).
	changed, err := casSums(ctx, o, man.Files.Sums, func(s map[string]string) bool {
		grew := false
		for f, h := range ours {
			if s[f] != h {
				s[f], grew = h, true
			}
		}
		return grew
	})
	if err != nil {
		return res, err
	}
	wrote := map[string]bool{}
	if changed {
		wrote[man.Files.Sums] = true
	}
	// The commit: epochs.json with our epochs merged into the bucket's.
	committed := false
	for try := 0; ; try++ {
		cur, etag, err := readEpochs(ctx, o)
		cond := bucket.Cond(etag)
		merged := *man
		switch {
		case errors.Is(err, bucket.ErrNotFound):
			cond = bucket.CreateOnly
		case err != nil:
			return res, err
		case shuffle.OptionsKey(cur) != key:
			return res, fmt.Errorf("%w: another push committed epochs with other options into %s meanwhile", ErrUsage, o.Dest)
		default:
			merged = *cur
			merged.Epochs = mergeEpochs(cur.Epochs, man.Epochs)
			if slices.EqualFunc(merged.Epochs, cur.Epochs, sameEntry) {
				break // every epoch of ours is there
			}
			merged.Created, merged.Tool = man.Created, man.Tool
		}
		if err == nil && slices.EqualFunc(merged.Epochs, cur.Epochs, sameEntry) {
			break
		}
		js, jerr := manifests.MarshalJSON(&merged)
		if jerr != nil {
			return res, jerr
		}
		faults.Point("push.commit")
		_, perr := o.Client.PutBytes(ctx, o.Dest, manifests.EpochsFile, js, hashOf(js), cond)
		if perr == nil {
			committed = true
			break
		}
		if !errors.Is(perr, bucket.ErrPrecondition) || try == casTries {
			return res, perr
		}
		backoff(try)
	}
	if committed {
		wrote[manifests.EpochsFile] = true
	}
	// shards.parquet and the manifests' lines of SHA256SUMS, from the
	// epochs.json committed, until it stays the same.
	if err := fixup(ctx, o, man.Files, wrote); err != nil {
		return res, err
	}
	res.Sent += len(wrote)
	final, _, err := readEpochs(ctx, o)
	if err != nil {
		return res, err
	}
	for _, e := range final.Epochs {
		res.Epochs = append(res.Epochs, e.Epoch)
	}
	res.UpToDate = res.Sent == 0
	return res, nil
}

// readEpochs reads and checks the bucket's epochs.json (as LoadEpochs
// does a folder's), with its ETag.
func readEpochs(ctx context.Context, o Options) (*manifests.Epochs, string, error) {
	b, etag, err := o.Client.ReadAll(ctx, o.Dest, manifests.EpochsFile, manifests.MaxManifest)
	if err != nil {
		return nil, "", err
	}
	m, err := manifests.ParseEpochs(b, o.Dest.Name(manifests.EpochsFile))
	return m, etag, err
}

// mergeEpochs is the bucket's epochs with ours added (ours replace an
// entry of the same number: the same options cut the same bytes), sorted.
func mergeEpochs(theirs, ours []manifests.EpochEntry) []manifests.EpochEntry {
	out := slices.Clone(theirs)
	for _, e := range ours {
		i := slices.IndexFunc(out, func(x manifests.EpochEntry) bool { return x.Epoch == e.Epoch })
		if i >= 0 {
			out[i] = e
		} else {
			out = append(out, e)
		}
	}
	sort.SliceStable(out, func(a, b int) bool { return out[a].Epoch < out[b].Epoch })
	return out
}

func sameEntry(a, b manifests.EpochEntry) bool {
	x, _ := manifests.MarshalJSON(a)
	y, _ := manifests.MarshalJSON(b)
	return bytes.Equal(x, y)
}

// casSums applies edit to the bucket's SHA256SUMS (none: empty) and, if
// it changed anything, writes it back by compare-and-swap, retrying with
// what another pusher wrote meanwhile.
func casSums(ctx context.Context, o Options, rel string, edit func(map[string]string) bool) (bool, error) {
	for try := 0; ; try++ {
		b, etag, err := o.Client.ReadAll(ctx, o.Dest, rel, manifests.MaxManifest)
		cond := bucket.Cond(etag)
		sums := map[string]string{}
		switch {
		case errors.Is(err, bucket.ErrNotFound):
			cond = bucket.CreateOnly
		case err != nil:
			return false, err
		default:
			if sums, err = manifests.ParseSums(b, o.Dest.Name(rel)); err != nil {
				return false, err
			}
		}
		if !edit(sums) {
			return false, nil
		}
		out := manifests.FormatSums(sums)
		faults.Point("push.sums")
		_, err = o.Client.PutBytes(ctx, o.Dest, rel, out, hashOf(out), cond)
		if err == nil {
			return true, nil
		}
		if !errors.Is(err, bucket.ErrPrecondition) || try == casTries {
			return false, err
		}
		backoff(try)
	}
}

// fixup rewrites shards.parquet from the bucket's epochs.json, and the
// lines of SHA256SUMS for it and epochs.json, until epochs.json is the
// same before and after (another pusher's commit meanwhile: again).
func fixup(ctx context.Context, o Options, names manifests.EpochFiles, wrote map[string]bool) error {
	for try := 0; ; try++ {
		js, etag, err := o.Client.ReadAll(ctx, o.Dest, manifests.EpochsFile, manifests.MaxManifest)
		if err != nil {
			return err
		}
		cur, err := manifests.ParseEpochs(js, o.Dest.Name(manifests.EpochsFile))
		if err != nil {
			return err
		}
		pq, err := manifests.ShardsTable(cur)
		if err != nil {
			return err
		}
		pqSum := hashOf(pq)
		if st, err := o.Client.Stat(ctx, o.Dest, names.Shards); err != nil || st.SHA256 != pqSum || st.Size != int64(len(pq)) {
			faults.Point("push.fixup")
			if _, err := o.Client.PutBytes(ctx, o.Dest, names.Shards, pq, pqSum, ""); err != nil {
				return err
			}
			wrote[names.Shards] = true
		}
		changed, err := casSums(ctx, o, names.Sums, func(s map[string]string) bool {
			grew := s[names.Shards] != pqSum || s[manifests.EpochsFile] != hashOf(js)
			s[names.Shards], s[manifests.EpochsFile] = pqSum, hashOf(js)
			return grew
		})
		if err != nil {
			return err
		}
		if changed {
			wrote[names.Sums] = true
		}
		st, err := o.Client.Stat(ctx, o.Dest, manifests.EpochsFile)
		if err != nil {
			return err
		}
		if st.ETag == etag {
			return nil
		}
		if try == casTries {
			return fmt.Errorf("%s: rewritten by other pushes %d times while this one made shards.parquet; run again", o.Dest.Name(manifests.EpochsFile), casTries)
		}
	}
}
