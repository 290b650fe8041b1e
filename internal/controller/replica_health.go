package controller

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/klog/v2"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
)

// Failed and node-lost members. A MachineSet or MachinePool counts neither
// a Failed Machine (its VM is gone: it failed to start, timed out booting
// or exited) nor one on a node whose agent is unreachable
// (rules.MachineNodeReachable), so it creates replacements for both at once.
// A Failed Machine on a reachable node is then deleted: nothing runs, and
// its reason stays in the set's or pool's DeletedFailedMachine event. A
// node-lost Machine is never deleted: its node may still run the VM, and
// only the operator can say it does not (issue 16, fence). Once the node
// is back it counts again, and scaling down removes the surplus.

// splitByHealth separates the Machines a set or pool counts from those on
// an unreachable node (lost) and the Failed ones on a reachable node.
func splitByHealth(machines []*kaironv1.Machine) (counted, lost, failed []*kaironv1.Machine) {
	for _, m := range machines {
		switch {
		case !rules.MachineNodeReachable(m):
			lost = append(lost, m)
		case m.Status.Phase == kaironv1.MachineFailed:
			failed = append(failed, m)
		default:
			counted = append(counted, m)
		}
	}
	return counted, lost, failed
}

// maxFailureBackoff caps how long a set or pool waits before it replaces
// its next Failed Machine.
const maxFailureBackoff = 5 * time.Minute

// failureBackoff slows the replacement of Failed Machines that keep
// failing (a template whose image is missing fails every Machine within
// moments): after the n-th replacement the next waits 2^(n-1) s, up to
// maxFailureBackoff. A set or pool whose Machines are all ready starts
// over. Meanwhile its Failed Machines stay, counted as in flight so that
// no replacement is made for them, and are replaced when the wait is over.
type failureBackoff struct {
	mu  sync.Mutex
	m   map[types.UID]*failureState
	now func() time.Time
}

type failureState struct {
	replaced int
	until    time.Time
}

func newFailureBackoff() *failureBackoff {
	return &failureBackoff{m: map[types.UID]*failureState{}, now: time.Now}
}

// hold is how long the owner must still wait before it replaces a Failed
// Machine (zero: now).
func (b *failureBackoff) hold(owner types.UID) time.Duration {
	b.mu.Lock()
	defer b.mu.Unlock()
	if s := b.m[owner]; s != nil {
		if now := b.now(); now.Before(s.until) {
			return s.until.Sub(now)
		}
	}
	return 0
}

// replaced records that the owner replaced n Failed Machines now.
func (b *failureBackoff) replaced(owner types.UID, n int) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.m[owner]
	if s == nil {
		s = &failureState{}
		b.m[owner] = s
	}
	s.replaced += n
	wait := time.Second
	for i := 1; i < s.replaced && wait < maxFailureBackoff; i++ {
		wait *= 2
	}
	s.until = b.now().Add(min(wait, maxFailureBackoff))
}

// healthy forgets the owner's failures: all its Machines are ready.
func (b *failureBackoff) healthy(owner types.UID) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.m, owner)
}

// heldFailed is what a reconcile does with the owner's Failed Machines:
// during a backoff they are held (counted as in flight, not deleted) and
// the reconcile comes back when it ends; otherwise they are to be deleted.
func (b *failureBackoff) heldFailed(owner types.UID, failed []*kaironv1.Machine) (toDelete []*kaironv1.Machine, held int, retryIn time.Duration) {
	if len(failed) == 0 {
		return nil, 0, 0
	}
	if wait := b.hold(owner); wait > 0 {
		return nil, len(failed), wait
	}
	return failed, 0, 0
}

// deleteFailed deletes the owner's Failed Machines, each only as the
// version the reconcile saw (still Failed), with an event that keeps its
// reason, and counts them into the backoff.
func deleteFailed(ctx context.Context, c client.Client, recorder events.EventRecorder, backoff *failureBackoff,
	expectations *replicaExpectations, owner client.Object, failed []*kaironv1.Machine) error {
	var errs []error
	deleted := 0
	for _, m := range failed {
		err := c.Delete(ctx, m, client.Preconditions{UID: ptr.To(m.UID), ResourceVersion: ptr.To(m.ResourceVersion)})
		switch {
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			continue // gone, or changed since listed: the next pass looks again
		case err != nil:
			recorder.Eventf(owner, m, corev1.EventTypeWarning, kaironv1.ReplicaReasonFailedDelete, "Delete", "Deleting failed machine %s: %v", m.Name, err)
			errs = append(errs, fmt.Errorf("deleting failed machine %s: %w", m.Name, err))
			continue
		}
		deleted++
		expectations.deleted(owner.GetUID(), m.UID)
		log.FromContext(ctx).Info("Deleted failed machine, replaced", "machine", klog.KObj(m), "reason", failedReason(m))
		recorder.Eventf(owner, m, corev1.EventTypeNormal, kaironv1.EventReasonDeletedFailed, "Delete",
			"Deleted failed machine %s after replacing it: %s", m.Name, failedReason(m))
	}
	backoff.replaced(owner.GetUID(), deleted)
	return errors.Join(errs...)
}

// failedReason is a Failed Machine's Ready reason and message.
func failedReason(m *kaironv1.Machine) string {
	for _, c := range m.Status.Conditions {
		if c.Type == kaironv1.ConditionReady.String() {
			return c.Reason + ": " + c.Message
		}
	}
	return m.Status.Message
}
