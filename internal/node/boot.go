package node

import (
	"errors"
	"fmt"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend"
)

// Starting a VM can fail for a moment and then work: the node's address
// range is full until another Machine goes, a tap cannot be made yet, the
// disk is full or busy. Such a failure is retried with backoff; any other
// fails the Machine for good. Either way a VM that has not reached Running
// within Options.BootTimeout of the first attempt fails the Machine
// (MachineReasonBootTimeout), and a set or pool replaces it.

// maxStartBackoff caps the wait between two start attempts.
const maxStartBackoff = 30 * time.Second

// transientError marks a start failure that may pass: the node network's
// part (address, tap, the guest's filters).
type transientError struct{ err error }

func (e transientError) Error() string { return e.err.Error() }
func (e transientError) Unwrap() error { return e.err }

// transient marks err, if any, as a failure that may pass.
func transient(err error) error {
	if err == nil {
		return nil
	}
	return transientError{err}
}

// transientErrnos are the system errors of a start that can pass: no disk
// space or quota, too many open files, no memory for now, busy, try again.
var transientErrnos = []syscall.Errno{
	syscall.ENOSPC, syscall.EDQUOT, syscall.EMFILE, syscall.ENFILE,
	syscall.ENOMEM, syscall.EAGAIN, syscall.EBUSY, syscall.EINTR,
}

// isTransientStart says whether a failed start is retried: the node
// network's errors (transientError), the errnos above wherever they come
// from (the backend's disk and files), and any error a backend marks with
// Temporary() true.
func isTransientStart(err error) bool {
	var te transientError
	if errors.As(err, &te) {
		return true
	}
	var temp interface{ Temporary() bool }
	if errors.As(err, &temp) && temp.Temporary() {
		return true
	}
	for _, errno := range transientErrnos {
		if errors.Is(err, errno) {
			return true
		}
	}
	return false
}

// bootAttempts remembers, per instance, when the agent first tried to start
// it and how many attempts failed, until it runs or fails for good. An
// agent that restarts starts counting again (from the VM's own start
// time for a VM it adopts while Booting).
type bootAttempts struct {
	mu sync.Mutex
	m  map[string]*bootAttempt
}

type bootAttempt struct {
	// failedReason and failedMessage: the Machine failed for good, and
	// stays Failed even if the status write saying so lost a race (the
	// next reconcile writes it again instead of starting the VM).
	failedReason, failedMessage string

	first    time.Time
	failures int
	// next is when the next attempt may be made: a status write wakes the
	// reconciler long before the backoff is over.
	next time.Time
}

// begin records a start attempt and returns when the first one was.
func (b *bootAttempts) begin(id string, now time.Time) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[string]*bootAttempt{}
	}
	at := b.m[id]
	if at == nil {
		at = &bootAttempt{first: now}
		b.m[id] = at
	}
	return at.first
}

// failed counts a failed attempt, holds the next one back by its backoff
// and returns how many failed so far.
func (b *bootAttempts) failed(id string, now time.Time) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if at := b.m[id]; at != nil {
		at.failures++
		at.next = now.Add(startBackoff(at.failures))
		return at.failures
	}
	return 1
}

// wait is how long the next attempt must still wait (zero: go).
func (b *bootAttempts) wait(id string, now time.Time) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if at := b.m[id]; at != nil && now.Before(at.next) {
		return at.next.Sub(now)
	}
	return 0
}

// since is when the first attempt was, or zero when none is recorded.
func (b *bootAttempts) since(id string) time.Time {
	b.mu.Lock()
	defer b.mu.Unlock()
	if at := b.m[id]; at != nil {
		return at.first
	}
	return time.Time{}
}

// gaveUp records that the instance failed for good.
func (b *bootAttempts) gaveUp(id, reason, message string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.m == nil {
		b.m = map[string]*bootAttempt{}
	}
	b.m[id] = &bootAttempt{failedReason: reason, failedMessage: message}
}

// failedForGood is the reason and message of an instance that failed for
// good, if it did.
func (b *bootAttempts) failedForGood(id string) (reason, message string, ok bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if at := b.m[id]; at != nil && at.failedReason != "" {
		return at.failedReason, at.failedMessage, true
	}
	return "", "", false
}

func (b *bootAttempts) forget(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.m, id)
}

// startBackoff is the wait after the n-th failed attempt: 1 s, 2 s, 4 s,
// up to maxStartBackoff.
func startBackoff(n int) time.Duration {
	d := time.Second
	for i := 1; i < n && d < maxStartBackoff; i++ {
		d *= 2
	}
	return min(d, maxStartBackoff)
}

// startFailed handles a failed start attempt of machine: a transient one
// with time left before the boot timeout is retried (it returns when), any
// other fails the Machine.
func (a *Agent) startFailed(machine *kaironv1.Machine, id string, err error) time.Duration {
	failures := a.boots.failed(id, time.Now())
	first := a.boots.since(id)
	wait := startBackoff(failures)
	if isTransientStart(err) && time.Since(first)+wait < a.opts.BootTimeout {
		phase := machine.Status.Phase
		if phase == "" || phase == kaironv1.MachinePending {
			phase = kaironv1.MachineScheduled
		}
		message := fmt.Sprintf("starting the VM failed (attempt %d), retrying in %s: %v", failures, wait, err)
		setPhase(machine, phase, kaironv1.MachineReasonStartRetrying, message)
		a.event(machine, corev1.EventTypeWarning, kaironv1.EventReasonStartRetrying, message)
		return wait
	}
	message := err.Error()
	if failures > 1 {
		message = fmt.Sprintf("%s (attempt %d; gave up)", message, failures)
	}
	a.boots.gaveUp(id, kaironv1.MachineReasonStartFailed, message)
	setPhase(machine, kaironv1.MachineFailed, kaironv1.MachineReasonStartFailed, message)
	a.event(machine, corev1.EventTypeWarning, kaironv1.MachineReasonStartFailed, message)
	return a.opts.Interval
}

// bootTimedOut says whether a VM still Booting has had its time: since the
// first start attempt this agent made, or since the VM started for one it
// adopted.
func (a *Agent) bootTimedOut(id string, instance backend.Instance) bool {
	since := a.boots.since(id)
	if since.IsZero() || (!instance.StartedAt.IsZero() && instance.StartedAt.Before(since)) {
		since = instance.StartedAt
	}
	return !since.IsZero() && time.Since(since) > a.opts.BootTimeout
}
