package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MachineNetworkPolicySpec is a default-deny egress policy: the selected
// Machines may reach only what spec.egress of one of their policies allows;
// a Machine no policy selects is unrestricted.
// +kubebuilder:validation:XValidation:rule="has(self.machineName) != has(self.machineSelector)",message="exactly one of spec.machineName or spec.machineSelector must be set"
type MachineNetworkPolicySpec struct {
	// MachineName selects one Machine, in the policy's namespace, by name.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	MachineName string `json:"machineName,omitempty"`

	// MachineSelector selects Machines in the policy's namespace by label.
	// +optional
	MachineSelector *metav1.LabelSelector `json:"machineSelector,omitempty"`

	// Egress lists what the selected Machines may reach. An empty list allows
	// nothing.
	// +optional
	Egress EgressRules `json:"egress,omitempty"`
}

// MachineNetworkPolicyStatus reports enforcement.
type MachineNetworkPolicyStatus struct {
	// Machines is how many Machines the nodes report the policy enforced
	// for: the sum over status.nodes. Each node's agent writes it with its
	// own entry; kairon-controller corrects it when several nodes report
	// at once.
	// +optional
	// +kubebuilder:default=0
	Machines int32 `json:"machines"`
	// Nodes reports enforcement: one entry per node that runs a selected
	// Machine, written by that node's agent (server-side apply, one field
	// manager per node) once the node's nftables rules for the policy's
	// generation are in place.
	// +optional
	// +listType=map
	// +listMapKey=node
	Nodes []PolicyEnforcement `json:"nodes,omitempty"`
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// PolicyEnforcement is one node's report on a MachineNetworkPolicy.
type PolicyEnforcement struct {
	// Node is the node whose agent wrote this entry.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	Node string `json:"node"`
	// Machines are the selected Machines the node enforces the policy for,
	// by name, sorted.
	// +optional
	// +listType=set
	Machines []string `json:"machines,omitempty"`
	// ObservedGeneration is the policy generation those rules implement.
	ObservedGeneration int64 `json:"observedGeneration"`
	// Error, when set, says why the node could not enforce the policy for
	// some Machine; the Machine stays under its previous rules (or, new,
	// sends nothing it would not be allowed).
	// +optional
	Error string `json:"error,omitempty"`
}

// MachineNetworkPolicy confines the egress of Machines to an allowlist.
// Each node agent (kairon-node) enforces it with nftables at the selected
// Machines' taps, with a DNS proxy for allowFqdns and an SNI proxy for
// allowSNI, and reports it in status.nodes: a selected Machine may send
// only what one of its policies allows, replies aside (docs/guides/egress.md).
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=mnp,categories=kairon
// +kubebuilder:printcolumn:name="Machine",type=string,JSONPath=`.spec.machineName`
// +kubebuilder:printcolumn:name="Machines",type=integer,JSONPath=`.status.machines`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MachineNetworkPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec MachineNetworkPolicySpec `json:"spec,omitempty"`
	// +kubebuilder:default={}
	Status MachineNetworkPolicyStatus `json:"status,omitempty"`
}

// MachineNetworkPolicyList is a list of MachineNetworkPolicies.
//
// +kubebuilder:object:root=true
type MachineNetworkPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MachineNetworkPolicy `json:"items"`
}

func init() {
	register(&MachineNetworkPolicy{}, &MachineNetworkPolicyList{})
}
