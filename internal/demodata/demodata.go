// Package demodata converts testdata/demo into the datasets that the
// tests of several packages read (cmd/shuffle's and python/checks'): once
// a test binary, read-only, in a folder the caller removes.
package demodata

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/clipshard/clipshard/internal/clitest"
	"github.com/clipshard/clipshard/transform/convert"
)

var (
	dsOnce sync.Once
	dsDir  string
	dsErr  error
)

// Dataset converts testdata/demo once (into a new folder in parent): with
// per-clip modalities (a float16 vector and a kept int64 scalar), which
// every sample carries whole.
func Dataset(t testing.TB, parent string) string {
	t.Helper()
	dsOnce.Do(func() {
		dir, err := os.MkdirTemp(parent, "ds")
		if err != nil {
			dsErr = err
			return
		}
		var mods []convert.Modality
		for _, s := range []string{"motion=motion/{clip}.pkl:exp+pose", "shape@clip=motion/{clip}.pkl:shape", "whisper@2=whisper/{clip}.npy",
			"fps@clip=motion/{clip}.pkl:fps", "emotion=emotion/{clip}.npy"} {
			m, _ := convert.ParseModality(s)
			m.KeepDType = m.Name == "fps"
			mods = append(mods, m)
		}
		dsDir = filepath.Join(dir, "ds")
		_, dsErr = convert.Run(context.Background(), convert.Options{
			ClipList: filepath.Join(clitest.DemoDir(), "clips.txt"), Out: dsDir, Modalities: mods})
	})
	if dsErr != nil {
		t.Fatal(dsErr)
	}
	return dsDir
}

var (
	mixOnce sync.Once
	mixDirs map[string]string
	mixErr  error
)

// Mix converts, once (into a new folder in parent), three datasets of
// testdata/demo's clips of different sizes (a: all 12 clips, b: 4, c: 7),
// with the demo dataset's modalities, and one ("other") of the same clips
// whose motion modality has other keys (another frame shape).
func Mix(t testing.TB, parent string) map[string]string {
	t.Helper()
	mixOnce.Do(func() {
		dir, err := os.MkdirTemp(parent, "mix")
		if err != nil {
			mixErr = err
			return
		}
		root, _ := filepath.Abs(clitest.DemoDir())
		mixDirs = map[string]string{}
		clips := func(a, b int) string {
			var s strings.Builder
			for c := a; c < b; c++ {
				fmt.Fprintf(&s, "clip%03d\n", c)
			}
			return s.String()
		}
		for _, set := range []struct {
			name, clips, motion string
		}{{"a", clips(0, 12), "exp+pose"}, {"b", clips(0, 4), "exp+pose"}, {"c", clips(4, 11), "exp+pose"}, {"other", clips(0, 4), "exp"}} {
			var mods []convert.Modality
			for _, s := range []string{"motion=motion/{clip}.pkl:" + set.motion, "shape@clip=motion/{clip}.pkl:shape", "whisper@2=whisper/{clip}.npy",
				"emotion=emotion/{clip}.npy"} {
				m, err := convert.ParseModality(s)
				if err != nil {
					mixErr = err
					return
				}
				mods = append(mods, m)
			}
			list := filepath.Join(dir, set.name+".txt")
			os.WriteFile(list, []byte(set.clips), 0o644)
			mixDirs[set.name] = filepath.Join(dir, set.name)
			o := convert.Options{ClipList: list, Root: root, Out: mixDirs[set.name], Modalities: mods}
			if _, mixErr = convert.Run(context.Background(), o); mixErr != nil {
				return
			}
		}
	})
	if mixErr != nil {
		t.Fatal(mixErr)
	}
	return mixDirs
}
