// Package convertcmd is the convert command (cmd/convert, and clipshard
// convert): it packs per-clip .npy and pickle sources into a clipshard
// dataset: one float16 .npy blob per modality plus offset manifests. Run
// "clipshard convert --help" for the flags; docs/FORMAT.md describes the
// output.
package convertcmd

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/clipshard/clipshard/internal/ui"
	"github.com/clipshard/clipshard/manifests"
	"github.com/clipshard/clipshard/transform/convert"
)

const usage = `usage: convert --clips FILE --out DIR -m NAME[@RATE|@clip]=TEMPLATE[:KEYS] [-m ...] [flags]

Decode every clip's sources, convert them to float16 exactly as numpy's
astype(np.float16), and concatenate each modality along time into
DIR/NAME.npy, with DIR/clips.parquet, DIR/index.npy, DIR/SHA256SUMS and
DIR/dataset.json (written last). A re-run with unchanged inputs does nothing;
after a change only the clips whose sources changed are decoded (the others'
rows are copied from the dataset in DIR); a killed run resumes where it
stopped.

Example:
  convert --clips testdata/demo/clips.txt --out /tmp/demo-ds \
    -m 'motion=motion/{clip}.pkl:exp+pose' \
    -m 'whisper@2=whisper/{clip}.npy' -m 'emotion=emotion/{clip}.npy'

TEMPLATE is a path with {clip} replaced by the clip id, relative to --root.
KEYS select arrays inside a pickle: exp, params/exp, exp+pose (concatenated
along the last axis); without KEYS the pickle must hold a bare array.
@RATE: rows per clip frame (default 1). @clip: one value per clip (a
vector such as shape [100], or a number such as fps), stored a row per
clip in DIR/NAME.npy and given whole to every sample; it plays no part
in the clips' lengths. Integers are kept exactly with --keep-dtype NAME.
--label NAME[=COLUMN]: a string per clip from a column of a .csv or
.parquet clip list (speaker, emotion class...), or --label
NAME=TEMPLATE.pkl:KEY from the str (or int) at KEY of each clip's pickle,
kept as an int32 code a clip in DIR/NAME.npy, delivered like a per-clip
value; dataset.json keeps the vocabulary (code i is its labels[i]), and a
label keeps its code when DIR is converted again.

Example with per-clip values:
  convert ... -m 'motion=motion/{clip}.pkl:exp+pose' \
    -m 'shape@clip=motion/{clip}.pkl:shape' -m 'fps@clip=motion/{clip}.pkl:fps' --keep-dtype fps

Example with labels (clips.csv: clip,speaker):
  convert --clips clips.csv ... -m 'motion=motion/{clip}.pkl:exp+pose' --label speaker

Flags:
`

const exitCodes = `
Growing a dataset (format 2; docs/FORMAT.md, "Segments and versions"):
  convert ... --segments --out DIR       writes only the change, as a new version
  convert ... --compact --out DIR        a new version in one segment (rows copied)
  convert --keep N --out DIR             drops all versions but the N newest

Partitioned (Slurm or Kubernetes arrays; docs/SCALING.md):
  convert ... --part auto --out parts/part-{part}      one task per part
  convert --merge parts/part-* --out DIR               then merge, in order
  convert --merge parts/part-* --out DIR --segments    ... by reference: the parts' blobs
                                                       hard-linked as segments, manifests written

Exit status: 0 done or up to date; 1 bad input or failure (one line on
stderr names the file, clip and key); 2 usage error.
`

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(s string) error { *m = append(*m, s); return nil }

// splitMerge takes the part directories that follow --merge out of args
// (the flag package would stop at the first of them).
func splitMerge(args []string) (rest, parts []string, merge bool) {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--merge" || a == "-merge" {
			merge = true
			rest = append(rest, a)
			for i+1 < len(args) && !strings.HasPrefix(args[i+1], "-") {
				i++
				parts = append(parts, args[i])
			}
			continue
		}
		rest = append(rest, a)
	}
	return rest, parts, merge
}

