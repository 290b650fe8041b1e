package rules

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// A clock that moves by hand: the schedule's slots as the controller would
// see them at each moment, missed slots collapsing into the latest one.
func TestScheduleDue(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tt := range []struct {
		name, schedule, last, now string
		due, next                 string // "" for none
	}{
		{"before the first slot", "*/15 * * * *", "2026-12-03T10:01:00Z", "2026-12-03T10:14:59Z", "", "2026-12-03T10:15:00Z"},
		{"at the slot", "*/15 * * * *", "2026-12-03T10:01:00Z", "2026-12-03T10:15:00Z", "2026-12-03T10:15:00Z", "2026-12-03T10:30:00Z"},
		{"just after the slot", "*/15 * * * *", "2026-12-03T10:01:00Z", "2026-12-03T10:15:07Z", "2026-12-03T10:15:00Z", "2026-12-03T10:30:00Z"},
		{"the slot that ran is not due again", "*/15 * * * *", "2026-12-03T10:15:00Z", "2026-12-03T10:29:00Z", "", "2026-12-03T10:30:00Z"},
		{"missed slots: only the latest", "0 * * * *", "2026-12-03T01:00:00Z", "2026-12-03T10:20:00Z", "2026-12-03T10:00:00Z", "2026-12-03T11:00:00Z"},
		{"daily at three", "0 3 * * *", "2026-12-02T03:00:00Z", "2026-12-03T02:59:59Z", "", "2026-12-03T03:00:00Z"},
		{"weekdays only", "30 8 * * MON-FRI", "2026-12-04T08:30:00Z", "2026-12-06T12:00:00Z", "", "2026-12-07T08:30:00Z"}, // Friday to Monday
		{"@hourly", "@hourly", "2026-12-03T10:00:00Z", "2026-12-03T11:00:00Z", "2026-12-03T11:00:00Z", "2026-12-03T12:00:00Z"},
		{"a week of minutes missed", "* * * * *", "2026-11-26T10:00:00Z", "2026-12-03T10:00:30Z", "2026-12-03T10:00:00Z", "2026-12-03T10:01:00Z"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			schedule, err := ParseSnapshotSchedule(tt.schedule)
			if err != nil {
				t.Fatal(err)
			}
			due, next := ScheduleDue(schedule, at(tt.last), at(tt.now))
			gotDue := ""
			if !due.IsZero() {
				gotDue = due.Format(time.RFC3339)
			}
			if gotDue != tt.due || next.Format(time.RFC3339) != tt.next {
				t.Errorf("due %q next %s, want due %q next %s", gotDue, next.Format(time.RFC3339), tt.due, tt.next)
			}
		})
	}
}

func TestParseSnapshotScheduleRefusals(t *testing.T) {
	for _, spec := range []string{"61 * * * *", "* * * FOO *", "@every 5m", "* * *"} {
		if _, err := ParseSnapshotSchedule(spec); err == nil {
			t.Errorf("%q parsed; want an error", spec)
		}
	}
}

