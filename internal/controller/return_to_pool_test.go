package controller

import (
	"context"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// A Machine the claim is Bound to is never handed back to its pool, even by
// a caller that took it for a stray: the claim reconciler may have recorded
// the bind (a status write that looked lost) while the binder was undoing
// it, and handing it back let another claim take it (a double bind seen
// under contention).
func TestReturnToPoolKeepsTheMachineTheClaimIsBoundTo(t *testing.T) {
	env := testenv.Get(t)
	ns := env.Namespace(t)
	ctx := context.Background()
	pool := createPool(t, env, ns, "agents", 0)
	claim := createClaim(t, env, ns, "job", "agents")
	bound, stray := createHeldMachine(t, env, ns, "bound", "agents", "job"), createHeldMachine(t, env, ns, "stray", "agents", "job")
	claim.Status = kaironv1.MachineClaimStatus{Phase: kaironv1.ClaimBound, MachineName: bound.Name}
	if err := env.Client.Status().Update(ctx, claim); err != nil {
		t.Fatal(err)
	}
	recorder := events.NewFakeRecorder(10)
	for _, m := range []*kaironv1.Machine{bound, stray} {
		if err := returnToPool(ctx, env.Client, env.Client, recorder, pool, claim, m.Name); err != nil {
			t.Fatalf("returning %s: %v", m.Name, err)
		}
	}
	state := func(m *kaironv1.Machine) string {
		got := &kaironv1.Machine{}
		if err := env.Client.Get(ctx, client.ObjectKeyFromObject(m), got); err != nil {
			t.Fatal(err)
		}
		return got.Labels[kaironv1.LabelPoolState] + "/" + got.Labels[kaironv1.LabelMachineClaim]
	}
	if got := state(bound); got != kaironv1.PoolStateClaimed+"/job" {
		t.Errorf("the Machine the claim is Bound to: %s, want it kept claimed by job", got)
	}
	if got := state(stray); got != kaironv1.PoolStateWarm+"/" {
		t.Errorf("the stray: %s, want it back to warm", got)
	}

	// Nor while the claim is being deleted: its user had the Machine, and
	// the release deletes or retains it, never hands it back warm.
	claim.Finalizers = []string{"kairon.zyvor.dev/test-hold"}
	if err := env.Client.Update(ctx, claim); err != nil {
		t.Fatal(err)
	}
	if err := env.Client.Delete(ctx, claim); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		live := &kaironv1.MachineClaim{}
		if env.Client.Get(context.Background(), client.ObjectKeyFromObject(claim), live) == nil {
			live.Finalizers = nil
			if err := env.Client.Update(context.Background(), live); err != nil {
				t.Errorf("releasing the test's finalizer: %v", err)
			}
		}
	})
	if err := returnToPool(ctx, env.Client, env.Client, recorder, pool, claim, bound.Name); err != nil {
		t.Fatalf("returning %s: %v", bound.Name, err)
	}
	if got := state(bound); got != kaironv1.PoolStateClaimed+"/job" {
		t.Errorf("the Machine a claim being deleted is Bound to: %s, want it kept claimed by job", got)
	}
}

// createHeldMachine creates a Machine of pool labelled as claimed by claim,
// as a binder's take leaves it.
func createHeldMachine(t *testing.T, env *testenv.Env, ns, name, pool, claim string) *kaironv1.Machine {
	t.Helper()
	return createMachine(t, env, ns, name, 1, "64Mi", func(m *kaironv1.Machine) {
		m.Labels = map[string]string{kaironv1.LabelMachinePool: pool, kaironv1.LabelMachineClaim: claim, kaironv1.LabelPoolState: kaironv1.PoolStateClaimed}
	})
}

// recordingBindFixture is a Pending claim "job" with a Machine labelled for
// it whose bind nobody recorded, and a claim reconciler ready to record it
// (its adoptGrace already over).
type recordingBindFixture struct {
	env     *testenv.Env
	pool    *kaironv1.MachinePool
	claim   *kaironv1.MachineClaim
	machine *kaironv1.Machine
	r       *MachineClaimReconciler
}

