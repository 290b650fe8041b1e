package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// MachinePhase is where a Machine is in its life.
// +kubebuilder:validation:Enum=Pending;Scheduled;Booting;Running;Stopping;Stopped;Failed
type MachinePhase string

const (
	// MachinePending: accepted, not yet placed on a node (see the Scheduled
	// condition's message for why).
	MachinePending MachinePhase = "Pending"
	// MachineScheduled: spec.nodeName is set; the node agent has not started it yet.
	MachineScheduled MachinePhase = "Scheduled"
	// MachineBooting: the VM process runs; the guest has not reported ready.
	MachineBooting MachinePhase = "Booting"
	// MachineRunning: the VM process runs and the guest printed its ready marker.
	MachineRunning MachinePhase = "Running"
	// MachineStopping: the VM is being shut down.
	MachineStopping MachinePhase = "Stopping"
	// MachineStopped: no VM runs because spec.powerState is Stopped.
	MachineStopped MachinePhase = "Stopped"
	// MachineFailed: the VM died or could not start; the Ready condition says why.
	MachineFailed MachinePhase = "Failed"
)

// PowerState is the state the user wants the VM in.
// +kubebuilder:validation:Enum=Running;Stopped
type PowerState string

const (
	PowerStateRunning PowerState = "Running"
	PowerStateStopped PowerState = "Stopped"
)

// MachineSpec is the desired state of a Machine. An empty spec is valid and
// boots the built-in guest with 1 vCPU and 256Mi of memory.
type MachineSpec struct {
	// NodeName is the node the Machine runs on. The scheduler sets it, like a
	// Pod's spec.nodeName; setting it yourself bypasses the scheduler.
	// +optional
	// +kubebuilder:validation:MaxLength=253
	NodeName string `json:"nodeName,omitempty"`

	// NodeSelector limits placement to nodes carrying all of these labels.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	NodeSelector map[string]string `json:"nodeSelector,omitempty"`

	// CPU is the number of virtual CPUs.
	// +optional
	// +kubebuilder:default=1
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=64
	CPU int32 `json:"cpu,omitempty"`

	// Memory is the guest's memory, at least 64Mi.
	// +optional
	// +kubebuilder:default="256Mi"
	// +kubebuilder:validation:XValidation:rule="quantity(string(self)).compareTo(quantity('64Mi')) >= 0",message="must be at least 64Mi"
	Memory resource.Quantity `json:"memory,omitempty,omitzero"`

	// Image is what the guest runs: either the name of a built-in guest
	// image on the node ("default", the guest `make guest` builds), or a
	// full OCI image reference, registry[:port]/repository[:tag][@sha256:…]
	// (a missing tag is latest). An OCI image is pulled by the node, turned
	// into a read-only filesystem and booted by Kairon's kernel with a
	// writable layer in guest memory (docs/guides/images.md).
	// +optional
	// +kubebuilder:default=default
	// +kubebuilder:validation:MaxLength=512
	// +kubebuilder:validation:XValidation:rule="self.contains('/') ? self.matches('^(localhost(:[0-9]+)?|[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?([.][a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?)+(:[0-9]+)?|[a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?:[0-9]+)(/[a-z0-9]+(([._]|__|-+)[a-z0-9]+)*)+(:[a-zA-Z0-9_][a-zA-Z0-9_.-]{0,127})?(@sha256:[a-f0-9]{64})?$') : self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')",message="must be a built-in guest image name such as default (lowercase letters, digits, '-' and '.') or a full OCI image reference registry[:port]/repository[:tag][@sha256:<64 lowercase hex digits>], e.g. 127.0.0.1:5000/kairon/python:3.11"
	Image string `json:"image,omitempty"`

	// ImagePullSecrets name Secrets of type kubernetes.io/dockerconfigjson
	// (or kubernetes.io/dockercfg) in the Machine's namespace that hold
	// credentials for spec.image's registry, as a Pod's do. Only the node
	// running the Machine may read them, and they never reach the guest.
	// +optional
	// +kubebuilder:validation:MaxItems=16
	// +listType=atomic
	ImagePullSecrets []corev1.LocalObjectReference `json:"imagePullSecrets,omitempty"`

	// KernelArgs are appended to the guest kernel command line.
	// +optional
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MaxLength=1024
	KernelArgs []string `json:"kernelArgs,omitempty"`

	// PowerState is Running (default) or Stopped. Stopping a Machine keeps the
	// object and its placement; starting it again boots a fresh VM.
	// +optional
	// +kubebuilder:default=Running
	PowerState PowerState `json:"powerState,omitempty"`

	// RestoreFrom starts the Machine from a MachineSnapshot's saved memory
	// and devices instead of booting it: the guest carries on from the
	// moment of the snapshot, with this Machine's own network identity.
	// spec.cpu, spec.memory and spec.image must be the snapshot's
	// (kaironctl restore copies them). It cannot change after creation.
	// +optional
	RestoreFrom *RestoreSource `json:"restoreFrom,omitempty"`
}

