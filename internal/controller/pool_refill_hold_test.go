package controller

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

func TestRefillHold(t *testing.T) {
	now := time.Unix(1000, 0)
	h := newRefillHolds()
	h.now = func() time.Time { return now }
	steps := []struct {
		name                    string
		after                   time.Duration
		waiting, binding, ready int
		want                    bool
	}{
		{"no claim: refill", 0, 0, 0, 3, false},
		{"claims the ready members can serve: held", 0, 2, 0, 3, true},
		{"still, a moment later", maxRefillHold / 2, 3, 0, 3, true},
		{"more claims than ready members: refill at once", 0, 4, 0, 3, false},
		{"served again: a new hold", 0, 1, 0, 3, true},
		{"held for as long as a hold lasts: refill", maxRefillHold, 1, 0, 3, false},
		{"and it stays so while claims wait", time.Second, 1, 0, 3, false},
		{"none waits: the hold is reset", 0, 0, 0, 3, false},
		{"the next burst is held again", 0, 2, 0, 2, true},
		{"its members taken, its binds being recorded: still held", 0, 0, 2, 0, true},
		{"all Bound: refill", 0, 0, 0, 0, false},
		{"a bind being recorded, the pool empty: held", 0, 0, 1, 0, true},
		{"a claim no ready member serves: refill at once", 0, 1, 1, 0, false},
	}
	for _, s := range steps {
		now = now.Add(s.after)
		if got := h.hold("pool", s.waiting, s.binding, s.ready); got != s.want {
			t.Errorf("%s: hold(%d waiting, %d binding, %d ready) = %v, want %v", s.name, s.waiting, s.binding, s.ready, got, s.want)
		}
	}
}

// holdFixture is a pool "agents" of replicas in namespace team, with one
// Running member and a claim "job" on it, for the pool reconciler alone
// against a fake client.
type holdFixture struct {
	t      *testing.T
	c      client.Client
	r      *MachinePoolReconciler
	now    time.Time
	member *kaironv1.Machine
	claim  *kaironv1.MachineClaim
}

func newHoldFixture(t *testing.T, replicas int32, memberTaken bool) *holdFixture {
	pool := &kaironv1.MachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "agents", UID: "pool-uid"},
		Spec:       kaironv1.MachinePoolSpec{Replicas: ptr.To(replicas), Template: poolTemplate()},
	}
	f := &holdFixture{t: t, now: time.Now()}
	f.member = newPoolMember(pool, templateHash(&pool.Spec.Template))
	f.member.Name, f.member.UID = "agents-1", "uid-1"
	f.member.Status.Phase = kaironv1.MachineRunning
	if memberTaken {
		f.member.Labels[kaironv1.LabelPoolState] = kaironv1.PoolStateClaimed
		f.member.Labels[kaironv1.LabelMachineClaim] = "job"
	}
	f.claim = &kaironv1.MachineClaim{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "job", UID: "claim-uid"},
		Spec:       kaironv1.MachineClaimSpec{PoolName: "agents"},
	}
	f.c = fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(pool, f.member, f.claim).
		WithStatusSubresource(&kaironv1.MachineClaim{}, &kaironv1.MachinePool{}, &kaironv1.Machine{}).
		WithIndex(&kaironv1.MachineClaim{}, pendingClaimPoolIndex, pendingClaimPool).WithIndex(&kaironv1.Machine{}, poolMachineIndex, poolOfMember).WithIndex(&kaironv1.Machine{}, poolUnclaimedMachineIndex, poolOfUnclaimedMember).WithIndex(&kaironv1.Machine{}, claimedMachineIndex, claimOfClaimedMachine).Build()
	holds := newRefillHolds()
	holds.now = func() time.Time { return f.now }
	f.r = &MachinePoolReconciler{Client: f.c, Recorder: events.NewFakeRecorder(20), Interval: time.Minute,
		expectations: newReplicaExpectations(), failures: newFailureBackoff(), refills: holds}
	return f
}

