package controller

import (
	"context"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// A bind waiting for its policy's report is woken by the watch's new
// version of the policy, not by polling: with the safety-net recheck
// pushed out of reach, the wait still ends as soon as the report lands.
func TestWaitEgressEnforcedWakesOnThePolicysNewVersion(t *testing.T) {
	oldRecheck := egressEnforceRecheck.Swap(int64(time.Hour))
	oldTimeout := egressEnforceTimeout.Swap(int64(30 * time.Second))
	t.Cleanup(func() { egressEnforceRecheck.Store(oldRecheck); egressEnforceTimeout.Store(oldTimeout) })

	policy := &kaironv1.MachineNetworkPolicy{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "claim-egress-job", Generation: 1},
		Spec:       kaironv1.MachineNetworkPolicySpec{MachineName: "vm"},
	}
	machine := &kaironv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "vm"},
		Spec:       kaironv1.MachineSpec{NodeName: "n1", CPU: 1, Memory: resource.MustParse("64Mi")},
	}
	c := fake.NewClientBuilder().WithScheme(testScheme(t)).WithObjects(policy).
		WithStatusSubresource(&kaironv1.MachineNetworkPolicy{}).Build()
	waiters := &policyWaiters{}

	type result struct {
		cond metav1.Condition
		err  error
	}
	done := make(chan result, 1)
	go func() {
		cond, err := waitEgressEnforced(context.Background(), c, waiters, "team", policy.Name, machine)
		done <- result{cond, err}
	}()

	// The bind has read the policy, found no report, and waits.
	for registered := false; !registered; {
		waiters.mu.Lock()
		registered = len(waiters.waiting[client.ObjectKeyFromObject(policy)]) > 0
		waiters.mu.Unlock()
		select {
		case r := <-done:
			t.Fatalf("the wait ended before any report: %+v, %v", r.cond, r.err)
		case <-time.After(time.Millisecond):
		}
	}
	// The node's report lands and the watch delivers it.
	var reported kaironv1.MachineNetworkPolicy
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(policy), &reported); err != nil {
		t.Fatal(err)
	}
	reported.Status.Nodes = []kaironv1.PolicyEnforcement{{Node: "n1", Machines: []string{"vm"}, ObservedGeneration: reported.Generation}}
	if err := c.Status().Update(context.Background(), &reported); err != nil {
		t.Fatal(err)
	}
	waiters.changed(&reported)
	if r := <-done; r.err != nil || r.cond.Status != metav1.ConditionTrue {
		t.Fatalf("wait ended with %+v, %v; want EgressEnforced True", r.cond, r.err)
	}
}

func TestPolicyWaitersCancel(t *testing.T) {
	w := &policyWaiters{}
	p := &kaironv1.MachineNetworkPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "p"}}
	ch, cancel := w.wait(client.ObjectKeyFromObject(p))
	cancel()
	if len(w.waiting) != 0 {
		t.Errorf("a cancelled waiter is still registered: %v", w.waiting)
	}
	w.changed(p) // nothing to wake, and no panic
	select {
	case <-ch:
		t.Error("a cancelled waiter was woken")
	default:
	}
	ch2, cancel2 := w.wait(client.ObjectKeyFromObject(p))
	w.changed(p)
	select {
	case <-ch2:
	default:
		t.Error("a waiter was not woken by its policy's change")
	}
	cancel2() // after the wake: harmless
}