// parsePart reads --part I/N, or --part auto from a Slurm job array or a
// Kubernetes Indexed Job (with --parts N).
func parsePart(s string, parts int) (int, int, error) {
	if s == "auto" {
		if id, cnt := os.Getenv("SLURM_ARRAY_TASK_ID"), os.Getenv("SLURM_ARRAY_TASK_COUNT"); id != "" && cnt != "" {
			i, err1 := strconv.Atoi(id)
			n, err2 := strconv.Atoi(cnt)
			lo, _ := strconv.Atoi(os.Getenv("SLURM_ARRAY_TASK_MIN"))
			if err1 != nil || err2 != nil {
				return 0, 0, fmt.Errorf("--part auto: SLURM_ARRAY_TASK_ID=%q SLURM_ARRAY_TASK_COUNT=%q are not numbers", id, cnt)
			}
			return i - lo, n, nil
		}
		if idx := os.Getenv("JOB_COMPLETION_INDEX"); idx != "" {
			i, err := strconv.Atoi(idx)
			if err != nil || parts < 1 {
				return 0, 0, fmt.Errorf("--part auto: JOB_COMPLETION_INDEX=%q needs --parts N (the Indexed Job's completions)", idx)
			}
			return i, parts, nil
		}
		return 0, 0, fmt.Errorf("--part auto: set SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT (Slurm job array) or JOB_COMPLETION_INDEX with --parts N (Kubernetes Indexed Job)")
	}
	a, b, ok := strings.Cut(s, "/")
	i, err1 := strconv.Atoi(a)
	n, err2 := strconv.Atoi(b)
	if !ok || err1 != nil || err2 != nil || n < 1 || i < 0 || i >= n {
		return 0, 0, fmt.Errorf("--part %q: want I/N with 0 <= I < N, or auto", s)
	}
	return i, n, nil
}

