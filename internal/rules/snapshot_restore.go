package rules

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// RestoredMachine is the Machine name (in the snapshot's namespace) that
// restoring snap creates: spec.restoreFrom names snap, and spec.cpu,
// spec.memory and spec.image are the snapshot's, as its node agent
// requires. Labels, owners and placement are the caller's to add.
// kaironctl restore and the fence's restore both build it here. A
// snapshot that is not Ready cannot be restored.
func RestoredMachine(snap *kaironv1.MachineSnapshot, name string) (*kaironv1.Machine, error) {
	if snap.Status.Phase != kaironv1.SnapshotReady {
		phase := snap.Status.Phase
		if phase == "" {
			phase = kaironv1.SnapshotPending
		}
		why := ""
		if snap.Status.Message != "" {
			why = ": " + snap.Status.Message
		}
		return nil, fmt.Errorf("machinesnapshot %s is %s, not Ready%s", snap.Name, phase, why)
	}
	m := &kaironv1.Machine{
		ObjectMeta: metav1.ObjectMeta{Namespace: snap.Namespace, Name: name},
		Spec: kaironv1.MachineSpec{
			CPU:         snap.Status.CPU,
			Image:       snap.Status.Image,
			RestoreFrom: &kaironv1.RestoreSource{SnapshotName: snap.Name},
		},
	}
	if snap.Status.Memory != nil {
		m.Spec.Memory = snap.Status.Memory.DeepCopy()
	}
	return m, nil
}
