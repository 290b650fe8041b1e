package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// ReclaimPolicy says what happens to a claimed Machine when its claim goes.
// +kubebuilder:validation:Enum=Delete;Retain
type ReclaimPolicy string

const (
	// ReclaimDelete deletes the Machine with the claim.
	ReclaimDelete ReclaimPolicy = "Delete"
	// ReclaimRetain keeps the Machine as a plain Machine, without pool or claim labels.
	ReclaimRetain ReclaimPolicy = "Retain"
)

// MachineClaimPhase is Pending, Bound or Lost.
// +kubebuilder:validation:Enum=Pending;Bound;Lost
type MachineClaimPhase string

const (
	// ClaimPending: waiting for a Running warm member of the pool.
	ClaimPending MachineClaimPhase = "Pending"
	// ClaimBound: status.machineName is this claim's Machine.
	ClaimBound MachineClaimPhase = "Bound"
	// ClaimLost: the bound Machine was deleted out from under the claim.
	ClaimLost MachineClaimPhase = "Lost"
)

// MachineClaimSpec asks for one warm Machine from a pool.
type MachineClaimSpec struct {
	// PoolName is the MachinePool, in the claim's namespace, to take a Machine from.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.poolName is immutable"
	PoolName string `json:"poolName"`

	// Labels are added to the Machine when it is bound.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	Labels map[string]string `json:"labels,omitempty"`

	// ReclaimPolicy is Delete (default: the Machine goes with the claim) or
	// Retain (the Machine stays as a plain Machine).
	// +optional
	// +kubebuilder:default=Delete
	ReclaimPolicy ReclaimPolicy `json:"reclaimPolicy,omitempty"`

	// TTLSeconds deletes the claim this long after it binds, releasing the
	// Machine per reclaimPolicy.
	// +optional
	// +kubebuilder:validation:Minimum=1
	TTLSeconds *int64 `json:"ttlSeconds,omitempty"`

	// Egress confines the claimed Machine to these destinations while bound:
	// the binder makes it a MachineNetworkPolicy (claim-egress-<claim>), and
	// the claim turns Bound only once the Machine's node reports that policy
	// enforced in nftables (condition EgressEnforced). Releasing deletes the
	// policy before the Machine goes back or is deleted.
	// +optional
	Egress *EgressRules `json:"egress,omitempty"`
}

// MachineClaimStatus reports the bind.
type MachineClaimStatus struct {
	// Phase is Pending, Bound or Lost.
	// +optional
	Phase MachineClaimPhase `json:"phase,omitempty"`
	// MachineName is the bound Machine.
	// +optional
	MachineName string `json:"machineName,omitempty"`
	// BindMillis is the time from the claim's creation to its bind.
	// +optional
	BindMillis int64 `json:"bindMillis,omitempty"`
	// BoundAt is when the claim was bound; spec.ttlSeconds counts from here.
	// +optional
	BoundAt *metav1.Time `json:"boundAt,omitempty"`
	// EgressPolicy names the MachineNetworkPolicy that enforces spec.egress.
	// +optional
	EgressPolicy string `json:"egressPolicy,omitempty"`
	// Message says why a claim is still Pending or was Lost.
	// +optional
	Message string `json:"message,omitempty"`
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// MachineClaim takes one warm Machine from a MachinePool.
//
// +kubebuilder:object:root=true
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 63",message="metadata.name must be at most 63 characters: it is used as the value of the kairon.zyvor.dev/machineclaim label on its Machines"
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=mc,categories=kairon
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.spec.poolName`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Machine",type=string,JSONPath=`.status.machineName`
// +kubebuilder:printcolumn:name="Bind-ms",type=integer,JSONPath=`.status.bindMillis`
// +kubebuilder:printcolumn:name="Egress",type=string,JSONPath=`.status.egressPolicy`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MachineClaim struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   MachineClaimSpec   `json:"spec,omitempty"`
	Status MachineClaimStatus `json:"status,omitempty"`
}

// MachineClaimList is a list of MachineClaims.
//
// +kubebuilder:object:root=true
type MachineClaimList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MachineClaim `json:"items"`
}

func init() {
	register(&MachineClaim{}, &MachineClaimList{})
}
