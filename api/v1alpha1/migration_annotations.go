package v1alpha1

// Annotations the node agents put on a MachineMigration while they carry out
// a cold migration: the source agent sets both once the VM's state is saved
// and served; the target agent then fetches and restores it.
const (
	// AnnotationMigrationStateSaved is "true" once the source agent saved
	// the paused VM's state and serves it to the target agent.
	AnnotationMigrationStateSaved = "kairon.zyvor.dev/state-saved"
	// AnnotationMigrationStateSavedAt is when (RFC 3339, nanoseconds) the
	// guest stopped running on the source: the start of its downtime.
	AnnotationMigrationStateSavedAt = "kairon.zyvor.dev/state-saved-at"
)
