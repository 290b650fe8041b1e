package node

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/backend/sim"
	"github.com/zyvor/kairon/internal/testenv"
)

func TestOwnWritesLatest(t *testing.T) {
	machine := func(uid types.UID, rv string, phase kaironv1.MachinePhase) *kaironv1.Machine {
		return &kaironv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm", UID: uid, ResourceVersion: rv},
			Status:     kaironv1.MachineStatus{Phase: phase},
		}
	}
	cases := []struct {
		name      string
		replaced  string
		written   *kaironv1.Machine
		cached    *kaironv1.Machine
		wantRV    string
		remembers int // entries left after the read
	}{
		{"cache still before the write", "10", machine("u1", "11", kaironv1.MachineBooting), machine("u1", "10", kaironv1.MachineScheduled), "11", 1},
		{"cache shows the write", "10", machine("u1", "11", kaironv1.MachineBooting), machine("u1", "11", kaironv1.MachineBooting), "11", 0},
		{"cache shows a later write", "10", machine("u1", "11", kaironv1.MachineBooting), machine("u1", "12", kaironv1.MachineRunning), "12", 0},
		{"another Machine under the name", "10", machine("u1", "11", kaironv1.MachineBooting), machine("u2", "10", kaironv1.MachinePending), "10", 0},
		{"no write was made", "10", machine("u1", "10", kaironv1.MachineBooting), machine("u1", "10", kaironv1.MachineBooting), "10", 0},
		{"nothing to go by", "", machine("u1", "11", kaironv1.MachineBooting), machine("u1", "10", kaironv1.MachineBooting), "10", 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var w ownWrites
			w.wrote(tc.replaced, tc.written)
			got := w.latest(tc.cached)
			if got.ResourceVersion != tc.wantRV || got.UID != tc.cached.UID {
				t.Errorf("latest = %s/%s, want resourceVersion %s of %s", got.UID, got.ResourceVersion, tc.wantRV, tc.cached.UID)
			}
			if w.len() != tc.remembers {
				t.Errorf("%d writes remembered after the read, want %d", w.len(), tc.remembers)
			}
			if got != tc.cached {
				got.Status.Phase = "Changed" // a copy: the remembered write must not change with it
				if again := w.latest(tc.cached); again.Status.Phase == "Changed" {
					t.Error("latest returned the remembered object itself, not a copy")
				}
			}
		})
	}
	var w ownWrites
	w.wrote("10", machine("u1", "11", kaironv1.MachineBooting))
	w.forget(types.NamespacedName{Namespace: "ns", Name: "vm"})
	if w.len() != 0 {
		t.Error("forget left the write remembered")
	}
}

// laggingReader serves Gets of the Machine in frozen from that copy, as an
// informer cache behind its watch does; everything else, writes included,
// goes to the client underneath.
type laggingReader struct {
	client.Client
	frozen *kaironv1.Machine
}

func (l *laggingReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if m, ok := obj.(*kaironv1.Machine); ok && l.frozen != nil && key == client.ObjectKeyFromObject(l.frozen) {
		l.frozen.DeepCopyInto(m)
		return nil
	}
	return l.Client.Get(ctx, key, obj, opts...)
}

// The VM comes up a moment after the agent wrote Booting, and the cache
// may not show that write yet. The agent's Running write must start from
// its own Booting write, not from the version before it: a write from that
// version is refused (Conflict) and the Machine waits for a retry.
func TestAgentReadsItsOwnStatusWrite(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := kaironv1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	machine := &kaironv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "vm", UID: "uid-1", Finalizers: []string{kaironv1.FinalizerMachineVM}},
		Spec:       kaironv1.MachineSpec{NodeName: "n1", CPU: 1, Memory: resource.MustParse("256Mi")},
	}
	api := fake.NewClientBuilder().WithScheme(scheme).WithObjects(machine).WithStatusSubresource(&kaironv1.Machine{}).Build()
	cache := &laggingReader{Client: api}
	state := t.TempDir()
	be, err := sim.New(sim.Options{StateDir: filepath.Join(state, "vms"), BootDelay: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	a := &Agent{client: cache, recorder: events.NewFakeRecorder(100),
		opts: Options{StateDir: state, NodeName: "n1", Backend: be, BootTimeout: time.Minute, Interval: time.Minute}}
	ctx := context.Background()
	req := ctrl.Request{NamespacedName: client.ObjectKeyFromObject(machine)}
	live := func() *kaironv1.Machine {
		t.Helper()
		var m kaironv1.Machine
		if err := api.Get(ctx, req.NamespacedName, &m); err != nil {
			t.Fatal(err)
		}
		return &m
	}

	cache.frozen = live() // the cache will not see the Booting write
	if _, err := a.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if got := live(); got.Status.Phase != kaironv1.MachineBooting {
		t.Fatalf("after the first reconcile the Machine is %q, want Booting", got.Status.Phase)
	}
	testenv.Eventually(t, time.Minute, "the VM to come up", func() (bool, string) {
		inst, err := be.Get(ctx, instanceID("ns", "vm"))
		return err == nil && inst.Phase == backend.Running, string(inst.Phase)
	})

	result, err := a.Reconcile(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if got := live(); got.Status.Phase != kaironv1.MachineRunning {
		t.Errorf("with the cache behind the agent's Booting write, the Machine is %q after the VM came up (requeue in %s), want Running",
			got.Status.Phase, result.RequeueAfter)
	}

	// Once the cache shows the agent's writes, it is read as it is again.
	cache.frozen = nil
	if _, err := a.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if n := a.ownWrites.len(); n != 0 {
		t.Errorf("%d writes still remembered once the cache caught up", n)
	}
	_ = be.Stop(ctx, instanceID("ns", "vm"))
}
