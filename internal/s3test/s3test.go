// Package s3test starts a real S3 server for the tests: versitygw (a Go
// module, posix backend: a bucket is a folder) on 127.0.0.1, stopped by
// PID when the test ends. Outside CI a test without it is skipped, saying
// how to install it; in CI (CI set) it fails.
package s3test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Install is how to get the server.
const Install = "GOBIN=$HOME/.cache/clipshard-ci/bin go install github.com/versity/versitygw/cmd/versitygw@v1.8.0 (or set CLIPSHARD_VERSITYGW to its path); .ci/run does it"

// Keys of the server's root account.
const (
	AccessKey = "clipshard-test"
	SecretKey = "clipshard-test-secret-key"
)

// Server is a running versitygw.
type Server struct {
	Endpoint string // http://127.0.0.1:PORT
	Root     string // the posix backend's folder: a subfolder is a bucket
	cmd      *exec.Cmd
}

// Binary finds versitygw: CLIPSHARD_VERSITYGW, the cache folder .ci/run
// builds it in, or PATH.
func Binary() string {
	if p := os.Getenv("CLIPSHARD_VERSITYGW"); p != "" {
		return p
	}
	if home, err := os.UserHomeDir(); err == nil {
		p := filepath.Join(home, ".cache", "clipshard-ci", "bin", "versitygw")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, _ := exec.LookPath("versitygw")
	return p
}

// Start starts a server for t, with the buckets named (folders of its
// root), and stops it when t ends.
func Start(t testing.TB, buckets ...string) *Server {
	t.Helper()
	bin := Binary()
	if bin == "" {
		if os.Getenv("CI") != "" {
			t.Fatalf("versitygw is missing in CI: %s", Install)
		}
		t.Skipf("no versitygw (the S3 server of the tests): %s", Install)
	}
	root := t.TempDir()
	for _, b := range buckets {
		if err := os.Mkdir(filepath.Join(root, b), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for try := 0; ; try++ {
		port := freePort(t)
		s := &Server{Endpoint: fmt.Sprintf("http://127.0.0.1:%d", port), Root: root}
		s.cmd = exec.Command(bin, "--port", fmt.Sprintf("127.0.0.1:%d", port), "posix", root)
		s.cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY="+AccessKey, "ROOT_SECRET_KEY="+SecretKey)
		log, _ := os.Create(filepath.Join(t.TempDir(), "versitygw.log"))
		s.cmd.Stdout, s.cmd.Stderr = log, log
		s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := s.cmd.Start(); err != nil {
			t.Fatalf("starting %s: %v", bin, err)
		}
		pid := s.cmd.Process.Pid
		t.Cleanup(func() {
			syscall.Kill(-pid, syscall.SIGTERM)
			done := make(chan struct{})
			go func() { s.cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				syscall.Kill(-pid, syscall.SIGKILL)
				<-done
			}
			log.Close()
		})
		// (the port is free when picked, not when the server binds it: a
		// server of another test may take it first, this one then exits
		// and the port answers for that one; so it must be this pid's)
		if waitPort(port, pid, 10*time.Second) {
			return s
		}
		syscall.Kill(-pid, syscall.SIGKILL)
		if try == 2 {
			b, _ := os.ReadFile(log.Name())
			t.Fatalf("versitygw did not start on port %d: %s", port, b)
		}
	}
}

// Env is the environment a client of s needs (credentials, endpoint,
// region), to append to a command's environment.
func (s *Server) Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + AccessKey, "AWS_SECRET_ACCESS_KEY=" + SecretKey, "AWS_ENDPOINT_URL=" + s.Endpoint,
		"AWS_REGION=us-east-1", "AWS_SHARED_CREDENTIALS_FILE=/nonexistent", "AWS_CONFIG_FILE=/nonexistent"}
}

// Setenv sets Env in this process for t.
func (s *Server) Setenv(t testing.TB) {
	for _, kv := range s.Env() {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	t.Setenv("AWS_PROFILE", "")
	os.Unsetenv("AWS_PROFILE") // (restored when t ends)
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// waitPort waits until process pid listens on port (and answers there),
// false if it does not within d or exits first.
func waitPort(port, pid int, d time.Duration) bool {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
		if !alive(pid) {
			return false
		}
		if !listens(pid, port) {
			continue
		}
		if c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second); err == nil {
			c.Close()
			return true
		}
	}
	return false
}

// alive reports whether process pid runs (not exited, not a zombie).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(b), ") ")
	return rest != "" && rest[0] != 'Z' && rest[0] != 'X'
}

// listens reports whether process pid holds the socket listening on
// 127.0.0.1:port (from /proc/net/tcp and the process's fds).
func listens(pid, port int) bool {
	b, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return false
	}
	want := fmt.Sprintf("0100007F:%04X", port)
	var inode string
	for _, line := range strings.Split(string(b), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) > 9 && f[1] == want && f[3] == "0A" { // (0A: LISTEN)
			inode = f[9]
		}
	}
	if inode == "" {
		return false
	}
	fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return false
	}
	for _, e := range fds {
		if to, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, e.Name())); err == nil && to == "socket:["+inode+"]" {
			return true
		}
	}
	return false
}