// Run runs the command with args (without the program's name) as name
// ("convert", or "clipshard convert"), and returns its exit status.
func Run(name string, args []string, stdout, stderr io.Writer) (code int) {
	defer ui.Recover(stderr, name, &code)
	args, mergeParts, merging := splitMerge(args)
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	var (
		mods, keep     multi
		labels         multi
		o              convert.Options
		onError        string
		quiet, jsonOut bool
		memFlag        string
		checkpointFlag string
	)
	fs.StringVar(&o.ClipList, "clips", "", "clip list `FILE`: text (one id per line), .csv or .parquet with a clip column")
	fs.Var(&mods, "modality", "`NAME[@RATE|@clip]=TEMPLATE[:KEYS]` (repeatable)")
	fs.Var(&mods, "m", "short for --modality `NAME[@RATE|@clip]=TEMPLATE[:KEYS]`")
	fs.StringVar(&o.Root, "root", "", "`DIR` relative templates start from (default: the clip list's folder)")
	fs.StringVar(&o.Out, "out", "", "dataset `DIR` to write")
	fs.StringVar(&o.Align, "align", "strict", "`strict|trim`: modalities must agree on each clip's length, or are cut to the shortest")
	fs.Int64Var(&o.MaxTrim, "max-trim", convert.DefaultMaxTrim, "with --align trim: a clip may lose at most `N` clip frames (a clip needing more is bad input; -1: no bound)")
	fs.Var(&labels, "label", "`NAME[=COLUMN]` or NAME=TEMPLATE.pkl:KEY: a label per clip from the .csv/.parquet clip list's column COLUMN (default NAME), or the str at KEY of each clip's pickle, delivered in every sample as an int32 code into the vocabulary dataset.json keeps (repeatable)")
	fs.StringVar(&o.LabelsLike, "labels-like", "", "dataset `DIR` whose labels' codes to keep: each --label's vocabulary starts with DIR's (default: the dataset in --out's), so that epochs of both can be mixed")
	fs.Var(&keep, "keep-dtype", "keep modality `NAME` in its source dtype instead of float16 (repeatable)")
	fs.BoolVar(&o.AllowInt, "allow-int", false, "accept integer and bool arrays (converted to float16; --keep-dtype NAME keeps them as they are)")
	fs.BoolVar(&o.AllowOutsideRoot, "allow-outside-root", false, "accept clip ids that are absolute or contain .. (they read outside --root)")
	fs.BoolVar(&o.AllowNonFinite, "allow-nonfinite", false, "accept NaN and ±Inf in sources (counted in stats)")
	fs.BoolVar(&o.AllowOverflow, "allow-overflow", false, "accept finite values that become ±Inf in float16 (counted in stats)")
	fs.IntVar(&o.Workers, "workers", 0, "decode/convert goroutines (default: GOMAXPROCS)")
	fs.StringVar(&memFlag, "mem", "256MiB", "memory for the clips in flight, a `SIZE` such as 256MiB or 1GiB (peak RSS: SIZE + 64 MiB, plus one pickle clip per worker)")
	fs.StringVar(&checkpointFlag, "checkpoint", "16MiB", "journal finished clips every `SIZE` of output, once their rows are on file (0: every clip, waiting for it); a kill loses about twice that much work")
	fs.StringVar(&onError, "on-error", "fail", "`fail|skip`: stop at the first bad clip, or skip it (listed in skipped.tsv)")
	fs.BoolVar(&o.Segments, "segments", false, "over a dataset already in --out: write only what changed (new clips, a new modality, changed sources) as a new segment, and commit it as a new version in place, keeping every earlier version (format 2: read by shuffle, verify, inspect, push, the Python Dataset and drawn epochs; a convert without --segments writes format 1 again); with --merge, merge the parts by reference (their blobs hard-linked as segments)")
	fs.BoolVar(&o.Force, "force", false, "rebuild even if the dataset is up to date, decoding every clip (without it, clips whose sources are unchanged are copied from the dataset being replaced)")
	fs.BoolVar(&quiet, "quiet", false, "no progress on stderr")
	fs.BoolVar(&jsonOut, "json", false, "print the summary as JSON")
	var partFlag string
	var partsN int
	fs.StringVar(&partFlag, "part", "", "convert only part `I/N` (0-based) of the clip list into --out (which may contain {part}); auto: from Slurm or Kubernetes array variables")
	fs.IntVar(&partsN, "parts", 0, "with --part auto under a Kubernetes Indexed Job: the number of parts")
	fs.BoolVar(&o.Compact, "compact", false, "with --segments (implied): commit a version whose rows are all in one new segment, one blob per modality in clip order, no dead rows (the rows of unchanged clips copied from the dataset, not decoded; earlier versions kept, --keep 1 then reclaims their files); up to date when the dataset is one segment already")
	fs.IntVar(&o.Keep, "keep", 0, "`N`: after the run, drop every version of a dataset in segments but the N newest (their manifests, and the blobs no kept version reads); with --out DIR alone, only that")
	var clean bool
	fs.BoolVar(&clean, "clean", false, "with --out DIR only: remove what an interrupted or failed run left next to DIR for a resume")
	fs.Bool("merge", false, "merge the part directories that follow (convert --merge PART_DIR... --out DIR) into one dataset")
	if done, code := ui.Parse(fs, args, stdout, stderr, ui.Named(usage, "convert", name), ui.Named(exitCodes, "convert", name), false); done {
		return code
	}
	// (the tests: CLIPSHARD_KEEP_AFTER=0s keeps a quick failed run's work)
	if d, err := time.ParseDuration(os.Getenv("CLIPSHARD_KEEP_AFTER")); err == nil {
		convert.KeepAfter = d
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	now, err := ui.Clock()
	if err != nil {
		fmt.Fprintln(stderr, name+":", err)
		return 2
	}
	if clean {
		if o.Out == "" || len(mods) > 0 || o.ClipList != "" {
			fmt.Fprintln(stderr, name+": --clean takes --out DIR only")
			return 2
		}
		had, err := convert.Clean(o.Out)
		if err != nil {
			return ui.ExitCode(stderr, name, err, convert.ErrUsage)
		}
		if had {
			fmt.Fprintf(stdout, "removed what an interrupted run into %s left for a resume\n", o.Out)
		} else {
			fmt.Fprintf(stdout, "nothing to clean next to %s\n", o.Out)
		}
		return 0
	}
	if o.Keep != 0 && o.ClipList == "" && len(mods) == 0 && !merging {
		if o.Out == "" {
			fmt.Fprintln(stderr, name+": --keep N takes --out DIR (alone, or with a convert's arguments)")
			return 2
		}
		dr, err := convert.Keep(o.Out, o.Keep)
		if err != nil {
			return ui.ExitCode(stderr, name, err, convert.ErrUsage)
		}
		droppedSummary(stdout, o.Out, dr, jsonOut)
		return 0
	}
	if merging {
		mo := convert.MergeOptions{Parts: mergeParts, Out: o.Out, Workers: o.Workers, Now: now, Tool: "clipshard convert " + ui.Version(), Segments: o.Segments}
		return runMerge(name, ctx, mo, quiet, jsonOut, stdout, stderr)
	}
	if partFlag != "" {
		i, n, err := parsePart(partFlag, partsN)
		if err != nil {
			fmt.Fprintln(stderr, name+":", err)
			return 2
		}
		o.Part, o.Parts = i, n
		o.Out = strings.ReplaceAll(o.Out, "{part}", fmt.Sprintf("%04d", i))
	}
	switch onError {
	case "fail":
	case "skip":
		o.SkipBadClips = true
	default:
		fmt.Fprintf(stderr, "%s: --on-error %q: want fail or skip\n", name, onError)
		return 2
	}
	for _, s := range mods {
		m, err := convert.ParseModality(s)
		if err != nil {
			ui.Fail(stderr, name, err)
			return 2
		}
		o.Modalities = append(o.Modalities, m)
	}
	for _, s := range labels {
		m, err := convert.ParseLabel(s)
		if err != nil {
			ui.Fail(stderr, name, err)
			return 2
		}
		o.Modalities = append(o.Modalities, m)
	}
	for _, k := range keep {
		found := false
		for i := range o.Modalities {
			if o.Modalities[i].Name == k {
				o.Modalities[i].KeepDType, found = true, true
			}
		}
		if !found {
			fmt.Fprintf(stderr, "%s: --keep-dtype %q names no --modality\n", name, k)
			return 2
		}
	}
	if o.Budget, err = ui.ParseSize(memFlag); err != nil || o.Budget < 1<<20 {
		fmt.Fprintf(stderr, "%s: --mem: %v\n", name, cmp.Or(err, fmt.Errorf("%s: want at least 1MiB", memFlag)))
		return 2
	}
	if o.Checkpoint, err = ui.ParseSize(checkpointFlag); err != nil {
		fmt.Fprintln(stderr, name+": --checkpoint:", err)
		return 2
	}
	// Fewer garbage collections (on thousands of small clips they took a
	// twentieth of the time): the heap may grow to five times what is
	// live, under a soft limit that keeps the process under --mem + 64 MiB
	// with the blobs' buffers (convert.HeapLimit). GOGC and GOMEMLIMIT,
	// if set, win.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(400)
	}
	if os.Getenv("GOMEMLIMIT") == "" && o.Budget > 0 {
		debug.SetMemoryLimit(convert.HeapLimit(o.Budget, len(o.Modalities)))
	}
	o.Tool = "clipshard convert " + ui.Version()
	o.Now = now

	var bar *ui.Progress
	var bytesIn int64 // the finishing phases report no reads: keep the last count
	crash := crashHook()
	o.Progress = func(p convert.Progress) {
		if bar == nil {
			bar = ui.New(name, "clips", int64(p.ClipsTotal), quiet)
		}
		bytesIn = max(bytesIn, p.BytesIn)
		bar.Update(int64(p.Clips), func() string { return ui.Bytes(bytesIn) + " in, " + ui.Bytes(p.BytesOut) + " out" })
		crash(p)
	}
	res, err := convert.Run(ctx, o)
	if bar != nil {
		bar.Finish()
	}
	err = ui.Interrupted(ctx, err, "a re-run resumes where it stopped")
	if err != nil {
		return ui.ExitCode(stderr, name, err, convert.ErrUsage)
	}
	summary(stdout, res, jsonOut)
	return 0
}

