package controller

import (
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// A pool's status is counts for people and dashboards (warm, ready,
// claimed); nothing in Kairon decides on it. Yet every bind changes it
// twice (the member taken, its replacement ready) and would write it at
// the very moment the bind writes the claim's status, on the same API
// server. So a change is written poolStatusDelay after it is first seen,
// together with whatever else changed meanwhile: off the bind's path, and
// once for a whole burst of binds rather than once per bind.
const poolStatusDelay = 250 * time.Millisecond

// statusPacing remembers, per pool, since when its status change has been
// pending.
type statusPacing struct{ uidStamps }

func newStatusPacing() *statusPacing {
	return &statusPacing{newUIDStamps()}
}

// wait is how long pool's status waits before it is written: 0 once due.
// The first call for a change starts the delay; an unchanged status
// settles. A pass that fails writes its status at once: it runs again on
// the error backoff's schedule, which may be minutes away, not on the
// delay's.
func (p *statusPacing) wait(pool types.UID, changed, failing bool) time.Duration {
	switch {
	case !changed:
		p.settled(pool)
		return 0
	case failing:
		return 0
	}
	return max(0, poolStatusDelay-p.elapsed(pool))
}

// settled: pool's status is written, or needs no write; the next change
// waits afresh.
func (p *statusPacing) settled(pool types.UID) { p.forget(pool) }
