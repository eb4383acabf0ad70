// What a parsed epochs.json must hold: its weights' types, its samples'
// counts, its sources against the datasets they name.

package manifests

import (
	"encoding/json"
	"fmt"
)

// checkWeightTypes refuses a weight that is not a JSON number (json.Number
// would take the string "1" as the number 1): the weights of mix.weights
// and of each epoch.
func checkWeightTypes(b []byte) error {
	type ws = map[string]json.RawMessage
	var raw struct {
		Mix *struct {
			Ranges []struct {
				Weights ws `json:"weights"`
			} `json:"weights"`
		} `json:"mix"`
		Epochs []struct {
			Epoch   json.RawMessage `json:"epoch"`
			Weights ws              `json:"weights"`
		} `json:"epochs"`
	}
	if err := json.Unmarshal(b, &raw); err != nil {
		return err
	}
	check := func(where string, w ws) error {
		for n, v := range w {
			if len(v) == 0 || v[0] == '"' {
				return fmt.Errorf("%s: the weight of %s is %s, not a JSON number", where, n, v)
			}
		}
		return nil
	}
	if raw.Mix != nil {
		for i, r := range raw.Mix.Ranges {
			if err := check(fmt.Sprintf("mix.weights[%d]", i), r.Weights); err != nil {
				return err
			}
		}
	}
	for _, e := range raw.Epochs {
		if err := check("epoch "+string(e.Epoch), e.Weights); err != nil {
			return err
		}
	}
	return nil
}

// ClipCounts is the clip count of each source, in the order of the
// samples' source column (one for version 2; 0 where it was not
// recorded): a sample's clip must be below its source's.
func (m *Epochs) ClipCounts() []int64 {
	if m.Version != EpochsVersionMix {
		return []int64{m.Dataset.Clips}
	}
	out := make([]int64, len(m.Sources))
	for i, s := range m.Sources {
		out[i] = s.Clips
	}
	return out
}

// CheckSamples checks the rows of a samples file (int64, SampleCols()
// columns, row-major, rows of them) against what epochs.json says: each
// clip below its source's clip count (where recorded), its start >= 0,
// its valid frames 1..window (exactly the window unless short is "pad"),
// its source one of the sources. The error names the row and the column.
func (m *Epochs) CheckSamples(rows int, field func(i, c int) int64) error {
	cols, clips := m.SampleCols(), m.ClipCounts()
	for i := 0; i < rows; i++ {
		src := int64(0)
		if cols == 4 {
			if src = field(i, 3); src < 0 || src >= int64(len(clips)) {
				return fmt.Errorf("sample %d: source %d; epochs.json lists %d sources", i, src, len(clips))
			}
		}
		if c := field(i, 0); c < 0 || (clips[src] > 0 && c >= clips[src]) {
			return fmt.Errorf("sample %d: clip %d; its source has %d clips", i, c, clips[src])
		}
		if st := field(i, 1); st < 0 || st > 1<<48 {
			return fmt.Errorf("sample %d: start %d", i, st)
		}
		if v := field(i, 2); v < 1 || v > int64(m.Window) || (m.Short != "pad" && v != int64(m.Window)) {
			return fmt.Errorf("sample %d: valid %d frames; the window is %d (short %q)", i, v, m.Window, m.Short)
		}
	}
	return nil
}

// checkSources checks a version 3 manifest's sources and per-epoch
// counts (and that version 2 has none).
func (m *Epochs) checkSources() error {
	if m.Version == EpochsVersion {
		if m.Dataset.Clips < 0 {
			return fmt.Errorf("dataset: %d clips", m.Dataset.Clips)
		}
		if len(m.Sources) > 0 || m.Mix != nil {
			return fmt.Errorf("version 2 with sources (mixed epochs are version 3)")
		}
		return nil
	}
	if len(m.Sources) == 0 || m.Mix == nil || m.Dataset != (DatasetRef{}) {
		return fmt.Errorf("version 3 needs sources and mix, and no dataset")
	}
	seen := map[string]bool{}
	for _, s := range m.Sources {
		if err := CheckSourceName(s.Name); err != nil {
			return err
		}
		if seen[s.Name] {
			return fmt.Errorf("source %s is listed twice", s.Name)
		}
		if s.Clips < 0 {
			return fmt.Errorf("source %s: %d clips", s.Name, s.Clips)
		}
		seen[s.Name] = true
	}
	for _, e := range m.Epochs {
		var sum int64
		for n, c := range e.Counts {
			if !seen[n] || c < 0 {
				return fmt.Errorf("epoch %d: counts name %q (%d): not a source", e.Epoch, n, c)
			}
			sum += c
		}
		if len(e.Counts) != len(m.Sources) || sum != e.Samples {
			return fmt.Errorf("epoch %d: the counts per source add up to %d over %d sources, the epoch has %d samples and %d sources", e.Epoch, sum, len(e.Counts), e.Samples, len(m.Sources))
		}
		if len(e.Weights) != len(m.Sources) {
			return fmt.Errorf("epoch %d: %d weights for %d sources", e.Epoch, len(e.Weights), len(m.Sources))
		}
		for n, w := range e.Weights {
			if !seen[n] {
				return fmt.Errorf("epoch %d: a weight for %q, not a source", e.Epoch, n)
			}
			if err := CheckWeight(w); err != nil {
				return fmt.Errorf("epoch %d: weight %s=%.80s: %w", e.Epoch, n, w, err)
			}
		}
	}
	for i, r := range m.Mix.Ranges {
		if r.From < 0 || (r.To != 0 && r.To <= r.From) {
			return fmt.Errorf("mix.weights[%d]: epochs %d:%d", i, r.From, r.To)
		}
		if len(r.Weights) != len(m.Sources) {
			return fmt.Errorf("mix.weights[%d]: %d weights for %d sources", i, len(r.Weights), len(m.Sources))
		}
		for n, w := range r.Weights {
			if !seen[n] {
				return fmt.Errorf("mix.weights[%d]: a weight for %q, not a source", i, n)
			}
			if err := CheckWeight(w); err != nil {
				return fmt.Errorf("mix.weights[%d]: weight %s=%.80s: %w", i, n, w, err)
			}
		}
	}
	if err := m.Mix.CheckRanges(); err != nil {
		return err
	}
	if m.Mix.EpochSamples < 0 || m.Mix.EpochSamples > 1<<40 {
		return fmt.Errorf("mix.epoch_samples %d: want 0..2^40", m.Mix.EpochSamples)
	}
	return nil
}
