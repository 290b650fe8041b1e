package controller

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules/rulestest"
)

// staleMachines is a client whose Machine lists stay as they were when it
// was frozen, like an informer cache that has not seen the latest writes.
type staleMachines struct {
	client.Client
	frozen *kaironv1.MachineList
}

func (c *staleMachines) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	if machines, ok := list.(*kaironv1.MachineList); ok && c.frozen != nil {
		c.frozen.DeepCopyInto(machines)
		return nil
	}
	return c.Client.List(ctx, list, opts...)
}

func (c *staleMachines) freeze(t *testing.T) {
	t.Helper()
	var list kaironv1.MachineList
	if err := c.Client.List(context.Background(), &list); err != nil {
		t.Fatal(err)
	}
	c.frozen = &list
}

// A pass that runs before the cache has seen the previous pass's binds must
// not fill the same room twice.
func TestSchedulerAssumesItsBindingsUntilTheCacheCatchesUp(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := kaironv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	node := rulestest.Node("node-1", 1, "1Gi") // room for one Machine
	first := rulestest.Machine("first", 1, "256Mi")
	first.CreationTimestamp.Time = time.Unix(1, 0)
	second := rulestest.Machine("second", 1, "256Mi")
	second.CreationTimestamp.Time = time.Unix(2, 0)
	api := fake.NewClientBuilder().WithScheme(scheme).WithIndex(&corev1.Pod{}, podNodeNameIndex, podNodeName).
		WithObjects(node, first).
		WithStatusSubresource(&kaironv1.Machine{}).
		Build()
	cache := &staleMachines{Client: api}
	r := &SchedulerReconciler{
		Client:    cache,
		APIReader: api,
		Recorder:  events.NewFakeRecorder(100),
		Interval:  time.Minute,
		assumed:   newAssumedBindings(),
	}
	ctx := context.Background()

	if _, err := r.Reconcile(ctx, schedulingPassKey); err != nil {
		t.Fatalf("first pass: %v", err)
	}
	// The second Machine arrives; the cache shows it, but still shows the
	// first one unplaced.
	cache.freeze(t)
	frozenFirst := cache.frozen.Items[0].DeepCopy()
	frozenFirst.Spec.NodeName = ""
	frozenFirst.ResourceVersion = "1"
	cache.frozen.Items[0] = *frozenFirst
	if err := api.Create(ctx, second); err != nil {
		t.Fatal(err)
	}
	cache.frozen.Items = append(cache.frozen.Items, *second.DeepCopy())

	if _, err := r.Reconcile(ctx, schedulingPassKey); err != nil && !apierrors.IsConflict(err) {
		t.Fatalf("second pass: %v", err)
	}
	var got kaironv1.Machine
	if err := api.Get(ctx, client.ObjectKeyFromObject(second), &got); err != nil {
		t.Fatal(err)
	}
	if got.Spec.NodeName != "" {
		t.Fatalf("second Machine bound to %s, overcommitting it", got.Spec.NodeName)
	}
	if wantWhy := "0/1 nodes are available: 1 node has insufficient cpu (free 0, need 1)"; got.Status.Message != wantWhy {
		t.Errorf("second Machine's message %q", got.Status.Message)
	}
	if err := api.Get(ctx, client.ObjectKeyFromObject(first), &got); err != nil {
		t.Fatal(err)
	}
	// Placed; its status is its node agent's to write (or the scheduler's
	// once the cache shows it placed and unmarked).
	if got.Spec.NodeName != node.Name {
		t.Errorf("first Machine: %s", describeMachine(&got))
	}
}

