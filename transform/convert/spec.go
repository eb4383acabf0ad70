// Package convert packs clips into a clipshard dataset: it decodes every
// clip's sources (.npy or numpy-in-pickle), converts them to float16 exactly
// as numpy's astype(np.float16) would, and concatenates each modality along
// time into one .npy blob, with the manifests of docs/FORMAT.md.
//
// Run decodes and converts clips in parallel and writes them in clip-list
// order from one goroutine, with a byte budget on the results in flight.
// Output goes to a staging directory next to the output, with a journal of
// finished clips; a killed run resumes from the journal, and the finished
// dataset replaces the previous one in a single atomic directory exchange.
package convert

import (
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/clipshard/clipshard/formats"
)

// ErrUsage marks options that cannot work (bad modality spec, flags that
// contradict each other).
var ErrUsage = errors.New("convert: usage")

// ErrInput marks a problem with the input data: a clip whose source is
// missing, unreadable, refused or inconsistent.
var ErrInput = errors.New("convert: bad input")

// Modality is one --modality NAME[@RATE|@clip]=TEMPLATE[:KEYS].
type Modality struct {
	Name     string `json:"name"`
	Rate     int    `json:"rate"`
	Template string `json:"template"`
	Keys     string `json:"keys"`
	// KeepDType keeps the source dtype instead of converting to float16.
	KeepDType bool `json:"keep_dtype"`
	// PerClip (NAME@clip=...) marks a per-clip modality: its source holds
	// one value per clip (a scalar, or an array of any shape, such as
	// identity coefficients [100]), stored as one row per clip; it plays
	// no part in the clips' lengths. Rate is 1 and unused.
	PerClip bool `json:"per_clip,omitempty"`
	// Label (convert --label NAME=COLUMN) makes a label modality: no
	// source file, but the clip list's column Label, one string a clip,
	// stored per clip as an int32 code into the vocabulary (the distinct
	// values, in the order the clip list first gives them) that
	// dataset.json records. PerClip and KeepDType are set; Template and
	// Keys are empty.
	Label string `json:"label,omitempty"`
	// LabelKey (convert --label NAME=TEMPLATE.pkl:KEY) makes a label
	// modality of the str (or int) at KEY of each clip's pickle: coded
	// as Label's, in the order the clips give them, by the writer.
	LabelKey bool `json:"label_key,omitempty"`
}

// IsLabel reports whether m is a label modality (of a column or a key).
func (m Modality) IsLabel() bool { return m.Label != "" || m.LabelKey }

