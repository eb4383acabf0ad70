package convert

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestVocabBound: a label column with more distinct labels than
// MaxVocabBytes holds (a clip id given as a label) is bad input naming
// the label and what a label is for, before anything is written.
func TestVocabBound(t *testing.T) {
	dir := t.TempDir()
	var b strings.Builder
	b.WriteString("clip,speaker\n")
	for i := range 40 {
		fmt.Fprintf(&b, "c%02d,speaker-%02d\n", i, i)
	}
	list := filepath.Join(dir, "clips.csv")
	if err := os.WriteFile(list, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	defer func(v int64) { MaxVocabBytes = v }(MaxVocabBytes)
	MaxVocabBytes = 300 // 23 labels of 10 bytes and 4
	m, err := ParseLabel("speaker")
	if err != nil {
		t.Fatal(err)
	}
	x, _ := ParseModality("x=x/{clip}.npy")
	_, err = newJob(Options{ClipList: list, Out: filepath.Join(dir, "ds"), Modalities: []Modality{x, m}})
	if !errors.Is(err, ErrInput) || !strings.Contains(err.Error(), `the labels of "speaker" take more than 0 MiB in dataset.json (21 distinct so far): a label names a class shared by clips`) {
		t.Fatalf("got %v", err)
	}
	MaxVocabBytes = 400
	if _, err := newJob(Options{ClipList: list, Out: filepath.Join(dir, "ds"), Modalities: []Modality{x, m}}); err == nil {
		t.Fatal("40 labels of 14 bytes (4 a label included) accepted under a bound of 400")
	}
	MaxVocabBytes = 600
	if _, err := newJob(Options{ClipList: list, Out: filepath.Join(dir, "ds"), Modalities: []Modality{x, m}}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "ds")); err == nil {
		t.Fatal("newJob wrote --out")
	}
}
