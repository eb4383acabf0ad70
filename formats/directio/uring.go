// Direct writes through io_uring, so that the writing goroutine does not
// hold a P while the device works.
//
// A direct pwrite blocks its thread until the device has the bytes, and
// the Go scheduler leaves the thread's P (one of GOMAXPROCS) with it until
// sysmon takes it back, which it does late, or not at all when it sees no
// work queued on that very P. On a 2-CPU box the blob write goroutines
// kept one of the two Ps in pwrite for much of a convert run while other
// goroutines waited to run (Go's execution trace: 160 ms in pwrite over a
// 276 ms run, three goroutines runnable on average, 1.5 of 2 CPUs used).
//
// Submitted to an io_uring, the write is started by the kernel (a direct
// write that extends the file, which ext4 does synchronously, goes to an
// io_uring worker thread), and the goroutine waits for its completion by
// looking at the completion ring between short sleeps: parked, it leaves
// its P to the goroutines that have work. An eventfd registered with the
// ring wakes it at once when the Ps are idle; it cannot be the only wake,
// since the netpoller that reads it is polled only when a P runs out of
// work, or every 10 ms. (Linux AIO is no substitute: io_submit of an
// extending direct write waits for it on ext4, and extending the file
// first makes every write convert unwritten extents, which measured
// slower than the pwrite it replaces.)
//
// Where io_uring is not available (kernel older than 5.6, refused by a
// seccomp filter or by kernel.io_uring_disabled, its queue full) the write
// is a plain pwrite, as before. A write the ring fails is done again with
// pwrite, which reports the error (or, for EINVAL, falls back to the page
// cache; see File.WriteAt).

package directio

import (
	"os"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Async chooses whether direct writes go through io_uring when the kernel
// offers it (tests turn it off to cover both paths).
var Async = true

const (
	ringEntries     = 64 // writes in flight at once (a File has at most one)
	opWrite         = 23 // IORING_OP_WRITE
	offSQEs         = 0x10000000
	featSingleMM    = 1 << 0 // IORING_FEAT_SINGLE_MMAP (5.4)
	featRWCurPos    = 1 << 3 // IORING_FEAT_RW_CUR_POS (5.6, with IORING_OP_WRITE)
	registerEventfd = 4      // IORING_REGISTER_EVENTFD
)

// uringParams is struct io_uring_params.
type uringParams struct {
	sqEntries, cqEntries, flags, sqThreadCPU, sqThreadIdle, features, wqFd uint32
	resv                                                                   [3]uint32
	sqOff                                                                  struct {
		head, tail, ringMask, ringEntries, flags, dropped, array, resv1 uint32
		userAddr                                                        uint64
	}
	cqOff struct {
		head, tail, ringMask, ringEntries, overflow, cqes, flags, resv1 uint32
		userAddr                                                        uint64
	}
}

// sqe is struct io_uring_sqe.
type sqe struct {
	opcode, flags         uint8
	ioprio                uint16
	fd                    int32
	off, addr             uint64
	len, rwFlags          uint32
	userData              uint64
	bufIndex, personality uint16
	spliceFdIn            int32
	addr3, pad            uint64
}

// cqe is struct io_uring_cqe.
type cqe struct {
	userData uint64
	res      int32
	flags    uint32
}

// uring is the process's one ring. mu guards the rings' heads and tails
// (this process is their only user besides the kernel) and done.
type uring struct {
	fd             int
	mu             sync.Mutex
	sqTail         *uint32
	cqHead, cqTail *uint32
	sqMask, cqMask uint32
	sqArray        []uint32
	sqes           []sqe
	cqes           []cqe
	inflight       int
	next           uint64
	waiters        map[uint64]chan int32 // by user_data: where its result goes
}

// ringWrites counts the writes done whole through the ring (for tests).
var ringWrites atomic.Int64

var theRing struct {
	once sync.Once
	r    *uring
}

// asyncRing returns the ring, set up on first use, or nil where the kernel
// refuses it (or Async is off).
func asyncRing() *uring {
	if !Async || unsafe.Sizeof(uringParams{}) != 120 || unsafe.Sizeof(sqe{}) != 64 || unsafe.Sizeof(cqe{}) != 16 {
		return nil
	}
	theRing.once.Do(func() { theRing.r = newRing() })
	return theRing.r
}

func newRing() *uring {
	var p uringParams
	fd, _, e := unix.Syscall(unix.SYS_IO_URING_SETUP, ringEntries, uintptr(unsafe.Pointer(&p)), 0)
	if e != 0 {
		return nil
	}
	ok := false
	defer func() {
		if !ok {
			unix.Close(int(fd))
		}
	}()
	if p.features&(featSingleMM|featRWCurPos) != featSingleMM|featRWCurPos { // before 5.6: no IORING_OP_WRITE
		return nil
	}
	size := max(p.sqOff.array+p.sqEntries*4, p.cqOff.cqes+p.cqEntries*uint32(unsafe.Sizeof(cqe{})))
	rb, err := unix.Mmap(int(fd), 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil
	}
	sb, err := unix.Mmap(int(fd), offSQEs, int(p.sqEntries)*int(unsafe.Sizeof(sqe{})), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		unix.Munmap(rb)
		return nil
	}
	u32 := func(off uint32) *uint32 { return (*uint32)(unsafe.Pointer(&rb[off])) }
	r := &uring{
		fd:     int(fd),
		sqTail: u32(p.sqOff.tail),
		cqHead: u32(p.cqOff.head), cqTail: u32(p.cqOff.tail),
		sqMask: *u32(p.sqOff.ringMask), cqMask: *u32(p.cqOff.ringMask),
		sqArray: unsafe.Slice(u32(p.sqOff.array), p.sqEntries),
		sqes:    unsafe.Slice((*sqe)(unsafe.Pointer(&sb[0])), p.sqEntries),
		cqes:    unsafe.Slice((*cqe)(unsafe.Pointer(&rb[p.cqOff.cqes])), p.cqEntries),
		waiters: map[uint64]chan int32{},
	}
	ok = true
	// Completions also signal an eventfd, which the netpoller watches:
	// when the Ps are idle (nothing else to run), a waiting writer is
	// woken at once rather than at its next timer, which then fires no
	// earlier than a millisecond.
	if efd, err := unix.Eventfd(0, unix.EFD_NONBLOCK|unix.EFD_CLOEXEC); err == nil {
		arg := int32(efd)
		if _, _, e := unix.Syscall6(unix.SYS_IO_URING_REGISTER, fd, registerEventfd, uintptr(unsafe.Pointer(&arg)), 1, 0, 0); e == 0 {
			go r.wake(os.NewFile(uintptr(efd), "io_uring-eventfd"))
		} else {
			unix.Close(efd)
		}
	}
	return r // mapped for the life of the process
}

// submit queues a write of p at off to fd, whose result goes to ch; false
// if the ring cannot take it now (full) or the kernel refused it.
func (r *uring) submit(fd uintptr, p []byte, off int64, ch chan int32) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	// Each io_uring_enter consumes the entry it was given, so the
	// submission queue is empty here; what bounds the writes in flight
	// (and keeps the completion queue, twice as long, from overflowing)
	// is this count.
	if r.inflight >= len(r.sqes) {
		return false
	}
	tail := *r.sqTail // only this process advances it
	r.next++
	id := r.next
	i := tail & r.sqMask
	r.sqes[i] = sqe{opcode: opWrite, fd: int32(fd), off: uint64(off), addr: uint64(uintptr(unsafe.Pointer(&p[0]))), len: uint32(len(p)), userData: id}
	r.sqArray[i] = i
	atomic.StoreUint32(r.sqTail, tail+1)
	for {
		n, _, e := unix.Syscall6(unix.SYS_IO_URING_ENTER, uintptr(r.fd), 1, 0, 0, 0, 0)
		if e == unix.EINTR {
			continue
		}
		if e != 0 || n != 1 {
			// Not consumed: take the entry back.
			atomic.StoreUint32(r.sqTail, tail)
			return false
		}
		break
	}
	r.inflight++
	r.waiters[id] = ch
	return true
}