// ParseLabel parses --label NAME[=COLUMN]: the label modality NAME from
// the clip list's column COLUMN (default: NAME), or --label
// NAME=TEMPLATE.pkl:KEY: from the str or int at KEY of each clip's pickle.
func ParseLabel(s string) (Modality, error) {
	name, col, ok := strings.Cut(s, "=")
	if !ok {
		col = name
	}
	if strings.Contains(col, "{clip}") {
		m, err := ParseModality(name + "@clip=" + col)
		switch {
		case err != nil:
			return Modality{}, fmt.Errorf("%w (in --label %q)", err, s)
		case m.Keys == "" || strings.Contains(m.Keys, "+"):
			return Modality{}, fmt.Errorf("%w: --label %q: a label from a file is a str or an int at one key of a pickle: NAME=TEMPLATE.pkl:KEY (or NAME=COLUMN of a .csv or .parquet clip list)", ErrUsage, s)
		}
		m.KeepDType, m.LabelKey = true, true
		return m, nil
	}
	if col == "" || strings.TrimSpace(col) != col {
		return Modality{}, fmt.Errorf("%w: --label %q: want NAME or NAME=COLUMN (a column of the .csv or .parquet clip list)", ErrUsage, s)
	}
	if col == "clip" {
		return Modality{}, fmt.Errorf("%w: --label %q: the clip column holds the ids, which every dataset keeps (clips.txt; Dataset.ids in Python): label another column", ErrUsage, s)
	}
	if err := CheckName(name); err != nil {
		return Modality{}, fmt.Errorf("%w (in --label %q)", err, s)
	}
	return Modality{Name: name, Rate: 1, PerClip: true, KeepDType: true, Label: col}, nil
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]*$`)

// DefaultMaxTrim is the clip frames --align trim cuts from a clip at most,
// unless --max-trim says otherwise: a frame or two of rounding between
// feature extractors; more usually means a wrong key or rate.
const DefaultMaxTrim = 2

// ReservedNames are the modality names that collide with the files and
// columns clipshard writes: NAME.npy beside index.npy and dataset.json,
// NAME_file beside samples_file in shards.parquet, and so on.
var ReservedNames = []string{"clip", "clips", "dataset", "epoch", "epochs", "files", "index", "length", "rank",
	"samples", "sha256sums", "shard", "shards", "skipped", "start", "trimmed", "first"}

// CheckName refuses a modality name that is not letters, digits, _ . -
// or that is one of ReservedNames (in any case).
func CheckName(name string) error {
	if len(name) > MaxNameLen {
		return fmt.Errorf("%w: modality name %.20q... is %d bytes: at most %d (it names the blob and every shard file, shard-NNNNN.NAME.npy, and file names stop at 255 bytes)", ErrUsage, name, len(name), MaxNameLen)
	}
	if !nameRE.MatchString(name) {
		return fmt.Errorf("%w: modality name %q: use letters, digits, _ . - (starting with a letter, digit or _)", ErrUsage, name)
	}
	if slices.Contains(ReservedNames, strings.ToLower(name)) {
		return fmt.Errorf("%w: modality name %q is reserved (clipshard's own files and columns use: %s)", ErrUsage, name, strings.Join(ReservedNames, ", "))
	}
	return nil
}

// MaxNameLen bounds a modality name's length.
const MaxNameLen = 128

// ParseModality parses NAME[@RATE|@clip]=TEMPLATE[:KEYS]. TEMPLATE must contain
// {clip} and end in .npy, .pkl or .pickle; KEYS follow a pickle template.
func ParseModality(s string) (Modality, error) {
	lhs, tmpl, ok := strings.Cut(s, "=")
	if !ok || lhs == "" || tmpl == "" {
		return Modality{}, fmt.Errorf("%w: modality %q: want NAME[@RATE|@clip]=TEMPLATE[:KEYS]", ErrUsage, s)
	}
	m := Modality{Name: lhs, Rate: 1}
	if name, rate, ok := strings.Cut(lhs, "@"); ok && rate == "clip" {
		m.Name, m.PerClip = name, true
	} else if ok {
		r, err := strconv.Atoi(rate)
		if err != nil || r < 1 {
			return Modality{}, fmt.Errorf("%w: modality %q: rate %q is not an integer >= 1 (or \"clip\": one value per clip)", ErrUsage, s, rate)
		}
		m.Name, m.Rate = name, r
	}
	if err := CheckName(m.Name); err != nil {
		return Modality{}, err
	}
	lower := strings.ToLower(tmpl)
	for _, ext := range []string{".pkl:", ".pickle:"} {
		if i := strings.LastIndex(lower, ext); i >= 0 {
			m.Template, m.Keys = tmpl[:i+len(ext)-1], tmpl[i+len(ext):]
			if m.Keys == "" {
				return Modality{}, fmt.Errorf("%w: modality %q: empty KEYS after ':'", ErrUsage, s)
			}
			break
		}
	}
	if m.Template == "" {
		m.Template = tmpl
	}
	if !strings.Contains(m.Template, "{clip}") {
		return Modality{}, fmt.Errorf("%w: modality %q: template %q has no {clip}", ErrUsage, s, m.Template)
	}
	if _, err := formats.FormatOf(m.Template); err != nil {
		return Modality{}, fmt.Errorf("%w: modality %q: %w", ErrUsage, s, err)
	}
	return m, nil
}

// Path returns the source path of clip for this modality: the template with
// {clip} replaced, joined to root when relative.
func (m Modality) Path(root, clip string) string {
	if m.Label != "" {
		return "" // the clip list's column: no file
	}
	p := strings.ReplaceAll(m.Template, "{clip}", clip)
	if !filepath.IsAbs(p) {
		p = filepath.Join(root, p)
	}
	return p
}

// Options configure Run.
type Options struct {
	ClipList   string     // --clips
	Modalities []Modality // --modality, in order
	Root       string     // --root; default: the clip list's folder
	Out        string     // --out
	Align      string     // "strict" (default) or "trim"
	// MaxTrim bounds the clip frames --align trim may cut from a clip
	// (the longest modality's minus the shortest's): a clip needing more
	// is bad input, naming the clip and lengths. 0 means the default,
	// DefaultMaxTrim; a negative value, no bound.
	MaxTrim int64

	// AllowOutsideRoot accepts clip ids that are absolute or have ".."
	// components (otherwise refused: a template must not reach outside
	// the root through an id).
	AllowOutsideRoot bool
	AllowInt         bool
	AllowNonFinite   bool
	AllowOverflow    bool
	SkipBadClips     bool // --on-error skip
	Force            bool
	// Segments: over a dataset this run can reuse, write only the rows it
	// decodes, as a new segment, and commit a new version in place
	// (format 2), leaving every earlier version as it is.
	Segments bool
	// Compact (with Segments, which it implies): the new version holds
	// every row of the run in its one new segment (rows it would have
	// referred to are copied), one blob per modality, no dead rows; the
	// earlier versions are kept as they are (Keep drops them). A dataset
	// already so (format 1, or one blob per modality holding exactly its
	// clips' rows in order) whose inputs are unchanged is up to date.
	Compact bool
	// LabelsLike (--labels-like DIR): the label modalities' vocabularies
	// start with those of the same labels in the dataset DIR (rather than
	// the dataset in Out's), so that a code means the same label in both
	// and their epochs can be mixed.
	LabelsLike string
	// Keep, if > 0, drops every version of a dataset in segments but the
	// Keep newest after the run (see Keep).
	Keep int

	// Part and Parts select part Part (0-based) of Parts contiguous ranges
	// of the clip list (convert --part I/N); Parts 0 converts everything.
	Part, Parts int

	Workers int   // decode/convert goroutines; default GOMAXPROCS
	Budget  int64 // bytes of decoded results in flight; default 256 MiB
	// Checkpoint is how many converted bytes are appended between journal
	// checkpoints; a checkpoint's records are journaled once its rows are
	// in the blob files (without waiting for them), so a kill loses at
	// most about two checkpoints of finished work. 0 writes and journals
	// every clip before the next one; negative means the default, 16 MiB.
	Checkpoint int64

	// Progress, if set, is called from the writing goroutine after each clip
	// and once at the end; it must return quickly.
	Progress func(Progress)
	// Now returns the time recorded as "created"; default time.Now.
	Now func() time.Time
	// Tool is recorded as "tool".
	Tool string
}

// Progress is a snapshot of a running conversion.
type Progress struct {
	Clips, ClipsTotal int
	Resumed           int   // clips taken over from an interrupted run
	BytesIn, BytesOut int64 // source bytes read, blob bytes written, this run
	Phase             string
}
