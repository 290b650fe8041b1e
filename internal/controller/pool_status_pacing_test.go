package controller

import (
	"context"
	"errors"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// A pool's status change is written poolStatusDelay after the reconcile
// that first saw it, with whatever changed meanwhile, and the reconcile
// asks to run again when it is due.
func TestPoolStatusIsWrittenAMomentAfterItChanges(t *testing.T) {
	f := newHoldFixture(t, 1, false)
	pacing := newStatusPacing()
	pacing.now = func() time.Time { return f.now }
	f.r.statusWrites = pacing
	key := types.NamespacedName{Namespace: "team", Name: "agents"}
	status := func() kaironv1.MachinePoolStatus {
		t.Helper()
		p := &kaironv1.MachinePool{}
		if err := f.c.Get(context.Background(), key, p); err != nil {
			t.Fatal(err)
		}
		return p.Status
	}

	// A new pool with its one member warm: counted, not yet written.
	if res := f.reconcilePool(); res.RequeueAfter <= 0 || res.RequeueAfter > poolStatusDelay {
		t.Errorf("requeue after %v, want within %v to write the status", res.RequeueAfter, poolStatusDelay)
	}
	if s := status(); s.Warm != 0 {
		t.Errorf("status written at once: %+v", s)
	}
	f.now = f.now.Add(poolStatusDelay / 2)
	if res := f.reconcilePool(); res.RequeueAfter <= 0 || res.RequeueAfter > poolStatusDelay/2 {
		t.Errorf("halfway: requeue after %v, want at most the %v left", res.RequeueAfter, poolStatusDelay/2)
	}
	if s := status(); s.Warm != 0 {
		t.Errorf("status written before it was due: %+v", s)
	}
	f.now = f.now.Add(poolStatusDelay / 2)
	f.reconcilePool()
	if s := status(); s.Warm != 1 || s.ReadyWarm != 1 || s.Claimed != 0 {
		t.Fatalf("due: status %+v, want 1 warm and ready, 0 claimed", s)
	}

	// The member is taken: the next change waits its turn too, and is
	// written whole.
	m := &kaironv1.Machine{}
	if err := f.c.Get(context.Background(), types.NamespacedName{Namespace: "team", Name: f.member.Name}, m); err != nil {
		t.Fatal(err)
	}
	m.Labels[kaironv1.LabelPoolState] = kaironv1.PoolStateClaimed
	m.Labels[kaironv1.LabelMachineClaim] = "job"
	if err := f.c.Update(context.Background(), m); err != nil {
		t.Fatal(err)
	}
	f.now = f.now.Add(time.Second)
	f.reconcilePool()
	if s := status(); s.Claimed != 0 {
		t.Errorf("the take written at once: %+v", s)
	}
	f.now = f.now.Add(poolStatusDelay)
	f.reconcilePool()
	if s := status(); s.Claimed != 1 {
		t.Errorf("due: status %+v, want 1 claimed", s)
	}
	// Nothing changed: nothing pending.
	f.reconcilePool()
	pacing.mu.Lock()
	pending := len(pacing.since)
	pacing.mu.Unlock()
	if pending != 0 {
		t.Errorf("%d pools with a status change pending after it was written", pending)
	}
}

// A pass that fails (here: its refill cannot create Machines) writes its
// status at once. Its next pass comes on the error backoff's schedule, so
// a status left pending would wait for that, however long.
func TestPoolStatusOfAFailingPassIsWrittenAtOnce(t *testing.T) {
	f := newHoldFixture(t, 2, true)
	pacing := newStatusPacing()
	pacing.now = func() time.Time { return f.now }
	f.r.statusWrites = pacing
	ctx := context.Background()
	if err := f.c.Delete(ctx, f.claim); err != nil {
		t.Fatal(err)
	}
	f.r.Client = interceptor.NewClient(f.c.(client.WithWatch), interceptor.Funcs{
		Create: func(ctx context.Context, c client.WithWatch, obj client.Object, opts ...client.CreateOption) error {
			if _, ok := obj.(*kaironv1.Machine); ok {
				return errors.New("the API server is away")
			}
			return c.Create(ctx, obj, opts...)
		},
	})

	_, err := f.r.Reconcile(ctx, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "team", Name: "agents"}})
	if err == nil {
		t.Fatal("the refill's creates failed, yet the pass did not")
	}
	p := &kaironv1.MachinePool{}
	if err := f.c.Get(ctx, types.NamespacedName{Namespace: "team", Name: "agents"}, p); err != nil {
		t.Fatal(err)
	}
	if p.Status.Claimed != 1 || p.Status.ObservedGeneration != p.Generation {
		t.Errorf("status after the failing pass: %+v, want it written (1 claimed, generation %d observed)", p.Status, p.Generation)
	}
}
