// The prefix a push writes into: what is there (another folder's objects,
// the user's own), the claim that keeps a push of other content out, and
// the check, just before the commit, that nothing this push wrote or
// proved was replaced meanwhile.

package push

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	"github.com/clipshard/clipshard/formats/bucket"
	"github.com/clipshard/clipshard/internal/faults"
	"github.com/clipshard/clipshard/manifests"
)

// epochLayout matches the names an epochs push writes into epoch folders:
// objects of other epochs than a push's own at such names are another
// push's (an array task's, of the same options), never the user's.
var epochLayout = regexp.MustCompile(`^epoch-[0-9]{4,}/(BLOCKSUMS|shard-[0-9]+\.[^/]+\.npy)$`)

// survey lists the prefix and returns the names there that this push
// does not write (allowed says which it writes, or may leave) but a
// clipshard push wrote (x-amz-meta-sha256), unless keep, given their
// heads, keeps them: another folder's, which --force removes (with the
// ETag each had: removeStale removes only that version). A name no
// clipshard push wrote (the user's own, another tool's) is refused, even
// with --force: verify of the prefix would refuse it forever, and push
// never removes what it did not write.
func survey(ctx context.Context, o Options, kind string, allowed func(rel string) bool, keep func(rel string, st bucket.Object) bool) (map[string]string, error) {
	objs, err := o.Client.List(ctx, o.Dest)
	if err != nil {
		return nil, err
	}
	var foreign []string
	stale := map[string]string{}
	for _, rel := range slices.Sorted(maps.Keys(objs)) {
		if allowed(rel) {
			continue
		}
		st, err := o.Client.Stat(ctx, o.Dest, rel)
		switch {
		case errors.Is(err, bucket.ErrNotFound):
		case err != nil:
			return nil, err
		case st.SHA256 == "":
			foreign = append(foreign, o.Dest.Name(rel))
		case keep != nil && keep(rel, st):
		default:
			stale[rel] = st.ETag
		}
	}
	if len(foreign) > 0 {
		return nil, fmt.Errorf("%w: %s holds %s, which is not a file of a clipshard %s folder and which no clipshard push wrote (no x-amz-meta-sha256): verify of the prefix would refuse it; push never removes what it did not write: remove it yourself, or push to another prefix",
			ErrUsage, o.Dest, names(foreign), kind)
	}
	if len(stale) > 0 && !o.Force {
		var full []string
		for _, rel := range slices.Sorted(maps.Keys(stale)) {
			full = append(full, o.Dest.Name(rel))
		}
		return nil, fmt.Errorf("%w: %s holds %s, left by a push of another %s (not a file of this one): verify of the prefix would refuse it: --force removes what another push left, or push to another prefix",
			ErrUsage, o.Dest, names(full), kind)
	}
	return stale, nil
}

