package kaironctl

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"
	"sigs.k8s.io/controller-runtime/pkg/client"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
	"github.com/zyvor/kairon/internal/rules"
)

// snapshotKinds are MachineSnapshots and SnapshotSchedules
// (docs/guides/snapshots.md).
var snapshotKinds = []*Kind{
	{
		Resource: "machinesnapshots", Singular: "machinesnapshot", Aliases: []string{"msnap", "snapshots", "snapshot"},
		GVR: kaironGVR("machinesnapshots"), GoKind: "MachineSnapshot", Namespaced: true,
		Columns: cols("NAME", "MACHINE", "PHASE", "NODE", "SIZE", "PAUSE", "STORE*", "SCHEDULE*", "TAKEN", "AGE"),
		Row: rowOf(func(s *kaironv1.MachineSnapshot, rc *RowContext) []string {
			size, pause, taken := "", "", ""
			if s.Status.SizeBytes > 0 {
				size = rules.FormatBytes(s.Status.SizeBytes)
			}
			if s.Status.Phase == kaironv1.SnapshotReady {
				pause = strconv.FormatInt(s.Status.PauseMillis, 10) + "ms"
			}
			if s.Status.TakenAt != nil {
				taken = age(*s.Status.TakenAt, rc.Now)
			}
			return []string{
				s.Name, s.Spec.MachineName, string(s.Status.Phase), s.Status.Node, size, pause,
				s.Status.Store, s.Labels[kaironv1.LabelSnapshotSchedule], taken, age(s.CreationTimestamp, rc.Now),
			}
		}),
	},
	{
		Resource: "snapshotschedules", Singular: "snapshotschedule", Aliases: []string{"snapsched", "schedules", "schedule"},
		GVR: kaironGVR("snapshotschedules"), GoKind: "SnapshotSchedule", Namespaced: true,
		Columns: cols("NAME", "SCHEDULE", "RETENTION", "SUSPEND", "MACHINES", "SNAPSHOTS", "LAST", "NEXT*", "AGE"),
		Row: rowOf(func(s *kaironv1.SnapshotSchedule, rc *RowContext) []string {
			last, next := "", ""
			if s.Status.LastScheduleTime != nil {
				last = age(*s.Status.LastScheduleTime, rc.Now)
			}
			if s.Status.NextScheduleTime != nil {
				next = s.Status.NextScheduleTime.UTC().Format(time.RFC3339)
			}
			return []string{
				s.Name, s.Spec.Schedule, strconv.Itoa(rules.ScheduleRetention(s)), strconv.FormatBool(s.Spec.Suspend),
				itoa(int64(s.Status.MatchingMachines)), itoa(int64(s.Status.Snapshots)), last, next, age(s.CreationTimestamp, rc.Now),
			}
		}),
		Describe: describeSnapshotSchedule,
	},
}

// describeSnapshotSchedule lists what a schedule has of each Machine it
// matches, recomputed now with the functions kairon-controller runs it by.
func describeSnapshotSchedule(ctx context.Context, o *Options, obj *unstructured.Unstructured, w io.Writer) error {
	var s kaironv1.SnapshotSchedule
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.Object, &s); err != nil {
		return fmt.Errorf("reading snapshotschedule %q: %w", obj.GetName(), err)
	}
	machines, err := o.listMachines(ctx, s.Namespace)
	if err != nil {
		return err
	}
	c, err := o.Client()
	if err != nil {
		return err
	}
	var snaps kaironv1.MachineSnapshotList
	if err := c.List(ctx, &snaps, client.InNamespace(s.Namespace), client.MatchingLabels{kaironv1.LabelSnapshotSchedule: s.Name}); err != nil {
		return fmt.Errorf("listing machinesnapshots: %w", err)
	}
	return printScheduleState(w, rules.ComputeScheduleState(&s, machines, snaps.Items, time.Now()), time.Now())
}

// printScheduleState is the text after the JSON in `describe
// snapshotschedule`.
func printScheduleState(w io.Writer, st *rules.ScheduleState, now time.Time) error {
	s := st.Schedule
	ready := 0
	for _, r := range st.Receipts {
		if r.Newest != nil {
			ready++
		}
	}
	next := "none (suspended)"
	switch {
	case st.Err != nil:
		next = "none (invalid schedule)"
	case !s.Spec.Suspend:
		next = st.Next.UTC().Format(time.RFC3339)
	}
	fmt.Fprintf(w, "Status (recomputed fresh from Machines/MachineSnapshots right now): %d matching, %d with a Ready snapshot, schedule %q, retention %d, next run %s\n",
		len(st.Receipts), ready, s.Spec.Schedule, rules.ScheduleRetention(s), next)
	if st.Err != nil {
		fmt.Fprintf(w, "Invalid schedule: %s; until fixed, it takes no snapshots.\n", oneLine(st.Err.Error()))
	}
	if len(st.Receipts) == 0 {
		fmt.Fprintln(w, zeroMatchHint(machineMatch{Kind: "snapshotschedule", Name: s.Name, Namespace: s.Namespace, Selector: labels.SelectorFromSet(s.Spec.Selector)}))
		return nil
	}
	width := budgetNameWidth
	for _, r := range st.Receipts {
		width = max(width, len(r.Machine))
	}
	fmt.Fprintf(w, "Matching machines (%d):\n", len(st.Receipts))
	for _, r := range st.Receipts {
		verdict := oneLine(r.Why)
		if r.Newest != nil {
			verdict = fmt.Sprintf("%s (Ready, %s ago, %s, %d kept)", r.Newest.Name,
				duration.HumanDuration(now.Sub(rules.SnapshotTime(r.Newest))), rules.FormatBytes(r.Newest.Status.SizeBytes), r.Kept)
		}
		fmt.Fprintf(w, "  %-*s %s\n", width, r.Machine, verdict)
	}
	return nil
}

// The snapshot kinds are listed with the other Kairon kinds, before nodes.
func init() {
	at := len(kinds)
	for i, k := range kinds {
		if k.Resource == "nodes" {
			at = i
		}
	}
	kinds = slices.Insert(kinds, at, snapshotKinds...)
}
