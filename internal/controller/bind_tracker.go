package controller

import (
	"sort"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
)

// arrivalsTTL bounds how long the time a claim or member first showed up in
// the watch is kept (createdAt). A claim still Pending after it is forgotten
// has its bind time measured from creationTimestamp, which is then exact
// enough.
const arrivalsTTL = 10 * time.Minute

// bindTracker is what this process knows about claims and members that its
// informer cache may not show yet, shared by the binder and the claim
// reconciler, as the scheduler's assumedBindings is for node bindings.
//
// Without it, a binding pass right after a bind would still see the claim
// Pending and the member warm, and bind the claim a second time to another
// member (the claim's status write would then fail on its resourceVersion
// and the member be handed back, but that churns the pool for nothing).
type bindTracker struct {
	mu  sync.Mutex
	now func() time.Time

	// claims this process is binding or has bound, until the cache shows
	// them past Pending.
	claims map[types.UID]time.Time
	// machines this process has bound, until the cache shows them claimed.
	machines map[types.UID]time.Time
	// orphans: Pending claims first seen with a Machine already labelled
	// for them (a bind whose status write has not landed, or never will).
	orphans map[types.UID]time.Time
	// arrivals: when the watch first delivered a claim or member.
	arrivals  map[types.UID]time.Time
	lastSweep time.Time
}

func newBindTracker() *bindTracker {
	return &bindTracker{
		now:      time.Now,
		claims:   map[types.UID]time.Time{},
		machines: map[types.UID]time.Time{},
		orphans:  map[types.UID]time.Time{},
		arrivals: map[types.UID]time.Time{},
	}
}

// arrived records when an object was first seen.
func (t *bindTracker) arrived(uid types.UID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	now := t.now()
	if _, ok := t.arrivals[uid]; !ok {
		t.arrivals[uid] = now
	}
	if now.Sub(t.lastSweep) > time.Minute {
		t.lastSweep = now
		for id, at := range t.arrivals {
			if now.Sub(at) > arrivalsTTL {
				delete(t.arrivals, id)
			}
		}
		for _, m := range []map[types.UID]time.Time{t.claims, t.machines, t.orphans} {
			for id, at := range m {
				if now.Sub(at) > arrivalsTTL {
					delete(m, id)
				}
			}
		}
	}
}

// departed forgets a deleted object.
func (t *bindTracker) departed(uid types.UID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.arrivals, uid)
	delete(t.claims, uid)
	delete(t.machines, uid)
	delete(t.orphans, uid)
}

// createdAt is when o's bind time starts. creationTimestamp has whole
// seconds, too coarse for binds that take milliseconds, so it is never used
// when anything better is known:
//   - the creation stamp its client put on a claim
//     (AnnotationClaimCreatedAt, as kaironctl and the MCP server do), if
//     creationTimestamp allows it (rules.ClaimCreatedAt);
//   - else when this process's watch first delivered it: at most a watch
//     delivery after its creation, or later if the controller started
//     after it was created (the bind then looks faster than it was, never
//     slower);
//   - else, for an object the watch has not delivered yet,
//     creationTimestamp.
func (t *bindTracker) createdAt(o client.Object) time.Time {
	if c, ok := o.(*kaironv1.MachineClaim); ok {
		if stamp, ok := rules.ClaimCreatedAt(c); ok {
			return stamp
		}
	}
	t.mu.Lock()
	at, ok := t.arrivals[o.GetUID()]
	t.mu.Unlock()
	if ok {
		return at
	}
	return o.GetCreationTimestamp().Time
}

// sortOldestFirst orders objects by creation, breaking ties within a
// creationTimestamp's second by arrival, then by name.
func sortOldestFirst[T client.Object](t *bindTracker, objs []T) {
	t.mu.Lock()
	arrival := make(map[types.UID]time.Time, len(objs))
	for _, o := range objs {
		if at, ok := t.arrivals[o.GetUID()]; ok {
			arrival[o.GetUID()] = at
		}
	}
	t.mu.Unlock()
	sort.SliceStable(objs, func(i, j int) bool {
		a, b := objs[i], objs[j]
		ca, cb := a.GetCreationTimestamp(), b.GetCreationTimestamp()
		if !ca.Equal(&cb) {
			return ca.Before(&cb)
		}
		aa, okA := arrival[a.GetUID()]
		ab, okB := arrival[b.GetUID()]
		if okA && okB && !aa.Equal(ab) {
			return aa.Before(ab)
		}
		return a.GetName() < b.GetName()
	})
}

// bindSteps is where a bind's time went, for its log line: from the
// claim's creation to the watch delivering it (seen), from there to its
// bind starting (started), and from there to its Machine being taken
// (take). A step this process did not see is 0.
type bindSteps struct {
	seen, started, take time.Duration
}

// steps splits the span from created to took for claim.
func (t *bindTracker) steps(claim types.UID, created, took time.Time) bindSteps {
	t.mu.Lock()
	arrival, seen := t.arrivals[claim]
	start, started := t.claims[claim]
	t.mu.Unlock()
	var s bindSteps
	if seen {
		s.seen = arrival.Sub(created)
	}
	if started && seen {
		s.started = start.Sub(arrival)
	}
	if started {
		s.take = took.Sub(start)
	}
	return s
}

// startBind marks a claim as being bound by this process.
func (t *bindTracker) startBind(claim types.UID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.claims[claim] = t.now()
}

// abandonBind forgets a claim whose bind did not happen.
func (t *bindTracker) abandonBind(claim types.UID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.claims, claim)
}

// claimInFlight says whether this process is binding, or has bound, the
// claim the cache still shows as Pending.
func (t *bindTracker) claimInFlight(c *kaironv1.MachineClaim) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	at, ok := t.claims[c.UID]
	if !ok {
		return false
	}
	if !claimPending(c) || t.now().Sub(at) > assumeTTL {
		delete(t.claims, c.UID)
		return false
	}
	return true
}

func (t *bindTracker) tookMachine(m types.UID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.machines[m] = t.now()
}

func (t *bindTracker) gaveBackMachine(m types.UID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.machines, m)
}

// machineTaken says whether this process bound a member the cache still
// shows as warm.
func (t *bindTracker) machineTaken(m *kaironv1.Machine) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	at, ok := t.machines[m.UID]
	if !ok {
		return false
	}
	if m.Labels[kaironv1.LabelPoolState] != kaironv1.PoolStateWarm || m.DeletionTimestamp != nil || t.now().Sub(at) > assumeTTL {
		delete(t.machines, m.UID)
		return false
	}
	return true
}

// orphanSince records, and returns, when a Pending claim was first seen with
// a Machine already labelled for it.
func (t *bindTracker) orphanSince(claim types.UID) time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	at, ok := t.orphans[claim]
	if !ok {
		at = t.now()
		t.orphans[claim] = at
	}
	return at
}

func (t *bindTracker) forgetOrphan(claim types.UID) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.orphans, claim)
}

// claimPending: the claim waits for a bind.
func claimPending(c *kaironv1.MachineClaim) bool {
	return c.Status.Phase == "" || c.Status.Phase == kaironv1.ClaimPending
}
