package v1alpha1

// Labels and annotations of snapshot-clone pools (MachinePool spec.warmFrom
// Snapshot). The pool controller and the node agent share them.
const (
	// LabelMachinePoolTemplate is on a pool's template Machine: the pool's
	// name. A template Machine is no member (it has no
	// LabelMachinePool), so it is never counted, bound or claimed.
	LabelMachinePoolTemplate = "kairon.zyvor.dev/machinepool-template"

	// AnnotationSnapshotSave is on a template Machine: its node saves the
	// VM once it is Running into SnapshotPath and then stops it (the value
	// is "true").
	AnnotationSnapshotSave = "kairon.zyvor.dev/snapshot-save"
	// AnnotationSnapshotSaved is what the node writes on the template
	// Machine once the state file is complete: SnapshotRecord in JSON.
	AnnotationSnapshotSaved = "kairon.zyvor.dev/snapshot-saved"
	// AnnotationRestoreFrom is on a clone: the template Machine (same
	// namespace) whose saved state its node restores instead of booting.
	// The clone's spec.nodeName is the snapshot's node.
	AnnotationRestoreFrom = "kairon.zyvor.dev/restore-from"
)

// SnapshotRecord is AnnotationSnapshotSaved's value.
type SnapshotRecord struct {
	// NodeName is the node holding the file.
	NodeName string `json:"nodeName"`
	// Path is the state file on that node.
	Path string `json:"path"`
	// SizeBytes is its size.
	SizeBytes int64 `json:"sizeBytes"`
	// SavedAt is when the save finished (RFC 3339).
	SavedAt string `json:"savedAt"`
	// Error, when set, says why the node could not save it; the other
	// fields are then empty.
	Error string `json:"error,omitempty"`
}
