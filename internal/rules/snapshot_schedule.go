package rules

import (
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
	"k8s.io/apimachinery/pkg/labels"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// SnapshotSchedules: when one is due, which Machines it snapshots, which of
// its snapshots retention deletes, and what `kaironctl describe
// snapshotschedule` says of each Machine. kairon-controller's schedule
// controller and kaironctl call the same functions, so the preview and
// what the controller does cannot disagree.

// maxMissedSlots bounds the walk over the slots a schedule missed (a
// controller down for a week on "* * * * *" missed ten thousand).
const maxMissedSlots = 100000

// ParseSnapshotSchedule parses spec.schedule: five cron fields or one of
// the @ descriptors, in UTC. The API server already refused what is not
// shaped like either; this also refuses what it let through but cron
// cannot mean (minute 61, month FOO).
func ParseSnapshotSchedule(spec string) (cron.Schedule, error) {
	if strings.HasPrefix(strings.TrimSpace(spec), "@every") {
		return nil, errors.New("@every is not cron syntax; use five fields, e.g. \"*/15 * * * *\"")
	}
	schedule, err := cron.ParseStandard(spec)
	if err != nil {
		return nil, err
	}
	return schedule, nil
}

// ScheduleDue says what a schedule whose last run was last (its creation,
// before the first run) does at now: due is the slot to run now, the
// latest slot after last that is not after now (zero when none is: the
// slots missed before it are skipped, as a CronJob does), and next the
// first slot after now.
func ScheduleDue(schedule cron.Schedule, last, now time.Time) (due, next time.Time) {
	last, now = last.UTC(), now.UTC()
	slot := schedule.Next(last)
	if slot.IsZero() || slot.After(now) {
		return time.Time{}, slot
	}
	for range maxMissedSlots {
		following := schedule.Next(slot)
		if following.IsZero() || following.After(now) {
			return slot, following
		}
		slot = following
	}
	return slot, schedule.Next(now)
}

// ScheduleMatches says whether the schedule snapshots machine: in its
// namespace, carrying every label of its selector, not being deleted.
func ScheduleMatches(s *kaironv1.SnapshotSchedule, machine *kaironv1.Machine) bool {
	return machine.Namespace == s.Namespace && machine.DeletionTimestamp == nil &&
		labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(machine.Labels))
}

// ScheduleRetention is spec.retention with its default.
func ScheduleRetention(s *kaironv1.SnapshotSchedule) int {
	if s.Spec.Retention <= 0 {
		return 3
	}
	return int(s.Spec.Retention)
}

// ScheduledSnapshotName is the MachineSnapshot a schedule creates for
// machine at slot: one name per Machine and slot, so a retried run
// creates nothing twice.
func ScheduledSnapshotName(schedule, machine string, slot time.Time) string {
	name := fmt.Sprintf("%s-%s-%s", schedule, machine, slot.UTC().Format("20060102-1504"))
	if len(name) > 253 {
		name = name[len(name)-253:]
		name = strings.TrimLeft(name, "-.")
	}
	return name
}

// SnapshotTime is when snap's state is from: status.takenAt, or its
// creation before it is taken.
func SnapshotTime(snap *kaironv1.MachineSnapshot) time.Time {
	if snap.Status.TakenAt != nil {
		return snap.Status.TakenAt.Time
	}
	return snap.CreationTimestamp.Time
}

// NewestFirst sorts snapshots newest first (by SnapshotTime, then name).
func NewestFirst(snaps []*kaironv1.MachineSnapshot) {
	sort.SliceStable(snaps, func(i, j int) bool {
		ti, tj := SnapshotTime(snaps[i]), SnapshotTime(snaps[j])
		if !ti.Equal(tj) {
			return ti.After(tj)
		}
		return snaps[i].Name > snaps[j].Name
	})
}

// NewestReadySnapshot is the newest Ready snapshot of Machine ns/name
// among snaps (any schedule, or none), nil if there is none. kairon-controller
// restores a fenced node's Machine from it.
func NewestReadySnapshot(snaps []kaironv1.MachineSnapshot, ns, name string) *kaironv1.MachineSnapshot {
	var newest *kaironv1.MachineSnapshot
	for i := range snaps {
		s := &snaps[i]
		if s.Namespace != ns || s.Spec.MachineName != name || s.Status.Phase != kaironv1.SnapshotReady || s.DeletionTimestamp != nil {
			continue
		}
		if newest == nil || SnapshotTime(s).After(SnapshotTime(newest)) ||
			(SnapshotTime(s).Equal(SnapshotTime(newest)) && s.Name > newest.Name) {
			newest = s
		}
	}
	return newest
}

// SnapshotsToPrune are the snapshots of one Machine made by one schedule
// (snaps) that its retention deletes: the Ready ones beyond the newest
// retention, and Failed ones older than the newest Ready one. Pending ones
// and a Failed one newer than every Ready one (the latest news) stay.
func SnapshotsToPrune(snaps []*kaironv1.MachineSnapshot, retention int) []*kaironv1.MachineSnapshot {
	sorted := append([]*kaironv1.MachineSnapshot(nil), snaps...)
	NewestFirst(sorted)
	var prune []*kaironv1.MachineSnapshot
	ready := 0
	for _, s := range sorted {
		if s.DeletionTimestamp != nil {
			continue
		}
		switch s.Status.Phase {
		case kaironv1.SnapshotReady:
			ready++
			if ready > retention {
				prune = append(prune, s)
			}
		case kaironv1.SnapshotFailed:
			if ready > 0 {
				prune = append(prune, s)
			}
		}
	}
	return prune
}

