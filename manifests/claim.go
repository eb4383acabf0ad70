// The claim of a bucket prefix (CLAIM): what push writes there, create-only,
// before anything else, so that a push of other content is refused before
// it overwrites a byte of what another push may commit.

package manifests

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/clipshard/clipshard/formats/regfile"
)

// ClaimFile is the name of a prefix's claim.
const ClaimFile = "CLAIM"

// ClaimFormat is the "format" of a claim.
const ClaimFormat = "clipshard.claim"

// Claim says which content a prefix is pushed: Kind "dataset" or
// "epochs", and Identity, the sha256 of the dataset's dataset.json, or of
// the epochs' options key (Epochs.OptionsKey: the options and datasets
// that decide their bytes; array tasks pushing other epochs of the same
// options share it). It holds nothing else (no time, no host): every push
// of the same content writes the same bytes.
type Claim struct {
	Format   string `json:"format"`
	Version  int    `json:"version"`
	Kind     string `json:"kind"`
	Identity string `json:"identity"`
}

// DatasetClaim is the claim of a push of the dataset whose dataset.json
// is these bytes.
func DatasetClaim(datasetJSON []byte) Claim {
	h := sha256.Sum256(datasetJSON)
	return Claim{Format: ClaimFormat, Version: 1, Kind: "dataset", Identity: hex.EncodeToString(h[:])}
}

// EpochsClaim is the claim of a push of epochs of m's options.
func EpochsClaim(m *Epochs) Claim {
	h := sha256.Sum256([]byte(m.OptionsKey()))
	return Claim{Format: ClaimFormat, Version: 1, Kind: "epochs", Identity: hex.EncodeToString(h[:])}
}

// Marshal is the claim's bytes (one line of JSON).
func (c Claim) Marshal() []byte {
	b, _ := json.Marshal(c)
	return append(b, '\n')
}

// ParseClaim parses and checks a claim (name is for errors).
func ParseClaim(b []byte, name string) (Claim, error) {
	var c Claim
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil || dec.More() {
		return c, fmt.Errorf("%w: %s: not a clipshard claim (one JSON object: format, version, kind, identity)", ErrManifest, name)
	}
	if c.Format != ClaimFormat || c.Version != 1 || (c.Kind != "dataset" && c.Kind != "epochs") || !isHexSum(c.Identity) {
		return c, fmt.Errorf("%w: %s: format %q version %d kind %q identity %q: want %q version 1, kind dataset or epochs, a sha256",
			ErrManifest, name, c.Format, c.Version, c.Kind, c.Identity, ClaimFormat)
	}
	return c, nil
}

// Describe words the claim for a message.
func (c Claim) Describe() string {
	if c.Kind == "dataset" {
		return "a dataset whose dataset.json has sha256 " + c.Identity[:16] + "..."
	}
	return "epochs whose options key has sha256 " + c.Identity[:16] + "..."
}

// OptionsKey identifies the options that decide an epochs folder's
// bytes: the dataset (its dataset.json's sha256; a mixed run's sources,
// name:sha256 in order), seed, window, sampling, windows per clip, short
// windows and shard size, and a mixed run's weight schedule and epoch
// size. Folders of one key may be merged (each with its own epochs),
// folders of two may not.
func (m *Epochs) OptionsKey() string {
	key := fmt.Sprintf("dataset=%s seed=%d window=%d sampling=%s per_clip=%d short=%s shard_samples=%d",
		m.datasetKey(), m.Seed, m.Window, m.Sampling, m.PerClip, m.Short, m.ShardSamples)
	if m.Mix != nil {
		key += " weights=" + m.Mix.Key()
	}
	return key
}

func (m *Epochs) datasetKey() string {
	if m.Version != EpochsVersionMix {
		return m.Dataset.SHA256
	}
	var parts []string
	for _, s := range m.Sources {
		parts = append(parts, s.Name+":"+s.SHA256)
	}
	return strings.Join(parts, ",")
}

// checkClaim checks the claim in dir (a bucket's, or one synced down):
// a claim of other content than the folder's committed manifest is a
// push of it that has not committed (running, or killed), replacing the
// objects.
func checkClaim(dir string, want Claim, r *Report) {
	b, err := regfile.ReadFile(filepath.Join(dir, ClaimFile), 64<<10)
	if err != nil {
		r.add(Problem{File: ClaimFile, What: oneLine(err)})
		return
	}
	c, err := ParseClaim(b, ClaimFile)
	switch {
	case err != nil:
		r.add(Problem{File: ClaimFile, What: oneLine(err)})
	case c != want:
		r.add(Problem{File: ClaimFile, What: fmt.Sprintf("claimed by a push of %s, not of the %s %s commits (%s): that push has not committed (it is running, or was killed) and may have replaced objects: run it again to its end, or push this folder again with --force",
			c.Describe(), want.Kind, map[bool]string{true: DatasetFile, false: EpochsFile}[want.Kind == "dataset"], want.Describe())})
	}
}
