package s3test

import (
	"net"
	"os"
	"testing"
)

// TestListens: a port answers for the process holding its listening
// socket, not for another (a server that lost the port to another test's
// server must not be taken for it).
func TestListens(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if !listens(os.Getpid(), port) || !alive(os.Getpid()) {
		t.Fatal("this process's listener not seen")
	}
	if listens(1, port) {
		t.Fatal("pid 1 taken for the listener of this process")
	}
	l.Close()
	if listens(os.Getpid(), port) {
		t.Fatal("a closed listener still seen")
	}
	if alive(1 << 30) {
		t.Fatal("a pid that cannot exist is alive")
	}
}