func snapshotAt(name string, phase kaironv1.MachineSnapshotPhase, minute int) *kaironv1.MachineSnapshot {
	t0 := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	s := &kaironv1.MachineSnapshot{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team", CreationTimestamp: metav1.NewTime(t0.Add(time.Duration(minute) * time.Minute))}}
	s.Status.Phase = phase
	if phase == kaironv1.SnapshotReady {
		taken := metav1.NewTime(t0.Add(time.Duration(minute)*time.Minute + time.Second))
		s.Status.TakenAt = &taken
	}
	return s
}

func names(snaps []*kaironv1.MachineSnapshot) string {
	var out []string
	for _, s := range snaps {
		out = append(out, s.Name)
	}
	return strings.Join(out, ",")
}

// Retention keeps exactly N Ready snapshots, the newest; Failed ones go
// once a newer one is Ready; Pending ones stay.
func TestSnapshotsToPrune(t *testing.T) {
	snaps := []*kaironv1.MachineSnapshot{
		snapshotAt("r1", kaironv1.SnapshotReady, 1),
		snapshotAt("f2", kaironv1.SnapshotFailed, 2),
		snapshotAt("r3", kaironv1.SnapshotReady, 3),
		snapshotAt("r4", kaironv1.SnapshotReady, 4),
		snapshotAt("r5", kaironv1.SnapshotReady, 5),
		snapshotAt("f6", kaironv1.SnapshotFailed, 6),
		snapshotAt("p7", kaironv1.SnapshotPending, 7),
	}
	for _, tt := range []struct {
		retention int
		want      string
	}{
		{1, "r4,r3,f2,r1"},
		{2, "r3,f2,r1"},
		{4, "f2"},
		{10, "f2"},
	} {
		if got := names(SnapshotsToPrune(snaps, tt.retention)); got != tt.want {
			t.Errorf("retention %d: prune %s, want %s", tt.retention, got, tt.want)
		}
	}
	// Only failures: nothing to keep them for, nothing to prune them for.
	onlyFailed := []*kaironv1.MachineSnapshot{snapshotAt("f1", kaironv1.SnapshotFailed, 1), snapshotAt("f2", kaironv1.SnapshotFailed, 2)}
	if got := SnapshotsToPrune(onlyFailed, 1); len(got) != 0 {
		t.Errorf("failed snapshots without a Ready one pruned: %s", names(got))
	}
}

func TestNewestReadySnapshot(t *testing.T) {
	var snaps []kaironv1.MachineSnapshot
	for _, s := range []*kaironv1.MachineSnapshot{
		snapshotAt("old", kaironv1.SnapshotReady, 1),
		snapshotAt("new", kaironv1.SnapshotReady, 5),
		snapshotAt("newer-failed", kaironv1.SnapshotFailed, 9),
		snapshotAt("newest-pending", kaironv1.SnapshotPending, 10),
	} {
		s.Spec.MachineName = "web-1"
		snaps = append(snaps, *s)
	}
	other := snapshotAt("other-machine", kaironv1.SnapshotReady, 20)
	other.Spec.MachineName = "web-2"
	snaps = append(snaps, *other)
	if got := NewestReadySnapshot(snaps, "team", "web-1"); got == nil || got.Name != "new" {
		t.Errorf("newest Ready of web-1: %v, want new", got)
	}
	if got := NewestReadySnapshot(snaps, "other-ns", "web-1"); got != nil {
		t.Errorf("newest Ready in another namespace: %s, want none", got.Name)
	}
}

func TestScheduledSnapshotName(t *testing.T) {
	slot := time.Date(2026, 12, 3, 3, 0, 0, 0, time.UTC)
	if got := ScheduledSnapshotName("nightly", "web-1", slot); got != "nightly-web-1-20261203-0300" {
		t.Errorf("got %s", got)
	}
	long := ScheduledSnapshotName(strings.Repeat("s", 200), strings.Repeat("m", 100), slot)
	if len(long) > 253 || !strings.HasSuffix(long, "-20261203-0300") {
		t.Errorf("long name %q (%d): want at most 253 characters, ending in the slot", long, len(long))
	}
}

// What describe and the controller say of each matching Machine.
func TestComputeScheduleState(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 30, 0, 0, time.UTC)
	s := &kaironv1.SnapshotSchedule{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: "nightly", CreationTimestamp: metav1.NewTime(now.Add(-24 * time.Hour))},
		Spec:       kaironv1.SnapshotScheduleSpec{Selector: map[string]string{"tier": "web"}, Schedule: "0 3 * * *"},
	}
	last := metav1.NewTime(time.Date(2026, 12, 3, 3, 0, 0, 0, time.UTC))
	s.Status.LastScheduleTime = &last
	machine := func(name, tier string, phase kaironv1.MachinePhase) kaironv1.Machine {
		return kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "team", Name: name, Labels: map[string]string{"tier": tier}},
			Status: kaironv1.MachineStatus{Phase: phase}}
	}
	machines := []kaironv1.Machine{
		machine("web-1", "web", kaironv1.MachineRunning), machine("web-2", "web", kaironv1.MachineRunning),
		machine("web-3", "web", kaironv1.MachineBooting), machine("db", "db", kaironv1.MachineRunning),
	}
	own := func(name, m string, phase kaironv1.MachineSnapshotPhase, minute int) kaironv1.MachineSnapshot {
		snap := snapshotAt(name, phase, minute)
		snap.Spec.MachineName = m
		snap.Labels = map[string]string{kaironv1.LabelSnapshotSchedule: "nightly"}
		snap.Status.Message = "the message"
		return *snap
	}
	snaps := []kaironv1.MachineSnapshot{own("w1-a", "web-1", kaironv1.SnapshotReady, 1), own("w1-b", "web-1", kaironv1.SnapshotReady, 2),
		own("w2-a", "web-2", kaironv1.SnapshotFailed, 3)}
	st := ComputeScheduleState(s, machines, snaps, now)
	if st.Err != nil || st.Next.Format(time.RFC3339) != "2026-12-04T03:00:00Z" {
		t.Fatalf("err %v next %s", st.Err, st.Next)
	}
	var got []string
	for _, r := range st.Receipts {
		line := r.Machine + ": "
		if r.Newest != nil {
			line += r.Newest.Name
		} else {
			line += r.Why
		}
		got = append(got, line)
	}
	want := []string{
		"web-1: w1-b",
		"web-2: none Ready yet: the newest, w2-a, is Failed (the message)",
		"web-3: none yet: the Machine is Booting; it is snapshotted only while Running, next run 2026-12-04T03:00:00Z",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("receipts:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	s.Spec.Suspend = true
	if st := ComputeScheduleState(s, machines, nil, now); !st.Next.IsZero() || st.Receipts[0].Why != "none: the schedule is suspended (spec.suspend)" {
		t.Errorf("suspended: next %s, web-1 %q", st.Next, st.Receipts[0].Why)
	}
	s.Spec.Suspend, s.Spec.Schedule = false, "75 * * * *"
	if st := ComputeScheduleState(s, machines, nil, now); st.Err == nil || !strings.HasPrefix(st.Receipts[0].Why, `none: spec.schedule "75 * * * *": `) {
		t.Errorf("invalid: err %v, web-1 %q", st.Err, st.Receipts[0].Why)
	}
}
