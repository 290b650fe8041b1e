package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MachineNetworkPolicySpec is a default-deny egress policy: the selected
// Machines may reach only what spec.egress allows.
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
	// Machines is how many Machines the policy currently selects.
	// +optional
	Machines int32 `json:"machines"`
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// MachineNetworkPolicy confines the egress of Machines to an allowlist.
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

	Spec   MachineNetworkPolicySpec   `json:"spec,omitempty"`
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
