package controller

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/events"
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
	api := fake.NewClientBuilder().WithScheme(scheme).
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
	if got.Spec.NodeName != node.Name || got.Status.Phase != kaironv1.MachineScheduled {
		t.Errorf("first Machine: %s", describeMachine(&got))
	}
}