// names is a list of names for a message: the first three, and how many more.
func names(n []string) string {
	if len(n) <= 3 {
		return strings.Join(n, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(n[:3], ", "), len(n)-3)
}

// removeStale removes objects of the prefix that another push wrote
// (survey's stale ones, under --force): each only if its head still says
// a clipshard push wrote it (x-amz-meta-sha256) and, where the ETag it
// had is known, it is still that version; one that is not (the user's,
// or replaced since it was listed) fails the push, naming it, and is
// left as it is.
func removeStale(ctx context.Context, o Options, stale map[string]string) error {
	for _, rel := range slices.Sorted(maps.Keys(stale)) {
		st, err := o.Client.Stat(ctx, o.Dest, rel)
		if errors.Is(err, bucket.ErrNotFound) {
			continue
		}
		if err != nil {
			return err
		}
		if st.SHA256 == "" || (stale[rel] != "" && st.ETag != stale[rel]) {
			return fmt.Errorf("%w: %s: replaced since it was listed (by the user, or another tool: no longer what another push left): not removed; remove it yourself, or push to another prefix",
				ErrUsage, o.Dest.Name(rel))
		}
		faults.Point("push.stale")
		if err := o.Client.Remove(ctx, o.Dest, rel); err != nil {
			return fmt.Errorf("removing what another push left (--force): %w", err)
		}
	}
	return nil
}

// claim writes the prefix's claim (manifests.ClaimFile) for content c,
// create-only, before any other object: a prefix claimed for other
// content (another dataset, epochs of other options: a push of it running
// now, or killed before its commit) is refused, exit 2, before a byte of
// it is overwritten; --force takes it (compare-and-swap on the claim
// read: of two forced pushes at once, one wins, the other is refused).
// It returns the claim's ETag (checked again before the commit) and
// whether it replaced another content's claim; a claim it wrote is
// counted in res, and o's client then records c on every object it writes
// (x-amz-meta-claim).
func claim(ctx context.Context, o *Options, c manifests.Claim, res *Result) (string, bool, error) {
	etag, wrote, replaced, err := takeClaim(ctx, *o, c)
	if err != nil {
		return "", false, err
	}
	if wrote {
		res.Sent++
	}
	o.Client = o.Client.WithClaim(c.Identity)
	return etag, replaced, nil
}

// takeClaim is claim's compare-and-swap: the claim's ETag, whether it
// wrote it, whether that replaced another content's.
func takeClaim(ctx context.Context, o Options, c manifests.Claim) (string, bool, bool, error) {
	body := c.Marshal()
	sum := hashOf(body)
	cond := bucket.CreateOnly
	replaced := false
	for try := 0; ; try++ {
		if try > 0 {
			backoff(try)
		}
		faults.Point("push.claim")
		etag, err := o.Client.PutBytes(ctx, o.Dest, manifests.ClaimFile, body, sum, cond)
		if err == nil {
			return etag, true, replaced, nil
		}
		if !errors.Is(err, bucket.ErrPrecondition) || try == casTries {
			return "", false, false, err
		}
		// Claimed already (or changed since it was read): by whom?
		b, etag, err := o.Client.ReadAll(ctx, o.Dest, manifests.ClaimFile, 64<<10)
		switch {
		case errors.Is(err, bucket.ErrNotFound):
			cond = bucket.CreateOnly // (removed meanwhile)
			continue
		case err != nil:
			return "", false, false, err
		}
		their, perr := manifests.ParseClaim(b, o.Dest.Name(manifests.ClaimFile))
		if perr == nil && their == c {
			return etag, false, replaced, nil // this content's: resumed, or an array task of the same options
		}
		if perr == nil && their.Kind == c.Kind && o.takeover != "" && their.Identity == o.takeover {
			cond = bucket.Cond(etag) // the committed version's claim, this push's base: taken
			continue
		}
		if !o.Force {
			what := "a push of " + their.Describe()
			if perr != nil {
				what = "something that is not a clipshard claim (" + perr.Error() + ")"
			}
			return "", false, false, fmt.Errorf("%w: %s is claimed by %s, and this is a push of %s: that push is running, or was killed before its commit: run it again to its end, or use --force to take the prefix (never while that push runs), or push to another prefix",
				ErrUsage, o.Dest.Name(manifests.ClaimFile), what, c.Describe())
		}
		cond, replaced = bucket.Cond(etag), true
	}
}

// stillOurs checks, just before the commit, that the prefix still holds
// every object this push wrote or proved, at the version it wrote or
// proved (its ETag and size, as the prefix lists them: under dirs, ""
// the whole prefix), and still holds this push's claim: another writer
// (a forced push, another tool) that replaced one meanwhile fails the
// push, naming it, instead of a commit over bytes nobody checked.
func stillOurs(ctx context.Context, o Options, dirs []string, proofs map[string]bucket.Object, claimETag string) error {
	listed := map[string]bucket.Object{}
	for _, d := range dirs {
		got, err := o.Client.ListUnder(ctx, o.Dest, d)
		if err != nil {
			return err
		}
		maps.Copy(listed, got)
	}
	faults.Point("push.recheck")
	var changed []string
	for _, rel := range slices.Sorted(maps.Keys(proofs)) {
		if now, ok := listed[rel]; !ok || now.ETag != proofs[rel].ETag || now.Size != proofs[rel].Size {
			changed = append(changed, o.Dest.Name(rel))
		}
	}
	if len(changed) > 0 {
		return fmt.Errorf("%s: replaced or removed by another writer while this push ran (another version than the one it wrote or checked): not committed; push again (and find out who else writes to %s)",
			names(changed), o.Dest)
	}
	st, err := o.Client.Stat(ctx, o.Dest, manifests.ClaimFile)
	if err != nil && !errors.Is(err, bucket.ErrNotFound) {
		return err
	}
	if err != nil || st.ETag != claimETag {
		return fmt.Errorf("%w: %s: another push (--force) took the prefix while this one ran: not committed", ErrUsage, o.Dest.Name(manifests.ClaimFile))
	}
	return nil
}