func newRecordingBindFixture(t *testing.T) *recordingBindFixture {
	t.Helper()
	env := testenv.Get(t)
	ns := env.Namespace(t)
	f := &recordingBindFixture{env: env, pool: createPool(t, env, ns, "agents", 0)}
	f.claim = createClaim(t, env, ns, "job", "agents")
	f.machine = createHeldMachine(t, env, ns, "m", "agents", "job")
	clock := newTestClock(time.Now())
	tracker := newBindTracker()
	tracker.now = clock.Now
	tracker.orphanSince(f.claim.UID)
	clock.Step(adoptGrace + time.Second)
	f.r = &MachineClaimReconciler{Client: env.Client, APIReader: env.Client, Recorder: events.NewFakeRecorder(10), tracker: tracker}
	return f
}

// onFirstMachinePatch runs before, once, ahead of the first Machine patch
// sent through the returned client.
func onFirstMachinePatch(t *testing.T, env *testenv.Env, before func()) client.Client {
	var once sync.Once
	return interceptor.NewClient(directClient(t, env), interceptor.Funcs{
		Patch: func(ctx context.Context, c client.WithWatch, obj client.Object, p client.Patch, opts ...client.PatchOption) error {
			if _, ok := obj.(*kaironv1.Machine); ok {
				once.Do(before)
			}
			return c.Patch(ctx, obj, p, opts...)
		},
	})
}

// outcome is the Machine's pool state and claim label, and the Machine the
// claim's status names.
func (f *recordingBindFixture) outcome(t *testing.T) (machine, claimStatus string) {
	t.Helper()
	ctx := context.Background()
	m := &kaironv1.Machine{}
	if err := f.env.Client.Get(ctx, client.ObjectKeyFromObject(f.machine), m); err != nil {
		t.Fatal(err)
	}
	c := &kaironv1.MachineClaim{}
	if err := f.env.Client.Get(ctx, client.ObjectKeyFromObject(f.claim), c); err != nil {
		t.Fatal(err)
	}
	return m.Labels[kaironv1.LabelPoolState] + "/" + m.Labels[kaironv1.LabelMachineClaim], string(c.Status.Phase) + "/" + c.Status.MachineName
}

// The claim reconciler records a bind while a binder hands the same Machine
// back, the recording landing between the hand-back's read of the claim
// (still Pending) and its patch of the Machine. The hand-back must not
// then return a Machine the claim is now Bound to (it would go to a second
// claim: the double bind once seen under contention).
func TestAHandBackLosesToABindRecordedMeanwhile(t *testing.T) {
	f := newRecordingBindFixture(t)
	ctx := context.Background()
	var recordErr error
	handingBack := onFirstMachinePatch(t, f.env, func() {
		_, recordErr = f.r.reconcilePending(ctx, f.claim.DeepCopy(), []*kaironv1.Machine{f.machine.DeepCopy()})
	})
	if err := returnToPool(ctx, handingBack, handingBack, events.NewFakeRecorder(10), f.pool, f.claim, f.machine.Name); err != nil {
		t.Fatalf("returnToPool: %v", err)
	}
	if recordErr != nil {
		t.Fatalf("recording the bind: %v", recordErr)
	}
	machine, claim := f.outcome(t)
	if machine != kaironv1.PoolStateClaimed+"/job" || claim != string(kaironv1.ClaimBound)+"/m" {
		t.Errorf("machine %s, claim %s: want the machine kept claimed by job and the claim Bound to it", machine, claim)
	}
}

// The other order: the hand-back lands between the claim reconciler's read
// of the Machine (still labelled for the claim) and its recording. The
// claim must then stay Pending rather than name a Machine back in the pool.
func TestABindIsNotRecordedOnAMachineHandedBackMeanwhile(t *testing.T) {
	f := newRecordingBindFixture(t)
	ctx := context.Background()
	var handBackErr error
	f.r.Client = onFirstMachinePatch(t, f.env, func() {
		handBackErr = returnToPool(ctx, f.env.Client, f.env.Client, events.NewFakeRecorder(10), f.pool, f.claim, f.machine.Name)
	})
	_, err := f.r.reconcilePending(ctx, f.claim.DeepCopy(), []*kaironv1.Machine{f.machine.DeepCopy()})
	if handBackErr != nil {
		t.Fatalf("returnToPool: %v", handBackErr)
	}
	if !apierrors.IsConflict(err) {
		t.Errorf("recording the bind: %v, want a Conflict", err)
	}
	machine, claim := f.outcome(t)
	if machine != kaironv1.PoolStateWarm+"/" || claim != "/" {
		t.Errorf("machine %s, claim %s: want the machine back in the pool and the claim not bound", machine, claim)
	}
}
