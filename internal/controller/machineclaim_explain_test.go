package controller

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/testenv"
)

// A claim that no member can serve says why it waits while the pass is
// still busy with other binds, not once the pass ends: a pass fed by the
// refill's members one at a time lasts as long as the refill. Here the
// pool's only member is being taken for the oldest claim (its write held
// until the test lets it go); the next claim, waiting for an hour, is told
// it waits meanwhile. A claim that has not waited explainWaitingAfter yet
// (by the binder's clock, which the test holds still) is told only when
// the pass ends.
func TestWaitingClaimIsToldWhileThePassStillBinds(t *testing.T) {
	base := time.Now().Add(-time.Hour).Truncate(time.Second)
	pool := &kaironv1.MachinePool{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "agents", UID: "pool-uid"},
		Spec:       kaironv1.MachinePoolSpec{Replicas: ptr.To[int32](1), Template: poolTemplate()},
	}
	only := binderTestMember(pool, templateHash(&pool.Spec.Template), "only", base, kaironv1.MachineRunning)
	claim := func(name string, age time.Duration) *kaironv1.MachineClaim {
		return &kaironv1.MachineClaim{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name, UID: types.UID("uid-" + name), CreationTimestamp: metav1.NewTime(base.Add(age))},
			Spec:       kaironv1.MachineClaimSpec{PoolName: "agents"},
		}
	}
	release := make(chan struct{})
	released := false
	letGo := func() {
		if !released {
			released = true
			close(release)
		}
	}
	t.Cleanup(letGo)
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).
		WithObjects(pool, only, claim("first", time.Minute), claim("second", 2*time.Minute), claim("fresh", 2*time.Hour)).
		WithStatusSubresource(&kaironv1.MachineClaim{}, &kaironv1.MachinePool{}, &kaironv1.Machine{}).
		WithIndex(&kaironv1.MachineClaim{}, pendingClaimPoolIndex, pendingClaimPool).WithIndex(&kaironv1.Machine{}, poolMachineIndex, poolOfMember).WithIndex(&kaironv1.Machine{}, poolUnclaimedMachineIndex, poolOfUnclaimedMember).WithIndex(&kaironv1.Machine{}, claimedMachineIndex, claimOfClaimedMachine).
		WithInterceptorFuncs(interceptor.Funcs{Patch: func(ctx context.Context, cl client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if _, ok := obj.(*kaironv1.Machine); ok && obj.GetName() == "only" {
				<-release // the take of the only member, held
			}
			return cl.Patch(ctx, obj, patch, opts...)
		}}).
		Build()
	b := &MachineClaimBinder{Client: c, APIReader: c, Recorder: events.NewFakeRecorder(100), Interval: time.Minute,
		tracker: newBindTracker(), pendingRefreshed: map[types.NamespacedName]time.Time{}}
	b.tracker.now = newTestClock(base.Add(2*time.Hour + explainWaitingAfter/2)).Now

	ctx := context.Background()
	passDone := make(chan error, 1)
	go func() {
		_, err := b.Reconcile(ctx, reconcile.Request{NamespacedName: client.ObjectKeyFromObject(pool)})
		passDone <- err
	}()
	testenv.Eventually(t, 30*time.Second, "the second claim to be told it waits while the first one's bind runs", func() (bool, string) {
		var got kaironv1.MachineClaim
		if err := c.Get(ctx, client.ObjectKey{Namespace: "team", Name: "second"}, &got); err != nil {
			return false, err.Error()
		}
		return got.Status.Phase == kaironv1.ClaimPending && strings.HasPrefix(got.Status.Message, `no Running warm machine in pool "agents"`),
			fmt.Sprintf("%s %q", got.Status.Phase, got.Status.Message)
	})
	var fresh kaironv1.MachineClaim
	if err := c.Get(ctx, client.ObjectKey{Namespace: "team", Name: "fresh"}, &fresh); err != nil {
		t.Fatal(err)
	}
	if fresh.Status.Phase != "" {
		t.Errorf("a claim that had not waited %s was told during the pass: %s %q", explainWaitingAfter, fresh.Status.Phase, fresh.Status.Message)
	}
	select {
	case err := <-passDone:
		t.Fatalf("the pass ended (%v) before the first claim's bind was let go", err)
	default:
	}
	letGo()
	if err := <-passDone; err != nil {
		t.Fatal(err)
	}
	var first kaironv1.MachineClaim
	if err := c.Get(ctx, client.ObjectKey{Namespace: "team", Name: "first"}, &first); err != nil {
		t.Fatal(err)
	}
	if first.Status.Phase != kaironv1.ClaimBound || first.Status.MachineName != "only" {
		t.Errorf("first claim: %s %q bound to %q, want Bound to only", first.Status.Phase, first.Status.Message, first.Status.MachineName)
	}
	if err := c.Get(ctx, client.ObjectKey{Namespace: "team", Name: "fresh"}, &fresh); err != nil {
		t.Fatal(err)
	}
	if fresh.Status.Phase != kaironv1.ClaimPending {
		t.Errorf("once the pass ended, the fresh claim is %s %q, want Pending saying why", fresh.Status.Phase, fresh.Status.Message)
	}
}
