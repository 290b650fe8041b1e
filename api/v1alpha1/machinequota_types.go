package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MachineResources is an amount of Machines, vCPUs and memory. Unset fields
// are not limited.
type MachineResources struct {
	// Machines is a number of Machines.
	// +optional
	// +kubebuilder:validation:Minimum=0
	Machines *int32 `json:"machines,omitempty"`
	// CPU is a number of vCPUs.
	// +optional
	// +kubebuilder:validation:Minimum=0
	CPU *int32 `json:"cpu,omitempty"`
	// Memory is an amount of guest memory.
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`
}

// MachineQuotaSpec limits the Machines of one namespace.
type MachineQuotaSpec struct {
	// Hard are the limits. A Machine that would exceed one stays Pending.
	Hard MachineResources `json:"hard"`
}

// MachineQuotaStatus is what the namespace uses now.
type MachineQuotaStatus struct {
	// Hard is spec.hard as last enforced.
	// +optional
	Hard MachineResources `json:"hard,omitempty"`
	// Used counts the Machines the quota charges: placed Machines in the
	// namespace that are not Stopped, Failed or being deleted.
	// +optional
	Used MachineResources `json:"used,omitempty"`
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// MachineQuota caps the number, vCPUs and memory of Machines in a namespace.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=mq,categories=kairon
// +kubebuilder:printcolumn:name="Machines",type=integer,JSONPath=`.status.used.machines`
// +kubebuilder:printcolumn:name="Max-Machines",type=integer,JSONPath=`.spec.hard.machines`
// +kubebuilder:printcolumn:name="CPU",type=integer,JSONPath=`.status.used.cpu`
// +kubebuilder:printcolumn:name="Max-CPU",type=integer,JSONPath=`.spec.hard.cpu`
// +kubebuilder:printcolumn:name="Memory",type=string,JSONPath=`.status.used.memory`
// +kubebuilder:printcolumn:name="Max-Memory",type=string,JSONPath=`.spec.hard.memory`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MachineQuota struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   MachineQuotaSpec   `json:"spec,omitempty"`
	Status MachineQuotaStatus `json:"status,omitempty"`
}

// MachineQuotaList is a list of MachineQuotas.
//
// +kubebuilder:object:root=true
type MachineQuotaList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MachineQuota `json:"items"`
}

func init() {
	register(&MachineQuota{}, &MachineQuotaList{})
}
