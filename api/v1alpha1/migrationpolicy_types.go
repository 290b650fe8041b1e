package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MigrationPolicySelectors picks the Machines a MigrationPolicy applies to.
// A Machine is selected when it carries every label of machineSelector and
// its namespace carries every label of namespaceSelector; an empty selector
// places no condition, so a policy with neither selects every Machine.
type MigrationPolicySelectors struct {
	// MachineSelector are labels (key: value) the Machine must carry.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	MachineSelector map[string]string `json:"machineSelector,omitempty"`
	// NamespaceSelector are labels the Machine's namespace must carry, e.g.
	// kubernetes.io/metadata.name: team-a.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	NamespaceSelector map[string]string `json:"namespaceSelector,omitempty"`
}

// MigrationPolicySpec is how the migrations of the selected Machines run.
// Every field is optional; an unset one leaves Kairon's default in force
// (see docs/guides/migration-policy.md).
type MigrationPolicySpec struct {
	// Selectors pick the Machines. When several policies select a Machine,
	// the one whose selectors have the most labels wins; a tie goes to the
	// policy whose name sorts first.
	// +optional
	Selectors MigrationPolicySelectors `json:"selectors,omitempty"`

	// BandwidthPerMigration caps the stream of one live migration, in bytes
	// per second: "64Mi" is 64 MiB/s. Unset: 1Gi.
	// +optional
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isGreaterThan(quantity('1023'))",message="bandwidthPerMigration must be at least 1Ki (bytes per second)"
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).isInteger()",message="bandwidthPerMigration must be a whole number of bytes per second"
	BandwidthPerMigration *resource.Quantity `json:"bandwidthPerMigration,omitempty"`

	// CompletionTimeoutPerGiB is how long, in seconds per GiB of the
	// Machine's memory, a live migration may take in all before it is
	// cancelled (the guest stays on its node). Unset: no limit of its own.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	CompletionTimeoutPerGiB *int64 `json:"completionTimeoutPerGiB,omitempty"`

	// ProgressTimeout is how long, in seconds, a live migration may go
	// without the guest memory left to send dropping below its lowest value
	// so far; then it is cancelled and the guest stays on its node. Unset:
	// no limit.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	ProgressTimeout *int64 `json:"progressTimeout,omitempty"`

	// AllowAutoConverge lets the hypervisor slow the guest's vCPUs down
	// when it dirties memory faster than the migration sends it, so that a
	// live migration can finish. Unset: false.
	// +optional
	AllowAutoConverge *bool `json:"allowAutoConverge,omitempty"`

	// MaxParallelMigrations is how many migrations (cold or live) may run
	// at once in the whole cluster for one of this policy's Machines to
	// start moving; the others wait Pending. 0 holds them all. Unset: no limit.
	// +optional
	// +kubebuilder:validation:Minimum=0
	MaxParallelMigrations *int32 `json:"maxParallelMigrations,omitempty"`

	// MaxParallelOutboundPerNode is how many migrations may run at once out
	// of one node for one of this policy's Machines to start moving off it;
	// the others wait Pending. 0 holds them all. Unset: no limit.
	// +optional
	// +kubebuilder:validation:Minimum=0
	MaxParallelOutboundPerNode *int32 `json:"maxParallelOutboundPerNode,omitempty"`
}

// MigrationPolicy sets how the migrations of the Machines it selects run:
// the live stream's bandwidth, when a live migration is given up, whether
// the guest may be slowed to converge, and how many run at once. Like
// KubeVirt's MigrationPolicy it is cluster-scoped. kairon-controller
// resolves the winning policy when a migration starts and records it in
// the MachineMigration's status.migrationPolicy, which the node agents
// follow; a later change of the policy affects later migrations only.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=mpol,categories=kairon
// +kubebuilder:printcolumn:name="Bandwidth",type=string,JSONPath=`.spec.bandwidthPerMigration`
// +kubebuilder:printcolumn:name="Completion-s-per-GiB",type=integer,JSONPath=`.spec.completionTimeoutPerGiB`
// +kubebuilder:printcolumn:name="Progress-s",type=integer,JSONPath=`.spec.progressTimeout`
// +kubebuilder:printcolumn:name="Auto-Converge",type=boolean,JSONPath=`.spec.allowAutoConverge`
// +kubebuilder:printcolumn:name="Max-Parallel",type=integer,JSONPath=`.spec.maxParallelMigrations`
// +kubebuilder:printcolumn:name="Max-Per-Node",type=integer,JSONPath=`.spec.maxParallelOutboundPerNode`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MigrationPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec MigrationPolicySpec `json:"spec,omitempty"`
}

// MigrationPolicyList is a list of MigrationPolicies.
//
// +kubebuilder:object:root=true
type MigrationPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MigrationPolicy `json:"items"`
}

// AppliedMigrationPolicy is the MigrationPolicy a migration runs under, as
// kairon-controller resolved it when the migration started: the values the
// node agents apply, whatever happens to the policy afterwards.
type AppliedMigrationPolicy struct {
	// Name is the MigrationPolicy that won.
	Name string `json:"name"`
	// BandwidthPerMigration is the policy's cap, bytes per second.
	// +optional
	BandwidthPerMigration *resource.Quantity `json:"bandwidthPerMigration,omitempty"`
	// CompletionTimeoutSeconds is completionTimeoutPerGiB times the
	// Machine's memory in GiB, rounded up to a whole second.
	// +optional
	CompletionTimeoutSeconds *int64 `json:"completionTimeoutSeconds,omitempty"`
	// ProgressTimeoutSeconds is the policy's progressTimeout.
	// +optional
	ProgressTimeoutSeconds *int64 `json:"progressTimeoutSeconds,omitempty"`
	// AllowAutoConverge is the policy's allowAutoConverge.
	// +optional
	AllowAutoConverge *bool `json:"allowAutoConverge,omitempty"`
}

func init() {
	register(&MigrationPolicy{}, &MigrationPolicyList{})
}
