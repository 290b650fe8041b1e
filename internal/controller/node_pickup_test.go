package controller

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/tools/events"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
	"github.com/zyvor/kairon/internal/rules/rulestest"
)

// A Machine the scheduler places is left to its node agent to mark
// Scheduled, in the agent's first status write: the scheduler writes no
// status of its own for it unless no agent has within nodePickupGrace.
func TestSchedulerLeavesTheScheduledMarkToTheNodeAgent(t *testing.T) {
	for _, agent := range []bool{true, false} {
		name := map[bool]string{true: "the agent marks it", false: "no agent: the scheduler marks it after the grace"}[agent]
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			statusWrites := 0
			api := fake.NewClientBuilder().WithScheme(testScheme(t)).WithIndex(&corev1.Pod{}, podNodeNameIndex, podNodeName).
				WithObjects(rulestest.Node("node-1", 4, "4Gi"), rulestest.Machine("m", 1, "256Mi")).
				WithStatusSubresource(&kaironv1.Machine{}).
				WithInterceptorFuncs(interceptor.Funcs{SubResourcePatch: func(ctx context.Context, c client.Client, sub string, o client.Object, p client.Patch, opts ...client.SubResourcePatchOption) error {
					statusWrites++
					return c.SubResource(sub).Patch(ctx, o, p, opts...)
				}}).
				Build()
			clock := newTestClock(time.Unix(1_700_000_000, 0))
			pickups := newNodePickups()
			pickups.now = clock.Now
			r := &SchedulerReconciler{Client: api, APIReader: api, Recorder: events.NewFakeRecorder(10),
				Interval: time.Minute, assumed: newAssumedBindings(), pickups: pickups}
			get := func() *kaironv1.Machine {
				var m kaironv1.Machine
				if err := api.Get(ctx, client.ObjectKey{Namespace: "team", Name: "m"}, &m); err != nil {
					t.Fatal(err)
				}
				return &m
			}
			pass := func() time.Duration {
				res, err := r.Reconcile(ctx, schedulingPassKey)
				if err != nil {
					t.Fatal(err)
				}
				return res.RequeueAfter
			}

			pass()
			if m := get(); m.Spec.NodeName != "node-1" || statusWrites != 0 {
				t.Fatalf("after the placing pass: %s, %d status writes; want placed and no status write", describeMachine(m), statusWrites)
			}
			clock.Step(time.Second)
			if next := pass(); next <= 0 || next > nodePickupGrace-time.Second {
				t.Errorf("within the grace, the pass asks to run again in %s, want by the grace's end (%s)", next, nodePickupGrace-time.Second)
			}
			if statusWrites != 0 {
				t.Fatalf("within the grace the scheduler wrote the status %d times", statusWrites)
			}
			if agent {
				m := get()
				base := m.DeepCopy()
				rules.MarkScheduled(m)
				m.Status.Phase = kaironv1.MachineBooting
				if err := api.Status().Patch(ctx, m, client.MergeFrom(base)); err != nil {
					t.Fatal(err)
				}
				statusWrites = 0
			}
			clock.Step(nodePickupGrace)
			pass()
			m := get()
			c := meta.FindStatusCondition(m.Status.Conditions, kaironv1.ConditionScheduled.String())
			if c == nil || c.Status != "True" || c.Message != "Bound to node node-1" {
				t.Fatalf("after the grace: %s; want Scheduled True, bound to node-1", describeMachine(m))
			}
			wantWrites, wantPhase := 1, kaironv1.MachineScheduled
			if agent {
				wantWrites, wantPhase = 0, kaironv1.MachineBooting
			}
			if statusWrites != wantWrites || m.Status.Phase != wantPhase {
				t.Errorf("after the grace: phase %s, %d scheduler status writes; want %s and %d", m.Status.Phase, statusWrites, wantPhase, wantWrites)
			}
		})
	}
}
