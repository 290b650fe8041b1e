package v1alpha1

import (
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MachineSnapshotPhase is where a MachineSnapshot is in its life.
// +kubebuilder:validation:Enum=Pending;Ready;Failed
type MachineSnapshotPhase string

const (
	// SnapshotPending: not taken yet (the Machine is not Running, or its
	// node has not got to it).
	SnapshotPending MachineSnapshotPhase = "Pending"
	// SnapshotReady: the saved state is in status.store; it can be restored.
	SnapshotReady MachineSnapshotPhase = "Ready"
	// SnapshotFailed: the node could not take it; status.message says why.
	// A failed snapshot is not retried: create a new one.
	SnapshotFailed MachineSnapshotPhase = "Failed"
)

// MachineSnapshotSpec names the Machine to save.
type MachineSnapshotSpec struct {
	// MachineName is the Machine, in the snapshot's namespace, whose memory
	// and device state the node running it saves. It cannot change.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="spec.machineName is immutable; create another MachineSnapshot"
	MachineName string `json:"machineName"`
}

// MachineSnapshotStatus is written by the node agent that took the snapshot.
type MachineSnapshotStatus struct {
	// Phase is Pending, Ready or Failed.
	// +optional
	Phase MachineSnapshotPhase `json:"phase,omitempty"`
	// Message explains the phase in a sentence.
	// +optional
	Message string `json:"message,omitempty"`
	// Node is the node that took the snapshot (the one running the Machine).
	// +optional
	Node string `json:"node,omitempty"`
	// Store is where the state file lives: the name of the snapshot
	// storage the node reaches (kairon-node --snapshot-store). Any node
	// whose label kairon.zyvor.dev/snapshot-store has this value can
	// restore it; a node-local store is named after its node ("node.<node>").
	// +optional
	Store string `json:"store,omitempty"`
	// File is the state file's name inside the store.
	// +optional
	File string `json:"file,omitempty"`
	// SizeBytes is the size of the state file.
	// +optional
	SizeBytes int64 `json:"sizeBytes,omitempty"`
	// TakenAt is when the guest was paused for the save: the moment whose
	// memory a restore brings back.
	// +optional
	TakenAt *metav1.Time `json:"takenAt,omitempty"`
	// PauseMillis is how long the guest was paused for the save.
	// +optional
	PauseMillis int64 `json:"pauseMillis,omitempty"`
	// CPU, Memory and Image are the saved Machine's shape; a Machine
	// restored from the snapshot must have the same.
	// +optional
	CPU int32 `json:"cpu,omitempty"`
	// +optional
	Memory *resource.Quantity `json:"memory,omitempty"`
	// +optional
	Image string `json:"image,omitempty"`
	// ImageDigest is the digest of the OCI image the saved Machine ran
	// (its status.imageDigest); a node restoring the snapshot pulls
	// exactly that image first. Empty for a built-in image.
	// +optional
	ImageDigest string `json:"imageDigest,omitempty"`
	// Conditions: Ready.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// MachineSnapshot is one saved state of one Machine: memory and device
// state, stored by the node agent that ran the Machine, restorable to a new
// Machine (spec.restoreFrom) on any node that reaches its store.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=msnap,categories=kairon
// +kubebuilder:printcolumn:name="Machine",type=string,JSONPath=`.spec.machineName`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.status.node`
// +kubebuilder:printcolumn:name="Size",type=integer,JSONPath=`.status.sizeBytes`
// +kubebuilder:printcolumn:name="PauseMs",type=integer,JSONPath=`.status.pauseMillis`
// +kubebuilder:printcolumn:name="Store",type=string,JSONPath=`.status.store`,priority=1
// +kubebuilder:printcolumn:name="Schedule",type=string,JSONPath=`.metadata.labels.kairon\.zyvor\.dev/snapshotschedule`,priority=1
// +kubebuilder:printcolumn:name="Taken",type=date,JSONPath=`.status.takenAt`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MachineSnapshot struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   MachineSnapshotSpec   `json:"spec"`
	Status MachineSnapshotStatus `json:"status,omitempty"`
}

// MachineSnapshotList is a list of MachineSnapshots.
//
// +kubebuilder:object:root=true
type MachineSnapshotList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MachineSnapshot `json:"items"`
}

// RestoreSource is where a restored Machine's guest comes from.
type RestoreSource struct {
	// SnapshotName is a MachineSnapshot in the Machine's namespace. The
	// Machine is placed on a node that reaches the snapshot's store and
	// started from its saved memory and devices instead of booting, with its
	// own network identity (address, MAC, hostname).
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=253
	// +kubebuilder:validation:Pattern=`^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$`
	SnapshotName string `json:"snapshotName"`
}

func init() {
	register(&MachineSnapshot{}, &MachineSnapshotList{})
}
