package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MachinePoolSpec keeps booted, unclaimed Machines ready for MachineClaims.
type MachinePoolSpec struct {
	// Replicas is how many warm (booted, unclaimed) members to keep. Claimed
	// members do not count, so every bind starts a replacement.
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	Replicas *int32 `json:"replicas,omitempty"`

	// Template is what each member is created from. Changing it replaces warm
	// members; claimed ones are left alone.
	// +optional
	Template MachineTemplateSpec `json:"template,omitempty"`

	// Readiness is when a warm member may be bound: Running (the default:
	// status.phase is Running) or GuestAgent (Running, and its guest agent
	// answered the node's latest ping: the GuestAgentReady condition).
	// +kubebuilder:default=Running
	// +optional
	Readiness MachinePoolReadiness `json:"readiness,omitempty"`

	// WarmFrom is how new members come up: Boot (the default: each one
	// boots its kernel) or Snapshot (the pool boots one template Machine
	// from spec.template, its node saves it once, and members are restored
	// from that saved state, each given its own address, MAC, hostname,
	// RNG seed and boot nonce before it reports Running). Snapshot members
	// are placed on the template's node (a kubernetes.io/hostname
	// nodeSelector). Until the snapshot exists, members boot. See
	// docs/guides/machinepool.md.
	// +kubebuilder:default=Boot
	// +optional
	WarmFrom MachinePoolWarmFrom `json:"warmFrom,omitempty"`
}

// MachinePoolWarmFrom is how a pool's new members come up.
// +kubebuilder:validation:Enum=Boot;Snapshot
type MachinePoolWarmFrom string

const (
	// WarmFromBoot: every member boots.
	WarmFromBoot MachinePoolWarmFrom = "Boot"
	// WarmFromSnapshot: members are clones of a saved template Machine.
	WarmFromSnapshot MachinePoolWarmFrom = "Snapshot"
)

// MachinePoolSnapshot is the saved template a pool with warmFrom Snapshot
// restores its members from.
type MachinePoolSnapshot struct {
	// Machine is the template Machine that was saved (in the pool's
	// namespace, labelled kairon.zyvor.dev/machinepool-template).
	Machine string `json:"machine"`
	// NodeName is the node holding the saved state; clones run there.
	NodeName string `json:"nodeName"`
	// Path is the saved state's file on that node.
	Path string `json:"path"`
	// TemplateHash is the hash of spec.template the template Machine was
	// built from (its kairon.zyvor.dev/machinepool-template-hash).
	TemplateHash string `json:"templateHash"`
	// TakenAt is when the node finished saving it.
	// +optional
	TakenAt *metav1.Time `json:"takenAt,omitempty"`
	// SizeBytes is the saved state's size.
	// +optional
	SizeBytes int64 `json:"sizeBytes,omitempty"`
}

// MachinePoolImage is spec.template's image reference as the pool
// resolved it.
type MachinePoolImage struct {
	// Reference is spec.template.spec.image as written.
	Reference string `json:"reference"`
	// Digest is what Reference resolved to (sha256:…).
	Digest string `json:"digest"`
	// TemplateHash is the hash of spec.template it was resolved for.
	TemplateHash string `json:"templateHash"`
	// ResolvedAt is when the pool asked the registry.
	// +optional
	ResolvedAt *metav1.Time `json:"resolvedAt,omitempty"`
}

// MachinePoolReadiness is when a pool's warm member counts as ready.
// +kubebuilder:validation:Enum=Running;GuestAgent
type MachinePoolReadiness string

const (
	// PoolReadinessRunning: the member's status.phase is Running.
	PoolReadinessRunning MachinePoolReadiness = "Running"
	// PoolReadinessGuestAgent: Running, and its GuestAgentReady condition
	// is True, so a claim gets a guest it can exec into at once.
	PoolReadinessGuestAgent MachinePoolReadiness = "GuestAgent"
)

// MachinePoolStatus counts the pool's members.
type MachinePoolStatus struct {
	// Replicas is the number of warm members, booted or booting; the scale
	// subresource reports it.
	// +optional
	// +kubebuilder:default=0
	Replicas int32 `json:"replicas"`
	// Warm is the number of unclaimed members.
	// +optional
	// +kubebuilder:default=0
	Warm int32 `json:"warm"`
	// ReadyWarm is the number of unclaimed members in phase Running: the ones a
	// claim can bind to now.
	// +optional
	// +kubebuilder:default=0
	ReadyWarm int32 `json:"readyWarm"`
	// Claimed is the number of members held by MachineClaims.
	// +optional
	// +kubebuilder:default=0
	Claimed int32 `json:"claimed"`
	// Selector selects the warm members, exactly the ones Replicas counts
	// (kairon.zyvor.dev/machinepool=NAME,kairon.zyvor.dev/pool-state=warm),
	// for the scale subresource and HPA. Claimed members are not selected.
	// +optional
	Selector string `json:"selector,omitempty"`
	// Snapshot is the saved template members are restored from, with
	// spec.warmFrom Snapshot, once its node saved it; the SnapshotReady
	// condition says where it is on its way.
	// +optional
	Snapshot *MachinePoolSnapshot `json:"snapshot,omitempty"`
	// Image is the OCI image the pool's current template pins its members
	// to: spec.template's image reference resolved to one digest. Members
	// are created with that digest, so a tag that moves later does not
	// mix images in one pool; `kaironctl rollout restart machinepool`
	// resolves it again and rolls the warm members. Unset for a built-in
	// image.
	// +optional
	Image *MachinePoolImage `json:"image,omitempty"`
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// MachinePool keeps spec.replicas Machines booted so a MachineClaim gets one
// without waiting for a cold boot.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:subresource:scale:specpath=.spec.replicas,statuspath=.status.replicas,selectorpath=.status.selector
// +kubebuilder:resource:shortName=mp,categories=kairon
// +kubebuilder:printcolumn:name="Desired",type=integer,JSONPath=`.spec.replicas`
// +kubebuilder:printcolumn:name="Warm",type=integer,JSONPath=`.status.warm`
// +kubebuilder:printcolumn:name="Ready",type=integer,JSONPath=`.status.readyWarm`
// +kubebuilder:printcolumn:name="Claimed",type=integer,JSONPath=`.status.claimed`
// +kubebuilder:printcolumn:name="Image",type=string,JSONPath=`.spec.template.spec.image`,priority=1
// +kubebuilder:printcolumn:name="Digest",type=string,JSONPath=`.status.image.digest`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type MachinePool struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   MachinePoolSpec   `json:"spec,omitempty"`
	Status MachinePoolStatus `json:"status,omitempty"`
}

// MachinePoolList is a list of MachinePools.
//
// +kubebuilder:object:root=true
type MachinePoolList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []MachinePool `json:"items"`
}

func init() {
	register(&MachinePool{}, &MachinePoolList{})
}
