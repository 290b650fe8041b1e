package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// MachineDisruptionBudgetSpec caps how many matching Machines may be disrupted
// at once. Exactly one of minAvailable and maxUnavailable is set.
// +kubebuilder:validation:XValidation:rule="has(self.minAvailable) != has(self.maxUnavailable)",message="exactly one of spec.minAvailable or spec.maxUnavailable must be set"
type MachineDisruptionBudgetSpec struct {
	// Selector matches Machines by label, across the whole cluster.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	Selector map[string]string `json:"selector,omitempty"`

	// MinAvailable is how many matching Machines must stay healthy: an integer
	// or a percentage ("50%") of the matching Machines, rounded up.
	// +optional
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^[0-9]+$') || self.matches('^([0-9]|[1-9][0-9]|100)%$')",message="must be a non-negative integer or a percentage from 0% to 100%"
	MinAvailable *intstr.IntOrString `json:"minAvailable,omitempty"`

	// MaxUnavailable is how many matching Machines may be unhealthy at once: an
	// integer or a percentage of the matching Machines, rounded up.
	// +optional
	// +kubebuilder:validation:XValidation:rule="type(self) == int ? self >= 0 : self.matches('^[0-9]+$') || self.matches('^([0-9]|[1-9][0-9]|100)%$')",message="must be a non-negative integer or a percentage from 0% to 100%"
	MaxUnavailable *intstr.IntOrString `json:"maxUnavailable,omitempty"`
}

// MachineDisruptionBudgetStatus is recomputed by kairon-controller every tick.
// It is informational: evacuate and the webhook recompute it at decision time.
type MachineDisruptionBudgetStatus struct {
	// ExpectedMachines is how many Machines match the selector.
	// +optional
	// +kubebuilder:default=0
	ExpectedMachines int32 `json:"expectedMachines"`
	// CurrentHealthy counts matching Machines that are Running, not the
	// target of a Pending or Running MachineMigration, and not on a node
	// whose agent is unreachable (nobody knows whether those still run).
	// +optional
	// +kubebuilder:default=0
	CurrentHealthy int32 `json:"currentHealthy"`
	// DesiredHealthy is the least number of healthy Machines the budget allows.
	// +optional
	// +kubebuilder:default=0
	DesiredHealthy int32 `json:"desiredHealthy"`
	// DisruptionsAllowed is currentHealthy - desiredHealthy, never below 0.
	// +optional
	// +kubebuilder:default=0
	DisruptionsAllowed int32 `json:"disruptionsAllowed"`
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// MachineDisruptionBudget limits how many Machines evacuation, the admission
// webhook and cordon evacuation disrupt at once.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=mdb,categories=kairon
// +kubebuilder:printcolumn:name="MinAvailable",type=string,JSONPath=`.spec.minAvailable`
// +kubebuilder:printcolumn:name="MaxUnavailable",type=string,JSONPath=`.spec.maxUnavailable`
// +kubebuilder:printcolumn:name="Expected",type=integer,JSONPath=`.status.expectedMachines`
// +kubebuilder:printcolumn:name="Healthy",type=integer,JSONPath=`.status.currentHealthy`
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.status.desiredHealthy`
// +kubebuilder:printcolumn:name="Allowed",type=integer,JSONPath=`.status.disruptionsAllowed`
type MachineDisruptionBudget struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   MachineDisruptionBudgetSpec   `json:"spec,omitempty"`
	Status MachineDisruptionBudgetStatus `json:"status,omitempty"`
}

// MachineDisruptionBudgetList is a list of MachineDisruptionBudgets.
//
// +kubebuilder:object:root=true
type MachineDisruptionBudgetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MachineDisruptionBudget `json:"items"`
}

func init() {
	register(&MachineDisruptionBudget{}, &MachineDisruptionBudgetList{})
}
