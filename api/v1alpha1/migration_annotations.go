package v1alpha1

// Annotations the node agents use while they carry out a migration.
const (
	// AnnotationMigrationStateSaved is "true" once the source agent handed
	// the guest's state over: for a cold migration when the paused VM is
	// saved and served to the target agent, for a live one when the whole
	// stream reached the target and the target took the guest over.
	AnnotationMigrationStateSaved = "kairon.zyvor.dev/state-saved"
	// AnnotationMigrationStateSavedAt is when (RFC 3339, nanoseconds) the
	// guest stopped running on the source: the start of a cold migration's
	// downtime.
	AnnotationMigrationStateSavedAt = "kairon.zyvor.dev/state-saved-at"
	// AnnotationMigrationDowntimeMillis is a live migration's downtime as
	// the source's hypervisor measured it, in milliseconds.
	AnnotationMigrationDowntimeMillis = "kairon.zyvor.dev/downtime-millis"
	// AnnotationMigrationTransferToken is on a Running MachineMigration:
	// the SHA-256 (hex) of the one-time token the connecting agent will
	// present on the migration listener (the source of a live migration,
	// the target fetching a cold one's saved state). The token itself is
	// only ever in that agent's memory and on the TLS connection; the
	// listening agent consumes it by removing this annotation, so a second
	// connection with the same token is refused.
	AnnotationMigrationTransferToken = "kairon.zyvor.dev/transfer-token-sha256"
	// AnnotationNodeMigrationEndpoint is on a Node: host:port where its
	// agent accepts migrations (live streams and cold saved states). Only
	// kairon-controller writes it, as the Node's InternalIP and the port
	// of AnnotationNodeMigrationPort, so that an agent cannot point other
	// nodes' migrations at another host. An empty host means the Node's
	// InternalIP.
	AnnotationNodeMigrationEndpoint = "kairon.zyvor.dev/migration-endpoint"
	// AnnotationNodeMigrationPort is on a Node: the TCP port its agent's
	// migration listener is bound to, on the Node's InternalIP. The agent
	// writes it on its own Node; the controller derives
	// AnnotationNodeMigrationEndpoint from it.
	AnnotationNodeMigrationPort = "kairon.zyvor.dev/migration-port"
	// AnnotationMachineMigrationTarget is on a Machine while a migration
	// moves it: the target node, which kairon-controller writes before it
	// sets the migration Running and removes once the migration ended. The
	// node confinement policy lets a node agent move a Machine's
	// spec.nodeName to itself only when this names it, so a compromised
	// node cannot pull Machines it was not chosen for.
	AnnotationMachineMigrationTarget = "kairon.zyvor.dev/migration-target"
	// AnnotationMigrationRequestedStrategy is on a MachineMigration whose
	// creator asked for a strategy spec.strategy cannot hold: "auto", from
	// cordon evacuation with strategy auto, which chose spec.strategy
	// itself. With AnnotationMigrationStrategyReason (a StrategyReason*)
	// and AnnotationMigrationStrategyMessage it is what kairon-controller
	// writes as the migration's StrategyChosen condition. They only
	// describe the choice: nothing acts on them.
	AnnotationMigrationRequestedStrategy = "kairon.zyvor.dev/requested-strategy"
	AnnotationMigrationStrategyReason    = "kairon.zyvor.dev/strategy-reason"
	AnnotationMigrationStrategyMessage   = "kairon.zyvor.dev/strategy-message"
)