// MachineAddress is one address the guest can be reached at.
type MachineAddress struct {
	// Type is InternalIP for the address on the node's bridge.
	Type string `json:"type"`
	// Address is the IP address.
	Address string `json:"address"`
}

// MachineStatus is what the node agent and controllers observed.
type MachineStatus struct {
	// Phase summarises where the Machine is in its life.
	// +optional
	Phase MachinePhase `json:"phase,omitempty"`

	// Message explains the phase in a sentence, e.g. why a Machine is Pending.
	// +optional
	Message string `json:"message,omitempty"`

	// Addresses the guest answers on.
	// +optional
	Addresses []MachineAddress `json:"addresses,omitempty"`

	// Acceleration the node runs the VM with: kvm, tcg or sim.
	// +optional
	Acceleration string `json:"acceleration,omitempty"`

	// BootMillis is how long the guest took from VM start to ready.
	// +optional
	BootMillis int64 `json:"bootMillis,omitempty"`

	// StartedAt is when the current VM process started.
	// +optional
	StartedAt *metav1.Time `json:"startedAt,omitempty"`

	// ConsoleTail is the end of the serial console when the VM failed.
	// +optional
	ConsoleTail string `json:"consoleTail,omitempty"`

	// ImageDigest is the digest (sha256:…) of the OCI image the VM runs,
	// set by the node once it pulled spec.image; empty for a built-in image.
	// +optional
	ImageDigest string `json:"imageDigest,omitempty"`

	// Snapshot is set by the node agent on a pool's template Machine
	// (annotation kairon.zyvor.dev/snapshot-save) once it saved the VM
	// for the pool's clones and stopped it.
	// +optional
	Snapshot *TemplateSnapshot `json:"snapshot,omitempty"`

	// ObservedGeneration is the spec generation this status describes.
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// Conditions: Scheduled, Ready, GuestAgentReady, and MainProcess for an
	// OCI image with an entrypoint.
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Machine is one micro-VM. Its spec.cpu and spec.memory cannot change after
// creation, since quota charges them at admission.
//
// The immutability rules sit on the whole object, not on spec.cpu and
// spec.memory: a transition rule on an optional field is skipped when the old
// object lacks it, so a Machine created without a spec could otherwise grow.
// An unset field counts as its default.
//
// +kubebuilder:object:root=true
// +kubebuilder:validation:XValidation:rule="(has(self.spec) && has(self.spec.cpu) ? self.spec.cpu : 1) == (has(oldSelf.spec) && has(oldSelf.spec.cpu) ? oldSelf.spec.cpu : 1)",message="spec.cpu is immutable; create a new Machine with the size you need",fieldPath=".spec.cpu",reason=FieldValueForbidden
// +kubebuilder:validation:XValidation:rule="quantity(has(self.spec) && has(self.spec.memory) ? string(self.spec.memory) : '256Mi').compareTo(quantity(has(oldSelf.spec) && has(oldSelf.spec.memory) ? string(oldSelf.spec.memory) : '256Mi')) == 0",message="spec.memory is immutable; create a new Machine with the size you need",fieldPath=".spec.memory",reason=FieldValueForbidden
// +kubebuilder:validation:XValidation:rule="(has(self.spec) && has(self.spec.restoreFrom)) == (has(oldSelf.spec) && has(oldSelf.spec.restoreFrom)) && (!has(self.spec) || !has(self.spec.restoreFrom) || self.spec.restoreFrom.snapshotName == oldSelf.spec.restoreFrom.snapshotName)",message="spec.restoreFrom is immutable; create a new Machine to restore a snapshot",fieldPath=".spec.restoreFrom",reason=FieldValueForbidden
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=mach,categories=kairon
// +kubebuilder:selectablefield:JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="Phase",type=string,JSONPath=`.status.phase`
// +kubebuilder:printcolumn:name="Node",type=string,JSONPath=`.spec.nodeName`
// +kubebuilder:printcolumn:name="CPU",type=integer,JSONPath=`.spec.cpu`
// +kubebuilder:printcolumn:name="Memory",type=string,JSONPath=`.spec.memory`
// +kubebuilder:printcolumn:name="Address",type=string,JSONPath=`.status.addresses[0].address`
// +kubebuilder:printcolumn:name="Pool",type=string,JSONPath=`.metadata.labels.kairon\.zyvor\.dev/machinepool`
// +kubebuilder:printcolumn:name="Claim",type=string,JSONPath=`.metadata.labels.kairon\.zyvor\.dev/machineclaim`,priority=1
// +kubebuilder:printcolumn:name="Accel",type=string,JSONPath=`.status.acceleration`,priority=1
// +kubebuilder:printcolumn:name="Image",type=string,JSONPath=`.spec.image`,priority=1
// +kubebuilder:printcolumn:name="RestoredFrom",type=string,JSONPath=`.spec.restoreFrom.snapshotName`,priority=1
// +kubebuilder:printcolumn:name="NodeReachable",type=string,JSONPath=`.status.conditions[?(@.type=="NodeReachable")].status`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type Machine struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   MachineSpec   `json:"spec,omitempty"`
	Status MachineStatus `json:"status,omitempty"`
}

