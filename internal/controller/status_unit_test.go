package controller

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules/rulestest"
)

func inPhase(name string, phase kaironv1.MachinePhase) *kaironv1.Machine {
	return rulestest.Machine(name, 1, "256Mi", rulestest.Placed("n", phase))
}

func machinesInPhases(phases ...kaironv1.MachinePhase) []*kaironv1.Machine {
	var out []*kaironv1.Machine
	for i, p := range phases {
		out = append(out, inPhase("m"+string(rune('a'+i)), p))
	}
	return out
}

// condition is a condition as a status builder makes it, without the
// LastTransitionTime meta.SetStatusCondition stamps.
func condition(typ kaironv1.ConditionType, status metav1.ConditionStatus, reason, message string, generation int64) metav1.Condition {
	return metav1.Condition{Type: typ.String(), Status: status, Reason: reason, Message: message, ObservedGeneration: generation}
}

func withoutTransitionTimes(conditions []metav1.Condition) []metav1.Condition {
	out := make([]metav1.Condition, len(conditions))
	for i, c := range conditions {
		c.LastTransitionTime = metav1.Time{}
		out[i] = c
	}
	return out
}

var errSync = errors.New("creating a warm machine: exceeds MachineQuota \"team\"")

func TestComputePoolStatus(t *testing.T) {
	const gen = 7
	run, boot, fail := kaironv1.MachineRunning, kaironv1.MachineBooting, kaironv1.MachineFailed
	ready := func(status metav1.ConditionStatus, reason, message string) metav1.Condition {
		return condition(kaironv1.ConditionReady, status, reason, message, gen)
	}
	failure := func(reason string) metav1.Condition {
		return condition(kaironv1.ConditionReplicaFailure, metav1.ConditionTrue, reason, errSync.Error(), gen)
	}
	tests := []struct {
		name     string
		replicas *int32
		warm     []*kaironv1.Machine
		claimed  int
		syncErr  error
		prior    []metav1.Condition
		// replicas (= warm), readyWarm, claimed
		wantCounts [3]int32
		wantConds  []metav1.Condition
		// kairon_machinepool_members by state: warm, booting, claimed
		wantMetrics [3]float64
	}{
		{
			name: "every warm member Running", replicas: ptr.To[int32](2), warm: machinesInPhases(run, run), claimed: 1,
			wantCounts:  [3]int32{2, 2, 1},
			wantConds:   []metav1.Condition{ready(metav1.ConditionTrue, kaironv1.PoolReasonWarmMachinesReady, "2/2 warm machines Running")},
			wantMetrics: [3]float64{2, 0, 1},
		},
		{
			name: "one booting", replicas: ptr.To[int32](2), warm: machinesInPhases(run, boot),
			wantCounts:  [3]int32{2, 1, 0},
			wantConds:   []metav1.Condition{ready(metav1.ConditionFalse, kaironv1.PoolReasonWarmMachinesNotReady, "1/2 warm machines Running, 1 booting")},
			wantMetrics: [3]float64{1, 1, 0},
		},
		{
			name: "a failed member counts as not Running yet", replicas: ptr.To[int32](2), warm: machinesInPhases(run, fail),
			wantCounts:  [3]int32{2, 1, 0},
			wantConds:   []metav1.Condition{ready(metav1.ConditionFalse, kaironv1.PoolReasonWarmMachinesNotReady, "1/2 warm machines Running, 1 booting")},
			wantMetrics: [3]float64{1, 1, 0},
		},
		{
			name: "members that cannot be placed are not booting", replicas: ptr.To[int32](3), warm: append(machinesInPhases(run, boot), unplacedMember("mc")),
			wantCounts: [3]int32{3, 1, 0},
			wantConds: []metav1.Condition{ready(metav1.ConditionFalse, kaironv1.PoolReasonWarmMachinesNotReady,
				"1/3 warm machines Running, 1 booting, 1 waiting for a node (0/1 nodes are available: 1 node has insufficient cpu (free 0, need 1))")},
			wantMetrics: [3]float64{1, 2, 0},
		},
		{
			name: "short of members, none booting", replicas: ptr.To[int32](3), warm: machinesInPhases(run), claimed: 2,
			wantCounts:  [3]int32{1, 1, 2},
			wantConds:   []metav1.Condition{ready(metav1.ConditionFalse, kaironv1.PoolReasonWarmMachinesNotReady, "1/3 warm machines Running")},
			wantMetrics: [3]float64{1, 0, 2},
		},
		{
			name: "more Running than spec.replicas", replicas: ptr.To[int32](1), warm: machinesInPhases(run, run),
			wantCounts:  [3]int32{2, 2, 0},
			wantConds:   []metav1.Condition{ready(metav1.ConditionFalse, kaironv1.PoolReasonWarmMachinesNotReady, "2/1 warm machines Running")},
			wantMetrics: [3]float64{2, 0, 0},
		},
		{
			name: "no spec.replicas means one", warm: machinesInPhases(run),
			wantCounts:  [3]int32{1, 1, 0},
			wantConds:   []metav1.Condition{ready(metav1.ConditionTrue, kaironv1.PoolReasonWarmMachinesReady, "1/1 warm machines Running")},
			wantMetrics: [3]float64{1, 0, 0},
		},
		{
			name: "zero replicas, none left", replicas: ptr.To[int32](0),
			wantCounts:  [3]int32{0, 0, 0},
			wantConds:   []metav1.Condition{ready(metav1.ConditionTrue, kaironv1.PoolReasonWarmMachinesReady, "0/0 warm machines Running")},
			wantMetrics: [3]float64{0, 0, 0},
		},
		{
			name: "a failed sync while short is a create's", replicas: ptr.To[int32](2), warm: machinesInPhases(run), syncErr: errSync,
			wantCounts: [3]int32{1, 1, 0},
			wantConds: []metav1.Condition{
				ready(metav1.ConditionFalse, kaironv1.PoolReasonWarmMachinesNotReady, "1/2 warm machines Running"),
				failure(kaironv1.ReplicaReasonFailedCreate),
			},
			wantMetrics: [3]float64{1, 0, 0},
		},
		{
			name: "a failed sync at or over spec.replicas is a delete's", replicas: ptr.To[int32](1), warm: machinesInPhases(run, run), syncErr: errSync,
			wantCounts: [3]int32{2, 2, 0},
			wantConds: []metav1.Condition{
				ready(metav1.ConditionFalse, kaironv1.PoolReasonWarmMachinesNotReady, "2/1 warm machines Running"),
				failure(kaironv1.ReplicaReasonFailedDelete),
			},
			wantMetrics: [3]float64{2, 0, 0},
		},
		{
			name: "a sync that works clears the failure", replicas: ptr.To[int32](1), warm: machinesInPhases(run),
			prior:       []metav1.Condition{ready(metav1.ConditionFalse, kaironv1.PoolReasonWarmMachinesNotReady, "0/1 warm machines Running"), failure(kaironv1.ReplicaReasonFailedCreate)},
			wantCounts:  [3]int32{1, 1, 0},
			wantConds:   []metav1.Condition{ready(metav1.ConditionTrue, kaironv1.PoolReasonWarmMachinesReady, "1/1 warm machines Running")},
			wantMetrics: [3]float64{1, 0, 0},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			pool := &kaironv1.MachinePool{
				ObjectMeta: metav1.ObjectMeta{Namespace: "status-test", Name: "agents", Generation: gen},
				Spec:       kaironv1.MachinePoolSpec{Replicas: tt.replicas},
				Status:     kaironv1.MachinePoolStatus{ObservedGeneration: gen - 1, Conditions: tt.prior},
			}
			before := pool.Status.DeepCopy()
			claimed := make([]*kaironv1.Machine, tt.claimed)
			for i := range claimed {
				claimed[i] = inPhase("c", kaironv1.MachineRunning)
			}
			got := computePoolStatus(pool, tt.warm, claimed, tt.syncErr)

			want := kaironv1.MachinePoolStatus{
				ObservedGeneration: gen, Selector: "kairon.zyvor.dev/machinepool=agents,kairon.zyvor.dev/pool-state=warm",
				Replicas: tt.wantCounts[0], Warm: tt.wantCounts[0], ReadyWarm: tt.wantCounts[1], Claimed: tt.wantCounts[2],
				Conditions: tt.wantConds,
			}
			gotCmp := got.DeepCopy()
			gotCmp.Conditions = withoutTransitionTimes(got.Conditions)
			if !equality.Semantic.DeepEqual(gotCmp, &want) {
				t.Errorf("status\n%s\nwant\n%s", fmtJSON(gotCmp), fmtJSON(want))
			}
			if !equality.Semantic.DeepEqual(&pool.Status, before) {
				t.Errorf("the pool's own status changed: %s", fmtJSON(pool.Status))
			}
			for i, state := range []string{memberStateWarm, memberStateBooting, memberStateClaimed} {
				if v := testutil.ToFloat64(poolMembers.WithLabelValues("status-test", "agents", state)); v != tt.wantMetrics[i] {
					t.Errorf("kairon_machinepool_members{state=%q} = %v, want %v", state, v, tt.wantMetrics[i])
				}
			}
		})
	}
	forgetPoolMembers("status-test", "agents")
}

