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