// ScheduleReceipt is what a schedule has of one matching Machine.
type ScheduleReceipt struct {
	Machine string
	// Newest is the newest Ready snapshot the schedule took of it; nil when
	// there is none, and Why says why.
	Newest *kaironv1.MachineSnapshot
	Why    string
	// Kept is how many of its snapshots the schedule holds (any phase).
	Kept int
}

// ScheduleState is a schedule recomputed from the Machines and snapshots.
type ScheduleState struct {
	Schedule *kaironv1.SnapshotSchedule
	// Err is why spec.schedule cannot be used; nil when it can.
	Err error
	// Next is the schedule's next run (zero while suspended or invalid).
	Next time.Time
	// Receipts, one per matching Machine, by name.
	Receipts []ScheduleReceipt
	// Snapshots are all the schedule's MachineSnapshots, by Machine name.
	Snapshots map[string][]*kaironv1.MachineSnapshot
}

// ScheduleSnapshots are the schedule's own MachineSnapshots among snaps
// (its label), by Machine name.
func ScheduleSnapshots(s *kaironv1.SnapshotSchedule, snaps []kaironv1.MachineSnapshot) map[string][]*kaironv1.MachineSnapshot {
	byMachine := map[string][]*kaironv1.MachineSnapshot{}
	for i := range snaps {
		snap := &snaps[i]
		if snap.Namespace == s.Namespace && snap.Labels[kaironv1.LabelSnapshotSchedule] == s.Name {
			byMachine[snap.Spec.MachineName] = append(byMachine[snap.Spec.MachineName], snap)
		}
	}
	return byMachine
}

// ComputeScheduleState recomputes schedule s at now from the Machines and
// MachineSnapshots of its namespace.
func ComputeScheduleState(s *kaironv1.SnapshotSchedule, machines []kaironv1.Machine, snaps []kaironv1.MachineSnapshot, now time.Time) *ScheduleState {
	st := &ScheduleState{Schedule: s, Snapshots: ScheduleSnapshots(s, snaps)}
	schedule, err := ParseSnapshotSchedule(s.Spec.Schedule)
	if err != nil {
		st.Err = fmt.Errorf("spec.schedule %q: %w", s.Spec.Schedule, err)
	} else if !s.Spec.Suspend {
		_, st.Next = ScheduleDue(schedule, ScheduleLastRun(s), now)
	}
	for i := range machines {
		m := &machines[i]
		if !ScheduleMatches(s, m) {
			continue
		}
		own := append([]*kaironv1.MachineSnapshot(nil), st.Snapshots[m.Name]...)
		NewestFirst(own)
		r := ScheduleReceipt{Machine: m.Name, Kept: len(own)}
		for _, snap := range own {
			if snap.Status.Phase == kaironv1.SnapshotReady && snap.DeletionTimestamp == nil {
				r.Newest = snap
				break
			}
		}
		if r.Newest == nil {
			r.Why = st.whyNone(m, own)
		}
		st.Receipts = append(st.Receipts, r)
	}
	sort.Slice(st.Receipts, func(i, j int) bool { return st.Receipts[i].Machine < st.Receipts[j].Machine })
	return st
}

// ScheduleLastRun is the time the schedule counts its next slot from.
func ScheduleLastRun(s *kaironv1.SnapshotSchedule) time.Time {
	if s.Status.LastScheduleTime != nil {
		return s.Status.LastScheduleTime.Time
	}
	return s.CreationTimestamp.Time
}

// whyNone says why Machine m has no Ready snapshot of the schedule; own
// are the schedule's snapshots of it, newest first.
func (st *ScheduleState) whyNone(m *kaironv1.Machine, own []*kaironv1.MachineSnapshot) string {
	if len(own) > 0 {
		newest := own[0]
		phase := newest.Status.Phase
		if phase == "" {
			phase = kaironv1.SnapshotPending
		}
		why := fmt.Sprintf("none Ready yet: the newest, %s, is %s", newest.Name, phase)
		if newest.Status.Message != "" {
			why += " (" + newest.Status.Message + ")"
		}
		return why
	}
	switch {
	case st.Err != nil:
		return "none: " + st.Err.Error()
	case st.Schedule.Spec.Suspend:
		return "none: the schedule is suspended (spec.suspend)"
	case m.Status.Phase != kaironv1.MachineRunning:
		phase := string(m.Status.Phase)
		if phase == "" {
			phase = string(kaironv1.MachinePending)
		}
		return fmt.Sprintf("none yet: the Machine is %s; it is snapshotted only while Running, next run %s", phase, st.Next.UTC().Format(time.RFC3339))
	}
	return "none yet: next run " + st.Next.UTC().Format(time.RFC3339)
}