func TestMachineSetStatus(t *testing.T) {
	const gen = 4
	run, boot := kaironv1.MachineRunning, kaironv1.MachineBooting
	ready := func(status metav1.ConditionStatus, reason, message string) metav1.Condition {
		return condition(kaironv1.ConditionReady, status, reason, message, gen)
	}
	failure := func(reason string) metav1.Condition {
		return condition(kaironv1.ConditionReplicaFailure, metav1.ConditionTrue, reason, errSync.Error(), gen)
	}
	tests := []struct {
		name     string
		replicas *int32
		live     []*kaironv1.Machine
		syncErr  error
		prior    []metav1.Condition
		// replicas, readyReplicas
		wantCounts [2]int32
		wantConds  []metav1.Condition
	}{
		{
			name: "all Running", replicas: ptr.To[int32](3), live: machinesInPhases(run, run, run),
			wantCounts: [2]int32{3, 3},
			wantConds:  []metav1.Condition{ready(metav1.ConditionTrue, kaironv1.SetReasonAllReplicasReady, "3/3 machines Running")},
		},
		{
			name: "one booting", replicas: ptr.To[int32](3), live: machinesInPhases(run, boot, run),
			wantCounts: [2]int32{3, 2},
			wantConds:  []metav1.Condition{ready(metav1.ConditionFalse, kaironv1.SetReasonReplicasNotReady, "2/3 machines Running")},
		},
		{
			name: "one missing", replicas: ptr.To[int32](3), live: machinesInPhases(run, run),
			wantCounts: [2]int32{2, 2},
			wantConds:  []metav1.Condition{ready(metav1.ConditionFalse, kaironv1.SetReasonReplicasNotReady, "2/3 machines Running, 2 exist")},
		},
		{
			name: "one too many", replicas: ptr.To[int32](1), live: machinesInPhases(run, run),
			wantCounts: [2]int32{2, 2},
			wantConds:  []metav1.Condition{ready(metav1.ConditionFalse, kaironv1.SetReasonReplicasNotReady, "2/1 machines Running, 2 exist")},
		},
		{
			name:       "no spec.replicas means one",
			wantCounts: [2]int32{0, 0},
			wantConds:  []metav1.Condition{ready(metav1.ConditionFalse, kaironv1.SetReasonReplicasNotReady, "0/1 machines Running, 0 exist")},
		},
		{
			name: "a failed sync while short is a create's", replicas: ptr.To[int32](3), live: machinesInPhases(run, run), syncErr: errSync,
			wantCounts: [2]int32{2, 2},
			wantConds: []metav1.Condition{
				ready(metav1.ConditionFalse, kaironv1.SetReasonReplicasNotReady, "2/3 machines Running, 2 exist"),
				failure(kaironv1.ReplicaReasonFailedCreate),
			},
		},
		{
			name: "a failed sync at spec.replicas is a delete's", replicas: ptr.To[int32](2), live: machinesInPhases(run, run), syncErr: errSync,
			wantCounts: [2]int32{2, 2},
			wantConds: []metav1.Condition{
				ready(metav1.ConditionTrue, kaironv1.SetReasonAllReplicasReady, "2/2 machines Running"),
				failure(kaironv1.ReplicaReasonFailedDelete),
			},
		},
		{
			name: "a sync that works clears the failure", replicas: ptr.To[int32](1), live: machinesInPhases(run),
			prior:      []metav1.Condition{failure(kaironv1.ReplicaReasonFailedDelete)},
			wantCounts: [2]int32{1, 1},
			wantConds:  []metav1.Condition{ready(metav1.ConditionTrue, kaironv1.SetReasonAllReplicasReady, "1/1 machines Running")},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			set := &kaironv1.MachineSet{
				ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "web", Generation: gen},
				Spec:       kaironv1.MachineSetSpec{Replicas: tt.replicas},
			}
			status := &kaironv1.MachineSetStatus{Conditions: append([]metav1.Condition(nil), tt.prior...)}
			setReplicaCounts(status, tt.live)
			setMachineSetConditions(status, set, tt.syncErr)
			want := kaironv1.MachineSetStatus{Replicas: tt.wantCounts[0], ReadyReplicas: tt.wantCounts[1], Conditions: tt.wantConds}
			got := status.DeepCopy()
			got.Conditions = withoutTransitionTimes(status.Conditions)
			if !equality.Semantic.DeepEqual(got, &want) {
				t.Errorf("status\n%s\nwant\n%s", fmtJSON(got), fmtJSON(want))
			}
		})
	}
}

// unplacedMember is a warm member the scheduler found no room for.
func unplacedMember(name string) *kaironv1.Machine {
	m := inPhase(name, kaironv1.MachinePending)
	m.Spec.NodeName = ""
	m.Status.Conditions = []metav1.Condition{{Type: kaironv1.ConditionScheduled.String(), Status: metav1.ConditionFalse,
		Reason: kaironv1.MachineReasonUnschedulable, Message: "0/1 nodes are available: 1 node has insufficient cpu (free 0, need 1)"}}
	return m
}
