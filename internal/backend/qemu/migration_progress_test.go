package qemu

import (
	"errors"
	"testing"
	"time"

	"github.com/zyvor/kairon/internal/backend"
)

// migrationProgress is KubeVirt's watermark: progress is a new low of the
// RAM left to send. The remaining RAM rising again (a new pass over memory
// the guest dirtied) and falling back, but not below the low, is no
// progress; a new low is, whenever it comes.
func TestMigrationProgressWatermark(t *testing.T) {
	start := time.Unix(1000, 0)
	at := func(s float64) time.Time { return start.Add(time.Duration(s * float64(time.Second))) }
	active := func(remaining int64) qmpMigration {
		return qmpMigration{Status: "active", RAM: &qmpMigrationRAM{Remaining: remaining}}
	}
	limits := migrationLimits{progress: 2 * time.Second, completion: 20 * time.Second}
	steps := []struct {
		at   float64
		mig  qmpMigration
		want error
	}{
		{0.0, qmpMigration{Status: "setup"}, nil},
		{0.5, active(1000), nil},                           // first reading: the low
		{1.5, active(800), nil},                            // new low at 1.5
		{3.0, active(900), nil},                            // a new pass: up again
		{3.4, active(850), nil},                            // down, but not below 800
		{3.6, active(810), backend.ErrMigrationNoProgress}, // 2.1 s since the low at 1.5
	}
	p := newMigrationProgress(start)
	for _, s := range steps {
		err := p.observe(s.mig, at(s.at), limits)
		if !errors.Is(err, s.want) || (s.want == nil && err != nil) {
			t.Fatalf("at %.1f s, remaining %+v: %v, want %v", s.at, s.mig.RAM, err, s.want)
		}
	}

	// A new low in time keeps it going, until the completion timeout.
	p = newMigrationProgress(start)
	for i, remaining := range []int64{1000, 900, 800, 700, 600, 500, 400, 300, 200, 100} {
		if err := p.observe(active(remaining), at(float64(i)*1.5), limits); err != nil {
			t.Fatalf("at %.1f s a migration making progress was given up: %v", float64(i)*1.5, err)
		}
	}
	if err := p.observe(active(50), at(20.5), limits); !errors.Is(err, backend.ErrMigrationCompletionTimeout) {
		t.Errorf("after 20.5 s with a 20 s completion timeout: %v", err)
	}

	// No limits: never.
	p = newMigrationProgress(start)
	if err := p.observe(active(1000), at(3600), migrationLimits{}); err != nil {
		t.Errorf("without limits: %v", err)
	}
}
