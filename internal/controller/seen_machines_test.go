package controller

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// A Machine counts as seen only before a time after its first delivery; a
// later update does not move that first sighting.
func TestSeenMachinesBefore(t *testing.T) {
	clock := time.Date(2026, 12, 3, 9, 0, 0, 0, time.UTC)
	s := newSeenMachines()
	s.now = func() time.Time { return clock }
	m := &kaironv1.Machine{ObjectMeta: metav1.ObjectMeta{Name: "a", UID: "uid-a"}}
	listStarted := clock.Add(-time.Millisecond)
	s.observe(m)
	if s.seenBefore("uid-a", listStarted) {
		t.Errorf("a Machine first delivered after the list began counts as seen before it")
	}
	if !s.seenBefore("uid-a", clock.Add(time.Millisecond)) {
		t.Errorf("a Machine delivered before the list began does not count as seen")
	}
	clock = clock.Add(time.Minute)
	s.observe(m) // an update
	if !s.seenBefore("uid-a", clock.Add(-30*time.Second)) {
		t.Errorf("an update moved the first sighting")
	}
	if s.seenBefore("uid-b", clock) {
		t.Errorf("a Machine never delivered counts as seen")
	}
}