// machines counts the namespace's Machines.
func (f *holdFixture) machines() int {
	var ms kaironv1.MachineList
	if err := f.c.List(context.Background(), &ms, client.InNamespace("team")); err != nil {
		f.t.Fatal(err)
	}
	return len(ms.Items)
}

func (f *holdFixture) reconcilePool() reconcile.Result {
	res, err := f.r.Reconcile(context.Background(), reconcile.Request{NamespacedName: types.NamespacedName{Namespace: "team", Name: "agents"}})
	if err != nil {
		f.t.Fatal(err)
	}
	return res
}

// A pool whose waiting claim a ready member can serve holds its refill
// (the bind goes first) and looks again shortly; once the hold has lasted
// maxRefillHold it refills all the same.
func TestPoolHoldsItsRefillForWaitingClaims(t *testing.T) {
	f := newHoldFixture(t, 2, false)
	c, ctx := f.c, context.Background()
	reconcilePool, members := f.reconcilePool, f.machines

	if res := reconcilePool(); members() != 1 || res.RequeueAfter != refillHoldRecheck {
		t.Errorf("a claim waiting for the one ready member: %d members, requeue after %v; want the refill held (1 member) and a look again after %v",
			members(), res.RequeueAfter, refillHoldRecheck)
	}
	f.now = f.now.Add(maxRefillHold)
	if reconcilePool(); members() != 2 {
		t.Errorf("held for %v: %d members, want the refill made (2)", maxRefillHold, members())
	}

	// A claim refused for its labels does not wait for a member: nothing
	// is held for it.
	fresh := &kaironv1.MachinePool{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "team", Name: "agents"}, fresh); err != nil {
		t.Fatal(err)
	}
	fresh.Spec.Replicas = ptr.To[int32](3)
	if err := c.Update(ctx, fresh); err != nil {
		t.Fatal(err)
	}
	claim := &kaironv1.MachineClaim{}
	if err := c.Get(ctx, types.NamespacedName{Namespace: "team", Name: "job"}, claim); err != nil {
		t.Fatal(err)
	}
	claim.Status.Phase = kaironv1.ClaimPending
	meta.SetStatusCondition(&claim.Status.Conditions, metav1.Condition{Type: kaironv1.ConditionReady.String(), Status: metav1.ConditionFalse,
		Reason: kaironv1.ClaimReasonInvalidLabels, Message: "refused"})
	if err := c.Status().Update(ctx, claim); err != nil {
		t.Fatal(err)
	}
	f.r.refills.forget(fresh.UID)
	if reconcilePool(); members() != 3 {
		t.Errorf("only a refused claim waits: %d members, want the refill made at once (3)", members())
	}
}

// A claim whose member is taken but whose bind is not yet recorded still
// holds the refill, even though no ready member is left: the replacement
// would compete with the bind's last write. Once the claim is Bound, the
// pool refills.
func TestPoolHoldsItsRefillWhileABindIsRecorded(t *testing.T) {
	f := newHoldFixture(t, 1, true)
	c, ctx, claim, taken := f.c, context.Background(), f.claim, f.member
	reconcilePool, members := f.reconcilePool, f.machines

	pool := types.NamespacedName{Namespace: "team", Name: "agents"}
	if res := reconcilePool(); members() != 1 || res.RequeueAfter != refillHoldRecheck {
		t.Errorf("the only member taken by a claim not yet Bound: %d Machines, requeue after %v; want the refill held (1) and a look again after %v",
			members(), res.RequeueAfter, refillHoldRecheck)
	}
	if !f.r.heldPools().isHeld(pool) {
		t.Error("the refill held, but the pool is not marked held: its members' events would wake it at once")
	}
	claim.Status.Phase = kaironv1.ClaimBound
	claim.Status.MachineName = taken.Name
	if err := c.Status().Update(ctx, claim); err != nil {
		t.Fatal(err)
	}
	if reconcilePool(); members() != 2 {
		t.Errorf("the claim Bound: %d Machines, want the replacement made (2)", members())
	}
	if f.r.heldPools().isHeld(pool) {
		t.Error("the pool refilled, but it is still marked held: its members' events would wait")
	}
}