// MachineList is a list of Machines.
//
// +kubebuilder:object:root=true
type MachineList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []Machine `json:"items"`
}

// MachineTemplateSpec describes the Machines a MachineSet or MachinePool creates.
type MachineTemplateSpec struct {
	// Metadata the created Machines carry.
	// +optional
	Metadata MachineTemplateMeta `json:"metadata,omitempty"`
	// Spec of the created Machines.
	// +optional
	Spec MachineSpec `json:"spec,omitempty"`
}

// MachineTemplateMeta is the part of object metadata a template may set.
type MachineTemplateMeta struct {
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	Labels map[string]string `json:"labels,omitempty"`
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	Annotations map[string]string `json:"annotations,omitempty"`
}

func init() {
	register(&Machine{}, &MachineList{})
}

// TemplateSnapshot is a saved template Machine's state file on its node
// (spec.nodeName). It is not a MachineSnapshot object: a pool's clones on
// other nodes fetch it from that node.
type TemplateSnapshot struct {
	// Path is the state file on the node.
	Path string `json:"path"`
	// SizeBytes is its size.
	SizeBytes int64 `json:"sizeBytes"`
	// SavedAt is when the save finished.
	SavedAt metav1.Time `json:"savedAt"`
	// SHA256 is the file's SHA-256 digest (hex). A node that restores a
	// clone elsewhere fetches the file from this node and checks its copy
	// against it. Lowercase hex, as a node names its copy after it.
	// +optional
	// +kubebuilder:validation:Pattern=`^[0-9a-f]{64}$`
	SHA256 string `json:"sha256,omitempty"`
}
