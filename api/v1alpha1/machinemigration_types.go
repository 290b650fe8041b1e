package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MigrationStrategy is how a Machine moves between nodes.
// +kubebuilder:validation:Enum=cold;live
type MigrationStrategy string

const (
	// MigrationCold stops the VM, moves its saved state and starts it on the target.
	MigrationCold MigrationStrategy = "cold"
	// MigrationLive copies the running VM to the target with QEMU live migration.
	MigrationLive MigrationStrategy = "live"
)

// MigrationPhase is Pending, Running, Succeeded or Failed.
// +kubebuilder:validation:Enum=Pending;Running;Succeeded;Failed
type MigrationPhase string

const (
	MigrationPending   MigrationPhase = "Pending"
	MigrationRunning   MigrationPhase = "Running"
	MigrationSucceeded MigrationPhase = "Succeeded"
	MigrationFailed    MigrationPhase = "Failed"
)

// IsTerminal reports whether a migration in this phase is finished.
// Pending and Running migrations are in flight and count against budgets.
func (p MigrationPhase) IsTerminal() bool {
	return p == MigrationSucceeded || p == MigrationFailed
}

// MachineMigrationSpec names the Machine to move. It cannot change after
// creation, so admission only ever checks CREATE.
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec is immutable; delete the MachineMigration and create a new one"
type MachineMigrationSpec struct {
	// MachineName is the Machine, in the migration's namespace, to move.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	MachineName string `json:"machineName"`

	// Strategy is cold (default) or live.
	// +optional
	// +kubebuilder:default=cold
	Strategy MigrationStrategy `json:"strategy,omitempty"`

	// TargetNode is where to move the Machine; empty lets the scheduler choose.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	TargetNode string `json:"targetNode,omitempty"`
}

// MachineMigrationStatus reports the move.
type MachineMigrationStatus struct {
	// +optional
	Phase MigrationPhase `json:"phase,omitempty"`
	// Reason is a CamelCase word for the phase, e.g. TargetUnavailable.
	// +optional
	Reason MigrationReason `json:"reason,omitempty"`
	// Message explains the reason.
	// +optional
	Message string `json:"message,omitempty"`
	// SourceNode is where the Machine ran when the migration started.
	// +optional
	SourceNode string `json:"sourceNode,omitempty"`
	// TargetNode is where the Machine is moving to.
	// +optional
	TargetNode string `json:"targetNode,omitempty"`
	// StartTime is when the migration began moving the Machine.
	// +optional
	StartTime *metav1.Time `json:"startTime,omitempty"`
	// CompletionTime is when it succeeded or failed.
	// +optional
	CompletionTime *metav1.Time `json:"completionTime,omitempty"`
	// DowntimeMillis is how long the guest was not running.
	// +optional
	DowntimeMillis int64 `json:"downtimeMillis,omitempty"`
	// MigrationPolicy is the MigrationPolicy this migration runs under,
	// resolved by kairon-controller when it started the migration (the
	// policy whose selectors match the Machine with the most labels); the
	// source node's agent applies these values. Absent: no policy selected
	// the Machine, and Kairon's defaults apply.
	// +optional
	MigrationPolicy *AppliedMigrationPolicy `json:"migrationPolicy,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// MachineMigration moves one Machine to another node.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=mmig,categories=kairon
// +kubebuilder:printcolumn:name="Machine",type=string,JSONPath=`.spec.machineName`
// +kubebuilder:printcolumn:name="Strategy",type=string,JSONPath=`.spec.strategy`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Source",type=string,JSONPath=`.status.sourceNode`
// +kubebuilder:printcolumn:name="Target",type=string,JSONPath=`.status.targetNode`
// +kubebuilder:printcolumn:name="Reason",type=string,JSONPath=`.status.reason`,priority=1
// +kubebuilder:printcolumn:name="Downtime-ms",type=integer,JSONPath=`.status.downtimeMillis`,priority=1
// +kubebuilder:printcolumn:name="Policy",type=string,JSONPath=`.status.migrationPolicy.name`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MachineMigration struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   MachineMigrationSpec   `json:"spec,omitempty"`
	Status MachineMigrationStatus `json:"status,omitempty"`
}

// MachineMigrationList is a list of MachineMigrations.
//
// +kubebuilder:object:root=true
type MachineMigrationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MachineMigration `json:"items"`
}

func init() {
	register(&MachineMigration{}, &MachineMigrationList{})
}
