package v1alpha1

// Labels and annotations of snapshot-clone pools (MachinePool spec.warmFrom
// Snapshot). The pool controller and the node agent share them.
const (
	// LabelMachinePoolTemplate is on a pool's template Machine: the pool's
	// name. A template Machine is no member (it has no
	// LabelMachinePool), so it is never counted, bound or claimed.
	LabelMachinePoolTemplate = "kairon.zyvor.dev/machinepool-template"

	// AnnotationSnapshotSave is on a template Machine: its node saves the
	// VM once it is Running, stops it and reports the file in the
	// Machine's status.snapshot (the value is "true").
	AnnotationSnapshotSave = "kairon.zyvor.dev/snapshot-save"
	// AnnotationRestoreFrom is on a clone: the template Machine (same
	// namespace) whose saved state its node restores instead of booting.
	// The clone's nodeSelector names the snapshot's node by its
	// kubernetes.io/hostname label.
	AnnotationRestoreFrom = "kairon.zyvor.dev/restore-from"
)

// Labels of MachineSnapshots
// (machinesnapshot_types.go) and SnapshotSchedules.
const (
	// LabelSnapshotMachine is on a MachineSnapshot: its spec.machineName,
	// so a Machine's snapshots can be listed by label.
	LabelSnapshotMachine = "kairon.zyvor.dev/snapshot-of"
	// LabelSnapshotSchedule is on a MachineSnapshot a SnapshotSchedule
	// created: the schedule's name. Retention counts only these.
	LabelSnapshotSchedule = "kairon.zyvor.dev/snapshotschedule"
	// LabelNodeSnapshotStore is on a Kairon Node: the snapshot store its
	// agent reaches (kairon-node --snapshot-store; "node.<node>" when it
	// has only its own). The scheduler places a Machine restored from a
	// snapshot only on a node with the snapshot's status.store here.
	LabelNodeSnapshotStore = "kairon.zyvor.dev/snapshot-store"
)

// NodeLocalSnapshotStore is the store name of a node without shared
// snapshot storage: only that node reaches its snapshots.
func NodeLocalSnapshotStore(node string) string { return "node." + node }
