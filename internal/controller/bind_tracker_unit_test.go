package controller

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// A claim created late in one second reaches the controller in the next.
// Its bind time starts at that arrival (or at its client's stamp), never at
// the truncated creationTimestamp, which would add most of a second.
func TestBindStartAcrossASecondBoundary(t *testing.T) {
	created := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC) // the API server's whole second
	arrival := created.Add(1005 * time.Millisecond)          // created at ~.990, delivered in the next second
	clock := arrival
	tracker := newBindTracker()
	tracker.now = func() time.Time { return clock }

	claim := func(uid, stamp string) *kaironv1.MachineClaim {
		c := &kaironv1.MachineClaim{ObjectMeta: metav1.ObjectMeta{UID: types.UID(uid), CreationTimestamp: metav1.NewTime(created)}}
		if stamp != "" {
			c.Annotations = map[string]string{kaironv1.AnnotationClaimCreatedAt: stamp}
		}
		return c
	}
	tests := []struct {
		name string
		c    *kaironv1.MachineClaim
		seen bool
		want time.Time
	}{
		{"first sight, in the second after creationTimestamp", claim("late", ""), true, arrival},
		{"the client's stamp", claim("stamped", "2026-12-02T12:00:00.990Z"), true, created.Add(990 * time.Millisecond)},
		{"a stamp creationTimestamp rules out falls back to first sight", claim("lying", "2026-12-02T11:00:00.000Z"), true, arrival},
		{"not seen yet", claim("unseen", ""), false, created},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.seen {
				tracker.arrived(tt.c.UID)
			}
			clock = arrival.Add(50 * time.Millisecond) // the bind
			if got := tracker.createdAt(tt.c); !got.Equal(tt.want) {
				t.Errorf("createdAt = %s, want %s", got.Format(time.RFC3339Nano), tt.want.Format(time.RFC3339Nano))
			}
			clock = arrival
		})
	}
	// The bind above took 50 ms after first sight; the truncated second
	// would have said 1055 ms.
	if ms := (arrival.Add(50 * time.Millisecond)).Sub(tracker.createdAt(claim("late", ""))).Milliseconds(); ms != 50 {
		t.Errorf("bind of the late claim measured %d ms, want 50", ms)
	}
}

// A bind's log line splits its time into the create and its delivery, the
// wait for a pass and the take; a step this process did not see is 0.
func TestBindSteps(t *testing.T) {
	created := time.Date(2026, 12, 4, 4, 0, 0, 0, time.UTC)
	clock := created
	tracker := newBindTracker()
	tracker.now = func() time.Time { return clock }
	at := func(ms int) time.Time { return created.Add(time.Duration(ms) * time.Millisecond) }

	clock = at(6)
	tracker.arrived("seen-and-bound")
	clock = at(7)
	tracker.startBind("seen-and-bound")
	clock = at(3)
	tracker.startBind("never-seen") // a claim the watch had not delivered

	tests := []struct {
		uid                         types.UID
		wantSeen, wantStarted, take time.Duration
	}{
		{"seen-and-bound", 6 * time.Millisecond, time.Millisecond, 10 * time.Millisecond},
		{"never-seen", 0, 0, 14 * time.Millisecond},
		{"unknown", 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(string(tt.uid), func(t *testing.T) {
			s := tracker.steps(tt.uid, created, at(17))
			if want := (bindSteps{seen: tt.wantSeen, started: tt.wantStarted, take: tt.take}); s != want {
				t.Errorf("steps = %+v, want %+v", s, want)
			}
		})
	}
}
