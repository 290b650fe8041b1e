package images

import (
	"context"
	"sync"
)

// flights runs one call of a function per key at a time, however many
// callers ask for it: the second Ensure of an image waits for the first's
// pull instead of starting its own. A flight runs in its own context,
// cancelled only once every caller waiting for it gave up, so one
// impatient caller does not fail the others.
type flights[T any] struct {
	mu sync.Mutex
	m  map[string]*flight[T]
}

type flight[T any] struct {
	done    chan struct{}
	val     T
	err     error
	waiters int
	cancel  context.CancelFunc
}

// do returns fn's result for key, running fn unless a flight for key is
// already running, and ctx's error if ctx ends first.
func (f *flights[T]) do(ctx context.Context, key string, fn func(context.Context) (T, error)) (T, error) {
	f.mu.Lock()
	if f.m == nil {
		f.m = map[string]*flight[T]{}
	}
	fl := f.m[key]
	if fl == nil {
		fctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		fl = &flight[T]{done: make(chan struct{}), cancel: cancel}
		f.m[key] = fl
		go func() {
			defer close(fl.done)
			defer cancel()
			fl.val, fl.err = fn(fctx)
			f.forget(key, fl)
		}()
	}
	fl.waiters++
	f.mu.Unlock()

	select {
	case <-fl.done:
		return fl.val, fl.err
	case <-ctx.Done():
		f.mu.Lock()
		fl.waiters--
		if fl.waiters == 0 {
			// Nobody wants it any more: stop it, and let a caller that
			// comes now start afresh rather than join a cancelled flight.
			fl.cancel()
			if f.m[key] == fl {
				delete(f.m, key)
			}
		}
		f.mu.Unlock()
		var zero T
		return zero, ctx.Err()
	}
}

func (f *flights[T]) forget(key string, fl *flight[T]) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m[key] == fl {
		delete(f.m, key)
	}
}