func runMerge(name string, ctx context.Context, mo convert.MergeOptions, quiet, jsonOut bool, stdout, stderr io.Writer) int {
	var bar *ui.Progress
	mo.Progress = func(p convert.Progress) {
		if bar == nil {
			bar = ui.New("merge", "MB", 0, quiet)
		}
		bar.Update(p.BytesOut>>20, nil)
	}
	res, err := convert.Merge(ctx, mo)
	if bar != nil {
		bar.Finish()
	}
	err = ui.Interrupted(ctx, err, "--out was left as it was")
	if err != nil {
		return ui.ExitCode(stderr, name, err, convert.ErrUsage)
	}
	if !jsonOut {
		fmt.Fprintf(stdout, "merged %d parts: ", len(mo.Parts))
	}
	summary(stdout, res, jsonOut)
	return 0
}

// droppedSummary says what --keep dropped from the dataset in dir.
func droppedSummary(w io.Writer, dir string, dr *convert.Dropped, asJSON bool) {
	if asJSON {
		if err := ui.WriteJSON(w, map[string]any{"dir": dir, "dropped_versions": dr.Versions, "removed_files": dr.Files, "removed_bytes": dr.Bytes}); err != nil {
			fmt.Fprintf(os.Stderr, "clipshard convert: %v\n", err)
		}
		return
	}
	if len(dr.Versions) == 0 {
		fmt.Fprintf(w, "--keep: no version of %s to drop\n", dir)
		return
	}
	var vs []string
	for _, v := range dr.Versions {
		vs = append(vs, strconv.Itoa(v))
	}
	fmt.Fprintf(w, "dropped version%s %s of %s: removed %s (%s) that no kept version reads; epochs cut from them are refused from now on\n",
		map[bool]string{true: "s", false: ""}[len(vs) > 1], strings.Join(vs, ", "), dir, ui.Count(int64(dr.Files), "file"), ui.Bytes(dr.Bytes))
}

