package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// SnapshotScheduleSpec says which Machines to snapshot, when, and how many
// snapshots of each to keep.
type SnapshotScheduleSpec struct {
	// Selector matches Machines of the schedule's namespace by label; empty
	// matches every Machine of the namespace.
	// +optional
	// +kubebuilder:validation:MaxProperties=64
	Selector map[string]string `json:"selector,omitempty"`

	// Schedule is when to snapshot, in cron syntax: five fields (minute
	// hour day-of-month month day-of-week, e.g. "*/15 * * * *"), or one of
	// @hourly, @daily (@midnight), @weekly, @monthly, @yearly (@annually).
	// Times are UTC.
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:XValidation:rule=`self.matches('^@(hourly|daily|midnight|weekly|monthly|yearly|annually)$') || self.matches('^\\s*([0-9*?/,A-Za-z-]+)(\\s+[0-9*?/,A-Za-z-]+){4}\\s*$')`,message="must be a cron schedule: five fields (minute hour day-of-month month day-of-week, e.g. \"*/15 * * * *\") or @hourly, @daily, @weekly, @monthly, @yearly"
	Schedule string `json:"schedule"`

	// Retention is how many snapshots of each matching Machine the schedule
	// keeps: once a new one is Ready, older ones beyond this count are
	// deleted, oldest first.
	// +optional
	// +kubebuilder:default=3
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=1000
	Retention int32 `json:"retention,omitempty"`

	// Suspend stops the schedule from taking new snapshots; those it took
	// stay.
	// +optional
	Suspend bool `json:"suspend,omitempty"`
}

// SnapshotScheduleStatus is written by kairon-controller.
type SnapshotScheduleStatus struct {
	// LastScheduleTime is the last time the schedule took snapshots.
	// +optional
	LastScheduleTime *metav1.Time `json:"lastScheduleTime,omitempty"`
	// NextScheduleTime is when it takes the next ones (unset while suspended).
	// +optional
	NextScheduleTime *metav1.Time `json:"nextScheduleTime,omitempty"`
	// MatchingMachines is how many Machines the selector matched last time
	// the controller looked.
	// +optional
	MatchingMachines int32 `json:"matchingMachines"`
	// Snapshots is how many MachineSnapshots the schedule holds now.
	// +optional
	Snapshots int32 `json:"snapshots"`
	// +optional
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Conditions: Ready (false with InvalidSchedule when the controller
	// cannot parse spec.schedule).
	// +optional
	// +listType=map
	// +listMapKey=type
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// SnapshotSchedule snapshots the Machines it selects on a cron schedule and
// keeps the newest spec.retention MachineSnapshots of each.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=snapsched,categories=kairon
// +kubebuilder:printcolumn:name="Schedule",type=string,JSONPath=`.spec.schedule`
// +kubebuilder:printcolumn:name="Retention",type=integer,JSONPath=`.spec.retention`
// +kubebuilder:printcolumn:name="Suspend",type=boolean,JSONPath=`.spec.suspend`
// +kubebuilder:printcolumn:name="Machines",type=integer,JSONPath=`.status.matchingMachines`
// +kubebuilder:printcolumn:name="Snapshots",type=integer,JSONPath=`.status.snapshots`
// +kubebuilder:printcolumn:name="Last",type=date,JSONPath=`.status.lastScheduleTime`
// +kubebuilder:printcolumn:name="Next",type=string,JSONPath=`.status.nextScheduleTime`,priority=1
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type SnapshotSchedule struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   SnapshotScheduleSpec   `json:"spec"`
	Status SnapshotScheduleStatus `json:"status,omitempty"`
}

// SnapshotScheduleList is a list of SnapshotSchedules.
//
// +kubebuilder:object:root=true
type SnapshotScheduleList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []SnapshotSchedule `json:"items"`
}

func init() {
	register(&SnapshotSchedule{}, &SnapshotScheduleList{})
}
