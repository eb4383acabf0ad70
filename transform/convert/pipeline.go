// Pipeline: workers decode and convert clips in parallel, within a memory
// budget, and the writer takes them in order.

package convert

import (
	"context"
	"sync"
)

// pipeline decodes and converts the clips from w.next on with opts.Workers
// goroutines and writes them in order.
func (j *job) pipeline(ctx context.Context, w *writer, res *Result) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w.ctx = ctx
	n := len(j.clips)
	// Half the clips' memory (clipMemory) for converted clips waiting to
	// be written; the other half for the clips the workers hold (each at
	// most twice streamMin: its source and its converted rows).
	b := newBudget(clipMemory(j.opts.Budget)/2, w.next)
	stop := context.AfterFunc(ctx, b.wake)
	defer stop()

	indices := make(chan int, 256)
	results := make(chan *clipOut, 2*j.opts.Workers)
	var wg sync.WaitGroup
	go func() {
		defer close(indices)
		for i := w.next; i < n; i++ {
			select {
			case indices <- i:
			case <-ctx.Done():
				return
			}
		}
	}()
	for range j.opts.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range indices {
				c := j.processClip(ctx, i)
				if !b.acquire(ctx, c.cost, i) {
					c.release()
					return
				}
				select {
				case results <- c:
				case <-ctx.Done():
					c.release()
					return
				}
			}
		}()
	}
	defer func() {
		cancel()
		// Drain so that workers blocked on send can exit.
		go func() {
			for c := range results {
				c.release()
			}
		}()
		wg.Wait()
		close(results)
	}()

	pending := map[int]*clipOut{}
	report := func(phase string) {
		if j.opts.Progress != nil {
			j.opts.Progress(Progress{Clips: w.next, ClipsTotal: n, Resumed: res.Resumed, BytesIn: res.BytesIn, BytesOut: w.bytesOut, Phase: phase})
		}
	}
	report("convert")
	for w.next < n {
		if ctx.Err() != nil {
			w.flush()
			return ctx.Err()
		}
		var c *clipOut
		select {
		case c = <-results:
		case <-ctx.Done():
			w.flush()
			return ctx.Err()
		}
		pending[c.index] = c
		for ctx.Err() == nil {
			c, ok := pending[w.next]
			if !ok {
				break
			}
			delete(pending, w.next)
			err := w.write(c)
			res.BytesIn += c.bytesIn
			c.release()
			b.release(c.cost, w.next)
			if err != nil {
				for _, p := range pending {
					p.release()
				}
				w.flush() // keep what is done for a resume
				return err
			}
			if c.err == nil {
				res.Converted++
				switch c.reused {
				case 0:
				case len(c.mods):
					res.Reused++
				default:
					res.ReusedPart++
				}
			}
			report("convert")
		}
	}
	res.BytesOut = w.bytesOut
	return w.flush()
}

// budget bounds the bytes of converted clips waiting to be written. The
// clip the writer needs next is always admitted, so the pipeline cannot
// deadlock however large one clip is.
type budget struct {
	mu    sync.Mutex
	cond  *sync.Cond
	used  int64
	limit int64
	next  int
}

func newBudget(limit int64, next int) *budget {
	b := &budget{limit: limit, next: next}
	b.cond = sync.NewCond(&b.mu)
	return b
}

func (b *budget) acquire(ctx context.Context, cost int64, index int) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.used > 0 && b.used+cost > b.limit && index != b.next {
		if ctx.Err() != nil {
			return false
		}
		b.cond.Wait()
	}
	b.used += cost
	return ctx.Err() == nil
}

func (b *budget) release(cost int64, next int) {
	b.mu.Lock()
	b.used -= cost
	b.next = next
	b.mu.Unlock()
	b.cond.Broadcast()
}

func (b *budget) wake() {
	b.mu.Lock()
	b.mu.Unlock()
	b.cond.Broadcast()
}
