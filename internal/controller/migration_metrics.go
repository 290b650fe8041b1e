package controller

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	kaironv1 "github.com/zyvor/kairon/api/v1alpha1"
)

// migrationEnds records each migration's end in the metrics once. Only
// ends after since count: a restarted controller would otherwise count
// again every finished migration still in the cluster.
type migrationEnds struct {
	since time.Time
	mu    sync.Mutex
	seen  map[types.UID]time.Time
}

// record counts mig, which is in a terminal phase, unless it already did.
func (e *migrationEnds) record(mig *kaironv1.MachineMigration) {
	if mig.Status.CompletionTime == nil || mig.Status.CompletionTime.Time.Before(e.since.Truncate(time.Second)) {
		return
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	if _, done := e.seen[mig.UID]; done {
		return
	}
	if e.seen == nil {
		e.seen = map[types.UID]time.Time{}
	}
	now := time.Now()
	e.seen[mig.UID] = now
	if len(e.seen) > 10000 { // migrations deleted long ago are not seen again
		for uid, at := range e.seen {
			if now.Sub(at) > time.Hour {
				delete(e.seen, uid)
			}
		}
	}
	recordMigrationEnd(mig)
}

// recordMigrationEnd adds one ended migration to the metrics.
func recordMigrationEnd(mig *kaironv1.MachineMigration) {
	strategy := string(mig.Spec.Strategy)
	if strategy == "" {
		strategy = string(kaironv1.MigrationCold)
	}
	phase := string(mig.Status.Phase)
	migrationsFinished.WithLabelValues(strategy, phase, string(mig.Status.Reason)).Inc()
	if mig.Status.StartTime != nil && mig.Status.CompletionTime != nil {
		migrationDuration.WithLabelValues(strategy, phase).Observe(mig.Status.CompletionTime.Sub(mig.Status.StartTime.Time).Seconds())
	}
	if mig.Status.Phase == kaironv1.MigrationSucceeded && mig.Status.DowntimeMillis > 0 {
		migrationDowntime.WithLabelValues(strategy).Observe(float64(mig.Status.DowntimeMillis) / 1000)
	}
}
