package node

import (
	"context"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/events"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/backend"
	"github.com/zyvor/kairon/internal/backend/sim"
	"github.com/zyvor/kairon/internal/testenv"
)

// A template Machine's save is reported in its status, and the agent's
// cache shows that write only a moment later. A reconcile of the Machine as
// the cache still had it (Running, no status.snapshot) must not boot the
// saved template again: the agent remembers its own save.
func TestSavedTemplateStaysStoppedWhileTheCacheIsBehind(t *testing.T) {
	state := t.TempDir()
	be, err := sim.New(sim.Options{StateDir: filepath.Join(state, "vms"), BootDelay: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	a := &Agent{opts: Options{StateDir: state, NodeName: "n1", Backend: be, BootTimeout: time.Minute, Interval: time.Second}, recorder: events.NewFakeRecorder(100)}
	ctx := context.Background()
	machine := &kaironv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "tmpl", UID: "uid-1", Annotations: map[string]string{kaironv1.AnnotationSnapshotSave: "true"}},
		Spec:       kaironv1.MachineSpec{NodeName: "n1", CPU: 1, Memory: resource.MustParse("256Mi")},
	}
	id := instanceID(machine.Namespace, machine.Name)
	reconcile := func(m *kaironv1.Machine) {
		t.Helper()
		if _, err := a.reconcileVM(ctx, m, id); err != nil {
			t.Fatal(err)
		}
	}

	stale := machine.DeepCopy() // what the cache holds until the writes show
	testenv.Eventually(t, time.Minute, "the template to boot, be saved and stop", func() (bool, string) {
		reconcile(machine)
		return machine.Status.Phase == kaironv1.MachineStopped && machine.Status.Snapshot != nil, fmt.Sprintf("%s %q", machine.Status.Phase, machine.Status.Message)
	})

	reconcile(stale)
	if _, err := be.Get(ctx, id); err == nil {
		t.Fatal("a reconcile from the stale cache booted the saved template again")
	}
	if stale.Status.Phase != kaironv1.MachineStopped || stale.Status.Snapshot == nil || stale.Status.Snapshot.Path != machine.Status.Snapshot.Path {
		t.Errorf("from the stale cache: %s %q, snapshot %+v; want Stopped with %+v", stale.Status.Phase, stale.Status.Message, stale.Status.Snapshot, machine.Status.Snapshot)
	}

	// Another Machine under the same name is another template.
	other := machine.DeepCopy()
	other.UID, other.Status = "uid-2", kaironv1.MachineStatus{}
	if err := a.removeSnapshot(id); err != nil {
		t.Fatal(err)
	}
	reconcile(other)
	if inst, err := be.Get(ctx, id); err != nil || inst.Phase != backend.Booting {
		t.Errorf("a new template under the same name did not start: %+v %v", inst, err)
	}
}
