// Package faults is fault injection for the crash tests. The code marks
// the moments a kill could hurt (before and after each rename of a commit,
// while a manifest is half written, between clips or shards) with Point.
// With CLIPSHARD_KILL_POINT=N in the environment, the N-th Point reached
// (counting from 1, over the whole process) kills the process with
// SIGKILL, as kill -9 would; with CLIPSHARD_FAULT_LOG=FILE, every Point
// reached appends its name to FILE, so that a test can count them and
// pick where to kill; with CLIPSHARD_FAULT_DELAY=DURATION (e.g. 20ms),
// every Point sleeps that long, so that concurrent runs overlap. Without
// these variables, Point costs an atomic load.
package faults

import (
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

var (
	once    sync.Once
	active  atomic.Bool
	killAt  int64
	delay   time.Duration
	reached atomic.Int64
	logMu   sync.Mutex
	logFile *os.File
)

func setup() {
	killAt, _ = strconv.ParseInt(os.Getenv("CLIPSHARD_KILL_POINT"), 10, 64)
	if p := os.Getenv("CLIPSHARD_FAULT_LOG"); p != "" {
		logFile, _ = os.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	}
	delay, _ = time.ParseDuration(os.Getenv("CLIPSHARD_FAULT_DELAY"))
	active.Store(killAt > 0 || logFile != nil || delay > 0)
}

// Point marks a moment where the process may be killed (see the package
// doc). name says where, for the log.
func Point(name string) {
	once.Do(setup)
	if !active.Load() {
		return
	}
	n := reached.Add(1)
	if logFile != nil {
		logMu.Lock()
		logFile.WriteString(name + "\n")
		logMu.Unlock()
	}
	if delay > 0 {
		time.Sleep(delay)
	}
	if n == killAt {
		syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {} // the signal is on its way
	}
}
