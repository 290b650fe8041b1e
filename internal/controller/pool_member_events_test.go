package controller

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/util/workqueue"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// poolMember is the pool's own kind of member (newPoolMember), named name.
func poolMember(pool, name string) *kaironv1.Machine {
	m := newPoolMember(&kaironv1.MachinePool{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: pool}}, "hash")
	m.Name = name
	return m
}

// newRequestQueue is a controller's workqueue on clock: deferred requests
// become ready only when the test steps it.
func newRequestQueue(t *testing.T, clock *clocktesting.FakeClock) workqueue.TypedRateLimitingInterface[reconcile.Request] {
	q := workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[reconcile.Request](),
		workqueue.TypedRateLimitingQueueConfig[reconcile.Request]{Clock: clock})
	t.Cleanup(q.ShutDown)
	return q
}

// queued drains what q holds now, without waiting for deferred requests.
func queued(q workqueue.TypedRateLimitingInterface[reconcile.Request]) []string {
	var got []string
	for q.Len() > 0 {
		req, _ := q.Get()
		got = append(got, req.Name)
		q.Done(req)
	}
	return got
}

// A member's event wakes its pool at once, unless the pool's refill is
// held: then it waits, and many events make one request.
func TestHeldPoolsDeferMemberEvents(t *testing.T) {
	ctx := context.Background()
	clock := clocktesting.NewFakeClock(time.Now())
	h := newHeldPools()
	always := func(event.UpdateEvent) bool { return true }
	never := func(event.UpdateEvent) bool { return false }
	agents := types.NamespacedName{Namespace: "team", Name: "agents"}

	q := newRequestQueue(t, clock)
	h.memberEvents(always).Create(ctx, event.CreateEvent{Object: poolMember("agents", "m1")}, q)
	if got := queued(q); len(got) != 1 || got[0] != "agents" {
		t.Errorf("a member created in a pool not held: queued %v, want [agents] at once", got)
	}

	h.set(agents, true)
	for _, name := range []string{"m1", "m2", "m3"} {
		h.memberEvents(always).Update(ctx, event.UpdateEvent{ObjectOld: poolMember("agents", name), ObjectNew: poolMember("agents", name)}, q)
	}
	h.memberEvents(always).Delete(ctx, event.DeleteEvent{Object: poolMember("agents", "m4")}, q)
	if got := queued(q); len(got) != 0 {
		t.Errorf("members of a held pool changed: queued %v at once, want their requests deferred", got)
	}
	// The deferred requests arrive after the hold's recheck, as one.
	clock.Step(refillHoldRecheck)
	testenv.Eventually(t, time.Minute, "the held pool's deferred request", func() (bool, string) {
		return q.Len() > 0, "none queued"
	})
	if got := queued(q); len(got) != 1 || got[0] != "agents" {
		t.Errorf("four events of a held pool, %v later: queued %v, want [agents] once", refillHoldRecheck, got)
	}

	// A member moved from a held pool to one that is not: the other pool
	// is woken at once.
	h.memberEvents(always).Update(ctx, event.UpdateEvent{ObjectOld: poolMember("agents", "m5"), ObjectNew: poolMember("builders", "m5")}, q)
	if got := queued(q); len(got) != 1 || got[0] != "builders" {
		t.Errorf("a member moved from held agents to builders: queued %v, want [builders] at once", got)
	}
	h.memberEvents(never).Update(ctx, event.UpdateEvent{ObjectOld: poolMember("builders", "m6"), ObjectNew: poolMember("builders", "m6")}, q)
	if got := queued(q); len(got) != 0 {
		t.Errorf("an update the predicate drops: queued %v, want nothing", got)
	}

	h.set(agents, false)
	h.memberEvents(always).Create(ctx, event.CreateEvent{Object: poolMember("agents", "m7")}, q)
	if got := queued(q); len(got) != 1 || got[0] != "agents" {
		t.Errorf("the hold over: queued %v, want [agents] at once", got)
	}
}