// Within a quota, a pass admits the waiting Machines oldest first: by
// creationTimestamp, then, within its second, by name.
func TestSchedulerAdmitsOldestFirst(t *testing.T) {
	base := time.Unix(1_700_000_000, 0)
	const node = "node-1"
	bound := "Bound to node " + node
	full := func(used, hard int) string {
		return fmt.Sprintf(`exceeds MachineQuota "team": machines %d/%d used`, used, hard)
	}
	tests := []struct {
		name string
		// when z and a were created, after base
		zAt, aAt time.Duration
		quota    int32
		// the Scheduled condition's reason and message each Machine ends with
		want       map[string][2]string
		wantEvents []string
	}{
		{
			name: "z a second older: age before name",
			aAt:  time.Second, quota: 1,
			want: map[string][2]string{
				"z": {kaironv1.MachineReasonScheduled, bound},
				"a": {kaironv1.MachineReasonQuotaExceeded, full(1, 1)},
			},
			wantEvents: []string{
				corev1.EventTypeNormal + " " + kaironv1.MachineReasonScheduled + " " + bound,
				corev1.EventTypeWarning + " " + kaironv1.EventReasonFailedScheduling + " " + full(1, 1),
			},
		},
		{
			name: "same second: the name decides",
			zAt:  300 * time.Millisecond, aAt: 700 * time.Millisecond, quota: 1,
			want: map[string][2]string{
				"a": {kaironv1.MachineReasonScheduled, bound},
				"z": {kaironv1.MachineReasonQuotaExceeded, full(1, 1)},
			},
			wantEvents: []string{
				corev1.EventTypeNormal + " " + kaironv1.MachineReasonScheduled + " " + bound,
				corev1.EventTypeWarning + " " + kaironv1.EventReasonFailedScheduling + " " + full(1, 1),
			},
		},
		{
			name: "room for both",
			aAt:  time.Second, quota: 2,
			want: map[string][2]string{
				"z": {kaironv1.MachineReasonScheduled, bound},
				"a": {kaironv1.MachineReasonScheduled, bound},
			},
			wantEvents: []string{
				corev1.EventTypeNormal + " " + kaironv1.MachineReasonScheduled + " " + bound,
				corev1.EventTypeNormal + " " + kaironv1.MachineReasonScheduled + " " + bound,
			},
		},
		{
			name: "room for none",
			aAt:  time.Second, quota: 0,
			want: map[string][2]string{
				"z": {kaironv1.MachineReasonQuotaExceeded, full(0, 0)},
				"a": {kaironv1.MachineReasonQuotaExceeded, full(0, 0)},
			},
			wantEvents: []string{
				corev1.EventTypeWarning + " " + kaironv1.EventReasonFailedScheduling + " " + full(0, 0),
				corev1.EventTypeWarning + " " + kaironv1.EventReasonFailedScheduling + " " + full(0, 0),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			at := func(d time.Duration) func(*kaironv1.Machine) {
				// creationTimestamp as the API server stores it: whole seconds.
				return func(m *kaironv1.Machine) { m.CreationTimestamp = metav1.NewTime(base.Add(d).Truncate(time.Second)) }
			}
			quota := &kaironv1.MachineQuota{
				ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "team"},
				Spec:       kaironv1.MachineQuotaSpec{Hard: kaironv1.MachineResources{Machines: ptr.To(tt.quota)}},
			}
			api := fake.NewClientBuilder().WithScheme(testScheme(t)).WithIndex(&corev1.Pod{}, podNodeNameIndex, podNodeName).
				WithObjects(rulestest.Node(node, 16, "16Gi"), quota,
					rulestest.Machine("z", 1, "256Mi", at(tt.zAt)), rulestest.Machine("a", 1, "256Mi", at(tt.aAt))).
				WithStatusSubresource(&kaironv1.Machine{}).
				Build()
			recorder := events.NewFakeRecorder(10)
			r := &SchedulerReconciler{Client: api, APIReader: api, Recorder: recorder, Interval: time.Minute, assumed: newAssumedBindings()}
			// The first pass places; with no node agent to record that,
			// the next records it (this reconciler has no pickup grace).
			for range 2 {
				if _, err := r.Reconcile(context.Background(), schedulingPassKey); err != nil {
					t.Fatal(err)
				}
			}
			for name, want := range tt.want {
				var m kaironv1.Machine
				if err := api.Get(context.Background(), client.ObjectKey{Namespace: "team", Name: name}, &m); err != nil {
					t.Fatal(err)
				}
				reason, message := want[0], want[1]
				c := meta.FindStatusCondition(m.Status.Conditions, kaironv1.ConditionScheduled.String())
				wantNode, wantPhase, wantStatus, wantMessage := node, kaironv1.MachineScheduled, metav1.ConditionTrue, ""
				if reason != kaironv1.MachineReasonScheduled {
					wantNode, wantPhase, wantStatus, wantMessage = "", kaironv1.MachinePending, metav1.ConditionFalse, message
				}
				if m.Spec.NodeName != wantNode || m.Status.Phase != wantPhase || m.Status.Message != wantMessage ||
					c == nil || c.Status != wantStatus || c.Reason != reason || c.Message != message {
					t.Errorf("machine %s: %s; want node %q, phase %s, Scheduled=%s/%s %q", name, describeMachine(&m), wantNode, wantPhase, wantStatus, reason, message)
				}
			}
			if got := recordedEvents(recorder); !slices.Equal(got, tt.wantEvents) {
				t.Errorf("events %q, want %q", got, tt.wantEvents)
			}
		})
	}
}
