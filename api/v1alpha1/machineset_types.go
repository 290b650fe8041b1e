package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MachineSetSpec keeps a number of identical Machines.
// +kubebuilder:validation:XValidation:rule="!has(self.selector.matchLabels) || self.selector.matchLabels.all(k, has(self.template.metadata.labels) && k in self.template.metadata.labels && self.template.metadata.labels[k] == self.selector.matchLabels[k])",message="spec.selector.matchLabels must match spec.template.metadata.labels"
type MachineSetSpec struct {
	// Replicas is how many Machines to keep.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	Replicas *int32 `json:"replicas,omitempty"`

	// Selector picks the Machines this set owns; it must match the template's labels.
	Selector MachineSelector `json:"selector"`

	// Template is what each Machine is created from.
	Template MachineTemplateSpec `json:"template"`
}

// MachineSelector is a label selector with the same JSON as a Kubernetes
// LabelSelector, bounded so the API server can afford to check it against the
// template with CEL.
type MachineSelector struct {
	// +optional
	// +kubebuilder:validation:MaxProperties=16
	MatchLabels map[string]string `json:"matchLabels,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	MatchExpressions []metav1.LabelSelectorRequirement `json:"matchExpressions,omitempty"`
}

// LabelSelector converts the selector for the label and selector helpers.
func (s *MachineSelector) LabelSelector() *metav1.LabelSelector {
	return &metav1.LabelSelector{MatchLabels: s.MatchLabels, MatchExpressions: s.MatchExpressions}
}

// MachineSetStatus is what the MachineSet controller observed.
type MachineSetStatus struct {
	// Replicas is how many Machines the set owns now.
	// +optional
	// +kubebuilder:default=0
	Replicas int32 `json:"replicas"`
	// ReadyReplicas are owned Machines in phase Running.
	// +optional
	// +kubebuilder:default=0
	ReadyReplicas int32 `json:"readyReplicas"`
	// Selector is spec.selector as a string, for the scale subresource.
	// +optional
	Selector string `json:"selector,omitempty"`
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// MachineSet keeps spec.replicas Machines from one template, like a ReplicaSet.
//
// +kubebuilder:object:root=true
// +kubebuilder:validation:XValidation:rule="size(self.metadata.name) <= 63",message="metadata.name must be at most 63 characters: it is used as the value of the kairon.zyvor.dev/machineset label on its Machines"
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:shortName=ms,categories=kairon
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="Current",type=integer,JSONPath=`.status.replicas`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyReplicas`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MachineSet struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   MachineSetSpec   `json:"spec,omitempty"`
	Status MachineSetStatus `json:"status,omitempty"`
}

// MachineSetList is a list of MachineSets.
//
// +kubebuilder:object:root=true
type MachineSetList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MachineSet `json:"items"`
}

func init() {
	register(&MachineSet{}, &MachineSetList{})
}