func summary(w io.Writer, r *convert.Result, asJSON bool) {
	d := r.Dataset
	if asJSON {
		out := map[string]any{
			"dir": r.Dir, "up_to_date": r.UpToDate, "clips": d.Clips, "frames": d.Frames,
			"converted": r.Converted, "resumed": r.Resumed, "reused": r.Reused, "reused_in_part": r.ReusedPart, "skipped": d.Skipped,
			"bytes_in": r.BytesIn, "bytes_out": r.BytesOut, "seconds": r.Elapsed.Seconds(),
			"stats": d.Stats, "trimmed": d.Trimmed,
		}
		if r.UpToDate {
			out["checked"] = convert.UpToDateChecks
		}
		if r.ReuseRefused != "" {
			out["reuse_refused"] = r.ReuseRefused
		}
		if d.Segmented() {
			out["dataset_version"], out["segment"] = d.Number(), r.Segment
		}
		if r.Dropped != nil {
			out["dropped_versions"], out["removed_files"], out["removed_bytes"] = r.Dropped.Versions, r.Dropped.Files, r.Dropped.Bytes
		}
		if err := ui.WriteJSON(w, out); err != nil {
			fmt.Fprintf(os.Stderr, "clipshard convert: %v\n", err)
		}
		return
	}
	if r.Dropped != nil {
		defer droppedSummary(w, r.Dir, r.Dropped, false)
	}
	if r.UpToDate {
		fmt.Fprintf(w, "up to date: %s (%s, %s); nothing to do (checked: %s; `verify --deep %s` reads the blobs)\n",
			r.Dir, ui.Count(d.Clips, "clip"), ui.Count(d.Frames, "frame"), convert.UpToDateChecks, r.Dir)
		return
	}
	rate := ""
	if s := r.Elapsed.Seconds(); s > 0 {
		rate = fmt.Sprintf(", %s/s in", ui.Bytes(int64(float64(r.BytesIn)/s)))
	}
	fmt.Fprintf(w, "converted %d clips (%d frames) into %s in %.1fs: %s read, %s written%s\n",
		d.Clips, d.Frames, r.Dir, r.Elapsed.Seconds(), ui.Bytes(r.BytesIn), ui.Bytes(r.BytesOut), rate)
	if r.Resumed > 0 {
		fmt.Fprintf(w, "resumed: %s already done by an interrupted run\n", ui.Count(int64(r.Resumed), "clip"))
	}
	if r.ReuseRefused != "" {
		fmt.Fprintf(w, "not reused: the previous dataset in %s (every clip was decoded): %s\n", r.Dir, r.ReuseRefused)
	}
	if r.Reused+r.ReusedPart > 0 {
		part := ""
		if r.ReusedPart > 0 {
			part = fmt.Sprintf(", and some modalities of %s", ui.Count(int64(r.ReusedPart), "more clip"))
		}
		how := "not decoded"
		if d.Segmented() && r.Compacted {
			how = "not decoded, copied into the new segment"
		} else if d.Segmented() {
			how = "not decoded, not copied: their rows stay where they are"
		}
		fmt.Fprintf(w, "reused from the previous dataset (sources unchanged, %s): all the rows of %s%s\n", how, ui.Count(int64(r.Reused), "clip"), part)
	}
	if d.Segmented() {
		seg := "no new rows: the version is a new manifest"
		if r.Segment != "" {
			seg = fmt.Sprintf("the new rows are in %s/%s/", manifests.SegmentsDir, r.Segment)
		}
		kept := "version 1 is kept"
		if d.Number() > 2 {
			kept = fmt.Sprintf("versions 1-%d are kept", d.Number()-1)
		}
		fmt.Fprintf(w, "committed version %d of %s (%s); %s, and epochs cut from them read them\n", d.Number(), r.Dir, seg, kept)
	}
	for _, m := range d.Modalities {
		s := d.Stats[m.Name]
		if m.IsLabel() {
			from := fmt.Sprintf("column %q", m.LabelColumn)
			if m.LabelColumn == "" {
				from = fmt.Sprintf("key %q of %s", m.Keys, m.Template)
			}
			fmt.Fprintf(w, "  %-12s %s x%d rows  labels from %s: %s\n", m.Name, m.DType, m.Rows, from, ui.LabelList(m.Labels, 8))
			continue
		}
		fmt.Fprintf(w, "  %-12s %s %v x%d rows  max|x| %g  nan %d inf %d overflow %d underflow %d\n",
			m.Name, m.DType, m.FrameShape, m.Rows, s.MaxAbs, s.NaN, s.InfIn, s.Overflow, s.Underflow)
	}
	if d.Trimmed > 0 {
		fmt.Fprintf(w, "trimmed: %d clip frames dropped to align modalities\n", d.Trimmed)
	}
	if n := len(d.Skipped); n > 0 {
		fmt.Fprintf(w, "skipped %s (see %s):\n", ui.Count(int64(n), "clip"), d.Files.Skipped)
		for i, s := range d.Skipped {
			if i == 10 {
				fmt.Fprintf(w, "  ... and %d more\n", n-10)
				break
			}
			fmt.Fprintf(w, "  %s: %s\n", s.Clip, s.Reason)
		}
	}
}

// crashHook is fault injection for the crash tests: with
// CLIPSHARD_KILL_AFTER_CLIPS=N the process SIGKILLs itself once N clips are
// written; with CLIPSHARD_KILL_AT_PHASE=finish|checksum, when that phase
// starts.
func crashHook() func(convert.Progress) {
	after, _ := strconv.Atoi(os.Getenv("CLIPSHARD_KILL_AFTER_CLIPS"))
	phase := os.Getenv("CLIPSHARD_KILL_AT_PHASE")
	if after <= 0 && phase == "" {
		return func(convert.Progress) {}
	}
	return func(p convert.Progress) {
		if (after > 0 && p.Clips >= after) || (phase != "" && p.Phase == phase) {
			syscall.Kill(os.Getpid(), syscall.SIGKILL)
			select {}
		}
	}
}