// reap hands the completions in the ring to their waiters. r.mu is held.
func (r *uring) reap() {
	head := *r.cqHead
	tail := atomic.LoadUint32(r.cqTail)
	for ; head != tail; head++ {
		c := r.cqes[head&r.cqMask]
		if ch := r.waiters[c.userData]; ch != nil {
			delete(r.waiters, c.userData)
			ch <- c.res
		}
		r.inflight--
	}
	atomic.StoreUint32(r.cqHead, head)
}

func (r *uring) lockedReap() {
	r.mu.Lock()
	r.reap()
	r.mu.Unlock()
}

// wake reaps completions each time the eventfd says there are some.
func (r *uring) wake(efd *os.File) {
	var n [8]byte
	for {
		if _, err := efd.Read(n[:]); err != nil {
			return // not expected: the waiters' timers still reap
		}
		r.lockedReap()
	}
}

// wait returns the result sent on ch (bytes written, or -errno), looking
// at the completion ring itself between sleeps: when the CPUs are busy,
// the netpoller (and so the eventfd) is looked at only every 10 ms, but
// timers at every scheduling.
func (r *uring) wait(ch chan int32) int32 {
	sleep := 20 * time.Microsecond
	t := time.NewTimer(sleep)
	defer t.Stop()
	for {
		select {
		case res := <-ch:
			return res
		case <-t.C:
			r.lockedReap()
			sleep = min(2*sleep, 500*time.Microsecond)
			t.Reset(sleep)
		}
	}
}

// writeAsync writes p (page-aligned, for the direct descriptor) at off
// through the ring. It returns the bytes written, or ok false if the ring
// did not write them all (the caller writes the rest with pwrite).
func (d *File) writeAsync(p []byte, off int64) (n int, ok bool) {
	r := asyncRing()
	if r == nil || len(p) > 1<<30 {
		return 0, false
	}
	var res int32 = -1
	err := d.raw.Control(func(fd uintptr) {
		ch := make(chan int32, 1)
		if r.submit(fd, p, off, ch) {
			res = r.wait(ch)
		}
	})
	runtime.KeepAlive(p)
	if err != nil || res < 0 {
		return 0, false
	}
	if int(res) == len(p) {
		ringWrites.Add(1)
	}
	return int(res), int(res) == len(p)
}
